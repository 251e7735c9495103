"""Data parallelism over every visible device with `jax.sharding`: one mesh axis "data"; the
batch is split along it and parameters and optimizer state are replicated."""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DATA_AXIS = "data"


def make_mesh(devices=None) -> Mesh:
  """A 1-D mesh over `devices` (default: all of `jax.devices()`)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh):
  return NamedSharding(mesh, P())


def batch_sharding(mesh):
  return NamedSharding(mesh, P(DATA_AXIS))


def shard_batch(mesh, *arrays):
  """Places host arrays [N, ...] on the mesh, split along N."""
  sharding = batch_sharding(mesh)
  return tuple(jax.device_put(a, sharding) for a in arrays)


def replicate(mesh, tree):
  return jax.device_put(tree, replicated(mesh))
