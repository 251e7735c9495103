"""State-path factors of every chunk, one Pallas (Triton) program per (batch * head, chunk).

The state path is the generalised delta rule S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T with
erase keys e_t (VLA: khat_t) and write keys w_t (VLA: a_t). Per chunk of C tokens (rows E, W,
Q, V), the factors that do not depend on the chunk-start state:

    N  = strictly_lower(E W^T),   T = (I + N)^-1               [C, C] unit lower triangular
    U' = T V,   W' = T E,   P = tril(Q W^T)                      [C, dv], [C, dk], [C, C]

T comes from block doubling on the whole [C, C] matrix (`common.unit_tril_inv`: log2 C rounds
of inv <- inv - inv N_s inv). The state loops (`state_path.py`) then need only products.
Products: the doubling's at `Plan.state_factor_dot`, those that form N and apply T and P at
`Plan.state_apply_dot` (bfloat16 operands for bfloat16 inputs at precision DEFAULT; the
state-prep kernel 0.24 ms faster at d = 64, T = 4096).

Packed documents (`rel`, chunk-relative document indices; `common.doc_masks`): N and P keep
pairs of one document (T is then block diagonal), and W' only the rows of the chunk's first
document (the others start from a zero state, which they do not read).

Decays (Gated DeltaNet, `gate`: cumulative log decays G within the chunk; `common.
decay_factors`): N and P weighted by D_ij = exp(G_i - G_j), W' = T (exp(G) E).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (causal_dot, compiler_params, decay_factors, doc_masks,
                                    doc_spec, dot, iota, rows_spec, unit_rows, unit_tril_inv)
from vla_jax.ops.utils import KEY_EPS

WARPS = 4     # not tuned


# ----------------------------------------------------------------------------- kernel

def _state_prep_kernel(e_ref, w_ref, q_ref, v_ref, *refs, C, factor_dot, apply_dot, acc,
                       unit_keys, packed, gated):
  # e_ref, w_ref, q_ref, wp_ref: [C, dk]; v_ref, up_ref: [C, dv]; p_ref, t_ref: [C, C];
  # packed documents: rel_ref [C] first; decays: g_ref [C] (cumulative log decays) first.
  if packed or gated:
    side_ref, up_ref, wp_ref, p_ref, *t_ref = refs
  else:
    side_ref = None
    up_ref, wp_ref, p_ref, *t_ref = refs
  r, c, _ = iota(C)
  strict, lower = r > c, r >= c
  if packed:
    same, first, _, _ = doc_masks(side_ref[...])
    strict, lower = strict & same, lower & same
  decay, gam = (decay_factors(side_ref[...].astype(acc))[:2] if gated
                else (1.0, None))
  W = w_ref[...].astype(acc)
  E = e_ref[...].astype(acc)
  if unit_keys:   # raw keys read in place
    E = unit_rows(E, KEY_EPS)
  T = unit_tril_inv(jnp.where(strict, decay * dot(E, W, tb=True, precision=apply_dot), 0.0),
                    factor_dot)
  up_ref[...] = causal_dot(T, v_ref[...].astype(acc), apply_dot).astype(up_ref.dtype)
  Wp = causal_dot(T, E if gam is None else gam * E, apply_dot)
  if packed:
    Wp = jnp.where(first, Wp, 0.0)
  wp_ref[...] = Wp.astype(wp_ref.dtype)
  p_ref[...] = jnp.where(lower, decay * dot(q_ref[...].astype(acc), W, tb=True,
                                             precision=apply_dot), 0.0).astype(p_ref.dtype)
  if t_ref:   # T itself, for the state path's chunk-local VJP
    t_ref[0][...] = T.astype(t_ref[0].dtype)


# ----------------------------------------------------------------------------- wrapper

def state_prep(e, w, q, v, *, plan, with_inverse=False, out_dtype=None, inverse_dtype=None,
               heads=None, qv_heads=None, rel=None, gate=None):
  """U' [BH, N*C, dv], W' [BH, N*C, dk], P [BH, N*C, C] (grid (B * H, N)).

  Args:
    e, w, q: [BH, N*C, dk] erase keys, write keys, queries; v: [BH, N*C, dv] (any float
      dtype; computed in the plan's accumulation dtype).
    plan: the `Plan`; out_dtype: of the outputs (default the accumulation dtype).
    with_inverse: also T of every chunk, [BH, N*C, C], in inverse_dtype (default out_dtype).
    heads: None, or H when e, q, v are the caller's token-major [B, >= N*C, H, d] (read in
      place; e then holds raw keys, made unit here); w and the outputs stay head-major.
    qv_heads: None, or H when only q and v are token-major (e holds unit keys, head-major).
    rel: None, or [BH, N*C] int32 chunk-relative document indices of packed documents.
    gate: None, or [BH, N*C] cumulative log decays within each chunk (Gated DeltaNet; not
      with rel): N and P weighted by exp(G_i - G_j), W' = T (exp(G) E).
  """
  BH, NC, dk = w.shape
  C, dv, acc = plan.chunk_size, v.shape[-1], jnp.dtype(plan.acc)
  out = out_dtype or acc
  rows = lambda d, h=None: rows_spec(C, d, h)
  n_out = 4 if with_inverse else 3
  in_specs = [rows(dk, heads), rows(dk), rows(dk, heads or qv_heads), rows(dv, heads or qv_heads)]
  args = [e, w, q, v]
  side = rel if rel is not None else gate
  if side is not None:
    in_specs, args = in_specs + [doc_spec(C)], args + [side]
  return pl.pallas_call(
      functools.partial(_state_prep_kernel, C=C, factor_dot=plan.state_factor_dot,
                        apply_dot=plan.state_apply_dot, acc=acc, unit_keys=heads is not None,
                        packed=rel is not None, gated=gate is not None),
      grid=(BH, NC // C),
      in_specs=in_specs,
      out_specs=[rows(dv), rows(dk), rows(C), rows(C)][:n_out],
      out_shape=[jax.ShapeDtypeStruct((BH, NC, dv), out),
                 jax.ShapeDtypeStruct((BH, NC, dk), out),
                 jax.ShapeDtypeStruct((BH, NC, C), out),
                 jax.ShapeDtypeStruct((BH, NC, C), inverse_dtype or out)][:n_out],
      compiler_params=compiler_params(WARPS), interpret=plan.interpret, name="vla_state_prep",
  )(*args)
