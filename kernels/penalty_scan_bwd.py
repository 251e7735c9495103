"""Reverse pass of the penalty scan (`penalty_scan.py`) as a sequential Pallas (Triton) kernel.

The forward carries A through blocks of b tokens (rows U, E of the block, A its start inverse):

    X = U A,   G = I + X U^T = L L^T,   Linv = L^-1,   Y = Linv X
    W = E A - K Y,  K = tril(E Y^T)                  rows A_t khat_t of the block
    A_next = A - Y^T Y

Its reverse, for the cotangents dW of the rows and dA of A_next (`block_bwd`):

    dY  = -Y (dA + dA^T) - K^T dW + dK^T E,          dK = tril(-dW Y^T)
    dE  = dW A + dK Y
    dLinv = dY X^T,  dX = Linv^T dY
    Lbar = -tril(Linv^T dLinv Linv^T),  P = Phi(L^T Lbar),  dG = sym(Linv^T P Linv)
    dX += dG U,  dU = dG X + dX A
    dA_start = dA + E^T dW + U^T dX

(the Cholesky step is Murray 2016, arXiv:1602.07527, as in `penalty._chol_inverse_products`:
Phi keeps the lower triangle and halves the diagonal; L = G Linv^T). A is symmetric, so only
symmetric parts of the carried cotangent matter downstream (dA enters dY symmetrised, and the
start value of every segment is symmetrised when written).

One program per (batch * head, segment), as in the forward. The program walks its segment's
chunks from last to first: per chunk it recomputes the C / b block-start inverses forward from
the chunk-start inverse A_c that the forward wrote (a static loop, kept as values), then runs
`block_bwd` over the blocks in reverse, carrying dA (unroll=False instead loops over the blocks
and recomputes each block's start from A_c: more downdates, a smaller program). It writes dU,
dE of every row and the cotangent of the segment-start A (`penalty_grad.
penalty_scan_grad` turns the latter into cotangents of u and A_0 through the XLA
segment-start inverses).

Resources (ptxas -v for sm_90a, tf32x3 products, through `experiments/kernel_resources.py`'s
`resources`): the reverse kernel spills, the forward does not (dk <= 64). Stack bytes per
thread at 4 / 8 warps: dk = 64, C = 64: 2264 / 1096 (unroll=False: 1208 / 352); dk = 64,
C = 16 (one block a chunk): 856 / 176; dk = 32, C = 64, 4 warps: 2192; dk = 128, C = 64,
8 warps: 5840 (unroll=False: 3824; forward: 832). Not yet timed on a GPU.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.penalty_scan import block_factors
from vla_jax.kernels.split_prep import _dot, _iota

BLOCKS = (16, 32, 64)


def block_bwd(A, U, E, dW, dA, *, precision):
  """Reverse of one block step. A [dk, dk] block-start inverse; U, E, dW [b, dk] its rows and
  the rows' cotangent; dA [dk, dk] the cotangent of A_next. Returns (cotangent of A, not
  symmetrised; dU; dE). Plain jnp: runs inside the kernel and outside it."""
  dot = functools.partial(_dot, precision=precision)
  r, c, _ = _iota(U.shape[0])
  lower = r >= c
  X, G, Linv, Y = block_factors(A, U, precision=precision)
  Lf = dot(G, Linv, tb=True)                                        # L = G L^-T
  K = jnp.where(lower, dot(E, Y, tb=True), 0.0)
  dK = jnp.where(lower, -dot(dW, Y, tb=True), 0.0)
  dY = -dot(Y, dA + dA.T) - dot(K, dW, ta=True) + dot(dK, E, ta=True)
  dE = dot(dW, A) + dot(dK, Y)
  dLinv = dot(dY, X, tb=True)
  dX = dot(Linv, dY, ta=True)
  Lbar = -jnp.where(lower, dot(dot(Linv, dLinv, ta=True), Linv, tb=True), 0.0)
  P = dot(Lf, Lbar, ta=True)
  P = jnp.where(r > c, P, jnp.where(r == c, 0.5 * P, 0.0))
  dG = dot(dot(Linv, P, ta=True), Linv)
  dG = 0.5 * (dG + dG.T)
  dX = dX + dot(dG, U)
  dU = dot(dG, X) + dot(dX, A)
  dA_start = dA + dot(E, dW, ta=True) + dot(U, dX, ta=True)
  return dA_start, dU, dE


def _bwd_kernel(ac_ref, e_ref, u_ref, dw_ref, dae_ref, du_ref, de_ref, das_ref, *, L, b, C,
                unroll, fprec, acc):
  # ac_ref: [L / C, dk, dk] chunk-start inverses of the segment; e_ref, u_ref, dw_ref: [L, dk]
  # unit keys, penalty directions and the rows' cotangent; dae_ref: [dk, dk] cotangent of the
  # segment-end A. Out: du_ref, de_ref [L, dk]; das_ref [dk, dk] cotangent of the start A.
  dot = functools.partial(_dot, precision=fprec)
  per, n = C // b, L // C
  rows = lambda ref, j: ref[pl.ds(pl.multiple_of(j * b, b), b), :].astype(acc)

  def downdate(blk, A):
    Y = block_factors(A, rows(u_ref, blk), precision=fprec)[3]
    return A - dot(Y, Y, ta=True)

  def block(blk, A, dA):
    dA, dU, dE = block_bwd(A, rows(u_ref, blk), rows(e_ref, blk), rows(dw_ref, blk), dA,
                           precision=fprec)
    out = pl.ds(pl.multiple_of(blk * b, b), b)
    du_ref[out, :] = dU.astype(du_ref.dtype)
    de_ref[out, :] = dE.astype(de_ref.dtype)
    return dA

  def chunk(i, dA):
    m = n - 1 - i
    A_c = ac_ref[m].astype(acc)
    if unroll:
      starts = [A_c]                                 # block-start inverses of the chunk
      for j in range(per - 1):
        starts.append(downdate(m * per + j, starts[-1]))
      for j in reversed(range(per)):
        dA = block(m * per + j, starts[j], dA)
      return dA

    def back(k, dA):                                 # block j = per - 1 - k of the chunk
      j = per - 1 - k
      A = jax.lax.fori_loop(0, j, lambda i, A: downdate(m * per + i, A), A_c)
      return block(m * per + j, A, dA)
    return jax.lax.fori_loop(0, per, back, dA)

  dA = jax.lax.fori_loop(0, n, chunk, dae_ref[...].astype(acc))
  das_ref[...] = (0.5 * (dA + dA.T)).astype(das_ref.dtype)


def penalty_scan_bwd(A_c, e, u, dW, dA_end, *, chunk_size, block=16, unroll=True,
                     factor_precision, num_warps=4, interpret=False):
  """Cotangents of the rows' inputs and of the segment-start inverses of `penalty_scan`.

  Args:
    A_c: [BH, S * L / C, dk, dk] inverse at every chunk start (`penalty_scan`'s chunk-start
      output, symmetrised), in the accumulation dtype.
    e, u: [BH, S * L, dk] unit keys and penalty directions (zero rows pad: exact).
    dW: [BH, S * L, dk] cotangent of the rows A_t khat_t (`penalty_scan(normalize=False)`).
    dA_end: [BH, S, dk, dk] cotangent of every segment's end inverse (zero except for the
      last segment when the segment starts come from elsewhere).
    chunk_size: C (a multiple of `block` dividing the segment length L).
    block: tokens per Sherman-Morrison block b (16, 32 or 64).
    unroll: True (the function's default; `KernelConfig.scan_bwd_unroll` defaults to False,
      measured faster on an H200): per chunk, the C / b - 1 downdates to the block starts run once
      and the block starts stay live as values, the chunk's blocks unrolled. False: the
      blocks in a loop, each block's start recomputed from the chunk start (C / b (C / b - 1)
      / 2 downdates a chunk instead of C / b - 1; a smaller program, fewer live values).
      `KernelConfig.scan_bwd_unroll` sets it in `vla_pallas`'s gradient.
    factor_precision: precision of the products (tf32, tf32x3, ieee or bf16 on GPUs,
      HIGHEST otherwise; bf16 also in interpret mode).

  Returns:
    (dU [BH, S * L, dk], dE [BH, S * L, dk], dA_start [BH, S, dk, dk] cotangent of every
    segment-start inverse, symmetrised), in A_c's dtype.
  """
  BH, S, dk, _ = dA_end.shape
  L = e.shape[1] // S
  C = chunk_size
  if block not in BLOCKS or C % block or L % C:
    raise ValueError(f"chunk_size must be a multiple of the block {block} (one of {BLOCKS}) "
                     f"and divide the segment length {L}; got {chunk_size!r}")
  acc = A_c.dtype
  mat = pl.BlockSpec((None, None, dk, dk), lambda h, s: (h, s, 0, 0))
  rows = pl.BlockSpec((None, L, dk), lambda h, s: (h, s, 0))
  chunks = pl.BlockSpec((None, L // C, dk, dk), lambda h, s: (h, s, 0, 0))
  return pl.pallas_call(
      functools.partial(_bwd_kernel, L=L, b=block, C=C, unroll=unroll,
                        fprec=factor_precision, acc=acc),
      grid=(BH, S),
      in_specs=[chunks, rows, rows, rows, mat],
      out_specs=[rows, rows, mat],
      out_shape=[jax.ShapeDtypeStruct((BH, S * L, dk), acc),
                 jax.ShapeDtypeStruct((BH, S * L, dk), acc),
                 jax.ShapeDtypeStruct((BH, S, dk, dk), acc)],
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="vla_penalty_scan_bwd",
  )(A_c, e, u, dW, dA_end)
