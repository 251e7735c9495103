"""`train_loop`: the loop of `train_and_evaluate` (one run) and `train_sweep` (R runs stacked
and vmapped).

It resumes from the workdir's latest checkpoint that verifies, runs the steps, appends a metrics
row every `train.log_every` steps (and at the last step, and at a SIGTERM's), probes the layers
every `train.diagnostics_every` steps, evaluates every `train.eval_every` steps and at the end,
saves a checkpoint every `train.checkpoint_every` steps and at the end, and stops after the step
in flight on SIGTERM with a checkpoint at that step (`preemption.stop_request`). Progress lines
give the first step's compile time apart and steps/s without it (`progress.Progress`). What
differs between a run and a sweep is given by `Steps`: the step, the batches, the probe, the
evaluation and the state's shape (`Steps.runs`).

With several processes (`distributed`) every process runs the loop alike (each step, metric
read, probe, evaluation and checkpoint is a collective operation), and process 0 alone writes
the rows and calls `log`.
"""

import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Optional

import jax
import numpy as np

from vla_jax.training import checkpoint as ckpt
from vla_jax.training import curves
from vla_jax.training import distributed
from vla_jax.training import jsonl
from vla_jax.training import preemption
from vla_jax.training import probe as probe_lib
from vla_jax.training import progress as progress_lib
from vla_jax.training import provenance


