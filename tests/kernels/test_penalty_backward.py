"""The penalty path under differentiation (`penalty_backward.py`): its adjoint VJP (the rows'
cotangents from the forward's chunk-start inverses and Woodbury rows, the u-cotangent kernel)
against `jax.grad` of the token-by-token Sherman-Morrison scan in float64; in float32 at long
T with anisotropic u (exact segment starts); the chunk starts the scan does not keep
(`Plan.chunk_start_stride`) rebuilt in the row-cotangent kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import anisotropic_u, assert_close, plan_for, rel, unit_np
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.config import PENALTY_LAYOUTS
from vla_jax.kernels.penalty_backward import du_segment_chunks, penalty_path, u_cotangents
from vla_jax.kernels.penalty_scan import GAIN_LIMIT, penalty_forward
from vla_jax.kernels.vla import document_indices
from vla_jax.ops.utils import unit
from vla_jax.ops.vla.penalty import penalty_scan

B, H, dk, C = 1, 2, 16, 16


def _inputs(seed, T):
  rng = np.random.default_rng(seed)
  khat = unit_np(rng.standard_normal((B, H, T, dk)), 1e-6)
  u = rng.standard_normal((B, H, T, dk)) / np.sqrt(dk)
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2))
  rng2 = np.random.default_rng(seed + 1)
  wa, wA = rng2.standard_normal((B, H, T, dk)), rng2.standard_normal((B, H, dk, dk))
  return [jnp.asarray(x) for x in (khat, u, A0, wa, wA)]


@jax.jit
def _scan_vjp(khat, u, A0, wa, wA, starts=None, reset=None):
  """((a [B, H, T, dk], A_T) of the XLA penalty scan on head-major khat, u, and its pullback
  of (wa, wA) to khat, u, A0): the reference the kernels' gradients are checked against
  (float64 under jax.enable_x64), one program per shape. starts [B, T] bool, reset [dk, dk]:
  A restarts at reset at every document start."""
  def reference(khat, u, A0):
    tok = lambda x: jnp.swapaxes(x, 1, 2)
    W, A_T = penalty_scan(tok(khat), tok(u), A0, starts, reset)
    return tok(unit(W, 1e-12)), A_T
  out, pull = jax.vjp(reference, khat, u, A0)
  return out, pull((wa, wA))


def test_du_segment_chunks():
  assert [du_segment_chunks(n) for n in (1, 5, 9, 10, 64, 512)] == [1, 5, 3, 5, 8, 8]


@pytest.mark.parametrize("layout", PENALTY_LAYOUTS)
@pytest.mark.parametrize("d", [32, 128])
def test_u_cotangents(x64, d, layout):
  """The u-cotangent kernel against du_s = -(D_s + D_s^T) u_s, D_s = sum_{t >= s} Z_t W_t^T
  + X (X: E of the one segment's last chunk), in float64, in both layouts (E, or the
  symmetric F = E + E^T)."""
  N, C = 3, 16
  rng = np.random.default_rng(7)
  U, W, Z = (rng.standard_normal((1, 1, N, C, d)) for _ in range(3))
  X = rng.standard_normal((1, 1, 1, d, d))
  plan = plan_for(KernelConfig(chunk_size=C, penalty_layout=layout), np.float64, d, d, 1, N)
  du = u_cotangents(*(jnp.asarray(x) for x in (U, W, Z, X)), plan=plan, warps=4)
  u, w, z = (x.reshape(N * C, d) for x in (U, W, Z))
  D = X[0, 0, 0] + np.cumsum((z[:, :, None] * w[:, None, :])[::-1], axis=0)[::-1]
  want = -np.einsum("sij,sj->si", D + np.swapaxes(D, 1, 2), u)
  assert_close(du.reshape(N * C, d), want, jnp.float64, "du")


@pytest.mark.parametrize("N,segment_chunks", [(9, 4), (10, 10)])
def test_gradients_match_scan_float64(x64, N, segment_chunks):
  """Cotangents of khat, u and (the symmetric part of) A0 for a loss on the unit rows and
  A_T; segments of the scan and of the u-cotangent kernel both > 1 or = 1."""
  T = N * C
  khat, u, A0, wa, wA = _inputs(0, T)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dk, B * H, N,
                  segment_chunks=segment_chunks, segments=-(-N // segment_chunks))
  chunks = lambda x: x.reshape(B, H, N, C, dk)

  def kernel_loss(khat, u, A0):
    a, A_T = penalty_path(chunks(khat), chunks(u), A0, plan)
    return jnp.sum(wa * a.reshape(B, H, T, dk)) + jnp.sum(wA * A_T)

  def scan_loss(khat, u, A0):
    tok = lambda x: jnp.swapaxes(x, 1, 2)
    W, A_T = penalty_scan(tok(khat), tok(u), 0.5 * (A0 + jnp.swapaxes(A0, -1, -2)))
    return jnp.sum(wa * tok(unit(W, 1e-12))) + jnp.sum(wA * A_T)

  got = jax.jit(jax.grad(kernel_loss, argnums=range(3)))(khat, u, A0)
  want = jax.jit(jax.grad(scan_loss, argnums=range(3)))(khat, u, A0)
  sym = lambda x: 0.5 * (x + jnp.swapaxes(x, -1, -2))
  for name, g, r in zip(("khat", "u", "A0"), got, want):
    if name == "A0":
      g, r = sym(g), sym(r)
    assert_close(g, r, jnp.float64, "d" + name)


def test_zero_cotangents_meet_nan_cleanly():
  """NaN in u at token 21 and a loss on the rows before it: the cotangents of khat and u
  before token 21 and of A0 equal the clean run's."""
  N, t = 3, 21
  T = N * C
  khat, u, A0, wa, _ = (x.astype(jnp.float32) for x in _inputs(2, T))
  plan = plan_for(KernelConfig(chunk_size=C), np.float32, dk, dk, B * H, N,
                  segment_chunks=1, segments=N)
  chunks = lambda x: x.reshape(B, H, N, C, dk)
  loss = lambda khat, u, A0: jnp.sum(
      wa[:, :, :t] * penalty_path(chunks(khat), chunks(u), A0, plan)[0].reshape(
          B, H, T, dk)[:, :, :t])
  grad = jax.jit(jax.grad(loss, argnums=range(3)))
  clean = grad(khat, u, A0)
  bad = grad(khat, u.at[0, 0, t, 2].set(jnp.nan), A0)
  np.testing.assert_array_equal(bad[0][:, :, :t], clean[0][:, :, :t])
  np.testing.assert_array_equal(bad[1][:, :, :t], clean[1][:, :, :t])
  np.testing.assert_array_equal(bad[2], clean[2])


