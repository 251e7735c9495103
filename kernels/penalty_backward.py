"""The penalty path under differentiation: forward scan, row cotangents, u-cotangent kernel.

`penalty_path(khat, u, A0, plan)` -> (a [B, H, N, C, dk] unit write directions, A_T) is the
penalty scan (`penalty_scan.py`, role "both") with a custom VJP that differentiates no inverse.
M_t = A_t^-1 is additive in the u u^T and A_t is symmetric, so with W_t = A_t khat_t and the
cotangents dW_t of the rows and dA_T of A_T:

    dkhat_t = A_t dW_t =: Z_t
    du_s    = -(D_s + D_s^T) u_s,                D_s = sum_{t >= s} Z_t W_t^T + A_T dA_T A_T
    dA_0    = M_0 sym(D_0) M_0,                  M_0 = A_0^-1

(`vla_jax.ops.vla.penalty` has the derivation and the XLA form with the same backward). The
cotangents arrive for the unit rows a_t = unit(W_t): dW_t = (da_t - a_t (a_t . da_t)) / |W_t|.
Z needs A_t for every token, which the forward scan carried and did not keep; it kept the
Woodbury rows y_s of its downdates (A_t = A_c - sum of y_s y_s^T over the chunk's tokens
s <= t, A_c the inverse at the chunk start) and A_c at every `Plan.chunk_start_stride`-th
chunk start of each scan segment, so `vla_row_cotangents` forms, per chunk, in parallel

    A_c = A_k - Y_k^T Y_k - ... (k: the kept start; the downdates of the chunks between)
    Z = dW A_c - tril(dW Y^T) Y                  ([C, dk]; tril keeps s <= t)

A_c is rebuilt as the scan carried it: block by block in the scan's order, each 16-token
block's downdate with the scan's products (`penalty_scan.block_downdate`: its layout, its
precision, or `Plan.accurate_dot` where the block's penalty gains passed
`penalty_scan.GAIN_LIMIT`), so the rebuilt A_c is the carried one (bit for bit in interpret
mode). Up to stride - 1 more [C, dk] blocks of Y a program, for a residual of
ceil(chunks / stride) [dk, dk] matrices per segment instead of one per chunk.

With bfloat16 or one-pass TF32 products (`Plan.accurate_dot`) Z cancels like the scan's
downdates: the rows whose penalty gains (written by the forward scan) summed from the chunk
start exceed `penalty_scan.GAIN_LIMIT` take Z at three-pass products.

The sums over t >= s are a reverse linear attention, chunk by chunk: within a chunk the masked
products, across chunks suffix sums of Z^T W. `vla_adjoint_du` keeps them on chip, one program
per (batch * head, segment of up to 8 chunks), carrying

    E <- E + Z_n^T W_n                       from the segment's last chunk back to its first,
    du_n = -(UW Z + UZ W + U E + U E^T),     UW = mask(U W^T), UZ = mask(U Z^T)  ([C, C], t >= s)

from the later segments' sums (one XLA product per segment, `segment_suffix_starts`). No
[N, dk, dk] array of sums is written (d = 128, T = 4096, B = 8: 537 MB, 0.68 ms in XLA).
With `Plan.penalty_layout` "transposed" the kernel carries the symmetric F = E + E^T instead,
F <- F + Z_n^T W_n + W_n^T Z_n and du_n = -(UW Z + UZ W + U F): one U F product a chunk in
place of U E and U E^T (no transposed [dk, dk] operand), one more accumulating product into
the carry.

Packed documents (A restarts at reset * I; `docs`: chunk-relative document indices, see
`common.doc_masks`): the sums over t >= s keep the same document. Z takes reset * dW in place
of dW A_c for tokens of documents that start inside the chunk and masks tril(dW Y^T) to one
document; the rebuild of A_c restarts at reset * I as the scan does (a block with a document
start downdates reset * I by its last document's rows, `penalty_scan.document_restart`); the
du kernel masks UW and UZ to one document, adds U E + U E^T only to the chunk's last document
and carries E <- (E if no document starts in the chunk, else 0) + Z_f^T W over the rows of
its first document (F likewise, adding W^T Z_f too); the segments' E and dA0 (the row's first
document only) follow the same rule in XLA (`_packed_suffix_starts`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (compiler_params, doc_masks, doc_spec, dot, dot_parts,
                                    finite, iota, rows_spec, split_operand, unit_rows_vjp)
from vla_jax.kernels.config import SCAN_BLOCK
from vla_jax.kernels.penalty_scan import (block_downdate, document_restart, kept_chunk_starts,
                                          large_gains, past_gain_limit, penalty_forward,
                                          unguarded)
from vla_jax.ops.vla.penalty import segment_suffix_starts
from vla_jax.ops.utils import WRITE_EPS

DU_SEGMENT_CHUNKS = 8   # chunks a u-cotangent program carries E through (1,024 programs at
                        # T = 4096, B = 8, H = 16 or T = 32768, B = 1)


# ----------------------------------------------------------------------------- Z kernel

def _z_kernel(ac_ref, y_ref, w_ref, da_ref, *refs, C, b, stride, segment_chunks, precision,
              acc, reset, accurate_dot, transposed):
  # One (batch * head, chunk n): ac_ref [dk, dk] A at the kept chunk start k <= n (every
  # stride-th of the scan segment's `segment_chunks`); y_ref (Woodbury rows), w_ref (rows
  # A_t khat_t), da_ref (the unit rows' cotangents), z_ref [C, dk]. A and Y enter through
  # `finite`: after a non-finite token they are NaN, and the zero cotangents there must not
  # turn earlier rows into NaN. refs: first the Woodbury rows of chunks k .. k + stride - 2
  # (stride - 1 refs [C, dk]; those from n on are not read); with accurate_dot then g_ref [C]
  # (the forward's penalty gains) and those chunks' gains; with packed documents then
  # rel_ref [C] and those chunks' chunk-relative document indices; last z_ref. transposed:
  # the scan's `Plan.penalty_layout` (the form of its downdates).
  before = stride - 1
  y_before, refs = refs[:before], refs[before:]
  g_ref, g_before = None, (None,) * before
  if accurate_dot is not None:
    g_ref, g_before, refs = refs[0], refs[1:1 + before], refs[1 + before:]
  r, c, _ = iota(C)
  dW = unit_rows_vjp(w_ref[...].astype(acc), da_ref[...].astype(acc), WRITE_EPS)
  Y = finite(y_ref[...].astype(acc))
  A_c = finite(ac_ref[...].astype(acc))
  lower = r >= c
  if reset is None:
    (z_ref,) = refs
    first, rel_before = None, (None,) * before
  else:
    rel_ref, rel_before, (z_ref,) = refs[0], refs[1:1 + before], refs[1 + before:]
    same, first, _, _ = doc_masks(rel_ref[...])
    lower = lower & same

  def chunk_downdates(A, y_ref, g_ref, rel_ref):
    # A after one earlier chunk, carried as the scan carried it: per block of b rows
    # A <- (reset * I if a document starts in the block, else A) - Y^T Y over the block's
    # (last document's) rows, in the scan's layout, at accurate_dot where the block's gains
    # passed GAIN_LIMIT (the scan's large-gain pass), else at the scan's products.
    _, _, w = iota(b)

    def block(i, carry):
      A, prev = carry                         # prev: the document before the block (rel)
      rows = pl.ds(pl.multiple_of(i * b, b), b)
      Yb, last = finite(y_ref[rows, :].astype(acc)), None
      if rel_ref is not None:
        d = rel_ref[rows]
        A, last = document_restart(A, d, prev, reset)
        prev = jnp.max(d)
      if transposed:
        Yb, last = Yb.T, None if last is None else last[None, :]
      elif last is not None:
        last = last[:, None]
      step = lambda kind: block_downdate(A, Yb, functools.partial(dot, precision=kind),
                                         transposed=transposed, last=last)
      if g_ref is None:
        return step(precision), prev
      k = jnp.min(jnp.where(past_gain_limit(g_ref[rows].astype(acc)), w, b))
      return jax.lax.cond(k < b, lambda: step(accurate_dot), lambda: step(precision)), prev

    return jax.lax.fori_loop(0, C // b, block, (A, jnp.int32(0)))[0]

  # A_c from the kept start k: the downdates of chunks k .. n - 1, in order (stride 1: A_c
  # is kept, nothing to rebuild).
  if before:
    since = jax.lax.rem(jax.lax.rem(pl.program_id(1), jnp.int32(segment_chunks)),
                        jnp.int32(stride))
  for j in range(before):
    A_c = jax.lax.cond(
        j < since, functools.partial(chunk_downdates, y_ref=y_before[j], g_ref=g_before[j],
                                     rel_ref=rel_before[j]),
        lambda A: A, A_c)

  def rows(mm, dWA):
    # Z = dW A_c - tril(dW Y^T) Y with products mm.
    if first is not None:
      dWA = jnp.where(first, dWA, reset * dW)
    return dWA - mm(jnp.where(lower, mm(dW, Y, tb=True), 0.0), Y)

  # A_c as a split operand (two bfloat16 parts in bfloat16 mode, as in the scan).
  Z = rows(functools.partial(dot, precision=precision),
           dot_parts(dW, split_operand(A_c, precision), precision=precision))
  if g_ref is not None:
    # A_t = A_c - (the chunk's downdates up to t) shrank from A_c by up to 1 + the sum of the
    # penalty gains since the chunk start; past GAIN_LIMIT products of the plan's low
    # precision lose as much relative accuracy in Z, and the row takes Z at `accurate_dot`
    # (a row depends on no later row).
    heavy = past_gain_limit(g_ref[...].astype(acc))                                # [C]

    def accurate(Z):
      mm_acc = functools.partial(dot, precision=accurate_dot)
      return jnp.where(heavy[:, None], rows(mm_acc, mm_acc(dW, A_c)), Z)

    Z = jax.lax.cond(jnp.max(jnp.where(heavy, 1.0, 0.0)) > 0.0, accurate, lambda Z: Z, Z)
  z_ref[...] = Z.astype(z_ref.dtype)


def row_cotangents(A_kept, Y, W, da, *, plan, warps, gains=None, rel=None, reset=None):
  """Z [BH, N * C, dk] = A_t dW_t of every token (module docstring), grid (B * H, N).
  A_kept: [BH, S * K, dk, dk] A at every `plan.chunk_start_stride`-th chunk start of each
  scan segment (`penalty_scan.penalty_scan`; K = `kept_chunk_starts`); Y, W:
  [BH, >= N * C, dk] the forward scan's Woodbury rows and rows A_t khat_t; da:
  [BH, N * C, dk] the unit rows' cotangents. gains: [BH, >= N * C], the forward's penalty
  gains, with `plan.accurate_dot` (rows past `GAIN_LIMIT` from their chunk's start take Z
  at those products; the rebuilt chunk starts take the scan's large-gain blocks). rel:
  None, or [BH, N * C] int32 chunk-relative document indices (A restarts at `reset` * I at
  every document start). A program reads the kept start of its chunk's group and the
  [C, dk] rows (gains, document indices) of the up to stride - 1 chunks between."""
  BH, T_pad, dk = da.shape
  C, Lc, stride = plan.chunk_size, plan.segment_chunks, plan.chunk_start_stride
  K = kept_chunk_starts(Lc, stride)
  # Grid indices are int32; lax.div and lax.rem on int32 operands (non-negative: no floor
  # corrections) lower to Triton's integer division.
  div = lambda n, m: jax.lax.div(n, jnp.int32(m))
  rem = lambda n, m: jax.lax.rem(n, jnp.int32(m))
  kept = lambda i, n: (i, div(n, Lc) * K + div(rem(n, Lc), stride), 0, 0)
  # The j-th chunk from the kept start (clamped to n; read only where it precedes n).
  between = [lambda i, n, j=j: jnp.minimum(n - rem(rem(n, Lc), stride) + j, n)
             for j in range(stride - 1)]
  rows = rows_spec(C, dk)
  in_specs = ([pl.BlockSpec((None, None, dk, dk), kept)] + [rows] * 3
              + [rows_spec(C, dk, time=t) for t in between])
  args = [A_kept, Y, W, da] + [Y] * len(between)
  if plan.accurate_dot is not None:
    in_specs += [doc_spec(C)] + [doc_spec(C, time=t) for t in between]
    args += [gains] * (1 + len(between))
  if rel is not None:
    in_specs += [doc_spec(C)] + [doc_spec(C, time=t) for t in between]
    args += [rel] * (1 + len(between))
  return pl.pallas_call(
      functools.partial(_z_kernel, C=C, b=SCAN_BLOCK, stride=stride, segment_chunks=Lc,
                        precision=plan.factor_dot, acc=Y.dtype,
                        reset=None if rel is None else float(reset),
                        accurate_dot=plan.accurate_dot,
                        transposed=plan.penalty_layout == "transposed"),
      grid=(BH, T_pad // C),
      in_specs=in_specs,
      out_specs=rows,
      out_shape=jax.ShapeDtypeStruct((BH, T_pad, dk), Y.dtype),
      compiler_params=compiler_params(warps),
      interpret=plan.interpret, name="vla_row_cotangents",
  )(*args)


# ----------------------------------------------------------------------------- du kernel

def _du_kernel(u_ref, w_ref, z_ref, e0_ref, *refs, C, L, precision, acc, packed, symmetric):
  # u_ref, w_ref, z_ref, du_ref: [L * C, dk] (one segment of L chunks); e0_ref: [dk, dk], E
  # of the segment's last chunk (the later segments' Z^T W and A_T dA_T A_T). Packed
  # documents: refs = (rel_ref [L * C], du_ref). symmetric: carry F = E + E^T
  # (`Plan.penalty_layout` "transposed"; module docstring).
  rel_ref, du_ref = refs if packed else (None,) + refs
  mm = functools.partial(dot, precision=precision)
  r, c, _ = iota(C)

  def body(i, E):   # E, or F = E + E^T (symmetric)
    rows = pl.ds(pl.multiple_of((L - 1 - i) * C, C), C)
    U, W, Z = (ref[rows, :].astype(acc) for ref in (u_ref, w_ref, z_ref))    # [C, dk]
    later = r <= c                                                         # [s, t], t >= s
    if packed:
      same, first, last, keep = doc_masks(rel_ref[rows])
      later = later & same
    UW = jnp.where(later, mm(U, W, tb=True), 0.0)
    UZ = jnp.where(later, mm(U, Z, tb=True), 0.0)
    # E enters after the masked products: its tile stays out of their shared memory (80 KB a
    # program at d = 64 instead of 112). U E + U E^T, or U F in one product.
    UE = mm(U, E) if symmetric else mm(U, E) + mm(U, E, tb=True)
    if packed:   # E holds the later tokens of the chunk's last document only
      UE = jnp.where(last, UE, 0.0)
    du = -(mm(UW, Z) + mm(UZ, W) + UE)
    du_ref[rows, :] = du.astype(du_ref.dtype)
    if packed:
      E, Z = jnp.where(keep, E, 0.0), jnp.where(first, Z, 0.0)
    E = E + mm(Z, W, ta=True)                                              # + Z_n^T W_n
    return E + mm(W, Z, ta=True) if symmetric else E                       # + W_n^T Z_n

  E = e0_ref[...].astype(acc)
  jax.lax.fori_loop(0, L, body, E + E.T if symmetric else E)


def du_segment_chunks(N, most=DU_SEGMENT_CHUNKS):
  """Chunks per program of the u-cotangent kernel: the largest divisor of N up to `most`."""
  return max(L for L in range(1, min(N, most) + 1) if N % L == 0)


def u_cotangents(U, W, Z, E_last, *, plan, warps, rel=None):
  """du [B, H, N, C, dk] (module docstring). U, W, Z: [B, H, N, C, dk], N a multiple of L =
  `du_segment_chunks(N)`; E_last: [B, H, N / L, dk, dk], E of each segment's last chunk;
  rel: None, or [B * H, N * C] int32 chunk-relative document indices. Grid (B * H, N / L)."""
  B, H, N, C, dk = U.shape
  L = du_segment_chunks(N)
  S = N // L
  flat = lambda x: x.reshape(B * H, N * C, dk)
  acc = U.dtype
  seg = pl.BlockSpec((None, L * C, dk), lambda b, s: (b, s, 0))
  in_specs = [seg] * 3 + [pl.BlockSpec((None, None, dk, dk), lambda b, s: (b, s, 0, 0))]
  args = [flat(U), flat(W), flat(Z), E_last.reshape(B * H, S, dk, dk)]
  if rel is not None:
    in_specs, args = in_specs + [doc_spec(L * C)], args + [rel]
  du = pl.pallas_call(
      functools.partial(_du_kernel, C=C, L=L, precision=plan.du_dot, acc=acc,
                        packed=rel is not None,
                        symmetric=plan.penalty_layout == "transposed"),
      grid=(B * H, S),
      in_specs=in_specs,
      out_specs=seg,
      out_shape=jax.ShapeDtypeStruct((B * H, N * C, dk), acc),
      compiler_params=compiler_params(warps),
      interpret=plan.interpret, name="vla_adjoint_du",
  )(*args)
  return du.reshape(B, H, N, C, dk)


def _packed_suffix_starts(W, Z, A_T, dA_T, A0, L, starts, precision):
  """`segment_suffix_starts` for packed documents: (E of each segment's last chunk
  [B, H, N / L, dk, dk], dA0). starts: [B, N * C] bool document starts. E entering a segment's
  last chunk sums Z^T W over the later tokens of the document running at that chunk's end
  (and A_T dA_T A_T where that is the row's last document); dA0 = M_0 sym(D_0) M_0 with D_0
  over the row's first document."""
  B, H, N, C, dk = W.shape
  S = N // L
  mm_full = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  seg_starts = starts.reshape(B, S, L * C)
  # Tokens of each segment before its first document start, and whether it has none.
  first = (jnp.cumsum(seg_starts, axis=-1) == 0)[:, None, :, :, None]
  keep = ~jnp.any(seg_starts, axis=-1)[:, None, :, None, None]            # [B, 1, S, 1, 1]
  seg = lambda x: x.reshape(B, H, S, L * C, dk)
  G = jnp.einsum("bhsti,bhstj->bhsij", jnp.where(first, seg(Z), 0.0), seg(W),
                 precision=precision)
  K = mm_full("bhij,bhjk,bhkl->bhil", A_T, dA_T, A_T)

  def step(E, x):   # from the last segment back: E entering segment s - 1's last chunk
    G_s, keep_s = x
    return G_s + jnp.where(keep_s, E, 0.0), E

  keeps = jnp.broadcast_to(keep, (B, H, S, 1, 1))
  _, E = jax.lax.scan(step, K, (jnp.moveaxis(G, 2, 0), jnp.moveaxis(keeps, 2, 0)),
                      reverse=True)
  in_first = (jnp.cumsum(starts, axis=-1) == 0).reshape(B, 1, N * C, 1)
  D0 = (jnp.einsum("bhti,bhtj->bhij", jnp.where(in_first, Z.reshape(B, H, N * C, dk), 0.0),
                   W.reshape(B, H, N * C, dk), precision=precision)
        + jnp.where(jnp.any(starts, axis=-1)[:, None, None, None], 0.0, K))
  M0 = jnp.linalg.inv(A0)
  M0 = 0.5 * (M0 + jnp.swapaxes(M0, -1, -2))
  return (jnp.moveaxis(E, 0, 2),
          mm_full("bhij,bhjk,bhkl->bhil", M0, 0.5 * (D0 + jnp.swapaxes(D0, -1, -2)), M0))


# ----------------------------------------------------------------------------- custom VJP

@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 5))
def penalty_path(khat, u, A0, plan, docs=None, reset=None):
  """(a [B, H, N, C, dk] unit write directions unit(A_t khat_t), A_T [B, H, dk, dk]) of unit
  keys khat and penalty directions u [B, H, N, C, dk] and A0 [B, H, dk, dk] (one dtype), by
  the penalty scan, with the adjoint backward of this module. The returned A0 cotangent is
  the gradient over symmetric perturbations. docs: None, or packed documents (starts
  [B, N * C] bool, document indices and chunk-relative document indices [B * H, N * C] int32;
  `vla.document_indices`; a plan of one segment): A restarts at `reset` * I at every start."""
  return _forward(khat, u, A0, plan, docs, reset)[:2]


