"""The recurrences over a sequence split into contiguous segments, one per device of a named
axis, called inside `jax.shard_map(..., check_vma=False)` (what `shard.shard_sequence`
builds; the Pallas kernels' outputs carry no manual-axis types).

Every state path here is affine in the state a segment starts from: S_out = S_in Phi + Psi.
Each device runs the public op on its segment once, with values [v, 0] and the initial state
[0; I] (dv + dk rows), which gives the outputs o0_t and the final state Psi from S_in = 0 and,
in the other rows, x_t = Phi_{1..t} q_t and Phi itself. The (Psi, Phi) of all devices are
all-gathered and folded in order, S_in(j + 1) = S_in(j) Phi_j + Psi_j, and each device corrects
its outputs, o_t = o0_t + S_in x_t. Linear attention has Phi = I and needs no extra rows.

VLA's penalty path is additive in M = A^-1: the device j starts from
A_j = (M_0 + sum_{i<j} U_i^T U_i)^-1. In float32 the inverse of a rounded prefix sum is off by
about eps cond(M) along the write directions; a first-order carry of that error across the
segment boundaries (README.md) brings it back to the single-device op's accuracy.

Gradients are JAX's autodiff through the ops' own backward passes, the all-gathers (whose
transposes are reduce-scatters) and the folds, except for A_j: it enters the op without
gradient, and probe tokens at the segment's start carry dL/dM_j (`_probe_rows`).
"""

import functools
import inspect

import jax
import jax.numpy as jnp

from vla_jax.ops import checks, nonfinite
from vla_jax.ops.baselines import (LinearAttentionState, deltanet, elu_plus_one,
                                   gated_deltanet, linear_attention)
from vla_jax.ops.impl import KERNEL_IMPLS, parse_impl
from vla_jax.ops.utils import einsum
from vla_jax.ops.vla import VLAState, vla_recurrence


def _symmetrize(A):
  return 0.5 * (A + jnp.swapaxes(A, -1, -2))


def _gather(x, axis_name):
  """[P, ...]: x of every device of `axis_name`, in device order, the same on each."""
  return jax.lax.all_gather(x, axis_name)


def _from_last(x, axis_name):
  """x of the axis' last device, on every device."""
  last = jax.lax.axis_size(axis_name) - 1
  mine = jax.lax.axis_index(axis_name) == last
  return jax.lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), axis_name)


def fold_states(Psi, Phi, S0, axis_name):
  """The segment fold. Psi: [B, H, dv, dk] this device's segment run from S = 0; Phi:
  [B, H, dk, dk] its transition (S_out = S_in Phi + Psi); S0: [B, H, dv, dk] the state before
  the first segment. Returns (S_in [B, H, dv, dk], the state this device's segment starts
  from; S_end, the state after the last segment, the same on every device)."""
  Psis, Phis = _gather(Psi, axis_name), _gather(Phi, axis_name)

  def step(S, xs):
    Psi_i, Phi_i = xs
    return einsum("bhvk,bhkl->bhvl", S, Phi_i) + Psi_i, S

  S_end, starts = jax.lax.scan(step, S0, (Psis, Phis))
  return starts[jax.lax.axis_index(axis_name)], S_end


def correct_outputs(o0, x, S_in, out_dtype):
  """o_t = o0_t + S_in x_t. o0: [B, T, H, dv]; x: [B, T, H, dk]; S_in: [B, H, dv, dk]."""
  o = o0.astype(S_in.dtype) + einsum("bthk,bhvk->bthv", x.astype(S_in.dtype), S_in)
  return o.astype(out_dtype)


def transition_run(run, v, dk, dtype, split):
  """Runs a delta-rule op on its segment for the fold. `run(values [B, T, H, w], S0
  [B, H, w, dk])` returns (outputs [B, T, H, w], final S [B, H, w, dk]) and any auxiliary
  output. Returns (o0 [B, T, H, dv], x [B, T, H, dk], Psi [B, H, dv, dk], Phi [B, H, dk, dk],
  aux of the call that ran the values). split=False: one call with values [v, 0] from
  [0; I]; True: two calls (v from 0, then 0 from I)."""
  B, T, H, dv = v.shape
  eye = jnp.broadcast_to(jnp.eye(dk, dtype=dtype), (B, H, dk, dk))
  zeros_v = jnp.zeros((B, T, H, dk), v.dtype)
  if split:
    o0, Psi, aux = run(v, jnp.zeros((B, H, dv, dk), dtype))
    x, Phi, _ = run(zeros_v, eye)
    return o0, x, Psi, Phi, aux
  S0 = jnp.concatenate([jnp.zeros((B, H, dv, dk), dtype), eye], axis=2)
  o, S, aux = run(jnp.concatenate([v, zeros_v], axis=-1), S0)
  return o[..., :dv], o[..., dv:], S[:, :, :dv], S[:, :, dv:], aux


