"""`vla_recurrence`: the public VLA op and its dispatch over implementations."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
import numpy as np

from vla_jax.ops import checks, nonfinite
from vla_jax.ops.delta_rule import (delta_rule_associative_scan, delta_rule_chunked,
                                    delta_rule_scan)
from vla_jax.ops.impl import KERNEL_IMPLS, Impl, parse_impl
from vla_jax.ops.utils import KEY_EPS, WRITE_EPS, document_starts, resolve_precision, unit
from vla_jax.ops.vla.penalty import (penalty_chunked, penalty_chunked_documents,
                                     penalty_prefix_solve, penalty_scan)


class VLAState(NamedTuple):
  """VLA memory per head. S: [B, H, dv, dk] associative memory; A: [B, H, dk, dk] penalty
  inverse (lam0 I + sum u u^T)^-1, symmetric positive definite. float32 (float64 in x64)."""

  S: jax.Array
  A: jax.Array


def initial_vla_state(batch: int, heads: int, dk: int, dv: int, *, lam0: float = 1.0,
                      dtype: DTypeLike = jnp.float32) -> VLAState:
  """S = 0 [batch, heads, dv, dk], A = I / lam0 [batch, heads, dk, dk], in `dtype` (float32
  or float64). The sizes are ints >= 0."""
  batch, heads, dk, dv = (checks.check_size(name, n) for name, n in
                          (("batch", batch), ("heads", heads), ("dk", dk), ("dv", dv)))
  checks.check_positive("lam0", lam0)
  checks.check_state_dtype("dtype", dtype)
  A = jnp.broadcast_to(jnp.eye(dk, dtype=dtype) / lam0, (batch, heads, dk, dk))
  return VLAState(S=jnp.zeros((batch, heads, dv, dk), dtype), A=A)


def vla_recurrence(q: jax.Array, k: jax.Array, v: jax.Array, u: jax.Array,
                   beta: jax.Array | None = None, *, lam0: float = 1.0, initial_state: VLAState | None = None,
                   impl: str | Impl = "chunked", chunk_size: int = 64,
                   segment_ids: jax.Array | None = None,
                   precision: str | jax.lax.Precision | None = None) -> tuple[jax.Array, VLAState]:
  """Variational Linear Attention recurrence (Pandey & Singh, 2026), per head:

      khat_t = k_t / ||k_t||   (0 where ||k_t|| <= eps = 1e-6)
      A_t = A_{t-1} - z_t z_t^T / (1 + u_t^T z_t),   z_t = A_{t-1} u_t   (Sherman-Morrison)
      a_t = A_t khat_t / ||A_t khat_t||   (0 where <= 1e-12)                (unit write direction)
      S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) a_t^T                   (erase khat, write a)
      o_t = S_t q_t

