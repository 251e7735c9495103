"""Timings behind RESULTS.md section 8 (decoding) and the README's CPU table: wall-clock
medians of compiled calls (`lab.benchmarks.measure.median_seconds`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.benchmarks.measure import median_seconds
from vla_jax.layers import SoftmaxAttention, VLAAttention
from vla_jax.ops.vla import vla_recurrence


def _decode_fn(graphdef):
  """jit(state, cache, xs [N, B, d_model]) -> (cache, ys): N `step` calls in one lax.scan."""

  @jax.jit
  def decode(state, cache, xs):
    mixer = nnx.merge(graphdef, state)

    def body(cache, x_t):
      y_t, cache = mixer.step(x_t, cache)
      return cache, y_t
    return jax.lax.scan(body, cache, xs)
  return decode


def decode_rows(contexts, *, batch=1, steps=256, repeats=10, heads=16, head_dim=64,
                impl="chunked", log=None):
  """One row per (context L, mixer) of one VLA and one softmax attention layer (d_model = heads
  * head_dim, bfloat16 activations) decoding `steps` tokens in one compiled `lax.scan` of `step`
  calls after L tokens: {mixer, context, batch, ms_per_token, tokens_per_s, cache_mib_per_seq}.
  VLA's cache comes from a real prefill of L random tokens (impl `impl`); softmax's KV cache
  (max_len L + steps) is filled with random keys and values up to L."""
  d_model = heads * head_dim
  kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  mixers = {"vla": VLAAttention(d_model, heads, head_dim, impl=impl, conv_size=0, **kw),
            "softmax": SoftmaxAttention(d_model, heads, head_dim, implementation="xla", **kw)}
  key = jax.random.key(0)
  xs = jax.random.normal(key, (steps, batch, d_model), jnp.bfloat16)
  rows = []
  for L in contexts:
    for name, mixer in mixers.items():
      graphdef, state = nnx.split(mixer)
      if name == "vla":
        context = jax.random.normal(jax.random.fold_in(key, L), (batch, L, d_model),
                                    jnp.bfloat16)
        prefill = jax.jit(lambda state, x, g=graphdef: nnx.merge(g, state).prefill(x)[1])
        cache = prefill(state, context)
      else:
        cache = mixer.init_cache(batch, L + steps)
        kk, kv = jax.random.split(jax.random.fold_in(key, L))
        cache = cache._replace(k=jax.random.normal(kk, cache.k.shape, cache.k.dtype),
                               v=jax.random.normal(kv, cache.v.shape, cache.v.dtype),
                               mask=jnp.broadcast_to(jnp.arange(L + steps) < L,
                                                     cache.mask.shape),
                               index=jnp.asarray(L, jnp.int32))
      seconds = median_seconds(_decode_fn(graphdef), (state, cache, xs), repeats=repeats)
      cache_bytes = sum(x.nbytes for x in jax.tree.leaves(cache)) / batch
      rows.append({"mixer": name, "context": L, "batch": batch,
                   "ms_per_token": 1e3 * seconds / steps, "tokens_per_s": batch * steps / seconds,
                   "cache_mib_per_seq": cache_bytes / 2 ** 20})
      if log:
        log(rows[-1])
  return rows


def impl_times(lengths, impls, *, heads=4, dim=64, repeats=5):
  """{(T, impl): milliseconds}: vla_recurrence's forward (float32, B = 1, `heads` heads of
  dk = dv = `dim`) under jit, median of `repeats` calls after one warm-up call."""
  out = {}
  for T in lengths:
    key = jax.random.split(jax.random.key(T), 4)
    q, k, v = (jax.random.normal(key[i], (1, T, heads, dim), jnp.float32) for i in range(3))
    u = jax.random.normal(key[3], (1, T, heads, dim), jnp.float32) / np.sqrt(dim)
    for impl in impls:
      fn = jax.jit(functools.partial(vla_recurrence, impl=impl))
      out[(T, impl)] = 1e3 * median_seconds(fn, (q, k, v, u), repeats=repeats)
  return out
