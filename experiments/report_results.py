r"""Regenerates RESULTS.md and its plots from the raw JSON lines under results/.

    python experiments/report_results.py [--results=results] [--out=RESULTS.md]

Reads (each optional; a missing file leaves its section saying so):
  mqar_capacity_h200.jsonl      rows of experiments/grid.py --grids=capacity
  mqar_long_h200.jsonl, copy_h200.jsonl, mqar_zoology_h200.jsonl   other grids, same format
  ablation_h200.jsonl           rows of --grids=ablation (VLA variants at n_pairs = 24)
  mixer_sweep_mqar_n24_h200.jsonl   the earlier one-seed run at n_pairs = 24
  state_norms_cpu.jsonl         experiments/state_norms.py (random inputs, Jacobians)
  trained_diagnostics_cpu.jsonl experiments/trained_diagnostics.py (inside trained models)
  vla_penalty_ablation_cpu.jsonl    VLA's lam0 / penalty scale on the demo problem
  vla_ablation_demo_cpu.jsonl   rows of --grids=ablation_demo (the same variants, 3 seeds)
Writes RESULTS.md and results/plots/*.png. Every number in RESULTS.md comes from those files.

Learning-rate choice: for each mixer and setting, the rate with the best mean *validation*
accuracy over seeds (validation examples are drawn with another seed than the test set); the
table reports *test* accuracy at that rate: mean, standard deviation and minimum over seeds.
Copy: the rate with the best mean validation generated token accuracy at the training length;
test scores by greedy generation (exact match, token accuracy) at each length.
"""

import argparse
import collections
import json
import os

import numpy as np

MIXER_ORDER = ("softmax", "softmax_conv", "linear", "deltanet", "gated_deltanet", "vla",
               "vla_p1")
MIXER_NAMES = {"softmax": "softmax", "softmax_conv": "softmax + conv", "linear": "linear",
               "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "vla": "VLA",
               "vla_p1": "VLA, penalty scale 1"}
PAPER_N = (4, 8, 12, 16, 24, 32, 48, 64)


