"""Wall-clock timing shared by the benchmark scripts."""

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
