"""Diagnostics: state-norm traces against the oracles, Jacobian norms against dense math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import oracles
from conftest import random_inputs, random_module
from vla_jax import diagnostics, vla_recurrence
from vla_jax.models import LanguageModel, ModelConfig
from vla_jax.ops.vla.penalty import penalty_scan  # rows A_t khat_t, checked against the oracle

# The op-level diagnostics, jitted (the mixer, lam0, span and positions static): one program
# each rather than one eager compilation per operation and shape. Bad arguments raise when
# traced, as eagerly.
_state_norm_trace = jax.jit(diagnostics.state_norm_trace, static_argnums=0,
                            static_argnames="lam0")
_jacobian_norms = jax.jit(diagnostics.vla_jacobian_norms, static_argnames="lam0")
_product_norms = jax.jit(diagnostics.vla_jacobian_product_norms, static_argnames=("span", "lam0"))
_conditioning = jax.jit(diagnostics.penalty_conditioning, static_argnums=1,
                        static_argnames="lam0")
_write_directions = jax.jit(diagnostics.khat_and_write_directions, static_argnums=2)


def test_state_norm_trace_matches_oracle_final_states(x64):
  q, k, v, u = random_inputs(31, 1, 12, 2, 4, 3)
  rng = np.random.default_rng(32)
  beta = rng.uniform(0.1, 1.0, (1, 12, 2))
  log_decay = -rng.uniform(0, 0.3, (1, 12, 2))
  traces = {mixer: _state_norm_trace(mixer, q, k, v, u=u, beta=beta, log_decay=log_decay)
            for mixer in ("vla", "linear_attention", "deltanet", "gated_deltanet")}
  for t in (1, 7, 12):
    cut = lambda *xs: [x[:, :t] for x in xs]
    expected = {
        "vla": oracles.vla(*cut(q, k, v, u))[1],
        "linear_attention": oracles.linear_attention(*cut(q, k, v))[1],
        "deltanet": oracles.gated_deltanet(*cut(q, k, v, beta))[1],
        "gated_deltanet": oracles.gated_deltanet(*cut(q, k, v, beta, log_decay))[1],
    }
    for mixer, S in expected.items():
      assert traces[mixer].shape == (1, 12, 2)
      np.testing.assert_allclose(traces[mixer][:, t - 1], np.linalg.norm(S, axis=(-2, -1)),
                                 rtol=1e-10)


def test_state_norm_trace_needs_its_inputs():
  q, k, v, u = random_inputs(0, 1, 4, 1, 2, 2, np.float32)
  with pytest.raises(ValueError, match="mixer='vla' needs u"):
    diagnostics.state_norm_trace("vla", q, k, v)
  with pytest.raises(ValueError, match="mixer must be one of"):
    diagnostics.state_norm_trace("mamba", q, k, v)
  with pytest.raises(ValueError, match="u has T=3"):
    diagnostics.state_norm_trace("vla", q, k, v, u=u[:, :3])
  with pytest.raises(ValueError, match=r"beta must have rank 3 \[B, T, H\]"):
    diagnostics.state_norm_trace("deltanet", q, k, v, beta=np.ones((1, 4, 1, 1), np.float32))
  with pytest.raises(ValueError, match="at least one token"):
    diagnostics.state_norm_trace("linear_attention", q[:, :0], k[:, :0], v[:, :0])


def test_jacobian_norms_match_dense_and_closed_form(x64):
  q, k, v, u = random_inputs(33, 2, 30, 2, 6, 6)
  out = _jacobian_norms(k, u, lam0=0.7)
  khat = k / np.linalg.norm(k, axis=-1, keepdims=True)
  np.testing.assert_allclose(out["measured"], out["closed_form"], rtol=1e-10)
  assert np.all(out["measured"] >= 1.0 - 1e-12) and np.all(out["measured"] < 1.6181)
  # Independent check of one token: a from the oracle's A, dense SVD.
  _, _, A = oracles.vla(q[:1, :5, :1], k[:1, :5, :1], v[:1, :5, :1], u[:1, :5, :1], lam0=0.7)
  a = A[0, 0] @ khat[0, 4, 0]
  a /= np.linalg.norm(a)
  J = np.eye(6) - np.outer(khat[0, 4, 0], a)
  np.testing.assert_allclose(out["measured"][0, 4, 0], np.linalg.norm(J, 2), rtol=1e-10)
  np.testing.assert_allclose(out["cosine"][0, 4, 0], a @ khat[0, 4, 0], rtol=1e-10)
  # A padding token (k = u = 0) leaves the state alone: J = I, norm 1 by both measures.
  at7 = np.arange(30)[None, :, None, None] == 7
  pad = _jacobian_norms(np.where(at7, 0.0, k), np.where(at7, 0.0, u), lam0=0.7)
  np.testing.assert_allclose(pad["measured"][:, 7], 1.0, rtol=1e-12)
  np.testing.assert_allclose(pad["closed_form"], pad["measured"], rtol=1e-10)


def test_closed_form_extremes():
  c = np.array([1.0, 0.0, 0.5])
  np.testing.assert_allclose(diagnostics.jacobian_norm_closed_form(c),
                             [1.0, (1 + np.sqrt(5)) / 2, np.sqrt((2 + np.sqrt(3)) / 2)],
                             rtol=1e-6)


def test_jacobian_product_norms(x64):
  _, k, _, u = random_inputs(34, 1, 10, 1, 4, 4)
  prod = _product_norms(k, u, span=3)
  assert prod.shape == (1, 3, 1)
  single = _jacobian_norms(k, u)["measured"]
  np.testing.assert_allclose(_product_norms(k, u, span=1)[:, :, 0],
                             single[:, :, 0], rtol=1e-10)
  khat = k / np.linalg.norm(k, axis=-1, keepdims=True)
  W, _ = penalty_scan(khat, u, np.broadcast_to(np.eye(4), (1, 1, 4, 4)))
  a = np.asarray(W) / np.linalg.norm(W, axis=-1, keepdims=True)
  P = np.eye(4)
  for t in range(3, 6):
    P = P @ (np.eye(4) - np.outer(khat[0, t, 0], a[0, t, 0]))
  np.testing.assert_allclose(prod[0, 1, 0], np.linalg.norm(P, 2), rtol=1e-10)
  with pytest.raises(ValueError, match="span must be an int"):
    _product_norms(k, u, span=0)


# The model-level diagnostics and the references they are checked against, each compiled
# once (eager, each costs one compilation per operation); models with NumPy-drawn parameters
# (`random_module`: no initialiser compiled; the checks hold for any parameters).
_layer_inputs = nnx.jit(diagnostics.vla_layer_inputs)      # lam0 comes back as an array
_layer_state_norms = nnx.jit(diagnostics.layer_state_norms)


@nnx.jit
def _first_mixer_output(model, tokens, o):
  """(the first block's mixer output, and its output projection of o)."""
  mixer = model.blocks[0].mixer
  h = model.blocks[0].norm1(model.embed_tokens(tokens))
  return mixer(h), mixer.out(o.astype(jnp.float32))


@nnx.jit
def _prefill_state_norms(model, tokens):
  """||S||_F of the state each recurrent layer's prefill leaves on the layer's inputs."""
  x = model.embed_tokens(tokens)
  norms = []
  for block in model.blocks:
    _, cache = block.mixer.prefill(block.norm1(x))
    S = cache.state.S if hasattr(cache.state, "S") else cache.state
    norms.append(jnp.linalg.norm(S, axis=(-2, -1)))
    x = block(x)
  return norms


def _model(mixer, max_len, **options):
  config = ModelConfig(vocab_size=13, max_len=max_len, mixer=mixer, d_model=8, num_heads=2,
                       chunk_size=16, mixer_options=options)
  return random_module(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))


