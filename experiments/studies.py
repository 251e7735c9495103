r"""Runs one of five studies of VLA's failing seeds, the authors' layer, the baselines and mixed
precision, each a list of experiments/sweep.py jobs (`lab.studies`), resumable over calls.

    python experiments/studies.py --study=weights_or_data --workdir=OUT/weights_or_data
    ... the same command again (OUT kept) until --list shows every job done, then
    python experiments/studies.py --study=weights_or_data --workdir=OUT/weights_or_data \
        --summary
    python experiments/studies.py --study=weights_or_data --workdir=OUT/weights_or_data \
        --export=results/training/studies/weights_or_data        # what RESULTS.md reads

Studies (`lab.studies` says what each runs and why), with the GPU time one H200 or H100 is
expected to take, scaled from the committed H200 rows' wall_s (no GPU ran these jobs yet: the
CPU smoke, `--override=train.num_steps=4`, checks that every job builds, trains, probes and
writes its rows):
  weights_or_data  5 jobs (a data seed each) x 5 initialisation seeds, T = 64, 12,000 steps,
                   all 5 at once (300,000 run-steps; the seed_remedies grid's 280,000 at T = 64
                   and 128 took 350-410 s as 14 processes): about 500 s, two calls.
  fix              16 jobs (4 cells x 4 variants) x 10 seeds, 4,000 steps (640,000
                   run-steps). T = 64 and 128, d_model 64: 8 jobs at once, about 470 s on one
                   H100 (their rows: 260-460 s a job), one or two calls. T = 256 and 512,
                   d_model 128 (--only=T256-,T512- --per_gpu=2: a 10-seed job at T = 512 may
                   take most of a GPU's memory): 15.7 billion training tokens, about 30-35
                   GPU-minutes on one H100 at the 7.5-8.5 million tokens/s that the parity
                   study's jobs (d_model 128) and the fix study's T = 64 / 128 jobs (beta
                   variants included) sustained there, T = 512 two thirds of it; four or five
                   calls (--only=T256- and --only=T512- split it).
  authors          6 jobs (n = 4 ... 32) x 3 seeds x 3 rates, 3,000 steps, T <= 97, all at
                   once (the capacity grid's VLA jobs of 9 runs took 180-400 s, 5 a GPU):
                   about 300 s, one call.
  baselines        T = 512: the collapsed Gated DeltaNet job again at two precisions (3 runs,
                   4,000 steps each: about 60 s at the default, 2-4x that at "highest"); 8
                   jobs of 9 runs (3 rates x 3 seeds) at 4,000 steps (GPU-bound: VLA's such job
                   ran 31.7 steps/s alone, about 130 s each: about 17 minutes); then a
                   12,000-step job of 3 seeds per cell at its chosen rate (68-89 steps/s alone,
                   about 126 in all at 4 at once: about 13 minutes): about 35 GPU-minutes in
                   all, 2 jobs a GPU (GDN at T = 512 ran out of memory at 9 at once), four to
                   six calls; --only=collapse runs the collapse part alone, --only=-d64- the
                   smaller width.
  parity           12 jobs (3 mixers x 2 cells x float32 / bfloat16) x 3 seeds, 2,000 steps,
                   T = 256 and 512, d_model 128, 6 at once (72,000 run-steps; a 3-seed
                   T = 512 job ran 68-89 steps/s alone on the H200, about 126 in all at 4 at
                   once, so the 12,000 job-steps at T = 512 take about 100 s and those at
                   T = 256, half the tokens, about 50 s, with two waves of start-up and
                   compilation, 30-40 s each): about 4 minutes on the H200, 4-5 on one H100,
                   one call.

Each call runs the jobs not done yet, none started after --budget_s, stops (with a checkpoint)
those still running at --budget_s + --grace_s, and a later call resumes them; the baselines'
12,000-step jobs are planned as their cells' 4,000-step sweeps finish (in the same call where
time is left). Several jobs share a GPU (--per_gpu, default per study): each process then
allocates GPU memory on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false unless set). --summary
prints the study's tables (markdown, every run) from --workdir; --export copies its rows and
run files (metrics slimmed) to the folder RESULTS.md's blocks read
(results/training/studies/<study>/, `lab.report.studies`), keeping the rows of jobs there that
this workdir does not hold (a study run over several fresh machines exports into one folder).
"""

