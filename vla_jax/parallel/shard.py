"""`shard_sequence`: a public sequence op with its time axis split over a mesh axis."""

import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from vla_jax.parallel.segments import segment_op

SEQ_AXIS = "seq"


def _is_array(x):
  return isinstance(x, (jax.Array, np.ndarray))


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
  summaries, no extra work). Other array arguments (a traced lam0, say) are
  replicated; everything else goes to the op unchanged.

  Non-finite inputs stay causal as in the op: a NaN or Inf at token t leaves every earlier
  output, and the gradients of a loss on them, unchanged (README.md, "Non-finite inputs").

  Args:
    op: one of the four public sequence ops.
    axis: the mesh axis of the sequence (default "seq").
    mesh: a `jax.sharding.Mesh` or `AbstractMesh`; default the one set by `jax.set_mesh`
      when the function is called.

  Raises:
    TypeError for another op; ValueError when there is no mesh, the mesh has no axis `axis`,
    T is not divisible by its size, or `segment_ids` (packed documents) is given.
  """
  per_device = segment_op(op)

  @functools.wraps(op)
  def sharded(*args, **kwargs):
    if kwargs.pop("segment_ids", None) is not None:
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
    T = args[0].shape[1]
    if T % n:
      raise ValueError(f"the sequence length T={T} must be divisible by the {n} devices of "
                       f"mesh axis {axis!r}")
    # Positional arguments are token arrays [B, T, ...] or None (gated_deltanet's log_decay).
    tokens = [a is not None for a in args]
    token_args = [a for a in args if a is not None]
    state = kwargs.pop("initial_state", None)
    arrays = {k: v for k, v in kwargs.items() if _is_array(v)}
    static = {k: v for k, v in kwargs.items() if not _is_array(v)}

    def body(token_args, state, arrays):
      it = iter(token_args)
      full = [next(it) if t else None for t in tokens]
      if n == 1:   # one device holds the whole sequence: the op itself, no summaries
        return op(*full, initial_state=state, **arrays, **static)
      return per_device(*full, axis_name=axis, initial_state=state, **arrays, **static)

    in_specs = ([P(batch, axis)] * len(token_args), P(batch), {k: P() for k in arrays})
    # check_vma=False: the Pallas kernels' outputs carry no manual-axis types. Without them
    # the transposes follow shard_map's untyped rules (a replicated output's cotangent is
    # split over the devices that computed it), which the segment code is written for: no
    # pcast, plain all_gather and psum; the tests check every gradient.
    return jax.shard_map(body, mesh=m, in_specs=in_specs, check_vma=False,
                         out_specs=(P(batch, axis), P(batch)))(token_args, state, arrays)

  return sharded


def sequence_op(op):
  """`op`, sharded over the sequence when the mesh set by `jax.set_mesh` has an axis
  `SEQ_AXIS` ("seq") of more than one device, else `op` itself (what the layers call)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or SEQ_AXIS not in mesh.axis_names or mesh.shape[SEQ_AXIS] < 2:
    return op
  return shard_sequence(op, axis=SEQ_AXIS, mesh=mesh)
