"""vla_recurrence: every impl against the float64 NumPy oracle, state hand-over, padding,
gradients, transformations, float32 stability at T = 16,384 and input validation."""

import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import oracles
from conftest import random_inputs, rel_err
from vla_jax import Impl, VLAState, initial_vla_state, vla_recurrence, vla_step
from vla_jax.ops.checks import MIN_LAM0_FLOAT32
from vla_jax.ops.vla.penalty import penalty_u_cotangents

IMPLS = ["scan", "associative_scan", "chunked"]
# (B, T, H, dk, dv, chunk_size): T a multiple of the chunk, not a multiple, shorter than it.
SHAPES = [(1, 32, 1, 4, 4, 16), (2, 37, 3, 8, 5, 16), (1, 70, 2, 16, 12, 32),
          (2, 5, 1, 3, 6, 64)]
# (shape, impl): where T falls against the chunk matters to "chunked" only; the other impls
# take no chunk size and run on two shapes (B, H > 1 and dk > dv; T = 5 and dv > dk).
CASES = [pytest.param(shape, impl, id="B{}T{}H{}dk{}dv{}C{}-".format(*shape) + impl)
         for shape in SHAPES for impl in IMPLS
         if impl == "chunked" or shape in (SHAPES[1], SHAPES[3])]
TOL = {np.float64: 1e-10, np.float32: 1e-5}


def run(impl, q, k, v, u, chunk_size=16, **kw):
  fn = jax.jit(functools.partial(vla_recurrence, impl=impl, chunk_size=chunk_size, **kw))
  return fn(q, k, v, u)


@functools.cache
def _from_state(impl, chunk_size):
  """jit of (q, k, v, u, S0, A0) -> vla_recurrence from the state (S0, A0): one program per
  impl, chunk size and shape, which the float64 checks below share (the default initial
  state, S = 0 and A = I / lam0: the float32 checks)."""
  return jax.jit(lambda q, k, v, u, S0, A0: vla_recurrence(
      q, k, v, u, initial_state=VLAState(S0, A0), impl=impl, chunk_size=chunk_size))


@pytest.mark.parametrize("shape,impl", CASES)
def test_matches_oracle_float64(x64, shape, impl):
  """From a random initial state (S0, A0 symmetric positive definite)."""
  B, T, H, dk, dv, C = shape
  q, k, v, u = random_inputs(hash(shape) % 1000, B, T, H, dk, dv)
  S0, A0 = _initial_state(hash(shape) % 1000 + 1, B, H, dk, dv)
  o_ref, S_ref, A_ref = oracles.vla(q, k, v, u, S0=S0, A0=A0)
  o, state = _from_state(impl, C)(q, k, v, u, S0, A0)
  chex.assert_shape(o, (B, T, H, dv))
  chex.assert_shape(state.S, (B, H, dv, dk))
  chex.assert_shape(state.A, (B, H, dk, dk))
  chex.assert_trees_all_equal_dtypes(state, VLAState(S=o, A=o))
  assert rel_err(o, o_ref) < TOL[np.float64]
  assert rel_err(state.S, S_ref) < TOL[np.float64]
  assert rel_err(state.A, A_ref) < TOL[np.float64]


@pytest.mark.parametrize("impl", IMPLS)
def test_matches_oracle_float32(impl):
  q, k, v, u = random_inputs(11, 2, 45, 2, 16, 8, np.float32)
  o_ref, S_ref, A_ref = oracles.vla(q, k, v, u)
  o, state = run(impl, q, k, v, u)
  chex.assert_type([o, state.S, state.A], jnp.float32)
  assert rel_err(o, o_ref) < TOL[np.float32]
  assert rel_err(state.S, S_ref) < TOL[np.float32]
  assert rel_err(state.A, A_ref) < TOL[np.float32]


