"""Diagnostics of recurrent memories: state-norm traces and VLA's state Jacobians.

- `state_norm_trace`: ||S_t||_F for every token of any recurrence of this library (the seed's
  Prop. 1: VLA's memory norm is self-limiting, linear attention's grows).
- `vla_jacobian_norms`: the spectral norm of dS_t / dS_{t-1}, the map S -> S (I - khat_t a_t^T),
  per token, measured and in closed form. For unit khat, a with c = a . khat it is
  sqrt((3 - 2c + sqrt(5 - 4c)) / 2), in [1, 1.618); exactly 1 only when a = khat (the seed's
  Prop. 2 claims 1 always).
- `vla_jacobian_product_norms`: the spectral norm of products of those Jacobians over spans of
  tokens, which is what bounds how a perturbation of the memory grows over a long context.
- `khat_and_write_directions`, `penalty_conditioning`: VLA's unit keys and write directions
  a_t (their cosine a_t . khat_t), and cond(A_t) of the penalty inverse at chosen tokens.
- `vla_layer_inputs`, `layer_state_norms`: the inputs of each VLA layer of a `LanguageModel`,
  and ||S_t||_F inside each of its recurrent layers.

All take [B, T, H, D] inputs like the recurrences and return float32 (float64 in x64) arrays.
"""

import jax
import jax.numpy as jnp

from vla_jax.ops import checks
from vla_jax.ops.step import (gated_deltanet_step, linear_attention_step, vla_step)
from vla_jax.ops.utils import KEY_EPS, WRITE_EPS, einsum, unit
from vla_jax.ops.vla.penalty import penalty_scan
from vla_jax.ops.vla.recurrence import initial_vla_state

MIXERS = ("vla", "linear_attention", "deltanet", "gated_deltanet")


def state_norm_trace(mixer, q, k, v, *, u=None, beta=None, log_decay=None, lam0=1.0):
  """||S_t||_F after every token.

  Args:
    mixer: "vla", "linear_attention" (ELU+1 features, as in `linear_attention`), "deltanet" or
      "gated_deltanet".
    q, k: [B, T, H, dk]; v: [B, T, H, dv]; u: [B, T, H, dk] (VLA); beta: [B, T, H] (DeltaNets);
    log_decay: [B, T, H] (Gated DeltaNet); lam0: VLA's initial ridge. The inputs a mixer uses
    are checked (ValueError naming them); the others are ignored, so that one set of inputs
    can be passed to every mixer.

  Returns:
    [B, T, H] Frobenius norms of the memory S_t.
  """
  if mixer not in MIXERS:
    raise ValueError(f"mixer must be one of {MIXERS}; got {mixer!r}")
  B, T, H, dk = checks.check_tokens("q", q)
  checks.check_tokens("k", k, batch=B, time=T, heads=H, dim=dk)
  checks.check_tokens("v", v, batch=B, time=T, heads=H)
  if T == 0:
    raise ValueError(f"q must hold at least one token; got shape {tuple(q.shape)}")
  needs = {"vla": ("u",), "deltanet": ("beta",), "gated_deltanet": ("beta", "log_decay")}
  given = {"u": u, "beta": beta, "log_decay": log_decay}
  for name in needs.get(mixer, ()):
    if given[name] is None:
      raise ValueError(f"mixer={mixer!r} needs {name}")
    if name == "u":
      checks.check_tokens("u", u, batch=B, time=T, heads=H, dim=dk)
    else:
      checks.check_tokens(name, given[name], rank=3, batch=B, time=T, heads=H)

  if mixer == "vla":
    step = lambda s, q, k, v, u: vla_step(s, q, k, v, u, lam0=lam0)
    tokens = (q, k, v, u)
  elif mixer == "linear_attention":
    step, tokens = linear_attention_step, (q, k, v)
  else:
    step = lambda s, q, k, v, b, *g: gated_deltanet_step(s, q, k, v, b, g[0] if g else None)
    tokens = (q, k, v, beta) + ((log_decay,) if mixer == "gated_deltanet" else ())
  state0 = step(None, *(x[:, 0] for x in tokens))[1]  # the state after the first token
  memory = lambda s: s.S if hasattr(s, "S") else s

  def body(state, xs):
    state = step(state, *xs)[1]
    return state, jnp.linalg.norm(memory(state), axis=(-2, -1))

  _, norms = jax.lax.scan(body, state0, [jnp.moveaxis(x[:, 1:], 1, 0) for x in tokens])
  first = jnp.linalg.norm(memory(state0), axis=(-2, -1))[None]
  return jnp.moveaxis(jnp.concatenate([first, norms], axis=0), 0, 1)


