"""`SoftmaxAttention` under non-finite inputs: a NaN or Inf token stays causal and inside its
packed document, in the outputs and in the gradients with respect to the inputs, as the
recurrent mixers keep it (tests/ops/test_properties.py), on every path the layer has on the
CPU: the full-sequence call (`jax.nn.dot_product_attention`, implementation "xla"; the cuDNN
path receives the same sanitised q, k, v) and the KV-cache path (`prefill`, `step`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import random_module
from vla_jax.layers import SoftmaxAttention

B, T, D, H = 1, 24, 16, 2
T0 = 12                            # the corrupted token: inside document 1 of 3
DOCS = np.repeat(np.arange(3), 8)[None]        # [B, T]: tokens 0-7, 8-15, 16-23
CONV = (0, 4)


def _layer(conv_size):
  return random_module(lambda: SoftmaxAttention(D, H, implementation="xla",
                                                conv_size=conv_size, rngs=nnx.Rngs(0)))


@nnx.jit
def _outputs_and_grads(m, x, weights, segment_ids):
  """(y, d sum(y * weights) / dx): weights select the outputs a loss sees."""
  def loss(x):
    return jnp.sum(m(x, segment_ids=segment_ids) * weights)
  return m(x, segment_ids=segment_ids), jax.grad(loss)(x)


def _inputs(seed=0):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((B, T, D)), jnp.float32)


@pytest.mark.parametrize("conv_size", CONV)
@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
def test_non_finite_token_is_causal(conv_size, value):
  """x[T0] non-finite: y and the input gradient of a loss on y[:T0] before T0 are unchanged
  and finite; y from T0 on is NaN."""
  m, x = _layer(conv_size), _inputs()
  weights = jnp.asarray(np.random.default_rng(1).standard_normal((B, T, D)), jnp.float32)
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
  weights = np.random.default_rng(3).standard_normal((B, T, D)) * other
  weights = jnp.asarray(weights, jnp.float32)
  y_ref, g_ref = _outputs_and_grads(m, x, weights, ids)
  y, g = _outputs_and_grads(m, x.at[:, T0].set(np.nan), weights, ids)
  keep = np.asarray(DOCS[0] != 1) | (np.arange(T) < T0)
  for got, want in ((y, y_ref), (g, g_ref)):
    assert np.all(np.isfinite(np.asarray(got[:, keep])))
    np.testing.assert_allclose(np.asarray(got[:, keep]), np.asarray(want[:, keep]),
                               rtol=1e-6, atol=1e-6)
  assert np.all(np.isnan(np.asarray(y[:, T0:16])))


def test_cache_path_is_causal():
  """prefill of T tokens with a NaN at T0, then one step: prefill's outputs before T0 are
  unchanged and finite, those from T0 on NaN, and the next token (which attends to the NaN
  slot kept in the cache) is NaN."""
  m, x = _layer(4), _inputs(4)
  x_t = _inputs(5)[:, 0]

  @nnx.jit
  def run(m, x):
    y, cache = m.prefill(x, m.init_cache(B, T + 1))
    return y, m.step(x_t, cache)[0]

  y_ref, _ = run(m, x)
  y, y_next = run(m, x.at[:, T0].set(np.nan))
  assert np.all(np.isfinite(np.asarray(y[:, :T0])))
  np.testing.assert_allclose(np.asarray(y[:, :T0]), np.asarray(y_ref[:, :T0]), rtol=1e-6,
                             atol=1e-6)
  assert np.all(np.isnan(np.asarray(y[:, T0:]))) and np.all(np.isnan(np.asarray(y_next)))