@pytest.mark.parametrize("impl", IMPLS)
def test_output_dtype_follows_v(impl):
  """Traced, not run (`jax.eval_shape`): the dtypes are decided when the op is traced."""
  q, k, v, u = (jnp.asarray(x, jnp.bfloat16) for x in random_inputs(3, 1, 20, 2, 8, 8))
  o, state = jax.eval_shape(functools.partial(vla_recurrence, impl=impl, chunk_size=16),
                            q, k, v, u)
  chex.assert_type(o, jnp.bfloat16)
  chex.assert_type([state.S, state.A], jnp.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_split_sequence_equals_one_call(x64, impl):
  """Two calls, the second from the state the first returns: the outputs and final state of
  one call over the whole sequence (the float64 oracle's). Halves of the shape of
  test_matches_oracle_float64's second case (its program, compiled once)."""
  B, T, H, dk, dv, C = SHAPES[1]
  q, k, v, u = random_inputs(5, B, 2 * T, H, dk, dv)
  S0, A0 = _initial_state(6, B, H, dk, dv)
  o, S, A = oracles.vla(q, k, v, u, S0=S0, A0=A0)
  from_state = _from_state(impl, C)
  o1, mid = from_state(*(x[:, :T] for x in (q, k, v, u)), S0, A0)
  o2, end = from_state(*(x[:, T:] for x in (q, k, v, u)), *mid)
  np.testing.assert_allclose(np.concatenate([o1, o2], axis=1), o, rtol=1e-10, atol=1e-12)
  chex.assert_trees_all_close(end, VLAState(S, A), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_key_and_u_steps_are_exact_padding(x64, impl):
  """21 tokens spread over 37 with 16 padding steps between and around them; the padded
  sequence has the shape of test_matches_oracle_float64's second case (its program, compiled
  once)."""
  B, T, H, dk, dv, C = SHAPES[1]
  q, k, v, u = random_inputs(6, B, T - 16, H, dk, dv)
  S0, A0 = _initial_state(8, B, H, dk, dv)
  rng = np.random.default_rng(7)
  pad_at = np.sort(rng.choice(T, 16, replace=False))
  keep = np.setdiff1d(np.arange(T), pad_at)
  def spread(x, fill):
    y = np.full((B, T) + x.shape[2:], fill, x.dtype) if fill is not None else (
        rng.standard_normal((B, T) + x.shape[2:]))
    y[:, keep] = x
    return y
  # Padded steps: zero k and u, arbitrary (random) q and v.
  qp, vp = spread(q, None), spread(v, None)
  kp, up = spread(k, 0.0), spread(u, 0.0)
  # Against the float64 oracle of the unpadded sequence (what the impl computes for it,
  # test_matches_oracle_float64).
  o, S, A = oracles.vla(q, k, v, u, S0=S0, A0=A0)
  op, state_p = _from_state(impl, C)(qp, kp, vp, up, S0, A0)
  np.testing.assert_allclose(op[:, keep], o, rtol=1e-10, atol=1e-12)
  chex.assert_trees_all_close(state_p, VLAState(S, A), rtol=1e-10, atol=1e-12)


def _loss(impl, chunk_size=16):
  def loss(q, k, v, u, S0, A0):
    o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl=impl,
                           chunk_size=chunk_size)
    w = jnp.sin(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape))
    return jnp.sum(w * o) + jnp.sum(jnp.cos(st.S)) + jnp.sum(st.A ** 2)
  return loss


def _initial_state(seed, B, H, dk, dv):
  rng = np.random.default_rng(seed)
  R = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(np.eye(dk) + R @ np.swapaxes(R, -1, -2))
  return rng.standard_normal((B, H, dv, dk)), A0


@functools.lru_cache(maxsize=None)
def _grad(impl):
  """The jitted gradient of _loss(impl) with respect to all six inputs, shared by the tests
  (at GRAD_SHAPE: one compilation)."""
  return jax.jit(jax.grad(_loss(impl), argnums=tuple(range(6))))


GRAD_SHAPE = (2, 21, 2, 6, 5)   # B, T, H, dk, dv: two chunks of 16


