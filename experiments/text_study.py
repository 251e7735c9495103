r"""The byte-level language-modelling study (planned): six mixers at the small size
(configs/text_small.py, ~10.7-11.7M parameters, Gated DeltaNet with fla's output gate and
values twice the key width 14.3M; T = 1024) and equal tokens, three learning
rates each (and the next rate of `lab.grid.RATE_GRID` past an edge, as often as the best is
the highest or lowest tried), then the best rate (by validation bits per byte) with two more
seeds; every run
scored on the test split at T, 4T and 16T (length extrapolation) in bits per byte, overall
and by position bucket, and its training throughput in tokens/s.

    python experiments/fetch_text.py --out=runs/text_cache        # once, with the network
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python experiments/text_study.py \
        --workdir=runs/text_study --data_dir=runs/text_cache --budget_s=500
    ... the same command again (runs/text_study kept between calls; on a fresh machine add
    --rows_from=results/training to start from the committed rows) until `--list` shows
    every job done, then
    python experiments/text_study.py --workdir=runs/text_study --data_dir=runs/text_cache \
        --summary

Each job is one experiments/sweep.py call (`lab.grid.run_grid` schedules them,
one at a time by default: the runs are GPU-bound); the rate jobs vmap a mixer's three rates
(seed 0), the seed jobs its best rate (seeds 1 and 2; seed 0 at that rate is the rate job's
run: a sweep's run equals the single run). Rows go to <workdir>/text.jsonl; a call skips
finished jobs, resumes a stopped one from its checkpoint (a SIGTERM at --budget_s + --grace_s
checkpoints it), runs a mixer's rate past an edge (one run, in a job named by its rate) once
its rate job is done, and its seed job once its best rate is inside the rates tried.
--summary prints, per mixer, the rates tried, the chosen rate, test bits per byte at each
length over the three seeds (mean, std) with the position buckets' means, and tokens/s.
`--rates=1e-3` is the study's cheapest version: one run a mixer, no seed jobs (6 runs, about a
fifth of the cost).

Budget: 30 runs of 600 steps x 32 x 1024 bytes = 19.7M bytes each (about one pass over the
train split), 590M bytes in all. With three vmapped rates and then two seeds a job, the full
study is about 30 GPU-minutes, more with rates past an edge (a rate job took 2-3 minutes on
one H200, 2.2-2.5 on one H100, a run past an edge 2 on the H100 with compilation and scoring;
results/training/text_study_h200.jsonl, text_study_h100.jsonl). A
call resumed after --budget_s compiles its job again (~1 minute). Memory: softmax attention
scored at 16K holds float32 scores and probabilities of 6 x 16K x 16K per run (~13 GB; ~39 GB
for a rate job's three vmapped runs), hence the memory fraction above JAX's default 0.75 on an
80 GB H100.
"""

import json
import math
import os

import numpy as np
from absl import app, flags

from lab import cli

CONFIG = "configs/text_small.py"
GRID = "text"
RATES = ("3e-4", "1e-3", "3e-3")
RATE_SEED = 0
MORE_SEEDS = (1, 2)
EVAL_LENGTHS = (1024, 4096, 16384)   # T, 4T, 16T of configs/text_small.py
PENALTY = "model.options.vla.penalty_scale"
QK_MAP = "model.options.vla.qk_map"
# (label, overrides of configs/text_small.py): softmax attention with RoPE (the config's),
# the recurrent mixers with their short convolution and base's impl, VLA with the layer's
# default penalty scale 1 and with the authors' 1 / sqrt(d_h) (RESULTS.md's "authors'
# penalty" rows; everything else as the VLA row), both with the authors' ELU + 1 queries and
# keys they were made with (the layer's default is "silu_l2" since, as for lab.grid's rows).
MIXERS = (
    ("softmax_rope", {"model.mixer": "softmax"}),
    ("linear", {"model.mixer": "linear"}),
    ("deltanet", {"model.mixer": "deltanet"}),
    ("gated_deltanet", {"model.mixer": "gated_deltanet"}),
    ("vla", {"model.mixer": "vla", QK_MAP: "elu1"}),
    ("vla_authors", {"model.mixer": "vla", PENALTY: "inv_sqrt_dh", QK_MAP: "elu1"}),
)
VALIDATION_SET = f"text_T{EVAL_LENGTHS[0]}"

