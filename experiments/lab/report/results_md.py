"""The generated parts of RESULTS.md, the full tables under results/tables/ and the plots under
results/plots/, from the rows under results/training/.

RESULTS.md itself is written by hand around marked blocks (`lab.markers`): `write_results_md`
rewrites the blocks only. The findings' claims are checked against the same rows by
`lab.report.findings`.
"""

import dataclasses
import os

import numpy as np

from lab import markers
from lab.grid import ABLATION_VARIANTS, PAPER_N, TUNED_STEPS, TUNED_T, ZOOLOGY, ZOOLOGY_WIDTHS
from lab.report import copy_task, markdown, memory, mqar, plots, seeds, text, zoology
from lab.report import studies as study_report
from lab.report.rows import grid_summary, mixers_in, name, read
from lab.studies import WOD_STEPS

FILES = {
    "capacity": "mqar_capacity_h200.jsonl",
    "long": "mqar_long_h200.jsonl",
    "zoology": "mqar_zoology_h200.jsonl",
    "zoology_tuned": "zoology_tuned_h200.jsonl",
    "copy": "copy_h200.jsonl",
    "ablation": "ablation_h200.jsonl",
    "ablation_demo": "vla_ablation_demo_cpu.jsonl",
    "ablation_one_seed": "vla_penalty_ablation_cpu.jsonl",
    "mixer_sweep": "mixer_sweep_mqar_n24_h200.jsonl",
    "state_norms": "state_norms_cpu.jsonl",
    "trained_diagnostics": "trained_diagnostics_cpu.jsonl",
    "decode": "decode_h200.jsonl",
}
PLOTS = {"capacity": "mqar_capacity.png", "zoology": "zoology_state_size.png",
         "trained_norms": "trained_state_norms.png", "random_norms": "state_norms_random.png",
         "seed_remedies": "seed_remedies_h200.png", "text": "text_lm.png",
         "weights_or_data": "weights_or_data.png"}
# Drawn by `experiments/plot_run.py` from the section 9 run (not by this report).
SEED_PLOT = "seed_failures_h200.png"
# The full tables, one file each under results/tables/: (file stem, title).
TABLES = (("memory", "Memory norm ||S_t||_F"), ("jacobian", "VLA's state Jacobian"),
          ("capacity", "MQAR capacity"), ("long_context", "Long context (n = 8, growing T)"),
          ("zoology", "Zoology's MQAR against state size"), ("copy", "Copy"),
          ("ablation", "VLA's hyperparameters and readout"),
          ("decode", "Decoding: a fixed-size state against a KV cache"),
          ("seed_failures", "Why VLA seeds fail"),
          ("weights_or_data", "Weights or data: what decides whether a VLA run leaves the "
           "plateau"),
          ("seed_fix", "VLA with DeltaNet's query/key path and a learned write strength"),
          ("authors_layer", "The authors' layer as published"),
          ("baselines_t512", "Baselines as their authors configure them, T = 512"),
          ("bf16_parity", "Mixed precision against float32"))


@dataclasses.dataclass
class Results:
  """The rows under results/training/ and the summaries the report reads from them."""
  rows_dir: str
  rows: dict          # {FILES key: rows}
  kinds: dict         # the diagnostics rows by kind (memory.split_norm_rows)
  capacity: dict      # {(label, n_pairs): cell}
  long: dict          # {(label, T): cell}
  zoology: dict       # {(label, (T, d_model)): cell} at 4,000 steps (the combined sweep)
  zoology_long: dict  # the same at T = TUNED_T, TUNED_STEPS steps
  pending: dict       # {(label, setting, steps): rates not run yet}
  copy: dict          # copy_task.copy_summary
  remedies: dict      # {(T, d_model): {variant: run table}} (seeds.remedy_tables)
  lr: dict            # {label: run table} of the learning-rate run (seeds.lr_tables)
  text: list          # text.summary of the language-modelling study's rows
  text_curves: dict   # text.curves of its jobs
  studies: dict       # {study: lab.studies.StudyData} (study_report.load_all)


