"""`vla_pallas`: the VLA recurrence as a pipeline of Pallas GPU kernels, with its VJP.

Forward (inference), per call:
  1. `segment_starts.py`   the inverse A at each penalty-scan segment start;
  2. `penalty_scan.py`     A carried through 16-token Sherman-Morrison blocks per segment:
                           the unit write directions a_t and A_T;
  3. `state_prep.py`       per chunk U' = T V, W' = T khat, P = tril(Q a^T);
  4. `state_path.py`       the pass over chunk states: o and S_T.
Steps 1-4 are Triton kernels; a learned write strength (`beta`) scales the a_t between steps 2
and 3 (an XLA product, differentiated by autodiff). For bfloat16 inputs at precision DEFAULT
the kernels read the caller's [B, T, H, d] arrays in place and pass factors in bfloat16 (`Plan.low`); otherwise XLA
first makes head-major copies (unit keys and u in the accumulation dtype). Under
differentiation the same kernels run on head-major unit keys (the penalty scan also keeping the
rows A_t khat_t, its Woodbury rows and A at every `Plan.chunk_start_stride`-th chunk start;
the state path T and the chunk-start states), and the backward is `penalty_backward.py`
(the rows' cotangents in one parallel kernel, then the u-cotangent kernel) and
`state_backward.py` (the reverse pass and the chunk-local VJP).

Packed documents (`segment_ids`): every kernel takes the tokens' document indices and keeps
documents apart (S restarts at 0 and A at I / lam0 at every document start, anywhere in a
chunk; the kernels' docstrings say how). Such a call runs the differentiable pipeline
(head-major unit keys, the penalty scan's residuals) also for inference, and the penalty scan
as one segment per sequence (a document start breaks the additive prefix sums the segment
starts are made of).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax.kernels.config import KernelConfig, compile_target
from vla_jax.kernels.penalty_backward import penalty_path
from vla_jax.kernels.penalty_scan import penalty_forward
from vla_jax.kernels.state_path import planned_state_path, state_forward
from vla_jax.kernels.state_prep import state_prep
from vla_jax.ops.checks import check_segment_ids, check_tokens, compute_dtype
from vla_jax.ops.utils import KEY_EPS, document_starts, unit


def default_interpret():
  """True when the default backend is not a GPU: kernels then run in Pallas interpret mode."""
  return jax.default_backend() != "gpu"


def vla_pallas(q, k, v, u, S0, A0, *, beta=None, segment_ids=None, lam0=1.0,
               config=KernelConfig(), interpret=None):
  """VLA (Pandey & Singh, 2026) per head:
  A_t = (A_0^-1 + sum_{s<=t} u_s u_s^T)^-1, a_t = unit(A_t khat_t),
  S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) a_t^T, o_t = S_t q_t (beta_t = 1 without
  `beta`).

  Args:
    q, k: [B, T, H, dk] queries and keys (feature-mapped), float32, bfloat16 or float64.
    v: [B, T, H, dv] values.
    u: [B, T, H, dk] penalty directions.
    S0: [B, H, dv, dk] initial memory; A0: [B, H, dk, dk] initial penalty inverse (SPD).
    beta: None, or [B, T, H] write strengths: the write directions a_t are scaled by beta_t
      between the penalty scan and the state path (an XLA product; the kernels take any
      write direction).
    segment_ids: None, or [B, T] int document ids of packed rows, as in
      `vla_recurrence`: a document starts where the id changes; S restarts at 0 and A at
      I / lam0 there (anywhere in a chunk); the row's first document continues from (S0, A0)
      and the returned state is that of its last document.
    lam0: the ridge strength of the restarts (a Python number > 0; used only with
      segment_ids).
    config: `KernelConfig` (chunk size, precision, value block).
    interpret: True runs the kernels in Pallas interpret mode (slow, any backend); False
      compiles them for the GPU (Triton kernels: compute capability >= 8.0); None (default)
      picks interpret mode exactly when `jax.default_backend()` is not "gpu". The same
      algorithm runs either way.

  Returns:
    (o [B, T, H, dv] in v's dtype, S_T [B, H, dv, dk], A_T [B, H, dk, dk]); the states are
    float32, or float64 when any input is float64. Any T: the tail is padded with zero keys
    and zero u, which is exact. A NaN or Inf at token t leaves outputs at earlier tokens (and,
    for a loss on them, their gradients) unchanged; later outputs are non-finite (with
    segment_ids, in later documents too).

  Raises:
    ValueError for head dims outside {16, 32, 64, 128}, chunk sizes outside 16..128 (powers
    of two), a bad value block or precision, bad segment_ids or lam0; RuntimeError, when
    tracing a compiled call, for a device the kernels cannot run on (not a GPU, or compute
    capability below 8.0), naming it and the alternatives (impl="chunked" runs anywhere).
  """
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  config.validate(dk, dv)
  C = config.chunk_size
  interpret = default_interpret() if interpret is None else bool(interpret)
  N = -(-T // C)
  plan = config.plan(low=all(x.dtype == jnp.bfloat16 for x in (q, k, v, u)),
                     acc=compute_dtype(q, k, v, u, beta, S0, A0), dk=dk, dv=dv, BH=B * H,
                     N=N, interpret=interpret, target=compile_target(interpret))
  segment_ids = check_segment_ids(segment_ids, B, T)
  if beta is not None:
    check_tokens("beta", beta, rank=3, batch=B, time=T, heads=H)
  if segment_ids is None:
    return _vla(plan, None, q, k, v, u, S0, A0, beta, None)
  if isinstance(lam0, jax.core.Tracer) or not np.isscalar(lam0) or not lam0 > 0:
    raise ValueError("lam0 must be a Python number > 0 with segment_ids (the kernels restart "
                     f"A at I / lam0); got {lam0!r}")
  plan = dataclasses.replace(plan, segments=1, segment_chunks=N)
  return _vla(plan, 1.0 / float(lam0), q, k, v, u, S0, A0, beta,
              document_indices(segment_ids, N * C, C, H))


def document_indices(segment_ids, T_pad, C, heads):
  """(starts [B, T_pad] bool, document index [B * H, T_pad] int32, chunk-relative document
  index [B * H, T_pad] int32) of [B, T] segment_ids: starts as `document_starts` (padding
  continues the last document); the document index counts the starts up to each token (0:
  the row's first document); the chunk-relative one counts those in the token's chunk
  (0: the document running at the chunk start; `common.doc_masks`). Rows b * H + h."""
  B, T = segment_ids.shape
  starts = jnp.pad(document_starts(segment_ids), [(0, 0), (0, T_pad - T)])
  count = lambda x: jnp.cumsum(x.astype(jnp.int32), axis=-1)
  rel = count(starts.reshape(B, T_pad // C, C)).reshape(B, T_pad)
  rows = lambda x: jnp.repeat(x, heads, axis=0)
  return starts, rows(count(starts)), rows(rel)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _vla(plan, reset, q, k, v, u, S0, A0, beta, docs):
  if docs is not None:
    return _differentiable_forward(plan, q, k, v, u, S0, A0, beta, docs=docs, reset=reset)
  return _inference_forward(plan, q, k, v, u, S0, A0, beta)


def _vla_fwd(plan, reset, q, k, v, u, S0, A0, beta, docs):
  # Under differentiation the differentiable pipeline runs and keeps its residuals; the
  # backward is its pullback (the kernels' own VJPs), with no recomputation.
  out, pullback = jax.vjp(
      functools.partial(_differentiable_forward, plan, docs=docs, reset=reset),
      q, k, v, u, S0, A0, beta)
  return out, (pullback, docs)


def _vla_bwd(plan, reset, res, cts):
  del plan, reset
  pullback, docs = res
  d_docs = None if docs is None else tuple(np.zeros(x.shape, jax.dtypes.float0) for x in docs)
  return pullback(cts) + (d_docs,)


_vla.defvjp(_vla_fwd, _vla_bwd)


def _pad_time(x, T_pad):
  """[B, T, H, d] zero-padded in time to T_pad (x itself when T = T_pad)."""
  if x.shape[1] == T_pad:
    return x
  return jnp.pad(x, [(0, 0), (0, T_pad - x.shape[1]), (0, 0), (0, 0)])


def _head_major(x, T_pad):
  """[B, T, H, d] -> [B, H, T_pad, d] (zero-padded in time)."""
  return jnp.swapaxes(_pad_time(x, T_pad), 1, 2)


def _write_strengths(a, beta, T_pad):
  """The write directions a [B * H, T_pad, dk] scaled by beta [B, T, H] (a itself without
  beta); padded tokens write nothing whatever their scale (their keys are zero)."""
  if beta is None:
    return a
  b = jnp.swapaxes(jnp.pad(beta, [(0, 0), (0, T_pad - beta.shape[1]), (0, 0)]), 1, 2)
  return b.reshape(a.shape[:2])[..., None].astype(a.dtype) * a


def _unit_rows(x, eps):
  """`unit` along the last axis, on x viewed as 2-D rows [-1, d]. The same numbers; on a 3-D
  or 4-D view XLA may give the per-row norms (and their VJP's per-row sums) a transposed
  layout: it did for the write directions' norms in the gradient, a 0.92 ms transpose at
  d = 64, T = 4096, B = 8, against 0.07 ms with row views."""
  return unit(x.reshape(-1, x.shape[-1]), eps).reshape(x.shape)


def _inference_forward(plan, q, k, v, u, S0, A0, beta=None):
  """The forward alone: kernels 1-4 of the module docstring."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  acc = jnp.dtype(plan.acc)
  T_pad = -(-T // plan.chunk_size) * plan.chunk_size
  if plan.low:     # the caller's arrays in place: the kernels make the unit keys
    q_r, e, v_r, u_r = (_pad_time(x, T_pad) for x in (q, k, v, u))
    keys, heads = e, H
  else:
    e = _head_major(_unit_rows(k.astype(acc), KEY_EPS), T_pad)
    u_r = _head_major(u, T_pad).astype(acc)
    flat = lambda x: x.reshape(B * H, *x.shape[2:])
    keys, heads = flat(e), None
    q_r, v_r = flat(_head_major(q, T_pad)), flat(_head_major(v, T_pad))
  # The write directions in the accumulation dtype, also for bfloat16 inputs: the state's
  # directions that the keys' writes miss (those of large penalty, where a_t has almost no
  # component) are never erased, so a rounding of a_t there accumulates in S over the whole
  # sequence (kernels/DESIGN.md, "Precision").
  a, A_T = penalty_forward(plan, e, u_r, A0.astype(acc), token_major=plan.low,
                           rows_dtype=acc)
  a = _write_strengths(a, beta, T_pad)
  Up, Wp, P = state_prep(keys, a, q_r, v_r, plan=plan, out_dtype=plan.store, heads=heads)
  o, S_T, _ = state_forward(plan, q_r, a, Up, Wp, P, S0.astype(acc).reshape(B * H, dv, dk),
                            v.dtype, heads=heads)
  o = o[:, :T] if plan.low else jnp.swapaxes(o.reshape(B, H, T_pad, dv), 1, 2)[:, :T]
  return o, S_T.reshape(B, H, dv, dk), A_T.reshape(B, H, dk, dk)


def _differentiable_forward(plan, q, k, v, u, S0, A0, beta=None, docs=None, reset=None):
  """The forward that `_vla_fwd` differentiates: the penalty scan with its adjoint VJP on
  head-major unit keys and u, then the state path with its VJP reading q and v in place;
  beta scales the write directions between them (its gradient is autodiff's).
  docs, reset: packed documents (`document_indices`; A restarts at reset * I)."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  acc = jnp.dtype(plan.acc)
  C = plan.chunk_size
  T_pad = -(-T // C) * C
  N = T_pad // C
  chunks = lambda x: x.reshape(B, H, N, C, x.shape[-1])
  khat = _head_major(_unit_rows(k.astype(acc), KEY_EPS), T_pad)
  a, A_T = penalty_path(chunks(khat), chunks(_head_major(u, T_pad).astype(acc)),
                        A0.astype(acc), plan, docs, reset)
  flat = lambda x: x.reshape(B * H, T_pad, x.shape[-1])
  o, S_T = planned_state_path(plan, _pad_time(q, T_pad), flat(khat),
                              _write_strengths(flat(a.reshape(B, H, T_pad, dk)), beta, T_pad),
                              _pad_time(v, T_pad),
                              S0.astype(acc).reshape(B * H, dv, dk), H,
                              None if docs is None else docs[2])
  return o[:, :T], S_T.reshape(B, H, dv, dk), A_T

