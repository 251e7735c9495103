"""`LinearAttention`: causal linear attention with the ELU + 1 feature map."""

import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax.layers import common
from vla_jax.layers.recurrent import RecurrentMixer
from vla_jax.ops.baselines import LinearAttentionState, elu_plus_one, linear_attention
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import linear_attention_step


class LinearAttention(RecurrentMixer):
  """Causal linear attention (Katharopoulos et al., 2020), x [B, T, d_model] -> same:

      S_t = S_{t-1} + v_t phi(k_t)^T,  o_t = S_t phi(q_t) [/ max(z_t . phi(q_t), eps)]

  with phi = ELU + 1, then y = W_o LayerNorm(merge_heads(o)).

  Attributes:
    d_model, num_heads, head_dim, impl, chunk_size, conv_size, out_norm, dtype, param_dtype:
      as `RecurrentMixer` (the op: `linear_attention`).
    normalize: divide by the additive normaliser (default True, the original form).
  """

  OP = "linear_attention"
  RECURRENCE = staticmethod(linear_attention)
  STEP = staticmethod(linear_attention_step)
  QK_BIAS = True

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64, normalize: bool = True,
               conv_size: int = common.DEFAULT_CONV_SIZE, out_norm: bool = True,
               dtype: DTypeLike = jnp.float32, param_dtype: DTypeLike = jnp.float32,
               rngs: nnx.Rngs):
    super().__init__(d_model, num_heads, head_dim, dtype=dtype, param_dtype=param_dtype)
    self.normalize = common.check_bool(type(self).__name__, "normalize", normalize)
    self._build(d_model, impl=impl, chunk_size=chunk_size, conv_size=conv_size,
                out_norm=out_norm, param_dtype=param_dtype, rngs=rngs)

  def _recurrence_options(self):
    return {"feature_map": None, "normalize": self.normalize}

  def _step_options(self):
    return {"feature_map": None, "normalize": self.normalize}

  def _inputs(self, x, q, k, v, mask):
    """Per-head phi(q), phi(k) (in the state dtype) and v; phi(k) and v are 0 at the pads (no
    write to S or z)."""
    H, f = self.num_heads, common.state_dtype(self.dtype)
    q, k, v = (common.split_heads(t, H) for t in (q, k, v))
    q, k = elu_plus_one(q.astype(f)), elu_plus_one(k.astype(f))
    k, v = common.mask_tokens(mask, k, v)
    return q, k, v

  def _initial_state(self, batch_size):
    """S = 0, z = 0."""
    H, D, f = self.num_heads, self.head_dim, common.state_dtype(self.dtype)
    return LinearAttentionState(jnp.zeros((batch_size, H, D, D), f),
                                jnp.zeros((batch_size, H, D), f))
