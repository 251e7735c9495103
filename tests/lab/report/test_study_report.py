"""lab.report.studies: escape steps and probe values per run, the weights-or-data variance
shares, each study's tables from synthetic rows (the parity study's float32 and bfloat16 means
and their difference), and "not run yet" without them."""

import numpy as np
import pytest

from lab import studies
from lab.report import studies as report


def _runs(accuracies, seeds=None, rate=3e-3):
  return [{"seed": s, "learning_rate": rate, "test": {"mqar": {"accuracy": a}},
           "train_loss": 0.5} for s, a in zip(seeds or range(len(accuracies)), accuracies)]


def test_run_table_reads_escape_steps_and_first_and_last_probes():
  """Escape: the first logged step with training accuracy above 0.5 (run 1 never); probes:
  step 0 and the last step, the row written last winning at a repeated step (a resumed run)."""
  metrics = [{"step": 0, "diagnostics": {"layer0.key_cos_mean": [0.9, 0.8],
                                         "layer1.key_cos_mean": [0.7, 0.6]}},
             {"step": 50, "loss": [1.0, 1.0], "accuracy": [0.3, 0.2]},
             {"step": 100, "loss": [1.0, 1.0], "accuracy": [0.51, 0.5]},
             {"step": 100, "diagnostics": {"layer0.key_cos_mean": [0.0, 0.0]}},
             {"step": 100, "diagnostics": {"layer0.key_cos_mean": [0.5, 0.4],
                                           "layer0.decay_mean": [0.9, 0.8]}}]
  a, b = report.run_table(metrics, _runs([1.0, 0.25]))
  assert (a["escape"], b["escape"]) == (100, None)
  assert a["key_cos"] == {0: (0.9, 0.5)} and b["key_cos"] == {0: (0.8, 0.4)}
  assert b["probes"]["layer0.decay_mean"] == [(100, 0.8)]
  assert (a["accuracy"], a["seed"], b["seed"]) == (1.0, 0, 1)


def test_shares_tell_which_seed_decides():
  rows_decide = {(i, d): float(i % 2) for i in range(5) for d in range(5)}
  cols_decide = {(i, d): float(d in (1, 3)) for i in range(5) for d in range(5)}
  assert report.shares(rows_decide) == {"init": pytest.approx(1.0), "data": pytest.approx(0.0)}
  assert report.shares(cols_decide) == {"init": pytest.approx(0.0), "data": pytest.approx(1.0)}
  mixed = {(i, d): float((i + d) % 2) for i in range(4) for d in range(4)}
  assert report.shares(mixed) == {"init": pytest.approx(0.0), "data": pytest.approx(0.0)}
  assert report.shares({k: v for k, v in rows_decide.items() if k != (0, 0)}) is None
  assert report.shares({k: 1.0 for k in rows_decide}) is None


def _metrics(escapes, steps=(0, 12000)):
  """Training rows every 50 steps whose accuracy passes 0.5 at each run's escape step."""
  rows = [{"step": t, "loss": [1.0] * len(escapes),
           "accuracy": [0.9 if e is not None and t >= e else 0.25 for e in escapes]}
          for t in range(50, 12001, 50)]
  return rows + [{"step": s, "diagnostics": {"layer0.key_cos_mean": [0.99] * len(escapes)}}
                 for s in steps]


