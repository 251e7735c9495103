"""The grids behind RESULTS.md: their jobs, which of them are done, and a scheduler.

A job is one `experiments/sweep.py` call: one mixer at one task setting, its seeds and learning
rates trained together (vmapped, `vla_jax.training.sweep`), its rows appended to
`<workdir>/<grid>.jsonl`. `run_grid` starts jobs in order, several processes per GPU, none after
`budget_s`; jobs still running at `budget_s + grace_s` get SIGTERM (a sweep checkpoints the step
it reached and exits) and SIGKILL `stop_s` later. A job that runs out of device memory runs
again, once, alone on a GPU. A job whose rows already cover every seed and rate (made with
the same result-changing overrides) is skipped, and a stopped one resumes from its
checkpoint, so calling it again continues the grid.

Grids (the settings of RESULTS.md):
  capacity: configs/mqar_paper.py, n_pairs 4..64, rates 3e-4, 1e-3, 3e-3.
  long:     configs/mqar_long.py, 8 pairs, T = 64..4096, rates 1e-3, 3e-3.
  copy:     configs/copy.py, rates 1e-3, 3e-3; scored at lengths 64, 128, 256.
  zoology:  configs/mqar_zoology.py at T / n_pairs = 64/4, 128/8, 256/16, 512/64, d_model
            64 / 128 / 256, rates 1e-3, 3e-3.
  ablation: VLA on configs/mqar_paper.py:24 with lam0, penalty_scale, readout or the
            convolution changed, rates 1e-3, 3e-3.
  ablation_demo: the same variants on configs/mqar_demo.py at rate 3e-3 (CPU-sized).
  zoology_tuned: the zoology grid's sweep carried on from its rows (`zoology_rows`, e.g.
            results/training/mqar_zoology_h200.jsonl; see `tuned_jobs`): the rate past the
            edge at every cell below 0.99 whose best rate is an edge of its sweep
            (`edge_cells`), a Gated DeltaNet row with the slow gate initialisation
            (gated_deltanet_slow) at every setting, and every mixer at T = 512 with 12,000
            steps (at the chosen rate of a cell solved at 4,000 steps, else at it and the
            rates either side). A 4,000-step job per cell and the rates it lacks, a 12,000-step
            job per cell and rate, named by both, e.g. "zoology_tuned-T512-d64-
            gated_deltanet_slow-s4000-lr3e-4_1e-3_3e-3", "zoology_tuned-T512-d64-linear-
            s12000-lr1e-2".
  seed_remedies: VLA at the two zoology cells whose seeds split at rate 3e-3 (REMEDY_CELLS:
            T = 64, 4 pairs and T = 128, 8 pairs, d_model 64; configs/mqar_zoology.py, 4,000
            steps) with the earlier defaults and one setting changed per variant
            (REMEDY_VARIANTS: penalty scale, lam0, W_u's initialisation, warmup, readout),
            rate 3e-3, seeds 0-4 (the jobs carry them: `Job.seeds`), training diagnostics every
            50 steps. Named e.g. "seed_remedies-T128-d64-lam0-0.1"; rows labelled by variant.

VLA's penalty scale: the layer's default is 1 (vla_jax.layers.vla.DEFAULT_PENALTY_SCALE); the
rows labelled "vla", and every ablation and seed_remedies variant but the penalty ones, were
made with the authors' 1 / sqrt(d_h) and keep it: their jobs pin AUTHORS_PENALTY_SCALE.

VLA's query/key map: the layer's default is DeltaNet's SiLU + L2 ("silu_l2"); every grid's VLA
rows were made with the authors' ELU + 1 and keep it: their jobs pin EARLIER_VLA.

Gated DeltaNet: the layer's defaults are fla's output gate with gated RMSNorm and values twice
the key width; the rows labelled "gated_deltanet" and "gated_deltanet_slow" were made without
either and keep that: their jobs pin EARLIER_GDN.
"""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np

from vla_jax.layers.vla import INV_SQRT_DH
from vla_jax.training import jsonl
from vla_jax.training.config import RESULT_FREE

