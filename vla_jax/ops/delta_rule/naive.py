"""Step-by-step `lax.scan` definition of the generalised delta rule (the reference)."""

import jax
import jax.numpy as jnp

from vla_jax.ops.utils import HIGHEST, einsum


def delta_rule_step(S, q_t, e_t, w_t, v_t, g_t, precision=HIGHEST):
  """One token: S <- gamma S + (v - gamma S e) w^T, o = S q.

  Args:
    S: [B, H, dv, dk]; q_t, w_t: [B, H, dk]; e_t: [B, H, dk] or None (no erase);
    v_t: [B, H, dv]; g_t: [B, H] log decay or None.

  Returns:
    (o_t [B, H, dv], S [B, H, dv, dk]); products at `precision`.
  """
  if g_t is not None:
    S = jnp.exp(g_t)[..., None, None] * S
  r_t = v_t if e_t is None else v_t - einsum("bhvk,bhk->bhv", S, e_t, precision=precision)
  S = S + einsum("bhv,bhk->bhvk", r_t, w_t, precision=precision)
  return einsum("bhvk,bhk->bhv", S, q_t, precision=precision), S


def delta_rule_scan(q: jax.Array, e: jax.Array | None, w: jax.Array, v: jax.Array,
                    log_decay: jax.Array | None, S0: jax.Array, starts: jax.Array | None = None,
                    *, precision: jax.lax.Precision | None = HIGHEST) -> tuple[jax.Array, jax.Array]:
  """Runs S_t = gamma_t S_{t-1} + (v_t - gamma_t S_{t-1} e_t) w_t^T token by token.

  Args:
    q, w: [B, T, H, dk]; e: [B, T, H, dk] or None (no erase); v: [B, T, H, dv];
    log_decay: [B, T, H] or None (gamma = 1); S0: [B, H, dv, dk]. All in one float dtype.
    starts: [B, T] bool or None: S_{t-1} is replaced by 0 (selected, not multiplied) at the
      tokens where it is True, the first token of a packed document (`document_starts`).
    precision: of the products (a `jax.lax.Precision`).

  Returns:
    o: [B, T, H, dv] with o_t = S_t q_t, and S_T: [B, H, dv, dk].

  Each step is rematerialised in the backward (`jax.checkpoint`): a gradient keeps S per
  token, not every intermediate of the step.
  """
  xs = [jnp.moveaxis(x, 1, 0) if x is not None else None
        for x in (q, e, w, v, log_decay, starts)]

  def step(S, x):
    *x, start = x
    if start is not None:
      S = jnp.where(start[:, None, None, None], jnp.zeros((), S.dtype), S)
    o_t, S = jax.checkpoint(delta_rule_step, static_argnums=(6,))(S, *x, precision)
    return S, o_t

  S, o = jax.lax.scan(step, S0, xs)
  return jnp.moveaxis(o, 0, 1), S
