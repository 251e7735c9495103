"""The tables behind RESULTS.md are computed from their rows (`lab.report`): best rate on
validation, test mean over seeds, the notes under each full table."""

import json
import pathlib
import shutil

import numpy as np

from lab.report import copy_task, markdown, memory, mqar, notes, rows, zoology

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _row(mixer, lr, seed, test, val, T=64, d_model=128, steps=4000):
  return {"label": mixer, "mixer": mixer.removesuffix("_slow"), "learning_rate": lr,
          "seed": seed, "steps": steps, "seq_len": T, "d_model": d_model,
          "test": {"mqar": {"accuracy": test}}, "validation": {"mqar": {"accuracy": val}}}


def _cell(mixer, accuracies, T=512, d_model=64, steps=4000):
  """Rows of one cell, 3 seeds: accuracies {rate: (test, validation)}."""
  return [_row(mixer, lr, s, test, val, T=T, d_model=d_model, steps=steps)
          for lr, (test, val) in accuracies.items() for s in range(3)]


def _text(blocks):
  return "\n\n".join(b for b in blocks if b)


def test_best_rate_is_chosen_on_validation():
  group = [_row("vla", lr, s, test, val) for lr, test, val in ((1e-3, 0.9, 0.5),
                                                                (3e-3, 0.4, 0.6))
           for s in range(2)]
  rate, test, rates = rows.best_rate(group)
  assert rate == 3e-3 and rates == [1e-3, 3e-3]
  np.testing.assert_array_equal(test, [0.4, 0.4])


def test_state_floats():
  assert rows.state_floats("deltanet", 128, 64) == 4 * 32 * 32
  assert rows.state_floats("vla", 128, 64) == 2 * 4 * 32 * 32       # S and A
  assert rows.state_floats("softmax_conv", 64, 512) == 2 * 512 * 64  # KV cache


def test_zoology_section_from_rows():
  data = [_row("deltanet", lr, s, 1.0 if lr == 1e-3 else 0.5, 1.0 if lr == 1e-3 else 0.4)
          for lr in (1e-3, 3e-3) for s in range(3)]
  data += [_row("vla", 3e-3, s, acc, acc) for s, acc in enumerate((0.25, 0.97, 0.25))]
  blocks = zoology.zoology_tables(data)
  summary = zoology.sweep_summaries(data, [])[0]
  text = _text(blocks)
  assert "| setting | DeltaNet | VLA-a |" in text
  assert ("| T = 64, d_model = 128 | 1.000 ± 0.000 (min 1.000) @ 0.001 | 0.490 ± 0.339 "
          "(min 0.250) @ 0.003 (of 1 rate) |") in text       # the validated rate; fewer rates
  assert "| 128 | 4,096 | 8,192 | 16,384 |" in text          # state per layer
  assert ("| T = 64 d_model 128 | VLA-a | 0.250, 0.970, 0.250 |"
          in text)   # seeds split
  assert "Not run yet (device time): T = 64 d_model 64, " in text
  assert "Mixers not yet run at a setting: T = 64, d_model 128: softmax / " in text
  assert summary[("vla", (64, 128))]["rate"] == 3e-3


def test_pallas_note_groups_settings_by_seeds():
  data = [dict(_row("vla", 3e-3, s, 1.0, 1.0, T=T), model={"impl": impl})
          for s, T, impl in ((0, 128, "pallas"), (1, 128, "pallas"), (2, 128, "chunked"),
                             (0, 256, "pallas"), (1, 256, "pallas"), (0, 512, "pallas"))]
  note = notes.pallas_note(data, lambda r: r["seq_len"], lambda T: f"T = {T}")
  assert note.endswith("seeds 0, 1 at T = 128, T = 256; seed 0 at T = 512."), note
  assert notes.pallas_note(data[2:3], lambda r: r["seq_len"], str) == ""


