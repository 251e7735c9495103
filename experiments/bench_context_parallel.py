r"""The sequence-sharded VLA op on a mesh of one device against the plain op: time (fwd and
fwd+bwd, medians) and XLA's compiled memory, one JSON row per (impl, d, T, pass).

    python experiments/bench_context_parallel.py --out=results/bench/context_parallel_h200.jsonl

Defaults: bfloat16, B = 1, H = 16, d in {64, 128}, impl pallas and chunked, T in {16384,
131072}. CPU smoke: --impls=chunked --dims=16 --Ts=64 --heads=2 --repeats=1 --warmup=1.
"""

import json

import jax
import jax.numpy as jnp
from absl import app, flags

from vla_jax.parallel.overhead import overhead_rows

_OUT = flags.DEFINE_string("out", None, "JSONL file for the rows (written as they come).")
_TS = flags.DEFINE_list("Ts", ["16384", "131072"], "Sequence lengths.")
_DIMS = flags.DEFINE_list("dims", ["64", "128"], "Head dims (dk = dv).")
_IMPLS = flags.DEFINE_list("impls", ["pallas", "chunked"], "vla_recurrence impls.")
_HEADS = flags.DEFINE_integer("heads", 16, "Heads.")
_BATCH = flags.DEFINE_integer("batch", 1, "Batch.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Input dtype.")
_CHUNK = flags.DEFINE_integer("chunk_size", 64, "chunk_size of the op.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls per measurement (median).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls before timing.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  print(f"device: {jax.devices()[0].device_kind}", flush=True)
  out = open(_OUT.value, "w") if _OUT.value else None   # pylint: disable=consider-using-with
  try:
    for row in overhead_rows(Ts=[int(t) for t in _TS.value], dims=[int(d) for d in _DIMS.value],
                             impls=_IMPLS.value, heads=_HEADS.value, batch=_BATCH.value,
                             dtype=jnp.dtype(_DTYPE.value), chunk_size=_CHUNK.value,
                             repeats=_REPEATS.value, warmup=_WARMUP.value):
      line = json.dumps(row)
      print(line, flush=True)
      if out:
        out.write(line + "\n")
        out.flush()
  finally:
    if out:
      out.close()


if __name__ == "__main__":
  app.run(main)
