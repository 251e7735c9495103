"""Stopping a training loop cleanly on SIGTERM, so that a preempted run loses no step.

A job scheduler (or `experiments/grid.py` at its deadline) sends SIGTERM; the training loop
(`loop.train_loop`, of `train_and_evaluate` and `train_sweep`) asks `stop_request()`'s object
after every step whether to stop (`reached`), stops, and saves a checkpoint at the step it
reached. It saves every checkpoint, the last one too, inside the `with` block, so a SIGTERM
during a save lets it finish. Re-running with the same workdir resumes there, with the same
result as an uninterrupted run (batches are a pure function of seed and step).

One process: `StopSignal` turns SIGTERM into a flag inside the block. Several processes
(`jax.distributed` initialized): `PreemptionSync`, JAX's preemption service, which holds
SIGTERM from `jax.distributed.initialize` on (it never ends such a process) and, once any
process receives one, makes every process stop after the same step: the next step of the one
furthest ahead, agreed through the coordination service within about a second.
"""

import signal
import threading

import jax
from jax.experimental import multihost_utils


class StopSignal:
  """A context manager that turns SIGTERM into a flag instead of ending the process.

  Outside the main thread (where Python cannot install signal handlers) it does nothing and
  `requested` stays False. The previous handler is restored on exit.

  Attributes:
    requested: True once a SIGTERM arrived inside the `with` block.
  """

  def __init__(self, signum=signal.SIGTERM):
    self.signum = signum
    self.requested = False
    self._previous = None

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def reached(self, steps):
    """Whether to stop after the segment's `steps`-th step: a SIGTERM arrived (`requested`,
    which a later SIGTERM sets at any time)."""
    del steps
    return self.requested

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(self.signum, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(self.signum, self._previous)
      self._previous = None
    return False


class PreemptionSync:
  """Every process of a multi-process run stops after the same step once any of them got a
  SIGTERM (`jax.experimental.multihost_utils.reached_preemption_sync_point`): a context
  manager with `StopSignal`'s interface.

  Every process must call `reached` after each step of the segment, counting them from 1, as
  the training loop does; a SIGTERM that came before the first call stops the run after the
  first step.

  Attributes:
    requested: True once the agreed step was reached (set by `reached` only, so every
      process sees it change after the same step).
  """

  def __init__(self):
    self.requested = False

  def reached(self, steps):
    """Whether to stop now, after the segment's `steps`-th step (the same answer on every
    process)."""
    self.requested = self.requested or multihost_utils.reached_preemption_sync_point(steps)
    return self.requested

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def stop_request():
  """`PreemptionSync` where `jax.distributed` is initialized, `StopSignal` otherwise."""
  return PreemptionSync() if jax.distributed.is_initialized() else StopSignal()
