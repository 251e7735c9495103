"""Packed documents (`segment_ids`): for every recurrence and impl, the outputs and the final
state of a packed row equal running each document alone (float64), with documents that start
inside a chunk, at a chunk boundary and of length 1, a carried-in initial state for each row's
first document, and gradients; bad segment ids raise clearly. (Each case compiles its
packed and separate gradients once, together: a few seconds each on a CPU.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vla_jax import parallel
from vla_jax.ops.baselines import (LinearAttentionState, elu_plus_one, gated_deltanet,
                                   linear_attention)
from vla_jax.ops.vla import VLAState, vla_recurrence

T, H, DK, DV, CHUNK, LAM0 = 40, 1, 4, 3, 16, 0.7
# Row 0: starts inside chunks (5, 6, 17, 24), at a chunk boundary (16) and two length-1
# documents; row 1: a boundary start (16) and one inside a chunk (30).
LENGTHS = [[5, 1, 10, 1, 7, 16], [16, 14, 10]]
IMPLS = ["scan", "associative_scan", "chunked"]
# DeltaNet is Gated DeltaNet without decay: its path (erase, no decay) is VLA's state path.
OPS = ["vla", "linear", "gated_deltanet"]


def layout():
  """segment_ids [B, T] (arbitrary, non-consecutive ids) and, per document, (row, start, length)."""
  ids, docs = np.zeros((len(LENGTHS), T), np.int32), []
  for b, lengths in enumerate(LENGTHS):
    start = 0
    for i, n in enumerate(lengths):
      ids[b, start:start + n] = 7 * i + 3 * b - 2
      docs.append((b, start, n))
      start += n
  return ids, docs


SEGMENT_IDS, DOCS = layout()
ROW = np.array([d[0] for d in DOCS])
FIRST = np.array([d[1] == 0 for d in DOCS])                    # a row's first document
LAST = [max(i for i, d in enumerate(DOCS) if d[0] == b) for b in range(len(LENGTHS))]
# Gather maps: separate [n_docs, T] (each document at the start of its own row, zero after)
# from packed [B, T], and back.
SEP_ROW = np.repeat(ROW[:, None], T, 1)
SEP_POS = np.array([[min(s + t, T - 1) for t in range(T)] for _, s, _ in DOCS])
SEP_REAL = np.array([[t < n for t in range(T)] for _, _, n in DOCS])
DOC_OF = np.zeros((len(LENGTHS), T), int)
POS_IN = np.zeros((len(LENGTHS), T), int)
for i, (b, s, n) in enumerate(DOCS):
  DOC_OF[b, s:s + n], POS_IN[b, s:s + n] = i, np.arange(n)


def separate(x):
  """Packed [B, T, ...] -> [n_docs, T, ...], zero past each document (zeros leave the states
  unchanged: zero keys, u and features, zero log decay)."""
  real = SEP_REAL.reshape(SEP_REAL.shape + (1,) * (x.ndim - 2))
  return jnp.where(real, x[SEP_ROW, SEP_POS], 0.0)


def run(name, impl, args, state, segment_ids=None):
  kw = dict(impl=impl, chunk_size=CHUNK, initial_state=state, segment_ids=segment_ids)
  if name == "vla":
    return vla_recurrence(*args, lam0=LAM0, **kw)
  if name == "linear":
    return linear_attention(*args, feature_map=None, normalize=True, **kw)
  return gated_deltanet(*args, **kw)


def inputs(name, seed):
  rng = np.random.default_rng(seed)
  B = len(LENGTHS)
  q, k = (rng.standard_normal((B, T, H, DK)) for _ in range(2))
  v = rng.standard_normal((B, T, H, DV))
  if name == "vla":
    args = (q, k, v, rng.standard_normal((B, T, H, DK)) / np.sqrt(DK))
    A = rng.standard_normal((B, H, DK, DK)) / 3
    state = VLAState(rng.standard_normal((B, H, DV, DK)),
                     np.eye(DK) + np.einsum("bhij,bhkj->bhik", A, A))
  elif name == "linear":   # positive features, given (feature_map=None): zero ones are pads
    args = (elu_plus_one(q), elu_plus_one(k), v)
    state = LinearAttentionState(rng.standard_normal((B, H, DV, DK)), rng.random((B, H, DK)))
  else:
    beta = rng.random((B, T, H))
    log_decay = -rng.random((B, T, H)) if name == "gated_deltanet" else None
    args = (q, k, v, beta, log_decay)
    state = rng.standard_normal((B, H, DV, DK))
  return tuple(None if a is None else jnp.asarray(a) for a in args), jax.tree.map(
      jnp.asarray, state)


def fresh(name, state):
  """The state a document starts from: zeros, and A = I / lam0."""
  if name == "vla":
    return VLAState(jnp.zeros_like(state.S), jnp.broadcast_to(jnp.eye(DK) / LAM0, state.A.shape))
  return jax.tree.map(jnp.zeros_like, state)


def loss_and_outputs(args, state, weights, name, impl, packed):
  """sum(o W) + sum(final state W_state), and (o, final state) on the packed layout."""
  w_o, w_s = weights
  if packed:
    o, final = run(name, impl, args, state, SEGMENT_IDS)
  else:
    sep_args = tuple(None if a is None else separate(a) for a in args)
    sep_state = jax.tree.map(
        lambda s, f: jnp.where(FIRST.reshape((-1,) + (1,) * (s.ndim - 1)), s[ROW], f[ROW]),
        state, fresh(name, state))
    o_sep, final_sep = run(name, impl, sep_args, sep_state)
    o = o_sep[DOC_OF, POS_IN]
    final = jax.tree.map(lambda s: s[np.array(LAST)], final_sep)
  loss = jnp.sum(o * w_o) + sum(jnp.sum(s * w) for s, w in
                                zip(jax.tree.leaves(final), jax.tree.leaves(w_s)))
  return loss, (o, final)


@functools.partial(jax.jit, static_argnames=("name", "impl"))
def both(args, state, weights, *, name, impl):
  """Gradients (in args and state) and (o, final state) of the packed and separate runs, in
  one compilation."""
  grad = jax.grad(loss_and_outputs, argnums=(0, 1), has_aux=True)
  return tuple(grad(args, state, weights, name, impl, packed) for packed in (True, False))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OPS)
def test_packed_equals_separate(x64, name, impl):
  args, state = inputs(name, seed=OPS.index(name))
  rng = np.random.default_rng(99)
  weights = (jnp.asarray(rng.standard_normal((len(LENGTHS), T, H, DV))),
             jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape)), state))
  ((g_args, g_state), (o, final)), ((h_args, h_state), (o2, final2)) = both(
      args, state, weights, name=name, impl=impl)
  diff = lambda a, b: max(float(jnp.max(jnp.abs(x - y)))
                          for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert diff(o, o2) < 1e-10
  assert diff(final, final2) < 1e-10
  assert diff(g_args, h_args) < 1e-9
  assert diff(g_state, h_state) < 1e-9


def test_bad_segment_ids_raise():
  q = jnp.ones((2, 8, 1, 4))
  with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\] = \(2, 8\)"):
    vla_recurrence(q, q, q, q, segment_ids=jnp.zeros((2, 7), jnp.int32))
  with pytest.raises(TypeError, match="segment_ids must have an integer dtype"):
    gated_deltanet(q, q, q, q[..., 0], None, segment_ids=jnp.zeros((2, 8)))
  with pytest.raises(TypeError, match="segment_ids must be an int array"):
    linear_attention(q, q, q, segment_ids=[[0] * 8] * 2)
  with pytest.raises(ValueError, match="impl='pallas'; use impl='chunked'"):
    vla_recurrence(q, q, q, q, impl="pallas", segment_ids=jnp.zeros((2, 8), jnp.int32))
  mesh = jax.sharding.AbstractMesh((1,), ("seq",))
  with pytest.raises(ValueError, match="context parallelism.*impl='chunked'"):
    parallel.shard_sequence(vla_recurrence, mesh=mesh)(
        q, q, q, q, segment_ids=jnp.zeros((2, 8), jnp.int32))
