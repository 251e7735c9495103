"""Validation of user input at the public entry points of the recurrences.

Errors name the argument and what was expected; nothing here runs under `jit` tracing
except static shape and dtype logic.
"""

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax.ops.utils import document_starts

MIN_CHUNK, MAX_CHUNK = 16, 256


def check_tokens(name, x, *, rank=4, batch=None, time=None, heads=None, dim=None):
  """Checks a [B, T, H, D] (rank 4) or [B, T, H] (rank 3) float array and returns its shape."""
  shape = getattr(x, "shape", None)
  dtype = getattr(x, "dtype", None)
  layout = "[B, T, H, D]" if rank == 4 else "[B, T, H]"
  if shape is None or dtype is None:
    raise TypeError(f"{name} must be an array of shape {layout}; got {type(x).__name__}")
  if len(shape) != rank:
    raise ValueError(f"{name} must have rank {rank} {layout}; got shape {tuple(shape)}")
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{name} must have a floating dtype (float32, bfloat16, float16 or "
                    f"float64); got {dtype}")
  for axis, (label, want) in enumerate(
      (("B", batch), ("T", time), ("H", heads), ("D", dim))[:rank]):
    if want is not None and shape[axis] != want:
      raise ValueError(f"{name} has {label}={shape[axis]} (shape {tuple(shape)}); expected "
                       f"{label}={want} to match the other inputs")
  if rank == 4 and shape[3] == 0:
    raise ValueError(f"{name} must have a non-empty last axis; got shape {tuple(shape)}")
  return tuple(shape)


def check_state(name, x, expected_shape):
  """Checks one array of a state against its expected shape and the state dtypes (float32 or
  float64, the same rule for the sequence ops and the steps: a bfloat16 state would have
  lost the precision the recurrences keep)."""
  shape = getattr(x, "shape", None)
  if shape is None or not hasattr(x, "dtype"):
    raise TypeError(f"{name} must be an array of shape {tuple(expected_shape)} (float32 or "
                    f"float64); got {type(x).__name__}")
  if tuple(shape) != tuple(expected_shape):
    raise ValueError(f"{name} must have shape {tuple(expected_shape)}; got {tuple(shape)}")
  check_state_dtype(name, x.dtype)


def is_int(value):
  """Whether `value` is a Python or NumPy integer (not a bool)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_size(name, value):
  """`value` as an int if it is a Python or NumPy int >= 0 (a size: batch, heads, widths),
  else ValueError naming the argument."""
  if not is_int(value) or value < 0:
    raise ValueError(f"{name} must be an int >= 0; got {type(value).__name__} {value!r}")
  return int(value)


def nonnegative(value):
  """`value` as a float if it is a finite real number >= 0 (a Python, NumPy or JAX scalar; not
  a str or bool), else None (callers raise their own error, naming what else they take)."""
  if (isinstance(value, (str, bytes, bool, np.bool_)) or getattr(value, "shape", ()) != ()
      or getattr(value, "dtype", None) == bool):
    return None
  try:
    concrete = float(value)
  except (TypeError, ValueError):
    return None
  return concrete if math.isfinite(concrete) and concrete >= 0 else None


def check_bool(name, value):
  """`value` as a bool if it is a Python or NumPy bool, else ValueError naming the argument
  (a str such as "no" is not read for its truth)."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be True or False; got {type(value).__name__} {value!r}")
  return bool(value)


def check_chunk_size(chunk_size):
  if (not is_int(chunk_size) or chunk_size < MIN_CHUNK or chunk_size > MAX_CHUNK
      or chunk_size & (chunk_size - 1)):
    raise ValueError(f"chunk_size must be a power of two in [{MIN_CHUNK}, {MAX_CHUNK}]; "
                     f"got {chunk_size!r}")
  return int(chunk_size)


def check_positive(name, value):
  """Checks a scalar hyperparameter > 0 when its value is known (not traced): a real number
  (a Python int or float, or a NumPy / JAX scalar; not a str or bool)."""
  if isinstance(value, jax.core.Tracer):
    return
  if (isinstance(value, (str, bytes, bool)) or getattr(value, "shape", ()) != ()
      or getattr(value, "dtype", None) == bool):
    raise ValueError(f"{name} must be a real number (int or float) > 0; got "
                     f"{type(value).__name__} {value!r}")
  try:
    concrete = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a real number (int or float) > 0; got "
                     f"{type(value).__name__} {value!r}") from None
  if not math.isfinite(concrete) or concrete <= 0:
    raise ValueError(f"{name} must be a finite number > 0; got {value!r}")


# The smallest lam0 each VLA impl takes when it computes in float32. The relative error of o
# against float64 grows like eps ||u||^2 / lam0 (vla_jax/ops/vla/README.md); below these the
# chunked and associative-scan penalty paths lose every digit, then return NaN
# (tests/ops/test_vla_recurrence.py measures each impl at its minimum and below it).
MIN_LAM0_FLOAT32 = {"scan": 1e-4, "associative_scan": 1e-4, "chunked": 1e-3, "pallas": 1e-4,
                    "pallas_interpret": 1e-4}
# The layers' impl "auto" runs "pallas" or "chunked", whichever the backend and call allow.
MIN_LAM0_FLOAT32["auto"] = max(MIN_LAM0_FLOAT32["pallas"], MIN_LAM0_FLOAT32["chunked"])


