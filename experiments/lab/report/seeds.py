r"""The tables of RESULTS.md section 9: why VLA seeds fail, and the remedies tried, from zoology
cells rerun with training diagnostics.

Two folders under results/training/, each a grid's rows with every job's metrics.jsonl
(training rows, and probe rows with lists over the job's runs: `vla_jax.training.probe`) and
its sweep_results.jsonl (the runs, in the metrics lists' order):

- FOLDER, seed_failures_h200/ (the learning-rate remedy): the zoology grid's two VLA jobs at
  T = 64, d_model 64 rerun at rates 3e-3 and 1e-2, 5 seeds (LR_COMMAND): rows.jsonl (the
  grid's OUT/zoology.jsonl), `<label>_metrics.jsonl` and `<label>_runs.jsonl` (LABELS).
- REMEDY_FOLDER, seed_remedies_h200/ (the other remedies): the seed_remedies grid
  (`lab.grid`: REMEDY_CELLS x REMEDY_VARIANTS at rate 3e-3, seeds 0-4, training
  diagnostics every 50 steps), made by REMEDY_COMMAND and copied from its OUT with

      mkdir -p results/training/seed_remedies_h200
      cp OUT/seed_remedies.jsonl results/training/seed_remedies_h200/rows.jsonl
      for d in OUT/runs/seed_remedies-*; do
        j=$(basename "$d"); j=${j#seed_remedies-}
        python -c "$SLIM" < "$d/metrics.jsonl" \
          > "results/training/seed_remedies_h200/${j}_metrics.jsonl"
        cp "$d/sweep_results.jsonl" "results/training/seed_remedies_h200/${j}_runs.jsonl"
      done

  where SLIM, the one-liner below, drops the parameter norms (keys "param.*" and "*.param.*",
  which this section does not read) and rounds every float to 4 significant digits:

      SLIM='import json, sys; f = lambda v: {k: f(x) for k, x in v.items() if not (k.startswith("param.") or ".param." in k)} if isinstance(v, dict) else [f(x) for x in v] if isinstance(v, list) else float(f"{v:.4g}") if isinstance(v, float) else v; [print(json.dumps(f(json.loads(l)))) for l in sys.stdin]'

  That gives rows.jsonl (70 rows, ~65 KB), and per job (`remedy_stem`, e.g.
  "T128-d64-lam0-0.1") `<stem>_metrics.jsonl` (80 training rows and 81 probe rows of 5 runs
  over 4,000 steps: ~0.2 MB; 2.8 MB for the 14 jobs, against ~8 MB copied whole) and
  `<stem>_runs.jsonl` (5 rows, ~2 KB). A job whose two files are not there yet reads
  *pending*.

The remedies' baseline, the variant "defaults", is the defaults of those runs, with the
authors' penalty scale 1/sqrt(d_h); the layer's default became 1 on these rows and section 5's.
"""

import os

import numpy as np

from lab.grid import (REMEDY_CELLS, REMEDY_DIAGNOSTICS_EVERY, REMEDY_RATE,
                      REMEDY_VARIANTS, grid_jobs)
from lab.report import markdown
from lab.report.rows import name, read

FOLDER = "seed_failures_h200"
REMEDY_FOLDER = "seed_remedies_h200"
LR_COMMAND = ("python experiments/grid.py --grids=zoology --only=zoology-T64-d64-vla "
              "--seeds=0,1,2,3,4 --rates=3e-3,1e-2 --vla_impl=pallas "
              "--override=train.diagnostics_every=50 --workdir=OUT")
REMEDY_COMMAND = ("python experiments/grid.py --grids=seed_remedies --workdir=OUT --gpus=0 "
                  "--per_gpu=14 --vla_impl=pallas")
# (grid label, name in the section): VLA with the authors' penalty scale 1/sqrt(d_h), and 1.
LABELS = (("vla", name("vla")),
          ("vla_p1", name("vla_p1")))
# The seed_remedies grid's variants (`REMEDY_VARIANTS`) by name, and the learning-rate run's
# labels as the variants they equal. "defaults" has the authors' penalty scale; 1 is the
# layer's default now.
VARIANT_NAMES = {"defaults": "defaults (VLA-a)", "penalty-1": "penalty scale 1 (VLA)",
                 "lam0-0.1": "lam0 0.1", "lam0-10": "lam0 10", "u-identity": "W_u = I",
                 "warmup-1000": "warmup 1,000 steps", "readout-additive": "additive readout"}
