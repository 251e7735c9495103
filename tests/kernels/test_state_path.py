"""`state_path` (the generalised delta rule S_t = S + (v_t - S e_t) w_t^T, o_t = S_t q_t) and
its forward kernels, against a float64 NumPy loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import INTERPRET, assert_close, plan_for, state_path_np, unit_np
from vla_jax.kernels import KernelConfig, state_path
from vla_jax.kernels.state_path import planned_state_path

BH, T, dk, dv, C = 2, 48, 16, 32, 16


def _inputs(seed, dtype=np.float64):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((BH, T, dk)) / 2
  e, w = (unit_np(rng.standard_normal((BH, T, dk)), 1e-6) for _ in range(2))
  v = rng.standard_normal((BH, T, dv))
  S0 = rng.standard_normal((BH, dv, dk)) / 4
  return [jnp.asarray(x, dtype) for x in (q, e, w, v, S0)]


@pytest.mark.parametrize("split,segments", [(True, 1), (True, 3), (False, 1)],
                         ids=["chain+outputs", "segmented chain", "fused"])
def test_forward_float64(x64, split, segments):
  """Every forward form: the chain kernel (over the whole sequence, or over 3 segments
  stitched by their transfer products) plus the parallel output kernel, and one loop."""
  args = _inputs(0)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, T // C,
                  split_output=split, chain_segments=segments)
  o, S = jax.jit(lambda *a: planned_state_path(plan, *a, None))(*args)
  o_ref, S_ref = state_path_np(*args)
  assert_close(o, o_ref, jnp.float64, "o")
  assert_close(S, S_ref, jnp.float64, "S")


def test_segmented_chain_gradients_and_non_finite():
  """The segmented chain (2 segments of 3 chunks) under the state path's VJP matches the
  one-run chain in float32, and a NaN in v at token 60 (segment 1 starts at 48) leaves every
  output before it unchanged."""
  T2 = 96
  rng = np.random.default_rng(5)
  q = jnp.asarray(rng.standard_normal((BH, T2, dk)) / 2, jnp.float32)
  e, w = (jnp.asarray(unit_np(rng.standard_normal((BH, T2, dk)), 1e-6), jnp.float32)
          for _ in range(2))
  v = jnp.asarray(rng.standard_normal((BH, T2, dv)), jnp.float32)
  S0 = jnp.asarray(rng.standard_normal((BH, dv, dk)) / 4, jnp.float32)
  plans = [plan_for(KernelConfig(chunk_size=C, precision=jax.lax.Precision.HIGHEST),
                    np.float32, dk, dv, BH, T2 // C, split_output=True, chain_segments=G)
           for G in (1, 2)]
  wo = jnp.asarray(rng.standard_normal((BH, T2, dv)), jnp.float32)
  loss = lambda plan: jax.jit(jax.value_and_grad(
      lambda *a: jnp.sum(wo * planned_state_path(plan, *a, None)[0]), argnums=range(5)))
  (l1, g1), (l2, g2) = (loss(p)(q, e, w, v, S0) for p in plans)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  for a, b in zip(g2, g1):   # both are within ~3e-7 of float64 (largest-entry relative)
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 2e-6 * np.abs(np.asarray(b)).max()
  fwd = jax.jit(lambda *a: planned_state_path(plans[1], *a, None))
  o, _ = fwd(q, e, w, v, S0)
  o_n, S_n = fwd(q, e, w, v.at[0, 60, 3].set(jnp.nan), S0)
  np.testing.assert_array_equal(o_n[0, :60], o[0, :60])
  np.testing.assert_array_equal(o_n[1], o[1])
  assert np.isnan(np.asarray(o_n[0, 60:])).any(axis=-1).all()
  assert np.isnan(np.asarray(S_n[0])).any()


def test_token_major_q_v_and_vmap(x64):
  """heads=H reads q, v as [B, T, H, d] and writes o so; `state_path` composes with vmap."""
  q, e, w, v, S0 = _inputs(1)
  cfg = KernelConfig(chunk_size=C)
  fn = jax.jit(lambda *a, heads=None: state_path(*a, config=cfg, heads=heads,
                                                 interpret=INTERPRET), static_argnames="heads")
  o, S = fn(q, e, w, v, S0)
  tok = lambda x: jnp.swapaxes(x.reshape(1, BH, T, -1), 1, 2)
  o_t, S_t = fn(tok(q), e, w, tok(v), S0, heads=BH)
  np.testing.assert_allclose(o_t, tok(o), rtol=1e-12)
  np.testing.assert_allclose(S_t, S, rtol=1e-12)
  batched = jax.jit(jax.vmap(lambda *a: state_path(*a, config=cfg, interpret=INTERPRET)))(
      *(x[:, None] for x in (q, e, w, v, S0)))
  np.testing.assert_allclose(batched[0][:, 0], o, rtol=1e-12)


def test_non_finite_value_reaches_later_outputs_only():
  """A NaN in v at token 21 (chunk 1 starts at 16): outputs before it unchanged, from it on
  NaN; the final state NaN."""
  args = _inputs(2, np.float32)
  cfg = KernelConfig(chunk_size=C)
  fn = jax.jit(lambda *a: state_path(*a, config=cfg, interpret=INTERPRET))
  o, S = fn(*args)
  bad = list(args)
  bad[3] = bad[3].at[0, 21, 5].set(jnp.nan)
  o_n, S_n = fn(*bad)
  np.testing.assert_array_equal(o_n[0, :21], o[0, :21])
  np.testing.assert_array_equal(o_n[1], o[1])
  assert np.isnan(np.asarray(o_n[0, 21:])).any(axis=-1).all()
  assert np.isnan(np.asarray(S_n[0])).any()


@pytest.mark.parametrize("kw,match", [(dict(T=24), "multiple of chunk_size"),
                                      (dict(heads=3), "heads")])
def test_bad_arguments_raise(kw, match):
  x = jnp.zeros((2, kw.get("T", 32), 16))
  with pytest.raises(ValueError, match=match):
    state_path(x, x, x, x, jnp.zeros((2, 16, 16)), config=KernelConfig(chunk_size=16),
               heads=kw.get("heads"))

