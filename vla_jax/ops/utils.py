"""Small numerical helpers shared by the recurrences."""

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def einsum(spec, *operands):
  """`jnp.einsum` at full float32 precision (no TF32 or bf16 passes on accelerators)."""
  return jnp.einsum(spec, *operands, precision=HIGHEST)


def unit(x, eps):
  """x / max(||x||, eps) along the last axis.

  The floor is applied to the squared norm, so the gradient at x = 0 is finite (zero
  direction in, zero direction out): padding with zero vectors is exact and NaN-free.
  """
  sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(sq, jnp.asarray(eps, x.dtype) ** 2))


def to_chunks(x, chunk_size):
  """[B, T, H, ...] -> [B, H, N, C, ...], zero-padding T up to N * C."""
  b, t, h = x.shape[:3]
  n = -(-t // chunk_size)
  pad = n * chunk_size - t
  if pad:
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape((b, n, chunk_size, h) + x.shape[3:])
  return jnp.moveaxis(x, 3, 1)


def from_chunks(x, length):
  """[B, H, N, C, ...] -> [B, T, H, ...], dropping padding beyond `length`."""
  b, h, n, c = x.shape[:4]
  x = jnp.moveaxis(x, 1, 3).reshape((b, n * c, h) + x.shape[4:])
  return x[:, :length]
