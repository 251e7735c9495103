"""Five studies of VLA's failing seeds, the authors' layer, the baselines and mixed precision:
their jobs, and their rows and run files read from a workdir or from their copy under
results/training/.

Each study is a list of `lab.grid.Job`s (experiments/sweep.py calls that vmap a job's seeds and
rates in one process), run by `lab.grid.run_grid` from experiments/studies.py; its rows go to
<workdir>/<study>.jsonl, each job's run folder to <workdir>/runs/<job> (metrics.jsonl: the
training rows and the probe rows of `vla_jax.training.probe`, lists over the job's runs;
sweep_results.jsonl: the runs in the lists' order).

  weights_or_data  VLA (the layer's defaults, pinned: `VLA_DEFAULTS`) at zoology's MQAR,
                   T = 64 (4 pairs), d_model 64, rate 3e-3, 12,000 steps: initialisation seeds
                   0-4 (one job vmaps them) x data seeds 0-4 (`train.data_seed`, a job each),
                   probes every WOD_DIAGNOSTICS_EVERY steps (key collinearity at step 0 and at
                   the end). Does the initialisation or the data order decide whether a run
                   leaves the plateau?
  fix              the two zoology cells whose VLA seeds split at rate 3e-3
                   (`lab.grid.REMEDY_CELLS`: T = 64 / 4 pairs and T = 128 / 8 pairs, d_model 64),
                   at that rate, and the cells that decide VLA's default (`D128_CELLS`:
                   T = 256 / 16 pairs and T = 512 / 64 pairs, d_model 128, 4 heads), each at
                   the rate the zoology rows chose for VLA there (`D128_RATES`); 4,000
                   steps, seeds 0-9, for VLA with DeltaNet's query/key path (qk_map
                   "silu_l2"), a learned write strength (beta), both, and neither
                   (`FIX_VARIANTS`), probes every FIX_DIAGNOSTICS_EVERY steps.
  authors          the authors' layer as published (`AUTHORS_LAYER`: lam0 0.1, the additive
                   readout, no convolution, penalty scale 1 / sqrt(d_h)) on the seed's MQAR
                   form (configs/mqar_paper.py, T = 3n + 1) at n = 4 ... 32, 3,000 steps,
                   seeds 0-2, at the authors' rate 3e-4 and the capacity grid's 1e-3, 3e-3.
  baselines        T = 512 (64 pairs), d_model 64 and 128: Gated DeltaNet as fla configures it
                   (the layer's defaults: output gate with gated RMSNorm, values twice the key
                   width) and rows whose state holds as many floats as VLA's S and A at d_h 32
                   (`BASELINES`: Gated DeltaNet with d_h 64 and values of the key width,
                   DeltaNet and linear attention with d_h 64); first 4,000 steps at three
                   rates, then, for each cell whose three rates have run, 12,000 steps at the
                   rate chosen on validation (`baseline_jobs`); and one collapsed Gated DeltaNet
                   job of the zoology grid (T = 512, d_model 128, rate 1e-3, the layer as those
                   rows had it: `lab.grid.EARLIER_GDN`) again with its gate values probed
                   every 100 steps, at JAX's default matmul precision and at "highest"
                   (JAX_DEFAULT_MATMUL_PRECISION, recorded in the rows' "matmul_precision").
  parity           mixed precision against float32: VLA (its defaults, pinned), DeltaNet and
                   Gated DeltaNet as fla configures it (the layer's defaults, pinned) at two
                   zoology cells (T = 256 / 16 pairs and T = 512 / 64 pairs, d_model 128, 4
                   heads), seeds 0-2, PARITY_STEPS steps, each at the rate the zoology rows
                   chose for its mixer and cell (`D128_RATES`), once with
                   configs/mqar_zoology.py (float32) and once with configs/mqar_zoology_bf16.py
                   (bfloat16 activations, float32 parameters and states; the rows' "precision").

A study's copy under results/training/studies/<study>/ (`export`): rows.jsonl (the rows file),
and per job `<stem>_metrics.jsonl` (metrics.jsonl without parameter norms, floats to 4
significant digits) and `<stem>_runs.jsonl` (sweep_results.jsonl), stem = the job's name
without "<study>-".
"""

