"""The penalty scan (`penalty_scan.py`): the rows A_t khat_t and unit write directions of every
token and A_T, carried through 16-token blocks over segments, against Sherman-Morrison token
by token in float64; in both input layouts, with bfloat16 products, and over one long
segment with ill-conditioned M_t (the safeguards in both penalty layouts,
`KernelConfig.penalty_layout`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import (anisotropic_u, assert_close, isotropic_u, penalty_rows_np, plan_for,
                           rel, unit_np)
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.common import NEWTON_RADIUS
from vla_jax.kernels.config import BLOCK_FACTORS, PENALTY_LAYOUTS
from vla_jax.kernels.penalty_scan import (FAST_GAIN, block_deviations, chunk_start_inverses,
                                          kept_chunk_starts, large_gains, penalty_forward,
                                          unguarded)

B, H, dk, C = 1, 2, 32, 16


def _inputs(seed, T):
  rng = np.random.default_rng(seed)
  k = rng.standard_normal((B, T, H, dk)) * 2
  u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2))
  return k, u, A0


def _reference(k, u, A0):
  heads = lambda x: np.swapaxes(x, 1, 2).reshape(B * H, x.shape[1], dk)
  W, A_T = penalty_rows_np(unit_np(heads(k), 1e-6), heads(u), A0.reshape(B * H, dk, dk))
  return W, A_T


@pytest.mark.parametrize("T,segment_chunks,stride", [(80, 2, 4), (70, 1, 4), (144, 5, 4),
                                                     (80, 2, 1)])
def test_head_major_float64(x64, T, segment_chunks, stride):
  """Unit rows, plain rows and A_T (role "both"); several segments, T not a whole number of
  them (the last segment zero-padded); A kept at every `Plan.chunk_start_stride`-th chunk
  start of each segment (the plan's 4, or every one)."""
  k, u, A0 = _inputs(0, T)
  N = -(-T // C)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dk, B * H, N,
                  segment_chunks=segment_chunks, segments=-(-N // segment_chunks),
                  chunk_start_stride=stride)
  T_pad = N * C
  head = lambda x: jnp.pad(jnp.asarray(np.swapaxes(x, 1, 2)),
                           [(0, 0), (0, 0), (0, T_pad - T), (0, 0)])
  khat = head(unit_np(k, 1e-6))
  a, W, Y, A_chunks, _, A_T = jax.jit(lambda *x: penalty_forward(plan, *x, both=True))(
      khat, head(u), jnp.asarray(A0))
  W_ref, A_ref = _reference(k, u, A0)
  assert_close(W[:, :T], W_ref, jnp.float64, "W")
  assert_close(a[:, :T], unit_np(W_ref, 1e-12), jnp.float64, "a")
  assert_close(A_T, A_ref, jnp.float64, "A_T")
  # The adjoint's residuals: A at every stride-th chunk start of each segment (the others,
  # `chunk_start_inverses`, the kept one less the Woodbury rows' downdates between), and
  # Woodbury rows with A_t = A_c - sum of y_s y_s^T over the chunk's tokens s <= t, so that
  # the chunk's rows are khat A_c - tril(khat Y^T) Y.
  K = kept_chunk_starts(segment_chunks, stride)
  assert A_chunks.shape == (B * H, plan.segments * K, dk, dk)
  kh = np.asarray(khat).reshape(B * H, T_pad, dk)
  starts = np.asarray(chunk_start_inverses(A_chunks, Y, plan, N))
  for n in range(N):
    A_n = (A0.reshape(B * H, dk, dk) if n == 0
           else _reference(k[:, :n * C], u[:, :n * C], A0)[1])
    if n % segment_chunks % stride == 0:
      kept = n // segment_chunks * K + n % segment_chunks // stride
      assert_close(A_chunks[:, kept], A_n, jnp.float64, f"A kept at chunk {n}")
    assert_close(starts[:, n], A_n, jnp.float64, f"A at chunk {n}")
    rows = slice(n * C, (n + 1) * C)
    Yc, Kc = np.asarray(Y[:, rows]), kh[:, rows]
    W_c = Kc @ starts[:, n] - np.tril(Kc @ np.swapaxes(Yc, 1, 2)) @ Yc
    assert_close(W_c[:, :max(0, min(C, T - n * C))], W_ref[:, rows], jnp.float64,
                 f"rows from chunk {n}'s residuals")


def test_token_major_raw_keys_bfloat16():
  """The bfloat16 inference default: raw keys and u read in place as [B, T, H, dk], unit keys
  made in the kernel, bfloat16 product operands and rows."""
  T = 64
  k, u, A0 = _inputs(1, T)
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dk, B * H, T // C,
                  segment_chunks=2, segments=2)
  a, A_T = jax.jit(lambda *x: penalty_forward(plan, *x, token_major=True,
                                              rows_dtype=plan.store))(
      bf(k), bf(u), jnp.asarray(A0, jnp.float32))
  assert a.dtype == jnp.bfloat16
  W_ref, A_ref = _reference(np.asarray(bf(k), np.float64), np.asarray(bf(u), np.float64), A0)
  assert_close(a, unit_np(W_ref, 1e-12), jnp.bfloat16, "a")
  assert_close(A_T, A_ref, jnp.bfloat16, "A_T")


@pytest.mark.parametrize("layout", PENALTY_LAYOUTS)
def test_non_finite_u_reaches_later_rows_only(layout):
  """A NaN in u at token 21 (block 1 holds tokens 16..31): rows before it unchanged, rows from
  it on and A_T non-finite; in both penalty layouts (`KernelConfig.penalty_layout`)."""
  T = 48
  k, u, A0 = _inputs(2, T)
  plan = plan_for(KernelConfig(chunk_size=C, penalty_layout=layout), np.float32, dk, dk, B * H,
                  T // C, segment_chunks=3, segments=1)
  head = lambda x: jnp.asarray(np.swapaxes(x, 1, 2), jnp.float32)
  fn = jax.jit(lambda *x: penalty_forward(plan, *x))
  a, A_T = fn(head(unit_np(k, 1e-6)), head(u), jnp.asarray(A0, jnp.float32))
  u_bad = u.copy()
  u_bad[0, 21, 0, 3] = np.nan
  a_n, A_n = fn(head(unit_np(k, 1e-6)), head(u_bad), jnp.asarray(A0, jnp.float32))
  np.testing.assert_array_equal(a_n[0, :21], a[0, :21])
  np.testing.assert_array_equal(a_n[1], a[1])
  assert not np.isfinite(np.asarray(a_n[0, 21:])).any()
  assert not np.isfinite(np.asarray(A_n[0])).any()


@pytest.mark.parametrize("layout", PENALTY_LAYOUTS)
def test_bfloat16_one_long_segment_anisotropic_u(layout):
  """bfloat16 products over one segment of 2048 tokens (the plan at >= 1056 sequences, e.g.
  B * H = 1024 at T = 4096), d = 16, unit-norm u: with u in 4 dominant directions M_t is
  ill-conditioned (A's entries ~1 / lam0, its dominant-direction eigenvalues ~4 / t); the unit
  rows stay finite and within 1.5x of isotropic u's error at lam0 = 0.1 and 1, in both penalty
  layouts. The carried A as one bfloat16 operand (rounded by 2^-9 of its largest entries in
  every product) drove the small eigenvalues negative: NaN rows from token 1040 (1346 in the
  other head) at lam0 = 0.1 (the transposed layout's left operand A likewise: NaN)."""
  B, H, d, T, C = 1, 2, 16, 2048, 64
  rng = np.random.default_rng(3)
  k = jnp.asarray(rng.standard_normal((B, T, H, d)), jnp.bfloat16)
  plan = plan_for(KernelConfig(chunk_size=C, penalty_layout=layout), jnp.bfloat16, d, d, B * H,
                  T // C, segment_chunks=T // C, segments=1)
  fn = jax.jit(lambda *x: penalty_forward(plan, *x, token_major=True,
                                          rows_dtype=jnp.float32))
  heads = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2).reshape(B * H, T, d)
  errors = {}
  for kind, make in (("isotropic", isotropic_u), ("anisotropic", anisotropic_u)):
    u = jnp.asarray(np.swapaxes(make(rng, B, H, T, d, norm=1.0), 1, 2), jnp.bfloat16)
    for lam0 in (0.1, 1.0):
      A0 = np.broadcast_to(np.eye(d) / lam0, (B, H, d, d))
      a, _ = fn(k, u, jnp.asarray(A0, jnp.float32))
      W, _ = penalty_rows_np(unit_np(heads(k), 1e-6), heads(u), A0.reshape(B * H, d, d))
      assert np.isfinite(np.asarray(a)).all(), (kind, lam0)
      errors[kind, lam0] = rel(a, unit_np(W, 1e-12))
  for lam0 in (0.1, 1.0):
    assert errors["anisotropic", lam0] <= 1.5 * errors["isotropic", lam0], errors
  assert max(errors.values()) < 1e-2, errors


@pytest.mark.parametrize("factor", BLOCK_FACTORS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32_highest"])
def test_block_factors(x64, dtype, factor):
  """Both block factors against the float64 oracle: unit-norm anisotropic u from A0 = 10 I
  (lam0 = 0.1), so that the early blocks' ||G - I||_F exceed NEWTON_RADIUS (where "newton"
  takes the elimination) and the later ones do not (its Newton steps); two segments.
  `block_deviations` (from the scan's residuals) gives the oracle's ||U A U^T||_F of every
  block."""
  T, b = 192, 16
  rng = np.random.default_rng(4)
  k = rng.standard_normal((B, T, H, dk))
  u = np.swapaxes(anisotropic_u(rng, B, H, T, dk, norm=1.0), 1, 2)
  A0 = np.broadcast_to(10 * np.eye(dk), (B, H, dk, dk))
  N = T // C
  cfg = KernelConfig(chunk_size=C, precision=jax.lax.Precision.HIGHEST, block_factor=factor)
  plan = plan_for(cfg, dtype, dk, dk, B * H, N, segment_chunks=N // 2, segments=2)
  head = lambda x: jnp.asarray(np.swapaxes(x, 1, 2), dtype)
  a, W, Y, A_chunks, _, A_T = jax.jit(lambda *x: penalty_forward(plan, *x, both=True))(
      head(unit_np(k, 1e-6)), head(u), jnp.asarray(A0, dtype))
  W_ref, A_ref = _reference(k, u, A0)
  assert_close(W, W_ref, dtype, "W")
  assert_close(a, unit_np(W_ref, 1e-12), dtype, "a")
  assert_close(A_T, A_ref, dtype, "A_T")
  if factor != "newton":
    return
  dev = np.asarray(block_deviations(head(u).reshape(B * H, T, dk), Y, A_chunks, plan))
  U = np.swapaxes(u, 1, 2).reshape(B * H, T, dk)
  want = [[np.linalg.norm(U[i, j:j + b] @ (A0[0, 0] if j == 0 else _reference(
      k[:, :j], u[:, :j], A0)[1][i]) @ U[i, j:j + b].T) for j in range(0, T, b)]
      for i in range(B * H)]
  np.testing.assert_allclose(dev, want, rtol=1e-4)
  assert (dev > NEWTON_RADIUS).any() and (dev <= NEWTON_RADIUS).any(), dev


@pytest.mark.parametrize("layout", PENALTY_LAYOUTS)
@pytest.mark.parametrize("lam0,norm", [(0.1, 4.0), (0.01, 1.0)], ids=["u4_lam0.1", "u1_lam0.01"])
def test_bfloat16_large_penalty_gains(lam0, norm, layout):
  """bfloat16 products over one segment of 256 tokens from A0 = I / lam0, d = 16, isotropic
  u: the first blocks' penalty gains u^T A u reach |u|^2 / lam0 = 160 and 100, so each shrinks
  A by ~100x along its u, more than bfloat16 products resolve (2^-9 of A's entries). Those
  blocks take three-pass products (interpret mode: float32; `penalty_scan.GAIN_LIMIT`): the
  unit rows stay finite, within 1e-2 of float64 (2.3e-3 measured), and the first 64 tokens
  within 2x of the rest. With bfloat16 products throughout the downdates drove A indefinite:
  errors of 0.4 and 0.5 over the first 64 tokens, NaN rows from token 26 and 67 (as the GPU's
  drift check at d = 64, |u| = 8, lam0 = 0.1: NaN from its 256-token first segment on); in
  both penalty layouts (the transposed one without the three-pass blocks: NaN too)."""
  B, H, d, T, C = 1, 2, 16, 256, 64
  rng = np.random.default_rng(5)
  k = jnp.asarray(rng.standard_normal((B, T, H, d)), jnp.bfloat16)
  u = jnp.asarray(np.swapaxes(isotropic_u(rng, B, H, T, d, norm=norm), 1, 2), jnp.bfloat16)
  A0 = np.broadcast_to(np.eye(d) / lam0, (B, H, d, d))
  plan = plan_for(KernelConfig(chunk_size=C, penalty_layout=layout), jnp.bfloat16, d, d, B * H,
                  T // C, segment_chunks=T // C, segments=1)
  assert plan.accurate_dot is not None
  a, A_T = jax.jit(lambda *x: penalty_forward(plan, *x, token_major=True,
                                              rows_dtype=jnp.float32))(
      k, u, jnp.asarray(A0, jnp.float32))
  heads = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2).reshape(B * H, T, d)
  W, A_ref = penalty_rows_np(unit_np(heads(k), 1e-6), heads(u), A0.reshape(B * H, d, d))
  want = unit_np(W, 1e-12)
  assert np.isfinite(np.asarray(a)).all() and np.isfinite(np.asarray(A_T)).all()
  early, late = rel(a[:, :64], want[:, :64]), rel(a[:, 64:], want[:, 64:])
  assert max(early, late) < 1e-2 and early < 2 * late, (early, late)
  assert rel(A_T, A_ref) < 1e-2


def test_the_large_gain_blocks_run_only_where_gains_may_reach_them():
  """`large_gains` bounds every gain u_t^T A_t u_t by max |u_t|^2 times A_0's largest absolute
  row sum (or `reset`): at the layer's defaults (unit u, A_0 = I, bfloat16) the scan runs
  without the large-gain blocks, bit for bit as the unguarded plan; at |u| = 2 with the guarded
  one (the unguarded scan's rows differ there). Under vmap the choice stays one cond (a batched
  predicate would turn it into a select that runs both scans)."""
  B, H, d, T, C = 2, 2, 16, 128, 32
  rng = np.random.default_rng(3)
  k = jnp.asarray(rng.standard_normal((B, T, H, d)), jnp.bfloat16)
  u = rng.standard_normal((B, T, H, d))
  u = jnp.asarray(u / np.linalg.norm(u, axis=-1, keepdims=True), jnp.bfloat16)
  A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H, d, d))
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, d, d, B * H, T // C,
                  segment_chunks=T // C, segments=1)
  assert plan.accurate_dot is not None
  run = lambda plan, u, A0: jax.jit(lambda *x: penalty_forward(
      plan, *x, token_major=True, rows_dtype=jnp.float32))(k, u, A0)
  assert not large_gains(u, A0) and large_gains(u, A0 * (FAST_GAIN + 0.1))
  assert large_gains(u, A0, reset=2.0) and large_gains(2 * u, A0)
  v = np.ones(d)
  v[0] = 3.0
  v /= np.linalg.norm(v)
  shrunk = jnp.asarray(np.outer(v, v) + 1e-3 * np.eye(d), jnp.float32)   # row sum 2.25, trace 1.02
  assert not large_gains(u, shrunk) and large_gains(u, 1.1 * shrunk)
  for got, want in zip(run(plan, u, A0), run(unguarded(plan), u, A0)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  guarded, fast = run(plan, 2 * u, A0), run(unguarded(plan), 2 * u, A0)
  assert not np.array_equal(np.asarray(guarded[0]), np.asarray(fast[0]))
  batched = jax.make_jaxpr(jax.vmap(lambda u: penalty_forward(
      plan, k, u, A0, token_major=True, rows_dtype=jnp.float32)))(jnp.stack([u, 2 * u]))
  conds = [e for e in batched.jaxpr.eqns if e.primitive.name == "cond"]
  assert len(conds) == 1 and conds[0].invars[0].aval.shape == (), batched
