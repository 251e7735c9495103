"""Variational Linear Attention: the recurrence and its penalty path. Math in README.md."""

from vla_jax.ops.vla.recurrence import VLAState, initial_vla_state, vla_recurrence

__all__ = ["VLAState", "initial_vla_state", "vla_recurrence"]
