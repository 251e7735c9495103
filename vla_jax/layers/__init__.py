"""Sequence mixers (Flax NNX): VLA and its baselines, one constructor style, and a registry.

Every mixer maps x [B, T, d_model] -> [B, T, d_model], causally; `__call__(x, attention_mask=)`
and `prefill(x, cache, attention_mask=)` take an optional [B, T] bool padding mask (True = a
real token) under which padded positions are deleted (see `vla_jax.layers.common`).
"""

from vla_jax.layers.common import RecurrentCache
from vla_jax.layers.delta import DeltaNet, GatedDeltaNet
from vla_jax.layers.linear import LinearAttention
from vla_jax.layers.recurrent import RecurrentMixer
from vla_jax.layers.registry import MIXERS, make_mixer, mixer_options
from vla_jax.layers.softmax import KVCache, SoftmaxAttention
from vla_jax.layers.vla import VLAAttention

__all__ = [
    "VLAAttention",
    "SoftmaxAttention",
    "LinearAttention",
    "DeltaNet",
    "GatedDeltaNet",
    "MIXERS",
    "make_mixer",
    "mixer_options",
    "RecurrentMixer",
    "RecurrentCache",
    "KVCache",
]