def test_long_section_names_single_rate_settings_and_finds_the_first_failure():
  data = [_row("deltanet", lr, s, 1.0, 1.0, T=1024) for lr in (1e-3, 3e-3) for s in range(3)]
  data += [_row("deltanet", 1e-3, s, 1.0, 1.0, T=2048) for s in range(3)]
  data += [_row("vla", 3e-3, s, 0.5, 0.5, T=2048) for s in range(3)]
  blocks, summary = mqar.long_tables(data)
  text = _text(blocks)
  assert len(summary[("deltanet", 2048)]["rates"]) == 1
  assert "Trained at one rate only" in text
  assert "T = 2048: DeltaNet 0.001, VLA-a 0.003" in text
  assert "T = 1024: DeltaNet" not in text.split("Trained at one rate only")[1]


def test_dtype_note_names_runs_not_in_float32():
  data = [dict(_row("softmax", 1e-3, s, 1.0, 1.0, T=4096), model={"dtype": "bfloat16"})
          for s in range(3)]
  data += [dict(_row("deltanet", 1e-3, s, 1.0, 1.0, T=4096), model={"dtype": "float32"})
           for s in range(3)]
  data += [_row("linear", 1e-3, 0, 1.0, 1.0, T=4096)]          # older rows: no dtype recorded
  text = _text(mqar.long_tables(data)[0])
  assert "Trained with bfloat16 activations" in text
  assert "do not fit in memory there): softmax at T = 4096." in text, text
  assert notes.dtype_note(data[3:], str) == ""


def test_long_section_lists_rates_tried_on_fewer_seeds():
  """A rate run on fewer seeds than the cell's other rate is listed with its per-seed test
  accuracies; the table keeps the better rate by mean validation accuracy; a softmax+conv
  run (mixer "softmax", label "softmax_conv") is named by its label."""
  data = [_row("vla", 3e-3, s, acc, acc, T=4096) for s, acc in enumerate((1.0, 0.13, 0.14))]
  data += [_row("vla", 1e-3, s, acc, acc, T=4096) for s, acc in ((1, 0.128), (2, 0.129))]
  data += [dict(_row("softmax", 1e-3, 0, 1.0, 1.0, T=4096), label="softmax_conv",
                model={"dtype": "bfloat16"})]
  blocks, summary = mqar.long_tables(data)
  text = _text(blocks)
  assert summary[("vla", 4096)]["rate"] == 3e-3
  assert ("VLA-a at T = 4096, rate 0.001, seeds 1, 2: 0.128, "
          "0.129.") in text, text
  assert "rate 0.003, seed" not in text
  assert "softmax+conv at T = 4096." in text
  assert notes.partial_rates_note(data[:3], "seq_len", str) == ""


def test_settings_sentence_reads_the_rows():
  """The settings a section states come from its rows: the common value, then the others with
  their row counts; MQAR test examples are targets / n_pairs."""
  def row(batch, dtype, d_model, targets):
    return {"task": "mqar", "batch_size": batch, "steps": 3000, "task_fields": {"n_pairs": 8},
            "model": {"d_model": d_model, "num_layers": 2, **({"dtype": dtype} if dtype else {})},
            "test": {"mqar": {"accuracy": 1.0, "targets": targets}}}
  data = [row(64, None, 128, 8000)] * 3 + [row(64, "bfloat16", 256, 8000)]
  assert rows.settings_sentence(data) == (
      "Settings of these 4 rows: batch 64; 3,000 steps; float32 (bfloat16 in 1 row); "
      "d_model 128 (d_model 256 in 1 row); 2 layers; 1,000 test examples per set.")


