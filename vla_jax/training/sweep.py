"""`train_sweep`: every (seed, learning rate) pair of one experiment, trained at once.

The R = len(seeds) * len(learning_rates) runs share one model definition; their parameters and
optimizer states are stacked along a leading axis and one `jax.vmap`-ed step trains them all,
so a small model's sweep costs about one run's kernel launches. Each run is exactly the run
`train_and_evaluate` would make with that seed and learning rate:

- parameters initialised from `nnx.Rngs(seed)`, batches `task.train_batch(seed, step)`;
- the optimizer is `make_optimizer` with peak learning rate 1, its updates scaled by the run's
  rate. AdamW's update is lr(t) (adam(t) + wd p) and the warmup-cosine schedule is linear in
  its peak, so this equals the optimizer built with that peak rate.

Each run is scored on two held-out sets: "test" (`task.eval_sets(seed)`, the set
`train_and_evaluate` reports) and "validation" (`task.validation_sets(seed)`: for generated
tasks drawn with seed + VALIDATION_OFFSET, for `.npz` data the task.valid_path file), so that
a learning rate can be chosen on validation and reported on test.

The stacked state is checkpointed with orbax under `workdir`, so an interrupted sweep resumes
at its last checkpoint; batches are a pure function of (seed, step). A SIGTERM stops the sweep
after the step in flight, with a checkpoint at that step (`preemption.stop_request`).

The sweep is data-parallel as a single run is: the stacked state is replicated over a data
mesh of every device (of every process, `distributed`), each batch [R, B, T] split along B.
"""

import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from vla_jax.models import LanguageModel
from vla_jax.tasks import registry
from vla_jax.tasks.common import check_int
from vla_jax.training import checkpoint as ckpt
from vla_jax.training import distributed
from vla_jax.training import jsonl
from vla_jax.training import loop
from vla_jax.training import probe as probe_lib
from vla_jax.training import sharding
from vla_jax.training.config import ExperimentConfig, data_seed_of
from vla_jax.training.train import (check_max_targets, count_scores, eval_batches,
                                    eval_buckets, eval_counts, generation_scores, model_loss,
                                    most_targets, make_optimizer, text_scores)

VALIDATION_OFFSET = registry.VALIDATION_OFFSET
RESULTS_FILE = "sweep_results.jsonl"


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


