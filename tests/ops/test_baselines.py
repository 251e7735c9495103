"""Linear attention, DeltaNet and Gated DeltaNet: every impl against float64 NumPy oracles,
state hand-over, gradients across impls and input validation. The Pallas impls (interpret
mode here) on one ragged shape; tests/kernels/test_delta_rule.py checks their kernels in
float32 and bfloat16."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from conftest import random_inputs, rel_err
from vla_jax import (LinearAttentionState, deltanet, gated_deltanet, linear_attention)

IMPLS = ["scan", "associative_scan", "chunked"]
SHAPES = [(2, 37, 3, 8, 5, 16), (1, 64, 2, 16, 16, 32), (1, 6, 1, 4, 3, 64)]
SHAPE_IDS = ["B{}T{}H{}dk{}dv{}C{}".format(*s) for s in SHAPES]
# (shape, impl): T a multiple of the chunk (SHAPES[1]) matters to "chunked" only; the other
# impls take no chunk size and run on the other two shapes.
CASES = [pytest.param(shape, impl, id=f"{shape_id}-{impl}")
         for shape, shape_id in zip(SHAPES, SHAPE_IDS) for impl in IMPLS
         if impl == "chunked" or shape != SHAPES[1]]


def gates(seed, B, T, H, dtype=np.float64):
  rng = np.random.default_rng(seed)
  beta = rng.uniform(0.05, 1.0, (B, T, H)).astype(dtype)
  log_decay = -rng.uniform(0.0, 0.3, (B, T, H)).astype(dtype)
  return beta, log_decay


def jitted(fn, impl, chunk_size, **kw):
  return jax.jit(functools.partial(fn, impl=impl, chunk_size=chunk_size, **kw))


@pytest.mark.parametrize("shape,impl", CASES)
@pytest.mark.parametrize("normalize", [False, True])
def test_linear_attention_matches_oracle(x64, shape, impl, normalize):
  B, T, H, dk, dv, C = shape
  q, k, v, _ = random_inputs(1, B, T, H, dk, dv)
  o_ref, S_ref, z_ref = oracles.linear_attention(q, k, v, normalize=normalize)
  o, state = jitted(linear_attention, impl, C, normalize=normalize)(q, k, v)
  chex.assert_shape(o, (B, T, H, dv))
  assert rel_err(o, o_ref) < 1e-10
  assert rel_err(state.S, S_ref) < 1e-10
  assert rel_err(state.z, z_ref) < 1e-10


@pytest.mark.parametrize("shape,impl", CASES)
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated_deltanet"])
def test_deltanets_match_oracle(x64, shape, impl, gated):
  B, T, H, dk, dv, C = shape
  q, k, v, _ = random_inputs(2, B, T, H, dk, dv)
  beta, log_decay = gates(3, B, T, H)
  if gated:
    o_ref, S_ref = oracles.gated_deltanet(q, k, v, beta, log_decay)
    o, S = jitted(gated_deltanet, impl, C)(q, k, v, beta, log_decay)
  else:
    o_ref, S_ref = oracles.gated_deltanet(q, k, v, beta)
    o, S = jitted(deltanet, impl, C)(q, k, v, beta)
  chex.assert_shape(S, (B, H, dv, dk))
  assert rel_err(o, o_ref) < 1e-10
  assert rel_err(S, S_ref) < 1e-10


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_hard_resets_and_large_decays_match_oracle(impl, dtype, tol):
  """log_decay = -inf (a reset) and -1e4 at single tokens, with the chunked form's chunk
  boundaries elsewhere: finite and equal to the float64 oracle (the chunked form floors each
  token's log decay at 2 log(eps), a reset to working precision). The shapes of
  test_deltanets_match_oracle's first case and of test_float32_matches_oracle (their programs,
  compiled once)."""
  B, T, H, dk, dv, _ = SHAPES[0] if dtype == np.float64 else (2, 45, 2, 16, 8, 16)
  with jax.enable_x64(dtype == np.float64):
    q, k, v, _ = random_inputs(6, B, T, H, dk, dv, dtype)
    beta, log_decay = gates(7, B, T, H, dtype)
    log_decay[:, 10, 0] = -np.inf
    log_decay[:, 21, 1] = -1e4
    o_ref, S_ref = oracles.gated_deltanet(*(x.astype(np.float64) for x in (q, k, v, beta,
                                                                          log_decay)))
    o, S = jitted(gated_deltanet, impl, 16)(q, k, v, beta, log_decay)
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(S)).all()
    assert rel_err(o, o_ref) < tol and rel_err(S, S_ref) < tol


@pytest.mark.parametrize("impl", IMPLS)
def test_float32_matches_oracle(impl):
  q, k, v, _ = random_inputs(4, 2, 45, 2, 16, 8, np.float32)
  beta, log_decay = gates(5, 2, 45, 2, np.float32)
  o_ref, S_ref = oracles.gated_deltanet(q, k, v, beta, log_decay)
  o, S = jitted(gated_deltanet, impl, 16)(q, k, v, beta, log_decay)
  chex.assert_type([o, S], jnp.float32)
  assert rel_err(o, o_ref) < 1e-5 and rel_err(S, S_ref) < 1e-5
  o_ref, S_ref, _ = oracles.linear_attention(q, k, v, normalize=True)
  o, state = jitted(linear_attention, impl, 16, normalize=True)(q, k, v)
  assert rel_err(o, o_ref) < 1e-5 and rel_err(state.S, S_ref) < 1e-5


def test_split_sequence_equals_one_call(x64):
  """Two calls, the second from the state the first returns: the outputs and final state of
  one call over the whole sequence (the float64 oracle's)."""
  q, k, v, _ = random_inputs(6, 1, 40, 2, 8, 4)
  beta, log_decay = gates(7, 1, 40, 2)
  first, second = slice(None, 20), slice(20, None)   # halves of one shape: one compilation
  gdn = jax.jit(gated_deltanet)  # the default impl, compiled per shape
  lin = jax.jit(functools.partial(linear_attention, normalize=True))
  o, S = oracles.gated_deltanet(q, k, v, beta, log_decay)
  o1, S1 = gdn(*(x[:, first] for x in (q, k, v, beta, log_decay)),
               initial_state=np.zeros_like(S))
  o2, S2 = gdn(*(x[:, second] for x in (q, k, v, beta, log_decay)), initial_state=S1)
  np.testing.assert_allclose(np.concatenate([o1, o2], 1), o, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(S2, S, rtol=1e-10)
  o, S, z = oracles.linear_attention(q, k, v, normalize=True)
  o1, st1 = lin(q[:, first], k[:, first], v[:, first],
                initial_state=LinearAttentionState(np.zeros_like(S), np.zeros_like(z)))
  o2, st2 = lin(q[:, second], k[:, second], v[:, second], initial_state=st1)
  np.testing.assert_allclose(np.concatenate([o1, o2], 1), o, rtol=1e-10)
  chex.assert_trees_all_close(st2, LinearAttentionState(S, z), rtol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_float64_state_computes_in_float64_with_float32_inputs(x64, impl):
  """As `vla_recurrence`: float32 tokens from a float64 initial state give a float64 final
  state, the float64 oracle's (the state was cast down to float32 before)."""
  q, k, v, _ = random_inputs(8, 1, 20, 2, 4, 3)
  beta, log_decay = gates(9, 1, 20, 2)
  f32 = lambda *xs: tuple(np.asarray(x, np.float32) for x in xs)
  q, k, v, beta, log_decay = f32(q, k, v, beta, log_decay)
  S0 = np.random.default_rng(10).standard_normal((1, 2, 3, 4))
  z0 = np.abs(np.random.default_rng(11).standard_normal((1, 2, 4)))
  for fn, args, state in (
      (gated_deltanet, (q, k, v, beta, log_decay), S0),
      (deltanet, (q, k, v, beta), S0),
      (linear_attention, (q, k, v), LinearAttentionState(S0, z0))):
    _, got = fn(*args, impl=impl, chunk_size=16, initial_state=state)
    _, want = fn(*(x.astype(np.float64) for x in args), impl=impl, chunk_size=16,
                 initial_state=state)
    chex.assert_trees_all_equal_dtypes(got, want)
    chex.assert_trees_all_close(got, want, rtol=1e-12)


def test_gradients_agree_across_impls(x64):
  q, k, v, _ = random_inputs(8, 1, 21, 2, 6, 5)
  beta, log_decay = gates(9, 1, 21, 2)
  def loss(impl):
    def f(q, k, v, beta, log_decay):
      o, S = gated_deltanet(q, k, v, beta, log_decay, impl=impl, chunk_size=16)
      o2, st = linear_attention(q, k, v, normalize=True, impl=impl, chunk_size=16)
      return jnp.sum(jnp.sin(o)) + jnp.sum(S ** 2) + jnp.sum(jnp.cos(o2)) + jnp.sum(st.z)
    return jax.jit(jax.grad(f, argnums=tuple(range(5))))
  ref = loss("scan")(q, k, v, beta, log_decay)
  for impl in IMPLS[1:]:
    for name, g, g_ref in zip(["q", "k", "v", "beta", "log_decay"],
                              loss(impl)(q, k, v, beta, log_decay), ref):
      assert rel_err(g, g_ref) < 1e-9, (impl, name)


def test_validation():
  q, k, v, _ = random_inputs(0, 1, 8, 2, 4, 3, np.float32)
  beta, log_decay = gates(0, 1, 8, 2, np.float32)
  with pytest.raises(ValueError, match="beta has T="):
    deltanet(q, k, v, beta[:, :4])
  with pytest.raises(ValueError, match=r"log_decay must have rank 3 \[B, T, H\]"):
    gated_deltanet(q, k, v, beta, log_decay[..., None])
  with pytest.raises(ValueError, match="impl='auto' is not available here"):
    deltanet(q, k, v, beta, impl="auto")
  with pytest.raises(TypeError, match="k must have a floating dtype"):
    linear_attention(q, k.astype(np.int8), v)
  with pytest.raises(ValueError, match=r"initial_state.z must have shape \(1, 2, 4\)"):
    linear_attention(q, k, v, initial_state=LinearAttentionState(jnp.zeros((1, 2, 3, 4)),
                                                                  jnp.zeros((1, 2, 3))))
  with pytest.raises(ValueError, match=r"initial_state must have shape \(1, 2, 3, 4\)"):
    deltanet(q, k, v, beta, initial_state=jnp.zeros((1, 2, 4, 3)))
  with pytest.raises(TypeError, match=r"initial_state must be an array of shape \(1, 2, 3, 4\) "
                                      r"\(float32 or float64\); got tuple"):
    deltanet(q, k, v, beta, initial_state=(jnp.zeros((1, 2, 3, 4)),))
  # normalize is a bool (bool("no") would normalise), eps a finite number > 0.
  with pytest.raises(ValueError, match="normalize must be True or False; got str 'no'"):
    linear_attention(q, k, v, normalize="no")
  for eps in (-1.0, 0.0, float("inf")):
    with pytest.raises(ValueError, match=rf"eps must be a finite number > 0; got {eps}"):
      linear_attention(q, k, v, normalize=True, eps=eps)
  with pytest.raises(ValueError, match="eps must be a real number .* got str 'x'"):
    linear_attention(q, k, v, normalize=True, eps="x")
  # A positive log decay grows the state (outputs 1.5e13 at +0.5, NaN at +5 before).
  with pytest.raises(ValueError, match=r"log_decay must be <= 0 .* got 0.5 at \[b, t, h\] = "
                                       r"\(0, 3, 1\)"):
    gated_deltanet(q, k, v, beta, jnp.asarray(log_decay).at[0, 3, 1].set(0.5))


@pytest.mark.parametrize("impl", IMPLS)
def test_linear_attention_feature_map_may_change_the_width(x64, impl):
  """A feature map dk -> 2 dk: the state is [.., dv, 2 dk], the output equals raw linear
  attention on the mapped q, k, and the one-token step agrees; a map that changes another dim
  is an error naming feature_map."""
  from vla_jax.ops.step import linear_attention_step  # pylint: disable=import-outside-toplevel
  fm = lambda x: jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], -1)
  q, k, v, _ = random_inputs(11, 2, 19, 2, 4, 3)
  o, state = jitted(linear_attention, impl, 16, feature_map=fm, normalize=True)(q, k, v)
  fq, fk = np.asarray(fm(q)), np.asarray(fm(k))       # the reference: a loop in float64
  S_ref, z, o_ref = np.zeros((2, 2, 3, 8)), np.zeros((2, 2, 8)), np.zeros(v.shape)
  for t in range(q.shape[1]):
    S_ref = S_ref + np.einsum("bhv,bhk->bhvk", v[:, t], fk[:, t])
    z = z + fk[:, t]
    o_ref[:, t] = (np.einsum("bhvk,bhk->bhv", S_ref, fq[:, t])
                   / np.maximum(np.einsum("bhk,bhk->bh", z, fq[:, t]), 1e-6)[..., None])
  chex.assert_shape(state.S, (2, 2, 3, 8))
  assert rel_err(o, o_ref) < 1e-10 and rel_err(state.S, S_ref) < 1e-10
  # Jitted: one step program (eagerly, each operation compiles on its own).
  step = jax.jit(functools.partial(linear_attention_step, feature_map=fm, normalize=True))
  st, steps = None, []
  for t in range(q.shape[1]):
    o_t, st = step(st, q[:, t], k[:, t], v[:, t])
    steps.append(o_t)
  assert rel_err(jnp.stack(steps, 1), o_ref) < 1e-10
  with pytest.raises(ValueError, match="feature_map must map q and k"):
    linear_attention(q, k, v, feature_map=lambda x: x[:, :-1])


@pytest.mark.parametrize("impl", IMPLS)
def test_no_tokens_pass_the_state_through(impl):
  from vla_jax import vla_recurrence, initial_vla_state  # pylint: disable=import-outside-toplevel
  q, k, v, u = random_inputs(12, 1, 0, 2, 4, 3, np.float32)
  beta, log_decay = gates(13, 1, 0, 2, np.float32)
  S0 = jnp.ones((1, 2, 3, 4), jnp.float32)
  init = initial_vla_state(1, 2, 4, 3, lam0=2.0)

  @jax.jit   # one program (eagerly, each operation compiles on its own)
  def run(q, k, v, u, beta, log_decay, S0, init):
    return (deltanet(q, k, v, beta, initial_state=S0, impl=impl),
            gated_deltanet(q, k, v, beta, log_decay, initial_state=S0, impl=impl),
            linear_attention(q, k, v, impl=impl),
            vla_recurrence(q, k, v, u, initial_state=init, impl=impl))

  delta, gated, linear, vla = run(q, k, v, u, beta, log_decay, S0, init)
  for o, S in (delta, gated):
    chex.assert_shape(o, (1, 0, 2, 3))
    chex.assert_trees_all_equal(S, S0)
  o, state = linear
  chex.assert_shape([o, state.S], [(1, 0, 2, 3), (1, 2, 3, 4)])
  o, state = vla
  chex.assert_shape(o, (1, 0, 2, 3))
  chex.assert_trees_all_equal(state, init)


def _packed_ids(B, T):
  """Three documents a row, one starting inside the first chunk of 16 and one at token 31."""
  return np.repeat(np.array([[0] * 7 + [1] * 24 + [2] * (T - 31)]), B, axis=0)


@pytest.mark.parametrize("packed", [False, True], ids=["one_document", "packed"])
def test_pallas_impls_match_oracle_chunked_and_their_gradients(x64, packed):
  """impl 'pallas' (interpret mode off GPUs) and 'pallas_interpret' of DeltaNet and linear
  attention (normalised, from an initial state; v 5 wide, run on zero columns up to 16; T a
  ragged 40): outputs and states equal the oracles (one document) or 'chunked' (packed), and
  so do the gradients of q, k, v, beta and the initial state."""
  B, T, H, dk, dv = 1, 40, 2, 16, 5
  q, k, v, _ = random_inputs(14, B, T, H, dk, dv)
  beta, _ = gates(15, B, T, H)
  rng = np.random.default_rng(16)
  S0, z0 = rng.standard_normal((B, H, dv, dk)) / 4, rng.uniform(0.5, 1.0, (B, H, dk))
  ids = _packed_ids(B, T) if packed else None
  kernel = "pallas_interpret" if packed else "pallas"

  def run(impl):
    def f(q, k, v, beta, S0, z0):
      o1, S = deltanet(q, k, v, beta, initial_state=S0, impl=impl, chunk_size=16,
                       segment_ids=ids)
      o2, st = linear_attention(q, k, v, normalize=True, impl=impl, chunk_size=16,
                                initial_state=LinearAttentionState(S0, z0), segment_ids=ids)
      return o1, S, o2, st.S, st.z
    loss = lambda *a: sum(jnp.sum(jnp.sin(x)) for x in f(*a))
    return jax.jit(lambda *a: (f(*a), jax.grad(loss, argnums=range(6))(*a)))

  args = (q, k, v, beta, S0, z0)
  got, grads = run(kernel)(*args)
  want, grads_ref = run("chunked")(*args)
  if not packed:
    want = (oracles.gated_deltanet(q, k, v, beta, S0=S0)
            + oracles.linear_attention(q, k, v, normalize=True, S0=S0, z0=z0))
  for name, x, r in zip(("o", "S", "o_linear", "S_linear", "z"), got, want):
    assert rel_err(x, r) < 1e-10, name
  for name, g, r in zip(("q", "k", "v", "beta", "S0", "z0"), grads, grads_ref):
    assert rel_err(g, r) < 1e-10, "d" + name


def test_gated_deltanet_pallas_matches_oracle_and_scan_gradients(x64):
  """impl 'pallas_interpret' of Gated DeltaNet (v 5 wide, a hard reset, T a ragged 40):
  outputs and state equal the oracle's, gradients 'scan''s; packed documents are refused."""
  B, T, H, dk, dv = 1, 40, 2, 16, 5
  q, k, v, _ = random_inputs(17, B, T, H, dk, dv)
  beta, log_decay = gates(18, B, T, H)
  log_decay[0, 12, 1] = -np.inf
  S0 = np.random.default_rng(19).standard_normal((B, H, dv, dk)) / 4

  def run(impl):
    f = lambda *a: gated_deltanet(*a[:5], initial_state=a[5], impl=impl, chunk_size=16)
    loss = lambda *a: (lambda o, S: jnp.sum(jnp.sin(o)) + jnp.sum(S ** 2))(*f(*a))
    return jax.jit(lambda *a: (f(*a), jax.grad(loss, argnums=range(6))(*a)))

  args = (q, k, v, beta, log_decay, S0)
  (o, S), grads = run("pallas_interpret")(*args)
  o_ref, S_ref = oracles.gated_deltanet(q, k, v, beta, log_decay, S0=S0)
  assert rel_err(o, o_ref) < 1e-10 and rel_err(S, S_ref) < 1e-10
  for name, g, r in zip(("q", "k", "v", "beta", "log_decay", "S0"), grads,
                        run("scan")(*args)[1]):
    assert rel_err(g, r) < 1e-10, "d" + name
  with pytest.raises(ValueError, match="Gated DeltaNet kernel does not take segment_ids"):
    gated_deltanet(*args[:5], impl="pallas_interpret", segment_ids=_packed_ids(B, T))
  with pytest.raises(ValueError, match="chunk_size must be a power of two in \\[16, 128\\]"):
    deltanet(q, k, v, beta, impl="pallas_interpret", chunk_size=256)
