"""Chunk prep of VLA as one Pallas (Triton) kernel, parallel over all chunks (forward only).

One program per (batch * head, chunk n). With C tokens per chunk, rows U (penalty directions),
E (unit keys khat), Q, V of the chunk, and M_c = A_0^-1 + sum_{m<n} U_m^T U_m (computed in XLA:
per-chunk Grams and an exclusive prefix sum), the program computes

  1. chunk-start inverse  A_c = M_c^-1:
       M_c = L L^T (blocked Cholesky, 16 x 16 tiles), L^-1 by block forward substitution,
       A_c = L^-T L^-1, then one Newton step A_c <- A_c + A_c (I - M_c A_c) (`refine`),
       symmetrised;
  2. penalty rows:
       X = U A_c,  I + X U^T = Lc Lc^T (blocked Cholesky),  Y = Lc^-1 X,
       W = E A_c - tril(E Y^T) Y,  a_t = unit(W_t) (write directions, eps WRITE_EPS),
       A_end = A_c - Y^T Y (stored by the last chunk only: A_T);
  3. state-path factors (exactly `state_path._factors` with erase keys E, write keys Ahat):
       Lk = strictly_lower(E Ahat^T),  T = (I + Lk)^-1 (unit lower, block forward
       substitution),  U' = T V,  W' = T E,  P = tril(Q Ahat^T).
Outputs Ahat, U', W', P are written in the [BH, N * C, d] layouts that `state_path._fwd_kernel`
reads, so the sequential pass over chunk states runs unchanged.

Triton constraints shape the code: register values cannot be sliced or concatenated, so inputs
are read in pieces with `ref[pl.ds(r0, 16), pl.ds(c0, d)]` and every matrix computed in the
program is a Python list of pieces, each made by its own product. Two layouts, same math:
"panels" (default, `_prep_kernel_panels`): A_c is one [dk, dk] value, built as
sum_k (L^-1)_k^T (L^-1)_k from the 16-row panels of L^-1, and C-row matrices (X, Y, W, Ahat,
U', W') are lists of 16-row panels [16, d], so products are tile @ panel, panel @ panel^T or
panel @ [dk, dk]; "tiles" (`_prep_kernel`): every matrix a grid of 16 x 16 tiles (`None` for a
zero tile), many more but smaller products. All loops over pieces are Python loops (unrolled at
trace time). Base cases (Cholesky of a 16 x 16 tile, inverse of a 16 x 16 lower-triangular
tile) are 16-step `fori_loop`s that extract a column or row by a masked sum, as
flash-linear-attention's `solve_tril` does. Nothing is written and re-read in one program.

Precision. Products inside the factorisations (steps 1 and 2) use `factor_precision`: on the GPU
`lax.DotAlgorithmPreset.TF32_TF32_F32_X3` (Triton `input_precision="tf32x3"`: three TF32 tensor
core products, about float32 accuracy) or `lax.Precision.HIGHEST` (Triton `"ieee"`: full float32
on CUDA cores, slower); in interpret mode and for float64 always HIGHEST. Step 3 uses the state
path's `precision` (DEFAULT = TF32 on GPUs), like the XLA `_factors`.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.state_path import PREP_DOTS, PREP_FORMS
from vla_jax.ops.vla.recurrence import WRITE_EPS

TILE = 16


# ----------------------------------------------------------------------------- tile algebra

def _dot(a, b, *, ta=False, tb=False, precision):
  """(a or a^T) @ (b or b^T) for 2-D tiles, result in a's dtype."""
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=a.dtype)


def _add(x, y):
  """x + y for tiles where None means zero."""
  if x is None:
    return y
  return x if y is None else x + y


def _sub(x, y):
  if y is None:
    return x
  return -y if x is None else x - y