def test_edge_rate_note_counts_cells_below_at_an_edge_of_their_sweep():
  """Cells below 0.99 are counted by where their chosen rate lies in the rates tried there;
  single-rate cells and cells at or above 0.99 are left out."""
  data = [_row("vla", lr, s, acc, acc) for lr, acc in ((1e-3, 0.5), (3e-3, 0.9))
          for s in range(3)]                                          # chose the highest
  data += [_row("deltanet", lr, s, acc, acc) for lr, acc in ((3e-4, 0.2), (1e-3, 0.8),
                                                               (3e-3, 0.1)) for s in range(3)]
  data += [_row("linear", lr, s, acc, acc, T=128) for lr, acc in ((1e-3, 1.0), (3e-3, 0.9))
           for s in range(3)]                                          # solved: left out
  data += [_row("softmax", 1e-3, s, 0.3, 0.3) for s in range(3)]         # one rate: left out
  summary = rows.grid_summary(data, "seq_len")
  assert summary[("deltanet", 64)]["rates"] == [3e-4, 1e-3, 3e-3]
  note = notes.edge_rate_note(summary, lambda T: f"T = {T}")
  assert note.startswith("Rate sweep edges: of the 2 cells below 0.99, 0 chose the lowest rate "
                         "tried, 1 the highest and 1 one inside the sweep"), note
  assert note.endswith("| VLA-a | - | T = 64 @ 0.003 |"), note
  solved = {k: c for k, c in summary.items() if k[0] == "linear"}
  assert notes.edge_rate_note(solved, str) == ""


def test_wider_sweep_note_and_table_mark_cells_off_the_usual_sweep():
  """The usual sweep is the rate set of most cells; a cell with a rate added is named with the
  added rate and the rate chosen, and its table cell says how many rates it had."""
  data = [_row(m, lr, s, 1.0, 1.0, T=T) for m in ("linear", "deltanet") for T in (64, 128)
          for lr in (1e-3, 3e-3) for s in range(3)]
  data += [_row("vla", lr, s, acc, acc, T=128) for lr, acc in ((3e-4, 0.7), (1e-3, 0.6),
                                                                 (3e-3, 0.1)) for s in range(3)]
  summary = rows.grid_summary(data, "seq_len")
  table = mqar.accuracy_table(summary, [64, 128], lambda T: f"T = {T}")
  assert ("| VLA-a | not run | 0.700 ± 0.000 (min 0.700) @ 0.0003 "
          "(of 3 rates) |") in table
  assert "(of 2 rates)" not in table                       # the usual sweep is not annotated
  note = notes.wider_sweep_note(summary, lambda T: f"T = {T}")
  assert note == ("Rates added to the usual sweep (0.001, 0.003) at some cells: VLA-a at "
                  "T = 128: 0.0003 (chosen: 0.0003)."), note
  plain = {k: c for k, c in summary.items() if k[0] != "vla"}
  assert notes.wider_sweep_note(plain, str) == ""


def test_copy_section_chooses_the_rate_at_the_training_length():
  def row(m, lr, seed, exact, val):
    scores = lambda e: {f"copy_L{n}": {"generated_exact_match": e if n == 64 else 0.0,
                                       "generated_accuracy": e, "accuracy": 1.0}
                        for n in copy_task.LENGTHS}
    return {"label": m, "mixer": m, "learning_rate": lr, "seed": seed, "steps": 10,
            "test": scores(exact), "validation": {"copy_L64": {"generated_accuracy": val}},
            "diverged": None if m == "deltanet" else False}
  data = [row("deltanet", lr, s, e, e) for lr, e in ((1e-3, 0.9), (3e-3, 0.2)) for s in (0, 1)]
  data += [row("vla", 3e-3, s, 0.1 + 0.7 * s, 0.5) for s in (0, 1)]
  text = _text(copy_task.copy_tables(data))
  assert "| DeltaNet | 0.001 | 0.900 ± 0.000 | 0.900 ± 0.000 | 0.000 ± 0.000 |" in text
  assert "The rows of DeltaNet record no training loss" in text


