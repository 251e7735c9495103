"""Segment-start inverses of the penalty scan (`segment_starts.py`): the Gram kernel, the
inverse kernel (whole matrix and 32 x 32 tiles, with and without the Newton step) and the XLA
form at dk = 128, against float64 NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import INTERPRET, assert_close, plan_for
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.segment_starts import (segment_grams, segment_start_inverses,
                                            spd_inverse_kernel)


def _spd(rng, n, dk):
  X = rng.standard_normal((n, dk, dk)) / np.sqrt(dk)
  return 0.3 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)


@pytest.mark.parametrize("tile,newton", [(None, True), (32, False)])
def test_inverse_kernel_float64(x64, tile, newton):
  M = _spd(np.random.default_rng(0), 3, 64)[None]
  A = jax.jit(lambda m: spd_inverse_kernel(m, newton_step=newton,
                                           precision=jax.lax.Precision.HIGHEST, tile=tile,
                                           interpret=INTERPRET))(jnp.asarray(M))
  assert_close(A, np.linalg.inv(M), jnp.float64, "A")
  np.testing.assert_array_equal(A, np.swapaxes(A, -1, -2))


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