def test_float32_exact_at_long_T_anisotropic():
  """float32 at HIGHEST, anisotropic u, T = 4096 in 128 segments (cond(M_T) ~ 1e4): unit rows,
  A_T and the cotangents of khat and A0 within 1e-6 of float64, du within 1e-4 (its own
  conditioning: the XLA chunked form gives 2e-5). With direct float32 segment starts: 1e-4
  (rows, dkhat), 3e-4 (dA0), 6e-3 (du)."""
  B, H, dk, T, lam0 = 1, 2, 16, 4096, 0.01
  N = T // C
  rng = np.random.default_rng(4)
  khat = unit_np(rng.standard_normal((B, H, T, dk)), 1e-6)
  u = anisotropic_u(rng, B, H, T, dk)
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(lam0 * (0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)))
  wa, wA = rng.standard_normal((B, H, T, dk)), rng.standard_normal((B, H, dk, dk))
  khat, u, A0 = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (khat, u, A0))
  plan = plan_for(KernelConfig(chunk_size=C, precision=jax.lax.Precision.HIGHEST), np.float32,
                  dk, dk, B * H, N, segment_chunks=2, segments=N // 2)
  chunks = lambda x: x.reshape(B, H, N, C, dk)

  def kernel(khat, u, A0):
    out, pull = jax.vjp(lambda *x: penalty_path(*x, plan), chunks(khat), chunks(u), A0)
    return out, pull((jnp.asarray(wa, jnp.float32).reshape(B, H, N, C, dk),
                      jnp.asarray(wA, jnp.float32)))

  (a, A_T), (dkhat, du, dA0) = jax.jit(kernel)(*(jnp.asarray(x, jnp.float32)
                                                 for x in (khat, u, A0)))
  with jax.enable_x64(True):
    (a_ref, A_ref), grads = _scan_vjp(*(jnp.asarray(x) for x in (khat, u, A0, wa, wA)))
  sym = lambda x: 0.5 * (np.asarray(x) + np.swapaxes(np.asarray(x), -1, -2))
  errors = {"a": rel(a.reshape(B, H, T, dk), a_ref), "A_T": rel(A_T, A_ref),
            "dkhat": rel(dkhat.reshape(B, H, T, dk), grads[0]),
            "dA0": rel(sym(dA0), sym(grads[2])), "du": rel(du.reshape(B, H, T, dk), grads[1])}
  bounds = {"a": 1e-6, "A_T": 1e-6, "dkhat": 1e-6, "dA0": 1e-6, "du": 1e-4}
  assert all(errors[k] < bounds[k] for k in bounds), errors


def test_bfloat16_large_penalty_gains():
  """bfloat16 products, A0 = I / lam0 with lam0 = 0.1 and isotropic u of norm 4 (d = 16):
  early in the sequence A shrinks ~100x in a block, which bfloat16 products do not resolve.
  The scan's blocks and the row cotangents' rows past `penalty_scan.GAIN_LIMIT` take
  three-pass products (interpret mode: float32): the unit rows and the cotangents of khat, u
  and A0 within 1e-2 of float64, the first 64 tokens' within 2x of the rest's (measured:
  2.7e-3 / 3.3e-3 a, 2.8e-3 / 4.3e-3 dkhat, 3.3e-3 / 5.2e-3 du). With the row cotangents in
  bfloat16 products alone, dkhat errs by 9.4e-3 over the first 64 tokens; with the scan's
  too, the rows are NaN."""
  T, lam0, N = 128, 0.1, 8
  rng = np.random.default_rng(6)
  khat = unit_np(rng.standard_normal((B, H, T, dk)), 1e-6)
  u = rng.standard_normal((B, H, T, dk))
  u = 4.0 * u / np.linalg.norm(u, axis=-1, keepdims=True)
  A0 = np.broadcast_to(np.eye(dk) / lam0, (B, H, dk, dk))
  wa, wA = rng.standard_normal((B, H, T, dk)), rng.standard_normal((B, H, dk, dk))
  khat, u = (np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) for x in (khat, u))
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dk, B * H, N,
                  segment_chunks=N, segments=1)
  chunks = lambda x: x.reshape(B, H, N, C, dk)

  def kernel(khat, u, A0):
    out, pull = jax.vjp(lambda *x: penalty_path(*x, plan), chunks(khat), chunks(u), A0)
    return out, pull((jnp.asarray(wa, jnp.float32).reshape(B, H, N, C, dk),
                      jnp.asarray(wA, jnp.float32)))

  (a, _), grads = jax.jit(kernel)(*(jnp.asarray(x, jnp.float32) for x in (khat, u, A0)))
  with jax.enable_x64(True):
    (a_ref, _), want = _scan_vjp(*(jnp.asarray(x) for x in (khat, u, A0, wa, wA)))
  per_token = {"a": (a.reshape(B, H, T, dk), a_ref),
               "dkhat": (grads[0].reshape(B, H, T, dk), want[0]),
               "du": (grads[1].reshape(B, H, T, dk), want[1])}
  for name, (g, r) in per_token.items():
    g, r = np.asarray(g, np.float64), np.asarray(r)
    assert np.isfinite(g).all(), name
    early, late = rel(g[:, :, :64], r[:, :, :64]), rel(g[:, :, 64:], r[:, :, 64:])
    assert max(early, late) < 1e-2 and early < 2 * late, (name, early, late)
  sym = lambda x: 0.5 * (np.asarray(x) + np.swapaxes(np.asarray(x), -1, -2))
  assert rel(sym(grads[2]), sym(want[2])) < 1e-2


