"""Shared kernel helpers (`common.py`): the small factorisations against float64 NumPy, and
the containment of non-finite rows in causal products (plain jnp: the helpers run as written
inside and outside kernels)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import assert_close, rel
from vla_jax.kernels.common import (BF16, causal_dot, chol_inv, dot, finite, split_operand,
                                    unit_rows, unit_rows_vjp, unit_tril_inv)

HI = jax.lax.Precision.HIGHEST


def _spd(n, seed=0):
  X = np.random.default_rng(seed).standard_normal((n, n)) / np.sqrt(n)
  return np.eye(n) + X @ X.T


def test_chol_inv_and_unit_tril_inv_float64(x64):
  G = _spd(16)
  assert_close(chol_inv(jnp.asarray(G)), np.linalg.inv(np.linalg.cholesky(G)), jnp.float64)
  N = np.tril(np.random.default_rng(1).standard_normal((32, 32)) / 4, -1)
  assert_close(unit_tril_inv(jnp.asarray(N), HI), np.linalg.inv(np.eye(32) + N), jnp.float64)


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
