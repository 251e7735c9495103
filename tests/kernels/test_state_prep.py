"""`state_prep`: the state path's per-chunk factors U' = T V, W' = T E, P = tril(Q W^T), T =
(I + strictly_lower(E W^T))^-1, against float64 NumPy, in both input layouts, at every chunk
size, with packed documents and decays, and with ill-conditioned I + N."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import TOL, assert_close, plan_for, rel, unit_np
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.state_prep import state_prep

BH, C, N, dk, dv = 2, 16, 3, 32, 16


def _factors_np(e, w, q, v, C=C, rel=None, gate=None):
  """(U', W', P, T) chunk by chunk in float64, head-major [BH, N * C, .]; rel: packed
  documents' chunk-relative indices, gate: cumulative log decays within chunks ([BH, N * C])."""
  split = lambda x: np.asarray(x, np.float64).reshape(x.shape[0], -1, C, x.shape[-1])
  E, W, Q, V = map(split, (e, w, q, v))
  weight = np.ones(E.shape[:2] + (C, C))
  if rel is not None:
    r = split(np.asarray(rel)[..., None])[..., 0]
    weight = (r[..., :, None] == r[..., None, :]).astype(np.float64)
  if gate is not None:
    G = split(np.asarray(gate, np.float64)[..., None])[..., 0]
    weight = np.exp(np.tril(G[..., :, None] - G[..., None, :]))
    E_w = np.exp(G)[..., None] * E
  L = np.tril(np.einsum("bnik,bnjk->bnij", E, W) * weight, -1) + np.eye(C)
  T = np.linalg.inv(L)
  P = np.tril(np.einsum("bnik,bnjk->bnij", Q, W) * weight)
  Wp = T @ (E if gate is None else E_w)
  if rel is not None:
    Wp = Wp * (r == 0)[..., None]
  merge = lambda x: x.reshape(x.shape[0], -1, x.shape[-1])
  return merge(T @ V), merge(Wp), merge(P), merge(T)


def _inputs(seed, dtype=np.float64, C=C, w_norm=1.0):
  """e, w, q, v [BH, N * C, .] with unit erase keys e and write keys w of norm w_norm."""
  rng = np.random.default_rng(seed)
  e = unit_np(rng.standard_normal((BH, N * C, dk)), 1e-6)
  w = w_norm * unit_np(rng.standard_normal((BH, N * C, dk)), 1e-6)
  q = rng.standard_normal((BH, N * C, dk))
  v = rng.standard_normal((BH, N * C, dv))
  return [jnp.asarray(x, dtype) for x in (e, w, q, v)]


def test_factors_float64(x64):
  e, w, q, v = _inputs(0)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, N)
  got = jax.jit(lambda *a: state_prep(*a, plan=plan, with_inverse=True))(e, w, q, v)
  for name, g, r in zip(("U'", "W'", "P", "T"), got, _factors_np(e, w, q, v)):
    assert_close(g, r, jnp.float64, name)


def test_token_major_raw_keys_bfloat16():
  """heads=H: e (raw keys, made unit in the kernel), q and v read as the caller's
  [B, T, H, d]; bfloat16 operands and bfloat16 outputs (the inference default)."""
  B, H = 1, 2
  rng = np.random.default_rng(1)
  k = rng.standard_normal((B, N * C, H, dk)) * 3
  w = unit_np(rng.standard_normal((B * H, N * C, dk)), 1e-6)
  q = rng.standard_normal((B, N * C, H, dk))
  v = rng.standard_normal((B, N * C, H, dv))
  bf = lambda x: jnp.asarray(x, jnp.bfloat16)
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dv, B * H, N)
  got = jax.jit(lambda *a: state_prep(*a, plan=plan, out_dtype=plan.store, heads=H))(
      bf(k), jnp.asarray(w, jnp.float32), bf(q), bf(v))
  assert all(g.dtype == jnp.bfloat16 for g in got)
  heads = lambda x: np.swapaxes(np.asarray(bf(x), np.float64), 1, 2).reshape(B * H, N * C, -1)
  want = _factors_np(unit_np(heads(k), 1e-6), w, heads(q), heads(v))
  for name, g, r in zip(("U'", "W'", "P"), got, want):
    assert_close(g, r, jnp.bfloat16, name)


