"""One run per workdir (`vla_jax.training.lock`): a second run fails at once naming the holder;
the lock goes when its run ends; a lock of a process that died on this host is taken over; on a
file system without flock or hard links (simulated) a soft lock holds the workdir the same way
and a run trains."""

import errno
import fcntl
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


def _owner(workdir):
  return json.loads((workdir / lock.OWNER_FILE).read_text())


@pytest.fixture
def no_flock_nor_links(monkeypatch):
  """A file system like an object store's FUSE mount or NFS without locking: flock and
  link() fail (for every file, in this process)."""
  def refuse(*args):
    del args
    raise OSError(errno.ENOTSUP, "Operation not supported")

  def no_link(*args, **kwargs):
    del args, kwargs
    raise OSError(errno.EPERM, "Operation not permitted")

  monkeypatch.setattr(fcntl, "flock", refuse)
  monkeypatch.setattr(os, "link", no_link)
  monkeypatch.setattr(lock, "_said_soft", [], raising=False)


def _soft_lock(workdir, lock_file=True, **owner):
  """The lock file and owner record a soft lock's holder leaves (`lock_file`: the record names
  the lock file it was written for)."""
  workdir.mkdir(exist_ok=True)
  (workdir / lock.LOCK_FILE).write_text("")
  if lock_file:
    st = os.stat(workdir / lock.LOCK_FILE)
    owner["lock_file"] = [st.st_ino, st.st_mtime_ns]
  (workdir / lock.OWNER_FILE).write_text(json.dumps(owner))


def test_a_held_workdir_refuses_a_second_holder_until_released(tmp_path):
  held = lock.WorkdirLock(tmp_path / "w")
  with held:
    assert not held.soft
    saved = _owner(tmp_path / "w")
    assert saved["pid"] == os.getpid() and saved["host"] == os.uname().nodename
    with pytest.raises(lock.WorkdirInUseError, match=rf"in use by another run \(pid "
                                                       rf"{os.getpid()} on host"):
      lock.WorkdirLock(tmp_path / "w").acquire()
  assert not (tmp_path / "w" / lock.OWNER_FILE).exists()
  with lock.WorkdirLock(tmp_path / "w"):   # free again
    pass


def test_a_killed_runs_flock_record_is_taken_over(tmp_path, caplog):
  """With flock the kernel let go of a killed run's lock: its record is only overwritten."""
  (tmp_path / "w").mkdir()
  (tmp_path / "w" / lock.OWNER_FILE).write_text(json.dumps({"pid": _dead_pid(), "host": "h"}))
  with caplog.at_level(logging.WARNING, logger=lock.__name__):
    with lock.WorkdirLock(tmp_path / "w"):
      assert _owner(tmp_path / "w")["pid"] == os.getpid()
  assert "taking over the lock of pid" in caplog.text and "no longer runs" in caplog.text


def test_without_flock_a_soft_lock_holds_the_workdir(tmp_path, no_flock_nor_links, caplog):
  """flock and link() fail: the lock is a lock file, said once; a second holder is refused,
  the lock file goes when its run ends."""
  del no_flock_nor_links
  with caplog.at_level(logging.WARNING, logger=lock.__name__):
    with lock.WorkdirLock(tmp_path / "w") as held:
      assert held.soft and (tmp_path / "w" / lock.LOCK_FILE).exists()
      assert _owner(tmp_path / "w")["pid"] == os.getpid()
      with pytest.raises(lock.WorkdirInUseError, match=rf"\(pid {os.getpid()} on host .*; "
                         rf"wait for it to end or use another workdir \(if no run uses it, "
                         rf"remove {tmp_path / 'w' / lock.LOCK_FILE}\)"):
        lock.WorkdirLock(tmp_path / "w").acquire()
    assert not (tmp_path / "w" / lock.LOCK_FILE).exists()
    assert not (tmp_path / "w" / lock.OWNER_FILE).exists()
    with lock.WorkdirLock(tmp_path / "w2"):
      pass
  said = [r.getMessage() for r in caplog.records]
  assert len(said) == 1 and "does not support flock" in said[0], said


