"""DeltaNet, Gated DeltaNet and linear attention on the Pallas state path, with their VJPs.

Both are the generalised delta rule S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T, o_t = S_t q_t
that `state_path.py` computes forward and `state_backward.py` backward for VLA (NOTES.md):

| op | erase key e_t | write key w_t |
| --- | --- | --- |
| DeltaNet | khat_t = k_t / max(|k_t|, 1e-6) | beta_t khat_t |
| Gated DeltaNet | khat_t | beta_t khat_t, and the state decays by gamma_t = exp(g_t) |
| linear attention | 0 (no erase) | k_t (feature-mapped by the caller) |

Gated DeltaNet, S_t = gamma_t S_{t-1} + (v_t - gamma_t S_{t-1} e_t) w_t^T, runs on the same
kernels given each chunk's cumulative log decays G_i = g_1 + ... + g_i (XLA, each g floored at
2 log(eps) of the accumulation dtype, a reset to working precision, as the chunked XLA form):
the state prep weights N and P by exp(G_i - G_j) and forms W' = T (exp(G) E), the state loops
carry exp(G_C) S_c + R^T (exp(G_C - G) W) and read exp(G) Q S_c^T (flash-linear-attention's
chunk_gated_delta_rule does the same per chunk). Backward: the reverse pass in the kernels
with the same decays; the chunk-local VJP, with the decays' cotangent dG, as batched XLA
products (`state_backward._local_vjp_gated_xla`); XLA autodiff takes dG to the log decays.
Packed documents are not taken with decays (a ValueError).

Only XLA element-wise work surrounds the kernels (unit keys, beta times them, head-major
copies of e and w in the accumulation dtype, zero padding of the tail): autodiff of it takes
the state path's cotangents of e and w to k and beta, so the kernels' custom VJP
(`state_path.planned_state_path`) gives the gradients of q, k, v, beta and the initial state.
q and v are read in place ([B, T, H, d]).

Packed documents (`segment_ids`): the state path restarts S at 0 at every document start
(anywhere in a chunk; `vla.document_indices`), the row's first document continuing from S0.

Non-finite inputs: the kernels keep a NaN or Inf at token t to outputs at tokens >= t
(kernels/NOTES.md, `common.py`); a token with a zero key writes nothing (its value and beta
are dropped here). With packed documents a non-finite token also reaches the row's later
documents (the XLA forms keep it to its document), as for `vla_pallas`.
"""

import math

import jax.numpy as jnp

from vla_jax.kernels.config import KernelConfig, compile_target, pad_value_width
from vla_jax.kernels.state_path import planned_state_path
from vla_jax.kernels.vla import default_interpret, document_indices
from vla_jax.ops.checks import check_segment_ids, compute_dtype
from vla_jax.ops.utils import KEY_EPS, unit


def deltanet_pallas(q, k, v, beta, S0, *, segment_ids=None, config=KernelConfig(),
                    interpret=None):
  """DeltaNet per head: S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) khat_t^T, o_t = S_t q_t.

  Args:
    q, k: [B, T, H, dk] queries and keys (k unit-normalised here), float32, bfloat16 or
      float64; dk one of `config.SUPPORTED_HEAD_DIMS`.
    v: [B, T, H, dv] values (any dv: other widths run on zero value columns up to the next
      supported head dim).
    beta: [B, T, H] write strengths.
    S0: [B, H, dv, dk] initial state.
    segment_ids: None, or [B, T] int document ids (module docstring).
    config: `KernelConfig` (chunk size, precision, value block).
    interpret: Pallas interpret mode; None (default): exactly when the backend is not a GPU.

  Returns:
    (o [B, T, H, dv] in v's dtype, S_T [B, H, dv, dk] in the accumulation dtype: float32, or
    float64 when any input is float64). Differentiable in q, k, v, beta and S0.
  """
  acc = compute_dtype(q, k, v, beta, S0)
  khat = unit(k.astype(acc), KEY_EPS)
  return _run(q, khat, beta.astype(acc)[..., None] * khat, v, S0, k, acc, segment_ids,
              config, interpret)


