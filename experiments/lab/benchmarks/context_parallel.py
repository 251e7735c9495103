"""The sequence-sharded VLA op (`vla_jax.parallel.shard_sequence`) on a mesh of one device
against the plain op: time and memory per (impl, d, T, pass), one row for each of three paths:
"plain" (the op), "sharded" (`shard_sequence` on a one-device mesh, which runs the op itself)
and "segment" (the per-device segment algorithm, `segment_op`, forced on one device).

The "segment" path does what every device of a larger mesh does for its segment:
the op on [v, 0] from [0; I] (dv + dk value channels; two calls for Pallas where dv + dk is not
a kernel head dim, d = 128), dk probe tokens, the segment's Gram and the fold; the exchange is
an all-gather over one device. The float32 carry of the penalty's boundary error runs only
with more than one device and is not in these figures.

Timing and memory are `measure.time_jax`'s (medians after warm-up, rotating input sets; XLA's
compiled peak and, on GPU, the runtime peak); functions are compiled ahead on worker threads.
"""

import concurrent.futures
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from lab.benchmarks import measure
from vla_jax.ops.vla import vla_recurrence
from vla_jax.parallel import SEQ_AXIS, segment_op, shard_sequence

PASSES = ("fwd", "fwd+bwd")
PATHS = ("plain", "sharded", "segment")


def vla_inputs(B, T, H, d, dtype, seed):
  """Random q, k, v [B, T, H, d] and u (unit rows / sqrt(d)) in `dtype`."""
  keys = jax.random.split(jax.random.key(seed), 4)
  q, k, v, u = (jax.random.normal(key, (B, T, H, d), jnp.float32) for key in keys)
  u = u / jnp.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(d)
  return tuple(x.astype(dtype) for x in (q, k, v, u))


def segment_on_one_device(mesh):
  """The per-device segment algorithm of `vla_recurrence` on a one-device mesh (what
  `shard_sequence` skips there), taking and returning what the op does."""
  per_device = segment_op(vla_recurrence)

  def op(q, k, v, u, **kwargs):
    body = lambda *a: per_device(*a, axis_name=SEQ_AXIS, **kwargs)
    spec = jax.sharding.PartitionSpec(None, SEQ_AXIS)
    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 4, check_vma=False,
                         out_specs=(spec, jax.sharding.PartitionSpec()))(q, k, v, u)
  return op


def vla_function(op, impl, pass_, chunk_size):
  """q, k, v, u -> o ("fwd") or the gradients of sum(o) w.r.t. q, k, v, u ("fwd+bwd")."""
  run = lambda q, k, v, u: op(q, k, v, u, impl=impl, chunk_size=chunk_size)[0]
  if pass_ == "fwd":
    return run
  return jax.grad(lambda *a: jnp.sum(run(*a).astype(jnp.float32)), argnums=(0, 1, 2, 3))


def run(recorder, *, Ts, dims, impls, passes=PASSES, heads=16, batch=1, dtype="bfloat16",
        chunk_size=64, sets=2, warmup=2, target_s=0.3, min_reps=5, max_reps=50,
        budget_s=None, compile_workers=8):
  """Measures every (impl, d, T, pass) for both paths and writes one row each through
  `recorder` (`records.Recorder`): path, ms, ms_sync, peak_mib (compiled), runtime_peak_mib,
  compile_s, status. Rows not started within `budget_s` seconds are recorded as skipped."""
  start = time.perf_counter()
  mesh = Mesh(np.array(jax.devices()[:1]), (SEQ_AXIS,))
  ops = {"plain": vla_recurrence, "sharded": shard_sequence(vla_recurrence, mesh=mesh),
         "segment": segment_on_one_device(mesh)}
  pool = concurrent.futures.ThreadPoolExecutor(max(1, compile_workers))
  for impl in impls:
    for d in dims:
      jobs = {}
      for T in Ts:
        shapes = [jax.ShapeDtypeStruct((batch, T, heads, d), jnp.dtype(dtype))] * 4
        for pass_ in passes:
          for path in PATHS:
            fn = vla_function(ops[path], impl, pass_, chunk_size)
            jobs[T, pass_, path] = pool.submit(measure.compile_jax, fn, shapes)
      for T in Ts:
        inputs = [vla_inputs(batch, T, heads, d, dtype, seed) for seed in range(sets)]
        for pass_ in passes:
          for path in PATHS:
            row = dict(impl=impl, op="vla_recurrence", T=T, B=batch, H=heads, d=d,
                       dtype=jnp.dtype(dtype).name, path=path, chunk_size=chunk_size,
                       **{"pass": pass_})
            if budget_s is not None and time.perf_counter() - start > budget_s:
              recorder.row(**row, status="skipped", note=f"budget of {budget_s} s spent")
              continue
            try:
              result = measure.time_jax(None, inputs, compiled=jobs[T, pass_, path].result(),
                                        warmup=warmup, target_s=target_s, min_reps=min_reps,
                                        max_reps=max_reps)
              recorder.row(**row, **result, status="ok")
            except Exception as err:  # pylint: disable=broad-except
              status, note = measure.classify(err)
              recorder.row(**row, status=status, note=note)
        del inputs
  pool.shutdown(wait=False, cancel_futures=True)
