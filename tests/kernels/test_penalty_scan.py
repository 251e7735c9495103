"""Tests of the sequential penalty kernel (`vla_jax.kernels.penalty_scan`, KernelConfig
prep="scan") on CPU: Pallas interpret mode against the float64 NumPy oracle of
tests/test_kernels.py, with one segment (A carried through the whole sequence) and several
(A inverted in XLA at segment starts), and lowering for an abstract NVIDIA H200."""

import chex
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from test_chunk_prep import _lower
from test_kernels import TOL, _inputs, _oracle, _rel, shape_id
from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels.lowering import lower_for_h200
from vla_jax.kernels.penalty_scan import (forward_scan_warps, penalty_scan, scan_warps,
                                          segment_layout, segments_for)

HI = jax.lax.Precision.HIGHEST


@pytest.mark.parametrize("shape,segment_chunks,block", [
    ((2, 37, 2, 16, 32, 16), None, 16), ((1, 70, 1, 32, 32, 32), 1, 16),
    ((1, 90, 2, 32, 16, 32), 2, 32), ((1, 40, 1, 64, 16, 16), 3, 16)],
    ids=lambda x: shape_id(x) if isinstance(x, tuple) else str(x))
def test_forward_matches_oracle_float64(x64, shape, segment_chunks, block):
  """T not a multiple of the chunk or of the segment: padding with zero k and u is exact."""
  B, T, H, dk, dv, C = shape
  args = _inputs(30, B, T, H, dk, dv)
  cfg = KernelConfig(chunk_size=C, block_v=16, precision=jax.lax.Precision.HIGHEST,
                     prep="scan", segment_chunks=segment_chunks, scan_block=block)
  got = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(
      *(jnp.asarray(x) for x in args))
  assert got[0].shape == (B, T, H, dv)
  for name, g, w in zip("oSA", got, _oracle(*args)):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))


def test_forward_float32_matches_oracle():
  B, T, H, dk, dv, C = 1, 75, 2, 32, 32, 32
  args = _inputs(31, B, T, H, dk, dv)
  cfg = KernelConfig(chunk_size=C, precision=jax.lax.Precision.HIGHEST, prep="scan",
                     segment_chunks=1)
  got = vla_pallas(*(jnp.asarray(x, jnp.float32) for x in args), config=cfg, interpret=True)
  for name, g, w in zip("oSA", got, _oracle(*args)):
    assert _rel(g, w) < TOL[np.float32], (name, _rel(g, w))


def test_gradients_are_the_xla_paths():
  """Under differentiation prep="scan" runs the XLA path (same custom VJP as prep="split")."""
  B, T, H, dk, dv, C = 1, 40, 1, 16, 16, 16
  args = [jnp.asarray(x, jnp.float32) for x in _inputs(32, B, T, H, dk, dv)]
  loss = lambda cfg: jax.jit(jax.grad(
      lambda *a: jnp.sum(vla_pallas(*a, config=cfg, interpret=True)[0]), argnums=range(4)))(*args)
  base = dict(chunk_size=C, precision=jax.lax.Precision.HIGHEST)
  for g, w in zip(loss(KernelConfig(prep="scan", **base)), loss(KernelConfig(**base))):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_segments_for_fills_one_wave():
  assert segments_for(128, 64) == 32            # 2 segments: 256 programs, one wave of 264
  assert segments_for(512, 64) == 64            # B * H alone fills the GPU: one segment
  assert segments_for(16, 512) == 32            # B = 1, 16 heads: 16 segments
  assert segments_for(16, 4) == 1               # never fewer than one chunk per segment


def test_forward_scan_warps_and_segments():
  """One-pass TF32 at dk <= 64: 1-warp programs, four times the segments; the differentiated
  path (`scan_warps`) keeps 4 warps and the 4-warp layout."""
  cfg = KernelConfig()                                   # precision DEFAULT: factor_dot "tf32"
  assert cfg.factor_dot == "tf32" and forward_scan_warps(cfg, 64) == 1
  assert scan_warps(cfg, 64) == 4 and forward_scan_warps(cfg, 128) == 8
  hi = KernelConfig(precision=jax.lax.Precision.HIGHEST)           # tf32x3: 1 warp spills
  assert forward_scan_warps(hi, 64) == 4
  assert forward_scan_warps(KernelConfig(scan_warps=2), 64) == 2
  assert segment_layout(cfg, 128, 64, 1) == (8, 8 * 64)          # T = 4096, B = 8: 8 segments
  assert segment_layout(cfg, 128, 64, 4) == (2, 32 * 64)
  assert segment_layout(cfg, 128, 64, 8) == (1, 64 * 64)         # dk = 128: one per SM
  assert segment_layout(cfg, 16, 512, 8) == (8, 64 * 64)         # T = 32768, B = 1
  assert segment_layout(KernelConfig(segment_chunks=16), 128, 64, 1) == (4, 16 * 64)
  with pytest.raises(ValueError, match="scan_warps"):
    KernelConfig(scan_warps=3).validate(64, 64)


