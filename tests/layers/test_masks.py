"""Padding masks: every mixer and impl computes at the real tokens, and leaves in its cache, what
it computes for the unpadded sequences (float64), with non-zero biases and the short
convolution; outputs at the pads are 0, and NaN inputs at the pads reach neither the outputs
nor the gradients."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vla_jax.layers import common, make_mixer

B, D, H = 3, 32, 2          # head_dim 16: the smallest the Pallas kernels take
N1, N2, PAD = 11, 7, 5      # real tokens in a first and a second call; pads per row
MIXERS = [("vla", {"readout": "additive", "qk_map": "elu1"}), ("vla", {"readout": "delta"}),
          ("linear", {}), ("deltanet", {}), ("gated_deltanet", {}), ("softmax", {"conv_size": 4}),
          ("softmax", {"positions": "rope"})]
IDS = [name + "".join(f"-{k}={v}" for k, v in o.items()) for name, o in MIXERS]
# The layers zero k (VLA's u, DeltaNet's beta and log decay) and v at the pads whatever the
# impl, so an impl pads exactly where its op leaves zero-key tokens exact: an op property,
# tests/ops/test_properties.py (VLA's four impls, the baselines' scan and chunked) and
# test_vla_recurrence.py (VLA's XLA impls in float64). Here the impls those leave out, with
# the default options, against the default "chunked" (tested above).
IMPLS = [(name, "associative_scan") for name in ("linear", "deltanet", "gated_deltanet")]


def masks(length, pad, first):
  """Row 0 left-padded, row 1 right-padded, row 2 padded at scattered positions (the first
  call's also at position 0, so the convolution's window crosses pads)."""
  n = length - pad
  scattered = np.ones(length, bool)
  scattered[[0, 3, 4, length - 6, length - 1] if first else [1, 2, 5, length - 3, length - 2]] = 0
  return np.stack([np.r_[np.zeros(pad, bool), np.ones(n, bool)],
                   np.r_[np.ones(n, bool), np.zeros(pad, bool)], scattered])


def pad(x, mask, fill=np.nan):
  """x [B, N, F] (the real tokens) placed at mask's True positions, `fill` elsewhere."""
  index = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
  return np.where(mask[..., None], np.take_along_axis(x, index[..., None], axis=1), fill)


def mixer(name, impl, options, seed=0):
  m = make_mixer(name, D, H, impl=impl, chunk_size=16, options=options, dtype=jnp.float64,
                 param_dtype=jnp.float64, rngs=nnx.Rngs(seed))
  # Non-zero biases (nnx.Linear starts them at 0), so a pad's projection is not zero.
  key = jax.random.key(seed + 1)
  for path, param in nnx.iter_graph(m):
    if isinstance(param, nnx.Param) and path[-1] in ("bias", "dt_bias"):
      key, sub = jax.random.split(key)
      param[...] = 0.5 * jax.random.normal(sub, param.shape, param.dtype)
  return m


@nnx.jit
def two_calls(mixers, x1, x2, mask1, mask2):
  """For each mixer of a list: prefill(x1) from the empty cache, then prefill(x2) from the
  cache it left (one program for the list: XLA:CPU compiles the kernels that the mixers share
  once)."""
  out = []
  for m in mixers:
    cache = m.init_cache(x1.shape[0], x1.shape[1] + x2.shape[1])
    y1, cache1 = m.prefill(x1, cache, attention_mask=mask1)
    y2, cache2 = m.prefill(x2, cache1, attention_mask=mask2)
    out.append((y1, y2, cache1, cache2))
  return out


@nnx.jit
def one_call(m, x, mask):
  return m.prefill(x, attention_mask=mask)


@nnx.jit
def forward(mixers, x, mask):
  return [m(x, attention_mask=mask) for m in mixers]


def max_diff(padded, unpadded, mask):
  """Largest difference at the real tokens; asserts exact zeros at the pads."""
  padded = np.asarray(padded)
  np.testing.assert_array_equal(padded[~mask], 0.0)
  return float(np.abs(padded[mask] - np.asarray(unpadded).reshape(-1, D)).max())


def cache_diff(cache, want):
  return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
             for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(want)))


def inputs():
  rng = np.random.default_rng(0)
  x1, x2 = rng.standard_normal((B, N1, D)), rng.standard_normal((B, N2, D))
  return x1, x2, masks(N1 + PAD, PAD, True), masks(N2 + PAD, PAD, False)


