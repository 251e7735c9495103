"""Penalty path of VLA as a sequential Pallas (Triton) kernel over segments of the sequence.

The split prep (`split_prep.py`) inverts M_c at every chunk start and factorises every C x C
block with C elimination steps on whole [C, C] or [dk, dk] values: parallel, but each step is a
few cross-warp reductions on a large value, and there are dk + C of them per chunk. Here A is
instead *carried* through the Sherman-Morrison downdates, as the sequential definition does,
in blocks of `block` tokens (rows U_j, E_j of the block; A the inverse at the block start):

    X = U_j A,   I + X U_j^T = L L^T,   Y = L^-1 X          [b, dk], [b, b], [b, dk]
    W_j = E_j A - tril(E_j Y^T) Y                           rows A_t khat_t of the block
    A  <- A - Y^T Y                                         the inverse after the block

(the chunkwise identity of the penalty path, VLA.md section 4, on blocks of b = 16 tokens:
the b x b factorisation is b elimination steps on a small value, and every product is small).
A [dk, dk] stays in registers; the only values are [b, dk], [b, b] and [dk, dk].

Parallelism. One program per (batch * head, segment): the sequence is cut into S segments of
L tokens and A at each segment start is M^-1 with M = A_0^-1 + sum of u u^T before it (computed
in XLA by the caller: a prefix sum and S batched Cholesky inverses). With S = 1 the whole path is
carried (most accurate: no inversion at all); larger S fills the GPU when B * H is small, at the
accuracy of a direct inversion at S - 1 points (eps * cond(M), see NOTES.md) instead of every
chunk start.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.split_prep import _chol_inv, _dot, _eye, _iota
from vla_jax.ops.vla.recurrence import WRITE_EPS

BLOCKS = (16, 32, 64)


def _scan_kernel(a0_ref, e_ref, u_ref, ah_ref, at_ref, *, L, b, prefetch, fprec, acc):
  # a0_ref, at_ref: [dk, dk] segment-start and segment-end inverses; e_ref, u_ref, ah_ref:
  # [L, dk] unit keys, penalty directions and (out) write directions of the segment.
  dot = functools.partial(_dot, precision=fprec)
  r, c, _ = _iota(b)
  eye = _eye(b, acc)
  n_blocks = L // b
  start = lambda j: j * b if isinstance(j, int) else pl.multiple_of(j * b, b)
  load = lambda j: tuple(ref[pl.ds(start(j), b), :].astype(acc) for ref in (u_ref, e_ref))

  def step(j, A, U, E):
    X = dot(U, A)
    Y = dot(_chol_inv(eye + dot(X, U, tb=True)), X)
    W = dot(E, A) - dot(jnp.where(r >= c, dot(E, Y, tb=True), 0.0), Y)
    inv_norm = jax.lax.rsqrt(jnp.maximum(jnp.sum(W * W, axis=1), WRITE_EPS ** 2))
    ah_ref[pl.ds(start(j), b), :] = (W * inv_norm[:, None]).astype(ah_ref.dtype)
    return A - dot(Y, Y, ta=True)

  A0 = a0_ref[...].astype(acc)
  if prefetch:
    # Block j + 1's rows are loaded before block j's products, so their latency overlaps
    # the products instead of starting each block (the last block reloads itself).
    def body(j, carry):
      A, U, E = carry
      nxt = load(jnp.minimum(j + 1, n_blocks - 1))
      return (step(j, A, U, E),) + nxt
    A = jax.lax.fori_loop(0, n_blocks, body, (A0,) + load(0))[0]
  else:
    A = jax.lax.fori_loop(0, n_blocks, lambda j, A: step(j, A, *load(j)), A0)
  at_ref[...] = (0.5 * (A + A.T)).astype(at_ref.dtype)


def penalty_scan(A_start, e, u, *, block=16, prefetch=False, factor_precision, num_warps=4,
                 interpret=False):
  """Write directions of every token and the inverse at every segment end.

  Args:
    A_start: [BH, S, dk, dk] inverse at each segment start (symmetric positive definite).
    e: [BH, S * L, dk] unit keys; u: [BH, S * L, dk] penalty directions (zero rows pad: exact).
    block: tokens per Sherman-Morrison block b (16, 32 or 64; L must be a multiple).
    prefetch: load block j + 1's rows before block j's products (same result; measured
      within noise on an H200, so off by default).
    factor_precision: precision of the products (tf32x3 / ieee on GPUs, HIGHEST otherwise).

  Returns:
    (Ahat [BH, S * L, dk] unit write directions, A_end [BH, S, dk, dk]), in A_start's dtype.
  """
  BH, S, dk, _ = A_start.shape
  L = e.shape[1] // S
  if block not in BLOCKS or L % block:
    raise ValueError(f"block must be one of {BLOCKS} and divide the segment length {L}; "
                     f"got {block!r}")
  acc = A_start.dtype
  mat = pl.BlockSpec((None, None, dk, dk), lambda h, s: (h, s, 0, 0))
  rows = pl.BlockSpec((None, L, dk), lambda h, s: (h, s, 0))
  return pl.pallas_call(
      functools.partial(_scan_kernel, L=L, b=block, prefetch=prefetch, fprec=factor_precision,
                        acc=acc),
      grid=(BH, S),
      in_specs=[mat, rows, rows],
      out_specs=[rows, mat],
      out_shape=[jax.ShapeDtypeStruct((BH, S * L, dk), acc),
                 jax.ShapeDtypeStruct((BH, S, dk, dk), acc)],
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="vla_penalty_scan",
  )(A_start, e, u)


def segments_for(BH, N, resident=264):
  """Chunks per segment: as many segments as fit in one wave of `resident` programs (two per
  SM of an H200), at least one, never fewer than one chunk per segment. A second, partial wave
  adds a whole segment's latency: measured on an H200 at d = 64, one wave is 11% faster at
  T = 4096, B = 8 (2 segments instead of 3) and 16% at T = 32768, B = 1 (16 instead of 17)."""
  S = min(N, max(1, resident // BH))
  return -(-N // S)