def test_prefetch_is_the_same_function(x64):
  """The prefetching loop (rows of block j + 1 loaded before block j's products) computes
  exactly what the plain loop computes, the last block included."""
  B, T, H, dk, dv, C = 1, 70, 2, 16, 16, 16
  args = [jnp.asarray(x) for x in _inputs(33, B, T, H, dk, dv)]
  run = lambda p: vla_pallas(*args, config=KernelConfig(
      chunk_size=C, prep="scan", scan_prefetch=p, segment_chunks=2,
      precision=jax.lax.Precision.HIGHEST), interpret=True)
  for g, w in zip(run(True), run(False)):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("kw,match", [(dict(scan_block=8), "scan_block"),
                                      (dict(scan_block=64, chunk_size=32), "scan_block"),
                                      (dict(segment_chunks=0), "segment_chunks")])
def test_bad_options_raise(kw, match):
  x = jnp.zeros((1, 16, 1, 16))
  with pytest.raises(ValueError, match=match):
    vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
               config=KernelConfig(**{"chunk_size": 16, "prep": "scan", **kw}))


def test_bad_block_for_segment_raises():
  A = jnp.broadcast_to(jnp.eye(16), (1, 1, 16, 16))
  e = jnp.zeros((1, 40, 16))
  with pytest.raises(ValueError, match="block"):
    penalty_scan(A, e, e, block=16, factor_precision=jax.lax.Precision.HIGHEST, interpret=True)


@pytest.mark.parametrize("shape", [(1, 100, 2, 64, 64, 64), (1, 64, 1, 128, 128, 64)],
                         ids=shape_id)
def test_forward_lowers_for_h200(shape):
  text = _lower(shape, jnp.bfloat16, "tf32x3", grad=False, prep="scan")
  # segment_inverse="auto": at dk = 64 (two segments) A0 and the segment starts are inverted
  # by the spd_inverse kernel (the Grams from segment_grams, segment_gram="kernel"), at
  # dk = 128 (one chunk) nothing is.
  inverses = 2 if shape[3] == 64 else 0
  assert text.count('name = "vla_spd_inverse"') == inverses
  assert text.count('name = "vla_segment_grams"') == inverses // 2
  assert text.count("__gpu$xla.gpu.triton") == 3 + inverses + inverses // 2
  assert all(k in text for k in ("vla_penalty_scan", "vla_state_prep", "vla_state_fwd"))


def test_auto_factor_dot_resolves_by_precision(monkeypatch):
  """prep_dot="auto" (the default) gives the penalty kernel bfloat16 products for bfloat16
  inputs and one-pass TF32 ones for float32 inputs at precision=DEFAULT, three-pass
  (float32-accurate) ones at HIGHEST, in the lowered GPU forward and gradient; other preps keep
  tf32x3, and explicit values stay."""
  assert KernelConfig().prep_dot == "auto" and KernelConfig().factor_dot == "tf32"
  hi = jax.lax.Precision.HIGHEST
  assert KernelConfig(precision=hi).factor_dot == "tf32x3"
  assert KernelConfig(prep="split").factor_dot == "tf32x3"
  assert KernelConfig(prep_dot="ieee").factor_dot == "ieee"
  import vla_jax.kernels.penalty_scan as ps
  seen = []

  def spy(*args, **kwargs):
    seen.append(kwargs["factor_precision"])
    return penalty_scan(*args, **kwargs)

  monkeypatch.setattr(ps, "penalty_scan", spy)
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  args = (spec(1, 128, 2, 64), spec(1, 128, 2, 64), spec(1, 128, 2, 64), spec(1, 128, 2, 64),
          f32(1, 2, 64, 64), f32(1, 2, 64, 64))
  f32_args = tuple(f32(*a.shape) for a in args[:4]) + args[4:]
  presets = jax.lax.DotAlgorithmPreset
  for precision, inputs, want in ((jax.lax.Precision.DEFAULT, args, presets.BF16_BF16_F32),
                                  (jax.lax.Precision.DEFAULT, f32_args, presets.TF32_TF32_F32),
                                  (hi, args, presets.TF32_TF32_F32_X3)):
    cfg = KernelConfig(precision=precision)
    fwd = lambda *a: vla_pallas(*a, config=cfg, interpret=False)[0]
    grad = jax.grad(lambda *a: jnp.sum(fwd(*a).astype(jnp.float32)), argnums=range(4))
    seen.clear()
    lower_for_h200(fwd, *inputs)
    lower_for_h200(grad, *inputs)
    assert seen == [want, want], (precision, inputs[0].dtype, seen)


def test_segment_inverse_kernel_matches_oracle_float64(x64):
  """segment_inverse="kernel": the segment-start inverses from the spd_inverse kernel (three
  segments here); forward equal to the oracle, gradients unchanged (the XLA inversions)."""
  B, T, H, dk, dv, C = 1, 90, 2, 32, 16, 16
  args = [jnp.asarray(x) for x in _inputs(33, B, T, H, dk, dv)]
  base = dict(chunk_size=C, precision=jax.lax.Precision.HIGHEST, prep="scan", segment_chunks=2)
  kern = KernelConfig(segment_inverse="kernel", **base)
  got = jax.jit(lambda *a: vla_pallas(*a, config=kern, interpret=True))(*args)
  for name, g, w in zip("oSA", got, _oracle(*(np.asarray(a) for a in args))):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))
  grads = [jax.jit(jax.grad(lambda *a, c=c: jnp.sum(vla_pallas(*a, config=c, interpret=True)[0]),
                            argnums=range(4)))(*args)
           for c in (kern, KernelConfig(**base))]
  for g, w in zip(*grads):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("tile", [16, 32])
