"""Pallas GPU kernels for VLA (installed as `vla_jax.kernels`).

`vla_pallas` is the fused VLA op (penalty path in XLA, parallel over chunks; state path as a
Pallas kernel pair with a custom VJP); `state_path` is the generalised delta-rule kernel alone.
Importing this package needs no GPU: on other backends the kernels run in interpret mode.
Design and measurements: NOTES.md.
"""

from vla_jax.kernels.state_path import KernelConfig, state_path
from vla_jax.kernels.vla import default_interpret, vla_pallas

__all__ = ["KernelConfig", "default_interpret", "state_path", "vla_pallas"]
