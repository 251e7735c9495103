"""The JAX functions the suite times, and their inputs.

Every function takes a tuple of arrays and returns o [B, T, H, d]. The forward+backward variant
is the gradient of sum(o * c) with respect to every input, c a fixed random cotangent.
"""

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax import deltanet, gated_deltanet, linear_attention, vla_recurrence


def make_inputs(op, B, T, H, d, dtype, seed):
  """Inputs of one call of `op`, float `dtype` ([B, T, H, d] tensors; [B, T, H] gates)."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  shape = (B, T, H, d)
  q, k, v = (jax.random.normal(x, shape, jnp.float32).astype(dtype) for x in ks[:3])
  if op == "vla":
    u = (jax.random.normal(ks[3], shape, jnp.float32) / np.sqrt(d)).astype(dtype)
    return (q, k, v, u)
  if op == "softmax_attention" or op == "linear_attention":
    return (q, k, v)
  beta = jnp.ones((B, T, H), dtype)
  if op == "deltanet":
    return (q, k, v, beta)
  if op == "gated_deltanet":
    decay = jax.random.uniform(ks[4], (B, T, H), jnp.float32, minval=0.9, maxval=1.0)
    return (q, k, v, beta, jnp.log(decay).astype(dtype))
  raise ValueError(f"unknown op {op!r}")


def forward(op, impl, chunk):
  """fn(*inputs) -> o."""
  if op == "vla":
    return lambda q, k, v, u: vla_recurrence(q, k, v, u, impl=impl, chunk_size=chunk)[0]
  if op == "softmax_attention":
    return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                        implementation=impl)
  if op == "linear_attention":
    return lambda q, k, v: linear_attention(q, k, v, impl=impl, chunk_size=chunk)[0]
  if op == "deltanet":
    return lambda q, k, v, beta: deltanet(q, k, v, beta, impl=impl, chunk_size=chunk)[0]
  if op == "gated_deltanet":
    return lambda q, k, v, beta, g: gated_deltanet(q, k, v, beta, g, impl=impl,
                                                   chunk_size=chunk)[0]
  raise ValueError(f"unknown op {op!r}")


def with_backward(fwd, n_inputs):
  """fn(*inputs, cotangent) -> (fwd(*inputs), the cotangent pulled back to every input).

  The output is returned as well, as in training (where it feeds the next layer) and as the
  torch rows compute it: a gradient alone would let XLA drop forward work that only the
  output needs (VLA's split state path's output kernel, 0.15 ms at d = 64, T = 4096)."""
  def call(*args):
    xs, cot = args[:n_inputs], args[n_inputs]
    o, pullback = jax.vjp(fwd, *xs)
    return o, pullback(cot.astype(o.dtype))
  return call


def input_sets(op, B, T, H, d, dtype, n_sets, backward):
  sets = []
  for s in range(n_sets):
    xs = make_inputs(op, B, T, H, d, dtype, seed=100 * s + 1)
    if backward:
      cot = jax.random.normal(jax.random.PRNGKey(100 * s + 7), (B, T, H, d),
                              jnp.float32).astype(dtype)
      xs = xs + (cot,)
    sets.append(xs)
  return sets


def function(op, impl, pass_, chunk):
  """The function one row times."""
  fwd = forward(op, impl, chunk)
  if pass_ == "fwd":
    return fwd
  n_inputs = {"vla": 4, "softmax_attention": 3, "linear_attention": 3, "deltanet": 4,
              "gated_deltanet": 5}[op]
  return with_backward(fwd, n_inputs)


def abstract_inputs(op, B, T, H, d, dtype, backward):
  """Shapes and dtypes of one input set (no device memory)."""
  return jax.eval_shape(lambda: input_sets(op, B, T, H, d, jnp.dtype(dtype), 1, backward)[0])


def build(op, impl, pass_, B, T, H, d, dtype, chunk, n_sets=2):
  """(fn, input sets) for one row."""
  sets = input_sets(op, B, T, H, d, jnp.dtype(dtype), n_sets, backward=(pass_ == "fwd+bwd"))
  return function(op, impl, pass_, chunk), sets
