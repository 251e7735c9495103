r"""Runs the sweeps behind RESULTS.md, several processes per GPU, and collects their rows.

    python experiments/grid.py --grids=capacity,long --workdir=OUT [--gpus=0,1] [--per_gpu=4]

Each job is one experiments/sweep.py call (one mixer at one setting, its seeds and rates
vmapped) whose rows go to OUT/<grid>.jsonl; the grids and the scheduling rules are in
`lab.grid`. A second call with the same --workdir skips finished jobs and resumes
stopped ones from their checkpoints. --list prints the jobs (done or to do) and runs none.

The tuned zoology comparison (issue 37) on one H200, a cell's 12,000-step jobs (one a rate)
a call of under ten minutes, each call resuming the last:

    python experiments/grid.py --grids=zoology_tuned --workdir=OUT --gpus=0 --per_gpu=3 \
        --vla_impl=pallas --only=T512-d64-linear-s12000 --budget_s=30 --grace_s=560

Measured on the H200 (16 host cores; T = 512, d_model 64):
- Jobs of 3 seeds x 1 rate: one alone ran at 68-89 steps/s (Gated DeltaNet to VLA), bound by
  making its batches on the host; 4 at once at 22-39 steps/s each (~126 in all), 12 at once
  at ~7 each (~84 in all: the host's cores oversubscribed).
- A job of 3 seeds x 3 rates: the GPU is the bound. VLA alone: 31.7 steps/s, 12,000 steps
  in 413 s, 50 GiB of GPU memory, the GPU busy ~100%; three such jobs at once: 9.4-11.5
  steps/s each (~30 in all, 133 GiB). Hence one job per rate at 12,000 steps
  (`lab.grid.tuned_jobs`), a cell's three at once.
- Out of memory (also with XLA_PYTHON_CLIENT_PREALLOCATE=false): Gated DeltaNet at T = 256,
  d_model 128 at 10 at once (11.4 GiB asked) and T = 128, d_model 256 (13 GiB); DeltaNet and
  Gated DeltaNet at T = 512 at 9 at once (5.9-11.9 GiB asked), and Gated DeltaNet at T = 512,
  d_model 256 with 3 rates at 3 at once (32 GiB asked). A job that runs out of memory goes
  back to the queue once, to run alone on a GPU.
A stopped job resumes from its checkpoint under OUT/runs only where OUT survives between calls.

It extends results/training/mqar_zoology_h200.jsonl (--zoology_rows): past the edge rate of
every cell below 0.99, a Gated DeltaNet row with the slow gate initialisation, and T = 512 at
12,000 steps, a job per cell (`lab.grid.tuned_jobs`); its rows go to
OUT/zoology_tuned.jsonl. `--only=-s4000-` or `--only=-s12000-` runs one part. Each round
goes on past the edges the last one found, planned from both rows files as RESULTS.md reads
them: --zoology_rows=results/training/mqar_zoology_h200.jsonl,OUT/zoology_tuned.jsonl.

The remedies for VLA's failing seeds (issue 37): 14 jobs (two zoology cells x seven variants,
rate 3e-3, seeds 0-4 carried by the jobs, training diagnostics every 50 steps), all at once:

    python experiments/grid.py --grids=seed_remedies --workdir=OUT --gpus=0 --per_gpu=14 \
        --vla_impl=pallas --budget_s=420 --grace_s=30 --stop_s=60

repeated with the same OUT until --list shows every job done. OUT/seed_remedies.jsonl and each
job's OUT/runs/<job>/metrics.jsonl and sweep_results.jsonl are what RESULTS.md section 9 reads
(copied as `lab.report.seeds` says).
"""

import os

from absl import app, flags

from lab import cli

_GRIDS = flags.DEFINE_list("grids", ["capacity"], "Grids to run: capacity, long, copy, zoology, "
                           "ablation, ablation_demo, zoology_tuned, seed_remedies.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the rows (<grid>.jsonl), runs, logs.")
_GPUS = flags.DEFINE_list("gpus", [], "GPU ids to pin jobs to; empty: no pinning.")
_PER_GPU = flags.DEFINE_integer("per_gpu", 4, "Processes per GPU (or in all, without --gpus).")
_BUDGET = flags.DEFINE_float("budget_s", 540.0, "No job starts after this many seconds.")
_GRACE = flags.DEFINE_float("grace_s", 30.0, "Jobs running at budget_s + grace_s are stopped.")
_STOP = flags.DEFINE_float("stop_s", 60.0, "Seconds a stopped job has to checkpoint and exit "
                           "after SIGTERM before it is killed.")
