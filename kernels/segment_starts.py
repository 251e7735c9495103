"""Segment-start inverses of the penalty scan: A_s = M_s^-1 at the start of segments 1..S-1.

The penalty scan (`penalty_scan.py`) cuts each sequence into S segments of L tokens and
carries A through each from its start. Its starts are

    M_s = A_0^-1 + sum_{t < s L} u_t u_t^T,     A_s = M_s^-1,

the prefix sums of per-segment Grams G_j = sum of u_t u_t^T over segment j, inverted
directly. A float32 direct inverse has relative error ~eps * cond(M_s): the float32 sums round
M_s by ~eps ||M_s|| in every direction, and the Cholesky adds as much (the carried A inside a
segment rounds relative to ||A|| and does not). cond(M_s) grows with T when u is anisotropic,
so two forms, by `Plan.exact_starts`:

  - exact (every float32 state: bfloat16 inputs, one-pass TF32, HIGH, HIGHEST): the
    Grams and their prefix sums in float64 (XLA; each product of two float32 numbers is exact
    in float64), M_0 = A_0^-1 and every M_s^-1 first as a float32 direct inverse X (the
    kernels below, on tiles at dk = 128 by default), then `REFINE_STEPS` Newton steps
    X <- X + X (I - M X) in float64 (the residual I - M X is ~eps * cond and cancels: only
    float64 forms it). Error ~eps, independent of T. Where the first residual exceeds
    NEWTON_RESIDUAL (cond(M) ~1e6 and beyond, where the steps stop short or diverge), M's
    float64 Cholesky inverse instead. For bfloat16 u the Grams are the float32
    ones of the direct form (each product of two bfloat16 numbers is exact in float32; only
    the sums round, by ~eps ||G_j|| per segment, not eps ||M_s||; the kernel's products are
    three TF32 passes, `Plan.gram_dot`: with bfloat16 tensor-core products o drifted with T
    on the GPU, kernels/DESIGN.md "Precision"), summed in float64: error
    ~eps * sqrt(T L) / lambda_min(M_s) instead of ~eps * T / lambda_min (3e-4 against 5e-4
    at T = 16384, d = 32, cond 4e4, growing slower with T). bfloat16 needs it although its
    products round by far more: a start's error reaches the state's columns along u's
    dominant directions, which no write erases (kernels/DESIGN.md, "Precision").
  - direct (float64 states): Grams, prefix sums and inverses in float64 and one Newton step
    (float64's eps * cond is ~1e-12).

Kernels, by key head dim (`Plan.inverse_kernel`):
  - dk <= 64: the Grams in `vla_segment_grams` (direct form and bfloat16 exact form; one
    program per (sequence, segment), C tokens a step, reading u in place), and each inverse
    in one program of
    `vla_spd_inverse`: a Cholesky by dk elimination steps on the whole [dk, dk] matrix, or a
    block Cholesky on 32 x 32 tiles (`Plan.inverse_tile`), then A = L^-T L^-1 and, with
    `Plan.newton_step` (float64 states), a step A <- A + A (I - M A). A_0^-1 takes a second launch.
  - dk = 128 (where that program spills and needs 256 KB of shared memory): for float32
    states (`KernelConfig.start_inverse` "tiles", the plan's choice) the same kernels:
    `vla_segment_grams` at `WIDE_GRAM_WARPS`, and `vla_spd_inverse` on 32 x 32 tiles that go
    through a global-memory workspace of the program
    instead of its registers (`_workspace_inverse_kernel`); for float64 states, or with
    start_inverse "xla", XLA: float32 Grams of each segment and batched Cholesky inverses
    (`vla_jax.ops.utils.spd_inverse`).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.common import chol_inv, compiler_params, dot, eye, rows_spec
from vla_jax.ops.utils import spd_inverse

WARPS = 4     # both kernels (not tuned), but WIDE_GRAM_WARPS
# Warps of the Gram kernel at dk = 128, whose [128, 128] float32 sum at 4 warps spills (255
# registers; at 8: 155 with bfloat16 products, 222 with three TF32 passes, no spills, 64 KB
# of shared memory; ptxas for sm_90a offline, `profile.kernel_resources`).
WIDE_GRAM_WARPS = 8
# Float64 Newton steps on each exact start (d = 64, T = 131,072, anisotropic u, CPU: one step
# leaves 3.0e-7 relative error at cond(M) = 5.3e4 and 2e-8 at 600; two leave 2.7e-8, the
# float32 rounding of A; kernels/VARIANTS.md, "Segment starts").
REFINE_STEPS = 2
# The largest Frobenius norm of the first residual I - M X (X the float32 start) from which the
# Newton steps run; beyond it M's float64 Cholesky inverse. CPU, d = 16, u in 4 directions with
# no noise, HIGHEST float32 starts: the residual is ~2e-7 cond(M); two steps leave 6e-8
# relative error from 0.25, 5e-7 from 0.39, 3e-5 from 0.75, 8.7e-3 from 2.8 (cond 1.3e7:
# |u| = 1, lam0 = 1e-4), and diverged to NaN from 6e2 (cond 8e8: |u| = 8, lam0 = 1e-4).
NEWTON_RESIDUAL = 0.25
# Tiles a side that `vla_spd_inverse` holds as values (dk = 64 at 32 x 32 tiles); beyond, its
# tiles go through a global-memory workspace (dk = 128: the 16 tiles as values spill).
VALUE_TILES = 2
HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------- kernels

def _gram_kernel(u_ref, g_ref, *, L, C, precision, acc):
  # One program = one (batch * head, segment): u_ref [L, dk] (the segment's tokens, read in
  # place when token-major), g_ref [dk, dk] = the sum of u u^T over them, C tokens a step.
  def body(n, G):
    U = u_ref[pl.ds(pl.multiple_of(n * C, C), C), :].astype(acc)        # [C, dk]
    return G + dot(U, U, ta=True, precision=precision)

  dk = g_ref.shape[-1]
  g_ref[...] = jax.lax.fori_loop(0, L // C, body, jnp.zeros((dk, dk), acc)).astype(g_ref.dtype)


def _inverse_kernel(m_ref, a_ref, *, newton_step, precision, acc):
  # m_ref, a_ref: [dk, dk], one matrix M and its inverse A.
  Li = chol_inv(m_ref[...].astype(acc))
  A = dot(Li, Li, ta=True, precision=precision)
  if newton_step:
    A = A + dot(A, eye(A.shape[0], acc) - dot(m_ref[...].astype(acc), A, precision=precision),
                precision=precision)
  a_ref[...] = (0.5 * (A + A.T)).astype(a_ref.dtype)


def _tiled_inverse_kernel(m_ref, a_ref, *, t, precision, acc):
  # m_ref, a_ref: [dk, dk], handled as n x n tiles of t x t (ref slices; the values are tiles
  # only). Block Cholesky M = L L^T: per tile column k, Linv_kk = L_kk^-1 by t elimination
  # steps on the tile (`chol_inv`), L_ik = G_ik Linv_kk^T below it, the Schur complement
  # G_ij -= L_ik L_jk^T; then X = L^-1 by block forward substitution and A = X^T X. The
  # function of `_inverse_kernel` without its Newton step, with n elimination loops of t
  # steps on [t, t] values instead of dk steps on [dk, dk].
  mm = functools.partial(dot, precision=precision)
  n = m_ref.shape[0] // t
  blk = [pl.ds(i * t, t) for i in range(n)]
  load = lambda i, j: m_ref[blk[i], blk[j]].astype(acc)
  G = {(i, j): load(i, j) for i in range(n) for j in range(i + 1)}
  Ld, L = {}, {}
  for k in range(n):
    Ld[k] = chol_inv(G[k, k])                                          # L_kk^-1
    for i in range(k + 1, n):
      L[i, k] = mm(G[i, k], Ld[k], tb=True)                            # G_ik L_kk^-T
    for i in range(k + 1, n):
      for j in range(k + 1, i + 1):
        G[i, j] = G[i, j] - mm(L[i, k], L[j, k], tb=True)
  X = {}
  for k in range(n):                                                   # X = L^-1, lower
    X[k, k] = Ld[k]
    for i in range(k + 1, n):
      X[i, k] = -mm(Ld[i], sum(mm(L[i, m], X[m, k]) for m in range(k, i)))
  A = {(i, j): sum(mm(X[m, i], X[m, j], ta=True) for m in range(max(i, j), n))
       for i in range(n) for j in range(i, n)}                         # X^T X, upper tiles
  for j in range(n):
    for i in range(j + 1):      # the upper tiles, mirrored (diagonal tiles symmetrised)
      T = 0.5 * (A[i, j] + A[i, j].T) if i == j else A[i, j]
      a_ref[blk[i], blk[j]] = T.astype(a_ref.dtype)
      if i < j:
        a_ref[blk[j], blk[i]] = T.T.astype(a_ref.dtype)


def _workspace_inverse_kernel(m_ref, a_ref, w_ref, *, t, precision, acc, sync):
  # The function of `_tiled_inverse_kernel` where its n x n tiles as values would spill
  # (n = dk / t > VALUE_TILES): every tile goes through w_ref [2 dk, dk], a global-memory
  # workspace of the program (halves W0 and W1), and the tile indices are loop counters, so
  # that the code holds a few tile products instead of one per (tile, term) (at dk = 128,
  # unrolled, the products took minutes to compile). `sync` is a barrier of
  # the program's threads, between a tile's store and its loads by other threads. Phases:
  # (1) left-looking block Cholesky of M's lower tiles, a tile column at a time: W0's lower
  # tiles <- L_ik (i > k), and L_kk^-1 on the diagonal; (2) X = L^-1 by block forward
  # substitution into W1's lower tiles, a tile at a time; (3) A = X^T X, upper tiles
  # mirrored (diagonal tiles symmetrised), into a_ref.
  mm = functools.partial(dot, precision=precision)
  dk = m_ref.shape[0]
  n = dk // t
  at = lambda i: pl.ds(pl.multiple_of(i * t, t), t)
  half = lambda h, i: pl.ds(pl.multiple_of(h * dk + i * t, t), t)      # tile row i of W_h
  M = lambda i, j: m_ref[at(i), at(j)].astype(acc)
  W = lambda h, i, j: w_ref[half(h, i), at(j)]
  zero = jnp.zeros((t, t), acc)

  def put(T, h, i, j):   # tile (i, j) of W_h, or of a_ref for h = None
    if h is None:
      a_ref[at(i), at(j)] = T.astype(a_ref.dtype)
    else:
      w_ref[half(h, i), at(j)] = T

  def put_symmetric(T, h, i, j):   # upper tile (i, j) and its mirror (diagonal symmetrised)
    T = jnp.where(i == j, 0.5 * (T + T.T), T)
    put(T, h, i, j)
    put(T.T, h, j, i)

  def loop(lo, hi, body, init=0):
    return jax.lax.fori_loop(lo, hi, body, init)

  def cholesky_column(k, c):                                         # (1)
    schur = lambda i: loop(0, k, lambda m, G: G - mm(W(0, i, m), W(0, k, m), tb=True), M(i, k))
    Ld = chol_inv(schur(k))                                          # L_kk^-1
    put(Ld, 0, k, k)

    def below(i, c):
      put(mm(schur(i), Ld, tb=True), 0, i, k)                        # G_ik L_kk^-T
      return c
    loop(k + 1, n, below)
    sync()
    return c

  def inverse_column(k, c):                                          # (2)
    put(W(0, k, k), 1, k, k)                                         # X_kk = L_kk^-1
    sync()

    def below(i, c):                # X_ik = -L_ii^-1 (sum of L_im X_mk over k <= m < i)
      S = loop(k, i, lambda m, S: S + mm(W(0, i, m), W(1, m, k)), zero)
      put(-mm(W(0, i, i), S), 1, i, k)
      sync()
      return c
    return loop(k + 1, n, below, c)

  def upper(fn, h):   # tiles (i, j >= i) of fn(i, j), mirrored into W_h (a_ref for None)
    def row(i, c):
      def tile(j, c):
        put_symmetric(fn(i, j), h, i, j)
        return c
      return loop(i, n, tile, c)
    loop(0, n, row)

  loop(0, n, cholesky_column)
  loop(0, n, inverse_column)
  upper(lambda i, j: loop(j, n, lambda m, T: T + mm(W(1, m, i), W(1, m, j), ta=True), zero),
        None)                                                        # (3) X^T X


# ----------------------------------------------------------------------------- wrappers

def segment_grams(u, S, L, *, plan, heads=None):
  """The Grams G_s = sum of u_t u_t^T over the L tokens of segment s, for s = 0..S-2 (the
  last segment's is never needed): [BH, S - 1, dk, dk] in the accumulation dtype. u:
  head-major [BH, >= S * L, dk], or with heads=H the caller's token-major [B, >= S * L, H, dk]
  read in place. Grid (B * H, S - 1), chunk_size tokens a step."""
  dk = u.shape[-1]
  BH = u.shape[0] * (heads or 1)
  acc = jnp.dtype(plan.acc)
  return pl.pallas_call(
      functools.partial(_gram_kernel, L=L, C=plan.chunk_size, precision=plan.gram_dot,
                        acc=acc),
      grid=(BH, S - 1),
      in_specs=[rows_spec(L, dk, heads)],
      out_specs=pl.BlockSpec((None, None, dk, dk), lambda i, j: (i, j, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((BH, S - 1, dk, dk), acc),
      compiler_params=compiler_params(WARPS if dk <= 64 else WIDE_GRAM_WARPS),
      interpret=plan.interpret, name="vla_segment_grams",
  )(u)


def spd_inverse_kernel(M, *, newton_step, precision, tile=None, interpret=False):
  """A = M^-1 for M [BH, N, dk, dk] symmetric positive definite, one program per matrix
  (grid (BH, N)). tile: None (dk elimination steps on the whole matrix) or 32 (a block
  Cholesky on 32 x 32 tiles; the same function): the tiles as values up to `VALUE_TILES` a
  side (dk <= 64), beyond through a global-memory workspace of 2 dk^2 entries per program
  (an output that is dropped). newton_step: one Newton step A <- A + A (I - M A) in M's
  dtype, on the whole matrix only (the direct starts of float64 states; raises ValueError
  with a tile)."""
  BH, N, dk, _ = M.shape
  if newton_step and tile is not None:
    raise ValueError(f"spd_inverse_kernel: newton_step runs on the whole matrix (tile=None); "
                     f"got tile={tile}")
  spec = pl.BlockSpec((None, None, dk, dk), lambda b, n: (b, n, 0, 0))
  out_specs, out_shape = spec, jax.ShapeDtypeStruct(M.shape, M.dtype)
  options = dict(precision=precision, acc=M.dtype)
  if tile is None:
    kernel = functools.partial(_inverse_kernel, newton_step=newton_step, **options)
  elif dk // tile <= VALUE_TILES:
    kernel = functools.partial(_tiled_inverse_kernel, t=tile, **options)
  else:
    sync = (lambda: None) if interpret else plgpu.debug_barrier
    kernel = functools.partial(_workspace_inverse_kernel, t=tile, sync=sync, **options)
    out_specs = [spec, pl.BlockSpec((None, None, 2 * dk, dk), lambda b, n: (b, n, 0, 0))]
    out_shape = [out_shape, jax.ShapeDtypeStruct((BH, N, 2 * dk, dk), M.dtype)]
  out = pl.pallas_call(
      kernel,
      grid=(BH, N), in_specs=[spec], out_specs=out_specs, out_shape=out_shape,
      compiler_params=compiler_params(WARPS), interpret=interpret, name="vla_spd_inverse",
  )(M)
  return out[0] if isinstance(out, (list, tuple)) else out


def segment_start_inverses(u, A0, S, L, *, plan, token_major=False):
  """The inverses at the starts of segments 1..S-1, [B, H, S - 1, dk, dk] in A0's dtype
  (module docstring: exact or direct, by `plan.exact_starts`).

  u: [B, H, T_pad, dk] head-major (zero-padded to S * L here), or with token_major the
  caller's [B, S * L, H, dk] (any float dtype, read in place; not for the exact form with
  float64 Grams). A0: [B, H, dk, dk]."""
  inverse = functools.partial(_direct_inverses, plan=plan)
  if plan.exact_starts:
    # bfloat16 u (bfloat16 products): every product u_i u_j is exact in float32, and the
    # float32 Grams only round their sums; float32 u takes float64 Grams.
    grams = _segment_grams(u, S, L, plan, token_major) if plan.low else None
    return _exact_start_inverses(u, A0, S, L, inverse, grams)
  grams = jnp.cumsum(_segment_grams(u, S, L, plan, token_major), axis=2)
  if not plan.inverse_kernel:
    M0 = spd_inverse(A0, solve=True)
    return inverse(M0[:, :, None] + grams.astype(A0.dtype), newton=plan.newton_step)
  M = inverse(A0[:, :, None], newton=False) + grams
  return inverse(M, newton=plan.newton_step)


def _segment_grams(u, S, L, plan, token_major):
  """The Grams G_s of segments 0..S-2, [B, H, S - 1, dk, dk] in the accumulation dtype: the
  `vla_segment_grams` kernel (`Plan.gram_dot` products) with `Plan.inverse_kernel`, else XLA
  (HIGHEST). u as in `segment_start_inverses`."""
  if token_major:
    B, _, H, dk = u.shape
  else:
    B, H, _, dk = u.shape
  if not plan.inverse_kernel:
    return _grams_xla(u, S, L, token_major).astype(plan.acc)
  if not token_major:
    pad = S * L - u.shape[2]
    u = jnp.pad(u, [(0, 0), (0, 0), (0, pad), (0, 0)]).reshape(B * H, S * L, dk)
  grams = segment_grams(u, S, L, plan=plan, heads=H if token_major else None)
  return grams.reshape(B, H, S - 1, dk, dk)


def _direct_inverses(M, *, plan, newton):
  """M^-1 of M [B, H, n, dk, dk] by a direct Cholesky inverse in M's dtype: the
  `vla_spd_inverse` kernel with `Plan.inverse_kernel`, else XLA (`spd_inverse`); newton:
  one Newton step in the same dtype."""
  if not plan.inverse_kernel:
    return spd_inverse(M, newton_step=newton)
  B, H, n, dk, _ = M.shape
  return spd_inverse_kernel(M.reshape(B * H, n, dk, dk), newton_step=newton,
                            precision=plan.inverse_dot, tile=plan.inverse_tile,
                            interpret=plan.interpret).reshape(M.shape)


def _exact_start_inverses(u, A0, S, L, inverse, grams=None):
  """The exact form (module docstring) for A0 [B, H, dk, dk] and float32 u [B, H, T_pad, dk]
  (T_pad > (S - 1) L): float64 Grams and prefix sums, float32 direct inverses, float64
  Newton steps; or from given float32 Grams [B, H, S - 1, dk, dk] (bfloat16 u, whose products
  are exact in float32; u unused), summed in float64. The float64 parts are XLA products, sums
  and casts traced under `jax.enable_x64` (no float64 enters a Pallas kernel, none leaves
  this function)."""
  f32 = A0.dtype
  X0 = inverse(A0[:, :, None], newton=False)                 # ~A0^-1, float32
  with jax.enable_x64(True):
    M0 = _newton_float64(X0, A0[:, :, None])                 # A0^-1 to ~eps (float64)
    if grams is None:
      grams = _grams_xla(u.astype(jnp.float64), S, L, token_major=False)
    M = M0 + jnp.cumsum(grams.astype(jnp.float64), axis=2)   # [B, H, S - 1, dk, dk]
    M_f32 = M.astype(f32)
  X = inverse(M_f32, newton=False)
  with jax.enable_x64(True):
    return _newton_float64(X, M).astype(f32)


def _newton_float64(X, M, steps=REFINE_STEPS):
  """`steps` Newton steps X <- X + X (I - M X) towards M^-1 in float64, symmetrised; X, M:
  [..., dk, dk] (float32 or float64; run under `jax.enable_x64`). Each step squares the
  residual I - M X, down to float64 rounding, from a first residual below 1; X, a float32
  inverse, starts at ~eps * cond(M) (float32 rounds M itself by that much). Where the first
  residual's norm exceeds NEWTON_RESIDUAL (M too ill-conditioned for a float32 start: the
  steps would stop short of float32 accuracy, or diverge) the inverse is M's float64
  Cholesky inverse instead (`spd_inverse`; computed only when some matrix needs it)."""
  X, M = X.astype(jnp.float64), M.astype(jnp.float64)
  mm = functools.partial(jnp.matmul, precision=HIGHEST)
  identity = jnp.eye(X.shape[-1], dtype=jnp.float64)
  R = identity - mm(M, X)
  ok = jnp.sum(R * R, axis=(-2, -1)) <= NEWTON_RESIDUAL ** 2        # False for NaN or Inf
  X = X + mm(X, R)
  for _ in range(steps - 1):
    X = X + mm(X, identity - mm(M, X))
  X = 0.5 * (X + jnp.swapaxes(X, -1, -2))
  return jax.lax.cond(
      jnp.all(ok), lambda X, M: X,
      lambda X, M: jnp.where(ok[..., None, None], X, spd_inverse(M, solve=True)), X, M)


def _grams_xla(u, S, L, token_major):
  """The Grams of segments 0..S-2 in XLA (HIGHEST products on u in float32, or u's wider
  dtype): [B, H, S - 1, dk, dk]. u as in `segment_start_inverses`."""
  u = u.astype(jnp.promote_types(u.dtype, jnp.float32))
  if token_major:
    B, _, H, dk = u.shape
    U = u[:, :(S - 1) * L].reshape(B, S - 1, L, H, dk)
    return jnp.einsum("bslhi,bslhj->bhsij", U, U, precision=HIGHEST)
  B, H, T_pad, dk = u.shape
  U = jnp.pad(u, [(0, 0), (0, 0), (0, max(0, S * L - T_pad)), (0, 0)])[:, :, :(S - 1) * L]
  U = U.reshape(B, H, S - 1, L, dk)
  return jnp.einsum("bhnci,bhncj->bhnij", U, U, precision=HIGHEST)
