"""Settings that change no result (`vla_jax.training.config.RESULT_FREE`): a run with every one
of them changed logs the same numbers, bit for bit, as the run without; `train.data_seed`
seeds the data alone."""

import dataclasses

import jax
import numpy as np
import pytest

from vla_jax.models import ModelConfig
from vla_jax.training import curves, from_config_dict, jsonl, train_and_evaluate
from vla_jax.training.config import RESULT_FREE, ROUNDING_ONLY, TrainConfig

import test_train  # noqa: E402  pylint: disable=wrong-import-position

# test_train.py's tiny run (the programs it compiles), stopped after step STOP.
BASE = {"log_every": 2, "eval_every": 0, "checkpoint_every": 0, "keep_checkpoints": 2,
        "tensorboard": False, "diagnostics_every": 0}
STOP = 6
# Another value of every RESULT_FREE setting.
CHANGED = {"train.log_every": 1, "train.eval_every": 3, "train.eval_batch_size": 8,
           "train.checkpoint_every": 2, "train.keep_checkpoints": 1, "train.tensorboard": True,
           "train.diagnostics_every": 3}


def test_result_free_settings_are_config_fields():
  fields = {"train": {f.name for f in dataclasses.fields(TrainConfig)},
            "model": {f.name for f in dataclasses.fields(ModelConfig)}}
  for name in RESULT_FREE + ROUNDING_ONLY:
    section, field = name.split(".")
    assert field in fields[section], name
  assert not set(RESULT_FREE) & set(ROUNDING_ONLY)
  assert "train.eval_examples" not in RESULT_FREE + ROUNDING_ONLY


def _run(workdir, changed):
  config = test_train.tiny_config(**BASE)
  for name, value in changed.items():
    section, field = name.split(".")
    getattr(config, section)[field] = value
  summary = train_and_evaluate(from_config_dict(config), str(workdir), stop_after=STOP,
                               log=lambda s: None)
  rows = jsonl.read_rows(str(workdir / curves.METRICS_FILE))
  return summary, rows


@pytest.mark.parametrize("changed", [CHANGED], ids=["every_setting"])
def test_result_free_settings_change_no_logged_number(tmp_path, changed):
  """The run with every RESULT_FREE setting changed logs more rows (every step, periodic
  evaluations, diagnostics), and at the steps both log the same losses, accuracies, gradient
  norms and learning rates, and the same final scores, bit for bit."""
  assert set(changed) == set(RESULT_FREE)   # a new entry is tested here too
  base, base_rows = _run(tmp_path / "base", {})
  other, other_rows = _run(tmp_path / "other", changed)
  keys = ("loss", "accuracy", "grad_norm", "lr")
  by_step = {r["step"]: r for r in other_rows if "loss" in r}
  train_rows = [r for r in base_rows if "loss" in r]
  assert [r["step"] for r in train_rows] == [2, 4, 6] and len(by_step) == 6
  for row in train_rows:
    assert {k: row[k] for k in keys} == {k: by_step[row["step"]][k] for k in keys}, row["step"]
  final = lambda rows: [r["eval"] for r in rows if "eval" in r and r["step"] == 6]
  assert final(base_rows) == final(other_rows) and len(final(base_rows)) == 1
  assert [r["step"] for r in other_rows if "eval" in r] == [3, 6]
  for key in ("accuracy", "exact_match", "evals", "steps", "train_loss"):
    assert base[key] == other[key], key


def test_data_seed_seeds_the_data_alone():
  """train.data_seed: the batches, evaluation sets and probe batch of a run follow it, its
  parameters follow train.seed; None (the default) keeps the data on the seed."""
  from vla_jax.training.config import data_seed_of  # pylint: disable=import-outside-toplevel
  from vla_jax.training.train import Trainer  # pylint: disable=import-outside-toplevel

  def trainer(seed, data_seed):
    config = test_train.tiny_config(seed=seed, data_seed=data_seed)
    return Trainer(from_config_dict(config, num_devices=1))

  def first_batch(t):
    return np.asarray(next(iter(t.batches(0, 1)))[1][0])

  a, b, c, d = trainer(0, 5), trainer(1, 5), trainer(0, None), trainer(0, 0)
  np.testing.assert_array_equal(first_batch(a), first_batch(b))      # the same data
  assert not np.array_equal(first_batch(a), first_batch(c))
  np.testing.assert_array_equal(first_batch(c), first_batch(d))      # None: the seed's
  leaves = lambda t: jax.tree.leaves(t.init_state["params"])
  assert not all(np.array_equal(x, y) for x, y in zip(leaves(a), leaves(b)))
  assert all(np.array_equal(x, y) for x, y in zip(leaves(a), leaves(c)))
  assert data_seed_of(a.config.train) == 5 and data_seed_of(c.config.train, 7) == 7
  with pytest.raises(ValueError, match="train.data_seed must be None or an int >= 0"):
    trainer(0, -1)
