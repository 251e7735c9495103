"""Chunk prep of VLA as three small Pallas (Triton) kernels, each parallel over all chunks.

The v3 kernel (`chunk_prep.py`) did everything in one program, as ~140 unrolled products on
16-row panels, and spilled heavily. Here the same math is split, like flash-linear-attention
splits its delta rule (chunk_scaled_dot_kkt / solve_tril / recompute_w_u), into three kernels of
grid (B * H, N), one program per (batch * head, chunk), each holding only whole-chunk values
([C, C], [C, d] or [dk, dk]) and a handful of products:

  (a) `vla_spd_inverse`  M_c [dk, dk] -> A_c = M_c^-1:
        Linv = L^-1 for M_c = L L^T (`_chol_inv`: one loop of dk elimination steps on the whole
        matrix), A_c = Linv^T Linv, one Newton step A_c <- A_c + A_c (I - M_c A_c)
        (`refine`), symmetrised. 3 products.
  (b) `vla_penalty_rows`  (A_c, U, E) -> write directions Ahat (and A_T, last chunk):
        X = U A_c, Lc^-1 for I + X U^T = Lc Lc^T (`_chol_inv`, C steps), Y = Lc^-1 X,
        W = E A_c - tril(E Y^T) Y, Ahat = unit(W); A_T = A_c - Y^T Y. 6 products at dk <= 64;
        at dk = 128 every [., dk] matrix is two column panels of 64 (read as ref slices).
  (c) `vla_state_prep`  (E, Ahat, Q, V) -> U', W', P (exactly `state_path._factors`):
        T = (I + strictly_lower(E Ahat^T))^-1 by block doubling on the whole [C, C] matrix
        (`_unit_tril_inv`: log2 C rounds of inv <- inv - inv N_s inv, N_s the off-diagonal
        blocks being merged), U' = T V, W' = T E, P = tril(Q Ahat^T). 2 log2 C + 4 products.

Nothing is sliced (Triton values cannot be), so no unrolled panels: the only loops are the
Cholesky eliminations (`fori_loop`), each step two masked reductions and two rank-1 updates.
Intermediate results go through HBM between kernels (A_c: N dk^2 floats; Ahat: N C dk).

Precision: the factorisations (kernels (a), (b), and the doubling products of (c)) use
`factor_precision` (tf32x3 or ieee on GPUs, HIGHEST in interpret mode / float64); the products
that only apply factors in (c) use the state path's `precision`, as the XLA `_factors` does.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.layout import rows_spec
from vla_jax.ops.vla.recurrence import KEY_EPS, WRITE_EPS

PANEL = 64   # column panel width of the penalty-rows kernel


def _dot(a, b, *, ta=False, tb=False, precision):
  """(a or a^T) @ (b or b^T), result in a's dtype. With precision `BF16_BF16_F32` the operands
  are rounded to bfloat16 here (so that interpret mode computes what the GPU computes) and the
  product accumulates in float32."""
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  out = a.dtype
  if precision == jax.lax.DotAlgorithmPreset.BF16_BF16_F32:
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=out)


def unit_rows(x, eps):
  """Rows of x [n, d] divided by max(their norm, eps): `vla_jax.ops.utils.unit` inside a kernel
  (for raw keys read in place)."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=1), eps ** 2))[:, None]


def _iota(n):
  return (jax.lax.broadcasted_iota(jnp.int32, (n, n), 0),
          jax.lax.broadcasted_iota(jnp.int32, (n, n), 1),
          jax.lax.broadcasted_iota(jnp.int32, (n,), 0))


def _eye(n, dtype):
  r, c, _ = _iota(n)
  return jnp.where(r == c, 1.0, 0.0).astype(dtype)


def _chol_inv(G):
  """L^-1 for G = L L^T (G [n, n] symmetric positive definite), by n elimination steps on the
  whole matrix: step j takes column j of the Schur complement, l = col / sqrt(pivot) (column j
  of L), removes l l^T, and applies the elementary inverse to Z (starting at I): row j of Z is
  divided by l_j, then rows i > j lose l_i times it. Carries two [n, n] values."""
  n = G.shape[0]
  r, c, v = _iota(n)

  def body(j, carry):
    G, Z = carry
    col = jnp.sum(jnp.where(c == j, G, 0.0), axis=1)              # G[:, j]
    inv_piv = jax.lax.rsqrt(jnp.sum(jnp.where(v == j, col, 0.0)))  # 1 / sqrt(G[j, j])
    l = jnp.where(v > j, col * inv_piv, 0.0)                       # L[i, j], i > j
    z = jnp.sum(jnp.where(r == j, Z, 0.0), axis=0) * inv_piv       # new row j of Z
    G = G - l[:, None] * l[None, :]
    Z = jnp.where(r == j, z[None, :], Z - l[:, None] * z[None, :])
    return G, Z

  return jax.lax.fori_loop(0, n, body, (G, _eye(n, G.dtype)))[1]


