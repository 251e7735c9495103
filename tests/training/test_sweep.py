"""Vmapped sweeps (`vla_jax.training.sweep`): each stacked run equals the single run that
`train_and_evaluate` makes with its seed and learning rate, and an interrupted sweep resumes."""

import json
import os
import pathlib
import shutil
import signal

import chex
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

import test_train  # noqa: E402
from vla_jax.training import from_config_dict, train_and_evaluate  # noqa: E402
from vla_jax.training.sweep import train_sweep  # noqa: E402


def tiny_config_dict(**train):
  """test_train's tiny MQAR model, with fewer and smaller steps. A sweep stacks any model
  alike, so one layer of softmax attention (the quickest to compile) stands for all."""
  config = test_train.tiny_config(
      **{"batch_size": 8, "num_steps": 6, "warmup_steps": 2, "eval_examples": 24, **train})
  config.model.update({"num_layers": 1, "mixer": "softmax"})
  return config


def tiny_config(**train):
  return from_config_dict(tiny_config_dict(**train))


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if '"loss"' in line]


SEEDS, RATES = [0, 3], [1e-2, 3e-3]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """One uninterrupted sweep of tiny_config() over SEEDS x RATES: (rows, workdir). Shared by
  the tests that read it (its compiled steps are then reused from the compilation cache)."""
  workdir = tmp_path_factory.mktemp("sweep")
  rows = train_sweep(tiny_config(), SEEDS, RATES, str(workdir), log=lambda s: None)
  return rows, workdir


def test_each_stacked_run_equals_its_single_run(tmp_path, sweep):
  rows, workdir = sweep
  assert [(r["seed"], r["learning_rate"]) for r in rows] == [(0, 1e-2), (0, 3e-3), (3, 1e-2),
                                                              (3, 3e-3)]
  sweep_losses = np.array([r["loss"] for r in _losses(workdir)])  # [steps, R]
  for index in (1, 2):  # a second rate of seed 0, and the first rate of seed 3
    seed, lr = rows[index]["seed"], rows[index]["learning_rate"]
    single = tiny_config(seed=seed, learning_rate=lr)
    summary = train_and_evaluate(single, str(tmp_path / f"single{index}"), log=lambda s: None)
    single_losses = np.array([r["loss"] for r in _losses(tmp_path / f"single{index}")])
    chex.assert_trees_all_close(sweep_losses[:, index], single_losses, rtol=1e-4)
    assert abs(rows[index]["test"]["mqar"]["accuracy"] - summary["accuracy"]) <= 1 / 72
  assert all(not r["diverged"] for r in rows)
  for r in rows:  # the validation set is another draw than the test set
    assert r["validation"]["mqar"]["targets"] == r["test"]["mqar"]["targets"] == 72
  assert (workdir / "sweep_results.jsonl").exists()


def test_interrupted_sweep_resumes_exactly(tmp_path, sweep):
  full = sweep[0]
  config = tiny_config(checkpoint_every=2)
  assert train_sweep(config, SEEDS, RATES, str(tmp_path / "part"), stop_after=3,
                     log=lambda s: None) == []
  resumed = train_sweep(config, SEEDS, RATES, str(tmp_path / "part"), log=lambda s: None)
  assert [r["train_loss"] for r in resumed] == [r["train_loss"] for r in full]
  assert [r["test"] for r in resumed] == [r["test"] for r in full]
  with pytest.raises(ValueError, match="other runs"):
    train_sweep(config, [2], [1e-2], str(tmp_path / "part"), log=lambda s: None)


def test_sigterm_stops_a_sweep_with_a_checkpoint_at_that_step(tmp_path, sweep):
  """SIGTERM while step 4 is logged (no periodic checkpoints): the sweep stops after step 4
  with a checkpoint there and returns no rows; resumed, its rows equal the uninterrupted
  sweep's."""
  full = sweep[0]
  config = tiny_config(log_every=1)
  part = tmp_path / "part"

  def log(line):
    if line.startswith("step 4/"):
      os.kill(os.getpid(), signal.SIGTERM)

  assert train_sweep(config, SEEDS, RATES, str(part), log=log) == []
  assert [p.name for p in (part / "checkpoints").iterdir()] == ["4"]
  first = [json.loads(line) for line in open(part / "metrics.jsonl")][-1]["elapsed_s"]
  resumed = train_sweep(config, SEEDS, RATES, str(part), log=lambda s: None)
  assert [r["train_loss"] for r in resumed] == [r["train_loss"] for r in full]
  assert [r["test"] for r in resumed] == [r["test"] for r in full]
  # wall_s counts both segments: at least the first one's plus the resumed steps' logged time.
  elapsed = [json.loads(line)["elapsed_s"] for line in open(part / "metrics.jsonl")]
  assert elapsed == sorted(elapsed) and all(r["wall_s"] >= elapsed[-1] > first for r in resumed)


