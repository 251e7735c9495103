"""Independent float64 NumPy step-by-step oracles (no library code), one head at a time."""

import numpy as np


def _unit(x, eps):
  return x / max(np.linalg.norm(x), eps)


def vla(q, k, v, u, lam0=1.0, S0=None, A0=None):
  """q, k, u: [B, T, H, dk]; v: [B, T, H, dv] -> o [B, T, H, dv], S [B, H, dv, dk], A."""
  q, k, v, u = (np.asarray(x, np.float64) for x in (q, k, v, u))
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  o = np.zeros((B, T, H, dv))
  S = np.zeros((B, H, dv, dk)) if S0 is None else np.array(S0, np.float64)
  A = (np.broadcast_to(np.eye(dk) / lam0, (B, H, dk, dk)).copy() if A0 is None
       else np.array(A0, np.float64))
  for b in range(B):
    for h in range(H):
      s, a_inv = S[b, h], A[b, h]
      for t in range(T):
        khat = _unit(k[b, t, h], 1e-6)
        z = a_inv @ u[b, t, h]
        a_inv = a_inv - np.outer(z, z) / (1.0 + u[b, t, h] @ z)
        a = _unit(a_inv @ khat, 1e-12)
        s = s + np.outer(v[b, t, h] - s @ khat, a)
        o[b, t, h] = s @ q[b, t, h]
      S[b, h], A[b, h] = s, a_inv
  return o, S, A


def linear_attention(q, k, v, normalize=False, eps=1e-6, S0=None, z0=None):
  """ELU+1 features; S_t = S + v phi(k)^T; o = S phi(q) [/ max(z . phi(q), eps)]; S and z
  start from S0 [B, H, dv, dk] and z0 [B, H, dk] (None: zeros)."""
  phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  B, T, H, dk = q.shape
  o = np.zeros(v.shape)
  S = np.zeros((B, H, v.shape[-1], dk)) if S0 is None else np.array(S0, np.float64)
  z = np.zeros((B, H, dk)) if z0 is None else np.array(z0, np.float64)
  for b in range(B):
    for h in range(H):
      for t in range(T):
        fq, fk = phi(q[b, t, h]), phi(k[b, t, h])
        S[b, h] += np.outer(v[b, t, h], fk)
        z[b, h] += fk
        o[b, t, h] = S[b, h] @ fq
        if normalize:
          o[b, t, h] /= max(z[b, h] @ fq, eps)
  return o, S, z


def gated_deltanet(q, k, v, beta, log_decay=None, S0=None):
  """S_t = gamma S (I - beta khat khat^T) + beta v khat^T; o = S q. log_decay None: DeltaNet.
  S starts from S0 [B, H, dv, dk] (None: zeros)."""
  q, k, v, beta = (np.asarray(x, np.float64) for x in (q, k, v, beta))
  B, T, H, dk = q.shape
  o = np.zeros(v.shape)
  S = np.zeros((B, H, v.shape[-1], dk)) if S0 is None else np.array(S0, np.float64)
  for b in range(B):
    for h in range(H):
      s = S[b, h]
      for t in range(T):
        khat = _unit(k[b, t, h], 1e-6)
        if log_decay is not None:
          s = np.exp(log_decay[b, t, h]) * s
        s = s + beta[b, t, h] * np.outer(v[b, t, h] - s @ khat, khat)
        o[b, t, h] = s @ q[b, t, h]
      S[b, h] = s
  return o, S


def delta_rule(q, e, w, v, S0):
  """S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T, o_t = S_t q_t (erase and write keys as given)."""
  q, e, w, v, S = (np.array(x, np.float64) for x in (q, e, w, v, S0))
  o = np.zeros(v.shape)
  for t in range(q.shape[1]):
    r = v[:, t] - np.einsum("bhvk,bhk->bhv", S, e[:, t])
    S = S + np.einsum("bhv,bhk->bhvk", r, w[:, t])
    o[:, t] = np.einsum("bhvk,bhk->bhv", S, q[:, t])
  return o, S


def penalty(khat, u, A0):
  """Rows A_t khat_t and A_T of the penalty path by Sherman-Morrison: khat, u [B, T, H, dk]
  (keys as given), A0 [B, H, dk, dk] -> (W [B, T, H, dk], A_T [B, H, dk, dk])."""
  khat, u, A = (np.array(x, np.float64) for x in (khat, u, A0))
  W = np.zeros(khat.shape)
  for t in range(khat.shape[1]):
    z = np.einsum("bhij,bhj->bhi", A, u[:, t])
    A = A - np.einsum("bhi,bhj->bhij", z, z) / (1.0 + np.einsum("bhi,bhi->bh", u[:, t], z))[
        ..., None, None]
    W[:, t] = np.einsum("bhij,bhj->bhi", A, khat[:, t])
  return W, A