LR_VARIANTS = {"vla": "defaults", "vla_p1": "penalty-1"}
# What a variant's setting means, where its override does not say it.
VARIANT_NOTES = {"u-identity": "W_u starts at I, so that u_t starts along the raw key"}
SOLVED = 0.9          # final test accuracy from which a run counts as solved
ESCAPED = 0.5         # training accuracy that marks leaving the plateau
PROBE_STEP = 300      # the diagnostics compared before any run has left the plateau
RUN_HEADER = ["seed", "test accuracy", "escape step", "cond(A_T) 0 / 1", "a . khat 0 / 1",
              "||S_T|| (layer 1)"]


def run_table(metrics, runs):
  """Per run (in `runs`' order): {seed, rate, accuracy, escape (first logged step with training
  accuracy > ESCAPED, or None), cond0/cond1 and align0/align1 (cond(A_T) and mean a . khat of
  layers 0 and 1 at PROBE_STEP), state1 (||S_T|| of layer 1 at the last probe)}; the probe
  values are None where `metrics` has no probe rows that far."""
  train = [r for r in metrics if "loss" in r]
  probes = [r for r in metrics if "diagnostics" in r]
  early = next((r["diagnostics"] for r in probes if r["step"] >= PROBE_STEP), None)
  last = probes[-1]["diagnostics"] if probes else None
  t_key = (max((k for k in early if k.startswith("layer0.cond_A.t")),
               key=lambda k: int(k.rsplit("t", 1)[1])) if early else None)
  at = lambda diag, key, i: diag[key][i] if diag and key in diag else None
  out = []
  for i, r in enumerate(runs):
    out.append({
        "seed": r["seed"], "rate": r["learning_rate"],
        "accuracy": r["test"]["mqar"]["accuracy"],
        "escape": next((t["step"] for t in train if t["accuracy"][i] > ESCAPED), None),
        "cond0": at(early, t_key, i),
        "cond1": at(early, t_key and t_key.replace("layer0", "layer1"), i),
        "align0": at(early, "layer0.align_mean", i), "align1": at(early, "layer1.align_mean", i),
        "state1": at(last, "layer1.state_norm_end", i),
        "u_grad0": train[0].get("layer0.grad.u_proj", [None] * len(runs))[i] if train else None})
  return out


def remedy_stem(job_name):
  """The file stem of a seed_remedies job ("seed_remedies-T64-d64-lam0-10" -> "T64-d64-lam0-10")."""
  return job_name.removeprefix("seed_remedies-")


def remedy_tables(folder):
  """{(T, d_model): {variant: run_table}} of the seed_remedies jobs whose files are in `folder`
  (cells and variants in the grid's order), and [job name] of those that are not (pending)."""
  tables, pending = {}, []
  for job in grid_jobs("seed_remedies"):
    cell = (job.tag["seq_len"], job.tag["d_model"])
    metrics = read(os.path.join(folder, f"{remedy_stem(job.name)}_metrics.jsonl"))
    runs = read(os.path.join(folder, f"{remedy_stem(job.name)}_runs.jsonl"))
    if metrics and runs:
      tables.setdefault(cell, {})[job.tag["label"]] = run_table(metrics, runs)
    else:
      pending.append(job.name)
  return tables, pending


def failed(rs):
  return [r for r in rs if r["accuracy"] < SOLVED]


def solved(rs):
  return [r for r in rs if r["accuracy"] >= SOLVED]


def median(rs, key):
  """The median of `key` over the runs that have it (None if none has)."""
  values = [r[key] for r in rs if r[key] is not None]
  return float(np.median(values)) if values else None


def summary(table):
  """One variant at one cell: {failed, runs, escape (median escape step of the runs that leave
  the plateau, None if none does), cond0, cond1, align0, align1 (medians over the runs)}."""
  escaped = [r for r in table if r["escape"] is not None]
  return {"failed": len(failed(table)), "runs": len(table),
          "escape": median(escaped, "escape"),
          **{key: median(table, key) for key in ("cond0", "cond1", "align0", "align1")}}


def summary_cells(table):
  """A variant's cells of the summary table: failed seeds, median escape step, median
  cond(A_T) and a . khat of layers 0 / 1 (`summary`)."""
  s = summary(table)
  return [f"{s['failed']} of {s['runs']}", "never" if s["escape"] is None else f"{s['escape']:g}",
          pair(s, "cond0", "cond1", ".1f"), pair(s, "align0", "align1", ".2f")]


