"""The reverse penalty kernel (`penalty_scan_bwd.py`, KernelConfig(prep="scan",
penalty_grad="scan")): its block reverse and the kernel alone (both block walks) equal VJPs of
the block step in float64, gradients of `vla_pallas` equal impl="scan"'s with one, two and three
segments and with the blocks in a loop (scan_bwd_unroll=False), the option needs prep="scan",
KernelConfig.scan_bwd_unroll reaches the kernel, and the gradient and the kernel lower for an
abstract H200."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_kernels import (_assert_grads_match_scan, _config, _kernel_names, _lowered_grad_lines,
                          _rel, _sym)
from vla_jax.kernels import KernelConfig, penalty_grad
from vla_jax.kernels.lowering import lower_for_h200
from vla_jax.kernels.penalty_scan_bwd import block_bwd, penalty_scan_bwd

HI = jax.lax.Precision.HIGHEST


def _block_step(A, U, E):
  """The forward block step in XLA: (W, A_next)."""
  mm = lambda a, b: jnp.matmul(a, b, precision=HI)
  X = mm(U, A)
  Lc = jnp.linalg.cholesky(jnp.eye(U.shape[0], dtype=U.dtype) + mm(X, U.T))
  Y = jax.scipy.linalg.solve_triangular(Lc, X, lower=True)
  return mm(E, A) - mm(jnp.tril(mm(E, Y.T)), Y), A - mm(Y.T, Y)


@pytest.mark.parametrize("b,dk", [(16, 16), (16, 32)])
def test_block_bwd_matches_vjp_float64(x64, b, dk):
  rng = np.random.default_rng(b + dk)
  X = rng.standard_normal((dk, dk)) / np.sqrt(dk)
  A = jnp.asarray(np.linalg.inv(0.5 * np.eye(dk) + X @ X.T))
  U = jnp.asarray(rng.standard_normal((b, dk)) / np.sqrt(dk))
  E = rng.standard_normal((b, dk))
  E = jnp.asarray(E / np.linalg.norm(E, axis=1, keepdims=True))
  dW, dA = jnp.asarray(rng.standard_normal((b, dk))), jnp.asarray(rng.standard_normal((dk, dk)))
  want = jax.vjp(_block_step, A, U, E)[1]((dW, dA))
  got = jax.jit(lambda *a: block_bwd(*a, precision=HI))(A, U, E, dW, dA)
  chex.assert_trees_all_equal_shapes(got, want)
  assert _rel(_sym(got[0]), _sym(want[0])) < 1e-12
  assert _rel(got[1], want[1]) < 1e-12 and _rel(got[2], want[2]) < 1e-12


@pytest.mark.parametrize("T,C,segment_chunks", [(45, 16, None), (77, 16, 3), (75, 32, 1)])
def test_vla_pallas_gradients_match_scan_float64(x64, T, C, segment_chunks):
  """B * H = 2: segment_chunks=None gives one chunk per segment (3 segments of 16 tokens);
  T = 77 at C = 16 is 5 chunks in 2 segments of 3 (the last segment half padding); T = 75 at
  C = 32 is one segment of 3 chunks of 2 blocks each."""
  _assert_grads_match_scan(_config(C, prep="scan", penalty_grad="scan",
                                   segment_chunks=segment_chunks), T, seed=70 + T)


def test_segment_grad_products_matches_scan_float64(x64):
  """KernelConfig(segment_grad="products"): the segment-start inverses' VJP written out; T = 77
  at C = 16 is 5 chunks in 2 segments of 3 (the last half padding). More segments: below."""
  _assert_grads_match_scan(_config(16, prep="scan", penalty_grad="scan", segment_grad="products",
                                   segment_chunks=3), 77, seed=167)


def test_grad_scan_warps_forward_layout_differs_from_reverse_float64(x64, monkeypatch):
  """KernelConfig(grad_scan_warps=1): the differentiated forward's penalty scan with 1-warp
  programs and its own segments, the reverse kernel with its 4-warp layout. At test sizes both
  layouts would be one chunk per segment, so `segments_for` is patched: 1-chunk segments for
  1-warp programs (5 segments at T = 77, C = 16), 3-chunk ones for 4 warps (2 segments).
  Gradients still equal impl="scan"'s (with segment_grad either way)."""
  from vla_jax.kernels import penalty_scan
  seen = []

  def fake_segments_for(BH, N, resident=264):
    seen.append(resident)
    return 1 if resident > 264 else 3
  monkeypatch.setattr(penalty_scan, "segments_for", fake_segments_for)
  for seg_grad in ("autodiff", "products"):
    _assert_grads_match_scan(_config(16, prep="scan", penalty_grad="scan", grad_scan_warps=1,
                                     segment_grad=seg_grad), 77, seed=177)
  assert 264 * 4 in seen and 264 in seen     # both layouts were used
  # The other way round: bwd_scan_warps=1 gives the reverse kernel the 1-chunk segments.
  seen.clear()
  _assert_grads_match_scan(_config(16, prep="scan", penalty_grad="scan", bwd_scan_warps=1,
                                   segment_grad="products"), 77, seed=178)
  assert 264 * 4 in seen and 264 in seen
  for name in ("grad_scan_warps", "bwd_scan_warps"):
    with pytest.raises(ValueError, match=name):
      KernelConfig(**{name: 3}).validate(16, 16)