import dataclasses
import os

from lab import grid
from vla_jax.training import jsonl

STUDIES = ("weights_or_data", "fix", "authors", "baselines", "parity")
# Where `export` puts a study's files, under results/training (the report reads them there).
EXPORT_FOLDER = "studies"

VLA = "model.options.vla."
# The VLA layer's defaults at the time of these studies, pinned so that the rows keep their
# meaning if a default changes: penalty scale 1, the authors' ELU + 1, writes of strength 1.
VLA_DEFAULTS = {VLA + "penalty_scale": 1.0, VLA + "qk_map": "elu1", VLA + "beta": False}

WOD_CELL = (64, 4, 64, 2)            # (T, n_pairs, d_model, heads)
WOD_SEEDS = (0, 1, 2, 3, 4)          # initialisation seeds, vmapped in each job
WOD_DATA_SEEDS = (0, 1, 2, 3, 4)     # data seeds, a job each
WOD_STEPS = 12000
WOD_RATE = "3e-3"
WOD_DIAGNOSTICS_EVERY = 500

# Zoology's cells at d_model 128 that decide the comparisons (T, n_pairs, d_model, heads): the
# parity study's, and the fix study's beside section 9's two (VLA's default is decided there).
D128_CELLS = ((256, 16, 128, 4), (512, 64, 128, 4))
# The rate the zoology rows chose on validation for each mixer at those cells (4,000 steps,
# results/training/mqar_zoology_h200.jsonl with zoology_tuned_h200.jsonl, as RESULTS.md section
# 5 chooses; tests/lab/test_studies.py checks these against those rows): VLA's are the rows of
# penalty scale 1 (label vla_p1, the layer's default); Gated DeltaNet's are the rows of the
# earlier layer (label gated_deltanet: no output gate, values of the key width), the only
# Gated DeltaNet rows at d_model 128, which at T = 512 stayed near chance at every rate.
D128_RATES = {("vla", 256): "1e-2", ("vla", 512): "3e-3",
              ("deltanet", 256): "1e-3", ("deltanet", 512): "3e-3",
              ("gdn_fla", 256): "3e-3", ("gdn_fla", 512): "1e-3"}

FIX_VARIANTS = (("vla", {}), ("silu_l2", {VLA + "qk_map": "silu_l2"}),
                ("beta", {VLA + "beta": True}),
                ("silu_l2_beta", {VLA + "qk_map": "silu_l2", VLA + "beta": True}))
FIX_SEEDS = tuple(range(10))
FIX_STEPS = 4000
FIX_RATE = "3e-3"                    # at lab.grid.REMEDY_CELLS, where VLA's seeds split at it
FIX_DIAGNOSTICS_EVERY = 100

# The authors' layer (VLA.md section 2, [authors' code]): everything else as the layer's
# defaults, which are theirs (q/k bias, LayerNorm before W_o), ELU + 1 and writes of strength 1
# pinned.
AUTHORS_LAYER = {VLA + "penalty_scale": "inv_sqrt_dh", VLA + "lam0": 0.1,
                 VLA + "readout": "additive", VLA + "conv_size": 0, VLA + "qk_map": "elu1",
                 VLA + "beta": False}
AUTHORS_N = (4, 8, 12, 16, 24, 32)
AUTHORS_RATE = "3e-4"                  # the authors' rate
AUTHORS_RATES = (AUTHORS_RATE, "1e-3", "3e-3")
AUTHORS_SEEDS = (0, 1, 2)
AUTHORS_STEPS = 3000                   # theirs, and configs/mqar_paper.py's

