"""RESULTS.md's language-modelling section: the rows of `experiments/text_study.py` (one sweep
row a run, its test and validation sets scored in bits per byte at the training length T and
at 4T and 16T) and each job's logged training curve, as a table per mixer (its figure: `lab.report.plots.plot_text`).

Files, under results/training/: `text_study_<card>.jsonl` (the study's rows) and
`text_runs/<job>.jsonl` (the job's metrics.jsonl, the curve and tokens/s).
"""

import glob
import math
import os

import numpy as np

from lab.report import markdown
from vla_jax.training import jsonl

ROWS_GLOB = "text_study_*.jsonl"
RUNS_FOLDER = "text_runs"
# The study's mixers in table order, with their display names (softmax with rotary
# positions; VLA-a: VLA with the authors' penalty scale 1 / sqrt(d_h)).
LABELS = (("softmax_rope", "softmax + RoPE"), ("linear", "linear"), ("deltanet", "DeltaNet"),
          ("gated_deltanet", "GDN"), ("vla", "VLA"), ("vla_authors", "VLA-a"))
VALIDATION_LENGTH = 1024


def rows_file(rows_dir):
  """The study's rows file under rows_dir (the newest by name), or None."""
  paths = sorted(glob.glob(os.path.join(rows_dir, ROWS_GLOB)))
  return paths[-1] if paths else None


def _bpb(scores, length):
  value = (scores or {}).get(f"text_T{length}", {}).get("bits_per_byte")
  return value if value is not None and math.isfinite(value) else None


def lengths(rows):
  """The evaluation lengths the rows were scored at, ascending."""
  found = {int(k.split("_T")[1]) for r in rows for k in (r.get("test") or {}) if "_T" in k}
  return tuple(sorted(found))


def summary(rows):
  """[{label, name, rates, rate, seeds, test: {L: (mean, std)}, by_position: [...],
  diverged}] per mixer with rows, in LABELS order: the rate with the lowest validation bits
  per byte at T (over the rates tried; a diverged run scores none) and its runs' test bits
  per byte."""
  out = []
  Ls = lengths(rows)
  for label, display in LABELS:
    mine = [r for r in rows if r.get("label") == label]
    if not mine:
      continue
    by_rate = {}
    for r in mine:
      by_rate.setdefault(float(r["learning_rate"]), []).append(r)
    score = {lr: np.mean([_bpb(r.get("validation"), VALIDATION_LENGTH) for r in rs])
             for lr, rs in by_rate.items()
             if all(_bpb(r.get("validation"), VALIDATION_LENGTH) is not None for r in rs)}
    entry = {"label": label, "name": display, "rates": sorted(by_rate),
             "diverged": sum(bool(r.get("diverged")) for r in mine)}
    if not score:
      out.append({**entry, "rate": None, "seeds": [], "test": {}, "by_position": None})
      continue
    rate = min(score, key=score.get)
    runs = by_rate[rate]
    test = {}
    for L in Ls:
      vals = [_bpb(r.get("test"), L) for r in runs]
      vals = [v for v in vals if v is not None]
      if vals:
        test[L] = (float(np.mean(vals)), float(np.std(vals)) if len(vals) > 1 else None)
    pos = [r["test"][f"text_T{Ls[0]}"].get("bits_per_byte_by_position") for r in runs
           if f"text_T{Ls[0]}" in (r.get("test") or {})]
    pos = [p for p in pos if p]
    out.append({**entry, "rate": rate, "seeds": sorted(r["seed"] for r in runs), "test": test,
                "by_position": np.mean(pos, axis=0).tolist() if pos else None})
  return out


def curves(runs_dir):
  """{label: (steps, bits per byte of the training loss, tokens/s per run)} from each job's
  metrics (a rate job's runs train together: its first run's curve, its tokens/s divided by
  its runs); a mixer's seed job before its rate job; the runs past an edge of the rates
  (`text-<label>-rates-lr<rate>`) not at all."""
  out = {}
  for path in sorted(glob.glob(os.path.join(runs_dir, "text-*.jsonl")), reverse=True):
    label, *phase = os.path.basename(path)[len("text-"):-len(".jsonl")].split("-")
    rows = [r for r in jsonl.read_rows(path) if "loss" in r and "step" in r]
    if not rows or label in out or phase not in (["seeds"], ["rates"]):
      continue
    loss = [r["loss"][0] if isinstance(r["loss"], list) else r["loss"] for r in rows]
    n = len(rows[-1]["loss"]) if isinstance(rows[-1]["loss"], list) else 1
    tps = [r["tokens_per_s"] / n for r in rows if r.get("tokens_per_s")]
    out[label] = ([r["step"] for r in rows], [l / math.log(2) for l in loss],
                  float(np.median(tps)) if tps else None)
  return out


def block(entries, curve_data, plot_link):
  """The section's markdown: bits per byte per mixer at each length (mean, and the spread
  over seeds when there are several), the rates tried, tokens/s."""
  if not entries:
    return "No rows yet."
  Ls = sorted({L for e in entries for L in e["test"]})
  T = Ls[0] if Ls else VALIDATION_LENGTH
  body = []
  for e in entries:
    cells = []
    for L in Ls:
      got = e["test"].get(L)
      cells.append("-" if got is None else
                   f"{got[0]:.3f}" + (f" ± {got[1]:.3f}" if got[1] is not None else ""))
    tps = (curve_data.get(e["label"]) or (None, None, None))[2]
    body.append([e["name"], ", ".join(f"{r:g}" for r in e["rates"]),
                 "-" if e["rate"] is None else f"{e['rate']:g}", len(e["seeds"]), *cells,
                 "-" if tps is None else f"{tps:,.0f}"])
  head = ["mixer", "rates tried", "rate", "seeds"] + [
      f"{L // T}T = {L:,}" if L != T else f"T = {L:,}" for L in Ls] + ["tokens/s a run"]
  return ("Test bits per byte (lower is better) at the training length T and beyond it, the "
          "rate chosen by validation bits per byte at T; mean ± std over seeds where there "
          "are several:\n\n" + markdown.table(head, body) + "\n\n" + plot_link)
