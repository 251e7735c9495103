"""What the absl mains in experiments/ share: flags that fail with one line, and a user's
mistakes reported as one line on stderr (exit status 1) instead of a traceback.

    app.run(main, flags_parser=cli.parse_flags)      # and in main: `with cli.user_errors():`
"""

import contextlib
import importlib.util
import logging
import os
import re
import sys

from absl import flags

from vla_jax.training import jsonl
from vla_jax.training import lock


def _config_fields(argv, path):
  """The fields of the section `path` (a list of names) of the config file in argv's
  `--config=FILE[:ARGS]`, for an error message; None when it cannot be loaded."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    return None
  filename, _, arg = spec.partition(":")
  try:
    module_spec = importlib.util.spec_from_file_location("config_for_message", filename)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    section = module.get_config(arg) if arg else module.get_config()
    for name in path:
      section = section[name]
    return sorted(section.keys())
  except Exception:   # pylint: disable=broad-except  (only the message loses the list)
    return None


def parse_flags(argv):
  """absl's flag parsing (for `app.run(..., flags_parser=parse_flags)`), except that an
  override of a field the configuration does not have (`--config.task.seq_len` on a task
  without it), which ml_collections reports as a bare KeyError, exits with one line naming
  the flag and the fields there are."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f"{os.path.basename(argv[0])}: {e}\nPass --helpshort or --helpfull to see help "
             "on flags.")
  except (KeyError, AttributeError) as e:
    while isinstance(e.args[0] if e.args else None, BaseException):
      e = e.args[0]
    text = str(e.args[0]) if e.args else str(e)
    found = re.match(r"'([^']+)'", text)
    if found is None:
      raise
    key, hint = found.group(1), text[found.end():].strip()
    flag = next((a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")
                 and re.search(rf"\.{re.escape(key)}(\.|=|$)", a.split("=", 1)[0])), None)
    if flag is None:
      raise
    path = flag[len("--config."):].split(".")
    parent = path[:path.index(key)]
    fields = _config_fields(argv, parent)
    where = "config." + ".".join(parent) if parent else "the configuration"
    listing = f" (it has: {', '.join(fields)})" if fields else ""
    sys.exit(f"{os.path.basename(argv[0])}: {flag}: {where} has no field {key!r}{listing}"
             + (f"; {hint}" if hint else ""))


USER_ERRORS = (ValueError, lock.WorkdirInUseError)


@contextlib.contextmanager
def user_errors(program):
  """Turns a user's mistake (`USER_ERRORS`: a bad setting, file or workdir) and a full disk
  (an OSError ENOSPC or EDQUOT, `jsonl.disk_full`) into one line on stderr and exit status 1;
  other exceptions keep their traceback."""
  try:
    yield
  except OSError as e:
    code = jsonl.disk_full(e)
    if code is None:
      raise
    sys.exit(f"{program}: error: {e.filename or 'a file'}: {jsonl.DISK_FULL[code]} (the disk "
             f"is full): free space there or use a folder on another disk, then rerun (a "
             f"training run resumes from its last complete checkpoint)")
  except USER_ERRORS as e:
    sys.exit(f"{program}: error: {e}")


def quiet_libraries():
  """Keeps the libraries' INFO logs (absl, orbax, jax) off stderr: warnings still show."""
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  if not flags.FLAGS["verbosity"].present:   # --verbosity=0 brings them back
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
