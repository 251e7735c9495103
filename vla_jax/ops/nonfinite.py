"""Causal containment of non-finite inputs for the sequence ops.

A NaN or Inf at token t must not reach outputs (or gradients) at earlier tokens. Chunked
forms mix the tokens of a chunk in masked matrix products, where 0 * NaN = NaN would carry a
later token's NaN backwards, and reverse-mode autodiff multiplies zero cotangents by
non-finite primals (0 * NaN again) in every form. So the ops compute on inputs whose
non-finite tokens are replaced by zeros (a select: gradients flow through the finite tokens
unchanged and are zero at the replaced ones), and then mark what a sequential pass would have
made non-finite as NaN:

  - a non-finite token of the state's inputs (k, u, a gate) makes its own output and every
    later one NaN, and the final state NaN;
  - a non-finite value (or write strength) of a token whose key is zero writes nothing
    (padding is exact whatever v is); with a non-zero key it counts as a state input;
  - a non-finite query makes its own output NaN only.

For finite inputs every select is the identity: the outputs are bit-identical.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


def token_finite(x):
  """[B, T, H] bool: every entry of the token is finite; x is [B, T, H, D] or [B, T, H]."""
  ok = jnp.isfinite(x)
  return jnp.all(ok, axis=-1) if x.ndim == 4 else ok


def zero_where(bad, x):
  """x with the tokens where bad [B, T, H] is True replaced by zeros (a select)."""
  if x is None:
    return None
  return jnp.where(bad[..., None] if x.ndim == 4 else bad, 0.0, x)   # keeps x's dtype


class Guard(NamedTuple):
  """Where a sequence's state broke (`broken` [B, T, H]: some token s <= t had a non-finite
  state input) and which queries were non-finite (`query_bad` [B, T, H])."""

  broken: jax.Array
  query_bad: jax.Array

  def outputs(self, o):
    """o [B, T, H, dv] with NaN at tokens whose state is broken or whose query is bad."""
    return jnp.where((self.broken | self.query_bad)[..., None],
                     jnp.asarray(jnp.nan, o.dtype), o)

  def state(self, x):
    """A final state array [B, H, ...], NaN for sequences whose state broke."""
    if self.broken.shape[1] == 0:
      return x
    last = self.broken[:, -1].reshape(self.broken.shape[:1] + self.broken.shape[2:3]
                                      + (1,) * (x.ndim - 2))
    return jnp.where(last, jnp.asarray(jnp.nan, x.dtype), x)


def _segmented_or(pair_a, pair_b):
  """Associative combine of (document start seen, bad seen) over time: a start clears what
  came before it."""
  start_a, bad_a = pair_a
  start_b, bad_b = pair_b
  return start_a | start_b, bad_b | (bad_a & ~start_b)


def contain(q, keys, state_inputs=(), writes=(), state_bad=None, starts=None):
  """Sanitises a sequence op's inputs (module docstring).

  Args:
    q: [B, T, H, dk] queries; keys: [B, T, H, dk] the write keys (a token with an all-zero
      key writes nothing); state_inputs: other arrays ([B, T, H, D] or [B, T, H]) whose
      non-finite tokens always break the state (u, ...); writes: arrays whose non-finite
      tokens break it only where the key is non-zero (values, write strengths);
      state_bad: an optional [B, T, H] mask of further breaking tokens (a gate's own rule).
    starts: None, or [B, T] bool document starts of packed sequences (`segment_ids`): the
      state restarts there, and so does the breakage.

  Returns:
    (`Guard`, q, keys, state_inputs, writes), each array with its non-finite tokens zeroed.
  """
  fin = lambda x: token_finite(x)
  q_ok, k_ok = fin(q), fin(keys)
  bad = ~k_ok if state_bad is None else state_bad | ~k_ok
  ok_state = [fin(x) for x in state_inputs]
  for ok in ok_state:
    bad = bad | ~ok
  ok_writes = [fin(x) for x in writes]
  if writes:
    writes_something = jnp.any(keys != 0, axis=-1)    # a NaN key counts as non-zero
    for ok in ok_writes:
      bad = bad | (writes_something & ~ok)
  if starts is None:
    broken = jax.lax.cummax(bad.astype(jnp.int32), axis=1).astype(bool)
  else:
    starts = jnp.broadcast_to(starts[:, :, None], bad.shape)
    broken = jax.lax.associative_scan(_segmented_or, (starts, bad), axis=1)[1]
  clean = lambda xs, oks: tuple(zero_where(~ok, x) for x, ok in zip(xs, oks))
  return (Guard(broken, ~q_ok), zero_where(~q_ok, q), zero_where(~k_ok, keys),
          clean(state_inputs, ok_state), clean(writes, ok_writes))