def test_decode_section_reads_both_mixers():
  data = [{"mixer": m, "context": L, "batch": 1, "ms_per_token": ms, "tokens_per_s": 1e3 / ms,
           "cache_mib_per_seq": mib}
          for m, L, ms, mib in (("vla", 1024, 0.034, 0.5), ("softmax", 1024, 0.034, 5.0),
                                ("vla", 4096, 0.034, 0.5), ("softmax", 4096, 0.068, 17.0))]
  text = _text(memory.decode_tables(data))
  assert "| 4,096 | 0.034 | 29,412 | 0.5 | 0.068 | 14,706 | 17 |" in text
  assert "Not measured yet" in _text(memory.decode_tables([]))


def test_listed_and_table():
  assert [markdown.listed(x) for x in ([], ["a"], ["a", "b", "c"])] == ["", "a", "a, b and c"]
  assert markdown.table(["a", "b"], [[1, "||S||"]]) == (
      "| a | b |\n| --- | --- |\n| 1 | \\|\\|S\\|\\| |")     # a "|" in a cell is escaped


def test_seed_section_escape_and_probe_values(tmp_path):
  """Section 9 reads a sweep's metrics and runs: the escape step is the first training row
  above 0.5, the probe values are those at step 300, and failed runs are counted per rate."""
  from lab.report import seeds  # pylint: disable=import-outside-toplevel
  folder = tmp_path / seeds.FOLDER
  folder.mkdir()
  diag = lambda c, a: {"layer0.cond_A.t8": [1.0, 1.0], "layer0.cond_A.t64": c,
                       "layer1.cond_A.t64": c, "layer0.align_mean": a,
                       "layer1.align_mean": a, "layer1.state_norm_end": [0.5, 9.0]}
  metrics = [{"step": 0, "diagnostics": diag([1.0, 1.0], [1.0, 1.0])},
             {"step": 250, "loss": [2.0, 2.0], "accuracy": [0.25, 0.3]},
             {"step": 300, "diagnostics": diag([2.5, 3.5], [0.9, 0.8])},
             {"step": 500, "loss": [2.0, 0.1], "accuracy": [0.25, 0.7]},
             {"step": 600, "diagnostics": diag([9.0, 9.0], [0.1, 0.1])}]
  runs = [{"seed": 0, "learning_rate": 0.01, "test": {"mqar": {"accuracy": 0.25}}},
          {"seed": 1, "learning_rate": 0.01, "test": {"mqar": {"accuracy": 0.99}}}]
  for name, rows in (("vla_metrics.jsonl", metrics), ("vla_runs.jsonl", runs),
                     ("rows.jsonl", [{"seq_len": 64, "n_pairs": 4, "d_model": 64,
                                      "steps": 600}])):
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  table = seeds.run_table(metrics, runs)
  assert [r["escape"] for r in table] == [None, 500]
  assert [r["cond0"] for r in table] == [2.5, 3.5]
  assert [r["align1"] for r in table] == [0.9, 0.8]
  assert [r["state1"] for r in table] == [0.5, 9.0]
  text = "\n".join(seeds.seed_tables(str(tmp_path)))
  assert seeds.separated(table)   # a . khat sets the failed run apart
  assert ("| VLA-a | 0.01 | 0 | 0.250 | never | 2.5 / 2.5 | "
          "0.90 / 0.90 | 0.5 |") in text
  assert "No rows yet" in "\n".join(seeds.seed_tables(str(tmp_path / "empty")))


