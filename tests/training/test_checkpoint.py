"""Checkpoints (`vla_jax.training.checkpoint`): what is restored is what was saved, a damaged
checkpoint is never restored silently, the clean-up deletes only what it wrote, and evaluate.py
reports a missing or damaged step in one line."""

import errno
import json
import logging
import os
import pathlib
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import run_scripts
from vla_jax.training import checkpoint as ckpt

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _state(step, scale=1.0):
  """A small train state of the usual form: {step, params, opt_state (a tuple)}."""
  params = {"w": jnp.arange(12.0).reshape(3, 4) * scale, "b": jnp.full((5,), scale, jnp.bfloat16)}
  return {"step": jnp.asarray(step, jnp.int32), "params": params,
          "opt_state": (jnp.asarray(step, jnp.int32), {"mu": params["w"] + 1.0})}


def _biggest_data_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir / ckpt.ITEM) for f in fs
           if os.sep + "d" + os.sep in os.path.join(r, f)]
  return max(files, key=os.path.getsize)


def _truncate(step_dir):
  path = _biggest_data_file(step_dir)
  os.truncate(path, os.path.getsize(path) // 2)


def _flip(step_dir):
  path = _biggest_data_file(step_dir)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x01
  open(path, "wb").write(bytes(data))


def _garble_record(step_dir):
  (step_dir / ckpt.RECORD).write_text("{")


def _restores_other_values(step_dir):
  """As if orbax read back other values than were saved (files intact)."""
  record = json.loads((step_dir / ckpt.RECORD).read_text())
  record["leaves"]["['params']['w']"]["crc32"] += 1
  (step_dir / ckpt.RECORD).write_text(json.dumps(record))


@pytest.fixture
def saved(tmp_path):
  """Checkpoints of steps 1, 2, 3 (keep=2: 1 is deleted) beside a user's folders "7" and
  "0"; returns (checkpointer, checkpoints folder)."""
  directory = tmp_path / "checkpoints"
  (directory / "7").mkdir(parents=True)
  (directory / "7" / "notes.txt").write_text("mine")
  (directory / "0").mkdir()
  (directory / "5.partial" / ckpt.ITEM).mkdir(parents=True)   # a save that was killed
  checkpointer = ckpt.Checkpointer(tmp_path, keep=2)
  for step in (1, 2, 3):
    checkpointer.save(step, _state(step, scale=step))
  yield checkpointer, directory
  checkpointer.close()


def test_save_keeps_the_newest_and_never_touches_a_users_folders(saved):
  """keep=2 of steps 1, 2, 3; the user's "7" and "0" stay, a killed save's "5.partial"
  goes; the latest restores bit for bit with its dtypes."""
  checkpointer, directory = saved
  assert checkpointer.steps() == [2, 3] and checkpointer.latest_step() == 3
  assert sorted(p.name for p in directory.iterdir()) == ["0", "2", "3", "7"]
  assert (directory / "7" / "notes.txt").read_text() == "mine"
  record = json.loads((directory / "3" / ckpt.RECORD).read_text())
  assert record["step"] == 3 and record["leaves"]["['params']['b']"]["dtype"] == "bfloat16"
  restored = checkpointer.restore(_state(0))
  chex.assert_trees_all_equal(restored, _state(3, scale=3))
  chex.assert_trees_all_equal_dtypes(restored, _state(0))


@pytest.mark.parametrize("damage", [_truncate, _flip, _garble_record, _restores_other_values,
                                    lambda d: os.remove(_biggest_data_file(d))],
                         ids=["truncated", "flipped-bit", "garbled-record", "other-values",
                              "missing-file"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(saved, damage, caplog):
  checkpointer, directory = saved
  damage(directory / "3")
  with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
    restored = checkpointer.restore(_state(0))
  chex.assert_trees_all_equal(restored, _state(2, scale=2))
  assert f"checkpoint {directory / '3'}" in caplog.text
  assert "restored step 2" in caplog.text
  with pytest.raises(ckpt.CheckpointError, match=f"checkpoint {directory / '3'}"):
    checkpointer.restore(_state(0), step=3)   # asked for by step: no fallback


def test_restore_errors_are_one_clear_line(saved):
  checkpointer, directory = saved
  with pytest.raises(ValueError, match=r"no checkpoint at step 7 in .*checkpoints "
                                       r"\(checkpoints: 2, 3\)"):
    checkpointer.restore(_state(0), step=7)
  other = _state(0)
  other["params"]["w"] = jnp.zeros((4, 4))
  with pytest.raises(ckpt.CheckpointError,
                     match=r"holds another state than this run's: \['params'\]\['w'\] is "
                           r"float32\[3, 4\], not float32\[4, 4\]"):
    checkpointer.restore(other, step=3)
  _truncate(directory / "2")
  _flip(directory / "3")
  with pytest.raises(ckpt.CheckpointError, match="no checkpoint in .* can be restored: .*"
                                                 "corrupted.*truncated"):
    checkpointer.restore(_state(0))
  empty = ckpt.Checkpointer(directory.parent / "none")
  with pytest.raises(ValueError, match="no checkpoint in"):
    empty.restore(_state(0))


def test_a_checkpoint_from_orbaxs_checkpoint_manager_still_restores(tmp_path):
  """Runs written before checksums.json (orbax's CheckpointManager, same layout) resume,
  checked for structure, shapes and dtypes, and finiteness unless told otherwise."""
  manager = ocp.CheckpointManager(tmp_path / "checkpoints",
                                  options=ocp.CheckpointManagerOptions(create=True))
  bad = _state(4)
  bad["params"]["w"] = bad["params"]["w"].at[0, 0].set(jnp.nan)
  manager.save(2, args=ocp.args.StandardSave(_state(2)))
  manager.save(4, args=ocp.args.StandardSave(bad))
  manager.wait_until_finished()
  manager.close()
  checkpointer = ckpt.Checkpointer(tmp_path)
  chex.assert_trees_all_equal(checkpointer.restore(_state(0)), _state(2))   # 4 is not finite
  with pytest.raises(ckpt.CheckpointError, match=r"\['params'\]\['w'\] has 1 non-finite"):
    checkpointer.restore(_state(0), step=4)
  restored = ckpt.Checkpointer(tmp_path, finite=False).restore(_state(0))
  assert int(restored["step"]) == 4 and np.isnan(restored["params"]["w"][0, 0])
  checkpointer.save(6, _state(6))             # the old checkpoints are kept
  assert checkpointer.steps() == [2, 4, 6]


def test_evaluate_py_names_missing_steps_and_falls_back_over_damaged_ones(tmp_path):
  """evaluate.py on a run with checkpoints 4 and 8: --step=7 is one line naming the steps
  there are; with step 8 truncated it warns and scores step 4, without library INFO logs."""
  import test_train  # pylint: disable=import-outside-toplevel
  from vla_jax.training import (  # pylint: disable=import-outside-toplevel
      from_config_dict, train_and_evaluate)
  # test_train.py's tiny run (the programs it compiles), stopped after step 8.
  config = from_config_dict(test_train.tiny_config(checkpoint_every=4))
  workdir = tmp_path / "run"
  train_and_evaluate(config, str(workdir), stop_after=8, log=lambda s: None)
  evaluate_py = [ROOT / "experiments" / "evaluate.py", f"--workdir={workdir}"]
  _truncate(workdir / "checkpoints" / "8")
  missing, fallback = run_scripts(evaluate_py + ["--step=7"], evaluate_py,
                                  env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert missing.returncode == 1 and missing.stdout == ""
  assert missing.stderr.strip().splitlines() == [
      f"evaluate.py: error: no checkpoint at step 7 in {workdir / 'checkpoints'} "
      "(checkpoints: 4, 8)"]
  assert fallback.returncode == 0, fallback.stderr[-3000:]
  assert json.loads(fallback.stdout.strip().splitlines()[-1])["step"] == 4
  lines = fallback.stderr.strip().splitlines()
  assert len(lines) == 2, lines   # two warnings, no INFO lines
  assert "has " in lines[0] and "truncated?" in lines[0] and "restored step 4" in lines[1]


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    ValueError("RESOURCE_EXHAUSTED: Error writing local file: Failed to write 268 bytes to "
               "file 5: No space left on device [os_error_code='28']"),   # tensorstore's
    OSError(errno.EDQUOT, "Disk quota exceeded")], ids=["enospc", "tensorstore", "edquot"])
def test_a_save_that_finds_the_disk_full_leaves_the_last_checkpoint(saved, monkeypatch, error):
  """A full disk while checkpoint 4 is written: one OSError naming it, its partial folder
  gone, checkpoints 2 and 3 untouched and restorable."""
  checkpointer, directory = saved
  orbax = checkpointer._orbax   # pylint: disable=protected-access
  orbax_save = orbax.save

  def save_then_fill(path, state):
    orbax_save(path, state)
    orbax.wait_until_finished()
    raise error

  monkeypatch.setattr(orbax, "save", save_then_fill)
  with pytest.raises(OSError) as raised:
    checkpointer.save(4, _state(4))
  assert raised.value.errno == (error.errno if isinstance(error, OSError) else errno.ENOSPC)
  assert raised.value.filename == str(directory / "4")
  assert sorted(os.listdir(directory)) == ["0", "2", "3", "7"]
  monkeypatch.undo()
  restored = ckpt.Checkpointer(directory.parent).restore(_state(0))
  assert int(restored["step"]) == 3


def test_a_checkpoint_removed_while_read_gives_the_newest(saved, monkeypatch, caplog):
  """A training in the workdir saves step 4 and removes step 3 while step 3 is read (its
  clean-up): restore reads the newest again, step 4, without a warning; with step=3 it is one
  line naming the steps kept."""
  checkpointer, directory = saved
  training = ckpt.Checkpointer(directory.parent, keep=1)
  file_crc = ckpt._file_crc   # pylint: disable=protected-access
  saves = []   # the training's next save, made at the first file read

  def read_while_cleaned(path):
    if saves:
      training.save(*saves.pop())   # removes the older checkpoints, one of them half-read
    return file_crc(path)

  monkeypatch.setattr(ckpt, "_file_crc", read_while_cleaned)
  saves.append((4, _state(4, scale=4)))
  with caplog.at_level(logging.WARNING):
    assert int(checkpointer.restore(_state(0))["step"]) == 4
  assert checkpointer.steps() == [4] and not caplog.records
  saves.append((6, _state(6)))
  with pytest.raises(ValueError, match=rf"^checkpoint 4 in {directory} was removed while it "
                     r"was read .*: .*\(checkpoints: 6\)$"):
    checkpointer.restore(_state(0), step=4)
  training.close()


def test_a_cut_config_json_is_one_line_naming_it(tmp_path):
  """A config.json cut short (a full disk, a copy stopped half-way): reading it, or resuming
  on it, is a ValueError naming the file and what to do, not the JSON parser's bare message."""
  whole = json.dumps({"model": {"mixer": "vla"}, "train": {"learning_rate": 1e-3}})
  path = tmp_path / ckpt.CONFIG_FILE
  path.write_text(whole[:20])
  for call in (lambda: ckpt.read_config(str(tmp_path)),
               lambda: ckpt.write_config(str(tmp_path), whole)):
    with pytest.raises(ValueError, match=rf"^{path} is cut short or damaged \(not JSON: .* at "
                       r"line 1 column \d+\); it holds the run's settings: remove it to start "
                       r"the run afresh"):
      call()
  ckpt.Checkpointer(tmp_path).save(1, _state(1))
  path.write_text("[1, 2]")
  with pytest.raises(ValueError, match=rf"^{path} holds no JSON object but a list; .*: put back "
                     r"a whole copy of it or use a new workdir$"):
    ckpt.read_config(str(tmp_path))


def test_a_run_from_before_gate_init_resumes_only_with_fla(tmp_path):
  """config.json written before GatedDeltaNet had gate_init lacks it: the same run as
  gate_init "fla", another run than "slow"."""
  def config(*options):
    return json.dumps({"model": {"mixer": "gated_deltanet",
                                 "mixer_options": [["conv_size", 4], *options]},
                       "train": {"learning_rate": 1e-3}})
  ckpt.write_config(str(tmp_path), config())
  ckpt.write_config(str(tmp_path), config(["gate_init", "fla"]))
  with pytest.raises(ValueError, match="different model configuration"):
    ckpt.write_config(str(tmp_path), config(["gate_init", "slow"]))


@pytest.mark.parametrize("mixer,same,other", [
    ("gated_deltanet", [["output_gate", False], ["expand_v", 1]],
     [["output_gate", True], ["expand_v", 2]]),
    ("vla", [["qk_map", "elu1"], ["beta", False]], [["qk_map", "silu_l2"], ["beta", False]]),
    ("vla", [["qk_map", "elu1"], ["beta", False]], [["qk_map", "elu1"], ["beta", True]])])
def test_a_run_from_before_the_new_options_resumes_only_at_their_old_values(
    tmp_path, mixer, same, other):
  """config.json written before Gated DeltaNet's output gate and value expansion, or VLA's
  qk_map and beta, lacks them: the same run as the values it was made with (no gate, values
  of the key width; ELU + 1, no write strength), another run than the new defaults."""
  def config(*options):
    return json.dumps({"model": {"mixer": mixer,
                                 "mixer_options": [["conv_size", 4], *options]},
                       "train": {"learning_rate": 1e-3}})
  ckpt.write_config(str(tmp_path), config())
  ckpt.write_config(str(tmp_path), config(*same))
  with pytest.raises(ValueError, match="different model configuration"):
    ckpt.write_config(str(tmp_path), config(*other))


def test_a_config_with_penalty_scale_none_fails_naming_the_option(tmp_path):
  """penalty_scale None (a config.json from before "inv_sqrt_dh" named the authors' scale) is
  refused on resume and on reading, naming the option and its value now; "inv_sqrt_dh" and
  its float at d_h 32 are two configurations."""
  def config(scale):
    return json.dumps({"model": {"mixer": "vla", "d_model": 64, "num_heads": 2, "head_dim": 32,
                                 "mixer_options": [["lam0", 1.0], ["penalty_scale", scale]]},
                       "train": {"learning_rate": 1e-3}})
  old = tmp_path / "old"
  old.mkdir()
  (old / ckpt.CONFIG_FILE).write_text(config(None))
  for call in (lambda: ckpt.write_config(str(old), config("inv_sqrt_dh")),
               lambda: ckpt.read_config(str(old))):
    with pytest.raises(ValueError, match=r"penalty_scale None.*\"inv_sqrt_dh\""):
      call()
  ckpt.write_config(str(tmp_path), config("inv_sqrt_dh"))
  ckpt.write_config(str(tmp_path), config("inv_sqrt_dh"))
  with pytest.raises(ValueError, match="different model configuration"):
    ckpt.write_config(str(tmp_path), config(1 / np.sqrt(32)))


def test_a_run_resumes_with_result_free_settings_changed_only(tmp_path):
  """Every `config.RESULT_FREE` and `config.ROUNDING_ONLY` setting may differ on resume;
  eval_examples (other evaluation sets, other scores) or the learning rate may not."""
  from vla_jax.training.config import RESULT_FREE, ROUNDING_ONLY  # pylint: disable=import-outside-toplevel
  def config(**changed):
    sections = {"task": {"name": "mqar"}, "model": {"mixer": "vla", "remat": False},
                "train": {"learning_rate": 1e-3, "eval_examples": 16}}
    for name, value in changed.items():
      section, field = name.split("__")
      sections[section][field] = value
    return json.dumps(sections)
  ckpt.write_config(str(tmp_path), config())
  for name in RESULT_FREE + ROUNDING_ONLY:
    ckpt.write_config(str(tmp_path), config(**{name.replace(".", "__"): "changed"}))
    ckpt.write_config(str(tmp_path), config())
  with pytest.raises(ValueError, match=r"different training settings \(eval_examples: 16 -> 8\)"):
    ckpt.write_config(str(tmp_path), config(train__eval_examples=8))
  with pytest.raises(ValueError, match="learning_rate: 0.001 -> 0.01"):
    ckpt.write_config(str(tmp_path), config(train__learning_rate=1e-2))


def test_a_background_save_is_whole_when_waited_for_and_a_full_disk_names_it(tmp_path,
                                                                             monkeypatch):
  """async_save (a GPU's default): save returns before the files are recorded and renamed;
  after `wait` the checkpoints are those a synchronous save leaves, bit for bit, and a full
  disk in the background is the same one OSError at the next call, the older ones intact."""
  checkpointer = ckpt.Checkpointer(tmp_path, keep=2, async_save=True)
  for step in (1, 2, 3):
    checkpointer.save(step, _state(step, scale=step))
  checkpointer.wait()
  assert checkpointer.steps() == [2, 3]
  chex.assert_trees_all_equal(checkpointer.restore(_state(0)), _state(3, scale=3))
  def full(*args):   # the disk fills up when checksums.json is written
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(ckpt.jsonl, "write_atomic", full)
  checkpointer.save(4, _state(4))
  with pytest.raises(OSError) as raised:
    checkpointer.finish(_state(4))
  assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(
      tmp_path / "checkpoints" / "4")
  monkeypatch.undo()
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "3"]
  chex.assert_trees_all_equal(ckpt.Checkpointer(tmp_path).restore(_state(0)),
                              _state(3, scale=3))


def test_a_config_json_keeps_its_meaning_when_a_default_changes(tmp_path):
  """A config.json records every option of its mixer (`ExperimentConfig.to_json`), so a run
  keeps its meaning when a default changes; one from before lacks some, which read back at the
  value that made the run: qk_map "elu1" (the default is "silu_l2" since), the rest at the
  layer's defaults. Such a run resumes with "elu1" given, not with the new default, and loads
  as the layer it was."""
  from vla_jax.layers.registry import mixer_options  # pylint: disable=import-outside-toplevel
  from vla_jax.training import config_from_workdir, from_config_dict  # pylint: disable=import-outside-toplevel
  from test_train import tiny_config  # pylint: disable=import-outside-toplevel
  assert mixer_options("vla")["qk_map"] == "silu_l2"
  now = json.loads(from_config_dict(tiny_config()).to_json())
  assert dict(now["model"]["mixer_options"]) == {**mixer_options("vla"),
                                                  **dict(now["model"]["mixer_options"])}
  assert sorted(dict(now["model"]["mixer_options"])) == sorted(mixer_options("vla"))
  assert ckpt.complete_options(now) == now
  before = json.loads(json.dumps(now))
  before["model"]["mixer_options"] = [["conv_size", 4], ["penalty_scale", 1.0]]
  (tmp_path / ckpt.CONFIG_FILE).write_text(json.dumps(before))
  read = dict(ckpt.read_config(str(tmp_path))["model"]["mixer_options"])
  assert read == {**mixer_options("vla"), "qk_map": "elu1"}
  assert config_from_workdir(str(tmp_path)).model.options["qk_map"] == "elu1"
  with pytest.raises(ValueError, match="different model configuration"):
    ckpt.write_config(str(tmp_path), json.dumps(now))          # silu_l2, the default now
  elu1 = tiny_config()
  elu1.model.options.vla.qk_map = "elu1"
  ckpt.write_config(str(tmp_path), from_config_dict(elu1).to_json())
  unknown = {"model": {"mixer": "nope", "mixer_options": [["a", 1]]}}
  assert ckpt.complete_options(unknown) == unknown