def test_tiled_spd_inverse_matches_float64(x64, tile):
  """`split_prep.spd_inverse(tile=)`: the block Cholesky on tile x tile tiles gives M^-1 to
  float64 rounding, with and without the Newton step, at dk = 64 (and dk = 32 at tile 16);
  in float32 on an ill-conditioned M (cond ~1e5) its error is within 2x of the whole-matrix
  form's; and KernelConfig(inverse_tile=) through vla_pallas (three segments) equals the
  oracle."""
  from vla_jax.kernels.split_prep import spd_inverse
  rng = np.random.default_rng(80 + tile)
  for dk in (64, 32) if tile == 16 else (64,):
    X = rng.standard_normal((2, 3, 2 * dk, dk))
    M = np.einsum("bnti,bntj->bnij", X, X) + 0.5 * np.eye(dk)
    want = np.linalg.inv(M)
    for refine in (False, True):
      got = spd_inverse(jnp.asarray(M), refine=refine, factor_precision=HI, interpret=True,
                        tile=tile)
      chex.assert_shape(got, M.shape)
      assert _rel(got, want) < 1e-12, (dk, refine, _rel(got, want))
      np.testing.assert_array_equal(got, np.swapaxes(got, -1, -2))   # symmetric tiles
  Q = np.linalg.qr(rng.standard_normal((64, 64)))[0]
  M = (Q * np.logspace(0, 5, 64)) @ Q.T
  want = np.linalg.inv(M)
  err = lambda t, refine=True: _rel(spd_inverse(jnp.asarray(M[None, None], jnp.float32),
                                                refine=refine, factor_precision=HI,
                                                interpret=True, tile=t)[0, 0], want)
  assert err(tile) < 2 * err(None) + 1e-6, (err(tile), err(None))
  # Without the Newton step (the bf16 default): float32 products gain little from it.
  assert err(tile, False) < 4 * err(None) + 1e-6, (err(tile, False), err(None))
  B, T, H, dv, C = 1, 90, 2, 16, 16
  args = [jnp.asarray(x) for x in _inputs(34, B, T, H, 32, dv)]
  cfg = KernelConfig(chunk_size=C, precision=HI, prep="scan", segment_chunks=2,
                     segment_inverse="kernel", inverse_tile=16)
  got = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*args)
  for name, g, w in zip("oSA", got, _oracle(*(np.asarray(a) for a in args))):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))
  with pytest.raises(ValueError, match="inverse_tile"):
    KernelConfig(inverse_tile=64).validate(64, 64)
  with pytest.raises(ValueError, match="tile"):
    spd_inverse(jnp.asarray(M[None, None, :48, :48]), refine=False, factor_precision=HI,
                interpret=True, tile=32)


@pytest.mark.parametrize("tile", [16, 32])
def test_tiled_spd_inverse_lowers_for_h200(tile):
  """bf16 inputs, d = 64: the forward and gradient with inverse_tile lower for an H200, the two
  spd_inverse launches (A0's and the segment starts') included."""
  for grad in (False, True):
    text = _lower((1, 300, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=grad, prep="scan",
                  segment_chunks=2, inverse_tile=tile)
    assert text.count('name = "vla_spd_inverse"') == 2, grad


def test_segment_inverse_kernel_lowers_and_validates():
  text = _lower((1, 300, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=False, prep="scan",
                segment_chunks=2, segment_inverse="kernel")
  # Two launches: the inverse of A0, then the segment starts.
  assert text.count('name = "vla_spd_inverse"') == 2 and "vla_penalty_scan" in text
  x = jnp.zeros((1, 16, 1, 128))
  for kw, match in (({"segment_inverse": "gpu"}, "segment_inverse"),
                    ({"segment_inverse": "kernel"}, "dk up to 64")):
    with pytest.raises(ValueError, match=match):
      vla_pallas(x, x, x, x, jnp.zeros((1, 1, 128, 128)), jnp.eye(128)[None, None],
                 config=KernelConfig(chunk_size=16, **kw))


@pytest.mark.parametrize("heads", [None, 2])
def test_segment_grams_kernel_equals_xla(x64, heads):
  """`segment_grams`: the per-segment sums of u u^T (segments 0..S-2), head-major and
  token-major read in place, equal the XLA einsum in float64; bf16 u with bf16 products within
  float32 rounding of the exact sums."""
  from vla_jax.kernels.penalty_scan import segment_grams   # pylint: disable=import-outside-toplevel
  B, H, S, L, C, dk = 1, 2, 3, 48, 16, 16
  rng = np.random.default_rng(5)
  u = rng.standard_normal((B, S * L, H, dk))
  want = np.einsum("bslhi,bslhj->bhsij", *(u.reshape(B, S, L, H, dk),) * 2)[:, :, :-1]
  x = jnp.asarray(u if heads else np.swapaxes(u, 1, 2).reshape(B * H, S * L, dk))
  got = segment_grams(x, S, L, chunk_size=C, precision=jax.lax.Precision.HIGHEST,
                      acc=jnp.float64, heads=heads, interpret=True)
  chex.assert_shape(got, (B * H, S - 1, dk, dk))
  np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-12, atol=1e-12)
  ub = jnp.asarray(u, jnp.bfloat16)
  exact = np.einsum("bslhi,bslhj->bhsij",
                    *(np.asarray(ub, np.float64).reshape(B, S, L, H, dk),) * 2)[:, :, :-1]
  got = segment_grams(ub if heads else jnp.swapaxes(ub, 1, 2).reshape(B * H, S * L, dk), S, L,
                      chunk_size=C, precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32,
                      acc=jnp.float32, heads=heads, interpret=True)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got, np.float64).reshape(exact.shape), exact,
                             rtol=1e-5, atol=1e-5)