def test_segment_start_vjp_equals_autodiff_float64(x64):
  """`penalty_grad.segment_start_vjp` against `jax.vjp` of `segment_start_inverses` (XLA
  Cholesky, doubling inverse, Newton step) on random u, a non-diagonal SPD A0 and random
  (non-symmetric) cotangents: 4 segments of 2 chunks of 16, the last one short."""
  from vla_jax.kernels.penalty_grad import segment_start_vjp
  from vla_jax.kernels.penalty_scan import segment_start_inverses
  rng = np.random.default_rng(95)
  B, H, T_pad, dk, S, L = 1, 2, 112, 16, 4, 32
  u = jnp.asarray(rng.standard_normal((B, H, T_pad, dk)) / 4)
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = jnp.asarray(np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)))
  dA = jnp.asarray(rng.standard_normal((B, H, S - 1, dk, dk)))
  cfg = KernelConfig(chunk_size=16)
  A_seg, pullback = jax.vjp(lambda u, A0: segment_start_inverses(u, A0, cfg, S, L), u, A0)
  want = pullback(dA)
  got = segment_start_vjp(u, A0, A_seg, dA, S, L)
  chex.assert_trees_all_equal_shapes(got, want)
  assert _rel(got[0], want[0]) < 1e-10
  assert _rel(_sym(got[1]), _sym(want[1])) < 1e-10
  with pytest.raises(ValueError, match="segment_grad"):
    KernelConfig(segment_grad="exact").validate(16, 16)


def test_vla_pallas_gradients_scan_bwd_unroll_false_float64(x64):
  """KernelConfig(scan_bwd_unroll=False), the reverse kernel's blocks in a loop (each block's
  start recomputed from the chunk start): gradients of `vla_pallas` equal impl="scan"'s, as the
  unrolled walk's do above. C = 64 (four blocks a chunk, up to three recomputed downdates),
  T = 150: 3 chunks in 2 segments of 2 (one segment start from XLA)."""
  _assert_grads_match_scan(_config(64, prep="scan", penalty_grad="scan", segment_chunks=2,
                                   scan_bwd_unroll=False), 150, seed=150)


