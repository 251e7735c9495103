"""RESULTS.md section 6: Copy, trained on strings up to one length and scored up to 4x it.

The rate is chosen per mixer on the mean validation generated-token accuracy at the training
length; cells are test scores at that rate, mean ± std over seeds.
"""

import collections

import numpy as np

from lab.report import markdown
from lab.report.rows import (MIXER_ORDER, label, name, prose_name, sentence_start,
                             settings_sentence)

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


def copy_finding(summary):
  n0, n1 = LENGTHS[0], LENGTHS[1]
  exact = lambda m, n: float(summary[m]["scores"][(n, "generated_exact_match")].mean())
  best = max(summary, key=lambda m: (exact(m, n0), exact(m, n1)))
  beyond = [m for m in summary if exact(m, n1) > 0]
  first = (f"{sentence_start(prose_name(best))} copies strings of the training length best "
           f"({exact(best, n0):.3f} exact)")
  if beyond == [best]:
    first += (" and is the only mixer that copies strings longer than any it was trained on ("
              + " / ".join(f"{exact(best, n):.3f}" for n in LENGTHS[1:]) + " exact at L = "
              + " / ".join(map(str, LENGTHS[1:])) + ")")
  elif beyond:
    first += ("; " + markdown.listed(prose_name(m) for m in beyond) + " copy strings longer "
              "than any they were trained on (" + "; ".join(
                  f"{prose_name(m)} " + " / ".join(f"{exact(m, n):.3f}" for n in LENGTHS[1:])
                  for m in beyond) + " exact at L = " + " / ".join(map(str, LENGTHS[1:])) + ")")
  else:
    first += f"; no mixer copies a whole string longer than {n0}"
  drop = [m for m in summary if exact(m, n0) >= 0.5 and exact(m, n1) == 0]
  second = ""
  if drop:
    second = (f" {markdown.listed(prose_name(m) for m in drop)} copy most strings of the training "
              f"length and none at {n1 // n0}x that length: their memory does not generalise "
              "the copy beyond the lengths seen.")
  return "**Finding.** " + first + "." + second


def copy_section(rows):
  """Section 6 from the Copy grid's rows."""
  blocks = ["## 6. Copy"]
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
  blocks.append(copy_finding(summary))
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

  mean = lambda m, n, metric: float(summary[m]["scores"][(n, metric)].mean())
  token = lambda m, n: mean(m, n, "generated_accuracy")
  items = []
  fail = [m for m in summary if token(m, n0) < 0.6]
  if fail:
    items.append(f"At the training length {markdown.listed(prose_name(m) for m in fail)} reach"
                 f"{'es' if len(fail) == 1 else ''} only "
                 + " and ".join(f"{token(m, n0):.3f}" for m in fail) + " token accuracy"
                 + (" respectively." if len(fail) > 1 else "."))
  per_seed = lambda m: summary[m]["scores"][(n0, "generated_exact_match")]
  spread = [m for m in summary if per_seed(m).std() > 0.2]
  if spread:
    items.append(f"{markdown.listed(prose_name(m) for m in spread)} "
                 f"depend{'s' if len(spread) == 1 else ''} on the seed at L = {n0} (exact per "
                 "seed: " + "; ".join(", ".join(f"{x:.3f}" for x in per_seed(m))
                                      for m in spread) + ").")
  gaps = {m: mean(m, n1, "accuracy") - token(m, n1) for m in summary}
  g = max(gaps, key=gaps.get)
  if gaps[g] > 0.1:
    items.append(f"Teacher-forced accuracy overstates what generation achieves beyond the "
                 f"training length: at L = {n1}, {prose_name(g)} predicts "
                 f"{mean(g, n1, 'accuracy'):.3f} of the tokens given the true prefix but "
                 f"{token(g, n1):.3f} when it reads its own output.")
  if "vla" in summary and "vla_p1" in summary:
    items.append(f"At L = {n0}, {prose_name('vla_p1')} reaches "
                 f"{mean('vla_p1', n0, 'generated_exact_match'):.3f} exact against "
                 f"{mean('vla', n0, 'generated_exact_match'):.3f} with the authors' 1/sqrt(d_h).")
  diverged = [m for m, s in summary.items() if s["diverged"]]
  if diverged:
    items.append("Runs with a non-finite final training loss: " + ", ".join(
        f"{prose_name(m)} {summary[m]['diverged']}" for m in diverged) + ".")
  unknown = [m for m, s in summary.items() if s["loss_unknown"]]
  if unknown:
    items.append("The rows of " + markdown.listed(prose_name(m) for m in unknown) + " record no "
                 "training loss (`diverged: null`): their first attempt was stopped during "
                 "evaluation, after the last training step, and the resumed attempt had no step "
                 "left to log; their scores are those of the fully trained parameters.")
  blocks.append(markdown.bullets(items))
  return blocks
