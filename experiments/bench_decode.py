r"""Decode speed and memory per sequence: VLA's fixed-size state against softmax's KV cache.

    python experiments/bench_decode.py [--contexts=1024,4096,16384,65536,131072] [--out=rows.jsonl]

One mixer layer (H = --heads, d_h = --head_dim, bfloat16 activations) decodes --steps tokens
in one compiled `lax.scan` of `step` calls after a context of L tokens
(`lab.report.speed.decode_rows`); prints ms per token, tokens/s and the cache's MiB per
sequence. RESULTS.md section 8 reads the rows.
"""

import json

from absl import app, flags

from lab import cli

_CONTEXTS = flags.DEFINE_list("contexts", ["1024", "4096", "16384", "65536", "131072"],
                              "Context lengths L before decoding.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences decoded together.")
_STEPS = flags.DEFINE_integer("steps", 256, "Tokens decoded per timed call.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls (median reported).")
_HEADS = flags.DEFINE_integer("heads", 16, "Heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dim.")
_IMPL = flags.DEFINE_string("impl", "chunked", "VLA impl of the prefill.")
_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are written to.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  import jax  # pylint: disable=g-import-not-at-top
  from lab.report import speed  # pylint: disable=g-import-not-at-top
  from vla_jax.training import jsonl  # pylint: disable=g-import-not-at-top

  print(f"decode on {jax.devices()[0].device_kind}: one layer, H={_HEADS.value}, "
        f"d_h={_HEAD_DIM.value}, batch {_BATCH.value}, {_STEPS.value} tokens per call, bfloat16")
  print(f"{'mixer':>8} | {'context':>8} | {'ms/token':>9} | {'tokens/s':>10} | "
        f"{'cache MiB/seq':>13}")
  log = lambda r: print(f"{r['mixer']:>8} | {r['context']:>8} | {r['ms_per_token']:9.3f} | "
                        f"{r['tokens_per_s']:10.0f} | {r['cache_mib_per_seq']:13.2f}", flush=True)
  with cli.user_errors("bench_decode.py"):
    rows = speed.decode_rows([int(c) for c in _CONTEXTS.value], batch=_BATCH.value,
                             steps=_STEPS.value, repeats=_REPEATS.value, heads=_HEADS.value,
                             head_dim=_HEAD_DIM.value, impl=_IMPL.value, log=log)
  if _OUT.value:
    jsonl.write_rows(_OUT.value, rows)
    print(json.dumps({"rows": len(rows), "out": _OUT.value}))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
