"""CPU timings of vla_recurrence's pure-JAX forms: chunked vs associative_scan vs scan.

    python experiments/bench_impls_cpu.py [--lengths=256,1024,4096] [--heads=4] [--dim=64]

Forward only, float32, B = 1; each time is the median of --repeats runs after one warm-up
(compile) call. Speed claims for the GPU are made by the GPU benchmarks, not here.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from vla_jax.benchmarks.measure import median_seconds
from vla_jax import vla_recurrence

_LENGTHS = flags.DEFINE_list("lengths", ["256", "1024", "4096"], "Sequence lengths T.")
_IMPLS = flags.DEFINE_list("impls", ["chunked", "associative_scan", "scan"], "Impls to time.")
_HEADS = flags.DEFINE_integer("heads", 4, "Heads H.")
_DIM = flags.DEFINE_integer("dim", 64, "Head dim dk = dv.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per cell (median reported).")


def main(argv):
  del argv
  H, d = _HEADS.value, _DIM.value
  print(f"vla_recurrence forward on {jax.devices()[0].platform.upper()}, "
        f"B=1, H={H}, dk=dv={d}, float32, median of {_REPEATS.value} (ms)")
  header = f"{'T':>6} | " + " | ".join(f"{impl:>16}" for impl in _IMPLS.value)
  print(header + f" | {'scan / chunked':>14}")
  print("-" * len(header + " | scan / chunked"))
  for T in map(int, _LENGTHS.value):
    key = jax.random.split(jax.random.key(T), 4)
    q, k, v = (jax.random.normal(key[i], (1, T, H, d), jnp.float32) for i in range(3))
    u = jax.random.normal(key[3], (1, T, H, d), jnp.float32) / np.sqrt(d)
    ms = {}
    for impl in _IMPLS.value:
      fn = jax.jit(functools.partial(vla_recurrence, impl=impl))
      ms[impl] = 1e3 * median_seconds(fn, (q, k, v, u), repeats=_REPEATS.value)
    ratio = (f"{ms['scan'] / ms['chunked']:14.1f}" if {"scan", "chunked"} <= ms.keys()
             else " " * 14)
    print(f"{T:>6} | " + " | ".join(f"{ms[i]:16.2f}" for i in _IMPLS.value) + f" | {ratio}")


if __name__ == "__main__":
  app.run(main)
