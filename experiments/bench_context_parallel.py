r"""The sequence-sharded VLA op on a mesh of one device against the plain op: time (fwd and
fwd+bwd, medians after warm-up) and peak memory, one JSON row per (impl, d, T, pass, path)
after a header line (`lab.benchmarks.context_parallel`).

    python experiments/bench_context_parallel.py --out=results/bench/context_parallel_h200.jsonl

Defaults: bfloat16, B = 1, H = 16, d in {64, 128}, impl pallas and chunked, T in {16384,
131072}, rows not started after --budget_s=270 recorded as skipped. CPU smoke:
--impls=chunked --dims=16 --Ts=64 --heads=2 --warmup=1 --min_reps=1 --target_s=0.
"""

import os

from absl import app, flags

from lab.benchmarks import context_parallel, records

_OUT = flags.DEFINE_string("out", None, "JSONL file for the rows (appended as they come).")
_TS = flags.DEFINE_list("Ts", ["16384", "131072"], "Sequence lengths.")
_DIMS = flags.DEFINE_list("dims", ["64", "128"], "Head dims (dk = dv).")
_IMPLS = flags.DEFINE_list("impls", ["pallas", "chunked"], "vla_recurrence impls.")
_PASSES = flags.DEFINE_list("passes", ["fwd", "fwd+bwd"], "Passes.")
_HEADS = flags.DEFINE_integer("heads", 16, "Heads.")
_BATCH = flags.DEFINE_integer("batch", 1, "Batch.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Input dtype.")
_CHUNK = flags.DEFINE_integer("chunk_size", 64, "chunk_size of the op.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls before timing.")
_TARGET = flags.DEFINE_float("target_s", 0.3, "Timed seconds per row (reps = target / call).")
_MIN_REPS = flags.DEFINE_integer("min_reps", 5, "Fewest timed calls per row.")
_BUDGET = flags.DEFINE_float("budget_s", 270.0, "Rows not started by then are skipped.")
flags.mark_flag_as_required("out")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  settings = dict(Ts=[int(t) for t in _TS.value], dims=[int(d) for d in _DIMS.value],
                  impls=_IMPLS.value, passes=_PASSES.value, heads=_HEADS.value,
                  batch=_BATCH.value, dtype=_DTYPE.value, chunk_size=_CHUNK.value,
                  warmup=_WARMUP.value, target_s=_TARGET.value, min_reps=_MIN_REPS.value,
                  budget_s=_BUDGET.value)
  if os.path.exists(_OUT.value):
    os.remove(_OUT.value)
  recorder = records.Recorder(_OUT.value)
  recorder.header(settings)
  context_parallel.run(recorder, **settings)


if __name__ == "__main__":
  app.run(main)