def apart(a, b, key):
  """Whether the values of `key` over runs `a` and over runs `b` do not overlap (both given)."""
  a = [r[key] for r in a if r[key] is not None]
  b = [r[key] for r in b if r[key] is not None]
  return bool(a and b and (max(a) < min(b) or max(b) < min(a)))


def separated(table):
  """Whether cond(A_T) or a . khat of layer 0 at PROBE_STEP tells the failed runs of `table`
  from the solved ones (their ranges do not overlap)."""
  return apart(failed(table), solved(table), "cond0") or apart(failed(table), solved(table),
                                                                "align0")


def num(x, f=".1f"):
  return "n/a" if x is None else f"{x:{f}}"


def pair(r, a, b, f):
  return f"{num(r[a], f)} / {num(r[b], f)}"


def run_row(r):
  """A run's cells of RUN_HEADER."""
  return [r["seed"], f"{r['accuracy']:.3f}", r["escape"] if r["escape"] is not None else "never",
          pair(r, "cond0", "cond1", ".1f"), pair(r, "align0", "align1", ".2f"),
          num(r["state1"])]


def cell_name(cell):
  return f"T = {cell[0]}, d_model {cell[1]}"


def variant_name(label):
  return VARIANT_NAMES.get(label, label)


def remedy_names():
  """The variants of the seed_remedies grid other than the defaults, each with the setting it
  changes ("`lam0-10` (lam0 = 10.0)")."""
  out = []
  for label, extra in REMEDY_VARIANTS:
    changed = [f"{k.rsplit('.', 1)[-1]} = {v}" for k, v in extra.items()]
    if changed:
      note = f": {VARIANT_NOTES[label]}" if label in VARIANT_NOTES else ""
      out.append(f"`{label}` ({', '.join(changed)}{note})")
  return out


def lr_tables(folder):
  """{label: run_table} of the learning-rate run's files in `folder` ({} without them)."""
  tables = {}
  for key, _ in LABELS:
    metrics = read(os.path.join(folder, f"{key}_metrics.jsonl"))
    runs = read(os.path.join(folder, f"{key}_runs.jsonl"))
    if metrics and runs:
      tables[key] = run_table(metrics, runs)
  return tables


def cells_and_pairs():
  """[(T, d_model)] of the remedy cells and {(T, d_model): n_pairs}."""
  return ([(T, d) for T, _, d, _ in REMEDY_CELLS], {(T, d): n for T, n, d, _ in REMEDY_CELLS})


def setting_notes(rows_dir, every):
  """The bullets that say what the runs are (cells, variants, commands, columns)."""
  rate = float(REMEDY_RATE)
  cells, n_pairs = cells_and_pairs()
  sample = next(iter(read(os.path.join(rows_dir, REMEDY_FOLDER, "rows.jsonl"))), {})
  steps = f"{sample['steps']:,}" if "steps" in sample else "n/a"
  seeds = sorted({r["seed"] for r in every})
  return markdown.bullets([
      "Zoology's MQAR at " + markdown.listed(f"{cell_name(c)} ({n_pairs[c]} pairs)"
                                             for c in cells)
      + f", rate {rate:g}, {steps} steps, {markdown.plural(len(seeds), 'seed')} per variant, on "
      f"an H200 with training diagnostics every {REMEDY_DIAGNOSTICS_EVERY} steps.",
      "Variants, each one setting changed from the defaults of these runs (the authors' "
      "penalty scale 1 / sqrt(d_h), lam0 1, W_u random, readout none, 400 warmup steps): "
      + "; ".join(remedy_names()) + ".",
      f"Rows: `{REMEDY_COMMAND}` (`results/training/{REMEDY_FOLDER}/`); the learning rate: "
      f"`{LR_COMMAND}` (`results/training/{FOLDER}/`).",
      f"A run fails below test accuracy {SOLVED}; *escape*, the first logged step with training "
      f"accuracy above {ESCAPED}; cond(A_T) and a . khat of layers 0 / 1 at step {PROBE_STEP} "
      "(cond at the last token, median over heads; a . khat mean over tokens); ||S_T|| of "
      "layer 1 at the end; |grad W_u|: layer 0's W_u gradient norm at the first logged step."])


