"""`SoftmaxAttention`: causal multi-head softmax attention."""

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.typing import DTypeLike

from vla_jax.layers import common
from vla_jax.ops import checks, nonfinite
from vla_jax.ops.utils import document_starts

IMPLEMENTATIONS = ("auto", "cudnn", "xla")
POSITIONS = ("none", "rope")
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def rotary_embedding(x, positions, base=10000.0):
  """Rotary position embedding (RoPE; Su et al., 2021, arXiv 2104.09864), half-split form:
  the pairs (x_i, x_{i + D/2}), i < D/2, of each head are rotated by the angle
  positions * base^(-2i / D), so that rotary(q, m) . rotary(k, n) depends on m - n only.

  Args:
    x: [B, T, H, D] with D even.
    positions: [B, T] int, each token's position.
    base: the frequencies' base (default 10000).

  Returns:
    [B, T, H, D] in x's dtype (angles and rotation computed in float32, float64 under x64
    for float64 x).
  """
  D = x.shape[-1]
  if D % 2:
    raise ValueError(f"rotary_embedding needs an even head dimension; got {D}")
  dtype = jnp.promote_types(x.dtype, jnp.float32)
  freq = base ** (-jnp.arange(D // 2, dtype=dtype) * 2 / D)
  angles = positions.astype(dtype)[:, :, None, None] * freq              # [B, T, 1, D/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = jnp.split(x.astype(dtype), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def resolve_implementation(implementation, dtype, backend=None):
  """The `jax.nn.dot_product_attention` implementation that "auto" stands for.

  "auto" is "cudnn" when the default backend is a GPU and `dtype` is bfloat16 or float16 (the
  dtypes cuDNN's fused attention supports), and "xla" otherwise. The rule depends only on the
  backend and the dtype, never on shapes, so one configuration always runs one algorithm.
  """
  if implementation != "auto":
    return implementation
  backend = backend or jax.default_backend()
  if backend == "gpu" and jnp.dtype(dtype) in tuple(map(jnp.dtype, _CUDNN_DTYPES)):
    return "cudnn"
  return "xla"


def check_implementation(name, implementation, dtype, backend):
  """The `jax.nn.dot_product_attention` implementation a layer `name` of `dtype` runs on
  `backend` (`resolve_implementation`). ValueError naming the option for an unknown one, for
  "cudnn" with a dtype other than bfloat16 or float16, and for "cudnn" off a GPU backend;
  `backend` None (a configuration checked before any layer is built) checks all but the
  backend and returns `implementation` as given."""
  common.check_choice(name, "implementation", implementation, IMPLEMENTATIONS)
  if implementation == "cudnn" and jnp.dtype(dtype) not in tuple(map(jnp.dtype, _CUDNN_DTYPES)):
    raise ValueError(f"{name}: implementation='cudnn' needs dtype bfloat16 or float16; got "
                     f"{jnp.dtype(dtype)}")
  if backend is None:
    return implementation
  if implementation == "cudnn" and backend != "gpu":
    raise ValueError(f"{name}: implementation='cudnn' cannot run here: the backend is "
                     f"{backend!r}, and cuDNN's fused attention runs on NVIDIA GPUs. Use "
                     f"implementation='auto' (cuDNN where it runs, else 'xla') or 'xla'")
  return resolve_implementation(implementation, dtype, backend)


class SoftmaxAttention(nnx.Module):
  """Causal softmax attention, x [B, T, d_model] -> [B, T, d_model]:
  y = W_o merge_heads(softmax(q k^T / sqrt(d_h) + causal mask) v).

  Attributes:
    d_model, num_heads, head_dim: num_heads * head_dim must equal d_model (standard MHA).
    implementation: "auto" (default; see `resolve_implementation`), "cudnn" (GPU, bf16/fp16
      only: another dtype or backend raises ValueError at construction) or "xla".
    conv_size: 0 (default: standard attention) or the width of a causal depthwise convolution
      on q, k, v, the same short convolution the recurrent mixers use (a like-for-like
      backbone for comparisons).
    positions: "none" (default: the layer sees positions only through its input, e.g. the
      model's position embedding) or "rope": q and k are rotated by `rotary_embedding` at
      each token's position, `common.token_positions` (real tokens counted, restarting at
      each packed document, continued across `prefill` / `step` calls from the cache), so
      the scores depend on relative positions; head_dim must be even.
    rope_base: RoPE's frequency base, a finite real number > 1 (Python or NumPy; default
      10000).
    dtype, param_dtype: activation and parameter dtypes (default float32).

  Non-finite inputs stay causal, as in the recurrent mixers: a NaN or Inf at token t (of x or
  of q, k, v) leaves every output before t, and outputs of other packed documents, unchanged
  and finite, with their input gradients; outputs from t to the end of its document are NaN.
  Every path (XLA, cuDNN, the KV cache) attends over finite, selected q, k, v.
  """

  RECURRENT = False

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               implementation: str = "auto", conv_size: int = 0, positions: str = "none",
               rope_base: float = 10000.0, dtype: DTypeLike = jnp.float32, param_dtype: DTypeLike = jnp.float32,
               rngs: nnx.Rngs):
    name = type(self).__name__
    common.check_dtype(name, "dtype", dtype)
    common.check_dtype(name, "param_dtype", param_dtype)
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim, free=False)
    if num_heads * self.head_dim != d_model:
      raise ValueError(f"{name}: num_heads * head_dim must equal d_model; got "
                       f"{num_heads} * {self.head_dim} != {d_model}")
    self.num_heads = num_heads
    self.implementation = check_implementation(name, implementation, dtype,
                                               jax.default_backend())
    common.check_choice(name, "positions", positions, POSITIONS)
    if positions == "rope" and self.head_dim % 2:
      raise ValueError(f"{name}: positions='rope' needs an even head_dim; got {self.head_dim}")
    if not (isinstance(rope_base, numbers.Real) and not isinstance(rope_base, (bool, np.bool_))
            and math.isfinite(rope_base) and rope_base > 1):
      raise ValueError(f"{name}: rope_base must be a finite number > 1; got {rope_base!r}")
    self.positions = positions
    self.rope_base = float(rope_base)
    self.dtype = dtype
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, d_model, use_bias=True, **kw)
    self.k_proj = common.dense(d_model, d_model, use_bias=True, **kw)
    self.v_proj = common.dense(d_model, d_model, use_bias=True, **kw)
    self.conv = common.short_convs(name, d_model, conv_size, **kw)
    self.out = common.OutputProjection(d_model, d_model, out_norm=False, **kw)

  def _qkv(self, x, conv_prefix=None, mask=None, docs=None, offset=0):
    """Heads of q, k, v [B, T, H, d_h] and the convolutions' new tails (x 0 at the pads);
    q and k rotated (`_rotate`) after `offset` (int or [B]) earlier tokens."""
    H = self.num_heads
    x = common.mask_tokens(mask, x)
    qkv, tails = common.convolve(self.conv, (self.q_proj(x), self.k_proj(x), self.v_proj(x)),
                                 conv_prefix, mask, docs)
    q, k, v = (common.split_heads(t, H) for t in qkv)
    q, k = self._rotate(q, k, offset, mask, docs)
    return q, k, v, tails

  def _rotate(self, q, k, offset, mask, docs):
    """q, k [B, T, H, d_h] rotated at their tokens' positions with positions="rope"
    (`common.token_positions` after `offset` earlier tokens); unchanged with "none"."""
    if self.positions == "none":
      return q, k
    positions = common.token_positions(q.shape[:2], offset, mask, docs)[0]
    return (rotary_embedding(q, positions, self.rope_base),
            rotary_embedding(k, positions, self.rope_base))

  def __call__(self, x: jax.Array, *, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """x: [B, T, d_model] -> [B, T, d_model] in `dtype`. `attention_mask` ([B, T] bool,
    True = a real token; None: all real): padded keys are masked out, outputs at the pads
    are 0. `segment_ids` ([B, T] int): packed documents; a query attends to the keys of its
    own document only (causal AND same document; `vla_jax.layers.common`)."""
    name = type(self).__name__
    common.check_input(name, x, self.q_proj.in_features)
    mask = common.check_attention_mask(name, attention_mask, *x.shape[:2])
    docs = common.document_ids(name, segment_ids, *x.shape[:2], mask)
    x = x.astype(self.dtype)
    q, k, v, _ = self._qkv(x, None, mask, docs)
    # Non-finite tokens stay causal and inside their document (`vla_jax.ops.nonfinite`):
    # attention runs on q, k, v whose non-finite tokens are zeroed by selection (a masked
    # score's zero probability times a NaN value, or a zero cotangent times a NaN key, would
    # be NaN at every query, in cuDNN's kernel as in XLA's), and o_t is NaN where a key or
    # value of its own document at or before t, or q_t, was. Pads are masked keys: their k
    # and v are zeroed first, so they never count.
    k, v = common.mask_tokens(mask, k, v)
    starts = None if docs is None else document_starts(docs)
    guard, q, k, (v,), _ = nonfinite.contain(q, k, (v,), starts=starts)
    allowed = None if mask is None else mask[:, None, None, :]
    if docs is not None:
      same = docs[:, None, :, None] == docs[:, None, None, :]    # [B, 1, T, T]
      allowed = same if allowed is None else same & allowed
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True, mask=allowed,
                                     implementation=self.implementation)
    return common.mask_tokens(mask, self.out(guard.outputs(o)))

  def init_cache(self, batch_size: int, max_len: int) -> "KVCache":
    """A preallocated KV cache of `batch_size` (an int >= 0) sequences of `max_len` tokens: k, v [B, max_len, H, d_h] in `dtype`,
    which slots hold real tokens, the number of slots written, `index` (memory grows with
    max_len, unlike the recurrences), and the short convolutions' input tails (() without
    convolution)."""
    batch_size = checks.check_size(f"{type(self).__name__}: batch_size", batch_size)
    if not checks.is_int(max_len) or max_len <= 0:
      raise ValueError(f"{type(self).__name__}: a KV cache needs max_len > 0; got {max_len!r}")
    shape = (batch_size, int(max_len), self.num_heads, self.head_dim)
    return KVCache(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype),
                   jnp.zeros(shape[:2], jnp.bool_), jnp.zeros((), jnp.int32),
                   common.empty_prefixes(self.conv, batch_size))

  def _attend_cache(self, x, cache, mask=None, docs=None, arg="x"):
    """Writes x's keys and values at cache.index and attends over the real tokens written;
    with `docs`, the slots written before x only from x's first document, x's own keys only
    from the same document. `arg`: the caller's input, named by the cache's check."""
    common.check_cache(type(self).__name__, cache, KVCache,
                       lambda: jax.eval_shape(
                           lambda: self.init_cache(x.shape[0], cache.k.shape[1])),
                       x.shape[0], arg)
    B, T, L = x.shape[0], x.shape[1], cache.k.shape[1]
    index = common.concrete_int(cache.index)
    if T > L or (index is not None and index + T > L):
      raise ValueError(f"{type(self).__name__}: {T} more tokens after the {index or 0} written "
                       f"do not fit a KV cache of max_len={L}")
    # The cache's real slots are those of the document x continues: its next position.
    offset = cache.mask.sum(axis=1, dtype=jnp.int32)
    q, k, v, tails = self._qkv(x.astype(self.dtype), cache.conv, mask, docs, offset)
    zero = jnp.zeros((), cache.index.dtype)  # all indices one integer type (also under x64)
    at = (zero, cache.index, zero, zero)
    keys = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), at)
    values = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), at)
    real = jnp.ones((B, T), jnp.bool_) if mask is None else mask
    written = jax.lax.dynamic_update_slice(cache.mask, real, at[:2])
    query_pos = cache.index + jnp.arange(T)
    causal = jnp.arange(L)[None, :] <= query_pos[:, None]  # [T, L]: causal over the cache
    allowed = causal[None, None] & written[:, None, None, :]  # [B, 1, T, L]
    if docs is not None:   # slots before index: the cache, which only document 0 continues
      slot_docs = jax.lax.dynamic_update_slice(jnp.full((B, L), -1, docs.dtype), docs, at[:2])
      earlier = (jnp.arange(L) < cache.index)[None, None, :]
      same = jnp.where(earlier, (docs == 0)[:, :, None],
                       slot_docs[:, None, :] == docs[:, :, None])   # [B, T, L]
      allowed = allowed & same[:, None]
    # The cache keeps what was written, NaN included; attention reads it with non-finite
    # slots zeroed, and o is NaN where an allowed slot (or the query) is non-finite.
    slot_bad = ~(nonfinite.token_finite(keys) & nonfinite.token_finite(values))  # [B, L, H]
    reach = jnp.einsum("btl,blh->bth", allowed[:, 0].astype(jnp.float32),
                       slot_bad.astype(jnp.float32)) > 0
    q_bad = ~nonfinite.token_finite(q)
    o = jax.nn.dot_product_attention(nonfinite.zero_where(q_bad, q),
                                     nonfinite.zero_where(slot_bad, keys),
                                     nonfinite.zero_where(slot_bad, values), mask=allowed,
                                     implementation="xla")
    o = nonfinite.Guard(reach, q_bad).outputs(o)
    if docs is not None:   # the cache keeps the last document only, as the recurrent mixers'
      last = docs[:, -1:]
      written = jnp.where(earlier[0], written & (last == 0), written & (slot_docs == last))
    return (common.mask_tokens(mask, self.out(o)),
            KVCache(keys, values, written, cache.index + T, tails))

  def prefill(self, x: jax.Array, cache: "KVCache", *,
              attention_mask: jax.Array | None = None,
              segment_ids: jax.Array | None = None) -> tuple[jax.Array, "KVCache"]:
    """x [B, T, d_model] appended to `cache` -> (y [B, T, d_model], cache). index + T must
    stay <= max_len: checked (ValueError) when the index is concrete; under jit the caller
    keeps it (beyond it, `dynamic_update_slice` would clamp the write). Costs O(T max_len) per
    head: the masked XLA path, whatever `implementation` is. `attention_mask` ([B, T] bool,
    True = a real token): padded tokens take cache slots but are never attended to.
    `segment_ids` ([B, T] int): packed documents as in `__call__`; the cache's earlier tokens
    are attended to by x's first document only, and the returned cache marks the slots of
    every document but the last as not real (a later `step` continues the last document)."""
    name = type(self).__name__
    common.check_input(name, x, self.q_proj.in_features)
    mask = common.check_attention_mask(name, attention_mask, *x.shape[:2])
    docs = common.document_ids(name, segment_ids, *x.shape[:2], mask)
    return self._attend_cache(x, cache, mask, docs)

  def step(self, x_t: jax.Array, cache: "KVCache") -> tuple[jax.Array, "KVCache"]:
    """One token x_t [B, d_model] -> (y_t [B, d_model], cache); O(max_len d_h) per head."""
    common.check_input(type(self).__name__, x_t, self.q_proj.in_features, step=True)
    y, cache = self._attend_cache(x_t[:, None], cache, arg="x_t")
    return y[:, 0], cache


class KVCache(NamedTuple):
  """Softmax attention's streaming cache: k, v [B, max_len, H, d_h]; mask [B, max_len] bool,
  True where a slot holds a real token (padded tokens take slots that are never attended to);
  index (int32 [], the slots written) and the short convolutions' tails (a tuple of
  [B, conv_size - 1, d_model], () without)."""

  k: jax.Array
  v: jax.Array
  mask: jax.Array
  index: jax.Array
  conv: tuple = ()