def _mul(A, B, *, ta=False, tb=False, want=None, precision):
  """Tile grid of op(A) @ op(B) (op = transpose when ta / tb). `want(i, j)` selects the output
  tiles computed (others None); None tiles of A and B are skipped."""
  m = len(A[0]) if ta else len(A)
  kk = len(A) if ta else len(A[0])
  n = len(B) if tb else len(B[0])
  get_a = (lambda i, k: A[k][i]) if ta else (lambda i, k: A[i][k])
  get_b = (lambda k, j: B[j][k]) if tb else (lambda k, j: B[k][j])
  out = [[None] * n for _ in range(m)]
  for i in range(m):
    for j in range(n):
      if want is not None and not want(i, j):
        continue
      for k in range(kk):
        a, b = get_a(i, k), get_b(k, j)
        if a is not None and b is not None:
          out[i][j] = _add(out[i][j], _dot(a, b, ta=ta, tb=tb, precision=precision))
  return out


def _load(ref, rows, cols, dtype):
  """Tile grid [rows/16][cols/16] of a 2-D ref, cast to dtype."""
  return [[ref[pl.ds(TILE * i, TILE), pl.ds(TILE * j, TILE)].astype(dtype)
           for j in range(cols // TILE)] for i in range(rows // TILE)]


def _store(ref, grid, dtype):
  """Writes a tile grid into a 2-D ref (None tiles as zeros)."""
  for i, row in enumerate(grid):
    for j, x in enumerate(row):
      x = jnp.zeros((TILE, TILE), dtype) if x is None else x.astype(ref.dtype)
      ref[pl.ds(TILE * i, TILE), pl.ds(TILE * j, TILE)] = x


def _iotas():
  r = jax.lax.broadcasted_iota(jnp.int32, (TILE, TILE), 0)
  c = jax.lax.broadcasted_iota(jnp.int32, (TILE, TILE), 1)
  return r, c, jax.lax.broadcasted_iota(jnp.int32, (TILE,), 0)


def _eye(dtype):
  r, c, _ = _iotas()
  return jnp.where(r == c, 1.0, 0.0).astype(dtype)


def _chol_tile(X):
  """Lower Cholesky factor L of one symmetric positive definite 16 x 16 tile (lower part read)
  and its inverse, in one 16-step loop: step j makes column j of L, then row j of L^-1 from
  row j of L, (L^-1)_j = (e_j - sum_{k<j} L_jk (L^-1)_k) / L_jj."""
  r, c, v = _iotas()

  def body(j, carry):
    X, L, inv = carry
    col = jnp.sum(jnp.where(c == j, X, 0.0), axis=1)            # X[:, j]
    piv = jnp.sum(jnp.where(v == j, col, 0.0))                  # X[j, j]
    l = jnp.where(v >= j, col * jax.lax.rsqrt(piv), 0.0)        # column j of L
    L = jnp.where(c == j, l[:, None], L)
    row = jnp.sum(jnp.where(r == j, L, 0.0), axis=0)            # L[j, :]
    off = jnp.where(v < j, row, 0.0)
    new = jnp.where(v == j, 1.0, 0.0) - jnp.sum(off[:, None] * inv, axis=0)
    new = new * jax.lax.rsqrt(piv)
    return X - l[:, None] * l[None, :], L, jnp.where(r == j, new[None, :], inv)

  _, L, inv = jax.lax.fori_loop(0, TILE, body, (X, jnp.zeros_like(X), jnp.zeros_like(X)))
  return L, inv


def _tril_inv_tile(L, *, unit):
  """Inverse of a lower-triangular 16 x 16 tile by forward substitution over rows
  (unit diagonal assumed when `unit`; then only the strictly lower part is read)."""
  r, c, v = _iotas()

  def body(i, inv):
    row = jnp.sum(jnp.where(r == i, L, 0.0), axis=0)            # L[i, :]
    off = jnp.where(v < i, row, 0.0)
    new = jnp.where(v == i, 1.0, 0.0) - jnp.sum(off[:, None] * inv, axis=0)
    if not unit:
      new = new / jnp.sum(jnp.where(v == i, row, 0.0))
    return jnp.where(r == i, new[None, :], inv)

  return jax.lax.fori_loop(0, TILE, body, jnp.zeros_like(L))


def _cholesky(get, nb, precision):
  """Blocked Cholesky of a symmetric positive definite matrix of nb x nb tiles, tile (i, j) for
  i >= j given by get(i, j). Returns (L grid, inverses of L's diagonal tiles)."""
  L = [[None] * nb for _ in range(nb)]
  dinv = []
  for j in range(nb):
    for i in range(j, nb):
      S = get(i, j)
      for k in range(j):
        S = S - _dot(L[i][k], L[j][k], tb=True, precision=precision)
      if i == j:
        L[j][j], d = _chol_tile(S)
        dinv.append(d)
      else:
        L[i][j] = _dot(S, dinv[j], tb=True, precision=precision)     # S L_jj^-T
  return L, dinv


def _tril_inverse(L, dinv, precision):
  """Inverse of a block lower-triangular tile grid with known diagonal-tile inverses:
  X_ij = -D_i^-1 sum_{j<=k<i} L_ik X_kj."""
  nb = len(L)
  X = [[None] * nb for _ in range(nb)]
  for i in range(nb):
    X[i][i] = dinv[i]
    for j in range(i):
      S = None
      for k in range(j, i):
        if L[i][k] is not None and X[k][j] is not None:
          S = _add(S, _dot(L[i][k], X[k][j], precision=precision))
      X[i][j] = None if S is None else -_dot(dinv[i], S, precision=precision)
  return X


def _forward_subst(L, dinv, B, precision):
  """Y = L^-1 B for a block lower-triangular L (diagonal-tile inverses dinv), B a tile grid."""
  Y = []
  for i in range(len(L)):
    row = []
    for c in range(len(B[0])):
      S = B[i][c]
      for j in range(i):
        S = _sub(S, _dot(L[i][j], Y[j][c], precision=precision))
      row.append(_dot(dinv[i], S, precision=precision))
    Y.append(row)
  return Y


def _sym(A):
  nb = len(A)
  return [[0.5 * (A[i][j] + A[j][i].T) for j in range(nb)] for i in range(nb)]


# ----------------------------------------------------------------------------- kernel

def _prep_kernel(m_ref, e_ref, u_ref, q_ref, v_ref,              # inputs
                 a_ref, up_ref, wp_ref, p_ref, at_ref,            # outputs
                 *, C, N, dk, dv, refine, fprec, sprec, acc):
  # Refs (one program = one (batch*head, chunk)):
  #   m_ref: [dk, dk] M_c   e_ref, u_ref, q_ref: [C, dk]   v_ref: [C, dv]
  #   a_ref, wp_ref: [C, dk]   up_ref: [C, dv]   p_ref: [C, C]   at_ref: [dk, dk] (last chunk)
  nb, nc, nv = dk // TILE, C // TILE, dv // TILE
  r, c, v = _iotas()
  eye = _eye(acc)
  f = functools.partial(_mul, precision=fprec)
  s = functools.partial(_mul, precision=sprec)

  # 1. A_c = M_c^-1 (blocked Cholesky inverse, one Newton step).
  M = _load(m_ref, dk, dk, acc)
  Lm, dm = _cholesky(lambda i, j: M[i][j], nb, fprec)
  Li = _tril_inverse(Lm, dm, fprec)
  A = f(Li, Li, ta=True, want=lambda i, j: i <= j)                 # L^-T L^-1, upper tiles
  A = [[A[i][j] if i <= j else A[j][i].T for j in range(nb)] for i in range(nb)]
  if refine:
    R = f(M, A)
    R = [[(eye if i == j else 0.0) - R[i][j] for j in range(nb)] for i in range(nb)]
    A = _sym([[A[i][j] + x for j, x in enumerate(row)] for i, row in enumerate(f(A, R))])

  # 2. Penalty rows W = E A_c - tril(E Y^T) Y and write directions Ahat = unit(W).
  U = _load(u_ref, C, dk, acc)
  E = _load(e_ref, C, dk, acc)
  X = f(U, A)                                                      # [C, dk]
  G = f(X, U, tb=True, want=lambda i, j: i >= j)                   # X U^T, lower tiles
  Lc, dc = _cholesky(lambda i, j: G[i][j] + eye if i == j else G[i][j], nc, fprec)
  Y = _forward_subst(Lc, dc, X, fprec)                             # [C, dk]
  KY = f(E, Y, tb=True, want=lambda i, j: i >= j)                  # E Y^T, lower tiles
  KY = [[jnp.where(r >= c, x, 0.0) if i == j else x for j, x in enumerate(row)]
        for i, row in enumerate(KY)]
  EA = f(E, A)
  W = [[_sub(EA[i][k], x) for k, x in enumerate(row)] for i, row in enumerate(f(KY, Y))]
  inv_norm = []
  for i in range(nc):
    sq = sum(jnp.sum(x * x, axis=1) for x in W[i])
    inv_norm.append(jax.lax.rsqrt(jnp.maximum(sq, WRITE_EPS ** 2)))
  Ah = [[x * inv_norm[i][:, None] for x in W[i]] for i in range(nc)]
  _store(a_ref, Ah, acc)

  @pl.when(pl.program_id(1) == N - 1)
  def _():
    YY = f(Y, Y, ta=True)
    _store(at_ref, _sym([[A[i][j] - YY[i][j] for j in range(nb)] for i in range(nb)]), acc)

  # 3. State-path factors: T = (I + strictly_lower(E Ahat^T))^-1, U' = T V, W' = T E,
  #    P = tril(Q Ahat^T).
  Lk = s(E, Ah, tb=True, want=lambda i, j: i >= j)
  Lk = [[jnp.where(r > c, x, 0.0) if i == j else x for j, x in enumerate(row)]
        for i, row in enumerate(Lk)]
  dT = [_tril_inv_tile(Lk[i][i], unit=True) for i in range(nc)]
  Tg = _tril_inverse(Lk, dT, sprec)
  V = _load(v_ref, C, dv, acc)
  _store(up_ref, s(Tg, V), acc)
  _store(wp_ref, s(Tg, E), acc)
  Q = _load(q_ref, C, dk, acc)
  P = s(Q, Ah, tb=True, want=lambda i, j: i >= j)
  P = [[jnp.where(r >= c, x, 0.0) if i == j else x for j, x in enumerate(row)]
       for i, row in enumerate(P)]
  _store(p_ref, P, acc)


def _prep_kernel_panels(m_ref, e_ref, u_ref, q_ref, v_ref,       # inputs
                        a_ref, up_ref, wp_ref, p_ref, at_ref,     # outputs
                        *, C, N, dk, dv, refine, fprec, sprec, acc):
  # Same refs and math as `_prep_kernel`, with A_c a full [dk, dk] value and every C-row
  # matrix a list of 16-row panels [16, d]: products are tile @ panel, panel @ panel^T or
  # panel @ full, so far fewer (and larger) dots than the all-tile form.
  nb, nc = dk // TILE, C // TILE
  r, c, _ = _iotas()
  eye = _eye(acc)
  fd = functools.partial(_dot, precision=fprec)
  sd = functools.partial(_dot, precision=sprec)
  rows = lambda ref, i: ref[pl.ds(TILE * i, TILE), :].astype(acc)         # [16, d] panel
  tile = lambda ref, i, j: ref[pl.ds(TILE * i, TILE), pl.ds(TILE * j, TILE)].astype(acc)
  lower = lambda x, strict: jnp.where(r > c if strict else r >= c, x, 0.0)

  # 1. A_c = M_c^-1: tiled Cholesky, row panels of L^-1, A = sum_k Li_k^T Li_k, Newton step.
  Lm, dm = _cholesky(lambda i, j: tile(m_ref, i, j), nb, fprec)
  pr = jax.lax.broadcasted_iota(jnp.int32, (TILE, dk), 0)
  pc = jax.lax.broadcasted_iota(jnp.int32, (TILE, dk), 1)
  Li = []
  for i in range(nb):
    S = jnp.where(pr + TILE * i == pc, 1.0, 0.0).astype(acc)              # rows of I
    for j in range(i):
      S = S - fd(Lm[i][j], Li[j])
    Li.append(fd(dm[i], S))
  A = sum(fd(x, x, ta=True) for x in Li)                                  # [dk, dk]
  if refine:
    M = m_ref[...].astype(acc)
    full_eye = jnp.where(jax.lax.broadcasted_iota(jnp.int32, (dk, dk), 0)
                         == jax.lax.broadcasted_iota(jnp.int32, (dk, dk), 1), 1.0, 0.0)
    A = A + fd(A, full_eye.astype(acc) - fd(M, A))
    A = 0.5 * (A + A.T)

  # 2. X = U A_c; I + X U^T = Lc Lc^T; Y = Lc^-1 X; W = E A_c - tril(E Y^T) Y; Ahat = unit(W).
  X = [fd(rows(u_ref, i), A) for i in range(nc)]
  Lc, dc = _cholesky(
      lambda i, j: fd(X[i], rows(u_ref, j), tb=True) + (eye if i == j else 0.0), nc, fprec)
  Y = []
  for i in range(nc):
    S = X[i]
    for j in range(i):
      S = S - fd(Lc[i][j], Y[j])
    Y.append(fd(dc[i], S))
  Ah = []
  for i in range(nc):
    E_i = rows(e_ref, i)
    W = fd(E_i, A)
    for j in range(i + 1):
      KY = fd(E_i, Y[j], tb=True)
      W = W - fd(lower(KY, False) if j == i else KY, Y[j])
    sq = jnp.sum(W * W, axis=1)
    Ah.append(W * jax.lax.rsqrt(jnp.maximum(sq, WRITE_EPS ** 2))[:, None])
    a_ref[pl.ds(TILE * i, TILE), :] = Ah[i].astype(a_ref.dtype)

  @pl.when(pl.program_id(1) == N - 1)
  def _():
    A_end = A - sum(fd(y, y, ta=True) for y in Y)
    at_ref[...] = (0.5 * (A_end + A_end.T)).astype(at_ref.dtype)

  # 3. (I + strictly_lower(E Ahat^T)) [U' | W'] = [V | E] by block forward substitution,
  #    P = tril(Q Ahat^T).
  Up, Wp = [], []
  for i in range(nc):
    E_i = rows(e_ref, i)
    Lk = [sd(E_i, Ah[j], tb=True) for j in range(i + 1)]
    dT = _tril_inv_tile(Lk[i], unit=True)
    SU, SW = rows(v_ref, i), E_i
    for j in range(i):
      SU = SU - sd(Lk[j], Up[j])
      SW = SW - sd(Lk[j], Wp[j])
    Up.append(sd(dT, SU))
    Wp.append(sd(dT, SW))
    up_ref[pl.ds(TILE * i, TILE), :] = Up[i].astype(up_ref.dtype)
    wp_ref[pl.ds(TILE * i, TILE), :] = Wp[i].astype(wp_ref.dtype)
    Q_i = rows(q_ref, i)
    for j in range(nc):
      x = jnp.zeros((TILE, TILE), acc) if j > i else sd(Q_i, Ah[j], tb=True)
      p_ref[pl.ds(TILE * i, TILE), pl.ds(TILE * j, TILE)] = (
          lower(x, False) if j == i else x).astype(p_ref.dtype)


def _factor_precision(prep_dot, acc, interpret):
  """The `precision` of the factor products for `prep_dot`: HIGHEST for float64 and "ieee"
  and, except for "bf16", in interpret mode; "bf16" is `BF16_BF16_F32` everywhere else
  (`split_prep._dot` rounds the operands itself, so interpret mode emulates it)."""
  if acc == jnp.float64 or prep_dot == "ieee":
    return jax.lax.Precision.HIGHEST
  if prep_dot == "bf16":
    return jax.lax.DotAlgorithmPreset.BF16_BF16_F32
  if interpret:
    return jax.lax.Precision.HIGHEST
  if prep_dot == "tf32x3":
    return jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
  if prep_dot == "tf32":
    return jax.lax.DotAlgorithmPreset.TF32_TF32_F32
  raise ValueError(f"prep_dot must be one of {PREP_DOTS}; got {prep_dot!r}")


def chunk_prep(M, e, u, q, v, *, chunk_size, precision, refine=True, prep_dot="tf32x3",
               form="panels", num_warps=4, num_stages=1, interpret=False):
  """Per-chunk factors of VLA's forward, one Pallas program per (batch * head, chunk).

  Args:
    M: [BH, N, dk, dk] chunk-start penalty matrices M_c (symmetric positive definite), in the
      accumulation dtype (float32, or float64).
    e: [BH, N*C, dk] unit keys khat (accumulation dtype); zero rows for padding.
    u: [BH, N*C, dk] penalty directions (any float dtype); zero rows for padding.
    q: [BH, N*C, dk] queries; v: [BH, N*C, dv] values (any float dtype).
    chunk_size: C, a power of two in [16, 128]; dk, dv in {16, 32, 64, 128}.
    precision: precision of the state-path factor products (step 3).
    refine: one Newton step on each chunk-start inverse.
    prep_dot: "tf32x3" or "ieee": how the factorisation products run on the GPU (module doc).
    form: "panels" (A_c a full [dk, dk] value, C-row matrices as 16-row panels) or "tiles"
      (every matrix a grid of 16 x 16 tiles). Same math.
    interpret: Pallas interpret mode.

  Returns:
    (Ahat [BH, N*C, dk], U' [BH, N*C, dv], W' [BH, N*C, dk], P [BH, N*C, C], A_T [BH, dk, dk]),
    all in M's dtype.
  """
  BH, N, dk, _ = M.shape
  C, dv, acc = chunk_size, v.shape[-1], M.dtype
  NC = N * C
  if form not in PREP_FORMS:
    raise ValueError(f"form must be one of {PREP_FORMS}; got {form!r}")
  kernel = functools.partial(
      _prep_kernel_panels if form == "panels" else _prep_kernel, C=C, N=N, dk=dk, dv=dv,
      refine=refine,
      fprec=_factor_precision(prep_dot, acc, interpret), sprec=precision, acc=acc)
  rows = lambda d: pl.BlockSpec((None, C, d), lambda b, n: (b, n, 0))
  return pl.pallas_call(
      kernel,
      grid=(BH, N),
      in_specs=[pl.BlockSpec((None, None, dk, dk), lambda b, n: (b, n, 0, 0)),
                rows(dk), rows(dk), rows(dk), rows(dv)],
      out_specs=[rows(dk), rows(dv), rows(dk), rows(C),
                 pl.BlockSpec((None, dk, dk), lambda b, n: (b, 0, 0))],
      out_shape=[jax.ShapeDtypeStruct((BH, NC, dk), acc),
                 jax.ShapeDtypeStruct((BH, NC, dv), acc),
                 jax.ShapeDtypeStruct((BH, NC, dk), acc),
                 jax.ShapeDtypeStruct((BH, NC, C), acc),
                 jax.ShapeDtypeStruct((BH, dk, dk), acc)],
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      interpret=interpret,
      name="vla_chunk_prep",
  )(M, e, u, q, v)
