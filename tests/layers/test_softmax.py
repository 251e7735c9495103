"""`SoftmaxAttention`: its rotary position embedding (`rotary_embedding` against the float64
complex-rotation oracle, the relative-position property of the scores, the layer with
positions="rope" against the oracle layer; padding, packing and streaming with RoPE are in
test_masks.py, test_packed_layers.py and test_streaming.py), and non-finite inputs: a NaN or
Inf token stays causal and inside its packed document, in the outputs and in the gradients
with respect to the inputs, on every path the layer has on the CPU (the full-sequence call,
implementation "xla"; the cuDNN path receives the same sanitised q, k, v; and the KV-cache
path)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import oracles
from conftest import random_module
from vla_jax.layers import SoftmaxAttention, make_mixer
from vla_jax.layers.softmax import rotary_embedding

B, T, H, D = 2, 13, 3, 10     # D / 2 = 5 frequencies: an odd number of pairs


def test_rotary_embedding_equals_the_complex_rotation(x64):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((B, T, H, D))
  positions = rng.integers(0, 5000, (B, T))
  got = jax.jit(rotary_embedding, static_argnums=2)(x, positions, 500.0)
  np.testing.assert_allclose(got, oracles.rope(x, positions, 500.0), rtol=0, atol=1e-10)
  # vmap over the batch, and float32 inputs keep their dtype.
  np.testing.assert_allclose(jax.vmap(lambda a, p: rotary_embedding(a[None], p[None])[0])(
      x, positions), oracles.rope(x, positions), rtol=0, atol=1e-10)
  got32 = rotary_embedding(x.astype(np.float32), positions)
  assert got32.dtype == jnp.float32
  np.testing.assert_allclose(got32, oracles.rope(x, positions), rtol=0, atol=1e-3)


def test_rope_scores_depend_on_the_relative_position_only(x64):
  """q_m . k_n after rotation equals q_{m+c} . k_{n+c} for any shift c, and changes with m - n
  (the rotation is not the identity); norms are kept."""
  rng = np.random.default_rng(1)
  q, k = rng.standard_normal((1, 1, H, D)), rng.standard_normal((1, 1, H, D))

  def score(m, n):
    qm = rotary_embedding(q, np.array([[m]]))
    kn = rotary_embedding(k, np.array([[n]]))
    return np.einsum("bthd,bthd->h", qm, kn)

  for m, n in ((0, 0), (7, 2), (2, 7), (100, 31)):
    want = score(m, n)
    for c in (1, 17, 4096):
      np.testing.assert_allclose(score(m + c, n + c), want, rtol=1e-9, atol=1e-9)
  assert np.abs(score(7, 2) - score(2, 2)).max() > 1e-3
  assert np.abs(score(7, 2) - score(2, 7)).max() > 1e-3
  np.testing.assert_allclose(np.linalg.norm(rotary_embedding(q, np.array([[123]])), axis=-1),
                             np.linalg.norm(q, axis=-1), rtol=1e-12)


@pytest.mark.parametrize("conv_size", [0, 4])
def test_rope_layer_equals_the_oracle(x64, conv_size):
  m = make_mixer("softmax", H * D, H, options={"positions": "rope", "conv_size": conv_size},
                 dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (B, T, H * D), jnp.float64)
  forward = nnx.jit(lambda mod, a: mod(a))
  got = forward(m, x)
  # jax's attention keeps its softmax in float32 even for float64 inputs.
  np.testing.assert_allclose(got, oracles.mixer(m, x), rtol=1e-6, atol=1e-6)
  plain = make_mixer("softmax", H * D, H, options={"conv_size": conv_size},
                     dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
  # RoPE changes the outputs far beyond the tolerance above.
  assert np.abs(np.asarray(forward(plain, x)) - np.asarray(got)).max() > 1e-4


def test_rope_options_are_checked():
  with pytest.raises(ValueError, match="positions"):
    make_mixer("softmax", 16, 2, options={"positions": "alibi"}, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="even head_dim"):
    make_mixer("softmax", 15, 3, options={"positions": "rope"}, rngs=nnx.Rngs(0))
  for bad in (0.5, True, "500"):
    with pytest.raises(ValueError, match="rope_base must be a finite number > 1"):
      make_mixer("softmax", 16, 2, options={"positions": "rope", "rope_base": bad},
                 rngs=nnx.Rngs(0))
  for base in (np.float32(500.0), np.int64(500)):   # NumPy scalars are numbers too
    assert make_mixer("softmax", 16, 2, options={"positions": "rope", "rope_base": base},
                      rngs=nnx.Rngs(0)).rope_base == 500.0


def test_rope_stream_continues_the_last_packed_document(x64):
  """prefill of two packed documents then a step equals the last document alone then the
  step: the cache's rotated keys and the step's position both restart at the document."""
  m = make_mixer("softmax", H * D, H, options={"positions": "rope"}, dtype=jnp.float64,
                 param_dtype=jnp.float64, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(2), (1, T + 1, H * D), jnp.float64)
  segments = np.array([[0] * 5 + [1] * (T - 5)])

  @nnx.jit
  def run(mod, prompt, x_t, segment_ids):
    _, cache = mod.prefill(prompt, mod.init_cache(1, T + 1), segment_ids=segment_ids)
    return mod.step(x_t, cache)[0]

  packed = run(m, x[:, :T], x[:, T], segments)
  alone = run(m, x[:, 5:T], x[:, T], None)
  np.testing.assert_allclose(packed, alone, rtol=1e-6, atol=1e-6)


# Non-finite inputs.

NB, NT, ND, NH = 1, 24, 16, 2
T0 = 12                            # the corrupted token: inside document 1 of 3
DOCS = np.repeat(np.arange(3), 8)[None]        # [NB, NT]: tokens 0-7, 8-15, 16-23
CONV = (0, 4)


def _layer(conv_size):
  return random_module(lambda: SoftmaxAttention(ND, NH, implementation="xla",
                                                conv_size=conv_size, rngs=nnx.Rngs(0)))


@nnx.jit
def _outputs_and_grads(m, x, weights, segment_ids):
  """(y, d sum(y * weights) / dx): weights select the outputs a loss sees."""
  def loss(x):
    return jnp.sum(m(x, segment_ids=segment_ids) * weights)
  return m(x, segment_ids=segment_ids), jax.grad(loss)(x)


def _inputs(seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((NB, NT, ND)), jnp.float32)


@pytest.mark.parametrize("conv_size", CONV)
@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_token_is_causal(conv_size, value):
  """x[T0] non-finite: y and the input gradient of a loss on y[:T0] before T0 are unchanged
  and finite; y from T0 on is NaN."""
  m, x = _layer(conv_size), _inputs()
  weights = jnp.asarray(np.random.default_rng(1).standard_normal((NB, NT, ND)), jnp.float32)
  weights = weights.at[:, T0:].set(0.0)
  y_ref, g_ref = _outputs_and_grads(m, x, weights, None)
  y, g = _outputs_and_grads(m, x.at[:, T0].set(value), weights, None)
  for got, want in ((y, y_ref), (g, g_ref)):
    assert np.all(np.isfinite(np.asarray(got[:, :T0])))
    np.testing.assert_allclose(np.asarray(got[:, :T0]), np.asarray(want[:, :T0]), rtol=1e-6,
                               atol=1e-6)
  assert np.all(np.isnan(np.asarray(y[:, T0:])))


@pytest.mark.parametrize("conv_size", CONV)
def test_non_finite_token_stays_in_its_document(conv_size):
  """With segment_ids, a NaN in document 1 leaves documents 0 and 2 (outputs and the input
  gradients of a loss on them) as they were; document 1 is NaN from the token on."""
  m, x = _layer(conv_size), _inputs(2)
  ids = jnp.asarray(DOCS, jnp.int32)
  other = np.asarray(DOCS != 1)[..., None]
  weights = np.random.default_rng(3).standard_normal((NB, NT, ND)) * other
  weights = jnp.asarray(weights, jnp.float32)
  y_ref, g_ref = _outputs_and_grads(m, x, weights, ids)
  y, g = _outputs_and_grads(m, x.at[:, T0].set(np.nan), weights, ids)
  keep = np.asarray(DOCS[0] != 1) | (np.arange(NT) < T0)
  for got, want in ((y, y_ref), (g, g_ref)):
    assert np.all(np.isfinite(np.asarray(got[:, keep])))
    np.testing.assert_allclose(np.asarray(got[:, keep]), np.asarray(want[:, keep]),
                               rtol=1e-6, atol=1e-6)
  assert np.all(np.isnan(np.asarray(y[:, T0:16])))


def test_cache_path_is_causal():
  """prefill of NT tokens with a NaN at T0, then one step: prefill's outputs before T0 are
  unchanged and finite, those from T0 on NaN, and the next token (which attends to the NaN
  slot kept in the cache) is NaN."""
  m, x = _layer(4), _inputs(4)
  x_t = _inputs(5)[:, 0]

  @nnx.jit
  def run(m, x):
    y, cache = m.prefill(x, m.init_cache(NB, NT + 1))
    return y, m.step(x_t, cache)[0]

  y_ref, _ = run(m, x)
  y, y_next = run(m, x.at[:, T0].set(np.nan))
  assert np.all(np.isfinite(np.asarray(y[:, :T0])))
  np.testing.assert_allclose(np.asarray(y[:, :T0]), np.asarray(y_ref[:, :T0]), rtol=1e-6,
                             atol=1e-6)
  assert np.all(np.isnan(np.asarray(y[:, T0:]))) and np.all(np.isnan(np.asarray(y_next)))
