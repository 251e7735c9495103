"""The penalty path of VLA: write directions a_t = A_t khat_t / ||A_t khat_t||.

A_t = (M_t)^-1 with M_t = A_0^-1 + sum_{s<=t} u_s u_s^T, kept by Sherman-Morrison:
    z_t = A_{t-1} u_t,   A_t = A_{t-1} - z_t z_t^T / (1 + u_t^T z_t).

Three forms, each returning (W [B, T, H, dk] with rows A_t khat_t, A_T [B, H, dk, dk]):
  - `penalty_scan`: the rank-1 updates token by token;
  - `penalty_prefix_solve`: M_t by an associative prefix sum, then a batched solve
    (the Blelloch-compatible form; accuracy degrades with cond(M));
  - `penalty_chunked`: per chunk, I + U A_c U^T = L L^T (Cholesky), Y = L^-1 U A_c; then
    rows A_t khat_t = Khat A_c - tril(Khat Y^T) Y and A_next = A_c - Y^T Y. The inverse is
    carried through exact low-rank downdates, never re-inverted, which keeps float32
    accurate when M is ill-conditioned.

Gradients. `penalty_scan` and `penalty_prefix_solve` are differentiated by plain autodiff (the
references). `penalty_chunked` has the adjoint backward: M_t is additive in the u u^T and A_t
is symmetric, so for cotangents dW_t of the rows and dA_T of A_T,

    dkhat_t = A_t dW_t =: Z_t              (the same penalty path, run on the rows dW)
    du_s    = -(D_s + D_s^T) u_s,          D_s = sum_{t >= s} Z_t W_t^T + A_T dA_T A_T
    dA_0    = M_0 sym(D_0) M_0,            M_0 = A_0^-1

(`penalty_u_cotangents`: the sums over t >= s chunk by chunk, like a reverse linear
attention). A backward is one more forward pass and a few batched products; no Cholesky
factor is differentiated. The Pallas kernels use the same formulas
(`kernels/penalty_backward.py`).
"""

import functools

import jax
import jax.numpy as jnp

from vla_jax.ops.utils import (HIGHEST, einsum, from_chunks, in_first_document, segment_cumsum,
                               to_chunks, tril_inverse)


def _symmetrize(A):
  return 0.5 * (A + jnp.swapaxes(A, -1, -2))


def penalty_step(A, khat_t, u_t, precision=HIGHEST):
  """One Sherman-Morrison update. A: [B, H, dk, dk]; khat_t, u_t: [B, H, dk].

  Returns (A_t khat_t [B, H, dk], A_t [B, H, dk, dk]); products at `precision`.
  """
  mm = functools.partial(einsum, precision=precision)
  z = mm("bhij,bhj->bhi", A, u_t)
  denom = 1.0 + jnp.sum(u_t * z, axis=-1)
  A = A - mm("bhi,bhj->bhij", z, z) / denom[..., None, None]
  return mm("bhij,bhj->bhi", A, khat_t), A


def penalty_scan(khat, u, A0, starts=None, A_reset=None, precision=HIGHEST):
  """Sherman-Morrison token by token. khat, u: [B, T, H, dk]; A0: [B, H, dk, dk]. With
  `starts` ([B, T] bool, packed documents) A_{t-1} is replaced by `A_reset` ([dk, dk]) at the
  tokens where it is True.

  Each step is rematerialised in the backward (`jax.checkpoint`): a gradient keeps A per token,
  not every intermediate of the step (2.4x less temporary memory with the state scan)."""

  def step(A, x):
    *x, start = x
    if start is not None:
      A = jnp.where(start[:, None, None, None], A_reset, A)
    w_t, A = jax.checkpoint(penalty_step, static_argnums=(3,))(A, *x, precision)
    return A, w_t

  xs = (jnp.moveaxis(khat, 1, 0), jnp.moveaxis(u, 1, 0),
        None if starts is None else jnp.moveaxis(starts, 1, 0))
  A, W = jax.lax.scan(step, A0, xs)
  return jnp.moveaxis(W, 0, 1), A


