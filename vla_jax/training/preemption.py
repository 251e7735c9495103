"""Stopping a training loop cleanly on SIGTERM, so that a preempted run loses no step.

A job scheduler (or `experiments/grid.py` at its deadline) sends SIGTERM; the training loop
(`loop.train_loop`, of `train_and_evaluate` and `train_sweep`) checks `StopSignal.requested`
after every step, stops, and saves a checkpoint at the step it reached. It saves every
checkpoint, the last one too, inside the `StopSignal` block, so a SIGTERM during a save lets
it finish. Re-running with the
same workdir resumes there, with the same result as an uninterrupted run (batches are a pure
function of seed and step).
"""

import signal
import threading


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

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(self.signum, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(self.signum, self._previous)
      self._previous = None
    return False
