"""Tests of the split chunk-prep kernels of `vla_pallas` (KernelConfig.prep="split") on CPU.

The three kernels (`vla_jax.kernels.split_prep`) run in Pallas interpret mode against the
float64 NumPy oracle of tests/test_kernels.py, and are lowered for an abstract NVIDIA H200
(Triton). Gradients under prep="split" run the XLA path (tested for prep="kernel" in
tests/test_chunk_prep.py: same custom VJP).
"""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from test_chunk_prep import _lower
from test_kernels import TOL, _inputs, _oracle, _rel, shape_id
from vla_jax.kernels import KernelConfig, vla_pallas

@pytest.mark.parametrize("shape,split_inverse", [
    ((2, 37, 2, 16, 32, 16), "kernel"), ((1, 70, 1, 32, 32, 32), "kernel"),
    ((1, 50, 2, 32, 16, 16), "xla"), ((1, 40, 1, 128, 16, 16), "auto")],
    ids=lambda x: shape_id(x) if isinstance(x, tuple) else x)
def test_forward_matches_oracle_float64(x64, shape, split_inverse):
  """dk = 128: two column panels in the penalty-rows kernel, inverses in XLA ("auto")."""
  B, T, H, dk, dv, C = shape
  args = _inputs(20, B, T, H, dk, dv)
  cfg = KernelConfig(chunk_size=C, block_v=16, precision=jax.lax.Precision.HIGHEST,
                     prep="split", split_inverse=split_inverse)
  got = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(
      *(jnp.asarray(x) for x in args))
  assert got[0].shape == (B, T, H, dv)
  for name, g, w in zip("oSA", got, _oracle(*args)):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))


def test_bad_split_inverse_raises():
  x = jnp.zeros((1, 16, 1, 16))
  with pytest.raises(ValueError, match="split_inverse"):
    vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
               config=KernelConfig(chunk_size=16, prep="split", split_inverse="gpu"))


@pytest.mark.parametrize("shape,kernels", [
    ((1, 100, 2, 64, 64, 64),
     ("vla_spd_inverse", "vla_penalty_rows", "vla_state_prep", "vla_state_fwd")),
    ((1, 64, 1, 128, 128, 64), ("vla_penalty_rows", "vla_state_prep", "vla_state_fwd"))],
    ids=lambda x: shape_id(x) if len(x) == 6 and isinstance(x[0], int) else "")
def test_forward_lowers_for_h200(shape, kernels):
  """dk = 128: the chunk-start inverses run in XLA (split_inverse="auto")."""
  text = _lower(shape, jnp.bfloat16, "tf32x3", grad=False, prep="split")
  assert text.count("__gpu$xla.gpu.triton") == len(kernels)
  assert all(k in text for k in kernels)
  assert "vla_chunk_prep" not in text