_WORKDIR = flags.DEFINE_string("workdir", None, "Folder of the rows (text.jsonl), runs, logs.")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "The text cache (experiments/fetch_text.py; "
                                "default ~/.cache/vla_jax/text).")
_BUDGET = flags.DEFINE_float("budget_s", 500.0, "No job starts after this many seconds.")
_GRACE = flags.DEFINE_float("grace_s", 20.0, "Jobs running at budget_s + grace_s are stopped "
                            "(with a checkpoint).")
_STOP = flags.DEFINE_float("stop_s", 60.0, "Seconds a stopped job has to checkpoint and exit.")
_PER_GPU = flags.DEFINE_integer("per_gpu", 1, "Jobs at once.")
_ONLY = flags.DEFINE_list("only", [], "Run only the mixers of these labels.")
_RATES = flags.DEFINE_list("rates", list(RATES), "The rate jobs' learning rates (one rate "
                           "and no seed jobs: the study's cheapest version, one run a mixer).")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "FIELD=VALUE, a --config.FIELD=VALUE "
                                      "for every job (recorded in the rows).")
_ROWS_FROM = flags.DEFINE_string(
    "rows_from", "", "A folder of the study's rows made elsewhere (every text_study_*.jsonl in "
    "it, e.g. results/training): those the workdir's text.jsonl lacks (by job, rate and seed) "
    "are added to it first, so a fresh machine goes on where the committed rows end.")
_LIST = flags.DEFINE_bool("list", False, "Print the jobs (done or to do) and run none.")
_SUMMARY = flags.DEFINE_bool("summary", False, "Print the study's results and run nothing.")
flags.mark_flags_as_required(["workdir"])


def _job(grid, label, phase, rates, seeds, data_dir, name=None):
  overrides = dict(MIXERS_BY_LABEL[label])
  overrides["task.eval_lengths"] = "(" + ",".join(map(str, EVAL_LENGTHS)) + ")"
  if data_dir:
    overrides["task.data_dir"] = data_dir
  return grid.Job(grid=GRID, name=name or f"text-{label}-{phase}", config=CONFIG,
                  overrides=overrides, rates=tuple(rates),
                  tag={"grid": GRID, "label": label, "phase": phase}, seeds=tuple(seeds))


MIXERS_BY_LABEL = dict(MIXERS)


def rate_jobs(grid, labels, data_dir="", rates=RATES):
  """The first phase: each mixer's rates (default the three) at seed RATE_SEED, one job a
  mixer."""
  return [_job(grid, label, "rates", rates, (RATE_SEED,), data_dir) for label in labels]


def rates_run(rows, label):
  """The rates (strings, as RATES) of `label`'s rate-job rows."""
  return tuple(sorted({str(r["learning_rate"]) for r in rows
                       if r.get("label") == label and r.get("phase") == "rates"}, key=float))


def best_rate(rows, label, rates=RATES):
  """The rate (a float) of `label`'s rate-phase runs with the lowest validation bits per byte
  (runs that diverged or lack a score left out), or None before every one of `rates` has run
  (or where none scored)."""
  scores, ran = {}, set()
  for r in rows:
    if r.get("label") == label and r.get("phase") == "rates":
      ran.add(float(r["learning_rate"]))
      value = (r.get("validation") or {}).get(VALIDATION_SET, {}).get("bits_per_byte")
      if value is not None and math.isfinite(value) and not r.get("diverged"):
        scores[float(r["learning_rate"])] = value
  wanted = {float(r) for r in rates}
  return min(scores, key=scores.get) if scores and wanted <= ran else None


