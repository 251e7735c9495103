"""`DeltaNet` and `GatedDeltaNet` mixers on the shared delta-rule recurrences."""

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax.layers import common
from vla_jax.layers.recurrent import RecurrentMixer
from vla_jax.ops.baselines import gated_deltanet
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import gated_deltanet_step

# GatedDeltaNet's gate initialisations: {name: (dt_min, dt_max)} of dt ~ logU[dt_min, dt_max].
GATE_INITS = {"fla": (1e-3, 1e-1), "slow": (1e-4, 1e-2)}
# The epsilon of the output gate's RMSNorm (flash-linear-attention's norm_eps).
RMS_EPS = 1e-5


class GatedRMSNorm(nnx.Module):
  """flash-linear-attention's `FusedRMSNormGated` (swish gate, norm before the gate), per
  head: o [B, T, H, dv], g [B, T, H, dv] -> o / sqrt(mean(o^2) + eps) * weight * silu(g), in
  float32 (float64 for float64 activations), returned in `dtype`; without the norm
  (`norm=False`) o * silu(g).

  Attributes:
    weight: [dv] scale shared by the heads (ones at initialisation), or None without the norm.
  """

  def __init__(self, width, *, norm, dtype, param_dtype, eps=RMS_EPS):
    self.weight = nnx.Param(jnp.ones((width,), param_dtype)) if norm else None
    self.eps = eps
    self.dtype = dtype

  def __call__(self, o, g):
    f = common.state_dtype(self.dtype)
    y = o.astype(f)
    if self.weight is not None:
      y = (y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + self.eps)
           * self.weight[...].astype(f))
    return (y * jax.nn.silu(g.astype(f))).astype(self.dtype)


class DeltaNet(RecurrentMixer):
  """DeltaNet (Schlag et al., 2021; Yang et al., 2024), x [B, T, d_model] -> same:

      q = l2norm(silu(W_q x)),  k = silu(W_k x) (unit-normalised by the op),  v = W_v x,
      beta = sigmoid(W_beta x) per head,
      S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) khat_t^T,  o_t = S_t q_t,
      y = W_o LayerNorm(merge_heads(o)),
  or with the output gate (flash-linear-attention's, `GatedRMSNorm`), per head
      y = W_o merge_heads(RMSNorm(o) * silu(W_g x)).

  Attributes:
    d_model, num_heads, head_dim, impl, chunk_size, dtype, param_dtype: as `RecurrentMixer`
      (the op: `gated_deltanet` without a gate).
    conv_size: as `RecurrentMixer` (default 4); with 0, q and k go through SiLU alone.
    output_gate: fla's swish output gate with gated RMSNorm (`GatedRMSNorm`; W_g: d_model ->
      num_heads * value_head_dim, no bias), in place of the LayerNorm over the merged heads
      (default False here; `GatedDeltaNet`'s default is True).
    out_norm: normalise before W_o (default True): the LayerNorm over the merged heads, or
      with `output_gate` the RMSNorm of the gate (False: o * silu(W_g x)).
    expand_v: value expansion: each head's values, and its state's rows, are expand_v *
      head_dim wide (`value_head_dim`; an int >= 1, default 1 here, 2 for `GatedDeltaNet`).
  """

  OP = "deltanet"
  RECURRENCE = staticmethod(gated_deltanet)
  STEP = staticmethod(gated_deltanet_step)
  GATED = False
  INPUT_NAMES = ("q", "k", "v", "beta", "log_decay")
  DEFAULT_OUTPUT_GATE = False
  DEFAULT_EXPAND_V = 1

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64,
               conv_size: int = common.DEFAULT_CONV_SIZE, out_norm: bool = True,
               output_gate: bool = DEFAULT_OUTPUT_GATE, expand_v: int = DEFAULT_EXPAND_V,
               dtype: DTypeLike = jnp.float32, param_dtype: DTypeLike = jnp.float32,
               rngs: nnx.Rngs):
    super().__init__(d_model, num_heads, head_dim, dtype=dtype, param_dtype=param_dtype)
    name = type(self).__name__
    self.output_gate = common.check_bool(name, "output_gate", output_gate)
    self.expand_v = common.check_positive_int(name, "expand_v", expand_v)
    self.value_head_dim = self.expand_v * self.head_dim
    self.gate_norm = common.check_bool(name, "out_norm", out_norm)
    # With the output gate its RMSNorm is the output's norm: no LayerNorm over merged heads.
    self._build(d_model, impl=impl, chunk_size=chunk_size, conv_size=conv_size,
                out_norm=self.gate_norm and not self.output_gate, param_dtype=param_dtype,
                rngs=rngs)

  @classmethod
  def value_width(cls, head_dim, options):
    return head_dim * options.get("expand_v", cls.DEFAULT_EXPAND_V)

  def _init_params(self, d_model, inner, **kw):
    self.beta_proj = common.dense(d_model, self.num_heads, use_bias=True, **kw)

  def _init_late_params(self, d_model, *, dtype, param_dtype, rngs):
    if self.output_gate:
      values = self.num_heads * self.value_head_dim
      self.g_proj = common.dense(d_model, values, use_bias=False, dtype=dtype,
                                 param_dtype=param_dtype, rngs=rngs)
      self.o_norm = GatedRMSNorm(self.value_head_dim, norm=self.gate_norm, dtype=dtype,
                                 param_dtype=param_dtype)

  def _inputs(self, x, q, k, v, mask):
    """Per-head q (unit), k, v, beta [B, T, H] and the log decay (None without a gate); k, v,
    beta and the log decay are 0 at the pads (no write, no decay)."""
    if self.conv is None:
      q, k = jax.nn.silu(q), jax.nn.silu(k)
    H = self.num_heads
    q, k, v = (common.split_heads(t, H) for t in (q, k, v))
    beta = jax.nn.sigmoid(self.beta_proj(x).astype(common.state_dtype(self.dtype)))
    log_decay = self._log_decay(x)
    k, v, beta = common.mask_tokens(mask, k, v, beta)
    if log_decay is not None:
      log_decay = common.mask_tokens(mask, log_decay)
    return common.l2_normalize(q), k, v, beta, log_decay

  def _log_decay(self, x):
    return None

  def _initial_state(self, batch_size):
    """S = 0 [B, H, value_head_dim, head_dim]."""
    H, D = self.num_heads, self.head_dim
    return jnp.zeros((batch_size, H, self.value_head_dim, D), common.state_dtype(self.dtype))

  def _readout(self, o, inputs, norm, docs=None, x=None):
    """o [B, T, H, dv] -> W_o of the merged heads: with the output gate, gated by x."""
    del inputs, docs
    if self.output_gate:
      o = self.o_norm(o, common.split_heads(self.g_proj(x), self.num_heads))
    return self.out(o), norm


