"""One-token steps of every recurrence, for streaming inference with a fixed-size state.

Each step takes one token per head ([B, H, D] arrays, no time axis) and the state a sequence op
returned (or None for the initial state), and returns (o_t [B, H, dv] in v_t's dtype, state).
Prefill a prompt with the sequence op (any impl), then decode with steps: the outputs equal one
full forward pass. A step's products take `precision` as the sequence ops do (None: JAX's
default, `jax.default_matmul_precision`). Work per token is O(dk (dk + dv)) per head; memory
does not grow with the context.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from vla_jax.ops import checks
from vla_jax.ops.baselines import LinearAttentionState, check_feature_map, elu_plus_one
from vla_jax.ops.delta_rule.naive import delta_rule_step
from vla_jax.ops.utils import KEY_EPS, WRITE_EPS, resolve_precision, unit
from vla_jax.ops.vla.penalty import penalty_step
from vla_jax.ops.vla.recurrence import VLAState, initial_vla_state


def _check_tokens(q_t, k_t, v_t):
  B, H, dk = checks.check_step_tokens("q_t", q_t)
  checks.check_step_tokens("k_t", k_t, batch=B, heads=H, dim=dk)
  dv = checks.check_step_tokens("v_t", v_t, batch=B, heads=H)[2]
  return B, H, dk, dv


def _check_state_arrays(prefix, arrays, shapes):
  for (name, x), shape in zip(arrays, shapes):   # shape and dtype
    checks.check_state(f"{prefix}.{name}" if prefix else name, x, shape)


def vla_step(state: VLAState | None, q_t: jax.Array, k_t: jax.Array, v_t: jax.Array,
             u_t: jax.Array, beta_t: jax.Array | None = None, *, lam0: float = 1.0,
             precision: str | jax.lax.Precision | None = None
             ) -> tuple[jax.Array, VLAState]:
  """One VLA token (see `vla_recurrence` for the recurrence).

  Args:
    state: `VLAState(S [B, H, dv, dk], A [B, H, dk, dk])` in float32/float64, or None for
      S = 0, A = I / lam0.
    q_t, k_t, u_t: [B, H, dk]; v_t: [B, H, dv].
    beta_t: None (a write of strength 1) or [B, H] write strengths.
    lam0: initial ridge, a finite number > 0 (checked when concrete, as in `vla_recurrence`),
      used only when `state` is None; then, computing in float32, it must be at least
      `checks.MIN_LAM0_FLOAT32["scan"]` (the step is the scan's arithmetic), as for
      `vla_recurrence(..., impl="scan")` (a concrete lam0 below is a ValueError).
    precision: of the products, as `vla_recurrence`'s.

  Returns:
    (o_t [B, H, dv] in v_t's dtype, the new `VLAState`).
  """
  B, H, dk, dv = _check_tokens(q_t, k_t, v_t)
  precision = resolve_precision(precision)
  checks.check_step_tokens("u_t", u_t, batch=B, heads=H, dim=dk)
  if beta_t is not None:
    checks.check_step_tokens("beta_t", beta_t, batch=B, heads=H, rank=2)
  if state is None:
    dtype = checks.compute_dtype(q_t, k_t, v_t, u_t, beta_t)
    checks.check_lam0(lam0, "scan", dtype)   # a number > 0, and the scan's float32 floor
    state = initial_vla_state(B, H, dk, dv, lam0=lam0, dtype=dtype)
  else:
    checks.check_positive("lam0", lam0)   # unused, checked as in `vla_recurrence`
    if not isinstance(state, VLAState):
      raise TypeError(f"state must be a VLAState(S, A) or None; got {type(state).__name__}")
  _check_state_arrays("state", (("S", state.S), ("A", state.A)), ((B, H, dv, dk), (B, H, dk, dk)))
  dtype, out_dtype = state.S.dtype, checks.output_dtype(v_t)
  q_t, k_t, v_t, u_t = (x.astype(dtype) for x in (q_t, k_t, v_t, u_t))
  khat = unit(k_t, KEY_EPS)
  w_t, A = penalty_step(state.A, khat, u_t, precision)
  a_t = unit(w_t, WRITE_EPS)
  if beta_t is not None:
    a_t = beta_t.astype(dtype)[..., None] * a_t
  o_t, S = delta_rule_step(state.S, q_t, khat, a_t, v_t, None, precision)
  return o_t.astype(out_dtype), VLAState(S=S, A=A)


def linear_attention_step(state: LinearAttentionState | None, q_t: jax.Array, k_t: jax.Array,
                          v_t: jax.Array, *,
                          feature_map: Callable[[jax.Array], jax.Array] | None = elu_plus_one,
                          normalize: bool = False, eps: float = 1e-6,
                          precision: str | jax.lax.Precision | None = None
                          ) -> tuple[jax.Array, LinearAttentionState]:
  """One token of `linear_attention` (normalize, eps, precision: as there). state:
  `LinearAttentionState` or None (zeros)."""
  B, H, dk, dv = _check_tokens(q_t, k_t, v_t)
  precision = resolve_precision(precision)
  normalize = checks.check_bool("normalize", normalize)
  checks.check_positive("eps", eps)
  out_dtype = checks.output_dtype(v_t)
  if state is not None and not isinstance(state, LinearAttentionState):
    raise TypeError(f"state must be a LinearAttentionState(S, z) or None; got "
                    f"{type(state).__name__}")
  dtype = checks.compute_dtype(q_t, k_t, v_t) if state is None else state.S.dtype
  q_t, k_t, v_t = (x.astype(dtype) for x in (q_t, k_t, v_t))
  if feature_map is not None:   # may change the width dk -> df, as in `linear_attention`
    q_t, k_t = feature_map(q_t), feature_map(k_t)
    dk = check_feature_map(q_t, k_t, (B, H))
  if state is None:
    state = LinearAttentionState(jnp.zeros((B, H, dv, dk), dtype), jnp.zeros((B, H, dk), dtype))
  _check_state_arrays("state", (("S", state.S), ("z", state.z)), ((B, H, dv, dk), (B, H, dk)))
  v1 = jnp.concatenate([v_t, jnp.ones(v_t.shape[:-1] + (1,), dtype)], axis=-1)
  S1 = jnp.concatenate([state.S, state.z[:, :, None].astype(dtype)], axis=2)
  o_t, S1 = delta_rule_step(S1, q_t, None, k_t, v1, None, precision)
  num = o_t[..., :dv]
  if normalize:
    num = num / jnp.maximum(o_t[..., dv], eps)[..., None]
  return num.astype(out_dtype), LinearAttentionState(S1[:, :, :dv], S1[:, :, dv])


def gated_deltanet_step(S: jax.Array | None, q_t: jax.Array, k_t: jax.Array, v_t: jax.Array,
                        beta_t: jax.Array, log_decay_t: jax.Array | None, *,
                        precision: str | jax.lax.Precision | None = None
                        ) -> tuple[jax.Array, jax.Array]:
  """One token of `gated_deltanet` (log_decay_t None: `deltanet`).

  Args:
    S: [B, H, dv, dk] float32/float64 or None (zeros); q_t, k_t: [B, H, dk]; v_t: [B, H, dv];
    beta_t, log_decay_t: [B, H] (log_decay_t <= 0, as for `gated_deltanet`).
    precision: of the products, as `gated_deltanet`'s.

  Returns:
    (o_t [B, H, dv] in v_t's dtype, the new S).

  Raises:
    ValueError for a finite positive log decay when log_decay_t is concrete (under jit it is
    the caller's to keep), as `gated_deltanet` does.
  """
  B, H, dk, dv = _check_tokens(q_t, k_t, v_t)
  precision = resolve_precision(precision)
  checks.check_step_tokens("beta_t", beta_t, batch=B, heads=H, rank=2)
  if log_decay_t is not None:
    checks.check_step_tokens("log_decay_t", log_decay_t, batch=B, heads=H, rank=2)
    checks.check_log_decay(log_decay_t, "log_decay_t", "b, h")
  out_dtype = checks.output_dtype(v_t)
  if S is None:
    S = jnp.zeros((B, H, dv, dk), checks.compute_dtype(q_t, k_t, v_t, beta_t, log_decay_t))
  _check_state_arrays("", (("S", S),), ((B, H, dv, dk),))
  q_t, k_t, v_t, beta_t = (x.astype(S.dtype) for x in (q_t, k_t, v_t, beta_t))
  if log_decay_t is not None:
    log_decay_t = log_decay_t.astype(S.dtype)
  khat = unit(k_t, KEY_EPS)
  o_t, S = delta_rule_step(S, q_t, khat, beta_t[..., None] * khat, v_t, log_decay_t,
                           precision)
  return o_t.astype(out_dtype), S


def deltanet_step(S: jax.Array | None, q_t: jax.Array, k_t: jax.Array, v_t: jax.Array,
                  beta_t: jax.Array, *, precision: str | jax.lax.Precision | None = None
                  ) -> tuple[jax.Array, jax.Array]:
  """One token of `deltanet`; see `gated_deltanet_step`."""
  return gated_deltanet_step(S, q_t, k_t, v_t, beta_t, None, precision=precision)