def read(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def label(row):
  return row.get("label", row["mixer"])


def cell_order(item):
  """Sort key of a ((mixer, setting), value) item: by setting, then in MIXER_ORDER."""
  (m, v), _ = item
  return v, MIXER_ORDER.index(m) if m in MIXER_ORDER else len(MIXER_ORDER)


def usual_rates(rate_sets):
  """The rate set most cells were swept over (the larger one on a tie): a grid's own sweep."""
  counts = collections.Counter(tuple(sorted(rates)) for rates in rate_sets)
  return set(max(counts, key=lambda k: (counts[k], len(k)), default=()))


def first_set(scores):
  return next(iter(scores.values()))


def best_rate(rows):
  """rows of one (mixer, setting) -> (the rate best on mean validation accuracy, its test
  accuracies over seeds, the sorted rates tried)."""
  by_rate = collections.defaultdict(list)
  for r in rows:
    by_rate[r["learning_rate"]].append(r)
  rate = max(by_rate, key=lambda lr: np.mean([first_set(r["validation"])["accuracy"]
                                              for r in by_rate[lr]]))
  test = np.array([first_set(r["test"])["accuracy"] for r in by_rate[rate]])
  return rate, test, sorted(by_rate)


def cell(test):
  if len(test) == 1:
    return f"{test[0]:.3f} (1 seed)"
  return f"{test.mean():.3f} ± {test.std():.3f} (min {test.min():.3f})"


def grid_table(rows, key, values, key_name):
  """Markdown table mixer x setting of the best-rate test accuracy, and the summary dict."""
  groups = collections.defaultdict(list)
  for r in rows:
    groups[(label(r), r[key])].append(r)
  mixers = [m for m in MIXER_ORDER if any(g[0] == m for g in groups)]
  usual = len(usual_rates({r["learning_rate"] for r in g} for g in groups.values()))
  summary = {}
  lines = [f"| mixer | " + " | ".join(f"{key_name} = {v}" for v in values) + " |",
           "| --- |" + " --- |" * len(values)]
  for m in mixers:
    cells = []
    for v in values:
      if (m, v) not in groups:
        cells.append("not run")
        continue
      rate, test, rates = best_rate(groups[(m, v)])
      n_rates = len(rates)
      summary[(m, v)] = {"rate": rate, "test": test, "rates_tried": n_rates, "rates": rates}
      plural = "s" if n_rates > 1 else ""
      cells.append(f"{cell(test)} @ {rate:g}" + (f" (of {n_rates} rate{plural})"
                                                  if n_rates != usual else ""))
    lines.append(f"| {MIXER_NAMES.get(m, m)} | " + " | ".join(cells) + " |")
  return "\n".join(lines), summary


COPY_LENGTHS = (64, 128, 256)


def mean_std(x):
  return f"{x.mean():.3f} ± {x.std():.3f}"


def copy_summary(rows):
  """{mixer: {rate, rates, seeds, scores: {(L, metric): test values over seeds}}} at the rate
  with the best mean validation generated token accuracy at the training length."""
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in rows:
    groups[label(r)][r["learning_rate"]].append(r)
  summary = {}
  for m in [m for m in MIXER_ORDER if m in groups] + sorted(set(groups) - set(MIXER_ORDER)):
    by_rate = groups[m]
    key = f"copy_L{COPY_LENGTHS[0]}"
    rate = max(by_rate, key=lambda lr: np.mean([r["validation"][key]["generated_accuracy"]
                                                for r in by_rate[lr]]))
    chosen = sorted(by_rate[rate], key=lambda r: r["seed"])
    scores = {(n, metric): np.array([r["test"][f"copy_L{n}"][metric] for r in chosen])
              for n in COPY_LENGTHS for metric in ("generated_exact_match",
                                                   "generated_accuracy", "accuracy")}
    summary[m] = {"rate": rate, "rates": sorted(by_rate), "seeds": len(chosen),
                  "scores": scores,
                  "diverged": sum(r.get("diverged") is True for rs in by_rate.values()
                                  for r in rs),
                  "loss_unknown": sum(r.get("diverged", False) is None
                                      for rs in by_rate.values() for r in rs)}
  return summary


def copy_section(rows):
  """Markdown lines of section 6 from the rows of copy_h200.jsonl."""
  summary = copy_summary(rows)
  name = lambda m: MIXER_NAMES.get(m, m)
  seeds = sorted({r["seed"] for r in rows})
  rates = sorted({r["learning_rate"] for r in rows})
  steps = sorted({r.get("steps") for r in rows if r.get("steps") is not None})
  tf = rows[0].get("task_fields", {})
  out = []
  w = out.append
  w("`python experiments/grid.py --grids=copy --out_dir=OUT --gpus=0,1` (rows in "
    "`results/copy_h200.jsonl`; configs/copy.py). Each example is a string of "
    f"{tf.get('min_len', 1)} to {tf.get('max_len', 64)} random symbols (vocabulary "
    f"{tf.get('vocab_size', 32)}), a separator, then the string again; the models (2 layers, "
    "d_model 128, 4 heads of d_h 32, no position embedding, the recurrent mixers with their "
    f"short convolution) trained for {'/'.join(str(s) for s in steps)} steps at rates "
    + ", ".join(f"{r:g}" for r in rates) + f" with {len(seeds)} seeds, on strings up to length "
    f"{tf.get('max_len', 64)}. Scored on the test set at L = "
    + ", ".join(str(n) for n in COPY_LENGTHS) + " (L = 128 and 256 are 2x and 4x the longest "
    "training string). Rate chosen per mixer: the one with the best mean *validation* generated "
    f"token accuracy at L = {COPY_LENGTHS[0]}; cells are *test* scores at that rate, mean ± std "
    "over seeds. *exact* = share of strings reproduced without error by greedy generation, "
    "*token* = share of generated tokens that are right, *teacher-forced* = token accuracy when "
    "every earlier target token is given (mean only).\n")
  head = ["mixer", "rate"]
  for n in COPY_LENGTHS:
    head += [f"L={n} exact", f"L={n} token"]
  head.append("teacher-forced, L = " + " / ".join(str(n) for n in COPY_LENGTHS))
  w("| " + " | ".join(head) + " |")
  w("| --- | --- |" + " --- |" * (len(head) - 2))
  for m, s in summary.items():
    sc = s["scores"]
    cells = [name(m), f"{s['rate']:g}"]
    for n in COPY_LENGTHS:
      cells += [mean_std(sc[(n, "generated_exact_match")]),
                mean_std(sc[(n, "generated_accuracy")])]
    cells.append(" / ".join(f"{sc[(n, 'accuracy')].mean():.3f}" for n in COPY_LENGTHS))
    w("| " + " | ".join(cells) + " |")
  w("")

  # Reading, computed from the table.
  mean = lambda m, n, metric: float(summary[m]["scores"][(n, metric)].mean())
  prose = lambda m: "VLA with penalty scale 1" if m == "vla_p1" else name(m)
  listed = lambda ms: (", ".join(prose(m) for m in ms[:-1]) + " and " + prose(ms[-1])
                       if len(ms) > 1 else prose(ms[0]))
  exact = lambda m, n: mean(m, n, "generated_exact_match")
  token = lambda m, n: mean(m, n, "generated_accuracy")
  parts = []
  for n in COPY_LENGTHS:
    ranked = sorted(summary, key=lambda m: (-exact(m, n), -token(m, n)))
    solved = [m for m in ranked if exact(m, n) > 0]
    if solved:
      text = (f"at L = {n} {prose(solved[0])} is best ({exact(solved[0], n):.3f} exact, "
              f"{token(solved[0], n):.3f} token)")
      if len(solved) > 1:
        text += (f", then {prose(solved[1])} ({exact(solved[1], n):.3f} exact, "
                 f"{token(solved[1], n):.3f} token)")
      rest = [m for m in ranked if exact(m, n) == 0]
      if rest:
        if len(solved) == 1:
          best_rest = max(rest, key=lambda m: token(m, n))
          text += ("; every other mixer reproduces no string exactly (best token accuracy "
                   f"among them: {prose(best_rest)}, {token(best_rest, n):.3f})")
        else:
          text += (f"; {listed(rest)} reproduce{'s' if len(rest) == 1 else ''} no string "
                   "exactly")
    else:
      best_tok = max(summary, key=lambda m: token(m, n))
      text = (f"at L = {n} no mixer reproduces a whole string; the best token accuracy is "
              f"{prose(best_tok)}'s {token(best_tok, n):.3f}")
    parts.append(text)
  reading = ["Reading: " + "; ".join(parts) + "."]
  n0, n1 = COPY_LENGTHS[0], COPY_LENGTHS[1]
  drop = [m for m in summary if exact(m, n0) >= 0.5 and exact(m, n1) == 0]
  if drop:
    reading.append(
        f"{listed(drop)} copy most strings of the training length ("
        + ", ".join(f"{exact(m, n0):.3f}" for m in drop)
        + f" exact) and none at {n1 // n0}x that length.")
  fail = [m for m in summary if token(m, n0) < 0.6]
  if fail:
    reading.append(
        f"At the training length {listed(fail)} reach"
        f"{'es' if len(fail) == 1 else ''} only "
        + " and ".join(f"{token(m, n0):.3f}" for m in fail) + " token accuracy"
        + (" respectively." if len(fail) > 1 else "."))
  per_seed = lambda m: summary[m]["scores"][(n0, "generated_exact_match")]
  spread = [m for m in summary if per_seed(m).std() > 0.2]
  if spread:
    reading.append(
        f"{listed(spread)} depend{'s' if len(spread) == 1 else ''} on the seed at L = {n0} "
        "(exact per seed: " + "; ".join(", ".join(f"{x:.3f}" for x in per_seed(m))
                                        for m in spread) + ").")
  gaps = {m: mean(m, n1, "accuracy") - mean(m, n1, "generated_accuracy") for m in summary}
  g = max(gaps, key=gaps.get)
  if gaps[g] > 0.1:
    reading.append(
        f"Teacher-forced accuracy overstates what generation achieves beyond the training "
        f"length: at L = {n1}, {prose(g)} predicts {mean(g, n1, 'accuracy'):.3f} of the tokens "
        f"given the true prefix but {mean(g, n1, 'generated_accuracy'):.3f} when it reads its "
        "own output.")
  if "vla" in summary and "vla_p1" in summary:
    reading.append(
        f"At L = {n0}, {prose('vla_p1')} reaches "
        f"{mean('vla_p1', n0, 'generated_exact_match'):.3f} exact against "
        f"{mean('vla', n0, 'generated_exact_match'):.3f} with the authors' 1/sqrt(d_h).")
  diverged = [m for m, s in summary.items() if s["diverged"]]
  if diverged:
    reading.append("Runs with a non-finite final training loss: " + ", ".join(
        f"{prose(m)} {summary[m]['diverged']}" for m in diverged) + ".")
  unknown = [m for m, s in summary.items() if s["loss_unknown"]]
  if unknown:
    reading.append(
        "The rows of " + listed(unknown) + " record no training loss (`diverged: null`): "
        "their first attempt was stopped during evaluation, after the last training step, and "
        "the resumed attempt had no step left to log; their scores are those of the fully "
        "trained parameters.")
  w(" ".join(reading) + "\n")
  return out


BENCH_FILES = ("bench_h200_2026-11-29.jsonl", "bench_h200_library_xla.jsonl",
               "bench_h200_prep_scan.jsonl", "bench_h200_2026-11-30.jsonl",
               "bench_h200_2026-11-30b.jsonl", "bench_h200_2026-11-30c.jsonl",
               "bench_h200_2026-11-30d.jsonl", "bench_h200_2026-11-30e.jsonl",
               "bench_h200_triton_jax.jsonl", "bench_h200_2026-11-30f.jsonl",
               "bench_h200_2026-11-30g.jsonl", "bench_h200_2026-11-30h.jsonl",
               "bench_h200_2026-11-30i.jsonl",
               # p (d = 64 scan rows with pallas beside them) before j, so that j's pallas rows
               # at the T both measured stay paired with j's cuDNN and fla rows.
               "bench_h200_2026-11-30p.jsonl", "bench_h200_2026-11-30j.jsonl",
               "bench_h200_2026-11-30k.jsonl", "bench_h200_2026-11-30l.jsonl",
               "bench_h200_2026-11-30m.jsonl", "bench_h200_2026-11-30n.jsonl",
               "bench_h200_2026-11-30o.jsonl",
               # q: d = 64 pallas (bfloat16 penalty products), cuDNN and fla, one run.
               "bench_h200_2026-11-30q.jsonl",
               # t: scan and associative-scan rows with pallas beside them (d = 64, 128); before
               # r / s / u, whose pallas rows at the T they share stay paired with their own
               # cuDNN and fla rows.
               "bench_h200_2026-11-30t.jsonl",
               # r / s: d = 64 / 128 pallas at the bfloat16-input defaults (bfloat16 state-prep
               # products and factors, inputs read in place), cuDNN and fla, one run each.
               "bench_h200_2026-11-30r.jsonl", "bench_h200_2026-11-30s.jsonl",
               # u: d = 64 pallas with the 1-warp differentiated penalty scan
               # (grad_scan_warps default), cuDNN and fla, one run. (v, the same at d = 128,
               # where nothing changed, is kept as a raw file only: its fla rows beyond
               # T = 256 were cut by the run's budget.)
               "bench_h200_2026-11-30u.jsonl",
               # 2026-12-01 / 12-01b: d = 64 / 128 pallas at the adjoint penalty backward
               # (penalty_grad default), split state reverse pass below 132 programs and
               # bfloat16 local-VJP products for bfloat16 inputs, with cuDNN and fla, one run
               # each; `ms` the median of back-to-back rounds (measure.time_jax). At d = 128
               # the run's budget cut fla beyond T = 256: those rows stay run s's.
               "bench_h200_2026-12-01.jsonl", "bench_h200_2026-12-01b.jsonl",
               # 12-01c / 12-01d: d = 64 / 128 pallas at the fused chunk-local backward
               # defaults (state_local_vjp="fused", adjoint_du and segment_gram "kernel"), with
               # cuDNN and fla (all T at both d), one run each, fwd+bwd returning o. 12-01e:
               # scan and pallas at T = 8192, d = 64, one run.
               "bench_h200_2026-12-01c.jsonl", "bench_h200_2026-12-01d.jsonl",
               "bench_h200_2026-12-01e.jsonl",
               # 12-01f: d = 64 pallas at grad_layout="direct", adjoint_du="carried" and 16
               # value rows at B = 1, with cuDNN and fla, one run. 12-01g: the same at d = 128
               # (reverse pass split at dk 128, forward still fused), cuDNN and fla; 12-01i
               # after it: d = 128 pallas with the forward split too, and cuDNN, one run (its
               # budget cut fla after T = 256, so fla's d = 128 rows stay g's). 12-01h: the XLA
               # chunked form with its adjoint backward, d = 64, T = 1k, 4k, 16k.
               "bench_h200_2026-12-01f.jsonl", "bench_h200_2026-12-01g.jsonl",
               "bench_h200_2026-12-01h.jsonl", "bench_h200_2026-12-01i.jsonl",
               # 12-01j: d = 64 pallas at write_norm="kernel" and, for bfloat16 inputs, the
               # segment-start inverses on 32 x 32 tiles without the Newton step, with cuDNN
               # and fla, one run; then scan and pallas at T = 8192 (forward). 12-01k: the
               # same d = 128 pallas, cuDNN and fla, one run.
               "bench_h200_2026-12-01j.jsonl", "bench_h200_2026-12-01k.jsonl")


def kernel_claim_row(results_dir):
  """The claims-table row on the seed's kernel, computed from the benchmark files (the same
  files and merge rule as BENCHMARKS.md, `vla_jax.benchmarks.report`)."""
  from vla_jax.benchmarks import report as bench   # pylint: disable=import-outside-toplevel
  paths = [os.path.join(results_dir, "bench", f) for f in BENCH_FILES
           if os.path.exists(os.path.join(results_dir, "bench", f))]
  claim = "| Triton kernel crosses below softmax latency at about 43,000 tokens | "
  if not paths:
    return claim + "not measured yet (`experiments/bench.py` on a GPU) | open |"
  data = bench.Data(bench.load(paths)[1])

  def cross(d, pass_):
    kind, value = bench.crossover(bench.ratio_series(data, d, pass_, bench.PALLAS, bench.CUDNN))
    return {"at": lambda: f"~{value / 1e3:.0f}k", "always": lambda: "below 256",
            "never": lambda: f"none up to T = {max(data.Ts):,}"}.get(kind, lambda: kind)()

  def ms(lab, T, d=64):
    v = data.ms(d, "fwd", lab, T)
    return f"{v:.3g}" if v else "n/a"

  seq = "VLA triton_sequential(torch)"
  seq_wins = [T for T in data.Ts
              if data.ms(64, "fwd", seq, T) and data.ms(64, "fwd", bench.CUDNN, T)
              and data.ms(64, "fwd", seq, T) < data.ms(64, "fwd", bench.CUDNN, T)]
  dims = [d for d in data.dims if data.ms(d, "fwd", bench.PALLAS, 4096)]
  crossings = "; ".join(f"d = {d}: forward {cross(d, 'fwd')}, forward+backward "
                        f"{cross(d, 'fwd+bwd')}" for d in dims)
  return (claim + "H200, BENCHMARKS.md (H = 16, bf16, B * T = 32,768): our chunked Pallas "
          f"kernel crosses cuDNN causal attention at {crossings} (d = 64 forward at 4k / 32k / "
          f"131k: {ms(bench.PALLAS, 4096)} / {ms(bench.PALLAS, 32768)} / "
          f"{ms(bench.PALLAS, 131072)} ms, cuDNN {ms(bench.CUDNN, 4096)} / "
          f"{ms(bench.CUDNN, 32768)} / {ms(bench.CUDNN, 131072)} ms). The seed's own design "
          "(one program per sequence and head, a token loop; reimplemented in Triton, last "
          f"run at commit 49b2b53) takes {ms(seq, 4096)} / {ms(seq, 32768)} / "
          f"{ms(seq, 131072)} ms | "
          + ("the sequential design does not cross cuDNN attention on an H200 up to "
             f"T = {max(data.Ts):,}" if not seq_wins else
             f"the sequential design crosses cuDNN at T = {min(seq_wins):,}")
          + "; the chunked kernel crosses far later than the 4k target of this project; kernel "
          "work continues in `kernels/NOTES.md` |")


ABLATION_VARIANTS = ("defaults", "lam0-0.1", "lam0-10", "penalty-0", "penalty-1",
                     "readout-additive", "readout-delta", "no-conv")


LONG_TS = (64, 128, 256, 512, 1024, 2048, 4096)  # experiments/grid.py --long_Ts default


def long_section(rows):
  """Markdown lines of section 4 and the summary {(mixer, T): best-rate cell} from the rows of
  mqar_long_h200.jsonl."""
  Ts = sorted(set(LONG_TS) | {r["seq_len"] for r in rows})
  table, summary = grid_table(rows, "seq_len", Ts, "T")
  name = lambda m: MIXER_NAMES.get(m, m)
  lines = ["8 key-value pairs, zoology-form sequences (filler tokens, power-law query placement), "
           "vocabulary 256, same 2-layer backbone as section 3 (d_model 128, 4 heads of d_h = "
           "32), 3000 steps, 3 seeds, best of rates 1e-3 and 3e-3 on validation; test accuracy, "
           "mean ± std over seeds (rows in `results/mqar_long_h200.jsonl`):\n",
           "    python experiments/grid.py --grids=long --out_dir=OUT --gpus=0,1\n",
           "(`--only=long-T64-,long-T128-` runs part of the grid, in the order of the patterns; "
           "a second call skips finished jobs.)\n", table + "\n"]
  parts = []
  for T in sorted({T for (_, T) in summary}):
    ran = [m for m in MIXER_ORDER if (m, T) in summary]
    low = [m for m in ran if summary[(m, T)]["test"].mean() < 0.99]
    parts.append(f"T = {T}: " + (f"every mixer run ({len(ran)}) at or above 0.99" if not low else
                                 f"{len(ran) - len(low)} of {len(ran)} at or above 0.99, below: "
                                 + ", ".join(f"{name(m)} {summary[(m, T)]['test'].mean():.3f}"
                                             for m in low)))
  missing = [(T, [m for m in MIXER_ORDER if (m, T) not in summary]) for T in Ts]
  missing = [(T, ms) for T, ms in missing if ms]
  text = f"Reading (computed from the rows): {'; '.join(parts)}."
  if missing:
    text += " Not run yet: " + "; ".join(
        f"T = {T}" + ("" if len(ms) == len(MIXER_ORDER) else
                      " (" + " / ".join(name(m) for m in ms) + ")") for T, ms in missing) + "."
  single = {k for k, c in summary.items() if c["rates_tried"] == 1}
  if single:
    text += (" Trained at one rate only (the mixer's best at the next shorter T, to halve the "
             "device time; `grid.py --rates=RATE --only=...`): " + "; ".join(
                 f"T = {T}: " + ", ".join(f"{name(m)} {summary[(m, T)]['rate']:g}"
                                          for m in MIXER_ORDER if (m, T) in single)
                 for T in sorted({T for (_, T) in single})) + ".")
  text += pallas_note(rows, lambda r: r["seq_len"], lambda T: f"T = {T}")
  text += dtype_note(rows, lambda r: f"{name(label(r))} at T = {r['seq_len']}")
  text += partial_rates_note(rows, "seq_len", lambda T: f"T = {T}")
  text += edge_rate_note(summary, lambda T: f"T = {T}")
  if ("softmax_conv", 1024) not in summary:
    text += (" At T = 1,024 a softmax + conv job (6 runs vmapped) allocates ~37 GiB per training "
             "step; both attempts so far ran out of memory while packed with other jobs on one "
             "GPU.")
  lines.append(text + "\n")
  return lines, summary


ZOOLOGY_SETTINGS = ((64, 4), (128, 8), (256, 16), (512, 64))   # experiments/grid.py ZOOLOGY
ZOOLOGY_WIDTHS = (64, 128, 256)
HEAD_DIM = 32


def state_floats(mixer, d_model, T):
  """Recurrent state per layer in floats: the memory matrices S (heads * d_h^2; VLA also its
  penalty inverse A, as many again), or softmax attention's key-value cache (2 T d_model).
  Normalisers and the short convolutions' states add under 4% and are left out."""
  if mixer.startswith("softmax"):
    return 2 * T * d_model
  heads = d_model // HEAD_DIM
  return heads * HEAD_DIM ** 2 * (2 if mixer.startswith("vla") else 1)


def pallas_note(rows, key, where):
  """A sentence naming the runs trained with the Pallas kernels (model impl "pallas"), grouped
  by key(row) and named by where(key); "" when there are none."""
  by_key = collections.defaultdict(set)
  for r in rows:
    if r.get("model", {}).get("impl") == "pallas":
      by_key[key(r)].add(r["seed"])
  if not by_key:
    return ""
  seeds = lambda s: ("seed " if len(s) == 1 else "seeds ") + ", ".join(map(str, sorted(s)))
  return (" VLA runs trained with the Pallas kernels (`--vla_impl=pallas`, the same function "
          "as the default XLA chunked form; `tests/test_grid.py` checks a training step of "
          "each against impl=\"scan\"): " + "; ".join(
              f"{where(k)}, {seeds(s)}" for k, s in sorted(by_key.items())) + ".")


def edge_rate_note(summary, where, below=0.99):
  """A sentence counting the cells below `below` whose chosen rate is the lowest or the highest
  of two or more rates tried there (the best rate may lie outside the sweep), naming them; ""
  when there are none."""
  name = lambda m: MIXER_NAMES.get(m, m)
  swept = [(k, c) for k, c in sorted(summary.items(), key=cell_order) if len(c["rates"]) > 1]
  low = [(k, c) for k, c in swept if c["test"].mean() < below]
  if not low:
    return ""
  edges = []
  for side, pick in (("lowest", min), ("highest", max)):
    cells = [(k, c) for k, c in low if c["rate"] == pick(c["rates"])]
    if cells:
      edges.append(f"at the {side} rate tried ({len(cells)}: " + ", ".join(
          f"{name(m)} at {where(v)} @ {c['rate']:g}" for (m, v), c in cells) + ")")
  inside = len(low) - sum(1 for _, c in low if c["rate"] in (min(c["rates"]), max(c["rates"])))
  if not edges:
    return f" Every cell below {below} ({len(low)}) chose a rate inside its sweep."
  return (f" Rate sweep edges: of the {len(low)} cell{'s' if len(low) > 1 else ''} below "
          f"{below}, " + "; ".join(edges)
          + f"; {inside} inside the sweep. Where the chosen rate is an edge of the sweep, a "
          "wider sweep (not run) may score higher.")


def wider_sweep_note(summary, where):
  """A sentence naming the cells whose rates tried go beyond the usual sweep (the rate set of
  most cells), with the rates added and the rate chosen; "" when there are none."""
  name = lambda m: MIXER_NAMES.get(m, m)
  usual = usual_rates(c["rates"] for c in summary.values())
  wider = [(k, c) for k, c in sorted(summary.items(), key=cell_order) if set(c["rates"]) - usual]
  if not wider:
    return ""
  return (" Rates added to the usual sweep (" + ", ".join(f"{x:g}" for x in sorted(usual))
          + ") at some cells: " + "; ".join(
              f"{name(m)} at {where(v)}: "
              + ", ".join(f"{x:g}" for x in sorted(set(c["rates"]) - usual))
              + f" (chosen: {c['rate']:g})" for (m, v), c in wider) + ".")


def partial_rates_note(rows, key, where):
  """A sentence listing, per (mixer, row[key]), the learning rates trained on fewer seeds than
  that cell's most-seeded rate, with their test accuracies (best_rate compares mean validation
  accuracy over unequal seed sets there, so the reader sees them); "" when there are none."""
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in rows:
    groups[(label(r), r[key])][r["learning_rate"]].append(r)
  parts = []
  for (m, v), by_rate in sorted(groups.items(), key=cell_order):
    most = max(len(rs) for rs in by_rate.values())
    for rate, rs in sorted(by_rate.items()):
      if len(rs) < most:
        rs = sorted(rs, key=lambda r: r["seed"])
        parts.append(f"{MIXER_NAMES.get(m, m)} at {where(v)}, rate {rate:g}, "
                     + ("seed " if len(rs) == 1 else "seeds ")
                     + ", ".join(str(r["seed"]) for r in rs) + ": "
                     + ", ".join(f"{first_set(r['test'])['accuracy']:.3f}" for r in rs))
  if not parts:
    return ""
  return (" Rates also tried on fewer seeds (test accuracy per seed; the table keeps the best "
          "rate by mean validation accuracy): " + "; ".join(parts) + ".")


def dtype_note(rows, where):
  """A sentence naming the runs whose activations were not float32 (the row's model "dtype";
  rows without it ran at the configs' float32), by where(row); "" when there are none."""
  odd = sorted({(where(r), r["model"]["dtype"]) for r in rows
                if r.get("model", {}).get("dtype", "float32") != "float32"})
  if not odd:
    return ""
  return (" Trained with " + ", ".join(sorted({d for _, d in odd})) + " activations "
          "(`--override model.dtype bfloat16`; float32 parameters and optimiser state; softmax "
          "attention then runs cuDNN's fused kernel instead of XLA's float32 attention, whose "
          "T x T scores do not fit in memory there): " + "; ".join(w for w, _ in odd) + ".")


def zoology_section(rows, plot_path=None, rel=lambda p: p):
  """Markdown lines of section 5 from the rows of mqar_zoology_h200.jsonl (and its plot at
  `plot_path`, linked as `rel(plot_path)`)."""
  for r in rows:
    r["setting"] = (r["seq_len"], r["d_model"])
  settings = [(T, d) for T, _ in ZOOLOGY_SETTINGS for d in ZOOLOGY_WIDTHS]
  ran = [st for st in settings if any(r["setting"] == st for r in rows)]
  table, summary = grid_table(rows, "setting", ran, "T, d_model")
  for T, d in ran:
    table = table.replace(f"T, d_model = {(T, d)}", f"T = {T}, d_model = {d}")
  n_of = dict(ZOOLOGY_SETTINGS)
  steps = sorted({r["steps"] for r in rows})
  name = lambda m: MIXER_NAMES.get(m, m)
  lines = [
      "Zoology's multi-query associative recall (`configs/mqar_zoology.py`: vocabulary 8,192, "
      "power-law query placement, keys and values drawn from disjoint halves of the "
      "vocabulary; T / n_pairs = 64/4, 128/8, 256/16, 512/64), the 2-layer backbone with heads "
      f"of d_h = {HEAD_DIM} (d_model 64, 128, 256: 2, 4, 8 heads), batch 128, "
      f"{'/'.join(map(str, steps))} steps, rates 1e-3 and 3e-3, 3 seeds, the rate chosen on "
      "validation; test accuracy, mean ± std over seeds (rows in "
      "`results/mqar_zoology_h200.jsonl`):\n",
      "    python experiments/grid.py --grids=zoology --out_dir=OUT --gpus=0,1\n",
      "(`--only=zoology-T64-d128-vla,zoology-T64-d128-` runs part of the grid.)\n",
      table + "\n"]
  lines.append("Recurrent state per layer (floats; memory matrices S = heads x d_h^2, VLA also "
               "its penalty inverse A of the same size; softmax: the key-value cache 2 T "
               "d_model):\n")
  lines.append("| mixer | " + " | ".join(f"T = {T}, d_model = {d}" for T, d in ran) + " |")
  lines.append("| --- |" + " --- |" * len(ran))
  for m in MIXER_ORDER:
    if any((m, st) in summary for st in ran):
      lines.append(f"| {name(m)} | " + " | ".join(f"{state_floats(m, d, T):,}" for T, d in ran)
                   + " |")
  lines.append("")
  parts = []
  for T, d in ran:
    cells = [(m, summary[(m, (T, d))]["test"]) for m in MIXER_ORDER if (m, (T, d)) in summary]
    low = [f"{name(m)} {t.mean():.3f}" for m, t in cells if t.mean() < 0.99]
    parts.append(f"T = {T} (n = {n_of[T]}), d_model {d}: " + (
        (f"all {len(cells)} mixers run at or above 0.99" if len(cells) > 1 else
         f"the one mixer run ({name(cells[0][0])}) at or above 0.99") if not low else
        f"{len(cells) - len(low)} of {len(cells)} at or above 0.99; below: " + ", ".join(low)))
  split = [(m, st, summary[(m, st)]["test"]) for (m, st) in summary
           if summary[(m, st)]["test"].max() - summary[(m, st)]["test"].min() > 0.5]
  text = "Reading (computed from the rows): " + "; ".join(parts) + "."
  if split:
    text += (" Seeds that split between a plateau near 1 / n_pairs (0.25 at n = 4) and "
             "near-perfect recall at the chosen rate: " + "; ".join(
                 f"{name(m)} at T = {st[0]}, d_model {st[1]} ("
                 + ", ".join(f"{a:.3f}" for a in t) + ")" for m, st, t in split)
             + ": the run either learns the recall circuit within the step budget or stays "
             "on the plateau.")
  missing = [st for st in settings if st not in ran]
  if missing:
    text += (" Not run yet (device time): " + ", ".join(f"T = {T} d_model {d}" for T, d in missing)
             + ".")
  partial = [(st, [m for m in MIXER_ORDER if (m, st) not in summary]) for st in ran]
  partial = [(st, ms) for st, ms in partial if ms]
  if partial:
    text += " Mixers not yet run at a setting: " + "; ".join(
        f"T = {T}, d_model {d}: " + " / ".join(name(m) for m in ms) for (T, d), ms in partial) + "."
  text += penalty_scale_note(summary)
  text += wider_sweep_note(summary, lambda st: f"T = {st[0]} d_model {st[1]}")
  text += edge_rate_note(summary, lambda st: f"T = {st[0]} d_model {st[1]}")
  text += pallas_note(rows, lambda r: r["setting"], lambda st: f"T = {st[0]}, d_model {st[1]}")
  lines.append(text + "\n")
  if plot_path:
    plot_zoology(summary, plot_path)
    lines.append(f"![zoology MQAR: accuracy against state size]({rel(plot_path)})\n")
  return lines


def penalty_scale_note(summary):
  """A sentence comparing VLA's two penalty scales (`vla`: the authors' 1/sqrt(d_h), `vla_p1`:
  1) at every setting where both ran: mean test accuracy at each one's chosen rate."""
  both = sorted(st for (m, st) in summary if m == "vla" and ("vla_p1", st) in summary)
  if not both:
    return ""
  mean = lambda m, st: summary[(m, st)]["test"].mean()
  ahead = [st for st in both if mean("vla_p1", st) > mean("vla", st) + 0.01]
  behind = [st for st in both if mean("vla_p1", st) < mean("vla", st) - 0.01]
  where = lambda sts: ", ".join(f"T = {T} d_model {d} ({mean('vla_p1', (T, d)):.3f} against "
                                f"{mean('vla', (T, d)):.3f})" for T, d in sts)
  return (f" VLA's penalty scale: 1 is ahead of the authors' 1/sqrt(d_h) by more than 0.01 at "
          f"{len(ahead)} of {len(both)} settings" + (f" ({where(ahead)})" if ahead else "")
          + (f", behind at {where(behind)}" if behind else ", behind at none") + ".")


def plot_zoology(summary, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  Ts = sorted({st[0] for (_, st) in summary})
  fig, axes = plt.subplots(1, len(Ts), figsize=(4.2 * len(Ts), 3.8), squeeze=False,
                           sharey=True)
  handles = {}
  for ax, T in zip(axes[0], Ts):
    for m in MIXER_ORDER:
      pts = sorted((state_floats(m, st[1], T), s["test"]) for (mm, st), s in summary.items()
                   if mm == m and st[0] == T)
      if pts:
        handles[m] = ax.errorbar([p[0] for p in pts], [p[1].mean() for p in pts],
                                 yerr=[p[1].std() for p in pts], marker="o", capsize=3,
                                 color=f"C{MIXER_ORDER.index(m)}", label=MIXER_NAMES[m])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("recurrent state per layer (floats)")
    ax.set_title(f"T = {T}, n_pairs = {dict(ZOOLOGY_SETTINGS)[T]}")
  axes[0][0].set_ylabel("test accuracy (best rate, mean ± std)")
  axes[0][0].set_ylim(0, 1.05)
  axes[0][0].legend([handles[m] for m in MIXER_ORDER if m in handles],
                    [MIXER_NAMES[m] for m in MIXER_ORDER if m in handles], fontsize=7,
                    loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def ablation_section(rows):
  """Markdown lines for the GPU ablation at the seed's n_pairs = 24 (ablation_h200.jsonl)."""
  variants = [v for v in ABLATION_VARIANTS if any(r["variant"] == v for r in rows)]
  rates = sorted({r["learning_rate"] for r in rows})
  lines = [
      "H200, the seed's MQAR setting at n_pairs = 24 (configs/mqar_paper.py:24: 2 layers, "
      "d_model 128, 4 heads of 32, T = 73, 3000 steps), one variant of VLA changed at a time, "
      "3 seeds per rate (`python experiments/grid.py --grids=ablation --out_dir=OUT --gpus=0,1`,"
      " rows in `results/ablation_h200.jsonl`). Test accuracy per seed; `best` is the rate "
      "chosen on validation, mean ± std:\n",
      "| variant | " + " | ".join(f"rate {lr:g}" for lr in rates) + " | best | seeds >= 0.99, "
      "all rates |",
      "| --- |" + " --- |" * (len(rates) + 2)]
  for v in variants:
    vr = [r for r in rows if r["variant"] == v]
    cells = []
    for lr in rates:
      accs = [first_set(r["test"])["accuracy"] for r in sorted(vr, key=lambda r: r["seed"])
              if r["learning_rate"] == lr]
      cells.append(", ".join(f"{a:.3f}" for a in accs) if accs else "not run")
    rate, test, _ = best_rate(vr)
    solved = sum(first_set(r["test"])["accuracy"] >= 0.99 for r in vr)
    lines.append(f"| {v} | " + " | ".join(cells) + f" | {test.mean():.3f} ± {test.std():.3f} "
                 f"@ {rate:g} | {solved} of {len(vr)} |")
  missing = [v for v in ABLATION_VARIANTS if v not in variants]
  lines.append("")
  if missing:
    lines.append("Not run yet (device time): " + ", ".join(missing) + ". The same command "
                 "continues the grid.\n")
  at_best = {v: best_rate([r for r in rows if r["variant"] == v])[1] for v in variants}
  all_solve = [v for v in variants if (at_best[v] >= 0.99).all()]
  if len(all_solve) == len(variants):
    lines.append("Reading: at the rate chosen on validation every variant"
                 + (" run so far" if missing else "") + " solves n = 24 with all three seeds, "
                 "so at this setting lam0, the penalty scale, the readout and the convolution "
                 "do not change what is reachable; they change how often a seed trains at the "
                 "other rate (last column). The demo problem below separates the variants "
                 "more.\n")
    # Variants whose seeds all fail at some rate: the rate matters more than the variant.
    fragile = [(v, lr) for v in variants for lr in rates
               if all(first_set(r["test"])["accuracy"] < 0.5 for r in rows
                      if r["variant"] == v and r["learning_rate"] == lr)]
    if fragile:
      lines.append("Every seed at chance: " + ", ".join(f"{v} at rate {lr:g}"
                                                         for v, lr in fragile) + ".\n")
    if "penalty-0" in all_solve:
      lines.append("penalty-0 (penalty scale 0, so a_t = khat_t: DeltaNet with beta = 1 inside "
                   "VLA's layer) solves it too: at n = 24 the penalty path is not what makes the "
                   "layer work.\n")
  else:
    lines.append("Reading: at the rate chosen on validation, variants that solve n = 24 with "
                 "all three seeds: " + (", ".join(all_solve) or "none") + ".\n")
  return lines


def penalty_reading(cap):
  """Sentences on VLA's penalty scale from the capacity grid: seeds per n at the chosen rate."""
  common = sorted(n for (m, n) in cap if m == "vla_p1" and ("vla", n) in cap)
  if not common:
    return ("The capacity grid has no `vla_p1` rows (penalty_scale 1) yet; the library keeps "
            "the authors' 1/sqrt(d_h). ")
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
  return text + ("The default stays at the authors' 1/sqrt(d_h) in this release, for "
                 "comparability with the seed; penalty_scale = 1 is the better setting measured "
                 "here (`--config.model.options.vla.penalty_scale=1`, or "
                 "`model.options.vla.penalty_scale=1` in a config). ")


def plot_capacity(summary, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for m in MIXER_ORDER:
    pts = sorted((n, s["test"]) for (mm, n), s in summary.items() if mm == m)
    if not pts:
      continue
    n = [p[0] for p in pts]
    mean = [p[1].mean() for p in pts]
    std = [p[1].std() for p in pts]
    ax.errorbar(n, mean, yerr=std, marker="o", capsize=3, label=MIXER_NAMES[m])
  ax.set_xscale("log", base=2)
  ax.set_xticks(PAPER_N, [str(n) for n in PAPER_N])
  ax.set_xlabel("key-value pairs n (T = 3n + 1)")
  ax.set_ylabel("test accuracy (best rate, mean ± std over seeds)")
  ax.set_title("MQAR capacity: 2 layers, d_model 128, 4 heads of d_h 32")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_trained_norms(rows, path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  longest = max((r["T"] for r in rows), default=0)
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for r in rows:
    if r["T"] == longest:
      ax.loglog(r["trace_t"], r["trace_median"], label=f"{r['mixer']} layer {r['layer']}")
  ax.set_xlabel("token t")
  ax.set_ylabel("||S_t||_F (median over sequences, heads)")
  ax.set_title(f"Memory norm inside trained models, MQAR inputs, T = {longest}")
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def settings_sentence(rows):
  """One sentence of the training settings the rows record (batch, steps, dtype, width,
  layers, test examples per set), the most common value first and the others with their row
  counts: what a section's numbers were measured at, read from the rows, not assumed."""
  def values(fn):
    counts = collections.Counter(fn(r) for r in rows)
    (top, _), rest = counts.most_common(1)[0], counts.most_common()[1:]
    return top, rest

  def examples(r):
    fields, scores = r.get("task_fields", {}), first_set(r["test"])
    if r.get("task") == "mqar" and fields.get("n_pairs"):
      return scores["targets"] // fields["n_pairs"]
    return None

  parts = []
  for name, fn, show in (
      ("batch", lambda r: r.get("batch_size"), lambda v: f"batch {v}"),
      ("steps", lambda r: r.get("steps"), lambda v: f"{v:,} steps"),
      ("dtype", lambda r: r.get("model", {}).get("dtype", "float32"), str),
      ("width", lambda r: r.get("model", {}).get("d_model"), lambda v: f"d_model {v}"),
      ("layers", lambda r: r.get("model", {}).get("num_layers"), lambda v: f"{v} layers"),
      ("examples", examples, lambda v: f"{v:,} test examples per set")):
    top, rest = values(fn)
    if top is None and not rest:
      continue
    text = show(top) if top is not None else "-"
    if rest:
      text += " (" + ", ".join(f"{show(v) if v is not None else '-'} in {n} row"
                               + ("s" if n != 1 else "")
                               for v, n in rest) + ")"
    parts.append(text)
  return f"Settings of these {len(rows)} rows: " + "; ".join(parts) + "."


def fmt(x, digits=3):
  return "n/a" if x is None else f"{x:.{digits}g}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--results", default="results")
  parser.add_argument("--out", default="RESULTS.md")
  args = parser.parse_args()
  R = lambda name: read(os.path.join(args.results, name))
  plots = os.path.join(args.results, "plots")
  os.makedirs(plots, exist_ok=True)
  rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(args.out)) or ".")

  capacity = R("mqar_capacity_h200.jsonl")
  long_rows = R("mqar_long_h200.jsonl")
  cap_table, cap = grid_table(capacity, "n_pairs", PAPER_N, "n")
  if cap:
    plot_capacity(cap, os.path.join(plots, "mqar_capacity.png"))
  smoke = [r for r in R("mixer_sweep_mqar_n24_h200.jsonl")]
  smoke_best = {}
  for r in smoke:
    smoke_best[r["mixer"]] = max(smoke_best.get(r["mixer"], 0.0), r["accuracy"])

  norms = R("state_norms_cpu.jsonl")
  random_norm = {r["t"]: r for r in norms if r["kind"] == "state_norm_random"}
  jac_random = next((r for r in norms if r["kind"] == "jacobian_random"), None)
  jac_demo = [r for r in norms if r["kind"] == "trained"]
  trained = R("trained_diagnostics_cpu.jsonl")
  trained_models = [r for r in trained if r["kind"] == "trained_model"]
  trained_norms = [r for r in trained if r["kind"] == "trained_state_norm"]
  trained_jac = [r for r in trained if r["kind"] == "trained_jacobian"]
  if trained_norms:
    plot_trained_norms(trained_norms, os.path.join(plots, "trained_state_norms.png"))
  ablation_cpu = R("vla_penalty_ablation_cpu.jsonl")
  ablation_demo = R("vla_ablation_demo_cpu.jsonl")

  def cap_mean(m, n):
    s = cap.get((m, n))
    return None if s is None else float(s["test"].mean())

  r1000 = random_norm.get(1000, {})
  jac_max_trained = max([r["max"] for r in trained_jac] + [r["max"] for r in jac_demo],
                        default=None)
  out = []
  w = out.append
  w("# Results\n")
  w("Every number below is regenerated by `python experiments/report_results.py` from the raw "
    "JSON lines under `results/`; each section names the command that produced its rows and "
    "the settings those rows record (batch, steps, dtype, width, test examples). Common to the "
    "grids: 2-layer models with heads of d_h 32, a short convolution of 4 in every recurrent "
    "mixer, AdamW with warmup and cosine decay, NVIDIA H200; three seeds per learning rate, "
    "the rate chosen on a validation set drawn with another seed, accuracy (per query) "
    "reported on the test set.\n")
  def last_norm(mixer, T):
    rows = [r for r in trained_norms if r["mixer"] == mixer and r["T"] == T]
    return ({t: max(x["median"][i] for x in rows) for i, t in enumerate(rows[0]["t"])}
            if rows else {})
  T_long = max((r["T"] for r in trained_norms), default=None)
  trained_norm_text = ""
  if T_long:
    nv, nd, nl = (last_norm(m, T_long) for m in ("vla", "deltanet", "linear"))
    if nv and nd and nl:
      trained_norm_text = (
          f"; inside trained MQAR models (largest layer median) at t = 1,000 / {T_long:,}: VLA "
          f"{fmt(nv.get(1000))} / {fmt(nv.get(T_long))}, DeltaNet {fmt(nd.get(1000))} / "
          f"{fmt(nd.get(T_long))}, linear {fmt(nl.get(1000), 4)} / {fmt(nl.get(T_long), 5)}")
  trained_verdict = ""
  if trained_norm_text and nv.get(1000) and nd.get(1000):
    trained_verdict = (
        f". Inside a trained model VLA's memory still grows with T (x{nv[T_long] / nv[1000]:.1f} "
        f"from t = 1,000 to {T_long:,}, DeltaNet's x{nd[T_long] / nd[1000]:.1f}, linear "
        f"attention's x{nl[T_long] / nl[1000]:.1f}): self-limiting only in part")
  w("## The seed's claims against our measurements\n")
  w("| seed's claim | our measurement | verdict |")
  w("| --- | --- | --- |")
  w(f"| Prop. 1 / T = 1,000: linear attention ||S|| about 1,600, VLA under 15 | random inputs, "
    f"d_h 32: linear {fmt(r1000.get('linear_attention'), 4)}, VLA {fmt(r1000.get('vla'))}, "
    f"DeltaNet {fmt(r1000.get('deltanet'))} at t = 1,000; linear keeps growing "
    f"({fmt(random_norm.get(65536, {}).get('linear_attention'), 5)} at 65,536), VLA stays "
    f"{fmt(random_norm.get(65536, {}).get('vla'))}{trained_norm_text} | "
    "growth of linear attention and a bounded "
    "VLA memory reproduced on random inputs; the 'under 15' figure depends on the value scale "
    "(ours: unit-variance values), and DeltaNet is bounded as well" + trained_verdict + " |")
  jr = jac_random or {}
  w(f"| Prop. 2: ||dS_t/dS_(t-1)||_2 = 1 exactly | random inputs: median {fmt(jr.get('p50'), 5)}, "
    f"max {fmt(jr.get('max'), 5)}, above 1 for {100 * jr.get('frac_above_1', float('nan')):.2f}% "
    f"of tokens; trained models: max {fmt(jac_max_trained, 5)}; closed form "
    "sqrt((3 - 2c + sqrt(5 - 4c)) / 2) matches to "
    f"{fmt(jr.get('max_abs_closed_form_gap'), 2)} | does not hold: the norm exceeds 1 "
    "whenever a_t != khat_t; "
    + ("small per token on random inputs, larger in trained models "
       f"(up to {fmt(jac_max_trained, 3)}), and products over long spans stay above 1 "
       "(section 2) |" if jac_max_trained is not None and jac_max_trained > 1.1 else
       "the excess is small per token (see section 2 for products) |"))
  deltanet24, linear24 = cap_mean("deltanet", 24), cap_mean("linear", 24)
  softmax24, softconv24, vla24 = (cap_mean("softmax", 24), cap_mean("softmax_conv", 24),
                                  cap_mean("vla", 24))
  vla24_text = (f"VLA {fmt(vla24)}" if vla24 is not None else
                f"VLA not finished in the 3-seed grid (one earlier seed, better test "
                f"accuracy of two rates: {fmt(smoke_best.get('vla'))})")
  w(f"| MQAR n = 24, d_h 32: VLA 1.000, DeltaNet 0.010, linear 0.074, softmax 0.26 | "
    f"{vla24_text}; DeltaNet {fmt(deltanet24)}, linear {fmt(linear24)}, softmax "
    f"{fmt(softmax24)} without and {fmt(softconv24)} with the short convolution (3 seeds) | the "
    "baselines' low scores are not reproduced: on the same backbone DeltaNet, linear attention "
    "and softmax attention with the short convolution solve n = 24; plain softmax attention did "
    "not learn MQAR in 3000 steps at any rate tried |")
  long_summary = long_section(long_rows)[1] if long_rows else {}
  long_at = lambda m: {T: c["test"].mean() for (mm, T), c in long_summary.items() if mm == m}
  vla_long, dn_long = long_at("vla"), long_at("deltanet")
  if not vla_long and not dn_long:
    w("| n = 8, T up to 512: VLA 1.000, DeltaNet about 0.01 | not run yet (GPU time; "
      "`experiments/grid.py --grids=long`) | open |")
  else:
    seq = lambda d: ", ".join(f"{d[T]:.3f} at T = {T}" for T in sorted(d)) or "not run"
    dn_low = [T for T, a in dn_long.items() if a < 0.5]
    longest = max(list(vla_long) + list(dn_long))
    verdict = ("DeltaNet's low scores are not reproduced where run" if dn_long and not dn_low
               else "DeltaNet fails at some T, as claimed" if dn_low else "open for DeltaNet")
    n_seeds = {(m, T): len(c["test"]) for (m, T), c in long_summary.items()
               if m in ("vla", "deltanet")}
    fewer = [f"{'VLA' if m == 'vla' else 'DeltaNet'} at T = {T}: {n} seed{'s' * (n > 1)}"
             for (m, T), n in sorted(n_seeds.items()) if n < 3]
    seeds = "3 seeds" + (f", except {', '.join(fewer)}" if fewer else "")
    w(f"| n = 8, T up to 512: VLA 1.000, DeltaNet about 0.01 | VLA {seq(vla_long)}; DeltaNet "
      f"{seq(dn_long)} ({seeds}; section 4) | {verdict}; "
      + ("T = 512 not run yet" if longest < 512 else "the seed's whole range run") + " |")
  vla32, vla_p1_32 = cap_mean("vla", 32), cap_mean("vla_p1", 32)
  if vla32 is None:
    verdict32 = "open for VLA"
  elif vla32 > 0.9:
    verdict32 = ("not reproduced: VLA solves n = d_h = 32 on this backbone (so do DeltaNet and "
                 "linear attention)")
  else:
    verdict32 = f"VLA at {fmt(vla32)} on this backbone; see section 3"
  w(f"| 62% at the capacity boundary n = d_h = 32 | VLA at n = 32: "
    f"{fmt(vla32) if vla32 is not None else 'not finished'} (penalty scale 1: "
    f"{fmt(vla_p1_32) if vla_p1_32 is not None else 'not finished'}); DeltaNet "
    f"{fmt(cap_mean('deltanet', 32))}, linear {fmt(cap_mean('linear', 32))} (3 seeds) | "
    f"{verdict32} |")
  w(kernel_claim_row(args.results) + "\n")

  w("## 1. Memory norm ||S_t||_F\n")
  w("Random inputs (`python experiments/state_norms.py --max_T=65536 --out_dir=results`; one "
    "sequence, 4 heads of d_h 32, q, k, v ~ N(0, 1), u a random unit vector / sqrt(d_h); median "
    "over heads):\n")
  if random_norm:
    w("| t | linear attention | DeltaNet | Gated DeltaNet | VLA |")
    w("| --- | --- | --- | --- | --- |")
    for t in sorted(random_norm):
      r = random_norm[t]
      w(f"| {t:,} | {r['linear_attention']:.1f} | {r['deltanet']:.1f} | "
        f"{r['gated_deltanet']:.1f} | {r['vla']:.1f} |")
    w(f"\n![random inputs]({rel(os.path.join(args.results, 'state_norms_random.png'))})\n")
  if trained_models:
    m0 = trained_models[0]
    # One command per --examples value (each row's tokens = examples * T * heads of d_h 32).
    heads = max(1, m0["d_model"] // 32)
    by_examples = {}
    for r in trained_jac:
      by_examples.setdefault(r["tokens"] // (r["T"] * heads), set()).add(r["T"])
    base = (f"python experiments/trained_diagnostics.py --d_model={m0['d_model']} "
            f"--train_T={m0['train_T']} --num_steps={m0['steps']}")
    cmds = [f"`{base} --Ts={','.join(str(t) for t in sorted(Ts))} --examples={e} "
            "--out=results/trained_diagnostics_cpu.jsonl`"
            for e, Ts in sorted(by_examples.items(), key=lambda kv: min(kv[1]))]
    accuracy = {r["mixer"]: r["accuracy"] for r in reversed(trained_models)}
    w("Inside trained models (" + ", then ".join(cmds)
      + (" with the same --workdir, which reuses the trained models" if len(cmds) > 1 else "")
      + "; CPU): one model per "
      f"recurrent mixer trained on MQAR (8 pairs, T = {m0['train_T']}, d_model {m0['d_model']}, "
      "no position embeddings), then fed longer MQAR sequences of the same task; "
      "`vla_jax.diagnostics.layer_state_norms` follows each layer's memory token by token. "
      "Training accuracy at its own length: " + ", ".join(
          f"{m} {a:.3f}" for m, a in accuracy.items()) + ".\n")
    w("| mixer | layer | T | ||S_t|| at t = 1, 10, 100, 1,000, ... (median) | max over tokens |")
    w("| --- | --- | --- | --- | --- |")
    for r in trained_norms:
      w(f"| {r['mixer']} | {r['layer']} | {r['T']:,} | " + ", ".join(
          f"{t:,}: {x:.3g}" for t, x in zip(r["t"], r["median"])) + f" | {max(r['max']):.3g} |")
    w(f"\n![trained models]({rel(os.path.join(plots, 'trained_state_norms.png'))})\n")
  else:
    w("Inside trained models: not measured yet (`experiments/trained_diagnostics.py`).\n")

  w("## 2. VLA's state Jacobian I - khat_t a_t^T (Prop. 2)\n")
  w("`vla_jax.diagnostics.vla_jacobian_norms` measures the spectral norm per token and its closed "
    "form sqrt((3 - 2c + sqrt(5 - 4c)) / 2), c = a_t . khat_t; `vla_jacobian_product_norms` the "
    "norm of products over spans.\n")
  w("| inputs | tokens | median | p99 | max | share above 1 | closed-form gap | products |")
  w("| --- | --- | --- | --- | --- | --- | --- | --- |")
  if jac_random:
    w(f"| random, d_h 32 | {jr['tokens']:,} | {jr['p50']:.5f} | {jr['p99']:.5f} | "
      f"{jr['max']:.5f} | {jr['frac_above_1']:.4f} | {jr['max_abs_closed_form_gap']:.1e} | |")
  for r in jac_demo:
    prods = ", ".join(f"span {k.split('_')[2]}: {v:.3g}" for k, v in r.items()
                      if k.startswith("product_span_"))
    w(f"| trained demo model (T {r['T']}), layer {r['layer']} | {r['tokens']:,} | "
      f"{r['p50']:.5f} | {r['p99']:.5f} | {r['max']:.5f} | {r['frac_above_1']:.4f} | "
      f"{r['max_abs_closed_form_gap']:.1e} | max {prods} |")
  for r in trained_jac:
    prods = ", ".join(f"span {k.split('_')[2]}: {r[k]:.3g}" for k in sorted(r)
                      if k.startswith("product_span_") and k.endswith("_max"))
    w(f"| trained MQAR model, T {r['T']:,}, layer {r['layer']} | {r['tokens']:,} | "
      f"{r['p50']:.5f} | {r['p99']:.5f} | {r['max']:.5f} | {r['frac_above_1']:.4f} | "
      f"{r['closed_form_gap']:.1e} | max {prods} |")
  all_jac = ([jac_random] if jac_random else []) + jac_demo + trained_jac
  span_max = max([v for r in trained_jac for k, v in r.items()
                  if k.startswith("product_span_") and k.endswith("_max")], default=None)
  w("\nThe claim holds only where a_t = khat_t (no penalty). Per token the largest norm measured "
    f"is {fmt(max(r['max'] for r in all_jac), 4)} "
    + (f"(random inputs: {fmt(jac_random['max'], 4)}); " if jac_random else "; ")
    + "what matters over a long context is the product column: a norm above 1 for a product "
    "over a span means a perturbation of the memory can grow over that span, a norm at or "
    "below 1 that the erase steps keep it in check"
    + (f". In the trained MQAR model products over spans of up to 1,024 tokens reach "
       f"{fmt(span_max, 3)}: the VLA memory is not contractive there, and its norm keeps "
       "growing with T (section 1): far more slowly than linear attention's, but not bounded "
       "like DeltaNet's.\n" if span_max is not None else ".\n"))

  w("## 3. MQAR capacity (the seed's setting)\n")
  w("`python experiments/grid.py --grids=capacity --out_dir=OUT --gpus=0,1` (rows in "
    "`results/mqar_capacity_h200.jsonl`). Cells: test accuracy at the best rate, mean ± std "
    "(min) over 3 seeds, @ the rate; rates tried 3e-4, 1e-3, 3e-3. `softmax + conv` is softmax "
    "attention with the same short convolution as the recurrent mixers.\n")
  if capacity:
    w(settings_sentence(capacity) + "\n")
  w(cap_table + "\n")
  if cap:
    w(f"![capacity]({rel(os.path.join(plots, 'mqar_capacity.png'))})\n")
  missing = [f"{MIXER_NAMES[m]} n={n}" for m in MIXER_ORDER for n in PAPER_N
             if (m, n) not in cap]
  w("Not run yet: " + (", ".join(missing) or "none")
    + ". `experiments/grid.py` skips finished jobs, so the same command completes the grid.\n")
  unstable = sorted({(m, n) for (m, n), s in cap.items() if s["test"].min() < 0.5
                     and s["test"].max() > 0.99})
  if unstable:
    w("Seed sensitivity: at the chosen rate, some seeds solve the task and others stay near "
      "chance for " + ", ".join(f"{MIXER_NAMES[m]} n={n}" for m, n in unstable) + ".\n")
  edges = edge_rate_note(cap, lambda n: f"n = {n}")
  if edges:
    w(edges.strip() + "\n")
  beyond = sorted({n for (_, n) in cap if n > 32})
  if beyond:
    parts = []
    for n in beyond:
      means = {m: cap[(m, n)]["test"].mean() for m in MIXER_ORDER if (m, n) in cap}
      top = max(means.values())
      parts.append(f"n = {n}: " + ", ".join(
          f"{MIXER_NAMES[m]} {v:.3f}" + (" (best)" if f"{v:.3f}" == f"{top:.3f}" else "")
          for m, v in sorted(means.items(), key=lambda kv: -kv[1])))
    w("Beyond n = d_h = 32 (more pairs than one head's key dimension; 4 heads per layer), "
      "mean test accuracy at the chosen rate: " + "; ".join(parts) + ".\n")
  vla_labels = ("vla", "vla_p1")
  vla_rows = [r for r in capacity if label(r) in vla_labels]
  if vla_rows:
    by = collections.defaultdict(list)
    for r in sorted(vla_rows, key=lambda r: r["seed"]):
      by[(label(r), r["n_pairs"], r["learning_rate"])].append(first_set(r["test"])["accuracy"])
    w("VLA per seed (test accuracy), all rates; `vla_p1` is VLA with penalty_scale 1 instead of "
      "the authors' 1/sqrt(d_h):\n")
    w("| n | mixer | rate | seeds |")
    w("| --- | --- | --- | --- |")
    for (m, n, lr), accs in sorted(by.items(), key=lambda kv: (kv[0][1], vla_labels.index(
        kv[0][0]), kv[0][2])):
      w(f"| {n} | {MIXER_NAMES[m]} | {lr:g} | " + ", ".join(f"{a:.3f}" for a in accs) + " |")
    w("")
  if smoke:
    w("Earlier one-seed run at n = 24 (`python experiments/mixer_sweep.py --n_pairs=24 "
      "--num_steps=3000 --learning_rates=1e-3,3e-3`, rows in "
      "`results/mixer_sweep_mqar_n24_h200.jsonl`; no validation set, so this is the better "
      "test accuracy of two rates, an optimistic figure): " + ", ".join(
          f"{MIXER_NAMES.get(m, m)} {a:.3f}" for m, a in smoke_best.items()) + ".\n")

  w("## 4. Long context (n = 8, growing T)\n")
  if long_rows:
    w(settings_sentence(long_rows) + "\n")
    out.extend(long_section(long_rows)[0])
  else:
    w("Not run yet: `python experiments/grid.py --grids=long --out_dir=OUT --gpus=0,1` "
      "(configs/mqar_long.py, T = 64 to 4096; `--long_Ts` extends it).\n")
  w("## 5. Zoology's MQAR against state size\n")
  zoo = R("mqar_zoology_h200.jsonl")
  if zoo:
    w(settings_sentence(zoo) + "\n")
    out.extend(zoology_section(zoo, os.path.join(plots, "zoology_state_size.png"), rel))
  else:
    w("Not run yet: `python experiments/grid.py --grids=zoology --out_dir=OUT --gpus=0,1`.\n")
  w("## 6. Copy\n")
  copy_rows = R("copy_h200.jsonl")
  if copy_rows:
    w(settings_sentence(copy_rows) + "\n")
    out.extend(copy_section(copy_rows))
  else:
    w("Not run yet: `python experiments/grid.py --grids=copy --out_dir=OUT --gpus=0,1` (trained "
      "at lengths up to 64, scored by greedy generation at 64, 128 and 256).\n")
  w("## 7. VLA's hyperparameters and readout\n")
  ablation = R("ablation_h200.jsonl")
  if ablation:
    w(settings_sentence(ablation) + "\n")
    out.extend(ablation_section(ablation))
  if ablation_demo:
    variants = list(dict.fromkeys(r["variant"] for r in ablation_demo))
    steps = ablation_demo[0]["steps"]
    w("CPU, the README's demo problem (`configs/mqar_demo.py`: MQAR 8 pairs, T = 25, d_model 64, "
      f"2 heads of 32), {steps} steps at rate 3e-3, 3 seeds, one variant changed at a time "
      f"(`python experiments/grid.py --grids=ablation_demo --demo_steps={steps} --out_dir=OUT "
      "--per_gpu=1`, rows in `results/vla_ablation_demo_cpu.jsonl`). Test accuracy per seed:\n")
    w("| variant | mean ± std | seeds |")
    w("| --- | --- | --- |")
    for v in variants:
      accs = np.array([first_set(r["test"])["accuracy"] for r in ablation_demo
                       if r["variant"] == v])
      w(f"| {v} | {accs.mean():.3f} ± {accs.std():.3f} | "
        + ", ".join(f"{a:.3f}" for a in accs) + " |")
    w("\nVariants: lam0 (the ridge, default 1), penalty-0 (penalty_scale 0: u = 0, so a_t = "
      "khat_t, DeltaNet with beta 1), penalty-1 (penalty_scale 1 instead of 1/sqrt(d_h)), "
      "readout additive (the authors' normaliser) or delta (a normaliser carried by the same "
      "recurrence), no-conv (the authors' layer without the short convolution).\n")
    planned = ("defaults", "lam0-0.1", "lam0-10", "penalty-0", "penalty-1", "readout-additive",
               "readout-delta", "no-conv")
    unfinished = [v for v in planned if v not in variants]
    if unfinished:
      w("Not finished within the CPU time of the run: " + ", ".join(unfinished) + ".\n")
  if ablation_cpu:
    w("Earlier, one seed (`configs/mqar_demo.py`, 500 steps; `python "
      "experiments/train.py --config=configs/mqar_demo.py --config.train.num_steps=500 "
      "--config.model.options.vla.<field>=<value>`):\n")
    w("| setting | accuracy | exact match |")
    w("| --- | --- | --- |")
    for r in ablation_cpu:
      w(f"| {r['override']} | {r['accuracy']:.3f} | {r['exact_match']:.3f} |")
    w("\nOn the one-seed rows a stronger penalty relative to lam0 learned faster; the 3-seed rows "
      "above are the ones to read.\n")
  if ablation_demo:
    means = {v: np.mean([first_set(r["test"])["accuracy"] for r in ablation_demo
                         if r["variant"] == v]) for v in variants}
    best = max(means, key=means.get)
    readout_ok = means.get("defaults", 0) >= max(means.get("readout-additive", 0),
                                                 means.get("readout-delta", 0))
    w(f"Reading: the best variant is `{best}` ({means[best]:.3f} mean, against "
      f"{means.get('defaults', float('nan')):.3f} for the defaults). With the defaults (lam0 1, "
      "penalty scale 1/sqrt(d_h), the authors' choices) some seeds stay near chance, as in the "
      f"capacity grid (section 3). {penalty_reading(cap)}"
      + ("The readout default (none) was chosen by measurement, `vla_jax/layers/README.md`; the "
         "3-seed rows above agree (none beats additive and delta on average).\n" if readout_ok
         else "On these rows the default readout (none) does not beat the additive or delta "
         "readouts on average; the earlier one-seed measurement behind that default is in "
         "`vla_jax/layers/README.md`.\n"))
  with open(args.out, "w") as f:
    f.write("\n".join(out) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
