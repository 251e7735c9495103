"""Penalty path of VLA in XLA, parallel over chunks: rows A_t khat_t for every token.

A_t = M_t^-1 with M_t = A_0^-1 + sum_{s<=t} u_s u_s^T. With chunks of C tokens (rows U_n, Khat_n):

    G_n  = U_n^T U_n                                   [dk, dk]  per-chunk Grams
    M_c  = A_0^-1 + sum_{m<n} G_m                      exclusive prefix sum over chunks
    A_c  = M_c^-1                                      Cholesky inverse, symmetrised
                                                       (+ one Newton step, optional)
    I + U A_c U^T = L L^T,  Y = L^-1 U A_c             [C, C], [C, dk]
    rows A_t khat_t = Khat A_c - tril(Khat Y^T) Y      [C, dk]
    A_T  = A_c(last) - Y_last^T Y_last

Every step is batched over all chunks: no sequential pass. The price is accuracy: the
chunk-start inverses are computed from M directly instead of carried through exact downdates
(`vla_jax.ops.vla.penalty.penalty_chunked`), so their relative error grows like
eps * cond(M_c). See NOTES.md for measurements.
"""

import functools

import jax
import jax.numpy as jnp

from vla_jax.kernels.triangular import tri_inverse
from vla_jax.ops.utils import tril_inverse


def _sym(A):
  return 0.5 * (A + jnp.swapaxes(A, -1, -2))


def _lower_inverse(L, solver, precision):
  if solver == "nilpotent":
    return tri_inverse(L, unit_diagonal=False, precision=precision)
  eye = jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape)
  return jax.lax.linalg.triangular_solve(L, eye, left_side=True, lower=True)


def _chol_inverse(G, solver, precision):
  """L^-1 for G = L L^T (G [..., n, n] symmetric positive definite)."""
  if solver == "doubling":
    return _chol_inverse_products(G, precision)
  return _lower_inverse(jnp.linalg.cholesky(G), solver, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _chol_inverse_products(G, precision):
  """L^-1 for G = L L^T: Cholesky, then block doubling (`tril_inverse`). Its backward pass is
  products only. Plain autodiff would differentiate the Cholesky factorisation through
  triangular solves (slow when batched over many small matrices on a GPU) and the doubling
  rounds step by step. With Z = L^-1 and Zbar its cotangent:

      Lbar = -tril(Z^T Zbar Z^T)              (inverse, restricted to lower-triangular L)
      P    = Phi(L^T Lbar)                    (lower triangle, diagonal halved)
      Gbar = sym(Z^T P Z)                     (Cholesky; Murray 2016, arXiv:1602.07527)
  """
  return tril_inverse(jnp.linalg.cholesky(G))


def _chol_inverse_products_fwd(G, precision):
  L = jnp.linalg.cholesky(G)
  Z = tril_inverse(L)
  return Z, (L, Z)


def _chol_inverse_products_bwd(precision, res, Zbar):
  L, Z = res
  mm = functools.partial(jnp.matmul, precision=precision)
  T = lambda x: jnp.swapaxes(x, -1, -2)
  Lbar = -jnp.tril(mm(mm(T(Z), Zbar), T(Z)))
  P = jnp.tril(mm(T(L), Lbar))
  P = P - 0.5 * jnp.eye(P.shape[-1], dtype=P.dtype) * P
  return (_sym(mm(mm(T(Z), P), Z)),)


_chol_inverse_products.defvjp(_chol_inverse_products_fwd, _chol_inverse_products_bwd)


def _spd_inverse(M, *, refine, precision, solver="triangular_solve"):
  """Inverse of symmetric positive definite M [..., d, d] via Cholesky, symmetrised."""
  mm = functools.partial(jnp.matmul, precision=precision)
  eye = jnp.eye(M.shape[-1], dtype=M.dtype)
  Linv = _chol_inverse(_sym(M), solver, precision)
  A = _sym(mm(jnp.swapaxes(Linv, -1, -2), Linv))
  if refine:  # Newton-Schulz step: A <- A + A (I - M A)
    A = _sym(A + mm(A, eye - mm(M, A)))
  return A


def penalty_parallel(khat, u, A0, *, refine=True, precision=jax.lax.Precision.HIGHEST,
                     solver="triangular_solve", return_starts=False):
  """Write directions (unnormalised) for all chunks at once.

  Args:
    khat: [B, H, N, C, dk] unit keys in chunks (zero rows for padding).
    u: [B, H, N, C, dk] penalty directions in chunks (zero rows for padding).
    A0: [B, H, dk, dk] initial penalty inverse (symmetric positive definite).
    refine: one Newton step on each chunk-start inverse.
    precision: matrix-product precision.
    solver: "triangular_solve", "nilpotent" or "doubling" (matrix products only;
      `triangular.py`).

    return_starts: also return the chunk-start inverses A_c [B, H, N, dk, dk].

  Returns:
    W [B, H, N, C, dk] with rows A_t khat_t, and A_T [B, H, dk, dk] (and A_c). Same dtype as
    khat.
  """
  mm = functools.partial(jnp.einsum, precision=precision)
  gram = mm("bhnci,bhncj->bhnij", u, u)                          # [B, H, N, dk, dk]
  before = jnp.cumsum(gram, axis=2)[:, :, :-1]
  before = jnp.concatenate([jnp.zeros_like(gram[:, :, :1]), before], axis=2)
  M0 = _spd_inverse(A0, refine=False, precision=precision, solver=solver)
  A_c = _spd_inverse(M0[:, :, None] + before, refine=refine, precision=precision,
                     solver=solver)
  W, Y, _ = chunk_rows(A_c, u, khat, precision, solver)
  A_T = _sym(A_c[:, :, -1] - mm("bhck,bhcj->bhkj", Y[:, :, -1], Y[:, :, -1]))
  return (W, A_T, A_c) if return_starts else (W, A_T)


def chunk_rows(A, U, E, precision, solver):
  """One chunk's penalty rows from its start inverse, batched over any leading axes.
  A [..., dk, dk]; U, E [..., C, dk] penalty directions and unit keys.

      X = U A,  I + X U^T = L L^T,  Y = L^-1 X,  W = E A - tril(E Y^T) Y

  Returns W [..., C, dk] (rows A_t khat_t), Y [..., C, dk] (A_next = A - Y^T Y) and L^-1."""
  mm = functools.partial(jnp.matmul, precision=precision)
  T = lambda x: jnp.swapaxes(x, -1, -2)
  X = mm(U, A)
  eye = jnp.eye(U.shape[-2], dtype=U.dtype)
  Linv = _chol_inverse(_sym(eye + mm(X, T(U))), solver, precision)
  Y = mm(Linv, X)
  return mm(E, A) - mm(jnp.tril(mm(E, T(Y))), Y), Y, Linv
