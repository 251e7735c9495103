"""The language model: tied/untied heads, position embeddings, config errors, remat, padding
masks (every mixer's model, its causality and streaming: tests/layers/test_streaming.py)."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import random_module
from vla_jax.models import LanguageModel, ModelConfig

SMALL = dict(vocab_size=32, max_len=24, d_model=16, num_heads=2, mlp_ratio=2, chunk_size=16)


def _params(model):
  return sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_tied_and_untied_heads():
  """The parameters' shapes (`nnx.eval_shape`: no initialiser runs)."""
  tied, untied = (nnx.eval_shape(lambda tie=tie: LanguageModel(
      ModelConfig(tie_embeddings=tie, **SMALL), rngs=nnx.Rngs(0))) for tie in (True, False))
  assert tied.head is None
  assert _params(untied) - _params(tied) == 16 * 32


@pytest.mark.parametrize("pos_emb", ["sinusoidal", "none"])
def test_position_embedding_options(pos_emb):
  model = random_module(lambda: LanguageModel(
      ModelConfig(pos_emb=pos_emb, mixer="deltanet", **SMALL), rngs=nnx.Rngs(0)))
  assert model.pos_embed is None
  chex.assert_shape(nnx.jit(lambda m, t: m(t))(model, jnp.zeros((1, 5), jnp.int32)), (1, 5, 32))


def test_too_long_sequence_fails():
  model = LanguageModel(ModelConfig(mixer="linear", **SMALL), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="exceeds model.max_len=24"):
    model(jnp.zeros((1, 25), jnp.int32))


@pytest.mark.parametrize("change,match", [
    ({"mixer": "rwkv"}, "unknown mixer 'rwkv'"),
    ({"head_dim": 4}, "head_dim \\* model.num_heads must equal model.d_model"),
    ({"num_heads": 3}, "not divisible by num_heads=3; choose a num_heads that divides"),
    ({"pos_emb": "rope"}, "pos_emb must be one of"),
    ({"mixer_options": {"readout": "softmax"}}, "readout must be one of"),
    ({"mixer": "softmax", "mixer_options": {"lam0": 1.0}}, "does not take option"),
    ({"impl": "triton"}, "model.impl must be one of 'auto'"),
    ({"impl": "pallas", "d_model": 24}, r"model.impl='pallas' cannot run here: head_dim"),
    ({"impl": "pallas_interpret", "num_heads": 1, "chunk_size": 256},
     "model.impl='pallas_interpret' cannot run here: chunk_size=256"),
    ({"chunk_size": 48}, r"model.chunk_size must be a power of two in \[16, 256\]; got 48"),
    ({"mixer_options": {"lam0": -2.0}},
     "model.mixer_options: VLAAttention: lam0 must be a finite number > 0; got -2.0"),
    ({"mixer_options": {"penalty_scale": float("inf")}},
     "model.mixer_options: VLAAttention: penalty_scale must be a finite number"),
    ({"mixer": "linear", "mixer_options": {"normalize": "no"}},
     "model.mixer_options: LinearAttention: normalize must be True or False"),
])
def test_bad_model_configs(change, match):
  with pytest.raises(ValueError, match=match):
    LanguageModel(ModelConfig(**{**SMALL, **change}), rngs=nnx.Rngs(0))


def test_mixer_options_are_a_mapping_or_pairs_and_keep_the_config_hashable():
  """A mapping or (name, value) pairs (a list too, as JSON gives them back) become sorted
  pairs, so that the config hashes; anything else, a repeated name or an unhashable value is
  refused naming model.mixer_options (a list was kept and hash() raised)."""
  want = ModelConfig(**SMALL, mixer_options={"lam0": 2.0, "readout": "delta"})
  for given in ([("readout", "delta"), ("lam0", 2.0)], [["lam0", 2.0], ["readout", "delta"]]):
    config = ModelConfig(**SMALL, mixer_options=given)
    assert config == want and hash(config) == hash(want)
    assert config.mixer_options == (("lam0", 2.0), ("readout", "delta"))
  for bad, match in (("lam0", "a mapping of option names to values"),
                     ([("lam0",)], "a mapping of option names to values"),
                     ([("lam0", 1.0), ("lam0", 2.0)], "repeats option 'lam0'"),
                     ({"lam0": [1.0]}, "option lam0 has an unhashable value")):
    with pytest.raises(ValueError, match=f"model.mixer_options.*{match}"):
      ModelConfig(**SMALL, mixer_options=bad)


