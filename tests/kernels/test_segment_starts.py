"""Segment-start inverses of the penalty scan (`segment_starts.py`): the Gram kernel, the
inverse kernel (whole matrix and 32 x 32 tiles, with and without the Newton step; at dk = 128
its tiles in a workspace), the XLA form at dk = 128, the kernels there
(`KernelConfig.start_inverse` "tiles") and the exact starts at long T with anisotropic u
(float32, and bfloat16 u read in place), against float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import INTERPRET, anisotropic_u, assert_close, plan_for, rel
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.segment_starts import (segment_grams, segment_start_inverses,
                                            spd_inverse_kernel)
from vla_jax.ops.utils import spd_inverse


def _spd(rng, n, dk):
  X = rng.standard_normal((n, dk, dk)) / np.sqrt(dk)
  return 0.3 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)


@pytest.mark.parametrize("dk,tile,newton", [(64, None, True), (64, 32, False), (128, 32, False)])
def test_inverse_kernel_float64(x64, dk, tile, newton):
  """The whole matrix with the Newton step (float64's direct starts); 32 x 32 tiles as values
  (dk = 64) and through the workspace (dk = 128, 4 x 4 tiles), which take no Newton step."""
  M = _spd(np.random.default_rng(0), 3, dk)[None]
  A = jax.jit(lambda m: spd_inverse_kernel(m, newton_step=newton,
                                           precision=jax.lax.Precision.HIGHEST, tile=tile,
                                           interpret=INTERPRET))(jnp.asarray(M))
  assert_close(A, np.linalg.inv(M), jnp.float64, "A")
  np.testing.assert_array_equal(A, np.swapaxes(A, -1, -2))


def test_inverse_kernel_refuses_the_newton_step_on_tiles():
  with pytest.raises(ValueError, match="newton_step runs on the whole matrix"):
    spd_inverse_kernel(jnp.zeros((1, 1, 64, 64)), newton_step=True,
                       precision=jax.lax.Precision.HIGHEST, tile=32, interpret=True)


@pytest.mark.parametrize("token_major", [False, True])
def test_grams_float64(x64, token_major):
  """Segments 0..S-2 of L tokens; u head-major or read as [B, T, H, dk] in place."""
  B, H, S, L, dk = 1, 2, 3, 32, 16
  u = np.random.default_rng(1).standard_normal((B, H, S * L, dk))
  plan = plan_for(KernelConfig(chunk_size=16), np.float64, dk, dk, B * H, S * L // 16)
  arg = jnp.asarray(np.swapaxes(u, 1, 2) if token_major else u.reshape(B * H, S * L, dk))
  G = jax.jit(lambda x: segment_grams(x, S, L, plan=plan, heads=H if token_major else None))(
      arg)
  U = u.reshape(B * H, S, L, dk)[:, :S - 1]
  assert_close(G, np.einsum("bsli,bslj->bsij", U, U), jnp.float64, "G")


@pytest.mark.parametrize("dk", [32, 128])
def test_segment_start_inverses_float64(x64, dk):
  """(A0^-1 + sum of u u^T before segment s)^-1 for s = 1..S-1: the kernels at dk = 32, XLA
  at dk = 128; T not a multiple of the segments."""
  B, H, S, L, T = 1, 2, 3, 32, 80
  rng = np.random.default_rng(2)
  u = rng.standard_normal((B, H, T, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(_spd(rng, B * H, dk)).reshape(B, H, dk, dk)
  plan = plan_for(KernelConfig(chunk_size=16), np.float64, dk, dk, B * H, 5)
  assert plan.inverse_kernel == (dk <= 64)
  A = jax.jit(lambda u, A0: segment_start_inverses(u, A0, S, L, plan=plan))(
      jnp.asarray(u), jnp.asarray(A0))
  want = [np.linalg.inv(np.linalg.inv(A0) + np.einsum("bhti,bhtj->bhij", u[:, :, :s * L],
                                                      u[:, :, :s * L])) for s in (1, 2)]
  assert_close(A, np.stack(want, axis=2), jnp.float64, "A_s")


@pytest.mark.parametrize("inverse_kernel", [True, False], ids=["kernel", "xla"])
def test_exact_starts_anisotropic_long_T(inverse_kernel):
  """float32 at HIGHEST, anisotropic u, T = 16384 (cond(M) > 1e3 at the last start): every
  start within 1e-6 of the float64 inverse (float64 Grams, prefix sums and Newton steps
  after the kernel's float32 inverse, or XLA's as at dk = 128). Direct float32 starts err by
  ~eps * cond(M): 1.8e-5 here."""
  B, H, S, T, dk, lam0 = 1, 1, 16, 16384, 32, 0.1
  L = T // S
  rng = np.random.default_rng(3)
  u = anisotropic_u(rng, B, H, T, dk)
  A0 = np.linalg.inv(lam0 * _spd(rng, B * H, dk) + lam0 * np.eye(dk)).reshape(B, H, dk, dk)
  plan = plan_for(KernelConfig(chunk_size=16, precision=jax.lax.Precision.HIGHEST), np.float32,
                  dk, dk, B * H, T // 16, inverse_kernel=inverse_kernel)
  A = jax.jit(lambda u, A0: segment_start_inverses(u, A0, S, L, plan=plan))(
      jnp.asarray(u, jnp.float32), jnp.asarray(A0, jnp.float32))
  assert A.dtype == jnp.float32
  u32 = np.asarray(jnp.asarray(u, jnp.float32), np.float64)[0, 0]
  M0 = np.linalg.inv(np.asarray(jnp.asarray(A0, jnp.float32), np.float64)[0, 0])
  for s in range(1, S):
    M = M0 + u32[:s * L].T @ u32[:s * L]
    err = rel(A[0, 0, s - 1], np.linalg.inv(M))
    assert err < 1e-6, (s, err)
  assert np.linalg.cond(M) > 1e3


def test_exact_starts_bfloat16_u_read_in_place():
  """bfloat16 products (the inference forward: unit-norm anisotropic u read in place as
  [B, T, H, dk]), lam0 = 0.1, T = 16384, d = 32 (cond(M) ~4e4): the exact starts (the Gram
  kernel's float32 Grams, whose products are exact for bfloat16 u, float64 prefix sums and
  Newton steps) err at most 3e-4 against the float64 inverse; the direct float32 form errs
  >= 2x more at the last start (eps * cond(M))."""
  B, H, S, T, dk, lam0 = 1, 1, 16, 16384, 32, 0.1
  L = T // S
  u = jnp.asarray(np.swapaxes(anisotropic_u(np.random.default_rng(3), B, H, T, dk, norm=1.0),
                              1, 2), jnp.bfloat16)
  A0 = jnp.asarray(np.broadcast_to(np.eye(dk) / lam0, (B, H, dk, dk)), jnp.float32)
  u64 = np.asarray(u, np.float64)[0, :, 0]
  want = [np.linalg.inv(lam0 * np.eye(dk) + u64[:s * L].T @ u64[:s * L]) for s in range(1, S)]
  errors = {}
  for exact in (True, False):
    plan = plan_for(KernelConfig(chunk_size=64), jnp.bfloat16, dk, dk, B * H, T // 64,
                    exact_starts=exact)
    A = jax.jit(lambda u, A0: segment_start_inverses(u, A0, S, L, plan=plan,
                                                     token_major=True))(u, A0)
    errors[exact] = [rel(A[0, 0, s], want[s]) for s in range(S - 1)]
  assert plan_for(KernelConfig(), jnp.bfloat16, dk, dk, 1, 4).exact_starts
  assert max(errors[True]) < 3e-4 and 2 * errors[True][-1] < errors[False][-1], errors


@pytest.mark.parametrize("lam0,norm", [(1e-4, 1.0), (1e-4, 8.0)])
def test_exact_starts_beyond_newton_range(lam0, norm):
  """float32 at HIGHEST, u in exactly 4 directions (no noise) and A0 = I / lam0, so M_s has
  eigenvalues lam0 and ~T |u|^2 / 4: cond(M) 1.3e7 and 8e8 (d = 16, T = 4096). The float32
  start's residual I - M X exceeds `NEWTON_RESIDUAL` (2.8 and 6e2), where the Newton steps
  stop short (2.2e-2 relative error) or diverge (NaN); those starts take M's float64
  Cholesky inverse: every start finite and within 1e-6 of float64."""
  B, H, S, L, dk = 1, 1, 16, 256, 16
  u = anisotropic_u(np.random.default_rng(0), B, H, S * L, dk, norm=norm, noise=0.0)
  u = np.asarray(jnp.asarray(u, jnp.float32), np.float64)
  A0 = np.broadcast_to(np.eye(dk) / lam0, (B, H, dk, dk))
  plan = plan_for(KernelConfig(chunk_size=64, precision=jax.lax.Precision.HIGHEST), np.float32,
                  dk, dk, B * H, S * L // 64, segment_chunks=L // 64, segments=S)
  assert plan.exact_starts
  A = jax.jit(lambda u, A0: segment_start_inverses(u, A0, S, L, plan=plan))(
      jnp.asarray(u, jnp.float32), jnp.asarray(A0, jnp.float32))
  U = u[0, 0]
  M = [lam0 * np.eye(dk) + U[:s * L].T @ U[:s * L] for s in range(1, S)]
  assert np.linalg.cond(M[-1]) > 1e7
  errors = [rel(A[0, 0, s], np.linalg.inv(M[s])) for s in range(S - 1)]
  assert max(errors) < 1e-6, errors


@pytest.mark.parametrize("dtype,precision", [(jnp.float32, "HIGHEST"), (jnp.bfloat16, "DEFAULT")],
                         ids=["f32_exact", "bf16_exact"])
def test_tiled_starts_at_dk_128(dtype, precision):
  """start_inverse="tiles" at dk = 128: the Gram kernel and the workspace inverse kernel in
  each form of float32 states' exact starts (float32: float64 Grams, at any precision, which
  interpret mode runs as HIGHEST; bfloat16: the Gram kernel's float32 Grams of u read in
  place). Anisotropic unit-norm u, A0 = I / lam0 with lam0 = 0.01 (cond(M) > 1e4 at the last
  start): the exact starts within 1e-6 (float32) and 3e-4 (bfloat16, as at d = 32) of the
  float64 inverse, and the float32 inverse that the exact ones refine within 1.5x of XLA's
  error (~eps * cond(M))."""
  B, H, S, L, dk, lam0 = 1, 1, 4, 256, 128, 0.01
  u = anisotropic_u(np.random.default_rng(4), B, H, S * L, dk, norm=1.0)
  low = dtype == jnp.bfloat16
  u_in = jnp.asarray(np.swapaxes(u, 1, 2) if low else u, dtype)
  U = np.asarray(u_in, np.float64).reshape(S * L, dk)
  A0 = jnp.asarray(np.broadcast_to(np.eye(dk) / lam0, (B, H, dk, dk)), jnp.float32)
  M = [lam0 * np.eye(dk) + U[:s * L].T @ U[:s * L] for s in range(1, S)]
  assert np.linalg.cond(M[-1]) > 1e4
  cfg = KernelConfig(chunk_size=64, precision=getattr(jax.lax.Precision, precision),
                     start_inverse="tiles")
  plan = plan_for(cfg, dtype, dk, dk, B * H, S * L // 64, segment_chunks=L // 64, segments=S)
  assert plan.exact_starts and plan.inverse_kernel and plan.inverse_tile == 32
  A = jax.jit(lambda u, A0: segment_start_inverses(u, A0, S, L, plan=plan,
                                                   token_major=low))(u_in, A0)
  errors = [rel(A[0, 0, s], np.linalg.inv(M[s])) for s in range(S - 1)]
  assert max(errors) < (3e-4 if low else 1e-6), errors
  if not low:
    # The float32 start X the Newton steps refine (a wrong X would pass above: its residual
    # sends the start to the float64 Cholesky inverse): as accurate as XLA's.
    M32 = jnp.asarray(np.stack(M)[None], jnp.float32)
    X, X_xla = jax.jit(lambda m: (
        spd_inverse_kernel(m, newton_step=False, precision=plan.inverse_dot, tile=32,
                           interpret=INTERPRET), spd_inverse(m)))(M32)
    x_errors = [rel(x, np.linalg.inv(m)) for x, m in zip(X[0], M)]
    xla_errors = [rel(x, np.linalg.inv(m)) for x, m in zip(X_xla[0], M)]
    assert max(x_errors) < 1.5 * max(xla_errors), (x_errors, xla_errors)