def load(rows_dir):
  """The Results of the rows in `rows_dir` (results/training)."""
  rows = {key: read(os.path.join(rows_dir, f)) for key, f in FILES.items()}
  short, long, pending, _ = zoology.sweep_summaries(rows["zoology"], rows["zoology_tuned"])
  text_rows = text.rows(rows_dir)
  text_entries = text.summary(text_rows)
  return Results(
      rows_dir=rows_dir, rows=rows,
      kinds=memory.split_norm_rows(rows["state_norms"], rows["trained_diagnostics"]),
      capacity=grid_summary(rows["capacity"], "n_pairs"),
      long=grid_summary(rows["long"], "seq_len"), zoology=short, zoology_long=long,
      pending=pending, copy=copy_task.copy_summary(rows["copy"]) if rows["copy"] else {},
      remedies=seeds.remedy_tables(os.path.join(rows_dir, seeds.REMEDY_FOLDER))[0],
      lr=seeds.lr_tables(os.path.join(rows_dir, seeds.FOLDER)),
      text=text_entries, text_curves=text.curves(os.path.join(rows_dir, text.RUNS_FOLDER),
                                                 text_rows, text_entries),
      studies=study_report.load_all(rows_dir))


# -- compact tables -------------------------------------------------------------------------------

def _acc(x):
  return "-" if x is None else f"{x:.3f}"


def _mean(summary, key):
  c = summary.get(key)
  return None if c is None else float(c["test"].mean())


def _grid_table(summary, settings, heading):
  """Mixers by rows, settings by columns: mean test accuracy at the chosen rate."""
  return markdown.table(["mixer"] + [heading(v) for v in settings],
                        [[name(m)] + [_acc(_mean(summary, (m, v))) for v in settings]
                         for m in mixers_in(summary)])


def _link(stem, out_dir, results_dir):
  path = os.path.relpath(os.path.join(results_dir, "tables", f"{stem}.md"), out_dir)
  return f"[{path}]({path})"


def _plot(key_or_file, out_dir, results_dir):
  return os.path.relpath(os.path.join(results_dir, "plots", PLOTS.get(key_or_file, key_or_file)),
                         out_dir)


def memory_block(res, link):
  random = {r["t"]: r for r in res.kinds.get("state_norm_random", [])}
  mixers = memory.RANDOM_MIXERS
  lines = [f"Random inputs (median over heads; every t, layer and length, the commands: {link}):",
           "", markdown.table(
      ["t"] + [n for _, n in mixers],
      [[f"{t:,}"] + [f"{random[t][m]:.1f}" for m, _ in mixers] for t in sorted(random)
       if t >= 100])]
  norms = res.kinds.get("trained_state_norm", [])
  T = max((r["T"] for r in norms), default=None)
  if T:
    marks = [100, 1000, 10000, T]
    at = {m: memory.trained_norm_at(norms, m, T) for m in ("linear", "deltanet",
                                                           "gated_deltanet", "vla")}
    lines += ["", f"Inside models trained on MQAR at T = 64, fed T = {T:,} (largest layer, "
              "median over sequences and heads):", "", markdown.table(
                  ["mixer"] + [f"t = {t:,}" for t in marks],
                  [[name(m)] + [f"{a[t]:.3g}" if t in a else "-" for t in marks]
                   for m, a in at.items() if a])]
  return "\n".join(lines)


def jacobian_block(res, link):
  def row(text, rs, gap_key):
    spans = [v for r in rs for k, v in r.items()
             if k.startswith("product_span_") and (k.endswith("_max") or k.count("_") == 2)]
    return [text, f"{max(r['p50'] for r in rs):.4f}", f"{max(r['max'] for r in rs):.4f}",
            f"{min(r['frac_above_1'] for r in rs):.4f}",
            f"{max(spans):.4f}" if spans else "-"]
  body = []
  random = res.kinds.get("jacobian_random", [])
  if random:
    body.append(row("random, d_h 32", random, "max_abs_closed_form_gap"))
  demo = res.kinds.get("trained", [])
  if demo:
    body.append(row(f"trained demo model, T = {demo[0]['T']}", demo, ""))
  trained = res.kinds.get("trained_jacobian", [])
  for T in sorted({r["T"] for r in trained}):
    body.append(row(f"trained MQAR model, T = {T:,}", [r for r in trained if r["T"] == T], ""))
  return "\n".join([
      f"Per token, the largest over layers (share above 1: the smallest; per layer: {link}):",
      "",
      markdown.table(["inputs", "median", "max", "share above 1", "max product over a span"],
                     body)])


