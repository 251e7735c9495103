"""Models built from the mixers in `vla_jax.layers`."""

from vla_jax.models.lm import LanguageModel, ModelConfig

__all__ = ["LanguageModel", "ModelConfig"]
