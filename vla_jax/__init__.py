"""vla-jax: Variational Linear Attention for JAX."""

import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys


class _SourceKernelsFinder(_abc.MetaPathFinder):
  """Maps `vla_jax.kernels` onto the checkout's top-level `kernels/` folder.

  An installed copy has `vla_jax/kernels` (setup.cfg's package_dir). Scripts run from a source
  checkout put the checkout first on sys.path (experiments/*.py do), which finds this `vla_jax`
  folder, whose kernels live beside it; without this finder `impl="pallas"` would fail there.
  """

  def __init__(self, folder):
    self.folder = folder

  def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
    if name != "vla_jax.kernels":
      return None
    return _util.spec_from_file_location(name, _os.path.join(self.folder, "__init__.py"),
                                         submodule_search_locations=[self.folder])


_HERE = _os.path.dirname(_os.path.abspath(__file__))
_SOURCE_KERNELS = _os.path.join(_os.path.dirname(_HERE), "kernels")
if (not _os.path.isdir(_os.path.join(_HERE, "kernels"))
    and _os.path.isfile(_os.path.join(_SOURCE_KERNELS, "__init__.py"))
    and not any(isinstance(f, _SourceKernelsFinder) for f in _sys.meta_path)):
  _sys.meta_path.append(_SourceKernelsFinder(_SOURCE_KERNELS))

from vla_jax.ops.baselines import (LinearAttentionState, deltanet, elu_plus_one,
                                   gated_deltanet, linear_attention)
from vla_jax.ops.impl import Impl
from vla_jax.ops.step import (deltanet_step, gated_deltanet_step, linear_attention_step,
                              vla_step)
from vla_jax.ops.vla import VLAState, initial_vla_state, vla_recurrence

__all__ = [
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
__version__ = "0.1.0"