def gated_deltanet_pallas(q, k, v, beta, log_decay, S0, *, config=KernelConfig(),
                          interpret=None):
  """Gated DeltaNet per head: S_t = gamma_t S_{t-1} + beta_t (v_t - gamma_t S_{t-1} khat_t)
  khat_t^T with gamma_t = exp(log_decay_t), o_t = S_t q_t (module docstring).

  Args: as `deltanet_pallas`, plus log_decay [B, T, H] (<= 0; -inf is a reset), without
  segment_ids. Returns (o, S_T) likewise; differentiable in q, k, v, beta, log_decay and S0.
  """
  acc = compute_dtype(q, k, v, beta, S0, log_decay)
  khat = unit(k.astype(acc), KEY_EPS)
  return _run(q, khat, beta.astype(acc)[..., None] * khat, v, S0, k, acc, None, config,
              interpret, log_decay=log_decay)


def linear_attention_pallas(q, k, v, S0, *, segment_ids=None, config=KernelConfig(),
                            interpret=None):
  """Linear attention per head (no normaliser): S_t = S_{t-1} + v_t k_t^T, o_t = S_t q_t.

  Args: as `deltanet_pallas`, with q and k already feature-mapped (phi(q), phi(k)) and no
  beta. Returns (o, S_T) likewise; differentiable in q, k, v and S0.
  """
  acc = compute_dtype(q, k, v, S0)
  return _run(q, None, k.astype(acc), v, S0, k, acc, segment_ids, config, interpret)


def _run(q, e, w, v, S0, k, acc, segment_ids, config, interpret, log_decay=None):
  """The state path on [B, T, H, d] erase keys e (None: none), write keys w (accumulation
  dtype), q and v read in place; k (the caller's keys) marks the tokens that write;
  log_decay: None, or [B, T, H] per-token log decays."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  if w.shape != (B, T, H, dk) or v.shape[:3] != (B, T, H) or S0.shape != (B, H, dv, dk):
    raise ValueError(f"q, k must be [B, T, H, dk], v [B, T, H, dv] and S0 [B, H, dv, dk] "
                     f"alike; got q {q.shape}, k {w.shape}, v {v.shape}, S0 {S0.shape}")
  segment_ids = check_segment_ids(segment_ids, B, T)
  v, S0, dv_run = pad_value_width(v, S0)     # the extra outputs are dropped below
  config.validate(dk, dv_run)
  interpret = default_interpret() if interpret is None else bool(interpret)
  C = config.chunk_size
  N = -(-T // C)
  T_pad = N * C
  if T == 0:
    return jnp.zeros((B, 0, H, dv), v.dtype), S0[:, :, :dv].astype(acc)
  # A token with a zero key writes nothing, whatever its value and beta (padding).
  writes = jnp.any(k != 0, axis=-1, keepdims=True)
  w = jnp.where(writes, w, jnp.zeros((), acc))
  v = jnp.where(writes, v, jnp.zeros((), v.dtype))
  pad = lambda x: jnp.pad(x, [(0, 0), (0, T_pad - T)] + [(0, 0)] * (x.ndim - 2))
  rows = lambda x: jnp.swapaxes(pad(x), 1, 2).reshape(B * H, T_pad, dk)
  w = rows(w)
  e = jnp.zeros_like(w) if e is None else rows(e)
  plan = config.plan(low=all(x.dtype == jnp.bfloat16 for x in (q, k, v)), acc=acc, dk=dk,
                     dv=dv_run, BH=B * H, N=N, interpret=interpret,
                     target=compile_target(interpret))
  rel = None if segment_ids is None else document_indices(segment_ids, T_pad, C, H)[2]
  o, S_T = planned_state_path(plan, pad(q), e, w, pad(v),
                              S0.astype(acc).reshape(B * H, dv_run, dk), H, rel,
                              None if log_decay is None else chunk_log_decays(
                                  log_decay.astype(acc), C, T_pad))
  return o[:, :T, :, :dv], S_T.reshape(B, H, dv_run, dk)[:, :, :dv]


def chunk_log_decays(log_decay, C, T_pad):
  """[B, T, H] per-token log decays -> [B * H, T_pad] cumulative sums within each chunk of C
  tokens (head-major), each token's floored at 2 log(eps) of its dtype (exp of the floor is
  eps^2: a reset to working precision; a hard reset, -inf, then gives finite differences
  G_i - G_j), the padded tail 0 (no decay)."""
  B, T, H = log_decay.shape
  floor = 2.0 * math.log(jnp.finfo(log_decay.dtype).eps)
  g = jnp.pad(jnp.maximum(log_decay, floor), [(0, 0), (0, T_pad - T), (0, 0)])
  G = jnp.cumsum(g.reshape(B, T_pad // C, C, H), axis=2).reshape(B, T_pad, H)
  return jnp.swapaxes(G, 1, 2).reshape(B * H, T_pad)
