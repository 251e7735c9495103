"""State path of VLA as Pallas (Triton) kernels: the generalised delta rule (with per-token
decays for Gated DeltaNet, `gate`; `delta_rule.py`).

Per head, with erase keys e_t (VLA: khat_t) and write keys w_t (VLA: a_t):

    S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T,    o_t = S_t q_t.

Chunkwise (chunks of C tokens, chunk-start state S_c, rows Q, E, W, V; U', W', P from
`state_prep.py`, which do not depend on S_c):

    R = U' - W' S_c^T                    [C, dv]  residuals
    O = Q S_c^T + P R                    [C, dv]
    S_next = S_c + R^T W                 [dv, dk]

Only the pass over chunk states is sequential. It runs with one program per (batch * head,
block of BV value rows), the state [BV, dk] carried in registers: `vla_state_fwd` writes O in
the loop; with few programs or dk = 128 (`Plan.split_output`) the loop keeps only the chain
(`vla_state_chain`, writing every chunk-start state) and `vla_state_out` computes O in
parallel over (batch * head, chunk), as flash-linear-attention splits its delta rule.
The backward (reverse pass and chunk-local VJPs) is `state_backward.py`.

Packed documents (S restarts at 0 at every document start; `rel`, chunk-relative document
indices, `common.doc_masks`; W' from `state_prep` is zero outside the chunk's first document):
O = first * Q S_c^T + P R and S_next = keep * S_c + R^T (last * W), where first marks the
tokens that continue from S_c, last those of the chunk's last document and keep a chunk
without a document start.

Decays (`gate`: each chunk's cumulative log decays G, `common.decay_factors`): O = exp(G) Q S_c^T
+ P R and S_next = exp(G_C) S_c + R^T (exp(G_C - G) W), with P, W' from `state_prep` weighted
by the decays.

Layout: per-token arrays head-major [B * H, N * C, d], or (heads=H) q, v and o the caller's
token-major [B, N * C, H, d], read and written in place.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (causal_dot, compiler_params, decay_factors, doc_masks,
                                    doc_spec, dot, rows_spec, split_chunks)
from vla_jax.kernels.config import STATE_STAGES, STATE_WARPS, KernelConfig, compile_target
from vla_jax.kernels.state_backward import local_vjp, reverse_pass
from vla_jax.kernels.state_prep import state_prep
from vla_jax.ops.checks import compute_dtype


# ----------------------------------------------------------------------------- kernels

def _chunk_update(S, R, w, rel, mm, gate=None):
  """S_next = S + R^T W of one chunk; packed documents: keep * S + R^T (last * W); decays
  (gate: the chunk's cumulative log decays G): exp(G_C) S + R^T (exp(G_C - G) W)."""
  if gate is not None:
    _, _, rest, last = decay_factors(gate)
    return last * S + mm(R, rest * w, ta=True)
  if rel is None:
    return S + mm(R, w, ta=True)
  _, _, last, keep = doc_masks(rel)
  return jnp.where(keep, S, 0.0) + mm(R, jnp.where(last, w, 0.0), ta=True)


def _carried(qS, rel, gate=None):
  """Q S_c^T of one chunk; packed documents: only the rows of its first document; decays:
  exp(G) Q S_c^T."""
  if gate is not None:
    return decay_factors(gate)[1] * qS
  return qS if rel is None else jnp.where(doc_masks(rel)[1], qS, 0.0)


def _sides(side_ref, rows, gated, acc):
  """(rel, gate) of one chunk's rows from the side input (document indices or decays)."""
  if side_ref is None:
    return None, None
  x = side_ref[rows]
  return (None, x.astype(acc)) if gated else (x, None)


def _fwd_kernel(q_ref, w_ref, up_ref, wp_ref, p_ref, s0_ref, *refs,
                C, N, precision, acc, packed, gated=False):
  # One program = one (batch * head, value block):
  #   q_ref, w_ref, wp_ref: [N*C, dk]   up_ref, o_ref: [N*C, BV]   p_ref: [N*C, C]
  #   s0_ref, st_ref: [BV, dk]          sc_ref: [N, BV, dk] (chunk-start states)
  #   packed documents (rel) or decays (G): side_ref [N*C] before the outputs (o_ref, st_ref,
  #   sc_ref).
  side_ref, o_ref, st_ref, sc_ref = refs if packed or gated else (None,) + refs
  mm = functools.partial(dot, precision=precision)

  def body(n, S):                                        # S: [BV, dk]
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    rel, gate = _sides(side_ref, rows, gated, acc)
    sc_ref[n, :, :] = S.astype(sc_ref.dtype)
    q, w, wp = (ref[rows, :].astype(acc) for ref in (q_ref, w_ref, wp_ref))   # [C, dk]
    up = up_ref[rows, :].astype(acc)                     # [C, BV]
    p = p_ref[rows, :].astype(acc)                       # [C, C]
    R = up - mm(wp, S, tb=True)                          # [C, BV]
    o_ref[rows, :] = (_carried(mm(q, S, tb=True), rel, gate)
                      + causal_dot(p, R, precision)).astype(o_ref.dtype)
    return _chunk_update(S, R, w, rel, mm, gate)         # [BV, dk]

  S = jax.lax.fori_loop(0, N, body, s0_ref[...].astype(acc))
  st_ref[...] = S.astype(st_ref.dtype)


def _chain_kernel(w_ref, up_ref, wp_ref, s0_ref, *refs, C, N, precision, acc, packed,
                  gated=False):
  # The chain alone; refs as in `_fwd_kernel` (packed or gated: side_ref, st_ref, sc_ref).
  side_ref, st_ref, sc_ref = refs if packed or gated else (None,) + refs
  mm = functools.partial(dot, precision=precision)

  def body(n, S):
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    sc_ref[n, :, :] = S.astype(sc_ref.dtype)
    R = up_ref[rows, :].astype(acc) - mm(wp_ref[rows, :].astype(acc), S, tb=True)
    rel, gate = _sides(side_ref, rows, gated, acc)
    return _chunk_update(S, R, w_ref[rows, :].astype(acc), rel, mm, gate)

  S = jax.lax.fori_loop(0, N, body, s0_ref[...].astype(acc))
  st_ref[...] = S.astype(st_ref.dtype)


def _out_kernel(q_ref, up_ref, wp_ref, p_ref, sc_ref, *refs, precision, acc, packed,
                gated=False):
  # One (batch * head, chunk): q_ref, wp_ref: [C, dk]; up_ref, o_ref: [C, dv]; p_ref: [C, C];
  # sc_ref: [dv, dk] the chunk-start state; packed or gated: side_ref [C] before o_ref.
  side_ref, o_ref = refs if packed or gated else (None,) + refs
  mm = functools.partial(dot, precision=precision)
  S = sc_ref[...].astype(acc)
  R = up_ref[...].astype(acc) - mm(wp_ref[...].astype(acc), S, tb=True)
  o = (_carried(mm(q_ref[...].astype(acc), S, tb=True), *_sides(side_ref, ..., gated,
                                                                acc))
       + causal_dot(p_ref[...].astype(acc), R, precision))
  o_ref[...] = o.astype(o_ref.dtype)


# ----------------------------------------------------------------------------- wrapper

def state_forward(plan, q, w, Up, Wp, P, S0, out_dtype, heads=None, rel=None, gate=None):
  """The pass over chunk states. q, w, Wp: [BH, N*C, dk]; Up: [BH, N*C, dv]; P: [BH, N*C, C];
  S0: [BH, dv, dk]; rel: None, or [BH, N*C] int32 chunk-relative document indices; gate:
  None, or [BH, N*C] cumulative log decays within each chunk (Gated DeltaNet). Returns
  O [BH, N*C, dv] (out_dtype; with heads=H, q is the caller's [B, >= N*C, H, dk] and O is
  [B, N*C, H, dv]), S_T [BH, dv, dk] and the chunk-start states
  [BH, N, dv, dk], in S0's dtype (the factors may be stored narrower)."""
  BH, NC, dk = w.shape
  dv, C = Up.shape[-1], plan.chunk_size
  N, BV, acc = NC // C, plan.block_v, S0.dtype
  params = compiler_params(STATE_WARPS, STATE_STAGES)
  s_spec = pl.BlockSpec((None, BV, dk), lambda b, j: (b, j, 0))
  c_spec = pl.BlockSpec((None, N, BV, dk), lambda b, j: (b, 0, j, 0))
  states = [jax.ShapeDtypeStruct((BH, dv, dk), acc), jax.ShapeDtypeStruct((BH, N, dv, dk), acc)]
  o_shape = (BH, NC, dv) if heads is None else (BH // heads, NC, heads, dv)
  packed, gated = rel is not None, gate is not None
  side = rel if packed else gate
  whole, whole_args = ([doc_spec(NC, time=lambda b, j: 0)], [side]) if side is not None else (
      [], [])
  if plan.split_output:
    k_spec = pl.BlockSpec((None, NC, dk), lambda b, j: (b, 0, 0))
    S_T, S_c = pl.pallas_call(
        functools.partial(_chain_kernel, C=C, N=N, precision=plan.state_dot, acc=acc,
                          packed=packed, gated=gated),
        grid=(BH, dv // BV),
        in_specs=[k_spec, pl.BlockSpec((None, NC, BV), lambda b, j: (b, 0, j)), k_spec,
                  s_spec] + whole,
        out_specs=[s_spec, c_spec], out_shape=states,
        compiler_params=params, interpret=plan.interpret, name="vla_state_chain",
    )(w, Up, Wp, S0, *whole_args)
    rows = lambda d, h=None: rows_spec(C, d, h)
    O = pl.pallas_call(
        functools.partial(_out_kernel, precision=plan.state_dot, acc=acc, packed=packed,
                          gated=gated),
        grid=(BH, N),
        in_specs=[rows(dk, heads), rows(dv), rows(dk), rows(C),
                  pl.BlockSpec((None, None, dv, dk), lambda b, n: (b, n, 0, 0))]
                 + ([doc_spec(C)] if side is not None else []),
        out_specs=rows(dv, heads),
        out_shape=jax.ShapeDtypeStruct(o_shape, out_dtype),
        compiler_params=params, interpret=plan.interpret, name="vla_state_out",
    )(q, Up, Wp, P, S_c, *whole_args)
    return O, S_T, S_c
  # Whole sequences: all NC rows of (batch * head) b; `value` blocks take the j-th BV columns.
  seq = lambda d, h=None: rows_spec(NC, d, h, time=lambda b, j: 0)
  value = lambda h=None: rows_spec(NC, BV, h, time=lambda b, j: 0, feature=lambda b, j: j)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, C=C, N=N, precision=plan.state_dot, acc=acc,
                        packed=packed, gated=gated),
      grid=(BH, dv // BV),
      in_specs=[seq(dk, heads), seq(dk), value(), seq(dk), seq(C), s_spec] + whole,
      out_specs=[value(heads), s_spec, c_spec],
      out_shape=[jax.ShapeDtypeStruct(o_shape, out_dtype)] + states,
      compiler_params=params, interpret=plan.interpret, name="vla_state_fwd",
  )(q, w, Up, Wp, P, S0, *whole_args)


# ----------------------------------------------------------------------------- custom VJP

def _factors(plan, q, e, w, v, heads, rel, with_inverse=False, gate=None):
  """U', W', P (and T [BH, N, C, C]) of every chunk from `state_prep`; T in bfloat16 where
  the chunk-local VJP takes bfloat16 operands (`Plan.low`)."""
  acc = jnp.dtype(plan.acc)
  out = state_prep(e.astype(acc), w.astype(acc), q, v, plan=plan, with_inverse=with_inverse,
                   inverse_dtype=jnp.bfloat16 if plan.low else None, qv_heads=heads, rel=rel,
                   gate=gate)
  if with_inverse:
    Up, Wp, P, T = out
    return Up, Wp, P, split_chunks(T, plan.chunk_size)
  return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 6))
