"""RESULTS.md's language-modelling section: the rows of `experiments/text_study.py` (one sweep
row a run, its test and validation sets scored in bits per byte at the training length T and
at 4T and 16T) and each job's logged training curve, as a table per mixer (its figure:
`lab.report.plots.plot_text`).

Files, under results/training/: `text_study_<card>.jsonl` (the study's rows from one kind of
GPU; a study whose calls ran on several kinds has a file each) and `text_runs/<job>.jsonl`
(the job's metrics.jsonl: the curves of its runs and its tokens/s); only the jobs the
section reads are kept.
"""

import collections
import functools
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


def rows(rows_dir):
  """The study's rows from every `text_study_<card>.jsonl` under rows_dir, each with its
  "card" (the file name's)."""
  out = []
  for path in sorted(glob.glob(os.path.join(rows_dir, ROWS_GLOB))):
    prefix, suffix = ROWS_GLOB.split("*")
    card = os.path.basename(path)[len(prefix):-len(suffix)]
    out += [{**r, "card": card} for r in jsonl.read_rows(path)]
  return out


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


def curves(runs_dir, rows, entries):
  """{label: (steps, training loss in bits per byte, tokens/s, card)} for each mixer of
  `summary`'s entries that has a chosen rate. The curve is the run at that rate with the
  lowest seed among those whose job's metrics were kept (`text_runs/<job>.jsonl`: a job's runs
  train together, their losses listed in the order of the job's rows). Tokens/s and its card
  come from a job of the mixer that trained one run alone (the runs past a rate's edge; the
  rate does not change the speed, and a job's vmapped runs share the GPU unevenly), the chosen
  rate's first; None where no such job's metrics were kept. Mixers with no curve are left
  out."""

  @functools.cache
  def metrics(job):
    return [r for r in jsonl.read_rows(os.path.join(runs_dir, f"{job}.jsonl"))
            if "loss" in r and "step" in r]         # [] where the job's file is absent

  runs_of_job = collections.Counter(r.get("job") for r in rows)
  out = {}
  for e in entries:
    if e["rate"] is None:
      continue
    mine = [r for r in rows if r.get("label") == e["label"]]
    at_rate = sorted((r for r in mine if float(r["learning_rate"]) == e["rate"]),
                     key=lambda r: r["seed"])
    first = next((r for r in at_rate if metrics(r.get("job"))), None)
    if first is None:
      continue
    job = [r for r in rows if r.get("job") == first.get("job")]
    i = job.index(first)
    logged = metrics(first.get("job"))
    loss = [r["loss"][i] if isinstance(r["loss"], list) else r["loss"] for r in logged]
    alone = sorted((r for r in mine if runs_of_job[r.get("job")] == 1),
                   key=lambda r: (float(r["learning_rate"]) != e["rate"], r.get("job")))
    timed = next((r for r in alone if metrics(r.get("job"))), None)
    tps = ([m["tokens_per_s"] for m in metrics(timed.get("job")) if m.get("tokens_per_s")]
           if timed else [])
    out[e["label"]] = ([r["step"] for r in logged], [l / math.log(2) for l in loss],
                       float(np.median(tps)) if tps else None,
                       timed.get("card") if tps else None)
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
    _, _, tps, card = curve_data.get(e["label"]) or (None, None, None, None)
    body.append([e["name"], ", ".join(f"{r:g}" for r in e["rates"]),
                 "-" if e["rate"] is None else f"{e['rate']:g}", len(e["seeds"]), *cells,
                 "-" if tps is None else f"{tps:,.0f} ({card.upper()})"])
  head = ["mixer", "rates tried", "rate", "seeds"] + [
      f"{L // T}T = {L:,}" if L != T else f"T = {L:,}" for L in Ls] + ["tokens/s (GPU)"]
  return ("Test bits per byte (lower is better) at the training length T and beyond it, the "
          "rate chosen by validation bits per byte at T; mean ± std over seeds where there "
          "are several; tokens/s of one run training alone, on the GPU it ran on (compare "
          "within one GPU; - where no such run's metrics were kept):\n\n"
          + markdown.table(head, body) + "\n\n" + plot_link)
