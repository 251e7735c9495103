"""RESULTS.md's MQAR sections: capacity (3), long context (4), VLA's settings (7); zoology (5)
is `zoology`'s.

Each `*_section` returns (markdown blocks, summary); the summary ({(label, setting): cell}) is
what the claims table and other sections read.
"""

import collections

import numpy as np

from lab.grid import ABLATION_VARIANTS, HEAD_DIM, LONG_TS, MIXERS, PAPER_N
from lab.report import markdown, notes
from lab.report.rows import (AUTHORS_FLAG, accuracy, best_rate, grid_summary, label,
                             mixers_in, name, prose_name, sentence_start,
                             settings_sentence, usual_rates)

SOLVED = 0.99   # a cell "reaches" the task at this mean test accuracy
GRID_LABELS = tuple(m for m, _, _ in MIXERS)   # the labels every grid runs, in its order
# The ablation variants' names: "defaults" are the settings of those runs, with the authors'
# penalty scale (the layer's default is 1 now).
VARIANT_NAMES = {"defaults": "defaults (authors' penalty 1/sqrt(d_h))"}
CELLS = ("Cells: test accuracy at the rate chosen on validation, mean ± std (min) over seeds, "
         "@ that rate; \"(of N rates)\" marks a cell swept over another number of rates than "
         "the rest of the grid.")


def grid_command(grid, rest=""):
  return f"`python experiments/grid.py --grids={grid} --workdir=OUT --gpus=0,1{rest}`"


def accuracy_cells(summary):
  """{(label, setting): table cell text} of a grid summary."""
  usual = len(usual_rates(c["rates"] for c in summary.values()))
  out = {}
  for k, c in summary.items():
    n = len(c["rates"])
    out[k] = (f"{markdown.accuracy_cell(c['test'])} @ {c['rate']:g}"
              + (f" (of {markdown.plural(n, 'rate')})" if n != usual else ""))
  return out


def accuracy_table(summary, settings, heading, by_setting=False):
  """One row per mixer and one column per setting (heading(setting)), or the transpose with
  by_setting=True; a cell not run says so."""
  cells = accuracy_cells(summary)
  mixers = mixers_in(summary)
  text = lambda m, v: cells.get((m, v), "not run")
  if by_setting:
    return markdown.table(["setting"] + [name(m) for m in mixers],
                          [[heading(v)] + [text(m, v) for m in mixers] for v in settings])
  return markdown.table(["mixer"] + [heading(v) for v in settings],
                        [[name(m)] + [text(m, v) for v in settings] for m in mixers])


def mean(summary, m, v):
  c = summary.get((m, v))
  return None if c is None else float(c["test"].mean())


def below(summary, settings):
  """[(label, setting, mean)] of the cells below SOLVED among `settings`, in setting order."""
  return [(m, v, mean(summary, m, v)) for v in settings for m in mixers_in(summary)
          if (m, v) in summary and mean(summary, m, v) < SOLVED]


# -- 3. capacity --------------------------------------------------------------------------------

def capacity_finding(summary):
  """Two sentences, up to n = d_h and beyond: every mixer reaches SOLVED at every n except
  those named, each with how many n it falls below at and its lowest cell."""
  small = [n for n in PAPER_N if n <= HEAD_DIM and any(v == n for _, v in summary)]
  large = [n for n in PAPER_N if n > HEAD_DIM and any(v == n for _, v in summary)]

  def verdict(ns, where):
    misses = []
    for m in mixers_in(summary):
      lows = [(n, mean(summary, m, n)) for n in ns
              if (m, n) in summary and mean(summary, m, n) < SOLVED]
      unrun = [n for n in ns if (m, n) not in summary]
      if lows:
        n_min, a_min = min(lows, key=lambda x: x[1])
        misses.append(f"{prose_name(m)} ({len(lows)} of {len(ns)} below, lowest {a_min:.3f} "
                      f"at n = {n_min})")
      elif unrun:
        misses.append(f"{prose_name(m)} (not run at n = {', '.join(map(str, unrun))})")
    return (f"{where} every mixer reaches {SOLVED} at every n"
            + (" except " + markdown.listed(misses) if misses else "") + ".")

  return ("**Finding.** " + verdict(small, f"Up to n = d_h = {HEAD_DIM} pairs,")
          + (" " + verdict(large, f"Beyond it (n = {', '.join(map(str, large))}),")
             if large else ""))


