"""Wall-clock timing shared by the benchmark scripts."""

import json
import os
import statistics
import time

import jax


def median_seconds(fn, args, *, repeats, warmup=1):
  """Median wall time of fn(*args) over `repeats` runs, after `warmup` untimed calls (the first
  compiles); every call is waited for with `jax.block_until_ready`."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


class Rows:
  """JSON rows of a profiling script: `emit` prints one (flushed) and keeps it; `dump` writes
  them all, with the device, to DIR/NAME."""

  def __init__(self):
    self.rows = []

  def emit(self, row):
    print(json.dumps(row), flush=True)
    self.rows.append(row)

  def dump(self, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
      json.dump({"device": str(jax.devices()[0]), "rows": self.rows}, f, indent=1)
