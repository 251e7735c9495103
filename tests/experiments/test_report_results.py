"""RESULTS.md's zoology section is computed from its rows: best rate on validation, test mean
over seeds, state sizes, and the settings and mixers not yet run."""

import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

import report_results  # noqa: E402  pylint: disable=wrong-import-position


def _row(mixer, lr, seed, test, val, T=64, d_model=128):
  return {"label": mixer, "mixer": mixer, "learning_rate": lr, "seed": seed, "steps": 4000,
          "seq_len": T, "d_model": d_model, "test": {"mqar": {"accuracy": test}},
          "validation": {"mqar": {"accuracy": val}}}


def test_state_floats():
  assert report_results.state_floats("deltanet", 128, 64) == 4 * 32 * 32
  assert report_results.state_floats("vla", 128, 64) == 2 * 4 * 32 * 32       # S and A
  assert report_results.state_floats("softmax_conv", 64, 512) == 2 * 512 * 64  # KV cache


def test_zoology_section_from_rows():
  rows = [_row("deltanet", lr, s, 1.0 if lr == 1e-3 else 0.5, 1.0 if lr == 1e-3 else 0.4)
          for lr in (1e-3, 3e-3) for s in range(3)]
  rows += [_row("vla", 3e-3, s, acc, acc) for s, acc in enumerate((0.25, 0.97, 0.25))]
  text = "\n".join(report_results.zoology_section(rows))
  assert "| mixer | T = 64, d_model = 128 |" in text
  assert "| DeltaNet | 1.000 ± 0.000 (min 1.000) @ 0.001 |" in text     # the validated rate
  assert "| VLA | 0.490 ± 0.339 (min 0.250) @ 0.003 (of 1 rate) |" in text   # fewer rates: said
  assert "| VLA | 8,192 |" in text and "| DeltaNet | 4,096 |" in text
  assert "below: VLA 0.490" in text and "VLA at T = 64, d_model 128 (0.250, 0.970, 0.250)" in text
  assert "T = 512 d_model 256" in text                                   # not run yet


def test_penalty_scale_note_compares_the_two_vla_rows():
  only_vla = {("vla", (64, 128)): {"test": np.array([0.25, 0.97, 0.25])}}
  assert report_results.penalty_scale_note(only_vla) == ""          # nothing to compare
  rows = [_row("vla", 3e-3, s, acc, acc) for s, acc in enumerate((0.25, 0.97, 0.25))]
  rows += [_row("vla_p1", 3e-3, s, acc, acc) for s, acc in enumerate((1.0, 0.99, 0.98))]
  text = "\n".join(report_results.zoology_section(rows))
  assert ("penalty scale: 1 is ahead of the authors' 1/sqrt(d_h) by more than 0.01 at 1 of 1 "
          "settings (T = 64 d_model 128 (0.990 against 0.490)), behind at none.") in text


def test_pallas_note_names_the_pallas_trained_runs():
  rows = [dict(_row("vla", 3e-3, s, 1.0, 1.0, T=T), model={"impl": impl})
          for s, T, impl in ((0, 128, "pallas"), (1, 128, "pallas"), (2, 128, "chunked"),
                             (0, 256, "pallas"))]
  note = report_results.pallas_note(rows, lambda r: r["seq_len"], lambda T: f"T = {T}")
  assert note.endswith("T = 128, seeds 0, 1; T = 256, seed 0."), note
  assert report_results.pallas_note(rows[2:3], lambda r: r["seq_len"], str) == ""
  text = "\n".join(report_results.zoology_section(rows))
  assert "T = 128, d_model 128, seeds 0, 1; T = 256, d_model 128, seed 0." in text


def test_long_section_names_single_rate_settings():
  rows = [_row("deltanet", lr, s, 1.0, 1.0, T=1024) for lr in (1e-3, 3e-3) for s in range(3)]
  rows += [_row("deltanet", 1e-3, s, 1.0, 1.0, T=2048) for s in range(3)]
  lines, summary = report_results.long_section(rows)
  text = "\n".join(lines)
  assert summary[("deltanet", 2048)]["rates_tried"] == 1
  assert "Trained at one rate only" in text and "T = 2048: DeltaNet 0.001" in text
  assert "T = 1024: DeltaNet" not in text.split("Trained at one rate only")[1]


def test_dtype_note_names_runs_not_in_float32():
  rows = [dict(_row("softmax", 1e-3, s, 1.0, 1.0, T=4096), model={"dtype": "bfloat16"})
          for s in range(3)]
  rows += [dict(_row("deltanet", 1e-3, s, 1.0, 1.0, T=4096), model={"dtype": "float32"})
           for s in range(3)]
  rows += [_row("linear", 1e-3, 0, 1.0, 1.0, T=4096)]          # older rows: no dtype recorded
  lines, _ = report_results.long_section(rows)
  text = "\n".join(lines)
  assert "Trained with bfloat16 activations" in text
  assert "do not fit in memory there): softmax at T = 4096." in text, text
  assert report_results.dtype_note(rows[3:], str) == ""


