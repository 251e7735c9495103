"""What the five studies of `lab.studies` show: per-run tables, summaries, RESULTS.md's blocks
and the weights-or-data plot, from a study's `lab.studies.StudyData` (experiments/studies.py
--summary prints the same tables from its workdir).

Definitions (as RESULTS.md section 9's, `lab.report.seeds`): a run *fails* below test accuracy
SOLVED (0.9); it *leaves the plateau* (escapes) at the first logged training step (every
train.log_every = 50 steps) whose training-batch accuracy is above ESCAPED (0.5), never if no
logged step is; key collinearity is the probe's layer<i>.key_cos_mean (the mean |cos| between
the key directions of two tokens of an example) at step 0 and at the last probe.
"""

import collections
import os

import numpy as np

from lab import studies
from lab.grid import REMEDY_CELLS, best_rate_table, rate_name
from lab.report import markdown
from lab.report.rows import accuracy, grid_summary, name
from lab.report.seeds import ESCAPED, SOLVED

COMMAND = "python experiments/studies.py --study={study} --workdir=OUT"
# The names of the studies' labels in the tables.
NAMES = {"vla": "VLA", "silu_l2": "VLA + SiLU/L2 q, k", "beta": "VLA + beta",
         "silu_l2_beta": "VLA + SiLU/L2 q, k + beta", "vla_paper": "VLA as published",
         "gdn_fla": "GDN-fla (d_h 32, values 64)", "gdn_fla_h64": "GDN-fla (d_h 64, values 64)",
         "deltanet_h64": "DeltaNet (d_h 64)", "linear_h64": "linear (d_h 64)",
         "gdn_collapse": "GDN (earlier rows' layer)"}
LAYERS = (0, 1)


def label_name(label):
  return NAMES.get(label, name(label))


def not_run(study):
  """The text of a study without rows."""
  return (f"Not run yet: `{COMMAND.format(study=study)}`, then its files under "
          f"`results/training/{studies.EXPORT_FOLDER}/{study}/` (`--export`).")


# -- per run ---------------------------------------------------------------------------------

def run_table(metrics, runs):
  """Per run of one job (in `runs`' order, the metrics lists' order): {seed, rate, accuracy,
  train_loss, escape (step or None), key_cos {layer: (at step 0, at the last probe)},
  probes {name: [(step, value)]} of every probe value}."""
  train = [r for r in metrics if "loss" in r and isinstance(r.get("accuracy"), list)]
  probes = {}
  for r in metrics:                       # the last row written at a step wins
    if "diagnostics" in r:
      probes[r["step"]] = r["diagnostics"]
  steps = sorted(probes)
  out = []
  for i, r in enumerate(runs):
    series = {k: [(s, probes[s][k][i]) for s in steps if k in probes[s]]
              for k in (probes[steps[-1]] if steps else {})}
    key_cos = {layer: (series[k][0][1], series[k][-1][1]) for layer in LAYERS
               if (k := f"layer{layer}.key_cos_mean") in series and series[k]}
    out.append({"seed": r["seed"], "rate": r["learning_rate"], "accuracy": accuracy(r),
                "train_loss": r.get("train_loss"),
                "escape": next((t["step"] for t in train if t["accuracy"][i] > ESCAPED),
                               None),
                "key_cos": key_cos, "probes": series})
  return out


def job_runs(data, job):
  """The `run_table` of `job` in `data` (None where its files are not there)."""
  files = data.files.get(studies.stem(data.study, job.name))
  return None if files is None else run_table(*files)


def _esc(r):
  return "never" if r["escape"] is None else f"{r['escape']:,}"


def _cos(r, layer):
  pair = r["key_cos"].get(layer)
  return "n/a" if pair is None else f"{pair[0]:.2f} / {pair[1]:.2f}"


def _count(rs):
  return f"{sum(r['accuracy'] >= SOLVED for r in rs)} of {len(rs)}"


