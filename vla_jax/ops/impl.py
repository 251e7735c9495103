"""The `Impl` enum (which form of a recurrence to run) and `resolve_impl` (what "auto" runs).

Every recurrence in `vla_jax.ops` takes the same arguments whatever the form and returns
`(outputs, final_state)`; `impl` only chooses how the same function is computed. The ops take
a concrete form; the layers also take "auto" (their default), which `resolve_impl` turns into
one for each call: the Pallas kernel where it takes the call, the chunked form otherwise
(recurrentgemma's `ScanType.AUTO` pattern). What each kernel takes is one table,
`vla_jax.kernels.config.KERNEL_SUPPORT`.
"""

import enum
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from absl import logging


class Impl(str, enum.Enum):
  """Implementations of a recurrence (recurrentgemma's `ScanType` pattern).

  AUTO: for layers: PALLAS where the kernel takes the call on this backend, else CHUNKED
    (`resolve_impl`). The ops themselves take the concrete forms only.
  SCAN: the step-by-step definition, `lax.scan` over tokens. O(T d^2) work, O(d^2) state.
  ASSOCIATIVE_SCAN: Blelloch prefix scan of affine maps (`lax.associative_scan`).
    O(T d^3) work, O(T d^2) memory: a parallel reference, not a fast path.
  CHUNKED: chunkwise matmul form, C x C triangular systems per chunk and one sequential
    pass over chunk states. O(T C d + T d^2) work.
  PALLAS: the Pallas GPU kernels (VLA, DeltaNet, Gated DeltaNet, linear attention;
    `vla_jax.kernels`, whose `config.KERNEL_SUPPORT` says what each takes).
  PALLAS_INTERPRET: the same kernel in Pallas interpret mode, on any backend (slow: for
    tests of the kernel path on a CPU).
  """

  AUTO = "auto"
  SCAN = "scan"
  ASSOCIATIVE_SCAN = "associative_scan"
  CHUNKED = "chunked"
  PALLAS = "pallas"
  PALLAS_INTERPRET = "pallas_interpret"


# The forms the ops take (every member but AUTO) and those that run a Pallas kernel.
OP_IMPLS = tuple(i for i in Impl if i is not Impl.AUTO)
KERNEL_IMPLS = (Impl.PALLAS, Impl.PALLAS_INTERPRET)
GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def parse_impl(impl: str | Impl, allowed: tuple[Impl, ...] = OP_IMPLS) -> Impl:
  """Returns `impl` as an `Impl`, raising ValueError for unknown or unsupported names."""
  names = ", ".join(repr(i.value) for i in allowed)
  try:
    parsed = Impl(impl)
  except ValueError:
    raise ValueError(f"impl must be one of {names}; got {impl!r}") from None
  if parsed not in allowed:
    hint = (" ('auto' is resolved by the layers: `vla_jax.ops.impl.resolve_impl`)"
            if parsed is Impl.AUTO else "")
    raise ValueError(f"impl={parsed.value!r} is not available here; choose one of {names}"
                     f"{hint}")
  return parsed


def _kernel_support():
  """`vla_jax.kernels.config.KERNEL_SUPPORT` (the kernels import the ops: not at the top)."""
  from vla_jax.kernels.config import KERNEL_SUPPORT  # pylint: disable=import-outside-toplevel
  return KERNEL_SUPPORT


def _kernel_problem(op, dtype, head_dims, chunk_size, segment_ids, options):
  """None when the Pallas kernel of `op` takes the call, else why not (naming the option)."""
  support = _kernel_support().get(op)
  if support is None:
    return f"there is no Pallas kernel for {op!r} (kernels: {', '.join(_kernel_support())})"
  for arg, d in zip(("head_dim (keys)", "head_dim (values)"), head_dims):
    if d not in support.head_dims:
      return f"{arg}={d} is not one of the kernel's head dims {support.head_dims}"
  if chunk_size not in support.chunk_sizes:
    return f"chunk_size={chunk_size!r} is not one of the kernel's {support.chunk_sizes}"
  name = jnp.dtype(dtype).name
  if name not in support.dtypes:
    return f"dtype={name} is not one of the kernel's dtypes {support.dtypes}"
  if segment_ids and not support.segment_ids:
    return "the kernel does not take segment_ids (packed documents)"
  for option, values in support.unsupported:
    if option in options and options[option] in values:
      return f"the kernel does not take {option}={options[option]!r}"
  return None


def _platform_problem(platform, capability, min_capability):
  """None when the compiled kernel runs on (platform, capability), else why not; an unknown
  capability is a problem of its own (second value True)."""
  if platform not in GPU_PLATFORMS:
    return f"the backend is {platform!r}, and the kernel compiles for NVIDIA GPUs", False
  if capability is None:
    return "the GPU's compute capability is unknown", True
  if tuple(capability) < tuple(min_capability):
    return (f"the GPU's compute capability {'%d.%d' % tuple(capability)} is below the "
            f"kernel's {'%d.%d' % tuple(min_capability)}"), False
  return None, False


