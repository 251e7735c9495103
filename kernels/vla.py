"""`vla_pallas`: the VLA recurrence with the penalty path in XLA and the state path in Pallas."""

import jax
import jax.numpy as jnp

from vla_jax.kernels.penalty import penalty_parallel
from vla_jax.kernels.state_path import KernelConfig, state_path
from vla_jax.ops.checks import compute_dtype
from vla_jax.ops.utils import unit
from vla_jax.ops.vla.recurrence import KEY_EPS, WRITE_EPS


def _head_major(x, T_pad):
  """[B, T, H, d] -> [B, H, T_pad, d] (zero-padded in time)."""
  x = jnp.pad(x, [(0, 0), (0, T_pad - x.shape[1]), (0, 0), (0, 0)])
  return jnp.swapaxes(x, 1, 2)


def default_interpret():
  """True when the default backend is not a GPU: kernels then run in Pallas interpret mode."""
  return jax.default_backend() != "gpu"


def vla_pallas(q, k, v, u, S0, A0, *, config=KernelConfig(), interpret=None):
  """VLA (Pandey & Singh, 2026) per head:
  A_t = (A_0^-1 + sum_{s<=t} u_s u_s^T)^-1, a_t = unit(A_t khat_t),
  S_t = S_{t-1} + (v_t - S_{t-1} khat_t) a_t^T, o_t = S_t q_t.

  The penalty path runs in XLA, parallel over chunks (`penalty.py`); the state path is the
  Pallas kernel pair of `state_path.py` (forward pass and reverse pass over chunk states).
  The same algorithm runs whatever the backend; only `interpret` changes how the two Pallas
  kernels execute.

  Args:
    q, k: [B, T, H, dk] queries and keys (feature-mapped), float32, bfloat16 or float64.
    v: [B, T, H, dv] values.
    u: [B, T, H, dk] penalty directions.
    S0: [B, H, dv, dk] initial memory; A0: [B, H, dk, dk] initial penalty inverse (SPD).
    config: `KernelConfig` (chunk size, value block, warps, stages, precision, refine).
    interpret: True runs the kernels in Pallas interpret mode (slow, any backend); False
      compiles them with Triton (needs a GPU); None (default) picks interpret mode exactly
      when `jax.default_backend()` is not "gpu".

  Returns:
    (o [B, T, H, dv] in v's dtype, S_T [B, H, dv, dk], A_T [B, H, dk, dk]); the states are
    float32, or float64 when any input is float64. Any T: the tail is padded with zero keys
    and zero u, which is exact.

  Raises:
    ValueError for head dims outside {16, 32, 64, 128}, chunk sizes outside 16..128 (powers
    of two) or a bad value block.
  """
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  config.validate(dk, dv)
  if interpret is None:
    interpret = default_interpret()
  if interpret != config.interpret:
    config = type(config)(**{**config.__dict__, "interpret": bool(interpret)})
  acc = compute_dtype(q, k, v, u, S0, A0)
  C = config.chunk_size
  T_pad = -(-T // C) * C
  N = T_pad // C

  khat = unit(_head_major(k, T_pad).astype(acc), KEY_EPS)      # [B, H, T_pad, dk]
  u_h = _head_major(u, T_pad).astype(acc)
  chunks = lambda x: x.reshape(B, H, N, C, x.shape[-1])
  W, A_T = penalty_parallel(chunks(khat), chunks(u_h), A0.astype(acc), refine=config.refine,
                            precision=jax.lax.Precision.HIGHEST, solver=config.solver)
  a = unit(W.reshape(B, H, T_pad, dk), WRITE_EPS)

  flat = lambda x: x.reshape(B * H, T_pad, x.shape[-1])
  o, S_T = state_path(flat(_head_major(q, T_pad)), flat(khat), flat(a),
                      flat(_head_major(v, T_pad)), S0.astype(acc).reshape(B * H, dv, dk),
                      config=config)
  o = jnp.swapaxes(o.reshape(B, H, T_pad, dv), 1, 2)[:, :T]
  return o, S_T.reshape(B, H, dv, dk), A_T