class SweepTrainer:
  """The stacked state and the vmapped steps of R runs of one `ExperimentConfig`.

  Args:
    config, seeds, learning_rates: the experiment and its runs.
    mesh: a data mesh (`sharding.make_mesh`; default: every device of every process): the
      state is replicated over it, every batch [R, B, T] split along B.

  Attributes:
    runs: [(seed, learning_rate)] in stacking order (seeds outer, rates inner).
    init_state: {"step": int32 [], "params": pytree with leading axis R, "opt_state": same},
      replicated on the mesh.
  """

  def __init__(self, config: ExperimentConfig, seeds, learning_rates, mesh=None):
    seeds = [int(s) for s in seeds]
    rates = [float(r) for r in learning_rates]
    if not seeds or not rates:
      raise ValueError(f"train_sweep needs at least one seed and one learning rate; got "
                       f"seeds={seeds}, learning_rates={rates}")
    if len(set(seeds)) != len(seeds) or len(set(rates)) != len(rates):
      raise ValueError(f"seeds and learning_rates must not repeat; got {seeds}, {rates}")
    bad = [r for r in rates if not (r > 0 and math.isfinite(r))]
    if bad:
      raise ValueError(f"learning rates must be positive and finite; got {bad}")
    if config.train.seq_devices != 1:
      raise ValueError(f"a sweep splits batches, not sequences; train.seq_devices must be 1, "
                       f"got {config.train.seq_devices}")
    self.mesh = mesh or sharding.make_mesh()
    config.train.validate(self.mesh.size, self.mesh.shape[sharding.SEQ_AXIS])
    self.config = config
    self.seeds, self.rates = seeds, rates
    self.runs = [(s, r) for s in seeds for r in rates]
    self.task = config.make_task()
    self.task.validation_sets(seeds[0], 1)  # fails now, not after training, if there is none
    self.max_targets = getattr(self.task, "max_targets", None)
    per_seed = {}
    for s in seeds:
      graphdef, params, rest = nnx.split(LanguageModel(config.model, rngs=nnx.Rngs(s)),
                                         nnx.Param, ...)
      per_seed[s] = params
    self.graphdef, self.rest = graphdef, rest
    params = _stack([per_seed[s] for s, _ in self.runs])
    self.tx, _ = make_optimizer(dataclasses.replace(config.train, learning_rate=1.0))
    self.lrs = jnp.asarray([r for _, r in self.runs], jnp.float32)
    self.init_state = sharding.replicate(self.mesh, {
        "step": jnp.zeros((), jnp.int32), "params": params,
        "opt_state": jax.vmap(self.tx.init)(params)})
    repl = sharding.replicated(self.mesh)
    self._stacked = NamedSharding(self.mesh, P(None, sharding.DATA_AXIS))   # [R, B, ...]
    self._jit_train_step = jax.jit(self._train_step,
                                   in_shardings=(repl,) + (self._stacked,) * 3,
                                   out_shardings=(repl, repl), donate_argnums=0)
    self.eval_step = jax.jit(jax.vmap(self._eval_one, in_axes=(0, 0, 0, None, None)),
                             in_shardings=(repl, self._stacked, self._stacked),
                             out_shardings=repl, static_argnums=(3, 4))
    # params, probe inputs [R, B, T] -> {name: [R]} (`probe`).
    self.probe_step = jax.jit(jax.vmap(functools.partial(probe_lib.probe_metrics, self.model)))

  @property
  def size(self):
    return len(self.runs)

  def model(self, params):
    """The `LanguageModel` of one run's (unstacked) parameters."""
    return nnx.merge(self.graphdef, params, self.rest)

  def run_params(self, params, index):
    return jax.tree.map(lambda x: x[index], params)

  def _train_one(self, params, opt_state, lr, inputs, labels, segment_ids=None):
    def loss_fn(p):
      return model_loss(self.model(p), inputs, labels, self.max_targets, segment_ids)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = self.tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda x: lr * x, updates)
    params = optax.apply_updates(params, updates)
    acc = aux["correct"].sum() / jnp.maximum(aux["targets"].sum(), 1)
    metrics = {"loss": loss, "accuracy": acc, "grad_norm": optax.tree.norm(grads)}
    if self.config.train.diagnostics_every:
      metrics.update(probe_lib.group_norms(grads, "grad"))
    return params, opt_state, metrics

  def train_step(self, state, inputs, labels, segment_ids=None):
    """One step of every run (`_train_step`), jitted; donates `state`."""
    return self._jit_train_step(state, inputs, labels, segment_ids)

  def _train_step(self, state, inputs, labels, segment_ids=None):
    """inputs, labels (segment_ids of packed rows, or None): [R, B, T]. Returns the new state
    and per-run metrics [R]: loss, accuracy, grad_norm (and with train.diagnostics_every the
    gradient norms by group)."""
    params, opt_state, metrics = jax.vmap(self._train_one)(
        state["params"], state["opt_state"], self.lrs, inputs, labels, segment_ids)
    return {"step": state["step"] + 1, "params": params, "opt_state": opt_state}, metrics

  def _eval_one(self, params, inputs, labels, max_targets=None, buckets=0):
    return eval_counts(self.model(params), inputs, labels, max_targets, buckets)

  def batch(self, step):
    """Host batches of every run at `step`: inputs, labels [R, B, T], and segment ids
    [R, B, T] for a packed task (runs of one seed share their data)."""
    bs = self.config.train.batch_size
    data = {s: self.task.train_batch(data_seed_of(self.config.train, s), step, bs)
            for s in self.seeds}
    for s in self.seeds:
      check_max_targets(data[s][1], self.max_targets, where=f"seed {s} train batch {step}")
    return tuple(np.stack([data[s][i] for s, _ in self.runs])
                 for i in range(len(data[self.seeds[0]])))

  def device_batch(self, step):
    """`batch(step)` on the mesh, split along B (each process transfers its devices' rows)."""
    return tuple(sharding.put(self._stacked, a) for a in self.batch(step))

  def probe_inputs(self):
    """Every run's probe batch (`probe.probe_inputs` of its seed): inputs [R, B, T]."""
    bs = self.config.train.batch_size
    data = {s: probe_lib.probe_inputs(self.task, data_seed_of(self.config.train, s), bs)
            for s in self.seeds}
    return np.stack([data[s] for s, _ in self.runs])

  def eval_sets(self, validation=False):
    """{name: (inputs, labels) [R, N, T]}: each run scored on its own seed's test sets, or
    with validation=True its validation sets (`task.validation_sets`)."""
    n = self.config.train.eval_examples
    sets = self.task.validation_sets if validation else self.task.eval_sets
    per_seed = {s: sets(data_seed_of(self.config.train, s), n) for s in self.seeds}
    names = list(per_seed[self.seeds[0]])
    return {name: (np.stack([per_seed[s][name][0] for s, _ in self.runs]),
                   np.stack([per_seed[s][name][1] for s, _ in self.runs])) for name in names}

  def evaluate(self, params, eval_sets):
    """Per-run scores: a list of R dicts {set name: {accuracy, exact_match, targets}} (Copy
    adds the generation scores, text sets the losses of `text_scores`), as
    `Trainer.evaluate` gives for one run."""
    bs = self.config.train.eval_batch_size
    results = [{} for _ in self.runs]
    for name, (inputs, labels) in eval_sets.items():
      most = most_targets(labels)     # the head runs at target positions only
      buckets = eval_buckets(name)
      sums = [jax.tree.map(lambda a, n=n: np.asarray(a)[:, :n],
                           self.eval_step(params, sharding.put(self._stacked, x),
                                          sharding.put(self._stacked, y), most, buckets))
              for x, y, n in eval_batches(inputs, labels, bs, axis=1)]
      sums = {k: np.concatenate([s[k] for s in sums], axis=1) for k in sums[0]}  # [R, N, ...]
      for r in range(self.size):
        results[r][name] = count_scores(sums["counts"][r], where=f"evaluation set {name}")
        if buckets:
          results[r][name].update(text_scores(sums["nll"][r], sums["scored"][r]))
        if self.task.name == "copy":
          model = self.model(self.run_params(params, r))
          results[r][name].update(generation_scores(model, inputs[r], bs))
    return results