def _median_escape(rs):
  escaped = [r["escape"] for r in rs if r["escape"] is not None]
  return "never" if not escaped else f"{np.median(escaped):,.0f}"


# -- weights or data -------------------------------------------------------------------------

def weights_or_data_grid(data):
  """{(init seed, data seed): run} of the weights_or_data jobs on file."""
  grid = {}
  for job in studies.jobs("weights_or_data"):
    for r in job_runs(data, job) or ():
      grid[(r["seed"], job.tag["data_seed"])] = r
  return grid


def shares(values):
  """The main effects of a complete two-way table: {"init": share, "data": share} of the total
  sum of squares of `values` ({(init, data): number}) that the row (initialisation seed) and
  column (data seed) means explain (each in [0, 1]; the rest is their interaction). None when
  the table is incomplete or constant."""
  inits = sorted({i for i, _ in values})
  datas = sorted({d for _, d in values})
  if len(values) != len(inits) * len(datas) or len(inits) < 2 or len(datas) < 2:
    return None
  y = np.array([[values[(i, d)] for d in datas] for i in inits], np.float64)
  total = np.sum((y - y.mean()) ** 2)
  if total == 0:
    return None
  return {"init": float(len(datas) * np.sum((y.mean(1) - y.mean()) ** 2) / total),
          "data": float(len(inits) * np.sum((y.mean(0) - y.mean()) ** 2) / total)}


def weights_or_data_summary(data):
  """{grid, inits, datas, failed_by_init {seed: n}, failed_by_data, shares {outcome: shares}}:
  outcome "solved" (1 / 0) and "escape" (the escape step, never counted as the run's last
  step)."""
  grid = weights_or_data_grid(data)
  inits, datas = studies.WOD_SEEDS, studies.WOD_DATA_SEEDS
  fails = lambda pairs: sum(grid[p]["accuracy"] < SOLVED for p in pairs if p in grid)
  end = studies.WOD_STEPS
  complete = len(grid) == len(inits) * len(datas)   # shares of the whole design only
  share = lambda f: shares({p: f(r) for p, r in grid.items()}) if complete else None
  return {"grid": grid, "inits": inits, "datas": datas,
          "failed_by_init": {i: fails([(i, d) for d in datas]) for i in inits},
          "failed_by_data": {d: fails([(i, d) for i in inits]) for d in datas},
          "shares": {"solved": share(lambda r: float(r["accuracy"] >= SOLVED)),
                     "escape": share(lambda r: float(end if r["escape"] is None
                                                     else r["escape"]))}}


def _share_text(s):
  return "n/a" if s is None else f"{s['init']:.2f} / {s['data']:.2f}"


def weights_or_data_tables(data):
  """Markdown blocks: the grid of escape steps, failures per seed, the variance shares, every
  run."""
  s = weights_or_data_summary(data)
  grid = s["grid"]
  if not grid:
    return [not_run("weights_or_data")]
  cell = lambda i, d: ("pending" if (i, d) not in grid else
                       _esc(grid[(i, d)]) + ("" if grid[(i, d)]["accuracy"] >= SOLVED
                                             else " (failed)"))
  T, n, d_model, _ = studies.WOD_CELL
  blocks = [
      f"Zoology's MQAR, T = {T} ({n} pairs), d_model {d_model}, VLA (its defaults), rate "
      f"{float(studies.WOD_RATE):g}, {studies.WOD_STEPS:,} steps. **Escape step** (first "
      f"logged step with training accuracy above {ESCAPED}) by initialisation seed (rows) and "
      f"data seed (columns); *failed*: test accuracy below {SOLVED}:",
      markdown.table(["init seed"] + [f"data {d}" for d in s["datas"]] + ["failed"],
                     [[i] + [cell(i, d) for d in s["datas"]] + [s["failed_by_init"][i]]
                      for i in s["inits"]]
                     + [["failed"] + [s["failed_by_data"][d] for d in s["datas"]] + [""]]),
      "Share of the variance explained by the initialisation seed / the data seed (main "
      "effects of the 5 x 5 table; the rest is their interaction): solved "
      f"{_share_text(s['shares']['solved'])}, escape step "
      f"{_share_text(s['shares']['escape'])}."]
  return blocks