def capacity_block(res, link, plot):
  return "\n".join([
      "Mean test accuracy over 3 seeds at the rate chosen on validation, n pairs, T = 3n + 1 "
      f"(std, min, rate, seeds: {link}):", "",
      _grid_table(res.capacity, PAPER_N, lambda n: f"n = {n}"), "", f"![capacity]({plot})"])


def long_block(res, link):
  Ts = sorted({T for _, T in res.long})
  return "\n".join([
      f"Mean test accuracy over 3 seeds at the chosen rate, 8 pairs (std, min, rate: {link}):",
      "", _grid_table(res.long, Ts, lambda T: f"T = {T:,}")])


def zoology_block(res, link, plot):
  settings = zoology.settings_run(res.zoology)
  labels = mixers_in({**res.zoology, **{(m, st): None for m, st, s in res.pending
                                        if s == zoology.STEPS}})

  def cell(summary, m, st, steps):
    if (m, st, steps) in res.pending:
      return "pending"
    return _acc(_mean(summary, (m, st)))
  widths = [d for d, _ in ZOOLOGY_WIDTHS]
  long_labels = mixers_in(res.zoology_long)
  waiting = [m for m in mixers_in({**res.zoology_long, **{(m, st): None for m, st, s in res.pending
                                                         if s == TUNED_STEPS}})
             if m not in long_labels]
  return "\n".join([
      f"Mean test accuracy over 3 seeds at the chosen rate, {zoology.STEPS:,} steps (std, min, "
      f"rates, state sizes, seeds: {link}):", "",
      markdown.table(["T (pairs), d_model"] + [name(m) for m in labels],
                     [[f"{T} ({dict(ZOOLOGY)[T]}), {d}"]
                      + [cell(res.zoology, m, (T, d), zoology.STEPS) for m in labels]
                      for T, d in settings]), "",
      f"T = {TUNED_T} ({dict(ZOOLOGY)[TUNED_T]} pairs), {TUNED_STEPS:,} steps:", "",
      markdown.table(["mixer"] + [f"d_model {d}" for d in widths],
                     [[name(m)] + [cell(res.zoology_long, m, (TUNED_T, d), TUNED_STEPS)
                                   for d in widths] for m in long_labels]), "",
      *([f"Every cell pending: {', '.join(name(m) for m in waiting)}.", ""] if waiting else []),
      f"![zoology MQAR: accuracy against state size]({plot})"])


def copy_block(res, link):
  L = copy_task.LENGTHS
  body = [[name(m)] + [f"{s['scores'][(n, 'generated_exact_match')].mean():.3f}" for n in L]
          + [f"{s['scores'][(n, 'generated_accuracy')].mean():.3f}" for n in L[:2]]
          for m, s in res.copy.items()]
  return "\n".join([
      "Greedy generation, mean over 3 seeds, trained on strings up to L = 64 (std, rates, "
      f"teacher-forced: {link}):", "",
      markdown.table(["mixer"] + [f"exact, L = {n}" for n in L]
                     + [f"token, L = {n}" for n in L[:2]], body)])


def ablation_block(res, link):
  rows, demo = res.rows["ablation"], mqar.demo_means(res.rows["ablation_demo"])
  rates = sorted({r["learning_rate"] for r in rows})
  ran = {r["variant"] for r in rows} | set(demo)
  variants = [v for v, _ in ABLATION_VARIANTS if v in ran]
  at = lambda v, lr: [r for r in rows if r["variant"] == v and r["learning_rate"] == lr]
  body = [[mqar.VARIANT_NAMES.get(v, v)]
          + [_acc(float(np.mean([mqar.accuracy(r) for r in at(v, lr)])) if at(v, lr) else None)
             for lr in rates] + [_acc(demo.get(v))] for v in variants]
  return "\n".join([
      "Mean test accuracy over 3 seeds, one setting changed from the defaults (VLA-a) (per "
      f"seed: {link}):", "",
      markdown.table(["variant"] + [f"n = 24, rate {lr:g}" for lr in rates]
                     + ["CPU demo, 500 steps"], body)])


