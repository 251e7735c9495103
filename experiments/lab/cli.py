"""What the absl mains in experiments/ share: flags that fail with one line, a user's
mistakes reported as one line on stderr (exit status 1) instead of a traceback, and the flags
of a run of several processes.

    app.run(main, flags_parser=cli.parse_flags)      # and in main: `with cli.user_errors():`
    cli.define_process_flags()                       # and first in main: cli.start_processes()
    cli.define_kernel_option_flags("calls")          # and in main: cli.kernel_options()
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


def define_process_flags():
  """Defines --coordinator_address, --num_processes and --process_id: one process of a run of
  several (`vla_jax.training.distributed`), for a main that trains."""
  flags.DEFINE_string(
      "coordinator_address", None, "host:port of process 0 in a run of several processes "
      "(one per host), the same for every process. Without it and the two flags below, the "
      "run has one process unless JAX_COORDINATOR_ADDRESS is set; values not given come from "
      "JAX_COORDINATOR_ADDRESS or a SLURM, Open MPI, Kubernetes or Cloud TPU job.")
  flags.DEFINE_integer("num_processes", None, "Processes of the run (see "
                       "--coordinator_address).", lower_bound=1)
  flags.DEFINE_integer("process_id", None, "This process's index in [0, --num_processes); "
                       "process 0 writes the run's files.", lower_bound=0)
  flags.register_validator(
      "coordinator_address", lambda a: a is None or re.fullmatch(r".+:\d{1,5}", a) is not None,
      message="--coordinator_address must be host:port, such as localhost:12345")
  flags.register_multi_flags_validator(
      ["num_processes", "process_id"],
      lambda f: None in (f["num_processes"], f["process_id"])
      or f["process_id"] < f["num_processes"],
      message="--process_id must be below --num_processes")


KERNEL_OPTIONS = ("block_factor", "start_inverse", "penalty_layout")


def define_kernel_option_flags(calls):
  """Defines --block_factor, --start_inverse and --penalty_layout: the `KernelConfig` options
  of the script's calls (`calls` names them in the help), each "plan" (the plan's choice) by
  default, or one of the forms `vla_jax.kernels.config` lists (imported here: only the kernel
  scripts pay for it)."""
  from vla_jax.kernels import config  # pylint: disable=import-outside-toplevel
  forms = {"block_factor": config.BLOCK_FACTORS, "start_inverse": config.START_INVERSES,
           "penalty_layout": config.PENALTY_LAYOUTS}
  for name in KERNEL_OPTIONS:
    flags.DEFINE_enum(name, "plan", ["plan", *forms[name]],
                      f"KernelConfig.{name} of the {calls} (plan: the plan's choice).")


def kernel_options():
  """{option: the form named, or None for "plan"} of `define_kernel_option_flags`' flags."""
  return {name: None if flags.FLAGS[name].value == "plan" else flags.FLAGS[name].value
          for name in KERNEL_OPTIONS}


def start_processes(program):
  """Joins the run of several processes that `define_process_flags`' flags (or the
  environment) describe, before anything uses JAX's devices; nothing for a run of one. A
  mistake exits with one line (`user_errors`). Returns whether this process writes the run's
  files and output (process 0)."""
  from vla_jax.training import distributed  # pylint: disable=import-outside-toplevel
  with user_errors(program):
    distributed.initialize(flags.FLAGS.coordinator_address, flags.FLAGS.num_processes,
                           flags.FLAGS.process_id)
  return distributed.is_primary()


def field_overrides(values, flag="override"):
  """[(FIELD, VALUE)] of the values of a repeated --override FIELD=VALUE flag; absl's
  UsageError naming the flag when one has no "=" (the program then prints it in one line)."""
  from absl import app  # pylint: disable=import-outside-toplevel
  if any("=" not in v for v in values):
    raise app.UsageError(f"--{flag} takes FIELD=VALUE; got {list(values)}")
  return [tuple(v.split("=", 1)) for v in values]


def quiet_libraries():
  """Keeps the libraries' INFO logs (absl, orbax, jax) off stderr: warnings still show."""
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  if not flags.FLAGS["verbosity"].present:   # --verbosity=0 brings them back
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
