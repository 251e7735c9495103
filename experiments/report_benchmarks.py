r"""Rewrites BENCHMARKS.md's generated blocks and its plots from the rows in
results/bench/*.jsonl (those of `experiments/bench.py` and `experiments/check_kernels.py`),
oldest run first, the per-kernel profile (`experiments/profile_kernels.py`), the
whole-model rows (`experiments/bench_model.py`) and the training-speed rows
(`experiments/bench_train_speed.py`). The words
around the blocks are left as they are; a new file gets every block under a heading.

    python experiments/report_benchmarks.py [--bench_dir=results/bench] [--out=BENCHMARKS.md]
        [--plots=results/plots] [--profile=results/bench/decisions/profile_h100.json]
        [--model=results/bench/model/model_h100.jsonl]
        [--baselines=results/bench/baselines/h100_delta.jsonl,results/bench/baselines/h100_gated.jsonl]
        [--train_speed=results/bench/train_speed/train_speed.jsonl]
"""

import os

from absl import app, flags

_BENCH_DIR = flags.DEFINE_string("bench_dir", os.path.join("results", "bench"),
                                 "Folder of the JSON-lines files.")
_OUT = flags.DEFINE_string("out", "BENCHMARKS.md", "The markdown file written.")
_PLOTS = flags.DEFINE_string("plots", os.path.join("results", "plots"),
                             "Folder of the plots ('' for none).")
_PROFILE = flags.DEFINE_string(
    "profile", os.path.join("results", "bench", "decisions", "profile_h100.json"),
    "The per-kernel profile JSON of experiments/profile_kernels.py ('' for none).")
_MODEL = flags.DEFINE_string(
    "model", os.path.join("results", "bench", "model", "model_h100.jsonl"),
    "The rows of experiments/bench_model.py ('' for none).")
_BASELINES = flags.DEFINE_list(
    "baselines", [os.path.join("results", "bench", "baselines", f"h100_{name}.jsonl")
                  for name in ("delta", "gated")],
    "Files of experiments/bench.py runs of the baseline kernels beside fla's, one table each "
    "(none: empty; kept apart from --bench_dir, whose rows a later file replaces across "
    "devices).")
_TRAIN_SPEED = flags.DEFINE_string(
    "train_speed", os.path.join("results", "bench", "train_speed", "train_speed.jsonl"),
    "The rows of experiments/bench_train_speed.py (its block reads 'not run yet' while the "
    "file does not exist).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # pylint: disable-next=import-outside-toplevel
  from lab.benchmarks import baseline_report, model_report, report, train_speed
  paths = report.bench_files(_BENCH_DIR.value)
  if not paths:
    raise app.UsageError(f"no *.jsonl files in {_BENCH_DIR.value}")
  command = report.regenerate_command(_BENCH_DIR.value, _OUT.value, _PLOTS.value,
                                     _PROFILE.value)
  extra = {}
  if _BASELINES.value:
    extra["baselines"] = baseline_report.blocks([model_report.load(path)
                                                 for path in _BASELINES.value])
  if _MODEL.value:
    extra["model"] = model_report.block(*model_report.load(_MODEL.value))
  extra["train_speed"] = train_speed.block(_TRAIN_SPEED.value)
  n, plots = report.write_report(paths, _OUT.value, _PLOTS.value or None, command,
                                 _PROFILE.value or None, extra)
  print(f"wrote {_OUT.value} ({n} rows from {len(paths)} files) and {len(plots)} plots")


if __name__ == "__main__":
  app.run(main)
