"""`DeltaNet` and `GatedDeltaNet` mixers on the shared delta-rule recurrences."""

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax import parallel
from vla_jax.layers import common
from vla_jax.ops.baselines import gated_deltanet
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import gated_deltanet_step

# GatedDeltaNet's gate initialisations: {name: (dt_min, dt_max)} of dt ~ logU[dt_min, dt_max].
GATE_INITS = {"fla": (1e-3, 1e-1), "slow": (1e-4, 1e-2)}


class DeltaNet(nnx.Module):
  """DeltaNet (Schlag et al., 2021; Yang et al., 2024), x [B, T, d_model] -> same:

      q = l2norm(silu(W_q x)),  k = silu(W_k x) (unit-normalised by the op),  v = W_v x,
      beta = sigmoid(W_beta x) per head,
      S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) khat_t^T,  o_t = S_t q_t,
      y = W_o LayerNorm(merge_heads(o)).

  Attributes:
    d_model, num_heads, head_dim: widths (inner width num_heads * head_dim).
    impl: "auto" (default): the Pallas kernel where one takes the call, else "chunked"
      (`vla_jax.ops.impl.resolve_impl`; no delta-rule kernel yet: "chunked"), or "chunked",
      "scan" or "associative_scan"; "pallas" raises ValueError at construction.
    chunk_size: tokens per chunk of "chunked".
      Traced under a mesh with a "seq" axis of more than one device (`jax.set_mesh`),
      the op runs with T split over it (`vla_jax.parallel.sequence_op`).
    conv_size: the width of a causal depthwise convolution with SiLU on q, k, v (default 4;
      0 for none, then q and k go through SiLU alone).
    out_norm: LayerNorm over the merged heads before W_o (default True).
    dtype, param_dtype: activation and parameter dtypes (default float32); state in float32.
  """

  RECURRENT = True
  GATED = False

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64,
               conv_size: int = common.DEFAULT_CONV_SIZE, out_norm: bool = True,
               dtype: DTypeLike = jnp.float32, param_dtype: DTypeLike = jnp.float32,
               rngs: nnx.Rngs):
    name = type(self).__name__
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim)
    self.num_heads = num_heads
    self.dtype = dtype
    self.impl, self.chunk_size = common.check_recurrence_options(
        name, impl, chunk_size, **self._kernel_facts())
    inner = num_heads * self.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, inner, use_bias=False, **kw)
    self.k_proj = common.dense(d_model, inner, use_bias=False, **kw)
    self.v_proj = common.dense(d_model, inner, use_bias=False, **kw)
    self.beta_proj = common.dense(d_model, num_heads, use_bias=True, **kw)
    self.conv = common.short_convs(name, inner, conv_size, **kw)
    if self.GATED:
      self._init_gate(d_model, num_heads, rngs, dtype, param_dtype)
    self.out = common.OutputProjection(inner, d_model, out_norm=out_norm, **kw)

  @classmethod
  def kernel_facts(cls, head_dim, dtype, options):
    """What decides whether a Pallas kernel takes the calls of a layer of this head dim,
    dtype and `options`: `resolve_impl`'s op, dtype and head_dims."""
    del options
    return dict(op="gated_deltanet" if cls.GATED else "deltanet", dtype=dtype,
                head_dims=(head_dim, head_dim))

  def _kernel_facts(self):
    return self.kernel_facts(self.head_dim, self.dtype, {})

  def _features(self, x, conv_prefix, mask=None, docs=None):
    """x [B, T, d_model] -> per-head q, k, v, beta [B, T, H], log decay (or None), conv tails;
    with `mask`, k, v, beta and the log decay are 0 at the pads (no write, no decay)."""
    x = common.mask_tokens(mask, x)
    (q, k, v), tails = common.convolve(
        self.conv, (self.q_proj(x), self.k_proj(x), self.v_proj(x)), conv_prefix, mask, docs)
    if self.conv is None:
      q, k = jax.nn.silu(q), jax.nn.silu(k)
    H = self.num_heads
    q, k, v = (common.split_heads(t, H) for t in (q, k, v))
    beta = jax.nn.sigmoid(self.beta_proj(x).astype(common.state_dtype(self.dtype)))
    log_decay = self._log_decay(x)
    k, v, beta = common.mask_tokens(mask, k, v, beta)
    if log_decay is not None:
      log_decay = common.mask_tokens(mask, log_decay)
    return common.l2_normalize(q), k, v, beta, log_decay, tails

  def _log_decay(self, x):
    return None

  def init_cache(self, batch_size: int, max_len: int | None = None) -> common.RecurrentCache:
    """The empty streaming cache (S = 0); the state has a fixed size."""
    del max_len
    H, D = self.num_heads, self.head_dim
    return common.RecurrentCache(
        state=jnp.zeros((batch_size, H, D, D), common.state_dtype(self.dtype)),
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
    q, k, v, beta, log_decay, tails = self._features(x, cache.conv, mask, docs)
    o, S = parallel.sequence_op(gated_deltanet)(q, k, v, beta, log_decay,
                                                initial_state=cache.state, impl=impl,
                                                chunk_size=self.chunk_size, segment_ids=docs)
    return common.mask_tokens(mask, self.out(o)), common.RecurrentCache(S, tails)

  def step(self, x_t: jax.Array, cache: common.RecurrentCache
           ) -> tuple[jax.Array, common.RecurrentCache]:
    """One token x_t [B, d_model] -> (y_t [B, d_model], cache)."""
    common.check_token(type(self).__name__, x_t, self.q_proj.in_features)
    q, k, v, beta, log_decay, tails = self._features(x_t[:, None].astype(self.dtype),
                                                      cache.conv)
    o_t, S = gated_deltanet_step(cache.state, q[:, 0], k[:, 0], v[:, 0], beta[:, 0],
                                 None if log_decay is None else log_decay[:, 0])
    return self.out(o_t[:, None])[:, 0], common.RecurrentCache(S, tails)

  def __call__(self, x: jax.Array, *, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """x: [B, T, d_model] -> [B, T, d_model] in `dtype`; `attention_mask` and `segment_ids`
    as in `prefill`."""
    return self.prefill(x, attention_mask=attention_mask, segment_ids=segment_ids)[0]


class GatedDeltaNet(DeltaNet):
  """Gated DeltaNet (Yang et al., 2024, arXiv 2412.06464): DeltaNet whose state decays by
  gamma_t = exp(g_t) per token and head, with

      g_t = -exp(A_log) * softplus(W_a x_t + dt_bias),
      A_log = log(a), a ~ U[1, 16];  softplus(dt_bias) = dt, dt ~ logU[dt_min, dt_max].

  Attributes: as `DeltaNet`, plus `a_proj`, `A_log` [H], `dt_bias` [H] and
    gate_init: the gate's initialisation (`GATE_INITS`), read where W_a x_t = 0, so that the
      per-token decay at initialisation is exp(-a dt):
      "fla" (default): dt ~ logU[1e-3, 1e-1], as in the paper's code (fla): a dt in
        [1e-3, 1.6], decay in [0.20, 0.999] (half-life from 0.43 to 690 tokens; 8 tokens at
        the medians a = 8.5, dt = 1e-2).
      "slow": dt ~ logU[1e-4, 1e-2], the same a (the same draws, dt 10x smaller): a dt in
        [1e-4, 0.16], decay in [0.85, 0.9999] (half-life from 4.3 to 6,900 tokens; 80 tokens
        at the medians), a state that forgets 10x more slowly early in training.
  """

  GATED = True

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64,
               conv_size: int = common.DEFAULT_CONV_SIZE, out_norm: bool = True,
               gate_init: str = "fla", dtype: DTypeLike = jnp.float32,
               param_dtype: DTypeLike = jnp.float32, rngs: nnx.Rngs):
    self.gate_init = common.check_choice(type(self).__name__, "gate_init", gate_init,
                                         tuple(GATE_INITS))
    super().__init__(d_model, num_heads, head_dim, impl=impl, chunk_size=chunk_size,
                     conv_size=conv_size, out_norm=out_norm, dtype=dtype,
                     param_dtype=param_dtype, rngs=rngs)

  def _init_gate(self, d_model, num_heads, rngs, dtype, param_dtype):
    self.a_proj = common.dense(d_model, num_heads, use_bias=False, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)
    a = jax.random.uniform(rngs.params(), (num_heads,), jnp.float32, 1.0, 16.0)
    self.A_log = nnx.Param(jnp.log(a).astype(param_dtype))
    lo, hi = (math.log(x) for x in GATE_INITS[self.gate_init])
    dt = jnp.exp(jax.random.uniform(rngs.params(), (num_heads,), jnp.float32, lo, hi))
    dt_bias = dt + jnp.log(-jnp.expm1(-dt))  # inverse softplus
    self.dt_bias = nnx.Param(dt_bias.astype(param_dtype))

  def _log_decay(self, x):
    f = common.state_dtype(self.dtype)
    a = self.a_proj(x).astype(f) + self.dt_bias[...].astype(f)
    return -jnp.exp(self.A_log[...].astype(f)) * jax.nn.softplus(a)
