"""`LinearAttention`: causal linear attention with the ELU + 1 feature map."""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax import parallel
from vla_jax.layers import common
from vla_jax.ops.baselines import LinearAttentionState, elu_plus_one, linear_attention
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import linear_attention_step


class LinearAttention(nnx.Module):
  """Causal linear attention (Katharopoulos et al., 2020), x [B, T, d_model] -> same:

      S_t = S_{t-1} + v_t phi(k_t)^T,  o_t = S_t phi(q_t) [/ max(z_t . phi(q_t), eps)]

  with phi = ELU + 1, then y = W_o LayerNorm(merge_heads(o)).

  Attributes:
    d_model, num_heads, head_dim: widths (inner width num_heads * head_dim).
    impl: "auto" (default): the Pallas kernel where one takes the call, else "chunked"
      (`vla_jax.ops.impl.resolve_impl`; no linear-attention kernel yet: "chunked"), or
      "chunked", "scan" or "associative_scan"; "pallas" raises ValueError at construction.
    chunk_size: tokens per chunk of "chunked".
      Traced under a mesh with a "seq" axis of more than one device (`jax.set_mesh`),
      the op runs with T split over it (`vla_jax.parallel.sequence_op`).
    normalize: divide by the additive normaliser (default True, the original form).
    conv_size: the width of a causal depthwise convolution with SiLU on q, k, v (default 4;
      0 for none).
    out_norm: LayerNorm over the merged heads before W_o (default True).
    dtype, param_dtype: activation and parameter dtypes (default float32); state in float32.
  """

  RECURRENT = True

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64, normalize: bool = True,
               conv_size: int = common.DEFAULT_CONV_SIZE, out_norm: bool = True,
               dtype: DTypeLike = jnp.float32, param_dtype: DTypeLike = jnp.float32,
               rngs: nnx.Rngs):
    name = type(self).__name__
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim)
    self.num_heads = num_heads
    self.normalize = bool(normalize)
    self.dtype = dtype
    self.impl, self.chunk_size = common.check_recurrence_options(
        name, impl, chunk_size, **self._kernel_facts())
    inner = num_heads * self.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, inner, use_bias=True, **kw)
    self.k_proj = common.dense(d_model, inner, use_bias=True, **kw)
    self.v_proj = common.dense(d_model, inner, use_bias=False, **kw)
    self.conv = common.short_convs(name, inner, conv_size, **kw)
    self.out = common.OutputProjection(inner, d_model, out_norm=out_norm, **kw)

  @classmethod
  def kernel_facts(cls, head_dim, dtype, options):
    """What decides whether a Pallas kernel takes the calls of a layer of this head dim,
    dtype and `options`: `resolve_impl`'s op, dtype and head_dims."""
    del options
    return dict(op="linear_attention", dtype=dtype, head_dims=(head_dim, head_dim))

  def _kernel_facts(self):
    return self.kernel_facts(self.head_dim, self.dtype, {})

  def _features(self, x, conv_prefix, mask=None, docs=None):
    """x [B, T, d_model] -> per-head phi(q), phi(k) (in the state dtype), v and conv tails;
    with `mask`, phi(k) and v are 0 at the pads (no write to S or z)."""
    x = common.mask_tokens(mask, x)
    (q, k, v), tails = common.convolve(
        self.conv, (self.q_proj(x), self.k_proj(x), self.v_proj(x)), conv_prefix, mask, docs)
    H, f = self.num_heads, common.state_dtype(self.dtype)
    q, k, v = (common.split_heads(t, H) for t in (q, k, v))
    q, k = elu_plus_one(q.astype(f)), elu_plus_one(k.astype(f))
    k, v = common.mask_tokens(mask, k, v)
    return q, k, v, tails

  def init_cache(self, batch_size: int, max_len: int | None = None) -> common.RecurrentCache:
    """The empty streaming cache (S = 0, z = 0); the state has a fixed size."""
    del max_len
    H, D, f = self.num_heads, self.head_dim, common.state_dtype(self.dtype)
    return common.RecurrentCache(
        state=LinearAttentionState(jnp.zeros((batch_size, H, D, D), f),
                                   jnp.zeros((batch_size, H, D), f)),
        conv=common.empty_prefixes(self.conv, batch_size, H * D))

  def prefill(self, x: jax.Array, cache: common.RecurrentCache | None = None, *,
              attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None
              ) -> tuple[jax.Array, common.RecurrentCache]:
    """x [B, T, d_model] from `cache` (None: empty) -> (y [B, T, d_model], cache);
    `attention_mask` ([B, T] bool, True = a real token) deletes the padded positions;
    `segment_ids` ([B, T] int) packs documents, each computed alone (`vla_jax.layers.common`)."""
    name = type(self).__name__
    mask = common.check_attention_mask(name, attention_mask, *x.shape[:2])
    docs = common.document_ids(name, segment_ids, *x.shape[:2], mask)
    x = x.astype(self.dtype)
    cache = self.init_cache(x.shape[0]) if cache is None else cache
    impl = common.recurrence_impl(name, self.impl, chunk_size=self.chunk_size, docs=docs,
                                  **self._kernel_facts())
    q, k, v, tails = self._features(x, cache.conv, mask, docs)
    o, state = parallel.sequence_op(linear_attention)(
        q, k, v, feature_map=None, normalize=self.normalize, initial_state=cache.state,
        impl=impl, chunk_size=self.chunk_size, segment_ids=docs)
    return common.mask_tokens(mask, self.out(o)), common.RecurrentCache(state, tails)

  def step(self, x_t: jax.Array, cache: common.RecurrentCache
           ) -> tuple[jax.Array, common.RecurrentCache]:
    """One token x_t [B, d_model] -> (y_t [B, d_model], cache)."""
    common.check_token(type(self).__name__, x_t, self.q_proj.in_features)
    q, k, v, tails = self._features(x_t[:, None].astype(self.dtype), cache.conv)
    o_t, state = linear_attention_step(cache.state, q[:, 0], k[:, 0], v[:, 0],
                                       feature_map=None, normalize=self.normalize)
    return self.out(o_t[:, None])[:, 0], common.RecurrentCache(state, tails)

  def __call__(self, x: jax.Array, *, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """x: [B, T, d_model] -> [B, T, d_model] in `dtype`; `attention_mask` and `segment_ids`
    as in `prefill`."""
    return self.prefill(x, attention_mask=attention_mask, segment_ids=segment_ids)[0]