def capacity_section(rows, smoke_rows, plot_path, rel, plot=None):
  """Section 3 from the capacity grid's rows and the earlier one-seed sweep's rows; its plot is
  linked as rel(plot_path) and drawn there by plot(summary, ns, path) when given."""
  blocks = ["## 3. MQAR capacity (the seed's setting)"]
  summary = grid_summary(rows, "n_pairs")
  if not rows:
    return blocks + [f"Not run yet: {grid_command('capacity')}."], summary
  blocks.append(capacity_finding(summary))
  blocks.append(markdown.bullets([
      f"Rows: {grid_command('capacity')} (`results/training/mqar_capacity_h200.jsonl`; "
      "configs/mqar_paper.py: T = 3n + 1, vocabulary 256; rates 3e-4, 1e-3, 3e-3).",
      settings_sentence(rows),
      "`softmax + conv` is softmax attention with the recurrent mixers' short convolution.",
      CELLS]))
  blocks.append(accuracy_table(summary, PAPER_N, lambda n: f"n = {n}"))
  if plot:
    plot(summary, PAPER_N, plot_path)
  blocks.append(f"![capacity]({rel(plot_path)})")
  missing = [f"{name(m)} n={n}" for m in GRID_LABELS for n in PAPER_N if (m, n) not in summary]
  blocks.append(markdown.bullets([
      ("Not run yet: " + ", ".join(missing) + ". The same command completes the grid (it "
       "skips finished jobs).") if missing else "",
      notes.wider_sweep_note(summary, lambda n: f"n = {n}")]))
  blocks += [notes.seed_split_note(summary, lambda n: f"n = {n}"),
             notes.edge_rate_note(summary, lambda n: f"n = {n}")]
  vla = [r for r in rows if label(r) in ("vla", "vla_p1")]
  if vla:
    by = collections.defaultdict(list)
    for r in sorted(vla, key=lambda r: r["seed"]):
      by[(r["n_pairs"], label(r), r["learning_rate"])].append(accuracy(r))
    rates = sorted({k[2] for k in by})
    body = [[n, name(m)] + [", ".join(f"{a:.3f}" for a in by.get((n, m, lr), [])) or "-"
                            for lr in rates]
            for n, m in sorted({k[:2] for k in by}, key=lambda k: (k[0], k[1] != "vla"))]
    blocks.append("VLA per seed (test accuracy at every rate tried):")
    blocks.append(markdown.table(["n", "mixer"] + [f"rate {lr:g}" for lr in rates], body))
  if smoke_rows:
    best = {}
    for r in smoke_rows:
      best[r["mixer"]] = max(best.get(r["mixer"], 0.0), r["accuracy"])
    blocks.append(markdown.bullets([
        "Earlier one-seed run at n = 24 (`python experiments/mixer_sweep.py "
        f"--config=configs/mqar_paper.py:24 --learning_rates=1e-3,3e-3 {AUTHORS_FLAG}`, "
        "`results/training/mixer_sweep_mqar_n24_h200.jsonl`; no validation set, so the better "
        "test accuracy of two rates, an optimistic figure): "
        + ", ".join(f"{name(m)} {a:.3f}" for m, a in best.items()) + "."]))
  return blocks, summary


# -- 4. long context ----------------------------------------------------------------------------

def long_finding(summary, Ts):
  ran = [T for T in Ts if any(v == T for _, v in summary)]
  ok = [T for T in ran if not below(summary, [T])]
  upto = None
  for T in ran:
    if T not in ok:
      break
    upto = T
  first = (f"Every mixer run reaches {SOLVED} at every T up to {upto:,} (8 pairs)."
           if upto else f"Some mixer is below {SOLVED} already at T = {ran[0]:,}.")
  later = [T for T in ran if T not in ok and (upto is None or T > upto)]
  parts = []
  for T in later:
    lows = below(summary, [T])
    rest = sum(1 for m, v in summary if v == T) - len(lows)
    parts.append(f"at T = {T:,} " + markdown.listed(f"{prose_name(m)} falls to {a:.3f}"
                                                     for m, _, a in lows)
                 + f", the other {rest} stay at or above {SOLVED}")
  return ("**Finding.** " + first
          + (" " + sentence_start("; ".join(parts)) + "." if parts else ""))


