"""`VLAAttention`: the Variational Linear Attention mixer (Pandey & Singh, 2026)."""

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax import parallel
from vla_jax.layers import common
from vla_jax.ops import checks
from vla_jax.ops.baselines import elu_plus_one
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import vla_step
from vla_jax.ops.utils import document_starts, segment_cumsum
from vla_jax.ops.vla import initial_vla_state, vla_recurrence

READOUTS = ("none", "additive", "delta")
U_INITS = ("random", "identity")
# Chosen by measurement on MQAR (it learns fastest; see vla_jax/layers/README.md).
DEFAULT_READOUT = "none"
# Chosen by measurement on zoology's MQAR (fewer failed seeds, better or tied at every cell;
# RESULTS.md sections 9 and 5, vla_jax/layers/README.md). None: the authors' 1 / sqrt(head_dim).
DEFAULT_PENALTY_SCALE = 1.0


class VLAAttention(nnx.Module):
  """Variational Linear Attention as a sequence mixer, x [B, T, d_model] -> [B, T, d_model].

  Per head (d_h = head_dim), following the authors' layer:

      q = phi(W_q x + b_q),  k_raw = W_k x + b_k,  k = phi(k_raw),  v = W_v x
      u = penalty_scale * (W_u k_raw) / ||W_u k_raw||             (penalty direction)
      (o_t, state) = vla_recurrence(q, k, v, u; lam0)             o_t = S_t q_t
      y = W_o LayerNorm(merge_heads(readout(o)))

  with phi = ELU + 1. Readouts:
    "none":     y_t = S_t q_t.
    "additive": y_t = S_t q_t / max(z_t . q_t, eps), z_t = sum_{s<=t} phi(k_s): the linear-
                attention ratio of the authors' code (it shrinks outputs roughly as 1/t).
    "delta":    one more value channel of constant 1 goes through the same recurrence, so
                S_t = [S_t; d_t] and y_t = S_t q_t / g(d_t . q_t), g(x) = sign(x) max(|x|, eps)
                with sign(0) = +1: the denominator is carried by the delta rule, which erases
                along khat, so it tracks the recent keys instead of growing with t.

  Attributes:
    d_model, num_heads, head_dim: widths; the projections map d_model -> num_heads * head_dim,
      which need not equal d_model.
    impl: "auto" (default): the Pallas kernel where it takes the call (an NVIDIA GPU of compute
      capability >= 8.0; head dims, chunk size, dtype, readout and packing the kernel takes:
      `vla_jax.kernels.config.KERNEL_SUPPORT`), else "chunked"; the choice and its reason
      are logged (absl INFO) once (`vla_jax.ops.impl.resolve_impl`). Or any form of
      `vla_recurrence` ("chunked", "scan", "associative_scan", "pallas",
      "pallas_interpret"); "pallas" where the kernel cannot run (not a GPU, readout "delta",
      other head dims or chunk sizes) raises ValueError at construction, and with
      `segment_ids` at the call.
    chunk_size: tokens per chunk of "chunked" and the kernel.
      Traced under a mesh with a "seq" axis of more than one device (`jax.set_mesh`),
      the op runs with T split over it (`vla_jax.parallel.sequence_op`).
    lam0: ridge strength of the initial penalty (A_0 = I / lam0).
    penalty_scale: norm of u per head (default `DEFAULT_PENALTY_SCALE`, 1); None gives
      1 / sqrt(head_dim), the authors' choice. 1 is the default by measurement: fewer failed
      seeds on zoology's MQAR and better or tied at every cell (RESULTS.md sections 9 and 5).
    readout: "none" | "additive" | "delta" (default `DEFAULT_READOUT`).
    readout_eps: the floor of the readout's denominator (default 1e-6).
    u_init: W_u's initialisation: "random" (default; flax's LeCun normal, as every projection)
      or "identity" (W_u = I: each u_t starts along its raw key k_raw_t). u is normalised, so
      W_u's scale sets only how fast training turns u, not u itself.
    conv_size: the width of a causal depthwise convolution with SiLU applied to the projected
      q, k and v before the feature map (default 4, the setting every experiment uses: without
      it the layer does not learn MQAR, see vla_jax/layers/README.md); 0 for none, the
      authors' layer.
    out_norm: LayerNorm over the merged heads before W_o (default True, as the authors).
    dtype, param_dtype: activation and parameter dtypes (default float32); the recurrence state
      is float32 (float64 under x64) and its output is cast back to `dtype`.
  """

  RECURRENT = True

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64, lam0: float = 1.0,
               penalty_scale: float | None = DEFAULT_PENALTY_SCALE,
               readout: str = DEFAULT_READOUT,
               readout_eps: float = 1e-6, u_init: str = "random",
               conv_size: int = common.DEFAULT_CONV_SIZE,
               out_norm: bool = True, dtype: DTypeLike = jnp.float32,
               param_dtype: DTypeLike = jnp.float32, rngs: nnx.Rngs):
    name = type(self).__name__
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim)
    self.num_heads = num_heads
    self.readout = common.check_choice(name, "readout", readout, READOUTS)
    self.u_init = common.check_choice(name, "u_init", u_init, U_INITS)
    try:
      checks.check_lam0(lam0, impl, common.state_dtype(dtype))
    except ValueError as e:
      raise ValueError(f"{name}: {e}") from None
    self.lam0 = float(lam0)
    self.penalty_scale = (1.0 / math.sqrt(self.head_dim) if penalty_scale is None
                          else float(penalty_scale))
    if not self.penalty_scale >= 0:
      raise ValueError(f"{name}: penalty_scale must be >= 0; got {penalty_scale!r}")
    self.readout_eps = float(readout_eps)
    self.dtype = dtype
    self.impl, self.chunk_size = common.check_recurrence_options(
        name, impl, chunk_size, **self._kernel_facts())
    inner = num_heads * self.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, inner, use_bias=True, **kw)
    self.k_proj = common.dense(d_model, inner, use_bias=True, **kw)
    self.v_proj = common.dense(d_model, inner, use_bias=False, **kw)
    self.u_proj = common.dense(inner, inner, use_bias=False, **kw)
    if self.u_init == "identity":
      self.u_proj.kernel[...] = jnp.eye(inner, dtype=self.u_proj.kernel[...].dtype)
    self.conv = common.short_convs(name, inner, conv_size, **kw)
    self.out = common.OutputProjection(inner, d_model, out_norm=out_norm, **kw)

  @classmethod
  def kernel_facts(cls, head_dim, dtype, options):
    """What decides whether a Pallas kernel takes the calls of a layer of this head dim,
    dtype and `options` (its keyword options): `resolve_impl`'s op, dtype, head_dims and
    options."""
    return dict(op="vla", dtype=dtype, head_dims=(head_dim, head_dim),
                options={"readout": options.get("readout", DEFAULT_READOUT)})

  def _kernel_facts(self):
    return self.kernel_facts(self.head_dim, self.dtype, {"readout": self.readout})

  def _features(self, x, conv_prefix, mask=None, docs=None):
    """x [B, T, d_model] -> per-head q, k, v (+1 channel for "delta"), u and conv tails; with
    `mask`, k, v and u are 0 at the pads (a step that leaves the state unchanged); `docs`
    (`common.document_ids`) keeps the convolutions inside each document."""
    x = common.mask_tokens(mask, x)
    (q, k_raw, v), tails = common.convolve(
        self.conv, (self.q_proj(x), self.k_proj(x), self.v_proj(x)), conv_prefix, mask, docs)
    H = self.num_heads
    u = self.penalty_scale * common.l2_normalize(common.split_heads(self.u_proj(k_raw), H))
    q = elu_plus_one(common.split_heads(q, H))
    k = elu_plus_one(common.split_heads(k_raw, H))
    v = common.split_heads(v, H)
    if self.readout == "delta":
      v = jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    k, v, u = common.mask_tokens(mask, k, v, u)
    return q, k, v, u, tails

  def _readout(self, o, q, k, z0, docs=None):
    """o [B, T, H, dv(+1)] -> (y [B, T, d_model], the additive readout's running sum z, which
    restarts at each document of `docs`)."""
    f = jnp.promote_types(o.dtype, jnp.float32)
    z = z0
    if self.readout == "delta":
      num, den = o[..., :-1].astype(f), o[..., -1:].astype(f)
      sign = jnp.where(den < 0, -1.0, 1.0)
      o = num / (sign * jnp.maximum(jnp.abs(den), self.readout_eps))
    elif self.readout == "additive":
      if docs is None:
        zs = z0[:, None].astype(f) + jnp.cumsum(k.astype(f), axis=1)
      else:
        first = (docs == 0)[:, :, None, None]
        zs = (segment_cumsum(k.astype(f), document_starts(docs))
              + jnp.where(first, z0[:, None].astype(f), jnp.zeros((), f)))
      den = jnp.sum(zs * q.astype(f), axis=-1, keepdims=True)
      o = o.astype(f) / jnp.maximum(den, self.readout_eps)
      z = zs[:, -1]
    return self.out(o.astype(self.dtype)), z

  def init_cache(self, batch_size: int, max_len: int | None = None) -> common.RecurrentCache:
    """The empty streaming cache: S = 0, A = I / lam0 (`max_len` is not needed: the state has a
    fixed size)."""
    del max_len
    H, D, f = self.num_heads, self.head_dim, common.state_dtype(self.dtype)
    dv = D + (self.readout == "delta")
    return common.RecurrentCache(
        state=initial_vla_state(batch_size, H, D, dv, lam0=self.lam0, dtype=f),
        conv=common.empty_prefixes(self.conv, batch_size, H * D),
        norm=jnp.zeros((batch_size, H, D), f) if self.readout == "additive" else ())

  def prefill(self, x: jax.Array, cache: common.RecurrentCache | None = None, *,
              attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None
              ) -> tuple[jax.Array, common.RecurrentCache]:
    """Runs x [B, T, d_model] from `cache` (None: the empty cache) with `impl`; returns
    (y [B, T, d_model], the cache after x). `attention_mask` ([B, T] bool, True = a real
    token; None: all real) deletes the padded positions; `segment_ids` ([B, T] int, None: one
    document) packs documents, each computed alone (S, A, the convolutions and the additive
    readout's sum restart; see `vla_jax.layers.common`)."""
    name = type(self).__name__
    mask = common.check_attention_mask(name, attention_mask, *x.shape[:2])
    docs = common.document_ids(name, segment_ids, *x.shape[:2], mask)
    x = x.astype(self.dtype)
    cache = self.init_cache(x.shape[0]) if cache is None else cache
    impl = common.recurrence_impl(name, self.impl, chunk_size=self.chunk_size, docs=docs,
                                  **self._kernel_facts())
    q, k, v, u, tails = self._features(x, cache.conv, mask, docs)
    o, state = parallel.sequence_op(vla_recurrence)(q, k, v, u, initial_state=cache.state,
                                                    impl=impl, chunk_size=self.chunk_size,
                                                    lam0=self.lam0, segment_ids=docs)
    y, z = self._readout(o, q, k, cache.norm, docs)
    return common.mask_tokens(mask, y), common.RecurrentCache(state, tails, z)

  def step(self, x_t: jax.Array, cache: common.RecurrentCache
           ) -> tuple[jax.Array, common.RecurrentCache]:
    """One token x_t [B, d_model] -> (y_t [B, d_model], cache); O(H d_h^2) work and memory."""
    common.check_token(type(self).__name__, x_t, self.q_proj.in_features)
    q, k, v, u, tails = self._features(x_t[:, None].astype(self.dtype), cache.conv)
    o_t, state = vla_step(cache.state, q[:, 0], k[:, 0], v[:, 0], u[:, 0])
    y, z = self._readout(o_t[:, None], q, k, cache.norm)
    return y[:, 0], common.RecurrentCache(state, tails, z)

  def __call__(self, x: jax.Array, *, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """x: [B, T, d_model] in any float dtype -> [B, T, d_model] in `dtype`; `attention_mask`
    and `segment_ids` as in `prefill`."""
    return self.prefill(x, attention_mask=attention_mask, segment_ids=segment_ids)[0]