def test_bfloat16_nan_where_the_block_turns_accurate():
  """bfloat16 products, A0 = 3 I and unit-norm u: the penalty gains of block 0 sum past
  `GAIN_LIMIT` at token 2, so the clean run computes tokens 2.. of the block at three-pass
  products and tokens 0, 1 in bfloat16. A NaN in u at token 2 leaves the block in bfloat16;
  the rows and every cotangent before token 2 equal the clean run's (the rows before the
  limit keep their low-precision pass, and the accurate pass continues from them)."""
  N, t = 2, 2
  T = N * C
  rng = np.random.default_rng(8)
  khat = unit_np(rng.standard_normal((B, H, T, dk)), 1e-6)
  u = unit_np(rng.standard_normal((B, H, T, dk)), 1e-6)
  A0 = np.broadcast_to(3.0 * np.eye(dk), (B, H, dk, dk))
  u32 = np.asarray(jnp.asarray(u, jnp.float32), np.float64)
  gains = np.cumsum(np.einsum("bhti,bhti->bht", u32[:, :, :16], u32[:, :, :16]) * 3.0, axis=-1)
  assert (np.argmax(gains > GAIN_LIMIT, axis=-1) == t).all(), gains
  wa = jnp.asarray(rng.standard_normal((B, H, T, dk)), jnp.float32)
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dk, B * H, N,
                  segment_chunks=N, segments=1)
  chunks = lambda x: x.reshape(B, H, N, C, dk)
  rows = lambda khat, u, A0: penalty_path(chunks(khat), chunks(u), A0, plan)[0].reshape(
      B, H, T, dk)
  loss = lambda khat, u, A0: jnp.sum(wa[:, :, :t] * rows(khat, u, A0)[:, :, :t])
  # The rows and the cotangents in one program (XLA compiles the forward they share once).
  run = jax.jit(lambda *a: (rows(*a), jax.grad(loss, argnums=range(3))(*a)))
  args = [jnp.asarray(x, jnp.float32) for x in (khat, u, A0)]
  clean = run(*args)
  args[1] = args[1].at[0, 0, t, 3].set(jnp.nan)
  bad = run(*args)
  assert not np.isfinite(np.asarray(bad[0][0, 0, t])).any()
  np.testing.assert_array_equal(bad[0][:, :, :t], clean[0][:, :, :t])
  for name, g, g_clean in zip(("khat", "u"), bad[1][:2], clean[1][:2]):
    np.testing.assert_array_equal(g[:, :, :t], g_clean[:, :, :t], err_msg="d" + name)
  np.testing.assert_array_equal(bad[1][2], clean[1][2], err_msg="dA0")


