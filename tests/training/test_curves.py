"""Curves and progress: step timing without compilation, TensorBoard scalars and their tags,
and the git commit that result rows record (the PNG plots of plot_run.py:
tests/lab/test_run_plots.py)."""

import json
import os
import pathlib
import re
import struct
import subprocess

import pytest

import vla_jax
from vla_jax.training import curves, from_config_dict, progress, provenance, train_and_evaluate
from vla_jax.training import jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]

import test_train  # noqa: E402  pylint: disable=wrong-import-position

COMMIT = re.compile(r"^[0-9a-f]{40}(-dirty)?$")


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_progress_leaves_compilation_and_pauses_out():
  clock = Clock()
  p = progress.Progress(start=10, end=110, clock=clock)
  clock.now += 30.0                              # the first step compiles: 30 s
  assert p.first_step_done() == 30.0 and p.compile_s == 30.0
  assert p.rate(11) is None and p.eta(11) is None
  clock.now += 9.0                               # steps 12..20: 9 s
  with p.paused():
    clock.now += 100.0                           # an evaluation
  assert p.rate(20) == pytest.approx(1.0)        # 9 steps in 9 s of training
  assert p.eta(20) == pytest.approx(90 * 109.0 / 9)   # wall per step since step 11
  clock.now += 2.0
  rate, text = p.describe(30)
  left = progress.format_seconds(80 * 111.0 / 19)
  assert rate == pytest.approx(5.0) and text == f" 5.00 steps/s, {left} left"
  assert progress.format_seconds(3725.4) == "1:02:05"


def _events(logdir):
  """(tag, step, value) of every scalar in the TensorBoard event files under `logdir`."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  found = []
  for name in sorted(os.listdir(logdir)):
    data = (pathlib.Path(logdir) / name).read_bytes()
    at = 0
    while at < len(data):
      length = struct.unpack("<Q", data[at:at + 8])[0]
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
      at += 12 + length + 4
      found += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
  return found


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """test_train.py's tiny run (the programs it compiles) stopped after 8 of its 40 steps,
  logging every 2 steps, evaluating at 4 and 8, with TensorBoard."""
  workdir = tmp_path_factory.mktemp("curves") / "run"
  lines = []
  config = from_config_dict(test_train.tiny_config(log_every=2, eval_every=4, tensorboard=True))
  summary = train_and_evaluate(config, str(workdir), stop_after=8, log=lines.append)
  return workdir, summary, lines


def test_progress_lines_report_compilation_once_then_rates_and_time_left(run):
  workdir, summary, lines = run
  compiled = [l for l in lines if "with compilation" in l]
  assert compiled == [f"step 1 took {summary['compile_s']:.1f} s with compilation; steps/s "
                      "figures leave it out"]
  steps = [l for l in lines if l.startswith("step ") and "/40 " in l]
  assert len(steps) == 4 and all(re.search(r"[\d.]+ steps/s, \d+:\d\d:\d\d left$", l)
                                 for l in steps[:-1])
  rows = [r for r in jsonl.read_rows(str(workdir / "metrics.jsonl")) if "loss" in r]
  assert rows[0]["compile_s"] == summary["compile_s"] > 0
  assert all("compile_s" not in r and r["steps_per_s"] > 0 for r in rows[1:])
  assert COMMIT.match(rows[0]["git_commit"]) and summary["git_commit"] == rows[0]["git_commit"]


def test_tensorboard_scalars_equal_the_metrics_rows(run):
  workdir, _, _ = run
  events = _events(workdir / curves.TENSORBOARD_DIR)
  rows = jsonl.read_rows(str(workdir / "metrics.jsonl"))
  loss = [(s, v) for t, s, v in events if t == "train/loss"]
  assert loss == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in rows if "loss" in r]
  evals = [(s, v) for t, s, v in events if t == "eval/mqar/accuracy"]
  assert evals == [(r["step"], pytest.approx(r["eval"]["mqar"]["accuracy"], rel=1e-6))
                   for r in rows if "eval" in r] and len(evals) == 2
  assert {t for t, _, _ in events} >= {"train/lr", "train/steps_per_s", "train/compile_s",
                                       "eval/mqar/exact_match"}


def test_scalars_of_a_sweep_are_tagged_by_run(tmp_path):
  """A sweep's rows (a list per run) give a scalar per run, named by seed and rate."""
  (tmp_path / "config.json").write_text(json.dumps({
      "task": {"name": "mqar"}, "model": {"mixer": "vla"}, "train": {"num_steps": 4},
      "sweep": {"seeds": [0, 1], "learning_rates": [1e-3]}}))
  labels = curves.run_labels(str(tmp_path))
  assert labels == ["seed 0, lr 0.001", "seed 1, lr 0.001"]
  assert curves.run_labels(str(tmp_path / "none")) is None
  assert curves.scalars({"step": 4, "loss": [1.0, 2.0]}, labels) == [
      ("train/loss/seed 0, lr 0.001", 1.0), ("train/loss/seed 1, lr 0.001", 2.0)]
  assert curves.scalars({"step": 4, "eval": {"mqar": {"accuracy": 0.5, "targets": 9}}}) == [
      ("eval/mqar/accuracy", 0.5)]
  assert curves.scalars({"step": 0, curves.DIAGNOSTICS_KEY: {"b": 2.0, "a": [1.0]}}) == [
      ("diagnostics/a/run 0", 1.0), ("diagnostics/b", 2.0)]


def test_git_commit_is_the_checkouts_else_named_or_none(tmp_path, monkeypatch):
  commit = provenance.git_commit()
  head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert COMMIT.match(commit) and commit.startswith(head)
  monkeypatch.setenv(provenance.COMMIT_ENV, "abc123")
  assert provenance.git_commit.__wrapped__() == commit    # a checkout's own commit comes first
  monkeypatch.setattr(vla_jax, "__file__", str(tmp_path / "vla_jax" / "__init__.py"))
  assert provenance.git_commit.__wrapped__() == "abc123"  # a copy: the commit it was made from
  monkeypatch.delenv(provenance.COMMIT_ENV)
  assert provenance.git_commit.__wrapped__() is None      # an installed copy, not a checkout
