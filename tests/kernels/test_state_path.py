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


@pytest.mark.parametrize("split", [True, False], ids=["chain+outputs", "fused"])
def test_forward_float64(x64, split):
  """Every forward form: the chain kernel plus the parallel output kernel, and one loop."""
  args = _inputs(0)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, T // C,
                  split_output=split)
  o, S = jax.jit(lambda *a: planned_state_path(plan, *a, None))(*args)
  o_ref, S_ref = state_path_np(*args)
  assert_close(o, o_ref, jnp.float64, "o")
  assert_close(S, S_ref, jnp.float64, "S")


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
  NaN; the final state NaN (the chain kernel at these program counts)."""
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

