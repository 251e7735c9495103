"""Orbax checkpoints of the train state {step, params, opt_state}.

The data position needs no saving: batches are a pure function of (seed, step), so restoring
the step restores the data stream. The experiment configuration is written next to the
checkpoints (config.json) and a resumed run must match it.
"""

import json
import os

import jax
import orbax.checkpoint as ocp

from vla_jax.training import jsonl

CONFIG_FILE = "config.json"
# Settings that do not change the training trajectory and may differ on resume.
_FREE = ("log_every", "eval_every", "eval_examples", "eval_batch_size", "checkpoint_every",
         "keep_checkpoints")
# Per section, settings of the same kind (memory against compute only); a config.json written
# before such a setting existed lacks it.
_FREE_BY_SECTION = {"task": (), "model": ("remat",)}


class Checkpointer:
  """Saves and restores the train state under `<workdir>/checkpoints`."""

  def __init__(self, workdir, keep=2):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self):
    return self.manager.latest_step()

  def save(self, step, state):
    self.manager.save(int(step), args=ocp.args.StandardSave(state), force=True)
    self.manager.wait_until_finished()

  def restore(self, target, step=None):
    """Restores the state at `step` (default latest) with the structure and shardings of
    `target` (a state of the right shapes)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise ValueError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def finish(self, state):
    """Saves `state` unless its step is already the latest checkpoint, then closes."""
    step = int(state["step"])
    if self.latest_step() != step:
      self.save(step, state)
    self.close()
    return step

  def close(self):
    self.manager.close()


def write_config(workdir, config_json):
  """Writes config.json, or checks that an existing one (a run being resumed) matches."""
  path = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    new = json.loads(config_json)
    if old.get("sweep") != new.get("sweep"):   # a sweep's stacked state is not a run's
      kind = lambda c: f"a sweep over {c['sweep']}" if c.get("sweep") else "a single run"
      raise ValueError(f"{workdir} holds {kind(old)}, not {kind(new)}; use a new workdir")
    for section, free in _FREE_BY_SECTION.items():
      if _without(old.get(section), free) != _without(new.get(section), free):
        raise ValueError(f"{workdir} holds a run with a different {section} configuration; "
                         f"use a new workdir (old: {old.get(section)}, new: "
                         f"{new.get(section)})")
    old_train = {k: v for k, v in old.get("train", {}).items() if k not in _FREE}
    new_train = {k: v for k, v in new["train"].items() if k not in _FREE}
    if old_train != new_train:
      diff = ", ".join(f"{k}: {old_train.get(k)} -> {new_train.get(k)}"
                       for k in sorted(set(old_train) | set(new_train))
                       if old_train.get(k) != new_train.get(k))
      raise ValueError(f"{workdir} holds a run with different training settings ({diff}); "
                       "resuming would not reproduce it; use a new workdir")
  os.makedirs(workdir, exist_ok=True)
  jsonl.write_atomic(path, config_json)


def _without(section, keys):
  if not isinstance(section, dict):
    return section
  return {k: v for k, v in section.items() if k not in keys}


def read_config(workdir):
  with open(os.path.join(workdir, CONFIG_FILE)) as f:
    return json.load(f)


def logged_row(metrics_path, step, key="loss"):
  """The last row of the JSON-lines log `metrics_path` that has `key` and a step at or before
  `step`; None when there is none (or no file).

  A resumed run reads what it logged up to the checkpoint it restarts from: its losses, and
  `elapsed_s`, the wall time spent on the steps kept so far. Rows past `step` (logged after
  that checkpoint by a run that was then killed) are skipped; of rows at the same step, the
  one written last wins.
  """
  last = None
  for row in jsonl.read_rows(metrics_path):
    if key in row and row["step"] <= step:
      last = row
  return last


def elapsed_of(row):
  """Seconds of wall time that a `logged_row` says earlier segments of a run spent (0.0 for
  no row, or a row logged before `elapsed_s` existed)."""
  return 0.0 if row is None else float(row.get("elapsed_s", 0.0))
