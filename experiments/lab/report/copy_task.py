"""The full table of RESULTS.md section 6: Copy, trained on strings up to one length and scored up to 4x it.

The rate is chosen per mixer on the mean validation generated-token accuracy at the training
length; cells are test scores at that rate, mean ± std over seeds.
"""

import collections

import numpy as np

from lab.report import markdown
from lab.report.rows import MIXER_ORDER, label, name, settings_sentence

LENGTHS = (64, 128, 256)   # scored lengths; the first is the longest training string
METRICS = ("generated_exact_match", "generated_accuracy", "accuracy")


def copy_summary(rows):
  """{label: {rate, rates, seeds, scores: {(L, metric): test values over seeds (seed order)},
  diverged: runs with a non-finite final loss, loss_unknown: runs that logged no loss}}."""
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in rows:
    groups[label(r)][r["learning_rate"]].append(r)
  summary = {}
  for m in [m for m in MIXER_ORDER if m in groups] + sorted(set(groups) - set(MIXER_ORDER)):
    by_rate = groups[m]
    key = f"copy_L{LENGTHS[0]}"
    rate = max(by_rate, key=lambda lr: np.mean([r["validation"][key]["generated_accuracy"]
                                                for r in by_rate[lr]]))
    chosen = sorted(by_rate[rate], key=lambda r: r["seed"])
    runs = [r for rs in by_rate.values() for r in rs]
    summary[m] = {"rate": rate, "rates": sorted(by_rate), "seeds": len(chosen),
                  "scores": {(n, metric): np.array([r["test"][f"copy_L{n}"][metric]
                                                    for r in chosen])
                             for n in LENGTHS for metric in METRICS},
                  "diverged": sum(r.get("diverged") is True for r in runs),
                  "loss_unknown": sum(r.get("diverged", False) is None for r in runs)}
  return summary


def copy_tables(rows):
  """The full tables of section 6 (markdown blocks) from the Copy grid's rows."""
  blocks = []
  if not rows:
    return blocks + ["Not run yet: `python experiments/grid.py --grids=copy --workdir=OUT "
                     "--gpus=0,1` (trained at lengths up to 64, scored by greedy generation at "
                     "64, 128 and 256)."]
  summary = copy_summary(rows)
  seeds = sorted({r["seed"] for r in rows})
  rates = sorted({r["learning_rate"] for r in rows})
  steps = sorted({r.get("steps") for r in rows if r.get("steps") is not None})
  tf = rows[0].get("task_fields", {})
  n0, n1 = LENGTHS[0], LENGTHS[1]
  blocks.append(markdown.bullets([
      "Rows: `python experiments/grid.py --grids=copy --workdir=OUT --gpus=0,1` "
      "(`results/training/copy_h200.jsonl`; configs/copy.py). Each example is a string of "
      f"{tf.get('min_len', 1)} to {tf.get('max_len', 64)} random symbols (vocabulary "
      f"{tf.get('vocab_size', 32)}), a separator, then the string again; 2 layers, d_model 128, "
      "4 heads of d_h 32, no position embedding, trained for "
      f"{'/'.join(str(s) for s in steps)} steps at rates " + ", ".join(f"{r:g}" for r in rates)
      + f" with {len(seeds)} seeds.",
      settings_sentence(rows),
      f"Scored on the test set at L = {', '.join(map(str, LENGTHS))} (L = {n1} and {LENGTHS[2]} "
      "are 2x and 4x the longest training string); the rate is chosen per mixer on the mean "
      f"validation generated-token accuracy at L = {n0}. *exact*: strings reproduced without "
      "error by greedy generation; *token*: generated tokens that are right; *teacher-forced*: "
      "token accuracy given every earlier target token (mean only)."]))
  head = ["mixer", "rate"]
  for n in LENGTHS:
    head += [f"L={n} exact", f"L={n} token"]
  head.append("teacher-forced, L = " + " / ".join(str(n) for n in LENGTHS))
  body = []
  for m, s in summary.items():
    sc = s["scores"]
    line = [name(m), f"{s['rate']:g}"]
    for n in LENGTHS:
      line += [markdown.mean_std(sc[(n, "generated_exact_match")]),
               markdown.mean_std(sc[(n, "generated_accuracy")])]
    line.append(" / ".join(f"{sc[(n, 'accuracy')].mean():.3f}" for n in LENGTHS))
    body.append(line)
  blocks.append(markdown.table(head, body))

  items = []
  diverged = [m for m, s in summary.items() if s["diverged"]]
  if diverged:
    items.append("Runs with a non-finite final training loss: " + ", ".join(
        f"{name(m)} {summary[m]['diverged']}" for m in diverged) + ".")
  unknown = [m for m, s in summary.items() if s["loss_unknown"]]
  if unknown:
    items.append("The rows of " + markdown.listed(name(m) for m in unknown) + " record no "
                 "training loss (`diverged: null`): their first attempt was stopped during "
                 "evaluation, after the last training step, and the resumed attempt had no step "
                 "left to log; their scores are those of the fully trained parameters.")
  blocks.append(markdown.bullets(items))
  return blocks