def _prefetch(trainer, start, end, depth=4):
  """Yields trainer.device_batch(step) for step in [start, end), generated ahead on worker
  threads."""
  # Several workers: NumPy's generators and sorts release the GIL, and task data (MQAR at
  # zoology's vocabulary, T = 512: ~6 ms a batch of 128 per seed on a slow CPU core) can
  # otherwise bound the step rate, more so with many processes sharing the host's cores.
  with concurrent.futures.ThreadPoolExecutor(min(depth, 4)) as pool:
    pending = [pool.submit(trainer.device_batch, s)
               for s in range(start, min(end, start + depth))]
    for step in range(start, end):
      batch = pending.pop(0).result()
      if step + depth < end:
        pending.append(pool.submit(trainer.device_batch, step + depth))
      yield step, batch


def train_sweep(config: ExperimentConfig, seeds, learning_rates, workdir, *, stop_after=None,
                log=print):
  """Trains every (seed, learning rate) pair of `config` at once; resumes from `workdir`.

  Args:
    config: the experiment; `config.train.seed` and `learning_rate` are replaced by the runs'.
    seeds, learning_rates: lists; the runs are their product.
    workdir: output folder (config.json, checkpoints/, metrics.jsonl, sweep_results.jsonl);
      with train.diagnostics_every = N > 0 metrics.jsonl has a "diagnostics" row at step 0
      and every N steps, each value a list over the runs (`probe`).
    stop_after: stop with a checkpoint once this many steps (an int >= 1) are done (an
      interruption).
      A SIGTERM stops the sweep the same way, after the step in flight.
    log: called with progress lines.

  With several processes (`distributed`) every process calls it alike and gets the rows;
  process 0 writes the files and calls `log`.

  Raises:
    lock.WorkdirInUseError: another run holds `workdir` (see `lock`).

  Returns:
    [] when stopped before the last step or by a SIGTERM (a rerun with the same workdir
    resumes, or only evaluates); otherwise one dict per run: seed, learning_rate,
    mixer, task, steps, train_loss (None when diverged or unknown), diverged, test and
    validation scores ({set: {accuracy, exact_match, targets, ...}}), wall_s (the whole
    sweep's, over every segment of a resumed one), git_commit (`provenance.git_commit`).
    The same rows are written to `workdir/sweep_results.jsonl` when the sweep finishes.
  """
  start_time = time.time()
  if stop_after is not None:
    check_int("stop_after", stop_after, 1)
  trainer = SweepTrainer(config, seeds, learning_rates)
  with distributed.hold_workdir(workdir):
    return _train_sweep(trainer, workdir, stop_after, log, start_time)


