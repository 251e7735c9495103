"""`train_and_evaluate`: the training loop behind experiments/train.py, and `evaluate`."""

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vla_jax.models import LanguageModel
from vla_jax.tasks import IGNORE
from vla_jax.tasks import copy as copy_task
from vla_jax.tasks import text as text_task
from vla_jax.tasks.common import check_examples, check_int
from vla_jax.training import checkpoint as ckpt
from vla_jax.training import curves
from vla_jax.training import distributed
from vla_jax.training import loop
from vla_jax.training import probe as probe_lib
from vla_jax.training import provenance
from vla_jax.training import sharding
from vla_jax.training.config import ExperimentConfig, TrainConfig, data_seed_of

METRICS_FILE = curves.METRICS_FILE


def make_optimizer(train: TrainConfig):
  """AdamW (decay on >= 2-D parameters) with linear warmup and cosine decay, after global-norm
  gradient clipping."""
  warmup = min(train.warmup_steps, train.num_steps)
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate, warmup_steps=warmup,
      decay_steps=max(train.num_steps, warmup + 1),
      end_value=train.learning_rate * train.end_lr_ratio)
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  adamw = optax.adamw(schedule, b1=train.b1, b2=train.b2, weight_decay=train.weight_decay,
                      mask=decay_mask)
  clip = optax.clip_by_global_norm(train.grad_clip) if train.grad_clip > 0 else optax.identity()
  return optax.chain(clip, adamw), schedule


def lm_loss(logits, labels):
  """Mean cross-entropy over targets (labels != -100) and per-example target counts.

  Args:
    logits: [B, T, V] float32; labels: [B, T] int.

  Returns:
    (loss scalar, dict of per-example `correct` [B] and `targets` [B] counts, `loss_sum`,
    and `nll` [B, T]: each position's cross-entropy in nats, 0 where there is no target).
  """
  mask = labels != IGNORE
  safe = jnp.where(mask, labels, 0)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
  nll = jnp.where(mask, nll, 0.0)
  targets = mask.sum(axis=1)
  correct = ((jnp.argmax(logits, -1) == labels) & mask).sum(axis=1)
  loss = nll.sum() / jnp.maximum(targets.sum(), 1)
  return loss, {"correct": correct, "targets": targets, "loss_sum": nll.sum(), "nll": nll}


def model_loss(model, inputs, labels, max_targets=None, segment_ids=None):
  """`lm_loss` of `model` on inputs, labels [B, T] (packed rows: with `segment_ids` [B, T],
  `vla_jax.tasks.packing`).

  With `max_targets` (an int, at least every row's number of targets) the output head runs
  only at each row's first `max_targets` target positions (gathered in order; rows with fewer
  are padded with ignored positions): the same loss and counts as the full head, with
  T / max_targets times less head work. For MQAR with zoology's vocabulary of 8,192 the head
  is most of a training step. Rows with more targets than `max_targets` would lose some:
  `check_max_targets` guards the host batches.
  """
  if max_targets is None or max_targets >= labels.shape[1]:
    return lm_loss(model(inputs, segment_ids=segment_ids), labels)
  order = jnp.argsort(labels == IGNORE, axis=1, stable=True)[:, :max_targets]   # targets first
  x = jnp.take_along_axis(model.features(inputs, segment_ids=segment_ids), order[..., None],
                          axis=1)
  return lm_loss(model.head_logits(x), jnp.take_along_axis(labels, order, axis=1))