def _sweep_files(folder, stem, runs, steps=600):
  """A sweep's `<stem>_metrics.jsonl` and `<stem>_runs.jsonl` in `folder`: runs [(seed, rate,
  test accuracy, escape step or None, cond(A_T) and a . khat at step 300)]."""
  diag = lambda c, a: {"layer0.cond_A.t8": [1.0] * len(runs), "layer0.cond_A.t64": c,
                       "layer1.cond_A.t64": c, "layer0.align_mean": a, "layer1.align_mean": a,
                       "layer1.state_norm_end": [1.0] * len(runs)}
  metrics = [{"step": 0, "diagnostics": diag([1.0] * len(runs), [1.0] * len(runs))},
             {"step": 300, "diagnostics": diag([r[4] for r in runs], [r[5] for r in runs])}]
  metrics += [{"step": t, "loss": [1.0] * len(runs),
               "accuracy": [0.9 if r[3] is not None and t >= r[3] else 0.2 for r in runs]}
              for t in range(100, steps + 1, 100)]
  done = [{"seed": r[0], "learning_rate": r[1], "test": {"mqar": {"accuracy": r[2]}}}
          for r in runs]
  for name, rows in ((f"{stem}_metrics.jsonl", metrics), (f"{stem}_runs.jsonl", done)):
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_seed_section_with_remedies_compares_each_variant_with_the_defaults(tmp_path):
  """With seed_remedies rows, section 9 opens with the defaults' failed seeds per cell and the
  variants that fail fewer at every cell; one table counts failed seeds per variant and cell
  (the learning-rate run's other rate beside them), one per cell lists the runs, and the jobs
  without files read pending."""
  from lab.report import seeds  # pylint: disable=import-outside-toplevel
  lr = tmp_path / seeds.FOLDER
  remedies = tmp_path / seeds.REMEDY_FOLDER
  lr.mkdir()
  remedies.mkdir()
  _sweep_files(lr, "vla", [(0, 3e-3, 0.25, None, 2.9, 0.95), (0, 1e-2, 1.0, 300, 3.0, 0.96),
                           (1, 3e-3, 0.98, 500, 2.8, 0.94), (1, 1e-2, 1.0, 200, 2.9, 0.97)])
  (lr / "rows.jsonl").write_text(json.dumps({"seq_len": 64, "n_pairs": 4, "d_model": 64,
                                             "steps": 600}) + "\n")
  # T = 64: defaults fail 2 of 3, lam0 10 none; T = 128: defaults 1 of 3, lam0 10 0,
  # W_u = I only at T = 128 (1 of 3); the other jobs pending.
  fail, ok = lambda s, c: (s, 3e-3, 0.25, None, c, 0.9), lambda s, c: (s, 3e-3, 0.99, 400, c, 0.9)
  _sweep_files(remedies, "T64-d64-defaults", [fail(0, 2.0), ok(1, 3.0), fail(2, 4.0)])
  _sweep_files(remedies, "T64-d64-lam0-10", [ok(0, 1.0), ok(1, 1.0), ok(2, 1.5)])
  _sweep_files(remedies, "T128-d64-defaults", [ok(0, 5.0), fail(1, 6.0), ok(2, 7.0)])
  _sweep_files(remedies, "T128-d64-lam0-10", [ok(0, 5.0), ok(1, 6.0), ok(2, 7.0)])
  _sweep_files(remedies, "T128-d64-u-identity", [ok(0, 5.0), ok(1, 6.0), fail(2, 5.5)])
  (remedies / "rows.jsonl").write_text(json.dumps({"steps": 600, "label": "defaults"}) + "\n")
  text = _text(seeds.seed_tables(str(tmp_path)))
  D = "defaults (VLA-a)"
  assert f"| T = 64, d_model 64 | {D} | 2 of 3 | 400 | 3.0 / 3.0 | 0.90 / 0.90 |" in text
  assert f"| T = 64, d_model 64 | {D}, rate 0.01 | 0 of 2 | 250 | 3.0 / 3.0 | 0.96 / 0.96 |" \
      in text
  assert "| T = 64, d_model 64 | W_u = I | pending |  |  |  |" in text
  assert "| T = 128, d_model 64 | W_u = I | 1 of 3 | 400 | 5.5 / 5.5 | 0.90 / 0.90 |" in text
  assert "**T = 128, d_model 64 (8 pairs), per run**, rate 0.003:" in text
  assert "| lam0 10 | 2 | 0.990 | 400 | 1.5 / 1.5 | 0.90 / 0.90 | 1.0 |" in text
  assert "**Learning rate, T = 64, d_model 64**" in text
  assert ("| VLA-a | 0.01 | 1 | 1.000 | 200 | 2.9 / 2.9 | "
          "0.97 / 0.97 | 1.0 |") in text
  assert "`seed_remedies-T128-d64-readout-additive`" in text and "pending: `" not in text

  # Without the remedies' files: the learning-rate run alone; without either: one line.
  shutil.rmtree(remedies)
  text = _text(seeds.seed_tables(str(tmp_path)))
  assert text.count("| VLA-a |") == 4
  assert "| T = 128, d_model 64 | W_u = I | pending |" in text
  shutil.rmtree(lr)
  assert _text(seeds.seed_tables(str(tmp_path))).startswith("No rows yet")