GRIDS = ("capacity", "long", "copy", "zoology", "ablation", "ablation_demo", "zoology_tuned",
         "seed_remedies")
DEFAULT_SEEDS = (0, 1, 2)   # the seeds of a job that carries none (`Job.seeds`)
# d_h of every grid's jobs: their configs set head_dim 32 and no job changes it
# (tests/lab/test_grid.py checks each job's config).
HEAD_DIM = 32
PENALTY = "model.options.vla.penalty_scale"
# The authors' penalty scale 1 / sqrt(d_h), by name.
AUTHORS_PENALTY_SCALE = INV_SQRT_DH
# VLA's query/key map as the grids' rows were made: the authors' ELU + 1 (the layer's default
# is "silu_l2" since).
EARLIER_VLA = {"model.options.vla.qk_map": "elu1"}
# Gated DeltaNet as the grids' rows were made: no output gate (the LayerNorm over the merged
# heads), values of the key width (the layer's defaults are fla's since).
EARLIER_GDN = {"model.options.gated_deltanet.output_gate": False,
               "model.options.gated_deltanet.expand_v": 1}
# (label, mixer, config overrides): softmax_conv is softmax attention with the recurrent
# mixers' short convolution, the like-for-like backbone; vla is VLA with the authors' penalty
# scale (pinned: the layer's default is now 1), vla_p1 with penalty scale 1 (the default; named
# so that the label says what it is); both with the authors' ELU + 1 (EARLIER_VLA).
MIXERS = (("softmax", "softmax", {}),
          ("softmax_conv", "softmax", {"model.options.softmax.conv_size": 4}),
          ("linear", "linear", {}), ("deltanet", "deltanet", {}),
          ("gated_deltanet", "gated_deltanet", EARLIER_GDN),
          ("vla", "vla", {PENALTY: AUTHORS_PENALTY_SCALE, **EARLIER_VLA}),
          ("vla_p1", "vla", {PENALTY: 1.0, **EARLIER_VLA}))
# The zoology_tuned grid's labels: Gated DeltaNet's gate initialisation named in the overrides
# (the fla baseline stays fla if the layer's default changes), and one row with the slow one.
TUNED_MIXERS = tuple(
    (label, mixer, {**extra, "model.options.gated_deltanet.gate_init": "fla"}
     if mixer == "gated_deltanet" else extra) for label, mixer, extra in MIXERS) + (
    ("gated_deltanet_slow", "gated_deltanet",
     {**EARLIER_GDN, "model.options.gated_deltanet.gate_init": "slow"}),)
# A label without rows of its own starts from the sweep its baseline label was given.
TUNED_BASELINE = {"gated_deltanet_slow": "gated_deltanet"}
# Learning rates on a log grid of half-decades: a sweep is extended to the next one past an edge.
RATE_GRID = ("1e-5", "3e-5", "1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2", "1e-1")
TUNED_T = 512          # the zoology_tuned grid's long-training setting ...
TUNED_STEPS = 12000    # ... and its training steps (3x the zoology grid's 4,000)
SOLVED = 0.99          # a cell below this mean test accuracy is not solved
PAPER_N = (4, 8, 12, 16, 24, 32, 48, 64)
LONG_TS = (64, 128, 256, 512, 1024, 2048, 4096)
ZOOLOGY = ((64, 4), (128, 8), (256, 16), (512, 64))        # (T, n_pairs)
ZOOLOGY_WIDTHS = ((64, 2), (128, 4), (256, 8))              # (d_model, heads of d_h 32)
# The ablation grids' variants, (label, overrides): each changes one setting from the defaults
# of their runs (lam0 1, the authors' penalty scale 1 / sqrt(d_h), readout none, conv_size 4);
# "defaults" changes none. Every job also gets AUTHORS_BASE, below its variant's own overrides.
AUTHORS_BASE = {PENALTY: AUTHORS_PENALTY_SCALE, **EARLIER_VLA}
ABLATION_VARIANTS = (("defaults", {}), ("lam0-0.1", {"model.options.vla.lam0": 0.1}),
                     ("lam0-10", {"model.options.vla.lam0": 10.0}),
                     ("penalty-0", {"model.options.vla.penalty_scale": 0.0}),
                     ("penalty-1", {"model.options.vla.penalty_scale": 1.0}),
                     ("readout-additive", {"model.options.vla.readout": "additive"}),
                     ("readout-delta", {"model.options.vla.readout": "delta"}),
                     ("no-conv", {"model.options.vla.conv_size": 0}))