def planned_state_path(plan, q, e, w, v, S0, heads, rel=None, gate=None):
  """`state_path` for a given `Plan` (what `vla_pallas` differentiates); rel: None, or
  [BH, N*C] int32 chunk-relative document indices of packed documents (S restarts at 0);
  gate: None, or [BH, N*C] cumulative log decays G within each chunk (Gated DeltaNet,
  S_t = gamma_t S_{t-1} + (v_t - gamma_t S_{t-1} e_t) w_t^T; not with rel), differentiable."""
  Up, Wp, P = _factors(plan, q, e, w, v, heads, rel, gate=gate)
  O, S_T, _ = state_forward(plan, q, w, Up, Wp, P, S0.astype(Up.dtype), v.dtype, heads, rel,
                            gate)
  return O, S_T


def _fwd(plan, q, e, w, v, S0, heads, rel, gate):
  Up, Wp, P, T = _factors(plan, q, e, w, v, heads, rel, with_inverse=True, gate=gate)
  O, S_T, S_c = state_forward(plan, q, w, Up, Wp, P, S0.astype(Up.dtype), v.dtype, heads, rel,
                              gate)
  return (O, S_T), (q, e, w, v, S0, Wp, P, S_c, T, rel, gate)


def _bwd(plan, heads, res, cts):
  q, e, w, v, S0, Wp, P, S_c, T, rel, gate = res
  dO, dS_T = cts
  # With bfloat16 products dS_next only meets them as a bfloat16 operand: the reverse pass
  # writes it so (the same rounding, half the bytes, no cast pass).
  dS_next, dS0 = reverse_pass(plan, dO, q, w, Wp, P, dS_T.astype(Wp.dtype),
                              jnp.bfloat16 if plan.low else None, heads=heads, rel=rel,
                              gate=gate)
  grads = local_vjp(plan, q, e, w, v, dO, S_c, dS_next, P, T, heads=heads, rel=rel, gate=gate)
  d_rel = None if rel is None else np.zeros(rel.shape, jax.dtypes.float0)
  return grads[:4] + (dS0.astype(S0.dtype), d_rel, grads[4] if gate is not None else None)