# Zoology rows at T = 512, d_model 64 ({rate: (test, validation)}): linear, VLA and DeltaNet
# best at the highest rate and Gated DeltaNet at the lowest, all below 0.99 (the tuned grid
# extends them); softmax+conv solved (not extended).
ZOOLOGY_ROWS = (_cell("linear", {1e-3: (0.01, 0.01), 3e-3: (0.02, 0.02)})
                + _cell("vla", {1e-3: (0.5, 0.5), 3e-3: (0.7, 0.7)})
                + _cell("deltanet", {1e-3: (0.6, 0.6), 3e-3: (0.8, 0.8)})
                + _cell("gated_deltanet", {1e-3: (0.3, 0.3), 3e-3: (0.0, 0.0)})
                + _cell("softmax_conv", {1e-3: (1.0, 1.0), 3e-3: (1.0, 0.99)}))
# Tuned rows at 4,000 steps: linear best at the rate grid's end (1e-1: an edge with nothing
# past it); VLA's 1e-2 better on test but not on validation; Gated DeltaNet best at its new
# lowest rate (1e-4 past it still to run); the slow gate init (no zoology rows: its baseline's
# rates and extension) best inside; DeltaNet's extension not run.
TUNED_ROWS = (_cell("linear", {1e-2: (0.3, 0.4), 3e-2: (0.35, 0.45), 1e-1: (0.4, 0.5)})
              + _cell("vla", {1e-2: (0.99, 0.6)})
              + _cell("gated_deltanet", {3e-4: (0.9, 0.9)})
              + _cell("gated_deltanet_slow", {3e-4: (0.2, 0.2), 1e-3: (0.95, 0.95),
                                              3e-3: (0.1, 0.1)}))
# ... and at 12,000 steps (the chosen rate and those either side): VLA converges, linear stays
# below at a rate inside its sweep.
LONG_ROWS = (_cell("linear", {1e-2: (0.1, 0.1), 3e-2: (0.5, 0.5), 1e-1: (0.2, 0.2)},
                   steps=12000)
             + _cell("vla", {1e-3: (0.5, 0.5), 3e-3: (1.0, 1.0), 1e-2: (0.9, 0.9)}, steps=12000))


def test_zoology_tuned_plan_and_pending_cells():
  """The cells the tuned grid plans from the zoology rows, and those whose rows are missing
  once the plan is made from every row (past the edges the tuned rows found)."""
  plan = zoology.planned_rates(ZOOLOGY_ROWS)
  assert plan[("linear", (512, 64), 4000)] == {1e-2}
  assert plan[("gated_deltanet", (512, 64), 4000)] == {3e-4}
  assert plan[("gated_deltanet_slow", (512, 64), 4000)] == {3e-4, 1e-3, 3e-3}
  assert ("softmax_conv", (512, 64), 4000) not in plan                 # solved: not extended
  assert plan[("softmax_conv", (512, 64), 12000)] == {1e-3}            # solved: its rate only
  assert plan[("linear", (512, 64), 12000)] == {1e-3, 3e-3, 1e-2}      # the rates either side
  tuned = TUNED_ROWS + LONG_ROWS
  pending = zoology.missing_rates(zoology.planned_rates(ZOOLOGY_ROWS + tuned), tuned)
  assert {k: v for k, v in pending.items() if k[2] == 4000} == {
      ("deltanet", (512, 64), 4000): [1e-2], ("gated_deltanet", (512, 64), 4000): [1e-4]}
  assert pending[("gated_deltanet", (512, 64), 12000)] == [1e-4, 3e-4, 1e-3]
  assert {k[0] for k in pending if k[2] == 12000} == {
      "softmax_conv", "deltanet", "gated_deltanet", "gated_deltanet_slow"}