def long_section(rows):
  """Section 4 from the long-context grid's rows."""
  blocks = ["## 4. Long context (n = 8, growing T)"]
  summary = grid_summary(rows, "seq_len")
  if not rows:
    return blocks + [f"Not run yet: {grid_command('long')} (configs/mqar_long.py, T = 64 to "
                     "4096; `--long_Ts` extends it)."], summary
  Ts = sorted(set(LONG_TS) | {r["seq_len"] for r in rows})
  where = lambda T: f"T = {T}"
  blocks.append(long_finding(summary, Ts))
  blocks.append(markdown.bullets([
      f"Rows: {grid_command('long')} (`results/training/mqar_long_h200.jsonl`; "
      "`--only=long-T64-,long-T128-` runs part of the grid, in the order of the patterns). "
      "8 key-value pairs, zoology-form sequences (filler tokens, power-law query placement), "
      "vocabulary 256, the backbone of section 3; rates 1e-3 and 3e-3.",
      settings_sentence(rows), CELLS]))
  blocks.append(accuracy_table(summary, Ts, where))
  missing = [(T, [m for m in GRID_LABELS if (m, T) not in summary]) for T in Ts]
  single = sorted({k for k, c in summary.items() if len(c["rates"]) == 1}, key=lambda k: k[1])
  blocks.append(markdown.bullets([
      ("Not run yet: " + "; ".join(
          f"T = {T}" + ("" if len(ms) == len(GRID_LABELS) else
                        " (" + " / ".join(name(m) for m in ms) + ")") for T, ms in missing if ms)
       + ".") if any(ms for _, ms in missing) else "",
      ("Trained at one rate only (the mixer's best at the next shorter T, to halve the device "
       "time; `grid.py --rates=RATE --only=...`): " + "; ".join(
           f"T = {T}: " + ", ".join(f"{name(m)} {summary[(m, T)]['rate']:g}"
                                    for m in GRID_LABELS if (m, T) in single)
           for T in sorted({T for _, T in single})) + ".") if single else "",
      notes.pallas_note(rows, lambda r: r["seq_len"], where),
      notes.dtype_note(rows, lambda r: f"{name(label(r))} at T = {r['seq_len']}"),
      notes.partial_rates_note(rows, "seq_len", where),
      ("At T = 1,024 a softmax + conv job (6 runs vmapped) allocates ~37 GiB per training "
       "step; both attempts so far ran out of memory while packed with other jobs on one GPU."
       if ("softmax_conv", 1024) not in summary else "")]))
  blocks += [notes.seed_split_note(summary, where), notes.edge_rate_note(summary, where)]
  return blocks, summary


# -- 7. VLA's settings --------------------------------------------------------------------------

def penalty_reading(cap):
  """VLA's penalty scale in the capacity grid: seeds below 0.5 per scale at the chosen rates,
  and which scale the library defaults to."""
  common = sorted(n for (m, n) in cap if m == "vla_p1" and ("vla", n) in cap)
  if not common:
    return ("The capacity grid has no `vla_p1` rows (penalty_scale 1) yet; the layer's default "
            "penalty scale is 1 (section 9).")
  ns = ", ".join(str(n) for n in common)
  seeds = lambda m: np.concatenate([cap[(m, n)]["test"] for n in common])
  p1, auth = seeds("vla_p1"), seeds("vla")
  p1_fail = [n for n in common if (cap[("vla_p1", n)]["test"] < 0.5).any()]
  auth_fail = [n for n in common if (cap[("vla", n)]["test"] < 0.5).any()]
  text = "In the capacity grid (section 3; each n at its rate chosen on validation), "
  if not p1_fail:
    text += (f"VLA with penalty_scale 1 solved every seed at n = {ns} "
             f"({int((p1 >= 0.99).sum())} of {p1.size} seeds at or above 0.99)")
  else:
    text += (f"VLA with penalty_scale 1 left {int((p1 < 0.5).sum())} of {p1.size} seeds below "
             f"0.5 at n = {ns} (at n = " + ", ".join(str(n) for n in p1_fail) + ")")
  text += (f", the authors' scale left {int((auth < 0.5).sum())} of {auth.size} seeds near chance "
           "(below 0.5" + (", at n = " + ", ".join(str(n) for n in auth_fail) if auth_fail
                           else "") + "). ")
  return text + ("Penalty scale 1 is the layer's default (section 9 gives the measurements "
                 "behind it); the authors' 1/sqrt(d_h) is `penalty_scale=None` in the layer, "
                 f"`{AUTHORS_FLAG}` on the command line at d_h = {HEAD_DIM}.")


