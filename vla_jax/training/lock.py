"""A run's hold on its workdir: `<workdir>/lock`, held with the `filelock` package, and
`<workdir>/lock.owner`, a JSON record of the holder's pid, host and start.

Two processes training in one workdir would overwrite each other's checkpoints and write
duplicate metric rows. `train_and_evaluate` and `train_sweep` hold the workdir while they run
(`WorkdirLock`); a second run on it fails at once with `WorkdirInUseError`, naming the holder.

Where the file system supports `flock` (local disks, NFS with locking) the lock is a
`filelock.FileLock`: the kernel lets go of it when its process ends, however it ends, so it is
never stale. Where it does not (some FUSE mounts of object stores, NFS mounted without
locking, vfat or exFAT on some systems) the lock is a `filelock.SoftFileLock`: the lock file's
existence is the hold (created with O_EXCL), a warning says so once per process, and a process
killed with SIGKILL leaves it behind. Such a lock left by a process of this host that no longer
runs is taken over with a warning; one written on another host is never judged stale (its pid
means nothing here) and must be removed by hand once that run is gone, as must one whose owner
record is missing (a run killed while taking the lock). The run's owner record is removed when
it ends, by an exception or a SIGTERM (`preemption`) too.
"""

import errno
import fcntl
import json
import logging
import os
import socket
import time

import filelock

LOCK_FILE = "lock"
OWNER_FILE = "lock.owner"
# What flock raises on a file system that does not support it (NFS without locking: ENOLCK).
NO_FLOCK_ERRNOS = frozenset({errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOLCK,
                             errno.EINVAL, errno.EPERM, errno.EBADF})

log = logging.getLogger(__name__)
_said_soft = []   # [True] once the soft lock's warning was given in this process


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
  """Whether the process `owner` (a lock's record, written on this host) still runs."""
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
  """An owner record: None when there is none, {} when it does not parse."""
  try:
    with open(path) as f:
      owner = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}
  return owner if isinstance(owner, dict) else {}


def _identity(path):
  """(inode, mtime in ns) of `path`, or None when it does not exist: ties an owner record to
  the soft lock file it was written for."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return None
  return [st.st_ino, st.st_mtime_ns]


def _describe(owner):
  return (f"pid {owner.get('pid')} on host {owner.get('host')!r}, since {owner.get('since')}"
          if owner else "an unknown process: no readable owner record")


def flock_supported(directory):
  """Whether `flock` works on files of `directory`: tried on a new file there, removed again.

  Raises:
    OSError: the file cannot be made (a read-only or full disk, say).
  """
  probe = os.path.join(directory, f".flock-probe-{socket.gethostname()}-{os.getpid()}")
  fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in NO_FLOCK_ERRNOS:
      raise
    return False
  finally:
    os.close(fd)
    os.remove(probe)
  return True


class WorkdirLock:
  """Holds `workdir` (created if needed) for one run: a context manager.

  Attributes:
    soft: whether the lock is a `filelock.SoftFileLock` (the file system lacks flock).

  Raises:
    WorkdirInUseError: on entry, when another run holds it.
  """

  def __init__(self, workdir):
    self.workdir = os.path.abspath(workdir)
    self.path = os.path.join(self.workdir, LOCK_FILE)
    self.owner_path = os.path.join(self.workdir, OWNER_FILE)
    self.soft = None
    self.owner = None
    self._lock = None

  def acquire(self):
    os.makedirs(self.workdir, exist_ok=True)
    self.soft = not flock_supported(self.workdir)
    if self.soft and not _said_soft:
      _said_soft.append(True)
      log.warning("%s: the file system does not support flock; holding the workdir with the "
                  "lock file %s instead (one that a run killed by SIGKILL leaves behind is "
                  "taken over when that run was of this host)", self.workdir, self.path)
    kind = filelock.SoftFileLock if self.soft else filelock.FileLock
    self._lock = kind(self.path, timeout=0)
    try:
      self._lock.acquire()
    except filelock.Timeout:
      if not (self.soft and self._stale(_read(self.owner_path))):
        raise self._in_use(_read(self.owner_path)) from None
      try:
        self._lock.acquire()
      except filelock.Timeout:
        raise self._in_use(_read(self.owner_path)) from None
    try:
      previous = _read(self.owner_path)   # held now: a record there is a killed run's
      if previous:
        log.warning("%s: taking over the lock of %s, which no longer runs", self.workdir,
                    _describe(previous))
      me = {"pid": os.getpid(), "host": socket.gethostname(),
            "start": _start_time(os.getpid()), "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "lock": "soft" if self.soft else "flock"}
      if self.soft:
        me["lock_file"] = _identity(self.path)
      # Through a temporary file and a rename: the record never exists half-written.
      tmp = f"{self.owner_path}.tmp{os.getpid()}"
      with open(tmp, "w") as f:
        json.dump(me, f)
      os.replace(tmp, self.owner_path)
    except BaseException:
      self._lock.release()
      raise
    self.owner = me
    return self

  def _stale(self, owner):
    """Removes the soft lock when `owner`, its record, names a process of this host that no
    longer runs; returns whether it did."""
    held = _identity(self.path)
    if not (owner and held is not None and owner.get("lock_file") == held
            and owner.get("host") == socket.gethostname() and not _running(owner)):
      return False
    if _identity(self.path) != held:   # taken over by another process meanwhile
      return False
    os.remove(self.path)
    return True

  def _in_use(self, owner):
    hint = (f" (if no run uses it, remove {self.path})" if self.soft else "")
    return WorkdirInUseError(
        f"workdir {self.workdir} is in use by another run ({_describe(owner)}); wait for it "
        f"to end or use another workdir{hint}")

  def release(self):
    """Removes the owner record if it is still this run's, then lets go of the lock."""
    if self._lock is None:
      return
    try:
      if self.owner is not None and _read(self.owner_path) == self.owner:
        os.remove(self.owner_path)
    finally:
      self._lock.release()
      self._lock, self.owner = None, None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
    return False