def test_segment_gram_prefix_takes_bf16_products_with_bf16_factor_dot():
  """The differentiated forward hands the segment Grams u cast to float32: with the bf16-input
  factor products (`factor_dot` "bf16") the Grams take bfloat16 products too. On u whose values
  are bfloat16 values that is exact (float32 sums); other float32 u shows the operands'
  rounding, which tf32x3 products (`factor_dot` "tf32") do not have."""
  from vla_jax.kernels.penalty_scan import _segment_gram_prefix_kernel  # pylint: disable=import-outside-toplevel
  B, H, S, L, C, dk = 1, 2, 3, 32, 16, 16
  rng = np.random.default_rng(8)
  u = rng.standard_normal((B, H, S * L, dk)).astype(np.float32)
  u_bf = np.asarray(jnp.asarray(u, jnp.bfloat16), np.float32)    # bfloat16 values, float32

  def exact(x):
    G = np.einsum("bhsli,bhslj->bhsij", *(x.astype(np.float64).reshape(B, H, S, L, dk),) * 2)
    return np.cumsum(G[:, :, :-1], axis=2)

  def grams(x, prep_dot):
    cfg = KernelConfig(chunk_size=C, prep="scan", prep_dot=prep_dot, interpret=True)
    got = _segment_gram_prefix_kernel(jnp.asarray(x), cfg, S, L, False, jnp.float32)
    chex.assert_shape(got, (B, H, S - 1, dk, dk))
    return np.asarray(got, np.float64)

  rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
  assert rel(grams(u_bf, "bf16"), exact(u_bf)) < 1e-6        # exact products, float32 sums
  assert rel(grams(u, "bf16"), exact(u)) > 1e-4              # operands rounded to bfloat16
  assert rel(grams(u, "tf32x3"), exact(u)) < 1e-6


def test_segment_gram_kernel_option_same_function(x64):
  """KernelConfig(segment_gram="kernel") with the segment-start inverses in the kernel: the
  forward equals the oracle in float64 with three segments, head-major and (bf16-free direct
  layout) token-major, and the adjoint gradient equals the XLA Grams'."""
  B, T, H, dk, dv, C = 1, 90, 2, 32, 16, 16
  args = [jnp.asarray(x) for x in _inputs(34, B, T, H, dk, dv)]
  base = dict(chunk_size=C, precision=jax.lax.Precision.HIGHEST, prep="scan", segment_chunks=2,
              segment_inverse="kernel")
  want = _oracle(*(np.asarray(a) for a in args))
  for layout in ("transposed", "direct"):
    cfg = KernelConfig(segment_gram="kernel", input_layout=layout, **base)
    got = jax.jit(lambda *a, c=cfg: vla_pallas(*a, config=c, interpret=True))(*args)
    for name, g, w in zip("oSA", got, want):
      assert _rel(g, w) < TOL[np.float64], (layout, name, _rel(g, w))
  grads = [jax.jit(jax.grad(lambda *a, c=c: jnp.sum(vla_pallas(*a, config=c, interpret=True)[0]),
                            argnums=range(4)))(*args)
           for c in (KernelConfig(segment_gram="kernel", **base),
                     KernelConfig(segment_gram="xla", **base))]
  for g, w in zip(*grads):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)
  with pytest.raises(ValueError, match="segment_gram"):
    KernelConfig(segment_gram="gpu").validate(16, 16)


def test_segment_gram_kernel_lowers_for_h200():
  """bf16 inputs: the forward (direct layout, the bf16 default: u read in place) and the
  gradient (the adjoint's differentiated forward, head-major u) lower with one Gram kernel
  and the two spd_inverse launches (A0's and the segment starts')."""
  for grad in (False, True):
    text = _lower((2, 300, 4, 64, 64, 64), jnp.bfloat16, "auto", grad=grad, prep="scan",
                  segment_chunks=2, segment_gram="kernel", state_output="auto")
    assert text.count('name = "vla_segment_grams"') == 1, grad
    assert text.count('name = "vla_spd_inverse"') == 2, grad
    assert 'name = "vla_penalty_scan"' in text


