"""The chunk-level backward pass of the penalty path (`vla_jax.kernels.penalty_grad`,
KernelConfig(penalty_grad="chunk")): gradients equal plain autodiff in float64, alone and
inside `vla_pallas` (against impl="scan"), and the gradient lowers for an abstract H200."""

import chex
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from test_kernels import _assert_grads_match_scan, _config, _lowered_grad_lines, _rel, _sym
from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels.penalty import penalty_parallel
from vla_jax.kernels.penalty_grad import penalty_chunked_grad


@pytest.mark.parametrize("refine,solver,N", [(False, "triangular_solve", 5),
                                             (True, "triangular_solve", 1),
                                             (True, "doubling", 6)])
def test_matches_autodiff_float64(x64, refine, solver, N):
  """Gradients of khat, u and (symmetric part) A0 for every chunk count, incl. one chunk."""
  B, H, C, dk = 2, 2, 8, 8
  rng = np.random.default_rng(N)
  k = rng.standard_normal((B, H, N, C, dk))
  khat = jnp.asarray(k / np.linalg.norm(k, axis=-1, keepdims=True))
  u = jnp.asarray(rng.standard_normal((B, H, N, C, dk)) / np.sqrt(dk))
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = jnp.asarray(np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)))
  cW = jnp.asarray(rng.standard_normal((B, H, N, C, dk)))
  cA = jnp.asarray(rng.standard_normal((B, H, dk, dk)))
  hi = jax.lax.Precision.HIGHEST

  def loss(fn):
    def f(khat, u, A0):
      W, A_T = fn(khat, u, A0)
      return jnp.sum(cW * jnp.sin(W)) + jnp.sum(cA * A_T)
    return f

  want = jax.jit(jax.grad(loss(lambda *a: penalty_parallel(*a, refine=refine, solver=solver)),
                          argnums=range(3)))(khat, u, A0)
  got = jax.jit(jax.grad(loss(lambda *a: penalty_chunked_grad(*a, refine, hi, solver)),
                         argnums=range(3)))(khat, u, A0)
  out = penalty_chunked_grad(khat, u, A0, refine, hi, solver)
  for g, w in zip(out, penalty_parallel(khat, u, A0, refine=refine, solver=solver)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))   # forward unchanged
  for name, g, w in zip(("khat", "u", "A0"), got, want):
    if name == "A0":
      g, w = _sym(g), _sym(w)
    assert _rel(g, w) < 1e-10, (name, _rel(g, w))


def test_vla_pallas_gradients_match_scan_float64_xla_prep(x64):
  """penalty_grad="chunk" with prep="xla" (the direct-inverse forward); prep="scan" is in
  test_penalty_scan_grad.py."""
  _assert_grads_match_scan(_config(16, prep="xla", penalty_grad="chunk"), T=45, seed=40)


def test_bad_penalty_grad_raises():
  x = jnp.zeros((1, 16, 1, 16))
  with pytest.raises(ValueError, match="penalty_grad"):
    vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
               config=KernelConfig(chunk_size=16, penalty_grad="implicit"))


def test_gradient_lowers_for_h200():
  lines = _lowered_grad_lines(KernelConfig(chunk_size=64, prep="xla", penalty_grad="chunk",
                                               state_output="fused", state_bwd="fused"), T=100)
  assert any("vla_state_fwd" in l for l in lines) and any("vla_state_bwd" in l for l in lines)


@pytest.mark.parametrize("n", [16, 64])
def test_products_only_cholesky_inverse_float64(x64, n):
  """solver="doubling": L^-1 of a Cholesky factor has a backward pass of products only. Its
  gradient equals autodiff through the Cholesky and a triangular solve, and the gradient's
  program holds no triangular solve."""
  from vla_jax.kernels.penalty import _chol_inverse   # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(n)
  X = rng.standard_normal((3, n, n)) / np.sqrt(n)
  G = jnp.asarray(X @ np.swapaxes(X, -1, -2) + 0.5 * np.eye(n))
  W = jnp.asarray(rng.standard_normal((3, n, n)))
  hi = jax.lax.Precision.HIGHEST
  loss = lambda solver: lambda G: jnp.sum(W * jnp.sin(_chol_inverse(_sym(G), solver, hi)))
  want = jax.jit(jax.grad(loss("triangular_solve")))(G)
  got = jax.jit(jax.grad(loss("doubling")))(G)
  chex.assert_trees_all_close(got, want, rtol=1e-10, atol=1e-10 * float(jnp.abs(want).max()))
  jaxpr = str(jax.make_jaxpr(jax.grad(loss("doubling")))(G))
  assert "triangular_solve" not in jaxpr
  assert "triangular_solve" in str(jax.make_jaxpr(jax.grad(loss("triangular_solve")))(G))


@pytest.mark.parametrize("unit_diagonal", [True, False])
def test_tril_inverse_products_grad_float64(x64, unit_diagonal):
  """The two-product backward of the doubling triangular inverse (state path, solver=
  "doubling") equals autodiff through the doubling rounds."""
  from vla_jax.kernels.triangular import tril_inverse_products  # pylint: disable=import-outside-toplevel
  from vla_jax.ops.utils import tril_inverse  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(3)
  L = np.tril(rng.standard_normal((4, 32, 32)) / 8, -1) + np.eye(32) * (
      1.0 if unit_diagonal else rng.uniform(0.5, 2.0, (4, 1, 32)))
  L, W = jnp.asarray(L), jnp.asarray(rng.standard_normal((4, 32, 32)))
  hi = jax.lax.Precision.HIGHEST
  want = jax.jit(jax.grad(
      lambda L: jnp.sum(W * jnp.sin(tril_inverse(L, unit_diagonal=unit_diagonal)))))(L)
  got = jax.jit(jax.grad(
      lambda L: jnp.sum(W * jnp.sin(tril_inverse_products(L, unit_diagonal, hi)))))(L)
  mask = np.tril(np.ones((32, 32)), -1 if unit_diagonal else 0)   # the entries L varies in
  chex.assert_trees_all_close(got, want * mask, rtol=1e-10,
                              atol=1e-10 * float(jnp.abs(want).max()))