with beta_t = 1 (the authors' recurrence) unless a write strength `beta` is given: then
S_t is S_{t-1} moved a fraction beta_t of the way to the write of strength 1 (beta_t = 1:
the full write; as DeltaNet's beta, whose rule this is when a_t = khat_t).

  A_t = (lam0 I + sum_{s<=t} u_s u_s^T)^-1 is the inverse of the least-squares penalty, so S_t
  is the online solution of min_S sum_s ||v_s - S khat_s||^2 + tr(S M_t S^T).

  Padding is exact: a step whose k and u are both zero leaves (S, A) unchanged (khat = 0 and
  u = 0 make z = 0 and a = 0), whatever q and v are (NaN included). Pad with zero keys and
  zero u. A key of norm <= 1e-6 is such a zero key and its gradient is zero (padding gives
  no gradient spikes); norms are scale-safe (keys up to the float32 range).

  Non-finite inputs stay causal (`vla_jax.ops.nonfinite`): a NaN or Inf at token t in k, u,
  or in v or beta where k_t != 0, leaves every output before t and its gradient unchanged and
  finite; o from t on (to the end of its document with `segment_ids`) and the final state (where the
  row's last document holds t) are NaN; outputs and gradients of the other documents are as
  without it. A non-finite q_t makes o_t alone NaN.

  Float32 accuracy (README.md): the relative error of o against float64 grows like
  eps * max_t ||u_t||^2 / lam0 in every impl (about 3e-7 at a ratio of 1, 3e-4 at 1e4,
  chunked within ~2.5x of scan); beyond a ratio of ~1e5 float32 has no correct digits: use
  float64 inputs (x64) or a larger lam0.

  Packing: with `segment_ids` several documents share a row and each runs as if alone. The
  state restarts (S = 0, A = I / lam0, by selection) at every token whose id differs from the
  previous token's; the row's first document continues from `initial_state`, and the final
  state is that of the row's last document.

  Args:
    q: [B, T, H, dk] queries (already feature-mapped).
    k: [B, T, H, dk] keys (feature-mapped; unit-normalised here with eps = 1e-6).
    v: [B, T, H, dv] values.
    u: [B, T, H, dk] penalty directions.
    beta: None (default: every write of strength 1) or [B, T, H] write strengths (usually in
      (0, 1), the layer's sigmoid(W_beta x)): the write key is beta_t a_t. A value at a token
      whose key is zero is still dropped, whatever beta is. Every impl takes it (the Pallas
      kernels scale their write directions by it between the penalty scan and the state
      path).
    lam0: ridge strength (> 0, a real number) of the initial penalty; used when
      `initial_state` is None and at every document start of `segment_ids`, and checked to be
      a finite real number > 0 always (when concrete). When it is used and the compute dtype
      is float32, each impl takes lam0 >= `checks.MIN_LAM0_FLOAT32[impl]` (1e-3 for
      "chunked", 1e-4 for the others; smaller is a ValueError when lam0 is concrete): below,
      float32 has no correct digits left (or gives NaN). float64 inputs take any lam0 > 0.
    initial_state: a `VLAState` to continue from (S [B, H, dv, dk], A [B, H, dk, dk]), or None
      for S = 0, A = I / lam0. A is used as (A + A^T) / 2 (it is a symmetric inverse), so its
      gradient is symmetric and the same for every impl.
    impl: "chunked" (default), "scan", "associative_scan", "pallas" or "pallas_interpret",
      or an `Impl` ("auto" is the layers': `vla_jax.ops.impl.resolve_impl`).
      "pallas" runs `vla_jax.kernels.vla_pallas` with `KernelConfig(chunk_size, precision)`
      (key head dims 16, 32, 64 or 128, value widths up to 128, other widths on zero value
      columns up to the next of those; chunk_size <= 128); on a backend other
      than GPU its kernels run in Pallas interpret mode (same algorithm, slow), as
      "pallas_interpret" runs them on any backend.
    chunk_size: tokens per chunk for "chunked" and "pallas", a power of two in [16, 256]
      (default 64); any T works, the tail is padded internally.
    precision: of the matrix products, for every impl. None (default) follows JAX's default
      matmul precision, read when the op is traced (`jax.default_matmul_precision(...)`;
      unset: DEFAULT). A `jax.lax.Precision` or one of 'default' / 'high' / 'highest' (also
      'bfloat16' / 'tensorfloat32' / 'float32') overrides it; so does a pair of two equal ones
      (`jnp.matmul`'s per-operand form: the products take one precision, an unequal pair is a
      ValueError). On CPU every setting computes
      float32 products exactly (relative error of o ~1e-6 against float64). On a GPU with
      float32 inputs DEFAULT is one-pass TF32 (~1e-3), HIGH three TF32 passes and HIGHEST
      IEEE float32 (~1e-6); bfloat16 inputs at DEFAULT multiply bfloat16 operands (~1e-2).
      For "pallas" it sets `KernelConfig.precision`.
    segment_ids: None, or [B, T] int document ids (equal ids = one document; documents are
      contiguous; a new document starts where the id changes), every impl (documents may
      start anywhere inside a chunk); "pallas" and "pallas_interpret" need lam0 as a Python number. With
      "chunked", gradients through a row with several
      documents come from autodiff of the penalty path (not its adjoint backward).

  Differentiation: every impl supports reverse mode (`jax.grad`, `jax.vjp`). "chunked" and
  "pallas" define their own backward (`jax.custom_vjp`), so forward mode (`jax.jvp`,
  `jax.jacfwd`) with respect to k, u or the initial A needs impl="scan" or
  "associative_scan".

  Returns:
    o: [B, T, H, dv] in v's dtype, and the final `VLAState`. Arithmetic and the state are in
    float32, or float64 when any input is float64 (x64 mode).

  Raises:
    ValueError / TypeError naming the argument for bad ranks, shapes or dtypes, a lam0 that
    is not a finite number > 0 (always) or, where lam0 is used, below the float32 minimum
    (when its value is known; a traced lam0 under jit is not checked), a bad chunk_size, an
    unknown impl or precision, or an initial state of the wrong shape or dtype.
  """
  impl = parse_impl(impl)
  chunk_size = checks.check_chunk_size(chunk_size)
  precision = resolve_precision(precision)
  B, T, H, dk = checks.check_tokens("q", q)
  checks.check_tokens("k", k, batch=B, time=T, heads=H, dim=dk)
  dv = checks.check_tokens("v", v, batch=B, time=T, heads=H)[3]
  checks.check_tokens("u", u, batch=B, time=T, heads=H, dim=dk)
  if beta is not None:
    checks.check_tokens("beta", beta, rank=3, batch=B, time=T, heads=H)
  segment_ids = checks.check_segment_ids(segment_ids, B, T)
  checks.check_positive("lam0", lam0)   # used or not (README: ignored with initial_state)
  if segment_ids is not None and impl in KERNEL_IMPLS and (
      isinstance(lam0, jax.core.Tracer) or not np.isscalar(lam0)):
    raise ValueError(f"impl={impl.value!r} with segment_ids needs lam0 as a Python number (the "
                     f"kernels restart A at I / lam0); got {type(lam0).__name__}")
  if initial_state is not None and not isinstance(initial_state, VLAState):
    raise TypeError("initial_state must be a VLAState(S, A) or None; got "
                    f"{type(initial_state).__name__}")
  dtype = checks.compute_dtype(q, k, v, u, beta, *(initial_state or ()))
  if initial_state is None or segment_ids is not None:   # lam0 is used
    checks.check_lam0(lam0, impl, dtype)
  if initial_state is None:
    initial_state = initial_vla_state(B, H, dk, dv, lam0=lam0, dtype=dtype)
  else:
    checks.check_state("initial_state.S", initial_state.S, (B, H, dv, dk))
    checks.check_state("initial_state.A", initial_state.A, (B, H, dk, dk))
    # A is a symmetric inverse: every impl sees (A + A^T) / 2 (exact for a symmetric A), so
    # the gradient with respect to initial_state.A is the same symmetric matrix for all.
    A0 = initial_state.A
    initial_state = VLAState(S=initial_state.S, A=0.5 * (A0 + jnp.swapaxes(A0, -1, -2)))
  out_dtype = checks.output_dtype(v)
  if T == 0:   # no tokens: the state passes through (a scan needs one element)
    return (jnp.zeros((B, 0, H, dv), out_dtype),
            VLAState(*(x.astype(dtype) for x in initial_state)))
  starts = None if segment_ids is None else document_starts(segment_ids)
  if impl in KERNEL_IMPLS:
    # The kernels keep a non-finite input from earlier tokens (kernels/DESIGN.md, "Non-finite
    # inputs") but not from the later documents of a packed row, so they run on k, u, v with
    # their non-finite entries zeroed (a select each; a value at a zero-key token then writes
    # nothing, as padding must); q they keep to its own output, which is marked NaN.
    from vla_jax.kernels import KernelConfig, vla_pallas  # pylint: disable=import-outside-toplevel
    from vla_jax.kernels.config import (  # pylint: disable=import-outside-toplevel
        pad_value_width)
    guard, k, (u,), (v, beta) = nonfinite.contain_entries(k, (u,), (v, beta), starts=starts)
    S0, A0 = initial_state
    # A value width the kernels do not take (the layers' "delta" readout: d_h + 1) runs on
    # zero value columns; its outputs are dropped.
    v, S0, _ = pad_value_width(v, S0)
    o, S, A = vla_pallas(q, k, v, u, S0, A0, beta=beta, segment_ids=segment_ids, lam0=lam0,
                         config=KernelConfig(chunk_size=chunk_size, precision=precision),
                         interpret=True if impl is Impl.PALLAS_INTERPRET else None)
    return (guard.outputs(o[..., :dv]),
            VLAState(S=guard.state(S[:, :, :dv]), A=guard.state(A)))
  # beta is a write, as v: non-finite where the key is zero, it writes nothing.
  guard, q, k, (u,), (v, beta) = nonfinite.contain(q, k, (u,), (v, beta), starts=starts)
  q, k, v, u = (x.astype(dtype) for x in (q, k, v, u))
  S0, A0 = (x.astype(dtype) for x in initial_state)
  khat = unit(k, KEY_EPS)
  if segment_ids is None:
    docs = None
  else:
    docs = (starts, jnp.eye(dk, dtype=dtype) / jnp.asarray(lam0, dtype))  # (starts, A_reset)
  if impl is Impl.SCAN:
    W, A = penalty_scan(khat, u, A0, *(docs or (None, None)), precision)
    core = delta_rule_scan
  elif impl is Impl.ASSOCIATIVE_SCAN:
    W, A = penalty_prefix_solve(khat, u, A0, *(docs or (None, None)), precision)
    core = delta_rule_associative_scan
  else:
    if docs is None:
      W, A = penalty_chunked(khat, u, A0, chunk_size, precision)
    else:
      W, A = penalty_chunked_documents(khat, u, A0, chunk_size, *docs, precision)
    core = lambda *args, **kw: delta_rule_chunked(*args[:6], chunk_size, args[6], **kw)
  a = unit(W, WRITE_EPS)
  if beta is not None:
    a = beta.astype(dtype)[..., None] * a
  o, S = core(q, khat, a, v, None, S0, starts, precision=precision)
  return (guard.outputs(o.astype(out_dtype)),
          VLAState(S=guard.state(S), A=guard.state(A)))