def test_vla_layer_inputs_reproduce_the_layer(x64):
  model = _model("vla", 12, conv_size=3)     # the model of test_layer_state_norms[vla]
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 13)
  layers = _layer_inputs(model, tokens)
  assert len(layers) == 2
  # The first layer's recurrence output, projected, is the first block's mixer output.
  first = layers[0]
  assert float(first["lam0"]) == model.blocks[0].mixer.lam0
  o, _ = jax.jit(vla_recurrence, static_argnames="lam0")(first["q"], first["k"], first["v"],
                                                          first["u"], lam0=float(first["lam0"]))
  mixer_out, projected = _first_mixer_output(model, tokens, o)
  np.testing.assert_allclose(projected, mixer_out, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="no VLA layer"):
    _layer_inputs(_model("deltanet", 12), tokens)


@pytest.mark.parametrize("mixer", ["vla", "linear", "deltanet", "gated_deltanet", "softmax"])
def test_layer_state_norms_follow_the_layers_memory(x64, mixer):
  model = _model(mixer, 12, **({} if mixer == "softmax" else {"conv_size": 3}))
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 13)
  traces = _layer_state_norms(model, tokens)
  if mixer == "softmax":
    assert traces == []
    return
  assert len(traces) == 2 and traces[0].shape == (2, 12, 2)
  # The last norm of each layer is the norm of the state its prefill leaves (float32 model).
  for trace, norm in zip(traces, _prefill_state_norms(model, tokens), strict=True):
    np.testing.assert_allclose(trace[:, -1], norm, rtol=1e-5)
  if mixer == "vla":  # and the whole trace is state_norm_trace on the layer's inputs
    first = _layer_inputs(model, tokens)[0]
    want = _state_norm_trace("vla", first["q"], first["k"], first["v"], u=first["u"],
                             lam0=float(first["lam0"]))
    np.testing.assert_allclose(traces[0], want, rtol=1e-5)