@pytest.mark.parametrize("unroll", [True, False])
def test_scan_bwd_unroll_reaches_kernel(monkeypatch, unroll):
  """KernelConfig.scan_bwd_unroll is the reverse kernel's `unroll` in the default config's
  gradient (penalty_grad="auto"), and that gradient lowers for an abstract H200."""
  seen = []

  def spy(*args, **kwargs):
    seen.append(kwargs["unroll"])
    return penalty_scan_bwd(*args, **kwargs)

  monkeypatch.setattr(penalty_grad, "penalty_scan_bwd", spy)
  lines = _lowered_grad_lines(KernelConfig(scan_bwd_unroll=unroll, penalty_grad="scan"), T=128)
  assert seen == [unroll]
  assert sum('name = "vla_penalty_scan_bwd"' in l for l in lines) == 1


@pytest.mark.parametrize("prep", ["xla", "kernel", "split"])
def test_scan_grad_needs_scan_prep(prep):
  with pytest.raises(ValueError, match="penalty_grad"):
    KernelConfig(prep=prep, penalty_grad="scan").validate(64, 64)
  KernelConfig(prep="scan", penalty_grad="scan").validate(64, 64)


def test_auto_penalty_grad_resolves_by_prep():
  """The default penalty_grad="auto" is the adjoint backward with prep="scan" (the default
  prep) and plain autodiff with the other preps, which then validate."""
  assert KernelConfig().penalty_grad == "auto"
  assert KernelConfig().penalty_backward == "adjoint"
  for prep in ("xla", "kernel", "split"):
    cfg = KernelConfig(prep=prep)
    cfg.validate(64, 64)
    assert cfg.penalty_backward == "autodiff"
  assert KernelConfig(penalty_grad="chunk").penalty_backward == "chunk"
  with pytest.raises(ValueError, match="penalty_grad"):
    KernelConfig(penalty_grad="reverse").validate(64, 64)


def test_gradient_lowers_for_h200():
  """dk = C = 64, T = 300 (5 chunks), 2 chunks per segment (3 segments): the differentiated
  program holds the forward scan and the reverse kernel, each once."""
  cfg = KernelConfig(chunk_size=64, prep="scan", penalty_grad="scan", segment_chunks=2,
                     state_output="fused", state_bwd="fused")
  lines = _lowered_grad_lines(cfg, T=300)
  count = lambda name: sum(f'name = "{name}"' in l for l in lines)
  assert count("vla_penalty_scan") == 1 and count("vla_penalty_scan_bwd") == 1
  assert count("vla_state_fwd") == 1 and count("vla_state_bwd") == 1


def test_grad_scan_warps_lowers_for_h200():
  """grad_scan_warps=1, bwd_scan_warps=2: the differentiated forward's scan runs 1-warp
  programs, the reverse kernel 2-warp ones."""
  cfg = KernelConfig(chunk_size=64, prep="scan", penalty_grad="scan", segment_chunks=2,
                     grad_scan_warps=1, bwd_scan_warps=2)
  warps = {}
  for line in _lowered_grad_lines(cfg, T=300):
    for name in ("vla_penalty_scan", "vla_penalty_scan_bwd"):
      if f'name = "{name}"' in line:
        warps[name] = re.findall(r"num_warps = (\d+)", line)
  assert warps == {"vla_penalty_scan": ["1"], "vla_penalty_scan_bwd": ["2"]}, warps


