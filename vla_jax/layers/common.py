"""Pieces shared by the mixers: head arithmetic, projections, the short convolution, the readout.

Every mixer maps x [B, T, d_model] -> y [B, T, d_model] and is causal. Parameters are stored in
`param_dtype`, activations computed in `dtype`; recurrences keep their state in float32
(float64 under x64) whatever `dtype` is, and return outputs in `dtype`.
"""

import jax
import jax.numpy as jnp
from flax import nnx


def resolve_head_dim(name, d_model, num_heads, head_dim):
  """Returns the per-head width; `head_dim=None` means d_model // num_heads (must divide)."""
  for arg, value in (("d_model", d_model), ("num_heads", num_heads)):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"{name}: {arg} must be a positive int; got {value!r}")
  if head_dim is None:
    if d_model % num_heads:
      raise ValueError(f"{name}: d_model={d_model} is not divisible by num_heads={num_heads}; "
                       "pass head_dim explicitly or change num_heads")
    return d_model // num_heads
  if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
    raise ValueError(f"{name}: head_dim must be a positive int or None; got {head_dim!r}")
  return head_dim


def check_choice(name, arg, value, choices):
  if value not in choices:
    raise ValueError(f"{name}: {arg} must be one of {', '.join(map(repr, choices))}; "
                     f"got {value!r}")
  return value


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
  """x / max(||x||, eps) along the last axis (finite gradient at 0)."""
  sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sq, jnp.asarray(eps, x.dtype) ** 2))


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

  def __call__(self, x):
    """x: [B, T, F] -> [B, T, F]."""
    K = self.kernel_size
    w = self.kernel[...].astype(self.dtype)
    xp = jnp.pad(x, ((0, 0), (K - 1, 0), (0, 0)))
    T = x.shape[1]
    y = sum(xp[:, i:i + T] * w[i] for i in range(K))
    return jax.nn.silu(y)


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