def khat_and_write_directions(k, u, lam0=1.0):
  """VLA's unit keys and unit write directions.

  Args:
    k, u: [B, T, H, dk] keys (feature-mapped) and penalty directions, as given to
      `vla_recurrence`; lam0: initial ridge (A_0 = I / lam0).

  Returns:
    (khat, a), each [B, T, H, dk]: khat_t = k_t / ||k_t|| and a_t = A_t khat_t / ||A_t khat_t||
    (0 at a padding token, k = u = 0).
  """
  B, T, H, dk = checks.check_tokens("k", k)
  checks.check_tokens("u", u, batch=B, time=T, heads=H, dim=dk)
  dtype = checks.compute_dtype(k, u)
  k, u = k.astype(dtype), u.astype(dtype)
  khat = unit(k, KEY_EPS)
  A0 = initial_vla_state(B, H, dk, 1, lam0=lam0, dtype=dtype).A
  W, _ = penalty_scan(khat, u, A0)
  return khat, unit(W, WRITE_EPS)


def penalty_conditioning(u, positions, *, lam0=1.0):
  """Condition numbers of VLA's penalty inverse A_t at the given token counts.

  cond(A_t) = cond(M_t) = lambda_max(M_t) / lambda_min(M_t) with M_t = A_t^-1 =
  lam0 I + sum_{s<=t} u_s u_s^T; M_t is summed directly (every eigenvalue is >= lam0, so the
  symmetric eigensolver is accurate to the dtype's precision), never inverted.

  Args:
    u: [B, T, H, dk] penalty directions; positions: token counts t in [1, T] (ints, static);
      lam0: initial ridge (> 0).

  Returns:
    [B, len(positions), H] condition numbers (1 for u = 0).
  """
  B, T, H, dk = checks.check_tokens("u", u)
  checks.check_positive("lam0", lam0)
  positions = [int(t) for t in positions]
  if not positions or any(not 1 <= t <= T for t in positions):
    raise ValueError(f"positions must be token counts in [1, T={T}]; got {positions}")
  dtype = checks.compute_dtype(u)
  u = u.astype(dtype)
  eye = lam0 * jnp.eye(dk, dtype=dtype)
  M = jnp.stack([eye + einsum("bshi,bshj->bhij", u[:, :t], u[:, :t]) for t in positions],
                axis=1)
  eig = jnp.linalg.eigvalsh(M)                  # ascending, [B, P, H, dk]
  return eig[..., -1] / eig[..., 0]


def jacobian_norm_closed_form(c):
  """Spectral norm of I - x y^T for unit x, y with c = x . y in [-1, 1]."""
  return jnp.sqrt((3.0 - 2.0 * c + jnp.sqrt(jnp.maximum(5.0 - 4.0 * c, 0.0))) / 2.0)


def vla_jacobian_norms(k, u, *, lam0=1.0):
  """Per-token spectral norms of VLA's state Jacobian J_t = I - khat_t a_t^T.

  Args:
    k, u: [B, T, H, dk] keys (feature-mapped) and penalty directions, as given to
      `vla_recurrence`; lam0: initial ridge.

  Returns:
    dict with "measured" ([B, T, H], largest singular value of J_t), "closed_form" ([B, T, H],
    sqrt((3 - 2c + sqrt(5 - 4c)) / 2); 1 at a padding token, k = u = 0, where khat = a = 0
    and J_t = I) and "cosine" ([B, T, H], c = a_t . khat_t; 0 at padding).
  """
  khat, a = khat_and_write_directions(k, u, lam0)
  dk = khat.shape[-1]
  J = jnp.eye(dk, dtype=khat.dtype) - einsum("bthi,bthj->bthij", khat, a)
  c = jnp.sum(khat * a, axis=-1)
  padding = jnp.sum(khat * khat, axis=-1) * jnp.sum(a * a, axis=-1) == 0
  return {"measured": jnp.linalg.norm(J, ord=2, axis=(-2, -1)),
          "closed_form": jnp.where(padding, 1.0, jacobian_norm_closed_form(c)), "cosine": c}


def vla_jacobian_product_norms(k, u, *, span, lam0=1.0):
  """Spectral norms of products of consecutive Jacobians J_s J_{s+1} ... J_{s+span-1}.

  The state map acts from the right (S_t = S_{t-1} J_t + ...), so a perturbation of S_s is
  multiplied by the product in time order. Products are taken over the non-overlapping spans
  [0, span), [span, 2 span), ...; a trailing partial span is dropped.

  Returns:
    [B, T // span, H] spectral norms.
  """
  khat, a = khat_and_write_directions(k, u, lam0)
  B, T, H, dk = khat.shape
  if not checks.is_int(span) or not 1 <= span <= T:
    raise ValueError(f"span must be an int in [1, T={T}]; got {span!r}")
  span = int(span)
  n = T // span
  J = jnp.eye(dk, dtype=khat.dtype) - einsum("bthi,bthj->bthij", khat, a)
  J = J[:, :n * span].reshape(B, n, span, H, dk, dk)
  compose = lambda P, J_t: (einsum("bnhij,bnhjk->bnhik", P, J_t),) * 2
  P0 = jnp.broadcast_to(jnp.eye(dk, dtype=khat.dtype), (B, n, H, dk, dk))
  P, _ = jax.lax.scan(compose, P0, jnp.moveaxis(J, 2, 0))
  return jnp.linalg.norm(P, ord=2, axis=(-2, -1))