def test_gradients_agree_across_impls(x64):
  B, T, H, dk, dv = GRAD_SHAPE
  args = random_inputs(8, B, T, H, dk, dv) + _initial_state(9, B, H, dk, dv)
  names = ["q", "k", "v", "u", "S0", "A0"]
  grads = {impl: _grad(impl)(*args) for impl in IMPLS}
  # A0 enters as (A0 + A0^T) / 2 in every impl: its gradient is symmetric and the same for
  # all (the forms may use A0 or A0^T where they are equal).
  for impl in IMPLS:
    chex.assert_trees_all_close(grads[impl][5], np.swapaxes(grads[impl][5], -1, -2),
                                rtol=1e-12, atol=1e-14)
  for impl in IMPLS[1:]:
    for name, g, g_ref in zip(names, grads[impl], grads["scan"]):
      assert rel_err(g, g_ref) < 1e-9, (impl, name, rel_err(g, g_ref))


def test_gradient_through_zero_keys_is_finite(x64):
  B, T, H, dk, dv = GRAD_SHAPE
  args = random_inputs(17, B, T, H, dk, dv) + _initial_state(18, B, H, dk, dv)
  args[1][:, 5:9], args[3][:, 5:9] = 0.0, 0.0     # zero k and u, inside the first chunk
  chex.assert_tree_all_finite(_grad("chunked")(*args))


def test_penalty_u_cotangents_equal_autodiff_float64(x64):
  """`penalty.penalty_u_cotangents` against jax.vjp of the penalty path's definition
  (A_t = (A0^-1 + sum_{s<=t} u_s u_s^T)^-1 by direct inversion, W_t = A_t khat_t, and A_T) for
  random cotangents of W and A_T: du and the symmetric part of dA0."""
  B, H, N, C, dk = 1, 2, 3, 4, 5
  rng = np.random.default_rng(7)
  u = jnp.asarray(rng.standard_normal((B, H, N, C, dk)) / np.sqrt(dk))
  khat = jnp.asarray(rng.standard_normal((B, H, N, C, dk)))
  X = rng.standard_normal((B, H, dk, dk))
  A0 = jnp.asarray(np.linalg.inv(np.eye(dk) + X @ np.swapaxes(X, -1, -2) / dk))
  dW = jnp.asarray(rng.standard_normal((B, H, N, C, dk)))
  dA_T = jnp.asarray(rng.standard_normal((B, H, dk, dk)))

  def path(u, A0):
    U = u.reshape(B, H, N * C, dk)
    M = jnp.linalg.inv(A0)[:, :, None] + jnp.cumsum(U[..., :, None] * U[..., None, :], axis=2)
    A = jnp.linalg.inv(M)
    W = jnp.einsum("bhtij,bhtj->bhti", A, khat.reshape(B, H, N * C, dk))
    return W.reshape(B, H, N, C, dk), A[:, :, -1]

  @jax.jit   # one program (eager, each operation compiles)
  def both(u, A0, dW, dA_T):
    (W, A_T), pullback = jax.vjp(path, u, A0)
    U = u.reshape(B, H, N * C, dk)
    M = jnp.linalg.inv(A0)[:, :, None] + jnp.cumsum(U[..., :, None] * U[..., None, :], axis=2)
    Z = jnp.einsum("bhtij,bhtj->bhti", jnp.linalg.inv(M),
                   dW.reshape(B, H, N * C, dk)).reshape(B, H, N, C, dk)
    return pullback((dW, dA_T)), penalty_u_cotangents(u, W, Z, A_T, dA_T, A0)
  (du_ref, dA0_ref), (du, dA0) = both(u, A0, dW, dA_T)
  assert rel_err(du, du_ref) < 1e-12, rel_err(du, du_ref)
  sym_ref = 0.5 * (dA0_ref + jnp.swapaxes(dA0_ref, -1, -2))
  assert rel_err(dA0, sym_ref) < 1e-12, rel_err(dA0, sym_ref)


def test_check_grads(x64):
  """impl="scan"'s reverse mode against finite differences; the other impls' gradients equal
  scan's (test_gradients_agree_across_impls)."""
  B, T, H, dk, dv = 1, 7, 1, 3, 2
  args = random_inputs(10, B, T, H, dk, dv) + _initial_state(12, B, H, dk, dv)
  # Jitted once: check_grads evaluates the loss several times at these shapes.
  check_grads(jax.jit(_loss("scan", chunk_size=16)), args, order=1, modes=("rev",), atol=1e-6,
              rtol=1e-6)


