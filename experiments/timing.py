"""Wall-clock timing shared by the benchmark scripts."""

import argparse
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


def ms(fn, args, reps, warmup):
  """`median_seconds` in milliseconds."""
  return 1e3 * median_seconds(fn, args, repeats=reps, warmup=warmup)


def profile_parser(description, *, tokens, variants):
  """The flags the profiling scripts share: --out, --Ts, --reps, --warmup, --variants (default
  `variants`), --tokens (B * T, default `tokens`) and --dim."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--out", default=".")
  parser.add_argument("--Ts", default="4096,32768")
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=2,
                      help="untimed calls before each timing (the first compiles)")
  parser.add_argument("--variants", default=variants)
  parser.add_argument("--tokens", type=int, default=tokens, help="B * T (smaller: CPU smoke)")
  parser.add_argument("--dim", type=int, default=64, help="head dim d (dk = dv; 64 or 128)")
  return parser


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