# The seed_remedies grid: (T, n_pairs, d_model, heads) of the zoology cells whose VLA seeds split
# at rate 3e-3 (results/training/mqar_zoology_h200.jsonl: T = 64 0.252 / 0.97 / 0.252, T = 128
# 0.104 / 0.098 / 0.675), and (label, overrides) of the variants tried there: the earlier
# defaults (the authors' penalty scale 1 / sqrt(d_h), lam0 1, W_u random, readout none, 400
# warmup steps; the rows record the layer's options) and one setting changed in each; every
# job also gets AUTHORS_BASE, below its variant's own overrides.
# u-identity starts W_u at I, so that u_t points along the raw key k_raw_t (k_t = phi(k_raw_t)).
REMEDY_CELLS = ((64, 4, 64, 2), (128, 8, 64, 2))
REMEDY_VARIANTS = (("defaults", {}),
                   ("penalty-1", {"model.options.vla.penalty_scale": 1.0}),
                   ("lam0-0.1", {"model.options.vla.lam0": 0.1}),
                   ("lam0-10", {"model.options.vla.lam0": 10.0}),
                   ("u-identity", {"model.options.vla.u_init": "identity"}),
                   ("warmup-1000", {"train.warmup_steps": 1000}),
                   ("readout-additive", {"model.options.vla.readout": "additive"}))
REMEDY_RATE = "3e-3"
REMEDY_SEEDS = (0, 1, 2, 3, 4)
REMEDY_DIAGNOSTICS_EVERY = 50


@dataclasses.dataclass(frozen=True)
class Job:
  """One sweep call.

  Attributes:
    grid: the grid it belongs to; its rows go to `<workdir>/<grid>.jsonl`.
    name: unique job name, e.g. "capacity-n24-vla" (its run folder and log are named so).
    config: config file argument relative to the checkout, e.g. "configs/mqar_paper.py:24".
    overrides: {config field: value}, passed as --config.FIELD=VALUE.
    rates: learning rates as strings, e.g. ("1e-3", "3e-3").
    tag: fields added to every row (grid, label, the setting).
    seeds: the job's own seeds (ints), or () for the grid driver's (`DEFAULT_SEEDS` unless
      told otherwise).
    env: (name, value) pairs of environment variables the job's process gets on top of the
      driver's (JAX_DEFAULT_MATMUL_PRECISION, say); its tag should say what they change.
  """
  grid: str
  name: str
  config: str
  overrides: dict
  rates: tuple
  tag: dict
  seeds: tuple = ()
  env: tuple = ()


def job_seeds(job, seeds):
  """The seeds `job` runs: its own, else `seeds` (the driver's)."""
  return tuple(job.seeds) or tuple(seeds)


def rate_name(rate):
  """A learning rate's name in jobs: its RATE_GRID string (0.003 -> "3e-3"), else "%g"."""
  return next((r for r in RATE_GRID if float(r) == float(rate)), f"{float(rate):g}")


def best_rate_table(rows, *, steps=None, metric="validation"):
  """{(seq_len, d_model, label): {"rate", "mean", "rates"}} of zoology sweep rows: per cell,
  the rate with the best mean `metric` ("validation", as RESULTS.md chooses, or "test")
  accuracy over seeds, the mean test accuracy at that rate and the sorted rates tried
  (floats); rows of other `steps` (when given) left out. A row's label is its "label", else
  its "mixer"."""
  cells = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in rows:
    if steps is None or r.get("steps") == steps:
      cells[(r["seq_len"], r["d_model"], r.get("label", r["mixer"]))][
          float(r["learning_rate"])].append(r)
  score = lambda r, key: next(iter(r[key].values()))["accuracy"]
  table = {}
  for cell, by_rate in cells.items():
    rate = max(sorted(by_rate), key=lambda lr: np.mean([score(r, metric) for r in by_rate[lr]]))
    table[cell] = {"rate": rate, "mean": float(np.mean([score(r, "test")
                                                         for r in by_rate[rate]])),
                   "rates": tuple(sorted(by_rate))}
  return table


