"""Orbax checkpoints of the train state {step, params, opt_state}, verified when restored.

The data position needs no saving: batches are a pure function of (seed, step), so restoring
the step restores the data stream. The experiment configuration is written next to the
checkpoints (config.json) and a resumed run must match it.

Layout: `<workdir>/checkpoints/<step>/default/` is the state as orbax writes it (the layout of
orbax's CheckpointManager) and `<step>/checksums.json` records what was saved: the step, every
file's size and CRC-32, and every array's path, shape, dtype, CRC-32 and count of non-finite
values. A step is written under `<step>.partial` and renamed once complete, so a folder named
by an integer and holding checksums.json is a whole checkpoint that this module wrote.

Restoring checks the files before orbax reads them and the arrays after, against the record:
a truncated or corrupted checkpoint is never restored silently, and orbax's own errors become
one `CheckpointError` line. Without a step, the latest checkpoint that verifies is restored,
with a warning for each later one that does not. Checkpoints written before checksums.json
existed are restored with structure, shape, dtype (and, for a single run, finiteness) checks.
Clean-up deletes only checkpoints with checksums.json: an integer-named folder that someone
put under checkpoints/ is neither restored nor deleted. On a GPU, saves are written in the
background (`Checkpointer.async_save`).

Why not orbax's CheckpointManager (orbax-checkpoint 0.12): it takes every integer-named folder
for a step, so a user's folder "7" makes it skip the saves of steps 1 to 7 and its keep-N
clean-up deletes a user's folder "0"; it refuses to save a step at or below its latest one,
which a run resumed past a damaged checkpoint must do; and it renames a step into place
before checksums.json could be written into it. Saves here use orbax's asynchronous
StandardCheckpointer under the same rename, record and clean-up rules instead.

With several processes (`distributed`) every process calls `save` and `restore` alike: orbax
writes and reads the arrays from every process (its multi-host path: process 0 writes the
metadata, each process its devices' shards, with barriers between), and process 0 alone
clears stale partial folders, writes checksums.json, renames the step into place and deletes
old steps; a barrier keeps the others from starting a save before those folders are cleared.
Every process verifies and restores the same checkpoint (they read one shared folder) and
checks that they agree on its step.
"""

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import time
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from vla_jax.layers.registry import mixer_options
from vla_jax.training import distributed
from vla_jax.training import jsonl
from vla_jax.training.config import RESULT_FREE, ROUNDING_ONLY

CONFIG_FILE = "config.json"
ITEM = "default"            # the orbax folder inside a step
RECORD = "checksums.json"   # what `Checkpointer.save` wrote, for `restore` to check
PARTIAL = ".partial"        # suffix of a step being written
REREADS = 5                 # reads of the newest checkpoint while a training removes old ones
# Per config.json section, the settings a resumed run may change (`config.RESULT_FREE` and
# `config.ROUNDING_ONLY`); a config.json written before such a setting existed lacks it.
_FREE_BY_SECTION = {section: tuple(name.split(".", 1)[1] for name in RESULT_FREE + ROUNDING_ONLY
                                   if name.startswith(section + "."))
                    for section in ("task", "model", "train")}
# Mixer options a config.json may lack, at the value that reproduces its run: one written before
# the option existed (or, for qk_map, before config.json recorded every option and the default
# became "silu_l2") lacks it, which is the same run. Any other option it lacks is at the layer's
# default (`complete_options`).
_ADDED_OPTIONS = {"u_init": "random", "gate_init": "fla", "qk_map": "elu1", "beta": False,
                  "output_gate": False, "expand_v": 1}
# Training settings added since the first runs, at the default that changes nothing: a run
# written before them resumes.
_ADDED_TRAIN = {"data_seed": None}


def _added_default(key, value):
  return key in _ADDED_TRAIN and value == _ADDED_TRAIN[key]

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
  """A checkpoint that cannot be restored as it was saved (damaged, or of another model)."""


def _crc(data, value=0):
  return zlib.crc32(data, value)


def _leaf_records(tree):
  """{path: {shape, dtype, crc32, nonfinite}} of every array of `tree` (read to the host)."""
  records = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    array = np.asarray(jax.device_get(leaf))
    nonfinite = (int(np.count_nonzero(~np.isfinite(array.astype(np.float64))))
                 if jnp.issubdtype(array.dtype, jnp.inexact) else 0)
    records[jax.tree_util.keystr(path)] = {
        "shape": list(array.shape), "dtype": str(array.dtype),
        "crc32": _crc(np.ascontiguousarray(array).tobytes()), "nonfinite": nonfinite}
  return records


