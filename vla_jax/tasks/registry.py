"""Tasks as the trainer sees them: seeded train batches and fixed evaluation sets."""


from vla_jax.tasks import copy as copy_task
from vla_jax.tasks import mqar
from vla_jax.tasks import text
from vla_jax.tasks.common import rng_for
from vla_jax.tasks.npz import load_npz
from vla_jax.tasks.packing import PackedTask

TRAIN, EVAL = 1, 2
# Validation sets of generated tasks are drawn like the test sets, from seed + this offset.
VALIDATION_OFFSET = 1_000_003


class MQARTask:
  """MQAR (`vla_jax.tasks.mqar`); one evaluation set named "mqar"."""

  name = "mqar"

  def __init__(self, config: mqar.MQARConfig):
    self.config = config
    self.vocab_size = config.vocab_size
    self.max_len = config.length
    # Every example has exactly n_pairs targets: the trainer runs the output head on those
    # positions only (`training.train.model_loss`).
    self.max_targets = config.n_pairs

  def train_batch(self, seed, step, batch_size):
    return mqar.generate(self.config, batch_size, rng_for(seed, TRAIN, step))

  def eval_sets(self, seed, num_examples):
    return {"mqar": mqar.generate(self.config, num_examples, rng_for(seed, EVAL, 0))}

  def validation_sets(self, seed, num_examples):
    """Sets named as `eval_sets`' but disjoint draws: a learning rate is chosen on these."""
    return self.eval_sets(seed + VALIDATION_OFFSET, num_examples)


class CopyTask:
  """Copy (`vla_jax.tasks.copy`); one evaluation set "copy_L<length>" per evaluation length."""

  name = "copy"

  def __init__(self, config: copy_task.CopyConfig):
    self.config = config
    self.vocab_size = config.vocab_size
    self.max_len = 2 * max((config.max_len,) + config.lengths)
    self.max_targets = None     # the head runs on every position

  def train_batch(self, seed, step, batch_size):
    return copy_task.generate(self.config, batch_size, rng_for(seed, TRAIN, step))

  def eval_sets(self, seed, num_examples):
    return {f"{copy_task.SET_PREFIX}{L}": copy_task.generate(self.config, num_examples,
                                            rng_for(seed, EVAL, L), length=L)
            for L in self.config.lengths}

  def validation_sets(self, seed, num_examples):
    return self.eval_sets(seed + VALIDATION_OFFSET, num_examples)


class NpzTask:
  """Examples from `.npz` files (`vla_jax.tasks.npz`): train batches are rows drawn with
  replacement, seeded by (seed, step); the evaluation set "npz" is the whole eval file, and
  the validation set (a sweep's, to choose a learning rate on) the whole valid file."""

  name = "npz"

  def __init__(self, vocab_size, eval_path, train_path="", valid_path=""):
    if not eval_path and not train_path:
      raise ValueError("task npz needs task.eval_path and/or task.train_path")
    self.vocab_size = vocab_size
    self.train = load_npz(train_path, vocab_size) if train_path else None
    self.eval = load_npz(eval_path, vocab_size) if eval_path else None
    self.valid = load_npz(valid_path, vocab_size) if valid_path else None
    self.max_len = max(d[0].shape[1] for d in (self.train, self.eval, self.valid)
                       if d is not None)
    self.max_targets = None

  def train_batch(self, seed, step, batch_size):
    if self.train is None:
      raise ValueError("task npz has no task.train_path to train on")
    rows = rng_for(seed, TRAIN, step).integers(0, self.train[0].shape[0], batch_size)
    return self.train[0][rows], self.train[1][rows]

  def eval_sets(self, seed, num_examples):
    del seed, num_examples  # the file is the evaluation set
    return {"npz": self.eval} if self.eval is not None else {}

  def validation_sets(self, seed, num_examples):
    del seed, num_examples
    if self.valid is None:
      raise ValueError("task npz: choosing a learning rate needs a validation file apart from "
                       "the test file; set task.valid_path")
    return {"npz": self.valid}


def make_task(name, fields):
  """Builds task `name` ("mqar", "copy", "npz" or "text") from a dict of its fields. The field `pack`
  (default 1: off) packs that many examples into each training row (`PackedTask`)."""
  fields = dict(fields)
  pack = fields.pop("pack", 1)
  if not isinstance(pack, int) or isinstance(pack, bool) or pack < 1:
    raise ValueError(f"task.pack must be an int >= 1 (examples per training row; 1: no "
                     f"packing); got {pack!r}")
  task = _make_task(name, fields)
  return PackedTask(task, pack) if pack > 1 else task


def _make_task(name, fields):
  try:
    if name == "mqar":
      return MQARTask(mqar.MQARConfig(**fields))
    if name == "copy":
      return CopyTask(copy_task.CopyConfig(**fields))
    if name == "npz":
      return NpzTask(**fields)
    if name == "text":
      return text.TextTask(text.TextConfig(**fields))
  except TypeError as e:
    raise ValueError(f"task {name!r}: bad field(s): {e}") from None
  raise ValueError(f"unknown task {name!r}; choose one of 'mqar', 'copy', 'npz', 'text'")
