"""Packed documents (`segment_ids`): for every recurrence and impl, the outputs and the final
state of a packed row equal each document run alone by the float64 oracles, with documents
that start inside a chunk, at a chunk boundary, span one and are of length 1, and a carried-in
initial state for each row's first document; gradients (VLA's chunked path and one baseline
per impl) equal the oracles' directional derivatives; bad segment ids raise clearly. (One
small compilation per case: the packed rows only, the references are NumPy.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from vla_jax import parallel
from vla_jax.ops import checks
from vla_jax.ops.baselines import (LinearAttentionState, deltanet, gated_deltanet,
                                   linear_attention)
from vla_jax.ops.vla import VLAState, vla_recurrence

T, H, DK, DV, CHUNK, LAM0 = 24, 1, 4, 3, 16, 0.7
# Row 0: starts inside chunks (5, 6, 17), at a chunk boundary (16) and two length-1 documents;
# row 1: a start inside a chunk (3), a document across the chunk boundary and a length-1 last
# document (the row's final state).
LENGTHS = [[5, 1, 10, 1, 7], [3, 20, 1]]
IMPLS = ["scan", "associative_scan", "chunked"]
OPS = ["vla", "linear", "deltanet", "gated_deltanet"]
# Gradients: VLA's packed chunked penalty path (autodiff through the per-chunk Cholesky, not
# the adjoint backward of the unpacked one) and one baseline per impl.
GRADS = [("vla", "chunked"), ("gated_deltanet", "scan"), ("linear", "associative_scan"),
         ("deltanet", "chunked")]


def layout():
  """segment_ids [B, T] (arbitrary, non-consecutive ids) and, per document, (row, start, length)
  in row order."""
  ids, docs = np.zeros((len(LENGTHS), T), np.int32), []
  for b, lengths in enumerate(LENGTHS):
    assert sum(lengths) == T
    start = 0
    for i, n in enumerate(lengths):
      ids[b, start:start + n] = 7 * i + 3 * b - 2
      docs.append((b, start, n))
      start += n
  return ids, docs


SEGMENT_IDS, DOCS = layout()


def inputs(name, seed):
  """(args, initial state) as tuples of float64 NumPy arrays, packed layout [B, T, H, ...]."""
  rng = np.random.default_rng(seed)
  B = len(LENGTHS)
  q, k = (rng.standard_normal((B, T, H, DK)) for _ in range(2))
  v = rng.standard_normal((B, T, H, DV))
  if name == "vla":
    A = rng.standard_normal((B, H, DK, DK)) / 3
    return ((q, k, v, rng.standard_normal((B, T, H, DK)) / np.sqrt(DK)),
            (rng.standard_normal((B, H, DV, DK)), np.eye(DK) + np.einsum("bhij,bhkj->bhik", A, A)))
  if name == "linear":
    return (q, k, v), (rng.standard_normal((B, H, DV, DK)), rng.random((B, H, DK)))
  args = (q, k, v, rng.random((B, T, H)))
  if name == "gated_deltanet":
    args += (-rng.random((B, T, H)),)
  return args, (rng.standard_normal((B, H, DV, DK)),)


def weights(name, seed=99):
  """Random weights of the outputs and of the final state's leaves: the loss is their dot."""
  rng = np.random.default_rng(seed)
  _, state = inputs(name, 0)
  return (rng.standard_normal((len(LENGTHS), T, H, DV)),) + tuple(
      rng.standard_normal(s.shape) for s in state)


def loss_and_outputs(args, state, w, name, impl):
  """The packed run: (sum(o w_o) + sum(final w_state), (o, final state leaves))."""
  kw = dict(impl=impl, chunk_size=CHUNK, segment_ids=SEGMENT_IDS)
  if name == "vla":
    o, final = vla_recurrence(*args, lam0=LAM0, initial_state=VLAState(*state), **kw)
  elif name == "linear":
    o, final = linear_attention(*args, normalize=True,
                                initial_state=LinearAttentionState(*state), **kw)
  else:
    o, final = (deltanet if name == "deltanet" else gated_deltanet)(
        *args, initial_state=state[0], **kw)
  final = tuple(jax.tree.leaves(final))
  return sum(jnp.sum(x * y) for x, y in zip((o,) + final, w)), (o, final)


@functools.partial(jax.jit, static_argnames=("name", "impl", "grad"))
def packed(args, state, w, *, name, impl, grad):
  """(o, final state leaves) of the packed rows and, with `grad`, the loss's gradients in
  args and state (else None)."""
  if not grad:
    return loss_and_outputs(args, state, w, name, impl)[1], None
  g, outs = jax.grad(loss_and_outputs, argnums=(0, 1), has_aux=True)(args, state, w, name, impl)
  return outs, g