def contain_segment(axis_name, q, keys, state_inputs=(), writes=(), state_bad=None):
  """`nonfinite.contain` over a sequence split across `axis_name`, so that a non-finite token
  stays causal across the devices too: this device's tokens are sanitised, and the
  breakage of the earlier devices' segments carries into this one.

  Everything after it (the ops on their segments, the folds, the collectives and their
  transposes) then computes on finite numbers only, forward and backward: a later segment's
  NaN never meets an earlier one's cotangent (0 * NaN) in a fold or a reduce-scatter.

  Args: as `nonfinite.contain` (this device's tokens), without `starts`.
  Returns:
    (outputs guard: NaN where this device's tokens see a broken state; final guard: its
    `state` marks a final state NaN when any segment broke (the same on every device);
    q, keys, state_inputs, writes sanitised).
  """
  guard, q, keys, state_inputs, writes = nonfinite.contain(q, keys, state_inputs, writes,
                                                           state_bad)
  B, T, H = guard.broken.shape
  end = guard.broken[:, -1] if T else jnp.zeros((B, H), bool)
  ends = _gather(end, axis_name)                                # [P, B, H]
  earlier = jnp.arange(ends.shape[0]) < jax.lax.axis_index(axis_name)
  before = jnp.any(ends & earlier[:, None, None], axis=0)
  outputs = nonfinite.Guard(guard.broken | before[:, None], guard.query_bad)
  final = nonfinite.Guard(jnp.any(ends, axis=0)[:, None], jnp.zeros((B, 1, H), bool))
  return outputs, final, q, keys, state_inputs, writes


def _check_no_segment_ids(kwargs):
  if kwargs.get("segment_ids") is not None:
    raise ValueError("segment_ids are not supported with a sharded sequence")


def _impl_of(op, kwargs):
  return parse_impl(kwargs.get("impl", inspect.signature(op).parameters["impl"].default))


# ------------------------------------------------------------------------------------------
# VLA's penalty path: the inverse at each segment start.

# Probe tokens: u = PROBE e_i (i < dk) with k = q = v = 0 write nothing and change A by
# -PROBE^2 A^2, relative 3e-21 ||A||: below rounding while ||A|| <= 1 / lambda_min(M) stays
# under 1e4 (float64) or 1e13 (float32). The op's du for them is -PROBE (D + D^T) e_i with D
# the segment's whole adjoint sum, which is dL/dM at its start.
PROBE = 2.0 ** -34


@jax.custom_vjp
def _probe_rows(M):
  """u rows [B, dk, H, dk] of the probe tokens (PROBE * I), attached to M [B, H, dk, dk], the
  penalty at the segment start: their cotangent becomes M's (-sym D)."""
  B, H, dk, _ = M.shape
  return jnp.broadcast_to(PROBE * jnp.eye(dk, dtype=M.dtype)[None, :, None], (B, dk, H, dk))


def _probe_rows_fwd(M):
  return _probe_rows(M), None


def _probe_rows_bwd(_, ct):
  ct = jnp.moveaxis(ct, 2, 1)                               # [B, H, i, dk]: -PROBE (D + D^T)
  return (_symmetrize(ct) / (2 * PROBE),)


_probe_rows.defvjp(_probe_rows_fwd, _probe_rows_bwd)


def _linearised_carry(A_direct, G, run_chain, axis_name):
  """First-order correction E_j of the direct inverses A_direct = [P + 1, B, H, dk, dk] (of
  the rounded prefix sums) at each device's start; G: this device's Gram U^T U; run_chain(A)
  carries A through this device's segment by the op's own downdates. Values only.

  Per segment, F = chain(A~_j), Q = I - F G (dF = Q dA Q^T to first order), D = F - A~_{j+1};
  E_0 = 0, E_{i+1} = Q_i E_i Q_i^T + D_i; A_j = A~_j + E_j is off by O((eps cond)^2)."""
  j = jax.lax.axis_index(axis_name)
  F = run_chain(A_direct[j])
  Q = jnp.eye(F.shape[-1], dtype=F.dtype) - einsum("bhij,bhjk->bhik", F, G)
  D = F - A_direct[j + 1]
  Qs, Ds = _gather(Q, axis_name)[:-1], _gather(D, axis_name)[:-1]

  def step(E, xs):
    Q_i, D_i = xs
    return einsum("bhij,bhjk,bhlk->bhil", Q_i, E, Q_i) + D_i, E

  E_end, Es = jax.lax.scan(step, jnp.zeros_like(F), (Qs, Ds))
  return jnp.concatenate([Es, E_end[None]])[j]