def _train_sweep(trainer, workdir, stop_after, log, start_time):
  """The body of `train_sweep`, run while it holds `workdir`."""
  config = trainer.config
  tc = config.train
  sweep = {"seeds": trainer.seeds, "learning_rates": trainer.rates}
  config_path = os.path.join(workdir, ckpt.CONFIG_FILE)
  if os.path.exists(config_path) and ckpt.read_config(workdir).get("sweep") != sweep:
    raise ValueError(f"{workdir} holds a sweep over other runs "
                     f"({ckpt.read_config(workdir).get('sweep')}); use a new workdir")
  ckpt.write_config(workdir, json.dumps({**json.loads(config.to_json()), "sweep": sweep},
                                        sort_keys=True))
  probe = trainer.probe_inputs() if tc.diagnostics_every else None
  out = loop.train_loop(loop.Steps(
      init_state=trainer.init_state, train_step=trainer.train_step,
      batches=lambda start, end: _prefetch(trainer, start, end),
      header=f"sweep task={trainer.task.name} mixer={config.model.mixer} runs={trainer.size}",
      runs=trainer.size,
      probe=None if probe is None else lambda params: trainer.probe_step(params, probe)),
                        workdir, tc, stop_after=stop_after, log=log, start_time=start_time)
  if out.step < tc.num_steps or out.stopped:   # a rerun evaluates
    return []
  test = trainer.evaluate(out.state["params"], trainer.eval_sets())
  validation = trainer.evaluate(out.state["params"], trainer.eval_sets(validation=True))
  wall = out.wall_s()
  # Per run, the loss of the last logged step (None when unknown: steps done, none logged).
  losses = None if out.loss is None else np.asarray(out.loss, np.float64)
  rows = []
  for r, (seed, lr) in enumerate(trainer.runs):
    known = losses is not None
    rows.append({"task": trainer.task.name, "mixer": config.model.mixer, "seed": seed,
                 "learning_rate": lr, "steps": out.step,
                 "train_loss": float(losses[r]) if known and math.isfinite(losses[r]) else None,
                 "diverged": not math.isfinite(losses[r]) if known else None, "test": test[r],
                 "validation": validation[r], "wall_s": wall, "git_commit": out.git_commit})
  if distributed.is_primary():
    jsonl.write_rows(os.path.join(workdir, RESULTS_FILE), rows)
  return rows
