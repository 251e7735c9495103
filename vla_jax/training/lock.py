"""A run's hold on its workdir: `<workdir>/lock`, a file naming the owner's pid and host.

Two processes training in one workdir would overwrite each other's checkpoints and write
duplicate metric rows. `train_and_evaluate` and `train_sweep` hold the workdir while they run
(`WorkdirLock`); a second run on it fails at once with `WorkdirInUseError`, naming the holder.
The lock file is removed when the run ends, by an exception or SIGTERM too. A lock left by a
process of this host that no longer runs (killed by SIGKILL, say) is taken over with a
warning; one written on another host is never judged stale (its pid means nothing here) and
must be removed by hand once that run is gone.
"""

import contextlib
import fcntl
import json
import logging
import os
import socket
import time

LOCK_FILE = "lock"

log = logging.getLogger(__name__)


class WorkdirInUseError(RuntimeError):
  """Another process holds the workdir."""


def _start_time(pid):
  """The start time of process `pid` in clock ticks since boot (Linux /proc), or None: with
  the pid it tells a process from a later one that reuses its pid."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _running(owner):
  """Whether the process `owner` (a lock's contents, written on this host) still runs."""
  pid = owner.get("pid")
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # it runs, as another user
    pass
  start = _start_time(pid)
  return owner.get("start") is None or start is None or start == owner["start"]


def _read(path):
  """The lock's contents: None when there is no lock, {} when it does not parse."""
  try:
    with open(path) as f:
      owner = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}
  return owner if isinstance(owner, dict) else {}


def _describe(owner):
  return (f"pid {owner.get('pid')} on host {owner.get('host')!r}, since {owner.get('since')}"
          if owner else "an unreadable lock file")


@contextlib.contextmanager
def _serialised(directory):
  """Holds an advisory lock on `directory` itself, so that two processes of this host never
  judge and replace a stale lock at once (a no-op where the file system refuses it)."""
  fd = os.open(directory, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
      pass
    yield
  finally:
    os.close(fd)   # releases the flock


class WorkdirLock:
  """Holds `workdir` (created if needed) for one run: a context manager.

  Raises:
    WorkdirInUseError: on entry, when a live process (or one on another host) holds it.
  """

  def __init__(self, workdir):
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, LOCK_FILE)
    self.owner = None

  def acquire(self):
    os.makedirs(self.workdir, exist_ok=True)
    me = {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid()),
          "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with _serialised(self.workdir):
      owner = _read(self.path)
      if owner is not None:
        if owner and owner.get("host") == me["host"] and not _running(owner):
          log.warning("%s: taking over the lock of %s, which no longer runs", self.workdir,
                      _describe(owner))
          os.remove(self.path)
        else:
          raise self._in_use(owner)
      # Written whole under another name, then linked: the lock never exists half-written,
      # and link() fails if another host's process made one meanwhile.
      tmp = f"{self.path}.{me['host']}.{me['pid']}"
      with open(tmp, "w") as f:
        json.dump(me, f)
      try:
        os.link(tmp, self.path)
      except FileExistsError:
        raise self._in_use(_read(self.path)) from None
      finally:
        os.remove(tmp)
    self.owner = me
    return self

  def _in_use(self, owner):
    return WorkdirInUseError(
        f"workdir {self.workdir} is in use by another run ({_describe(owner)}); wait for it "
        f"to end or use another workdir (if no run uses it, remove {self.path})")

  def release(self):
    """Removes the lock file if it is still this run's."""
    if self.owner is not None and _read(self.path) == self.owner:
      os.remove(self.path)
    self.owner = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
    return False
