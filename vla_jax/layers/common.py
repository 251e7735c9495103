"""Pieces shared by the mixers: head arithmetic, projections, the short convolution, the readout.

Every mixer maps x [B, T, d_model] -> y [B, T, d_model] and is causal. Parameters are stored in
`param_dtype`, activations computed in `dtype`; recurrences keep their state in float32
(float64 under x64) whatever `dtype` is, and return outputs in `dtype`.

Padding: every mixer's `__call__` and `prefill` take `attention_mask` ([B, T] bool, True = a
real token). A mixer computes at the real tokens, and leaves in its cache, exactly what it would
for the sequence with the padded positions deleted, wherever the pads are (left, right or
between tokens); its outputs at padded positions are 0. Pads are removed by selection
(`jnp.where`), never by multiplying with the mask, so a NaN or Inf at a padded position reaches
neither the outputs nor the gradients.

Packing: `__call__` and `prefill` also take `segment_ids` ([B, T] int; equal ids = one
document, documents contiguous, a new document wherever the id changes), with or without
`attention_mask`. Each document is computed as if it were alone: the recurrent state restarts
at its first token (S = 0; VLA's A = I / lam0), a short convolution's window never reaches into
the previous document, and softmax attention attends within the document only. Boundaries are
read among the real tokens (a pad between two tokens of one id splits nothing). The row's first
document continues from the cache passed to `prefill`, and the returned cache is that of the
row's last document (so a stream continues the last document).
"""

from typing import Any, NamedTuple

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from vla_jax.ops import checks
from vla_jax.ops.impl import KERNEL_IMPLS, Impl, choose_impl, parse_impl
from vla_jax.ops.utils import document_starts, unit


class RecurrentCache(NamedTuple):
  """What a recurrent mixer carries between calls when streaming.

  Attributes:
    state: the recurrence's state (`VLAState`, `LinearAttentionState` or S [B, H, dv, dk]),
      float32 (float64 when the activations are float64); its size does not grow with T.
    conv: the short convolutions' prefixes, each [B, K-1, inner] (empty without convolution).
    norm: VLA's "additive" readout sum z [B, H, dk] (empty otherwise).
  """

  state: Any
  conv: tuple = ()
  norm: Any = ()


def state_dtype(dtype):
  """Recurrent states (and gates) are float32, or float64 when the activations are float64
  and x64 mode is on (as JAX stores them: without it a float64 layer computes in float32)."""
  return jax.dtypes.canonicalize_dtype(jnp.promote_types(dtype, jnp.float32))


def check_recurrence_options(name, impl, chunk_size, *, op, dtype, head_dims, options=None):
  """`impl` and `chunk_size` checked when a layer is built, not at its first call: returns
  (impl as an `Impl`, chunk_size). "auto" is resolved per call (`recurrence_impl`); an
  explicit "pallas" or "pallas_interpret" that the kernel of `op` cannot run (on this
  backend, at these head dims, chunk size, dtype or `options`) raises ValueError naming the
  option (`vla_jax.ops.impl.resolve_impl`)."""
  try:
    impl = parse_impl(impl, tuple(Impl))
    chunk_size = checks.check_chunk_size(chunk_size)
  except ValueError as e:
    raise ValueError(f"{name}: {e}") from None
  if impl in KERNEL_IMPLS:
    choose_impl(impl, name=name, op=op, dtype=dtype, head_dims=head_dims,
                chunk_size=chunk_size, options=options)
  return impl, chunk_size


def recurrence_impl(name, impl, *, op, dtype, head_dims, chunk_size, docs, options=None):
  """The `Impl` a layer's call runs (`vla_jax.ops.impl.choose_impl` on JAX's current backend;
  "auto" logs its choice once): `docs` (`document_ids` or None) says whether the call packs
  documents. Raises ValueError, naming the layer, for an explicit kernel impl with packing."""
  return choose_impl(impl, name=name, op=op, dtype=dtype, head_dims=head_dims,
                     chunk_size=chunk_size, segment_ids=docs is not None, options=options)