def rate_past_edge(rates, best):
  """(side, rate) where `best` is the highest ("highest") or lowest ("lowest") of two or more
  rates tried (floats, ascending): rate is the next RATE_GRID rate past that edge (a string;
  3e-3 highest -> "1e-2", 1e-3 lowest -> "3e-4"), None past the grid. None where best lies
  inside the rates tried or fewer than two were tried."""
  if len(rates) < 2 or best not in (rates[0], rates[-1]):
    return None
  grid = [float(r) for r in RATE_GRID]
  if best == rates[-1]:
    return "highest", next((r for r, x in zip(RATE_GRID, grid) if x > best), None)
  return "lowest", next((r for r, x in reversed(list(zip(RATE_GRID, grid))) if x < best), None)


def edge_cells(table, *, below=SOLVED):
  """{cell: {"side", "rate", "mean", "extend"}} of the cells of `best_rate_table` whose mean
  test accuracy is below `below` and whose best rate is the lowest ("side": "lowest") or the
  highest ("highest") of two or more rates tried: "extend" holds the next RATE_GRID rate past
  that edge (a string; 3e-3 highest -> "1e-2", 1e-3 lowest -> "3e-4"), none past the grid."""
  out = {}
  for cell, c in sorted(table.items()):
    edge = rate_past_edge(c["rates"], c["rate"])
    if c["mean"] >= below or edge is None:
      continue
    side, rate = edge
    out[cell] = {"side": side, "rate": c["rate"], "mean": c["mean"],
                 "extend": () if rate is None else (rate,)}
  return out


