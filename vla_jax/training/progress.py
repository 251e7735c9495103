"""Step timing for progress lines: compilation apart, steps/s, time left.

The first step of a run (or of a resumed segment) compiles the train step, which takes from
seconds to minutes; counted in, it would make the first steps/s figure meaningless.
`Progress` times that step on its own (`compile_s`), measures steps/s from the end of it with
evaluations and checkpoints left out (`paused`), and estimates the time left from the wall
time per step since the first one (evaluations and checkpoints included, as they will recur).
"""

import contextlib
import time

import jax


def format_seconds(seconds):
  """Seconds as H:MM:SS."""
  seconds = int(round(seconds))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
  """Timing of the steps `start + 1 .. end` of one training segment.

  Call `first_step_done()` once the first step's results are ready (compilation included),
  `rate(done)` and `eta(done)` at each progress line, and wrap evaluations and checkpoints in
  `paused()`.

  Attributes:
    compile_s: seconds from the segment's start to the end of its first step (None before).
  """

  def __init__(self, start, end, clock=time.time):
    self.start, self.end = start, end
    self._clock = clock
    self._began = clock()
    self.compile_s = None
    self._first = None               # when the first step ended
    self._tick = self._tick_step = None
    self._paused = 0.0               # seconds paused since the last tick

  def first_step_done(self):
    now = self._clock()
    self.compile_s = now - self._began
    self._first = self._tick = now
    self._tick_step = self.start + 1
    self._paused = 0.0
    return self.compile_s

  def segment_start(self, done, metrics, commit, log):
    """At the segment's first step (`done == start + 1`): waits for `metrics`, logs the
    compile time once and returns the fields of the segment's first metrics row (compile_s,
    git_commit); at later steps returns None."""
    if done != self.start + 1:
      return None
    jax.block_until_ready(metrics)
    segment = {"compile_s": round(self.first_step_done(), 2), "git_commit": commit}
    log(f"step {done} took {segment['compile_s']:.1f} s with compilation; steps/s figures "
        "leave it out")
    return segment

  @contextlib.contextmanager
  def paused(self):
    """Time spent inside is not counted as training time in `rate`."""
    began = self._clock()
    try:
      yield
    finally:
      self._paused += self._clock() - began

  def rate(self, done):
    """Steps per second over the steps since the last call (evaluations, checkpoints and the
    first step left out); None at the first step, which has no steps before it to time."""
    if self._first is None or done <= self._tick_step:
      return None
    now = self._clock()
    rate = (done - self._tick_step) / max(now - self._tick - self._paused, 1e-9)
    self._tick, self._tick_step, self._paused = now, done, 0.0
    return rate

  def eta(self, done):
    """Seconds left to step `end` at the wall time per step since the first step; None
    before a second step is done."""
    if self._first is None or done <= self.start + 1:
      return None
    per_step = (self._clock() - self._first) / (done - self.start - 1)
    return per_step * (self.end - done)

  def describe(self, done):
    """' 12.3 steps/s, 0:01:05 left' (the parts known at `done`; rate() is read)."""
    rate, eta = self.rate(done), self.eta(done)
    parts = ([f"{rate:.2f} steps/s"] if rate is not None else []) + (
        [f"{format_seconds(eta)} left"] if eta is not None else [])
    return rate, (" " + ", ".join(parts)) if parts else ""
