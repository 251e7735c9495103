"""The state path as Mosaic GPU kernels (`vla_jax.kernels.state_path_mosaic`) on CPU.

The kernels run in Mosaic GPU interpret mode. It multiplies float32 operands exactly (no TF32),
so the float32 path is checked against float64 at float32 accuracy, and the TF32 splitting of
precision=HIGHEST on its own under simulated TF32 truncation; it multiplies bfloat16 operands
exactly too, as a GPU does, so the bfloat16 kernels (bfloat16 pieces, float32 accumulation)
compute here what they compute on a GPU. References: the float64 NumPy oracle
`oracles.delta_rule`; gradients against `jax.grad` of `delta_rule_scan` in float64. Interpret
mode takes wgmma's left operands from shared memory only, so there the bfloat16 kernels stage
the operands they compute through shared memory (compiled, they pass them in registers). The
same code is lowered for an abstract NVIDIA H200, which runs Mosaic GPU's own passes (layout
inference, wgmma and TMA lowering, the shared-memory check) but not ptxas: that needs a GPU
(experiments/check_kernels.py --backends=mosaic).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from vla_jax.kernels.lowering import lower_for_h200
from vla_jax.kernels.state_path_mosaic import (
    PIECES, SMEM_LIMIT, buffer_plan, chain_slots, chain_smem_bytes, out_smem_bytes,
    pick_chunk_size, prep_smem_bytes, smem_bytes, state_path_mosaic, tf32_split)
from vla_jax.ops.delta_rule import delta_rule_scan

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(seed, B, T, H, dk, dv, correlated=False):
  """Unit erase and write keys; correlated=True draws them near one 4-dim subspace, so the
  chunks' (I + strictly_lower(E W^T)) are far from the identity (ill-conditioned factors)."""
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, T, H, dk))
  if correlated:
    basis = rng.standard_normal((4, dk))
    e, w = (rng.standard_normal((B, T, H, 4)) @ basis + 0.1 * rng.standard_normal((B, T, H, dk))
            for _ in range(2))
  else:
    e, w = (rng.standard_normal((B, T, H, dk)) for _ in range(2))
  v = rng.standard_normal((B, T, H, dv))
  S0 = rng.standard_normal((B, H, dv, dk)) / 4
  return q, _unit(e), _unit(w), v, S0


def _rel(actual, expected):
  actual, expected = (np.asarray(x, np.float64) for x in (actual, expected))
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _weighted(fn, wo, wS):
  def loss(*args):
    o, S = fn(*args)
    return jnp.sum(wo * o.astype(wo.dtype)) + jnp.sum(wS * S.astype(wS.dtype))
  return loss


@pytest.mark.parametrize("dtype,precision,B,H", [
    (jnp.float32, "highest", 1, 1),    # float32 path: XLA factors, three-product TF32 chain
    (jnp.bfloat16, "default", 1, 2),   # bfloat16 kernels; two heads read in place
])
def test_forward_and_gradients_match_float64(x64, dtype, precision, B, H):
  """T = 100: two chunks of 64, the second padded. Keys near a 4-dim subspace: the chunks'
  (I + strictly_lower(E W^T)) are far from the identity (ill-conditioned factors; with one
  bfloat16 piece per computed operand o is 18% off here, offline)."""
  T, d = 100, 64
  args = _inputs(3, B, T, H, d, d, correlated=True)
  lowp = tuple(jnp.asarray(x, dtype) for x in args[:4]) + (jnp.asarray(args[4], jnp.float32),)
  # The reference sees the inputs as rounded to `dtype`.
  exact = tuple(np.asarray(x, np.float64) for x in lowp)
  fn = lambda *a: state_path_mosaic(*a, precision=precision, interpret=True)
  o, S = jax.jit(fn)(*lowp)
  chex.assert_shape(o, (B, T, H, d))
  chex.assert_type(o, dtype)
  chex.assert_type(S, jnp.float32)
  o_ref, S_ref = oracles.delta_rule(*exact)
  # bfloat16 o: its own rounding is ~2e-3; S_T is float32, from two-piece products.
  assert _rel(o, o_ref) < TOL[dtype], _rel(o, o_ref)
  assert _rel(S, S_ref) < (1e-5 if dtype == jnp.float32 else 1e-3), _rel(S, S_ref)

  rng = np.random.default_rng(4)
  wo, wS = jnp.asarray(rng.standard_normal((B, T, H, d))), jnp.asarray(
      rng.standard_normal((B, H, d, d)))
  grads = jax.jit(jax.grad(_weighted(fn, wo, wS), argnums=range(5)))(*lowp)
  scan = lambda q, e, w, v, S0: delta_rule_scan(q, e, w, v, None, S0)
  want = jax.jit(jax.grad(_weighted(scan, wo, wS), argnums=range(5)))(*map(jnp.asarray, exact))
  for name, g, x, gw in zip(("q", "e", "w", "v", "S0"), grads, lowp, want):
    chex.assert_type(g, x.dtype)
    assert _rel(g, gw) < TOL[dtype], (name, _rel(g, gw))


def test_mixed_head_dims_forward(x64):
  """bfloat16 kernels at dk = 128, dv = 64 (K = 128 products) and dk = 64, dv = 128 (two
  64-row blocks of the state and of the output columns); one chunk, two sequences each."""
  for dk, dv in ((128, 64), (64, 128)):
    args = _inputs(dk + dv, 2, 64, 1, dk, dv)
    bf = (tuple(jnp.asarray(x, jnp.bfloat16) for x in args[:4])
          + (jnp.asarray(args[4], jnp.float32),))
    o, S = jax.jit(lambda *a: state_path_mosaic(*a, interpret=True))(*bf)
    o_ref, S_ref = oracles.delta_rule(*(np.asarray(x, np.float64) for x in bf))
    assert _rel(o, o_ref) < 1e-2 and _rel(S, S_ref) < 1e-3, (dk, dv, _rel(o, o_ref))