def tuned_jobs(rows, *, steps=4000, long_steps=TUNED_STEPS, long_T=TUNED_T):
  """The zoology_tuned grid from zoology rows (`steps`-step rows, e.g. the committed
  results/training/mqar_zoology_h200.jsonl): [(name, config, overrides, rates, tag)].

  A cell's planned rates are the rates its rows tried plus `edge_cells`' extension (a label
  without rows, gated_deltanet_slow, takes its TUNED_BASELINE label's). In order:
    1. at `steps`, every cell's planned rates that its rows lack: the rates past an edge, and
       gated_deltanet_slow at every setting;
    2. at `long_T` with `long_steps` steps, every label at its `long_rates` (less any that
       `long_steps`-step rows in `rows` already hold), one job per cell and rate: on the
       H200 (T = 512, d_model 64) a job of 9 runs (3 rates) ran at 31.7 steps/s, the GPU
       the bound, against 68-89 for a job of 3, so that rates in one job save little, and a
       job of one rate fits a call of under ten minutes at d_model 256 too. A cell whose
       `long_rates` have all run and that is still below SOLVED at an edge of them goes on
       to the rate past that edge (`edge_cells` of the `long_steps`-step rows).
  Rows of this grid's own earlier jobs may be added to `rows` once they are finished: the
  sweep then goes on past the new edges, under new job names (a name holds its steps and
  rates, so that no run folder is reused for other rates).
  """
  short = best_rate_table(rows, steps=steps)
  edges = edge_cells(short)
  done_long = best_rate_table(rows, steps=long_steps)
  long_edges = edge_cells(done_long)

  def swept(T, d_model, label):
    """The 4,000-step cell that stands for (T, d_model, label): its own, else (a label
    without rows) its TUNED_BASELINE label's; None without either."""
    cell = (T, d_model, label)
    if cell not in short and label in TUNED_BASELINE:
      cell = (T, d_model, TUNED_BASELINE[label])
    return cell if cell in short else None

  def planned(cell):
    rates = {rate_name(x) for x in short[cell]["rates"]}
    rates |= set(edges[cell]["extend"]) if cell in edges else set()
    return tuple(sorted(rates, key=float))

  def long_rates(cell):
    # A cell solved at `steps` trains longer at its chosen rate only (more steps there can
    # only confirm it); an unsolved one at its chosen rate and the planned rates either side.
    rates = planned(cell)
    i = rates.index(rate_name(short[cell]["rate"]))
    return rates[i:i + 1] if short[cell]["mean"] >= SOLVED else rates[max(i - 1, 0):i + 2]

  def job(T, n, d_model, heads, label, mixer, extra, n_steps, rates):
    tag = {"seq_len": T, "n_pairs": n, "d_model": d_model, "label": label, "steps": n_steps}
    if mixer == "gated_deltanet":
      tag["gate_init"] = extra["model.options.gated_deltanet.gate_init"]
    return (f"zoology_tuned-T{T}-d{d_model}-{label}-s{n_steps}-lr{'_'.join(rates)}",
            f"configs/mqar_zoology.py:{T}",
            {"model.mixer": mixer, "task.n_pairs": n, "model.d_model": d_model,
             "model.num_heads": heads, "train.num_steps": n_steps, **extra}, rates, tag)

  out = []
  for T, n in ZOOLOGY:
    for d_model, heads in ZOOLOGY_WIDTHS:
      for label, mixer, extra in TUNED_MIXERS:
        cell = swept(T, d_model, label)
        tried = {rate_name(x) for x in short.get((T, d_model, label), {"rates": ()})["rates"]}
        rates = tuple(r for r in (planned(cell) if cell else ()) if r not in tried)
        if rates:
          out.append(job(T, n, d_model, heads, label, mixer, extra, steps, rates))
  for T, n in ZOOLOGY:
    if T != long_T:
      continue
    for d_model, heads in ZOOLOGY_WIDTHS:
      for label, mixer, extra in TUNED_MIXERS:
        cell = swept(T, d_model, label)
        tried = {rate_name(x)
                 for x in done_long.get((T, d_model, label), {"rates": ()})["rates"]}
        rates = long_rates(cell) if cell else ()
        if rates and set(rates) <= tried and (T, d_model, label) in long_edges:
          rates = long_edges[(T, d_model, label)]["extend"]
        for rate in rates:
          if rate not in tried:
            out.append(job(T, n, d_model, heads, label, mixer, extra, long_steps, (rate,)))
  return out