def _chunked_float64(args, C):
  """Forward (o, S_T, A_T) and gradients (q, k, v, u) of impl="chunked" in float64."""
  from vla_jax.ops.vla import VLAState, vla_recurrence
  with jax.enable_x64(True):
    a64 = [jnp.asarray(np.asarray(x, np.float64)) for x in args]

    def run(q, k, v, u):
      o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(a64[4], a64[5]),
                             impl="chunked", chunk_size=C)
      return o, st.S, st.A
    out = [np.asarray(x) for x in jax.jit(run)(*a64[:4])]
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(run(*a)[0]), argnums=range(4)))(*a64[:4])
    return out, [np.asarray(g) for g in grads]


def test_bf16_products_forward_and_gradients_within_bf16_bound():
  """prep_dot="bf16": the penalty kernels' product operands rounded to bfloat16 (interpret mode
  emulates the GPU's rounding). Forward and gradients stay within the bf16 bound of the
  float64 reference; the error is well above float32's, so the rounding really happens."""
  B, T, H, dk, dv, C = 1, 70, 2, 32, 32, 16
  args = [np.asarray(x, np.float32) for x in _inputs(34, B, T, H, dk, dv)]
  ref_out, ref_grads = _chunked_float64(args, C)
  f32 = [jnp.asarray(x) for x in args]
  errs = {}
  for dot in ("bf16", "tf32x3"):          # tf32x3 is full precision in interpret mode
    cfg = KernelConfig(chunk_size=C, prep="scan", prep_dot=dot, segment_chunks=2,
                       precision=jax.lax.Precision.HIGHEST)
    assert cfg.state_factor_dot == ("tf32" if dot == "bf16" else dot)
    out = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*f32)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(vla_pallas(*a, *f32[4:], config=cfg,
                                                           interpret=True)[0]),
                             argnums=range(4)))(*f32[:4])
    errs[dot] = [_rel(g, w) for g, w in zip((*out, *grads), (*ref_out, *ref_grads))]
  assert max(errs["bf16"]) < 2e-2, errs["bf16"]
  assert max(errs["tf32x3"]) < TOL[np.float32], errs["tf32x3"]
  assert min(errs["bf16"][:1] + errs["bf16"][6:]) > 20 * TOL[np.float32], errs["bf16"]


@pytest.mark.parametrize("kw,match", [
    (dict(prep="split", prep_dot="bf16"), 'prep_dot="bf16" needs prep="scan"'),
    (dict(state_prep_dot="fp8"), "state_prep_dot must be"),
    (dict(state_prep_dot="bf16", prep="split"), 'state_prep_dot=.bf16. needs prep="scan"'),
    (dict(factor_dtype="float16"), "factor_dtype must be"),
    (dict(factor_dtype="bfloat16", prep="split"), 'factor_dtype=.bfloat16. needs prep="scan"'),
    (dict(input_layout="rows"), "input_layout must be"),
    (dict(reverse_dot="fp8"), "reverse_dot must be"),
    (dict(reverse_dot="tf32", prep="split"), 'reverse_dot=.tf32. needs prep="scan"'),
    (dict(input_layout="direct", prep="split"), 'input_layout=.direct. needs prep="scan"')])
def test_bfloat16_options_raise(kw, match):
  x = jnp.zeros((1, 16, 1, 16))
  with pytest.raises(ValueError, match=match):
    vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
               config=KernelConfig(chunk_size=16, **kw))


def test_reverse_dot_reaches_the_reverse_kernel(monkeypatch):
  """reverse_dot sets the reverse penalty kernel's products alone: with prep_dot="bf16" and
  reverse_dot="tf32" the lowered gradient's forward scan takes bfloat16 products and the
  reverse kernel TF32 ones; "auto" follows the forward."""
  import vla_jax.kernels.penalty_grad as pg
  from vla_jax.kernels.penalty_scan_bwd import penalty_scan_bwd
  seen = []

  def spy(*args, **kwargs):
    seen.append(kwargs["factor_precision"])
    return penalty_scan_bwd(*args, **kwargs)

  monkeypatch.setattr(pg, "penalty_scan_bwd", spy)
  spec = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)
  args = (spec(1, 128, 2, 64),) * 4 + (spec(1, 2, 64, 64, dt=jnp.float32),) * 2
  presets = jax.lax.DotAlgorithmPreset
  for reverse, want in (("tf32", presets.TF32_TF32_F32), ("auto", presets.BF16_BF16_F32)):
    cfg = KernelConfig(reverse_dot=reverse, penalty_grad="scan")
    assert cfg.for_inputs(*args[:4]).reverse_factor_dot == ("tf32" if reverse == "tf32"
                                                           else "bf16")
    grad = jax.grad(lambda *a: jnp.sum(vla_pallas(*a, config=cfg, interpret=False)[0]
                                       .astype(jnp.float32)), argnums=range(4))
    seen.clear()
    lower_for_h200(grad, *args)
    assert seen == [want], (reverse, seen)


