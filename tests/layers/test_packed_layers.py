"""Packed documents in the mixers and the model: with `segment_ids` (and padding), every
mixer's outputs and final cache equal running each document alone (float64), with non-zero
biases and the short convolution; the model's positions restart and its cache continues the
row's last document."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vla_jax.layers import make_mixer
from vla_jax.models import LanguageModel, ModelConfig

D, H, T, CHUNK = 32, 2, 30, 16
# Row 0: documents of 5, 1, 10 (starts at a chunk boundary), 1 and 13 tokens; row 1: 16, 14.
SEGMENT_IDS = np.array([[0] * 5 + [1] + [2] * 10 + [3] + [4] * 13, [9] * 16 + [2] * 14],
                       np.int32)
MASK = np.ones((2, T), bool)
MASK[0, [0, 6, 7, 20]] = False        # pads: leading, inside documents
MASK[1, [15, 29]] = False             # the last token of a document; the row's last
MIXERS = [("vla", {"readout": "additive"}), ("vla", {"readout": "delta"}), ("linear", {}),
          ("deltanet", {}), ("gated_deltanet", {}), ("softmax", {"conv_size": 4})]
IDS = [name + "".join(f"-{k}={v}" for k, v in o.items()) for name, o in MIXERS]


def documents(mask):
  """[(row, real positions)] for every document with a real token, in row order."""
  out = []
  for b in range(SEGMENT_IDS.shape[0]):
    ids = SEGMENT_IDS[b]
    bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
    for s, e in zip(bounds[:-1], bounds[1:]):
      real = s + np.flatnonzero(mask[b, s:e])
      if real.size:
        out.append((b, real))
  return out


def mixer(name, impl, options, seed=0):
  m = make_mixer(name, D, H, impl=impl, chunk_size=CHUNK, options=options, dtype=jnp.float64,
                 param_dtype=jnp.float64, rngs=nnx.Rngs(seed))
  key = jax.random.key(seed + 1)     # non-zero biases: a pad's projection is not zero
  for path, param in nnx.iter_graph(m):
    if isinstance(param, nnx.Param) and path[-1] in ("bias", "dt_bias"):
      key, sub = jax.random.split(key)
      param[...] = 0.5 * jax.random.normal(sub, param.shape, param.dtype)
  return m


@nnx.jit
def packed_and_separate(m, x, mask, x_sep, mask_sep):
  cache = None if m.RECURRENT else m.init_cache(x.shape[0], T)
  cache_sep = None if m.RECURRENT else m.init_cache(x_sep.shape[0], T)
  return (m.prefill(x, cache, attention_mask=mask, segment_ids=SEGMENT_IDS),
          m.prefill(x_sep, cache_sep, attention_mask=mask_sep))


def check(m, mask):
  """Largest differences (outputs, recurrent caches) between the packed rows and the
  documents run alone (each right-padded, masked)."""
  x = np.random.default_rng(0).standard_normal((2, T, D))
  docs = documents(mask)
  x_sep, mask_sep = np.zeros((len(docs), T, D)), np.zeros((len(docs), T), bool)
  for i, (b, real) in enumerate(docs):
    x_sep[i, :real.size], mask_sep[i, :real.size] = x[b, real], True
  (y, cache), (y_sep, cache_sep) = packed_and_separate(m, x, mask, x_sep, mask_sep)
  y, y_sep = np.asarray(y), np.asarray(y_sep)
  out = max(float(np.abs(y[b, real] - y_sep[i, :real.size]).max())
            for i, (b, real) in enumerate(docs))
  np.testing.assert_array_equal(y[~mask], 0.0)
  if not m.RECURRENT:
    return out, 0.0
  last = [max(i for i, (b, _) in enumerate(docs) if b == row) for row in range(2)]
  state = max(float(np.abs(np.asarray(a) - np.asarray(c)[last]).max())
              for a, c in zip(jax.tree.leaves(cache), jax.tree.leaves(cache_sep)))
  return out, state


@pytest.mark.parametrize("name,options", MIXERS, ids=IDS)
def test_packed_equals_separate(x64, name, options):
  out, state = check(mixer(name, "chunked", options), MASK)
  tol = 1e-6 if name == "softmax" else 1e-10     # jax's attention: float32 softmax
  assert out < tol and state < 1e-10, (out, state)


@pytest.mark.parametrize("name,impl", [("vla", "chunked"), ("vla", "scan"),
                                       ("gated_deltanet", "scan")])
def test_without_padding_and_other_impls(x64, name, impl):
  out, state = check(mixer(name, impl, {}), np.ones_like(MASK))
  assert out < 1e-10 and state < 1e-10, (out, state)


def test_bad_segment_ids_raise():
  m = mixer("linear", "chunked", {})
  with pytest.raises(ValueError, match=r"LinearAttention: segment_ids must have shape"):
    m(jnp.zeros((2, T, D)), segment_ids=SEGMENT_IDS[:, :-1])
  with pytest.raises(TypeError, match=r"LinearAttention: segment_ids must have an integer"):
    m(jnp.zeros((2, T, D)), segment_ids=SEGMENT_IDS.astype(np.float32))


@nnx.jit
def model_runs(model, tokens, tokens_sep, mask_sep, last_rows, next_tokens):
  """Logits of the packed rows and of the documents alone; the step after a packed prefill
  and after a prefill of each row's last document alone."""
  logits = model(tokens, MASK, SEGMENT_IDS)
  logits_sep = model(tokens_sep, mask_sep)
  _, cache = model.prefill(tokens, model.init_cache(2, 48), MASK, SEGMENT_IDS)
  _, cache_sep = model.prefill(tokens_sep[last_rows], model.init_cache(2, 48),
                               mask_sep[last_rows])
  return logits, logits_sep, model.step(next_tokens, cache)[0], model.step(next_tokens,
                                                                           cache_sep)[0]


@pytest.mark.parametrize("mixer_name", ["vla", "softmax"])
def test_model_positions_and_cache(mixer_name):
  """Logits of packed rows equal each document alone (positions restart), and after a packed
  prefill the next step continues the row's last document (float32)."""
  config = ModelConfig(vocab_size=40, max_len=64, mixer=mixer_name, d_model=D, num_heads=H,
                       num_layers=1, chunk_size=CHUNK, pos_emb="learned")
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  tokens = np.random.default_rng(1).integers(0, 40, (2, T))
  docs = documents(MASK)
  tokens_sep, mask_sep = np.zeros((len(docs), T), np.int32), np.zeros((len(docs), T), bool)
  for i, (b, real) in enumerate(docs):
    tokens_sep[i, :real.size], mask_sep[i, :real.size] = tokens[b, real], True
  last = np.array([max(i for i, (b, _) in enumerate(docs) if b == row) for row in range(2)])
  logits, logits_sep, step, step_sep = map(np.asarray, model_runs(
      model, tokens, tokens_sep, mask_sep, last, jnp.array([3, 4])))
  for i, (b, real) in enumerate(docs):
    np.testing.assert_allclose(logits[b, real], logits_sep[i, :real.size], atol=2e-5)
  np.testing.assert_allclose(step, step_sep, atol=2e-5)