def resolve_head_dim(name, d_model, num_heads, head_dim, *, free=True):
  """Returns the per-head width; `head_dim=None` means d_model // num_heads (must divide).
  `free`: whether the caller takes any head_dim (the recurrent mixers) or only
  d_model // num_heads (softmax attention, the model): the hint of the error follows it."""
  for arg, value in (("d_model", d_model), ("num_heads", num_heads)):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"{name}: {arg} must be a positive int; got {value!r}")
  if head_dim is None:
    if d_model % num_heads:
      hint = ("pass head_dim explicitly or change num_heads" if free else
              "choose a num_heads that divides d_model (num_heads * head_dim must equal "
              "d_model here)")
      raise ValueError(f"{name}: d_model={d_model} is not divisible by num_heads={num_heads}; "
                       f"{hint}")
    return d_model // num_heads
  if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
    raise ValueError(f"{name}: head_dim must be a positive int or None; got {head_dim!r}")
  return head_dim


def check_attention_mask(name, attention_mask, batch, length):
  """None, or `attention_mask` as a bool [B, T] array (True = a real token). Integer masks
  count non-zero entries as real tokens; other dtypes and shapes raise naming the argument."""
  if attention_mask is None:
    return None
  mask = jnp.asarray(attention_mask)
  if mask.shape != (batch, length):
    raise ValueError(f"{name}: attention_mask must have shape [B, T] = ({batch}, {length}) "
                     f"like the input; got {mask.shape}")
  if mask.dtype == jnp.bool_:
    return mask
  if jnp.issubdtype(mask.dtype, jnp.integer):
    return mask != 0
  raise TypeError(f"{name}: attention_mask must be bool (True = a real token) or integer; got "
                  f"{mask.dtype}")


def document_ids(name, segment_ids, batch, length, mask=None):
  """None, or `segment_ids` ([B, T] int) checked and renumbered: [B, T] int32 counting the
  document starts among the real tokens up to each token (0 for the row's first document).
  With `mask`, a document starts at a real token whose id differs from the previous real
  token's; a pad takes the document of the real token before it (leading pads the first)."""
  try:
    ids = checks.check_segment_ids(segment_ids, batch, length)
  except (TypeError, ValueError) as e:
    raise type(e)(f"{name}: {e}") from None
  if ids is None:
    return None
  if mask is None:
    starts = document_starts(ids)
  else:
    plan = compaction(mask)
    real = jnp.arange(length)[None, :] < plan.count[:, None]
    starts_c = document_starts(jnp.take_along_axis(ids, plan.order, axis=1)) & real
    starts = mask & jnp.take_along_axis(starts_c, plan.rank, axis=1)
  return jnp.cumsum(starts, axis=1, dtype=jnp.int32)


def token_positions(shape, offset, mask=None, docs=None):
  """(positions [B, T] int32, the next position [B] int32) of tokens of `shape` [B, T] after
  `offset` (an int or int [B]) earlier tokens. A token's position counts the real tokens
  before it (`mask` [B, T] bool, None: all real), so a padded sequence has its unpadded
  positions; with `docs` (`document_ids`) positions restart at 0 at each document start, and
  `offset` counts for the row's first document only. Pads get position 0. The rule of the
  model's position embeddings and of softmax attention's rotary embeddings."""
  real = jnp.ones(shape, jnp.bool_) if mask is None else mask
  offset = jnp.broadcast_to(jnp.asarray(offset, jnp.int32).reshape(-1), shape[:1])
  rank = jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1          # index among real tokens
  count = rank[:, -1] + 1 if shape[1] else jnp.zeros(shape[:1], jnp.int32)
  if docs is None:
    positions, following = offset[:, None] + rank, offset + count
  else:
    start = jax.lax.cummax(jnp.where(document_starts(docs), rank, 0), axis=1)
    first = docs == 0
    positions = jnp.where(first, offset[:, None] + rank, rank - start)
    following = jnp.where(first[:, -1], offset + count, count - start[:, -1])
  return jnp.where(real, positions, 0), following


def mask_tokens(mask, *arrays):
  """Each of `arrays` ([B, T, ...]) with its padded positions (mask [B, T] False) set to 0 by
  selection; `mask` None returns them unchanged. Returns one array for one argument."""
  if mask is not None:
    arrays = tuple(jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 2)), a,
                             jnp.zeros((), a.dtype)) for a in arrays)
  return arrays[0] if len(arrays) == 1 else arrays


