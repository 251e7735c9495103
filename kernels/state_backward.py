"""Backward of the state path: the reverse pass over chunk states, then chunk-local VJPs.

The chunk map of `state_path.py` is affine in the chunk-start state S: S_next = S Phi + Psi
with Phi = I - W'^T W, Psi = U'^T W, and O = (Q - P W') S^T + P U'. The
cotangent of the state runs backwards as

    dS_c = dS_next - (dS_next W^T) W' + dO^T (Q - P W')  (= dS_next Phi^T + G_n),

carried in registers (grid (B * H, dv / BV), reverse over chunks), writing dS_next of every
chunk. With few programs (`Plan.split_backward`) the state-independent term
G_n = dO_n^T (Q_n - P_n W'_n) is first computed in parallel over (batch * head, chunk)
(`vla_state_bwd_terms`) and the loop keeps only dS <- dS - (dS W^T) W' + G_n
(`vla_state_bwd_chain`); else one fused loop (`vla_state_bwd`).

Then, with the chunk-start states S_c of the forward, the cotangents of the chunk-local inputs
are independent per chunk: the VJP of O = Q S^T + P R, S_next = S + R^T W, R = T (V - E S^T)
with S fixed, fed (dO, dS_next), by hand:

    dR = P^T dO + W dS_next^T              dP = tril(dO R^T)
    dX = T^T dR                            dLm = strictly_lower(-dX R^T)
    dq = dO S + dP W                       dw = dP^T Q + R dS_next + dLm^T E
    de = -dX S + dLm W                     dv = dX

(dT = dR X^T and dLm = -T^T dT T^T = -dX R^T), reusing the forward's P and T. One program per
(batch * head, chunk) keeps every intermediate on chip (`vla_state_local_vjp`, 8 warps: 224
registers and no spills at d = 64); where that program's float32 operands do not fit
(`Plan.fused_vjp`: head dim 128 without bfloat16 operands, 352 KB of shared memory) the same
VJP runs as 14 batched XLA products over all chunks.

Packed documents (`rel`; `common.doc_masks`; W' is zero outside the chunk's first document):
the reverse step is dS_c = keep * (dS_next - (dS_next W^T) W') + dO^T (first * Q - P W'), and
the chunk-local VJP masks dP and dLm to pairs of one document, takes first * (dO S) into dq
and first * (dX S) into de (R = T (V - first * E S^T)), and last * W in dR, last * (R dS_next)
in dw.

Decays (`gate`, Gated DeltaNet): dS_c = exp(G_C) dS_next - (dS_next (exp(G_C - G) W)^T) W'
+ dO^T (exp(G) Q - P W') in the same loops; the chunk-local VJP, which then also gives dG,
as batched XLA products (`_local_vjp_gated_xla`).

Non-finite values at later tokens meet only zero cotangents when the loss reads earlier
outputs; every value tile enters the products through `finite`, so 0 * NaN never reaches an
earlier token's cotangent.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (BF16, compiler_params, decay_factors, doc_masks, doc_spec,
                                    dot, finite, head_rows, iota, merge_chunks, rows_spec,
                                    split_chunks, token_rows)
from vla_jax.kernels.config import STATE_STAGES, STATE_WARPS

VJP_WARPS = 8   # the chunk-local VJP program: fewer spills than at 4


# ----------------------------------------------------------------------------- kernels

def _reverse_term(do, q, wp, p, mm, rel=None, gate=None):
  """dO^T (Q - P W') [BV, dk]: the state-independent term of one chunk's reverse step (packed
  documents: Q's rows of the chunk's first document only; decays: exp(G) Q)."""
  if rel is not None:
    q = jnp.where(doc_masks(rel)[1], q, 0.0)
  if gate is not None:
    q = decay_factors(gate)[1] * q
  return mm(do, q - mm(p, wp), ta=True)


def _reverse_step(dS, w, wp, rel, mm, gate=None):
  """dS - (dS W^T) W' (packed documents: 0 for a chunk with a document start; decays:
  exp(G_C) dS - (dS (exp(G_C - G) W)^T) W')."""
  if gate is not None:
    _, _, rest, last = decay_factors(gate)
    return last * dS - mm(mm(dS, rest * w, tb=True), wp)
  dS = dS - mm(mm(dS, w, tb=True), wp)                   # [BV, C] x [C, dk]
  return dS if rel is None else jnp.where(doc_masks(rel)[3], dS, 0.0)


def _sides(side_ref, rows, gated, acc):
  """(rel, gate) of one chunk's rows from the side input (document indices or decays)."""
  if side_ref is None:
    return None, None
  x = side_ref[rows]
  return (None, finite(x.astype(acc))) if gated else (x, None)


def _bwd_kernel(do_ref, q_ref, w_ref, wp_ref, p_ref, dst_ref, *refs,
                C, N, precision, acc, packed, gated=False):
  # One program = one (batch * head, value block), reverse over chunks:
  #   do_ref: [N*C, BV]   q_ref, w_ref, wp_ref: [N*C, dk]   p_ref: [N*C, C]
  #   dst_ref, ds0_ref: [BV, dk]   dsn_ref: [N, BV, dk] (cotangent of each chunk's S_next)
  #   packed documents (rel) or decays (G): side_ref [N*C] before the outputs (dsn_ref,
  #   ds0_ref).
  side_ref, dsn_ref, ds0_ref = refs if packed or gated else (None,) + refs
  mm = functools.partial(dot, precision=precision)

  def body(i, dS):                                       # dS: [BV, dk]
    n = N - 1 - i
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    rel, gate = _sides(side_ref, rows, gated, acc)
    dsn_ref[n, :, :] = dS.astype(dsn_ref.dtype)
    do = do_ref[rows, :].astype(acc)                     # [C, BV]
    q, w, wp = (finite(ref[rows, :].astype(acc)) for ref in (q_ref, w_ref, wp_ref))  # [C, dk]
    p = finite(p_ref[rows, :].astype(acc))               # [C, C]
    return (_reverse_step(dS, w, wp, rel, mm, gate)
            + _reverse_term(do, q, wp, p, mm, rel, gate))

  dS = jax.lax.fori_loop(0, N, body, dst_ref[...].astype(acc))
  ds0_ref[...] = dS.astype(ds0_ref.dtype)


def _bwd_terms_kernel(do_ref, q_ref, wp_ref, p_ref, *refs, precision, acc, packed,
                      gated=False):
  # One (batch * head, chunk): do_ref: [C, dv]; q_ref, wp_ref: [C, dk]; p_ref: [C, C];
  # g_ref: [dv, dk] the chunk's term dO^T (Q - P W'); packed or gated: side_ref [C] before
  # g_ref.
  side_ref, g_ref = refs if packed or gated else (None,) + refs
  do = do_ref[...].astype(acc)
  q, wp, p = (finite(ref[...].astype(acc)) for ref in (q_ref, wp_ref, p_ref))
  g_ref[...] = _reverse_term(do, q, wp, p, functools.partial(dot, precision=precision),
                             *_sides(side_ref, ..., gated, acc)).astype(g_ref.dtype)


def _bwd_chain_kernel(w_ref, wp_ref, g_ref, dst_ref, *refs, C, N, precision, acc, packed,
                      gated=False):
  # w_ref, wp_ref: [N*C, dk]; g_ref, dsn_ref: [N, BV, dk]; dst_ref, ds0_ref: [BV, dk];
  # packed or gated: side_ref [N*C] before the outputs.
  side_ref, dsn_ref, ds0_ref = refs if packed or gated else (None,) + refs
  mm = functools.partial(dot, precision=precision)

  def body(i, dS):
    n = N - 1 - i
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    dsn_ref[n, :, :] = dS.astype(dsn_ref.dtype)
    w, wp = (finite(ref[rows, :].astype(acc)) for ref in (w_ref, wp_ref))
    rel, gate = _sides(side_ref, rows, gated, acc)
    dS = _reverse_step(dS, w, wp, rel, mm, gate)
    return dS + g_ref[n, :, :].astype(acc)

  dS = jax.lax.fori_loop(0, N, body, dst_ref[...].astype(acc))
  ds0_ref[...] = dS.astype(ds0_ref.dtype)


def _local_vjp_kernel(q_ref, e_ref, w_ref, v_ref, do_ref, s_ref, dsn_ref, p_ref, t_ref,  # in
                      *refs, precision, acc, packed):
  # One (batch * head, chunk): q, e, w, dq, de, dw: [C, dk]; v, do, dv: [C, dv]; p, t: [C, C]
  # (the forward's P and T); s_ref, dsn_ref: [dv, dk] the chunk-start state and the
  # cotangent of the chunk-end state; packed: rel_ref [C] before the outputs.
  rel_ref, dq_ref, de_ref, dw_ref, dv_ref = refs if packed else (None,) + refs
  mm = functools.partial(dot, precision=precision)
  Q, E, W, P, T, V, S = (finite(ref[...].astype(acc))
                         for ref in (q_ref, e_ref, w_ref, p_ref, t_ref, v_ref, s_ref))
  dO, dSn = do_ref[...].astype(acc), dsn_ref[...].astype(acc)
  r, c, _ = iota(P.shape[0])
  lower, strict = r >= c, r > c
  first = last = lambda x: x
  if packed:
    same, f, l, _ = doc_masks(rel_ref[...])
    lower, strict = lower & same, strict & same
    first, last = (lambda x: jnp.where(f, x, 0.0)), (lambda x: jnp.where(l, x, 0.0))
  R = finite(mm(T, V - first(mm(E, S, tb=True))))                        # [C, dv]
  dR = mm(P, dO, ta=True) + mm(last(W), dSn, tb=True)                    # [C, dv]
  dP = jnp.where(lower, mm(dO, R, tb=True), 0.0)                         # [C, C]
  dX = mm(T, dR, ta=True)                                                # [C, dv]
  dLm = jnp.where(strict, -mm(dX, R, tb=True), 0.0)                      # [C, C]
  dq_ref[...] = (first(mm(dO, S)) + mm(dP, W)).astype(dq_ref.dtype)
  dw_ref[...] = (mm(dP, Q, ta=True) + last(mm(R, dSn))
                 + mm(dLm, E, ta=True)).astype(dw_ref.dtype)
  de_ref[...] = (mm(dLm, W) - first(mm(dX, S))).astype(de_ref.dtype)
  dv_ref[...] = dX.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- wrappers

def reverse_pass(plan, dO, q, w, Wp, P, dS_T, next_dtype=None, heads=None, rel=None,
                 gate=None):
  """dS_next of every chunk [BH, N, dv, dk] (in next_dtype, default the accumulation dtype)
  and dS_0 [BH, dv, dk]. dO: [BH, N*C, dv]; q, w, Wp: [BH, N*C, dk]; P: [BH, N*C, C];
  dS_T: [BH, dv, dk]. heads: None, or H when dO and q are token-major [B, N*C, H, d].
  rel: None, or [BH, N*C] int32 chunk-relative document indices of packed documents; gate:
  None, or [BH, N*C] cumulative log decays within each chunk (Gated DeltaNet)."""
  BH, NC, dk = w.shape
  dv, C = dO.shape[-1], plan.chunk_size
  N, BV, acc = NC // C, plan.block_v, Wp.dtype
  k_spec = pl.BlockSpec((None, NC, dk), lambda b, j: (b, 0, 0))
  n_spec = pl.BlockSpec((None, N, BV, dk), lambda b, j: (b, 0, j, 0))
  s_spec = pl.BlockSpec((None, BV, dk), lambda b, j: (b, j, 0))
  out_shape = [jax.ShapeDtypeStruct((BH, N, dv, dk), next_dtype or acc),
               jax.ShapeDtypeStruct((BH, dv, dk), acc)]
  params = compiler_params(STATE_WARPS, STATE_STAGES)
  packed, gated = rel is not None, gate is not None
  side = rel if packed else gate
  whole, docs = ([doc_spec(NC, time=lambda b, j: 0)], [side]) if side is not None else ([], [])
  if plan.split_backward:
    rows = lambda d, h=None: rows_spec(C, d, h)
    G = pl.pallas_call(
        functools.partial(_bwd_terms_kernel, precision=plan.state_dot, acc=acc, packed=packed,
                          gated=gated),
        grid=(BH, N),
        in_specs=[rows(dv, heads), rows(dk, heads), rows(dk), rows(C)]
                 + ([doc_spec(C)] if side is not None else []),
        out_specs=pl.BlockSpec((None, None, dv, dk), lambda b, n: (b, n, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((BH, N, dv, dk), acc),
        compiler_params=params, interpret=plan.interpret, name="vla_state_bwd_terms",
    )(dO, q, Wp, P, *docs)
    return pl.pallas_call(
        functools.partial(_bwd_chain_kernel, C=C, N=N, precision=plan.state_dot, acc=acc,
                          packed=packed, gated=gated),
        grid=(BH, dv // BV),
        in_specs=[k_spec, k_spec, n_spec, s_spec] + whole,
        out_specs=[n_spec, s_spec], out_shape=out_shape,
        compiler_params=params, interpret=plan.interpret, name="vla_state_bwd_chain",
    )(w, Wp, G, dS_T, *docs)
  seq = lambda d, f=lambda b, j: 0: rows_spec(NC, d, heads, time=lambda b, j: 0, feature=f)
  return pl.pallas_call(
      functools.partial(_bwd_kernel, C=C, N=N, precision=plan.state_dot, acc=acc,
                        packed=packed, gated=gated),
      grid=(BH, dv // BV),
      in_specs=[seq(BV, lambda b, j: j), seq(dk), k_spec, k_spec,
                pl.BlockSpec((None, NC, C), lambda b, j: (b, 0, 0)), s_spec] + whole,
      out_specs=[n_spec, s_spec], out_shape=out_shape,
      compiler_params=params, interpret=plan.interpret, name="vla_state_bwd",
  )(dO, q, w, Wp, P, dS_T, *docs)


def local_vjp(plan, q, e, w, v, dO, S_c, dS_next, P, T, heads=None, rel=None, gate=None):
  """Chunk-local cotangents (dq, de, dw, dv) of the state path (module docstring).

  q, e, w: [BH, N*C, dk]; v, dO: [BH, N*C, dv] (with heads=H, q, v and dO are token-major
  [B, N*C, H, d] and dq, dv come back so); S_c, dS_next: [BH, N, dv, dk]; P [BH, N*C, C] and
  T [BH, N, C, C] the forward's; rel: None, or [BH, N*C] int32 chunk-relative document
  indices of packed documents. dq, dv in q's and v's dtypes, de, dw in S_c's.
  gate: None, or [BH, N*C] cumulative log decays within each chunk (Gated DeltaNet): then
  also their cotangent dG [BH, N*C], from batched XLA products (`_local_vjp_gated_xla`)."""
  if gate is not None:
    q, v, dO = (head_rows(x, heads) for x in (q, v, dO))
    dq, de, dw, dv, dG = _local_vjp_gated_xla(plan, q, e, w, v, dO, S_c, dS_next, P, T, gate)
    return token_rows(dq, heads), de, dw, token_rows(dv, heads), dG
  if not plan.fused_vjp:
    q, v, dO = (head_rows(x, heads) for x in (q, v, dO))
    dq, de, dw, dv = _local_vjp_xla(plan, q, e, w, v, dO, S_c, dS_next, P, T, rel)
    return token_rows(dq, heads), de, dw, token_rows(dv, heads)
  BH, NC, dk = e.shape
  dv, C, acc = v.shape[-1], plan.chunk_size, S_c.dtype
  rows = lambda d, h=None: rows_spec(C, d, h)
  state = pl.BlockSpec((None, None, dv, dk), lambda b, n: (b, n, 0, 0))
  tok = lambda d: (BH, NC, d) if heads is None else (BH // heads, NC, heads, d)
  grads = pl.pallas_call(
      functools.partial(_local_vjp_kernel, precision=BF16 if plan.low else plan.state_dot,
                        acc=acc, packed=rel is not None),
      grid=(BH, NC // C),
      in_specs=[rows(dk, heads), rows(dk), rows(dk), rows(dv, heads), rows(dv, heads), state,
                state, rows(C), rows(C)] + ([] if rel is None else [doc_spec(C)]),
      out_specs=[rows(dk, heads), rows(dk), rows(dk), rows(dv, heads)],
      out_shape=[jax.ShapeDtypeStruct(tok(dk), q.dtype),
                 jax.ShapeDtypeStruct((BH, NC, dk), acc),
                 jax.ShapeDtypeStruct((BH, NC, dk), acc),
                 jax.ShapeDtypeStruct(tok(dv), v.dtype)],
      compiler_params=compiler_params(VJP_WARPS), interpret=plan.interpret,
      name="vla_state_local_vjp",
  )(q, e, w, v, dO, S_c, dS_next, P, T.reshape(BH, NC, C), *([] if rel is None else [rel]))
  return tuple(g.astype(x.dtype) for g, x in zip(grads, (q, e, w, v)))


def _local_vjp_xla(plan, q, e, w, v, dO, S_c, dS_next, P, T, rel=None):
  """`local_vjp` as batched XLA products over all chunks, head-major (module docstring)."""
  acc, C = S_c.dtype, plan.chunk_size
  mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=plan.xla_dot)
  Q, E, W, V, dOc = (split_chunks(x.astype(acc), C) for x in (q, e, w, v, dO))
  Q, E, W, V = (finite(x) for x in (Q, E, W, V))
  P, T, S_c = finite(split_chunks(P, C)), finite(T), finite(S_c)
  r = jnp.arange(C)
  lower, strict = r[:, None] >= r[None, :], r[:, None] > r[None, :]
  first = last = lambda x: x
  if rel is not None:
    rel = rel.reshape(rel.shape[0], -1, C)                                  # [BH, N, C]
    top = jnp.max(rel, axis=-1, keepdims=True)
    same = rel[..., :, None] == rel[..., None, :]
    lower, strict = lower & same, strict & same
    first = lambda x: jnp.where((rel == 0)[..., None], x, 0)
    last = lambda x: jnp.where((rel == top)[..., None], x, 0)
  R = finite(mm("bnij,bnjv->bniv", T, V - first(mm("bnck,bnvk->bncv", E, S_c))))   # [C, dv]
  dR = mm("bnij,bniv->bnjv", P, dOc) + mm("bnck,bnvk->bncv", last(W), dS_next)
  dP = jnp.where(lower, mm("bniv,bnjv->bnij", dOc, R), 0)
  dX = mm("bnij,bniv->bnjv", T, dR)                                         # T^T dR
  dLm = jnp.where(strict, -mm("bniv,bnjv->bnij", dX, R), 0)
  dq = first(mm("bncv,bnvk->bnck", dOc, S_c)) + mm("bnij,bnjk->bnik", dP, W)
  dw = (mm("bnij,bnik->bnjk", dP, Q) + last(mm("bncv,bnvk->bnck", R, dS_next))
        + mm("bnij,bnik->bnjk", dLm, E))
  de = mm("bnij,bnjk->bnik", dLm, W) - first(mm("bncv,bnvk->bnck", dX, S_c))
  return tuple(merge_chunks(g).astype(x.dtype) for g, x in zip((dq, de, dw, dX), (q, e, w, v)))


def _local_vjp_gated_xla(plan, q, e, w, v, dO, S_c, dS_next, P, T, gate):
  """The chunk-local VJP with decays (Gated DeltaNet), head-major, as batched XLA products.

  Per chunk, with G the cumulative log decays, gam = exp(G), rest = exp(G_C - G),
  last = exp(G_C), D_ij = exp(G_i - G_j) (i >= j) and S the chunk-start state:

      X = V - gam (E S^T),  R = T X,  O = gam (Q S^T) + P R,  S_next = last S + R^T (rest W)
      P = tril(D (Q W^T)),  L = strictly_lower(D (E W^T)),  T = (I + L)^-1

  fed (dO, dS_next): dR = P^T dO + (rest W) dS_next^T, dP = tril(dO R^T), dX = T^T dR,
  dL = strictly_lower(-dX R^T), and with dA = D dP, dB = D dL (element-wise):

      dq = gam (dO S) + dA W          dw = dA^T Q + dB^T E + rest (R dS_next)
      de = dB W - gam (dX S)          dv = dX
      dG_i = sum_j (M_ij - M_ji) + gam_i (dO_i . (Q S^T)_i - dX_i . (E S^T)_i)
             - rest_i (W_i . (R dS_next)_i) + [i = C] (sum_j rest_j (W_j . (R dS_next)_j)
             + last <dS_next, S>),   M = dA (Q W^T) + dB (E W^T)

  (the decays' own derivatives: D_ij, gam_i, rest_i and last are exponentials of G)."""
  acc, C = S_c.dtype, plan.chunk_size
  mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=plan.xla_dot)
  Q, E, W, V, dOc = (finite(split_chunks(x.astype(acc), C)) for x in (q, e, w, v, dO))
  P, T, S = finite(split_chunks(P, C)), finite(T), finite(S_c)
  G = finite(gate.reshape(gate.shape[0], -1, C).astype(acc))                 # [BH, N, C]
  r = jnp.arange(C)
  lower, strict = r[:, None] >= r[None, :], r[:, None] > r[None, :]
  D = jnp.where(lower, jnp.exp(jnp.where(lower, G[..., :, None] - G[..., None, :], 0.0)), 0.0)
  end = G[..., -1:]
  gam, rest, last = jnp.exp(G)[..., None], jnp.exp(end - G)[..., None], jnp.exp(end)[..., None]
  ES, QS = mm("bnck,bnvk->bncv", E, S), mm("bnck,bnvk->bncv", Q, S)           # [C, dv]
  R = finite(mm("bnij,bnjv->bniv", T, V - gam * ES))
  RdS = mm("bncv,bnvk->bnck", R, dS_next)                                   # [C, dk]
  dR = mm("bnij,bniv->bnjv", P, dOc) + mm("bnck,bnvk->bncv", rest * W, dS_next)
  dP = jnp.where(lower, mm("bniv,bnjv->bnij", dOc, R), 0)
  dX = mm("bnij,bniv->bnjv", T, dR)                                         # T^T dR
  dL = jnp.where(strict, -mm("bniv,bnjv->bnij", dX, R), 0)
  dA, dB = D * dP, D * dL
  dq = gam * mm("bncv,bnvk->bnck", dOc, S) + mm("bnij,bnjk->bnik", dA, W)
  dw = (mm("bnij,bnik->bnjk", dA, Q) + mm("bnij,bnik->bnjk", dB, E) + rest * RdS)
  de = mm("bnij,bnjk->bnik", dB, W) - gam * mm("bncv,bnvk->bnck", dX, S)
  M = (dA * mm("bnik,bnjk->bnij", Q, W) + dB * mm("bnik,bnjk->bnij", E, W))
  to_end = rest[..., 0] * jnp.sum(W * RdS, axis=-1)                         # [BH, N, C]
  dG = (jnp.sum(M, axis=-1) - jnp.sum(M, axis=-2)
        + gam[..., 0] * jnp.sum(dOc * QS - dX * ES, axis=-1) - to_end)
  at_end = jnp.sum(to_end, axis=-1) + last[..., 0, 0] * jnp.sum(dS_next * S, axis=(-2, -1))
  dG = dG.at[..., -1].add(at_end)
  grads = tuple(merge_chunks(g).astype(x.dtype) for g, x in zip((dq, de, dw, dX), (q, e, w, v)))
  return grads + (dG.reshape(gate.shape).astype(gate.dtype),)
