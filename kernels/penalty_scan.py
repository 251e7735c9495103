"""Penalty path of VLA as a sequential Pallas (Triton) kernel over segments of the sequence.

A_t = M_t^-1 with M_t = A_0^-1 + sum_{s <= t} u_s u_s^T; the write direction of token t is
a_t = unit(A_t khat_t). A is carried through the Sherman-Morrison downdates as the sequential
definition does, in blocks of b = 16 tokens (rows U, E of the block; A the inverse at its
start; the chunkwise identity of VLA.md section 4 on 16-token blocks):

    X = U A,   I + X U^T = L L^T,   Y = L^-1 X                  [b, dk], [b, b], [b, dk]
    W = E A - tril(E Y^T) Y                                     rows A_t khat_t of the block
    A <- A - Y^T Y                                              the inverse after the block

A [dk, dk] stays in registers; the other values are [b, dk] and [b, b]; the b x b Cholesky is
b elimination steps on one small value (`common.chol_inv`).

Parallelism: one program per (batch * head, segment). Each sequence is cut into S segments of
L = `Plan.segment_chunks` chunks (as many segments as fill one wave of programs), and A at each
segment start comes from `segment_starts.py` (a direct inverse of the prefix sum of u u^T).

The one kernel runs in three roles (`penalty_scan`'s `rows`):
  "unit"       the inference forward: unit rows a_t (optionally from raw keys read in place);
  "both"       the differentiated forward: unit rows and the rows A_t khat_t (residuals);
  "cotangent"  the adjoint backward: its "keys" are the cotangents da_t of the unit rows, made
               into those of the rows, dW_t = unit_rows_vjp(W_t, da_t), on load, and it writes
               the plain rows Z_t = A_t dW_t (`penalty_backward.py`).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vla_jax.kernels.common import (chol_inv, compiler_params, dot, eye, finite, iota,
                                    rows_spec, unit_rows, unit_rows_vjp)
from vla_jax.kernels.config import SCAN_BLOCK
from vla_jax.kernels.segment_starts import segment_start_inverses
from vla_jax.ops.vla.recurrence import KEY_EPS, WRITE_EPS

ROLES = ("unit", "both", "cotangent")


# ----------------------------------------------------------------------------- kernel

def _scan_kernel(*refs, L, b, role, unit_keys, precision, acc):
  # Inputs: a0_ref [dk, dk] (segment-start inverse), e_ref, u_ref [L, dk] (keys, penalty
  # directions), and for role "cotangent" w_ref [L, dk] (the forward's rows A_t khat_t, whose
  # unit rows' cotangents e_ref holds). Outputs: ah_ref [L, dk] (unit rows, or the plain rows
  # for "cotangent"), for "both" also wr_ref [L, dk] (the plain rows), and at_ref [dk, dk]
  # (segment-end inverse).
  cot = role == "cotangent"
  a0_ref, e_ref, u_ref = refs[:3]
  w_ref = refs[3] if cot else None
  outs = refs[4:] if cot else refs[3:]
  ah_ref, wr_ref, at_ref = outs if role == "both" else (outs[0], None, outs[1])
  mm = functools.partial(dot, precision=precision)
  r, c, _ = iota(b)
  one = eye(b, acc)

  def body(j, A):                                         # A: [dk, dk]
    rows = pl.ds(pl.multiple_of(j * b, b), b)
    U, E = (ref[rows, :].astype(acc) for ref in (u_ref, e_ref))   # [b, dk]
    if cot:
      E = unit_rows_vjp(w_ref[rows, :].astype(acc), E, WRITE_EPS)
    elif unit_keys:
      E = unit_rows(E, KEY_EPS)
    # The adjoint scan reads A, the rows and Y through `finite`: its keys are zero where the
    # loss has no cotangent, and a NaN left by a later token must not turn 0 into NaN.
    Au = finite(A) if cot else A
    X = mm(U, Au)                                         # [b, dk]
    Y = mm(chol_inv(one + mm(X, U, tb=True)), finite(X))  # L^-1 X
    Yf = finite(Y)
    W = mm(E, Au) - mm(jnp.where(r >= c, mm(E, Yf if cot else Y, tb=True), 0.0), Yf)
    if wr_ref is not None:   # the rows kept for the adjoint scan, non-finite rows as zeros
      wr_ref[rows, :] = finite(W).astype(wr_ref.dtype)
    if not cot:
      W = unit_rows(W, WRITE_EPS)
    ah_ref[rows, :] = W.astype(ah_ref.dtype)
    return A - mm(Y, Y, ta=True)

  A = jax.lax.fori_loop(0, L // b, body, a0_ref[...].astype(acc))
  at_ref[...] = (0.5 * (A + A.T)).astype(at_ref.dtype)


# ----------------------------------------------------------------------------- wrapper

def penalty_scan(A_start, e, u, *, plan, role="unit", warps, rows_dtype=None, heads=None,
                 unit_keys=False, w=None):
  """Rows of every token and the inverse at every segment end (grid (B * H, S)).

  Args:
    A_start: [BH, S, dk, dk] inverse at each segment start (symmetric positive definite), in
      the accumulation dtype.
    e: [BH, S * L, dk] unit keys (or, role "cotangent", the unit rows' cotangents);
      u: [BH, S * L, dk] penalty directions (zero rows pad: exact).
    plan: the `Plan` (products `factor_dot`, interpret mode); role: module docstring;
      warps: Triton warps per program.
    rows_dtype: dtype of the first rows output (default A_start's).
    heads: None, or H when e and u are token-major [B, S * L, H, dk] (read in place).
    unit_keys: e holds raw keys; the kernel divides each row by max(norm, KEY_EPS).
    w: role "cotangent" only: the forward's rows A_t khat_t [BH, S * L, dk].

  Returns:
    (rows [BH, S * L, dk], A_end [BH, S, dk, dk]); role "both": (unit rows, rows A_t khat_t
    in A_start's dtype, A_end).
  """
  BH, S, dk, _ = A_start.shape
  L = e.shape[1] // S
  acc = A_start.dtype
  mat = pl.BlockSpec((None, None, dk, dk), lambda h, s: (h, s, 0, 0))
  rows = rows_spec(L, dk)
  in_specs = [mat, rows_spec(L, dk, heads), rows_spec(L, dk, heads)]
  args = (A_start, e, u)
  if role == "cotangent":
    in_specs.append(rows)
    args += (w,)
  out_specs = [rows, mat]
  out_shape = [jax.ShapeDtypeStruct((BH, S * L, dk), rows_dtype or acc),
               jax.ShapeDtypeStruct((BH, S, dk, dk), acc)]
  if role == "both":
    out_specs.insert(1, rows)
    out_shape.insert(1, jax.ShapeDtypeStruct((BH, S * L, dk), acc))
  return pl.pallas_call(
      functools.partial(_scan_kernel, L=L, b=SCAN_BLOCK, role=role, unit_keys=unit_keys,
                        precision=plan.factor_dot, acc=acc),
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


def penalty_forward(plan, e, u, A0, *, token_major=False, rows_dtype=None, both=False):
  """The penalty path's forward over segments.

  e, u: [B, T_pad, H, dk] the caller's raw keys and u read in place (token_major, inference
  only), or [B, H, T_pad, dk] head-major unit keys and u in the accumulation dtype.
  A0: [B, H, dk, dk].

  Returns (unit write directions [B * H, T_pad, dk] in rows_dtype, A_T [B * H, dk, dk]); with
  both (the differentiated forward, head-major only) also the rows A_t khat_t over the
  segments' whole length [B * H, S * L, dk] and the segment-start inverses
  [B * H, S, dk, dk] (the adjoint backward's residuals): (unit rows, rows, A_T, A_start)."""
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
                     heads=H if token_major else None, unit_keys=token_major)
  if both:
    return out[0][:, :T_pad], out[1], out[2][:, -1], A_start
  return out[0][:, :T_pad], out[1][:, -1]
