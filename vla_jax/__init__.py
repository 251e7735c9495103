"""vla-jax: Variational Linear Attention for JAX."""

import importlib.metadata

from vla_jax.layers import (DeltaNet, GatedDeltaNet, LinearAttention, SoftmaxAttention,
                            VLAAttention, make_mixer)
from vla_jax.models import LanguageModel, ModelConfig
from vla_jax.ops.baselines import (LinearAttentionState, deltanet, elu_plus_one,
                                   gated_deltanet, linear_attention)
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import (deltanet_step, gated_deltanet_step, linear_attention_step,
                              vla_step)
from vla_jax.ops.vla import VLAState, initial_vla_state, vla_recurrence

__all__ = [
    # Layers (Flax NNX mixers, x [B, T, d_model] -> [B, T, d_model]) and the model.
    "VLAAttention",
    "SoftmaxAttention",
    "LinearAttention",
    "DeltaNet",
    "GatedDeltaNet",
    "make_mixer",
    "LanguageModel",
    "ModelConfig",
    # Ops ([B, T, H, D] arrays -> outputs and states).
    "Impl",
    "VLAState",
    "initial_vla_state",
    "vla_recurrence",
    "LinearAttentionState",
    "linear_attention",
    "deltanet",
    "gated_deltanet",
    "elu_plus_one",
    "vla_step",
    "linear_attention_step",
    "deltanet_step",
    "gated_deltanet_step",
]
try:
  __version__ = importlib.metadata.version("vla-jax")   # pyproject.toml's, the one source
except importlib.metadata.PackageNotFoundError:   # a source tree that was never installed
  __version__ = "0+unknown"