def segment_start_A(u, A0, M0, run_chain, axis_name):
  """A at this device's segment start, (M0 + sum of the earlier devices' u u^T)^-1.

  Args:
    u: [B, T, H, dk] this device's penalty directions (compute dtype).
    A0: [B, H, dk, dk] the initial inverse (symmetric); M0: A0^-1.
    run_chain: A -> A after this device's segment (the op's own carried downdates), used only
      for the float32 correction.
  Returns:
    (A [B, H, dk, dk], a value without gradient: A0 on the first device; float64 inverts the
    prefix sums directly, float32 adds the linearised carry of their rounding error; probe
    rows [B, dk, H, dk] to put before the segment's tokens, through which the gradient
    reaches M, the Grams and A0).

  The gradient could instead go through the op's own dA0 and the inverse's -A (.) A, but the
  op forms dA0 = A^-1 (.) A^-1 with a float32 inverse of A, which loses eps cond(M) when A
  is ill-conditioned (measured: 3e-5 against 5e-6 in du, T = 4096, lam0 = 0.1, rank-4 u).
  """
  j = jax.lax.axis_index(axis_name)
  G = einsum("bthi,bthj->bhij", u, u)
  Gs = _gather(G, axis_name)
  M = M0 + jnp.concatenate([jnp.zeros_like(Gs[:1]), jnp.cumsum(Gs, axis=0)])  # [P + 1, ...]
  stop = jax.lax.stop_gradient
  A_direct = stop(jnp.concatenate([A0[None], _symmetrize(jnp.linalg.inv(M[1:]))]))
  value = A_direct[j]
  if u.dtype != jnp.float64 and jax.lax.axis_size(axis_name) > 1:
    value = value + _linearised_carry(A_direct, stop(G), lambda A: stop(run_chain(A)),
                                      axis_name)
  return value, _probe_rows(M[j])


# ------------------------------------------------------------------------------------------
# The ops, one device's segment each.