def penalty_prefix_solve(khat, u, A0, starts=None, A_reset=None, precision=HIGHEST):
  """M_t = A0^-1 + prefix-sum(u u^T) via `lax.associative_scan`, then solve M_t w_t = khat_t.
  With `starts` the sums restart at each document (`segment_cumsum`) and M = A_reset^-1 there."""
  M0 = _symmetrize(jnp.linalg.inv(A0))
  uu = einsum("bthi,bthj->bthij", u, u, precision=precision)
  if starts is None:
    M = jax.lax.associative_scan(jnp.add, uu, axis=1) + M0[:, None]
  else:
    first = in_first_document(starts)[:, :, None, None, None]
    M_reset = _symmetrize(jnp.linalg.inv(A_reset))
    M = segment_cumsum(uu, starts) + jnp.where(first, M0[:, None], M_reset)
  W = jnp.linalg.solve(M, khat[..., None])[..., 0]
  return W, _symmetrize(jnp.linalg.inv(M[:, -1]))


def penalty_u_cotangents(U, W, Z, A_T, dA_T, A0, precision=jax.lax.Precision.HIGHEST):
  """du and dA0 of the penalty path from the rows U (penalty directions), W = A_t khat_t and
  Z = A_t dW_t, all [B, H, N, C, dk] (chunked, zero rows where padded), A_T, dA_T, A0
  [B, H, dk, dk]:

      du_s = -(sum_{t >= s} Z_t (W_t . u_s) + W_t (Z_t . u_s)) - K u_s,
      K = A_T (dA_T + dA_T^T) A_T,

  the sum over t >= s split into the chunk of s (masked C x C products, `chunk_u_cotangents`)
  and the later chunks (reverse exclusive prefix sums of the chunks' Z^T W + W^T Z,
  `suffix_matrices`). dA0 = M_0 sym(P) M_0 with P the sum over all t of Z_t W_t^T plus
  A_T dA_T A_T, M_0 = A0^-1; it is the gradient over symmetric perturbations of A0. The
  per-token products at `precision`, the [dk, dk] ones at HIGHEST.
  Returns (du [B, H, N, C, dk], dA0 [B, H, dk, dk])."""
  D, dA0 = suffix_matrices(W, Z, A_T, dA_T, A0, precision)
  return chunk_u_cotangents(U, W, Z, D, precision), dA0


def suffix_matrices(W, Z, A_T, dA_T, A0, precision=jax.lax.Precision.HIGHEST, symmetrize=True):
  """(D [B, H, N, dk, dk], dA0 [B, H, dk, dk]) of `penalty_u_cotangents`: D_n = the sum over
  the chunks after n of Z^T W + W^T Z, plus K (symmetric), and dA0. symmetrize=False returns
  E_n in place of D_n, with D_n = E_n + E_n^T: the consumer adds the transpose itself (the
  Pallas du kernel does, in a second product on chip), so that no XLA pass transposes the
  [dk, dk] blocks (fused into the reverse prefix sum, such a transpose took 1.2 ms at 512
  chunks a head, d = 64 on an H200)."""
  ZW = jnp.einsum("bhnti,bhntj->bhnij", Z, W, precision=precision)  # sum_t Z_t W_t^T per chunk
  E, dA0 = _later_sums(ZW, A_T, dA_T, A0)
  if not symmetrize:
    return E, dA0
  # Symmetrised once, with K, in one pass over the [dk, dk] per chunk (not before the sums).
  return E + jnp.swapaxes(E, -1, -2), dA0


