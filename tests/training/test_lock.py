"""One run per workdir (`vla_jax.training.lock`): a second run fails at once naming the holder;
the lock goes when its run ends; a lock of a process that died on this host is taken over."""

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from vla_jax.training import lock
from vla_jax.training.sweep import train_sweep

ROOT = pathlib.Path(__file__).resolve().parents[2]

import test_sweep  # noqa: E402  pylint: disable=wrong-import-position

TRAIN_PY = [sys.executable, str(ROOT / "experiments" / "train.py"),
            f"--config={ROOT / 'configs' / 'mqar_demo.py'}", "--config.task.n_pairs=3",
            "--config.model.d_model=16", "--config.model.head_dim=8",
            "--config.train.batch_size=8", "--config.train.eval_examples=16",
            "--config.train.eval_batch_size=16"]
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _dead_pid():
  proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(proc.stdout)


def _write_lock(workdir, **owner):
  workdir.mkdir(exist_ok=True)
  (workdir / lock.LOCK_FILE).write_text(json.dumps(owner))


def test_a_held_workdir_refuses_a_second_holder_until_released(tmp_path):
  held = lock.WorkdirLock(tmp_path / "w")
  with held:
    saved = json.loads((tmp_path / "w" / "lock").read_text())
    assert saved["pid"] == os.getpid() and saved["host"] == os.uname().nodename
    with pytest.raises(lock.WorkdirInUseError, match=rf"in use by another run \(pid "
                                                       rf"{os.getpid()} on host"):
      lock.WorkdirLock(tmp_path / "w").acquire()
  assert not (tmp_path / "w" / "lock").exists()
  with lock.WorkdirLock(tmp_path / "w"):   # free again
    pass


def test_stale_locks_are_taken_over_and_others_are_not(tmp_path, caplog):
  host = os.uname().nodename
  _write_lock(tmp_path / "dead", pid=_dead_pid(), host=host, since="then")
  with caplog.at_level(logging.WARNING, logger=lock.__name__):
    with lock.WorkdirLock(tmp_path / "dead"):
      assert json.loads((tmp_path / "dead" / "lock").read_text())["pid"] == os.getpid()
  assert "taking over the lock of pid" in caplog.text and "no longer runs" in caplog.text
  # A live pid whose start time differs was reused by a later process: stale too.
  _write_lock(tmp_path / "reused", pid=os.getpid(), host=host, start=1)
  with lock.WorkdirLock(tmp_path / "reused"):
    pass
  # A live process of this host, a process on another host, an unreadable lock: in use.
  _write_lock(tmp_path / "live", pid=os.getppid(), host=host)
  _write_lock(tmp_path / "remote", pid=_dead_pid(), host=host + "-elsewhere")
  (tmp_path / "garbled").mkdir()
  (tmp_path / "garbled" / "lock").write_text("{")
  for name in ("live", "remote", "garbled"):
    with pytest.raises(lock.WorkdirInUseError, match=f"remove {tmp_path / name / 'lock'}"):
      lock.WorkdirLock(tmp_path / name).acquire()
    assert (tmp_path / name / "lock").exists()


def test_a_sweep_holds_its_workdir(tmp_path):
  with lock.WorkdirLock(tmp_path / "s"):
    with pytest.raises(lock.WorkdirInUseError, match="in use by another run"):
      train_sweep(test_sweep.tiny_config(), [0], [1e-2], str(tmp_path / "s"),
                  log=lambda s: None)
  assert not (tmp_path / "s" / "config.json").exists()


def test_a_second_train_py_on_a_running_workdir_fails_at_once(tmp_path):
  """train.py A is training; B on the same workdir exits non-zero with one line naming A's
  pid and writes nothing; A killed by SIGKILL leaves its lock, which the next run takes
  over."""
  workdir = tmp_path / "run"
  common = TRAIN_PY + [f"--workdir={workdir}", "--config.train.log_every=100000"]
  with open(tmp_path / "a.log", "w") as out:
    a = subprocess.Popen(common + ["--config.train.num_steps=1000000"], stdout=out,
                         stderr=subprocess.STDOUT, env=ENV)
  try:
    deadline = time.time() + 300
    while not (workdir / "lock").exists():
      assert a.poll() is None and time.time() < deadline, (tmp_path / "a.log").read_text()
      time.sleep(0.2)
    before = sorted(p.name for p in workdir.iterdir())
    b = subprocess.run(common + ["--config.train.num_steps=1000000"], capture_output=True,
                       text=True, timeout=300, env=ENV, check=False)
    assert b.returncode == 1, b.stderr[-2000:]
    assert b.stderr.strip().splitlines()[-1] == (
        f"train.py: error: workdir {workdir} is in use by another run (pid {a.pid} on host "
        f"'{os.uname().nodename}', since {json.loads((workdir / 'lock').read_text())['since']})"
        f"; wait for it to end or use another workdir (if no run uses it, remove "
        f"{workdir / 'lock'})")
    assert "Traceback" not in b.stderr and b.stdout == ""
    assert sorted(p.name for p in workdir.iterdir()) == before
    assert a.poll() is None   # A trains on
  finally:
    a.send_signal(signal.SIGKILL)
    a.wait()
  assert json.loads((workdir / "lock").read_text())["pid"] == a.pid   # left behind
  with lock.WorkdirLock(workdir):
    assert json.loads((workdir / "lock").read_text())["pid"] == os.getpid()
