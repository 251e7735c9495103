"""Shared pieces of the kernel tests: the tolerance table, inputs, float64 references.

Every kernel test runs its kernel in Pallas interpret mode (`INTERPRET`) on small awkward
shapes and compares with the float64 NumPy oracles of tests/oracles.py; `test_lowering.py`
lowers the same kernels for an abstract H200, and `experiments/check_kernels.py` is the GPU
twin.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

import oracles

INTERPRET = True

# Relative tolerance by the inputs' dtype (interpret mode: float32 products are float32;
# bfloat16 products take bfloat16 operands, as on the GPU).
TOL = {"float64": 1e-10, "float32": 2e-5, "bfloat16": 3e-2}


def assert_close(actual, expected, dtype, name=""):
  """chex elementwise closeness, tolerance TOL[dtype] relative to the RMS of `expected`."""
  tol = TOL[jnp.dtype(dtype).name]
  expected = np.asarray(expected, np.float64)
  scale = float(np.sqrt(np.mean(expected ** 2))) or 1.0
  chex.assert_trees_all_close(np.asarray(actual, np.float64), expected, rtol=tol,
                              atol=tol * scale, custom_message=name)


def rel(actual, expected):
  actual, expected = (np.asarray(x, np.float64) for x in (actual, expected))
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def vla_inputs(seed, B, T, H, dk, dv, dtype=np.float64):
  """q, k, v, u [B, T, H, .] in dtype and S0 [B, H, dv, dk], A0 [B, H, dk, dk] (SPD, not
  diagonal) in float64 (float32 for non-float64 dtypes)."""
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((B, T, H, dk)) for _ in range(2))
  v = rng.standard_normal((B, T, H, dv))
  u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
  S0 = rng.standard_normal((B, H, dv, dk)) / 4
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2))
  state = np.float64 if dtype == np.float64 else np.float32
  return ([jnp.asarray(x, dtype) for x in (q, k, v, u)]
          + [jnp.asarray(x, state) for x in (S0, A0)])


def anisotropic_u(rng, B, H, T, d, rank=4, noise=0.01, norm=None):
  """Penalty directions [B, H, T, d] that make M_t ill-conditioned, as a trained layer's do:
  per head `rank` fixed directions with normal weights plus `noise` times isotropic noise,
  rows normalised to `norm` (default 1 / sqrt(d); cond(M_T) grows like T norm^2 / lam0)."""
  basis = rng.standard_normal((H, rank, d))
  u = (np.einsum("bhtr,hrd->bhtd", rng.standard_normal((B, H, T, rank)), basis)
       + noise * rng.standard_normal((B, H, T, d)))
  return u / np.linalg.norm(u, axis=-1, keepdims=True) * (norm or 1 / np.sqrt(d))


def isotropic_u(rng, B, H, T, d, norm=1.0):
  """Penalty directions [B, H, T, d]: normal rows normalised to `norm`."""
  u = rng.standard_normal((B, H, T, d))
  return u / np.linalg.norm(u, axis=-1, keepdims=True) * norm


def unit_np(x, eps):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def penalty_rows_np(khat, u, A0):
  """`oracles.penalty` on head-major rows: khat, u [BH, T, dk], A0 [BH, dk, dk] -> (rows
  A_t khat_t [BH, T, dk], A_T [BH, dk, dk]) in float64."""
  W, A = oracles.penalty(*(np.asarray(x)[:, :, None] for x in (khat, u)),
                         np.asarray(A0)[:, None])
  return W[:, :, 0], A[:, 0]


def state_path_np(q, e, w, v, S0):
  """`oracles.delta_rule` on head-major rows: q, e, w [BH, T, dk], v [BH, T, dv], S0
  [BH, dv, dk] -> (o [BH, T, dv], S_T) in float64."""
  o, S = oracles.delta_rule(*(np.asarray(x)[:, :, None] for x in (q, e, w, v)),
                            np.asarray(S0)[:, None])
  return o[:, :, 0], S[:, 0]


def state_path_loop(q, e, w, v, S0):
  """The same in JAX (`lax.scan`), to differentiate."""
  def step(S, x):
    q_t, e_t, w_t, v_t = x
    S = S + jnp.einsum("bv,bk->bvk", v_t - jnp.einsum("bvk,bk->bv", S, e_t), w_t)
    return S, jnp.einsum("bvk,bk->bv", S, q_t)
  S, o = jax.lax.scan(step, S0, tuple(jnp.swapaxes(x, 0, 1) for x in (q, e, w, v)))
  return jnp.swapaxes(o, 0, 1), S


def plan_for(config, dtype, dk, dv, BH, N, acc=None, **overrides):
  """`config.plan` for inputs of `dtype` in interpret mode, with fields overridden (to reach
  the forms a default selects only at GPU-sized program counts)."""
  import dataclasses   # pylint: disable=import-outside-toplevel
  acc = acc or (jnp.float64 if dtype == np.float64 else jnp.float32)
  plan = config.plan(low=jnp.dtype(dtype) == jnp.bfloat16, acc=acc, dk=dk, dv=dv, BH=BH, N=N,
                     interpret=INTERPRET)
  return dataclasses.replace(plan, **overrides)
