"""Chunk-local cotangents of the state path as one Pallas (Triton) kernel, parallel over chunks.

The state path's backward (`state_path._state_path_bwd`) gets, from its reverse pass, the
cotangent dS_n of every chunk's end state; what remains is, per chunk, the VJP of the chunk map
with the chunk-start state S (from the forward) held fixed:

    Lm = I + strictly_lower(E W^T),  Tm = Lm^-1          E erase keys, W write keys [C, dk]
    X = V - E S^T,  R = Tm X                              residuals [C, dv]
    P = tril(Q W^T),  O = Q S^T + P R                     outputs [C, dv]
    S_next = S + R^T W

Given dO [C, dv] and dS_next [dv, dk] (reverse-mode, by hand):

    dR = P^T dO + W dS_next^T              dP = tril(dO R^T)
    dX = Tm^T dR                           dLm = strictly_lower(-dX R^T)
    dQ = dO S + dP W
    dW = dP^T Q + R dS_next + dLm^T E
    dE = -dX S + dLm W
    dV = dX

(dTm = dR X^T and dLm = -Tm^T dTm Tm^T = -dX (Tm X)^T = -dX R^T.) XLA runs the same VJP as
`jax.vmap(jax.vjp(...))` of `state_path._chunk_map`: separate batched products with every
intermediate in HBM. Here one program per (batch * head, chunk) keeps them in registers and
shared memory. Tm is the block-doubling inverse `split_prep._unit_tril_inv` (products only).
`tests/test_state_output.py` checks it against the XLA VJP in float64.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.layout import rows_spec
from vla_jax.kernels.split_prep import _dot, _iota, _unit_tril_inv


def _local_vjp_kernel(q_ref, e_ref, w_ref, v_ref, do_ref, s_ref, dsn_ref,     # inputs
                      dq_ref, de_ref, dw_ref, dv_ref,                          # outputs
                      *, C, precision, acc):
  # One (batch*head, chunk): q, e, w, dq, de, dw: [C, dk]; v, do, dv: [C, dv];
  # s_ref, dsn_ref: [dv, dk] the chunk-start state and the cotangent of the chunk-end state.
  # P = tril(Q W^T) and Tm = Lm^-1 are recomputed here.
  dot = functools.partial(_dot, precision=precision)
  r, c, _ = _iota(C)
  Q, E, W = (ref[...].astype(acc) for ref in (q_ref, e_ref, w_ref))
  Tm = _unit_tril_inv(jnp.where(r > c, dot(E, W, tb=True), 0.0), precision)
  P = jnp.where(r >= c, dot(Q, W, tb=True), 0.0)                         # [C, C]
  _write_vjp(Q, E, W, P, Tm, v_ref, do_ref, s_ref, dsn_ref, dq_ref, de_ref, dw_ref, dv_ref,
             dot, acc)


def _reuse_vjp_kernel(q_ref, e_ref, w_ref, v_ref, do_ref, s_ref, dsn_ref, p_ref, t_ref,  # in
                      dq_ref, de_ref, dw_ref, dv_ref,                                    # out
                      *, precision, acc):
  # As `_local_vjp_kernel`, with P and Tm [C, C] read from the forward (the residuals
  # `state_path._local_vjp_products` reuses) instead of recomputed.
  Q, E, W, P, Tm = (ref[...].astype(acc) for ref in (q_ref, e_ref, w_ref, p_ref, t_ref))
  _write_vjp(Q, E, W, P, Tm, v_ref, do_ref, s_ref, dsn_ref, dq_ref, de_ref, dw_ref, dv_ref,
             functools.partial(_dot, precision=precision), acc)


def _write_vjp(Q, E, W, P, Tm, v_ref, do_ref, s_ref, dsn_ref, dq_ref, de_ref, dw_ref, dv_ref,
               dot, acc):
  """The chunk's cotangents (module docstring) from its Q, E, W, P, Tm, written to the refs."""
  r, c, _ = _iota(P.shape[0])
  V, dO = v_ref[...].astype(acc), do_ref[...].astype(acc)
  S, dSn = s_ref[...].astype(acc), dsn_ref[...].astype(acc)
  R = dot(Tm, V - dot(E, S, tb=True))                                    # [C, dv]
  dR = dot(P, dO, ta=True) + dot(W, dSn, tb=True)                        # [C, dv]
  dP = jnp.where(r >= c, dot(dO, R, tb=True), 0.0)                       # [C, C]
  dX = dot(Tm, dR, ta=True)                                              # [C, dv]
  dLm = jnp.where(r > c, -dot(dX, R, tb=True), 0.0)                      # [C, C]
  dq_ref[...] = (dot(dO, S) + dot(dP, W)).astype(dq_ref.dtype)
  dw_ref[...] = (dot(dP, Q, ta=True) + dot(R, dSn) + dot(dLm, E, ta=True)).astype(dw_ref.dtype)
  de_ref[...] = (dot(dLm, W) - dot(dX, S)).astype(de_ref.dtype)
  dv_ref[...] = dX.astype(dv_ref.dtype)