@pytest.fixture(scope="module")
def two_call_runs():
  """(the unpadded batch's two calls with impl "scan", the padded batch's with "chunked", the
  padded first call's forward pass of the softmax mixers), each for every mixer of MIXERS
  from one program."""
  with jax.enable_x64(True):
    x1, x2, mask1, mask2 = inputs()
    want = two_calls([mixer(name, "scan", options) for name, options in MIXERS], x1, x2, None,
                     None)
    chunked = [mixer(name, "chunked", options) for name, options in MIXERS]
    got = two_calls(chunked, pad(x1, mask1), pad(x2, mask2), mask1, mask2)
    softmax = [m for (name, _), m in zip(MIXERS, chunked) if name == "softmax"]
    forwards = iter(forward(softmax, pad(x1, mask1), mask1))
    return want, got, [next(forwards) if name == "softmax" else None for name, _ in MIXERS]


@pytest.mark.parametrize("name,options", MIXERS, ids=IDS)
def test_padded_equals_unpadded(x64, two_call_runs, name, options):
  """Two calls (the second continues the cache of the first), left, right and scattered pads,
  NaN at the pads; impl "chunked" against the unpadded batch run with impl "scan"."""
  _, _, mask1, mask2 = inputs()
  case = MIXERS.index((name, options))
  want1, want2, _, want_cache = two_call_runs[0][case]
  y1, y2, _, cache = two_call_runs[1][case]
  diffs = [max_diff(y1, want1, mask1), max_diff(y2, want2, mask2)]
  if name == "softmax":   # the KV caches differ in layout (pads take slots); y2 read them
    diffs.append(max_diff(two_call_runs[2][case], want1, mask1))
  else:                   # the state, the convolution tails and VLA's readout sum
    diffs.append(cache_diff(cache, want_cache))
  print(f"{IDS[MIXERS.index((name, options))]}: max |padded - unpadded| = {max(diffs):.1e}")
  # jax's attention keeps its softmax in float32 even for float64 inputs.
  assert max(diffs) < (1e-6 if name == "softmax" else 1e-10), diffs


@pytest.mark.parametrize("name,impl", IMPLS, ids=["-".join(c) for c in IMPLS])
def test_every_impl_pads_exactly(x64, name, impl):
  """One call with padding against the unpadded batch (impl "chunked")."""
  x1, _, mask1, _ = inputs()
  want, want_cache = one_call(mixer(name, "chunked", {}), x1, None)
  y, cache = one_call(mixer(name, impl, {}), pad(x1, mask1), mask1)
  diff = max(max_diff(y, want, mask1), cache_diff(cache, want_cache))
  print(f"{name} {impl}: max |padded - unpadded| = {diff:.1e}")
  assert diff < 1e-10


@pytest.mark.parametrize("name", ["vla", "softmax"])
def test_pads_do_not_reach_the_gradients(x64, name):
  """NaN inputs at the pads: the parameters' gradients of a loss on the real tokens are finite
  and equal those of the unpadded batch."""
  m = mixer(name, "chunked", {"conv_size": 4})
  rng = np.random.default_rng(1)
  x = rng.standard_normal((B, N1, D))
  mask = masks(N1 + PAD, PAD, True)

  @nnx.grad
  def grads(m, x, mask):
    return jnp.sum(jnp.tanh(m(x, attention_mask=mask)))  # pads give 0, tanh(0) = 0

  # Both in one program (XLA:CPU compiles the kernels they share once).
  both = nnx.jit(lambda m, padded_x, x, mask: (grads(m, padded_x, mask), grads(m, x, None)))
  padded, plain = (jax.tree.leaves(nnx.state(g)) for g in both(m, pad(x, mask), x, mask))
  chex.assert_tree_all_finite(padded)
  tol = 1e-6 if name == "softmax" else 1e-9   # jax's attention: float32 softmax
  chex.assert_trees_all_close(padded, plain, rtol=tol, atol=tol)


def test_mask_checks():
  m = make_mixer("deltanet", D, H, rngs=nnx.Rngs(0))
  x = jnp.zeros((2, 5, D))
  with pytest.raises(ValueError, match=r"DeltaNet: attention_mask must have shape \[B, T\]"):
    m(x, attention_mask=jnp.ones((2, 4), bool))
  with pytest.raises(TypeError, match="attention_mask must be bool"):
    m.prefill(x, attention_mask=jnp.ones((2, 5)))
  ints = np.array([[0, 1, 1, 1, 1], [1, 1, 1, 0, 2]])
  np.testing.assert_array_equal(common.check_attention_mask("m", ints, 2, 5), ints != 0)