def _unit_tril_inv(N, precision):
  """(I + N)^-1 for strictly lower N [n, n] (n a power of two), by block doubling on the whole
  matrix: with inv block diagonal in s x s blocks (inverse of I + N restricted to them), the
  2s x 2s blocks' inverse is inv - inv N_s inv, N_s = N on the (lower, upper) halves of each
  2s-block. The merge of `vla_jax.ops.utils.tril_inverse`, with masks instead of slices."""
  n = N.shape[0]
  r, c, _ = _iota(n)
  dot = functools.partial(_dot, precision=precision)
  inv = (jnp.where(r == c, 1.0, 0.0).astype(N.dtype)                  # 2 x 2 blocks
         + jnp.where((r == c + 1) & (r % 2 == 1), -N, 0.0))
  s = 2
  while s < n:
    m = 2 * s
    mask = (r // m == c // m) & (r % m >= s) & (c % m < s)
    inv = inv - dot(dot(inv, jnp.where(mask, N, 0.0)), inv)
    s = m
  return inv


# ----------------------------------------------------------------------------- kernels

def _inverse_kernel(m_ref, a_ref, *, refine, fprec, acc):
  # m_ref, a_ref: [dk, dk] (one chunk's M_c and A_c).
  dot = functools.partial(_dot, precision=fprec)
  Li = _chol_inv(m_ref[...].astype(acc))
  A = dot(Li, Li, ta=True)
  if refine:
    A = A + dot(A, _eye(A.shape[0], acc) - dot(m_ref[...].astype(acc), A))
  a_ref[...] = (0.5 * (A + A.T)).astype(a_ref.dtype)


def _tiled_inverse_kernel(m_ref, a_ref, *, t, refine, fprec, acc):
  # m_ref, a_ref: [dk, dk], handled as n x n tiles of t x t (ref slices; the values are tiles
  # only). Block Cholesky M = L L^T: per tile column k, Linv_kk = L_kk^-1 by t elimination
  # steps on the tile (`_chol_inv`), L_ik = G_ik Linv_kk^T below it, the Schur complement
  # G_ij -= L_ik L_jk^T; then X = L^-1 by block forward substitution and A = X^T X, with the
  # Newton step A <- A + A (I - M A) when `refine`. The same function as `_inverse_kernel`,
  # with n elimination loops of t steps on [t, t] values instead of dk steps on [dk, dk].
  dot = functools.partial(_dot, precision=fprec)
  n = m_ref.shape[0] // t
  blk = [pl.ds(i * t, t) for i in range(n)]
  load = lambda i, j: m_ref[blk[i], blk[j]].astype(acc)
  G = {(i, j): load(i, j) for i in range(n) for j in range(i + 1)}
  Ld, L = {}, {}
  for k in range(n):
    Ld[k] = _chol_inv(G[k, k])                                         # L_kk^-1
    for i in range(k + 1, n):
      L[i, k] = dot(G[i, k], Ld[k], tb=True)                           # G_ik L_kk^-T
    for i in range(k + 1, n):
      for j in range(k + 1, i + 1):
        G[i, j] = G[i, j] - dot(L[i, k], L[j, k], tb=True)
  X = {}
  for k in range(n):                                                   # X = L^-1, lower
    X[k, k] = Ld[k]
    for i in range(k + 1, n):
      X[i, k] = -dot(Ld[i], sum(dot(L[i, m], X[m, k]) for m in range(k, i)))
  A = {(i, j): sum(dot(X[m, i], X[m, j], ta=True) for m in range(max(i, j), n))
       for i in range(n) for j in range(i, n)}                         # X^T X, upper tiles
  At = lambda i, j: A[i, j] if i <= j else A[j, i].T
  Mt = lambda i, m: load(i, m) if m <= i else load(m, i).T
  for j in range(n):
    if refine:   # column j of A + A (I - M A), tile by tile: the Newton step
      MA = [sum(dot(Mt(m, l), At(l, j)) for l in range(n)) for m in range(n)]
      col = [2.0 * At(i, j) - sum(dot(At(i, m), MA[m]) for m in range(n)) for i in range(j + 1)]
    else:
      col = [At(i, j) for i in range(j + 1)]
    for i in range(j + 1):      # the upper tiles, mirrored (diagonal tiles symmetrised)
      T = 0.5 * (col[i] + col[i].T) if i == j else col[i]
      a_ref[blk[i], blk[j]] = T.astype(a_ref.dtype)
      if i < j:
        a_ref[blk[j], blk[i]] = T.T.astype(a_ref.dtype)


def _rows_kernel(ac_ref, e_ref, u_ref, ah_ref, at_ref, *, C, N, dk, fprec, acc):
  # ac_ref: [dk, dk] A_c; e_ref, u_ref, ah_ref: [C, dk]; at_ref: [dk, dk] (last chunk only).
  # Columns are handled in panels of P = min(dk, 64) (refs sliced, values never), so no
  # value is larger than [C, 64] or [64, 64] at dk = 128 either.
  dot = functools.partial(_dot, precision=fprec)
  P = min(dk, PANEL)
  cols = [pl.ds(P * i, P) for i in range(dk // P)]
  r, c, _ = _iota(C)
  Ablk = lambda i, j: ac_ref[cols[i], cols[j]].astype(acc)           # [P, P] tile of A_c
  U = [u_ref[:, p].astype(acc) for p in cols]                          # [C, P] panels
  X = [sum(dot(U[i], Ablk(i, j)) for i in range(len(cols))) for j in range(len(cols))]
  Li = _chol_inv(_eye(C, acc) + sum(dot(x, u, tb=True) for x, u in zip(X, U)))
  Y = [dot(Li, x) for x in X]                                          # Lc^-1 X
  E = [e_ref[:, p].astype(acc) for p in cols]
  KY = jnp.where(r >= c, sum(dot(e, y, tb=True) for e, y in zip(E, Y)), 0.0)  # tril(E Y^T)
  W = [sum(dot(E[i], Ablk(i, j)) for i in range(len(cols))) - dot(KY, Y[j])
       for j in range(len(cols))]
  inv_norm = jax.lax.rsqrt(jnp.maximum(sum(jnp.sum(w * w, axis=1) for w in W),
                                       WRITE_EPS ** 2))[:, None]
  for p, w in zip(cols, W):
    ah_ref[:, p] = (w * inv_norm).astype(ah_ref.dtype)

  @pl.when(pl.program_id(1) == N - 1)
  def _():                                                             # A_c - Y^T Y
    for i in range(len(cols)):
      for j in range(i, len(cols)):
        T = Ablk(i, j) - dot(Y[i], Y[j], ta=True)
        if i == j:
          at_ref[cols[i], cols[i]] = (0.5 * (T + T.T)).astype(at_ref.dtype)
        else:
          at_ref[cols[i], cols[j]] = T.astype(at_ref.dtype)
          at_ref[cols[j], cols[i]] = T.T.astype(at_ref.dtype)


def _state_prep_kernel(e_ref, ah_ref, q_ref, v_ref, up_ref, wp_ref, p_ref, *t_ref, C, fprec,
                       sprec, acc, unit_keys=False):
  # e_ref, ah_ref, q_ref, wp_ref: [C, dk]; v_ref, up_ref: [C, dv]; p_ref, t_ref: [C, C].
  sdot = functools.partial(_dot, precision=sprec)
  r, c, _ = _iota(C)
  E = e_ref[...].astype(acc)
  if unit_keys:   # raw keys read in place
    E = unit_rows(E, KEY_EPS)
  Ah = ah_ref[...].astype(acc)
  T = _unit_tril_inv(jnp.where(r > c, sdot(E, Ah, tb=True), 0.0), fprec)
  up_ref[...] = sdot(T, v_ref[...].astype(acc)).astype(up_ref.dtype)
  wp_ref[...] = sdot(T, E).astype(wp_ref.dtype)
  p_ref[...] = jnp.where(r >= c, sdot(q_ref[...].astype(acc), Ah, tb=True),
                         0.0).astype(p_ref.dtype)
  if t_ref:   # with_inverse: T itself, for the state path's written-out backward
    t_ref[0][...] = T.astype(t_ref[0].dtype)


# ----------------------------------------------------------------------------- entry points

def _params(num_warps):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=1)


def spd_inverse(M, *, refine, factor_precision, num_warps=4, interpret=False, tile=None):
  """A_c = M_c^-1 for M [BH, N, dk, dk] symmetric positive definite (kernel (a)).
  tile: None (dk elimination steps on the whole matrix) or t (16 or 32, dividing dk): a block
  Cholesky on t x t tiles (`_tiled_inverse_kernel`; the same function)."""
  BH, N, dk, _ = M.shape
  spec = pl.BlockSpec((None, None, dk, dk), lambda b, n: (b, n, 0, 0))
  if tile is None:
    kernel = functools.partial(_inverse_kernel, refine=refine, fprec=factor_precision,
                               acc=M.dtype)
  elif tile in (16, 32) and dk % tile == 0:
    kernel = functools.partial(_tiled_inverse_kernel, t=tile, refine=refine,
                               fprec=factor_precision, acc=M.dtype)
  else:
    raise ValueError(f"tile must be None, 16 or 32 and divide dk={dk}; got {tile!r}")
  return pl.pallas_call(
      kernel,
      grid=(BH, N), in_specs=[spec], out_specs=spec,
      out_shape=jax.ShapeDtypeStruct(M.shape, M.dtype),
      compiler_params=_params(num_warps), interpret=interpret, name="vla_spd_inverse",
  )(M)


def penalty_rows(A_c, e, u, *, chunk_size, factor_precision, num_warps=4, interpret=False):
  """Write directions Ahat [BH, N*C, dk] and A_T [BH, dk, dk] (kernel (b)).

  A_c: [BH, N, dk, dk] chunk-start inverses; e: [BH, N*C, dk] unit keys; u: [BH, N*C, dk]
  penalty directions (zero rows for padding). Outputs in A_c's dtype."""
  BH, N, dk, _ = A_c.shape
  C, acc = chunk_size, A_c.dtype
  rows = pl.BlockSpec((None, C, dk), lambda b, n: (b, n, 0))
  return pl.pallas_call(
      functools.partial(_rows_kernel, C=C, N=N, dk=dk, fprec=factor_precision, acc=acc),
      grid=(BH, N),
      in_specs=[pl.BlockSpec((None, None, dk, dk), lambda b, n: (b, n, 0, 0)), rows, rows],
      out_specs=[rows, pl.BlockSpec((None, dk, dk), lambda b, n: (b, 0, 0))],
      out_shape=[jax.ShapeDtypeStruct((BH, N * C, dk), acc),
                 jax.ShapeDtypeStruct((BH, dk, dk), acc)],
      compiler_params=_params(num_warps), interpret=interpret, name="vla_penalty_rows",
  )(A_c, e, u)


def state_prep(e, a, q, v, *, chunk_size, precision, factor_precision, num_warps=4,
               interpret=False, with_inverse=False, out_dtype=None, heads=None, acc=None,
               inverse_dtype=None, qv_heads=None):
  """U' [BH, N*C, dv], W' [BH, N*C, dk], P [BH, N*C, C] of the state path (kernel (c)), in
  `out_dtype` (default the computation's dtype `acc`, default e's dtype). e, a, q: [BH, N*C, dk]
  erase keys, write keys, queries; v: [BH, N*C, dv].
  with_inverse: also T = (I + strictly_lower(E A^T))^-1 of every chunk, [BH, N*C, C] (in
  `inverse_dtype`, default `out_dtype`).
  heads: None, or H when e, q, v are the caller's token-major [B, >= N*C, H, d] (read in place;
  e then holds raw keys, made unit in the kernel); a and the outputs stay head-major.
  qv_heads: None, or H when only q and v are token-major (read in place) and e holds unit
  keys head-major (the differentiated path's `state_path(heads=H)`)."""
  BH, NC, dk = a.shape
  C, dv, acc = chunk_size, v.shape[-1], acc or e.dtype
  out = out_dtype or acc
  rows = lambda d, h=None: rows_spec(C, d, h)
  n_out = 4 if with_inverse else 3
  return pl.pallas_call(
      functools.partial(_state_prep_kernel, C=C, fprec=factor_precision, sprec=precision,
                        acc=acc, unit_keys=heads is not None),
      grid=(BH, NC // C),
      in_specs=[rows(dk, heads), rows(dk), rows(dk, heads or qv_heads),
                rows(dv, heads or qv_heads)],
      out_specs=[rows(dv), rows(dk), rows(C), rows(C)][:n_out],
      out_shape=[jax.ShapeDtypeStruct((BH, NC, dv), out),
                 jax.ShapeDtypeStruct((BH, NC, dk), out),
                 jax.ShapeDtypeStruct((BH, NC, C), out),
                 jax.ShapeDtypeStruct((BH, NC, C), inverse_dtype or out)][:n_out],
      compiler_params=_params(num_warps), interpret=interpret, name="vla_state_prep",
  )(e, a, q, v)
