"""Pallas GPU kernels for VLA (installed as `vla_jax.kernels`).

`vla_pallas` is the fused VLA op (by default the penalty path carried through 16-token
Sherman-Morrison blocks by `penalty_scan.py`, the state path as Pallas kernels, both with
written-out backward passes; `KernelConfig` selects the alternatives); `state_path` is the
generalised delta-rule kernel alone.
Importing this package needs no GPU: on other backends the kernels run in interpret mode.
Design and measurements: NOTES.md.
"""

from vla_jax.kernels.state_path import KernelConfig, state_path
from vla_jax.kernels.vla import default_interpret, vla_pallas

__all__ = ["KernelConfig", "default_interpret", "state_path", "vla_pallas"]
