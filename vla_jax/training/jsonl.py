"""JSON-lines files that processes append to and may be killed while writing.

`append_rows` writes a batch of rows in one call with SIGTERM held back, so a stop signal lands
between batches, not inside one. Writers of one file take turns through `flock`; on a file
system without it (see `lock`) rows are appended without, with a warning once per process
(a workdir's own files have one writer, the run that holds the workdir). A SIGKILL during a
write can still leave a last line cut short: `read_rows` skips it, and the next `append_rows`
first truncates it (or ends it with its newline when it is a whole row), so that the new rows
start on a line of their own and the file stays readable. `read_rows` names the file and line
of any other malformed line. `write_rows` replaces a file's rows at once (through
`write_atomic`, which any whole-file write can use). A full disk is an OSError naming the file
(`disk_full` tells one, also from a library's error that says so); `write_atomic` then leaves
the old file as it was.
"""

import errno
import fcntl
import json
import logging
import os
import signal
import threading

from vla_jax.training import lock

log = logging.getLogger(__name__)
_said_no_flock = []   # [True] once the warning was given in this process
DISK_FULL = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def disk_full(error):
  """ENOSPC or EDQUOT when `error`, or an error it comes from, says that the disk (or the
  quota) is full, as an OSError or in a library's message; None otherwise."""
  seen, stack = set(), [error]
  while stack:
    e = stack.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in DISK_FULL:
      return e.errno
    text = str(e)
    for code, message in DISK_FULL.items():
      if message in text:
        return code
    stack += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
  return None


def _named(error, path):
  """`error` as an OSError naming `path` when it says the disk is full (os.write's do not
  name the file), else `error`."""
  code = disk_full(error)
  if code is None or (isinstance(error, OSError) and error.filename):
    return error
  return OSError(code, DISK_FULL[code], str(path))


def _lines(rows, **dumps):
  return "".join(json.dumps(row, **dumps) + "\n" for row in rows)


def append_rows(path, rows, **dumps):
  """Appends `rows` (dicts) to `path`, one JSON object per line, in a single write, after
  repairing a last line that a killed writer cut short (see the module docstring). Writers
  of one file take turns (an advisory lock on it)."""
  data = _lines(rows, **dumps).encode()
  if not data:
    return
  block = threading.current_thread() is threading.main_thread()
  if block:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
      _take_turn(fd, path)
      _end_last_line(fd, path)
      while data:
        data = data[os.write(fd, data):]
    except OSError as e:   # a line cut short is repaired by the next append
      error = _named(e, path)
      if error is e:
        raise
      raise error from None
    finally:
      os.close(fd)
  finally:
    if block:
      signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _take_turn(fd, path):
  """Waits for the advisory lock on `fd` (released when it is closed); where the file system
  has no flock, goes on without, saying so once."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
  except OSError as e:
    if e.errno not in lock.NO_FLOCK_ERRNOS:
      raise
    if not _said_no_flock:
      _said_no_flock.append(True)
      log.warning("%s: the file system does not support flock; appending rows without it "
                  "(processes appending to one file at once may mix their lines)", path)


def _end_last_line(fd, path):
  """Makes the file `fd` end with a newline: a last line without one is completed when it
  holds a whole JSON row and truncated away otherwise (with a warning)."""
  size = os.fstat(fd).st_size
  if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
    return
  start = size
  while start > 0:   # back to the last newline, a block at a time
    lo = max(0, start - 65536)
    block = os.pread(fd, start - lo, lo)
    cut = block.rfind(b"\n")
    if cut >= 0:
      start = lo + cut + 1
      break
    start = lo
  tail = os.pread(fd, size - start, start)
  try:
    whole = isinstance(json.loads(tail), dict)
  except ValueError:
    whole = False
  if whole:
    os.write(fd, b"\n")
  else:
    log.warning("%s: dropping a last line cut short by an interrupted write (%d bytes: %.60r)",
                path, size - start, tail)
    os.ftruncate(fd, start)


def write_rows(path, rows, **dumps):
  """Replaces the contents of `path` with `rows`, one JSON object per line (atomically)."""
  write_atomic(path, _lines(rows, **dumps))


def write_atomic(path, text):
  """Writes `text` to `path` through a temporary file and a rename, so that an interruption
  leaves either the old file or the new one, never a truncated one."""
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    error = _named(e, path)
    if error is e:
      raise
    raise error from None


def read_rows(path):
  """The rows of `path` ([] when it does not exist). A last line without its newline that
  does not parse is skipped as a write cut short; a malformed line elsewhere raises
  ValueError naming the file and line."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = f.read().split("\n")
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError as e:
      if number == len(lines):   # no newline after it: the write was cut short
        break
      raise ValueError(f"{path}:{number}: not a JSON object ({e})") from e
  return rows