def test_softmax_cudnn_is_checked_without_the_backend():
  """A configuration is checked without the backend (the layers check it when built): cuDNN
  with bfloat16 passes here on a CPU, cuDNN with float32 is refused."""
  config = dict(SMALL, mixer="softmax", mixer_options={"implementation": "cudnn"})
  ModelConfig(**config, dtype="bfloat16")
  with pytest.raises(ValueError, match="model.mixer_options: SoftmaxAttention: "
                                       "implementation='cudnn' needs dtype bfloat16"):
    ModelConfig(**config)


def test_impl_defaults_to_auto():
  """"auto" by default; a valid explicit "pallas" passes validation (the backend is checked
  when the layers are built: tests/layers/test_layers.py)."""
  assert ModelConfig(**SMALL).impl == "auto"
  pallas = ModelConfig(**{**SMALL, "num_heads": 1, "impl": "pallas"})
  pallas.check_impl()
  pallas.check_impl(packed=True)          # the VLA kernels take packed documents
  ModelConfig(**SMALL).check_impl(packed=True)
  for mixer in ("deltanet", "linear"):     # their kernels take packed documents too
    ModelConfig(**{**SMALL, "num_heads": 1, "impl": "pallas", "mixer": mixer}).check_impl(
        packed=True)
  ModelConfig(**{**SMALL, "num_heads": 1, "impl": "pallas", "mixer": "gated_deltanet"}
              ).check_impl()
  with pytest.raises(ValueError,
                     match="model.impl='pallas' .*kernel does not take segment_ids"):
    ModelConfig(**{**SMALL, "num_heads": 1, "impl": "pallas",
                   "mixer": "gated_deltanet"}).check_impl(packed=True)


def test_remat_keeps_the_gradients_and_saves_activation_memory():
  """model.remat recomputes each block in the backward: the same loss and parameter gradients
  (float32, to rounding) and a smaller compiled working set for the gradient. The block's
  remat does not depend on the mixer; VLA's (a custom VJP inside it) is the one checked."""
  config = dict(SMALL, max_len=32, d_model=32, num_heads=2, num_layers=2)

  def grad_fn(remat):
    model = LanguageModel(ModelConfig(mixer="vla", remat=remat, **config), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)

    def loss(p, tokens):
      logits = nnx.merge(graphdef, p)(tokens)
      return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])
    return jax.jit(jax.value_and_grad(loss)), params

  tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, 32)
  (plain, params), (remat, _) = grad_fn(False), grad_fn(True)
  plain, remat = (f.lower(params, tokens).compile() for f in (plain, remat))
  loss_plain, grads_plain = plain(params, tokens)
  loss_remat, grads_remat = remat(params, tokens)
  chex.assert_trees_all_close(loss_remat, loss_plain, rtol=1e-6)
  # Each parameter's gradient within float32 rounding of its largest entry (measured: at most
  # 4.4e-6 of it, in a leaf of small entries; the recomputed blocks round differently).
  chex.assert_trees_all_equal_structs(grads_remat, grads_plain)
  for a, b in zip(jax.tree.leaves(grads_remat), jax.tree.leaves(grads_plain)):
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * float(jnp.max(jnp.abs(b))), (a, b)
  temp = [f.memory_analysis().temp_size_in_bytes for f in (plain, remat)]
  assert temp[1] < temp[0], temp


@pytest.mark.parametrize("option", ["remat", "tie_embeddings"])
def test_bool_options_must_be_bools(option):
  """A string such as "no" (which bool() makes True) is refused, naming the option."""
  with pytest.raises(ValueError, match=f"model: {option} must be True or False; got str 'no'"):
    ModelConfig(**{option: "no"}, **SMALL)


@nnx.jit
def _full_and_prefill(model, padded, mask, tokens):
  """For the padded tokens with their mask, then for the unpadded tokens: the full pass, and
  prefill's logits and cache (one program: XLA:CPU compiles the kernels they share once)."""
  return tuple((model(t, m),) + model.prefill(t, model.init_cache(t.shape[0], 20), m)
               for t, m in ((padded, mask), (tokens, None)))


_step = nnx.jit(lambda model, token, cache: model.step(token, cache))