def eval_counts(model, inputs, labels, max_targets=None, buckets=0):
  """Per-example sums of one evaluation batch inputs, labels [B, T].

  Returns:
    {"counts": int [B, 2] of (correct, targets)}; with `buckets` K > 0 also "nll" float32
    [B, K], the summed cross-entropy (nats) of the targets in each of K equal position
    buckets over T (position t in bucket t * K // T), and "scored" int32 [B, K], their
    numbers of targets. Buckets need the full head (`max_targets` is then not used).
  """
  _, aux = model_loss(model, inputs, labels, None if buckets else max_targets)
  out = {"counts": jnp.stack([aux["correct"], aux["targets"]], axis=1)}
  if buckets:
    T = labels.shape[1]
    onehot = jax.nn.one_hot(jnp.arange(T) * buckets // T, buckets, dtype=jnp.float32)  # [T, K]
    out["nll"] = jnp.dot(aux["nll"], onehot, precision=jax.lax.Precision.HIGHEST)
    scored = jnp.dot((labels != IGNORE).astype(jnp.float32), onehot,   # exact: counts <= T
                     precision=jax.lax.Precision.HIGHEST)
    out["scored"] = jnp.round(scored).astype(jnp.int32)
  return out


def eval_buckets(name):
  """Position buckets of evaluation set `name`: text sets `text_task.POSITION_BUCKETS`, other
  sets none (0)."""
  return text_task.POSITION_BUCKETS if text_task.is_text_set(name) else 0


def most_targets(labels):
  """The largest number of targets in a row of labels [..., T] (host arrays)."""
  return int((np.asarray(labels) != IGNORE).sum(axis=-1).max(initial=0))


def check_max_targets(labels, max_targets, where="batch"):
  """Raises ValueError if a row of labels [..., T] has more than `max_targets` targets."""
  if max_targets is None:
    return
  most = most_targets(labels)
  if most > max_targets:
    raise ValueError(f"{where}: a row has {most} targets, more than the task's "
                     f"max_targets={max_targets}")


class Trainer:
  """Holds the model definition, optimizer and jitted steps of one experiment."""

  def __init__(self, config: ExperimentConfig, mesh=None):
    self.config = config
    self.mesh = mesh or sharding.make_mesh(seq_devices=config.train.seq_devices)
    config.train.validate(self.mesh.size, self.mesh.shape[sharding.SEQ_AXIS])
    self.task = config.make_task()
    self.max_targets = getattr(self.task, "max_targets", None)
    model = LanguageModel(config.model, rngs=nnx.Rngs(config.train.seed))
    self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
    self.tx, self.schedule = make_optimizer(config.train)
    self.init_state = sharding.replicate(self.mesh, {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": self.tx.init(params),
    })
    repl = sharding.replicated(self.mesh)
    tokens = sharding.token_sharding(self.mesh)
    self._jit_train_step = jax.jit(self._on_mesh(self._train_step),
                                   in_shardings=(repl, tokens, tokens, tokens),
                                   out_shardings=(repl, repl), donate_argnums=0)
    # Sums replicated: every process reads them whole (one process or several).
    self.eval_step = jax.jit(self._on_mesh(self._eval_step), in_shardings=(repl, tokens, tokens),
                             out_shardings=repl, static_argnums=(3, 4))
    # params, probe inputs -> {name: scalar} (`probe`; train.diagnostics_every > 0).
    self.probe_step = jax.jit(functools.partial(probe_lib.probe_metrics, self.model))

  def _on_mesh(self, step):
    """`step` traced with the mesh as the ambient one: the mixers see its "seq" axis."""
    def traced(*args):
      with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
        return step(*args)
    return traced

  def model(self, params):
    return nnx.merge(self.graphdef, params, self.rest)

  def batches(self, start, end):
    """Yields (step, device batch) for the steps in [start, end): inputs, labels [B, T] (and
    the segment ids [B, T] of packed rows) on the mesh. Each process draws the global batch
    of (seed, step) and transfers the part its devices hold (`sharding.shard_batch`)."""
    tc = self.config.train
    for step in range(start, end):
      batch = self.task.train_batch(data_seed_of(tc), step, tc.batch_size)  # (+ segment_ids)
      check_max_targets(batch[1], self.max_targets, where=f"train batch {step}")
      yield step, sharding.shard_batch(self.mesh, *batch)

  def train_step(self, state, inputs, labels, segment_ids=None):
    """One optimizer step on inputs, labels [B, T] (and the segment ids [B, T] of packed
    rows, `vla_jax.tasks.packing`); returns (state, metrics)."""
    return self._jit_train_step(state, inputs, labels, segment_ids)

  def _train_step(self, state, inputs, labels, segment_ids=None):
    def loss_fn(params):
      loss, aux = model_loss(self.model(params), inputs, labels, self.max_targets, segment_ids)
      return loss, aux

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
    updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    metrics = {"loss": loss,
               "accuracy": aux["correct"].sum() / jnp.maximum(aux["targets"].sum(), 1),
               "grad_norm": optax.tree.norm(grads),
               "lr": self.schedule(state["step"])}
    if self.config.train.diagnostics_every:
      metrics.update(probe_lib.group_norms(grads, "grad"))
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

  def _eval_step(self, params, inputs, labels, max_targets, buckets=0):
    return eval_counts(self.model(params), inputs, labels, max_targets, buckets)

  def evaluate(self, params, eval_sets):
    """Scores `params` on {name: (inputs, labels)}; returns {name: {accuracy, exact_match,
    targets}} (Copy adds generated_accuracy and generated_exact_match; text sets add loss,
    bits_per_byte and bits_per_byte_by_position, `text_scores`). Sets are run in batches of
    eval_batch_size, the last one padded with ignored rows."""
    bs = self.config.train.eval_batch_size
    results = {}
    for name, (inputs, labels) in eval_sets.items():
      # Ids past the embedding would score as NaN logits, not fail.
      check_examples(inputs, labels, self.config.model.vocab_size, where=f"evaluation set {name}")
      most = most_targets(labels)     # the head runs at target positions only
      buckets = eval_buckets(name)
      sums = [jax.tree.map(lambda a, n=n: np.asarray(a)[:n],
                           self.eval_step(params, *sharding.shard_batch(self.mesh, x, y), most,
                                          buckets))
              for x, y, n in eval_batches(inputs, labels, bs)]
      sums = ({k: np.concatenate([s[k] for s in sums]) for k in sums[0]} if sums
              else {"counts": np.zeros((0, 2), np.int64)})
      results[name] = count_scores(sums["counts"], where=f"evaluation set {name}")
      if buckets:
        results[name].update(text_scores(sums["nll"], sums["scored"]))
      if name.startswith(copy_task.SET_PREFIX):   # Copy data (from any run's task)
        results[name].update(generation_scores(self.model(params), inputs, bs))
    return results


def eval_batches(inputs, labels, batch_size, axis=0):
  """Splits `inputs`, `labels` along `axis` into batches of `batch_size`, the last one padded
  with ignored rows. Yields (inputs, labels, rows that are real)."""
  size = inputs.shape[axis]
  for lo in range(0, size, batch_size):
    index = (slice(None),) * axis + (slice(lo, lo + batch_size),)
    x, y = inputs[index], labels[index]
    n = x.shape[axis]
    if n < batch_size:
      widths = [(0, 0)] * x.ndim
      widths[axis] = (0, batch_size - n)
      x = np.pad(x, widths)
      y = np.pad(y, widths, constant_values=IGNORE)
    yield x, y, n


def count_scores(counts, where="evaluation set"):
  """Scores from per-example counts [N, 2] of (correct, targets): accuracy (per target),
  exact_match (share of the examples with targets that have every target right; an example
  without targets is not scored) and targets.

  Raises:
    ValueError: no example has a target (`where` names the set): there is nothing to score.
  """
  counts = np.asarray(counts)
  scored = counts[:, 1] > 0
  if not scored.any():
    raise ValueError(f"{where}: no example has a target (every label is {IGNORE}, or there are "
                     f"no examples: {len(counts)}): nothing to score")
  targets = int(counts[:, 1].sum())
  return {"accuracy": float(counts[:, 0].sum() / targets),
          "exact_match": float(np.mean(counts[scored, 0] == counts[scored, 1])),
          "targets": targets}


def text_scores(nll, scored):
  """Scores from per-example bucket sums nll [N, K] (nats) and scored [N, K] (targets) of
  `eval_counts`: loss (mean nats per target byte), bits_per_byte (loss / ln 2) and
  bits_per_byte_by_position (the same per position bucket, first to last; None for an empty
  bucket)."""
  nll, scored = np.asarray(nll, np.float64).sum(0), np.asarray(scored, np.int64).sum(0)
  loss = float(nll.sum() / max(int(scored.sum()), 1))
  return {"loss": loss, "bits_per_byte": text_task.bits(loss),
          "bits_per_byte_by_position": [text_task.bits(float(a / b)) if b else None
                                        for a, b in zip(nll, scored)]}


def generation_scores(model, inputs, batch_size):
  """Copy scored by greedy generation (no teacher forcing): the prompt is the string and SEP,
  the model generates the string back. Returns generated token accuracy and exact match."""
  prompts, strings = copy_task.generation_split(inputs)
  hits = []
  for lo in range(0, prompts.shape[0], batch_size):
    out = model.generate(prompts[lo:lo + batch_size], strings.shape[1])
    hits.append(np.asarray(out[:, prompts.shape[1]:]) == strings[lo:lo + batch_size])
  hits = np.concatenate(hits)
  return {"generated_accuracy": float(hits.mean()),
          "generated_exact_match": float(hits.all(axis=1).mean())}


def _headline(results, key):
  """`key` of the first evaluation set (for Copy, the first length); None with no evaluation
  (a run stopped before its final one), so that the summary stays strict JSON."""
  return next(iter(results.values()))[key] if results else None


def train_and_evaluate(config: ExperimentConfig, workdir, *, stop_after=None, mesh=None,
                       log=print):
  """Trains `config` in `workdir`, resuming from its latest checkpoint if there is one.

  Writes `workdir/config.json`, `workdir/metrics.jsonl` (one JSON row per log step and per
  evaluation; training rows after the first step of a segment carry `steps_per_s` and
  `tokens_per_s` (input tokens of a step, padding included, times steps/s; compilation left
  out); the first training row of each segment adds `compile_s`, the time of its first
  step, which compiles, and `git_commit`; with `train.diagnostics_every` = N > 0 the rows
  add gradient norms by group, and a "diagnostics" row comes at step 0 and every N steps,
  `probe`), orbax checkpoints under
  `workdir/checkpoints` and, with `config.train.tensorboard`, TensorBoard scalars under
  `workdir/tb`. Progress lines give
  steps/s without compilation, evaluations and checkpoints, and the time left.

  A run of several processes (`distributed.initialize` first) calls this on every process
  with the same arguments: the mesh then spans every process's devices, process 0 writes the
  files and calls `log` (`distributed`), and every process returns the summary.

  Args:
    config: an `ExperimentConfig` (see `vla_jax.training.config.from_config_dict`).
    workdir: output folder.
    stop_after: stop (with a checkpoint) once this many steps (an int >= 1) are done, as an
      interruption would, and evaluate there; the schedule still follows
      `config.train.num_steps`. None runs to the end. A SIGTERM stops the run too, after
      the step in flight, with a checkpoint at that step and no evaluation (`evals` None
      unless a periodic one fell on that step); rerunning with the same workdir resumes
      there. With several processes a SIGTERM to any of them stops all after the same step
      (`preemption.PreemptionSync`).
    mesh: a `jax.sharding.Mesh` with axes "data" and "seq" (`sharding.make_mesh`; default:
      every device of every process, train.seq_devices of them along each sequence).
    log: called with each progress line (on process 0).

  Raises:
    lock.WorkdirInUseError: another run holds `workdir` (see `lock`).

  Returns:
    A summary dict: task, mixer, accuracy (first evaluation set), exact_match, for the text
    task bits_per_byte (first set), evals (all sets), steps, train_loss (the last logged),
    wall_s (over every segment of a resumed run, as the metrics rows' `elapsed_s`),
    compile_s (this segment's first step; None when it trained none), devices (of every
    process), processes, workdir, git_commit (`provenance.git_commit`). The scores are
    always those of step `steps`, never of an earlier periodic evaluation: a run stopped by
    SIGTERM has accuracy, exact_match and evals None. No NaN appears, so the summary dumps as
    strict JSON.
  """
  start_time = time.time()
  if stop_after is not None:
    check_int("stop_after", stop_after, 1)
  trainer = Trainer(config, mesh)
  with distributed.hold_workdir(workdir):
    return _train(trainer, workdir, stop_after, log, start_time)


def _train(trainer, workdir, stop_after, log, start_time):
  """The body of `train_and_evaluate`, run while it holds `workdir`."""
  config = trainer.config
  tc = config.train
  ckpt.write_config(workdir, config.to_json())
  eval_sets = trainer.task.eval_sets(data_seed_of(tc), tc.eval_examples)
  probe = (probe_lib.probe_inputs(trainer.task, data_seed_of(tc), tc.batch_size)
           if tc.diagnostics_every else None)
  params = sum(p.size for p in jax.tree.leaves(trainer.init_state["params"]))
  out = loop.train_loop(loop.Steps(
      init_state=trainer.init_state, train_step=trainer.train_step, batches=trainer.batches,
      header=(f"task={trainer.task.name} mixer={config.model.mixer} "
              f"devices={trainer.mesh.size} params={params}"),
      probe=None if probe is None else lambda params: trainer.probe_step(params, probe),
      evaluate=lambda params: trainer.evaluate(params, eval_sets)),
                        workdir, tc, stop_after=stop_after, log=log, start_time=start_time)
  results = out.evals
  return {
      "task": trainer.task.name,
      "mixer": config.model.mixer,
      "accuracy": _headline(results, "accuracy"),
      "exact_match": _headline(results, "exact_match"),
      **({"bits_per_byte": _headline(results, "bits_per_byte")}
         if trainer.task.name == text_task.TextTask.name else {}),
      "evals": results,
      "steps": out.step,
      "train_loss": out.loss,
      "wall_s": out.wall_s(),
      "compile_s": out.compile_s and round(out.compile_s, 2),
      "devices": trainer.mesh.size,
      "processes": jax.process_count(),
      "workdir": os.path.abspath(workdir),
      "git_commit": out.git_commit,
  }


def config_from_workdir(workdir):
  """The `ExperimentConfig` a training run in `workdir` saved."""
  from vla_jax.training.config import from_config_dict  # pylint: disable=import-outside-toplevel

  saved = ckpt.read_config(workdir)
  model = dict(saved["model"])
  model["options"] = {model["mixer"]: model.pop("mixer_options")}
  return from_config_dict({"task": saved["task"], "model": model, "train": saved["train"]})


def evaluation_mesh(config, devices=None):
  """A data mesh over the most visible devices that split both batch sizes of `config`:
  scoring a run on a host with another device count (4 or 8 GPUs against a batch of 250, say)
  needs no new configuration."""
  devices = jax.devices() if devices is None else devices
  tc = config.train
  return sharding.make_mesh(devices[:splitting_devices(len(devices), tc.batch_size,
                                                       tc.eval_batch_size)])


def splitting_devices(available, *batch_sizes):
  """The most devices, up to `available`, that split every one of `batch_sizes`."""
  return max(k for k in range(1, available + 1) if all(b % k == 0 for b in batch_sizes))


def load_model(workdir, step=None):
  """The trained `LanguageModel` of the run in `workdir` (latest checkpoint, or `step`)."""
  config = config_from_workdir(workdir)
  trainer = Trainer(config, evaluation_mesh(config))
  checkpointer = ckpt.Checkpointer(workdir)
  state = checkpointer.restore(trainer.init_state, step)
  checkpointer.close()
  return trainer.model(state["params"])


def evaluate(workdir, *, task=None, npz_path=None, eval_examples=None, step=None, mesh=None,
             eval_batch_size=None):
  """Scores the checkpoint in `workdir` (latest, or `step`).

  Args:
    workdir: a training run's folder (holds config.json and checkpoints/).
    task: None for the run's own task, or (name, fields) of another task configuration.
    npz_path: an external `.npz` with `inputs` and `labels` to score instead of a task.
    eval_examples: examples per evaluation set (an int >= 1; default: the run's setting).
    eval_batch_size: rows per evaluation batch (default: the run's setting); lower it for
      contexts much longer than the training one (softmax attention's XLA path holds a
      [rows, heads, T, T] score matrix).
    mesh: default `evaluation_mesh(config)`: the most visible devices that split the run's
      batch sizes.

  Returns:
    {"step": ..., "evals": {name: {accuracy, exact_match, targets}} (text sets add loss,
    bits_per_byte and bits_per_byte_by_position), "git_commit": ...}.

  Raises:
    ValueError: a user's mistake (no run in `workdir`, no checkpoint at `step`, a data file
      with wrong keys, token ids outside the vocabulary, sequences longer than the learned
      positions); `checkpoint.CheckpointError` (a ValueError) when no checkpoint verifies.
  """
  from vla_jax.tasks import load_npz  # pylint: disable=import-outside-toplevel

  config = config_from_workdir(workdir)
  if eval_batch_size is not None:
    check_int("eval_batch_size", eval_batch_size, 1)
    config = dataclasses.replace(config, train=dataclasses.replace(
        config.train, eval_batch_size=int(eval_batch_size)))
  tc = config.train
  n = tc.eval_examples if eval_examples is None else check_int("eval_examples", eval_examples, 1)
  if npz_path:
    eval_sets = {"npz": load_npz(npz_path, config.model.vocab_size)}
  elif task is not None:
    from vla_jax.tasks import make_task  # pylint: disable=import-outside-toplevel
    eval_sets = make_task(task[0], task[1]).eval_sets(data_seed_of(tc), n)
  else:
    eval_sets = config.make_task().eval_sets(data_seed_of(tc), n)
  longest = max(x.shape[1] for x, _ in eval_sets.values())
  if longest > config.model.max_len:
    if config.model.pos_emb == "learned":
      raise ValueError(f"evaluation sequences of length {longest} exceed the model's learned "
                       f"positions (max_len={config.model.max_len})")
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, max_len=longest))
  trainer = Trainer(config, mesh or evaluation_mesh(config))
  checkpointer = ckpt.Checkpointer(workdir)
  state = checkpointer.restore(trainer.init_state, step)
  checkpointer.close()
  return {"step": int(state["step"]), "evals": trainer.evaluate(state["params"], eval_sets),
          "git_commit": provenance.git_commit()}