def vla_layer_inputs(model, tokens):
  """The inputs each VLA layer of a `LanguageModel` gives its recurrence on `tokens`.

  Args:
    model: a `vla_jax.models.LanguageModel` (mixer "vla").
    tokens: [B, T] int.

  Returns:
    One dict per VLA layer with q, k, v, u ([B, T, H, d_h]; v has one more channel with the
    "delta" readout), beta ([B, T, H], None without the layer's `beta`) and lam0: feed them
    to `state_norm_trace` or `vla_jacobian_norms`.
  """
  from vla_jax.layers.vla import VLAAttention  # pylint: disable=import-outside-toplevel

  x = model.embed_tokens(tokens)
  layers = []
  for block in model.blocks:
    if isinstance(block.mixer, VLAAttention):
      h = block.norm1(x).astype(block.mixer.dtype)
      inputs, _ = block.mixer.features(h)
      q, k, v, u = inputs[:4]
      layers.append({"q": q, "k": k, "v": v, "u": u,
                     "beta": inputs[4] if len(inputs) > 4 else None,
                     "lam0": block.mixer.lam0})
    x = block(x)
  if not layers:
    raise ValueError(f"the model has no VLA layer (mixer={model.config.mixer!r})")
  return layers


def key_collinearity(k):
  """How alike a layer's key directions are: k [B, T, H, d] -> the mean over examples and heads
  of mean_{s != t} |cos(k_s, k_t)| over the T tokens (0: orthogonal keys, 1: one direction).
  Writes of strength 1 along nearly collinear keys erase each other. Zero keys count as
  orthogonal to every other key. float32 scalar; T >= 2."""
  k = jnp.asarray(k, jnp.float32)
  T = k.shape[1]
  if T < 2:
    raise ValueError(f"key_collinearity needs at least 2 tokens; got k of shape {k.shape}")
  norm = jnp.linalg.norm(k, axis=-1, keepdims=True)
  khat = jnp.where(norm > 1e-6, k / jnp.maximum(norm, 1e-6), 0.0)
  gram = jnp.abs(jnp.einsum("bshd,bthd->bhst", khat, khat))
  off = jnp.sum(gram, axis=(-2, -1)) - jnp.trace(gram, axis1=-2, axis2=-1)
  return jnp.mean(off / (T * (T - 1)))


def recurrent_layer_inputs(model, tokens):
  """[(block index, {name: array})]: the inputs every recurrent layer of a `LanguageModel`
  gives its recurrence on `tokens`, by the mixer's `INPUT_NAMES` (those it does not use left
  out): q, k, v [B, T, H, d] after the projection, convolution and feature map (the keys as
  `key_collinearity` reads them), VLA's u, the write strengths beta [B, T, H] (DeltaNet,
  Gated DeltaNet, VLA with `beta`) and Gated DeltaNet's log decays [B, T, H]."""
  x = model.embed_tokens(tokens)
  out = []
  for i, block in enumerate(model.blocks):
    mixer = block.mixer
    if getattr(mixer, "RECURRENT", False):
      h = block.norm1(x).astype(mixer.dtype)
      inputs, _ = mixer.features(h)
      out.append((i, {name: a for name, a in zip(mixer.INPUT_NAMES, inputs)
                      if a is not None}))
    x = block(x)
  return out


def layer_state_norms(model, tokens):
  """||S_t||_F inside every recurrent layer of a `LanguageModel`, token by token.

  Each recurrent mixer is run through its streaming `step` from an empty cache on the inputs
  the layer sees in the model's forward pass, so the trace is the memory the trained model
  actually builds, whatever the mixer (VLA, linear attention, DeltaNet, Gated DeltaNet).

  Args:
    model: a `vla_jax.models.LanguageModel`.
    tokens: [B, T] int.

  Returns:
    One [B, T, H] array per recurrent layer (an empty list for softmax attention).
  """
  x = model.embed_tokens(tokens)
  B, T = tokens.shape
  traces = []
  for block in model.blocks:
    mixer = block.mixer
    if getattr(mixer, "RECURRENT", False):
      h = block.norm1(x).astype(mixer.dtype)

      def body(cache, h_t, mixer=mixer):
        _, cache = mixer.step(h_t, cache)
        S = cache.state.S if hasattr(cache.state, "S") else cache.state
        return cache, jnp.linalg.norm(S.astype(jnp.float32), axis=(-2, -1))

      _, norms = jax.lax.scan(body, mixer.init_cache(B, T), jnp.swapaxes(h, 0, 1))
      traces.append(jnp.swapaxes(norms, 0, 1))
    x = block(x)
  return traces
