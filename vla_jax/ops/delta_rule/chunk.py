"""Chunkwise (matmul-shaped) form of the generalised delta rule.

Split T into N chunks of C tokens. Inside a chunk with start state S_c, local cumulative
log decay G_i = g_1 + ... + g_i, Gamma_i = exp(G_i) and D_ij = Gamma_i / Gamma_j (i >= j):

    residuals   r_i = v_i - gamma_i S_{i-1} e_i  satisfy  (I + L) R = V - Gamma E S_c^T,
                with L = strictly_lower(D * (E W^T))                            [C, C]
    outputs     O = Gamma Q S_c^T + tril(D * (Q W^T)) R                        [C, dv]
    next state  S_next = Gamma_C S_c + R^T (Gamma_C / Gamma * W)               [dv, dk]

Everything that does not involve S_c is computed for all chunks at once (the unit
lower-triangular inverse, by block doubling in matmuls, gives U = (I + L)^-1 V and W_e = (I + L)^-1 Gamma E, the "WY"
factors), leaving one sequential `lax.scan` over chunk states with R = U - W_e S_c^T:
two [C, d] x [d, d] products per chunk. With no erase (e = None) L = 0 and R = V.

Packed documents (`starts`): a document start inside a chunk is a decay of exactly 0, applied by
selection: D_ij = 0 across documents (tokens i, j of different documents), Gamma_i = 0 after the
chunk's first start (S_c reaches the chunk's first document only), Gamma_C / Gamma_j = 0 before
the chunk's last start and Gamma_C = 0 when the chunk holds a start (S_next comes from the
chunk's last document alone).
"""

import functools
import math

import jax
import jax.numpy as jnp

from vla_jax.ops.utils import HIGHEST, einsum, from_chunks, to_chunks, tril_inverse


def delta_rule_chunked(q: jax.Array, e: jax.Array | None, w: jax.Array, v: jax.Array,
                       log_decay: jax.Array | None, S0: jax.Array, chunk_size: int,
                       starts: jax.Array | None = None, *,
                       precision: jax.lax.Precision | None = HIGHEST) -> tuple[jax.Array, jax.Array]:
  """Same contract as `delta_rule_scan` (`starts` included), computed chunk by chunk.

  T need not be a multiple of `chunk_size`: the tail is padded with zero keys
  (w = e = 0, g = 0), which leave the state unchanged. Products at `precision`.
  """
  mm = functools.partial(einsum, precision=precision)
  length = q.shape[1]
  C = chunk_size
  qc, wc, vc = (to_chunks(x, C) for x in (q, w, v))  # [B, H, N, C, d]
  incl = jnp.tril(jnp.ones((C, C), dtype=bool))
  if log_decay is None:
    D = incl.astype(q.dtype)
    gamma = gamma_last = decay_to_end = None
  else:
    # A per-token floor of 2 log(eps): exp(floor) = eps^2 is a reset to working precision, and
    # a hard reset (g = -inf) then gives finite differences G_i - G_j instead of -inf + inf;
    # it also bounds |G| within a chunk, whose float rounding the differences inherit.
    floor = 2.0 * math.log(jnp.finfo(log_decay.dtype).eps)
    G = jnp.cumsum(jnp.maximum(to_chunks(log_decay, C), floor), axis=-1)  # [B, H, N, C]
    diff = G[..., :, None] - G[..., None, :]
    D = jnp.where(incl, jnp.exp(jnp.where(incl, diff, 0.0)), 0.0)
    gamma = jnp.exp(G)
    gamma_last = gamma[..., -1]
    decay_to_end = jnp.exp(G[..., -1:] - G)

  doc = keep = None
  if starts is not None:   # document starts inside chunks (module docstring), by selection
    doc = jnp.cumsum(to_chunks(starts[:, :, None], C), axis=-1)   # [B, 1, N, C] within chunk
    D = jnp.where(doc[..., :, None] == doc[..., None, :], D, 0.0)
    keep = doc[..., -1] == 0                                        # [B, 1, N]
  first = lambda x: x if doc is None else jnp.where((doc == 0)[..., None], x, 0.0)

  # Chunk-local work, parallel over all chunks.
  P = mm("bhnik,bhnjk->bhnij", qc, wc) * D
  if e is None:
    U, We = vc, None
  else:
    ec = to_chunks(e, C)
    L = mm("bhnik,bhnjk->bhnij", ec, wc) * D * jnp.tril(jnp.ones((C, C), q.dtype), -1)
    ge = first(ec if gamma is None else gamma[..., None] * ec)
    T_inv = tril_inverse(L + jnp.eye(C, dtype=q.dtype), unit_diagonal=True,
                         precision=precision)
    U = mm("bhnij,bhnjv->bhniv", T_inv, vc)
    We = mm("bhnij,bhnjk->bhnik", T_inv, ge)
  Wd = wc if decay_to_end is None else decay_to_end[..., None] * wc
  if doc is not None:
    Wd = jnp.where((doc == doc[..., -1:])[..., None], Wd, 0.0)
  Qg = first(qc if gamma is None else gamma[..., None] * qc)

  # The one sequential pass: chunk-start states and residuals.
  def step(S, xs):
    U_n, We_n, Wd_n, gl_n, keep_n = xs
    R = U_n if We_n is None else U_n - mm("bhck,bhvk->bhcv", We_n, S)
    S_next = S if gl_n is None else gl_n[..., None, None] * S
    if keep_n is not None:
      S_next = jnp.where(keep_n[..., None, None], S_next, jnp.zeros((), S.dtype))
    S_next = S_next + mm("bhcv,bhck->bhvk", R, Wd_n)
    return S_next, (S, R)

  move = lambda x: None if x is None else jnp.moveaxis(x, 2, 0)
  S_T, (S_starts, R) = jax.lax.scan(
      step, S0, (move(U), move(We), move(Wd), move(gamma_last), move(keep)))
  S_starts, R = jnp.moveaxis(S_starts, 0, 2), jnp.moveaxis(R, 0, 2)
  O = mm("bhnck,bhnvk->bhncv", Qg, S_starts) + mm("bhnij,bhnjv->bhniv", P, R)
  return from_chunks(O, length), S_T