def test_stale_soft_locks_are_taken_over_and_others_are_not(tmp_path, no_flock_nor_links,
                                                            caplog):
  del no_flock_nor_links
  host = os.uname().nodename
  _soft_lock(tmp_path / "dead", pid=_dead_pid(), host=host, since="then")
  with caplog.at_level(logging.WARNING, logger=lock.__name__):
    with lock.WorkdirLock(tmp_path / "dead"):
      assert _owner(tmp_path / "dead")["pid"] == os.getpid()
  assert "taking over the lock of pid" in caplog.text and "no longer runs" in caplog.text
  # A live pid whose start time differs was reused by a later process: stale too.
  _soft_lock(tmp_path / "reused", pid=os.getpid(), host=host, start=1)
  with lock.WorkdirLock(tmp_path / "reused"):
    pass
  # A live process of this host, a process on another host, an unreadable record, a record
  # of another lock file (its holder has not written its own yet): in use.
  _soft_lock(tmp_path / "live", pid=os.getppid(), host=host)
  _soft_lock(tmp_path / "remote", pid=_dead_pid(), host=host + "-elsewhere")
  _soft_lock(tmp_path / "untied", lock_file=False, pid=_dead_pid(), host=host)
  _soft_lock(tmp_path / "garbled")
  (tmp_path / "garbled" / lock.OWNER_FILE).write_text("{")
  for name in ("live", "remote", "untied", "garbled"):
    with pytest.raises(lock.WorkdirInUseError, match=f"remove {tmp_path / name / 'lock'}"):
      lock.WorkdirLock(tmp_path / name).acquire()
    assert (tmp_path / name / "lock").exists()


def test_a_run_trains_without_flock_or_hard_links(tmp_path, no_flock_nor_links):
  """train_and_evaluate holds its workdir with a soft lock and writes its metrics rows."""
  del no_flock_nor_links
  from vla_jax.training import train_and_evaluate  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  seen = []

  def log(line):
    if line.startswith("step 1/"):
      with pytest.raises(lock.WorkdirInUseError):
        lock.WorkdirLock(workdir).acquire()
      seen.append(line)

  summary = train_and_evaluate(test_sweep.tiny_config(), str(workdir), stop_after=2, log=log)
  assert summary["steps"] == 2 and seen
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2]
  assert not (workdir / lock.LOCK_FILE).exists() and (workdir / "checkpoints" / "2").is_dir()


def test_a_sweep_holds_its_workdir(tmp_path):
  with lock.WorkdirLock(tmp_path / "s"):
    with pytest.raises(lock.WorkdirInUseError, match="in use by another run"):
      train_sweep(test_sweep.tiny_config(), [0], [1e-2], str(tmp_path / "s"),
                  log=lambda s: None)
  assert not (tmp_path / "s" / "config.json").exists()


def test_a_second_train_py_on_a_running_workdir_fails_at_once(tmp_path):
  """train.py A is training; B on the same workdir exits non-zero with one line naming A's
  pid and writes nothing; A killed by SIGKILL leaves its owner record, which the next run
  takes over."""
  workdir = tmp_path / "run"
  common = TRAIN_PY + [f"--workdir={workdir}", "--config.train.log_every=100000"]
  with open(tmp_path / "a.log", "w") as out:
    a = subprocess.Popen(common + ["--config.train.num_steps=1000000"], stdout=out,
                         stderr=subprocess.STDOUT, env=ENV)
  try:
    deadline = time.time() + 300
    while not (workdir / lock.OWNER_FILE).exists():
      assert a.poll() is None and time.time() < deadline, (tmp_path / "a.log").read_text()
      time.sleep(0.2)
    before = sorted(p.name for p in workdir.iterdir())
    b = subprocess.run(common + ["--config.train.num_steps=1000000"], capture_output=True,
                       text=True, timeout=300, env=ENV, check=False)
    assert b.returncode == 1, b.stderr[-2000:]
    assert b.stderr.strip().splitlines()[-1] == (
        f"train.py: error: workdir {workdir} is in use by another run (pid {a.pid} on host "
        f"'{os.uname().nodename}', since {_owner(workdir)['since']}); wait for it to end or "
        "use another workdir")
    assert "Traceback" not in b.stderr and b.stdout == ""
    assert sorted(p.name for p in workdir.iterdir()) == before
    assert a.poll() is None   # A trains on
  finally:
    a.send_signal(signal.SIGKILL)
    a.wait()
  assert _owner(workdir)["pid"] == a.pid   # left behind, and taken over
  with lock.WorkdirLock(workdir):
    assert _owner(workdir)["pid"] == os.getpid()