def alone(name, args, state):
  """Each document run alone by the float64 oracle, from the initial state (its row's first
  document) or from a fresh one: (o [B, T, H, dv], the final state leaves of each row's last
  document)."""
  o = np.zeros(args[2].shape[:3] + (DV,))
  final = [np.zeros_like(s) for s in state]
  for b, s, n in DOCS:                    # row order: a row's last document writes last
    x = [a[b:b + 1, s:s + n] for a in args]
    init = [x[b:b + 1] if s == 0 else None for x in state]
    if name == "vla":
      o_d, *fin = oracles.vla(*x, lam0=LAM0, S0=init[0], A0=init[1])
    elif name == "linear":
      o_d, *fin = oracles.linear_attention(*x, normalize=True, S0=init[0], z0=init[1])
    else:
      o_d, *fin = oracles.gated_deltanet(*x, S0=init[0])
    o[b, s:s + n] = o_d[0]
    for f, y in zip(final, fin):
      f[b] = y[0]
  return o, final


def oracle_loss(name, args, state, w):
  o, final = alone(name, args, state)
  return sum(np.sum(x * y) for x, y in zip([o] + final, w))


@pytest.fixture(scope="module")
def packed_runs():
  """{(name, impl): `packed` of the case}: one jitted program per impl for the four ops (their
  packed forms share kernels, which XLA:CPU compiles once a program)."""
  runs = {}
  with jax.enable_x64(True):
    for impl in IMPLS:
      cases = {name: inputs(name, seed=OPS.index(name)) + (weights(name),) for name in OPS}
      every = jax.jit(lambda cases, impl=impl: {
          name: packed(*case, name=name, impl=impl, grad=(name, impl) in GRADS)
          for name, case in cases.items()})
      runs.update({(name, impl): run for name, run in every(cases).items()})
  return runs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OPS)
def test_packed_equals_documents_alone(x64, packed_runs, name, impl):
  args, state = inputs(name, seed=OPS.index(name))
  w = weights(name)
  grad = (name, impl) in GRADS
  (o, final), g = packed_runs[name, impl]
  o_ref, final_ref = alone(name, args, state)
  np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-10)
  for x, y in zip(final, final_ref):
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-10)
  if not grad:
    return
  # Directional derivatives along random directions (symmetric for VLA's A: the recurrence
  # sees A's symmetric part), by central differences of the oracle.
  rng = np.random.default_rng(7)
  for _ in range(2):
    d_args = [rng.standard_normal(a.shape) for a in args]
    d_state = [rng.standard_normal(s.shape) for s in state]
    if name == "vla":
      d_state[1] = d_state[1] + np.swapaxes(d_state[1], -1, -2)
    h = 1e-5
    shifted = lambda sign: oracle_loss(
        name, [a + sign * h * d for a, d in zip(args, d_args)],
        [s + sign * h * d for s, d in zip(state, d_state)], w)
    fd = (shifted(1) - shifted(-1)) / (2 * h)
    ad = sum(float(np.sum(np.asarray(x) * y)) for x, y in zip(jax.tree.leaves(g),
                                                               d_args + d_state))
    assert abs(fd - ad) < 1e-7 * (1 + abs(ad)), (fd, ad)


