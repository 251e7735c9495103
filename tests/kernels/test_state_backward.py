"""The state path's backward (`state_backward.py`): its custom VJP against autodiff of a plain
loop in float64, in each form a default selects (split or fused reverse pass; chunk-local VJP
as one kernel or as XLA products), bfloat16 operands, and zero cotangents meeting NaN; the
chunk-local VJP kernel over value blocks against the one-pass kernel and autodiff of the chunk
map in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import assert_close, plan_for, rel, state_path_loop, unit_np
from vla_jax.kernels import KernelConfig
from vla_jax.kernels.common import head_rows, token_rows
from vla_jax.kernels.state_backward import local_vjp
from vla_jax.kernels.state_path import planned_state_path

BH, T, dk, dv, C = 2, 48, 16, 32, 16


def _inputs(seed, dtype=np.float64):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((BH, T, dk)) / 2
  e, w = (unit_np(rng.standard_normal((BH, T, dk)), 1e-6) for _ in range(2))
  v = rng.standard_normal((BH, T, dv))
  S0 = rng.standard_normal((BH, dv, dk)) / 4
  return [jnp.asarray(x, dtype) for x in (q, e, w, v, S0)]


def _loss(fn, seed, dtype=jnp.float64):
  rng = np.random.default_rng(seed)
  wo = jnp.asarray(rng.standard_normal((BH, T, dv)), dtype)
  wS = jnp.asarray(rng.standard_normal((BH, dv, dk)), dtype)
  return lambda *a: (lambda o, S: jnp.sum(wo * o) + jnp.sum(wS * S))(*fn(*a))


@pytest.mark.parametrize("split,fused_vjp", [(True, True), (False, False)],
                         ids=["split-kernel_vjp", "fused-xla_vjp"])
def test_gradients_float64(x64, split, fused_vjp):
  args = _inputs(0)
  plan = plan_for(KernelConfig(chunk_size=C), np.float64, dk, dv, BH, T // C,
                  split_backward=split, fused_vjp=fused_vjp)
  got = jax.jit(jax.grad(_loss(lambda *a: planned_state_path(plan, *a, None), 1),
                         argnums=range(5)))(*args)
  want = jax.jit(jax.grad(_loss(state_path_loop, 1), argnums=range(5)))(*args)
  for name, g, r in zip(("q", "e", "w", "v", "S0"), got, want):
    assert_close(g, r, jnp.float64, "d" + name)


def test_bfloat16_operands_within_bfloat16_bound():
  """bfloat16 inputs at DEFAULT: the local VJP's operands, T and dS_next in bfloat16."""
  args = _inputs(2)
  bf = [x.astype(jnp.bfloat16) for x in args[:4]] + [args[4].astype(jnp.float32)]
  plan = plan_for(KernelConfig(chunk_size=C), jnp.bfloat16, dk, dv, BH, T // C)
  assert plan.low and plan.fused_vjp
  got = jax.jit(jax.grad(_loss(lambda *a: planned_state_path(plan, *a, None), 3, jnp.float32),
                         argnums=range(5)))(*bf)
  exact = [x.astype(jnp.float64) for x in bf]
  with jax.enable_x64(True):
    want = jax.jit(jax.grad(_loss(state_path_loop, 3), argnums=range(5)))(
        *(jnp.asarray(np.asarray(x), jnp.float64) for x in exact))
  for name, g, r in zip(("q", "e", "w", "v", "S0"), got, want):
    assert_close(g, r, jnp.bfloat16, "d" + name)


@pytest.mark.parametrize("split", [True, False])
def test_zero_cotangents_meet_nan_cleanly(split):
  """NaN in w at token 21 and a loss on outputs before it: every cotangent before token 21
  (and of S0) equals the clean run's."""
  args = _inputs(4, np.float32)
  plan = plan_for(KernelConfig(chunk_size=C), np.float32, dk, dv, BH, T // C,
                  split_backward=split, split_output=split, fused_vjp=split)
  wo = jnp.asarray(np.random.default_rng(5).standard_normal((BH, 21, dv)), jnp.float32)
  loss = lambda *a: jnp.sum(wo * planned_state_path(plan, *a, None)[0][:, :21])
  grad = jax.jit(jax.grad(loss, argnums=range(5)))
  bad = list(args)
  bad[2] = bad[2].at[:, 21, 0].set(jnp.nan)
  for name, gc, gn in zip(("q", "e", "w", "v", "S0"), grad(*args), grad(*bad)):
    gc, gn = np.asarray(gc), np.asarray(gn)
    if name != "S0":
      gc, gn = gc[:, :21], gn[:, :21]
    np.testing.assert_array_equal(gn, gc, err_msg="d" + name)


# ----------------------------------------------------------------------------- local VJP

def _chunk_vjp_np(q, e, w, v, S, dO, dSn):
  """Float64 reference of `local_vjp`: autodiff of one chunk's map O = Q S^T + P R,
  S_next = S + R^T W, R = T (V - E S^T), P = tril(Q W^T), T = (I + strictly_lower(E W^T))^-1,
  with S fixed, fed (dO, dSn); every argument [BH, N, ...]. Also returns P and T."""
  def chunk(q, e, w, v, S):
    P = jnp.tril(q @ w.T)
    T = jnp.linalg.inv(jnp.eye(q.shape[0]) + jnp.tril(e @ w.T, -1))
    R = T @ (v - e @ S.T)
    return (q @ S.T + P @ R, S + R.T @ w), (P, T)

  def one(q, e, w, v, S, dO, dSn):
    _, vjp, (P, T) = jax.vjp(lambda *a: chunk(*a, S), q, e, w, v, has_aux=True)
    return vjp((dO, dSn)), P, T

  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(x, np.float64)) for x in (q, e, w, v, S, dO, dSn)]
    grads, P, T = jax.jit(jax.vmap(jax.vmap(one)))(*args)
    return [np.asarray(x) for x in (*grads, P, T)]


