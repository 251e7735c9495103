"""The penalty path under differentiation (`penalty_backward.py`): its adjoint VJP (a second
penalty scan on the rows' cotangents, the u-cotangent kernel) against `jax.grad` of the
token-by-token Sherman-Morrison scan in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import assert_close, plan_for, unit_np
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.penalty_backward import du_segment_chunks, penalty_path
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


def test_du_segment_chunks():
  assert [du_segment_chunks(n) for n in (1, 5, 9, 10, 64, 512)] == [1, 5, 3, 5, 8, 8]


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