def chunk_local_vjp(q, e, w, v, dO, S_c, dS_next, *, chunk_size, precision, num_warps=4,
                    num_stages=1, interpret=False, P=None, Tinv=None, heads=None,
                    dq_dtype=None, dv_dtype=None):
  """Cotangents (dq, de, dw [BH, N*C, dk], dv [BH, N*C, dv]) of the state path's chunk maps.

  Args:
    q, e, w: [BH, N*C, dk] queries, erase keys and write keys; v, dO: [BH, N*C, dv] values
      and output cotangents (any float dtype; computed in S_c's dtype).
    S_c: [BH, N, dv, dk] chunk-start states; dS_next: [BH, N, dv, dk] cotangents of the
      chunk-end states (the reverse pass's output).
    chunk_size: C; precision: of the products (as `KernelConfig.precision`, or the
      `BF16_BF16_F32` preset: bfloat16 operands, float32 sums).
    P, Tinv: None (recompute them in the kernel), or the forward's P [BH, N*C, C] and unit
      triangular inverses [BH, N, C, C] (any float dtype), read instead
      (`KernelConfig(state_local_vjp="fused")`).
    heads: None, or H when q, v and dO are token-major [B, N*C, H, d] (read in place); dq and
      dv are then written token-major too. e, w and the rest stay head-major.
    dq_dtype, dv_dtype: the dtypes dq and dv are written in (default S_c's): the caller's q
      and v dtypes when these are the final cotangents, so that no cast pass follows (the same
      rounding: computed in S_c's dtype, rounded once on the write).

  Returns:
    (dq, de, dw, dv): de and dw in S_c's dtype, dq and dv in dq_dtype and dv_dtype.
  """
  BH, NC, dk = e.shape
  dv, C, acc = v.shape[-1], chunk_size, S_c.dtype
  rows = lambda d, h=None: rows_spec(C, d, h)
  state = pl.BlockSpec((None, None, dv, dk), lambda b, n: (b, n, 0, 0))
  in_specs = [rows(dk, heads), rows(dk), rows(dk), rows(dv, heads), rows(dv, heads), state,
              state]
  args = (q, e, w, v, dO, S_c, dS_next)
  if P is None:
    kernel, name = functools.partial(_local_vjp_kernel, C=C, precision=precision, acc=acc), (
        "vla_state_local_vjp")
  else:
    kernel, name = functools.partial(_reuse_vjp_kernel, precision=precision, acc=acc), (
        "vla_state_fused_vjp")
    in_specs += [rows(C), rows(C)]
    args += (P, Tinv.reshape(BH, NC, C))
  tok = lambda d: (BH, NC, d) if heads is None else (BH // heads, NC, heads, d)
  return pl.pallas_call(
      kernel,
      grid=(BH, NC // C),
      in_specs=in_specs,
      out_specs=[rows(dk, heads), rows(dk), rows(dk), rows(dv, heads)],
      out_shape=[jax.ShapeDtypeStruct(tok(dk), dq_dtype or acc),
                 jax.ShapeDtypeStruct((BH, NC, dk), acc), jax.ShapeDtypeStruct((BH, NC, dk), acc),
                 jax.ShapeDtypeStruct(tok(dv), dv_dtype or acc)],
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret, name=name,
  )(*args)
