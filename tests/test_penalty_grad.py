"""The chunk-level backward pass of the penalty path (`vla_jax.kernels.penalty_grad`,
KernelConfig(penalty_grad="chunk")): gradients equal plain autodiff in float64, alone and
inside `vla_pallas` (against impl="scan"), and the gradient lowers for an abstract H200."""

import chex
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from test_kernels import _config, _inputs, _rel
from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels.lowering import lower_for_h200
from vla_jax.kernels.penalty import penalty_parallel
from vla_jax.kernels.penalty_grad import penalty_chunked_grad
from vla_jax.ops.vla import VLAState, vla_recurrence

def _sym(x):
  return 0.5 * (x + jnp.swapaxes(x, -1, -2))


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

  want = jax.grad(loss(lambda *a: penalty_parallel(*a, refine=refine, solver=solver)),
                  argnums=range(3))(khat, u, A0)
  got = jax.jit(jax.grad(loss(lambda *a: penalty_chunked_grad(*a, refine, hi, solver)),
                         argnums=range(3)))(khat, u, A0)
  out = penalty_chunked_grad(khat, u, A0, refine, hi, solver)
  for g, w in zip(out, penalty_parallel(khat, u, A0, refine=refine, solver=solver)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))   # forward unchanged
  for name, g, w in zip(("khat", "u", "A0"), got, want):
    if name == "A0":
      g, w = _sym(g), _sym(w)
    assert _rel(g, w) < 1e-10, (name, _rel(g, w))


def test_vla_pallas_gradients_match_scan_float64(x64):
  B, T, H, dk, dv, C = 1, 45, 2, 16, 16, 16
  q, k, v, u, S0, A0 = (jnp.asarray(x) for x in _inputs(40, B, T, H, dk, dv))
  rng = np.random.default_rng(41)
  wo, wS, wA = (jnp.asarray(rng.standard_normal(s)) for s in
                ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)))
  cfg = _config(C, penalty_grad="chunk")

  def pallas(q, k, v, u, S0):
    o, S, A = vla_pallas(q, k, v, u, S0, A0, config=cfg, interpret=True)
    return jnp.sum(wo * o) + jnp.sum(wS * S) + jnp.sum(wA * A)

  def scan(q, k, v, u, S0):
    o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl="scan")
    return jnp.sum(wo * o) + jnp.sum(wS * st.S) + jnp.sum(wA * st.A)

  got = jax.jit(jax.grad(pallas, argnums=range(5)))(q, k, v, u, S0)
  want = jax.grad(scan, argnums=range(5))(q, k, v, u, S0)
  for name, g, w in zip(("q", "k", "v", "u", "S0"), got, want):
    assert _rel(g, w) < 1e-9, (name, _rel(g, w))


def test_bad_penalty_grad_raises():
  x = jnp.zeros((1, 16, 1, 16))
  with pytest.raises(ValueError, match="penalty_grad"):
    vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
               config=KernelConfig(chunk_size=16, penalty_grad="implicit"))


def test_gradient_lowers_for_h200():
  B, T, H, dk, dv, C = 1, 100, 2, 64, 64, 64
  cfg = KernelConfig(chunk_size=C, penalty_grad="chunk")
  loss = lambda *a: sum(jnp.sum(x.astype(jnp.float32))
                        for x in vla_pallas(*a, config=cfg, interpret=False))
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  args = (spec(B, T, H, dk), spec(B, T, H, dk), spec(B, T, H, dv), spec(B, T, H, dk),
          jax.ShapeDtypeStruct((B, H, dv, dk), jnp.float32),
          jax.ShapeDtypeStruct((B, H, dk, dk), jnp.float32))
  text = lower_for_h200(jax.grad(loss, argnums=range(4)), *args).as_text()
  assert "vla_state_fwd" in text and "vla_state_bwd" in text


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
  want = jax.grad(loss("triangular_solve"))(G)
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
  want = jax.grad(lambda L: jnp.sum(W * jnp.sin(tril_inverse(L, unit_diagonal=unit_diagonal))))(L)
  got = jax.grad(lambda L: jnp.sum(W * jnp.sin(tril_inverse_products(L, unit_diagonal, hi))))(L)
  mask = np.tril(np.ones((32, 32)), -1 if unit_diagonal else 0)   # the entries L varies in
  chex.assert_trees_all_close(got, want * mask, rtol=1e-10,
                              atol=1e-10 * float(jnp.abs(want).max()))