def test_scan_gradient_keeps_only_the_carries():
  """impl="scan" rematerialises each token's step in the backward (`jax.checkpoint`): the
  gradient's temporaries are the carried S and A per token (two d x d matrices) and little
  more, not every intermediate of the step (5.4 matrices per token without it; XLA, CPU)."""
  B, T, H, d = 2, 64, 2, 32
  args = random_inputs(13, B, T, H, d, d, dtype=np.float32)
  grad = jax.jit(jax.grad(lambda *a: jnp.sum(vla_recurrence(*a, impl="scan")[0]),
                          argnums=(0, 1, 2, 3)))
  temp = grad.lower(*args).compile().memory_analysis().temp_size_in_bytes
  matrices_per_token = temp / (B * T * H * d * d * 4)
  assert 2 <= matrices_per_token < 3, matrices_per_token


def test_vmap_and_grad_compose(x64):
  q, k, v, u = random_inputs(13, 1, 9, 1, 4, 3)
  stacked = [np.stack([x, 2.0 * x]) for x in (q, k, v, u)]  # a leading "model" axis
  fn = lambda *a: vla_recurrence(*a, impl="chunked", chunk_size=16)[0]
  batched = jax.jit(jax.vmap(fn))(*stacked)
  single = jax.jit(fn)
  for i in range(2):
    np.testing.assert_allclose(batched[i], single(*(x[i] for x in stacked)), rtol=1e-12)
  per_example = jax.jit(jax.vmap(jax.grad(lambda v: fn(q, k, v, u).sum())))(stacked[2])
  chex.assert_shape(per_example, stacked[2].shape)
  chex.assert_tree_all_finite(per_example)


def test_enum_and_string_impl_are_the_same(x64):
  args = random_inputs(14, 1, 9, 1, 4, 4)
  for impl in Impl:
    if impl in (Impl.PALLAS, Impl.PALLAS_INTERPRET, Impl.AUTO):   # kernels: d 16-128; auto: layers
      continue
    # The same program (traced, not compiled: equal programs give equal results).
    by_enum, by_string = (str(jax.make_jaxpr(functools.partial(vla_recurrence, impl=i))(*args))
                          for i in (impl, impl.value))
    assert by_enum == by_string, impl


@pytest.mark.parametrize("u_kind", ["isotropic", "four_directions"])
def test_float32_chunked_is_stable_at_16k_tokens(u_kind):
  """float32 'chunked' vs the float64 oracle at T = 16,384, dk = dv = 64."""
  B, T, H, d = 1, 16384, 1, 64
  q, k, v, u = random_inputs(15, B, T, H, d, d)
  if u_kind == "four_directions":  # cond(M) about 1.6e4 at the end
    rng = np.random.default_rng(16)
    basis = np.linalg.qr(rng.standard_normal((d, 4)))[0]
    u = rng.standard_normal((B, T, H, 4)) @ basis.T + 1e-2 * u
  o_ref, S_ref, A_ref = oracles.vla(q, k, v, u)
  o, state = run("chunked", *(x.astype(np.float32) for x in (q, k, v, u)), chunk_size=64)
  assert rel_err(o, o_ref) < 1e-3
  assert rel_err(state.S, S_ref) < 1e-3
  A = np.asarray(state.A[0, 0], np.float64)
  np.testing.assert_array_equal(A, A.T)
  assert np.linalg.eigvalsh(A).min() > 0
  assert rel_err(A, A_ref[0, 0]) < 1e-3