def test_long_section_lists_rates_tried_on_fewer_seeds():
  """A rate run on fewer seeds than the cell's other rate is listed with its per-seed test
  accuracies; the table keeps the better rate by mean validation accuracy; a softmax + conv
  run (mixer "softmax", label "softmax_conv") is named by its label."""
  rows = [_row("vla", 3e-3, s, acc, acc, T=4096) for s, acc in enumerate((1.0, 0.13, 0.14))]
  rows += [_row("vla", 1e-3, s, acc, acc, T=4096) for s, acc in ((1, 0.128), (2, 0.129))]
  rows += [dict(_row("softmax", 1e-3, 0, 1.0, 1.0, T=4096), label="softmax_conv",
                model={"dtype": "bfloat16"})]
  lines, summary = report_results.long_section(rows)
  text = "\n".join(lines)
  assert summary[("vla", 4096)]["rate"] == 3e-3
  assert "VLA at T = 4096, rate 0.001, seeds 1, 2: 0.128, 0.129." in text, text
  assert "rate 0.003" not in text
  assert "softmax + conv at T = 4096." in text
  assert report_results.partial_rates_note(rows[:3], "seq_len", str) == ""


def test_settings_sentence_reads_the_rows():
  """The settings a section states come from its rows: the common value, then the others with
  their row counts; MQAR test examples are targets / n_pairs."""
  def row(batch, dtype, d_model, targets):
    return {"task": "mqar", "batch_size": batch, "steps": 3000, "task_fields": {"n_pairs": 8},
            "model": {"d_model": d_model, "num_layers": 2, **({"dtype": dtype} if dtype else {})},
            "test": {"mqar": {"accuracy": 1.0, "targets": targets}}}
  rows = [row(64, None, 128, 8000)] * 3 + [row(64, "bfloat16", 256, 8000)]
  text = report_results.settings_sentence(rows)
  assert text == ("Settings of these 4 rows: batch 64; 3,000 steps; float32 (bfloat16 in 1 row); "
                  "d_model 128 (d_model 256 in 1 row); 2 layers; 1,000 test examples per set.")


def test_edge_rate_note_counts_cells_below_at_an_edge_of_their_sweep():
  """Cells below 0.99 are counted by where their chosen rate lies in the rates tried there;
  single-rate cells and cells at or above 0.99 are left out."""
  rows = [_row("vla", lr, s, acc, acc) for lr, acc in ((1e-3, 0.5), (3e-3, 0.9))
          for s in range(3)]                                          # chose the highest
  rows += [_row("deltanet", lr, s, acc, acc) for lr, acc in ((3e-4, 0.2), (1e-3, 0.8),
                                                               (3e-3, 0.1)) for s in range(3)]
  rows += [_row("linear", lr, s, acc, acc, T=128) for lr, acc in ((1e-3, 1.0), (3e-3, 0.9))
           for s in range(3)]                                          # solved: left out
  rows += [_row("softmax", 1e-3, s, 0.3, 0.3) for s in range(3)]         # one rate: left out
  _, summary = report_results.grid_table(rows, "seq_len", [64, 128], "T")
  assert summary[("deltanet", 64)]["rates"] == [3e-4, 1e-3, 3e-3]
  note = report_results.edge_rate_note(summary, lambda T: f"T = {T}")
  assert note == (" Rate sweep edges: of the 2 cells below 0.99, at the highest rate tried (1: "
                  "VLA at T = 64 @ 0.003); 1 inside the sweep. Where the chosen rate is an edge "
                  "of the sweep, a wider sweep (not run) may score higher."), note
  solved = {k: c for k, c in summary.items() if k[0] == "linear"}
  assert report_results.edge_rate_note(solved, str) == ""


def test_wider_sweep_note_and_table_mark_cells_off_the_usual_sweep():
  """The usual sweep is the rate set of most cells; a cell with a rate added is named with the
  added rate and the rate chosen, and its table cell says how many rates it had."""
  rows = [_row(m, lr, s, 1.0, 1.0, T=T) for m in ("linear", "deltanet") for T in (64, 128)
          for lr in (1e-3, 3e-3) for s in range(3)]
  rows += [_row("vla", lr, s, acc, acc, T=128) for lr, acc in ((3e-4, 0.7), (1e-3, 0.6),
                                                                 (3e-3, 0.1)) for s in range(3)]
  table, summary = report_results.grid_table(rows, "seq_len", [64, 128], "T")
  assert "0.700 ± 0.000 (min 0.700) @ 0.0003 (of 3 rates)" in table
  assert "(of 2 rates)" not in table                       # the usual sweep is not annotated
  note = report_results.wider_sweep_note(summary, lambda T: f"T = {T}")
  assert note == (" Rates added to the usual sweep (0.001, 0.003) at some cells: VLA at T = 128: "
                  "0.0003 (chosen: 0.0003)."), note
  plain = {k: c for k, c in summary.items() if k[0] != "vla"}
  assert report_results.wider_sweep_note(plain, str) == ""