@dataclasses.dataclass(frozen=True)
class Steps:
  """What `train_loop` trains.

  Attributes:
    init_state: {"step": int32 [], "params", "opt_state"} at step 0; a restored checkpoint takes
      its structure, shapes and shardings.
    train_step: (state, *batch) -> (state, metrics): one optimizer step; metrics are {name:
      scalar} for one run, {name: [R]} for R stacked runs. It may donate the state.
    batches: (start, end) -> iterable of (step, batch) for the steps in [start, end), batch the
      arguments of `train_step` after the state, batch[0] the step's input tokens.
    header: the start line, before " steps START->END".
    runs: None for one run; R for R stacked runs: the metrics rows hold a list over the runs of
      each value, a diverged run's NaN loss is logged rather than raised, and checkpoints may
      hold non-finite values.
    probe: params -> {name: value} of the fixed probe batch (`probe`), logged as "diagnostics"
      rows at step 0 and every train.diagnostics_every steps; None for none.
    evaluate: params -> {set: scores} (`train.Trainer.evaluate`), logged as "eval" rows every
      train.eval_every steps and at the last step (not after a SIGTERM); None for none.
  """

  init_state: Any
  train_step: Callable
  batches: Callable[[int, int], Iterable]
  header: str
  runs: Optional[int] = None
  probe: Optional[Callable] = None
  evaluate: Optional[Callable] = None


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What `train_loop` ends with.

  Attributes:
    state: the state at `step`.
    step: the last step done (and checkpointed).
    stopped: whether a SIGTERM stopped the loop.
    evals: `Steps.evaluate`'s scores of `step`; None without `evaluate` or when stopped (never
      an earlier step's).
    loss: the last logged loss at or before `step` (a float, or a list over the runs); None when
      steps were done but none of them was logged.
    compile_s: the time of this segment's first step, which compiles (None when it ran none).
    git_commit: `provenance.git_commit()`.
    before: seconds that earlier segments of the run spent (their rows' `elapsed_s`).
    start_time: when this segment started (`time.time()`).
  """

  state: Any
  step: int
  stopped: bool
  evals: Any
  loss: Any
  compile_s: Optional[float]
  git_commit: Optional[str]
  before: float
  start_time: float

  def wall_s(self):
    """Seconds of wall time over every segment of the run, up to now."""
    return round(self.before + time.time() - self.start_time, 2)


def train_loop(steps: Steps, workdir, train, *, stop_after=None, log=print, start_time=None):
  """Trains `steps` in `workdir` (which holds its config.json) to step `train.num_steps`, or
  `stop_after` (an int >= 1) if it comes first, resuming from its latest checkpoint.

  Args:
    steps: the `Steps` to run.
    workdir: the run's folder: checkpoints/, metrics.jsonl and, with `train.tensorboard`, tb/.
    train: the `TrainConfig`.
    stop_after: stop with a checkpoint once this many steps are done; None runs to the end.
    log: called with each progress line (on process 0).
    start_time: when this segment started (default now): the origin of the rows' elapsed_s.

  Returns:
    An `Outcome`.

  Raises:
    FloatingPointError: a single run's logged loss is not finite.
  """
  start_time = time.time() if start_time is None else start_time
  tc = train
  primary = distributed.is_primary()
  if not primary:
    log = lambda line: None
  checkpointer = ckpt.Checkpointer(workdir, keep=tc.keep_checkpoints, finite=steps.runs is None)
  state, start = steps.init_state, 0
  if checkpointer.latest_step() is not None:
    state = checkpointer.restore(state)
    start = int(state["step"])
    log(f"resumed from step {start} in {checkpointer.directory}")
  end = tc.num_steps if stop_after is None else min(tc.num_steps, stop_after)
  log(f"{steps.header} steps {start}->{end}")
  metrics_path = os.path.join(workdir, curves.METRICS_FILE)
  # The last logged row at or before `start`: its loss (a run stopped after its last step, during
  # its evaluation, resumes with no step left to log) and the time of the earlier segments.
  last = ckpt.logged_row(metrics_path, start) if start else None  # read once, at resume
  before = ckpt.elapsed_of(last)
  loss = last["loss"] if last else None
  commit = provenance.git_commit()
  writer = (curves.TensorBoardWriter(os.path.join(workdir, curves.TENSORBOARD_DIR),
                                     labels=curves.run_labels(workdir))
            if tc.tensorboard and primary else None)

  def log_row(row):
    if primary:
      jsonl.append_rows(metrics_path, [row])
    if writer is not None:
      writer.write(row)

  def run_probe(step, params):
    log_row(probe_lib.row(step, steps.probe(params)))

  def run_eval(step, params):
    with progress.paused():
      results = steps.evaluate(params)
      log_row({"step": step, "eval": results, "git_commit": commit})
    log(_eval_line(step, results))
    return results

  probe = steps.probe is not None and tc.diagnostics_every
  if probe and start == 0:
    run_probe(0, state["params"])
  progress = progress_lib.Progress(start, end)
  evals, evals_step = None, None
  segment = {}   # added to the segment's first training row: its compile time and commit
  try:
    with preemption.stop_request() as stop:
      for step, batch in steps.batches(start, end):
        state, metrics = steps.train_step(state, *batch)
        done = step + 1
        # Asked once a step, before waiting for its results (several processes agree on the
        # step to stop after; `requested` changes only here then).
        stop.reached(done - start)
        segment = progress.segment_start(done, metrics, commit, log) or segment
        if done % tc.log_every == 0 or done == end or stop.requested:
          values = _values(jax.device_get(metrics), steps.runs)
          loss = values["loss"]
          rate, timing = progress.describe(done)
          row = {"step": done, **values,
                 **({"steps_per_s": rate, "tokens_per_s": rate * batch[0].size}
                    if rate is not None else {}),
                 "elapsed_s": round(before + time.time() - start_time, 2), **segment}
          segment = {}
          log_row(row)
          log(f"step {done}/{tc.num_steps} {_loss_line(values, steps.runs)}{timing}")
          if steps.runs is None and not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {done}")
        if probe and done % tc.diagnostics_every == 0:
          with progress.paused():
            run_probe(done, state["params"])
        if (steps.evaluate is not None and tc.eval_every and done % tc.eval_every == 0
            and done != tc.num_steps):
          evals, evals_step = run_eval(done, state["params"]), done
        if stop.requested:
          log(f"SIGTERM: stopping at step {done} with a checkpoint")
          break
        if tc.checkpoint_every and done % tc.checkpoint_every == 0 and done != end:
          with progress.paused():
            checkpointer.save(done, state)
      # Still inside the stop request: a SIGTERM during the last save lets it finish (outside,
      # the signal would end a process of one mid-save and a rerun would redo the steps since
      # the previous checkpoint).
      final = checkpointer.finish(state)
    if steps.evaluate is not None and evals_step != final:   # scores of the final step only
      evals = None if stop.requested else run_eval(final, state["params"])
  finally:
    if writer is not None:
      writer.close()
  return Outcome(state=state, step=final, stopped=stop.requested, evals=evals, loss=loss,
                 compile_s=progress.compile_s, git_commit=commit, before=before,
                 start_time=start_time)


def _values(metrics, runs):
  """Host metrics as a row's values: floats for one run, lists of floats over R runs."""
  if runs is None:
    return {k: float(v) for k, v in metrics.items()}
  return {k: np.asarray(v, np.float64).tolist() for k, v in metrics.items()}


def _loss_line(values, runs):
  """The loss part of a progress line: one run's loss, accuracy and learning rate; R runs'
  best and median loss and how many diverged."""
  if runs is None:
    return (f"loss {values['loss']:.4f} acc {values['accuracy']:.4f} "
            f"lr {values['lr']:.2e}")
  losses = np.asarray(values["loss"], np.float64)
  finite = losses[np.isfinite(losses)]
  best = f"{finite.min():.4f}" if finite.size else "nan"
  return (f"loss best {best} median {np.median(losses):.4f} "
          f"diverged {runs - finite.size}/{runs}")


def _eval_line(step, results):
  """The progress line of an evaluation {set: scores}."""
  return f"eval step {step}: " + " ".join(
      f"{k} acc={v['accuracy']:.4f} exact={v['exact_match']:.4f}"
      + (f" generated_exact={v['generated_exact_match']:.4f}"
         if "generated_exact_match" in v else "")
      + (f" bits/byte={v['bits_per_byte']:.4f}" if "bits_per_byte" in v else "")
      for k, v in results.items())
