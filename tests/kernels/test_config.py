"""`KernelConfig` validation and the planning rules of `KernelConfig.plan` (no kernels run)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from vla_jax.kernels import KernelConfig
from vla_jax.kernels.common import BF16
from vla_jax.kernels.config import Target, segments_for

P = jax.lax.Precision
TF32 = jax.lax.DotAlgorithmPreset.TF32_TF32_F32
TF32X3 = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3


def _plan(config=KernelConfig(), low=False, acc=jnp.float32, dk=64, dv=64, BH=128, N=64,
          interpret=False, target=None):
  return config.plan(low=low, acc=acc, dk=dk, dv=dv, BH=BH, N=N, interpret=interpret,
                     target=target)


@pytest.mark.parametrize("kw,dk,dv,match", [
    (dict(chunk_size=8), 16, 16, "chunk_size"), (dict(chunk_size=256), 16, 16, "chunk_size"),
    (dict(chunk_size=48), 16, 16, "chunk_size"), (dict(chunk_size=True), 16, 16, "chunk_size"),
    ({}, 24, 16, "dk"), ({}, 16, 48, "dv"), (dict(block_v=8), 16, 32, "block_v"),
    (dict(block_v=64), 16, 32, "block_v"), (dict(precision="fast"), 16, 16, "precision"),
    (dict(precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32), 16, 16, "precision"),
    (dict(block_factor="cholesky"), 16, 16, "block_factor"),
    (dict(start_inverse="cusolver"), 16, 16, "start_inverse"),
    (dict(penalty_layout="columns"), 16, 16, r"penalty_layout must be None \(the plan's "
                                             r"choice\) or one of \('rows', 'transposed'\); "
                                             r"got 'columns'")])
def test_bad_options_raise(kw, dk, dv, match):
  with pytest.raises(ValueError, match=match):
    KernelConfig(**kw).validate(dk, dv)


def test_precision_takes_jax_names():
  assert KernelConfig().precision == P.DEFAULT
  assert KernelConfig(precision=None).precision == P.DEFAULT
  assert KernelConfig(precision="highest").precision == P.HIGHEST
  assert KernelConfig(precision=P.HIGH).precision == P.HIGH
  assert hash(KernelConfig(precision="highest")) == hash(KernelConfig(precision=P.HIGHEST))


def test_default_products_follow_the_inputs():
  """DEFAULT: bfloat16 operands for bfloat16 inputs, one-pass TF32 for float32; the segment
  starts' inverses and Grams stay about float32 accurate (tf32x3), for bfloat16 u too (its
  bfloat16 Grams drifted on the GPU)."""
  bf = _plan(low=True)
  assert (bf.factor_dot, bf.state_factor_dot, bf.state_apply_dot) == (BF16,) * 3
  assert (bf.inverse_dot, bf.gram_dot) == (TF32X3, TF32X3)
  assert bf.state_dot == P.DEFAULT and bf.low
  assert bf.store == jnp.bfloat16
  f32 = _plan()
  assert (f32.factor_dot, f32.state_factor_dot) == (TF32, TF32)
  assert f32.state_apply_dot == P.DEFAULT and f32.state_dot == P.DEFAULT
  assert (f32.inverse_dot, f32.gram_dot) == (TF32X3, TF32X3) and not f32.low
  assert f32.store == jnp.float32
  # The Newton block factor's products: one TF32 pass for bfloat16 and one-pass TF32 scans.
  assert bf.newton_dot == f32.newton_dot == TF32


def test_the_plans_penalty_forms():
  """Where the config leaves them None: the Newton block factor at every dk; at dk = 128 the
  transposed layout and, for the exact starts of float32 states, the segment starts in the
  kernels (float64 states' direct ones in XLA); at dk <= 64
  the rows layout (and the starts in the kernels, as with every form). A form the config
  names wins at every dk."""
  for low, acc in ((False, jnp.float32), (True, jnp.float32), (False, jnp.float64)):
    for dk in (64, 128):
      plan = _plan(low=low, acc=acc, dk=dk, dv=dk)
      assert plan.block_factor == "newton"
      assert plan.penalty_layout == ("transposed" if dk == 128 else "rows")
      assert plan.inverse_kernel == (dk == 64 or plan.exact_starts), (low, acc, dk)
      assert plan.inverse_kernel == (dk == 64 or acc == jnp.float32), (low, dk)
      forced = KernelConfig(block_factor="elimination", start_inverse="xla",
                            penalty_layout="rows" if dk == 128 else "transposed")
      plan = _plan(forced, low=low, acc=acc, dk=dk, dv=dk)
      assert plan.block_factor == "elimination"
      assert plan.penalty_layout == ("rows" if dk == 128 else "transposed")
      assert plan.inverse_kernel == (dk == 64), (low, acc, dk)
  for p in (P.DEFAULT, P.HIGH, P.HIGHEST):   # exact starts of float32 inputs: in the kernels
    plan = _plan(KernelConfig(precision=p), dk=128, dv=128)
    assert plan.exact_starts and plan.inverse_kernel and plan.inverse_tile == 32
  assert _plan(KernelConfig(start_inverse="tiles"), acc=jnp.float64, dk=128,
               dv=128).inverse_kernel is False
  assert _plan(KernelConfig(block_factor="newton", start_inverse="tiles",
                            penalty_layout="transposed"), low=True, dk=128,
               dv=128) == _plan(low=True, dk=128, dv=128)
  assert _plan(KernelConfig(start_inverse="tiles"), dk=128, dv=128) == _plan(dk=128, dv=128)
  assert _plan(KernelConfig(start_inverse="xla"), acc=jnp.float64, dk=128, dv=128) == _plan(
      acc=jnp.float64, dk=128, dv=128)


def test_start_inverse_moves_the_dk_128_starts_into_the_kernels():
  """start_inverse="tiles": the segment starts at dk = 128 in the kernels for float32 states
  (float64 ones stay XLA), on 32 x 32 tiles, every other choice as with "xla"; at dk <= 64 it
  changes nothing."""
  tiles = KernelConfig(start_inverse="tiles")
  for low in (False, True):
    xla, kernel = (_plan(cfg, low=low, dk=128, dv=128)
                   for cfg in (KernelConfig(start_inverse="xla"), tiles))
    assert not xla.inverse_kernel and kernel.inverse_kernel and kernel.inverse_tile == 32
    assert not kernel.newton_step
    assert dataclasses.replace(kernel, inverse_kernel=False) == xla
    assert _plan(tiles, low=low) == _plan(KernelConfig(start_inverse="xla"), low=low)
  assert not _plan(tiles, acc=jnp.float64, dk=128, dv=128).inverse_kernel


def test_penalty_layout_is_the_configs_where_named():
  """A penalty layout the config names is the plan's at every head dim."""
  for dk in (16, 128):
    for layout in ("rows", "transposed"):
      plan = _plan(KernelConfig(penalty_layout=layout), low=True, dk=dk, dv=dk)
      assert plan.penalty_layout == layout


@pytest.mark.parametrize("low", [False, True])
def test_highest_makes_every_product_float32(low):
  """HIGHEST: no TF32 and no bfloat16 anywhere, and nothing stored narrower."""
  plan = _plan(KernelConfig(precision=P.HIGHEST), low=low)
  products = (plan.factor_dot, plan.inverse_dot, plan.gram_dot, plan.state_factor_dot,
              plan.state_apply_dot, plan.state_dot, plan.newton_dot)
  assert all(p == P.HIGHEST for p in products), products
  assert not plan.low and plan.store == jnp.float32 and plan.exact_starts


def test_high_is_three_tf32_passes():
  plan = _plan(KernelConfig(precision=P.HIGH), low=True)
  products = (plan.factor_dot, plan.inverse_dot, plan.gram_dot, plan.state_factor_dot,
              plan.state_apply_dot, plan.state_dot, plan.newton_dot)
  assert all(p == TF32X3 for p in products), products
  assert plan.scan_warps == 4   # three-pass products at one warp spill


def test_interpret_and_float64_products():
  """Interpret mode has no TF32 (HIGHEST) but emulates bfloat16; float64 is HIGHEST."""
  assert _plan(interpret=True).factor_dot == P.HIGHEST
  assert _plan(interpret=True, low=True).factor_dot == BF16
  f64 = _plan(acc=jnp.float64, low=True)
  assert f64.factor_dot == P.HIGHEST and f64.inverse_dot == P.HIGHEST and f64.store == jnp.float64


def test_scan_warps_and_segments():
  """1 warp at dk <= 64 for one-pass products, 4 for three-pass, 8 at dk = 128; segments fill
  one wave of 264 * 4 / warps programs."""
  assert _plan(low=True).scan_warps == 1 and _plan().scan_warps == 1
  assert _plan(KernelConfig(precision=P.HIGHEST)).scan_warps == 4
  assert _plan(dk=128, dv=128).scan_warps == 8
  plan = _plan(BH=128, N=64)                  # T = 4096, B = 8, H = 16: 1056 programs / 128
  assert (plan.segment_chunks, plan.segments) == (8, 8)
  plan = _plan(BH=16, N=512)                  # T = 32768, B = 1
  assert (plan.segment_chunks, plan.segments) == (8, 64)
  assert segments_for(128, 64) == 32 and segments_for(16, 512) == 32
  assert segments_for(300, 5) == 5 and segments_for(2, 3) == 1


def test_segment_start_inverses():
  """The Pallas inverse at dk <= 64, XLA at 128 with start_inverse "xla". Exact starts for
  every float32 state (bfloat16 products, one-pass TF32, HIGH, HIGHEST), not for float64; the
  Newton step in the states' dtype only on float64's direct starts, 32 x 32 tiles without
  it."""
  assert _plan().inverse_kernel
  assert not _plan(KernelConfig(start_inverse="xla"), dk=128, dv=128).inverse_kernel
  f32, bf, f64 = _plan(), _plan(low=True), _plan(acc=jnp.float64)
  assert bf.exact_starts and f32.exact_starts and not f64.exact_starts
  assert not f32.newton_step and f32.inverse_tile == 32 and f64.newton_step
  assert not bf.newton_step and bf.inverse_tile == 32
  assert _plan(low=True, dk=16, dv=16).inverse_tile is None
  for p in (P.HIGH, P.HIGHEST):
    for low in (False, True):
      exact = _plan(KernelConfig(precision=p), low=low)
      assert exact.exact_starts and not exact.newton_step and exact.inverse_tile == 32
    assert not _plan(KernelConfig(precision=p), acc=jnp.float64).exact_starts


def test_value_block_and_state_forms():
  """block_v: 16 rows where 32 leaves <= 32 programs; the split forward below 132 programs
  and at dk = 128, the split reverse pass up to 512 programs and at dk = 128."""
  assert _plan(BH=16).block_v == 16          # T = 32768, B = 1, H = 16
  assert _plan(BH=32).block_v == 32 and _plan(BH=128).block_v == 32
  assert _plan(BH=16, dk=128, dv=128).block_v == 32
  assert _plan(KernelConfig(block_v=64), BH=16).block_v == 64
  assert _plan(BH=128).split_output is False and _plan(BH=16).split_output is True
  assert _plan(BH=64, dk=128, dv=128).split_output is True
  assert _plan(BH=128).split_backward and _plan(BH=256).split_backward
  assert not _plan(BH=512).split_backward
  assert _plan(BH=512, dk=128, dv=128).split_backward


def test_chunk_local_vjp_form():
  """One kernel unless float32 operands at head dim 128 (352 KB of shared memory)."""
  assert _plan().fused_vjp and _plan(low=True, dk=128, dv=128).fused_vjp
  assert not _plan(dk=128, dv=128).fused_vjp and not _plan(dk=64, dv=128).fused_vjp
  assert _plan(dk=128, dv=128).adjoint_warps == 8 and _plan().adjoint_warps == 4
  # The row-cotangent kernel with large-gain rows on float32 operands asks for 256 KB of shared
  # memory at 8 warps and dk = 128 (one H100: the launch fails): 4 warps there; bfloat16 keeps 8.
  assert _plan(dk=128, dv=128).guarded_row_warps == 4
  assert _plan(low=True, dk=128, dv=128).guarded_row_warps == 8
  # At HIGH the u-cotangent kernel's three-pass products do not fit in shared memory at
  # dk = 128 (H200): IEEE there; the XLA parts take three passes (one, as XLA runs HIGH, would
  # leave du at ~3e-4).
  P = jax.lax.Precision
  high = KernelConfig(precision=P.HIGH)
  x3 = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
  assert _plan(high, dk=128, dv=128).du_dot == P.HIGHEST
  assert _plan(high).du_dot == x3 and _plan(high).xla_dot == x3
  assert _plan(high, dk=128, dv=128).xla_dot == x3


H200, A100, B200 = Target("NVIDIA H200", (9, 0)), Target("NVIDIA A100", (8, 0)), Target(
    "NVIDIA B200", (10, 0))


def test_kernels_run_from_compute_capability_8():
  """Ampere, Hopper, Blackwell and a GPU of unknown capability plan without error."""
  for target in (A100, H200, B200, Target("AMD gfx90a", None), None):
    assert _plan(low=True, dk=128, dv=128, target=target).chunk_size == 64


@pytest.mark.parametrize("target,match", [(Target("Tesla T4", (7, 5)), ">= 8.0")])
def test_kernels_that_cannot_run_raise(target, match):
  """A compiled call whose kernels cannot run on the target GPU: a RuntimeError naming the
  device and the alternatives, before any kernel is lowered."""
  with pytest.raises(RuntimeError, match=match) as err:
    _plan(KernelConfig(), low=True, target=target)
  assert "impl='chunked'" in str(err.value)
  if target is not None:
    assert target.kind in str(err.value)