def decode_block(res, link):
  at = {(r["mixer"], r["context"]): r for r in res.rows["decode"]}
  contexts = sorted({r["context"] for r in res.rows["decode"]})
  get = lambda m, L, k, x=1: f"{x * at[(m, L)][k]:.1f}" if (m, L) in at else "-"
  return "\n".join([
      f"One layer, H = 16, d_h = 64, bfloat16, batch 1, H200 (tokens/s, command: {link}):", "",
      markdown.table(["context", "VLA µs/token", "softmax µs/token", "VLA state MiB",
                      "KV cache MiB"],
                     [[f"{L:,}", get("vla", L, "ms_per_token", 1e3),
                       get("softmax", L, "ms_per_token", 1e3),
                       get("vla", L, "cache_mib_per_seq"), get("softmax", L, "cache_mib_per_seq")]
                      for L in contexts])])


def seeds_block(res, link, remedy_plot, lr_plot):
  cells = sorted(res.remedies)
  labels = [v for v, _ in seeds.REMEDY_VARIANTS]
  got = lambda c, v: res.remedies.get(c, {}).get(v)
  count = lambda rs: f"{len(seeds.failed(rs))} of {len(rs)}" if rs else "pending"
  body = [[seeds.variant_name(v)] + [count(got(c, v)) for c in cells] for v in labels]
  for k, t in res.lr.items():
    for x in sorted({r["rate"] for r in t}):
      if x != float(seeds.REMEDY_RATE):
        body.append([f"{seeds.variant_name(seeds.LR_VARIANTS[k])}, rate {x:g}",
                     count([r for r in t if r["rate"] == x])] + ["-"] * (len(cells) - 1))
  return "\n".join([
      f"Failed seeds (test accuracy below {seeds.SOLVED}), rate {float(seeds.REMEDY_RATE):g} "
      f"unless named (per run, W_u gradients, commands: {link}):", "",
      markdown.table(["variant"] + [f"T = {T}, d_model {d}" for T, d in cells], body), "",
      f"![loss and W_u gradient per run, failed and solved seeds]({remedy_plot}) "
      f"![training diagnostics per run]({lr_plot})"])


# -- the report -----------------------------------------------------------------------------------

def full_tables(res):
  """{file stem: markdown} of the full tables (`TABLES`)."""
  r = res.rows
  blocks = {
      "memory": memory.norms_tables(res.kinds), "jacobian": memory.jacobian_tables(res.kinds),
      "capacity": mqar.capacity_tables(r["capacity"], r["mixer_sweep"])[0],
      "long_context": mqar.long_tables(r["long"])[0],
      "zoology": zoology.zoology_tables(r["zoology"], r["zoology_tuned"]),
      "copy": copy_task.copy_tables(r["copy"]),
      "ablation": mqar.ablation_tables(r["ablation"], r["ablation_demo"],
                                       r["ablation_one_seed"]),
      "decode": memory.decode_tables(r["decode"]),
      "seed_failures": seeds.seed_tables(res.rows_dir),
      **study_report.full_tables(res.studies, r["capacity"])}
  intro = ("Generated by `python experiments/report_results.py` from the rows in "
           "`results/training/` (`results/README.md` lists each file); the findings are in "
           "RESULTS.md. Labels as defined at the top of RESULTS.md.")
  return {stem: "\n\n".join([f"# {title}", intro] + [b for b in blocks[stem] if b]) + "\n"
          for stem, title in TABLES}


