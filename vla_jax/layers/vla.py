"""`VLAAttention`: the Variational Linear Attention mixer (Pandey & Singh, 2026)."""

import math
import numbers

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax.layers import common
from vla_jax.layers.recurrent import RecurrentMixer
from vla_jax.ops import checks
from vla_jax.ops.baselines import elu_plus_one
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import vla_step
from vla_jax.ops.utils import document_starts, segment_cumsum
from vla_jax.ops.vla import initial_vla_state, vla_recurrence

READOUTS = ("none", "additive", "delta")
U_INITS = ("random", "identity")
# The query/key feature maps: "elu1", the authors' ELU + 1, and "silu_l2", DeltaNet's SiLU then
# unit norm (`vla_jax.layers.delta.DeltaNet`).
QK_MAPS = ("elu1", "silu_l2")
# Chosen by measurement on zoology's MQAR (no failed seed of ten at each cell measured, where
# ELU + 1 fails two or three, and an earlier escape from the starting plateau; RESULTS.md
# section 12, vla_jax/layers/README.md).
DEFAULT_QK_MAP = "silu_l2"
# Chosen by measurement on MQAR (it learns fastest; see vla_jax/layers/README.md).
DEFAULT_READOUT = "none"
# Chosen by measurement on zoology's MQAR (fewer failed seeds, better or tied at every cell;
# RESULTS.md sections 9 and 5, vla_jax/layers/README.md).
DEFAULT_PENALTY_SCALE = 1.0
# The penalty_scale that names the authors' choice, 1 / sqrt(head_dim).
INV_SQRT_DH = "inv_sqrt_dh"


def penalty_scale_value(name, penalty_scale, head_dim):
  """The norm of u that `penalty_scale` (a finite number >= 0 or `INV_SQRT_DH`) gives at
  `head_dim`; ValueError naming the option otherwise (None and inf included)."""
  if isinstance(penalty_scale, str) and penalty_scale == INV_SQRT_DH:
    return 1.0 / math.sqrt(head_dim)
  if (isinstance(penalty_scale, numbers.Real) and not isinstance(penalty_scale, bool)
      and math.isfinite(penalty_scale) and penalty_scale >= 0):
    return float(penalty_scale)
  raise ValueError(f"{name}: penalty_scale must be a finite number >= 0 or {INV_SQRT_DH!r} (the "
                   f"authors' 1 / sqrt(head_dim)); got {penalty_scale!r}")