def rate_choice(grid, rows, label, rates=RATES):
  """(best, past): `label`'s best rate (a float, `best_rate`) once `rates` and every rate
  tried have run, and the next rate past the edge of the rates tried where the best is the
  highest or lowest of two or more (a `grid.RATE_GRID` string, `grid.rate_past_edge`; None
  inside them or past the grid); (None, None) before, and with one rate (the cheapest
  version: no runs past an edge, no seed jobs)."""
  if len(rates) < 2:
    return None, None
  tried = sorted(float(r) for r in rates_run(rows, label))
  best = best_rate(rows, label, tuple(set(tried) | {float(r) for r in rates}))
  if best is None:
    return None, None
  edge = grid.rate_past_edge(tried, best)
  return best, None if edge is None else edge[1]


def edge_jobs(grid, rows, labels, data_dir="", rates=RATES):
  """Rate jobs past an edge: each mixer whose best rate so far is the highest or lowest it
  tried gets one run (seed RATE_SEED) at the next rate of `grid.RATE_GRID` that way, in a job
  named by its rate (so that no run folder is reused for another rate). None with one rate
  (the cheapest version)."""
  jobs = []
  for label in labels:
    rate = rate_choice(grid, rows, label, rates)[1]
    if rate is not None:
      jobs.append(_job(grid, label, "rates", (rate,), (RATE_SEED,), data_dir,
                       name=f"text-{label}-rates-lr{rate}"))
  return jobs


def seed_jobs(grid, rows, labels, data_dir="", rates=RATES):
  """The second phase: each mixer whose rates (`rates` and any past an edge) are done and
  whose best rate is inside them, at that rate, seeds MORE_SEEDS."""
  jobs = []
  for label in labels:
    best, past = rate_choice(grid, rows, label, rates)
    if best is not None and past is None:
      jobs.append(_job(grid, label, "seeds", (grid.rate_name(best),), MORE_SEEDS, data_dir))
  return jobs


def _edge_jobs_run(grid, rows, data_dir):
  """The jobs past an edge that `rows` hold (listed as done)."""
  names = {}
  for r in rows:
    if r.get("phase") == "rates" and "-lr" in r.get("job", ""):
      names[r["job"]] = (r["label"], grid.rate_name(r["learning_rate"]))
  return [_job(grid, label, "rates", (rate,), (RATE_SEED,), data_dir, name=name)
          for name, (label, rate) in sorted(names.items())]


def summary(rows, workdir):
  """Per mixer: the rates tried, the chosen rate and its runs' test scores at each length
  (mean and std of bits per byte over seeds, the buckets' means) and tokens/s per run (its
  jobs' median, divided by their runs: the runs of a job train together)."""
  out = []
  for label, _ in MIXERS:
    tried = rates_run(rows, label)
    rate = best_rate(rows, label, tried) if tried else None
    if rate is None:
      out.append({"label": label, "status": "rate job not done"})
      continue
    runs = [r for r in rows if r.get("label") == label and float(r["learning_rate"]) == rate]
    entry = {"label": label, "rates_tried": [float(r) for r in tried], "learning_rate": rate,
             "seeds": sorted(r["seed"] for r in runs), "test": {}}
    for L in EVAL_LENGTHS:
      name = f"text_T{L}"
      got = [r["test"][name] for r in runs if name in (r.get("test") or {})]
      if got:
        bpb = [g["bits_per_byte"] for g in got]
        entry["test"][name] = {
            "bits_per_byte": float(np.mean(bpb)), "std": float(np.std(bpb)),
            "by_position": np.mean([g["bits_per_byte_by_position"] for g in got],
                                   axis=0).round(4).tolist()}
    entry["tokens_per_s_per_run"] = {
        phase: _tokens_per_run(os.path.join(workdir, "runs", f"text-{label}-{phase}"))
        for phase in ("rates", "seeds")}
    out.append(entry)
  return out


