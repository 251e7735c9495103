"""Packed documents in the mixers and the model: with `segment_ids` (with and without padding),
every mixer's outputs and final cache equal running each document alone (float64), with
non-zero biases and the short convolution; the model's positions restart and its cache
continues the row's last document.

The mixers run impl "scan": the layers pass `impl` to the ops untouched, and
tests/ops/test_packed_ops.py covers every impl and recurrence (DeltaNet included). DeltaNet's
layer is GatedDeltaNet's without the gate (the same `prefill`), and VLA's readouts other than
the additive one (whose running sum restarts per document) act token by token."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import random_module
from vla_jax.layers import make_mixer
from vla_jax.models import LanguageModel, ModelConfig

D, H, T = 8, 2, 24
# Row 0: documents of 5, 1, 10, 1 and 7 tokens; row 1: 16 and 8.
SEGMENT_IDS = np.array([[0] * 5 + [1] + [2] * 10 + [3] + [4] * 7, [9] * 16 + [2] * 8],
                       np.int32)
MASK = np.ones((2, T), bool)
MASK[0, [0, 6, 7, 20]] = False        # pads: leading, inside documents
MASK[1, [15, 23]] = False             # the last token of a document; the row's last
MIXERS = [("vla", {"readout": "additive", "qk_map": "elu1"}), ("linear", {}),
          ("gated_deltanet", {}), ("softmax", {"conv_size": 4}), ("softmax", {"positions": "rope"})]
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


def separate(x, docs):
  """[B, T, ...] -> each document's real tokens at the start of its own row, and the mask."""
  x_sep, mask_sep = np.zeros((len(docs),) + x.shape[1:], x.dtype), np.zeros((len(docs), T), bool)
  for i, (b, real) in enumerate(docs):
    x_sep[i, :real.size], mask_sep[i, :real.size] = x[b, real], True
  return x_sep, mask_sep


def last_documents(docs):
  return np.array([max(i for i, (b, _) in enumerate(docs) if b == row) for row in range(2)])


def mixer(name, options):
  """The mixer in float64, with random parameters (non-zero biases: a pad's projection is not
  zero)."""
  return random_module(lambda: make_mixer(name, D, H, impl="scan", options=options,
                                          dtype=jnp.float64, param_dtype=jnp.float64,
                                          rngs=nnx.Rngs(0)))


@functools.partial(jax.jit, static_argnums=0)
def packed_and_separate(graphdef, params, x, mask, x_sep, mask_sep):
  m = nnx.merge(graphdef, params)
  cache = None if m.RECURRENT else m.init_cache(x.shape[0], T)
  cache_sep = None if m.RECURRENT else m.init_cache(x_sep.shape[0], T)
  return (m.prefill(x, cache, attention_mask=mask, segment_ids=SEGMENT_IDS),
          m.prefill(x_sep, cache_sep, attention_mask=mask_sep))


@pytest.mark.parametrize("name,options", MIXERS, ids=IDS)
def test_packed_equals_separate(x64, name, options):
  """With padding and without (the same program: every document keeps a real token)."""
  m = mixer(name, options)
  x = np.random.default_rng(0).standard_normal((2, T, D))
  tol = 1e-6 if name == "softmax" else 1e-10     # jax's attention: float32 softmax
  for mask in (MASK, np.ones_like(MASK)):
    docs = documents(mask)
    (y, cache), (y_sep, cache_sep) = jax.tree.map(
        np.asarray, packed_and_separate(*nnx.split(m), x, mask, *separate(x, docs)))
    for i, (b, real) in enumerate(docs):
      np.testing.assert_allclose(y[b, real], y_sep[i, :real.size], rtol=0, atol=tol)
    np.testing.assert_array_equal(y[~mask], 0.0)
    if m.RECURRENT:                   # state, convolution tails, the additive readout's sum
      for a, c in zip(jax.tree.leaves(cache), jax.tree.leaves(cache_sep)):
        np.testing.assert_allclose(a, c[last_documents(docs)], rtol=0, atol=1e-10)


def test_bad_segment_ids_raise(x64):
  m = mixer("linear", {})
  with pytest.raises(ValueError, match=r"LinearAttention: segment_ids must have shape"):
    m(jnp.zeros((2, T, D)), segment_ids=SEGMENT_IDS[:, :-1])
  with pytest.raises(TypeError, match=r"LinearAttention: segment_ids must have an integer"):
    m(jnp.zeros((2, T, D)), segment_ids=SEGMENT_IDS.astype(np.float32))


@functools.partial(jax.jit, static_argnums=0)
def model_runs(graphdef, params, tokens, next_tokens, tokens_sep, mask_sep):
  """Logits of the packed rows by `__call__` and by `prefill`, then of the step after the
  packed prefill; logits of the documents alone."""
  model = nnx.merge(graphdef, params)
  logits = model(tokens, MASK, SEGMENT_IDS)
  prefilled, cache = model.prefill(tokens, model.init_cache(2, 32), MASK, SEGMENT_IDS)
  return logits, prefilled, model.step(next_tokens, cache)[0], model(tokens_sep, mask_sep)


def test_model_positions_and_cache():
  """Logits of packed rows equal each document alone (learned positions restart), and after
  a packed prefill the next step continues the row's last document: its logits equal those
  of that document alone with the token appended (float32). Softmax attention: its cache
  keeps every token and the step must attend to the last document's alone (the recurrent
  mixers' caches are compared above)."""
  config = ModelConfig(vocab_size=40, max_len=32, mixer="softmax", d_model=D, num_heads=H,
                       num_layers=1, pos_emb="learned")
  graphdef, params = nnx.split(random_module(lambda: LanguageModel(config, rngs=nnx.Rngs(0)),
                                             scale=0.3))
  tokens = np.random.default_rng(1).integers(0, 40, (2, T)).astype(np.int32)
  next_tokens = np.array([3, 4], np.int32)
  docs = documents(MASK)
  tokens_sep, mask_sep = separate(tokens, docs)
  last = last_documents(docs)
  for row, i in enumerate(last):      # each row's next token after its last document alone
    n = docs[i][1].size
    tokens_sep[i, n], mask_sep[i, n] = next_tokens[row], True
  logits, prefilled, step, logits_sep = map(np.asarray, model_runs(
      graphdef, params, tokens, next_tokens, tokens_sep, mask_sep))
  for i, (b, real) in enumerate(docs):
    np.testing.assert_allclose(logits[b, real], logits_sep[i, :real.size], atol=2e-5)
    np.testing.assert_allclose(prefilled[b, real], logits_sep[i, :real.size], atol=2e-5)
  np.testing.assert_allclose(step, logits_sep[last, [docs[i][1].size for i in last]], atol=2e-5)