PATH_NAMES = ("a", "A_T", "dkhat", "du", "dA0")


def _path_against_scan(cfg, dtype, T, d, seed, damp_from, starts=None, strides=None,
                       **plan_fields):
  """(a, A_T, dkhat, du, sym(dA0)) of `penalty_path` under cfg's plan (`plan_for` with
  plan_fields) and the same of jax.vjp of the float64 token-by-token scan, as float64 arrays,
  and the plan. Inputs from `seed`: unit keys, anisotropic unit-norm u scaled by 0.3 from
  token damp_from on, A0 = 3 I (lam0 = 1 / 3), random cotangents of a and A_T; keys and u
  rounded to dtype; starts: the document-start tokens (packed), or None. With strides (a
  tuple of `Plan.chunk_start_stride` values): a list of (got, plan), one per stride, from one
  compiled program (XLA compiles what the plans share once), and ref."""
  C, lam0 = cfg.chunk_size, 1 / 3
  N = T // C
  rng = np.random.default_rng(seed)
  khat = unit_np(rng.standard_normal((B, H, T, d)), 1e-6)
  u = (anisotropic_u(rng, B, H, T, d, norm=1.0)
       * np.where(np.arange(T) < damp_from, 1.0, 0.3)[:, None])
  A0 = np.broadcast_to(np.eye(d) / lam0, (B, H, d, d))
  wa, wA = rng.standard_normal((B, H, T, d)), rng.standard_normal((B, H, d, d))
  if dtype != np.float64:
    khat, u = (np.asarray(jnp.asarray(x, dtype), np.float64) for x in (khat, u))
  packed = starts is not None
  mask = np.zeros((B, T), bool)
  if packed:
    mask[:, list(starts)] = True
  state = np.float64 if dtype == np.float64 else np.float32
  chunks = lambda x: x.reshape(B, H, N, C, d)
  sym = lambda x: 0.5 * (np.asarray(x, np.float64)
                         + np.swapaxes(np.asarray(x, np.float64), -1, -2))
  with jax.enable_x64(dtype == np.float64):
    plans = [plan_for(cfg, dtype, d, d, B * H, N, **plan_fields,
                      **({} if stride is None else {"chunk_start_stride": stride}))
             for stride in (strides or (None,))]
    docs = (document_indices(jnp.asarray(np.cumsum(mask, axis=1)), T, C, H) if packed
            else None)

    def kernel(plan, khat, u, A0):
      out, pull = jax.vjp(lambda *x: penalty_path(*x, plan, docs, 1 / lam0), chunks(khat),
                          chunks(u), A0)
      return out, pull((jnp.asarray(wa, state).reshape(B, H, N, C, d),
                        jnp.asarray(wA, state)))

    runs = jax.jit(lambda *x: [kernel(plan, *x) for plan in plans])(
        *(jnp.asarray(x, state) for x in (khat, u, A0)))
  with jax.enable_x64(True):
    (a_ref, A_ref), want = _scan_vjp(*(jnp.asarray(x) for x in (khat, u, A0, wa, wA)),
                                     jnp.asarray(mask) if packed else None,
                                     jnp.eye(d) / lam0)
  flat = lambda x: np.asarray(x, np.float64).reshape(B, H, T, d)
  got = [(flat(a), np.asarray(A_T, np.float64), flat(grads[0]), flat(grads[1]), sym(grads[2]))
         for (a, A_T), grads in runs]
  ref = (np.asarray(a_ref), np.asarray(A_ref), np.asarray(want[0]), np.asarray(want[1]),
         sym(want[2]))
  if strides is None:
    return got[0], ref, plans[0]
  return list(zip(got, plans)), ref