def vla_segments(q, k, v, u, beta=None, *, axis_name, lam0=1.0, initial_state=None,
                 **op_kwargs):
  """`vla_recurrence` on this device's segment of a sequence split over `axis_name`.

  Args:
    q, k, u: [B, T, H, dk]; v: [B, T, H, dv]; beta: None or [B, T, H] write strengths: this
      device's tokens (the devices of the axis hold consecutive segments, in axis order).
    lam0, initial_state: as `vla_recurrence` (the state before the first segment, the same
      on every device).
    op_kwargs: passed to `vla_recurrence` (impl, chunk_size, ...).
  Returns:
    (o [B, T, H, dv] in v's dtype for this segment, the final `VLAState` of the whole
    sequence, the same on every device).
  """
  _check_no_segment_ids(op_kwargs)
  B, T, H, dk = checks.check_tokens("q", q)
  dv = checks.check_tokens("v", v, batch=B, time=T, heads=H)[3]
  checks.check_tokens("u", u, batch=B, time=T, heads=H, dim=dk)
  if beta is not None:
    checks.check_tokens("beta", beta, rank=3, batch=B, time=T, heads=H)
  if initial_state is not None and not isinstance(initial_state, VLAState):
    raise TypeError("initial_state must be a VLAState(S, A) or None; got "
                    f"{type(initial_state).__name__}")
  dtype = checks.compute_dtype(q, k, v, u, beta, *(initial_state or ()))
  eye = jnp.eye(dk, dtype=dtype)
  if initial_state is None:   # a number > 0 and the impl's float32 floor
    checks.check_lam0(lam0, _impl_of(vla_recurrence, op_kwargs), dtype)
    S0 = jnp.zeros((B, H, dv, dk), dtype)
    A0 = jnp.broadcast_to(eye / lam0, (B, H, dk, dk))
    M0 = jnp.broadcast_to(eye * lam0, (B, H, dk, dk)).astype(dtype)
  else:
    checks.check_positive("lam0", lam0)   # unused, checked as in vla_recurrence
    checks.check_state("initial_state.S", initial_state.S, (B, H, dv, dk))
    checks.check_state("initial_state.A", initial_state.A, (B, H, dk, dk))
    S0 = initial_state.S.astype(dtype)
    A0 = _symmetrize(initial_state.A.astype(dtype))
    M0 = _symmetrize(jnp.linalg.inv(A0))
  impl = _impl_of(vla_recurrence, op_kwargs)
  pallas = impl in KERNEL_IMPLS
  if pallas:   # a [v, 0] wider than the kernels' head dims runs as two calls
    from vla_jax.kernels.config import (  # pylint: disable=import-outside-toplevel
        SUPPORTED_HEAD_DIMS)
  out_guard, end_guard, q, k, (u,), (v, beta) = contain_segment(axis_name, q, k, (u,),
                                                                (v, beta))
  op = functools.partial(vla_recurrence, **op_kwargs)
  stop = jax.lax.stop_gradient

  def chain(A):   # the op's penalty path alone: values of the narrowest width it takes
    width = min(SUPPORTED_HEAD_DIMS) if pallas else 1
    zeros = jnp.zeros((B, T, H, width), v.dtype)
    return op(stop(q), stop(k), zeros, stop(u),
              initial_state=VLAState(jnp.zeros((B, H, width, dk), dtype),
                                     A))[1].A

  A_start, probes = segment_start_A(u.astype(dtype), A0, M0, chain, axis_name)
  blank = lambda x: jnp.concatenate([jnp.zeros((B, dk) + x.shape[2:], x.dtype), x], axis=1)
  q_p, k_p, u_p = blank(q), blank(k), jnp.concatenate([probes.astype(u.dtype), u], axis=1)

  beta_p = None if beta is None else blank(beta)

  def run(values, S_start):   # with the probe tokens first; their outputs are dropped
    o, state = op(q_p, k_p, blank(values), u_p, beta_p,
                  initial_state=VLAState(S_start, A_start))
    return o[:, dk:], state.S, state.A

  # The XLA impls compute in the state dtype whatever v's dtype: values in that dtype keep
  # o0 and x unrounded. The Pallas kernels choose their products by the inputs' dtypes.
  values = v if pallas else v.astype(dtype)
  split = pallas and dv + dk not in SUPPORTED_HEAD_DIMS
  o0, x, Psi, Phi, A_end = transition_run(run, values, dk, dtype, split)
  S_in, S_end = fold_states(Psi, Phi, S0, axis_name)
  o = correct_outputs(o0, x, S_in, checks.output_dtype(v))
  return out_guard.outputs(o), VLAState(S=end_guard.state(S_end),
                                        A=end_guard.state(_from_last(A_end, axis_name)))


def gated_deltanet_segments(q, k, v, beta, log_decay, *, axis_name, initial_state=None,
                            **op_kwargs):
  """`gated_deltanet` on this device's segment of a sequence split over `axis_name`.

  Args: as `gated_deltanet` (q, k [B, T, H, dk], v [B, T, H, dv], beta and log_decay
    [B, T, H] of this device's tokens; log_decay None for DeltaNet); initial_state S
    [B, H, dv, dk] or None, before the first segment; op_kwargs go to `gated_deltanet`.
  Returns:
    (o [B, T, H, dv] in v's dtype, final S [B, H, dv, dk] of the whole sequence, the same on
    every device).
  """
  _check_no_segment_ids(op_kwargs)
  B, T, H, dk = checks.check_tokens("q", q)
  dv = checks.check_tokens("v", v, batch=B, time=T, heads=H)[3]
  dtype = checks.compute_dtype(q, k, v, beta, log_decay)
  if initial_state is None:
    S0 = jnp.zeros((B, H, dv, dk), dtype)
  else:
    checks.check_state("initial_state", initial_state, (B, H, dv, dk))
    S0 = initial_state.astype(dtype)
  out_dtype = checks.output_dtype(v)
  gate_bad, log_decay = nonfinite.gate_breaks(log_decay)   # as in the op
  out_guard, end_guard, q, k, _, (v, beta) = contain_segment(
      axis_name, q, k, writes=(v, beta), state_bad=gate_bad)

  def run(values, S_start):
    o, S = gated_deltanet(q, k, values, beta, log_decay, initial_state=S_start, **op_kwargs)
    return o, S, None

  o0, x, Psi, Phi, _ = transition_run(run, v.astype(dtype), dk, dtype, split=False)
  S_in, S_end = fold_states(Psi, Phi, S0, axis_name)
  return out_guard.outputs(correct_outputs(o0, x, S_in, out_dtype)), end_guard.state(S_end)