def test_float32_chunk_size_32_forward(x64):
  """The float32 path at dk = 128 with precision=HIGHEST picks 32-token chunks (64 do not fit
  its chain's shared memory); two chunks."""
  assert pick_chunk_size(128, "highest") == 32 and pick_chunk_size(128, None) == 64
  args = _inputs(5, 1, 64, 1, 128, 64)
  x32 = tuple(jnp.asarray(x, jnp.float32) for x in args)
  o, S = jax.jit(lambda *a: state_path_mosaic(*a, precision="highest", interpret=True))(*x32)
  o_ref, S_ref = oracles.delta_rule(*(np.asarray(x, np.float64) for x in x32))
  assert _rel(o, o_ref) < 1e-5 and _rel(S, S_ref) < 1e-5


def test_tf32_split_products_are_float32_accurate():
  """On a GPU a wgmma reads float32 operands as TF32 (the 13 low mantissa bits ignored).
  Simulating that, the three-product split of precision=HIGHEST is float32-accurate where one
  TF32 product is not, and the split itself is exact (hi + lo == x, hi exact in TF32)."""
  rng = np.random.default_rng(0)
  a = rng.standard_normal((64, 128)).astype(np.float32)
  b = rng.standard_normal((128, 64)).astype(np.float32)
  tf32 = lambda x: (np.asarray(x).view(np.int32) & np.int32(-(1 << 13))).view(np.float32)
  (a_hi, a_lo), (b_hi, b_lo) = (tuple(map(np.asarray, tf32_split(jnp.asarray(x))))
                                for x in (a, b))
  np.testing.assert_array_equal(a_hi + a_lo, a)
  np.testing.assert_array_equal(tf32(a_hi), a_hi)
  mm = lambda x, y: tf32(x).astype(np.float64) @ tf32(y).astype(np.float64)
  exact = a.astype(np.float64) @ b.astype(np.float64)
  assert _rel(mm(a, b), exact) > 1e-4
  assert _rel(mm(a_hi, b_hi) + mm(a_lo, b_hi) + mm(a_hi, b_lo), exact) < 2e-6


def test_shared_memory_plan():
  """Every supported configuration fits an H200 SM (227 KiB): the float32 chain (two buffers
  per product input in the default precision) and the three bfloat16 kernels (the chain
  double-buffered)."""
  for dk in (64, 128):
    for precision in ("default", "highest"):
      C = pick_chunk_size(dk, precision)
      split = precision == "highest"
      plan = buffer_plan(dk, C, split)
      assert smem_bytes(dk, C, split, plan) <= SMEM_LIMIT
      assert split or plan[0] == 2
    assert chain_slots(dk, PIECES) == 2
    assert chain_smem_bytes(dk, PIECES, 2) <= SMEM_LIMIT
    for dv in (64, 128):
      assert prep_smem_bytes(dk, dv, PIECES) <= SMEM_LIMIT
      assert out_smem_bytes(dk, dv, PIECES, 2) <= SMEM_LIMIT


@pytest.mark.parametrize("d,dtype,precision,kernels", [
    (128, jnp.bfloat16, "default", (3, 3)),   # prep, chain, outputs / prep, chain, reverse
    (128, jnp.float32, "highest", (1, 2)),    # chain / chain, reverse chain
])
def test_lowers_for_h200(d, dtype, precision, kernels):
  """Forward and gradient lower for an abstract H200 (the gradient does not need o, so the
  bfloat16 output kernel is not in it)."""
  B, T, H = 1, 200, 2
  sds = lambda *s, t=dtype: jax.ShapeDtypeStruct(s, t)
  args = (sds(B, T, H, d),) * 4 + (sds(B, H, d, d, t=jnp.float32),)
  fn = lambda *a: state_path_mosaic(*a, precision=precision, interpret=False)
  total = lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in fn(*a))
  assert lower_for_h200(fn, *args).as_text().count("@mosaic_gpu_v2(") == kernels[0]
  grad = lambda *a: jax.grad(total, argnums=range(5))(*a)
  assert lower_for_h200(grad, *args).as_text().count("@mosaic_gpu_v2(") == kernels[1]


def test_bad_inputs_raise_clear_errors():
  x = jnp.zeros((1, 64, 1, 64), jnp.float32)
  S0 = jnp.zeros((1, 1, 64, 64), jnp.float32)
  run = lambda *a, **k: state_path_mosaic(*a, interpret=True, **k)
  with pytest.raises(ValueError, match="dk and dv must be in"):
    run(*(jnp.zeros((1, 64, 1, 32)),) * 4, jnp.zeros((1, 1, 32, 32)))
  with pytest.raises(ValueError, match="S0 must be"):
    run(x, x, x, x, S0[..., :32])
  with pytest.raises(ValueError, match="v must be"):
    run(x, x, x, x[:, :32], S0)
  with pytest.raises(ValueError, match="chunk_size"):
    run(x, x, x, x, S0, chunk_size=128)
  with pytest.raises(ValueError, match="chunk_size must be None or 64"):
    run(*(x.astype(jnp.bfloat16),) * 4, S0, chunk_size=32)
  with pytest.raises(TypeError, match="float64"):
    run(x.astype(jnp.int32), x, x, x, S0)
  # Compiled on a machine whose device is not a Hopper GPU: a clear error, not a lowering crash.
  with pytest.raises(RuntimeError, match="Hopper"):
    state_path_mosaic(x, x, x, x, S0, interpret=False)
