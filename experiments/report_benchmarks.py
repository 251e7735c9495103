r"""Writes BENCHMARKS.md and its plots from the rows in results/bench/*.jsonl (those of
`experiments/bench.py` and `experiments/check_kernels.py`), oldest run first.

    python experiments/report_benchmarks.py [--bench_dir=results/bench] [--out=BENCHMARKS.md]
        [--plots=results/plots]
"""

import os

from absl import app, flags

_BENCH_DIR = flags.DEFINE_string("bench_dir", os.path.join("results", "bench"),
                                 "Folder of the JSON-lines files.")
_OUT = flags.DEFINE_string("out", "BENCHMARKS.md", "The markdown file written.")
_PLOTS = flags.DEFINE_string("plots", os.path.join("results", "plots"),
                             "Folder of the plots ('' for none).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from lab.benchmarks import report  # pylint: disable=import-outside-toplevel
  paths = report.bench_files(_BENCH_DIR.value)
  if not paths:
    raise app.UsageError(f"no *.jsonl files in {_BENCH_DIR.value}")
  command = (f"python3 experiments/report_benchmarks.py --bench_dir={_BENCH_DIR.value} "
             f"--out={_OUT.value} --plots={_PLOTS.value}")
  n, plots = report.write_report(paths, _OUT.value, _PLOTS.value or None, command)
  print(f"wrote {_OUT.value} ({n} rows from {len(paths)} files) and {len(plots)} plots")


if __name__ == "__main__":
  app.run(main)
