"""The `Impl` enum: which form of a recurrence to run.

Every recurrence in `vla_jax.ops` takes the same arguments whatever the form and returns
`(outputs, final_state)`; `impl` only chooses how the same function is computed.
"""

import enum


class Impl(str, enum.Enum):
  """Implementations of a recurrence (recurrentgemma's `ScanType` pattern).

  SCAN: the step-by-step definition, `lax.scan` over tokens. O(T d^2) work, O(d^2) state.
  ASSOCIATIVE_SCAN: Blelloch prefix scan of affine maps (`lax.associative_scan`).
    O(T d^3) work, O(T d^2) memory: a parallel reference, not a fast path.
  CHUNKED: chunkwise matmul form, C x C triangular systems per chunk and one sequential
    pass over chunk states. O(T C d + T d^2) work.
  PALLAS: the fused GPU kernel (VLA only; see `vla_jax.kernels`).
  """

  SCAN = "scan"
  ASSOCIATIVE_SCAN = "associative_scan"
  CHUNKED = "chunked"
  PALLAS = "pallas"


def parse_impl(impl: str | Impl, allowed: tuple[Impl, ...] = tuple(Impl)) -> Impl:
  """Returns `impl` as an `Impl`, raising ValueError for unknown or unsupported names."""
  try:
    parsed = Impl(impl)
  except ValueError:
    names = ", ".join(repr(i.value) for i in allowed)
    raise ValueError(f"impl must be one of {names}; got {impl!r}") from None
  if parsed not in allowed:
    names = ", ".join(repr(i.value) for i in allowed)
    raise ValueError(f"impl={parsed.value!r} is not available here; choose one of {names}")
  return parsed
