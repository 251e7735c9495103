"""`shard_sequence`: a public sequence op with its time axis split over a mesh axis."""

import functools
import inspect

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from vla_jax.ops import checks
from vla_jax.parallel.segments import segment_op

SEQ_AXIS = "seq"
# The ops' token arrays [B, T, ...] (the same names in all four), split over the sequence
# however they are passed, by position or by keyword.
TOKEN_ARGS = ("q", "k", "v", "u", "beta", "log_decay")


def _is_array(x):
  return isinstance(x, (jax.Array, np.ndarray))


def _check_values(signature, arguments):
  """The op's checks of argument values, which it skips for a traced value (inside
  `shard_map` every array is one): a concrete log decay <= 0 and, where the op starts from
  I / lam0, a concrete array lam0 > 0 and large enough for the compute dtype."""
  checks.check_log_decay(arguments.get("log_decay"))
  if "lam0" in signature.parameters and arguments.get("initial_state") is None:
    default = lambda name: signature.parameters[name].default
    tokens = [arguments.get(name) for name in TOKEN_ARGS]
    checks.check_lam0(arguments.get("lam0", default("lam0")),
                      arguments.get("impl", default("impl")), checks.compute_dtype(*tokens))


def _mesh(mesh):
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  if mesh is None or mesh.empty:
    raise ValueError("shard_sequence needs a mesh: pass mesh= or set one with jax.set_mesh")
  return mesh


def shard_sequence(op, *, axis=SEQ_AXIS, mesh=None):
  """`op` (`vla_recurrence`, `deltanet`, `gated_deltanet` or `linear_attention`) with its
  sequence split over the mesh axis `axis`: device i of the axis holds tokens
  [i T / n, (i + 1) T / n) and the devices exchange only their segments' summaries (the
  algorithm: `vla_jax.parallel.segments`).

  The returned function takes the op's arguments and returns what the op returns, equal to it
  up to float rounding, gradients included: token arrays [B, T, ...] are split along T over
  `axis` and along B over the mesh's other axes (so B must be divisible by their sizes'
  product, and T by the size of `axis`); the initial and final states are split along B only
  (the same on every device of `axis`). On an axis of one device the op runs as it is (no
  summaries, no extra work). Token arrays are q, k, v, u, beta and log_decay, by position or
  by keyword; other array arguments (a traced lam0, say) are replicated; everything else goes
  to the op unchanged. The op's checks of values (lam0, log_decay) run before the split, as
  they would on the op called eagerly; no tokens (T = 0) run the op itself.

  Non-finite inputs stay causal as in the op: a NaN or Inf at token t leaves every earlier
  output, and the gradients of a loss on them, unchanged (README.md, "Non-finite inputs").

  Args:
    op: one of the four public sequence ops.
    axis: the mesh axis of the sequence (default "seq").
    mesh: a `jax.sharding.Mesh` or `AbstractMesh`; default the one set by `jax.set_mesh`
      when the function is called.

  Raises:
    TypeError for another op or arguments it does not take; ValueError when there is no
    mesh, the mesh has no axis `axis`, T is not divisible by its size, a token array's B, T
    differ from q's, `segment_ids` (packed documents) is given, or the op would raise for a
    value (a positive log decay, a lam0 too small).
  """
  per_device = segment_op(op)
  signature = inspect.signature(op)

  @functools.wraps(op)
  def sharded(*args, **kwargs):
    try:   # by name whether passed by position or by keyword, as the op takes them
      arguments = dict(signature.bind(*args, **kwargs).arguments)
    except TypeError as e:
      raise TypeError(f"{op.__name__}: {e}") from None
    if arguments.pop("segment_ids", None) is not None:
      raise ValueError("segment_ids (packed documents) are not supported with the sequence "
                       "sharded over devices (context parallelism); run the op unsharded "
                       "with impl='chunked', or do not pack")
    m = _mesh(mesh)
    if axis not in m.axis_names:
      raise ValueError(f"the mesh has no axis {axis!r} for the sequence; its axes are "
                       f"{m.axis_names}")
    n = m.shape[axis]
    rest = tuple(a for a in m.axis_names if a != axis)
    batch = (rest if len(rest) > 1 else rest[0]) if rest else None
    shape = getattr(arguments["q"], "shape", ())
    if len(shape) < 2 or shape[1] == 0:   # the op's errors, or no tokens to split
      return op(**arguments)
    T = shape[1]
    if T % n:
      raise ValueError(f"the sequence length T={T} must be divisible by the {n} devices of "
                       f"mesh axis {axis!r}")
    _check_values(signature, arguments)
    state = arguments.pop("initial_state", None)
    tokens = {k: a for k, a in arguments.items() if k in TOKEN_ARGS and a is not None}
    for k, a in tokens.items():   # split alike, or the devices' segments would not match
      if tuple(getattr(a, "shape", ())[:2]) != tuple(shape[:2]):
        raise ValueError(f"{k} must have B, T = {tuple(shape[:2])} like q (its leading axes); "
                         f"got shape {tuple(getattr(a, 'shape', ()))}")
    others = {k: a for k, a in arguments.items() if k not in tokens}
    arrays = {k: a for k, a in others.items() if _is_array(a)}
    static = {k: a for k, a in others.items() if not _is_array(a)}

    def body(tokens, state, arrays):
      if n == 1:   # one device holds the whole sequence: the op itself, no summaries
        return op(**tokens, initial_state=state, **arrays, **static)
      return per_device(**tokens, axis_name=axis, initial_state=state, **arrays, **static)

    in_specs = ({k: P(batch, axis) for k in tokens}, P(batch), {k: P() for k in arrays})
    # check_vma=False: the Pallas kernels' outputs carry no manual-axis types. Without them
    # the transposes follow shard_map's untyped rules (a replicated output's cotangent is
    # split over the devices that computed it), which the segment code is written for: no
    # pcast, plain all_gather and psum; the tests check every gradient.
    return jax.shard_map(body, mesh=m, in_specs=in_specs, check_vma=False,
                         out_specs=(P(batch, axis), P(batch)))(tokens, state, arrays)

  return sharded


def sequence_op(op):
  """`op`, sharded over the sequence when the mesh set by `jax.set_mesh` has an axis
  `SEQ_AXIS` ("seq") of more than one device, else `op` itself (what the layers call)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or SEQ_AXIS not in mesh.axis_names or mesh.shape[SEQ_AXIS] < 2:
    return op
  return shard_sequence(op, axis=SEQ_AXIS, mesh=mesh)