def _forward(khat, u, A0, plan, docs, reset):
  B, H, N, C, dk = khat.shape
  flat = lambda x: x.reshape(B, H, N * C, dk)
  # With large-gain blocks in the plan, whether this call runs them (`large_gains`), decided
  # once for the scan and the row cotangents.
  large = None if plan.accurate_dot is None else large_gains(u, A0, reset)
  a, W, Y, A_chunks, gains, A_T = penalty_forward(
      plan, flat(khat), flat(u), A0, both=True, docs=None if docs is None else docs[1],
      reset=reset, large=large)
  return a.reshape(B, H, N, C, dk), A_T.reshape(B, H, dk, dk), W, Y, A_chunks, gains, large


def _fwd(khat, u, A0, plan, docs, reset):
  a, A_T, W, Y, A_chunks, gains, large = _forward(khat, u, A0, plan, docs, reset)
  return (a, A_T), (khat, u, A0, W, Y, A_chunks, gains, large, A_T, docs)


def _bwd(plan, reset, res, cts):
  khat, u, A0, W_full, Y, A_chunks, gains, large, A_T, docs = res
  da, dA_T = cts
  B, H, N, C, dk = khat.shape
  acc = W_full.dtype
  T_pad = N * C
  rel = None if docs is None else docs[2]
  z = functools.partial(row_cotangents, A_chunks, Y, W_full,
                        da.astype(acc).reshape(B * H, T_pad, dk), rel=rel, reset=reset)
  if plan.accurate_dot is None:
    Z = z(plan=plan, warps=plan.adjoint_warps)
  else:   # the forward scan's branch (`penalty_scan.FAST_GAIN`)
    Z = jax.lax.cond(large, lambda: z(plan=plan, gains=gains, warps=plan.guarded_row_warps),
                     lambda: z(plan=unguarded(plan), warps=plan.adjoint_warps))
  Z = Z.reshape(B, H, N, C, dk)
  W = W_full[:, :T_pad].reshape(B, H, N, C, dk)
  U = u.astype(acc)
  ends = tuple(finite(x.astype(acc)) for x in (A_T, dA_T)) + (A0.astype(acc),)
  L = du_segment_chunks(N)
  if docs is None:
    E_last, dA0 = segment_suffix_starts(W, Z, *ends, L, precision=plan.xla_dot)
  else:
    E_last, dA0 = _packed_suffix_starts(W, Z, *ends, L, docs[0], precision=plan.xla_dot)
  du = u_cotangents(U, W, Z, E_last, plan=plan, warps=plan.adjoint_warps, rel=rel)
  d_docs = None if docs is None else tuple(
      np.zeros(x.shape, jax.dtypes.float0) for x in docs)
  return Z.astype(khat.dtype), du.astype(u.dtype), dA0.astype(A0.dtype), d_docs


penalty_path.defvjp(_fwd, _bwd)
