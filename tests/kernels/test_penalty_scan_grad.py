"""The scan kernel's forward under differentiation (`penalty_grad.penalty_scan_grad`,
KernelConfig(prep="scan", penalty_grad="chunk")): `penalty_scan` with `chunk_size` writes the
oracle's chunk-start inverses, gradients of `vla_pallas` equal impl="scan"'s in float64 with one,
two and several segments, and the gradient lowers for an abstract H200 with the kernel in it."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_kernels import _assert_grads_match_scan, _config, _lowered_grad_lines, _rel
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.penalty_scan import penalty_scan


@pytest.mark.parametrize("C,block,prefetch", [(16, 16, False), (32, 16, True), (32, 32, False)])
def test_chunk_starts_match_oracle_float64(x64, C, block, prefetch):
  """Two segments of two chunks; the second segment starts from the exact inverse."""
  BH, S, dk = 2, 2, 16
  L = 2 * C
  rng = np.random.default_rng(C + block)
  e = rng.standard_normal((BH, S * L, dk))
  e /= np.linalg.norm(e, axis=-1, keepdims=True)
  u = rng.standard_normal((BH, S * L, dk)) / np.sqrt(dk)
  X = rng.standard_normal((BH, dk, dk)) / np.sqrt(dk)
  M0 = 0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2)
  # Oracle: A_t = (M_0 + sum_{s<t} u_s u_s^T)^-1 before token t, for every t.
  M = M0[:, None] + np.cumsum(u[:, :, :, None] * u[:, :, None, :], axis=1)
  A_before = np.linalg.inv(np.concatenate([M0[:, None], M[:, :-1]], axis=1))
  A_after = np.linalg.inv(M)
  A_start = A_before[:, ::L]
  kw = dict(block=block, prefetch=prefetch, factor_precision=jax.lax.Precision.HIGHEST,
            interpret=True)
  args = (jnp.asarray(A_start), jnp.asarray(e), jnp.asarray(u))
  W, A_end, A_c = penalty_scan(*args, chunk_size=C, normalize=False, **kw)
  chex.assert_shape(A_c, (BH, S * L // C, dk, dk))
  assert _rel(A_c, A_before[:, ::C]) < 1e-12
  assert _rel(W, np.einsum("btij,btj->bti", A_after, e)) < 1e-12
  assert _rel(A_end, A_after[:, L - 1::L]) < 1e-12
  # With chunk starts, unit rows and segment ends are the default call's.
  unit_rows, A_end_c, _ = penalty_scan(*args, chunk_size=C, **kw)
  chex.assert_trees_all_close((unit_rows, A_end_c), penalty_scan(*args, **kw), rtol=1e-14,
                              atol=1e-14)


def test_bad_chunk_size_raises():
  A = jnp.broadcast_to(jnp.eye(16), (1, 1, 16, 16))
  e = jnp.zeros((1, 64, 16))
  with pytest.raises(ValueError, match="chunk_size"):
    penalty_scan(A, e, e, block=32, chunk_size=16, factor_precision=jax.lax.Precision.HIGHEST,
                 interpret=True)


@pytest.mark.parametrize("T,C,segment_chunks", [(45, 16, 1), (77, 16, 2), (75, 32, None)])
def test_vla_pallas_gradients_match_scan_float64(x64, T, C, segment_chunks):
  """segment_chunks=None at B * H = 2: one chunk per segment (3 segments)."""
  _assert_grads_match_scan(_config(C, prep="scan", penalty_grad="chunk",
                                   segment_chunks=segment_chunks), T, seed=50 + T)


@pytest.mark.parametrize("segment_chunks,block,prefetch", [(2, 16, False), (None, 32, True)])
def test_gradient_lowers_for_h200(segment_chunks, block, prefetch):
  """The differentiated forward holds `penalty_scan` with its chunk-start output (dk = C = 64;
  T = 300: 5 chunks)."""
  B, T, H, dk, C = 1, 300, 2, 64, 64
  cfg = KernelConfig(chunk_size=C, prep="scan", penalty_grad="chunk",
                     segment_chunks=segment_chunks, scan_block=block, scan_prefetch=prefetch,
                     state_output="fused", state_bwd="fused")
  lines = _lowered_grad_lines(cfg, T=T, B=B, H=H, dk=dk, dv=dk)
  text = "\n".join(lines)
  scan_calls = [l for l in lines if 'name = "vla_penalty_scan"' in l]
  assert len(scan_calls) == 1 and "vla_state_fwd" in text and "vla_state_bwd" in text
  L = (segment_chunks or 1) * C
  n = -(-T // L) * L // C
  results = re.search(r"\) -> \((.*)\)$", scan_calls[0]).group(1)
  assert results.count("tensor<") == 3, results
  assert results.endswith(f"tensor<{B * H}x{n}x{dk}x{dk}xf32>"), results
