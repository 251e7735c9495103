"""Penalty path of VLA as a sequential Pallas (Triton) kernel over segments of the sequence.

A_t = M_t^-1 with M_t = A_0^-1 + sum_{s <= t} u_s u_s^T; the write direction of token t is
a_t = unit(A_t khat_t). A is carried through the Sherman-Morrison downdates as the sequential
definition does, in blocks of b = 16 tokens (rows U, E of the block; A the inverse at its
start; the chunkwise identity of VLA.md section 4 on 16-token blocks):

    X = U A,   I + X U^T = L L^T,   Y = L^-1 X                  [b, dk], [b, b], [b, dk]
    W = E A - tril(E Y^T) Y                                     rows A_t khat_t of the block
    A <- A - Y^T Y                                              the inverse after the block

A [dk, dk] stays in registers; the other values are [b, dk] and [b, b]; the b x b Cholesky is
b elimination steps on one small value (`common.chol_inv`), or with `Plan.block_factor`
"newton" (the plan's choice) two Newton steps of b x b products where ||X U^T||_F <= 0.25,
the elimination elsewhere (`common.guarded_chol_inv`; `block_deviations` gives that norm
for every block). With bfloat16 products A enters U A and E A as two bfloat16 parts
(`common.split_operand`): one would round it by 2^-9 of its largest entries in every
product, which over a long segment outgrows A's small eigenvalues when u is anisotropic
(kernels/DESIGN.md, "Penalty scan").

Layout (`Plan.penalty_layout`; the plan's: "rows" at dk <= 64, "transposed" at 128). "rows"
computes the products above on the block's rows: the 16 tokens are the products' M side and
A their right operand, which Triton stages through shared memory every block
(kernels/DESIGN.md, "Penalty scan"). "transposed" computes the same products transposed, on
values [dk, b] whose columns are the tokens:

    X^T = A U^T,   Y^T = X^T L^-T,   W^T = A E^T - Y^T tril(E Y^T)^T,   A <- A + (-Y^T) Y

so the head dim is the M side (M = dk, N = 16: Triton's products need M, N, K >= 16, which
every supported dk meets), A the left operand (which Hopper's wgmma takes from registers) and
the downdate's accumulator. Every safeguard of this module is the same in both: A as a split
operand, the GAIN_LIMIT pass, packed documents, `finite` on the operands holding later
tokens. The rows leave the kernel as rows (one [dk, 16] transpose per block and output).

Blocks of large penalty gain. A block shrinks A along its u by up to 1 + the sum of its gains
u_i^T A u_i (G's diagonal), and low-precision products lose as much relative accuracy: early
in a sequence (A = A_0 = I / lam0, gains |u|^2 / lam0) bfloat16 products drove A indefinite.
With `Plan.accurate_dot` (bfloat16 or one-pass TF32 products) the rows from the first one k
whose running sum of gains exceeds GAIN_LIMIT run the block again at those products, from
A - Y_k^T Y_k (Y_k: the low-precision pass's Woodbury rows of rows < k, which keep their
rows): causal, and W, Y and A one sequence of downdates.

Parallelism: one program per (batch * head, segment). Each sequence is cut into S segments of
L = `Plan.segment_chunks` chunks (as many segments as fill one wave of programs), and A at each
segment start comes from `segment_starts.py` (a direct inverse of the prefix sum of u u^T).

Packed documents (`docs`: each token's document index, nondecreasing): A restarts at
reset * I at every document start. A block then forms X and W from reset * I for the tokens of
documents that start inside it, masks I + X U^T and tril(E Y^T) to pairs of one document
(its Cholesky factor is block diagonal: no token meets another document's), and carries
A <- (reset * I if a document starts in the block, else A) - Y_l^T Y_l over the rows Y_l of
its last document. Such calls run one segment per sequence (no segment starts).

The one kernel runs in two roles (`penalty_scan`'s `role`):
  "unit"  the inference forward: unit rows a_t (optionally from raw keys read in place);
  "both"  the differentiated forward: unit rows and the adjoint's residuals, namely the rows
          W_t = A_t khat_t, the Woodbury rows Y (A after token t is A_c - sum y_s y_s^T over
          the chunk's tokens s <= t) and A_c at every `Plan.chunk_start_stride`-th chunk
          start of each segment (its first chunk's included), from which
          `penalty_backward.py` rebuilds the chunk starts between (`block_downdate`, block by
          block as this kernel carried A) and forms A_t dW_t for all tokens in parallel.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (chol_inv, compiler_params, doc_spec, dot, dot_parts, eye,
                                    finite, guarded_chol_inv, iota, parts_dot, rows_spec,
                                    split_operand, unit_rows)
from vla_jax.kernels.config import SCAN_BLOCK
from vla_jax.kernels.segment_starts import segment_start_inverses
from vla_jax.ops.utils import KEY_EPS, WRITE_EPS

ROLES = ("unit", "both")
# The largest sum of penalty gains u_i^T A u_i over a block's first rows (A at the block start)
# that runs at the plan's low-precision products (`Plan.accurate_dot`): a block shrinks A
# along its u by up to 1 + that sum, and bfloat16 products lose as much relative accuracy
# (2^-9 a product). Interpret mode, bfloat16 inputs, isotropic u, A0 = I / lam0, o against
# float64 per quarter of the sequence: at 8, flat (d = 64, T = 1024, 256-token segments,
# |u| = 8 and 1 at lam0 = 0.1: 5.8e-3 / 5.7e-3 in the first quarter, 5.6e-3 in the last;
# d = 16, |u| = 4 at lam0 = 0.1 and |u| = 1 at 0.01: 8.2e-3 against 8.6e-3); at 16 the first
# quarter errs 1.5x the last (8.2e-3, 1.2e-2), without the limit NaN. At the layer defaults
# (lam0 = 1, |u| = 1, T = 4096) 6 of 256 blocks pass it at d = 64 (13 at d = 128), at
# lam0 = 0.1 12 (NumPy count).
GAIN_LIMIT = 8.0
# Calls whose penalty gains are bounded by this (`large_gains`: max_t |u_t|^2 times a bound on
# A_0's largest eigenvalue, or `reset` with packed documents; A_t <= A_0 in the Loewner order)
# run the scan without the large-gain blocks (`Plan.accurate_dot` left out), the rest with
# them: the guarded kernel is slower in every block, taken or not (one H100, bfloat16,
# H = 16, B * T = 32,768: forward 1.88 -> 2.60 ms at d = 64, T = 4096, 4.01 -> 5.61 ms at
# d = 128; kernels/VARIANTS.md, "Large-gain blocks in every call"). With the choice made per
# call, the op at unit u runs 1-7% slower than before the blocks existed (forward 2.03
# against 1.89 ms at d = 64, T = 4096; results/bench/decisions/fast_path*_h100.jsonl). 1 is
# the layer's defaults (unit u, lam0 = 1), with room for u's rounding; there the unguarded
# scan errs as the guarded one on the GPU's drift check (d = 64, 131k: 6.49e-3 against
# 6.48e-3) and by 1.2-1.4x in the worst case, 16 isotropic rows spanning d = 16 (interpret
# mode, 256 tokens: 3.3e-3 / 2.7e-3 early / late against 2.3e-3; at a bound of 4, 9.9e-3).
FAST_GAIN = 1.05


def past_gain_limit(gain):
  """Whether the running sum of the penalty gains gain [n] up to each row exceeds
  `GAIN_LIMIT` ([n] bool; a row depends on no later row)."""
  r, c, _ = iota(gain.shape[0])
  return jnp.sum(jnp.where(c <= r, gain[None, :], 0.0), axis=1) > GAIN_LIMIT


def document_restart(A, d, prev, reset):
  """Packed documents at a block of the scan: (A restarted at reset * I where a document
  starts in the block, else A; the [b] mask of the block's last document, whose rows alone
  downdate it). d [b]: the block's document indices; prev: the index before the block. The
  scan (both layouts) and the row-cotangent kernel's rebuilt chunk starts restart alike."""
  top = jnp.max(d)
  return jnp.where(top != prev, reset * eye(A.shape[0], A.dtype), A), d == top