def test_zoology_section_selects_across_the_combined_sweep():
  """A 4,000-step cell is chosen on validation over the zoology rows and the tuned rows; a
  chosen rate still at an edge of the combined sweep is flagged; a cell whose tuned rows are
  missing reads pending (its old number labelled as so far); the two Gated DeltaNet rows are
  named by their gate init; the T = 512, 12,000-step table tells converged from below."""
  blocks = zoology.zoology_tables(ZOOLOGY_ROWS, TUNED_ROWS + LONG_ROWS)
  summary = zoology.sweep_summaries(ZOOLOGY_ROWS, TUNED_ROWS + LONG_ROWS)[0]
  text = _text(blocks)
  assert summary[("linear", (512, 64))]["rate"] == 1e-1
  assert summary[("vla", (512, 64))]["rate"] == 3e-3            # 1e-2 better on test only
  assert ("| setting | softmax+conv | linear | DeltaNet | GDN | "
          "GDN-slow | VLA-a |") in text
  assert ("| T = 512, d_model = 64 | 1.000 ± 0.000 (min 1.000) @ 0.001 | 0.400 ± 0.000 "
          "(min 0.400) @ 0.1 (of 5 rates; edge: the highest rate tried) | pending (1e-2 not "
          "run); so far 0.800 ± 0.000 (min 0.800) @ 0.003 | pending (1e-4 not run); so far "
          "0.900 ± 0.000 (min 0.900) @ 0.0003 (of 3 rates) | 0.950 ± 0.000 (min 0.950) @ 0.001 "
          "(of 3 rates) | 0.700 ± 0.000 (min 0.700) @ 0.003 (of 3 rates) |") in text
  # The edge list reads the combined sweep: linear at the grid's end, the others pending.
  edges = text[text.index("Rate sweep edges"):]
  assert "of the 5 cells below 0.99, 1 chose the lowest rate tried, 2 the highest" in edges
  assert "| linear | - | T = 512 d_model 64 @ 0.1 |" in edges
  assert "| DeltaNet | - | T = 512 d_model 64 @ 0.003 (pending) |" in edges
  assert "| GDN | T = 512 d_model 64 @ 0.0003 (pending) | - |" in edges
  # 12,000 steps: rows per label, the cells not run at that width, pending cells.
  assert ("| VLA-a | 1.000 ± 0.000 (min 1.000) @ 0.003 (of 3 "
          "rates) | not run | not run |") in text
  assert "| GDN-slow | pending | not run | not run |" in text
  assert "Pending (rows not all in yet): 4 of 6 cells." in text


def test_zoology_section_without_tuned_rows_reads_pending():
  """With no tuned rows every planned cell is pending: the extended cells say so next to the
  two-rate result, the slow gate init and the 12,000-step table hold no number."""
  text = _text(zoology.zoology_tables(ZOOLOGY_ROWS))
  assert "pending (1e-2 not run); so far 0.020 ± 0.000 (min 0.020) @ 0.003 |" in text
  assert "pending (3e-4 not run); so far 0.300 ± 0.000 (min 0.300) @ 0.001 |" in text
  assert "(min 0.900) @ 0.0003" not in text
  table = text[text.index("**T = 512"):text.index("Recurrent state")]
  assert table.count("| pending |") == 6 and "±" not in table