def test_bfloat16_options_resolve():
  cfg = KernelConfig(prep_dot="bf16")
  assert cfg.factor_dot == "bf16" and forward_scan_warps(cfg, 64) == 1
  assert KernelConfig().state_factor_dot == "tf32"
  assert cfg.state_factor_dot == "tf32"
  assert KernelConfig(state_prep_dot="bf16").state_factor_dot == "bf16"
  assert KernelConfig(prep_dot="tf32x3").state_factor_dot == "tf32x3"


def test_bfloat16_inputs_resolve_auto_options():
  """`for_inputs` turns the "auto" options into the bandwidth choices for bfloat16 inputs only
  (at prep="scan", precision=DEFAULT), keeps explicit settings, and leaves float32 inputs on
  the float32 choices."""
  bf = jnp.zeros((1, 16, 1, 16), jnp.bfloat16)
  f32 = bf.astype(jnp.float32)
  got = KernelConfig().for_inputs(bf, bf, bf, bf)
  assert (got.factor_dot, got.state_factor_dot, got.factor_dtype, got.direct_inputs) == (
      "bf16", "bf16", "bfloat16", True)
  assert got.factor_store(jnp.float32) == jnp.bfloat16 and got.local_vjp_dot == "bf16"
  assert KernelConfig(state_local_vjp="xla").for_inputs(bf, bf, bf, bf).local_vjp_dot == "auto"
  kept = KernelConfig(state_prep_dot="tf32", factor_dtype="float32",
                      input_layout="transposed").for_inputs(bf, bf, bf, bf)
  assert (kept.factor_dot, kept.state_factor_dot, kept.factor_dtype, kept.direct_inputs) == (
      "bf16", "tf32", "float32", False)
  assert (got.newton_step, got.inverse_tile_size) == (False, None)    # 32 does not divide 16
  bf64 = jnp.zeros((1, 16, 1, 64), jnp.bfloat16)
  got = KernelConfig().for_inputs(bf64, bf64, bf64, bf64)
  assert (got.newton_step, got.inverse_tile_size) == (False, 32)
  kept = KernelConfig(refine=True, inverse_tile=16).for_inputs(bf64, bf64, bf64, bf64)
  assert (kept.newton_step, kept.inverse_tile_size) == (True, 16)
  assert KernelConfig(refine=True).for_inputs(bf64, bf64, bf64, bf64).inverse_tile_size is None
  for cfg in (KernelConfig().for_inputs(f32, f32, f32, f32),
              KernelConfig().for_inputs(bf, bf, bf, f32),
              KernelConfig(precision=jax.lax.Precision.HIGHEST).for_inputs(bf, bf, bf, bf)):
    assert not cfg.direct_inputs and cfg.factor_store(jnp.float32) == jnp.float32
    assert cfg.factor_dot in ("tf32", "tf32x3") and cfg.state_factor_dot == cfg.factor_dot
    assert cfg.local_vjp_dot == "auto"
    assert (cfg.newton_step, cfg.inverse_tile_size) == (True, None)
  for bad in ("yes", 1, None):
    with pytest.raises(ValueError, match="refine"):
      KernelConfig(refine=bad).validate(64, 64)


@pytest.mark.parametrize("shape", [(1, 100, 2, 64, 64, 64), (1, 64, 1, 128, 128, 64)],
                         ids=shape_id)
def test_bf16_products_lower_for_h200(shape):
  """Forward and gradient with bfloat16 penalty products build Triton IR for an H200: the
  gradient with the adjoint backward (the default: a second penalty scan) and with the
  reverse penalty kernel."""
  text = _lower(shape, jnp.bfloat16, "bf16", grad=False, prep="scan")
  assert text.count('name = "vla_penalty_scan"') == 1
  for backward, scans, reverse in (("adjoint", 2, 0), ("scan", 1, 1)):
    text = _lower(shape, jnp.bfloat16, "bf16", grad=True, prep="scan", penalty_grad=backward)
    assert text.count('name = "vla_penalty_scan"') == scans, backward
    assert text.count('name = "vla_penalty_scan_bwd"') == reverse, backward


def test_bf16_state_prep_within_bf16_bound():
  """state_prep_dot="bf16": the state-path factor kernel's products (the block-doubling
  inverse and those that apply it) with bfloat16 operands as well, in the forward and the
  gradient (grad_prep="kernel"); within the bf16 bound of float64, and above float32's error."""
  B, T, H, dk, dv, C = 1, 70, 2, 32, 32, 16
  args = [np.asarray(x, np.float32) for x in _inputs(35, B, T, H, dk, dv)]
  ref_out, ref_grads = _chunked_float64(args, C)
  f32 = [jnp.asarray(x) for x in args]
  cfg = KernelConfig(chunk_size=C, prep="scan", prep_dot="tf32x3", state_prep_dot="bf16",
                     segment_chunks=2, precision=jax.lax.Precision.HIGHEST)
  assert cfg.state_factor_dot == "bf16"
  assert cfg.state_prep_precisions(jnp.float32) == (jax.lax.DotAlgorithmPreset.BF16_BF16_F32,) * 2
  assert cfg.state_prep_precisions(jnp.float64)[0] == jax.lax.Precision.HIGHEST
  out = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*f32)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(vla_pallas(*a, *f32[4:], config=cfg,
                                                         interpret=True)[0]),
                           argnums=range(4)))(*f32[:4])
  errs = [_rel(g, w) for g, w in zip((*out, *grads), (*ref_out, *ref_grads))]
  # A_T comes from the penalty kernel alone (tf32x3: full precision in interpret mode).
  assert errs[2] < TOL[np.float32], errs
  assert max(errs) < 2e-2 and min(errs[:2] + errs[3:]) > 20 * TOL[np.float32], errs


