"""RESULTS.md section 9: why VLA seeds fail, from a grid cell rerun with training diagnostics.

The rows are one zoology cell's sweeps (`experiments/grid.py ... --override=
train.diagnostics_every=50`), one per VLA label, with each sweep's metrics.jsonl (training rows
and probe rows with lists over its runs) and its per-run results (sweep_results.jsonl, in the
runs' order), saved as `<label>_metrics.jsonl` and `<label>_runs.jsonl`.
"""

import os

import numpy as np

from vla_jax.reporting import markdown
from vla_jax.reporting.rows import read

FOLDER = "seed_failures_h200"
# (grid label, name in the section): VLA with the authors' penalty scale 1/sqrt(d_h), and 1.
LABELS = (("vla", "VLA"),
          ("vla_p1", "VLA, penalty scale 1"))
SOLVED = 0.9          # final test accuracy from which a run counts as solved
ESCAPED = 0.5         # training accuracy that marks leaving the plateau
PROBE_STEP = 300      # the diagnostics compared before any run has left the plateau


def run_table(metrics, runs):
  """Per run (in `runs`' order): {seed, rate, accuracy, escape (first logged step with training
  accuracy > ESCAPED, or None), cond0/cond1 and align0/align1 (cond(A_T) and mean a . khat of
  layers 0 and 1 at PROBE_STEP), state1 (||S_T|| of layer 1 at the last probe)}."""
  train = [r for r in metrics if "loss" in r]
  probes = [r for r in metrics if "diagnostics" in r]
  early = next(r for r in probes if r["step"] >= PROBE_STEP)["diagnostics"]
  last = probes[-1]["diagnostics"]
  t_key = max((k for k in early if k.startswith("layer0.cond_A.t")),
              key=lambda k: int(k.rsplit("t", 1)[1]))
  out = []
  for i, r in enumerate(runs):
    out.append({
        "seed": r["seed"], "rate": r["learning_rate"],
        "accuracy": r["test"]["mqar"]["accuracy"],
        "escape": next((t["step"] for t in train if t["accuracy"][i] > ESCAPED), None),
        "cond0": early[t_key][i], "cond1": early[t_key.replace("layer0", "layer1")][i],
        "align0": early["layer0.align_mean"][i], "align1": early["layer1.align_mean"][i],
        "state1": last["layer1.state_norm_end"][i]})
  return out


def seed_section(rows_dir, plot_rel=None):
  """The section's markdown blocks ([] parts say so when the files are missing)."""
  folder = os.path.join(rows_dir, FOLDER)
  title = "## 9. Why VLA seeds fail"
  tables = {}
  for key, _ in LABELS:
    metrics = read(os.path.join(folder, f"{key}_metrics.jsonl"))
    runs = read(os.path.join(folder, f"{key}_runs.jsonl"))
    if metrics and runs:
      tables[key] = run_table(metrics, runs)
  if not tables:
    return [title, f"No rows yet (`results/training/{FOLDER}/`)."]
  some = next(iter(read(os.path.join(folder, "rows.jsonl"))), {})
  rates = sorted({r["rate"] for t in tables.values() for r in t})
  names = dict(LABELS)
  at_rate = lambda k, lr: [r for r in tables[k] if r["rate"] == lr]
  failed = lambda rs: [r for r in rs if r["accuracy"] < SOLVED]
  solved = lambda rs: [r for r in rs if r["accuracy"] >= SOLVED]
  every = [r for t in tables.values() for r in t]
  span = lambda rs, key, f=".2f": (f"{min(r[key] for r in rs):{f}}-{max(r[key] for r in rs):{f}}"
                                   if rs else "none")
  apart = lambda a, b, key: (a and b and (max(r[key] for r in a) < min(r[key] for r in b)
                                          or max(r[key] for r in b) < min(r[key] for r in a)))
  separate = [names[k] for k, t in tables.items()
              if apart(failed(t), solved(t), "cond0") or apart(failed(t), solved(t), "align0")]
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
      "Rows: `python experiments/grid.py --grids=zoology --only=zoology-T64-d64-vla "
      "--seeds=0,1,2,3,4 --rates=3e-3,1e-2 --vla_impl=pallas "
      "--override=train.diagnostics_every=50 --workdir=OUT` (`results/training/" + FOLDER
      + "/`).",
      f"Columns: *escape*, the first logged step with training accuracy above {ESCAPED}; "
      f"cond(A_T) and a . khat of layers 0 / 1 at step {PROBE_STEP} (cond at the last token, "
      "median over heads; a . khat mean over tokens); ||S_T|| of layer 1 at the end."])
  header = ["variant", "rate", "seed", "test accuracy", "escape step", "cond(A_T) 0 / 1",
            "a . khat 0 / 1", "||S_T|| (layer 1)"]
  body = []
  for key, text in LABELS:
    for r in sorted(tables.get(key, []), key=lambda r: (r["rate"], r["seed"])):
      body.append([text, f"{r['rate']:g}", r["seed"], f"{r['accuracy']:.3f}",
                   r["escape"] if r["escape"] is not None else "never",
                   f"{r['cond0']:.1f} / {r['cond1']:.1f}",
                   f"{r['align0']:.2f} / {r['align1']:.2f}", f"{r['state1']:.1f}"])
  escapes = {(k, lr): sorted(r["escape"] for r in at_rate(k, lr) if r["escape"] is not None)
             for k in tables for lr in rates}
  med = {key: float(np.median(v)) if v else None for key, v in escapes.items()}
  by_scale = [f"{names[k]}: a . khat {span(failed(t), 'align0')} failing against "
              f"{span(solved(t), 'align0')} solving, cond(A_T) {span(failed(t), 'cond0')} "
              f"against {span(solved(t), 'cond0')}" for k, t in tables.items()]
  quiet = [f"{names[k]} median cond(A_T) {float(np.median([r['cond0'] for r in t])):.1f}, "
           f"a . khat {float(np.median([r['align0'] for r in t])):.2f}"
           for k, t in tables.items()]
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
      (f"The remedy measured here is the learning rate "
       f"({markdown.listed(f'{lr:g}' for lr in clean)}); the grid's other cells, the T = 512 "
       "cells and the other remedies (lam0, u initialisation, warmup, readout) are not yet run "
       "with diagnostics; the layer's defaults are unchanged.") if clean else
      "No remedy is measured here yet; the layer's defaults are unchanged.",
  ])
  blocks = [title, first + " " + second, setting, markdown.table(header, body), notes]
  if plot_rel:
    blocks.append(f"![training diagnostics per run]({plot_rel})")
  return blocks