# The transposed penalty layout (`KernelConfig.penalty_layout`): T = 144 (nine chunks: scan
# segments of three chunks, u-cotangent segments of three), anisotropic u of norm 1 (0.3 from
# token 64 on) from A0 = 3 I, so that block 0's penalty gains pass `GAIN_LIMIT` at its third
# row (the accurate pass from a row inside the block) and a document's first block likewise,
# and the blocks from token 64 on have ||X U^T||_F < 0.05 (block_factor "newton" takes its
# Newton steps there, the elimination before); packed: document starts inside chunks, at a
# chunk boundary and two in one block.
LAYOUT_T, LAYOUT_STARTS = 144, (5, 16, 21, 23, 70, 100)


@pytest.mark.parametrize("dtype,packed", [(np.float64, True), (np.float32, False),
                                          (jnp.bfloat16, True)],
                         ids=["f64_packed", "f32", "bf16_packed"])
def test_transposed_layout(dtype, packed):
  """penalty_layout="transposed" (the scan's products X^T = A U^T, W^T = A E^T, A += -Y^T Y;
  the u-cotangent kernel carrying F = E + E^T): unit rows, A_T and the cotangents of khat, u
  and A0 against jax.vjp of the token-by-token scan in float64 (A restarting at I / lam0 at
  every document start), within the dtype's tolerance; bfloat16 (the carried A as two
  bfloat16 parts, three-pass blocks past GAIN_LIMIT) within 1e-2 in norm. float32 with
  block_factor "newton" (the elimination in the early blocks, Newton steps from token 64)."""
  cfg = KernelConfig(chunk_size=16, penalty_layout="transposed",
                     block_factor="newton" if dtype == np.float32 else "elimination")
  N = LAYOUT_T // 16
  got, ref, _ = _path_against_scan(
      cfg, dtype, LAYOUT_T, dk, seed=9, damp_from=64, starts=LAYOUT_STARTS if packed else None,
      **(dict(segment_chunks=N, segments=1) if packed else dict(segment_chunks=3, segments=3)))
  for name, g, r in zip(PATH_NAMES, got, ref):
    if dtype == jnp.bfloat16:
      assert np.isfinite(g).all() and rel(g, r) < 1e-2, (name, rel(g, r))
    elif name == "du" and dtype == np.float32:   # its own conditioning: 2.3e-5 either layout
      assert rel(g, r) < 1e-4, rel(g, r)
    else:
      assert_close(g, r, dtype, name)