def test_penalty_conditioning_and_write_directions_match_oracle(x64):
  q, k, v, u = random_inputs(35, 2, 9, 2, 5, 3)
  u = 3.0 * u      # ||u|| ~ 3: cond(A_t) reaches ~10 within 9 tokens
  positions = (1, 4, 9)
  cond = _conditioning(u, positions, lam0=0.5)
  khat, a = _write_directions(k, u, 0.5)
  assert cond.shape == (2, 3, 2) and khat.shape == a.shape == (2, 9, 2, 5)
  for p, t in enumerate(positions):
    A = oracles.vla(*(x[:, :t] for x in (q, k, v, u)), lam0=0.5)[2]     # A_t [B, H, dk, dk]
    eig = np.linalg.eigvalsh(A)
    np.testing.assert_allclose(cond[:, p], eig[..., -1] / eig[..., 0], rtol=1e-10)
    w = np.einsum("bhij,bhj->bhi", A, khat[:, t - 1])
    np.testing.assert_allclose(a[:, t - 1], w / np.linalg.norm(w, axis=-1, keepdims=True),
                               rtol=1e-10)
  assert cond.max() > 5.0     # the inputs test a spread spectrum, not A ~ I
  np.testing.assert_allclose(_conditioning(0 * u, (9,)), 1.0)
  with pytest.raises(ValueError, match=r"positions must be token counts in \[1, T=9\]"):
    _conditioning(u, (0, 9))


def test_key_collinearity_reads_zero_for_orthogonal_and_one_for_collinear_keys():
  eye = np.eye(4, dtype=np.float32)                                     # 4 orthogonal keys
  orthogonal = np.broadcast_to(eye[None, :, None, :], (2, 4, 3, 4))
  assert float(diagnostics.key_collinearity(orthogonal)) == 0.0
  one_way = np.broadcast_to(np.array([1.0, 2.0, 0.0, -1.0], np.float32), (2, 5, 3, 4))
  signs = np.where(np.arange(5) % 2, -3.0, 0.5)[None, :, None, None]   # |cos| ignores sign, scale
  np.testing.assert_allclose(diagnostics.key_collinearity(one_way * signs), 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match="at least 2 tokens"):
    diagnostics.key_collinearity(one_way[:, :1])