class Compaction(NamedTuple):
  """Where the real tokens of each row go when the pads are deleted (see `compaction`).

  Attributes:
    order: [B, T] int, the positions of the real tokens in order, then those of the pads.
    rank: [B, T] int, each real token's index among the real tokens of its row (0 at pads).
    count: [B] int, the number of real tokens per row.
  """

  order: jax.Array
  rank: jax.Array
  count: jax.Array


def compaction(mask):
  """The `Compaction` of a [B, T] bool mask."""
  order = jnp.argsort(jnp.logical_not(mask), axis=1, stable=True)
  rank = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 0)
  return Compaction(order, rank, jnp.sum(mask, axis=1))


def compact(x, plan):
  """x [B, T, F] -> the real tokens of each row first, in order, then zeros."""
  xc = jnp.take_along_axis(x, plan.order[..., None], axis=1)
  keep = jnp.arange(x.shape[1])[None, :] < plan.count[:, None]
  return mask_tokens(keep, xc)


def expand(xc, plan, mask):
  """Inverse of `compact`: xc [B, T, F] back at the real tokens' positions, 0 at the pads."""
  return mask_tokens(mask, jnp.take_along_axis(xc, plan.rank[..., None], axis=1))


def check_choice(name, arg, value, choices):
  if value not in choices:
    raise ValueError(f"{name}: {arg} must be one of {', '.join(map(repr, choices))}; "
                     f"got {value!r}")
  return value


def check_dtype(name, arg, dtype):
  """`dtype` (a layer's dtype or param_dtype) if it names a floating dtype, else TypeError
  naming the layer and the argument."""
  try:
    floating = dtype is not None and jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    shown = jnp.dtype(dtype).name
  except TypeError:
    floating, shown = False, repr(dtype)
  if not floating:
    raise TypeError(f"{name}: {arg} must be a floating dtype (float32, bfloat16, float16 or "
                    f"float64); got {shown}")
  return dtype


def check_bool(name, arg, value):
  """`value` if it is a bool (NumPy's too), else ValueError naming the layer and option
  (`checks.check_bool`)."""
  return checks.check_bool(f"{name}: {arg}", value)


def check_positive_int(name, arg, value):
  """`value` if it is an int >= 1, else ValueError naming the layer and option."""
  if not checks.is_int(value) or value < 1:
    raise ValueError(f"{name}: {arg} must be an int >= 1; got {value!r}")
  return int(value)


def dense(d_in, d_out, *, use_bias, dtype, param_dtype, rngs):
  return nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                    rngs=rngs)