def _file_crc(path):
  value = 0
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      value = _crc(block, value)
  return value


def _file_records(directory):
  """{relative path: [size, crc32]} of every file under `directory`."""
  records = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      records[os.path.relpath(path, directory)] = [os.path.getsize(path), _file_crc(path)]
  return records


def _first_line(error):
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def checkpoint_steps(workdir):
  """The steps that hold a checkpoint in `workdir`, ascending: folders of
  `<workdir>/checkpoints` named by an integer that hold checksums.json or (written before it
  existed) an orbax `default/` folder."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  found = []
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    if name.isdigit() and (os.path.isfile(os.path.join(path, RECORD))
                           or os.path.isdir(os.path.join(path, ITEM))):
      found.append(int(name))
  return sorted(found)


class Checkpointer:
  """Saves and restores the train state under `<workdir>/checkpoints` (see the module
  docstring), keeping the newest `keep` checkpoints it wrote.

  Args:
    workdir: the run's folder.
    keep: checkpoints kept (>= 1).
    finite: whether a checkpoint without checksums.json must hold only finite values (True
      for a single run; a sweep's diverged runs legitimately hold NaN).
    async_save: write checkpoints in the background (`save`); default: where the state is on
      a GPU (jax.default_backend() == "gpu"), where writing would stall the steps.
  """

  def __init__(self, workdir, keep=2, finite=True, async_save=None):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    self.keep = keep
    self.finite = finite
    self.async_save = jax.default_backend() == "gpu" if async_save is None else async_save
    self._orbax = ocp.StandardCheckpointer()
    self._current = None   # the step this object restored or saved last
    self._pool = self._pending = None   # the thread and Future of a save being written

  def steps(self):
    """The steps that hold a checkpoint, ascending (see `checkpoint_steps`)."""
    return checkpoint_steps(os.path.dirname(self.directory))

  def _written(self):
    """The steps whose checkpoint this module wrote (they hold checksums.json)."""
    return [s for s in self.steps()
            if os.path.isfile(os.path.join(self.directory, str(s), RECORD))]

  def latest_step(self):
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, step, state):
    """Writes `state` as checkpoint `step` (under `<step>.partial`, renamed when complete),
    then deletes the checkpoints it wrote that are older than the newest `keep`.

    With `async_save`, returns once the arrays are copied to the host (the state may then be
    donated): the files are written, recorded, renamed and the old checkpoints deleted on a
    background thread, which the next `save`, `wait`, `restore`, `finish` or `close` waits
    for, raising its error. With several processes only process 0 records, renames and
    deletes (see the module docstring).

    Raises:
      OSError: ENOSPC or EDQUOT naming the checkpoint when the disk is full (from orbax's
        errors, whose logs are left out); the partial save is removed and the checkpoints
        already there stay as they were.
    """
    self.wait()
    step = int(step)
    primary = distributed.is_primary()
    partial = os.path.join(self.directory, str(step)) + PARTIAL
    if primary:
      os.makedirs(self.directory, exist_ok=True)
      for name in os.listdir(self.directory):   # left by saves that were killed
        if name.endswith(PARTIAL) and name[:-len(PARTIAL)].isdigit():
          shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    distributed.barrier(f"checkpoint {step}: stale partial folders cleared")
    leaves = _leaf_records(state) if primary else None
    with self._writing_step(step):
      self._orbax.save(os.path.join(partial, ITEM), state)
    if not primary:   # orbax finishes this process's part; process 0 commits the step
      if not self.async_save:
        self._orbax.wait_until_finished()
    elif self.async_save:
      self._pool = self._pool or concurrent.futures.ThreadPoolExecutor(1)
      self._pending = self._pool.submit(self._commit, step, leaves)
    else:
      self._commit(step, leaves)
    self._current = step

  def _commit(self, step, leaves):
    """Waits for orbax's writes of checkpoint `step` (every process's: orbax's own barrier),
    records its files and `leaves`, renames it into place and deletes the old checkpoints."""
    final = os.path.join(self.directory, str(step))
    partial = final + PARTIAL
    with self._writing_step(step):
      self._orbax.wait_until_finished()
      record = {"step": step, "leaves": leaves, "files": _file_records(partial)}
      jsonl.write_atomic(os.path.join(partial, RECORD), json.dumps(record))
    if os.path.exists(final):   # a damaged checkpoint, or a folder someone put there
      aside = f"{final}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
      log.warning("%s: moving the folder already there to %s", final, aside)
      os.rename(final, aside)
    os.rename(partial, final)
    kept = [s for s in self._written() if s <= step][-self.keep:]
    for old in self._written():
      if old < kept[0]:
        shutil.rmtree(os.path.join(self.directory, str(old)))

  @contextlib.contextmanager
  def _writing_step(self, step):
    """Around writes of checkpoint `step`: on an error its partial folder is removed (the
    checkpoints there stay as they were), and a full disk is one OSError naming it."""
    final = os.path.join(self.directory, str(step))
    try:
      with _quiet_disk_full_logs():
        try:
          yield
        except Exception as e:   # pylint: disable=broad-except  (orbax raises many kinds)
          if jsonl.disk_full(e) is not None:   # its threads' last errors, quiet here too
            self._orbax.close()
          raise
    except Exception as e:   # pylint: disable=broad-except
      shutil.rmtree(final + PARTIAL, ignore_errors=True)
      code = jsonl.disk_full(e)
      if code is None:
        raise
      raise OSError(code, jsonl.DISK_FULL[code], final) from None

  def wait(self):
    """Waits for a save still being written in the background (`async_save`); raises its
    error."""
    pending, self._pending = self._pending, None
    if pending is not None:
      pending.result()

  def restore(self, target, step=None):
    """Restores the state at `step` with the structure and shardings of `target` (a state
    of the right shapes), verified against what was saved.

    Without `step`, the latest checkpoint that verifies, with a warning for each later one
    that does not. A checkpoint removed while it is read (by the clean-up of a training
    running in the workdir, which saves newer ones) is no warning: the newest one is tried
    again, up to `REREADS` times.

    Raises:
      ValueError: no checkpoint (at `step`), or the one at `step` was removed while read;
        the processes of a multi-process run restored different steps.
      CheckpointError: the checkpoint at `step` (or, without `step`, every one) does not
        verify; the message says why. Also when the checkpoints changed under every read.
    """
    state = self._restore_verified(target, step)
    distributed.agree(int(state["step"]), "the checkpoint step to resume from")
    return state

  def _restore_verified(self, target, step):
    """`restore` on this process."""
    self.wait()
    steps = self.steps()
    where = lambda steps: f"{self.directory} (checkpoints: {', '.join(map(str, steps)) or 'none'})"
    if step is not None:
      if step not in steps:
        raise ValueError(f"no checkpoint at step {step} in {where(steps)}")
      try:
        return self._restore(step, target)
      except CheckpointError:
        if step in self.steps():
          raise
        raise ValueError(f"checkpoint {step} in {self.directory} was removed while it was "
                         f"read (by the clean-up of a training running there?); choose a step "
                         f"kept now, or leave the step out for the newest: "
                         f"{where(self.steps())}") from None
    for _ in range(REREADS):
      if not steps:
        raise ValueError(f"no checkpoint in {self.directory}")
      failures, changed = [], None
      for candidate in reversed(steps):
        try:
          state = self._restore(candidate, target)
        except CheckpointError as e:
          now = self.steps()
          if now != steps:   # a training there saved and cleaned up meanwhile: read again
            changed = now
            break
          log.warning("%s; trying the previous checkpoint", e)
          failures.append(str(e))
          continue
        if failures:
          log.warning("restored step %d of %s instead of the latest", candidate, where(steps))
        return state
      if changed is None:
        raise CheckpointError(f"no checkpoint in {self.directory} can be restored: "
                              + "; ".join(failures))
      steps = changed
    raise CheckpointError(
        f"the checkpoints in {self.directory} were removed while read {REREADS} times: a "
        f"training running there saves and cleans up faster than they are read; score the "
        f"run once it ends, or rerun")

  def _restore(self, step, target):
    path = os.path.join(self.directory, str(step))
    name = f"checkpoint {path}"
    record = None
    if os.path.isfile(os.path.join(path, RECORD)):
      try:
        with open(os.path.join(path, RECORD)) as f:
          record = json.load(f)
        files, saved_leaves = record["files"], record["leaves"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{name}: unreadable {RECORD} ({_first_line(e)})") from None
      if record.get("step") != step:
        raise CheckpointError(f"{name}: {RECORD} is of step {record.get('step')}")
      for rel, (size, crc) in sorted(files.items()):
        file = os.path.join(path, rel)
        try:
          if not os.path.isfile(file):
            raise CheckpointError(f"{name}: file {rel} is missing")
          if os.path.getsize(file) != size:
            raise CheckpointError(f"{name}: file {rel} has {os.path.getsize(file)} bytes, "
                                  f"not the {size} written (truncated?)")
          if _file_crc(file) != crc:
            raise CheckpointError(f"{name}: file {rel} does not match its checksum "
                                  "(corrupted)")
        except OSError as e:   # removed or unreadable while read
          raise CheckpointError(f"{name}: file {rel} cannot be read ({_first_line(e)})"
                                ) from None
      expected = {k: (v["shape"], v["dtype"]) for k, v in _leaf_specs(target).items()}
      saved = {k: (v["shape"], v["dtype"]) for k, v in saved_leaves.items()}
      if saved != expected:
        raise CheckpointError(f"{name} holds another state than this run's: "
                              + _tree_difference(saved, expected))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    try:
      state = self._orbax.restore(os.path.join(path, ITEM), abstract)
    except Exception as e:   # pylint: disable=broad-except  (orbax raises many kinds)
      raise CheckpointError(f"{name} cannot be read ({_first_line(e)})") from None
    if jax.tree.structure(state) != jax.tree.structure(target):
      raise CheckpointError(f"{name}: restored tree structure differs from this run's state")
    restored = _leaf_records(state)
    expected = _leaf_specs(target)
    for key, got in restored.items():
      if (got["shape"], got["dtype"]) != (expected[key]["shape"], expected[key]["dtype"]):
        raise CheckpointError(f"{name}: {key} restored as {got['dtype']}{got['shape']}, not "
                              f"{expected[key]['dtype']}{expected[key]['shape']}")
      if record is not None:
        if got["crc32"] != record["leaves"][key]["crc32"]:
          raise CheckpointError(f"{name}: {key} does not match its checksum (corrupted)")
        if got["nonfinite"] != record["leaves"][key]["nonfinite"]:
          raise CheckpointError(f"{name}: {key} has {got['nonfinite']} non-finite values, "
                                f"{record['leaves'][key]['nonfinite']} when saved")
      elif self.finite and got["nonfinite"]:
        raise CheckpointError(f"{name}: {key} has {got['nonfinite']} non-finite values")
    if int(state["step"]) != step:
      raise CheckpointError(f"{name} holds step {int(state['step'])}")
    self._current = step
    return state

  def finish(self, state):
    """Saves `state` unless its step is the checkpoint restored or saved last, then
    closes."""
    step = int(state["step"])
    if self._current != step:
      self.save(step, state)
    self.close()
    return step

  def close(self):
    """Waits for a save being written (raising its error), then releases orbax's threads."""
    try:
      self.wait()
    finally:
      self._orbax.close()
      if self._pool is not None:
        self._pool.shutdown()
        self._pool = None


class _DiskFullFilter(logging.Filter):
  """Drops the error logs (a traceback each) of a write that found the disk full: the save
  raises it as one OSError."""

  def filter(self, record):
    text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
    return not (record.levelno >= logging.ERROR
                and any(message in text for message in jsonl.DISK_FULL.values()))


@contextlib.contextmanager
def _quiet_disk_full_logs():
  """While orbax saves: its threads log the error of a full disk, with tracebacks, to the
  "absl" logger before the save raises it."""
  loggers, quiet = [logging.getLogger(name) for name in ("absl", "asyncio")], _DiskFullFilter()
  for logger in loggers:
    logger.addFilter(quiet)
  try:
    yield
  finally:
    for logger in loggers:
      logger.removeFilter(quiet)


def _leaf_specs(tree):
  """{path: {shape, dtype}} of `tree`'s arrays (concrete or abstract)."""
  return {jax.tree_util.keystr(path): {"shape": list(np.shape(leaf)),
                                       "dtype": str(np.dtype(leaf.dtype))}
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _tree_difference(saved, expected):
  """One line on how two {path: (shape, dtype)} maps differ."""
  missing = sorted(set(expected) - set(saved))
  extra = sorted(set(saved) - set(expected))
  changed = sorted(k for k in set(saved) & set(expected) if saved[k] != expected[k])
  parts = []
  if missing:
    parts.append(f"missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
  if extra:
    parts.append(f"unexpected {', '.join(extra[:3])}" + (" ..." if len(extra) > 3 else ""))
  for k in changed[:3]:
    parts.append(f"{k} is {saved[k][1]}{saved[k][0]}, not {expected[k][1]}{expected[k][0]}")
  return "; ".join(parts)


def write_config(workdir, config_json):
  """Writes config.json, or checks that an existing one (a run being resumed) matches. Every
  process of a run checks; process 0 writes.

  Raises ValueError when the settings of a run to resume are unknown: checkpoints without
  config.json (deleted, say) would otherwise be resumed with whatever settings are given."""
  path = os.path.join(workdir, CONFIG_FILE)
  steps = checkpoint_steps(workdir)
  if steps and not os.path.exists(path):
    raise ValueError(
        f"{workdir} holds checkpoints (steps {', '.join(map(str, steps))}) but no "
        f"{CONFIG_FILE}: the settings of the run to resume are unknown, and resuming with "
        f"other ones would mix two runs; put its {CONFIG_FILE} back, or use a new workdir")
  if os.path.exists(path):
    old = _load_config(path, steps)
    new = complete_options(json.loads(config_json))
    if old.get("sweep") != new.get("sweep"):   # a sweep's stacked state is not a run's
      kind = lambda c: f"a sweep over {c['sweep']}" if c.get("sweep") else "a single run"
      raise ValueError(f"{workdir} holds {kind(old)}, not {kind(new)}; use a new workdir")
    for section in ("task", "model"):
      free = _FREE_BY_SECTION[section]
      if _without(old.get(section), free) != _without(new.get(section), free):
        raise ValueError(f"{workdir} holds a run with a different {section} configuration; "
                         f"use a new workdir (old: {old.get(section)}, new: "
                         f"{new.get(section)})")
    free = _FREE_BY_SECTION["train"]
    old_train = {k: v for k, v in old.get("train", {}).items()
                 if k not in free and not _added_default(k, v)}
    new_train = {k: v for k, v in new["train"].items()
                 if k not in free and not _added_default(k, v)}
    if old_train != new_train:
      diff = ", ".join(f"{k}: {old_train.get(k)} -> {new_train.get(k)}"
                       for k in sorted(set(old_train) | set(new_train))
                       if old_train.get(k) != new_train.get(k))
      raise ValueError(f"{workdir} holds a run with different training settings ({diff}); "
                       "resuming would not reproduce it; use a new workdir")
  if distributed.is_primary():
    os.makedirs(workdir, exist_ok=True)
    jsonl.write_atomic(path, config_json)


def _without(section, keys):
  if not isinstance(section, dict):
    return section
  return {k: v for k, v in section.items() if k not in keys}


def complete_options(config):
  """`config` (a config.json's object) with its model's mixer_options ([[name, value], ...])
  holding every option of its mixer: those it lacks at the value that reproduces its run
  (`_ADDED_OPTIONS`), else at the layer's default. A config.json written now holds them all
  (`ExperimentConfig.to_json`); one from before lacks some, and a default that changed since
  (VLA's qk_map) must not change what it means. Returned unchanged where there is no such list
  or the mixer is unknown (the model's own check names it)."""
  model = config.get("model") if isinstance(config, dict) else None
  options = model.get("mixer_options") if isinstance(model, dict) else None
  if not isinstance(options, list) or not all(
      isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) for o in options):
    return config
  try:
    defaults = mixer_options(model.get("mixer", "vla"))
  except ValueError:
    return config
  full = {**defaults, **{k: v for k, v in _ADDED_OPTIONS.items() if k in defaults},
          **dict(options)}
  return {**config, "model": {**model, "mixer_options": [[k, full[k]] for k in sorted(full)]}}


def read_config(workdir):
  """The config.json of the run in `workdir`; ValueError when there is none."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise ValueError(f"{workdir} is not a training run's folder: it has no {CONFIG_FILE}"
                     + ("" if os.path.isdir(workdir) else " (the folder does not exist)"))
  return _load_config(path, checkpoint_steps(workdir))


def _load_config(path, steps):
  """The JSON object in the config.json `path` (of a workdir with checkpoints at `steps`);
  ValueError naming the file and what to do when it is cut short or damaged, or holds VLA's
  penalty_scale None (the layer takes a number or "inv_sqrt_dh")."""
  fix = ("put back a whole copy of it or use a new workdir" if steps else
         "remove it to start the run afresh (the workdir holds no checkpoint), or use a new "
         "workdir")
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is cut short or damaged (not JSON: {e.msg} at line {e.lineno} "
                     f"column {e.colno}); it holds the run's settings: {fix}") from None
  except UnicodeDecodeError:
    raise ValueError(f"{path} is damaged (not UTF-8 text); it holds the run's settings: "
                     f"{fix}") from None
  if not isinstance(config, dict):
    raise ValueError(f"{path} holds no JSON object but a {type(config).__name__}; it holds "
                     f"the run's settings: {fix}")
  model = config.get("model")
  options = model.get("mixer_options") if isinstance(model, dict) else None
  if isinstance(options, list) and ["penalty_scale", None] in options:
    raise ValueError(f"{path} has mixer option penalty_scale None, which the layer no longer "
                     "takes; the authors' 1 / sqrt(head_dim) it meant is \"inv_sqrt_dh\": "
                     "write that in its place")
  return complete_options(config)


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