_SEEDS = flags.DEFINE_list("seeds", None, "Seeds of every job (default: a job's own, the "
                           "seed_remedies grid's 0-4; else 0, 1, 2).")
_LONG_TS = flags.DEFINE_list("long_Ts", None, "Lengths of the long grid (default: 64 to 4096, "
                             "lab.grid.LONG_TS).")
_ZOOLOGY_STEPS = flags.DEFINE_integer("zoology_steps", 4000, "Training steps (zoology grid).")
_ZOOLOGY_ROWS = flags.DEFINE_list(
    "zoology_rows", ["results/training/mqar_zoology_h200.jsonl"], "Rows files of the zoology grid "
    "that the zoology_tuned grid extends (a relative path not found here: under the checkout).")
_TUNED_STEPS = flags.DEFINE_integer("tuned_steps", 12000, "Training steps of the zoology_tuned "
                                    "grid at T = 512.")
_LIST = flags.DEFINE_bool("list", False, "Print the jobs (done or to do, from the rows under "
                          "--workdir) and run none.")
_DEMO_STEPS = flags.DEFINE_integer("demo_steps", 500, "Training steps (ablation_demo grid).")
_RATES = flags.DEFINE_list("rates", [], "Learning rates replacing every job's (default: the "
                           "grid's).")
_VLA_IMPL = flags.DEFINE_string("vla_impl", None, "model.impl of the VLA jobs (pallas on a GPU: "
                                "the same function as the default chunked).")
_ONLY = flags.DEFINE_list("only", [], "Run only jobs whose name contains one of these, in the "
                          "order of the list.")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "FIELD=VALUE, a --config.FIELD=VALUE "
                                      "for every job.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  from lab import grid  # pylint: disable=g-import-not-at-top
  from vla_jax.training import jsonl  # pylint: disable=g-import-not-at-top

  overrides = cli.field_overrides(_OVERRIDE.value)
  here = os.path.dirname(os.path.abspath(__file__))
  root, workdir = os.path.dirname(here), os.path.abspath(_WORKDIR.value)
  with cli.user_errors("grid.py"):
    given = [int(s) for s in _SEEDS.value or []]
    seeds = given or list(grid.DEFAULT_SEEDS)
    zoology_rows = None
    if "zoology_tuned" in _GRIDS.value:
      paths = [p if os.path.isfile(p) else os.path.join(root, p) for p in _ZOOLOGY_ROWS.value]
      missing = [p for p in paths if not os.path.isfile(p)]
      if missing:
        raise ValueError(f"--zoology_rows: no such file(s): {', '.join(missing)}")
      zoology_rows = [r for p in paths for r in jsonl.read_rows(p)]
    jobs = grid.select_jobs(_GRIDS.value, rates=_RATES.value, seeds=given,
                            vla_impl=_VLA_IMPL.value,
                            only=_ONLY.value,
                            long_Ts=[int(t) for t in _LONG_TS.value or grid.LONG_TS],
                            zoology_steps=_ZOOLOGY_STEPS.value, demo_steps=_DEMO_STEPS.value,
                            zoology_rows=zoology_rows, tuned_steps=_TUNED_STEPS.value)
    if _LIST.value:
      rows = {g: jsonl.read_rows(os.path.join(workdir, g + ".jsonl"))
              for g in {j.grid for j in jobs}}
      print(grid.listing(jobs, rows, seeds, overrides), flush=True)
      return
    summary = grid.run_grid(
        jobs, sweep_script=os.path.join(here, "sweep.py"), root=root,
        workdir=workdir, seeds=seeds,
        overrides=overrides, gpus=_GPUS.value, per_gpu=_PER_GPU.value, budget_s=_BUDGET.value,
        grace_s=_GRACE.value, stop_s=_STOP.value, log=lambda line: print(line, flush=True))
  failed = [f for f in summary["finished"] if f[1] != 0]
  print(f"finished {len(summary['finished'])} (failed {len(failed)}: {failed}), unfinished "
        f"{len(summary['unfinished'])}: {summary['unfinished']}"
        + (f"; run alone after running out of memory: {summary['alone']}"
           if summary["alone"] else ""), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
