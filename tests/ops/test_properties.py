"""Properties every sequence op keeps, for every impl: causality (a perturbed, NaN or Inf token
t changes no output or gradient before t, and leaves every gradient finite), containment in a
packed document (a NaN or Inf changes no other document's outputs or gradients), exact
padding (appended zero-key tokens with any q and v, NaN included, change nothing before them
and not the final state) and bounded gradients at zero keys. Small shapes; "pallas" runs in
interpret mode off a GPU.

The causality and padding properties of the ops with their sequence sharded over simulated
CPU devices: tests/ops/test_context_parallel.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vla_jax.ops.baselines import deltanet, gated_deltanet, linear_attention
from vla_jax.ops.vla.recurrence import vla_recurrence

B, T, H, D, C = 1, 40, 2, 16, 16
T0 = 21                       # the corrupted token: inside the second chunk, not its first
XLA_IMPLS = ("scan", "associative_scan", "chunked")


def _vla(impl, x):
  o, (S, A) = vla_recurrence(x["q"], x["k"], x["v"], x["u"], impl=impl, chunk_size=C)
  return o, (S, A)


def _deltanet(impl, x):
  return deltanet(x["q"], x["k"], x["v"], x["beta"], impl=impl, chunk_size=C)


def _gated(impl, x):
  return gated_deltanet(x["q"], x["k"], x["v"], x["beta"], x["g"], impl=impl, chunk_size=C)


def _linear(impl, x):
  o, (S, z) = linear_attention(x["q"], x["k"], x["v"], feature_map=None, impl=impl,
                               chunk_size=C)
  return o, (S, z)


# op name -> (function, its token inputs, the inputs that carry state (a NaN there breaks it)).
OPS = {
    "vla": (_vla, ("q", "k", "v", "u"), ("k", "v", "u")),
    "deltanet": (_deltanet, ("q", "k", "v", "beta"), ("k", "v", "beta")),
    "gated_deltanet": (_gated, ("q", "k", "v", "beta", "g"), ("k", "v", "beta", "g")),
    "linear": (_linear, ("q", "k", "v"), ("k", "v")),
}
# The baselines share the delta-rule core with VLA: its associative scan runs with VLA only
# (each compiles slowly).
CASES = ([("vla", impl) for impl in XLA_IMPLS + ("pallas",)]
         + [(op, impl) for op in OPS if op != "vla" for impl in ("scan", "chunked", "pallas")])


def _inputs(seed, length=T):
  rng = np.random.default_rng(seed)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return dict(q=normal(B, length, H, D), k=normal(B, length, H, D), v=normal(B, length, H, D),
              u=normal(B, length, H, D) / 4.0,
              beta=jnp.asarray(rng.uniform(0.1, 0.9, (B, length, H)), jnp.float32),
              g=jnp.asarray(-rng.uniform(0.0, 0.5, (B, length, H)), jnp.float32))


@functools.lru_cache(maxsize=None)
def _jitted(op, impl):
  """jit of (x, weights) -> (o, state, gradient of sum(o * weights) with respect to every
  token input). One program per (op, impl) and length, which the tests share: the weights
  select the outputs a loss sees (zero weights pass exactly zero cotangents, as slicing
  does)."""
  fn, names, _ = OPS[op]

  def run(x, weights):
    def loss(y):
      return jnp.sum(fn(impl, {**x, **y})[0] * weights)
    o, state = fn(impl, x)
    return o, state, jax.grad(loss)({n: x[n] for n in names})
  return jax.jit(run)


def _outputs_and_grads(op, impl, until):
  """x -> (o, state, gradient of a weighted sum of o[:, :until] with respect to every token
  input)."""
  def run(x):
    length = x["q"].shape[1]
    weights = np.random.default_rng(7).standard_normal((B, length, H, D))
    weights[:, until:] = 0.0
    return _jitted(op, impl)(x, jnp.asarray(weights, jnp.float32))
  return run


def _set_token(x, name, t, value):
  return {**x, name: x[name].at[:, t].set(value)}


def _assert_earlier_unchanged(got, want, t, tol=0.0):
  """Outputs and gradients before t equal (bit for bit where tol = 0: the same program)."""
  o, _, grads = got
  o_ref, _, grads_ref = want
  pairs = [("o", o, o_ref)] + [(f"gradient of {n}", g, grads_ref[n]) for n, g in grads.items()]
  for what, a, a_ref in pairs:
    a, a_ref = np.asarray(a[:, :t]), np.asarray(a_ref[:, :t])
    assert np.all(np.isfinite(a)), f"non-finite {what} before t = {t}"
    np.testing.assert_allclose(a, a_ref, rtol=tol, atol=tol, err_msg=what)


def _assert_gradients_finite(got):
  """Every gradient finite, at the bad token and after it too (one NaN there would make a
  parameter's gradient, summed over tokens, NaN)."""
  for name, g in got[2].items():
    assert np.all(np.isfinite(np.asarray(g))), f"non-finite gradient of {name}"


@pytest.mark.parametrize("op,impl", CASES)
def test_later_token_changes_nothing_before_it(op, impl):
  """Token T0 perturbed, NaN or Inf in any one input: outputs and gradients before T0 are
  unchanged and finite, later gradients finite; a non-finite state input (or query) makes
  o[T0] NaN."""
  fn = _outputs_and_grads(op, impl, T0)
  x = _inputs(0)
  want = fn(x)
  _, names, state_inputs = OPS[op]
  rng = np.random.default_rng(1)
  for name in names:
    perturbed = x[name].at[:, T0].add(rng.standard_normal(x[name][:, T0].shape))
    _assert_earlier_unchanged(fn({**x, name: perturbed}), want, T0)
    for value in [np.nan, np.inf] if name in ("q", "v") else [np.nan]:
      got = fn(_set_token(x, name, T0, value))
      _assert_earlier_unchanged(got, want, T0)
      _assert_gradients_finite(got)
      if name in state_inputs or name == "q":
        assert np.all(np.isnan(np.asarray(got[0][:, T0]))), (name, value)


@pytest.mark.parametrize("op,impl", CASES)
def test_zero_key_padding_is_exact(op, impl):
  """Appending tokens with zero keys (and zero u, zero log decay) whose q and v are arbitrary,
  NaN and Inf included, changes no earlier output, no gradient and not the final state."""
  P = 12
  x = _inputs(2)
  fn_short = _outputs_and_grads(op, impl, T - P)
  short = {n: a[:, :T - P] for n, a in x.items()}
  want = fn_short(short)
  pad = dict(x)
  for name, a in x.items():
    if name in ("k", "u", "g"):
      pad[name] = a.at[:, T - P:].set(0.0)
  pad["v"] = pad["v"].at[:, T - P:T - P + 4].set(np.nan).at[:, T - P + 4].set(np.inf)
  pad["q"] = pad["q"].at[:, T - 2].set(np.nan)
  got = _outputs_and_grads(op, impl, T - P)(pad)
  _assert_earlier_unchanged(got, want, T - P, tol=1e-5)   # a longer program: rounding may differ
  for s, s_ref in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(np.asarray(s), np.asarray(s_ref), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op,impl", [c for c in CASES if c[0] in ("vla", "deltanet")])
def test_zero_key_gradient_is_bounded(op, impl):
  """A zero key (and zero u) gives a finite gradient no larger than a real token's, for a
  loss on every output."""
  x = _inputs(3)
  for name in ("k", "u"):
    x = _set_token(x, name, T0, 0.0)
  _, _, grads = _outputs_and_grads(op, impl, T)(x)
  for name in ("k", "u") if op == "vla" else ("k",):
    norms = np.linalg.norm(np.asarray(grads[name]), axis=-1)      # [B, T, H]
    real = np.delete(norms, T0, axis=1)
    assert np.all(np.isfinite(norms)), name
    assert np.max(norms[:, T0]) <= np.max(real), (name, np.max(norms[:, T0]), np.max(real))


# Three documents; the bad token sits in the middle one (inside a chunk, not its first token)
# or in the last one (whose state the row returns).
DOCS = (0, 14, 30, T)


@functools.lru_cache(maxsize=None)
def _packed(op, impl):
  """jit of (x, weights) -> (o, state, gradient of sum(o * weights)) for `DOCS` packed."""
  ids = jnp.asarray(np.repeat(np.arange(len(DOCS) - 1), np.diff(DOCS))[None], jnp.int32)
  names = OPS[op][1]

  def run(x, weights):
    x = {n: x[n] for n in names}
    fn = lambda y: PACKED_OPS[op](y, impl=impl, chunk_size=C, segment_ids=ids)
    o, state = fn(x)
    return o, state, jax.grad(lambda y: jnp.sum(fn(y)[0] * weights))(x)
  return jax.jit(run)


PACKED_OPS = {
    "vla": lambda x, **kw: vla_recurrence(x["q"], x["k"], x["v"], x["u"], **kw),
    "deltanet": lambda x, **kw: deltanet(x["q"], x["k"], x["v"], x["beta"], **kw),
    "gated_deltanet": lambda x, **kw: gated_deltanet(x["q"], x["k"], x["v"], x["beta"],
                                                     x["g"], **kw),
    "linear": lambda x, **kw: linear_attention(x["q"], x["k"], x["v"], feature_map=None, **kw),
}
# (token, input, value, the entry set, or None for the whole token); "u" stands for the op's
# own state input (beta, the log decay; linear attention has none). Tokens 20 and 33 lie in
# the middle and the last document.
PACKED_CORRUPTIONS = [(20, "q", np.inf, None), (20, "k", np.nan, 3), (20, "v", np.inf, None),
                      (20, "u", np.nan, 0), (33, "k", np.inf, None), (33, "v", np.nan, 5)]
PACKED_CASES = ([("vla", impl) for impl in ("scan", "chunked", "pallas")]
                + [(op, impl) for op in ("deltanet", "gated_deltanet", "linear")
                   for impl in ("chunked", "pallas")])


@pytest.mark.parametrize("op,impl", PACKED_CASES)
def test_non_finite_token_stays_in_its_document(op, impl):
  """With segment_ids, a NaN or Inf at token t of one document (in one entry or all) makes
  its outputs from t to the document's end NaN (for q: o_t alone) and the final state NaN only
  when the row's last document holds it; every other output and every gradient of a loss on
  those outputs are as in the clean run (bit for bit for the XLA forms; the kernels within
  float32 rounding) and finite, the other documents' included. The Gated DeltaNet kernel
  takes no segment_ids: the op refuses them."""
  if (op, impl) == ("gated_deltanet", "pallas"):
    x = _inputs(4)
    with pytest.raises(ValueError, match="segment_ids"):
      _packed(op, impl)(x, jnp.ones((B, T, H, D), jnp.float32))
    return
  tol = 1e-5 if impl == "pallas" else 0.0
  x = _inputs(4)
  extra = {"vla": "u", "deltanet": "beta", "gated_deltanet": "g", "linear": None}[op]
  for t, name, value, entry in PACKED_CORRUPTIONS:
    if name == "u":
      if extra is None:
        continue
      name = extra
    end = t + 1 if name == "q" else min(e for e in DOCS if e > t)
    weights = np.random.default_rng(7).standard_normal((B, T, H, D))
    weights[:, t:end] = 0.0                              # a loss on every other output
    weights = jnp.asarray(weights, jnp.float32)
    o_ref, state_ref, grads_ref = _packed(op, impl)(x, weights)
    where = (slice(None), t)
    if entry is not None and x[name].ndim == 4:
      where = where + (slice(None), entry)
    bad = x[name].at[where].set(value)
    o, state, grads = _packed(op, impl)({**x, name: bad}, weights)
    o, o_ref = np.asarray(o), np.asarray(o_ref)
    kept = np.ones(T, bool)
    kept[t:end] = False
    case = (op, name, value, t, entry)
    assert np.all(np.isnan(o[:, ~kept])), case
    assert np.all(np.isfinite(o[:, kept])), case
    np.testing.assert_allclose(o[:, kept], o_ref[:, kept], rtol=tol, atol=tol, err_msg=str(case))
    for n, g in grads.items():
      g, g_ref = np.array(g), np.array(grads_ref[n])
      assert np.all(np.isfinite(g)), (n,) + case
      if n == name:
        # The corrupted entries reach only outputs the loss leaves out: their gradient is zero
        # (by selection) here and zero up to rounding in the clean run (the chunked forms mix
        # a chunk's decays).
        assert np.all(g[where] == 0.0), (n,) + case
        np.testing.assert_allclose(g_ref[where], 0.0, atol=1e-6, err_msg=str(case))
        g[where] = g_ref[where] = 0.0
      np.testing.assert_allclose(g, g_ref, rtol=tol, atol=tol, err_msg=f"gradient of {n} {case}")
    last_doc = t >= DOCS[-2] and name != "q"
    for s, s_ref in zip(jax.tree.leaves(state), jax.tree.leaves(state_ref)):
      s = np.asarray(s)
      if last_doc:
        assert np.all(np.isnan(s)), case
      else:
        np.testing.assert_allclose(s, np.asarray(s_ref), rtol=tol, atol=tol, err_msg=str(case))
