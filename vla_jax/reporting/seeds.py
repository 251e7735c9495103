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
  counts = "; ".join(
      f"{names[k]} at rate {lr:g}: "
      f"{sum(r['accuracy'] < SOLVED for r in at_rate(k, lr))} of {len(at_rate(k, lr))} failed"
      for k in tables for lr in rates)
  escapes = {k: [r["escape"] for r in t if r["escape"] is not None] for k, t in tables.items()}
  span = lambda rs, key: (f"{min(r[key] for r in rs):.2f}-{max(r[key] for r in rs):.2f}"
                          if rs else "none")
  by_scale = []
  for key, text in LABELS:
    rs = tables.get(key, [])
    fail = [r for r in rs if r["accuracy"] < SOLVED]
    solve = [r for r in rs if r["accuracy"] >= SOLVED]
    if rs:
      by_scale.append(f"{text}: a . khat {span(fail, 'align0')} failing against "
                      f"{span(solve, 'align0')} solving, cond(A_T) {span(fail, 'cond0')} "
                      f"against {span(solve, 'cond0')}")
  finding = (
      "**Finding.** A failed VLA seed is a run that has not left the plateau every run "
      "reaches first (training accuracy ~0.25); the penalty's conditioning and the write "
      f"direction's alignment a . khat at step {PROBE_STEP} do not tell it from a seed that "
      "solves, and at rate 0.01, above the grid's sweep, every seed of both penalty scales "
      f"solves the cell ({counts}).")
  setting = (
      f"Zoology's MQAR at T = {some.get('seq_len', 'n/a')}, {some.get('n_pairs', 'n/a')} pairs, "
      f"d_model {some.get('d_model', 'n/a')} ({some.get('steps', 'n/a')} steps, 5 seeds; the "
      "cell whose seeds split 0.252 / 0.970 / 0.252 in section 5), rerun on an H200 with "
      "`python experiments/grid.py --grids=zoology --only=zoology-T64-d64-vla --seeds=0,1,2,3,4 "
      "--rates=3e-3,1e-2 --vla_impl=pallas --override=train.diagnostics_every=50 "
      "--workdir=OUT` (`results/training/" + FOLDER + "/`). Escape: the first logged step "
      f"with training accuracy above {ESCAPED}; cond and a . khat: layers 0 / 1 at step "
      f"{PROBE_STEP} (cond(A_T) at the last token, median over heads; a . khat mean over "
      "tokens); ||S_T||: layer 1 at the end.")
  header = ["variant", "rate", "seed", "test accuracy", "escape step", "cond(A_T) 0 / 1",
            "a . khat 0 / 1", "||S_T|| (layer 1)"]
  body = []
  for key, text in LABELS:
    for r in sorted(tables.get(key, []), key=lambda r: (r["rate"], r["seed"])):
      body.append([text, f"{r['rate']:g}", r["seed"], f"{r['accuracy']:.3f}",
                   r["escape"] if r["escape"] is not None else "never",
                   f"{r['cond0']:.1f} / {r['cond1']:.1f}",
                   f"{r['align0']:.2f} / {r['align1']:.2f}", f"{r['state1']:.1f}"])
  notes = markdown.bullets([
      "Failed runs end at the plateau's accuracy; solved runs leave it at steps "
      + ", ".join(f"{min(v)}-{max(v)} ({names[k]})"
                  for k, v in escapes.items() if v) + f" of {some.get('steps', 'n/a')}.",
      f"Layer 0 at step {PROBE_STEP}, per scale: " + "; ".join(by_scale) + ". The scales "
      "differ (the authors' scale leaves the penalty nearly idle: cond ~3, a . khat ~0.95, "
      "close to DeltaNet), failing and solving seeds of one scale do not.",
      "Penalty scale 1 leaves the plateau sooner at each rate, and a higher rate sooner "
      "still; the cosine schedule lowers the rate as training goes on.",
      "The remedy measured here is the learning rate (0.01); the grid's other cells, the "
      "T = 512 cells and the other remedies (lam0, u initialisation, warmup, readout) are not "
      "yet run with diagnostics; the layer's defaults are unchanged.",
  ])
  blocks = [title, finding, setting, markdown.table(header, body), notes]
  if plot_rel:
    blocks.append(f"![training diagnostics per run]({plot_rel})")
  return blocks
