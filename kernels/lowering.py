"""Lowering for an abstract NVIDIA H200: builds the kernels' IR without a GPU.

Tests use it so that code which only runs in Pallas interpret mode cannot land, and
`lab.benchmarks.profile.kernel_resources` uses it to read the Triton IR for a resource
report.
"""

import contextlib
import warnings

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh


@contextlib.contextmanager
def abstract_h200():
  """Inside it, traces and lowerings target an abstract H200 (compute capability 9.0, the
  device `vla_pallas` plans for); only the Pallas Triton backend's deprecation warning is
  silenced."""
  device = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
  mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=device)
  with use_abstract_mesh(mesh), warnings.catch_warnings():
    warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)
    yield


def lower_for_h200(fn, *args):
  """`jax.jit(fn)` traced on `args` (arrays or ShapeDtypeStructs) and lowered for CUDA on an
  abstract H200. Returns the `Lowered` object (`.as_text()` is the StableHLO with the Triton
  calls)."""
  with abstract_h200():
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def equations(jaxpr, where="xla"):
  """Yields (where, eqn) for every equation of `jaxpr` (a Jaxpr or ClosedJaxpr) and of the
  jaxprs inside it: `where` is "xla" outside kernels and a kernel's name inside its
  pallas_call (the pallas_call equation itself is yielded with the enclosing `where`)."""
  from jax.extend import core as jcore  # pylint: disable=import-outside-toplevel
  if isinstance(jaxpr, jcore.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  for e in jaxpr.eqns:
    yield where, e
    if e.primitive.name == "pallas_call":
      name = e.params.get("name") or e.params["name_and_src_info"].name
      yield from equations(e.params["jaxpr"], str(name))
      continue
    for v in e.params.values():
      for x in v if isinstance(v, (list, tuple)) else [v]:
        if isinstance(x, (jcore.ClosedJaxpr, jcore.Jaxpr)):
          yield from equations(x, where)
