"""The state path's backward (`state_backward.py`): its custom VJP against autodiff of a plain
loop in float64, in each form a default selects (split or fused reverse pass; chunk-local VJP
as one kernel or as XLA products), bfloat16 operands, and zero cotangents meeting NaN."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import assert_close, plan_for, state_path_loop, unit_np
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.state_path import planned_state_path

BH, T, dk, dv, C = 2, 48, 16, 32, 16


def _inputs(seed, dtype=np.float64):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((BH, T, dk)) / 2
  e, w = (unit_np(rng.standard_normal((BH, T, dk)), 1e-6) for _ in range(2))
  v = rng.standard_normal((BH, T, dv))
  S0 = rng.standard_normal((BH, dv, dk)) / 4
  return [jnp.asarray(x, dtype) for x in (q, e, w, v, S0)]


def _loss(fn, seed, dtype=jnp.float64):
  rng = np.random.default_rng(seed)
  wo = jnp.asarray(rng.standard_normal((BH, T, dv)), dtype)
  wS = jnp.asarray(rng.standard_normal((BH, dv, dk)), dtype)
  return lambda *a: (lambda o, S: jnp.sum(wo * o) + jnp.sum(wS * S))(*fn(*a))


@pytest.mark.parametrize("split,fused_vjp", [(True, True), (False, False)],
                         ids=["split-kernel_vjp", "fused-xla_vjp"])
def test_gradients_float64(x64, split, fused_vjp):
  args = _inputs(0)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, T // C,
                  split_backward=split, fused_vjp=fused_vjp)
  got = jax.jit(jax.grad(_loss(lambda *a: planned_state_path(plan, *a, None), 1),
                         argnums=range(5)))(*args)
  want = jax.jit(jax.grad(_loss(state_path_loop, 1), argnums=range(5)))(*args)
  for name, g, r in zip(("q", "e", "w", "v", "S0"), got, want):
    assert_close(g, r, jnp.float64, "d" + name)


def test_bfloat16_operands_within_bfloat16_bound():
  """bfloat16 inputs at DEFAULT: the local VJP's operands, T and dS_next in bfloat16."""
  args = _inputs(2)
  bf = [x.astype(jnp.bfloat16) for x in args[:4]] + [args[4].astype(jnp.float32)]
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dv, BH, T // C)
  assert plan.low and plan.fused_vjp
  got = jax.jit(jax.grad(_loss(lambda *a: planned_state_path(plan, *a, None), 3, jnp.float32),
                         argnums=range(5)))(*bf)
  exact = [x.astype(jnp.float64) for x in bf]
  with jax.enable_x64(True):
    want = jax.jit(jax.grad(_loss(state_path_loop, 3), argnums=range(5)))(
        *(jnp.asarray(np.asarray(x), jnp.float64) for x in exact))
  for name, g, r in zip(("q", "e", "w", "v", "S0"), got, want):
    assert_close(g, r, jnp.bfloat16, "d" + name)


@pytest.mark.parametrize("split", [True, False], ids=["split", "fused"])
def test_zero_cotangents_meet_nan_cleanly(split):
  """NaN in w at token 21 and a loss on outputs before it: every cotangent before token 21
  (and of S0) equals the clean run's."""
  args = _inputs(4, np.float32)
  plan = plan_for(KernelConfig(chunk_size=C), np.float32, dk, dv, BH, T // C,
                  split_backward=split, split_output=split, fused_vjp=split)
  wo = jnp.asarray(np.random.default_rng(5).standard_normal((BH, 21, dv)), jnp.float32)
  loss = lambda *a: jnp.sum(wo * planned_state_path(plan, *a, None)[0][:, :21])
  grad = jax.jit(jax.grad(loss, argnums=range(5)))
  bad = list(args)
  bad[2] = bad[2].at[:, 21, 0].set(jnp.nan)
  for name, gc, gn in zip(("q", "e", "w", "v", "S0"), grad(*args), grad(*bad)):
    gc, gn = np.asarray(gc), np.asarray(gn)
    if name != "S0":
      gc, gn = gc[:, :21], gn[:, :21]
    np.testing.assert_array_equal(gn, gc, err_msg="d" + name)
