"""Lowering for an abstract NVIDIA H200: builds the Triton kernels' IR without a GPU.

Tests use it so that code which only runs in Pallas interpret mode cannot land, and
`experiments/kernel_resources.py` uses it to read the kernels' Triton IR for a resource report.
"""

import warnings

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh


def lower_for_h200(fn, *args):
  """`jax.jit(fn)` traced on `args` (arrays or ShapeDtypeStructs) and lowered for CUDA on an
  abstract H200. Returns the `Lowered` object (`.as_text()` is the StableHLO with the Triton
  calls). Only the Pallas Triton backend's deprecation warning is silenced."""
  device = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=device)
  with use_abstract_mesh(mesh), warnings.catch_warnings():
    warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
