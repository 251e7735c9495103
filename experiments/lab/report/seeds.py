r"""RESULTS.md section 9: why VLA seeds fail, and the remedies tried, from zoology cells rerun
with training diagnostics.

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
authors' penalty scale 1/sqrt(d_h); the layer's default became 1 on these rows and section 5's
(`default_reason` says why).
"""

import math
import os

import numpy as np

from lab.grid import (REMEDY_CELLS, REMEDY_DIAGNOSTICS_EVERY, REMEDY_RATE,
                      REMEDY_VARIANTS, grid_jobs)
from lab.report import markdown
from lab.report.rows import AUTHORS_FLAG, name, read

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
VARIANT_NAMES = {"defaults": "defaults (authors' penalty 1/sqrt(d_h))",
                 "penalty-1": "penalty scale 1, now the default",
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


def default_reason(tables, zoology=None):
  """Why penalty scale 1 is the layer's default, from the remedies' `tables` (failed seeds of
  "penalty-1" against "defaults", the authors' scale, over the cells both ran) and `zoology`
  (section 5's summary {(label, (T, d_model)): cell}; its "vla_p1" against "vla" at each
  setting): (a clause for the finding, a bullet); ("", bullet) without rows to compare."""
  cells = [c for c in tables if "penalty-1" in tables[c] and "defaults" in tables[c]]
  count = lambda v: (sum(len(failed(tables[c][v])) for c in cells),
                     sum(len(tables[c][v]) for c in cells))
  bullet = ("The layer's penalty scale defaults to 1 (`DEFAULT_PENALTY_SCALE`, "
            "`vla_jax/layers/vla.py`); the authors' 1/sqrt(d_h) stays available: "
            f"`penalty_scale=None` in the layer, `{AUTHORS_FLAG}` (d_h = 32) on the command line, "
            "label `vla` in sections 3 to 6 and variant `defaults` in sections 7 and 9.")
  if not cells:
    return "", bullet
  (f1, n1), (fd, nd) = count("penalty-1"), count("defaults")
  both = "both cells" if len(cells) == 2 else markdown.listed(cell_name(c) for c in cells)
  text = ("penalty scale 1 became the layer's default as it fails fewer seeds"
          if f1 < fd else "penalty scale 1 is the layer's default, and here it fails seeds")
  text += f" over {both} ({f1} of {n1} against {fd} of {nd} with the authors' 1/sqrt(d_h))"
  settings = sorted(st for (m, st) in (zoology or {}) if m == "vla"
                    and ("vla_p1", st) in zoology)
  if settings:
    gap = {st: float(zoology[("vla_p1", st)]["test"].mean() - zoology[("vla", st)]["test"].mean())
           for st in settings}
    worst = min(gap.values())
    ahead = sum(g > 0.01 for g in gap.values())
    text += (" and in section 5 is " + (f"at most {-worst:.3f} behind" if worst < 0 else
                                         "never behind")
             + f" the authors' scale at any of the {len(settings)} zoology settings (ahead by "
             f"more than 0.01 at {ahead})")
  return text, bullet


def seed_section(rows_dir, plot_rel=None, zoology=None, remedy_plot_rel=None):
  """The section's markdown blocks (a "pending" line where a folder's files are missing);
  `zoology`: section 5's summary, for the reason of the default penalty scale
  (`default_reason`)."""
  title = "## 9. Why VLA seeds fail"
  lr = _lr_part(os.path.join(rows_dir, FOLDER))
  tables, pending = remedy_tables(os.path.join(rows_dir, REMEDY_FOLDER))
  remedy_pending = (f"Remedies ({markdown.listed(variant_name(v) for v, _ in REMEDY_VARIANTS[1:])}"
                    f" at {markdown.listed(cell_name((T, d)) for T, _, d, _ in REMEDY_CELLS)}"
                    f", rate {float(REMEDY_RATE):g}): pending: `{REMEDY_COMMAND}` (rows to "
                    f"`results/training/{REMEDY_FOLDER}/`).")
  lr_pending = (f"Learning rate (T = 64, d_model 64, rates 0.003 and 0.01): pending: "
                f"`{LR_COMMAND}` (rows to `results/training/{FOLDER}/`).")
  if not tables and lr is None:
    return [title, f"No rows yet (`results/training/{FOLDER}/`, "
            f"`results/training/{REMEDY_FOLDER}/`).", markdown.bullets([lr_pending,
                                                                       remedy_pending])]
  if not tables:
    blocks = [title, lr["finding"], lr["setting"], lr["table"], lr["notes"], remedy_pending]
  else:
    remedy = _remedy_part(tables, pending, lr, rows_dir, zoology)
    blocks = [title, remedy["finding"], remedy["setting"], *remedy["tables"][:3]]
    if remedy_plot_rel:
      blocks.append(f"![loss and W_u gradient per run, failed and solved seeds]({remedy_plot_rel})")
    blocks += remedy["tables"][3:]
    blocks += ([f"**Learning rate, {cell_name(lr['cell'])}, rates "
                f"{markdown.listed(f'{x:g}' for x in lr['rates'])}**, "
                f"{markdown.listed(text for _, text in LABELS)}, per run:",
                lr["table"], lr["notes"]] if lr else [lr_pending])
  if plot_rel and lr:
    blocks.append(f"![training diagnostics per run]({plot_rel})")
  return blocks


def _lr_part(folder):
  """The learning-rate run's blocks and numbers (None without its files)."""
  tables = {}
  for key, _ in LABELS:
    metrics = read(os.path.join(folder, f"{key}_metrics.jsonl"))
    runs = read(os.path.join(folder, f"{key}_runs.jsonl"))
    if metrics and runs:
      tables[key] = run_table(metrics, runs)
  if not tables:
    return None
  some = next(iter(read(os.path.join(folder, "rows.jsonl"))), {})
  rates = sorted({r["rate"] for t in tables.values() for r in t})
  names = dict(LABELS)
  at_rate = lambda k, lr: [r for r in tables[k] if r["rate"] == lr]
  every = [r for t in tables.values() for r in t]
  def span(rs, key, f=".2f"):
    values = [r[key] for r in rs if r[key] is not None]
    return f"{min(values):{f}}-{max(values):{f}}" if values else "none"

  separate = [names[k] for k, t in tables.items() if separated(t)]
  n_pairs = some.get("n_pairs")
  first = (
      "**Finding.** A failed VLA seed is a run that never leaves the plateau every run starts "
      f"on (failed runs end at test accuracy {span(failed(every), 'accuracy', '.3f')}"
      + (f", chance 1 / n_pairs = {1 / n_pairs:.2f}" if n_pairs else "") + "), and at step "
      f"{PROBE_STEP} the penalty's conditioning cond(A_T) and the write direction's alignment "
      "a . khat " + ("do not tell it from a seed that solves (their ranges overlap for each "
                     "penalty scale)." if not separate else
                     f"set it apart from a seed that solves for {markdown.listed(separate)}."))
  counts = "; ".join(
      f"{names[k]}: " + ", ".join(f"{len(failed(at_rate(k, lr)))} of {len(at_rate(k, lr))} at "
                                  f"rate {lr:g}" for lr in rates if at_rate(k, lr))
      for k in tables)
  clean = [lr for lr in rates if all(not failed(at_rate(k, lr)) for k in tables)]
  second = (f"Failed seeds: {counts}; " + (
      f"at rate {markdown.listed(f'{lr:g}' for lr in clean)} every seed of "
      f"{'both penalty scales' if len(tables) > 1 else names[next(iter(tables))]} solves the "
      "cell." if clean else "no rate tried solves the cell with every seed."))
  seeds = sorted({r["seed"] for r in every})
  steps = f"{some['steps']:,}" if "steps" in some else "n/a"
  setting = markdown.bullets([
      f"Zoology's MQAR at T = {some.get('seq_len', 'n/a')}, {n_pairs or 'n/a'} pairs, d_model "
      f"{some.get('d_model', 'n/a')}, {steps} steps, "
      f"{markdown.plural(len(seeds), 'seed')} per rate: a cell whose VLA seeds split in "
      "section 5, rerun on an H200 with training diagnostics.",
      f"Rows: `{LR_COMMAND}` (`results/training/{FOLDER}/`).",
      f"Columns: *escape*, the first logged step with training accuracy above {ESCAPED}; "
      f"cond(A_T) and a . khat of layers 0 / 1 at step {PROBE_STEP} (cond at the last token, "
      "median over heads; a . khat mean over tokens); ||S_T|| of layer 1 at the end."])
  header = ["variant", "rate"] + RUN_HEADER
  body = []
  for key, text in LABELS:
    for r in sorted(tables.get(key, []), key=lambda r: (r["rate"], r["seed"])):
      body.append([text, f"{r['rate']:g}"] + run_row(r))
  escapes = {(k, lr): sorted(r["escape"] for r in at_rate(k, lr) if r["escape"] is not None)
             for k in tables for lr in rates}
  med = {key: float(np.median(v)) if v else None for key, v in escapes.items()}
  by_scale = [f"{names[k]}: a . khat {span(failed(t), 'align0')} failing against "
              f"{span(solved(t), 'align0')} solving, cond(A_T) {span(failed(t), 'cond0')} "
              f"against {span(solved(t), 'cond0')}" for k, t in tables.items()]
  quiet = [f"{names[k]} median cond(A_T) {num(median(t, 'cond0'))}, "
           f"a . khat {num(median(t, 'align0'), '.2f')}" for k, t in tables.items()]
  keys = list(tables)
  sooner = (len(keys) == 2 and all(med[(keys[1], lr)] is not None and med[(keys[0], lr)]
                                   is not None and med[(keys[1], lr)] < med[(keys[0], lr)]
                                   for lr in rates))
  faster = all(med[(k, a)] is None or med[(k, b)] is None or med[(k, b)] < med[(k, a)]
               for k in keys for a, b in zip(rates, rates[1:]))
  notes = markdown.bullets([
      "Median escape step of the runs that leave the plateau: " + "; ".join(
          f"{names[k]} " + ", ".join(f"{med[(k, lr)]:g} at rate {lr:g}" for lr in rates
                                     if med[(k, lr)] is not None) for k in keys)
      + f" (of {steps} steps)"
      + (f"; {names[keys[1]]} leaves it sooner at each rate" if sooner else "")
      + ("; a higher rate sooner still (the cosine schedule lowers the rate as training goes "
         "on)" if faster and len(rates) > 1 else "") + ".",
      f"Layer 0 at step {PROBE_STEP}, per scale: " + "; ".join(by_scale) + ".",
      ("The scales differ where failing and solving seeds of one scale do not ("
       + "; ".join(quiet) + "; a . khat = 1 is DeltaNet's write direction).")
      if len(tables) > 1 and not separate else "",
      (f"Rate {markdown.listed(f'{lr:g}' for lr in clean)} solves every seed here (the "
       "learning-rate remedy, measured at this cell only); the T = 512 cells are not yet run "
       "with diagnostics.") if clean else "No rate tried here solves every seed.",
  ])
  cell = (some.get("seq_len"), some.get("d_model"))
  lr_rows = {(LR_VARIANTS.get(k, k), lr): at_rate(k, lr) for k in tables for lr in rates}
  return {"finding": first + " " + second, "setting": setting,
          "table": markdown.table(header, body), "notes": notes, "cell": cell, "rates": rates,
          "clean": clean, "rows": lr_rows, "runs": every}


def _remedy_part(tables, pending, lr, rows_dir, zoology=None):
  """The remedies' finding, setting, tables and notes."""
  rate = float(REMEDY_RATE)
  reason = default_reason(tables, zoology)
  cells = [(T, d) for T, _, d, _ in REMEDY_CELLS]
  n_pairs = {(T, d): n for T, n, d, _ in REMEDY_CELLS}
  labels = [v for v, _ in REMEDY_VARIANTS]
  got = lambda cell, v: tables.get(cell, {}).get(v)
  every = [r for t in tables.values() for table in t.values() for r in table]
  lost = failed(every)
  stuck = [r for r in lost if r["escape"] is None]
  groups = [(cell, v) for cell in cells for v in labels if got(cell, v)]
  separate = [f"{variant_name(v)} at T = {cell[0]}" for cell, v in groups
              if separated(got(cell, v))]

  mixed = [(cell, v) for cell, v in groups
           if failed(got(cell, v)) and solved(got(cell, v))]
  defaults = [got(cell, "defaults") for cell in cells if got(cell, "defaults")]
  if lost and not mixed:
    probes = ("no variant and cell has both failing and solving seeds to compare at step "
              f"{PROBE_STEP}.")
  elif lost:
    probes = (f"at step {PROBE_STEP} cond(A_T) and a . khat " + (
        "do not tell a failing seed from a solving one (their ranges overlap in each of "
        f"the {len(mixed)} variants and cells with both)." if not separate else
        f"set the failing seeds apart in {len(separate)} of the {len(mixed)} variants and "
        f"cells with both ({markdown.listed(separate)})."))
  else:
    probes = ""
  if lost:
    grads = [g_p / g_d for _, _, g_d, g_p in w_u_gradients(tables, cells) if g_d > 0]
    lo_hi = sorted({f"{x:.0f}" for x in (min(grads), max(grads))}, key=float) if grads else []
    fd, nd = sum(len(failed(rs)) for rs in defaults), sum(len(rs) for rs in defaults)
    first = (f"A failed seed never leaves the plateau that every run starts on ({len(stuck)} of "
             f"the {len(lost)} failed runs, every variant"
             + (f"; the authors' setting fails {fd} of {nd} seeds at rate {rate:g}"
                if defaults else "") + ")" + (
                 ": with the authors' penalty scale 1/sqrt(d_h) the penalty stays close to the "
                 f"identity, W_u gets {'-'.join(lo_hi)}x less gradient than with penalty scale "
                 "1, and the seeds that leave do so late" if lo_hi else "") + ".")
  else:
    first = f"Of the {len(every)} runs of every variant, none fails."
  def compared(v):
    """[(cell, failed with v, runs, failed with the defaults)] at the cells both have."""
    return [(cell, len(failed(got(cell, v))), len(got(cell, v)),
             len(failed(got(cell, "defaults")))) for cell in cells
            if got(cell, v) and got(cell, "defaults")]

  others = [v for v in labels[1:] if compared(v)]
  everywhere = [v for v in others if len(compared(v)) == len(cells)
                and all(f < d for _, f, _, d in compared(v))]
  fewer = [v for v in others if v not in everywhere
           and sum(f for _, f, _, _ in compared(v)) < sum(d for _, _, _, d in compared(v))]
  counts = lambda v: ", ".join(f"{f} of {n}" for _, f, n, _ in compared(v))
  if reason[0]:
    second = reason[0][0].upper() + reason[0][1:]
    if [v for v in everywhere if v != "penalty-1"]:
      second += ("; fewer seeds fail than with the authors' setting at every cell with "
                 + markdown.listed(f"{variant_name(v)} ({counts(v)})"
                                   for v in everywhere if v != "penalty-1"))
  elif everywhere:
    second = ("Fewer seeds fail than with those defaults at every cell with "
              + markdown.listed(f"{variant_name(v)} ({counts(v)})" for v in everywhere))
  elif others:
    second = ("No variant fails fewer seeds than those defaults at every cell" + (
        f" ({markdown.listed(f'{variant_name(v)} ({counts(v)})' for v in fewer)} fewer over "
        "the cells run)" if fewer else ""))
  else:
    second = "No variant other than the defaults is in yet"
  if lr and lr["clean"] and lr["cell"] in cells:
    second += (f"; rate {markdown.listed(f'{x:g}' for x in lr['clean'])} makes every seed "
               f"solve at {cell_name(lr['cell'])} (the learning-rate run)")
  if pending:
    second += f"; {len(pending)} of {len(pending) + len(groups)} jobs pending"
  second += "."

  sample = next(iter(read(os.path.join(rows_dir, REMEDY_FOLDER, "rows.jsonl"))), {})
  steps = f"{sample['steps']:,}" if "steps" in sample else "n/a"
  seeds = sorted({r["seed"] for r in every})
  setting = markdown.bullets([
      "Zoology's MQAR at " + markdown.listed(f"{cell_name(c)} ({n_pairs[c]} pairs)"
                                             for c in cells)
      + f", rate {rate:g} (the cells and rate at which VLA's seeds split in section 5), "
      f"{steps} steps, {markdown.plural(len(seeds), 'seed')} per variant, on an H200 with "
      f"training diagnostics every {REMEDY_DIAGNOSTICS_EVERY} steps.",
      "Variants, each one setting changed from the defaults of these runs (the authors' "
      "penalty scale 1 / sqrt(d_h), lam0 1, W_u random, readout none, 400 warmup steps; the "
      "grid pins that scale now that the layer's default is 1): "
      + "; ".join(remedy_names()) + ".",
      f"Rows: `{REMEDY_COMMAND}` (`results/training/{REMEDY_FOLDER}/`); the learning rate: "
      f"`{LR_COMMAND}` (`results/training/{FOLDER}/`).",
      f"A run fails below test accuracy {SOLVED}; *escape*, the first logged step with training "
      f"accuracy above {ESCAPED}; cond(A_T) and a . khat of layers 0 / 1 at step {PROBE_STEP} "
      "(cond at the last token, median over heads; a . khat mean over tokens); ||S_T|| of "
      "layer 1 at the end."])

  header = ["cell", "variant", "failed seeds", "median escape step", "median cond(A_T) 0 / 1",
            "median a . khat 0 / 1"]
  body = []
  for cell in cells:
    for v in labels:
      body.append([cell_name(cell), variant_name(v)]
                  + (summary_cells(got(cell, v)) if got(cell, v) else ["pending", "", "", ""]))
    if lr and lr["cell"] == cell:
      body += [[cell_name(cell), f"{variant_name(v)}, rate {x:g}"] + summary_cells(rs)
               for (v, x), rs in lr["rows"].items() if x != rate and rs]
  blocks = [f"**Failed seeds per variant and cell**, rate {rate:g} unless named (medians over "
            "the variant's runs):", markdown.table(header, body)]
  totals = [f"{variant_name(v)}: {sum(len(failed(got(c, v))) for c in cells if got(c, v))} of "
            f"{sum(len(got(c, v)) for c in cells if got(c, v))}"
            for v in labels if any(got(c, v) for c in cells)]
  # Two measures, each apart by chance with probability 2 / C(n, f): at most twice that.
  by_chance = sum(min(1.0, 4 / math.comb(len(got(c, v)), len(failed(got(c, v)))))
                  for c, v in mixed)
  blocks.append(markdown.bullets([
      "Failed seeds over the cells run: " + "; ".join(totals) + ".",
      (f"Pending: {markdown.listed(f'`{j}`' for j in pending)}; `{REMEDY_COMMAND}` runs them "
       "(a finished job is skipped).") if pending else "",
      ("Probes: " + probes + (
          " By chance alone (the failed runs a random subset of a variant's runs) a measure "
          "puts the failed runs' range apart from the solved ones' with probability 2 / C(n, f) "
          f"(n runs, f failed; 0.2 for 2 of 5): at most {by_chance:.1f} of the {len(mixed)} "
          "variants and cells with both would show it on cond(A_T) or a . khat."
          if mixed else "")) if probes else "",
      cause(tables, cells),
      reason[1]]))
  for cell in cells:
    if cell not in tables:
      continue
    blocks.append(f"**{cell_name(cell)} ({n_pairs[cell]} pairs), per run**, rate {rate:g}:")
    blocks.append(markdown.table(["variant"] + RUN_HEADER, [
        [variant_name(v)] + run_row(r) for v in labels if got(cell, v)
        for r in sorted(got(cell, v), key=lambda r: r["seed"])]))
  return {"finding": f"**Finding.** {first} {second}", "setting": setting, "tables": blocks}


def w_u_gradients(tables, cells):
  """[(cell, the defaults' escape steps, median |grad W_u| of layer 0 at the first logged step
  with the defaults, the same with penalty scale 1)] at the cells with both variants."""
  med = lambda xs: float(np.median(xs)) if xs else float("nan")
  grad = lambda rs: med([r["u_grad0"] for r in rs if r["u_grad0"] is not None])
  return [(c, sorted(r["escape"] for r in tables[c]["defaults"] if r["escape"] is not None),
           grad(tables[c]["defaults"]), grad(tables[c]["penalty-1"]))
          for c in cells if {"defaults", "penalty-1"} <= set(tables.get(c, {}))]


def cause(tables, cells):
  """The note that states the cause: every run starts on one plateau and they differ in when
  they leave it; the escapes at the remedy rate come late under the decaying schedule; penalty
  scale 1 gives W_u a larger gradient and leaves sooner. "" without both variants."""
  parts = [f"{cell_name(c)}: the defaults' escapes at steps "
           f"{markdown.listed(str(x) for x in esc) if esc else 'none'}, |grad W_u| of layer 0 at "
           f"the first logged step {g_d:.1e} against {g_p:.1e} with penalty scale 1 "
           f"({g_p / g_d:.0f}x)" if g_d > 0 else f"{cell_name(c)}: n/a"
           for c, esc, g_d, g_p in w_u_gradients(tables, cells)]
  if not parts:
    return ""
  return (f"Cause: the failed and the solved seeds of a setting train alike early (the probes "
          f"at step {PROBE_STEP} no further apart than chance; the loss curves in the plot) and "
          f"differ in when they leave the plateau. At rate {float(REMEDY_RATE):g} the escapes "
          "come late, when the cosine schedule has lowered the rate, and a run that has not "
          "left by then stays (at rate 0.01 every seed leaves early: the learning-rate run "
          "below). With the authors' penalty scale the penalty is close to the identity "
          "(cond(A_T) ~3, a ~ khat: DeltaNet's write) and W_u, the penalty's own projection, "
          "gets almost no gradient; penalty scale 1 makes the penalty matter and its runs leave "
          "sooner: " + "; ".join(parts) + ".")


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
