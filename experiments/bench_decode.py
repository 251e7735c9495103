"""Decode speed and memory per sequence: VLA's fixed-size state against softmax's KV cache.

    python experiments/bench_decode.py [--contexts=1024,4096,16384,65536,131072] [--batch=1]

One mixer layer (d_model = H * d_h, H = 16, d_h = 64, bfloat16 activations) decodes --steps
tokens in one compiled `lax.scan` of `step` calls, after a context of L tokens:
- VLA: the cache after a real prefill of L random tokens (impl --impl); its size is fixed.
- softmax: a KV cache of max_len = L + steps, filled with random keys and values up to L (a
  real prefill would only be slower; decoding reads the same cache).
Reports ms per token, tokens/s (batch / time per step) and the cache's bytes per sequence.
"""

import json

import jax
import jax.numpy as jnp
from absl import app, flags
from flax import nnx

from vla_jax.benchmarks.measure import median_seconds
from vla_jax.layers import SoftmaxAttention, VLAAttention

_CONTEXTS = flags.DEFINE_list("contexts", ["1024", "4096", "16384", "65536", "131072"],
                              "Context lengths L before decoding.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences decoded together.")
_STEPS = flags.DEFINE_integer("steps", 256, "Tokens decoded per timed call.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls (median reported).")
_HEADS = flags.DEFINE_integer("heads", 16, "Heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dim.")
_IMPL = flags.DEFINE_string("impl", "chunked", "VLA impl for the prefill.")
_OUT = flags.DEFINE_string("out", None, "Optional JSONL file for the rows.")


def decode_fn(graphdef, steps):
  @jax.jit
  def decode(state, cache, xs):
    mixer = nnx.merge(graphdef, state)
    def body(cache, x_t):
      y_t, cache = mixer.step(x_t, cache)
      return cache, y_t
    cache, ys = jax.lax.scan(body, cache, xs)
    return cache, ys
  return decode


def cache_bytes(cache, batch):
  return sum(x.nbytes for x in jax.tree.leaves(cache)) / batch


def main(argv):
  del argv
  H, D, B, N = _HEADS.value, _HEAD_DIM.value, _BATCH.value, _STEPS.value
  d_model = H * D
  kw = dict(dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  mixers = {"vla": VLAAttention(d_model, H, D, impl=_IMPL.value, **kw),
            "softmax": SoftmaxAttention(d_model, H, D, implementation="xla", **kw)}
  key = jax.random.key(0)
  xs = jax.random.normal(key, (N, B, d_model), jnp.bfloat16)
  print(f"decode on {jax.devices()[0].device_kind}: one layer, H={H}, d_h={D}, batch {B}, "
        f"{N} tokens per call, bfloat16")
  print(f"{'mixer':>8} | {'context':>8} | {'ms/token':>9} | {'tokens/s':>10} | "
        f"{'cache MiB/seq':>13}")
  rows = []
  for L in map(int, _CONTEXTS.value):
    for name, mixer in mixers.items():
      graphdef, state = nnx.split(mixer)
      if name == "vla":
        context = jax.random.normal(jax.random.fold_in(key, L), (B, L, d_model), jnp.bfloat16)
        prefill = jax.jit(lambda state, x: nnx.merge(graphdef, state).prefill(x)[1])
        cache = prefill(state, context)
      else:
        cache = mixer.init_cache(B, L + N)
        kk, kv = jax.random.split(jax.random.fold_in(key, L))
        cache = cache._replace(k=jax.random.normal(kk, cache.k.shape, cache.k.dtype),
                               v=jax.random.normal(kv, cache.v.shape, cache.v.dtype),
                               index=jnp.asarray(L, jnp.int32))
      seconds = median_seconds(decode_fn(graphdef, N), (state, cache, xs), repeats=_REPEATS.value)
      row = {"mixer": name, "context": L, "batch": B, "ms_per_token": 1e3 * seconds / N,
             "tokens_per_s": B * N / seconds, "cache_mib_per_seq": cache_bytes(cache, B) / 2**20}
      rows.append(row)
      print(f"{name:>8} | {L:>8} | {row['ms_per_token']:9.3f} | {row['tokens_per_s']:10.0f} | "
            f"{row['cache_mib_per_seq']:13.2f}", flush=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
  app.run(main)