class VLAAttention(RecurrentMixer):
  """Variational Linear Attention as a sequence mixer, x [B, T, d_model] -> [B, T, d_model].

  Per head (d_h = head_dim), following the authors' layer:

      q = phi(W_q x + b_q),  k_raw = W_k x + b_k,  k = phi(k_raw),  v = W_v x
      u = penalty_scale * (W_u k_raw) / ||W_u k_raw||             (penalty direction)
      (o_t, state) = vla_recurrence(q, k, v, u[, beta]; lam0)     o_t = S_t q_t
      y = W_o LayerNorm(merge_heads(readout(o)))

  with DeltaNet's query/key path (qk_map "silu_l2", the default: q = unit(silu(.)),
  k = silu(.), which the op makes unit: keys of either sign, far less alike at
  initialisation than ELU + 1's positive ones), or phi = ELU + 1 (qk_map "elu1", the
  authors'). With `beta`, each write has a learned strength beta_t = sigmoid(W_beta x_t +
  b_beta) per token and head, as in DeltaNet (`vla_recurrence`'s beta:
  S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) a_t^T).
  Readouts:
    "none":     y_t = S_t q_t.
    "additive": y_t = S_t q_t / max(z_t . q_t, eps), z_t = sum_{s<=t} phi(k_s): the linear-
                attention ratio of the authors' code (it shrinks outputs roughly as 1/t).
    "delta":    one more value channel of constant 1 goes through the same recurrence, so
                S_t = [S_t; d_t] and y_t = S_t q_t / g(d_t . q_t), g(x) = sign(x) max(|x|, eps)
                with sign(0) = +1: the denominator is carried by the delta rule, which erases
                along khat, so it tracks the recent keys instead of growing with t.

  Attributes:
    d_model, num_heads, head_dim, impl, chunk_size, out_norm, dtype, param_dtype: as
      `RecurrentMixer` (the op: `vla_recurrence`, whose kernel support is
      `vla_jax.kernels.config`'s table).
    lam0: ridge strength of the initial penalty (A_0 = I / lam0).
    penalty_scale: norm of u per head: a finite number >= 0 (default `DEFAULT_PENALTY_SCALE`, 1) or
      "inv_sqrt_dh" (`INV_SQRT_DH`): 1 / sqrt(head_dim), the authors' choice. The attribute
      holds the number. 1 is the default by measurement: fewer failed
      seeds on zoology's MQAR and better or tied at every cell (RESULTS.md sections 9 and 5).
    readout: "none" | "additive" | "delta" (default `DEFAULT_READOUT`).
    readout_eps: the floor of the readout's denominator, a finite number > 0 (default 1e-6).
    u_init: W_u's initialisation: "random" (default; flax's LeCun normal, as every projection)
      or "identity" (W_u = I: each u_t starts along its raw key k_raw_t). u is normalised, so
      W_u's scale sets only how fast training turns u, not u itself.
    conv_size: as `RecurrentMixer`; the convolution acts on the projected q, k and v before
      the feature map (default 4, the setting every experiment uses); 0 for none, the
      authors' layer. Without it the layer stays at chance on the README's demo MQAR problem
      (vla_jax/layers/README.md) and at n = 24 at rate 3e-3, but solves n = 24 at rate 1e-3
      (RESULTS.md section 7, the ablation's no-conv row).
    qk_map: "silu_l2" (default `DEFAULT_QK_MAP`; DeltaNet's: SiLU, which the convolution
      already applies, then unit norm) or "elu1" (the authors' ELU + 1); `QK_MAPS`. "silu_l2"
      is the default by measurement: no failed seed of ten at the zoology cells measured,
      where "elu1" fails some (RESULTS.md section 12). "silu_l2" does not take the
      "additive" readout (its denominator sums positive features): the authors' layer is
      qk_map "elu1" with readout "additive".
    beta: a learned write strength (default False: every write of strength 1, the authors'
      recurrence). Its projection `beta_proj` (d_model -> num_heads, with bias) is drawn
      after every other parameter, so that the others are the layer's draws without it.
  """

  OP = "vla"
  RECURRENCE = staticmethod(vla_recurrence)
  STEP = staticmethod(vla_step)
  QK_BIAS = True
  KERNEL_OPTIONS = {"readout": DEFAULT_READOUT}
  INPUT_NAMES = ("q", "k", "v", "u", "beta")

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64, lam0: float = 1.0,
               penalty_scale: float | str = DEFAULT_PENALTY_SCALE,
               readout: str = DEFAULT_READOUT,
               readout_eps: float = 1e-6, u_init: str = "random",
               conv_size: int = common.DEFAULT_CONV_SIZE, qk_map: str = DEFAULT_QK_MAP,
               beta: bool = False, out_norm: bool = True, dtype: DTypeLike = jnp.float32,
               param_dtype: DTypeLike = jnp.float32, rngs: nnx.Rngs):
    super().__init__(d_model, num_heads, head_dim, dtype=dtype, param_dtype=param_dtype)
    name = type(self).__name__
    self.readout = common.check_choice(name, "readout", readout, READOUTS)
    self.u_init = common.check_choice(name, "u_init", u_init, U_INITS)
    self.qk_map = common.check_choice(name, "qk_map", qk_map, QK_MAPS)
    self.beta = common.check_bool(name, "beta", beta)
    if self.qk_map == "silu_l2" and self.readout == "additive":
      raise ValueError(f"{name}: qk_map='silu_l2' gives queries and keys of either sign, and "
                       "readout='additive' divides by z_t . q_t, a sum of positive features "
                       "(ELU + 1's): use readout 'none' or 'delta', or qk_map 'elu1' (the "
                       "authors' layer has both)")
    try:
      checks.check_lam0(lam0, impl, common.state_dtype(dtype))
      checks.check_positive("readout_eps", readout_eps)
    except ValueError as e:
      raise ValueError(f"{name}: {e}") from None
    self.lam0 = float(lam0)
    self.penalty_scale = penalty_scale_value(name, penalty_scale, self.head_dim)
    self.readout_eps = float(readout_eps)
    self._build(d_model, impl=impl, chunk_size=chunk_size, conv_size=conv_size,
                out_norm=out_norm, param_dtype=param_dtype, rngs=rngs)
    if self.beta:   # drawn last: the other parameters are the draws of the layer without it
      self.beta_proj = common.dense(d_model, num_heads, use_bias=True, dtype=dtype,
                                    param_dtype=param_dtype, rngs=rngs)

  def _init_params(self, d_model, inner, **kw):
    self.u_proj = common.dense(inner, inner, use_bias=False, **kw)
    if self.u_init == "identity":
      self.u_proj.kernel[...] = jnp.eye(inner, dtype=self.u_proj.kernel[...].dtype)

  def _recurrence_options(self):
    return {"lam0": self.lam0}

  def _inputs(self, x, q, k_raw, v, mask):
    """Per-head q, k, v (+1 channel for "delta"), u and with `beta` the write strengths
    [B, T, H] (in the state dtype); k, v, u and beta are 0 at the pads."""
    H = self.num_heads
    u = self.penalty_scale * common.l2_normalize(common.split_heads(self.u_proj(k_raw), H))
    if self.qk_map == "silu_l2":   # DeltaNet's path: the convolution ends in SiLU
      if self.conv is None:
        q, k_raw = jax.nn.silu(q), jax.nn.silu(k_raw)
      q = common.l2_normalize(common.split_heads(q, H))
      k = common.split_heads(k_raw, H)
    else:
      q = elu_plus_one(common.split_heads(q, H))
      k = elu_plus_one(common.split_heads(k_raw, H))
    v = common.split_heads(v, H)
    if self.readout == "delta":
      v = jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
    k, v, u = common.mask_tokens(mask, k, v, u)
    if not self.beta:
      return q, k, v, u
    beta = jax.nn.sigmoid(self.beta_proj(x).astype(common.state_dtype(self.dtype)))
    return q, k, v, u, common.mask_tokens(mask, beta)

  def _initial_state(self, batch_size):
    """S = 0, A = I / lam0."""
    H, D = self.num_heads, self.head_dim
    dv = D + (self.readout == "delta")
    return initial_vla_state(batch_size, H, D, dv, lam0=self.lam0,
                             dtype=common.state_dtype(self.dtype))

  def _initial_norm(self, batch_size):
    """The "additive" readout's sum z = 0 [B, H, D] (none for the other readouts)."""
    if self.readout != "additive":
      return ()
    return jnp.zeros((batch_size, self.num_heads, self.head_dim),
                     common.state_dtype(self.dtype))

  def _readout(self, o, inputs, norm, docs=None, x=None):
    """o [B, T, H, dv(+1)] -> (y [B, T, d_model], the additive readout's running sum z, which
    restarts at each document of `docs`)."""
    del x
    q, k = inputs[:2]
    f = jnp.promote_types(o.dtype, jnp.float32)
    z = norm
    if self.readout == "delta":
      num, den = o[..., :-1].astype(f), o[..., -1:].astype(f)
      sign = jnp.where(den < 0, -1.0, 1.0)
      o = num / (sign * jnp.maximum(jnp.abs(den), self.readout_eps))
    elif self.readout == "additive":
      if docs is None:
        zs = norm[:, None].astype(f) + jnp.cumsum(k.astype(f), axis=1)
      else:
        first = (docs == 0)[:, :, None, None]
        zs = (segment_cumsum(k.astype(f), document_starts(docs))
              + jnp.where(first, norm[:, None].astype(f), jnp.zeros((), f)))
      den = jnp.sum(zs * q.astype(f), axis=-1, keepdims=True)
      o = o.astype(f) / jnp.maximum(den, self.readout_eps)
      z = zs[:, -1] if zs.shape[1] else norm.astype(f)   # no tokens: the sum passes through
    return self.out(o.astype(self.dtype)), z
