"""`make_mixer`: builds any mixer by name with one constructor style."""

import inspect
from collections.abc import Mapping

import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax.layers.delta import DeltaNet, GatedDeltaNet
from vla_jax.layers.linear import LinearAttention
from vla_jax.layers.softmax import SoftmaxAttention
from vla_jax.layers.vla import VLAAttention
from vla_jax.ops.impl import Impl, parse_impl, resolve_impl

MIXERS = {
    "vla": VLAAttention,
    "softmax": SoftmaxAttention,
    "linear": LinearAttention,
    "deltanet": DeltaNet,
    "gated_deltanet": GatedDeltaNet,
}
_COMMON = ("self", "d_model", "num_heads", "head_dim", "impl", "chunk_size", "dtype",
           "param_dtype", "rngs")


def mixer_options(name: str) -> dict:
  """The mixer-specific keyword options of mixer `name` and their defaults."""
  cls = mixer_class(name)
  params = inspect.signature(cls.__init__).parameters
  return {k: p.default for k, p in params.items() if k not in _COMMON}


def mixer_class(name):
  if name not in MIXERS:
    raise ValueError(f"unknown mixer {name!r}; choose one of {', '.join(map(repr, MIXERS))}")
  return MIXERS[name]


def check_mixer_options(name, options):
  """Raises ValueError for option names that mixer `name` does not take."""
  allowed = mixer_options(name)
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise ValueError(f"mixer {name!r} does not take option(s) {', '.join(unknown)}; its "
                     f"options are {', '.join(sorted(allowed)) or '(none)'}")


def check_mixer_impl(name: str, impl: str | Impl, *, head_dim: int, chunk_size: int,
                     dtype: DTypeLike, options: Mapping | None = None, packed: bool = False,
                     platform: str | None = None, capability=None) -> Impl:
  """Checks `impl` for mixer `name` before any layer is built (a configuration): returns what
  `resolve_impl` resolves it to (the mixer's own impl for softmax attention, which has no
  recurrence: `impl` as parsed). `packed`: the calls pass `segment_ids`. `platform` None
  checks the call's own facts only (head dims, chunk size, dtype, options, packing); with a
  platform and capability, the backend too. Raises ValueError where the mixer would reject
  the settings (an explicit "pallas" the kernel does not take, naming the option)."""
  cls = mixer_class(name)
  impl = parse_impl(impl, tuple(Impl))
  if not cls.RECURRENT:
    return impl
  return resolve_impl(impl, platform=platform, capability=capability, chunk_size=chunk_size,
                      segment_ids=packed,
                      **cls.kernel_facts(head_dim, dtype, dict(options or {})))[0]


def make_mixer(name: str, d_model: int, num_heads: int, head_dim: int | None = None, *,
               impl: str | Impl = "auto", chunk_size: int = 64,
               options: Mapping | None = None, dtype: DTypeLike = jnp.float32,
               param_dtype: DTypeLike = jnp.float32, rngs: nnx.Rngs) -> nnx.Module:
  """Builds mixer `name` ("vla", "softmax", "linear", "deltanet", "gated_deltanet").

  `impl` and `chunk_size` go to the recurrent mixers ("auto", the default, runs the Pallas
  kernel where it takes the call, else "chunked": `vla_jax.ops.impl.resolve_impl`); softmax
  attention has no recurrence and ignores them (its kernel choice is its `implementation`
  option). `options` holds the mixer's own keyword options (see `mixer_options(name)`);
  unknown names raise.
  """
  cls = mixer_class(name)
  options = dict(options or {})
  check_mixer_options(name, options)
  if cls.RECURRENT:
    options.update(impl=impl, chunk_size=chunk_size)
  return cls(d_model, num_heads, head_dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
             **options)