def test_weights_or_data_table_and_plot_when_the_initialisation_decides(tmp_path):
  """Init seeds 1 and 3 fail under every data seed: failures by row, init share 1; the
  tables, the summary block and the plot read the files; a missing job is pending."""
  files = {}
  for d in studies.WOD_DATA_SEEDS[:4]:
    escapes = [100 * (d + 1), None, 200, None, 300]
    files[f"T64-d64-data{d}"] = (_metrics(escapes), _runs([1.0, 0.25, 1.0, 0.25, 1.0]))
  data = studies.StudyData("weights_or_data", [{"seed": 0}], files)
  s = report.weights_or_data_summary(data)
  assert s["failed_by_init"] == {0: 0, 1: 4, 2: 0, 3: 4, 4: 0}
  assert s["failed_by_data"] == {0: 2, 1: 2, 2: 2, 3: 2, 4: 0}
  assert s["shares"]["solved"] is None           # data seed 4 pending
  files["T64-d64-data4"] = (_metrics([500, None, 200, None, 300]), _runs([1, .25, 1, .25, 1]))
  s = report.weights_or_data_summary(data)
  assert s["shares"]["solved"] == {"init": pytest.approx(1.0), "data": pytest.approx(0.0)}
  assert s["shares"]["escape"]["init"] > 0.95
  text = "\n\n".join(report.tables("weights_or_data", data, full=True))
  assert "| 1 | never (failed) | never (failed) |" in text
  assert "| 0 | 100 | 200 | 300 | 400 | 500 | 0 |" in text
  assert "solved 1.00 / 0.00" in text
  assert "| 3 | 4 | 0.250 | never | 0.99 / 0.99 | n/a |" in text
  from lab.report import plots  # pylint: disable=import-outside-toplevel
  plots.plot_weights_or_data(s, studies.WOD_STEPS, 0.9, str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 10_000


def test_every_study_reads_not_run_yet_without_rows(tmp_path):
  empty = report.load_all(str(tmp_path))
  blocks = report.blocks(empty, [], lambda s: f"[{s}]", "p.png")
  assert list(blocks) == list(report.BLOCKS)
  for block, study in report.BLOCKS.items():
    assert blocks[block].startswith("Not run yet: `python experiments/studies.py "
                                    f"--study={study} --workdir=OUT`"), block
  assert all(b == [report.not_run(s)] for b, s in zip(
      report.full_tables(empty, []).values(), report.BLOCKS.values()))


def test_fix_table_states_each_cells_rate_and_reads_pending_cells():
  """One job on file (T = 64, VLA): its row counts solved seeds; every other cell and variant,
  the zoology grid's T = 256 and 512 among them, reads pending; the caption gives each cell's
  rate (0.003 at section 9's cells, the zoology rows' choice at the others)."""
  files = {"T64-d64-vla": (_metrics([100, None]), _runs([1.0, 0.25]))}
  text = "\n\n".join(report.tables("fix", studies.StudyData("fix", [{"seed": 0}], files)))
  assert "| T = 64, d_model 64 | VLA | 1 of 2 | 100 | 0.99 | 0.99 | n/a |" in text
  assert "| T = 64, d_model 64 | VLA + beta | pending |" in text
  assert "| T = 512, d_model 128 | VLA + SiLU/L2 q, k + beta | pending |" in text
  assert ("rate 0.003 at section 9's cells (T = 64, d_model 64; T = 128, d_model 64) and the "
          "rate the zoology rows chose for VLA at the others (0.01 at T = 256, d_model 128; "
          "0.003 at T = 512, d_model 128)") in text


def _row(label, d_model, steps, seed, rate, acc, head_dim=32, expand_v=1, mixer="x", **kw):
  return {"label": label, "mixer": mixer, "seq_len": 512, "d_model": d_model, "steps": steps,
          "seed": seed, "learning_rate": rate, "validation": {"mqar": {"accuracy": acc}},
          "test": {"mqar": {"accuracy": acc}},
          "model": {"num_heads": d_model // head_dim, "head_dim": head_dim,
                    "mixer_options": {"expand_v": expand_v}}, **kw}


def test_baselines_tables_choose_on_validation_and_count_seeds():
  rows = ([_row("gdn_fla", 64, 4000, s, r, a, expand_v=2) for s in range(3)
           for r, a in ((3e-4, 0.3), (1e-3, 0.95 - 0.1 * s), (3e-3, 0.5))]
          + [_row("gdn_fla", 64, 12000, s, 1e-3, 1.0, expand_v=2) for s in range(3)]
          + [_row("gdn_collapse", 128, 4000, s, 1e-3, 0.0, matmul_precision="default")
             for s in range(3)])
  cells = report.baseline_cells(rows)
  assert set(cells) == {("gdn_fla", 64, 4000), ("gdn_fla", 64, 12000)}   # not the collapse
  assert cells[("gdn_fla", 64, 4000)]["rate"] == 1e-3
  assert cells[("gdn_fla", 64, 4000)]["state"] == 2 * 32 * 64        # heads x d_k x d_v
  files = {f"T512-d128-gdn_collapse-{p}": (
      [{"step": t, "loss": [8.3] * 3, "accuracy": [0.0] * 3} for t in (50, 100)]
      + [{"step": t, "diagnostics": {"layer1.key_cos_mean": [v] * 3,
                                      "layer1.beta_mean": [v / 2] * 3,
                                      "layer1.decay_mean": [1 - v] * 3}}
         for t, v in ((0, 0.2), (500, 0.6), (4000, 0.8))],
      _runs([0.0] * 3, rate=1e-3)) for p in ("default", "highest")}
  text = "\n\n".join(report.tables("baselines", studies.StudyData("baselines", rows, files),
                                   full=True))
  assert "| GDN-fla (d_h 32, values 64) | 64 | 4,096 | 0.850 (1 of 3), rate 0.001 | " \
         "1.000 (3 of 3), rate 0.001 |" in text
  assert "| linear (d_h 64) | 128 | - | pending | pending |" in text
  # layer 1's probes at steps 0, 1,000 (the last probe before: 500) and 4,000
  assert ("| highest | 2 | 0.500 | 0.000 | 0.2 / 0.6 / 0.8 | 0.1 / 0.3 / 0.4 | "
          "0.8 / 0.4 / 0.2 |") in text


def test_authors_table_reads_the_published_rate_and_the_chosen_one():
  rows = [{"label": "vla_paper", "mixer": "vla", "n_pairs": 4, "seed": s, "learning_rate": r,
           "validation": {"mqar": {"accuracy": a}}, "test": {"mqar": {"accuracy": a}}}
          for s in range(3) for r, a in ((3e-4, 0.3), (1e-3, 0.99), (3e-3, 0.6))]
  capacity = [dict(r, label="vla_p1", learning_rate=1e-3, test={"mqar": {"accuracy": 1.0}})
              for r in rows[:3]]
  text = "\n\n".join(report.tables("authors", studies.StudyData("authors", rows, {}),
                                   capacity))
  assert "| n = 4 | 0.300 (0 of 3) | 0.001 | 0.990 (3 of 3) | 1.000 (3 of 3) |" in text
  assert "| n = 8 | pending |" in text
  assert np.isclose(report.state_floats(_row("vla", 64, 1, 0, 1, 1, mixer="vla")), 4096)


def test_parity_table_sets_each_precision_beside_the_other():
  def rows(label, T, precision, accuracies):
    return [{"label": label, "seq_len": T, "precision": precision, "seed": s,
             "learning_rate": 3e-3, "test": {"mqar": {"accuracy": a}}, "train_loss": 0.25}
            for s, a in enumerate(accuracies)]
  data = studies.StudyData("parity", rows("vla", 512, "bfloat16", (0.95, 0.5, 0.97))
                           + rows("vla", 512, "float32", (0.99, 0.98, 0.2))
                           + rows("deltanet", 256, "float32", (1.0, 1.0, 1.0)), {})
  text = "\n\n".join(report.tables("parity", data, full=True))
  assert "| VLA | 512 (64) | 0.003 | 0.723 (2 of 3) | 0.807 (2 of 3) | +0.083 |" in text
  assert "| DeltaNet | 256 (16) | 0.001 | 1.000 (3 of 3) | pending | - |" in text
  assert "| GDN-fla (d_h 32, values 64) | 512 (64) | 0.001 | pending | pending | - |" in text
  per_run = text.split("**VLA, T = 512**, per run:")[1]
  assert per_run.index("| float32 | 2 | 0.200 | 0.25 |") < per_run.index(
      "| bfloat16 | 0 | 0.950 | 0.25 |")
