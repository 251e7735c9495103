"""Streaming: every mixer's prefill + one-token steps equal its full forward pass; the model's
prefill/step/generate (VLA's generate: tests/models/test_generate.py); bad input to the
streaming interface."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import oracles
from conftest import random_module
from vla_jax.layers import MIXERS as ALL_MIXERS
from vla_jax.layers import make_mixer
from vla_jax.models.lm import LanguageModel, ModelConfig
from vla_jax.tasks import copy as copy_task

B, T, PROMPT, D_MODEL, HEADS = 2, 21, 13, 16, 2
MIXERS = [("vla", {}), ("vla", {"readout": "additive", "conv_size": 4, "qk_map": "elu1"}),
          ("vla", {"readout": "delta"}), ("softmax", {}), ("softmax", {"conv_size": 4}),
          ("softmax", {"positions": "rope"}), ("linear", {"conv_size": 4}),
          ("deltanet", {}), ("gated_deltanet", {"conv_size": 3}),
          ("vla", {"qk_map": "silu_l2", "beta": True})]
IDS = [name + "".join(f"-{k}={v}" for k, v in opts.items()) for name, opts in MIXERS]
# The model's prefill and step hand each layer its own cache whatever the mixer: in float32
# one mixer of each family and cache (VLA's default, attention's KV cache and a convolution,
# linear attention, DeltaNet, Gated DeltaNet); the readouts' steps share the forward's code
# and are checked in float64 above.
MODEL_MIXERS = [MIXERS[i] for i in (0, 4, 6, 7, 8)]
MODEL_IDS = [IDS[i] for i in (0, 4, 6, 7, 8)]


# Mixers' or models' forward passes, prefills and steps, each jitted over a list of modules:
# one compiled program per list (every step has the same shapes) rather than one eager
# dispatch, and one small compilation, per operation and token, or one program per module
# (XLA:CPU compiles the kernels that the modules share once a program). The bounds checks
# that need concrete values run eagerly in test_streaming_errors.
@nnx.jit
def forward(modules, x):
  return [m(x) for m in modules]


@nnx.jit
def prefill(modules, x, caches):
  return [m.prefill(x, cache) for m, cache in zip(modules, caches)]


@nnx.jit
def step(modules, x_t, caches):
  return [m.step(x_t, cache) for m, cache in zip(modules, caches)]


def stream(modules, x, prompt_len):
  """prefill(x[:, :P]) then one step per token of x [B, T, ...], for each module of a list:
  [(outputs [B, T, ...] of the mixer, or logits of the model, the cache after the last
  token)]."""
  caches = [m.init_cache(x.shape[0], x.shape[1]) for m in modules]
  ys, caches = zip(*prefill(modules, x[:, :prompt_len], caches))
  ys = [[y] for y in ys]
  for t in range(prompt_len, x.shape[1]):
    steps, caches = zip(*step(modules, x[:, t], list(caches)))
    for y, y_t in zip(ys, steps):
      y.append(y_t[:, None])
  return [(jnp.concatenate(y, axis=1), cache) for y, cache in zip(ys, caches)]


@pytest.fixture(scope="module")
def mixer_streams():
  """(the float64 mixers of MIXERS, x, each one's streamed outputs): every mixer streamed by
  one prefill program and one step program. Random parameters (`random_module`: no
  initialiser compiled); streaming equals the full pass for any."""
  with jax.enable_x64(True):
    mixers = [random_module(lambda name=name, options=options: make_mixer(
        name, D_MODEL, HEADS, impl="chunked", chunk_size=16, options=options,
        dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(1)), seed=i)
              for i, (name, options) in enumerate(MIXERS)]
    x = jax.random.normal(jax.random.key(2), (B, T, D_MODEL), jnp.float64)
    return mixers, x, [y for y, _ in stream(mixers, x, PROMPT)]


@pytest.mark.parametrize("case", range(len(MIXERS)), ids=IDS)
def test_mixer_stream_equals_forward_float64(x64, mixer_streams, case):
  mixers, x, streamed = mixer_streams
  # The full pass: the float64 oracle's (the layer's own forward equals it, test_layers).
  full = oracles.mixer(mixers[case], x)
  # jax's attention keeps its softmax in float32 even for float64 inputs.
  tol = 1e-6 if MIXERS[case][0] == "softmax" else 1e-10
  np.testing.assert_allclose(streamed[case], full, rtol=tol, atol=tol)


def test_no_tokens_give_no_outputs_and_leave_the_cache(x64, mixer_streams):
  """A forward pass of zero tokens gives [B, 0, d_model] and a prefill of zero tokens leaves
  the cache it is given, for every mixer (VLA's additive readout took its last sum from an
  empty axis)."""
  mixers, x, _ = mixer_streams
  empty = x[:, :0]
  for y in forward(mixers, empty):
    chex.assert_shape(y, (B, 0, D_MODEL))
  caches = [m.init_cache(B, T) for m in mixers]
  for (y, cache), before in zip(prefill(mixers, empty, caches), caches):
    chex.assert_shape(y, (B, 0, D_MODEL))
    chex.assert_trees_all_equal(cache, before)


def test_model_mixers_are_every_mixer():
  assert sorted(name for name, _ in MODEL_MIXERS) == sorted(ALL_MIXERS)


@pytest.fixture(scope="module")
def model_streams():
  """(the models of MODEL_MIXERS, their logits on tokens, on tokens changed after position
  12, their streams [(logits, cache)]): one forward program (run twice), one prefill program
  and one step program for every model; random parameters, as for `mixer_streams`."""
  models = [random_module(lambda name=name, options=options: LanguageModel(
      ModelConfig(vocab_size=23, max_len=T, mixer=name, d_model=D_MODEL, num_heads=HEADS,
                  chunk_size=16, mixer_options=options), rngs=nnx.Rngs(3)), seed=i)
            for i, (name, options) in enumerate(MODEL_MIXERS)]
  tokens = jax.random.randint(jax.random.key(4), (B, T), 0, 23)
  full = forward(models, tokens)
  changed = forward(models, tokens.at[:, 12:].set((tokens[:, 12:] + 1) % 23))
  return models, full, changed, stream(models, tokens, PROMPT)


@pytest.mark.parametrize("case", range(len(MODEL_MIXERS)), ids=MODEL_IDS)
def test_model_stream_equals_forward_float32(model_streams, case):
  """The model of every mixer (two blocks) builds and jits, is causal (tokens changed after
  position 12 change no earlier logit: the same program), and streams."""
  model, full, changed, streams = (x[case] for x in model_streams)
  assert len(model.blocks) == 2
  chex.assert_shape(full, (B, T, 23))
  chex.assert_type(full, jnp.float32)
  chex.assert_tree_all_finite(full)
  np.testing.assert_allclose(full[:, :12], changed[:, :12], rtol=1e-5, atol=1e-5)
  streamed, cache = streams
  np.testing.assert_allclose(streamed, full, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(cache.position, [T] * B)


def test_greedy_generate_equals_recomputed_argmax():
  """Attention's KV cache through generate (VLA's recurrent one, sampling, top-k and eos:
  tests/models/test_generate.py)."""
  # One layer: generation reads the last logits whatever the depth (the streaming tests above
  # check the layers' caches).
  config = ModelConfig(vocab_size=11, max_len=24, mixer="softmax", d_model=D_MODEL,
                       num_heads=HEADS, num_layers=1, chunk_size=16)
  model = LanguageModel(config, rngs=nnx.Rngs(5))
  prompt = jax.random.randint(jax.random.key(6), (B, 6), 0, 11)
  out = model.generate(prompt, 5)
  chex.assert_shape(out, (B, 11))
  chex.assert_type(out, jnp.int32)
  np.testing.assert_array_equal(out[:, :6], prompt)
  # The definition: each new token is the argmax of a full forward pass over the sequence so
  # far. The model is causal (test_model), so one forward pass over out[:, :-1] gives each of
  # those passes' last logits at once.
  recomputed = jnp.argmax(forward([model], out[:, :-1])[0][:, 5:], -1)
  np.testing.assert_array_equal(out[:, 6:], recomputed)


def test_generation_split_of_copy_examples():
  config = copy_task.CopyConfig(vocab_size=10, min_len=3, max_len=5)
  inputs, _ = copy_task.generate(config, 4, np.random.default_rng(0), length=5)
  prompts, strings = copy_task.generation_split(inputs)
  np.testing.assert_array_equal(prompts[:, -1], copy_task.SEP)
  np.testing.assert_array_equal(inputs[:, 6:10], strings[:, :4])  # the copy half


def test_streaming_errors():
  config = ModelConfig(vocab_size=11, max_len=12, mixer="softmax", d_model=D_MODEL,
                       num_heads=HEADS, num_layers=1)   # the checks do not depend on depth
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  prompt = jnp.zeros((1, 8), jnp.int32)
  with pytest.raises(ValueError, match="exceed model.max_len=12"):
    model.generate(prompt, 6)
  with pytest.raises(ValueError, match=r"step takes one token per sequence, shape \[B\]"):
    model.step(prompt, model.init_cache(1))
  with pytest.raises(ValueError, match=r"cache max_len must be in \[1, model.max_len=12\]"):
    model.init_cache(1, 13)
  with pytest.raises(ValueError, match="sampling with temperature > 0 needs rng"):
    model.generate(prompt, 2, temperature=1.0)
  mixer = make_mixer("vla", D_MODEL, HEADS, rngs=nnx.Rngs(0))
  x = jnp.zeros((1, 5, D_MODEL))
  with pytest.raises(ValueError, match=r"x_t must have shape \[B, d_model=16\] \(one token"):
    mixer.step(x, mixer.init_cache(1))
  attention = make_mixer("softmax", D_MODEL, HEADS, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="do not fit a KV cache of max_len=4"):
    attention.prefill(x, attention.init_cache(1, 4))
  # A second prefill past the cache, a position past learned positions, out-of-vocabulary
  # prompts and a NaN temperature are errors, not clamped writes or NaN logits.
  [(_, cache)] = prefill([model], prompt[:, :3], [model.init_cache(1, 4)])   # checked below
  with pytest.raises(ValueError, match="2 more tokens after the 3 written do not fit"):
    model.prefill(prompt[:, :2], cache)
  learned = LanguageModel(dataclasses.replace(config, mixer="vla", pos_emb="learned"),
                          rngs=nnx.Rngs(0))
  [(_, cache)] = prefill([learned], prompt, [learned.init_cache(1)])
  with pytest.raises(ValueError, match="5 more tokens after position 8 pass model.max_len=12"):
    learned.prefill(jnp.zeros((1, 5), jnp.int32), cache)
  for bad in (11, -1):
    with pytest.raises(ValueError, match=r"prompt token ids must lie in \[0, vocab_size=11\)"):
      model.generate(prompt.at[0, 2].set(bad), 2)
  with pytest.raises(ValueError, match="temperature must be a finite number >= 0; got nan"):
    model.generate(prompt, 2, temperature=float("nan"), rng=jax.random.key(0))
  with pytest.raises(ValueError, match="temperature must be a finite number >= 0; got 'hot'"):
    model.generate(prompt, 2, temperature="hot", rng=jax.random.key(0))
  for bad in (0, "seed"):
    with pytest.raises(ValueError, match=rf"rng must be a jax.random key .*; got {bad!r}"):
      model.generate(prompt, 2, temperature=1.0, rng=bad)
  assert model.generate(prompt, np.int64(2)).shape == (1, 10)


def test_caches_and_batch_sizes_are_checked():
  """A cache of another type, batch size or layer, or none, and a batch size that is not an
  int >= 0, raise naming the argument (not a concatenate TypeError, an AttributeError or a
  broadcasting error deep inside the step)."""
  vla = make_mixer("vla", D_MODEL, HEADS, rngs=nnx.Rngs(0))
  attention = make_mixer("softmax", D_MODEL, HEADS, rngs=nnx.Rngs(0))
  x = jnp.zeros((2, 3, D_MODEL))
  with pytest.raises(ValueError, match=r"VLAAttention: cache is for batch size 3; x_t has "
                                       r"B=2 \(init_cache\(2\)\)"):
    vla.step(x[:, 0], vla.init_cache(3))
  with pytest.raises(ValueError, match="VLAAttention: cache is for batch size 3; x has B=2"):
    vla.prefill(x, vla.init_cache(3))
  with pytest.raises(ValueError, match=r"SoftmaxAttention: cache is for batch size 1; x_t "
                                       r"has B=2"):
    attention.step(x[:, 0], attention.init_cache(1, 4))
  other = make_mixer("vla", D_MODEL, HEADS, options={"readout": "delta"}, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"VLAAttention: cache\.state\.S has shape "
                                       r"\(2, 2, 9, 8\); expected \(2, 2, 8, 8\)"):
    vla.step(x[:, 0], other.init_cache(2))
  for mixer, cache, want in ((vla, attention.init_cache(2, 4), "RecurrentCache"),
                             (vla, None, "RecurrentCache"),
                             (attention, vla.init_cache(2), "KVCache"),
                             (attention, None, "KVCache")):
    with pytest.raises(TypeError, match=f"{type(mixer).__name__}: cache must be a {want}"):
      mixer.step(x[:, 0], cache)
  for bad in (-1, 2.0, True):
    for init in (vla.init_cache, lambda b: attention.init_cache(b, 4)):
      with pytest.raises(ValueError, match=rf"batch_size must be an int >= 0; got {type(bad).__name__} {bad!r}"):
        init(bad)
  model = LanguageModel(ModelConfig(vocab_size=11, max_len=12, d_model=D_MODEL,
                                    num_heads=HEADS, num_layers=1), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"LanguageModel: batch_size must be an int >= 0; got int -1"):
    model.init_cache(-1)
  with pytest.raises(TypeError, match="cache must be a ModelCache"):
    model.step(jnp.zeros((2,), jnp.int32), vla.init_cache(2))
  with pytest.raises(ValueError, match="cache is for batch size 3; token has B=2"):
    model.step(jnp.zeros((2,), jnp.int32), model.init_cache(3))
