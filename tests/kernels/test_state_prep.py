"""`state_prep`: the state path's per-chunk factors U' = T V, W' = T E, P = tril(Q W^T), T =
(I + strictly_lower(E W^T))^-1, against float64 NumPy, in both input layouts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import assert_close, plan_for, unit_np
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.state_prep import state_prep

BH, C, N, dk, dv = 2, 16, 3, 32, 16


def _factors_np(e, w, q, v):
  """(U', W', P, T) chunk by chunk in float64, head-major [BH, N * C, .]."""
  split = lambda x: np.asarray(x, np.float64).reshape(x.shape[0], -1, C, x.shape[-1])
  E, W, Q, V = map(split, (e, w, q, v))
  L = np.tril(np.einsum("bnik,bnjk->bnij", E, W), -1) + np.eye(C)
  T = np.linalg.inv(L)
  P = np.tril(np.einsum("bnik,bnjk->bnij", Q, W))
  merge = lambda x: x.reshape(x.shape[0], -1, x.shape[-1])
  return merge(T @ V), merge(T @ E), merge(P), merge(T)


def _inputs(seed, dtype=np.float64):
  rng = np.random.default_rng(seed)
  e = unit_np(rng.standard_normal((BH, N * C, dk)), 1e-6)
  w = unit_np(rng.standard_normal((BH, N * C, dk)), 1e-6)
  q = rng.standard_normal((BH, N * C, dk))
  v = rng.standard_normal((BH, N * C, dv))
  return [jnp.asarray(x, dtype) for x in (e, w, q, v)]


def test_factors_float64(x64):
  e, w, q, v = _inputs(0)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, N)
  got = jax.jit(lambda *a: state_prep(*a, plan=plan, with_inverse=True))(e, w, q, v)
  for name, g, r in zip(("U'", "W'", "P", "T"), got, _factors_np(e, w, q, v)):
    assert_close(g, r, jnp.float64, name)


def test_token_major_raw_keys_bfloat16():
  """heads=H: e (raw keys, made unit in the kernel), q and v read as the caller's
  [B, T, H, d]; bfloat16 operands and bfloat16 outputs (the inference default)."""
  B, H = 1, 2
  rng = np.random.default_rng(1)
  k = rng.standard_normal((B, N * C, H, dk)) * 3
  w = unit_np(rng.standard_normal((B * H, N * C, dk)), 1e-6)
  q = rng.standard_normal((B, N * C, H, dk))
  v = rng.standard_normal((B, N * C, H, dv))
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dv, B * H, N)
  got = jax.jit(lambda *a: state_prep(*a, plan=plan, out_dtype=plan.store, heads=H))(
      bf(k), jnp.asarray(w, jnp.float32), bf(q), bf(v))
  assert all(g.dtype == jnp.bfloat16 for g in got)
  heads = lambda x: np.swapaxes(np.asarray(bf(x), np.float64), 1, 2).reshape(B * H, N * C, -1)
  want = _factors_np(unit_np(heads(k), 1e-6), w, heads(q), heads(v))
  for name, g, r in zip(("U'", "W'", "P"), got, want):
    assert_close(g, r, jnp.bfloat16, name)


@pytest.mark.parametrize("row", [20, 31])
def test_non_finite_row_reaches_later_rows_only(row):
  """A NaN in chunk 1's row `row` of e: factors of earlier rows unchanged, of rows >= row
  non-finite (U', W'), other chunks untouched."""
  e, w, q, v = _inputs(2, np.float32)
  plan = plan_for(KernelConfig(chunk_size=C), np.float32, dk, dv, BH, N)
  fn = jax.jit(lambda *a: state_prep(*a, plan=plan, with_inverse=True))
  clean = fn(e, w, q, v)
  bad = fn(e.at[0, row, 3].set(jnp.nan), w, q, v)
  for c, b in zip(clean, bad):
    c, b = np.asarray(c), np.asarray(b)
    np.testing.assert_array_equal(b[0, :row], c[0, :row])
    np.testing.assert_array_equal(b[0, 2 * C:], c[0, 2 * C:])
    np.testing.assert_array_equal(b[1], c[1])
  for b in bad[:2]:
    assert not np.isfinite(np.asarray(b)[0, row:2 * C]).any()
