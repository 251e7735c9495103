"""`vla_pallas` end to end in interpret mode: against the float64 oracle (forward), against
`jax.grad` of impl="scan" in float64 (gradients), precision semantics, non-finite inputs."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from kernel_checks import INTERPRET, anisotropic_u, assert_close, rel, vla_inputs
from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels import config as kernel_config
from vla_jax.ops.vla import VLAState, vla_recurrence

# (B, T, H, dk, dv, C): T not a multiple of the chunk and more than one segment; dk != dv.
SHAPES = [(2, 37, 2, 16, 32, 16), (1, 70, 1, 32, 16, 32)]
shape_id = lambda s: "B{}T{}H{}dk{}dv{}C{}".format(*s)


# Each program is jitted once per configuration and takes the loss weights as arguments, so
# that the tests that run one (the reference gradient at a shape, the non-finite checks'
# forward and gradient) share its compilation.
def _jit_call(config):
  return jax.jit(lambda *a: vla_pallas(*a, config=config, interpret=INTERPRET))


_call = functools.cache(_jit_call)


def _weights(seed, B, T, H, dk, dv):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal(s)) for s in
               ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)))


def _loss(fn):
  def loss(w, *args):
    wo, wS, wA = w
    o, S, A = fn(*args)
    return (jnp.sum(wo.astype(jnp.float32) * o.astype(jnp.float32)).astype(S.dtype)
            + jnp.sum(wS * S) + jnp.sum(wA * A))
  return loss


def _scan(q, k, v, u, S0, A0):
  o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl="scan")
  return o, st.S, st.A


def _jit_grads(config):
  """The gradients of `_loss(w, *args)` in the six inputs: vla_pallas with `config`, or the
  reference impl="scan" for None."""
  fn = _scan if config is None else (
      lambda *a: vla_pallas(*a, config=config, interpret=INTERPRET))
  return jax.jit(jax.grad(_loss(fn), argnums=range(1, 7)))


_grads = functools.cache(_jit_grads)


def _sym(x):
  return 0.5 * (x + jnp.swapaxes(x, -1, -2))


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_forward_and_gradients_float64(x64, shape):
  """o, S_T, A_T against the token-by-token oracle; the gradients for all six inputs against
  `jax.grad` of impl="scan" (A0's over symmetric perturbations)."""
  B, T, H, dk, dv, C = shape
  args = vla_inputs(0, B, T, H, dk, dv)
  cfg = KernelConfig(chunk_size=C)
  o, S, A = _call(cfg)(*args)
  want = oracles.vla(*args[:4], S0=args[4], A0=args[5])
  chex.assert_shape(o, (B, T, H, dv))
  for name, got, ref in zip("oSA", (o, S, A), want):
    assert_close(got, ref, jnp.float64, name)
  w = _weights(1, B, T, H, dk, dv)
  got, ref = _grads(cfg)(w, *args), _grads(None)(w, *args)
  for name, g, r in zip(("q", "k", "v", "u", "S0", "A0"), got, ref):
    if name == "A0":
      g, r = _sym(g), _sym(r)
    assert_close(g, r, jnp.float64, "d" + name)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_forward_float32_and_bfloat16(dtype):
  """Float32 and bfloat16 inputs (float32 states) against the oracle on the same values."""
  B, T, H, dk, dv, C = SHAPES[1]
  args = vla_inputs(2, B, T, H, dk, dv, dtype)
  o, S, A = _call(KernelConfig(chunk_size=C))(*args)
  chex.assert_type(o, dtype)
  chex.assert_type([S, A], jnp.float32)
  want = oracles.vla(*(np.asarray(x, np.float64) for x in args[:4]),
                     S0=np.asarray(args[4], np.float64), A0=np.asarray(args[5], np.float64))
  for name, got, ref in zip("oSA", (o, S, A), want):
    assert_close(got, ref, dtype, name)


def test_fused_state_loops_float64(x64, monkeypatch):
  """The state forward and reverse pass as single loops (what the defaults select at GPU
  program counts: > 132 and > 512 programs), forward and gradients."""
  monkeypatch.setattr(kernel_config, "SPLIT_OUTPUT_BELOW", 0)
  monkeypatch.setattr(kernel_config, "SPLIT_BWD_UP_TO", 0)
  B, T, H, dk, dv, C = SHAPES[0]
  args = vla_inputs(3, B, T, H, dk, dv)
  cfg = KernelConfig(chunk_size=C)
  plan = cfg.plan(low=False, acc=jnp.float64, dk=dk, dv=dv, BH=B * H, N=3, interpret=True)
  assert not plan.split_output and not plan.split_backward
  # Traced here, with the split forms off (not the cached programs of this configuration).
  o, S, A = _jit_call(cfg)(*args)
  want = oracles.vla(*args[:4], S0=args[4], A0=args[5])
  for name, got, ref in zip("oSA", (o, S, A), want):
    assert_close(got, ref, jnp.float64, name)
  w = _weights(4, B, T, H, dk, dv)
  got, ref = _jit_grads(cfg)(w, *args), _grads(None)(w, *args)
  for name, g, r in zip(("q", "k", "v", "u", "S0", "A0"), got, ref):
    if name == "A0":
      g, r = _sym(g), _sym(r)
    assert_close(g, r, jnp.float64, "d" + name)


def test_highest_removes_bfloat16_rounding():
  """bfloat16 inputs: DEFAULT rounds product operands and the inference factors to bfloat16
  (error ~1e-3 on exact bf16 values); HIGHEST computes in float32 (~1e-6)."""
  B, T, H, dk, dv, C = SHAPES[1]
  args = vla_inputs(5, B, T, H, dk, dv, jnp.bfloat16)
  want = oracles.vla(*(np.asarray(x, np.float64) for x in args[:4]),
                     S0=np.asarray(args[4], np.float64), A0=np.asarray(args[5], np.float64))
  errs = {}
  for p in ("DEFAULT", "HIGHEST"):
    cfg = KernelConfig(chunk_size=C, precision=getattr(jax.lax.Precision, p))
    _, S, A = _call(cfg)(*args)
    errs[p] = max(rel(S, want[1]), rel(A, want[2]))
  assert errs["HIGHEST"] < 2e-5 < 1e-4 < errs["DEFAULT"] < 3e-2, errs


def test_float32_highest_exact_at_long_T_anisotropic():
  """float32 at HIGHEST, B = H = 1, T = 2048: the plan cuts the sequence into 128 one-chunk
  segments; anisotropic u and A0 = 100 I give cond(M_T) ~ 2e4. o, S_T, A_T match the
  float64 oracle (exact segment starts) within 2e-6 (the state path's own float32 error is
  ~1e-6); with direct float32 starts they err by ~1e-4."""
  B, T, H, d, C = 1, 2048, 1, 16, 16
  args = vla_inputs(6, B, T, H, d, d, np.float32)
  u = anisotropic_u(np.random.default_rng(6), B, H, T, d)
  args[3] = jnp.asarray(np.swapaxes(u, 1, 2), jnp.float32)
  args[5] = jnp.asarray(100 * np.eye(d)[None, None], jnp.float32)
  o, S, A = _call(KernelConfig(chunk_size=C, precision=jax.lax.Precision.HIGHEST))(*args)
  want = oracles.vla(*(np.asarray(x, np.float64) for x in args[:4]),
                     S0=np.asarray(args[4], np.float64), A0=np.asarray(args[5], np.float64))
  errors = [rel(got, ref) for got, ref in zip((o, S, A), want)]
  assert max(errors) < 2e-6, errors


@functools.cache
def _grads_before(config, t):
  """The gradients in the six inputs of sum(wo * o[:, :t]), jitted."""
  loss = lambda wo, *a: jnp.sum(wo * vla_pallas(*a, config=config, interpret=INTERPRET)[0][:, :t])
  return jax.jit(jax.grad(loss, argnums=range(1, 7)))


@pytest.mark.parametrize("bad", ["k", "v", "u", "q"])
def test_non_finite_input_stays_later(bad):
  """A NaN at token t (in the middle of a chunk, with earlier tokens in the same chunk)
  leaves every output before t and, for a loss on them, every gradient before t equal to the
  clean run's; the outputs from t on (for q: at t) are non-finite."""
  B, T, H, dk, dv, C = 1, 40, 1, 16, 16, 16
  t = 21                                        # chunk 1 holds tokens 16..31
  args = vla_inputs(6, B, T, H, dk, dv, np.float32)
  cfg = KernelConfig(chunk_size=C)
  fwd = _call(cfg)
  which = "qkvu".index(bad)
  nan_args = list(args)
  nan_args[which] = nan_args[which].at[:, t, :, 0].set(jnp.nan)
  clean, poisoned = fwd(*args), fwd(*nan_args)
  np.testing.assert_array_equal(poisoned[0][:, :t], clean[0][:, :t])
  later = poisoned[0][:, t] if bad == "q" else poisoned[0][:, t:]
  assert not np.isfinite(np.asarray(later)).all()
  assert np.isfinite(np.asarray(poisoned[0][:, t + 1:])).all() == (bad == "q")
  wo = jnp.asarray(np.random.default_rng(7).standard_normal((B, t, H, dv)), jnp.float32)
  grad = _grads_before(cfg, t)
  g_clean, g_nan = grad(wo, *args), grad(wo, *nan_args)
  for name, gc, gn in zip(("q", "k", "v", "u", "S0", "A0"), g_clean, g_nan):
    gc, gn = (np.asarray(x) for x in (gc, gn))
    if gc.ndim == 4:       # per token: before t
      gc, gn = gc[:, :t], gn[:, :t]
    np.testing.assert_array_equal(gn, gc, err_msg=f"d{name}")


def test_impl_pallas_uses_interpret_on_cpu():
  args = vla_inputs(8, 1, 20, 1, 16, 16, np.float32)[:4]
  o, st = jax.jit(lambda *a: vla_recurrence(*a, impl="pallas", chunk_size=16))(*args)
  o_ref, st_ref = jax.jit(lambda *a: vla_recurrence(*a, impl="chunked", chunk_size=16))(*args)
  assert rel(o, o_ref) < 1e-5 and rel(st.S, st_ref.S) < 1e-5 and rel(st.A, st_ref.A) < 1e-5


@pytest.mark.parametrize("dk,dv,C,block_v,match", [
    (24, 16, 16, None, "dk"), (16, 48, 16, None, "dv"), (16, 16, 256, None, "chunk_size"),
    (16, 32, 16, 8, "block_v")])
def test_unsupported_shapes_raise(dk, dv, C, block_v, match):
  q, v = jnp.zeros((1, 16, 1, dk)), jnp.zeros((1, 16, 1, dv))
  with pytest.raises(ValueError, match=match):
    vla_pallas(q, q, v, q, jnp.zeros((1, 1, dv, dk)), jnp.eye(dk)[None, None],
               config=KernelConfig(chunk_size=C, block_v=block_v))