@pytest.mark.parametrize("offset", [4, 15])
def test_non_finite_row_reaches_later_rows_only(offset):
  """A NaN in chunk 1's row C + offset of e: factors of earlier rows unchanged, of rows at or
  after it non-finite (U', W'), other chunks untouched."""
  row = C + offset
  e, w, q, v = _inputs(2, np.float32, C)
  plan = plan_for(KernelConfig(chunk_size=C), np.float32, dk, dv, BH, N)
  fn = jax.jit(lambda *a: state_prep(*a, plan=plan, with_inverse=True))
  clean = fn(e, w, q, v)
  bad = fn(e.at[0, row, 3].set(jnp.nan), w, q, v)
  for c, b in zip(clean, bad):
    c, b = np.asarray(c), np.asarray(b)
    np.testing.assert_array_equal(b[0, :row], c[0, :row])
    np.testing.assert_array_equal(b[0, 2 * C:], c[0, 2 * C:])
    np.testing.assert_array_equal(b[1], c[1])
  for b in bad[:2]:
    assert not np.isfinite(np.asarray(b)[0, row:2 * C]).any()


def _packed_rel(seed, C):
  """[BH, N * C] chunk-relative document indices (`vla.document_indices`: the starts in the
  chunk up to each token): documents starting at random tokens, at a chunk start, two in a
  row (a one-token document) and 16 tokens into a chunk."""
  rng = np.random.default_rng(seed)
  starts = rng.random((BH, N * C)) < 4 / C
  starts[:, [C, C + 5, C + 6, C + 16]] = True
  return np.cumsum(starts.reshape(BH, N, C), axis=2).reshape(BH, N * C).astype(np.int32)


def _gate(seed, C):
  """[BH, N * C] cumulative log decays within each chunk (per token -U(0, 0.3), one -30)."""
  rng = np.random.default_rng(seed)
  g = -rng.uniform(0.0, 0.3, (BH, N * C))
  g[0, C + 20] = -30.0
  return np.cumsum(g.reshape(BH, N, C), axis=2).reshape(BH, N * C)


@pytest.mark.parametrize("C,side", [(16, None), (32, None), (64, None), (128, None),
                                    (64, "packed"), (64, "gated")])
def test_every_chunk_size_packed_and_decays_float64(x64, C, side):
  """At every chunk size, with packed documents and with decays: U', W', P and T against
  float64 NumPy, write keys of norm 3 (2 at C = 128; T's entries up to 1e4 and 3e3)."""
  e, w, q, v = _inputs(3, np.float64, C, w_norm=3.0 if C <= 64 else 2.0)
  extra = {}
  if side == "packed":
    extra = {"rel": _packed_rel(4, C)}
  elif side == "gated":
    extra = {"gate": _gate(4, C)}
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, N)
  got = jax.jit(lambda *a, **kw: state_prep(*a, plan=plan, with_inverse=True, **kw))(
      e, w, q, v, **{k: jnp.asarray(x) for k, x in extra.items()})
  for name, g, r in zip(("U'", "W'", "P", "T"), got, _factors_np(e, w, q, v, C, **extra)):
    assert_close(g, r, jnp.float64, name)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_ill_conditioned_float32_and_bfloat16(dtype):
  """C = 64, write keys of norm 4 (T's entries up to ~1e4): float32 inputs, and bfloat16
  inputs read token-major in place (raw keys made unit in the kernel, bfloat16 operands and
  outputs, as the inference forward runs), against float64 on the same values. float32: each
  factor within the float32 tolerance element-wise; bfloat16: each within the bfloat16
  tolerance in norm (2.0e-2 for U', W' and T, 2.3e-3 for P; float32: 5e-7 at most)."""
  C, H, B = 64, 2, 1
  e, w, q, v = _inputs(5, np.float32, C, w_norm=4.0)
  low = dtype == jnp.bfloat16
  heads = lambda x: np.swapaxes(np.asarray(x, np.float64).reshape(B, H, N * C, -1), 1, 2)
  rows = lambda x: np.swapaxes(np.asarray(x, np.float64), 1, 2).reshape(B * H, N * C, -1)
  if low:   # raw keys of norm 3, q and v token-major [B, T, H, d] in bfloat16
    args = [jnp.asarray(3 * heads(e), dtype), jnp.asarray(w, jnp.float32),
            jnp.asarray(heads(q), dtype), jnp.asarray(heads(v), dtype)]
    exact = [unit_np(rows(args[0]), 1e-6), np.asarray(args[1], np.float64),
             rows(args[2]), rows(args[3])]
  else:
    args = [jnp.asarray(x, dtype) for x in (e, w, q, v)]
    exact = [np.asarray(x, np.float64) for x in args]
  plan = plan_for(KernelConfig(chunk_size=C), dtype, dk, dv, B * H, N)
  got = jax.jit(lambda *a: state_prep(*a, plan=plan, with_inverse=True, out_dtype=plan.store,
                                      heads=H if low else None))(*args)
  for name, g, r in zip(("U'", "W'", "P", "T"), got, _factors_np(*exact, C)):
    if low:
      assert rel(g, r) < TOL["bfloat16"], (name, rel(g, r))
    else:
      assert_close(g, r, dtype, name)
