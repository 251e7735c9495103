"""`generate`: greedy decoding, seeded sampling, top-k and the end-of-sequence id, against full
forward passes (the attention model's greedy decoding: tests/layers/test_streaming.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vla_jax.models import LanguageModel, ModelConfig

# One layer of the cheapest form to compile: generation reads the last logits whatever the
# depth.
CONFIG = ModelConfig(vocab_size=13, max_len=20, mixer="vla", d_model=16, num_heads=2,
                     num_layers=1, impl="scan")
PROMPT_LEN, NEW = 4, 10


@nnx.jit
def forward(model, tokens):
  """The full forward pass, jitted (one compilation rather than one per eager operation)."""
  return model(tokens)


@pytest.fixture(scope="module")
def model():
  return LanguageModel(CONFIG, rngs=nnx.Rngs(11))


@pytest.fixture(scope="module")
def prompt():
  return jax.random.randint(jax.random.key(12), (6, PROMPT_LEN), 0, 13)


def test_greedy_is_the_argmax_of_a_full_forward_pass(model, prompt):
  out = model.generate(prompt, NEW)
  chex.assert_shape(out, (6, PROMPT_LEN + NEW))
  chex.assert_type(out, jnp.int32)
  np.testing.assert_array_equal(out[:, :PROMPT_LEN], prompt)
  # The definition: each new token is the argmax of a full forward pass over the sequence so
  # far. The model is causal (test_model), so one forward pass over out[:, :-1] gives each of
  # those passes' last logits at once.
  recomputed = jnp.argmax(forward(model, out[:, :-1])[:, PROMPT_LEN - 1:], -1)
  np.testing.assert_array_equal(out[:, PROMPT_LEN:], recomputed)


def test_sampling_is_seeded_and_in_vocabulary(model, prompt):
  a, b, c = (model.generate(prompt, NEW, temperature=5.0, rng=jax.random.key(seed))
             for seed in (3, 3, 4))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert int(a.min()) >= 0 and int(a.max()) < 13


def test_top_k_samples_only_among_the_k_most_likely_tokens(model, prompt):
  key = jax.random.key(3)
  greedy = model.generate(prompt, NEW)
  np.testing.assert_array_equal(model.generate(prompt, NEW, temperature=5.0, top_k=1, rng=key),
                                greedy)
  out = model.generate(prompt, NEW, temperature=5.0, top_k=3, rng=key)
  np.testing.assert_array_equal(out, model.generate(prompt, NEW, temperature=5.0, top_k=3,
                                                    rng=key))
  logits = forward(model, out[:, :-1])[:, PROMPT_LEN - 1:]             # [B, NEW, V] the step's logits
  chosen = np.take_along_axis(np.asarray(logits), np.asarray(out[:, PROMPT_LEN:, None]), -1)
  third = np.sort(np.asarray(logits), axis=-1)[..., -3:-2]
  assert np.all(chosen >= third - 1e-4)                          # always one of the top 3
  free = model.generate(prompt, NEW, temperature=5.0, rng=key)   # without top_k: any token
  logits = np.asarray(forward(model, free[:, :-1])[:, PROMPT_LEN - 1:])
  chosen = np.take_along_axis(logits, np.asarray(free[:, PROMPT_LEN:, None]), -1)
  assert np.mean(chosen < np.sort(logits, axis=-1)[..., -3:-2] - 1e-3) > 0.3


def test_sequences_end_at_eos_and_pad_with_it(model, prompt):
  greedy = np.asarray(model.generate(prompt, NEW))
  eos = int(greedy[0, PROMPT_LEN + 2])                           # row 0 ends at its third token
  out = np.asarray(model.generate(prompt, NEW, eos_id=eos))
  assert out.shape == greedy.shape and out.dtype == np.int32
  ended = 0
  for row, ref in zip(out, greedy):
    hits = np.flatnonzero(ref[PROMPT_LEN:] == eos)
    cut = PROMPT_LEN + (hits[0] + 1 if hits.size else NEW)
    np.testing.assert_array_equal(row[:cut], ref[:cut])          # greedy up to and with eos
    assert np.all(row[cut:] == eos)
    ended += bool(hits.size)
  assert 1 <= ended
  # Sampling: the same rule, and every sequence padded after its first eos.
  sampled = np.asarray(model.generate(prompt, NEW, temperature=3.0, eos_id=eos,
                                      rng=jax.random.key(4)))
  for row in sampled[:, PROMPT_LEN:]:
    hits = np.flatnonzero(row == eos)
    assert not hits.size or np.all(row[hits[0]:] == eos)
  # Every sequence ending at once (eos is the first token of each): all padding. Row 0's first
  # greedy token is the one generate(prompt[:1], 1) gives (each row decodes on its own): read
  # from the batch's greedy run rather than from a program of its own.
  first = greedy[0, PROMPT_LEN]
  np.testing.assert_array_equal(model.generate(prompt[:1], NEW, eos_id=int(first))[0, 4:],
                                np.full(NEW, first))


@pytest.mark.parametrize("kwargs,match", [
    ({"top_k": 0}, r"top_k must be None or an int in \[1, vocab_size=13\]"),
    ({"top_k": 14}, r"top_k must be None or an int in \[1, vocab_size=13\]"),
    ({"top_k": 2.5}, "top_k"), ({"eos_id": 13}, r"eos_id must be None or a token id in \[0"),
    ({"eos_id": -1}, "eos_id")])
def test_bad_top_k_and_eos_id(model, kwargs, match):
  with pytest.raises(ValueError, match=match):
    model.generate(jnp.zeros((1, 2), jnp.int32), 3, **kwargs)