@pytest.mark.parametrize("unroll", [True, False])
def test_kernel_matches_vjp_of_block_steps_float64(x64, unroll):
  """The kernel alone, one segment of two chunks of four blocks (C = 64, b = 16): dU, dE and
  the segment-start cotangent equal a VJP of the block steps run in sequence from A_start,
  for a random row cotangent and a random cotangent of the end inverse; with the chunk's
  blocks unrolled (block starts kept) and in a loop (block starts recomputed)."""
  BH, C, dk, b = 2, 64, 16, 16
  L = 2 * C
  rng = np.random.default_rng(3)
  e = rng.standard_normal((BH, L, dk))
  e = jnp.asarray(e / np.linalg.norm(e, axis=-1, keepdims=True))
  u = jnp.asarray(rng.standard_normal((BH, L, dk)) / np.sqrt(dk))
  X = rng.standard_normal((BH, dk, dk)) / np.sqrt(dk)
  A0 = jnp.asarray(np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)))
  dW = jnp.asarray(rng.standard_normal((BH, L, dk)))
  dA_end = jnp.asarray(rng.standard_normal((BH, 1, dk, dk)))

  def reference(A, U, E):     # one head: rows [L, dk] and the end inverse
    W = []
    for j in range(L // b):
      Wj, A = _block_step(A, U[j * b:(j + 1) * b], E[j * b:(j + 1) * b])
      W.append(Wj)
    return jnp.concatenate(W), A

  want_dA, want_dU, want_dE = jax.vmap(lambda A, U, E, dW, dA: jax.vjp(reference, A, U, E)[1](
      (dW, dA)))(A0, u, e, dW, dA_end[:, 0])
  A_c = jnp.stack([A0, _after_first_chunk(A0, u, C)], axis=1)
  dU, dE, dA_start = penalty_scan_bwd(A_c, e, u, dW, dA_end, chunk_size=C, block=b,
                                      unroll=unroll, factor_precision=HI, interpret=True)
  chex.assert_shape(dA_start, (BH, 1, dk, dk))
  assert _rel(dU, want_dU) < 1e-12 and _rel(dE, want_dE) < 1e-12
  assert _rel(dA_start[:, 0], _sym(want_dA)) < 1e-12


def _after_first_chunk(A0, u, C):
  """The inverse after the first C tokens: (A0^-1 + U^T U)^-1, [BH, dk, dk]."""
  U = u[:, :C]
  return jnp.linalg.inv(jnp.linalg.inv(A0) + jnp.einsum("bti,btj->bij", U, U))


@pytest.mark.parametrize("unroll", [True, False])
def test_kernel_lowers_for_h200(unroll):
  """The reverse kernel alone, both block walks (dk = C = 64, two segments, 8 heads)."""
  BH, S, C, dk = 8, 2, 64, 64
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  fn = lambda *a: penalty_scan_bwd(*a, chunk_size=C, unroll=unroll,
                                   factor_precision=jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3)
  text = lower_for_h200(fn, f32(BH, 2 * S, dk, dk), f32(BH, S * C, dk), f32(BH, S * C, dk),
                        f32(BH, S * C, dk), f32(BH, S, dk, dk)).as_text()
  assert sum('name = "vla_penalty_scan_bwd"' in l for l in text.splitlines()) == 1


def test_default_grad_scan_warps_follow_the_products():
  """grad_scan_warps=None: 1-warp differentiated-forward scans for bfloat16 inputs (bfloat16
  products) at dk = 64, the reverse kernel's 4 warps for float32 inputs (TF32 products) and
  8 at dk = 128; the lowered gradient for bf16 inputs at dk = 64 has them."""
  from vla_jax.kernels.penalty_scan import grad_scan_warps
  bf16 = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.bfloat16)
  f32 = jax.ShapeDtypeStruct((1, 64, 2, 64), jnp.float32)
  resolve = lambda x: KernelConfig().for_inputs(x, x, x, x)
  assert grad_scan_warps(resolve(bf16), 64) == 1
  assert grad_scan_warps(resolve(f32), 64) == 4
  assert grad_scan_warps(resolve(bf16), 128) == 8
  assert grad_scan_warps(KernelConfig(grad_scan_warps=2).for_inputs(bf16, bf16, bf16, bf16),
                         64) == 2
  warps = {}
  for line in _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2,
                                                penalty_grad="scan"), T=300):
    for name in ("vla_penalty_scan", "vla_penalty_scan_bwd"):
      if f'name = "{name}"' in line:
        warps[name] = re.findall(r"num_warps = (\d+)", line)
  assert warps == {"vla_penalty_scan": ["1"], "vla_penalty_scan_bwd": ["4"]}, warps