BASELINE_T, BASELINE_PAIRS = 512, 64
BASELINE_WIDTHS = (64, 128)
BASELINE_SEEDS = (0, 1, 2)
BASELINE_STEPS, BASELINE_LONG_STEPS = 4000, 12000
GDN = "model.options.gated_deltanet."
# (label, mixer, head dim, overrides, rates of the 4,000-step sweep). Gated DeltaNet's rates
# lie where its earlier rows did best (1e-3 and below at T = 512), DeltaNet's and linear
# attention's where theirs did (1e-2, RESULTS.md section 5's tuned rows).
BASELINES = (
    ("gdn_fla", "gated_deltanet", 32,
     {GDN + "output_gate": True, GDN + "expand_v": 2, GDN + "gate_init": "fla"},
     ("3e-4", "1e-3", "3e-3")),
    ("gdn_fla_h64", "gated_deltanet", 64,
     {GDN + "output_gate": True, GDN + "expand_v": 1, GDN + "gate_init": "fla"},
     ("3e-4", "1e-3", "3e-3")),
    ("deltanet_h64", "deltanet", 64, {}, ("1e-3", "3e-3", "1e-2")),
    ("linear_h64", "linear", 64, {}, ("1e-3", "3e-3", "1e-2")),
)
# The collapsed zoology job repeated: Gated DeltaNet as its rows had it, T = 512, d_model 128,
# rate 1e-3 (all three seeds ended at a training loss near ln 4096), 4,000 steps; at the
# highest precision one run (seed 2, still at ln 4096 after 4,000 steps at the default): three
# vmapped seeds there run at about 5 steps/s on an H100, past one device call.
COLLAPSE = dict(d_model=128, rate="1e-3", steps=4000, diagnostics_every=100,
                precisions=("default", "highest"), highest_seeds=(2,))
PRECISION_ENV = "JAX_DEFAULT_MATMUL_PRECISION"

# Mixed precision against float32: (label, mixer, overrides) with each layer's defaults pinned
# (VLA's as VLA_DEFAULTS; Gated DeltaNet's are fla's: output gate with gated RMSNorm, values
# twice the key width, fla's gate initialisation).
PARITY_MIXERS = (
    ("vla", "vla", VLA_DEFAULTS),
    ("deltanet", "deltanet", {}),
    ("gdn_fla", "gated_deltanet",
     {GDN + "output_gate": True, GDN + "expand_v": 2, GDN + "gate_init": "fla"}),
)
PARITY_ZOOLOGY_LABELS = {"vla": "vla_p1", "deltanet": "deltanet", "gdn_fla": "gated_deltanet"}
# (name in job names and rows, config file): float32, then bfloat16 activations with float32
# parameters and states.
PARITY_PRECISIONS = (("float32", "configs/mqar_zoology.py"),
                     ("bfloat16", "configs/mqar_zoology_bf16.py"))
PARITY_SEEDS = (0, 1, 2)
PARITY_STEPS = 2000


def _job(study, name, config, overrides, rates, tag, seeds, env=()):
  return grid.Job(study, f"{study}-{name}", config, overrides, tuple(rates),
                  {"grid": study, **tag}, tuple(seeds), tuple(env))


def _zoology(T, n, d_model, heads, steps):
  """Overrides of configs/mqar_zoology.py:T for one cell, and the rows' tag of it."""
  return ({"task.n_pairs": n, "model.d_model": d_model, "model.num_heads": heads,
           "train.num_steps": steps},
          {"seq_len": T, "n_pairs": n, "d_model": d_model, "steps": steps})


def weights_or_data_jobs():
  T, n, d_model, heads = WOD_CELL
  cell, tag = _zoology(T, n, d_model, heads, WOD_STEPS)
  return [_job("weights_or_data", f"T{T}-d{d_model}-data{d}", f"configs/mqar_zoology.py:{T}",
               {"model.mixer": "vla", **cell, "train.data_seed": d,
                "train.diagnostics_every": WOD_DIAGNOSTICS_EVERY, **VLA_DEFAULTS},
               (WOD_RATE,), {**tag, "label": "vla", "data_seed": d}, WOD_SEEDS)
          for d in WOD_DATA_SEEDS]


def fix_cells():
  """The fix study's cells in start order, (T, n_pairs, d_model, heads, rate): the two of
  section 9 at FIX_RATE, then D128_CELLS at VLA's D128_RATES."""
  return ([(*c, FIX_RATE) for c in grid.REMEDY_CELLS]
          + [(*c, D128_RATES[("vla", c[0])]) for c in D128_CELLS])


def fix_jobs():
  out = []
  for T, n, d_model, heads, rate in fix_cells():
    cell, tag = _zoology(T, n, d_model, heads, FIX_STEPS)
    for label, extra in FIX_VARIANTS:
      out.append(_job("fix", f"T{T}-d{d_model}-{label}", f"configs/mqar_zoology.py:{T}",
                      {"model.mixer": "vla", **cell,
                       "train.diagnostics_every": FIX_DIAGNOSTICS_EVERY, **VLA_DEFAULTS,
                       **extra}, (rate,), {**tag, "label": label}, FIX_SEEDS))
  return out