def weights_or_data_full(data):
  blocks = weights_or_data_tables(data)
  grid = weights_or_data_grid(data)
  if grid:
    blocks += ["**Every run** (key collinearity: at step 0 / at the end):",
               markdown.table(["init seed", "data seed", "test accuracy", "escape step",
                               "key cos, layer 0", "key cos, layer 1"],
                              [[i, d, f"{r['accuracy']:.3f}", _esc(r), _cos(r, 0), _cos(r, 1)]
                               for (i, d), r in sorted(grid.items())])]
  return blocks


# -- the fix ---------------------------------------------------------------------------------

def fix_summary(data):
  """{(T, d_model): {label: runs}} of the fix jobs on file (cells and variants in order)."""
  out = {}
  for job in studies.jobs("fix"):
    runs = job_runs(data, job)
    if runs is not None:
      out.setdefault((job.tag["seq_len"], job.tag["d_model"]), {})[job.tag["label"]] = runs
  return out


def fix_tables(data, full=False):
  s = fix_summary(data)
  if not s:
    return [not_run("fix")]
  cell_rates = {(T, d): rate for T, _, d, _, rate in studies.fix_cells()}
  cells = list(cell_rates)
  where = lambda cs: "; ".join(f"T = {T}, d_model {d}" for T, d in cs)
  section9 = [(T, d) for T, _, d, _ in REMEDY_CELLS]
  rates = (f"rate {float(studies.FIX_RATE):g} at section 9's cells ({where(section9)}) and "
           "the rate the zoology rows chose for VLA at the others ("
           + "; ".join(f"{float(cell_rates[c]):g} at {where([c])}" for c in cells
                       if c not in section9) + ")")

  def mean(values):
    values = [v for v in values if v is not None]
    return "n/a" if not values else f"{np.mean(values):.2f}"

  body = []
  for cell in cells:
    for label, _ in studies.FIX_VARIANTS:
      rs = s.get(cell, {}).get(label)
      body.append([f"T = {cell[0]}, d_model {cell[1]}", label_name(label)]
                  + (["pending", "", "", "", ""] if rs is None else
                     [_count(rs), _median_escape(rs),
                      mean(r["key_cos"].get(0, (None,))[0] for r in rs),
                      mean(r["key_cos"].get(0, (None, None))[1] for r in rs),
                      mean((r["probes"].get("layer0.beta_mean") or [(0, None)])[-1][1]
                           for r in rs)]))
  blocks = [f"Solved seeds (test accuracy >= {SOLVED}) of {len(studies.FIX_SEEDS)}, "
            f"{studies.FIX_STEPS:,} steps, {rates}; median escape step of "
            "the runs that escape; layer 0's key collinearity at step 0 and at the end, and "
            "its mean write strength beta at the end (means over runs):",
            markdown.table(["cell", "variant", "solved", "median escape", "key cos 0, start",
                            "key cos 0, end", "beta 0, end"], body)]
  if full:
    for cell in cells:
      for label, _ in studies.FIX_VARIANTS:
        rs = s.get(cell, {}).get(label)
        if rs:
          blocks += [f"**T = {cell[0]}, d_model {cell[1]}, {label_name(label)}**, per run:",
                     markdown.table(["seed", "test accuracy", "escape step", "key cos, layer 0",
                                     "key cos, layer 1"],
                                    [[r["seed"], f"{r['accuracy']:.3f}", _esc(r), _cos(r, 0),
                                      _cos(r, 1)] for r in sorted(rs, key=lambda r: r["seed"])])]
  return blocks


# -- the authors' layer ----------------------------------------------------------------------

def _cell_text(test):
  test = np.asarray(test)
  return f"{test.mean():.3f} ({int(np.sum(test >= SOLVED))} of {len(test)})"