@pytest.mark.parametrize("C,stride,segment_chunks", [(32, 16, None), (64, 32, 1), (32, 16, 2)])
def test_grad_stride_gradients_equal_scan_float64(x64, C, stride, segment_chunks):
  """KernelConfig(grad_stride): the differentiated forward saves A every `stride` tokens and
  the reverse kernel walks stretches of that length (fewer block starts to recompute); the
  gradients still equal impl="scan"'s, with one segment, one chunk a segment (T = 77 padded to
  whole chunks) and two chunks a segment."""
  _assert_grads_match_scan(_config(C, prep="scan", penalty_grad="scan", grad_stride=stride,
                                   segment_chunks=segment_chunks), 77, seed=191)


def test_grad_stride_validation_and_resolution():
  """grad_stride must be a multiple of scan_block dividing chunk_size; it applies to the
  reverse penalty kernel only (the chunk-level backward keeps chunk starts)."""
  for bad in (8, 24, 128, 0, True):
    with pytest.raises(ValueError, match="grad_stride"):
      KernelConfig(chunk_size=64, grad_stride=bad).validate(16, 16)
  KernelConfig(chunk_size=64, grad_stride=32).validate(16, 16)
  assert KernelConfig(chunk_size=64).residual_stride == 64
  assert KernelConfig(chunk_size=64, grad_stride=16, penalty_grad="scan").residual_stride == 16
  assert KernelConfig(chunk_size=64, grad_stride=16, penalty_grad="chunk").residual_stride == 64


def test_grad_stride_lowers_for_h200():
  """grad_stride=16 at C = 64, dk = 64: the gradient lowers for an H200 with one penalty scan
  forward and one reverse kernel (each stretch one block)."""
  lines = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2, grad_stride=16,
                                           penalty_grad="scan"), T=300)
  count = lambda name: sum(f'name = "{name}"' in l for l in lines)
  assert count("vla_penalty_scan") == 1 and count("vla_penalty_scan_bwd") == 1


@pytest.mark.parametrize("C,segment_chunks,T", [(16, None, 77), (16, 2, 77), (32, 1, 100),
                                                (64, None, 64)])
def test_adjoint_gradients_equal_scan_float64(x64, C, segment_chunks, T):
  """penalty_grad="adjoint": dkhat = A_t dW_t from a second forward penalty scan, du and dA0
  from reverse prefix sums of Z_t W_t^T (no reverse walk). Gradients of q, k, v, u, S0 and
  the symmetric part of A0 equal impl="scan"'s, with one and several segments, a padded tail
  and a single chunk."""
  _assert_grads_match_scan(_config(C, prep="scan", penalty_grad="adjoint",
                                   segment_chunks=segment_chunks), T, seed=211)


def test_adjoint_lowers_for_h200():
  """penalty_grad="adjoint" at C = 64, dk = 64: the gradient lowers for an H200 with two
  penalty scans (the forward and the one on dW) and no reverse penalty kernel."""
  lines = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2,
                                           penalty_grad="adjoint"), T=300)
  count = lambda name: sum(f'name = "{name}"' in l for l in lines)
  assert count("vla_penalty_scan") == 2 and count("vla_penalty_scan_bwd") == 0


