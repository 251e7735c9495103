"""Shared kernel helpers (`common.py`): the small factorisations against float64 NumPy, and
the containment of non-finite rows in causal products (plain jnp: the helpers run as written
inside and outside kernels)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import TOL, assert_close, rel
from vla_jax.kernels.common import (BF16, NEWTON_RADIUS, causal_dot, chol_inv, dot, finite,
                                    guarded_chol_inv, newton_chol_inv, split_operand, unit_rows,
                                    unit_rows_vjp, unit_tril_inv)

HI = jax.lax.Precision.HIGHEST


def _spd(n, seed=0):
  X = np.random.default_rng(seed).standard_normal((n, n)) / np.sqrt(n)
  return np.eye(n) + X @ X.T


def test_chol_inv_and_unit_tril_inv_float64(x64):
  G = _spd(16)
  assert_close(chol_inv(jnp.asarray(G)), np.linalg.inv(np.linalg.cholesky(G)), jnp.float64)
  N = np.tril(np.random.default_rng(1).standard_normal((32, 32)) / 4, -1)
  assert_close(unit_tril_inv(jnp.asarray(N), HI), np.linalg.inv(np.eye(32) + N), jnp.float64)


def _key_products(n, scale, seed=0, d=32):
  """strictly_lower(E W^T) [n, n] for unit rows E and rows W of norm `scale` (the state
  prep's N; a large scale makes I + N ill-conditioned: cond 2e6 at n = 64, scale 4)."""
  rng = np.random.default_rng(seed)
  E, W = (x / np.linalg.norm(x, axis=1, keepdims=True)
          for x in rng.standard_normal((2, n, d)))
  return np.tril(E @ W.T * scale, -1)


@pytest.mark.parametrize("n,scale", [(64, 4.0), (128, 3.0)])
def test_unit_tril_inv_float32_ill_conditioned(n, scale):
  """float32, I + N of the state prep's form with cond 2e6 (n = 64) and 1e7 (n = 128; entries
  of the inverse up to 1e5 and 3e5): with float32 products the block doubling's inverse is
  within the float32 tolerance of float64 (6e-7 and 9e-7 relative), with bfloat16 operands
  within the bfloat16 tolerance in norm (7e-3 and 1.3e-2)."""
  N = _key_products(n, scale)
  want = np.linalg.inv(np.eye(n) + N)
  assert_close(unit_tril_inv(jnp.asarray(N, jnp.float32), HI), want, jnp.float32)
  assert rel(unit_tril_inv(jnp.asarray(N, jnp.float32), BF16), want) < TOL["bfloat16"]


def _near_identity(n, radius, seed=0):
  """I + X X^T scaled to ||G - I||_F = radius."""
  X = np.random.default_rng(seed).standard_normal((n, n))
  D = X @ X.T
  return np.eye(n) + radius * D / np.linalg.norm(D)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_newton_chol_inv_and_its_guard(x64, dtype):
  """newton_chol_inv at ||G - I||_F = NEWTON_RADIUS matches L^-1 to the dtype's rounding (as
  chol_inv does), and so does guarded_chol_inv; beyond the radius two Newton steps are far off
  (1e-1 at ||G - I||_F = 4) and the guard gives chol_inv's result."""
  tol = {np.float64: 1e-14, np.float32: 2e-6}[dtype]
  for radius, near in ((NEWTON_RADIUS, True), (4.0, False)):
    G = _near_identity(16, radius)
    ref = np.linalg.inv(np.linalg.cholesky(G))
    g = jnp.asarray(G, dtype)
    newton, guarded = newton_chol_inv(g, HI), guarded_chol_inv(g, HI)
    assert rel(guarded, ref) < tol and rel(chol_inv(g), ref) < tol
    assert (rel(newton, ref) < tol) == near and (near or rel(newton, ref) > 1e-2)
    assert not np.asarray(newton)[np.triu_indices(16, 1)].any()       # lower triangular


def test_split_operand_keeps_float32_accuracy():
  """bfloat16 products with a float32 operand split in two parts: ~2^-17 relative error on
  the operand (one part: 2^-9); other precisions take the operand whole."""
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.standard_normal((32, 32)) * np.logspace(-3, 3, 32), jnp.float32)
  hi, lo = split_operand(x, BF16)
  assert hi.dtype == lo.dtype == jnp.bfloat16
  err = np.abs(np.asarray(hi, np.float64) + np.asarray(lo, np.float64) - np.asarray(x))
  assert (err <= 2.0 ** -17 * np.abs(np.asarray(x))).all()
  assert split_operand(x, HI) == (x,)