def ablation_finding(rows, demo_rows, cap):
  parts = []
  if rows:
    variants = [v for v, _ in ABLATION_VARIANTS if any(r["variant"] == v for r in rows)]
    at_best = {v: _best_test([r for r in rows if r["variant"] == v]) for v in variants}
    solve = [v for v in variants if (at_best[v] >= SOLVED).all()]
    if len(solve) == len(variants):
      parts.append("At n = 24 every VLA variant run solves the task with all seeds at its "
                   "chosen rate, so lam0, the penalty scale, the readout and the convolution "
                   "change only how often a seed trains at the other rate.")
    else:
      parts.append(f"At n = 24 the variants that solve the task with all seeds at their chosen "
                   f"rate are {markdown.listed(f'`{v}`' for v in solve) or 'none'}.")
  if demo_rows:
    means = _demo_means(demo_rows)
    top = max(means, key=means.get)
    text = (f"On the CPU demo problem the best variant is `{top}` ({means[top]:.3f} mean test "
            f"accuracy against {means.get('defaults', float('nan')):.3f} for the defaults, "
            "with the authors' penalty scale)")
    common = [n for (m, n) in cap if m == "vla_p1" and ("vla", n) in cap]
    if top == "penalty-1" and common:
      fails = lambda m: int(sum((cap[(m, n)]["test"] < 0.5).sum() for n in common))
      seeds = sum(cap[("vla", n)]["test"].size for n in common)
      text += (f", and in the capacity grid penalty scale 1 left {fails('vla_p1')} seeds below "
               f"0.5 where the authors' scale left {fails('vla')} (of {seeds})")
    parts.append(text + ".")
  return "**Finding.** " + " ".join(parts)


def _best_test(rows):
  return best_rate(rows)[1]


def _demo_means(demo_rows):
  variants = list(dict.fromkeys(r["variant"] for r in demo_rows))
  return {v: float(np.mean([accuracy(r) for r in demo_rows if r["variant"] == v]))
          for v in variants}