class GatedDeltaNet(DeltaNet):
  """Gated DeltaNet (Yang et al., 2024, arXiv 2412.06464): DeltaNet whose state decays by
  gamma_t = exp(g_t) per token and head, with

      g_t = -exp(A_log) * softplus(W_a x_t + dt_bias),
      A_log = log(a), a ~ U[1, 16];  softplus(dt_bias) = dt, dt ~ logU[dt_min, dt_max],

  configured by default as the paper's code (flash-linear-attention's `GatedDeltaNet`) is:
  the swish output gate with gated RMSNorm and values twice the key width.

  Attributes: as `DeltaNet`, plus `a_proj`, `A_log` [H], `dt_bias` [H] and
    output_gate: as `DeltaNet`; default True (fla's use_gate). False with out_norm True is
      the LayerNorm over merged heads that every Gated DeltaNet row of the results made
      before these options existed has (results/README.md).
    expand_v: as `DeltaNet`; default 2 (fla's; those earlier rows: 1).
    gate_init: the gate's initialisation (`GATE_INITS`), read where W_a x_t = 0, so that the
      per-token decay at initialisation is exp(-a dt):
      "fla" (default): dt ~ logU[1e-3, 1e-1], as in the paper's code (fla): a dt in
        [1e-3, 1.6], decay in [0.20, 0.999] (half-life from 0.43 to 690 tokens; 8 tokens at
        the medians a = 8.5, dt = 1e-2).
      "slow": dt ~ logU[1e-4, 1e-2], the same a (the same draws, dt 10x smaller): a dt in
        [1e-4, 0.16], decay in [0.85, 0.9999] (half-life from 4.3 to 6,900 tokens; 80 tokens
        at the medians), a state that forgets 10x more slowly early in training.
  The gate's parameters are drawn before W_g, so that they do not depend on the output
  gate or the value width.
  """

  OP = "gated_deltanet"
  GATED = True
  DEFAULT_OUTPUT_GATE = True
  DEFAULT_EXPAND_V = 2

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64,
               conv_size: int = common.DEFAULT_CONV_SIZE, out_norm: bool = True,
               output_gate: bool = DEFAULT_OUTPUT_GATE, expand_v: int = DEFAULT_EXPAND_V,
               gate_init: str = "fla", dtype: DTypeLike = jnp.float32,
               param_dtype: DTypeLike = jnp.float32, rngs: nnx.Rngs):
    self.gate_init = common.check_choice(type(self).__name__, "gate_init", gate_init,
                                         tuple(GATE_INITS))
    super().__init__(d_model, num_heads, head_dim, impl=impl, chunk_size=chunk_size,
                     conv_size=conv_size, out_norm=out_norm, output_gate=output_gate,
                     expand_v=expand_v, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def _init_late_params(self, d_model, *, dtype, param_dtype, rngs):
    num_heads = self.num_heads
    self.a_proj = common.dense(d_model, num_heads, use_bias=False, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)
    a = jax.random.uniform(rngs.params(), (num_heads,), jnp.float32, 1.0, 16.0)
    self.A_log = nnx.Param(jnp.log(a).astype(param_dtype))
    lo, hi = (math.log(x) for x in GATE_INITS[self.gate_init])
    dt = jnp.exp(jax.random.uniform(rngs.params(), (num_heads,), jnp.float32, lo, hi))
    dt_bias = dt + jnp.log(-jnp.expm1(-dt))  # inverse softplus
    self.dt_bias = nnx.Param(dt_bias.astype(param_dtype))
    super()._init_late_params(d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def _log_decay(self, x):
    f = common.state_dtype(self.dtype)
    a = self.a_proj(x).astype(f) + self.dt_bias[...].astype(f)
    return -jnp.exp(self.A_log[...].astype(f)) * jax.nn.softplus(a)
