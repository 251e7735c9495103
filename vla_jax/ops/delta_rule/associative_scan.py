"""Blelloch (`lax.associative_scan`) form of the generalised delta rule.

Each step is an affine map of the state acting from the right:
    S_t = S_{t-1} F_t + G_t,   F_t = gamma_t (I - e_t w_t^T)  [dk, dk],   G_t = v_t w_t^T  [dv, dk].
Applying (F1, G1) and then (F2, G2) gives S (F1 F2) + (G1 F2 + G2), an associative
composition; the scan yields every prefix map and S_t = S_0 F_{1..t} + G_{1..t}.
O(T dk^2 (dk + dv)) work and O(T dk (dk + dv)) memory: a parallel reference.
"""

import functools

import jax
import jax.numpy as jnp

from vla_jax.ops.utils import HIGHEST, einsum


def _compose(earlier, later, precision):
  F1, G1 = earlier
  F2, G2 = later
  mm = functools.partial(einsum, "...ij,...jk->...ik", precision=precision)
  return mm(F1, F2), mm(G1, F2) + G2


def delta_rule_associative_scan(q: jax.Array, e: jax.Array | None, w: jax.Array,
                                v: jax.Array, log_decay: jax.Array | None, S0: jax.Array,
                                starts: jax.Array | None = None, *,
                                precision: jax.lax.Precision | None = HIGHEST) -> tuple[jax.Array, jax.Array]:
  """Same contract as `delta_rule_scan`: returns (o [B, T, H, dv], S_T [B, H, dv, dk]). At a
  document start (`starts` [B, T] True) F_t is selected to 0: S_t = G_t forgets S_{t-1}."""
  dk = q.shape[-1]
  eye = jnp.eye(dk, dtype=q.dtype)
  F = jnp.broadcast_to(eye, w.shape + (dk,))
  if e is not None:
    F = F - einsum("bthi,bthj->bthij", e, w, precision=precision)
  if log_decay is not None:
    F = jnp.exp(log_decay)[..., None, None] * F
  if starts is not None:
    F = jnp.where(starts[:, :, None, None, None], jnp.zeros((), F.dtype), F)
  G = einsum("bthv,bthk->bthvk", v, w, precision=precision)
  F, G = jax.lax.associative_scan(functools.partial(_compose, precision=precision), (F, G),
                                  axis=1)
  S = einsum("bhvi,bthik->bthvk", S0, F, precision=precision) + G  # [B, T, H, dv, dk]: every S_t
  o = einsum("bthvk,bthk->bthv", S, q, precision=precision)
  return o, S[:, -1]