def test_vla_pallas_packed_equals_documents_alone(x64):
  """impl="pallas" (the kernels in interpret mode, head dims 16) on the same packed rows:
  outputs and final states equal each document run alone by the float64 oracle, and the
  gradients equal impl="chunked"'s (checked above against the oracle)."""
  d = 16
  rng = np.random.default_rng(11)
  B = len(LENGTHS)
  q, k, v = (rng.standard_normal((B, T, H, d)) for _ in range(3))
  u = rng.standard_normal((B, T, H, d)) / np.sqrt(d)
  X = rng.standard_normal((B, H, d, d)) / np.sqrt(d)
  S0, A0 = rng.standard_normal((B, H, d, d)) / 4, np.linalg.inv(0.5 * np.eye(d) + X @ X.mT)
  args = [jnp.asarray(x) for x in (q, k, v, u)]

  def run(impl, *xs):
    o, st = vla_recurrence(*xs[:4], lam0=LAM0, initial_state=VLAState(*xs[4:]), impl=impl,
                           chunk_size=CHUNK, segment_ids=SEGMENT_IDS)
    return o, st.S, st.A

  # The forward and the gradients of a loss with random weights w on (o, S_T, A_T), one
  # program per impl: XLA compiles the forward they share once.
  w = [jnp.asarray(rng.standard_normal(shape)) for shape in (v.shape, S0.shape, A0.shape)]

  def with_grads(impl):
    loss = lambda *xs: sum(jnp.sum(a * b) for a, b in zip(run(impl, *xs), w))
    return jax.jit(lambda *xs: (run(impl, *xs), jax.grad(loss, argnums=range(6))(*xs)))

  (o, S, A), got = with_grads("pallas")(*args, S0, A0)
  for b, s, n in DOCS:
    x = [np.asarray(a)[b:b + 1, s:s + n] for a in args]
    init = dict(S0=S0[b:b + 1], A0=A0[b:b + 1]) if s == 0 else {}
    o_d, S_d, A_d = oracles.vla(*x, lam0=LAM0, **init)
    np.testing.assert_allclose(o[b, s:s + n], o_d[0], rtol=0, atol=1e-10)
    if s + n == T:
      np.testing.assert_allclose(S[b], S_d[0], rtol=0, atol=1e-10)
      np.testing.assert_allclose(A[b], A_d[0], rtol=0, atol=1e-10)
  want = jax.jit(jax.grad(lambda *xs: sum(jnp.sum(a * b) for a, b in zip(
      run("chunked", *xs), w)), argnums=range(6)))(*args, S0, A0)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=0, atol=1e-10 * (1 + np.max(np.abs(r))))


def test_bad_segment_ids_raise():
  q = jnp.ones((2, 8, 1, 4))
  with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\] = \(2, 8\)"):
    vla_recurrence(q, q, q, q, segment_ids=jnp.zeros((2, 7), jnp.int32))
  with pytest.raises(TypeError, match="segment_ids must have an integer dtype"):
    gated_deltanet(q, q, q, q[..., 0], None, segment_ids=jnp.zeros((2, 8)))
  with pytest.raises(TypeError, match="segment_ids must be an int array"):
    linear_attention(q, q, q, segment_ids=[[0] * 8] * 2)
  with pytest.raises(ValueError, match="impl='pallas' with segment_ids needs lam0 as a Python"):
    jax.jit(lambda lam0: vla_recurrence(q, q, q, q, impl="pallas", lam0=lam0,
                                        segment_ids=jnp.zeros((2, 8), jnp.int32)))(1.0)
  mesh = jax.sharding.AbstractMesh((1,), ("seq",))
  with pytest.raises(ValueError, match="context parallelism.*impl='chunked'"):
    parallel.shard_sequence(vla_recurrence, mesh=mesh)(
        q, q, q, q, segment_ids=jnp.zeros((2, 8), jnp.int32))


@pytest.mark.parametrize("kind,x64_on", [("numpy", False), ("numpy", True), ("jax", True)])
def test_wide_segment_ids_that_a_cast_would_wrap_stay_apart(kind, x64_on):
  """int64 / uint64 ids 2**32 apart are two documents (an int32 cast makes them one):
  `check_segment_ids`, which every op and layer takes its ids from, counts each row's
  documents (a jax array of int64 ids exists only with float64 on); and the op packs them as
  it packs the same documents with small ids (eagerly, NumPy ids without float64: the
  default, where JAX itself would wrap them)."""
  T = 12
  wide = (np.array([7] * 5 + [7 + 2**32] * 7, np.int64),
          np.array([2**63 - 1] * 2 + [2**31 - 1 + 2**32] * 4 + [2**31 - 1] * 6, np.uint64))
  documents = (np.array([0] * 5 + [1] * 7), np.array([0] * 2 + [1] * 4 + [2] * 6))
  with jax.enable_x64(x64_on):
    for wide_row, want in zip(wide, documents):
      ids = wide_row[None] if kind == "numpy" else jnp.asarray(wide_row[None])
      got = checks.check_segment_ids(ids, 1, T)
      assert got.dtype == jnp.int32
      np.testing.assert_array_equal(got, want[None])
    if kind == "numpy" and not x64_on:
      rng = np.random.default_rng(21)
      q, k, v, u = (jnp.asarray(rng.standard_normal((1, T, 1, 4)), jnp.float32)
                    for _ in range(4))
      got, _ = vla_recurrence(q, k, v, u, segment_ids=wide[0][None])
      want, _ = vla_recurrence(q, k, v, u, segment_ids=documents[0][None])
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
      one, _ = vla_recurrence(q, k, v, u)
      assert not np.allclose(np.asarray(got), np.asarray(one))