def block_downdate(A, Y, mm, *, transposed=False, last=None):
  """A after one block's downdate as the scan carries it: A - Y^T Y of the block's Woodbury
  rows Y [b, dk] (layout "rows"), or A + (-Y^T) Y of its columns Y^T [dk, b], passed as Y
  ("transposed": A the product's accumulator); with packed documents over the rows (columns)
  where `last` ([b, 1] / [1, b] bool, the block's last document) holds. mm: the block's
  products (`dot` at `Plan.factor_dot`, or `Plan.accurate_dot` in a block past
  GAIN_LIMIT). The row-cotangent kernel rebuilds the chunk starts the scan did not keep with
  it (`penalty_backward.py`): the same products on the same rows give the same A."""
  Y_last = Y if last is None else jnp.where(last, Y, 0.0)
  if transposed:
    return A + mm(-Y, Y_last, tb=True)
  return A - mm(Y, Y_last, ta=True)


# ----------------------------------------------------------------------------- kernel

def _scan_kernel(a0_ref, e_ref, u_ref, *outs, L, C, b, stride, role, unit_keys, precision,
                 acc, reset, newton_dot, accurate_dot, transposed):
  # Inputs: a0_ref [dk, dk] (segment-start inverse), e_ref, u_ref [L, dk] (keys, penalty
  # directions); with reset (packed documents) also d_ref [L] (document indices). Outputs:
  # ah_ref [L, dk] (unit rows); for "both" also wr_ref, y_ref [L, dk] (rows A_t khat_t,
  # Woodbury rows), ac_ref [ceil(L / C / stride), dk, dk] (A at every stride-th chunk start)
  # and, with accurate_dot, g_ref [L] (penalty gains); last at_ref [dk, dk] (segment-end
  # inverse). accurate_dot: None, or the products of rows past GAIN_LIMIT (module
  # docstring). transposed: the block's products in `Plan.penalty_layout` "transposed"
  # (`transposed_block`).
  d_ref = g_ref = None
  if reset is not None:
    d_ref, *outs = outs
  if role == "both" and accurate_dot is not None:
    ah_ref, wr_ref, y_ref, ac_ref, g_ref, at_ref = outs
  elif role == "both":
    ah_ref, wr_ref, y_ref, ac_ref, at_ref = outs
  else:
    (ah_ref, at_ref), wr_ref = outs, None
  r, c, v = iota(b)
  one = eye(b, acc)
  block_inverse = (chol_inv if newton_dot is None
                   else functools.partial(guarded_chol_inv, precision=newton_dot))

  def transposed_block(A, U, E, lower, d, d_prev):
    # The block's products transposed (module docstring): its values [dk, b] hold the tokens
    # as columns, X^T = A U^T, W^T = A E^T - Y^T tril(E Y^T)^T, A <- A + (-Y^T) Y, so the head
    # dim is the products' M side and A their left operand and the downdate's accumulator.
    # The same safeguards as the rows' form below: A as a split operand, packed documents,
    # the GAIN_LIMIT pass, non-finite columns through `finite`. Returns (W, Y) as rows
    # [b, dk], the penalty gains [b] (None without accurate_dot) and A after the block
    # (packed: restarted where a document starts in it).
    same = fresh = last = None
    A_base = A
    if d is not None:
      same = d[:, None] == d[None, :]
      fresh = (d != d_prev)[None, :]                                           # [1, b]
      A_base, last = document_restart(A, d, d_prev, reset)
      last = last[None, :]

    def docs(Xt, EAt):
      # Columns of documents that start in this block: reset * U^T, reset * E^T.
      if fresh is None:
        return Xt, EAt
      return jnp.where(fresh, reset * U.T, Xt), jnp.where(fresh, reset * E.T, EAt)

    def gram(mm, Xt):
      G = mm(U, Xt)                                                            # U A U^T
      return G if same is None else jnp.where(same, G, 0.0)

    def downdate(mm, A, Yt):
      # A - Y^T Y over the block's columns (packed: its last document's), A the accumulator.
      return block_downdate(A, Yt, mm, transposed=True, last=last)

    mm = functools.partial(dot, precision=precision)
    A_parts = split_operand(A, precision)
    Xt, EAt = docs(*(parts_dot(A_parts, x, tb=True, precision=precision)
                     for x in (U, E)))                                        # [dk, b]
    G = gram(mm, Xt)
    Yt = mm(finite(Xt), block_inverse(one + G), tb=True)                      # X^T L^-T
    Wt = EAt - mm(finite(Yt), jnp.where(lower, mm(E, Yt), 0.0), tb=True)
    if accurate_dot is None:
      return Wt.T, Yt.T, None, downdate(mm, A_base, Yt)
    # As in the rows' form: from the first column k past GAIN_LIMIT on, the block again at
    # accurate_dot from A minus the downdates of columns < k.
    gain = jnp.sum(jnp.where(r == c, G, 0.0), axis=1)                          # [b]
    k = jnp.min(jnp.where(past_gain_limit(gain), v, b))

    def accurate(Yt, Wt, A_base):
      mm_acc = functools.partial(dot, precision=accurate_dot)
      rest = (v >= k)[None, :]                                                 # [1, b]
      Ypt = finite(jnp.where(rest, 0.0, Yt))                                   # columns < k
      Xt, EAt = docs(mm_acc(A, U, tb=True), mm_acc(A, E, tb=True))
      UY = mm_acc(U, Ypt)
      Xt = Xt - mm_acc(Ypt, UY if same is None else jnp.where(same, UY, 0.0), tb=True)
      G = jnp.where((r >= k) & (c >= k), gram(mm_acc, Xt), 0.0)
      Yt = Ypt + mm_acc(finite(jnp.where(rest, Xt, 0.0)), chol_inv(one + G), tb=True)
      Wt_acc = EAt - mm_acc(finite(Yt), jnp.where(lower, mm_acc(E, Yt), 0.0), tb=True)
      return Yt, jnp.where(rest, Wt_acc, Wt), downdate(mm_acc, A_base, Yt)

    Yt, Wt, A_next = jax.lax.cond(
        k < b, accurate, lambda Yt, Wt, A_base: (Yt, Wt, downdate(mm, A_base, Yt)),
        Yt, Wt, A_base)
    return Wt.T, Yt.T, gain, A_next

  def write(rows, W, Y, gain):
    # The block's rows W [b, dk] (as unit rows; for "both" also W, Woodbury rows Y and the
    # penalty gains [b] or None).
    if g_ref is not None:   # for the row cotangents (`penalty_backward.py`)
      g_ref[rows] = finite(gain).astype(g_ref.dtype)
    if wr_ref is not None:   # the adjoint's residuals, non-finite rows as zeros
      wr_ref[rows, :] = finite(W).astype(wr_ref.dtype)
      y_ref[rows, :] = finite(Y).astype(y_ref.dtype)
    ah_ref[rows, :] = unit_rows(W, WRITE_EPS).astype(ah_ref.dtype)

  def block(j, carry):     # carry: A [dk, dk]; packed: (A, document index before the block)
    A, d_prev = carry if d_ref is not None else (carry, None)
    rows = pl.ds(pl.multiple_of(j * b, b), b)
    U, E = (ref[rows, :].astype(acc) for ref in (u_ref, e_ref))   # [b, dk]
    if unit_keys:
      E = unit_rows(E, KEY_EPS)
    lower = r >= c
    d = None
    if d_ref is not None:   # rows of documents that start in this block begin from reset * I
      d = d_ref[rows]
      fresh = d[:, None] != d_prev
      same = d[:, None] == d[None, :]
      lower = lower & same
    if transposed:
      W, Y, gain, A_next = transposed_block(A, U, E, lower, d, d_prev)
      write(rows, W, Y, gain)
      return A_next if d_ref is None else (A_next, jnp.max(d))

    def docs(X, EA):
      # Rows of documents that start in this block: reset * U, reset * E.
      if d_ref is None:
        return X, EA
      return jnp.where(fresh, reset * U, X), jnp.where(fresh, reset * E, EA)

    def gram(mm, X):
      G = mm(X, U, tb=True)
      return G if d_ref is None else jnp.where(same, G, 0.0)

    # A after the block: A - Y^T Y over its rows (packed: from reset * I where a document
    # starts in the block, over its last document's rows).
    A_base, last = A, None
    if d_ref is not None:
      A_base, last = document_restart(A, d, d_prev, reset)
      last = last[:, None]
    downdate = lambda mm, Y: block_downdate(A_base, Y, mm, last=last)

    # X = U A and E A with A as a split operand (in bfloat16 mode two bfloat16 parts: one
    # would round the carried inverse by 2^-9 of its largest entries in every product,
    # `split_operand`); Y = L^-1 X with I + X U^T = L L^T; W = E A - tril(E Y^T) Y.
    mm = functools.partial(dot, precision=precision)
    A_parts = split_operand(A, precision)
    X, EA = docs(*(dot_parts(x, A_parts, precision=precision) for x in (U, E)))  # [b, dk]
    G = gram(mm, X)
    Y = mm(block_inverse(one + G), finite(X))
    W = EA - mm(jnp.where(lower, mm(E, Y, tb=True), 0.0), finite(Y))
    if accurate_dot is None:
      A_next = downdate(mm, Y)
    else:
      # The penalty gains g_i = u_i^T A u_i (G's diagonal) summed over the rows up to i: the
      # block shrinks A along the rows' u by up to 1 + that sum, and products of the plan's
      # low precision lose as much relative accuracy (bfloat16: 2^-9 of A's entries in the
      # downdate, which drove A indefinite). From the first row k past GAIN_LIMIT on, the
      # block runs again at `accurate_dot` (three TF32 passes), from A minus the downdates of
      # rows < k as the low-precision pass made them (those rows keep their W and Y: no row
      # depends on a later token, and A, W, Y stay one consistent sequence of downdates).
      gain = jnp.sum(jnp.where(r == c, G, 0.0), axis=1)                        # [b]
      k = jnp.min(jnp.where(past_gain_limit(gain), v, b))

      def accurate(Y, W):
        mm_acc = functools.partial(dot, precision=accurate_dot)
        rest = v[:, None] >= k                                                 # [b, 1]
        Yp = finite(jnp.where(rest, 0.0, Y))                                   # rows < k
        X, EA = docs(mm_acc(U, A), mm_acc(E, A))
        UY = mm_acc(U, Yp, tb=True)
        X = X - mm_acc(UY if d_ref is None else jnp.where(same, UY, 0.0), Yp)  # U (A - Yp^T Yp)
        G = jnp.where((r >= k) & (c >= k), gram(mm_acc, X), 0.0)
        Y = Yp + mm_acc(chol_inv(one + G), finite(jnp.where(rest, X, 0.0)))
        W_acc = EA - mm_acc(jnp.where(lower, mm_acc(E, Y, tb=True), 0.0), finite(Y))
        return Y, jnp.where(rest, W_acc, W), downdate(mm_acc, Y)

      Y, W, A_next = jax.lax.cond(k < b, accurate, lambda Y, W: (Y, W, downdate(mm, Y)), Y,
                                  W)
    write(rows, W, Y, None if accurate_dot is None else gain)
    return A_next if d_ref is None else (A_next, jnp.max(d))

  carry = a0_ref[...].astype(acc)
  if d_ref is not None:
    carry = (carry, jnp.int32(0))
  if wr_ref is None:
    carry = jax.lax.fori_loop(0, L // b, block, carry)
  else:
    def chunk(i, carry):
      m = jnp.asarray(stride, i.dtype)

      def keep():   # A at every stride-th chunk start (`Plan.chunk_start_stride`)
        ac_ref[jax.lax.div(i, m), :, :] = (
            carry if d_ref is None else carry[0]).astype(ac_ref.dtype)

      if stride == 1:
        keep()
      else:
        pl.when(jax.lax.rem(i, m) == 0)(keep)
      return jax.lax.fori_loop(0, C // b, lambda j, carry: block(i * (C // b) + j, carry),
                               carry)

    carry = jax.lax.fori_loop(0, L // C, chunk, carry)
  A = carry if d_ref is None else carry[0]
  at_ref[...] = (0.5 * (A + A.T)).astype(at_ref.dtype)


# ----------------------------------------------------------------------------- wrapper

def penalty_scan(A_start, e, u, *, plan, role="unit", warps, rows_dtype=None, heads=None,
                 unit_keys=False, docs=None, reset=None):
  """Rows of every token and the inverse at every segment end (grid (B * H, S)).

  Args:
    A_start: [BH, S, dk, dk] inverse at each segment start (symmetric positive definite), in
      the accumulation dtype.
    e: [BH, S * L, dk] unit keys; u: [BH, S * L, dk] penalty directions (zero rows pad:
      exact).
    plan: the `Plan` (products `factor_dot`, chunk size, interpret mode); role: module
      docstring; warps: Triton warps per program.
    rows_dtype: dtype of the unit rows (default A_start's).
    heads: None, or H when e and u are token-major [B, S * L, H, dk] (read in place).
    unit_keys: e holds raw keys; the kernel divides each row by max(norm, KEY_EPS).
    docs: None, or [BH, S * L] int32 document indices (nondecreasing, 0 for the document that
      continues from A_start; one segment, S = 1): A restarts at `reset` * I (a Python float)
      at every document start.

  Returns:
    role "unit": (unit rows [BH, S * L, dk], A_end [BH, S, dk, dk]); role "both": (unit rows,
    rows A_t khat_t, Woodbury rows Y [BH, S * L, dk], A at every
    `plan.chunk_start_stride`-th chunk start of each segment [BH, S * K, dk, dk] with
    K = ceil(L / C / stride) (`kept_chunk_starts`), with `plan.accurate_dot` the penalty
    gains u_t^T A u_t of every token [BH, S * L] (A at its block's start), A_end), the
    residuals in A_start's dtype.
  """
  BH, S, dk, _ = A_start.shape
  L = e.shape[1] // S
  C = plan.chunk_size
  K = kept_chunk_starts(L // C, plan.chunk_start_stride)
  acc = A_start.dtype
  mat = pl.BlockSpec((None, None, dk, dk), lambda h, s: (h, s, 0, 0))
  rows = rows_spec(L, dk)
  out_specs = [rows, mat]
  out_shape = [jax.ShapeDtypeStruct((BH, S * L, dk), rows_dtype or acc),
               jax.ShapeDtypeStruct((BH, S, dk, dk), acc)]
  if role == "both":
    out_specs[1:1] = [rows, rows, pl.BlockSpec((None, K, dk, dk), lambda h, s: (h, s, 0, 0))]
    out_shape[1:1] = [jax.ShapeDtypeStruct((BH, S * L, dk), acc)] * 2 + [
        jax.ShapeDtypeStruct((BH, S * K, dk, dk), acc)]
    if plan.accurate_dot is not None:
      out_specs.insert(-1, doc_spec(L))
      out_shape.insert(-1, jax.ShapeDtypeStruct((BH, S * L), acc))
  in_specs, args = [mat, rows_spec(L, dk, heads), rows_spec(L, dk, heads)], [A_start, e, u]
  if docs is not None:
    if S != 1:
      raise ValueError(f"packed documents run one segment per sequence; got {S}")
    in_specs, args = in_specs + [doc_spec(L)], args + [docs]
  return pl.pallas_call(
      functools.partial(_scan_kernel, L=L, C=C, b=SCAN_BLOCK, stride=plan.chunk_start_stride,
                        role=role, unit_keys=unit_keys,
                        precision=plan.factor_dot, acc=acc,
                        reset=None if docs is None else float(reset),
                        newton_dot=plan.newton_dot if plan.block_factor == "newton" else None,
                        accurate_dot=plan.accurate_dot,
                        transposed=plan.penalty_layout == "transposed"),
      grid=(BH, S),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=compiler_params(warps),
      interpret=plan.interpret, name="vla_penalty_scan",
  )(*args)


def kept_chunk_starts(chunks, stride):
  """How many chunk starts of a segment of `chunks` chunks the differentiated scan keeps:
  every stride-th (`Plan.chunk_start_stride`), the segment's first included."""
  return -(-chunks // stride)


def chunk_start_inverses(A_kept, Y, plan, N):
  """A at each of the first N chunk starts [BH, N, dk, dk] from the differentiated scan's
  residuals (no packed documents): the kept start of each chunk's group (A_kept
  [BH, S * K, dk, dk], `penalty_scan`) minus y_s y_s^T over the rows s of the chunks between
  (Y [BH, >= N * C, dk]; XLA at HIGHEST). The row-cotangent kernel rebuilds them itself,
  block by block at the scan's products (`penalty_backward.row_cotangents`)."""
  BH, _, dk = Y.shape
  C, Lc, stride = plan.chunk_size, plan.segment_chunks, plan.chunk_start_stride
  n = np.arange(N)
  since = n % Lc % stride                       # chunks since the kept start
  kept = n // Lc * kept_chunk_starts(Lc, stride) + n % Lc // stride
  Yc = Y[:, :N * C].reshape(BH, N, C, dk)
  G = jnp.einsum("bnci,bncj->bnij", Yc, Yc, precision=jax.lax.Precision.HIGHEST)
  A = A_kept[:, kept]
  for j in range(1, stride):                    # the downdates of the j-th chunk before
    A = A - jnp.where((since >= j)[None, :, None, None], G[:, np.maximum(n - j, 0)], 0.0)
  return A


def block_deviations(u, Y, A_kept, plan, b=SCAN_BLOCK):
  """||G - I||_F = ||U A U^T||_F of every b-token block of the penalty scan (U its rows of u,
  A the inverse at its start): what `KernelConfig.block_factor` "newton" holds against
  `common.NEWTON_RADIUS`, from the scan's residuals (role "both", no packed documents):
  A = A_c - Y_s^T Y_s over the rows s of the chunk's earlier blocks, A_c from the kept
  starts (`chunk_start_inverses`; XLA, HIGHEST).

  Args: u [BH, N * C, dk]; Y [BH, >= N * C, dk] Woodbury rows; A_kept [BH, S * K, dk, dk]
  (`penalty_scan`); plan: the scan's `Plan`. Returns [BH, N * C / b]."""
  BH, T, dk = u.shape
  C = plan.chunk_size
  N = T // C
  A_chunks = chunk_start_inverses(A_kept, Y, plan, N)
  mm = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  U = u.reshape(BH, N, C, dk)
  P = mm("bnid,bnde,bnje->bnij", U, A_chunks, U)                  # U A_c U^T
  block = jnp.arange(C) // b
  K = jnp.where(block[None, :] < block[:, None],                   # U Y^T, earlier blocks
                mm("bnid,bnjd->bnij", U, Y[:, :T].reshape(BH, N, C, dk)), 0.0)
  D = jnp.where(block[:, None] == block[None, :], P - mm("bnis,bnjs->bnij", K, K), 0.0)
  return jnp.sqrt(jnp.sum(D * D, axis=-1).reshape(BH, N * C // b, b).sum(-1))


def segment_starts(plan, e, u, A0, token_major=False):
  """(A_start [B * H, S, dk, dk], S, L, e, u): the inverse at every segment start (A0 first)
  and the segment layout, with e and u zero-padded in time to S * L when token-major (the
  Grams and the scan then read the same arrays). e, u: [B, T_pad, H, dk] token-major raw
  keys and u, or [B, H, T_pad, dk] head-major unit keys and u; A0 [B, H, dk, dk]."""
  if token_major:
    B, T_pad, H, dk = u.shape
  else:
    B, H, T_pad, dk = u.shape
  C = plan.chunk_size
  S, L = plan.segments, plan.segment_chunks * C
  if token_major and S * L != T_pad:
    pad = lambda x: jnp.pad(x, [(0, 0), (0, S * L - T_pad), (0, 0), (0, 0)])
    e, u = pad(e), pad(u)
  A_start = A0[:, :, None]
  if S > 1:
    A_start = jnp.concatenate(
        [A_start, segment_start_inverses(u, A0, S, L, plan=plan, token_major=token_major)],
        axis=2)
  return A_start.reshape(B * H, S, dk, dk), S, L, e, u


# The guarded and unguarded scans are one `lax.cond`; under `vmap` a batched predicate would
# make the cond a select that runs both kernels, so the predicate reduces over the mapped axis
# too (one unbatched choice: the guarded scan if any mapped call needs it).
@jax.custom_batching.custom_vmap
def _any_over_batch(x):
  return jnp.any(x)


@_any_over_batch.def_vmap
def _any_over_batch_rule(axis_size, in_batched, x):
  del axis_size, in_batched
  return jnp.any(x), False


def large_gains(u, A0, reset=None):
  """Whether a penalty gain u_t^T A_t u_t of the call may exceed `FAST_GAIN`: max_t |u_t|^2
  times a bound on A_0's largest eigenvalue (A_t <= A_0), the smaller of its largest absolute
  row sum and its trace (a carried state's A has shrunk: its trace can be the tighter one), or
  `reset` with packed documents. A scalar bool, unbatched under `vmap`.

  u: [..., dk] (any layout); A0: [..., dk, dk]."""
  u, A0 = jax.lax.stop_gradient(u), jax.lax.stop_gradient(A0)
  u2 = jnp.max(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=-1))
  A0 = A0.astype(jnp.float32)
  a = jnp.max(jnp.minimum(jnp.max(jnp.sum(jnp.abs(A0), axis=-1), axis=-1),
                          jnp.trace(A0, axis1=-2, axis2=-1)))
  if reset is not None:
    a = jnp.maximum(a, float(reset))
  return _any_over_batch(~(u2 * a <= FAST_GAIN))   # NaN counts as large


def unguarded(plan):
  """`plan` without the large-gain blocks (`Plan.accurate_dot`)."""
  return dataclasses.replace(plan, accurate_dot=None)


def penalty_forward(plan, e, u, A0, *, token_major=False, rows_dtype=None, both=False,
                    docs=None, reset=None, large=None):
  """The penalty path's forward over segments.

  e, u: [B, T_pad, H, dk] the caller's raw keys and u read in place (token_major, inference
  only), or [B, H, T_pad, dk] head-major unit keys and u in the accumulation dtype.
  A0: [B, H, dk, dk]. docs, reset: packed documents (`penalty_scan`; docs [B * H, T_pad],
  head-major, with a plan of one segment). large: with `plan.accurate_dot`, the call's
  `large_gains` where the caller keeps it (the differentiated forward hands it to its
  backward); None: decided here.

  Returns (unit write directions [B * H, T_pad, dk] in rows_dtype, A_T [B * H, dk, dk]); with
  both (the differentiated forward, head-major only) also the adjoint's residuals over the
  segments' whole length S * L: (unit rows, rows A_t khat_t [B * H, S * L, dk], Woodbury rows
  [B * H, S * L, dk], A at every `plan.chunk_start_stride`-th chunk start of each segment
  [B * H, S * K, dk, dk] (`kept_chunk_starts`, K per segment), penalty gains
  [B * H, S * L] or None (without `plan.accurate_dot`; zeros where `large_gains` is false
  and the scan ran without the large-gain blocks), A_T)."""
  T_pad = u.shape[1] if token_major else u.shape[2]
  H, dk = u.shape[-2] if token_major else u.shape[1], u.shape[-1]
  A_start, S, L, e, u = segment_starts(plan, e, u, A0, token_major)
  if token_major:
    rows = lambda x: x
  else:
    rows = lambda x: jnp.pad(x, [(0, 0), (0, 0), (0, S * L - T_pad), (0, 0)]).reshape(
        -1, S * L, dk)
  scan = functools.partial(
      penalty_scan, A_start, rows(e), rows(u), role="both" if both else "unit",
      warps=plan.scan_warps, rows_dtype=rows_dtype, heads=H if token_major else None,
      unit_keys=token_major, reset=reset,
      docs=None if docs is None else jnp.pad(docs, [(0, 0), (0, S * L - T_pad)], mode="edge"))
  if plan.accurate_dot is None:
    out = scan(plan=plan)
  else:   # the large-gain blocks only where the gains may reach them (`FAST_GAIN`)
    def fast():
      out = scan(plan=unguarded(plan))
      if both:   # no gains: the row cotangents take the same branch (`large_gains`)
        out = out[:4] + (jnp.zeros(out[0].shape[:2], out[1].dtype),) + out[4:]
      return tuple(out)
    if large is None:
      large = large_gains(u, A0, reset)
    out = jax.lax.cond(large, lambda: tuple(scan(plan=plan)), fast)
  if both:
    gains = out[4] if plan.accurate_dot is not None else None
    return (out[0][:, :T_pad],) + tuple(out[1:4]) + (gains, out[-1][:, -1])
  return out[0][:, :T_pad], out[1][:, -1]
