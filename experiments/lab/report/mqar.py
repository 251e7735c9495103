"""The full tables of RESULTS.md's MQAR sections: capacity (3), long context (4), VLA's settings
(7); zoology (5) is `zoology`'s.

`capacity_tables` and `long_tables` return (markdown blocks, summary); the summary
({(label, setting): cell}) is what the compact tables and the findings' checks read.
"""

import collections

import numpy as np

from lab.grid import ABLATION_VARIANTS, HEAD_DIM, LONG_TS, MIXERS, PAPER_N
from lab.report import markdown, notes
from lab.report.rows import (AUTHORS_FLAG, accuracy, best_rate, grid_summary, label,
                             mixers_in, name,
                             settings_sentence, usual_rates)

SOLVED = 0.99   # a cell "reaches" the task at this mean test accuracy
GRID_LABELS = tuple(m for m, _, _ in MIXERS)   # the labels every grid runs, in its order
# The ablation variants' names: "defaults" are the settings of those runs, with the authors'
# penalty scale (the layer's default is 1 now).
VARIANT_NAMES = {"defaults": "defaults (VLA-a)"}
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


# -- 3. capacity ---------------------------------------------------------------------------------

def capacity_tables(rows, smoke_rows):
  """The full tables of section 3 (markdown blocks) from the capacity grid's rows and the
  earlier one-seed sweep's rows, and the grid's summary."""
  blocks = []
  summary = grid_summary(rows, "n_pairs")
  if not rows:
    return [f"Not run yet: {grid_command('capacity')}."], summary
  blocks.append(markdown.bullets([
      f"Rows: {grid_command('capacity')} (`results/training/mqar_capacity_h200.jsonl`; "
      "configs/mqar_paper.py: T = 3n + 1, vocabulary 256; rates 3e-4, 1e-3, 3e-3).",
      settings_sentence(rows),
      "`softmax+conv` is softmax attention with the recurrent mixers' short convolution.",
      CELLS]))
  blocks.append(accuracy_table(summary, PAPER_N, lambda n: f"n = {n}"))
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

def long_tables(rows):
  """The full tables of section 4 (markdown blocks) from the long-context grid's rows, and its
  summary."""
  blocks = []
  summary = grid_summary(rows, "seq_len")
  if not rows:
    return blocks + [f"Not run yet: {grid_command('long')} (configs/mqar_long.py, T = 64 to "
                     "4096; `--long_Ts` extends it)."], summary
  Ts = sorted(set(LONG_TS) | {r["seq_len"] for r in rows})
  where = lambda T: f"T = {T}"
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

def demo_means(demo_rows):
  """{variant: mean test accuracy over seeds} of the demo problem's rows."""
  variants = list(dict.fromkeys(r["variant"] for r in demo_rows))
  return {v: float(np.mean([accuracy(r) for r in demo_rows if r["variant"] == v]))
          for v in variants}


def ablation_tables(rows, demo_rows, one_seed_rows):
  """The full tables of section 7: VLA variants at n = 24 on the GPU (`rows`), on the demo
  problem on the CPU (`demo_rows`, 3 seeds; `one_seed_rows`, the earlier single seed)."""
  blocks = []
  if not (rows or demo_rows or one_seed_rows):
    return [f"Not run yet: {grid_command('ablation')}."]
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
        if fragile else ""]))
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
    blocks.append(markdown.bullets([
        ("Not finished within the CPU time of the run: " + ", ".join(unfinished) + ".")
        if unfinished else ""]))
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