def check_log_decay(log_decay, name="log_decay", axes="b, t, h"):
  """A concrete log decay ([B, T, H]; a step's [B, H], axes "b, h") must be <= 0 where finite
  (gamma = exp(g) <= 1; a positive g grows the state without bound); NaN and +inf follow the
  ops' non-finite rule. A traced one (under jit) is not checked."""
  if log_decay is None or isinstance(log_decay, jax.core.Tracer):
    return
  g = np.asarray(log_decay)
  positive = np.isfinite(g) & (g > 0)
  if positive.any():
    where = tuple(int(i) for i in np.argwhere(positive)[0])
    raise ValueError(f"{name} must be <= 0 (a decay gamma = exp({name}) <= 1); got "
                     f"{float(g[where]):g} at [{axes}] = {where}")


def check_lam0(lam0, impl, dtype):
  """lam0 a finite number > 0 and, when `dtype` (the compute dtype) is not float64, at least
  `MIN_LAM0_FLOAT32[impl]`; checked when lam0 is concrete (a traced lam0 is not)."""
  check_positive("lam0", lam0)
  if isinstance(lam0, jax.core.Tracer) or jnp.dtype(dtype) == jnp.float64:
    return
  impl = getattr(impl, "value", impl)
  low = MIN_LAM0_FLOAT32.get(impl)        # an unknown impl is reported where it is parsed
  if low is not None and float(lam0) < low:
    raise ValueError(f"lam0={float(lam0):g} is below {low:g}, the smallest impl={impl!r} takes "
                     f"in float32 (its error grows like eps ||u||^2 / lam0: no correct digits "
                     f"or NaN below); use lam0 >= {low:g} or float64 inputs (x64)")


def compute_dtype(*arrays):
  """float64 if any input (an initial state's arrays among them) is float64 and x64 mode is
  on, else float32: the state's dtype (NumPy float64 inputs without x64 compute in float32, as
  JAX would store them). None and non-arrays count for nothing (their checks name them)."""
  if any(getattr(a, "dtype", None) == jnp.float64 for a in arrays):
    return jax.dtypes.canonicalize_dtype(jnp.float64)
  return jnp.float32


def output_dtype(v):
  """The dtype of an op's output o: v's, as JAX stores it (NumPy float64 without x64 mode is
  float32)."""
  return jax.dtypes.canonicalize_dtype(v.dtype)


def check_step_tokens(name, x, *, batch=None, heads=None, dim=None, rank=3):
  """Checks one token's [B, H, D] (rank 3) or [B, H] (rank 2) float array for a step function."""
  shape = getattr(x, "shape", None)
  layout = "[B, H, D]" if rank == 3 else "[B, H]"
  if shape is None or not hasattr(x, "dtype"):
    raise TypeError(f"{name} must be an array of shape {layout}; got {type(x).__name__}")
  if len(shape) != rank:
    hint = (" (one token; a step takes no time axis, use the sequence op for [B, T, ...])"
            if len(shape) == rank + 1 else "")
    raise ValueError(f"{name} must have rank {rank} {layout}{hint}; got shape {tuple(shape)}")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must have a floating dtype; got {x.dtype}")
  for axis, (label, want) in enumerate((("B", batch), ("H", heads), ("D", dim))[:rank]):
    if want is not None and shape[axis] != want:
      raise ValueError(f"{name} has {label}={shape[axis]} (shape {tuple(shape)}); expected "
                       f"{label}={want} to match the other inputs and the state")
  return tuple(shape)


def check_state_dtype(name, dtype):
  """A recurrent state is kept in float32 or float64: `dtype` (a state array's, or the one
  asked for) must be one of them."""
  if jnp.dtype(dtype) not in (jnp.float32, jnp.float64):
    raise TypeError(f"{name} must be float32 or float64 (the state's dtype); got "
                    f"{jnp.dtype(dtype)}")


def check_segment_ids(segment_ids, batch, time):
  """None, or `segment_ids` as an int32 [B, T] array: tokens with equal ids belong to one
  document, documents are contiguous and a document starts where the id changes. Ids wider
  than int32 (int64, uint32, uint64), whose values a cast could wrap onto a neighbour's, are
  renumbered instead (a row's documents counted from 0, `document_starts` compared in their
  own dtype: a NumPy array's by NumPy, before float64-off JAX could wrap them). Raises naming
  the argument for a wrong shape or a non-integer dtype."""
  if segment_ids is None:
    return None
  shape = getattr(segment_ids, "shape", None)
  dtype = getattr(segment_ids, "dtype", None)
  if shape is None or dtype is None:
    raise TypeError(f"segment_ids must be an int array of shape [B, T] = ({batch}, {time}); "
                    f"got {type(segment_ids).__name__}")
  if tuple(shape) != (batch, time):
    raise ValueError(f"segment_ids must have shape [B, T] = ({batch}, {time}) like the "
                     f"inputs; got {tuple(shape)}")
  if not jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
    raise TypeError(f"segment_ids must have an integer dtype (document ids); got {dtype}")
  if jnp.iinfo(dtype).bits < 32 or dtype == jnp.int32:
    return jnp.asarray(segment_ids).astype(jnp.int32)
  return jnp.cumsum(document_starts(segment_ids), axis=1, dtype=jnp.int32)
