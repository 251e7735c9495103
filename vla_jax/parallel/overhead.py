"""What the sequence-sharded path costs on a mesh of one device, against the plain op.

On one device the sharded `vla_recurrence` does the work every device of a larger mesh does
for its segment: the op on [v, 0] from [0; I] (dv + dk value rows; two calls for Pallas when
dv + dk is not a kernel head dim), dk probe tokens, the segment's Gram and the fold. The
exchange is an all-gather of one device. (The float32 carry of the penalty's boundary error
needs a second device and is not measured here.)
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from vla_jax.ops.vla import vla_recurrence
from vla_jax.parallel.shard import SEQ_AXIS, shard_sequence


def median_ms(fn, args, *, repeats, warmup):
  """Median wall time in ms of fn(*args) over `repeats` calls after `warmup` calls, each
  waited for with `jax.block_until_ready`."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def vla_inputs(B, T, H, d, dtype, seed=0):
  """Random q, k, v [B, T, H, d] and u (unit rows / sqrt(d)) in `dtype`."""
  keys = jax.random.split(jax.random.key(seed), 4)
  q, k, v, u = (jax.random.normal(key, (B, T, H, d), jnp.float32) for key in keys)
  u = u / jnp.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(d)
  return tuple(x.astype(dtype) for x in (q, k, v, u))


def _passes(op, impl, chunk_size):
  """{"fwd": q, k, v, u -> o, "fwd+bwd": -> gradients of sum(o) w.r.t. q, k, v, u}."""
  run = lambda q, k, v, u: op(q, k, v, u, impl=impl, chunk_size=chunk_size)[0]
  loss = lambda *a: jnp.sum(run(*a).astype(jnp.float32))
  return {"fwd": jax.jit(run), "fwd+bwd": jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))}


def _memory(compiled):
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  return {"temp_bytes": int(stats.temp_size_in_bytes),
          "total_bytes": int(stats.temp_size_in_bytes + stats.argument_size_in_bytes
                             + stats.output_size_in_bytes - stats.alias_size_in_bytes)}


def overhead_rows(*, Ts, dims, impls, heads=16, batch=1, dtype=jnp.bfloat16, chunk_size=64,
                  repeats=10, warmup=2, device=None):
  """Yields one row per (impl, d, T, pass) with the plain op's and the sharded op's median
  times (ms), their ratio and XLA's compiled memory (temp and total bytes) for both. The
  sharded op runs on a mesh of `device` alone (default the first device), axis "seq"."""
  device = device or jax.devices()[0]
  mesh = Mesh(np.array([device]), (SEQ_AXIS,))
  sharded = shard_sequence(vla_recurrence, mesh=mesh)
  for impl in impls:
    for d in dims:
      plain_fns = _passes(vla_recurrence, impl, chunk_size)
      sharded_fns = _passes(sharded, impl, chunk_size)
      for T in Ts:
        args = jax.device_put(vla_inputs(batch, T, heads, d, dtype), device)
        for name in plain_fns:
          row = {"impl": impl, "d": d, "T": T, "heads": heads, "batch": batch,
                 "dtype": jnp.dtype(dtype).name, "chunk_size": chunk_size, "pass": name,
                 "device": device.device_kind}
          for label, fns in (("plain", plain_fns), ("sharded", sharded_fns)):
            compiled = fns[name].lower(*args).compile()
            row[f"{label}_ms"] = median_ms(compiled, args, repeats=repeats, warmup=warmup)
            row.update({f"{label}_{k}": v for k, v in _memory(compiled).items()})
          row["ratio"] = row["sharded_ms"] / row["plain_ms"]
          yield row
