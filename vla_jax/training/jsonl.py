"""JSON-lines files that processes append to and may be killed while writing.

`append_rows` writes a batch of rows in one call with SIGTERM held back, so a stop signal lands
between batches, not inside one; `read_rows` skips a truncated last line (what a SIGKILL during
a write leaves) and names the file and line of any other malformed line. `write_rows` replaces a
file's rows at once (through `write_atomic`, which any whole-file write can use).
"""

import json
import os
import signal
import threading


def _lines(rows, **dumps):
  return "".join(json.dumps(row, **dumps) + "\n" for row in rows)


def append_rows(path, rows, **dumps):
  """Appends `rows` (dicts) to `path`, one JSON object per line, in a single write."""
  text = _lines(rows, **dumps)
  if not text:
    return
  block = threading.current_thread() is threading.main_thread()
  if block:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
  try:
    with open(path, "a") as f:
      f.write(text)
      f.flush()
  finally:
    if block:
      signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_rows(path, rows, **dumps):
  """Replaces the contents of `path` with `rows`, one JSON object per line (atomically)."""
  write_atomic(path, _lines(rows, **dumps))


def write_atomic(path, text):
  """Writes `text` to `path` through a temporary file and a rename, so that an interruption
  leaves either the old file or the new one, never a truncated one."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


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
