"""`deltanet_pallas`, `gated_deltanet_pallas` and `linear_attention_pallas` (the state path's
kernels on DeltaNet's and linear attention's keys, with Gated DeltaNet's decays) against the
float64 oracles: outputs, final state and the gradients of q, k, v, beta, the log decays and
S0 (autodiff of a float64 step-by-step loop), in float32 and bfloat16, on anisotropic keys
with a ragged tail (T not a multiple of the chunk); Gated DeltaNet also with a hard reset
(-inf), a -1e4 decay and every form of the state loops; DeltaNet also with packed
documents."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from kernel_checks import INTERPRET, TOL, anisotropic_u, assert_close, rel
from vla_jax.kernels import KernelConfig
from vla_jax.kernels import config as kernel_config
from vla_jax.kernels.delta_rule import (deltanet_pallas, gated_deltanet_pallas,
                                        linear_attention_pallas)

B, T, H, dk, dv, C = 1, 75, 2, 16, 32, 16
CONFIG = KernelConfig(chunk_size=C)


def _inputs(seed):
  """q, k, v, beta, S0 (float64 NumPy): keys anisotropic (rank 4 plus 1% noise: nearly
  parallel keys make (I + N) far from I), beta in (0.05, 1), linear attention's keys > 0."""
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, T, H, dk)) / 2
  k = np.swapaxes(anisotropic_u(rng, B, H, T, dk), 1, 2) * np.sqrt(dk)
  v = rng.standard_normal((B, T, H, dv))
  beta = rng.uniform(0.05, 1.0, (B, T, H))
  S0 = rng.standard_normal((B, H, dv, dk)) / 4
  log_decay = -rng.uniform(0.0, 0.3, (B, T, H))
  log_decay[0, 30, 0], log_decay[0, 50, 1] = -np.inf, -1e4      # a reset, a near-reset
  return q, k, v, beta, log_decay, S0


def _elu1(x):
  return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))


def _deltanet_loop(q, k, v, beta, S0, starts=None):
  """DeltaNet step by step (float64 JAX, to differentiate); starts: None, or [B, T] bool
  document starts (S restarts at 0 there)."""
  khat = k / jnp.maximum(jnp.linalg.norm(k, axis=-1, keepdims=True), 1e-6)
  starts = jnp.zeros(q.shape[:2], bool) if starts is None else jnp.asarray(starts)

  def step(S, x):
    q_t, k_t, v_t, b_t, s_t = x
    S = jnp.where(s_t[:, None, None, None], 0.0, S)
    S = S + b_t[..., None, None] * jnp.einsum(
        "bhv,bhk->bhvk", v_t - jnp.einsum("bhvk,bhk->bhv", S, k_t), k_t)
    return S, jnp.einsum("bhvk,bhk->bhv", S, q_t)
  S, o = jax.lax.scan(step, S0, tuple(jnp.swapaxes(x, 0, 1)
                                      for x in (q, khat, v, beta, starts)))
  return jnp.swapaxes(o, 0, 1), S


def _gated_loop(q, k, v, beta, log_decay, S0):
  """Gated DeltaNet step by step (float64 JAX, to differentiate)."""
  khat = k / jnp.maximum(jnp.linalg.norm(k, axis=-1, keepdims=True), 1e-6)

  def step(S, x):
    q_t, k_t, v_t, b_t, g_t = x
    S = jnp.exp(g_t)[..., None, None] * S
    S = S + b_t[..., None, None] * jnp.einsum(
        "bhv,bhk->bhvk", v_t - jnp.einsum("bhvk,bhk->bhv", S, k_t), k_t)
    return S, jnp.einsum("bhvk,bhk->bhv", S, q_t)
  S, o = jax.lax.scan(step, S0, tuple(jnp.swapaxes(x, 0, 1)
                                      for x in (q, khat, v, beta, log_decay)))
  return jnp.swapaxes(o, 0, 1), S


def _linear_loop(q, k, v, S0):
  def step(S, x):
    q_t, k_t, v_t = x
    S = S + jnp.einsum("bhv,bhk->bhvk", v_t, k_t)
    return S, jnp.einsum("bhvk,bhk->bhv", S, q_t)
  S, o = jax.lax.scan(step, S0, tuple(jnp.swapaxes(x, 0, 1) for x in (q, k, v)))
  return jnp.swapaxes(o, 0, 1), S


OPS = {
    # name: (kernel fn on the op's args, float64 loop, oracle (o, S), args from _inputs)
    "deltanet": (functools.partial(deltanet_pallas, config=CONFIG, interpret=INTERPRET),
                 _deltanet_loop,
                 lambda q, k, v, beta, S0: oracles.gated_deltanet(q, k, v, beta, S0=S0),
                 lambda q, k, v, beta, g, S0: (q, k, v, beta, S0)),
    "gated_deltanet": (
        functools.partial(gated_deltanet_pallas, config=CONFIG, interpret=INTERPRET),
        _gated_loop,
        lambda q, k, v, beta, g, S0: oracles.gated_deltanet(q, k, v, beta, g, S0=S0),
        lambda q, k, v, beta, g, S0: (q, k, v, beta, g, S0)),
    "linear_attention": (
        functools.partial(linear_attention_pallas, config=CONFIG, interpret=INTERPRET),
        _linear_loop,
        lambda q, k, v, S0: oracles.delta_rule(q, np.zeros_like(k), k, v, S0),
        lambda q, k, v, beta, g, S0: (np.asarray(_elu1(q)), np.asarray(_elu1(k)), v, S0)),
}