def test_adjoint_du_kernel_equals_xla_float64(x64):
  """`adjoint_du.chunk_u_cotangents_kernel` on E equals the XLA `chunk_u_cotangents` on
  D = E + E^T in float64 (two sequences, three chunks), `suffix_matrices`' two forms agree,
  and KernelConfig(adjoint_du="kernel") gives impl="scan"'s
  gradients with a padded tail."""
  from vla_jax.kernels.adjoint_du import chunk_u_cotangents_kernel
  from vla_jax.ops.vla.penalty import chunk_u_cotangents, suffix_matrices
  B, H, N, C, dk = 1, 2, 3, 16, 16
  rng = np.random.default_rng(3)
  U, W, Z = (jnp.asarray(rng.standard_normal((B, H, N, C, dk))) for _ in range(3))
  E = jnp.asarray(rng.standard_normal((B, H, N, dk, dk)))         # not symmetric
  got = chunk_u_cotangents_kernel(U, W, Z, E, precision=HI, interpret=True)
  chex.assert_shape(got, (B, H, N, C, dk))
  assert _rel(got, chunk_u_cotangents(U, W, Z, E + jnp.swapaxes(E, -1, -2))) < 1e-13
  A_T, dA_T, A0 = (jnp.asarray(rng.standard_normal((B, H, dk, dk))) for _ in range(3))
  A0 = _sym(A0) + 2 * dk * jnp.eye(dk)
  D, dA0 = suffix_matrices(W, Z, A_T, dA_T, A0)
  E, dA0_e = suffix_matrices(W, Z, A_T, dA_T, A0, symmetrize=False)
  assert _rel(E + jnp.swapaxes(E, -1, -2), D) < 1e-14 and _rel(dA0_e, dA0) < 1e-14
  _assert_grads_match_scan(_config(16, prep="scan", penalty_grad="adjoint", adjoint_du="kernel",
                                   segment_chunks=2), 77, seed=213)
  with pytest.raises(ValueError, match="adjoint_du"):
    KernelConfig(adjoint_du="gpu").validate(16, 16)


def test_adjoint_du_kernel_lowers_for_h200():
  lines = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2,
                                           adjoint_du="kernel"), T=300)
  count = lambda name: sum(f'name = "{name}"' in l for l in lines)
  assert count("vla_adjoint_du") == 1 and count("vla_penalty_scan") == 2


@pytest.mark.parametrize("N", [6, 5])
def test_carried_adjoint_du_equals_xla_float64(x64, N):
  """`adjoint_du.carried_u_cotangents`: the suffix sums carried through segments of chunks in
  the kernel from `segment_suffix_starts`' per-segment starts give the XLA du
  (`chunk_u_cotangents` on `suffix_matrices`' D) and the same dA0, in float64 (N = 6:
  segments of 6, 2 or 1 chunks; N = 5: of 5 or 1); and KernelConfig(adjoint_du="carried") gives
  impl="scan"'s gradients with a padded tail."""
  from vla_jax.kernels.adjoint_du import carried_segment_chunks, carried_u_cotangents
  from vla_jax.ops.vla.penalty import chunk_u_cotangents, segment_suffix_starts, suffix_matrices
  B, H, C, dk = 1, 2, 16, 16
  rng = np.random.default_rng(17 + N)
  U, W, Z = (jnp.asarray(rng.standard_normal((B, H, N, C, dk))) for _ in range(3))
  A_T, dA_T, A0 = (jnp.asarray(rng.standard_normal((B, H, dk, dk))) for _ in range(3))
  A0 = _sym(A0) + 2 * dk * jnp.eye(dk)
  D, dA0 = suffix_matrices(W, Z, A_T, dA_T, A0)
  want = chunk_u_cotangents(U, W, Z, D)
  for L in sorted({carried_segment_chunks(N), carried_segment_chunks(N, most=2), 1}):
    E_last, dA0_c = segment_suffix_starts(W, Z, A_T, dA_T, A0, L)
    chex.assert_shape(E_last, (B, H, N // L, dk, dk))
    got = carried_u_cotangents(U, W, Z, E_last, segment_chunks=L, precision=HI,
                               interpret=True)
    chex.assert_shape(got, (B, H, N, C, dk))
    assert _rel(got, want) < 1e-13, (L, _rel(got, want))
    assert _rel(dA0_c, dA0) < 1e-13
  assert carried_segment_chunks(64) == 8 and carried_segment_chunks(12) == 6
  assert carried_segment_chunks(13) == 1
  _assert_grads_match_scan(_config(16, prep="scan", penalty_grad="adjoint",
                                   adjoint_du="carried", segment_chunks=2), 77, seed=214)


def test_carried_adjoint_du_lowers_for_h200():
  lines = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2,
                                           adjoint_du="carried"), T=1000)
  count = lambda name: sum(f'name = "{name}"' in l for l in lines)
  assert count("vla_adjoint_du_carried") == 1 and count("vla_adjoint_du") == 0