def ablation_section(rows, demo_rows, one_seed_rows, cap):
  """Section 7: VLA variants at n = 24 on the GPU (`rows`), on the demo problem on the CPU
  (`demo_rows`, 3 seeds; `one_seed_rows`, the earlier single seed), and the capacity grid's
  penalty-scale comparison (`cap`, its summary)."""
  blocks = ["## 7. VLA's hyperparameters and readout"]
  if not (rows or demo_rows or one_seed_rows):
    return blocks + [f"Not run yet: {grid_command('ablation')}."]
  blocks.append(ablation_finding(rows, demo_rows, cap))
  names = [v for v, _ in ABLATION_VARIANTS]
  blocks.append(markdown.bullets([
      "Variants, one changed at a time from the defaults of these runs (lam0 1, the authors' "
      "penalty scale 1/sqrt(d_h), readout none, convolution 4; the grid pins that scale now that "
      "the layer's default is 1): lam0 (the ridge), penalty-0 (penalty_scale "
      "0: u = 0, so a_t = khat_t, DeltaNet with beta 1), penalty-1 (penalty_scale 1 instead of "
      "1/sqrt(d_h)), readout additive (the authors' normaliser) or delta (a normaliser carried "
      "by the same recurrence), no-conv (the authors' layer without the short convolution)."]))
  if rows:
    variants = [v for v in names if any(r["variant"] == v for r in rows)]
    rates = sorted({r["learning_rate"] for r in rows})
    blocks.append("**H200, the seed's setting at n = 24:**")
    blocks.append(markdown.bullets([
        "configs/mqar_paper.py:24 (T = 73, 3000 steps); rows: " + grid_command("ablation")
        + " (`results/training/ablation_h200.jsonl`).",
        settings_sentence(rows),
        "Cells: test accuracy per seed at each rate; `best`: the rate chosen on validation, "
        "mean ± std."]))
    body = []
    for v in variants:
      vr = sorted((r for r in rows if r["variant"] == v), key=lambda r: r["seed"])
      cells = [", ".join(f"{accuracy(r):.3f}" for r in vr if r["learning_rate"] == lr)
               or "not run" for lr in rates]
      rate, test, _ = best_rate(vr)
      solved = sum(accuracy(r) >= 0.99 for r in vr)
      body.append([VARIANT_NAMES.get(v, v)] + cells + [
          f"{test.mean():.3f} ± {test.std():.3f} @ {rate:g}",
                                 f"{solved} of {len(vr)}"])
    blocks.append(markdown.table(["variant"] + [f"rate {lr:g}" for lr in rates]
                                 + ["best", "seeds >= 0.99, all rates"], body))
    missing = [v for v in names if v not in variants]
    fragile = [(v, lr) for v in variants for lr in rates
               if all(accuracy(r) < 0.5 for r in rows
                      if r["variant"] == v and r["learning_rate"] == lr)]
    blocks.append(markdown.bullets([
        ("Not run yet (device time): " + ", ".join(missing) + ". The same command continues "
         "the grid.") if missing else "",
        ("Every seed at chance: " + ", ".join(f"{v} at rate {lr:g}" for v, lr in fragile) + ".")
        if fragile else "",
        ("penalty-0 (a_t = khat_t: DeltaNet with beta = 1 inside VLA's layer) solves it too: at "
         "n = 24 the penalty path is not what makes the layer work.")
        if "penalty-0" in variants and (_best_test([r for r in rows if r["variant"] ==
                                                    "penalty-0"]) >= SOLVED).all() else ""]))
  if demo_rows:
    variants = list(dict.fromkeys(r["variant"] for r in demo_rows))
    steps = demo_rows[0]["steps"]
    seeds = len({r["seed"] for r in demo_rows})
    blocks.append("**CPU, the README's demo problem:**")
    blocks.append(markdown.bullets([
        "configs/mqar_demo.py (MQAR 8 pairs, T = 25, d_model 64, 2 heads of 32), "
        f"{steps} steps at rate 3e-3, {markdown.plural(seeds, 'seed')}; rows: `python "
        f"experiments/grid.py --grids=ablation_demo --demo_steps={steps} --workdir=OUT "
        "--per_gpu=1` (`results/training/vla_ablation_demo_cpu.jsonl`).",
        "Cells: test accuracy per seed."]))
    body = []
    for v in variants:
      accs = np.array([accuracy(r) for r in demo_rows if r["variant"] == v])
      body.append([VARIANT_NAMES.get(v, v), f"{accs.mean():.3f} ± {accs.std():.3f}",
                   ", ".join(f"{a:.3f}" for a in accs)])
    blocks.append(markdown.table(["variant", "mean ± std", "seeds"], body))
    unfinished = [v for v in names if v not in variants]
    means = _demo_means(demo_rows)
    readout_ok = means.get("defaults", 0) >= max(means.get("readout-additive", 0),
                                                 means.get("readout-delta", 0))
    blocks.append(markdown.bullets([
        ("Not finished within the CPU time of the run: " + ", ".join(unfinished) + ".")
        if unfinished else "",
        "With the defaults of these runs (lam0 1 and penalty scale 1/sqrt(d_h), the authors' "
        "choices) some seeds stay near chance, as in the capacity grid (section 3).",
        penalty_reading(cap),
        "The readout default (none) was chosen by measurement, `vla_jax/layers/README.md`; the "
        "3-seed rows above agree (none beats additive and delta on average)." if readout_ok else
        "On these rows the default readout (none) does not beat the additive or delta readouts "
        "on average; the earlier one-seed measurement behind that default is in "
        "`vla_jax/layers/README.md`."]))
  if one_seed_rows:
    blocks.append("**Earlier, one seed** (the 3-seed rows above are the ones to read):")
    blocks.append(markdown.bullets([
        "configs/mqar_demo.py, 500 steps; rows: `python experiments/train.py "
        f"--config=configs/mqar_demo.py --config.train.num_steps=500 {AUTHORS_FLAG} "
        "--config.model.options.vla.<field>=<value>` "
        "(`results/training/vla_penalty_ablation_cpu.jsonl`; the authors' penalty scale except "
        "in the penalty_scale rows)."]))
    blocks.append(markdown.table(["setting", "accuracy", "exact match"],
                                 [[r["override"], f"{r['accuracy']:.3f}",
                                   f"{r['exact_match']:.3f}"] for r in one_seed_rows]))
  return blocks