def _local_vjp_inputs(seed, B, H, N, C, dk, dv):
  """Chunk-major float64 inputs of `local_vjp` ([BH, N, C, .] rows, [BH, N, dv, dk] states),
  the forward's P and T and the reference cotangents (dq, de, dw, dv) [BH, N, C, .]."""
  rng = np.random.default_rng(seed)
  BH = B * H
  q = rng.standard_normal((BH, N, C, dk)) / 2
  e, w = (unit_np(rng.standard_normal((BH, N, C, dk)), 1e-6) for _ in range(2))
  v, dO = (rng.standard_normal((BH, N, C, dv)) for _ in range(2))
  S, dSn = (rng.standard_normal((BH, N, dv, dk)) / 4 for _ in range(2))
  dq, de, dw, dv_, P, T = _chunk_vjp_np(q, e, w, v, S, dO, dSn)
  return (q, e, w, v, dO, S, dSn, P, T), (dq, de, dw, dv_)


def _run_local_vjp(plan, H, dtype, value_blocks, q, e, w, v, dO, S, dSn, P, T):
  """`local_vjp` on chunk-major inputs (q, v, dO token-major [B, N*C, H, d], as the pipeline
  passes them; P, T and dS_next in `dtype` under bfloat16 products, as the forward writes
  them) for each value block in one jitted call; cotangents back chunk-major [BH, N, C, .]."""
  acc = jnp.dtype(plan.acc)
  low = acc if not plan.low else jnp.bfloat16
  rows = lambda x, dt: jnp.asarray(np.asarray(x).reshape(x.shape[0], -1, x.shape[-1]), dt)
  tok = lambda x: token_rows(rows(x, dtype), H)
  args = (tok(q), rows(e, acc), rows(w, acc), tok(v), tok(dO), jnp.asarray(S, acc),
          jnp.asarray(dSn, low), rows(P, low), jnp.asarray(T, low))
  N, C = q.shape[1], q.shape[2]

  def run(*a):
    out = []
    for bv in value_blocks:
      dq, de, dw, dv = local_vjp(plan, *a, heads=H, value_block=bv)
      out.append([x.reshape(x.shape[0], N, C, -1)
                  for x in (head_rows(dq, H), de, dw, head_rows(dv, H))])
    return out

  return [[np.asarray(x, np.float64) for x in grads] for grads in jax.jit(run)(*args)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, jnp.bfloat16],
                         ids=["f64", "f32-highest", "bf16"])
def test_value_split_local_vjp(x64, dtype):
  """The chunk-local VJP kernel over value blocks of 16 columns (dk = dv = 32) equals the
  one-pass kernel and the float64 reference: float64 to 1e-10, float32 at HIGHEST to 1e-6 of
  each other, bfloat16 products within the bfloat16 bound."""
  B, H, N, C, dk, dv = 1, 2, 2, 16, 32, 32
  inputs, want = _local_vjp_inputs(0, B, H, N, C, dk, dv)
  precision = jax.lax.Precision.HIGHEST if dtype == np.float32 else jax.lax.Precision.DEFAULT
  plan = plan_for(KernelConfig(chunk_size=C, precision=precision), dtype, dk, dv, B * H, N,
                  fused_vjp=True)
  assert plan.low == (dtype == jnp.bfloat16)
  one, split = _run_local_vjp(plan, H, dtype, (dv, 16), *inputs)
  for name, a, b, r in zip(("dq", "de", "dw", "dv"), one, split, want):
    assert_close(a, r, dtype, name + " one pass")
    assert_close(b, r, dtype, name + " split")
    if dtype != jnp.bfloat16:
      assert rel(b, a) < (1e-6 if dtype == np.float32 else 1e-12), name


def test_value_split_local_vjp_meets_nan_cleanly():
  """A NaN in w at a later token of a chunk (the forward's P and T non-finite from there on,
  the next chunk's start state NaN) with zero cotangents from that token on: every cotangent
  before it equals the clean run's, in the one-pass and the split kernel."""
  B, H, N, C, dk, dv, t = 1, 2, 3, 16, 32, 32, 21
  (q, e, w, v, dO, S, dSn, P, T), _ = _local_vjp_inputs(4, B, H, N, C, dk, dv)
  n, i = divmod(t, C)
  dO = dO.reshape(B * H, N * C, dv).copy()
  dO[:, t:] = 0.0
  dO = dO.reshape(B * H, N, C, dv)
  dSn = dSn.copy()
  dSn[:, n:] = 0.0
  # Head 1 holds the NaN run of head 0's inputs.
  q, e, w, v, dO, S, dSn, P, T = (np.concatenate([x[:1], x[:1]]).copy()
                                  for x in (q, e, w, v, dO, S, dSn, P, T))
  w[1, n, i, 0] = np.nan
  P[1, n, i:, i] = np.nan
  T[1, n, i:] = np.nan
  S[1, n + 1:] = np.nan
  plan = plan_for(KernelConfig(chunk_size=C), np.float32, dk, dv, B * H, N, fused_vjp=True)
  for grads in _run_local_vjp(plan, H, np.float32, (dv, 16), q, e, w, v, dO, S, dSn, P, T):
    for name, g in zip(("dq", "de", "dw", "dv"), grads):
      g = g.reshape(B * H, N * C, -1)
      np.testing.assert_array_equal(g[1, :t], g[0, :t], err_msg=name)
