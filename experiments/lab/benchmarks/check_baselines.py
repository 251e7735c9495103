"""Correctness of the baselines' Pallas kernels (`vla_jax.kernels.delta_rule`: DeltaNet, Gated
DeltaNet, linear attention) against float64, on the device they run on.

Each case: fresh inputs (normal q, k, v; beta = sigmoid(normal); a log decay
log_sigmoid(normal + 3), so gamma ~ 0.95 with a spread; packed cases with documents of
`check.PACKED_MEAN` tokens on average), the forward (o, S_T) and the gradients of a weighted
sum of them with respect to q, k, v, beta, the log decay, compared with impl="chunked" in
float64 on the same inputs (for bfloat16 inputs, on their bfloat16 values). Relative
Frobenius errors, each reported, against `check.BOUNDS` by (dtype, precision). One row per
case (pass "check", with "op" naming the baseline). The kernels run through the ops
(impl="pallas").
"""

import dataclasses
import functools
import time

import numpy as np

from lab.benchmarks import check

OPS = ("deltanet", "gated_deltanet", "linear_attention")
# The inputs each op's gradient is taken with respect to (linear attention has no beta, no
# decay; DeltaNet no decay).
GRADS = {"deltanet": ("dq", "dk", "dv", "dbeta"),
         "gated_deltanet": ("dq", "dk", "dv", "dbeta", "dlog_decay"),
         "linear_attention": ("dq", "dk", "dv")}
# The kernels that take packed documents (`kernels.config.KERNEL_SUPPORT`).
PACKED_OPS = ("deltanet", "linear_attention")


@dataclasses.dataclass(frozen=True)
class Case:
  op: str
  dtype: str
  precision: str
  T: int
  d: int = 64
  B: int = 1
  H: int = 4
  chunk: int = 64
  packed: bool = False


def default_cases(dims=(64,), max_T=32768, ops=OPS):
  """Per op and head dim: float32 at HIGHEST and bfloat16 at DEFAULT at T = min(4096, max_T)
  and at max_T (when longer), and packed documents (the ops that take them) at
  T = min(4096, max_T) in both."""
  mid = min(4096, max_T)
  cases = []
  for op in ops:
    if op not in OPS:
      raise ValueError(f"op must be one of {OPS}; got {op!r}")
    for d in dims:
      for dtype, precision in (("float32", "HIGHEST"), ("bfloat16", "DEFAULT")):
        cases += [Case(op, dtype, precision, T, d) for T in sorted({mid, max_T})]
        if op in PACKED_OPS:
          cases.append(Case(op, dtype, precision, mid, d, packed=True))
  return cases


def smoke_cases():
  """Tiny CPU cases (interpret mode): each op once, DeltaNet packed too."""
  return ([Case(op, "float32", "HIGHEST", 32, 16, 1, 2, 16) for op in OPS]
          + [Case("deltanet", "float32", "HIGHEST", 32, 16, 1, 2, 16, packed=True)])


def inputs(case, seed=0):
  """(q, k, v, beta, log_decay) in the case's dtype (beta and the log decay float32) and the
  output weights wo."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  B, T, H, d = case.B, case.T, case.H, case.d
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  q, k, v = (jax.random.normal(x, (B, T, H, d), jnp.float32) for x in ks[:3])
  beta = jax.nn.sigmoid(jax.random.normal(ks[3], (B, T, H), jnp.float32))
  log_decay = jax.nn.log_sigmoid(jax.random.normal(ks[4], (B, T, H), jnp.float32) + 3)
  wo = jax.random.normal(ks[5], (B, T, H, d), jnp.float32)
  dtype = jnp.dtype(case.dtype)
  return (q.astype(dtype), k.astype(dtype), v.astype(dtype), beta, log_decay), wo


def _runner(op, impl, chunk, precision):
  """(q, k, v, beta, log_decay, ids) -> (o, S) of `op`."""
  import vla_jax  # pylint: disable=import-outside-toplevel
  kw = {"impl": impl, "chunk_size": chunk, "precision": precision}

  def run(q, k, v, beta, log_decay, ids):
    if op == "deltanet":
      return vla_jax.deltanet(q, k, v, beta, segment_ids=ids, **kw)
    if op == "gated_deltanet":
      return vla_jax.gated_deltanet(q, k, v, beta, log_decay, **kw)
    o, state = vla_jax.linear_attention(q, k, v, normalize=False, segment_ids=ids, **kw)
    return o, state.S
  return run


def _loss(run):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  def loss(q, k, v, beta, log_decay, ids, wo):
    o, S = run(q, k, v, beta, log_decay, ids)
    return jnp.sum(wo.astype(S.dtype) * o.astype(S.dtype)) + jnp.sum(S)
  return loss


@functools.cache
def _fns(op, impl, chunk, precision):
  """Jitted forward and gradients (q, k, v, beta, log_decay) of `op` (compiled once a shape)."""
  import jax  # pylint: disable=import-outside-toplevel
  run = _runner(op, impl, chunk, precision)
  return jax.jit(run), jax.jit(jax.grad(_loss(run), argnums=range(5)))


def check_case(case):
  """One row: the case, its errors against float64, bound, status ("ok" or "fail") (module
  docstring)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  xs, wo = inputs(case)
  ids = check.segment_ids(case)
  ids = None if ids is None else jnp.asarray(ids)
  fwd, grad = _fns(case.op, "pallas", case.chunk, getattr(jax.lax.Precision, case.precision))
  out, grads = fwd(*xs, ids), grad(*xs, ids, wo)
  with jax.enable_x64(True):
    xs64 = [jnp.asarray(np.asarray(x.astype(jnp.float32), np.float64)) for x in xs]
    wo64 = jnp.asarray(np.asarray(wo, np.float64))
    rfwd, rgrad = _fns(case.op, "chunked", case.chunk, "highest")
    ref_out = [np.asarray(x) for x in rfwd(*xs64, ids)]
    ref_grads = [np.asarray(g) for g in rgrad(*xs64, ids, wo64)]
  names = ("o", "S") + GRADS[case.op]
  got = (*out, *grads[:len(GRADS[case.op])])
  want = (*ref_out, *ref_grads[:len(GRADS[case.op])])
  errors = {n: check.rel(x.astype(jnp.float32), r) for n, x, r in zip(names, got, want)}
  finite = all(bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))) for x in got)
  b = check.BOUNDS.get((case.dtype, case.precision), 3e-2)
  ok = finite and max(errors.values()) <= b
  return {**dataclasses.asdict(case), "impl": "pallas", "pass": "check", "u": None,
          "errors": errors, "bound": b, "status": "ok" if ok else "fail",
          "note": None if finite else "non-finite output or gradient",
          "seconds": round(time.perf_counter() - t0, 1)}