def test_bf16_state_prep_lowers_for_h200():
  for grad in (False, True):
    text = _lower((1, 100, 2, 64, 64, 64), jnp.bfloat16, "bf16", grad=grad, prep="scan",
                  state_prep_dot="bf16")
    assert "vla_state_prep" in text


def test_bf16_factor_storage_forward_within_bf16_bound():
  """factor_dtype="bfloat16": the inference forward stores the write directions, U', W' and P
  in bfloat16 between its kernels. Within the bf16 bound of float64 and above float32's
  error; the gradient (the differentiated forward keeps float32) is unchanged."""
  B, T, H, dk, dv, C = 1, 70, 2, 32, 32, 16
  args = [np.asarray(x, np.float32) for x in _inputs(36, B, T, H, dk, dv)]
  ref_out, _ = _chunked_float64(args, C)
  f32 = [jnp.asarray(x) for x in args]
  base = dict(chunk_size=C, prep="scan", segment_chunks=2, precision=jax.lax.Precision.HIGHEST)
  errs = {}
  for dtype in ("bfloat16", "float32"):
    for state_output in ("fused", "split"):
      cfg = KernelConfig(factor_dtype=dtype, state_output=state_output, **base)
      out = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*f32)
      chex.assert_type(out, [jnp.float32] * 3)
      errs[dtype, state_output] = [_rel(g, w) for g, w in zip(out, ref_out)]
  for state_output in ("fused", "split"):
    bf, f = errs["bfloat16", state_output], errs["float32", state_output]
    assert max(f) < TOL[np.float32], f
    assert max(bf) < 2e-2 and min(bf[:2]) > 20 * TOL[np.float32], bf
    assert bf[2] == f[2]          # A_T: the penalty kernel's carried A, not a stored factor
  grad = lambda cfg: jax.jit(jax.grad(lambda *a: jnp.sum(vla_pallas(
      *a, *f32[4:], config=cfg, interpret=True)[0]), argnums=range(4)))(*f32[:4])
  for g, w in zip(grad(KernelConfig(factor_dtype="bfloat16", **base)),
                  grad(KernelConfig(**base))):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_bf16_factor_storage_lowers_for_h200():
  for state_output in ("fused", "split"):
    text = _lower((1, 100, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=False, prep="scan",
                  factor_dtype="bfloat16", state_output=state_output)
    assert "vla_state_prep" in text and "vla_penalty_scan" in text


@pytest.mark.parametrize("shape,segment_chunks", [
    ((2, 37, 2, 16, 32, 16), None), ((1, 77, 2, 32, 16, 16), 2), ((1, 40, 1, 64, 16, 16), 3)],
    ids=lambda x: shape_id(x) if isinstance(x, tuple) else str(x))
@pytest.mark.parametrize("state_output", ["fused", "split"])
def test_direct_layout_matches_oracle_float64(x64, shape, segment_chunks, state_output):
  """input_layout="direct": the kernels read [B, T, H, d] in place and make the unit keys;
  T = 77 at C = 16 in segments of 2 chunks pads k and u past the last chunk (3 segments of 32
  tokens for 80), the segment starts inverted by the kernel (dk <= 64)."""
  B, T, H, dk, dv, C = shape
  args = _inputs(41, B, T, H, dk, dv)
  cfg = KernelConfig(chunk_size=C, block_v=16, precision=jax.lax.Precision.HIGHEST,
                     prep="scan", segment_chunks=segment_chunks, input_layout="direct",
                     state_output=state_output)
  got = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(
      *(jnp.asarray(x) for x in args))
  chex.assert_shape(got[0], (B, T, H, dv))
  for name, g, w in zip("oSA", got, _oracle(*args)):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))


def test_direct_layout_bf16_inputs_match_transposed():
  """bf16 inputs (bfloat16 penalty products, bf16 o): the direct layout is within the bf16
  bound of float64 like the transposed one, and within bf16 resolution of it (its unit keys
  are made in the kernel, so an operand can round to the neighbouring bfloat16); gradients
  are the transposed path's, exactly."""
  B, T, H, dk, dv, C = 1, 70, 2, 32, 32, 16
  args = [jnp.asarray(x, jnp.float32) for x in _inputs(42, B, T, H, dk, dv)]
  args = [x.astype(jnp.bfloat16) for x in args[:4]] + args[4:]
  ref_out, _ = _chunked_float64([np.asarray(x, np.float32) for x in args], C)
  run = lambda layout: jax.jit(lambda *a: vla_pallas(*a, config=KernelConfig(
      chunk_size=C, segment_chunks=2, input_layout=layout), interpret=True))(*args)
  direct, transposed = run("direct"), run("transposed")
  chex.assert_trees_all_equal_shapes_and_dtypes(direct, transposed)
  for g, w, r in zip(direct, transposed, ref_out):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert _rel(g, r) < 2e-2 and _rel(w, r) < 2e-2, (_rel(g, r), _rel(w, r))
    assert _rel(g, w) < 4e-3, _rel(g, w)
  grad = lambda layout: jax.jit(jax.grad(lambda *a: jnp.sum(vla_pallas(
      *a, *args[4:], config=KernelConfig(chunk_size=C, input_layout=layout),
      interpret=True)[0].astype(jnp.float32)), argnums=range(4)))(*args[:4])
  for g, w in zip(grad("direct"), grad("transposed")):
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