planned_state_path.defvjp(_fwd, _bwd)


def state_path(q, e, w, v, S0, *, config=KernelConfig(), heads=None, interpret=None):
  """Generalised delta rule S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T, o_t = S_t q_t.

  Args:
    q, e, w: [BH, T, dk] queries, erase keys and write keys (head-major; float32, bfloat16 or
      float64). T must be a multiple of `config.chunk_size` (pad with zero e and w: exact).
    v: [BH, T, dv] values.
    S0: [BH, dv, dk] initial state.
    config: a `KernelConfig`.
    heads: None, or H when q and v are token-major [B, T, H, d] instead (B * H = BH): the
      kernels read them in place, and o and the cotangents of q and v are token-major too.
    interpret: Pallas interpret mode; None (default): exactly when the backend is not a GPU.

  Returns:
    o [BH, T, dv] (with heads: [B, T, H, dv]) in v's dtype and S_T [BH, dv, dk] in the
    accumulation dtype (float32, or float64 when any input is float64). Differentiable
    (custom VJP: `state_backward.py`).

  Raises:
    ValueError, RuntimeError as `vla_pallas` for shapes, options and devices.
  """
  BH, T, dk = e.shape
  dv = v.shape[-1]
  config.validate(dk, dv)
  C = config.chunk_size
  if T % C:
    raise ValueError(f"T={T} must be a multiple of chunk_size={C} here; pad with zero keys "
                     "first")
  if heads is not None:
    want = (BH // heads, T, heads)
    if BH % heads or q.shape[:3] != want or v.shape[:3] != want:
      raise ValueError(f"with heads={heads}, q and v must be [B, T, H, d] with B * H = {BH} "
                       f"and T = {T}; got q {q.shape}, v {v.shape}")
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  plan = config.plan(low=all(x.dtype == jnp.bfloat16 for x in (q, e, w, v)),
                     acc=compute_dtype(q, e, w, v), dk=dk, dv=dv, BH=BH, N=T // C,
                     interpret=interpret, target=compile_target(interpret))
  return planned_state_path(plan, q, e, w, v, S0, heads)