def authors_tables(data, capacity_rows=()):
  """The authors' layer at each n: at their rate and at the rate chosen on validation, beside
  the capacity grid's VLA and VLA-a (`capacity_rows`) where given."""
  rows = [r for r in data.rows if r.get("label") == "vla_paper"]
  if not rows:
    return [not_run("authors")]
  by_n = collections.defaultdict(list)
  for r in rows:
    by_n[r["n_pairs"]].append(r)
  chosen = grid_summary(rows, "n_pairs")
  capacity = grid_summary(list(capacity_rows), "n_pairs") if capacity_rows else {}
  ref = [m for m in ("vla_p1", "vla") if any(k[0] == m for k in capacity)]
  body = []
  for n in studies.AUTHORS_N:
    if n not in by_n:
      body.append([f"n = {n}", "pending", "", ""] + [""] * len(ref))
      continue
    at = [accuracy(r) for r in by_n[n] if rate_name(r["learning_rate"]) == studies.AUTHORS_RATE]
    c = chosen[("vla_paper", n)]
    body.append([f"n = {n}", _cell_text(at) if at else "-",
                 f"{c['rate']:g}", _cell_text(c["test"])]
                + [_cell_text(capacity[(m, n)]["test"]) if (m, n) in capacity else "-"
                   for m in ref])
  return [f"Mean test accuracy over seeds (seeds >= {SOLVED} of N), the seed's MQAR form "
          f"(T = 3n + 1), {studies.AUTHORS_STEPS:,} steps; the authors' layer (lam0 0.1, "
          "additive readout, no convolution, penalty scale 1/sqrt(d_h)) at their rate "
          f"{float(studies.AUTHORS_RATE):g} and at the rate chosen on validation"
          + (", beside the capacity grid's rows (short convolution, lam0 1, no readout "
             "denominator; chosen rate)" if ref else "") + ":",
          markdown.table(["n pairs", f"as published, rate {float(studies.AUTHORS_RATE):g}",
                          "chosen rate", "at the chosen rate"] + [name(m) for m in ref],
                         body)]


# -- baselines at T = 512 --------------------------------------------------------------------

def state_floats(row):
  """Recurrent state per layer of a sweep row, in floats: heads * value width * key width (the
  memory S; VLA's penalty inverse A adds heads * d_h^2)."""
  model, opts = row["model"], row["model"].get("mixer_options", {})
  heads, dk = model["num_heads"], model["head_dim"]
  dv = dk * opts.get("expand_v", 1)
  return heads * dk * dv + (heads * dk * dk if row["mixer"] == "vla" else 0)


def baseline_cells(rows):
  """{(label, d_model, steps): {"rate", "test" [seeds], "state"}}: each cell's rate chosen on
  validation (`lab.grid.best_rate_table` over its rows) and its test accuracies there."""
  out = {}
  for steps in (studies.BASELINE_STEPS, studies.BASELINE_LONG_STEPS):
    swept = [r for r in rows if r.get("steps") == steps and "matmul_precision" not in r]
    for (T, d, label), c in best_rate_table(swept, steps=steps).items():
      at = [r for r in swept if (r["d_model"], r["label"]) == (d, label)
            and r["learning_rate"] == c["rate"]]
      out[(label, d, steps)] = {"rate": c["rate"], "test": [accuracy(r) for r in at],
                                "state": state_floats(at[0])}
  return out


def collapse_runs(data):
  """{precision: runs} of the collapsed job repeated (`run_table`), where on file."""
  out = {}
  for job in studies.jobs("baselines", data.rows):
    if "matmul_precision" in job.tag:
      runs = job_runs(data, job)
      if runs is not None:
        out[job.tag["matmul_precision"]] = runs
  return out


def _at(series, step):
  """The value of a probe series [(step, value)] at the last probe at or before `step`."""
  got = [v for s, v in series if s <= step]
  return got[-1] if got else None