def grid_jobs(grid, *, long_Ts=LONG_TS, zoology_steps=4000, demo_steps=500, zoology_rows=None,
              tuned_steps=TUNED_STEPS):
  """The jobs of one grid, in the order they start: list of `Job`.

  long_Ts: the long grid's lengths; zoology_steps: training steps of the zoology and
  seed_remedies jobs (and of the zoology_tuned grid's rows it extends); demo_steps: training
  steps of the ablation_demo jobs; zoology_rows: the zoology rows the zoology_tuned grid
  extends (`tuned_jobs`; required for it); tuned_steps: the zoology_tuned grid's steps at
  T = 512.
  """
  out = []
  if grid == "capacity":
    for n in PAPER_N:
      for label, mixer, extra in MIXERS:
        out.append((f"capacity-n{n}-{label}", f"configs/mqar_paper.py:{n}",
                    {"model.mixer": mixer, **extra}, ("3e-4", "1e-3", "3e-3"),
                    {"n_pairs": n, "label": label}))
  elif grid == "long":
    for T in long_Ts:
      for label, mixer, extra in MIXERS:
        out.append((f"long-T{T}-{label}", f"configs/mqar_long.py:{T}",
                    {"model.mixer": mixer, **extra}, ("1e-3", "3e-3"),
                    {"seq_len": T, "label": label}))
  elif grid == "copy":
    for label, mixer, extra in MIXERS:
      out.append((f"copy-{label}", "configs/copy.py", {"model.mixer": mixer, **extra},
                  ("1e-3", "3e-3"), {"label": label}))
  elif grid == "zoology":
    for T, n in ZOOLOGY:
      for d_model, heads in ZOOLOGY_WIDTHS:
        for label, mixer, extra in MIXERS:
          out.append((f"zoology-T{T}-d{d_model}-{label}", f"configs/mqar_zoology.py:{T}",
                      {"model.mixer": mixer, "task.n_pairs": n, "model.d_model": d_model,
                       "model.num_heads": heads, "train.num_steps": zoology_steps, **extra},
                      ("1e-3", "3e-3"),
                      {"seq_len": T, "n_pairs": n, "d_model": d_model, "label": label}))
  elif grid == "ablation":
    for variant, extra in ABLATION_VARIANTS:
      out.append((f"ablation-{variant}", "configs/mqar_paper.py:24",
                  {"model.mixer": "vla", **AUTHORS_BASE, **extra}, ("1e-3", "3e-3"),
                  {"variant": variant, "n_pairs": 24}))
  elif grid == "ablation_demo":
    for variant, extra in ABLATION_VARIANTS:
      out.append((f"ablation_demo-{variant}", "configs/mqar_demo.py",
                  {"model.mixer": "vla", "train.num_steps": demo_steps, **AUTHORS_BASE,
                   **extra}, ("3e-3",),
                  {"variant": variant, "n_pairs": 8}))
  elif grid == "seed_remedies":
    for T, n, d_model, heads in REMEDY_CELLS:
      for variant, extra in REMEDY_VARIANTS:
        out.append((f"seed_remedies-T{T}-d{d_model}-{variant}", f"configs/mqar_zoology.py:{T}",
                    {"model.mixer": "vla", "task.n_pairs": n, "model.d_model": d_model,
                     "model.num_heads": heads, "train.num_steps": zoology_steps,
                     "train.diagnostics_every": REMEDY_DIAGNOSTICS_EVERY, **AUTHORS_BASE,
                     **extra},
                    (REMEDY_RATE,),
                    {"seq_len": T, "n_pairs": n, "d_model": d_model, "label": variant,
                     "steps": zoology_steps}))
  elif grid == "zoology_tuned":
    if zoology_rows is None:
      raise ValueError("the zoology_tuned grid extends the zoology grid's rows: give them "
                       "(zoology_rows, e.g. results/training/mqar_zoology_h200.jsonl)")
    out = tuned_jobs(zoology_rows, steps=zoology_steps, long_steps=tuned_steps)
  else:
    raise ValueError(f"grid must be one of {GRIDS}; got {grid!r}")
  seeds = REMEDY_SEEDS if grid == "seed_remedies" else ()
  return [Job(grid, name, config, overrides, rates, {"grid": grid, **tag}, seeds)
          for name, config, overrides, rates, tag in out]


def select_jobs(grids, *, rates=None, seeds=None, vla_impl=None, only=None, **grid_options):
  """The jobs of `grids` (names in GRIDS), in start order.

  rates: learning rates (strings) replacing every job's own; seeds: seeds (ints) replacing
  every job's own (the seed_remedies grid's 0-4; the others run the driver's); vla_impl:
  model.impl of the VLA jobs (the other mixers have no Pallas form); only: name patterns,
  keeping the jobs whose name contains one, ordered by the first pattern each matches (then
  grid order); grid_options: passed to `grid_jobs`.
  """
  if rates and "zoology_tuned" in grids:
    raise ValueError("the zoology_tuned grid picks each job's rates (its names hold them); "
                     "rates cannot replace them")
  jobs = [job for grid in grids for job in grid_jobs(grid, **grid_options)]
  if rates:
    jobs = [dataclasses.replace(job, rates=tuple(rates)) for job in jobs]
  if seeds:
    jobs = [dataclasses.replace(job, seeds=tuple(int(s) for s in seeds)) for job in jobs]
  if vla_impl:
    jobs = [dataclasses.replace(job, overrides={**job.overrides, "model.impl": vla_impl})
            if job.overrides.get("model.mixer") == "vla" else job for job in jobs]
  if only:
    rank = lambda job: next((i for i, p in enumerate(only) if p in job.name), None)
    jobs = sorted((job for job in jobs if rank(job) is not None), key=rank)
  return jobs