def test_a_sigterm_during_a_sweeps_last_checkpoint_loses_no_step(tmp_path, sweep,
                                                                 monkeypatch):
  """A SIGTERM while the last checkpoint (step 6 of 6) is written lets it finish; the sweep
  returns no rows (it was asked to stop), and the rerun only evaluates: the uninterrupted
  sweep's rows."""
  restore = test_train.sigterm_during_save(monkeypatch, 6)
  try:
    assert train_sweep(tiny_config(), SEEDS, RATES, str(tmp_path), log=lambda s: None) == []
  finally:
    restore()
  monkeypatch.undo()
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["6"]
  lines = []
  again = train_sweep(tiny_config(), SEEDS, RATES, str(tmp_path), log=lines.append)
  assert "resumed from step 6" in lines[0] and "steps 6->6" in lines[1]
  assert [r["test"] for r in again] == [r["test"] for r in sweep[0]]


def test_sweep_stopped_after_training_keeps_its_losses(tmp_path, sweep):
  """A sweep killed after its last step (during evaluation) resumes with no step to run: its
  rows still carry the last logged losses, not NaN read as divergence."""
  full, workdir = sweep[0], tmp_path / "s"
  shutil.copytree(sweep[1], workdir)  # the finished sweep, copied so that it stays unchanged
  os.remove(workdir / "sweep_results.jsonl")
  again = train_sweep(tiny_config(), SEEDS, RATES, str(workdir), log=lambda s: None)
  assert [r["train_loss"] for r in again] == [r["train_loss"] for r in full]
  assert all(np.isfinite(r["train_loss"]) and r["diverged"] is False for r in again)
  assert [r["test"] for r in again] == [r["test"] for r in full]


@pytest.mark.parametrize("seeds, rates, match", [
    ([], [1e-3], "at least one"), ([0, 0], [1e-3], "repeat"), ([0], [-1.0], "positive")])
def test_bad_sweeps_fail_early(tmp_path, seeds, rates, match):
  with pytest.raises(ValueError, match=match):
    train_sweep(tiny_config(), seeds, rates, str(tmp_path), log=lambda s: None)


def test_an_npz_sweep_chooses_its_rate_on_a_validation_file(tmp_path):
  """The eval file is the test set: a sweep without task.valid_path is refused before it
  trains; with one, its rows' validation scores come from that file."""
  from vla_jax.tasks import save_npz  # pylint: disable=import-outside-toplevel
  mqar = tiny_config().make_task()
  for name, seed, n in (("train", 0, 48), ("test", 1, 16), ("valid", 2, 8)):
    save_npz(tmp_path / f"{name}.npz", *mqar.eval_sets(seed, n)["mqar"])
  config = tiny_config_dict(num_steps=2, warmup_steps=1, eval_examples=16)
  config.task = type(config.task)({"name": "npz", "vocab_size": 16,
                                   "train_path": str(tmp_path / "train.npz"),
                                   "eval_path": str(tmp_path / "test.npz"), "valid_path": ""})
  with pytest.raises(ValueError, match="valid_path"):
    train_sweep(from_config_dict(config), [0], [1e-2], str(tmp_path / "a"), log=lambda s: None)
  assert not (tmp_path / "a").exists()
  config.task.valid_path = str(tmp_path / "valid.npz")
  rows = train_sweep(from_config_dict(config), [0], [1e-2], str(tmp_path / "b"),
                     log=lambda s: None)
  assert set(rows[0]["test"]) == set(rows[0]["validation"]) == {"npz"}
  assert (rows[0]["test"]["npz"]["targets"], rows[0]["validation"]["npz"]["targets"]) == (48, 24)


def test_a_text_sweep_scores_bits_per_byte_as_its_single_runs(tmp_path):
  """Text sets: each stacked run's loss and bits per byte (overall and by position) equal
  its single run's; the validation set is the validation split at the training length."""
  cache = test_train.text_cache(tmp_path / "cache")
  config = from_config_dict(test_train.text_config(cache, num_steps=2))
  rows = train_sweep(config, [0], [1e-2, 3e-3], str(tmp_path / "sweep"), log=lambda s: None)
  single = from_config_dict(test_train.text_config(cache, num_steps=2, learning_rate=3e-3))
  summary = train_and_evaluate(single, str(tmp_path / "single"), log=lambda s: None)
  want = summary["evals"]["text_T32"]
  got = rows[1]["test"]["text_T32"]
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  np.testing.assert_allclose(got["bits_per_byte_by_position"],
                             want["bits_per_byte_by_position"], rtol=1e-5)
  assert rows[0]["test"]["text_T32"]["loss"] != got["loss"]
  assert list(rows[1]["validation"]) == ["text_T32"]
  assert rows[1]["validation"]["text_T32"]["loss"] != got["loss"]
  tokens = [r["tokens_per_s"] for r in _losses(tmp_path / "sweep") if "tokens_per_s" in r]
  assert tokens and all(t > 0 for t in tokens)
