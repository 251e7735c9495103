"""Penalty path of VLA as a sequential Pallas (Triton) kernel over segments of the sequence.

A_t = M_t^-1 with M_t = A_0^-1 + sum_{s <= t} u_s u_s^T; the write direction of token t is
a_t = unit(A_t khat_t). A is carried through the Sherman-Morrison downdates as the sequential
definition does, in blocks of b = 16 tokens (rows U, E of the block; A the inverse at its
start; the chunkwise identity of VLA.md section 4 on 16-token blocks):

    X = U A,   I + X U^T = L L^T,   Y = L^-1 X                  [b, dk], [b, b], [b, dk]
    W = E A - tril(E Y^T) Y                                     rows A_t khat_t of the block
    A <- A - Y^T Y                                              the inverse after the block

A [dk, dk] stays in registers; the other values are [b, dk] and [b, b]; the b x b Cholesky is
b elimination steps on one small value (`common.chol_inv`). With bfloat16 products A enters
U A and E A as two bfloat16 parts (`common.split_operand`): one would round it by 2^-9 of its
largest entries in every product, which over a long segment outgrows A's small eigenvalues
when u is anisotropic (kernels/DESIGN.md, "Penalty scan").

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
          the chunk's tokens s <= t) and A_c at every chunk start, from which
          `penalty_backward.py` forms A_t dW_t for all tokens in parallel.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (chol_inv, compiler_params, doc_spec, dot, dot_parts, eye,
                                    finite, iota, rows_spec, split_operand, unit_rows)
from vla_jax.kernels.config import SCAN_BLOCK
from vla_jax.kernels.segment_starts import segment_start_inverses
from vla_jax.ops.vla.recurrence import KEY_EPS, WRITE_EPS

ROLES = ("unit", "both")


# ----------------------------------------------------------------------------- kernel

def _scan_kernel(a0_ref, e_ref, u_ref, *outs, L, C, b, role, unit_keys, precision, acc,
                 reset):
  # Inputs: a0_ref [dk, dk] (segment-start inverse), e_ref, u_ref [L, dk] (keys, penalty
  # directions); with reset (packed documents) also d_ref [L] (document indices). Outputs:
  # ah_ref [L, dk] (unit rows); for "both" also wr_ref, y_ref [L, dk] (rows A_t khat_t,
  # Woodbury rows) and ac_ref [L / C, dk, dk] (A at each chunk start); last
  # at_ref [dk, dk] (segment-end inverse).
  d_ref = None
  if reset is not None:
    d_ref, *outs = outs
  if role == "both":
    ah_ref, wr_ref, y_ref, ac_ref, at_ref = outs
  else:
    (ah_ref, at_ref), wr_ref = outs, None
  mm = functools.partial(dot, precision=precision)
  r, c, _ = iota(b)
  one = eye(b, acc)

  def block(j, carry):     # carry: A [dk, dk]; packed: (A, document index before the block)
    A, d_prev = carry if d_ref is not None else (carry, None)
    rows = pl.ds(pl.multiple_of(j * b, b), b)
    U, E = (ref[rows, :].astype(acc) for ref in (u_ref, e_ref))   # [b, dk]
    if unit_keys:
      E = unit_rows(E, KEY_EPS)
    lower = r >= c
    # A as a split operand: in bfloat16 mode two bfloat16 parts (one would round the carried
    # inverse by 2^-9 of its largest entries in every product, `split_operand`).
    A_parts = split_operand(A, precision)
    X, EA = (dot_parts(x, A_parts, precision=precision) for x in (U, E))    # [b, dk]
    if d_ref is None:
      G = mm(X, U, tb=True)
    else:   # rows of documents that start in this block begin from reset * I
      d = d_ref[rows]
      fresh = d[:, None] != d_prev
      same = d[:, None] == d[None, :]
      X = jnp.where(fresh, reset * U, X)
      EA = jnp.where(fresh, reset * E, EA)
      G = jnp.where(same, mm(X, U, tb=True), 0.0)
      lower = lower & same
    Y = mm(chol_inv(one + G), finite(X))                  # L^-1 X
    W = EA - mm(jnp.where(lower, mm(E, Y, tb=True), 0.0), finite(Y))
    if wr_ref is not None:   # the adjoint's residuals, non-finite rows as zeros
      wr_ref[rows, :] = finite(W).astype(wr_ref.dtype)
      y_ref[rows, :] = finite(Y).astype(y_ref.dtype)
    ah_ref[rows, :] = unit_rows(W, WRITE_EPS).astype(ah_ref.dtype)
    if d_ref is None:
      return A - mm(Y, Y, ta=True)
    d_last = jnp.max(d)
    A = jnp.where(d_last != d_prev, reset * eye(A.shape[0], acc), A)
    return A - mm(Y, jnp.where(d[:, None] == d_last, Y, 0.0), ta=True), d_last

  carry = a0_ref[...].astype(acc)
  if d_ref is not None:
    carry = (carry, jnp.int32(0))
  if wr_ref is None:
    carry = jax.lax.fori_loop(0, L // b, block, carry)
  else:
    def chunk(i, carry):
      ac_ref[i, :, :] = (carry if d_ref is None else carry[0]).astype(ac_ref.dtype)
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
    rows A_t khat_t, Woodbury rows Y [BH, S * L, dk], A at every chunk start
    [BH, S * L / C, dk, dk], A_end), the residuals in A_start's dtype.
  """
  BH, S, dk, _ = A_start.shape
  L = e.shape[1] // S
  C = plan.chunk_size
  acc = A_start.dtype
  mat = pl.BlockSpec((None, None, dk, dk), lambda h, s: (h, s, 0, 0))
  rows = rows_spec(L, dk)
  out_specs = [rows, mat]
  out_shape = [jax.ShapeDtypeStruct((BH, S * L, dk), rows_dtype or acc),
               jax.ShapeDtypeStruct((BH, S, dk, dk), acc)]
  if role == "both":
    out_specs[1:1] = [rows, rows, pl.BlockSpec((None, L // C, dk, dk), lambda h, s: (h, s, 0, 0))]
    out_shape[1:1] = [jax.ShapeDtypeStruct((BH, S * L, dk), acc)] * 2 + [
        jax.ShapeDtypeStruct((BH, S * L // C, dk, dk), acc)]
  in_specs, args = [mat, rows_spec(L, dk, heads), rows_spec(L, dk, heads)], [A_start, e, u]
  if docs is not None:
    if S != 1:
      raise ValueError(f"packed documents run one segment per sequence; got {S}")
    in_specs, args = in_specs + [doc_spec(L)], args + [docs]
  return pl.pallas_call(
      functools.partial(_scan_kernel, L=L, C=C, b=SCAN_BLOCK, role=role, unit_keys=unit_keys,
                        precision=plan.factor_dot, acc=acc,
                        reset=None if docs is None else float(reset)),
      grid=(BH, S),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=compiler_params(warps),
      interpret=plan.interpret, name="vla_penalty_scan",
  )(*args)


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


def penalty_forward(plan, e, u, A0, *, token_major=False, rows_dtype=None, both=False,
                    docs=None, reset=None):
  """The penalty path's forward over segments.

  e, u: [B, T_pad, H, dk] the caller's raw keys and u read in place (token_major, inference
  only), or [B, H, T_pad, dk] head-major unit keys and u in the accumulation dtype.
  A0: [B, H, dk, dk]. docs, reset: packed documents (`penalty_scan`; docs [B * H, T_pad],
  head-major, with a plan of one segment).

  Returns (unit write directions [B * H, T_pad, dk] in rows_dtype, A_T [B * H, dk, dk]); with
  both (the differentiated forward, head-major only) also the adjoint's residuals over the
  segments' whole length S * L: (unit rows, rows A_t khat_t [B * H, S * L, dk], Woodbury rows
  [B * H, S * L, dk], A at every chunk start [B * H, S * L / C, dk, dk], A_T)."""
  T_pad = u.shape[1] if token_major else u.shape[2]
  H, dk = u.shape[-2] if token_major else u.shape[1], u.shape[-1]
  A_start, S, L, e, u = segment_starts(plan, e, u, A0, token_major)
  if token_major:
    rows = lambda x: x
  else:
    rows = lambda x: jnp.pad(x, [(0, 0), (0, 0), (0, S * L - T_pad), (0, 0)]).reshape(
        -1, S * L, dk)
  out = penalty_scan(A_start, rows(e), rows(u), plan=plan, role="both" if both else "unit",
                     warps=plan.scan_warps, rows_dtype=rows_dtype,
                     heads=H if token_major else None, unit_keys=token_major,
                     docs=None if docs is None else jnp.pad(docs, [(0, 0), (0, S * L - T_pad)],
                                                            mode="edge"),
                     reset=reset)
  if both:
    return (out[0][:, :T_pad],) + tuple(out[1:4]) + (out[4][:, -1],)
  return out[0][:, :T_pad], out[1][:, -1]