def _loss(fn, seed):
  rng = np.random.default_rng(seed)
  wo = rng.standard_normal((B, T, H, dv))
  wS = rng.standard_normal((B, H, dv, dk))
  return lambda *a: (lambda o, S: jnp.sum(wo * o.astype(jnp.float32 if o.dtype == jnp.bfloat16
                                                             else o.dtype))
                     + jnp.sum(wS * S))(*fn(*a))


def _cast(op, dtype):
  """The op's kernel arguments from `_inputs(1)`: token inputs in dtype, the rest float32."""
  args = OPS[op][3](*_inputs(1))
  return ([jnp.asarray(x, dtype) for x in args[:3]]
          + [jnp.asarray(x, jnp.float32) for x in args[3:]])


@pytest.fixture(scope="module")
def kernel_runs():
  """{(op, dtype name): ((o, S), the gradients of `_loss(kernel, 2)`)} of every op's kernel
  in float32 and bfloat16: one jitted program per dtype, in which XLA:CPU compiles the
  kernels that the ops share (the state path's) once."""
  runs = {}
  for dtype in (jnp.float32, jnp.bfloat16):
    kernels = {op: OPS[op][0] for op in OPS}
    args = {op: _cast(op, dtype) for op in kernels}

    def run(args, kernels=kernels):
      return {key: (kernel(*args[key]),
                    jax.grad(_loss(kernel, 2), argnums=range(len(args[key])))(*args[key]))
              for key, kernel in kernels.items()}
    runs.update({(key, jnp.dtype(dtype).name): out
                 for key, out in jax.jit(run)(args).items()})
  return runs


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("op", list(OPS))
def test_outputs_state_and_gradients_match_float64(kernel_runs, op, dtype):
  _match_float64(op, dtype, kernel_runs[op, jnp.dtype(dtype).name])


def _match_float64(op, dtype, run):
  """The op's Pallas kernel (`OPS`, `kernel_runs`) in `dtype` against the float64 oracle
  (o, S) and the float64 loop's gradients, on the rounded inputs: float32 element-wise,
  bfloat16 gradients in norm."""
  _, loop, oracle, _ = OPS[op]
  state = jnp.float32
  cast = _cast(op, dtype)
  exact = [np.asarray(x, np.float64) for x in cast]     # the rounded inputs, in float64
  n = len(cast)
  (o, S), grads = run
  assert o.dtype == dtype and S.dtype == state
  o_ref, S_ref = oracle(*exact)
  assert_close(o, o_ref, dtype, "o")
  assert_close(S, S_ref, dtype, "S")
  with jax.enable_x64(True):
    want = jax.jit(jax.grad(_loss(loop, 2), argnums=range(n)))(*map(jnp.asarray, exact))
  names = {"deltanet": ("q", "k", "v", "beta", "S0"),
           "gated_deltanet": ("q", "k", "v", "beta", "log_decay", "S0"),
           "linear_attention": ("q", "k", "v", "S0")}[op]
  # The measured errors, for the record (`pytest -s`): relative to the oracle's norm.
  print(op, jnp.dtype(dtype).name, {"o": rel(o, o_ref), "S": rel(S, S_ref),
                                    **{"d" + k: rel(g, r) for k, g, r in zip(names, grads, want)}})
  for name, g, r in zip(names, grads, want):
    if dtype == jnp.float32:
      assert_close(g, r, dtype, "d" + name)
    else:
      # bfloat16: in norm (5e-3 measured). Element-wise, dk is a difference of bfloat16-
      # rounded terms where the unit-key VJP projects out the key direction, which
      # anisotropic keys make nearly cancel (one entry of 2,400 at 3% of the RMS).
      assert rel(g, r) < 1e-2, ("d" + name, rel(g, r))