def result_overrides(overrides):
  """{field: value} of `overrides` (pairs of strings) that change results (all but
  `RESULT_FREE`'s, which a finished job may differ in): recorded in rows."""
  return {k: v for k, v in overrides if k not in RESULT_FREE}


def is_done(job, rows, seeds, overrides=()):
  """Whether `rows` hold every (seed, rate) run of `job` made with `overrides` (the
  result-changing ones among them; pairs of strings); the seeds are `job`'s own, else
  `seeds`."""
  wanted = result_overrides(overrides)
  have = {(r.get("seed"), r.get("learning_rate")) for r in rows
          if r.get("job") == job.name and r.get("overrides", {}) == wanted}
  return all((int(s), float(lr)) in have for s in job_seeds(job, seeds) for lr in job.rates)


def listing(jobs, rows, seeds, overrides=()):
  """A listing of `jobs`, one line each (done or to do in `rows` ({grid: rows}), name, rates,
  and the steps, gate initialisation and seeds where the job sets them), then the totals."""
  lines, todo, runs, steps = [], 0, 0, 0
  for job in jobs:
    settings = {**job.overrides, **result_overrides(overrides)}
    shown = {k.rsplit(".", 1)[-1]: v for k, v in settings.items()
             if k in ("train.num_steps", "model.options.gated_deltanet.gate_init")}
    done = is_done(job, rows.get(job.grid, []), seeds, overrides)
    todo += not done
    n_seeds = len(job_seeds(job, seeds))
    runs += len(job.rates) * n_seeds
    steps += len(job.rates) * n_seeds * int(settings.get("train.num_steps", 0))
    lines.append(" ".join([("done" if done else "todo"), job.name, "rates",
                           ",".join(job.rates)] + [f"{k}={v}" for k, v in shown.items()]
                          + ([f"seeds={','.join(map(str, job.seeds))}"] if job.seeds else [])
                          + [f"{k}={v}" for k, v in job.env]))
  lines.append(f"{len(jobs)} jobs ({todo} to do), {runs} runs"
               + (f", {steps:,} run-steps" if steps else ""))
  return "\n".join(lines)


def sweep_command(job, *, sweep_script, root, workdir, seeds, overrides=()):
  """The argv of `job`'s sweep: `sweep_script` (experiments/sweep.py) with the job's config
  under `root` (the checkout), its seeds (else `seeds`), its run folder under `workdir`/runs
  and its rows appended to `workdir`/<grid>.jsonl; `overrides` (pairs of strings) apply on
  top of the job's."""
  tag = {**job.tag, "job": job.name, "overrides": result_overrides(overrides)}
  return ([sys.executable, sweep_script, f"--config={os.path.join(root, job.config)}",
           f"--seeds={','.join(map(str, job_seeds(job, seeds)))}",
           f"--learning_rates={','.join(job.rates)}",
           f"--workdir={os.path.join(workdir, 'runs', job.name)}",
           f"--out={os.path.join(workdir, job.grid + '.jsonl')}", f"--tag={json.dumps(tag)}"]
          + [f"--config.{k}={v}" for k, v in job.overrides.items()]
          + [f"--config.{k}={v}" for k, v in overrides])


