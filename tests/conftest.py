"""Shared fixtures: float64 mode, seeded random inputs and modules, compile options for one-off
test programs; one XLA compilation cache per run."""

import os
import shutil
import tempfile

import jax
import numpy as np
import pytest
from flax import nnx

_CACHE_ENV = "VLA_JAX_TEST_COMPILATION_CACHE"
_cache_key = pytest.StashKey[str]()

# `compiler_options` for a test's jitted programs that run once on tiny shapes: without the
# backend's (LLVM's) optimisation passes XLA compiles them about 1.7x faster on a CPU. The
# HLO is the same and LLVM does not reassociate float arithmetic (no fast-math): results do
# not change.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


def random_module(make, seed=0, scale=0.5):
  """The nnx module that `make()` builds with every variable drawn from N(0, scale^2) by NumPy:
  no initialiser is compiled (eager initialisers cost a compilation per operation and shape,
  seconds for a small model), and biases are non-zero. For tests whose checks hold for any
  parameter values (such as packed vs separate)."""
  graphdef, state = nnx.split(nnx.eval_shape(make))
  rng = np.random.default_rng(seed)
  return nnx.merge(graphdef, jax.tree.map(
      lambda v: jax.numpy.asarray(scale * rng.standard_normal(v.shape), v.dtype), state))


def pytest_configure(config):
  """Points JAX's persistent compilation cache at a folder made for this test run and shared by
  its xdist workers (they inherit the variable), so a computation that several tests (or
  several Trainer instances, or eager `lax.scan` calls) compile is compiled once. A cache hit
  returns the executable XLA built for the same program; results are unchanged."""
  folder = os.environ.get(_CACHE_ENV)
  if folder is None:
    folder = tempfile.mkdtemp(prefix="vla-jax-xla-cache-")
    os.environ[_CACHE_ENV] = folder
    config.stash[_cache_key] = folder
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_unconfigure(config):
  folder = config.stash.get(_cache_key, None)
  if folder is not None:
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(_CACHE_ENV, None)


@pytest.fixture
def x64():
  """Runs the test with float64 enabled (float64 inputs then give a float64 state)."""
  with jax.enable_x64(True):
    yield


def random_inputs(seed, B, T, H, dk, dv, dtype=np.float64):
  """Fresh standard-normal q, k, v, u (u scaled by 1/sqrt(dk)) for one test."""
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((B, T, H, dk)) for _ in range(2))
  v = rng.standard_normal((B, T, H, dv))
  u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
  return tuple(x.astype(dtype) for x in (q, k, v, u))


def rel_err(actual, expected):
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))
