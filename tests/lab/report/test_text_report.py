"""lab.report.text: the language-modelling section from study rows and job curves: the rate
chosen by validation bits per byte, test bits per byte per length over seeds, tokens/s per
run; the figure is drawn."""

import json

from lab.report import plots, text


def _row(label, lr, seed, val, test, diverged=False):
  scores = lambda b: {f"text_T{L}": {"bits_per_byte": b + i, "bits_per_byte_by_position":
                                     [b + i, b + i - 0.1]} for i, L in enumerate((1024, 4096))}
  return {"label": label, "learning_rate": lr, "seed": seed, "diverged": diverged,
          "validation": scores(val), "test": scores(test)}


def test_summary_block_and_plot(tmp_path):
  rows = [_row("vla", 1e-3, 0, 2.0, 2.1), _row("vla", 3e-3, 0, 1.9, 2.0),
          _row("vla", 3e-3, 1, 1.9, 2.2), _row("softmax_rope", 1e-3, 0, 1.5, 1.6),
          _row("deltanet", 1e-3, 0, float("nan"), 9.9, diverged=True)]
  entries = text.summary(rows)
  assert [e["label"] for e in entries] == ["softmax_rope", "deltanet", "vla"]
  vla = entries[-1]
  assert vla["rates"] == [1e-3, 3e-3] and vla["rate"] == 3e-3 and vla["seeds"] == [0, 1]
  assert abs(vla["test"][1024][0] - 2.1) < 1e-12 and abs(vla["test"][1024][1] - 0.1) < 1e-12
  assert abs(vla["test"][4096][0] - 3.1) < 1e-12
  assert entries[1]["rate"] is None and entries[1]["diverged"] == 1

  runs = tmp_path / "text_runs"
  runs.mkdir()
  (runs / "text-vla-rates.jsonl").write_text("".join(
      json.dumps({"step": s, "loss": [0.7 * 2, 1.0], "tokens_per_s": 2000.0}) + "\n"
      for s in (50, 100)))
  (runs / "text-vla-rates-lr1e-2.jsonl").write_text(   # a run past the rates' edge: not read
      json.dumps({"step": 50, "loss": 9.0, "tokens_per_s": 9.0}) + "\n")
  curve_data = text.curves(str(runs))
  assert set(curve_data) == {"vla"}
  assert curve_data["vla"][0] == [50, 100] and curve_data["vla"][2] == 1000.0
  assert abs(curve_data["vla"][1][0] - 1.4 / 0.6931471805599453) < 1e-9

  md = text.block(entries, curve_data, "PLOT")
  assert "| VLA | 0.001, 0.003 | 0.003 | 2 | 2.100 ± 0.100 | 3.100 ± 0.100 | 1,000 |" in md
  assert "| DeltaNet | 0.001 | - | 0 | - | - | - |" in md and md.endswith("PLOT")
  assert text.block([], {}, "PLOT") == "No rows yet."
  plots.plot_text(entries, curve_data, str(tmp_path / "t.png"))
  assert (tmp_path / "t.png").stat().st_size > 0