def seed_tables(rows_dir):
  """The full tables of section 9 (markdown blocks): failed seeds per variant and cell, every
  run of the remedies and of the learning-rate run, the W_u gradients."""
  rate = float(REMEDY_RATE)
  tables, pending = remedy_tables(os.path.join(rows_dir, REMEDY_FOLDER))
  lr = lr_tables(os.path.join(rows_dir, FOLDER))
  if not tables and not lr:
    return [f"No rows yet (`results/training/{FOLDER}/`, `results/training/{REMEDY_FOLDER}/`)."]
  cells, n_pairs = cells_and_pairs()
  labels = [v for v, _ in REMEDY_VARIANTS]
  got = lambda cell, v: tables.get(cell, {}).get(v)
  every = [r for t in tables.values() for table in t.values() for r in table]
  blocks = [setting_notes(rows_dir, every)]
  header = ["cell", "variant", "failed seeds", "median escape step", "median cond(A_T) 0 / 1",
            "median a . khat 0 / 1"]
  body = []
  for cell in cells:
    for v in labels:
      body.append([cell_name(cell), variant_name(v)]
                  + (summary_cells(got(cell, v)) if got(cell, v) else ["pending", "", "", ""]))
    if lr and (64, 64) == cell:
      body += [[cell_name(cell), f"{variant_name(LR_VARIANTS[k])}, rate {x:g}"]
               + summary_cells([r for r in t if r["rate"] == x])
               for k, t in lr.items() for x in sorted({r["rate"] for r in t}) if x != rate]
  blocks += [f"**Failed seeds per variant and cell**, rate {rate:g} unless named (medians over "
             "the variant's runs):", markdown.table(header, body)]
  grads = w_u_gradients(tables, cells)
  if grads:
    blocks += ["**|grad W_u| of layer 0 at the first logged step** (median over runs):",
               markdown.table(["cell", "escape steps, defaults", "defaults", "penalty-1"],
                              [[cell_name(c), ", ".join(map(str, esc)) or "none",
                                f"{g_d:.1e}", f"{g_p:.1e}"] for c, esc, g_d, g_p in grads])]
  if pending:
    blocks.append(markdown.bullets([f"Pending: {markdown.listed(f'`{j}`' for j in pending)}; "
                                    f"`{REMEDY_COMMAND}` runs them."]))
  for cell in cells:
    if cell not in tables:
      continue
    blocks.append(f"**{cell_name(cell)} ({n_pairs[cell]} pairs), per run**, rate {rate:g}:")
    blocks.append(markdown.table(["variant"] + RUN_HEADER, [
        [variant_name(v)] + run_row(r) for v in labels if got(cell, v)
        for r in sorted(got(cell, v), key=lambda r: r["seed"])]))
  if lr:
    blocks.append("**Learning rate, T = 64, d_model 64**, per run:")
    blocks.append(markdown.table(["variant", "rate"] + RUN_HEADER, [
        [name(k), f"{r['rate']:g}"] + run_row(r) for k, t in lr.items()
        for r in sorted(t, key=lambda r: (r["rate"], r["seed"]))]))
  return blocks


def w_u_gradients(tables, cells):
  """[(cell, the defaults' escape steps, median |grad W_u| of layer 0 at the first logged step
  with the defaults, the same with penalty scale 1)] at the cells with both variants."""
  med = lambda xs: float(np.median(xs)) if xs else float("nan")
  grad = lambda rs: med([r["u_grad0"] for r in rs if r["u_grad0"] is not None])
  return [(c, sorted(r["escape"] for r in tables[c]["defaults"] if r["escape"] is not None),
           grad(tables[c]["defaults"]), grad(tables[c]["penalty-1"]))
          for c in cells if {"defaults", "penalty-1"} <= set(tables.get(c, {}))]


def curve_panels(rows_dir, variants=("defaults", "penalty-1")):
  """{cell title: {variant name: (steps, loss [n, runs], |grad W_u| of layer 0 [n, runs],
  solved [runs])}} of the seed_remedies jobs on file (`plots.plot_seed_runs`)."""
  folder = os.path.join(rows_dir, REMEDY_FOLDER)
  panels = {}
  for job in grid_jobs("seed_remedies"):
    if job.tag["label"] not in variants:
      continue
    metrics = read(os.path.join(folder, f"{remedy_stem(job.name)}_metrics.jsonl"))
    runs = read(os.path.join(folder, f"{remedy_stem(job.name)}_runs.jsonl"))
    train = [r for r in metrics if "loss" in r and "layer0.grad.u_proj" in r]
    if not train or not runs:
      continue
    title = cell_name((job.tag["seq_len"], job.tag["d_model"]))
    panels.setdefault(title, {})[variant_name(job.tag["label"])] = (
        [r["step"] for r in train], [r["loss"] for r in train],
        [r["layer0.grad.u_proj"] for r in train],
        [r["test"]["mqar"]["accuracy"] >= SOLVED for r in runs])
  return panels
