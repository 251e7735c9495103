"""The PNG plots of a run's metrics rows (`lab.run_plots`, experiments/plot_run.py): the curves
of a run and of a resumed sweep, and the diagnostics figure comparing solved and failed seeds."""

import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

from conftest import run_scripts
from lab import run_plots
from vla_jax.training import curves, jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
# The lab's plots and plot_run.py: the slow tier (README), with the experiment scripts.
pytestmark = pytest.mark.slow


def _png_size(path):
  png = pathlib.Path(path).read_bytes()
  assert png[:8] == PNG
  return struct.unpack(">II", png[16:24])


def _synthetic_run(workdir):
  """A single run's folder as train_and_evaluate leaves it: 8 steps logged every 2, evaluated
  at 4 and 8."""
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({
      "task": {"name": "mqar"}, "model": {"mixer": "vla"}, "train": {"num_steps": 8}}))
  rows = []
  for step in (2, 4, 6, 8):
    rows.append({"step": step, "loss": 3.0 / step, "accuracy": step / 10, "grad_norm": 1.0,
                 "lr": 1e-3 * step / 8, "steps_per_s": 50.0, "elapsed_s": step / 50,
                 **({"compile_s": 2.0} if step == 2 else {})})
    if step % 4 == 0:
      rows.append({"step": step, "eval": {"mqar": {"accuracy": step / 10,
                                                   "exact_match": step / 20, "targets": 64}}})
  jsonl.append_rows(str(workdir / "metrics.jsonl"), rows)
  return workdir


def _synthetic_sweep(workdir, finals):
  """A sweep folder of 3 seeds with two layers' diagnostics and finished results."""
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({
      "task": {"name": "mqar"}, "model": {"mixer": "vla"}, "train": {"num_steps": 4},
      "sweep": {"seeds": [0, 1, 2], "learning_rates": [3e-3]}}))
  rows = []
  for step in (0, 2, 4):
    probe_values = {f"layer{i}.{k}": [1.0 + step + r for r in range(3)] for i in (0, 1)
                    for k in ("cond_A.t2", "cond_A.t8", "align_mean", "align_p10",
                              "state_norm_end")}
    rows.append({"step": step, curves.DIAGNOSTICS_KEY: probe_values})
    if step:
      rows.append({"step": step, "loss": [2.0, 1.0, float("nan")], "accuracy": [0.1, 0.5, 0.2],
                   "grad_norm": [1.0, 2.0, 3.0], "layer0.grad.u_proj": [0.1, 0.2, 0.3],
                   "elapsed_s": 1.0})
  jsonl.append_rows(str(workdir / "metrics.jsonl"), rows)
  jsonl.write_rows(str(workdir / "sweep_results.jsonl"), [
      {"seed": s, "learning_rate": 3e-3, "test": {"mqar": {"accuracy": a}}}
      for s, a in enumerate(finals)])
  return workdir


def test_plot_run_py_draws_a_png_and_names_a_missing_log(tmp_path):
  workdir = _synthetic_run(tmp_path / "run")
  plot_py = [ROOT / "experiments" / "plot_run.py"]
  out = tmp_path / "plots" / "run.png"
  proc, missing = run_scripts(plot_py + [f"--workdir={workdir}", f"--out={out}"],   # one process
                              plot_py + [f"--workdir={tmp_path / 'none'}"],
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0 and proc.stdout.strip() == str(out), proc.stderr[-2000:]
  assert proc.stderr == ""
  assert _png_size(out) == (1210, 825)
  assert missing.returncode == 1 and missing.stderr.strip() == (
      f"plot_run.py: error: no metrics file {tmp_path / 'none' / 'metrics.jsonl'} (a run "
      "writes it at its first logged step)")


def test_curves_of_a_run_and_of_a_resumed_sweep(tmp_path):
  """A run's rows give its training and evaluation curves; a sweep's rows (a list per run) a
  line per run; a step logged twice (a resume) counts once, the last row written."""
  got = run_plots.read_curves(str(_synthetic_run(tmp_path / "run") / "metrics.jsonl"))
  assert got["train"]["loss"] == [(2, 1.5), (4, 0.75), (6, 0.5), (8, 0.375)]
  assert set(got["train"]) == set(curves.TRAIN_KEYS)
  assert got["eval"] == {"mqar": {"accuracy": [(4, 0.4), (8, 0.8)],
                                  "exact_match": [(4, 0.2), (8, 0.4)]}}
  sweep = tmp_path / "sweep"
  sweep.mkdir()
  (sweep / "config.json").write_text(json.dumps({
      "task": {"name": "mqar"}, "model": {"mixer": "vla"}, "train": {"num_steps": 4},
      "sweep": {"seeds": [0, 1], "learning_rates": [1e-3]}}))
  jsonl.append_rows(str(sweep / "metrics.jsonl"), [
      {"step": 2, "loss": [2.0, 2.5], "accuracy": [0.1, 0.2], "compile_s": 3.0},
      {"step": 4, "loss": [9.0, 9.0], "accuracy": [0.0, 0.0], "steps_per_s": 5.0},
      {"step": 4, "loss": [1.0, float("nan")], "accuracy": [0.4, 0.0], "steps_per_s": 6.0}])
  got = run_plots.read_curves(str(sweep / "metrics.jsonl"))
  assert got["train"]["loss"][0] == (2, [2.0, 2.5]) and got["train"]["loss"][1][1][0] == 1.0
  assert got["train"]["steps_per_s"] == [(4, 6.0)] and got["eval"] == {}
  path = run_plots.plot_run(str(sweep))
  assert path == str(sweep / "curves.png") and os.path.getsize(path) > 10_000


def test_diagnostics_plot_compares_solved_and_failed_seeds(tmp_path):
  sweep = _synthetic_sweep(tmp_path / "sweep", [0.97, 0.25, 0.99])
  got = run_plots.read_diagnostics(str(sweep))
  assert got["labels"] == ["sweep: seed 0, lr 0.003", "sweep: seed 1, lr 0.003",
                           "sweep: seed 2, lr 0.003"]
  assert got["final"] == [0.97, 0.25, 0.99]
  assert run_plots.run_outcomes(got["final"] + [None]) == ["solved", "failed", "solved",
                                                          "unknown"]
  assert got["probe"]["layer1.cond_A.t8"] == [(0, [1.0, 2.0, 3.0]), (2, [3.0, 4.0, 5.0]),
                                              (4, [5.0, 6.0, 7.0])]
  assert got["train"]["layer0.grad.u_proj"][0] == (2, [0.1, 0.2, 0.3])
  assert "elapsed_s" not in got["train"]
  # A run without diagnostics rows next to the sweep: its final accuracy from its last
  # evaluation, drawn in the training panels only.
  run = _synthetic_run(tmp_path / "run")
  assert run_plots.has_diagnostics(str(sweep)) and not run_plots.has_diagnostics(str(run))
  assert run_plots.read_diagnostics(str(run))["final"] == [0.8]
  out = run_plots.plot_diagnostics([str(sweep), str(run)], str(tmp_path / "both.png"))
  assert _png_size(out) == (1350, 1260)
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "plot_run.py"),
       f"--workdir={sweep}", f"--out={tmp_path / 'c.png'}",
       f"--diagnostics_out={tmp_path / 'd.png'}", "--solved=0.95"],
      capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == [str(tmp_path / "c.png"), str(tmp_path / "d.png")]
  assert _png_size(tmp_path / "d.png") == (1350, 1260)
