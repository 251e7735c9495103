"""`SoftmaxAttention`: causal multi-head softmax attention."""

import jax
import jax.numpy as jnp
from flax import nnx

from vla_jax.layers import common

IMPLEMENTATIONS = ("auto", "cudnn", "xla")
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


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


class SoftmaxAttention(nnx.Module):
  """Causal softmax attention, x [B, T, d_model] -> [B, T, d_model]:
  y = W_o merge_heads(softmax(q k^T / sqrt(d_h) + causal mask) v).

  Attributes:
    d_model, num_heads, head_dim: num_heads * head_dim must equal d_model (standard MHA).
    implementation: "auto" (default; see `resolve_implementation`), "cudnn" (GPU, bf16/fp16
      only) or "xla".
    dtype, param_dtype: activation and parameter dtypes (default float32).
  """

  RECURRENT = False

  def __init__(self, d_model, num_heads, head_dim=None, *, implementation="auto",
               dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    name = type(self).__name__
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim)
    if num_heads * self.head_dim != d_model:
      raise ValueError(f"{name}: num_heads * head_dim must equal d_model; got "
                       f"{num_heads} * {self.head_dim} != {d_model}")
    self.num_heads = num_heads
    common.check_choice(name, "implementation", implementation, IMPLEMENTATIONS)
    self.implementation = resolve_implementation(implementation, dtype)
    if self.implementation == "cudnn" and jnp.dtype(dtype) not in tuple(
        map(jnp.dtype, _CUDNN_DTYPES)):
      raise ValueError(f"{name}: implementation='cudnn' needs dtype bfloat16 or float16; got "
                       f"{jnp.dtype(dtype)}")
    self.dtype = dtype
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, d_model, use_bias=True, **kw)
    self.k_proj = common.dense(d_model, d_model, use_bias=True, **kw)
    self.v_proj = common.dense(d_model, d_model, use_bias=True, **kw)
    self.out = common.OutputProjection(d_model, d_model, out_norm=False, **kw)

  def __call__(self, x):
    """x: [B, T, d_model] -> [B, T, d_model] in `dtype`."""
    x = x.astype(self.dtype)
    H = self.num_heads
    q, k, v = (common.split_heads(p(x), H) for p in (self.q_proj, self.k_proj, self.v_proj))
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                     implementation=self.implementation)
    return self.out(o)
