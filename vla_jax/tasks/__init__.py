"""Tasks (pure NumPy, seeded, deterministic): MQAR, Copy, external `.npz` data and byte-level
text."""

from vla_jax.tasks.common import IGNORE, rng_for, token_metrics
from vla_jax.tasks.copy import CopyConfig
from vla_jax.tasks.mqar import MQARConfig
from vla_jax.tasks.npz import load_npz, save_npz
from vla_jax.tasks.registry import make_task

__all__ = ["IGNORE", "rng_for", "token_metrics", "MQARConfig", "CopyConfig", "load_npz",
           "save_npz", "make_task"]
