r"""Training speed with the library defaults: steps/s of experiments/train.py for
configs/mqar_zoology.py:512 (d_model 128, float32, batch 128) and configs/mqar_long.py at
T = 8,192 and 32,768 (d_model 512, 8 heads of 64, bfloat16, batch 8), each with VLA (impl
"auto"), VLA on impl="chunked", softmax attention, Gated DeltaNet and DeltaNet (each on its
default impl): one short train.py run each, one at a time (`lab.benchmarks.train_speed`).

    python experiments/bench_train_speed.py --workdir=OUT --out=OUT/train_speed.jsonl
    ... the same command again resumes a file cut short (same commit and device; the commit
    is `VLA_JAX_GIT_COMMIT` where the tree is not a git checkout), then
    cp OUT/train_speed.jsonl results/bench/train_speed/train_speed.jsonl
    python experiments/report_benchmarks.py     # BENCHMARKS.md "Training speed with ..."

    python experiments/bench_train_speed.py --dry_run --workdir=OUT   # the commands, estimate
    python experiments/bench_train_speed.py --smoke --workdir=OUT --out=OUT/smoke.jsonl

The 15 runs take about 4-5 minutes of one H100, compilation included (--dry_run prints the
estimate and what it assumes: most of it is each run's start and compilation). --smoke runs
the same settings at T = 64 with a tiny model for 4 steps (a CPU check of the rows and the
report).
"""

import os

from absl import app, flags

from lab import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the runs and their logs.")
_OUT = flags.DEFINE_string("out", os.path.join("results", "bench", "train_speed",
                                               "train_speed.jsonl"),
                           "The rows file (resumed when its commit and device are this "
                           "call's, else written anew).")
_SETTINGS = flags.DEFINE_list("settings", [], "Settings to run (all when empty): zoology_512, "
                              "long_8192, long_32768.")
_COLUMNS = flags.DEFINE_list("columns", [], "Columns to run (all when empty): vla, "
                             "vla_chunked, softmax, gated_deltanet, deltanet.")
# A call within 10 minutes: the last run starts by budget_s and ends by timeout_s (a run takes
# well under a minute).
_BUDGET = flags.DEFINE_float("budget_s", 420.0, "No run starts after this many seconds.")
_TIMEOUT = flags.DEFINE_float("timeout_s", 150.0, "A run without its last row by then is "
                              "stopped (status timeout).")
_SMOKE = flags.DEFINE_bool("smoke", False, "T = 64, a tiny model, 4 steps (a CPU check).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the runs' commands and the estimate; "
                             "run nothing.")
_RESTART = flags.DEFINE_bool("restart", False, "Write the rows file anew even where it could "
                             "be resumed.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()
  from lab.benchmarks import train_speed  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with cli.user_errors("bench_train_speed.py"):
    runs = train_speed.plan(_SETTINGS.value, _COLUMNS.value, smoke=_SMOKE.value)
    if _DRY_RUN.value:
      print(train_speed.listing(runs), flush=True)
      return
    train_speed.run_all(runs, root=root, workdir=os.path.abspath(_WORKDIR.value),
                        out=os.path.abspath(_OUT.value), smoke=_SMOKE.value,
                        budget_s=_BUDGET.value, timeout_s=_TIMEOUT.value,
                        restart=_RESTART.value, log=lambda line: print(line, flush=True))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