@pytest.mark.parametrize("d", [64, 128])
def test_direct_layout_lowers_without_transposes(d):
  """For an H200: the direct forward has no per-token transpose, widening or padding left in
  XLA (T a whole number of chunks), only the five kernels' calls."""
  B, T, H = 2, 256, 4
  spec = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt)
  args = (spec(B, T, H, d),) * 4 + (spec(B, H, d, d, dt=jnp.float32),) * 2
  for state_output in ("fused", "split"):
    cfg = KernelConfig(input_layout="direct", state_output=state_output, segment_chunks=2)
    text = lower_for_h200(lambda *a: vla_pallas(*a, config=cfg, interpret=False)[0],
                          *args).as_text()
    per_token = [l for l in text.splitlines() if f"{B}x{T}x{H}x{d}" in l or f"{B}x{H}x{T}x{d}"
                 in l or f"{B * H}x{T}x{d}" in l]
    assert not any(op in l for l in per_token
                   for op in ("stablehlo.transpose", "stablehlo.convert", "stablehlo.pad")), (
                       per_token)
    assert "vla_penalty_scan" in text and "vla_state_prep" in text


def test_local_vjp_dot_bf16_gradients_within_bf16_bound():
  """local_vjp_dot="bf16": the state path's written-out chunk-local VJP takes bfloat16
  operands (float32 accumulation). Gradients stay within the bf16 bound of the float64
  reference, and the rounding really happens (error well above float32's); the forward is
  untouched. Bad values are refused."""
  B, T, H, dk, dv, C = 1, 70, 2, 32, 32, 16
  args = [np.asarray(x, np.float32) for x in _inputs(35, B, T, H, dk, dv)]
  ref_out, ref_grads = _chunked_float64(args, C)
  f32 = [jnp.asarray(x) for x in args]
  cfg = KernelConfig(chunk_size=C, prep="scan", segment_chunks=2, local_vjp_dot="bf16",
                     precision=jax.lax.Precision.HIGHEST)
  out = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*f32)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(vla_pallas(*a, *f32[4:], config=cfg,
                                                         interpret=True)[0]),
                           argnums=range(4)))(*f32[:4])
  out_errs = [_rel(g, w) for g, w in zip(out, ref_out)]
  grad_errs = [_rel(g, w) for g, w in zip(grads, ref_grads)]
  assert max(out_errs) < TOL[np.float32], out_errs
  assert max(grad_errs) < 2e-2, grad_errs
  assert max(grad_errs) > 20 * TOL[np.float32], grad_errs
  x = jnp.zeros((1, 16, 1, 16))
  for kw, match in ((dict(local_vjp_dot="fp8"), "local_vjp_dot must be"),
                    (dict(local_vjp_dot="bf16", state_local_vjp="xla"), "needs state_local")):
    with pytest.raises(ValueError, match=match):
      vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
                 config=KernelConfig(chunk_size=16, **kw))


def test_bfloat16_defaults_within_bf16_bound():
  """bfloat16 inputs at the defaults (`for_inputs`: no Newton step, segment-start inverses on
  32 x 32 tiles, the scan writing the unit rows and their VJP, bf16 products): forward and
  gradients within the bf16 bound of the float64 reference on the same rounded inputs."""
  B, T, H, dk, dv, C = 1, 70, 1, 64, 16, 16
  args = [np.asarray(x, np.float32) for x in _inputs(37, B, T, H, dk, dv)]
  args[:4] = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in args[:4]]
  ref_out, ref_grads = _chunked_float64(args, C)
  bf = [jnp.asarray(x, jnp.bfloat16) for x in args[:4]] + [jnp.asarray(x) for x in args[4:]]
  cfg = KernelConfig(chunk_size=C, segment_chunks=2)
  resolved = cfg.for_inputs(*bf[:4])
  assert (resolved.newton_step, resolved.inverse_tile_size, resolved.factor_dot,
          resolved.scan_unit_rows) == (False, 32, "bf16", True)
  out = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*bf)
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(vla_pallas(*a, *bf[4:], config=cfg,
                                                         interpret=True)[0]
                                              .astype(jnp.float32)),
                           argnums=range(4)))(*bf[:4])
  chex.assert_type(grads, [jnp.bfloat16] * 4)
  errs = [_rel(g, w) for g, w in zip((*out, *grads), (*ref_out, *ref_grads))]
  assert max(errs) < 2e-2, errs