def split_heads(x, num_heads):
  """[B, T, H * D] -> [B, T, H, D]."""
  return x.reshape(x.shape[:-1] + (num_heads, x.shape[-1] // num_heads))


def merge_heads(x):
  """[B, T, H, D] -> [B, T, H * D]."""
  return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def l2_normalize(x, eps=1e-6):
  """x / ||x|| along the last axis where ||x|| > eps, else 0 (with a zero gradient there):
  the ops' `unit`."""
  return unit(x, eps)


class ShortConv(nnx.Module):
  """Causal depthwise convolution over time followed by SiLU (flash-linear-attention's
  `ShortConvolution`); y_t depends on x_{t-K+1..t} only.

  Attributes:
    kernel: [K, features] taps; tap K-1 multiplies the current token.
  """

  def __init__(self, features, kernel_size, *, dtype, param_dtype, rngs):
    self.kernel_size = kernel_size
    self.dtype = dtype
    init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=0,
                                                out_axis=())
    self.kernel = nnx.Param(init(rngs.params(), (kernel_size, features), param_dtype))

  def __call__(self, x, prefix=None, docs=None):
    """x: [B, T, F] -> [B, T, F].

    `prefix` ([B, K-1, F], default zeros) holds the K-1 inputs before x: with the tail a
    previous call returned it continues a sequence (streaming); see `tail`. `docs` ([B, T]
    int, `document_ids`, or None): a token's window holds the inputs of its own document only
    (selected, the others count as 0); the prefix belongs to document 0.
    """
    K = self.kernel_size
    w = self.kernel[...].astype(self.dtype)
    if prefix is None:
      xp = jnp.pad(x, ((0, 0), (K - 1, 0), (0, 0)))
    else:
      xp = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    T = x.shape[1]
    # A non-finite input is zeroed by selection and its windows' outputs set to NaN after
    # the SiLU: no 0 * NaN (a zero cotangent through SiLU at NaN) reaches earlier inputs'
    # gradients.
    bad = ~jnp.isfinite(xp)
    xp = jnp.where(bad, jnp.zeros((), xp.dtype), xp)
    if docs is None:
      window = lambda a, i: a[:, i:i + T]
    else:
      dp = jnp.pad(docs, ((0, 0), (K - 1, 0)))        # the prefix is document 0's
      window = lambda a, i: jnp.where((dp[:, i:i + T] == docs)[..., None], a[:, i:i + T],
                                      jnp.zeros((), a.dtype))
    y = sum(window(xp, i) * w[i] for i in range(K))
    hit = functools.reduce(jnp.logical_or, (window(bad, i) for i in range(K)))
    return jnp.where(hit, jnp.asarray(jnp.nan, y.dtype), jax.nn.silu(y))

  def tail(self, x, prefix=None, length=None, docs=None):
    """The last K-1 inputs of `prefix` followed by x[:, :length] (length [B] int, default all
    of x): the next call's prefix, [B, K-1, F]. With `docs` (as in `__call__`) the inputs of
    documents before the last one (x[:, length - 1]'s) are 0."""
    K = self.kernel_size
    B, T = x.shape[:2]
    if prefix is None:
      prefix = jnp.zeros((B, K - 1, x.shape[2]), x.dtype)
    xp = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    if length is None:
      if docs is None or K == 1:
        return xp[:, T:]
      length = jnp.full((B,), T)
    index = length[:, None] + jnp.arange(K - 1)[None, :]
    tail = jnp.take_along_axis(xp, index[..., None], axis=1)
    if docs is None or K == 1:
      return tail
    dp = jnp.pad(docs, ((0, 0), (K - 1, 0)))
    last = jnp.take_along_axis(dp, index[:, -1:], axis=1)   # the last token's document
    same = jnp.take_along_axis(dp, index, axis=1) == last
    return jnp.where(same[..., None], tail, jnp.zeros((), tail.dtype))

  def empty_prefix(self, batch_size, features):
    return jnp.zeros((batch_size, self.kernel_size - 1, features), self.dtype)


# The recurrent mixers' default short convolution, the width every config uses: without it VLA
# stays at chance on the README's MQAR demo (measurements in vla_jax/layers/README.md).
DEFAULT_CONV_SIZE = 4


def short_convs(name, features, conv_size, *, dtype, param_dtype, rngs):
  """Three `ShortConv`s of width `conv_size` (for q, k and v) over `features` channels (an int,
  or the three widths), or None for `conv_size` 0."""
  if not checks.is_int(conv_size) or conv_size < 0:
    raise ValueError(f"{name}: conv_size must be an int >= 0 (0: no convolution); got "
                     f"{conv_size!r}")
  if not conv_size:
    return None
  widths = (features,) * 3 if checks.is_int(features) else tuple(features)
  return nnx.List([ShortConv(f, int(conv_size), dtype=dtype, param_dtype=param_dtype,
                             rngs=rngs) for f in widths])


def empty_prefixes(convs, batch_size):
  """Zero prefixes for each `ShortConv` of `convs`, each of its own width (None: no
  convolution, returns ())."""
  return (tuple(c.empty_prefix(batch_size, c.kernel.shape[1]) for c in convs) if convs
          else ())


def convolve(convs, tensors, prefixes=None, mask=None, docs=None):
  """Applies each `ShortConv` of `convs` to its tensor, continuing from `prefixes` (a tuple, or
  None for zeros). Returns (outputs, new prefixes); with no convolutions, returns the tensors
  and ().

  With `mask` ([B, T] bool), the convolutions run over the real tokens only: each real token's
  window holds the real tokens before it (then the prefix), as if the pads were deleted, the
  outputs at pads are 0, and the new prefixes end at the last real token. With `docs`
  ([B, T] int, `document_ids`), windows and prefixes stay inside their document.
  """
  if convs is None:
    return tuple(tensors), ()
  prefixes = prefixes or (None,) * len(tensors)
  if mask is None:
    outputs = tuple(conv(t, p, docs) for conv, t, p in zip(convs, tensors, prefixes))
    tails = tuple(conv.tail(t, p, docs=docs) for conv, t, p in zip(convs, tensors, prefixes))
    return outputs, tails
  plan = compaction(mask)
  compacted = tuple(compact(t, plan) for t in tensors)
  if docs is not None:
    docs = jnp.take_along_axis(docs, plan.order, axis=1)
  outputs = tuple(expand(conv(t, p, docs), plan, mask)
                  for conv, t, p in zip(convs, compacted, prefixes))
  tails = tuple(conv.tail(t, p, plan.count, docs)
                for conv, t, p in zip(convs, compacted, prefixes))
  return outputs, tails


def check_input(name, x, d_model, *, step=False):
  """A mixer's input: x [B, T, d_model] (`__call__`, `prefill`) or, with `step`, one token per
  sequence x_t [B, d_model], of a floating dtype. Raises ValueError for another shape and
  TypeError for another dtype, naming the layer, the argument and what was expected."""
  arg, layout = ("x_t", "[B, d_model") if step else ("x", "[B, T, d_model")
  shape = getattr(x, "shape", None)
  if shape is None or len(shape) != 2 + (not step) or shape[-1] != d_model:
    hint = ""
    if shape is not None and len(shape) == 3 and step:
      hint = " (one token; use the mixer's __call__ or prefill for [B, T, d_model])"
    elif shape is not None and len(shape) == 2 and not step:
      hint = " (a sequence; use the mixer's step for one token [B, d_model])"
    raise ValueError(f"{name}: {arg} must have shape {layout}={d_model}]{hint}; got "
                     f"{None if shape is None else tuple(shape)}")
  if not jnp.issubdtype(getattr(x, "dtype", None), jnp.floating):
    raise TypeError(f"{name}: {arg} must have a floating dtype (float32, bfloat16, float16 or "
                    f"float64); got {x.dtype}")


def check_cache(name, cache, cls, expected, batch, arg):
  """Checks a streaming cache before a `prefill` or `step` of `batch` sequences (`arg`: the
  input, "x" or "x_t"): a `cls` (TypeError otherwise, None included) whose arrays have the
  shapes of `expected()`, the abstract cache (`jax.eval_shape`) that the layer's `init_cache`
  gives for `batch` (ValueError naming the batch sizes, or the part of the cache and both
  shapes)."""
  if not isinstance(cache, cls):
    raise TypeError(f"{name}: cache must be a {cls.__name__} (the layer's init_cache or the "
                    f"cache a prefill or step returned); got {type(cache).__name__}")
  want = expected()
  got, tree = jax.tree_util.tree_flatten_with_path(cache)
  wanted, want_tree = jax.tree_util.tree_flatten_with_path(want)
  if tree != want_tree:
    raise ValueError(f"{name}: cache does not have the layout of this layer's init_cache: "
                     f"{tree}; expected {want_tree}")
  for (_, a), (_, w) in zip(got, wanted):
    shape = tuple(getattr(a, "shape", ()))
    if w.ndim and shape[:1] != (batch,):
      raise ValueError(f"{name}: cache is for batch size {shape[0] if shape else None}; {arg} "
                       f"has B={batch} (init_cache({batch}))")
  for (path, a), (_, w) in zip(got, wanted):
    if tuple(getattr(a, "shape", ())) != w.shape:
      raise ValueError(f"{name}: cache{jax.tree_util.keystr(path)} has shape "
                       f"{tuple(getattr(a, 'shape', ()))}; expected {w.shape} (this layer's "
                       f"init_cache)")


class OutputProjection(nnx.Module):
  """Merges heads, applies an optional LayerNorm over the merged width and the output
  projection W_o: [B, T, H, D] -> [B, T, d_model]."""

  def __init__(self, inner, d_model, *, out_norm, dtype, param_dtype, rngs):
    self.norm = (nnx.LayerNorm(inner, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
                 if out_norm else None)
    self.proj = dense(inner, d_model, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                      rngs=rngs)

  def __call__(self, o):
    y = merge_heads(o)
    if self.norm is not None:
      y = self.norm(y)
    return self.proj(y)


def concrete_int(x):
  """int(x) for a concrete scalar, None for a traced one (inside jit, where streaming bounds
  are the caller's to keep: `generate` checks them before it compiles)."""
  try:
    return int(x)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
    return None