def generated_blocks(res, out_dir, results_dir):
  """{block name: markdown} of RESULTS.md's generated blocks; links relative to `out_dir`."""
  link = lambda stem: _link(stem, out_dir, results_dir)
  plot = lambda key: _plot(key, out_dir, results_dir)
  makers = {
      "memory": (("state_norms",), lambda: memory_block(res, link("memory"))),
      "jacobian": (("state_norms",), lambda: jacobian_block(res, link("jacobian"))),
      "capacity": (("capacity",), lambda: capacity_block(res, link("capacity"),
                                                         plot("capacity"))),
      "long_context": (("long",), lambda: long_block(res, link("long_context"))),
      "zoology": (("zoology",), lambda: zoology_block(res, link("zoology"), plot("zoology"))),
      "copy": (("copy",), lambda: copy_block(res, link("copy"))),
      "ablation": (("ablation", "ablation_demo"), lambda: ablation_block(res, link("ablation"))),
      "decode": (("decode",), lambda: decode_block(res, link("decode"))),
      "seed_failures": ((), lambda: seeds_block(res, link("seed_failures"), plot("seed_remedies"),
                                                plot(SEED_PLOT))),
      "text": ((), lambda: text.block(
          res.text, res.text_curves,
          f"![bits per byte against length, by position, training curves]({plot('text')})")),
  }
  out = {}
  for block, (keys, make) in makers.items():
    missing = [FILES[k] for k in keys if not res.rows[k]]
    if block == "seed_failures" and not res.remedies:
      missing = [seeds.REMEDY_FOLDER + "/"]
    if block == "text" and not res.text:
      missing = [text.ROWS_GLOB]
    out[block] = (make() if not missing else
                  "No rows yet: " + ", ".join(f"`results/training/{f}`" for f in missing) + ".")
  # The studies of lab.studies: "not run yet" until their files are under results/training.
  out.update(study_report.blocks(res.studies, res.rows["capacity"], link,
                                 plot("weights_or_data")))
  return out


def draw_plots(res, plots_dir):
  """The plots RESULTS.md links (all but the two drawn by other scripts)."""
  os.makedirs(plots_dir, exist_ok=True)
  path = lambda key: os.path.join(plots_dir, PLOTS[key])
  if res.capacity:
    plots.plot_capacity(res.capacity, PAPER_N, path("capacity"))
  if res.zoology:
    plots.plot_zoology(res.zoology, dict(ZOOLOGY), path("zoology"))
  if res.kinds.get("trained_state_norm"):
    plots.plot_trained_norms(res.kinds["trained_state_norm"], path("trained_norms"))
  if res.text:
    plots.plot_text(res.text, res.text_curves, path("text"))
  panels = seeds.curve_panels(res.rows_dir)
  if panels:
    plots.plot_seed_runs(panels, path("seed_remedies"))
  wod = study_report.weights_or_data_summary(res.studies["weights_or_data"])
  if wod["grid"]:
    plots.plot_weights_or_data(wod, WOD_STEPS, seeds.SOLVED, path("weights_or_data"))


def write_results_md(results_dir, out, draw=True):
  """Rewrites the generated blocks of `out` (RESULTS.md; its other lines are left as they are;
  a new file holds the blocks alone) and results_dir/tables/*.md from results_dir/training, and with draw=True the plots under
  results_dir/plots. Raises ValueError when `out` lacks a block's markers."""
  res = load(os.path.join(results_dir, "training"))
  out_dir = os.path.dirname(os.path.abspath(out))
  blocks = generated_blocks(res, out_dir, results_dir)
  if os.path.exists(out):
    with open(out) as f:
      text = f.read()
  else:   # a new report: its blocks in order, the findings to be written around them
    text = markers.skeleton(blocks)
  text = markers.replace_blocks(text, blocks, out)
  tables_dir = os.path.join(results_dir, "tables")
  os.makedirs(tables_dir, exist_ok=True)
  for stem, md in full_tables(res).items():
    with open(os.path.join(tables_dir, f"{stem}.md"), "w") as f:
      f.write(md)
  if draw:
    draw_plots(res, os.path.join(results_dir, "plots"))
  with open(out, "w") as f:
    f.write(text)
