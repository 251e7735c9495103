"""Data and sequence parallelism with `jax.sharding`: a 2-D mesh ("data", "seq") over the
devices of every process of the run (`distributed`). The batch is split along "data"; each
sequence along "seq" (the recurrent mixers then run their ops sequence-sharded,
`vla_jax.parallel`; everything else is left to XLA); parameters and optimizer state are
replicated.

Host arrays reach the mesh through `put`: every process passes the same global array and
transfers only the slices its own devices hold, so one process or several build the same
global array."""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vla_jax.parallel import SEQ_AXIS

DATA_AXIS = "data"


def make_mesh(devices=None, seq_devices=1) -> Mesh:
  """A (data, seq) mesh over `devices` (default: all of `jax.devices()`, every process's) with
  `seq_devices` devices along the sequence (consecutive devices share a sequence)."""
  devices = np.asarray(jax.devices() if devices is None else devices)
  if seq_devices < 1 or devices.size % seq_devices:
    raise ValueError(f"seq_devices={seq_devices} must be >= 1 and divide the {devices.size} "
                     "devices")
  return Mesh(devices.reshape(-1, seq_devices), (DATA_AXIS, SEQ_AXIS))


def replicated(mesh):
  return NamedSharding(mesh, P())


def token_sharding(mesh):
  """Token arrays [N, T]: N over "data", T over "seq"."""
  return NamedSharding(mesh, P(DATA_AXIS, SEQ_AXIS))


def put(sharding, array):
  """The global array `array` (a host array, the same on every process) on `sharding`: each
  process transfers only the slices of its own devices."""
  array = np.asarray(array)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def shard_batch(mesh, *arrays):
  """Places host token arrays [N, T] (the same on every process) on the mesh, N split over
  "data" and T over "seq"."""
  seq = mesh.shape[SEQ_AXIS]
  for a in arrays:
    if a.shape[1] % seq:
      raise ValueError(f"sequences of length {a.shape[1]} do not split over the {seq} devices "
                       f"of the mesh's {SEQ_AXIS!r} axis (train.seq_devices)")
  sharding = token_sharding(mesh)
  return tuple(put(sharding, a) for a in arrays)


def replicate(mesh, tree):
  """`tree`'s arrays replicated on every device of the mesh (from their host values, which
  must be the same on every process)."""
  sharding = replicated(mesh)
  return jax.tree.map(lambda a: put(sharding, jax.device_get(a)), tree)