def test_unit_rows_vjp_float64(x64):
  rng = np.random.default_rng(2)
  w = jnp.asarray(rng.standard_normal((5, 8)))
  w = w.at[2].set(0.0)                                   # below eps: the floor's branch
  da = jnp.asarray(rng.standard_normal((5, 8)))
  _, pullback = jax.vjp(lambda x: unit_rows(x, 1e-12), w)
  assert_close(unit_rows_vjp(w, da, 1e-12), pullback(da)[0], jnp.float64)


def test_unit_rows_zero_tiny_overflow_and_nan_rows():
  """Rows of norm <= eps give zero rows and zero cotangents; a row whose squared norm overflows
  float32 gives NaN (reported, not dropped); a NaN entry stays NaN; other rows are x / |x|."""
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((5, 8)), jnp.float32)
  x = x.at[1].set(0.0).at[2].set(1e-8).at[3].set(1e20).at[4, 0].set(jnp.nan)
  got = np.asarray(unit_rows(x, 1e-6))
  np.testing.assert_allclose(got[0], np.asarray(x[0]) / np.linalg.norm(np.asarray(x[0])),
                             rtol=1e-6)
  np.testing.assert_array_equal(got[1:3], 0.0)
  assert np.isnan(got[3]).all() and np.isnan(got[4, 0])
  dw = np.asarray(unit_rows_vjp(x, jnp.ones_like(x), 1e-6))
  np.testing.assert_array_equal(dw[1:3], 0.0)
  assert np.isfinite(dw[0]).all()


@pytest.mark.parametrize("row", [0, 5, 15])
def test_non_finite_rows_reach_later_rows_only(row):
  """A NaN row j of the right operand: rows < j of the product unchanged, rows >= j NaN;
  Inf likewise; `finite` zeros exactly the non-finite entries."""
  rng = np.random.default_rng(3)
  m = jnp.asarray(np.tril(rng.standard_normal((16, 16))), jnp.float32)
  x = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
  clean = causal_dot(m, x, HI)
  np.testing.assert_array_equal(clean, dot(m, x, precision=HI))
  for bad in (np.nan, np.inf):
    y = causal_dot(m, x.at[row, 3].set(bad), HI)
    np.testing.assert_array_equal(y[:row], clean[:row])
    assert np.isnan(np.asarray(y[row:])).all()
  np.testing.assert_array_equal(finite(jnp.asarray([1.0, np.nan, -np.inf, 2.0])),
                                [1.0, 0.0, 0.0, 2.0])


def test_factorisations_keep_non_finite_rows_later():
  """chol_inv and unit_tril_inv: a non-finite row j leaves rows < j of the result unchanged."""
  G = jnp.asarray(_spd(16), jnp.float32)
  bad = G.at[9, :].set(jnp.nan).at[:, 9].set(jnp.nan)
  clean, got = chol_inv(G), chol_inv(bad)
  np.testing.assert_array_equal(got[:9], clean[:9])
  assert np.isnan(np.asarray(got[9:])).all()
  N = jnp.asarray(np.tril(np.random.default_rng(4).standard_normal((16, 16)) / 4, -1),
                  jnp.float32)
  clean, got = unit_tril_inv(N, HI), unit_tril_inv(N.at[9, 2].set(jnp.nan), HI)
  np.testing.assert_array_equal(got[:9], clean[:9])
  assert np.isnan(np.asarray(got[9:])).all()


def test_guarded_chol_inv_keeps_non_finite_rows_later():
  """A non-finite row j of g near I: the guard takes the elimination (whose rows < j are
  those of g's finite part), rows >= j NaN."""
  G = jnp.asarray(_near_identity(16, 0.1), jnp.float32)
  bad = G.at[9, :].set(jnp.nan).at[:, 9].set(jnp.nan)
  got = guarded_chol_inv(bad, HI)
  np.testing.assert_array_equal(got[:9], chol_inv(G)[:9])
  assert np.isnan(np.asarray(got[9:])).all()