# Chunk starts kept at every `Plan.chunk_start_stride`-th chunk (4) of each scan segment, the
# others rebuilt in the row-cotangent kernel: chunks of two 16-token blocks, two segments of
# five chunks (kept 0, 4 and 5, 9; rebuilt 1-3 and 6-8), or packed (one segment of ten: kept
# 0, 4, 8) with document starts in rebuilt chunks (in a chunk's first and second block, two
# in one block, at a chunk boundary) and in a kept one. Unit-norm anisotropic u (0.3 from
# token 128 on) from A0 = 3 I: block 0's penalty gains pass `GAIN_LIMIT`, and, packed, those
# of the first block of each document before token 128 (A restarts at 3 I), which lie in
# rebuilt chunks.
REBUILD_C, REBUILD_N, REBUILD_SEGMENT = 32, 10, 5
REBUILD_STARTS = (40, 53, 54, 64, 100, 140, 176, 200, 300)


def _rebuild_case(dtype, layout, packed, strides, d=dk):
  """`_path_against_scan` at each chunk_start_stride of `strides` (one program) on the cells
  above."""
  high = jax.lax.Precision.HIGHEST if dtype == np.float32 else jax.lax.Precision.DEFAULT
  cfg = KernelConfig(chunk_size=REBUILD_C, precision=high, penalty_layout=layout)
  return _path_against_scan(
      cfg, dtype, REBUILD_N * REBUILD_C, d, seed=10, damp_from=128,
      starts=REBUILD_STARTS if packed else None, strides=strides,
      **(dict(segment_chunks=REBUILD_N, segments=1) if packed
         else dict(segment_chunks=REBUILD_SEGMENT, segments=REBUILD_N // REBUILD_SEGMENT)))


# Relative error bounds of test_rebuilt_chunk_starts: against float64 (du at float32 by its
# own conditioning), and against the same kernels keeping every chunk start.
REBUILD_BOUNDS = {"float64": (1e-12, 1e-14), "float32": (1e-6, 1e-6), "bfloat16": (1e-2, 1e-6)}


def _check_rebuild(dtype, packed, layout, d=dk):
  """`_rebuild_case` at stride 4 against float64 and against stride 1 (REBUILD_BOUNDS); both
  strides in one program."""
  name = jnp.dtype(dtype).name
  ((got, plan), (every, plan_every)), ref = _rebuild_case(dtype, packed=packed, layout=layout,
                                                          strides=(4, 1), d=d)
  assert plan.chunk_start_stride == 4 and plan_every.chunk_start_stride == 1
  bound, same = REBUILD_BOUNDS[name]
  for key, g, r, e in zip(PATH_NAMES, got, ref, every):
    assert np.isfinite(g).all(), key
    limit = 1e-4 if key == "du" and name == "float32" else bound
    assert rel(g, r) < limit, (key, rel(g, r))
    assert rel(g, e) < same, (key, rel(g, e))


# Every pair of the three factors (dtype, packed, layout) is covered, each dtype in both
# layouts, once packed and once not: six cases instead of the twelve of the full product.
REBUILD_CASES = [(np.float64, False, "rows"), (np.float64, True, "transposed"),
                 (np.float32, True, "rows"), (np.float32, False, "transposed"),
                 (jnp.bfloat16, False, "rows"), (jnp.bfloat16, True, "transposed")]


@pytest.mark.parametrize("dtype,packed,layout", REBUILD_CASES,
                         ids=["f64-rows", "f64_packed-transposed", "f32_highest_packed-rows",
                              "f32_highest-transposed", "bf16-rows", "bf16_packed-transposed"])
def test_rebuilt_chunk_starts(dtype, packed, layout):
  """Chunk starts rebuilt from every 4th (`Plan.chunk_start_stride`), in both layouts: the
  unit rows, A_T and the cotangents of khat, u and A0 against jax.vjp of the float64
  token-by-token scan (float64 within 1e-12; float32 at HIGHEST 1e-6, du 1e-4 by its own
  conditioning as in `test_transposed_layout`; bfloat16 1e-2; measured at most 5.9e-14,
  2.8e-7, du 1.0e-5, 3.4e-3), and against the same kernels keeping every chunk start
  (stride 1) within 1e-6 (float64 1e-14): the rebuild repeats the scan's downdates at its
  products (bfloat16 operands, three-pass blocks past GAIN_LIMIT, resets at document
  starts), so the two agree to float rounding (interpret mode: bit for bit, but for a last
  bit in the transposed layout, where XLA folds the rebuild's transpose of Y into its
  product)."""
  _check_rebuild(dtype, packed, layout)


def test_rebuilt_chunk_starts_d128():
  """The same at dk = 128 (the plan's transposed layout there), float32 at HIGHEST, packed."""
  _check_rebuild(np.float32, True, "transposed", d=128)


def test_chunk_start_residual_every_fourth():
  """The differentiated scan's A residual holds ceil(chunks / 4) starts per segment
  ([B * H, S * K, dk, dk]), each the A the scan carried there (bit for bit the same as with
  every chunk start kept): two segments of five chunks (kept 0, 4, 5, 9), packed one of ten
  (kept 0, 4, 8)."""
  C, N = REBUILD_C, REBUILD_N
  T = N * C
  rng = np.random.default_rng(11)
  khat = jnp.asarray(unit_np(rng.standard_normal((B, H, T, dk)), 1e-6), jnp.float32)
  u = jnp.asarray(anisotropic_u(rng, B, H, T, dk, norm=1.0), jnp.float32)
  A0 = jnp.broadcast_to(3 * jnp.eye(dk, dtype=jnp.float32), (B, H, dk, dk))
  starts = np.zeros((B, T), bool)
  starts[:, list(REBUILD_STARTS)] = True
  docs = document_indices(jnp.asarray(np.cumsum(starts, axis=1)), T, C, H)
  for packed, segment_chunks, kept in ((False, REBUILD_SEGMENT, [0, 4, 5, 9]),
                                       (True, N, [0, 4, 8])):
    plans = {stride: plan_for(KernelConfig(chunk_size=C), np.float32, dk, dk, B * H, N,
                              segment_chunks=segment_chunks, segments=N // segment_chunks,
                              chunk_start_stride=stride) for stride in (4, 1)}
    # Both strides in one program (XLA compiles what they share once).
    outs = jax.jit(lambda *x, plans=plans, packed=packed: {
        stride: penalty_forward(plan, *x, both=True, docs=docs[1] if packed else None,
                                reset=3.0) for stride, plan in plans.items()})(khat, u, A0)
    residual = {stride: np.asarray(out[3]) for stride, out in outs.items()}
    segments = N // segment_chunks
    assert residual[4].shape == (B * H, segments * -(-segment_chunks // 4), dk, dk)
    assert residual[1].shape == (B * H, N, dk, dk)
    np.testing.assert_array_equal(residual[4], residual[1][:, kept])
