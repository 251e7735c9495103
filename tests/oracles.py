"""Independent float64 NumPy step-by-step oracles (no library code), one head at a time: the
ops, and the mixer layers from their parameters (`mixer`)."""

import numpy as np


def _unit(x, eps=1e-6):
  """x / max(||x||, eps) along the last axis."""
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def vla(q, k, v, u, lam0=1.0, S0=None, A0=None, beta=None):
  """q, k, u: [B, T, H, dk]; v: [B, T, H, dv] -> o [B, T, H, dv], S [B, H, dv, dk], A.
  beta: None (writes of strength 1) or [B, T, H]: S_t = S + beta_t (v_t - S khat_t) a_t^T."""
  q, k, v, u = (np.asarray(x, np.float64) for x in (q, k, v, u))
  beta = (np.ones(q.shape[:3]) if beta is None else np.asarray(beta, np.float64))
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
        s = s + beta[b, t, h] * np.outer(v[b, t, h] - s @ khat, a)
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


# ---- mixers: the layers' float64 forward passes from their parameters --------------------

def _p(param):
  return np.asarray(param[...], np.float64)


def _lin(x, layer):
  y = x @ _p(layer.kernel)
  return y + _p(layer.bias) if layer.bias is not None else y


def _layernorm(x, ln, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * _p(ln.scale) + _p(ln.bias)


def _silu(x):
  return x / (1 + np.exp(-x))


def _elu1(x):
  return np.where(x > 0, x + 1, np.exp(x))


def _conv(x, conv):
  w = _p(conv.kernel)
  K = w.shape[0]
  xp = np.pad(x, ((0, 0), (K - 1, 0), (0, 0)))
  return _silu(sum(xp[:, i:i + x.shape[1]] * w[i] for i in range(K)))


def _heads(x, H):
  return x.reshape(x.shape[:-1] + (H, x.shape[-1] // H))


def _readout(o, out):
  y = o.reshape(o.shape[:2] + (-1,))
  if out.norm is not None:
    y = _layernorm(y, out.norm)
  return y @ _p(out.proj.kernel)


def _projections(m, x):
  """The q, k, v projections of x, through the layer's short convolutions where it has them."""
  q, k, v = _lin(x, m.q_proj), _lin(x, m.k_proj), _lin(x, m.v_proj)
  if m.conv is not None:
    q, k, v = (_conv(t, c) for t, c in zip((q, k, v), m.conv))
  return q, k, v


def _vla_mixer(m, x):
  H = m.num_heads
  q, kr, v = _projections(m, x)
  u = m.penalty_scale * _unit(_heads(kr @ _p(m.u_proj.kernel), H))
  if m.qk_map == "silu_l2":
    if m.conv is None:
      q, kr = _silu(q), _silu(kr)
    q, k, v = _unit(_heads(q, H)), _heads(kr, H), _heads(v, H)
  else:
    q, k, v = _elu1(_heads(q, H)), _elu1(_heads(kr, H)), _heads(v, H)
  beta = (1 / (1 + np.exp(-_lin(x, m.beta_proj))) if m.beta else np.ones(q.shape[:3]))
  if m.readout == "delta":
    v = np.concatenate([v, np.ones(v.shape[:-1] + (1,))], -1)
  Bn, Tn, Hn, dk = q.shape
  o = np.zeros(v.shape)
  for b in range(Bn):
    for h in range(Hn):
      A, S, z = np.eye(dk) / m.lam0, np.zeros((v.shape[-1], dk)), np.zeros(dk)
      for t in range(Tn):
        kh = _unit(k[b, t, h])
        w = A @ u[b, t, h]
        A = A - np.outer(w, w) / (1 + u[b, t, h] @ w)
        a = _unit(A @ kh, 1e-12)
        S = S + beta[b, t, h] * np.outer(v[b, t, h] - S @ kh, a)
        z = z + k[b, t, h]
        o[b, t, h] = S @ q[b, t, h]
        if m.readout == "additive":
          o[b, t, h] /= max(z @ q[b, t, h], m.readout_eps)
  if m.readout == "delta":
    den = o[..., -1:]
    o = o[..., :-1] / (np.where(den < 0, -1.0, 1.0) * np.maximum(np.abs(den), m.readout_eps))
  return _readout(o, m.out)


def _linear_mixer(m, x):
  H = m.num_heads
  q, k, v = _projections(m, x)
  q, k, v = _elu1(_heads(q, H)), _elu1(_heads(k, H)), _heads(v, H)
  S = np.cumsum(np.einsum("bthv,bthk->bthvk", v, k), axis=1)
  o = np.einsum("bthvk,bthk->bthv", S, q)
  if m.normalize:
    o = o / np.maximum(np.einsum("bthk,bthk->bth", np.cumsum(k, 1), q), 1e-6)[..., None]
  return _readout(o, m.out)


def _delta_mixer(m, x):
  H = m.num_heads
  q, k, v = _projections(m, x)
  if m.conv is None:
    q, k = _silu(q), _silu(k)
  q, k, v = _unit(_heads(q, H)), _unit(_heads(k, H)), _heads(v, H)
  beta = 1 / (1 + np.exp(-_lin(x, m.beta_proj)))
  if m.GATED:
    a = _lin(x, m.a_proj) + _p(m.dt_bias)
    gamma = np.exp(-np.exp(_p(m.A_log)) * np.logaddexp(0, a))
  else:
    gamma = np.ones(beta.shape)
  o = np.zeros(v.shape)
  for b in range(x.shape[0]):
    for h in range(H):
      S = np.zeros((v.shape[-1], k.shape[-1]))
      for t in range(x.shape[1]):
        S = gamma[b, t, h] * S
        S = S + beta[b, t, h] * np.outer(v[b, t, h] - S @ k[b, t, h], k[b, t, h])
        o[b, t, h] = S @ q[b, t, h]
  if m.output_gate:   # fla's gated RMSNorm per head: RMSNorm(o) * w * silu(W_g x)
    if m.o_norm.weight is not None:
      o = o / np.sqrt((o ** 2).mean(-1, keepdims=True) + m.o_norm.eps) * _p(m.o_norm.weight)
    o = o * _silu(_heads(_lin(x, m.g_proj), H))
  return _readout(o, m.out)


def rope(x, positions, base=10000.0):
  """RoPE in float64 as complex rotation: x [B, T, H, D], positions [B, T] -> the pairs
  (x_j, x_{j + D/2}) as x_j + i x_{j + D/2}, times exp(i p base^(-2j / D))."""
  x, half = np.asarray(x, np.float64), x.shape[-1] // 2
  theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
  z = (x[..., :half] + 1j * x[..., half:]) * np.exp(
      1j * np.asarray(positions, np.float64)[:, :, None, None] * theta)
  return np.concatenate([z.real, z.imag], axis=-1)


def _softmax_mixer(m, x):
  H = m.num_heads
  q, k, v = _projections(m, x)
  q, k, v = _heads(q, H), _heads(k, H), _heads(v, H)
  if m.positions == "rope":
    positions = np.broadcast_to(np.arange(x.shape[1]), x.shape[:2])
    q, k = rope(q, positions, m.rope_base), rope(k, positions, m.rope_base)
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  s = np.where(np.tril(np.ones((x.shape[1], x.shape[1]), bool)), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return _readout(np.einsum("bhqk,bkhd->bqhd", p, v), m.out)


_MIXERS = {"VLAAttention": _vla_mixer, "LinearAttention": _linear_mixer,
           "DeltaNet": _delta_mixer, "GatedDeltaNet": _delta_mixer,
           "SoftmaxAttention": _softmax_mixer}


def mixer(m, x):
  """The float64 output [B, T, d_model] of the mixer layer `m` (`vla_jax.layers`, read for its
  parameters and options only) on x [B, T, d_model], token by token."""
  return _MIXERS[type(m).__name__](m, np.asarray(x, np.float64))
