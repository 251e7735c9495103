"""`VLAAttention`: the Variational Linear Attention mixer (Pandey & Singh, 2026)."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from vla_jax.layers import common
from vla_jax.ops.baselines import elu_plus_one
from vla_jax.ops.vla import vla_recurrence

READOUTS = ("none", "additive", "delta")
# Chosen by measurement on MQAR (it learns fastest; see vla_jax/layers/README.md).
DEFAULT_READOUT = "none"


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
    impl, chunk_size: passed straight to `vla_recurrence`.
    lam0: ridge strength of the initial penalty (A_0 = I / lam0).
    penalty_scale: norm of u per head (default 1 / sqrt(head_dim), the authors' choice).
    readout: "none" | "additive" | "delta" (default `DEFAULT_READOUT`).
    readout_eps: the floor of the readout's denominator (default 1e-6).
    conv_size: 0 (default, the authors' layer) or the width of a causal depthwise convolution
      with SiLU applied to the projected q, k and v before the feature map.
    out_norm: LayerNorm over the merged heads before W_o (default True, as the authors).
    dtype, param_dtype: activation and parameter dtypes (default float32); the recurrence state
      is float32 (float64 under x64) and its output is cast back to `dtype`.
  """

  RECURRENT = True

  def __init__(self, d_model, num_heads, head_dim=None, *, impl="chunked", chunk_size=64,
               lam0=1.0, penalty_scale=None, readout=DEFAULT_READOUT, readout_eps=1e-6,
               conv_size=0, out_norm=True, dtype=jnp.float32, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    name = type(self).__name__
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim)
    self.num_heads = num_heads
    self.readout = common.check_choice(name, "readout", readout, READOUTS)
    if not lam0 > 0:
      raise ValueError(f"{name}: lam0 must be > 0; got {lam0!r}")
    self.lam0 = float(lam0)
    self.penalty_scale = (1.0 / math.sqrt(self.head_dim) if penalty_scale is None
                          else float(penalty_scale))
    if not self.penalty_scale >= 0:
      raise ValueError(f"{name}: penalty_scale must be >= 0; got {penalty_scale!r}")
    self.readout_eps = float(readout_eps)
    self.impl, self.chunk_size = impl, chunk_size
    self.dtype = dtype
    inner = num_heads * self.head_dim
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, inner, use_bias=True, **kw)
    self.k_proj = common.dense(d_model, inner, use_bias=True, **kw)
    self.v_proj = common.dense(d_model, inner, use_bias=False, **kw)
    self.u_proj = common.dense(inner, inner, use_bias=False, **kw)
    self.conv = (nnx.List([common.ShortConv(inner, conv_size, **kw) for _ in range(3)])
                 if conv_size else None)
    self.out = common.OutputProjection(inner, d_model, out_norm=out_norm, **kw)

  def __call__(self, x):
    """x: [B, T, d_model] in any float dtype -> [B, T, d_model] in `dtype`."""
    x = x.astype(self.dtype)
    q, k_raw, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    if self.conv is not None:
      q, k_raw, v = (conv(t) for conv, t in zip(self.conv, (q, k_raw, v)))
    H = self.num_heads
    u = self.penalty_scale * common.l2_normalize(common.split_heads(self.u_proj(k_raw), H))
    q = elu_plus_one(common.split_heads(q, H))
    k = elu_plus_one(common.split_heads(k_raw, H))
    v = common.split_heads(v, H)
    kw = dict(lam0=self.lam0, impl=self.impl, chunk_size=self.chunk_size)
    if self.readout == "delta":
      ones = jnp.ones(v.shape[:-1] + (1,), v.dtype)
      o, _ = vla_recurrence(q, k, jnp.concatenate([v, ones], axis=-1), u, **kw)
      f = jnp.promote_types(o.dtype, jnp.float32)
      num, den = o[..., :-1].astype(f), o[..., -1:].astype(f)
      sign = jnp.where(den < 0, -1.0, 1.0)
      o = num / (sign * jnp.maximum(jnp.abs(den), self.readout_eps))
    else:
      o, _ = vla_recurrence(q, k, v, u, **kw)
      if self.readout == "additive":
        f = jnp.promote_types(o.dtype, jnp.float32)
        den = jnp.sum(jnp.cumsum(k.astype(f), axis=1) * q.astype(f), axis=-1, keepdims=True)
        o = o.astype(f) / jnp.maximum(den, self.readout_eps)
    return self.out(o.astype(self.dtype))
