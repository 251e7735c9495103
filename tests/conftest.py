"""Shared fixtures: float64 mode and seeded random inputs."""

import jax
import numpy as np
import pytest


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