def test_unit_rows_vjp_equals_autodiff_float64(x64):
  """`penalty_scan.unit_rows_vjp` is the VJP of `vla_jax.ops.utils.unit` row by row, including
  rows at or below the norm floor (zero rows: the floor's constant 1 / eps)."""
  from vla_jax.kernels.penalty_scan import unit_rows_vjp
  from vla_jax.ops.utils import unit
  rng = np.random.default_rng(71)
  W = rng.standard_normal((8, 16))
  W[2] = 0.0
  W[5] *= 1e-9                               # below WRITE_EPS: the clamped branch
  W, dA = jnp.asarray(W), jnp.asarray(rng.standard_normal((8, 16)))
  eps = 1e-6
  _, pullback = jax.vjp(lambda x: unit(x, eps), W)
  want = pullback(dA)[0]
  got = unit_rows_vjp(W, dA, eps)
  chex.assert_trees_all_close(got, want, rtol=1e-12, atol=1e-12)
  assert np.all(np.isfinite(got))


@pytest.mark.parametrize("T,write_norm", [(77, "kernel"), (96, "kernel"), (77, "xla")])
def test_write_norm_gradients_match_scan_float64(x64, T, write_norm):
  """KernelConfig(write_norm="kernel") (the default): the forward scan writes unit and plain
  rows, the backward's scan makes the rows' cotangents from the unit rows' on load; with "xla"
  XLA normalises the rows and differentiates that. Gradients (all six inputs) equal
  impl="scan"'s in float64, with a padded tail (T = 77) and without (T = 96), at two
  segments."""
  cfg = _config(16, prep="scan", penalty_grad="adjoint", write_norm=write_norm,
                segment_chunks=2)
  assert cfg.scan_unit_rows == (write_norm == "kernel")
  assert not KernelConfig(write_norm="kernel", penalty_grad="scan").scan_unit_rows
  _assert_grads_match_scan(cfg, T, seed=230 + T)
  with pytest.raises(ValueError, match="write_norm"):
    KernelConfig(write_norm="pallas").validate(16, 16)


def test_write_norm_kernel_lowers_for_h200():
  """bf16 inputs, d = 64: the gradient with write_norm="kernel" (the default) lowers for an
  H200 with the same kernels as with "xla" (the two penalty scans now write two row arrays /
  read three) and fewer XLA normalisations."""
  lines = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2), T=1000)
  xla = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2, write_norm="xla"),
                            T=1000)
  assert _kernel_names(lines) == _kernel_names(xla)
  assert sum("rsqrt" in l for l in lines) < sum("rsqrt" in l for l in xla)


def test_adjoint_z_scan_takes_bwd_scan_warps():
  """penalty_grad="adjoint": bwd_scan_warps sets the warps of the Z scan alone (the forward's
  scan keeps its 1 warp at d = 64, bf16), over the forward's segments: the lowered gradient
  has the same kernels with one penalty scan at 1 warp and one at 2; in float64 the gradients
  still equal impl="scan"'s."""
  warps = lambda lines: sorted(int(l.split("num_warps = ")[1].split()[0].rstrip(":,"))
                               for l in lines if 'name = "vla_penalty_scan"' in l)
  base = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2), T=1000)
  two = _lowered_grad_lines(KernelConfig(chunk_size=64, segment_chunks=2, bwd_scan_warps=2),
                            T=1000)
  assert warps(base) == [1, 1] and warps(two) == [1, 2]
  assert _kernel_names(two) == _kernel_names(base)
  with jax.enable_x64(True):
    _assert_grads_match_scan(_config(16, prep="scan", penalty_grad="adjoint", segment_chunks=2,
                                     bwd_scan_warps=2), 77, seed=241)
