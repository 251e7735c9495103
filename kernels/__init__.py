"""Pallas GPU kernels for VLA (installed as `vla_jax.kernels`)."""