@pytest.mark.parametrize("impl", ["scan", "associative_scan", "chunked"])
def test_float32_at_the_smallest_lam0(impl):
  """float32 at its impl's smallest lam0 (MIN_LAM0_FLOAT32) is finite and within 3e-3 of the
  float64 oracle (T = 64, d = 16, unit-scale u); float64 takes a lam0 100x smaller. Below the
  minimum (rejected), chunked reached 1.4e-2 at 1e-5 and NaN at 1e-7, associative_scan NaN at
  1e-8 (relative errors at this shape, before the check)."""
  q, k, v, u = random_inputs(11, 1, 64, 1, 16, 16)
  lam0 = MIN_LAM0_FLOAT32[impl]
  # Jitted: one program a dtype (eagerly, each operation compiles on its own).
  run = lambda *a, lam0: jax.jit(functools.partial(
      vla_recurrence, lam0=lam0, impl=impl, chunk_size=16))(*a)[0]
  o = run(*(x.astype(np.float32) for x in (q, k, v, u)), lam0=lam0)
  o_ref = oracles.vla(q, k, v, u, lam0=lam0)[0]
  assert np.all(np.isfinite(np.asarray(o)))
  assert rel_err(o, o_ref) < 3e-3, rel_err(o, o_ref)
  with jax.enable_x64(True):
    o64 = run(*(jnp.asarray(x) for x in (q, k, v, u)), lam0=lam0 / 100)
  assert rel_err(o64, oracles.vla(q, k, v, u, lam0=lam0 / 100)[0]) < 1e-8


class TestValidation:
  args = random_inputs(0, 1, 8, 2, 4, 3, np.float32)

  def call(self, *args, **kw):
    q, k, v, u = self.args
    return vla_recurrence(*(args or (q, k, v, u)), **kw)

  def test_wrong_rank(self):
    q, k, v, u = self.args
    with pytest.raises(ValueError, match=r"q must have rank 4 \[B, T, H, D\]"):
      self.call(q[0], k, v, u)

  @pytest.mark.parametrize("which,axis,label", [(1, 0, "B"), (1, 1, "T"), (2, 2, "H"),
                                                (3, 3, "D")])
  def test_mismatched_axes(self, which, axis, label):
    args = list(self.args)
    args[which] = np.concatenate([args[which]] * 2, axis=axis)
    name = "qkvu"[which]
    with pytest.raises(ValueError, match=rf"{name} has {label}="):
      self.call(*args)

  def test_integer_dtype(self):
    q, k, v, u = self.args
    with pytest.raises(TypeError, match="v must have a floating dtype"):
      self.call(q, k, v.astype(np.int32), u)

  @pytest.mark.parametrize("lam0", [0.0, -1.0, float("nan")])
  def test_lam0(self, lam0):
    with pytest.raises(ValueError, match="lam0 must be a finite number > 0"):
      self.call(lam0=lam0)

  @pytest.mark.parametrize("lam0", ["1", True, np.ones(2)])
  def test_lam0_type(self, lam0):
    with pytest.raises(ValueError, match="lam0 must be a real number"):
      self.call(lam0=lam0)

  def test_unused_lam0_is_still_checked(self):
    """With an initial state and no segment_ids lam0 is unused, but a lam0 that is not a
    number > 0 is a mistake all the same (op and step); the float32 floor, a limit of the
    arithmetic, applies only where lam0 is used."""
    state = initial_vla_state(1, 2, 4, 3)
    tokens = [x[:, 0] for x in self.args]
    for lam0, match in (("abc", "lam0 must be a real number"),
                        (-1.0, "lam0 must be a finite number > 0")):
      with pytest.raises(ValueError, match=match):
        self.call(lam0=lam0, initial_state=state)
      with pytest.raises(ValueError, match=match):
        vla_step(state, *tokens, lam0=lam0)
    jax.eval_shape(lambda: (self.call(lam0=1e-8, initial_state=state, impl="scan"),
                            vla_step(state, *tokens, lam0=1e-8)))   # traced, not compiled

  @pytest.mark.parametrize("impl", ["scan", "associative_scan", "chunked", "pallas"])
  def test_lam0_below_the_float32_minimum(self, impl):
    low = MIN_LAM0_FLOAT32[impl]
    with pytest.raises(ValueError, match=rf"lam0={low / 10:g} is below {low:g}, the smallest "
                                         rf"impl='{impl}' takes in float32"):
      self.call(lam0=low / 10, impl=impl)

  @pytest.mark.parametrize("chunk_size", [8, 48, 512, 64.0])
  def test_chunk_size(self, chunk_size):
    with pytest.raises(ValueError, match=r"chunk_size must be a power of two in \[16, 256\]"):
      self.call(chunk_size=chunk_size)

  def test_unknown_impl(self):
    with pytest.raises(ValueError, match="impl must be one of"):
      self.call(impl="fast")

  def test_initial_state_shape(self):
    bad = VLAState(S=jnp.zeros((1, 2, 4, 4)), A=jnp.zeros((1, 2, 4, 4)))
    with pytest.raises(ValueError, match=r"initial_state.S must have shape \(1, 2, 3, 4\)"):
      self.call(initial_state=bad)

  def test_initial_state_type(self):
    with pytest.raises(TypeError, match="initial_state must be a VLAState"):
      self.call(initial_state=(jnp.zeros((1, 2, 3, 4)), jnp.zeros((1, 2, 4, 4))))
    for bad in ({"S": 0, "A": 0}, jnp.zeros((1, 2, 3, 4))):  # checked before any use
      with pytest.raises(TypeError, match="initial_state must be a VLAState"):
        self.call(initial_state=bad)

  def test_numpy_float64_without_x64_computes_in_float32_quietly(self):
    """NumPy float64 inputs outside x64 mode: float32 results and states, and none of JAX's
    "float64 not available" warnings. Traced, not run: the ops see the NumPy arrays
    themselves (closed over, not jit arguments), and both the dtypes and the warnings are
    decided when an operation is traced (run eagerly, each operation compiled on its own:
    seconds)."""
    q, k, v, u = (np.asarray(x, np.float64) for x in self.args)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      (o, state), (o_t, _) = jax.eval_shape(lambda: (
          vla_recurrence(q, k, v, u), vla_step(None, q[:, 0], k[:, 0], v[:, 0], u[:, 0])))
    chex.assert_type([o, state.S, state.A, o_t], jnp.float32)

  def test_state_dtype_is_float32_or_float64(self):
    """One rule for sequence ops and steps: a bfloat16 state is refused, not upcast."""
    state = initial_vla_state(1, 2, 4, 3)
    bf16 = VLAState(S=state.S.astype(jnp.bfloat16), A=state.A)
    with pytest.raises(TypeError, match="initial_state.S must be float32 or float64"):
      self.call(initial_state=bf16)
    with pytest.raises(TypeError, match="state.S must be float32 or float64"):
      vla_step(bf16, *(x[:, 0] for x in self.args))
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
      initial_vla_state(1, 2, 4, 3, dtype=jnp.int32)

  @pytest.mark.parametrize("arg,sizes,got", [("batch", (-2, 2, 4, 3), "int -2"),
                                             ("batch", (2.0, 2, 4, 3), "float 2.0"),
                                             ("dv", (1, 2, 4, "3"), "str '3'")])
  def test_initial_state_sizes(self, arg, sizes, got):
    with pytest.raises(ValueError, match=rf"^{arg} must be an int >= 0; got {got}$"):
      initial_vla_state(*sizes)

  def test_unknown_impl_fails_before_tracing_under_grad(self):
    q, k, v, u = self.args
    with pytest.raises(ValueError, match="impl must be one of"):
      jax.grad(lambda q: vla_recurrence(q, k, v, u, impl="nope")[0].sum())(q)