@pytest.mark.parametrize("dtype", [np.float64, jnp.bfloat16], ids=["f64", "bf16"])
def test_packed_documents(dtype):
  """DeltaNet with packed documents (documents starting inside chunks, at chunk boundaries
  (tokens 16 and 64), a one-token document, one spanning two chunks): o against the oracle on
  each document alone (the first from S0, the others from zero), the final state (the last
  document's), and the gradients of q, k, v, beta and S0 against the float64 loop that
  restarts S at every document start; float64 within its tolerance, bfloat16 within its
  tolerance (gradients in norm)."""
  q, k, v, beta, _, S0 = _inputs(6)
  ids = np.zeros((B, T), np.int32)
  for t in (5, 16, 40, 41, 64):
    ids[:, t:] += 1
  starts = np.zeros((B, T), bool)
  starts[:, [5, 16, 40, 41, 64]] = True
  kernel = lambda *a: deltanet_pallas(*a, segment_ids=jnp.asarray(ids), config=CONFIG,
                                      interpret=INTERPRET)
  state = np.float64 if dtype == np.float64 else np.float32
  with jax.enable_x64(dtype == np.float64):
    cast = [jnp.asarray(x, dtype) for x in (q, k, v)] + [jnp.asarray(x, state)
                                                         for x in (beta, S0)]
    (o, S), grads = jax.jit(lambda *a: (kernel(*a), jax.grad(_loss(kernel, 7),
                                                             argnums=range(5))(*a)))(*cast)
  exact = [np.asarray(x, np.float64) for x in cast]
  o_ref = np.zeros(o.shape)
  bounds = [0, 5, 16, 40, 41, 64, T]
  for s, e in zip(bounds[:-1], bounds[1:]):
    init = exact[4] if s == 0 else np.zeros_like(exact[4])
    o_ref[:, s:e], S_ref = oracles.gated_deltanet(*(x[:, s:e] for x in exact[:4]), S0=init)
  assert_close(o, o_ref, dtype, "o")
  assert_close(S, S_ref, dtype, "S")
  with jax.enable_x64(True):
    loop = lambda *a: _deltanet_loop(*a, starts=starts)
    want = jax.jit(jax.grad(_loss(loop, 7), argnums=range(5)))(*map(jnp.asarray, exact))
  for name, g, r in zip(("q", "k", "v", "beta", "S0"), grads, want):
    if dtype == np.float64:
      assert_close(g, r, dtype, "d" + name)
    else:
      assert rel(g, r) < TOL["bfloat16"], ("d" + name, rel(g, r))


def test_zero_key_tokens_write_nothing():
  """A token with a zero key (padding) writes nothing whatever its value and beta (NaN
  included): outputs and state equal those without it."""
  q, k, v, beta, _, S0 = (jnp.asarray(x, jnp.float32) for x in _inputs(3))
  k = k.at[:, 20].set(0.0)
  clean = deltanet_pallas(q, k, v, beta, S0, config=CONFIG, interpret=INTERPRET)
  bad = deltanet_pallas(q, k, v.at[:, 20].set(jnp.nan), beta.at[:, 20].set(jnp.inf), S0,
                        config=CONFIG, interpret=INTERPRET)
  for x, y in zip(clean, bad):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_unsupported_key_width_raises():
  x = jnp.zeros((1, 16, 2, 24))
  with pytest.raises(ValueError, match="dk \\(key/query head dim\\) must be one of"):
    deltanet_pallas(x, x, x, jnp.zeros((1, 16, 2)), jnp.zeros((1, 2, 24, 24)), config=CONFIG)


# Whether the form runs split state loops: the plan picks them below
# kernel_config.SPLIT_OUTPUT_BELOW and SPLIT_BWD_UP_TO programs.
LOOP_FORMS = {"fused_loops": False, "chain+parallel": True}


@pytest.fixture(scope="module")
def gated_forms():
  """({form: ((o, S), gradients)} of Gated DeltaNet's kernel in every LOOP_FORMS form, traced
  with its plan settings into one jitted program (XLA:CPU compiles the kernels the forms
  share once); the float64 loop's (o, S) and gradients) on `_inputs(4)` in float64."""
  with jax.enable_x64(True):
    args = [jnp.asarray(x) for x in _inputs(4)]
    kernel = functools.partial(gated_deltanet_pallas, config=CONFIG, interpret=INTERPRET)

    def forms(*a):
      out = {}
      for form, split in LOOP_FORMS.items():
        with pytest.MonkeyPatch.context() as patch:
          patch.setattr(kernel_config, "SPLIT_OUTPUT_BELOW", 10 ** 6 if split else 0)
          patch.setattr(kernel_config, "SPLIT_BWD_UP_TO", 10 ** 6 if split else 0)
          out[form] = (kernel(*a), jax.grad(_loss(kernel, 5), argnums=range(6))(*a))
      return out
    loop = jax.jit(lambda *a: (_gated_loop(*a), jax.grad(_loss(_gated_loop, 5),
                                                         argnums=range(6))(*a)))
    return jax.jit(forms)(*args), loop(*args)


@pytest.mark.parametrize("form", list(LOOP_FORMS))
def test_gated_every_state_loop_form_float64(x64, gated_forms, form):
  """Gated DeltaNet through the fused forward and reverse loops and through the chain kernels
  with their parallel per-chunk kernels (the plan picks by program count): float64 outputs,
  state and gradients equal the float64 loop's."""
  (o, S), grads = gated_forms[0][form]
  (o_ref, S_ref), want = gated_forms[1]
  assert_close(o, o_ref, jnp.float64, "o")
  assert_close(S, S_ref, jnp.float64, "S")
  for name, g, r in zip(("q", "k", "v", "beta", "log_decay", "S0"), grads, want):
    assert_close(g, r, jnp.float64, "d" + name)
