"""Models built from the mixers in `vla_jax.layers`."""

from vla_jax.models.lm import LanguageModel, ModelCache, ModelConfig, generate

__all__ = ["LanguageModel", "ModelCache", "ModelConfig", "generate"]