def deltanet_segments(q, k, v, beta, *, axis_name, initial_state=None, **op_kwargs):
  """`deltanet` on this device's segment; see `gated_deltanet_segments`."""
  return gated_deltanet_segments(q, k, v, beta, None, axis_name=axis_name,
                                 initial_state=initial_state, **op_kwargs)


def linear_attention_segments(q, k, v, *, axis_name, feature_map=elu_plus_one, normalize=False,
                              eps=1e-6, initial_state=None, **op_kwargs):
  """`linear_attention` on this device's segment of a sequence split over `axis_name`.

  Linear attention only adds to its state (Phi = I): S_in is the initial state plus the
  earlier devices' sums, and o_t = o0_t + S_in phi(q_t); the normaliser likewise.

  Args: as `linear_attention` (q, k [B, T, H, dk], v [B, T, H, dv] of this device's tokens;
    initial_state a `LinearAttentionState` or None, before the first segment); op_kwargs go
    to `linear_attention`.
  Returns:
    (o [B, T, H, dv] in v's dtype, the final `LinearAttentionState`, the same on every
    device).
  """
  _check_no_segment_ids(op_kwargs)
  B, T, H, _ = checks.check_tokens("q", q)
  dv = checks.check_tokens("v", v, batch=B, time=T, heads=H)[3]
  normalize = checks.check_bool("normalize", normalize)   # as linear_attention
  checks.check_positive("eps", eps)
  if initial_state is not None and not isinstance(initial_state, LinearAttentionState):
    raise TypeError("initial_state must be a LinearAttentionState(S, z) or None; got "
                    f"{type(initial_state).__name__}")
  dtype = checks.compute_dtype(q, k, v)
  q, k = q.astype(dtype), k.astype(dtype)
  if feature_map is not None:
    q, k = feature_map(q), feature_map(k)
  df = q.shape[-1]
  if initial_state is None:
    initial_state = LinearAttentionState(jnp.zeros((B, H, dv, df), dtype),
                                         jnp.zeros((B, H, df), dtype))
  checks.check_state("initial_state.S", initial_state.S, (B, H, dv, df))
  checks.check_state("initial_state.z", initial_state.z, (B, H, df))
  out_dtype = checks.output_dtype(v)
  out_guard, end_guard, q, k, _, (v,) = contain_segment(axis_name, q, k, writes=(v,))
  # A value channel of constant 1 gives this segment's own normaliser z0_t . phi(q_t).
  v1 = jnp.concatenate([v.astype(dtype), jnp.ones((B, T, H, 1), dtype)], axis=-1)
  o, state = linear_attention(q, k, v1, feature_map=None, **op_kwargs)
  S0 = jnp.concatenate([initial_state.S, initial_state.z[:, :, None]], axis=2).astype(dtype)
  Ss = _gather(state.S, axis_name)                              # [P, B, H, dv + 1, df]
  # Exclusive prefix sums: a segment's start holds the earlier segments' sums only (not a
  # later one added and subtracted again, which would round differently with its values).
  starts = S0 + jnp.concatenate([jnp.zeros_like(Ss[:1]), jnp.cumsum(Ss[:-1], axis=0)])
  S_in, S_end = starts[jax.lax.axis_index(axis_name)], starts[-1] + Ss[-1]
  o = o + einsum("bthk,bhvk->bthv", q, S_in)
  num, den = o[..., :dv], o[..., dv]
  if normalize:
    num = num / jnp.maximum(den, eps)[..., None]
  S_end = end_guard.state(S_end)
  return (out_guard.outputs(num.astype(out_dtype)),
          LinearAttentionState(S_end[:, :, :dv], S_end[:, :, dv]))


SEGMENT_OPS = {
    vla_recurrence: vla_segments,
    deltanet: deltanet_segments,
    gated_deltanet: gated_deltanet_segments,
    linear_attention: linear_attention_segments,
}


def segment_op(op):
  """The per-device form of a public sequence op (`vla_recurrence`, `deltanet`,
  `gated_deltanet` or `linear_attention`): the same arguments plus `axis_name`."""
  try:
    return SEGMENT_OPS[op]
  except (KeyError, TypeError):
    names = ", ".join(f.__name__ for f in SEGMENT_OPS)
    raise TypeError(f"op must be one of {names}; got {op!r}") from None
