"""JSONL rows of the benchmark and check scripts: one header line (versions, device,
settings), then one line per measured row, appended and flushed as soon as it is measured."""

import datetime
import importlib.metadata
import json
import os
import platform
import sys

FIELDS = ("impl", "op", "pass", "T", "B", "H", "d", "dtype", "ms", "peak_mib", "status", "note")


def _version(dist):
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def environment():
  """Versions of everything the rows depend on, and the accelerator's name."""
  info = {"python": platform.python_version(), "host": platform.node()}
  for dist in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "torch", "triton",
               "fla-core", "flash-linear-attention", "jax-triton", "numpy"):
    info[dist] = _version(dist)
  try:
    import jax  # pylint: disable=import-outside-toplevel
    dev = jax.devices()[0]
    info["jax_backend"] = jax.default_backend()
    info["device"] = dev.device_kind
    info["device_count"] = jax.device_count()
  except Exception as err:  # pylint: disable=broad-except
    info["device"] = f"unknown ({type(err).__name__})"
  try:
    import torch  # pylint: disable=import-outside-toplevel
    if torch.cuda.is_available():
      info["torch_device"] = torch.cuda.get_device_name(0)
      info["torch_cuda"] = torch.version.cuda
  except Exception:  # pylint: disable=broad-except
    pass
  for var in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
              "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES"):
    if var in os.environ:
      info[var] = os.environ[var]
  return info


def header(settings, env=None):
  """A rows file's first line: the time, the command line, `settings` and `env` (default
  `environment()`, read in this process)."""
  return {"kind": "header",
          "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "argv": sys.argv, "settings": settings, **(environment() if env is None else env)}


class Recorder:
  """Appends JSON lines to `path` (its folder made if needed) and echoes them to stdout."""

  def __init__(self, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.path = path
    self.count = 0

  def _write(self, obj):
    line = json.dumps(obj, default=str)
    with open(self.path, "a") as f:
      f.write(line + "\n")
      f.flush()
    print(line, flush=True)

  def header(self, settings):
    """The file's first line (`header`)."""
    self._write(header(settings))

  def row(self, **fields):
    row = {key: fields.pop(key, None) for key in FIELDS}
    row.update(fields)
    self._write(row)
    self.count += 1
    return row
