"""Several processes, one run: `jax.distributed` and what the training needs on top of it.

A run past one host starts one process per host (or per group of devices), each with the same
settings. `initialize` connects them through JAX's coordination service; from then on
`jax.devices()` lists every process's devices, the training mesh spans them all
(`sharding.make_mesh`), and every jitted step is one program that all processes run together.
The processes take the same path through the training code, so that each collective
operation meets its partners; only their side effects differ:

- data: each process draws the step's global batch, a pure function of (seed, step), and
  places on its own devices only the rows (and, with `train.seq_devices`, the positions) that
  those devices hold (`sharding.shard_batch`); gathered, the batch is the one-process batch;
- files: process 0 (`is_primary`) writes config.json, metrics.jsonl, the TensorBoard scalars,
  result rows and every checkpoint file outside orbax's own (`checkpoint`), and prints the
  progress lines; orbax writes the arrays of a checkpoint from every process;
- the workdir: process 0 holds its lock for the run (`hold_workdir`);
- SIGTERM: JAX's preemption service (`preemption.stop_request`) makes every process stop after
  the same step.

The workdir must be one folder that every process sees (a shared file system), as orbax's
checkpoints require.
"""

import contextlib
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from vla_jax.training import lock

COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"   # read by jax.distributed.initialize


def initialize(coordinator_address=None, num_processes=None, process_id=None):
  """Starts this process's part of a multi-process run; returns whether it did.

  Does nothing (returns False) when no argument is given and the environment does not name a
  coordinator (`JAX_COORDINATOR_ADDRESS`): a run of one process. Otherwise calls
  `jax.distributed.initialize`, where the values not given come from the environment JAX
  reads: `JAX_COORDINATOR_ADDRESS`, or a SLURM, Open MPI, Kubernetes or Cloud TPU job's
  variables. Call it before anything else uses JAX's devices.

  Args:
    coordinator_address: "host:port" of process 0, which serves the coordination service
      there (every process gives the same address).
    num_processes: the number of processes of the run (an int >= 1).
    process_id: this process's index, in [0, num_processes).

  Raises:
    ValueError: an argument of the wrong kind or range, a value that neither the arguments
      nor the environment give, or JAX's devices already in use (the message names which).
  """
  given = {"coordinator_address": coordinator_address, "num_processes": num_processes,
           "process_id": process_id}
  if all(v is None for v in given.values()) and not os.environ.get(COORDINATOR_ENV):
    return False
  if coordinator_address is not None:
    host, _, port = str(coordinator_address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ValueError(f"coordinator_address must be host:port (a port in [1, 65535]); got "
                       f"{coordinator_address!r}")
  for name, low in (("num_processes", 1), ("process_id", 0)):
    value = given[name]
    if value is not None and (not isinstance(value, (int, np.integer))
                              or isinstance(value, bool) or value < low):
      raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
  if num_processes is not None and process_id is not None and process_id >= num_processes:
    raise ValueError(f"process_id={process_id} must be below num_processes={num_processes}")
  if jax.distributed.is_initialized():
    raise ValueError("jax.distributed is already initialized in this process")
  try:
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
  except ValueError as e:   # a value that neither the arguments nor the environment give
    missing = " and ".join(name for name, value in given.items() if value is None)
    raise ValueError(f"cannot start a run of several processes: {missing or 'a value'} not "
                     f"given, and the environment gives none (JAX_COORDINATOR_ADDRESS, or a "
                     f"SLURM, Open MPI, Kubernetes or Cloud TPU job's variables); JAX says: "
                     f"{e}") from None
  except RuntimeError as e:   # the backend was started before this call
    raise ValueError(f"cannot start a run of several processes: {e}") from None
  return True


def is_primary():
  """Whether this is process 0, the one that writes the run's files (one process: True)."""
  return jax.process_index() == 0


def barrier(name):
  """Waits until every process has reached `barrier(name)`; nothing with one process. `name`
  must be the same on every process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def agree(value, what):
  """Checks that `value` (an int or an array) is the same on every process.

  Raises:
    ValueError: on every process, naming `what`, when some process holds another value.
  """
  if jax.process_count() > 1:
    values = np.asarray(multihost_utils.process_allgather(np.asarray(value)))
    if not (values == values[:1]).all():
      raise ValueError(f"the processes of the run disagree on {what}: {values.tolist()} (do "
                       f"they see the same workdir?)")


def from_primary(value):
  """Process 0's `value` (an int), on every process."""
  if jax.process_count() == 1:
    return int(value)
  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


@contextlib.contextmanager
def hold_workdir(workdir):
  """`lock.WorkdirLock(workdir)` for a run of one or several processes: process 0 holds it,
  and every process fails at once when it cannot.

  Raises:
    lock.WorkdirInUseError: on entry, when another run holds `workdir` (on process 0 naming
      that run's process, on the others naming process 0's error).
  """
  held, error = None, None
  if is_primary():
    try:
      held = lock.WorkdirLock(workdir).acquire()
    except (lock.WorkdirInUseError, OSError) as e:
      error = e
  if not from_primary(held is not None):
    if error is not None:
      raise error
    raise lock.WorkdirInUseError(
        f"workdir {os.path.abspath(workdir)} could not be held by process 0 of this run (its "
        f"error names the cause, such as another run using it)")
  try:
    yield
  finally:
    if held is not None:
      held.release()
