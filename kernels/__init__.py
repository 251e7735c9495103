"""Pallas (Triton) GPU kernels for VLA, installed as `vla_jax.kernels`.

`vla_pallas` is the VLA recurrence as a pipeline of kernels with its own backward;
`state_path` is the generalised delta-rule part alone; `deltanet_pallas`,
`gated_deltanet_pallas` and `linear_attention_pallas` run the baselines on it; `KernelConfig` holds the options a user
sets (chunk size, precision, value block). Importing this package needs no GPU: on other
backends the kernels run in Pallas interpret mode. Design: DESIGN.md; the variants measured
against it: VARIANTS.md.
"""

from vla_jax.kernels.config import KernelConfig
from vla_jax.kernels.delta_rule import (deltanet_pallas, gated_deltanet_pallas,
                                        linear_attention_pallas)
from vla_jax.kernels.state_path import state_path
from vla_jax.kernels.vla import default_interpret, vla_pallas

__all__ = ["KernelConfig", "default_interpret", "deltanet_pallas", "gated_deltanet_pallas",
           "linear_attention_pallas", "state_path", "vla_pallas"]
