"""Sequence mixers (Flax NNX): VLA and its baselines, one constructor style, and a registry."""

from vla_jax.layers.common import RecurrentCache
from vla_jax.layers.delta import DeltaNet, GatedDeltaNet
from vla_jax.layers.linear import LinearAttention
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
    "RecurrentCache",
    "KVCache",
]