def test_forward_mode_of_scan_matches_reverse_mode_of_chunked(x64):
  """Forward mode (jax.jvp) works with impl="scan"; "chunked" (custom VJP) is reverse-mode
  only, and its gradient projected on the tangent equals scan's directional derivative."""
  B, T, H, dk, dv = GRAD_SHAPE
  args = random_inputs(31, B, T, H, dk, dv) + _initial_state(32, B, H, dk, dv)
  tangents = random_inputs(33, B, T, H, dk, dv) + _initial_state(34, B, H, dk, dv)
  tangents = tangents[:5] + (0.5 * (tangents[5] + np.swapaxes(tangents[5], -1, -2)),)
  # Jitted: one program each rather than one eager dispatch (and compilation) per operation.
  _, jvp_scan = jax.jit(lambda a, t: jax.jvp(_loss("scan"), a, t))(args, tangents)
  grads = _grad("chunked")(*args)
  projected = sum(np.vdot(np.asarray(g), t) for g, t in zip(grads, tangents))
  assert rel_err(projected, jvp_scan) < 1e-9, (projected, jvp_scan)
  with pytest.raises(TypeError, match="custom_vjp"):   # when traced (nothing compiles)
    jax.jit(lambda a, t: jax.jvp(_loss("chunked"), a, t))(args, tangents)