def resolve_impl(impl, *, op: str, platform: str | None, capability=None, dtype,
                 head_dims: tuple[int, int], chunk_size: int, segment_ids: bool = False,
                 options: Mapping | None = None) -> tuple[Impl, str]:
  """The form a layer's recurrence runs, and why: a pure function of the call.

  Args:
    impl: what the layer was given ("auto" or any `Impl`).
    op: the recurrence: "vla", "deltanet", "gated_deltanet" or "linear_attention".
    platform: the backend the call compiles for (`jax.default_backend()`: "gpu", "cpu",
      "tpu"), or None where not yet known (a configuration checked before training): then
      only the call's own facts are checked.
    capability: the GPU's compute capability (major, minor), None where unknown.
    dtype: the op's input dtype (the layer's activation dtype).
    head_dims: (key, value) head dims.
    chunk_size: tokens per chunk.
    segment_ids: whether the call packs documents.
    options: the layer's options the kernel may not take (VLA: {"readout": ...}).

  Returns:
    (the `Impl` to run, the reason). "auto" gives PALLAS where the op has a Pallas kernel
    (`vla_jax.kernels.config.KERNEL_SUPPORT`, one checked on a GPU) that takes these head
    dims, chunk size, dtype,
    packing and options, and the platform is an NVIDIA GPU of at least the kernel's compute
    capability (platform None: where the backend alone is left to decide); CHUNKED
    otherwise. Any other impl is returned as given.

  Raises:
    ValueError for an unknown impl, and for "pallas" or "pallas_interpret" where the kernel
    does not take the call ("pallas" also where the backend is not a GPU, or a GPU of a
    lower compute capability; "pallas_interpret" runs anywhere), naming the option.
  """
  impl = parse_impl(impl, tuple(Impl))
  if impl not in (Impl.AUTO,) + KERNEL_IMPLS:
    return impl, f"impl={impl.value!r} as requested"
  options = dict(options or {})
  problem = _kernel_problem(op, dtype, tuple(head_dims), chunk_size, bool(segment_ids),
                            options)
  on_device = problem is None and platform is not None and impl is not Impl.PALLAS_INTERPRET
  if on_device:
    problem, unknown = _platform_problem(platform, capability,
                                         _kernel_support()[op].min_capability)
    if unknown and impl is Impl.PALLAS:   # asked for: the kernel checks the device itself
      problem = None
  if impl is Impl.AUTO:
    if problem is None and not _kernel_support()[op].auto:
      problem = (f"the Pallas kernel for {op!r} is not yet checked on a GPU (impl='pallas' "
                 "runs it)")
    if problem is not None:
      return Impl.CHUNKED, f"impl='auto' runs 'chunked': {problem}"
    where = (f" on {platform} (compute capability {'%d.%d' % tuple(capability)})"
             if platform is not None else "")
    return Impl.PALLAS, f"impl='auto' runs 'pallas': the Pallas kernel takes this call{where}"
  if problem is not None:
    alternative = ("; impl='pallas_interpret' runs the kernel in interpret mode (slow)"
                   if on_device and platform not in GPU_PLATFORMS else "")
    raise ValueError(f"impl={impl.value!r} cannot run here: {problem}. Use impl='auto' (the "
                     f"kernel where it runs, else 'chunked') or 'chunked'{alternative}")
  return impl, f"impl={impl.value!r} as requested"


def current_target():
  """(platform, compute capability) of JAX's default backend and device, for
  `resolve_impl`; the capability is None off NVIDIA GPUs and where the device does not say."""
  platform = jax.default_backend()
  if platform not in GPU_PLATFORMS:
    return platform, None
  capability = getattr(jax.devices()[0], "compute_capability", None)
  try:
    major, minor = str(capability).split(".")
    return platform, (int(major), int(minor))
  except ValueError:
    return platform, None


_LOGGED = set()


def choose_impl(impl, *, name: str = "", **call) -> Impl:
  """`resolve_impl` for JAX's current backend (`current_target`): returns the `Impl` to run,
  logs (absl, INFO) what "auto" chose and why, once per distinct decision, and raises
  ValueError prefixed with `name` (the layer) where `resolve_impl` does."""
  platform, capability = current_target()
  try:
    chosen, reason = resolve_impl(impl, platform=platform, capability=capability, **call)
  except ValueError as e:
    raise ValueError(f"{name}: {e}" if name else str(e)) from None
  if Impl(impl) is Impl.AUTO:
    key = (name, call.get("op"), chosen, reason)
    if key not in _LOGGED:
      _LOGGED.add(key)
      logging.info("%s: %s", name or call.get("op"), reason)
  return chosen
