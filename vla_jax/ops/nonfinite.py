"""Causal containment of non-finite inputs for the sequence ops.

A NaN or Inf at token t must not reach outputs (or gradients) at earlier tokens. Chunked
forms mix the tokens of a chunk in masked matrix products, where 0 * NaN = NaN would carry a
later token's NaN backwards, and reverse-mode autodiff multiplies zero cotangents by
non-finite primals (0 * NaN again) in every form. So the ops compute on inputs whose
non-finite tokens are replaced by zeros (a select: gradients flow through the finite tokens
unchanged and are zero at the replaced ones), and then mark what a sequential pass would have
made non-finite as NaN:

  - a non-finite token of the state's inputs (k, u, a gate) makes its own output and every
    later one of its document NaN (packed documents: `starts`), and the final state NaN when
    the row's last document holds it;
  - a non-finite value (or write strength) of a token whose key is zero writes nothing
    (padding is exact whatever v is); with a non-zero key it counts as a state input;
  - a non-finite query makes its own output NaN only.

For finite inputs every select is the identity: the outputs are bit-identical.

`contain` zeroes whole tokens, q included. `contain_entries` is its form for ops that run on
fused kernels (the Pallas kernels of VLA and the baselines): it zeroes the non-finite
entries of the state's inputs only (a select each, with no reduction over the token in front
of it) and leaves q to the op, whose non-finite outputs `Guard.outputs` then marks NaN.
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
  """Where a sequence's state broke (`broken` [B, T, H]: some token s <= t of t's document had
  a non-finite state input) and which queries were non-finite (`query_bad` [B, T, H], or None
  where the op ran its queries as they were and a non-finite query leaves its own output
  non-finite: `contain_entries`)."""

  broken: jax.Array
  query_bad: jax.Array | None

  def outputs(self, o):
    """o [B, T, H, dv] with NaN at tokens whose state is broken or whose query is bad (with
    `query_bad` None: at o's non-finite entries)."""
    bad = self.broken[..., None]
    bad = bad | (~jnp.isfinite(o) if self.query_bad is None else self.query_bad[..., None])
    return jnp.where(bad, jnp.asarray(jnp.nan, o.dtype), o)

  def state(self, x):
    """A final state array [B, H, ...], NaN for sequences whose state broke."""
    if self.broken.shape[1] == 0:
      return x
    last = self.broken[:, -1].reshape(self.broken.shape[:1] + self.broken.shape[2:3]
                                      + (1,) * (x.ndim - 2))
    return jnp.where(last, jnp.asarray(jnp.nan, x.dtype), x)


def gate_breaks(log_decay):
  """(gate_bad, log_decay) of a gate's per-token log decays [B, T, H] (or (None, None)):
  NaN or +inf breaks the state (`state_bad` of `contain`) and goes on as 0; -inf is a reset
  and stays."""
  if log_decay is None:
    return None, None
  bad = jnp.isnan(log_decay) | (log_decay == jnp.inf)
  return bad, jnp.where(bad, jnp.zeros((), log_decay.dtype), log_decay)


def breakage(bad, starts=None):
  """[B, T, H] bool: some token s <= t of t's document is bad (bad [B, T, H]; starts None for
  one document a row, or [B, T] bool document starts, where the breakage restarts). Two
  cumulative maxima of token positions (the second over [B, T] only)."""
  pos = jnp.arange(bad.shape[1], dtype=jnp.int32)
  last_bad = jax.lax.cummax(jnp.where(bad, pos[:, None], -1), axis=1)     # [B, T, H]
  if starts is None:
    return last_bad >= 0
  first = jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)   # [B, T]: its document's first token
  return last_bad >= first[:, :, None]


def _breaking(keys, key_ok, state_oks, write_oks, state_bad):
  """[B, T, H] bool: the tokens whose non-finite inputs break the state (module docstring)."""
  bad = ~key_ok if state_bad is None else state_bad | ~key_ok
  for ok in state_oks:
    bad = bad | ~ok
  write_oks = [ok for ok in write_oks if ok is not None]
  if write_oks:
    writes_something = jnp.any(keys != 0, axis=-1)    # a NaN key counts as non-zero
    for ok in write_oks:
      bad = bad | (writes_something & ~ok)
  return bad


def _write_finite(x):
  """`token_finite` of a write, None for an absent one (None)."""
  return None if x is None else token_finite(x)


def contain(q, keys, state_inputs=(), writes=(), state_bad=None, starts=None):
  """Sanitises a sequence op's inputs (module docstring).

  Args:
    q: [B, T, H, dk] queries; keys: [B, T, H, dk] the write keys (a token with an all-zero
      key writes nothing); state_inputs: other arrays ([B, T, H, D] or [B, T, H]) whose
      non-finite tokens always break the state (u, ...); writes: arrays whose non-finite
      tokens break it only where the key is non-zero (values, write strengths), or None for
      an absent one (returned as None);
      state_bad: an optional [B, T, H] mask of further breaking tokens (a gate's own rule).
    starts: None, or [B, T] bool document starts of packed sequences (`segment_ids`): the
      state restarts there, and so does the breakage.

  Returns:
    (`Guard`, q, keys, state_inputs, writes), each array with its non-finite tokens zeroed.
  """
  q_ok, k_ok = token_finite(q), token_finite(keys)
  ok_state = [token_finite(x) for x in state_inputs]
  ok_writes = [_write_finite(x) for x in writes]
  broken = breakage(_breaking(keys, k_ok, ok_state, ok_writes, state_bad), starts)
  clean = lambda xs, oks: tuple(None if x is None else zero_where(~ok, x)
                                for x, ok in zip(xs, oks))
  return (Guard(broken, ~q_ok), zero_where(~q_ok, q), zero_where(~k_ok, keys),
          clean(state_inputs, ok_state), clean(writes, ok_writes))


def contain_entries(keys, state_inputs=(), writes=(), state_bad=None, starts=None):
  """`contain` for an op that reads its queries as they are and keeps a non-finite query's
  effect to that query's own output (the Pallas kernels do): the other inputs' non-finite
  entries (not whole tokens) are replaced by zeros, one select each with no reduction in front
  of it, so the op computes on finite numbers only. What a bad token's remaining entries then
  compute is marked NaN (`Guard.outputs`, `Guard.state`), and in reverse mode meets zero
  cotangents only.

  Args: as `contain`, without q (an input with its own rule, a gate, goes in as state_bad,
    already made finite by the caller).

  Returns:
    (`Guard` with query_bad None, keys, state_inputs, writes), each array with its non-finite
    entries zeroed.
  """
  broken = breakage(_breaking(keys, token_finite(keys), [token_finite(x) for x in state_inputs],
                              [_write_finite(x) for x in writes], state_bad), starts)
  clean = lambda x: None if x is None else jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))
  return (Guard(broken, None), clean(keys), tuple(clean(x) for x in state_inputs),
          tuple(clean(x) for x in writes))