# A learned write strength beta [B, T, H]: S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) a_t^T.

def _beta(seed, B, T, H, dtype=np.float64):
  return np.random.default_rng(seed).uniform(0.05, 1.0, (B, T, H)).astype(dtype)


@pytest.mark.parametrize("impl", IMPLS)
def test_beta_matches_oracle_float64(x64, impl):
  """Every XLA form with a write strength: the float64 oracle's outputs and state, T not a
  multiple of the chunk, dk > dv; a zero-key token with beta = NaN writes nothing."""
  B, T, H, dk, dv = 2, 37, 2, 8, 5
  q, k, v, u = random_inputs(41, B, T, H, dk, dv)
  beta = _beta(42, B, T, H)
  k[:, 9], u[:, 9] = 0.0, 0.0
  o_ref, S_ref, A_ref = oracles.vla(q, k, v, u, lam0=0.5, beta=beta)
  beta[:, 9] = np.nan
  o, state = jax.jit(functools.partial(vla_recurrence, impl=impl, chunk_size=16, lam0=0.5))(
      q, k, v, u, beta)
  assert rel_err(o, o_ref) < TOL[np.float64]
  assert rel_err(state.S, S_ref) < TOL[np.float64]
  assert rel_err(state.A, A_ref) < TOL[np.float64]
  # beta = 1 is the recurrence without beta, and beta changes the outputs.
  assert rel_err(o, oracles.vla(q, k, v, u, lam0=0.5)[0]) > 1e-2


def test_beta_float32_chunked_matches_oracle():
  q, k, v, u = random_inputs(43, 1, 45, 2, 16, 8, np.float32)
  beta = _beta(44, 1, 45, 2, np.float32)
  o, state = jax.jit(functools.partial(vla_recurrence, impl="chunked", chunk_size=16))(
      q, k, v, u, beta)
  o_ref, S_ref, _ = oracles.vla(q, k, v, u, beta=beta)
  assert rel_err(o, o_ref) < TOL[np.float32]
  assert rel_err(state.S, S_ref) < TOL[np.float32]


def _beta_loss(impl):
  def loss(q, k, v, u, beta):
    o, st = vla_recurrence(q, k, v, u, beta, impl=impl, chunk_size=16)
    w = jnp.sin(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape))
    return jnp.sum(w * o) + jnp.sum(jnp.cos(st.S))
  return loss


def test_beta_gradients_agree_across_impls_and_with_finite_differences(x64):
  """d/d(q, k, v, u, beta) of "chunked" (its own backward, two chunks) equal scan's, and
  scan's equal finite differences (a smaller shape). (The associative scan's beta is the
  same product as scan's: its forward against the oracle is enough.)"""
  B, T, H, dk, dv = GRAD_SHAPE
  args = random_inputs(45, B, T, H, dk, dv) + (_beta(46, B, T, H),)
  grads = {impl: jax.jit(jax.grad(_beta_loss(impl), argnums=tuple(range(5))))(*args)
           for impl in ("scan", "chunked")}
  for impl in ("chunked",):
    for name, g, g_ref in zip(["q", "k", "v", "u", "beta"], grads[impl], grads["scan"]):
      assert rel_err(g, g_ref) < 1e-9, (impl, name, rel_err(g, g_ref))
  assert float(np.abs(grads["scan"][4]).min()) > 0
  small = random_inputs(47, 1, 6, 1, 3, 2) + (_beta(48, 1, 6, 1),)
  check_grads(jax.jit(_beta_loss("scan")), small, order=1, modes=("rev",), atol=1e-6,
              rtol=1e-6)


def test_beta_is_checked():
  q, k, v, u = random_inputs(0, 1, 8, 2, 16, 16, np.float32)
  with pytest.raises(ValueError, match=r"beta must have rank 3 \[B, T, H\]"):
    vla_recurrence(q, k, v, u, q)
  with pytest.raises(ValueError, match="beta has T=4"):
    vla_recurrence(q, k, v, u, _beta(0, 1, 4, 2, np.float32))
