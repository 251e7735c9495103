"""A small pre-norm language model whose sequence mixer is chosen by name."""

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vla_jax.layers import common
from vla_jax.layers.registry import (check_mixer_impl, check_mixer_options, make_mixer,
                                     mixer_class)
from vla_jax.layers.softmax import check_implementation
from vla_jax.ops import checks
from vla_jax.ops.impl import Impl, parse_impl

POSITION_EMBEDDINGS = ("learned", "sinusoidal", "none")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that defines the model; frozen and hashable (no ml_collections here).

  Attributes:
    vocab_size: number of token ids.
    max_len: longest sequence the model accepts (size of the learned position table).
    mixer: "vla" | "softmax" | "linear" | "deltanet" | "gated_deltanet".
    d_model, num_layers, num_heads, head_dim: widths; num_heads * head_dim must equal d_model.
    mlp_ratio: hidden width of the MLP is mlp_ratio * d_model.
    tie_embeddings: the output head reuses the token embedding (True) or is its own matrix.
    pos_emb: "learned" (default), "sinusoidal" or "none".
    impl: the recurrent mixers' form: "auto" (default) runs the Pallas kernel where it takes
      the call (VLA on an NVIDIA GPU of compute capability >= 8.0, unpacked rows, head dims
      and chunk size it takes) and "chunked" otherwise, logging the choice once
      (`vla_jax.ops.impl.resolve_impl`); or "chunked", "scan", "associative_scan", "pallas",
      "pallas_interpret". An explicit "pallas" the kernel does not take raises at validation.
    chunk_size: tokens per chunk of the recurrent mixers.
    mixer_options: the mixer's own options as sorted (name, value) pairs (given as a mapping
      or as pairs; `option_pairs`).
    dtype, param_dtype: "float32" | "bfloat16" | "float16" names: the activations' and the
      parameters' dtypes (recurrent states are float32 whatever `dtype`; logits float32).
      Mixed precision: dtype "bfloat16" with param_dtype "float32" (parameters and so the
      optimizer state stay float32; `configs/mqar_zoology_bf16.py`).
    remat: recompute each block's activations in the backward pass instead of keeping them
      (`nnx.remat` around every block): the same function and gradients, less activation
      memory for about one more forward pass of compute. Default False.
  """

  vocab_size: int
  max_len: int
  mixer: str = "vla"
  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  head_dim: int | None = None
  mlp_ratio: int = 4
  tie_embeddings: bool = True
  pos_emb: str = "learned"
  impl: str = "auto"
  chunk_size: int = 64
  mixer_options: tuple = ()
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False

  def __post_init__(self):
    object.__setattr__(self, "mixer_options", option_pairs(self.mixer_options))
    self.validate()

  @property
  def options(self) -> dict[str, Any]:
    return dict(self.mixer_options)

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

  def validate(self) -> None:
    """Raises ValueError with a clear message for an inconsistent configuration: the fields,
    then the mixer as `Block` builds it, abstractly (`nnx.eval_shape`: every check of its
    constructor, no parameter allocated), except for the backend, which the layers check
    when they are built (an explicit impl "pallas" is checked as "pallas_interpret", the same
    kernel's facts on any backend; softmax attention's implementation "cudnn" is checked
    for its dtype)."""
    mixer_class(self.mixer)
    check_mixer_options(self.mixer, self.options)
    for name in ("vocab_size", "max_len", "d_model", "num_layers", "num_heads", "mlp_ratio"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"model.{name} must be a positive int; got {value!r}")
    head_dim = common.resolve_head_dim("model", self.d_model, self.num_heads, self.head_dim,
                                       free=False)
    if head_dim * self.num_heads != self.d_model:
      raise ValueError(f"model.head_dim * model.num_heads must equal model.d_model; got "
                       f"{head_dim} * {self.num_heads} != {self.d_model}")
    common.check_choice("model", "pos_emb", self.pos_emb, POSITION_EMBEDDINGS)
    common.check_choice("model", "dtype", self.dtype, tuple(DTYPES))
    common.check_choice("model", "param_dtype", self.param_dtype, tuple(DTYPES))
    for name in ("tie_embeddings", "remat"):
      common.check_bool("model", name, getattr(self, name))
    try:
      checks.check_chunk_size(self.chunk_size)
    except ValueError as e:
      raise ValueError(f"model.{e}") from None
    self.check_impl()
    impl, options = parse_impl(self.impl, tuple(Impl)), self.options
    try:
      if self.mixer == "softmax" and options.get("implementation") == "cudnn":
        # cuDNN's dtype rule here, its backend when the layer is built.
        check_implementation("SoftmaxAttention", "cudnn", DTYPES[self.dtype], backend=None)
        options = dict(options, implementation="xla")
      nnx.eval_shape(lambda: make_mixer(
          self.mixer, self.d_model, self.num_heads, self.head_dim,
          impl=Impl.PALLAS_INTERPRET if impl is Impl.PALLAS else impl,
          chunk_size=self.chunk_size, options=options, dtype=DTYPES[self.dtype],
          param_dtype=DTYPES[self.param_dtype], rngs=nnx.Rngs(0)))
    except (TypeError, ValueError) as e:
      raise ValueError(f"model.mixer_options: {e}") from None

  def check_impl(self, packed: bool = False):
    """Raises ValueError where the recurrent mixers would reject `impl` (an explicit "pallas"
    at head dims, a chunk size, dtype or mixer options the kernel does not take; `packed`:
    rows with `segment_ids`), before any layer is built; the backend is checked when the
    layers are."""
    try:
      check_mixer_impl(self.mixer, self.impl, head_dim=self.resolved_head_dim,
                       chunk_size=self.chunk_size, dtype=DTYPES[self.dtype],
                       options=self.options, packed=packed)
    except ValueError as e:
      raise ValueError(f"model.{e}") from None


def option_pairs(options) -> tuple:
  """A mixer's options, a mapping or (name, value) pairs (a list too, as JSON gives them
  back), as sorted (name, value) tuples: hashable, so that `ModelConfig` is. ValueError naming
  model.mixer_options for anything else, a repeated name or an unhashable value."""
  if isinstance(options, Mapping):
    pairs = list(options.items())
  elif isinstance(options, (tuple, list)) and all(
      isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) for p in options):
    pairs = [tuple(p) for p in options]
  else:
    raise ValueError(f"model.mixer_options must be a mapping of option names to values, or "
                     f"(name, value) pairs; got {options!r}")
  names = [name for name, _ in pairs]
  for name in names:
    if names.count(name) > 1:
      raise ValueError(f"model.mixer_options repeats option {name!r}: {options!r}")
  for name, value in pairs:
    try:
      hash(value)
    except TypeError:
      raise ValueError(f"model.mixer_options: option {name} has an unhashable value "
                       f"{value!r} (the config is hashable; give a number, str or bool)"
                       ) from None
  return tuple(sorted(pairs))


def sinusoidal_positions(positions, d_model):
  """sin/cos position codes (Vaswani et al., 2017): int positions [...] -> [..., d_model]
  float32."""
  pos = jnp.asarray(positions).astype(jnp.float32)[..., None]
  half = d_model // 2
  freq = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
  angles = pos * freq
  table = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  return jnp.pad(table, ((0, 0),) * (table.ndim - 1) + ((0, d_model - 2 * half),))


class MLP(nnx.Module):
  """x -> W_2 gelu(W_1 x)."""

  def __init__(self, d_model, hidden, *, dtype, param_dtype, rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.up = nnx.Linear(d_model, hidden, **kw)
    self.down = nnx.Linear(hidden, d_model, **kw)

  def __call__(self, x):
    return self.down(jax.nn.gelu(self.up(x)))


class Block(nnx.Module):
  """Pre-norm residual block: x + mixer(LN(x)), then x + MLP(LN(x))."""

  def __init__(self, config: ModelConfig, *, rngs):
    dtype, param_dtype = DTYPES[config.dtype], DTYPES[config.param_dtype]
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.norm1 = nnx.LayerNorm(config.d_model, **kw)
    self.mixer = make_mixer(config.mixer, config.d_model, config.num_heads, config.head_dim,
                            impl=config.impl, chunk_size=config.chunk_size,
                            options=config.options, **kw)
    self.norm2 = nnx.LayerNorm(config.d_model, **kw)
    self.mlp = MLP(config.d_model, config.mlp_ratio * config.d_model, **kw)

  def __call__(self, x, attention_mask=None, segment_ids=None):
    x = x + self.mixer(self.norm1(x), attention_mask=attention_mask, segment_ids=segment_ids)
    return x + self.mlp(self.norm2(x))

  def prefill(self, x, cache, attention_mask=None, segment_ids=None):
    y, cache = self.mixer.prefill(self.norm1(x), cache, attention_mask=attention_mask,
                                  segment_ids=segment_ids)
    x = x + y
    return x + self.mlp(self.norm2(x)), cache

  def step(self, x_t, cache):
    y, cache = self.mixer.step(self.norm1(x_t), cache)
    x_t = x_t + y
    return x_t + self.mlp(self.norm2(x_t)), cache


def _apply_block(block, x, attention_mask, segment_ids):
  return block(x, attention_mask, segment_ids)


class ModelCache(NamedTuple):
  """Streaming cache of a `LanguageModel`: each sequence's next position (int32 [B]: the
  number of real tokens it has seen) and one cache per layer (`RecurrentCache` for recurrent
  mixers, `KVCache` for softmax attention)."""

  position: jax.Array
  layers: tuple


class LanguageModel(nnx.Module):
  """Token (+ position) embeddings, `num_layers` pre-norm blocks, a final LayerNorm and a tied
  or untied head: tokens [B, T] int -> logits [B, T, vocab_size] float32.

  Attributes:
    config: the `ModelConfig`.
    embed: token embedding [vocab_size, d_model]; pos_embed: [max_len, d_model] when learned.
    blocks, final_norm, head (None when tied).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    config.validate()
    self.config = config
    dtype, param_dtype = DTYPES[config.dtype], DTYPES[config.param_dtype]
    self.dtype = dtype
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.embed = nnx.Embed(config.vocab_size, config.d_model, **kw)
    self.pos_embed = (nnx.Embed(config.max_len, config.d_model, **kw)
                      if config.pos_emb == "learned" else None)
    self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
    self.final_norm = nnx.LayerNorm(config.d_model, **kw)
    self.head = (None if config.tie_embeddings else
                 nnx.Linear(config.d_model, config.vocab_size, use_bias=False, **kw))

  def _check_ids(self, tokens, name="tokens"):
    """Token ids must be an int array, [B, T] for `name` "tokens" ([B] for "token", whose
    shape `step` checks), and in [0, vocab_size): a ValueError naming the first offending id,
    its position and vocab_size when the ids are concrete (an eager call, `generate`'s
    prompt). Under jit they are tracers and are not checked here: `embed_tokens` turns an id out of
    range into a NaN embedding (never another token's), whose NaN stays in its own document
    (the training data is checked when it is made or loaded, `vla_jax.tasks`)."""
    if not jnp.issubdtype(getattr(tokens, "dtype", np.float64), jnp.integer):
      raise TypeError(f"{name} must be an int array of token ids; got "
                      f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
    if name == "tokens" and tokens.ndim != 2:
      raise ValueError(f"tokens must have shape [B, T] (int token ids); got "
                       f"{tuple(tokens.shape)}")
    if isinstance(tokens, jax.core.Tracer):
      return
    ids = np.asarray(tokens)
    bad = (ids < 0) | (ids >= self.config.vocab_size)
    if bad.any():
      position = tuple(int(i) for i in np.argwhere(bad)[0])
      raise ValueError(f"{name}: token id {int(ids[position])} at position {position} is not "
                       f"in [0, vocab_size={self.config.vocab_size})")

  def embed_tokens(self, tokens: jax.Array, offset: int | jax.Array = 0,
                   mask: jax.Array | None = None, docs: jax.Array | None = None) -> jax.Array:
    """The first block's input: token and position embeddings of tokens [B, T] int after
    `offset` earlier tokens (an int or int [B]; default 0) -> [B, T, d_model] in `dtype`,
    at the positions of `common.token_positions`: with `mask` ([B, T] bool) a token's
    position counts the real tokens before it only, so a padded sequence embeds its real
    tokens as the unpadded one does; with `docs` (`common.document_ids`) positions restart at
    0 at each document start (`offset` counts for the row's first document only)."""
    # An id out of range takes the row past the table (a NaN embedding), negative ones too
    # (jnp.take would wrap them around to another token's row).
    vocab = self.config.vocab_size
    x = self.embed(jnp.where((tokens >= 0) & (tokens < vocab), tokens, vocab))
    if self.config.pos_emb == "none":
      return x
    positions = common.token_positions(tokens.shape, offset, mask, docs)[0]
    if self.config.pos_emb == "learned":
      return x + self.pos_embed(positions)
    return x + sinusoidal_positions(positions, self.config.d_model).astype(x.dtype)

  def _logits(self, x):
    x = self.final_norm(x)
    logits = self.embed.attend(x) if self.head is None else self.head(x)
    return logits.astype(jnp.float32)

  def _mask(self, tokens, attention_mask, segment_ids=None):
    """The checked mask and `common.document_ids` of `segment_ids`."""
    mask = common.check_attention_mask("LanguageModel", attention_mask, *tokens.shape[:2])
    return mask, common.document_ids("LanguageModel", segment_ids, *tokens.shape[:2], mask)

  def features(self, tokens: jax.Array, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """tokens: [B, T] int, T <= max_len -> the last block's output [B, T, d_model] (before
    the final LayerNorm and the head; `head_logits` maps it to logits). `attention_mask` and
    `segment_ids` as in `__call__`."""
    self._check_ids(tokens)
    T = tokens.shape[1]
    if T > self.config.max_len:
      raise ValueError(f"sequence length {T} exceeds model.max_len={self.config.max_len}")
    mask, docs = self._mask(tokens, attention_mask, segment_ids)
    x = self.embed_tokens(tokens, 0, mask, docs)
    for block in self.blocks:
      x = (nnx.remat(_apply_block)(block, x, mask, docs) if self.config.remat
           else block(x, mask, docs))
    return x

  def head_logits(self, x: jax.Array) -> jax.Array:
    """Features [..., d_model] -> logits [..., vocab_size] float32 (final LayerNorm, head)."""
    return self._logits(x)

  def __call__(self, tokens: jax.Array, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """tokens: [B, T] int, T <= max_len -> logits [B, T, vocab_size] float32.

    `attention_mask` ([B, T] bool, True = a real token; None: all real) marks padding, left,
    right or anywhere: the logits at the real tokens equal those of the unpadded sequences
    (positions count real tokens only); those at the pads mean nothing.

    `segment_ids` ([B, T] int; None: one document per row) packs several documents into a
    row: equal ids form one document, documents are contiguous, and a document starts where
    the id changes. Each document's logits equal those of the document alone: positions
    restart at 0, and every mixer restarts its state, convolution and attention there
    (`vla_jax.layers.common`). Both arguments may be given.

    Token ids outside [0, vocab_size) raise ValueError (naming the id, its position and
    vocab_size) when `tokens` is concrete; under jit they embed as NaN, so the logits of that
    token and the later ones of its document are NaN, and other documents keep theirs.
    """
    return self._logits(self.features(tokens, attention_mask, segment_ids))

  def init_cache(self, batch_size: int, max_len: int | None = None) -> ModelCache:
    """An empty streaming cache for `batch_size` (an int >= 0) sequences of up to `max_len`
    tokens (default model.max_len; softmax layers preallocate their KV cache to it, and padded
    tokens take room there too)."""
    batch_size = checks.check_size("LanguageModel: batch_size", batch_size)
    max_len = self.config.max_len if max_len is None else max_len
    if not 0 < max_len <= self.config.max_len:
      raise ValueError(f"cache max_len must be in [1, model.max_len={self.config.max_len}]; "
                       f"got {max_len}")
    return ModelCache(jnp.zeros((batch_size,), jnp.int32),
                      tuple(b.mixer.init_cache(batch_size, max_len) for b in self.blocks))

  def _check_cache(self, cache, batch, arg):
    """A `ModelCache` of one layer cache per block, for `batch` sequences (each layer checks
    its own cache's shapes)."""
    if not isinstance(cache, ModelCache):
      raise TypeError(f"cache must be a ModelCache (LanguageModel.init_cache); got "
                      f"{type(cache).__name__}")
    if len(cache.layers) != len(self.blocks):
      raise ValueError(f"cache has {len(cache.layers)} layer caches; the model has "
                       f"{len(self.blocks)} blocks")
    shape = tuple(getattr(cache.position, "shape", ()))
    if shape != (batch,):
      raise ValueError(f"cache is for batch size {shape[0] if shape else None}; {arg} has "
                       f"B={batch} (init_cache({batch}))")

  def _check_room(self, cache, T):
    """With learned positions, the next T tokens must stay within model.max_len (a position
    past the table would embed as NaN). Checked when the positions are concrete; softmax
    layers check their KV caches the same way."""
    try:
      position = int(jnp.max(cache.position))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
      return
    if self.config.pos_emb == "learned" and position + T > self.config.max_len:
      raise ValueError(f"{T} more tokens after position {position} pass model.max_len="
                       f"{self.config.max_len} (learned position embeddings)")

  def prefill(self, tokens: jax.Array, cache: ModelCache,
              attention_mask: jax.Array | None = None,
              segment_ids: jax.Array | None = None) -> tuple[jax.Array, ModelCache]:
    """Runs a prompt tokens [B, T] through the model from `cache` with the mixers' sequence
    ops (any impl) -> (logits [B, T, vocab_size] float32, the cache after the prompt).
    `attention_mask` ([B, T] bool, True = a real token) marks padding as in `__call__` (a
    batch of prompts of different lengths, left-padded, continues with `step` as each prompt
    alone would). `segment_ids` packs documents as in `__call__`: the first continues the
    cache, and the returned cache (positions included) continues the last. Raises ValueError
    when the tokens do not fit (see `_check_room`; KV caches are checked by their layers)."""
    self._check_ids(tokens)
    self._check_cache(cache, tokens.shape[0], "tokens")
    self._check_room(cache, tokens.shape[1])
    mask, docs = self._mask(tokens, attention_mask, segment_ids)
    x = self.embed_tokens(tokens, cache.position, mask, docs)
    layers = []
    for block, layer_cache in zip(self.blocks, cache.layers):
      x, layer_cache = block.prefill(x, layer_cache, mask, docs)
      layers.append(layer_cache)
    position = common.token_positions(tokens.shape, cache.position, mask, docs)[1]
    return self._logits(x), ModelCache(position, tuple(layers))

  def step(self, token: jax.Array, cache: ModelCache) -> tuple[jax.Array, ModelCache]:
    """One token per sequence, token [B] int -> (logits [B, vocab_size] float32, cache)."""
    if getattr(token, "ndim", None) != 1:
      raise ValueError(f"step takes one token per sequence, shape [B]; got shape "
                       f"{getattr(token, 'shape', None)} (use prefill for [B, T])")
    self._check_cache(cache, token.shape[0], "token")
    self._check_room(cache, 1)
    self._check_ids(token, "token")
    x = self.embed_tokens(token[:, None], cache.position)[:, 0]
    layers = []
    for block, layer_cache in zip(self.blocks, cache.layers):
      x, layer_cache = block.step(x, layer_cache)
      layers.append(layer_cache)
    return self._logits(x), ModelCache(cache.position + 1, tuple(layers))

  def generate(self, prompt: jax.Array, max_new_tokens: int, *, temperature: float = 0.0,
               top_k: int | None = None, eos_id: int | None = None,
               rng: jax.Array | None = None) -> jax.Array:
    """Continues `prompt` [B, P] int by `max_new_tokens` tokens; see `generate`."""
    return generate(self, prompt, max_new_tokens, temperature=temperature, top_k=top_k,
                    eos_id=eos_id, rng=rng)


def generate(model: LanguageModel, prompt: jax.Array, max_new_tokens: int, *,
             temperature: float = 0.0, top_k: int | None = None, eos_id: int | None = None,
             rng: jax.Array | None = None) -> jax.Array:
  """Greedy (temperature 0) or sampled decoding: prefill the prompt, then one `step` per new
  token inside a `lax.while_loop`, all compiled once per (prompt shape, max_new_tokens,
  temperature, top_k, eos_id).

  Args:
    model: a `LanguageModel`.
    prompt: [B, P] int token ids, P >= 1.
    max_new_tokens: N >= 1; P + N - 1 tokens are fed to the model and must fit
      model.max_len.
    temperature: 0 for argmax, > 0 to sample from softmax(logits / temperature).
    top_k: None (default) samples from every token; an int k in [1, vocab_size] samples from
      the k most likely ones only (top_k=1 is greedy). No effect when temperature is 0.
    eos_id: None (default), or the end-of-sequence token id in [0, vocab_size): once a
      sequence has generated it, every later position of that sequence holds eos_id, and
      decoding stops as soon as all sequences have ended.
    rng: a `jax.random` key (needed when temperature > 0).

  Returns:
    [B, P + N] int32: the prompt followed by the generated tokens.
  """
  prompt = jnp.asarray(prompt)
  if prompt.ndim != 2 or prompt.shape[1] < 1 or not jnp.issubdtype(prompt.dtype, jnp.integer):
    raise ValueError(f"prompt must be int tokens of shape [B, P] with P >= 1; got "
                     f"{prompt.dtype} {prompt.shape}")
  vocab = model.config.vocab_size
  low, high = int(prompt.min()), int(prompt.max())
  if low < 0 or high >= vocab:
    raise ValueError(f"prompt token ids must lie in [0, vocab_size={vocab}); got {low} .. "
                     f"{high}")
  if not checks.is_int(max_new_tokens) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an int >= 1; got {max_new_tokens!r}")
  max_new_tokens = int(max_new_tokens)
  fed = prompt.shape[1] + max_new_tokens - 1  # the last new token is not fed back
  if fed > model.config.max_len:
    raise ValueError(f"prompt length {prompt.shape[1]} + max_new_tokens {max_new_tokens} - 1 = "
                     f"{fed} tokens exceed model.max_len={model.config.max_len} (the position "
                     f"table and KV caches are that long)")
  temperature = _check_temperature(temperature)
  if temperature > 0 and rng is None:
    raise ValueError("sampling with temperature > 0 needs rng (a jax.random key)")
  if rng is not None and not _is_key(rng):
    raise ValueError(f"rng must be a jax.random key (jax.random.key(seed)); got {rng!r}")
  if top_k is not None:
    if not checks.is_int(top_k) or not 1 <= top_k <= vocab:
      raise ValueError(f"top_k must be None or an int in [1, vocab_size={vocab}]; got "
                       f"{top_k!r}")
    top_k = None if int(top_k) == vocab else int(top_k)
  if eos_id is not None:
    if not checks.is_int(eos_id) or not 0 <= eos_id < vocab:
      raise ValueError(f"eos_id must be None or a token id in [0, vocab_size={vocab}); got "
                       f"{eos_id!r}")
    eos_id = int(eos_id)
  rng = jax.random.key(0) if rng is None else rng
  return _generate(model, prompt.astype(jnp.int32), rng, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_k=top_k, eos_id=eos_id)


def _check_temperature(temperature):
  """`temperature` as a float if it is a finite real number >= 0 (Python, NumPy or a JAX
  scalar; not a str or bool), else ValueError naming it."""
  value = checks.nonnegative(temperature)
  if value is not None:
    return value
  raise ValueError(f"temperature must be a finite number >= 0; got {temperature!r}")


def _is_key(rng):
  """Whether `rng` is one `jax.random` key: a typed key array of shape [], or a raw uint32 [2]
  key (`jax.random.PRNGKey`)."""
  dtype, shape = getattr(rng, "dtype", None), getattr(rng, "shape", None)
  if dtype is None:
    return False
  if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return shape == ()
  return dtype == jnp.uint32 and tuple(shape) == (2,)


@functools.partial(nnx.jit, static_argnames=("max_new_tokens", "temperature", "top_k",
                                             "eos_id"))
def _generate(model, prompt, rng, *, max_new_tokens, temperature, top_k, eos_id):
  batch = prompt.shape[0]
  cache = model.init_cache(batch, prompt.shape[1] + max_new_tokens - 1)
  logits, cache = model.prefill(prompt, cache)

  def pick(logits_t, key):
    if temperature == 0:
      return jnp.argmax(logits_t, axis=-1).astype(jnp.int32)
    scaled = logits_t / temperature
    if top_k is None:
      return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
    values, ids = jax.lax.top_k(scaled, top_k)
    choice = jax.random.categorical(key, values, axis=-1)
    return jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)

  def ended(token):
    return jnp.zeros(token.shape, bool) if eos_id is None else token == eos_id

  keys = jax.random.split(rng, max_new_tokens)
  first = pick(logits[:, -1], keys[0])
  pad = 0 if eos_id is None else eos_id
  out = jnp.full((batch, max_new_tokens), pad, jnp.int32).at[:, 0].set(first)

  def cond(carry):
    i, _, _, done, _ = carry
    return (i < max_new_tokens) & ~jnp.all(done)

  def body(carry):
    i, token, cache, done, out = carry
    logits_t, cache = model.step(token, cache)
    token = jnp.where(done, pad, pick(logits_t, keys[i]))
    out = jax.lax.dynamic_update_slice(out, token[:, None], (0, i))
    return i + 1, token, cache, done | ended(token), out

  carry = (jnp.asarray(1, jnp.int32), first, cache, ended(first), out)
  out = jax.lax.while_loop(cond, body, carry)[-1]
  return jnp.concatenate([prompt, out], axis=1)