def segment_suffix_starts(W, Z, A_T, dA_T, A0, segment_chunks,
                          precision=jax.lax.Precision.HIGHEST):
  """`suffix_matrices(symmetrize=False)` at segment granularity: with the N chunks grouped
  into segments of `segment_chunks` (dividing N), (E of each segment's last chunk
  [B, H, N / segment_chunks, dk, dk], dA0). One product per segment instead of per chunk; the
  kernel that consumes them (`kernels/penalty_backward.u_cotangents`) carries the sums
  through the segment's chunks itself."""
  B, H, N, C, dk = W.shape
  seg = lambda x: x.reshape(B, H, N // segment_chunks, segment_chunks * C, dk)
  G = jnp.einsum("bhsti,bhstj->bhsij", seg(Z), seg(W), precision=precision)
  return _later_sums(G, A_T, dA_T, A0)


def _later_sums(G, A_T, dA_T, A0):
  """From per-group sums G [B, H, S, dk, dk] of Z^T W (groups in time order): (E, dA0) with
  E_s = the later groups' sums + A_T dA_T A_T and dA0 = M_0 sym(sum of G + A_T dA_T A_T) M_0
  (`penalty_u_cotangents`). The [dk, dk] products at HIGHEST."""
  mm_full = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  later = jnp.cumsum(G[:, :, ::-1], axis=2)[:, :, ::-1] - G           # groups after s
  ATdA = mm_full("bhij,bhjk,bhkl->bhil", A_T, dA_T, A_T)
  M0 = _symmetrize(jnp.linalg.inv(A0))
  P = jnp.sum(G, axis=2) + ATdA
  return later + ATdA[:, :, None], mm_full("bhij,bhjk,bhkl->bhil", M0, _symmetrize(P), M0)


def chunk_u_cotangents(U, W, Z, D, precision=jax.lax.Precision.HIGHEST):
  """du [B, H, N, C, dk] of `penalty_u_cotangents` from the rows U, W, Z [B, H, N, C, dk] and
  the chunks' suffix matrices D [B, H, N, dk, dk] (`suffix_matrices`): within each chunk the
  masked products, beyond it U D."""
  mm = functools.partial(jnp.einsum, precision=precision)
  C = U.shape[-2]
  r = jnp.arange(C)
  later = r[:, None] <= r[None, :]                                  # [s, t]: t >= s
  UW = jnp.where(later, mm("bhnsi,bhnti->bhnst", U, W), 0.0)
  UZ = jnp.where(later, mm("bhnsi,bhnti->bhnst", U, Z), 0.0)
  return -(mm("bhnst,bhnti->bhnsi", UW, Z) + mm("bhnst,bhnti->bhnsi", UZ, W)
           + mm("bhnsj,bhnij->bhnsi", U, D))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def penalty_chunked(khat, u, A0, chunk_size, precision=HIGHEST):
  """Chunkwise Cholesky downdates of A; sequential over chunks, matmuls inside. Its backward is
  the adjoint one (module docstring): the same function on the rows' cotangents, and
  `penalty_u_cotangents`. A0 enters as its symmetric part (A0 is symmetric wherever it comes
  from; that makes the function's gradient in A0 the symmetric one the backward returns).
  Products at `precision` (the backward's [dk, dk] ones at HIGHEST, `penalty_u_cotangents`)."""
  return _penalty_chunked(khat, u, A0, chunk_size, precision)


def _penalty_chunked_fwd(khat, u, A0, chunk_size, precision):
  W, A_T = _penalty_chunked(khat, u, A0, chunk_size, precision)
  return (W, A_T), (u, _symmetrize(A0), W, A_T)


def _penalty_chunked_bwd(chunk_size, precision, res, cts):
  u, A0, W, A_T = res
  dW, dA_T = cts
  Z, _ = _penalty_chunked(dW, u, A0, chunk_size, precision)          # A_t dW_t
  chunks = lambda x: to_chunks(x, chunk_size)
  du, dA0 = penalty_u_cotangents(chunks(u), chunks(W), chunks(Z), A_T, dA_T, A0, precision)
  return Z, from_chunks(du, u.shape[1]), dA0


penalty_chunked.defvjp(_penalty_chunked_fwd, _penalty_chunked_bwd)


# Tokens per Cholesky block of `penalty_chunked` (at most the chunk size): the error of the
# block factorisation grows with the block's rows when A is large (small lam0 or large u).
# float32 against float64, d = 32, T = 1024, lam0 = 1e-4: 2.1e-4 with 16-token blocks, 5.0e-3
# with 64 (scan 8.8e-5); at lam0 = 1: 4e-7 either way. The Pallas penalty scan uses 16 too.
PENALTY_BLOCK = 16


def _penalty_chunked(khat, u, A0, chunk_size, precision):
  """The forward of `penalty_chunked`: Cholesky blocks of min(chunk_size, PENALTY_BLOCK)
  tokens."""
  A0 = _symmetrize(A0)
  length, C = khat.shape[1], min(chunk_size, PENALTY_BLOCK)
  eye = jnp.eye(C, dtype=khat.dtype)
  mm = functools.partial(einsum, precision=precision)

  def step(A, xs):
    K, U = xs  # [B, H, C, dk]
    UA = mm("bhck,bhkj->bhcj", U, A)
    gram = _symmetrize(eye + mm("bhcj,bhdj->bhcd", UA, U))
    L = jnp.linalg.cholesky(gram)
    Y = mm("bhij,bhjk->bhik", tril_inverse(L, precision=precision), UA)
    KY = jnp.tril(mm("bhik,bhjk->bhij", K, Y))
    W = mm("bhck,bhkj->bhcj", K, A) - mm("bhij,bhjk->bhik", KY, Y)
    return _symmetrize(A - mm("bhck,bhcj->bhkj", Y, Y)), W

  xs = tuple(jnp.moveaxis(to_chunks(x, C), 2, 0) for x in (khat, u))
  A, W = jax.lax.scan(step, A0, xs)
  return from_chunks(jnp.moveaxis(W, 0, 2), length), A


def penalty_chunked_documents(khat, u, A0, chunk_size, starts, A_reset, precision=HIGHEST):
  """`penalty_chunked` with packed documents: A restarts at `A_reset` ([dk, dk]) at the tokens
  where `starts` ([B, T] bool) is True. Per chunk the Gram matrix I + U A_start U^T is block
  diagonal over the chunk's documents (A_start: A_c for the chunk's first document, A_reset
  for those that start inside it), so one Cholesky factor serves them all; the rows' products
  are masked to their own document by selection and the outgoing A is A_start of the chunk's
  last document minus its own downdates. Differentiated by autodiff (no adjoint backward)."""
  A0 = _symmetrize(A0)
  length, C = khat.shape[1], chunk_size
  eye = jnp.eye(C, dtype=khat.dtype)
  doc = jnp.cumsum(to_chunks(starts[:, :, None], C), axis=-1)  # [B, 1, N, C] within chunk
  A_reset = A_reset.astype(khat.dtype)
  mm = functools.partial(einsum, precision=precision)

  def step(A, xs):
    K, U, d = xs  # [B, H, C, dk], [B, 1, C]
    same = d[..., :, None] == d[..., None, :]
    carried = (d == 0)[..., None]
    UA = jnp.where(carried, mm("bhck,bhkj->bhcj", U, A), mm("bhck,kj->bhcj", U, A_reset))
    gram = _symmetrize(eye + jnp.where(same, mm("bhcj,bhdj->bhcd", UA, U), 0.0))
    L = jnp.linalg.cholesky(gram)
    Y = mm("bhij,bhjk->bhik", tril_inverse(L, precision=precision), UA)
    KY = jnp.where(same, jnp.tril(mm("bhik,bhjk->bhij", K, Y)), 0.0)
    KA = jnp.where(carried, mm("bhck,bhkj->bhcj", K, A), mm("bhck,kj->bhcj", K, A_reset))
    W = KA - mm("bhij,bhjk->bhik", KY, Y)
    last = (d == d[..., -1:])[..., None]
    A_start = jnp.where(d[..., -1:, None] == 0, A, A_reset)
    Y_last = jnp.where(last, Y, 0.0)
    return _symmetrize(A_start - mm("bhck,bhcj->bhkj", Y_last, Y_last)), W

  xs = tuple(jnp.moveaxis(to_chunks(x, C), 2, 0) for x in (khat, u)) + (jnp.moveaxis(doc, 2, 0),)
  A, W = jax.lax.scan(step, A0, xs)
  return from_chunks(jnp.moveaxis(W, 0, 2), length), A