def _padded_runs(model, padded, mask, tokens, following):
  """For the padded and the unpadded tokens: the full pass, and prefill + one step per token of
  `following` [B, N] (one compiled step for the padded and the unpadded cache: they have the
  same shapes)."""
  runs = []
  for full, prompt, cache in _full_and_prefill(model, padded, mask, tokens):
    steps = []
    for t in range(following.shape[1]):
      logits, cache = _step(model, following[:, t], cache)
      steps.append(logits)
    runs.append((full, prompt, jnp.stack(steps, 1), cache.position))
  return runs


@pytest.mark.parametrize("mixer", ["vla", "softmax"])
def test_padding_mask_gives_the_unpadded_logits(mixer):
  """Left- and right-padded prompts (learned positions count real tokens only): the logits at
  the real tokens, and the steps after a padded prefill, equal those of the unpadded batch."""
  model = LanguageModel(ModelConfig(mixer=mixer, mixer_options={"conv_size": 4}, **SMALL),
                        rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 32)
  following = jax.random.randint(jax.random.key(2), (2, 3), 0, 32)
  mask = np.ones((2, 13), bool)
  mask[0, :4] = mask[1, 9:] = False                 # row 0 left-, row 1 right-padded
  padded = np.full((2, 13), 31)
  padded[mask] = np.asarray(tokens).reshape(-1)
  got, want = _padded_runs(model, jnp.asarray(padded), jnp.asarray(mask), tokens, following)
  np.testing.assert_allclose(got[0][mask], want[0].reshape(18, 32), rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(got[1][mask], want[1].reshape(18, 32), rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose(got[2], want[2], rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(got[3], [12, 12])  # 9 real prompt tokens + 3 steps


def test_token_ids_out_of_range_are_errors():
  """Concrete ids outside [0, vocab_size): a ValueError naming the id, its position and
  vocab_size, from __call__, prefill and step; float tokens are a TypeError, tokens of another
  rank a ValueError."""
  model = random_module(lambda: LanguageModel(ModelConfig(mixer="deltanet", **SMALL),
                                              rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((2, 6), jnp.int32)
  cache = model.init_cache(2, 8)
  for bad, where in ((32, r"\(1, 4\)"), (-1, r"\(1, 4\)")):
    with pytest.raises(ValueError, match=rf"token id {bad} at position {where} is not in "
                                         r"\[0, vocab_size=32\)"):
      model(tokens.at[1, 4].set(bad))
    with pytest.raises(ValueError, match=rf"token id {bad} at position {where}"):
      model.prefill(tokens.at[1, 4].set(bad), cache)
  with pytest.raises(ValueError, match=r"token: token id 40 at position \(0,\)"):
    model.step(jnp.asarray([40, 0], jnp.int32), cache)
  with pytest.raises(TypeError, match="int array of token ids"):
    model(tokens.astype(jnp.float32))
  for bad in (tokens[0], tokens[..., None]):   # an IndexError / a broadcasting error before
    with pytest.raises(ValueError, match=re.escape(
        f"tokens must have shape [B, T] (int token ids); got {tuple(bad.shape)}")):
      model(bad)
    with pytest.raises(ValueError, match=r"tokens must have shape \[B, T\]"):
      model.prefill(bad, cache)


@pytest.mark.parametrize("mixer", ["vla", "softmax"])
def test_bad_token_id_under_jit_stays_in_its_document(mixer):
  """Under jit ids are not checked: an id of vocab_size (or -1, not wrapped to another token)
  in document 1 of a packed row makes that document's logits from it on NaN, and leaves
  documents 0 and 2 as they were."""
  model = LanguageModel(ModelConfig(mixer=mixer, **SMALL), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 32, (1, 24)), jnp.int32)
  ids = jnp.asarray(np.repeat(np.arange(3), 8)[None], jnp.int32)
  run = nnx.jit(lambda m, t: m(t, segment_ids=ids))
  want = np.asarray(run(model, tokens))
  other = np.r_[0:8, 16:24]
  for bad in (32, -1):
    got = np.asarray(run(model, tokens.at[0, 11].set(bad)))
    assert np.all(np.isnan(got[:, 11:16]))
    np.testing.assert_allclose(got[:, other], want[:, other], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[:, 8:11], want[:, 8:11], rtol=1e-6, atol=1e-6)
