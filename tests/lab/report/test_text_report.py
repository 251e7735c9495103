"""lab.report.text: the language-modelling section from study rows and job curves: the rate
chosen by validation bits per byte, test bits per byte per length over seeds, the chosen
rate's curve and tokens/s with the GPU it ran on (the lowest seed whose job's metrics were
kept), from rows split by card; the figure is drawn."""

import json

from lab.report import plots, text


def _row(label, lr, seed, val, test, diverged=False, job=None):
  scores = lambda b: {f"text_T{L}": {"bits_per_byte": b + i, "bits_per_byte_by_position":
                                     [b + i, b + i - 0.1]} for i, L in enumerate((1024, 4096))}
  return {"label": label, "learning_rate": lr, "seed": seed, "diverged": diverged,
          "validation": scores(val), "test": scores(test), "job": job or f"text-{label}-rates"}


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_block_curves_and_plot(tmp_path):
  # VLA's rate job (two rates) on one card, its seed job and DeltaNet's on another.
  h200 = [_row("vla", 1e-3, 0, 2.0, 2.1), _row("vla", 3e-3, 0, 1.9, 2.0),
          _row("softmax_rope", 1e-3, 0, 1.5, 1.6)]
  h100 = [_row("vla", 3e-3, 1, 1.9, 2.2, job="text-vla-seeds"),
          _row("deltanet", 1e-3, 0, float("nan"), 9.9, diverged=True)]
  _write(tmp_path / "text_study_h200.jsonl", h200)
  _write(tmp_path / "text_study_h100.jsonl", h100)
  rows = text.rows(str(tmp_path))
  assert len(rows) == 5 and {r["card"] for r in rows if r["seed"] == 1} == {"h100"}
  entries = text.summary(rows)
  assert [e["label"] for e in entries] == ["softmax_rope", "deltanet", "vla"]
  vla = entries[-1]
  assert vla["rates"] == [1e-3, 3e-3] and vla["rate"] == 3e-3 and vla["seeds"] == [0, 1]
  assert abs(vla["test"][1024][0] - 2.1) < 1e-12 and abs(vla["test"][1024][1] - 0.1) < 1e-12
  assert abs(vla["test"][4096][0] - 3.1) < 1e-12
  assert entries[1]["rate"] is None and entries[1]["diverged"] == 1

  # The curve: the chosen rate's run with the lowest seed, the rate job's second run (its
  # rows' order); tokens/s: the job that trained one run alone (the seed job here), not the
  # rate job's two runs sharing the GPU; the softmax job is not read.
  runs = tmp_path / "text_runs"
  runs.mkdir()
  _write(runs / "text-vla-rates.jsonl", [{"step": s, "loss": [1.0, 0.7 * 2], "tokens_per_s":
                                          2000.0} for s in (50, 100)])
  _write(runs / "text-vla-seeds.jsonl", [{"step": 50, "loss": [9.0], "tokens_per_s": 900.0}])
  curve_data = text.curves(str(runs), rows, entries)
  assert set(curve_data) == {"vla"}
  steps, bpb, tps, card = curve_data["vla"]
  assert steps == [50, 100] and tps == 900.0 and card == "h100"
  assert abs(bpb[0] - 1.4 / 0.6931471805599453) < 1e-9

  # Without the rate job's metrics the seed job's run (the next seed) gives the curve; without
  # a run alone, no tokens/s.
  (runs / "text-vla-rates.jsonl").rename(runs / "kept")
  steps, bpb, tps, card = text.curves(str(runs), rows, entries)["vla"]
  assert steps == [50] and abs(bpb[0] - 9.0 / 0.6931471805599453) < 1e-9
  (runs / "kept").rename(runs / "text-vla-rates.jsonl")
  (runs / "text-vla-seeds.jsonl").unlink()
  assert text.curves(str(runs), rows, entries)["vla"][2:] == (None, None)

  md = text.block(entries, curve_data, "PLOT")
  assert "| VLA | 0.001, 0.003 | 0.003 | 2 | 2.100 ± 0.100 | 3.100 ± 0.100 | 900 (H100) |" in md
  assert "| DeltaNet | 0.001 | - | 0 | - | - | - |" in md and md.endswith("PLOT")
  assert text.block([], {}, "PLOT") == "No rows yet."
  plots.plot_text(entries, curve_data, str(tmp_path / "t.png"))
  assert (tmp_path / "t.png").stat().st_size > 0