def baselines_tables(data, full=False):
  cells = baseline_cells(data.rows)
  collapse = collapse_runs(data)
  if not cells and not collapse:
    return [not_run("baselines")]
  labels = [label for label, *_ in studies.BASELINES]
  short, long = studies.BASELINE_STEPS, studies.BASELINE_LONG_STEPS
  text = lambda c: "pending" if c is None else f"{_cell_text(c['test'])}, rate {c['rate']:g}"
  body = []
  for label in labels:
    for d in studies.BASELINE_WIDTHS:
      at_short, at_long = cells.get((label, d, short)), cells.get((label, d, long))
      state = (at_short or at_long or {}).get("state")
      body.append([label_name(label), d, "-" if state is None else f"{state:,}",
                   text(at_short), text(at_long)])
  blocks = [f"T = {studies.BASELINE_T} ({studies.BASELINE_PAIRS} pairs): mean test accuracy "
            f"(seeds >= {SOLVED} of N) at the rate chosen on validation; state per layer in "
            "floats (VLA at d_h 32: 4,096 at d_model 64, 8,192 at 128):",
            markdown.table(["mixer", "d_model", "state floats", f"{short:,} steps",
                            f"{long:,} steps"], body)]
  if collapse:
    c = studies.COLLAPSE
    marks = [0, c["steps"] // 4, c["steps"]]
    probes = (("layer1.key_cos_mean", "key cos"), ("layer1.beta_mean", "beta"),
              ("layer1.decay_mean", "decay"))
    rows = []
    for precision, runs in collapse.items():
      for r in sorted(runs, key=lambda r: r["seed"]):
        series = lambda key: " / ".join(markdown.fmt(_at(r["probes"].get(key, []), m))
                                        for m in marks)
        rows.append([precision, r["seed"], "n/a" if r["train_loss"] is None
                     else f"{r['train_loss']:.3f}", f"{r['accuracy']:.3f}"]
                    + [series(key) for key, _ in probes])
    steps = " / ".join(f"{m:,}" for m in marks)
    blocks += [f"The collapsed Gated DeltaNet job of the zoology grid again (T = "
               f"{studies.BASELINE_T}, d_model {c['d_model']}, rate {float(c['rate']):g}, "
               f"{c['steps']:,} steps; training loss at the end, ln {4096} = "
               f"{np.log(4096):.3f} is uniform over the values), JAX's default matmul "
               "precision and \"highest\"; layer 1's mean |cos| between key directions, mean "
               f"write strength beta and mean decay exp(g_t) at steps {steps}:",
               markdown.table(["precision", "seed", "train loss", "test accuracy"]
                              + [f"{label}, layer 1" for _, label in probes], rows)]
    if full:
      for precision, runs in collapse.items():
        for r in sorted(runs, key=lambda r: r["seed"]):
          keys = [k for k in ("layer0.key_cos_mean", "layer1.key_cos_mean", "layer0.beta_mean",
                              "layer1.beta_mean", "layer0.decay_mean", "layer0.decay_p10",
                              "layer1.decay_mean") if k in r["probes"]]
          steps = [s for s, _ in r["probes"].get(keys[0], [])] if keys else []
          if steps:
            blocks += [f"**{precision}, seed {r['seed']}**: probe values through training:",
                       markdown.table(["step"] + keys,
                                      [[f"{s:,}"] + [markdown.fmt(dict(r["probes"][k]).get(s))
                                                     for k in keys] for s in steps])]
  return blocks


# -- mixed precision against float32 ---------------------------------------------------------

def parity_cells(rows):
  """{(label, T): {precision: [test accuracy per seed]}} of the parity rows."""
  out = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in sorted(rows, key=lambda r: r["seed"]):
    out[(r["label"], r["seq_len"])][r["precision"]].append(accuracy(r))
  return out


def parity_tables(data, full=False):
  """Per mixer and cell, the mean test accuracy in float32 and in mixed precision (seeds
  >= SOLVED of N each) and their difference; full=True: every run."""
  if not data.rows:
    return [not_run("parity")]
  cells = parity_cells(data.rows)
  f32, bf16 = (p for p, _ in studies.PARITY_PRECISIONS)
  body = []
  for label, _, _ in studies.PARITY_MIXERS:
    for T, n, _, _ in studies.D128_CELLS:
      got = cells.get((label, T), {})
      a, b = got.get(f32), got.get(bf16)
      diff = "-" if not (a and b) else f"{np.mean(b) - np.mean(a):+.3f}"
      body.append([label_name(label), f"{T} ({n})",
                   f"{float(studies.D128_RATES[(label, T)]):g}",
                   _cell_text(a) if a else "pending", _cell_text(b) if b else "pending", diff])
  _, _, d_model, heads = studies.D128_CELLS[0]
  blocks = [f"Zoology's MQAR, d_model {d_model} ({heads} heads of {d_model // heads}), "
            f"{studies.PARITY_STEPS:,} "
            f"steps, seeds {', '.join(map(str, studies.PARITY_SEEDS))}, each mixer at the rate "
            "the zoology rows chose for it (section 5; Gated DeltaNet's: the earlier layer's). "
            "Mean test accuracy (seeds >= "
            f"{SOLVED} of N) in float32 and in mixed precision (bfloat16 activations, float32 "
            "parameters and recurrent states, `configs/mqar_zoology_bf16.py`); difference: "
            "bfloat16 - float32:",
            markdown.table(["mixer", "T (pairs)", "rate", "float32", "bfloat16",
                            "difference"], body)]
  if full:
    for label, _, _ in studies.PARITY_MIXERS:
      for T, _, _, _ in studies.D128_CELLS:
        runs = sorted((r for r in data.rows if (r["label"], r["seq_len"]) == (label, T)),
                      key=lambda r: (r["precision"] != f32, r["seed"]))
        if runs:
          blocks += [f"**{label_name(label)}, T = {T}**, per run:",
                     markdown.table(["precision", "seed", "test accuracy", "train loss"],
                                    [[r["precision"], r["seed"], f"{accuracy(r):.3f}",
                                      markdown.fmt(r.get("train_loss"))] for r in runs])]
  return blocks


# -- the report ------------------------------------------------------------------------------

BLOCKS = {"weights_or_data": "weights_or_data", "seed_fix": "fix", "authors_layer": "authors",
          "baselines_t512": "baselines", "bf16_parity": "parity"}


def load_all(training_dir):
  """{study: StudyData} of the studies' copies under `training_dir` (results/training)."""
  folder = os.path.join(training_dir, studies.EXPORT_FOLDER)
  return {s: studies.load(os.path.join(folder, s), s) for s in studies.STUDIES}


def tables(study, data, capacity_rows=(), full=False):
  """The markdown blocks of `study` (full=True: every run too)."""
  if study == "weights_or_data":
    return (weights_or_data_full if full else weights_or_data_tables)(data)
  if study == "fix":
    return fix_tables(data, full)
  if study == "authors":
    return authors_tables(data, capacity_rows)
  if study == "parity":
    return parity_tables(data, full)
  return baselines_tables(data, full)


def full_tables(all_data, capacity_rows):
  """{full table stem (a `BLOCKS` name): markdown blocks} of every study."""
  return {block: tables(study, all_data[study], capacity_rows, full=True)
          for block, study in BLOCKS.items()}


def blocks(all_data, capacity_rows, link, plot):
  """{RESULTS.md block name: markdown}: each study's summary, its full table's link, and the
  weights-or-data plot once it has runs."""
  out = {}
  for block, study in BLOCKS.items():
    body = tables(study, all_data[study], capacity_rows)
    if all_data[study].rows:
      body.append(f"Per run and probe values: {link(block)}.")
      if study == "weights_or_data" and weights_or_data_grid(all_data[study]):
        body.append(f"![escape step by initialisation and data seed]({plot})")
    out[block] = "\n\n".join(body)
  return out
