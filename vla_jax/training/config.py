"""Typed, frozen experiment configuration, built from an `ml_collections.ConfigDict`.

Only this module and the absl mains touch ml_collections; models and layers see frozen
dataclasses. Building an `ExperimentConfig` validates everything that can be checked without
running (unknown mixer, head widths, a task that cannot be generated, a batch that does not
split over the devices), so a bad configuration fails before any training.
"""

import dataclasses
import json
import math

from vla_jax.layers.registry import mixer_options
from vla_jax.models import ModelConfig
from vla_jax.tasks import make_task


# Settings that change no result, as "section.field": a run made with other values of them logs
# the same numbers (losses, accuracies, gradient norms, learning rates, evaluation scores) at
# the steps both log, bit for bit; they change only how often rows are logged, evaluations run
# and checkpoints are kept, and what is written beside the rows. A run may resume with them
# changed (`checkpoint.write_config`), and a grid leaves them out of the settings its rows
# record. Not here: eval_examples (other evaluation sets, other scores) and `ROUNDING_ONLY`.
RESULT_FREE = ("train.log_every", "train.eval_every", "train.eval_batch_size",
               "train.checkpoint_every", "train.keep_checkpoints", "train.tensorboard",
               "train.diagnostics_every")
# Settings that compute the same function in another order (memory against compute, the
# sequence split over devices): results agree up to float rounding (model.remat: other last
# bits of the gradient norm), as on another number of devices. A run may resume with them
# changed; they are not result-free.
ROUNDING_ONLY = ("model.remat", "train.seq_devices")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Attributes:
    seed: seeds the parameters, and the data unless `data_seed` is set (batches are a pure
      function of (data seed, step)).
    data_seed: None (default: the data follow `seed`) or an int >= 0 that seeds the data alone
      (training batches, evaluation sets, the probe batch), so that the parameters' and the
      data's share of a run's outcome can be told apart (`data_seed_of`).
    batch_size: global batch, split over all devices.
    num_steps: optimizer steps.
    learning_rate, warmup_steps, weight_decay, b1, b2: AdamW with linear warmup (at most
      num_steps long) then cosine decay to `end_lr_ratio * learning_rate` (end_lr_ratio in
      [0, 1]); weight decay (>= 0) on >= 2-D parameters only; b1, b2 in [0, 1).
    grad_clip: global-norm clip (0 disables; >= 0).
    eval_every, eval_examples, eval_batch_size: periodic evaluation (0 = only at the end).
    log_every: steps between progress lines and JSONL rows.
    checkpoint_every: steps between checkpoints (0 = only at the end); keep_checkpoints kept.
    tensorboard: also write the metrics rows as TensorBoard scalars under <workdir>/tb
      (needs tensorboardX: pip install 'vla-jax[tensorboard]').
    seq_devices: devices along each sequence (default 1): the devices form a (data, seq) mesh
      and the recurrent mixers run sequence-sharded (`vla_jax.parallel`); the same function,
      up to float rounding.
    diagnostics_every: steps between measurements of the layers on a fixed probe batch
      (`vla_jax.training.probe`: gradient and parameter norms per layer and projection, state
      norms, and VLA's cond(A_t) and write-direction alignment), logged as "diagnostics" rows
      of metrics.jsonl; 0 (default) measures nothing. The training itself is unchanged.
  """

  seed: int = 0
  data_seed: int | None = None
  batch_size: int = 64
  num_steps: int = 1000
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  end_lr_ratio: float = 0.0
  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.98
  grad_clip: float = 1.0
  eval_every: int = 0
  eval_examples: int = 1000
  eval_batch_size: int = 250
  log_every: int = 50
  checkpoint_every: int = 0
  keep_checkpoints: int = 2
  tensorboard: bool = False
  seq_devices: int = 1
  diagnostics_every: int = 0

  def validate(self, num_devices=1, seq_devices=None):
    """Checks the settings for `num_devices` devices, `seq_devices` of them (default
    self.seq_devices) along each sequence."""
    for name in ("batch_size", "num_steps", "eval_examples", "eval_batch_size", "log_every",
                 "keep_checkpoints", "seq_devices"):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"train.{name} must be a positive int; got {value!r}")
    for name in ("warmup_steps", "eval_every", "checkpoint_every", "diagnostics_every"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ValueError(f"train.{name} must be an int >= 0; got {getattr(self, name)!r}")
    if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
      raise ValueError(f"train.learning_rate must be > 0 and finite; got {self.learning_rate}")
    for name, lo, hi, closed in (("end_lr_ratio", 0.0, 1.0, True), ("b1", 0.0, 1.0, False),
                                 ("b2", 0.0, 1.0, False),
                                 ("weight_decay", 0.0, math.inf, False),
                                 ("grad_clip", 0.0, math.inf, False)):
      value = getattr(self, name)
      ok = isinstance(value, (int, float)) and lo <= value and (
          value <= hi if closed else value < hi)
      if not ok:
        raise ValueError(f"train.{name} must be in [{lo}, {hi}{']' if closed else ')'}; "
                         f"got {value!r}")
    if self.data_seed is not None and (not isinstance(self.data_seed, int) or isinstance(
        self.data_seed, bool) or self.data_seed < 0):
      raise ValueError(f"train.data_seed must be None or an int >= 0; got {self.data_seed!r}")
    if not isinstance(self.tensorboard, bool):
      raise ValueError(f"train.tensorboard must be True or False; got {self.tensorboard!r}")
    seq_devices = self.seq_devices if seq_devices is None else seq_devices
    if num_devices % seq_devices:
      raise ValueError(f"train.seq_devices={seq_devices} must divide the number of devices "
                       f"({num_devices})")
    data_devices = num_devices // seq_devices
    for name in ("batch_size", "eval_batch_size"):
      if getattr(self, name) % data_devices:
        raise ValueError(f"train.{name}={getattr(self, name)} must be divisible by the "
                         f"number of devices ({data_devices}) along the data axis for data "
                         "parallelism")


def data_seed_of(train: TrainConfig, seed: int | None = None) -> int:
  """The seed of a run's data: `train.data_seed`, or where that is None the run's seed
  (`seed`, default `train.seed`)."""
  if train.data_seed is not None:
    return train.data_seed
  return train.seed if seed is None else seed


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """The whole experiment: task name and fields, model and training settings."""

  task_name: str
  task_fields: tuple
  model: ModelConfig
  train: TrainConfig

  def make_task(self):
    return make_task(self.task_name, dict(self.task_fields))

  def to_json(self):
    """The config as JSON (a run's config.json): the model's mixer_options hold every option
    of its mixer, its defaults included, so that a run keeps its meaning when a default
    changes."""
    model = dataclasses.asdict(self.model)
    model["mixer_options"] = sorted({**mixer_options(self.model.mixer),
                                     **self.model.options}.items())
    return json.dumps({"task": {"name": self.task_name, **dict(self.task_fields)},
                       "model": model, "train": dataclasses.asdict(self.train)},
                      sort_keys=True, default=list)


def _plain(value):
  """ConfigDict / FrozenConfigDict / lists -> plain dicts and tuples."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return tuple(_plain(v) for v in value)
  return value


def _fields(cls, values, section):
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - names)
  if unknown:
    raise ValueError(f"config.{section} has unknown field(s) {', '.join(unknown)}; known: "
                     f"{', '.join(sorted(names))}")
  return values


def from_config_dict(config, num_devices=1) -> ExperimentConfig:
  """Turns a ConfigDict with `task`, `model` and `train` sections into an `ExperimentConfig`.

  `config.model.options` maps each mixer name to its options; only the chosen mixer's entry
  is used, so `--config.model.mixer=...` switches mixers without editing options.
  `config.model.max_len = 0` (default) takes the task's longest sequence. A `model.impl`
  that cannot run the model's calls (an explicit "pallas" with task.pack > 1, readout
  "delta", head dims or a chunk size the kernel does not take) raises ValueError here.
  """
  c = _plain(config)
  for section in ("task", "model", "train"):
    if section not in c:
      raise ValueError(f"config needs a `{section}` section")
  task_fields = dict(c["task"])
  task_name = task_fields.pop("name", None)
  task = make_task(task_name, task_fields)

  model = dict(c["model"])
  options = model.pop("options", {}) or {}
  mixer = model.get("mixer", "vla")
  model["mixer_options"] = dict(options.get(mixer, {}) or {})
  model.setdefault("vocab_size", task.vocab_size)
  if model.get("max_len", 0) in (0, None):
    model["max_len"] = task.max_len
  if model["vocab_size"] < task.vocab_size:
    raise ValueError(f"model.vocab_size={model['vocab_size']} is smaller than the task's "
                     f"vocab_size={task.vocab_size}")
  if model["max_len"] < task.max_len:
    raise ValueError(f"model.max_len={model['max_len']} is shorter than the task's longest "
                     f"sequence ({task.max_len})")
  model_cfg = ModelConfig(**_fields(ModelConfig, model, "model"))
  pack = task_fields.get("pack", 1)
  if pack != 1:   # packed rows carry segment_ids: an impl that cannot take them fails here
    try:
      model_cfg.check_impl(packed=True)
    except ValueError as e:
      raise ValueError(f"task.pack={pack} trains on packed rows (segment_ids), and {e}") from None

  train = TrainConfig(**_fields(TrainConfig, dict(c["train"]), "train"))
  train.validate(num_devices)
  return ExperimentConfig(task_name=task_name, task_fields=tuple(sorted(task_fields.items())),
                          model=model_cfg, train=train)