def _tokens_per_run(run_dir):
  """Median tokens/s of a job's logged steps divided by its runs (None without rows)."""
  from vla_jax.training import jsonl  # pylint: disable=g-import-not-at-top
  rows = jsonl.read_rows(os.path.join(run_dir, "metrics.jsonl"))
  values = [r["tokens_per_s"] / len(r["loss"]) for r in rows
            if "tokens_per_s" in r and isinstance(r.get("loss"), list)]
  return round(float(np.median(values))) if values else None


def add_rows_from(folder, rows_path):
  """Appends to rows_path the rows of folder's `text_study_<card>.jsonl` files
  (`lab.report.text.rows`, each with its "card") that it lacks (the same job, learning rate
  and seed); returns how many."""
  from lab.report import text  # pylint: disable=g-import-not-at-top
  from vla_jax.training import jsonl  # pylint: disable=g-import-not-at-top
  committed = text.rows(folder)
  if not committed:
    raise ValueError(f"--rows_from={folder}: no {text.ROWS_GLOB} there")
  key = lambda r: (r.get("job"), float(r.get("learning_rate")), r.get("seed"))
  have = {key(r) for r in jsonl.read_rows(rows_path)}
  new = []
  for r in committed:
    if key(r) not in have:
      have.add(key(r))
      new.append(r)
  jsonl.append_rows(rows_path, new)
  return len(new)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()
  from lab import grid  # pylint: disable=g-import-not-at-top
  from vla_jax.training import jsonl  # pylint: disable=g-import-not-at-top

  overrides = cli.field_overrides(_OVERRIDE.value)
  unknown = sorted(set(_ONLY.value) - set(MIXERS_BY_LABEL))
  if unknown:
    raise app.UsageError(f"--only: unknown label(s) {unknown}; labels: {list(MIXERS_BY_LABEL)}")
  labels = _ONLY.value or [label for label, _ in MIXERS]
  here = os.path.dirname(os.path.abspath(__file__))
  root, workdir = os.path.dirname(here), os.path.abspath(_WORKDIR.value)
  rows_path = os.path.join(workdir, GRID + ".jsonl")
  data_dir = _DATA_DIR.value
  with cli.user_errors("text_study.py"):
    if _ROWS_FROM.value:
      os.makedirs(workdir, exist_ok=True)
      print(f"{add_rows_from(_ROWS_FROM.value, rows_path)} rows added from {_ROWS_FROM.value}",
            flush=True)
    rows = jsonl.read_rows(rows_path)
    if _SUMMARY.value:
      for entry in summary(rows, workdir):
        print(json.dumps(entry), flush=True)
      return
    rates = tuple(_RATES.value)
    bad = [r for r in rates if r not in RATES]
    if bad or not rates:
      raise app.UsageError(f"--rates: {bad or 'none'}; choose from {list(RATES)}")
    first = rate_jobs(grid, labels, data_dir, rates)
    later = lambda rows: (edge_jobs(grid, rows, labels, data_dir, rates)
                          + seed_jobs(grid, rows, labels, data_dir, rates))
    if _LIST.value:
      done_edges = _edge_jobs_run(grid, rows, data_dir)
      print(grid.listing(first + done_edges + later(rows), {GRID: rows}, (), overrides),
            flush=True)
      return
    run = lambda jobs, budget: grid.run_grid(
        jobs, sweep_script=os.path.join(here, "sweep.py"), root=root, workdir=workdir,
        seeds=(), overrides=overrides, per_gpu=_PER_GPU.value, budget_s=budget,
        grace_s=_GRACE.value, stop_s=_STOP.value, log=lambda line: print(line, flush=True))
    left = _BUDGET.value - run(first, _BUDGET.value)["wall_s"]
    while left > 0:   # rates past an edge, then seed jobs, as the rows allow
      rows = jsonl.read_rows(rows_path)
      todo = [j for j in later(rows) if not grid.is_done(j, rows, (), overrides)]
      if not todo:
        break
      left -= run(todo, left)["wall_s"]


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