import os

from absl import app, flags

from lab import cli

# Jobs a GPU by study: all at once for the small ones; two at T = 512 for the baselines' sweeps
# of 9 runs, six of 3 runs for the parity study (half its jobs at T = 512).
PER_GPU = {"weights_or_data": 5, "fix": 8, "authors": 6, "baselines": 2, "parity": 6}
CAPACITY_ROWS = "results/training/mqar_capacity_h200.jsonl"

_STUDY = flags.DEFINE_enum("study", None, list(PER_GPU), "The study to run.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the rows (<study>.jsonl), runs, logs.")
_BUDGET = flags.DEFINE_float("budget_s", 500.0, "No job starts after this many seconds.")
_GRACE = flags.DEFINE_float("grace_s", 40.0, "Jobs running at budget_s + grace_s are stopped "
                            "(with a checkpoint).")
_STOP = flags.DEFINE_float("stop_s", 50.0, "Seconds a stopped job has to checkpoint and exit.")
_PER_GPU = flags.DEFINE_integer("per_gpu", None, "Jobs at once a GPU (default: the study's, "
                                "PER_GPU).")
_GPUS = flags.DEFINE_list("gpus", [], "GPU ids to pin jobs to; empty: no pinning.")
_ONLY = flags.DEFINE_list("only", [], "Run only jobs whose name contains one of these.")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "FIELD=VALUE, a --config.FIELD=VALUE "
                                      "for every job (recorded in the rows).")
_LIST = flags.DEFINE_bool("list", False, "Print the jobs (done or to do) and run none.")
_SUMMARY = flags.DEFINE_bool("summary", False, "Print the study's tables and run nothing.")
_EXPORT = flags.DEFINE_string("export", None, "Copy the study's rows and run files to this "
                              "folder and run nothing.")
flags.mark_flags_as_required(["study", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()
  # pylint: disable=g-import-not-at-top
  from lab import grid, studies
  from lab.report import studies as report
  from vla_jax.training import jsonl
  # pylint: enable=g-import-not-at-top

  overrides = cli.field_overrides(_OVERRIDE.value)
  study = _STUDY.value
  here = os.path.dirname(os.path.abspath(__file__))
  root, workdir = os.path.dirname(here), os.path.abspath(_WORKDIR.value)
  rows_path = os.path.join(workdir, study + ".jsonl")
  pick = lambda jobs: [j for j in jobs if not _ONLY.value
                       or any(p in j.name for p in _ONLY.value)]
  with cli.user_errors("studies.py"):
    if _SUMMARY.value:
      capacity = jsonl.read_rows(os.path.join(root, CAPACITY_ROWS))
      print("\n\n".join(report.tables(study, studies.collect(workdir, study), capacity,
                                      full=True)), flush=True)
      return
    if _EXPORT.value:
      copied = studies.export(workdir, study, _EXPORT.value)
      print(f"copied the rows and {len(copied)} jobs' files to {_EXPORT.value}", flush=True)
      return
    if _LIST.value:
      rows = jsonl.read_rows(rows_path)
      print(grid.listing(pick(studies.jobs(study, rows, overrides)), {study: rows}, (),
                         overrides), flush=True)
      return
    per_gpu = _PER_GPU.value or PER_GPU[study]
    if per_gpu > 1:
      os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    left, started = _BUDGET.value, set()
    while left > 0:   # the baselines plan more jobs as their sweeps finish
      rows = jsonl.read_rows(rows_path)
      todo = [j for j in pick(studies.jobs(study, rows, overrides)) if j.name not in started
              and not grid.is_done(j, rows, (), overrides)]
      if not todo:
        break
      started |= {j.name for j in todo}
      summary = grid.run_grid(
          todo, sweep_script=os.path.join(here, "sweep.py"), root=root, workdir=workdir,
          seeds=(), overrides=overrides, gpus=_GPUS.value, per_gpu=per_gpu, budget_s=left,
          grace_s=_GRACE.value, stop_s=_STOP.value, log=lambda line: print(line, flush=True))
      left -= summary["wall_s"]
  rows = jsonl.read_rows(rows_path)
  print(grid.listing(pick(studies.jobs(study, rows, overrides)), {study: rows}, (), overrides),
        flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
