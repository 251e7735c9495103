"""One-token steps: prefill with a sequence op, then decode with steps, equals one full pass."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from conftest import random_inputs, rel_err
from vla_jax import (LinearAttentionState, VLAState, deltanet, gated_deltanet, initial_vla_state,
                     linear_attention, vla_recurrence)
from vla_jax.ops.checks import MIN_LAM0_FLOAT32
from vla_jax.ops.step import (deltanet_step, gated_deltanet_step, linear_attention_step,
                              vla_step)

B, T, H, DK, DV, PROMPT = 2, 23, 2, 8, 5, 17


def decode(step, state, *tokens):
  """Runs `step` over the time axis of `tokens` ([B, T, ...]) with `lax.scan`."""
  def body(state, xs):
    o_t, state = step(state, *xs)
    return state, o_t
  state, o = jax.lax.scan(body, state, [jnp.moveaxis(x, 1, 0) for x in tokens])
  return jnp.moveaxis(o, 0, 1), state


def inputs(dtype):
  q, k, v, u = random_inputs(21, B, T, H, DK, DV, dtype)
  rng = np.random.default_rng(22)
  beta = rng.uniform(0.1, 1.0, (B, T, H)).astype(dtype)
  log_decay = -rng.uniform(0.0, 0.2, (B, T, H)).astype(dtype)
  return q, k, v, u, beta, log_decay


def full_pass(name, q, k, v, u, beta, log_decay):
  """The float64 NumPy oracle of op `name` over the whole sequence: (o, final state)."""
  if name in ("vla", "vla_beta"):
    o, S, A = oracles.vla(q, k, v, u, beta=beta if name == "vla_beta" else None)
    return o, VLAState(S, A)
  if name == "linear_attention":
    o, S, z = oracles.linear_attention(q, k, v, normalize=True)
    return o, LinearAttentionState(S, z)
  return oracles.gated_deltanet(q, k, v, beta, log_decay if name == "gated_deltanet" else None)


CASES = {
    "vla": (lambda q, k, v, u, b, g, **kw: vla_recurrence(q, k, v, u, **kw),
            lambda s, q, k, v, u, b, g: vla_step(s, q, k, v, u)),
    "vla_beta": (lambda q, k, v, u, b, g, **kw: vla_recurrence(q, k, v, u, b, **kw),
                 lambda s, q, k, v, u, b, g: vla_step(s, q, k, v, u, b)),
    "linear_attention": (
        lambda q, k, v, u, b, g, **kw: linear_attention(q, k, v, normalize=True, **kw),
        lambda s, q, k, v, u, b, g: linear_attention_step(s, q, k, v, normalize=True)),
    "deltanet": (lambda q, k, v, u, b, g, **kw: deltanet(q, k, v, b, **kw),
                 lambda s, q, k, v, u, b, g: deltanet_step(s, q, k, v, b)),
    "gated_deltanet": (lambda q, k, v, u, b, g, **kw: gated_deltanet(q, k, v, b, g, **kw),
                       lambda s, q, k, v, u, b, g: gated_deltanet_step(s, q, k, v, b, g)),
}


def prefill_then_steps(xs):
  """For every op of CASES: the prompt xs[:, :PROMPT] by its chunked form, the rest by its
  steps: {name: (outputs of the prompt, of the steps, the final state)}. Jitted, one program
  for the ops (they share the delta-rule core's kernels, which XLA:CPU compiles once a
  program)."""
  prompt = [x[:, :PROMPT] for x in xs]
  rest = [x[:, PROMPT:] for x in xs]
  out = {}
  for name, (seq_op, step) in CASES.items():
    o_pre, state = seq_op(*prompt, impl="chunked", chunk_size=16)
    out[name] = (o_pre,) + decode(step, state, *rest)
  return out


@pytest.fixture(scope="module")
def step_runs():
  """{dtype name: (inputs, `prefill_then_steps` of them)} in float64 and float32."""
  runs = {}
  for dtype in (np.float64, np.float32):
    with jax.enable_x64(dtype == np.float64):
      xs = inputs(dtype)
      runs[np.dtype(dtype).name] = xs, jax.jit(prefill_then_steps)(xs)
  return runs


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)],
                         ids=["float64", "float32"])
def test_prefill_then_steps_equals_full_pass(step_runs, name, dtype, tol):
  """The prompt by the chunked op, the rest by steps: the outputs and final state of one pass
  over the whole sequence (the float64 oracle's; the chunked op's own: test_vla_recurrence,
  test_baselines)."""
  with jax.enable_x64(dtype == np.float64):
    xs, runs = step_runs[np.dtype(dtype).name]
    o_full, state_full = full_pass(name, *xs)
    o_pre, o_dec, state = runs[name]
    o = np.concatenate([o_pre, o_dec], axis=1)
    assert rel_err(o, o_full) < tol
    chex.assert_trees_all_close(state, jax.tree.map(lambda x: x.astype(dtype), state_full),
                                rtol=10 * tol, atol=10 * tol)
    chex.assert_trees_all_equal_shapes(state, state_full)


def test_vla_step_from_none_equals_initial_state():
  q, k, v, u, _, _ = inputs(np.float32)
  # Jitted: one compilation each rather than one per eager operation.
  o1, s1 = jax.jit(functools.partial(vla_step, None, lam0=2.0))(q[:, 0], k[:, 0], v[:, 0],
                                                                u[:, 0])
  o2, s2 = jax.jit(functools.partial(vla_recurrence, lam0=2.0))(q[:, :1], k[:, :1], v[:, :1],
                                                                 u[:, :1])
  # float32: the step and the chunked form round differently (XLA's CPU code differs between
  # machines; 1.7e-6 relative was seen on small entries of S), so the float32 bound of 1e-5.
  np.testing.assert_allclose(o1, o2[:, 0], rtol=1e-5)
  chex.assert_trees_all_close(s1, s2, rtol=1e-5)


def test_step_errors():
  q, k, v, u, beta, _ = inputs(np.float32)
  state = initial_vla_state(B, H, DK, DV)
  with pytest.raises(ValueError, match=r"q_t must have rank 3 \[B, H, D\] \(one token"):
    vla_step(state, q, k, v, u)
  with pytest.raises(ValueError, match=r"state.A must have shape \(2, 2, 8, 8\)"):
    vla_step(VLAState(state.S, state.A[:, :, :4, :4]), q[:, 0], k[:, 0], v[:, 0], u[:, 0])
  with pytest.raises(TypeError, match="state.S must be float32 or float64"):
    vla_step(VLAState(state.S.astype(jnp.bfloat16), state.A), q[:, 0], k[:, 0], v[:, 0],
             u[:, 0])
  with pytest.raises(TypeError, match="state must be a VLAState"):
    vla_step(tuple(state), q[:, 0], k[:, 0], v[:, 0], u[:, 0])
  with pytest.raises(ValueError, match=r"beta_t must have rank 2 \[B, H\]"):
    deltanet_step(None, q[:, 0], k[:, 0], v[:, 0], beta)
  # The Delta steps' state is their argument S.
  with pytest.raises(ValueError, match=r"^S must have shape \(2, 2, 5, 8\)"):
    deltanet_step(jnp.zeros((2, 2, 8, 5)), q[:, 0], k[:, 0], v[:, 0], beta[:, 0])
  with pytest.raises(TypeError, match="^S must be float32 or float64"):
    deltanet_step(jnp.zeros((2, 2, 5, 8), jnp.bfloat16), q[:, 0], k[:, 0], v[:, 0], beta[:, 0])
  # A positive log decay grows the state: refused as `gated_deltanet` refuses it.
  log_decay_t = jnp.full((B, H), -0.1).at[1, 0].set(0.5)
  with pytest.raises(ValueError, match=r"log_decay_t must be <= 0 .* got 0.5 at \[b, h\] = "
                                       r"\(1, 0\)"):
    gated_deltanet_step(None, q[:, 0], k[:, 0], v[:, 0], beta[:, 0], log_decay_t)
  with pytest.raises(ValueError, match="normalize must be True or False; got str 'no'"):
    linear_attention_step(None, q[:, 0], k[:, 0], v[:, 0], normalize="no")
  with pytest.raises(ValueError, match="eps must be a finite number > 0; got -1.0"):
    linear_attention_step(None, q[:, 0], k[:, 0], v[:, 0], normalize=True, eps=-1.0)


def test_vla_step_takes_the_scans_smallest_lam0():
  """The step is the scan's arithmetic, so it takes the scan's float32 lam0 floor: below it
  (lam0 = 1e-6, u scaled by 3: relative error 1.4 against float64 when stepped) is refused,
  as `vla_recurrence(..., impl="scan")` refuses it."""
  q, k, v, u, _, _ = inputs(np.float32)
  low = MIN_LAM0_FLOAT32["scan"]
  for call in (lambda: vla_step(None, q[:, 0], k[:, 0], v[:, 0], 3 * u[:, 0], lam0=1e-6),
               lambda: vla_recurrence(q, k, v, 3 * u, lam0=1e-6, impl="scan")):
    with pytest.raises(ValueError, match=rf"lam0=1e-06 is below {low:g}, the smallest "
                                         r"impl='scan' takes in float32"):
      call()


def test_pallas_prefill_then_vla_steps(x64):
  """Prefill with the Pallas kernel (interpret mode on CPU), decode with `vla_step`."""
  q, k, v, u = random_inputs(23, 1, 20, 2, 16, 16)
  o_full, state_full = jax.jit(functools.partial(vla_recurrence, impl="scan"))(q, k, v, u)
  o_pre, state = jax.jit(functools.partial(vla_recurrence, impl="pallas", chunk_size=16))(
      *(x[:, :12] for x in (q, k, v, u)))
  o_dec, state = jax.jit(functools.partial(decode, vla_step))(
      state, *(x[:, 12:] for x in (q, k, v, u)))
  assert rel_err(np.concatenate([o_pre, o_dec], axis=1), o_full) < 1e-9
  chex.assert_trees_all_close(state, state_full, rtol=1e-9, atol=1e-9)