def authors_jobs():
  return [_job("authors", f"n{n}-vla_paper", f"configs/mqar_paper.py:{n}",
               {"model.mixer": "vla", "train.num_steps": AUTHORS_STEPS, **AUTHORS_LAYER},
               AUTHORS_RATES, {"n_pairs": n, "label": "vla_paper", "steps": AUTHORS_STEPS},
               AUTHORS_SEEDS) for n in AUTHORS_N]


def _baseline(label, mixer, head_dim, extra, d_model, steps, rates, name=None, tag=(), env=(),
              seeds=BASELINE_SEEDS, more=()):
  cell, cell_tag = _zoology(BASELINE_T, BASELINE_PAIRS, d_model, d_model // head_dim, steps)
  return _job("baselines", name or f"T{BASELINE_T}-d{d_model}-{label}-s{steps}",
              f"configs/mqar_zoology.py:{BASELINE_T}",
              {"model.mixer": mixer, **cell, "model.head_dim": head_dim, **extra, **dict(more)},
              rates, {**cell_tag, "label": label, "head_dim": head_dim, **dict(tag)}, seeds, env)


def baseline_jobs(rows=(), overrides=None):
  """The baselines study from its rows so far: the collapsed job at both precisions, the
  4,000-step sweeps, then a 12,000-step job at the rate chosen on validation
  (`lab.grid.best_rate_table`) for each cell whose sweep has every rate and seed in `rows`
  (those made with `overrides`, the driver's (FIELD, VALUE) pairs, where given; else any)."""
  if overrides is not None:
    wanted = grid.result_overrides(overrides)
    rows = [r for r in rows if r.get("overrides", {}) == wanted]
  out = []
  c = COLLAPSE
  for precision in c["precisions"]:
    out.append(_baseline(
        "gdn_collapse", "gated_deltanet", grid.HEAD_DIM,
        {**grid.EARLIER_GDN, GDN + "gate_init": "fla"}, c["d_model"], c["steps"], (c["rate"],),
        name=f"T{BASELINE_T}-d{c['d_model']}-gdn_collapse-{precision}",
        tag={"matmul_precision": precision},
        env=((PRECISION_ENV, precision),) if precision != "default" else (),
        seeds=BASELINE_SEEDS if precision == "default" else c["highest_seeds"],
        more={"train.diagnostics_every": c["diagnostics_every"]}))
  out += [_baseline(label, mixer, head_dim, extra, d, BASELINE_STEPS, rates)
          for d in BASELINE_WIDTHS for label, mixer, head_dim, extra, rates in BASELINES]
  swept = {job.name: job for job in out}
  chosen = grid.best_rate_table([r for r in rows if r.get("job") in swept])
  for d in BASELINE_WIDTHS:
    for label, mixer, head_dim, extra, rates in BASELINES:
      job = swept[f"baselines-T{BASELINE_T}-d{d}-{label}-s{BASELINE_STEPS}"]
      cell = chosen.get((BASELINE_T, d, label))
      have = {(r.get("seed"), r.get("learning_rate")) for r in rows if r.get("job") == job.name}
      if cell is None or not all((s, float(lr)) in have for s in job.seeds for lr in job.rates):
        continue
      rate = grid.rate_name(cell["rate"])
      out.append(_baseline(label, mixer, head_dim, extra, d, BASELINE_LONG_STEPS, (rate,),
                           name=f"T{BASELINE_T}-d{d}-{label}-s{BASELINE_LONG_STEPS}-lr{rate}"))
  return out


def parity_jobs():
  """The parity study: per mixer and cell, the float32 job and then the bfloat16 one (so that
  the two of a cell run at once and a stopped call leaves pairs)."""
  out = []
  for label, mixer, extra in PARITY_MIXERS:
    for T, n, d_model, heads in D128_CELLS:
      cell, tag = _zoology(T, n, d_model, heads, PARITY_STEPS)
      for precision, config in PARITY_PRECISIONS:
        out.append(_job("parity", f"T{T}-d{d_model}-{label}-{precision}", f"{config}:{T}",
                        {"model.mixer": mixer, **cell, **extra},
                        (D128_RATES[(label, T)],),
                        {**tag, "label": label, "precision": precision}, PARITY_SEEDS))
  return out


def jobs(study, rows=(), overrides=None):
  """The jobs of `study` (one of STUDIES), in start order; `rows` (the study's rows so far,
  those made with `overrides` where given) plan the baselines' 12,000-step jobs."""
  makers = {"weights_or_data": weights_or_data_jobs, "fix": fix_jobs,
            "authors": authors_jobs, "baselines": lambda: baseline_jobs(rows, overrides),
            "parity": parity_jobs}
  if study not in makers:
    raise ValueError(f"study must be one of {', '.join(STUDIES)}; got {study!r}")
  return makers[study]()


def stem(study, job_name):
  """A job's file stem ("baselines-T512-d64-gdn_fla-s4000" -> "T512-d64-gdn_fla-s4000")."""
  return job_name.removeprefix(f"{study}-")


@dataclasses.dataclass
class StudyData:
  """A study's rows and its jobs' files.

  Attributes:
    study: its name; rows: its sweep rows (the rows file); files: {job stem: (metrics rows,
    run rows)} of the jobs whose two files are there (`vla_jax.training.sweep`'s
    metrics.jsonl and sweep_results.jsonl, or their copies).
  """
  study: str
  rows: list
  files: dict


def collect(workdir, study):
  """The `StudyData` of `study` in its workdir (experiments/studies.py's --workdir)."""
  rows = jsonl.read_rows(os.path.join(workdir, f"{study}.jsonl"))
  files = {}
  for job in jobs(study, rows):
    run = os.path.join(workdir, "runs", job.name)
    metrics = jsonl.read_rows(os.path.join(run, "metrics.jsonl"))
    runs = jsonl.read_rows(os.path.join(run, "sweep_results.jsonl"))
    if metrics and runs:
      files[stem(study, job.name)] = (metrics, runs)
  return StudyData(study, rows, files)


def load(folder, study):
  """The `StudyData` of `study` from its copy in `folder` (`export`'s layout); no rows and no
  files where the folder does not exist."""
  rows = jsonl.read_rows(os.path.join(folder, "rows.jsonl"))
  files = {}
  for job in jobs(study, rows):
    s = stem(study, job.name)
    metrics = jsonl.read_rows(os.path.join(folder, f"{s}_metrics.jsonl"))
    runs = jsonl.read_rows(os.path.join(folder, f"{s}_runs.jsonl"))
    if metrics and runs:
      files[s] = (metrics, runs)
  return StudyData(study, rows, files)


def slim(value):
  """A metrics row without parameter norms ("param.*", "*.param.*"), floats to 4 significant
  digits (`lab.report.seeds`' rule for the copied metrics)."""
  if isinstance(value, dict):
    return {k: slim(v) for k, v in value.items()
            if not (k.startswith("param.") or ".param." in k)}
  if isinstance(value, list):
    return [slim(v) for v in value]
  if isinstance(value, float):
    return float(f"{value:.4g}")
  return value


def export(workdir, study, dest):
  """Copies `study`'s rows and its finished jobs' files from `workdir` to `dest` (`load`'s
  layout; metrics slimmed by `slim`). The rows of jobs that `dest` holds and the workdir does
  not stay (a study run over several machines, a workdir each, exports into one folder); a
  job's rows in the workdir replace its rows there. Returns the stems copied."""
  data = collect(workdir, study)
  os.makedirs(dest, exist_ok=True)
  path = os.path.join(dest, "rows.jsonl")
  here = {r.get("job") for r in data.rows}
  kept = [r for r in jsonl.read_rows(path) if r.get("job") not in here]
  jsonl.write_rows(path, kept + data.rows, sort_keys=True)
  for s, (metrics, runs) in data.files.items():
    jsonl.write_rows(os.path.join(dest, f"{s}_metrics.jsonl"), [slim(r) for r in metrics])
    jsonl.write_rows(os.path.join(dest, f"{s}_runs.jsonl"), runs)
  return sorted(data.files)