def stop(procs, wait_s):
  """SIGTERM to each process (a sweep checkpoints the step it reached and exits), SIGKILL to
  those still running `wait_s` seconds later."""
  for proc in procs:
    proc.terminate()
  deadline = time.time() + wait_s
  for proc in procs:
    try:
      proc.wait(timeout=max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


START_MARK = "=== "   # how a job's log marks the start of each attempt


def ran_out_of_memory(log_path):
  """Whether the last attempt logged in `log_path` (from its last start line) ran out of
  device memory (XLA's RESOURCE_EXHAUSTED)."""
  try:
    with open(log_path, errors="replace") as f:
      text = f.read()
  except OSError:
    return False
  return "RESOURCE_EXHAUSTED" in text[text.rfind(START_MARK):]


def run_grid(jobs, *, sweep_script, root, workdir, seeds, overrides=(), gpus=(), per_gpu=4,
             budget_s=540.0, grace_s=30.0, stop_s=60.0, log=print):
  """Runs the jobs that are not done yet and returns {finished: [(name, rc, seconds)],
  unfinished: [name], alone: [name], wall_s}, also appended to `workdir`/grid_summary.json.

  gpus: GPU ids (strings) to pin jobs to (CUDA_VISIBLE_DEVICES), `per_gpu` processes each; empty:
  `per_gpu` processes, no pinning. Each job's output goes to `workdir`/logs/<name>.log
  (appended). A job that runs out of device memory goes back to the end of the queue, once,
  to run alone on a GPU (it resumes from its checkpoint): "alone" lists those. Other
  arguments as in `sweep_command` and the module docstring.
  """
  os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)
  log_path = lambda job: os.path.join(workdir, "logs", job.name + ".log")
  rows = {g: jsonl.read_rows(os.path.join(workdir, g + ".jsonl")) for g in {j.grid for j in jobs}}
  todo = [j for j in jobs if not is_done(j, rows[j.grid], seeds, overrides)]
  # Slots alternate between GPUs, so that the first jobs (started first) spread over all.
  slots = [g for _ in range(per_gpu) for g in (gpus or [""])]
  start = time.time()
  running = {}  # slot -> (job, process, started)
  alone = []    # names of the jobs that run alone on a GPU (they ran out of memory)
  finished, unfinished = [], []
  log(f"{len(todo)} jobs on {len(slots)} slots")
  while todo or running:
    overdue = []
    for slot, (job, proc, t0) in list(running.items()):
      if proc.poll() is not None:
        del running[slot]
        if proc.returncode and job.name not in alone and ran_out_of_memory(log_path(job)):
          alone.append(job.name)
          todo.append(job)
          log(f"[{time.time() - start:6.0f}s] out of memory: {job.name}, again alone on a GPU")
          continue
        finished.append((job.name, proc.returncode, round(time.time() - t0, 1)))
        log(f"[{time.time() - start:6.0f}s] done {job.name} rc={proc.returncode} "
            f"{time.time() - t0:.0f}s")
      elif time.time() - start > budget_s + grace_s:
        overdue.append(proc)
        del running[slot]
        unfinished.append(job.name)
    stop(overdue, stop_s)
    if time.time() - start > budget_s:
      unfinished += [j.name for j in todo]
      todo = []
    for slot, gpu in enumerate(slots):
      if slot in running:
        continue
      on_gpu = [j.name for s, (j, _, _) in running.items() if slots[s] == gpu]
      if any(name in alone for name in on_gpu):
        continue
      job = next((j for j in todo if j.name not in alone or not on_gpu), None)
      if job is None:
        continue
      todo.remove(job)
      env = dict(os.environ, **dict(job.env),
                 **({"CUDA_VISIBLE_DEVICES": gpu} if gpu else {}))
      # Appended: a resumed job's log keeps the earlier attempts (an out-of-memory trace).
      with open(log_path(job), "a") as f:
        f.write(f"{START_MARK}{time.strftime('%Y-%m-%dT%H:%M:%S')} start, GPU {gpu or '-'}"
                f"{', alone' if job.name in alone else ''}\n")
        f.flush()
        proc = subprocess.Popen(
            sweep_command(job, sweep_script=sweep_script, root=root, workdir=workdir,
                          seeds=seeds, overrides=overrides),
            env=env, stdout=f, stderr=subprocess.STDOUT, cwd=root)
      running[slot] = (job, proc, time.time())
    time.sleep(0.5)
  summary = {"finished": finished, "unfinished": unfinished, "alone": alone,
             "wall_s": round(time.time() - start, 1)}
  jsonl.append_rows(os.path.join(workdir, "grid_summary.json"), [summary])
  return summary
