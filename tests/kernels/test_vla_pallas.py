"""`vla_pallas` end to end in interpret mode: against the float64 oracle (forward), against
`jax.grad` of impl="scan" in float64 (gradients), a learned write strength (beta), precision
semantics, non-finite inputs."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from kernel_checks import (INTERPRET, anisotropic_u, assert_close, isotropic_u, rel,
                           vla_inputs)
from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels import config as kernel_config
from vla_jax.ops.vla import VLAState, vla_recurrence

# (B, T, H, dk, dv, C): T not a multiple of the chunk and more than one segment; dk != dv.
SHAPES = [(2, 37, 2, 16, 32, 16), (1, 70, 1, 32, 16, 32)]


# Each program is jitted once per configuration and takes the loss weights as arguments, so
# that the tests that run one (the reference gradient at a shape, the non-finite checks'
# forward and gradient) share its compilation.
def _with_beta(config, **kw):
  """vla_pallas on (q, k, v, u, S0, A0[, beta]): a seventh argument is beta."""
  return lambda *a: vla_pallas(*a[:6], beta=a[6] if len(a) > 6 else None, config=config,
                               interpret=INTERPRET, **kw)


def _jit_call(config):
  return jax.jit(_with_beta(config))


_call = functools.cache(_jit_call)


def _weights(seed, B, T, H, dk, dv):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal(s)) for s in
               ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)))


def _loss(fn):
  def loss(w, *args):
    wo, wS, wA = w
    o, S, A = fn(*args)
    return (jnp.sum(wo.astype(jnp.float32) * o.astype(jnp.float32)).astype(S.dtype)
            + jnp.sum(wS * S) + jnp.sum(wA * A))
  return loss


def _scan(q, k, v, u, S0, A0, beta=None):
  o, st = vla_recurrence(q, k, v, u, beta, initial_state=VLAState(S0, A0), impl="scan")
  return o, st.S, st.A


def _inputs_grad(fn, args):
  """jax.grad of `_loss(fn)` in every input of `args` (six, or seven with beta)."""
  return jax.grad(_loss(fn), argnums=tuple(range(1, len(args) + 1)))


# The reference: the gradients of `_loss(w, *args)` in the inputs, impl="scan".
@jax.jit
def _scan_grads(w, *args):
  return _inputs_grad(_scan, args)(w, *args)


def _with_grads(fn):
  """jit of (w, *args) -> (fn(*args), the gradients of `_loss(fn)(w, *args)` in the six
  inputs): the forward and the gradient in one program, in which XLA:CPU compiles the kernels
  they share once."""
  grad = jax.grad(_loss(fn), argnums=range(1, 7))
  return jax.jit(lambda w, *a: (fn(*a), grad(w, *a)))


def _sym(x):
  return 0.5 * (x + jnp.swapaxes(x, -1, -2))


# Several checks' calls in one program: a module fixture (`float64_runs`, `packed_runs`)
# traces each call's forward and gradient, with its plan settings, into one jitted program,
# in which XLA:CPU compiles the kernels that the configurations share once; each test checks
# its own call.
FUSED_FORMS = {"SPLIT_OUTPUT_BELOW": 0, "SPLIT_BWD_UP_TO": 0}   # the single-loop state passes


def _together(calls):
  """{name: (fn, kernel_config settings, w, args, ...)} -> {name: (fn(*args), the gradients
  of `_loss(fn)(w, *args)` in the six inputs)} from one jitted program, each fn traced with
  kernel_config's settings it names."""
  names = list(calls)

  def run(inputs):
    out = []
    for name, (w, args) in zip(names, inputs):
      fn, settings = calls[name][:2]
      with pytest.MonkeyPatch.context() as patch:
        for key, value in settings.items():
          patch.setattr(kernel_config, key, value)
        out.append((fn(*args), _inputs_grad(fn, args)(w, *args)))
    return out
  return dict(zip(names, jax.jit(run)([calls[n][2:4] for n in names])))


def _betas(seed, B, T, H, dtype):
  """Write strengths [B, T, H] in (0.05, 1), as a sigmoid gives them."""
  return jnp.asarray(np.random.default_rng(seed).uniform(0.05, 1.0, (B, T, H)), dtype)


def _call_case(seed, shape, settings=None, beta=False):
  """(fn, settings, w, args): vla_pallas with the shape's chunk size on `vla_inputs(seed)`
  (and with beta, write strengths `_betas(seed)`), loss weights `_weights(seed + 1)`."""
  B, T, H, dk, dv, C = shape
  args = vla_inputs(seed, B, T, H, dk, dv)
  return (_with_beta(KernelConfig(chunk_size=C)), settings or {},
          _weights(seed + 1, B, T, H, dk, dv),
          args + ([_betas(seed, B, T, H, np.float64)] if beta else []))


@pytest.fixture(scope="module")
def float64_runs():
  """({name: call}, {name: its outputs and gradients}) of the float64 checks: the default
  plan at SHAPES[0] (dk < dv), the fused state loops at SHAPES[1] (dk > dv), the packed
  documents' two forms at SHAPES[0]."""
  packed_fused = dict(FUSED_FORMS, FUSED_VJP_F32_UP_TO=0)   # and the XLA chunk-local VJP
  with jax.enable_x64(True):
    calls = {"default": _call_case(0, SHAPES[0]),
             "fused": _call_case(3, SHAPES[1], FUSED_FORMS, beta=True)}
    calls.update({f"packed_{forms}": _packed_case(
        10, SHAPES[0], np.float64, settings=packed_fused if forms == "fused" else None)
                  for forms in ("split", "fused")})
    return calls, _together(calls)


def _float64_check(call, result, shape):
  """o, S_T, A_T against the token-by-token oracle; the gradients for all six inputs (seven
  with beta) against `jax.grad` of impl="scan" (A0's over symmetric perturbations)."""
  _, _, w, args = call
  (o, S, A), got = result
  want = oracles.vla(*args[:4], S0=args[4], A0=args[5], beta=args[6] if len(args) > 6 else None)
  B, T, H, dk, dv, _ = shape
  chex.assert_shape([o, S, A], [(B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)])
  for name, g, ref in zip("oSA", (o, S, A), want):
    assert_close(g, ref, jnp.float64, name)
  ref = _scan_grads(w, *args)
  assert len(got) == len(ref) == len(args)
  for name, g, r in zip(("q", "k", "v", "u", "S0", "A0", "beta"), got, ref):
    if name == "A0":
      g, r = _sym(g), _sym(r)
    assert_close(g, r, jnp.float64, "d" + name)


def test_forward_and_gradients_float64(x64, float64_runs):
  """The default plan (at interpret-mode program counts: the split state passes), SHAPES[0]:
  forward and gradients exact in float64. SHAPES[1] in float64: the fused state loops (test
  below); with the default plan: float32 and bfloat16 (forward, packed gradients)."""
  calls, runs = float64_runs
  _float64_check(calls["default"], runs["default"], SHAPES[0])


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_forward_float32_and_bfloat16(dtype):
  """Float32 and bfloat16 inputs (float32 states) against the oracle on the same values;
  bfloat16 (the token-major path that reads the caller's arrays) with a write strength beta."""
  B, T, H, dk, dv, C = SHAPES[1]
  args = vla_inputs(2, B, T, H, dk, dv, dtype)
  beta = _betas(2, B, T, H, dtype) if dtype == jnp.bfloat16 else None
  o, S, A = _call(KernelConfig(chunk_size=C))(*args, *([] if beta is None else [beta]))
  chex.assert_type(o, dtype)
  chex.assert_type([S, A], jnp.float32)
  want = oracles.vla(*(np.asarray(x, np.float64) for x in args[:4]),
                     S0=np.asarray(args[4], np.float64), A0=np.asarray(args[5], np.float64),
                     beta=None if beta is None else np.asarray(beta, np.float64))
  for name, got, ref in zip("oSA", (o, S, A), want):
    assert_close(got, ref, dtype, name)


def test_fused_state_loops_float64(x64, monkeypatch, float64_runs):
  """The state forward and reverse pass as single loops (what the defaults select at GPU
  program counts: > 132 and > 512 programs), SHAPES[1], with a write strength beta: forward
  and the seven gradients (`float64_runs` traces the call with FUSED_FORMS; with packed
  documents: test_packed_documents_float64[fused])."""
  for key, value in FUSED_FORMS.items():
    monkeypatch.setattr(kernel_config, key, value)
  B, T, H, dk, dv, C = SHAPES[1]
  cfg = KernelConfig(chunk_size=C)
  plan = cfg.plan(low=False, acc=jnp.float64, dk=dk, dv=dv, BH=B * H, N=-(-T // C),
                  interpret=True)
  assert not plan.split_output and not plan.split_backward
  calls, runs = float64_runs
  _float64_check(calls["fused"], runs["fused"], SHAPES[1])


def test_highest_removes_bfloat16_rounding():
  """bfloat16 inputs: DEFAULT rounds product operands and the inference factors to bfloat16
  (error ~1e-3 on exact bf16 values); HIGHEST computes in float32 (~1e-6)."""
  B, T, H, dk, dv, C = SHAPES[1]
  args = vla_inputs(5, B, T, H, dk, dv, jnp.bfloat16)
  want = oracles.vla(*(np.asarray(x, np.float64) for x in args[:4]),
                     S0=np.asarray(args[4], np.float64), A0=np.asarray(args[5], np.float64))
  errs = {}
  for p in ("DEFAULT", "HIGHEST"):
    cfg = KernelConfig(chunk_size=C, precision=getattr(jax.lax.Precision, p))
    _, S, A = _call(cfg)(*args)
    errs[p] = max(rel(S, want[1]), rel(A, want[2]))
  assert errs["HIGHEST"] < 2e-5 < 1e-4 < errs["DEFAULT"] < 3e-2, errs


def test_float32_highest_exact_at_long_T_anisotropic():
  """float32 at HIGHEST, B = H = 1, T = 2048: the plan cuts the sequence into 128 one-chunk
  segments; anisotropic u and A0 = 100 I give cond(M_T) ~ 2e4. o, S_T, A_T match the
  float64 oracle (exact segment starts) within 2e-6 (the state path's own float32 error is
  ~1e-6); with direct float32 starts they err by ~1e-4."""
  B, T, H, d, C = 1, 2048, 1, 16, 16
  args = vla_inputs(6, B, T, H, d, d, np.float32)
  u = anisotropic_u(np.random.default_rng(6), B, H, T, d)
  args[3] = jnp.asarray(np.swapaxes(u, 1, 2), jnp.float32)
  args[5] = jnp.asarray(100 * np.eye(d)[None, None], jnp.float32)
  o, S, A = _call(KernelConfig(chunk_size=C, precision=jax.lax.Precision.HIGHEST))(*args)
  want = oracles.vla(*(np.asarray(x, np.float64) for x in args[:4]),
                     S0=np.asarray(args[4], np.float64), A0=np.asarray(args[5], np.float64))
  errors = [rel(got, ref) for got, ref in zip((o, S, A), want)]
  assert max(errors) < 2e-6, errors


def test_bfloat16_anisotropic_u_does_not_drift():
  """bfloat16 inputs, unit-norm u in 4 dominant directions plus noise (the layer's default
  penalty scale), B = 1, H = 2, d = 16, T = 4096 (the plan's one-chunk scan segments): o errs
  against the float64 oracle within 1.5x of isotropic u's error at lam0 = 0.1 and 1 (1.3x
  and 1.0x, the same in every quarter of the sequence). The write directions a_t have almost
  no component along the dominant directions, so the state's columns there are never erased
  and any rounding of a_t there adds up over the sequence: with a_t passed to the state path
  in bfloat16, 2.7x and 2.3x, growing from quarter to quarter. (Interpret mode runs the state
  chain's one-pass TF32 products in float32; the GPU check's drift cases cover them.)"""
  B, T, H, d, C = 1, 4096, 2, 16, 64
  args = vla_inputs(8, B, T, H, d, d, jnp.bfloat16)
  rng = np.random.default_rng(8)
  f64 = lambda x: np.asarray(x, np.float64)
  errors = {}
  for kind, make in (("isotropic", isotropic_u), ("anisotropic", anisotropic_u)):
    args[3] = jnp.asarray(np.swapaxes(make(rng, B, H, T, d, norm=1.0), 1, 2), jnp.bfloat16)
    for lam0 in (0.1, 1.0):
      args[5] = jnp.asarray(np.broadcast_to(np.eye(d) / lam0, (B, H, d, d)), jnp.float32)
      o = _call(KernelConfig(chunk_size=C))(*args)[0]
      want = oracles.vla(*map(f64, args[:4]), S0=f64(args[4]), A0=f64(args[5]))[0]
      errors[kind, lam0] = rel(o, want)
  for lam0 in (0.1, 1.0):
    assert errors["anisotropic", lam0] <= 1.5 * errors["isotropic", lam0], errors



def test_bfloat16_large_penalty_gains_stay_finite():
  """bfloat16 inputs with the shapes and plan of `test_bfloat16_anisotropic_u_does_not_drift`
  (64-token scan segments), isotropic u of norm sqrt(d) = 4 and A0 = I / lam0, lam0 = 0.1
  (the GPU drift check's isotropic input): the first blocks' penalty gains reach 160, and
  bfloat16 products in the scan drove A indefinite: NaN from token 41 to the end. Such blocks
  take three-pass products (`penalty_scan.GAIN_LIMIT`): o finite, within 2e-2 of float64, no
  quarter of the sequence above 1.5x another (measured 8.2e-3 to 8.4e-3)."""
  B, T, H, d, C = 1, 4096, 2, 16, 64
  args = vla_inputs(11, B, T, H, d, d, jnp.bfloat16)
  rng = np.random.default_rng(11)
  args[3] = jnp.asarray(np.swapaxes(isotropic_u(rng, B, H, T, d, norm=np.sqrt(d)), 1, 2),
                        jnp.bfloat16)
  args[5] = jnp.asarray(np.broadcast_to(10.0 * np.eye(d), (B, H, d, d)), jnp.float32)
  o = np.asarray(_call(KernelConfig(chunk_size=C))(*args)[0], np.float64)
  f64 = lambda x: np.asarray(x, np.float64)
  want = oracles.vla(*map(f64, args[:4]), S0=f64(args[4]), A0=f64(args[5]))[0]
  assert np.isfinite(o).all()
  quarters = [rel(o[:, i:i + T // 4], want[:, i:i + T // 4]) for i in range(0, T, T // 4)]
  assert max(quarters) < 2e-2 and max(quarters) < 1.5 * min(quarters), quarters


@functools.cache
def _outputs_and_grads_before(config, t):
  """jit of (wo, *args) -> ((o, S_T, A_T), the gradients in the six inputs of
  sum(wo * o[:, :t])): one program."""
  fn = lambda *a: vla_pallas(*a, config=config, interpret=INTERPRET)
  grad = jax.grad(lambda wo, *a: jnp.sum(wo * fn(*a)[0][:, :t]), argnums=range(1, 7))
  return jax.jit(lambda wo, *a: (fn(*a), grad(wo, *a)))


@pytest.mark.parametrize("bad", ["k", "v", "u", "q"])
def test_non_finite_input_stays_later(bad):
  """A NaN at token t (in the middle of a chunk, with earlier tokens in the same chunk)
  leaves every output before t and, for a loss on them, every gradient before t equal to the
  clean run's; the outputs from t on (for q: at t) are non-finite."""
  B, T, H, dk, dv, C = 1, 40, 1, 16, 16, 16
  t = 21                                        # chunk 1 holds tokens 16..31
  args = vla_inputs(6, B, T, H, dk, dv, np.float32)
  cfg = KernelConfig(chunk_size=C)
  run = _outputs_and_grads_before(cfg, t)
  which = "qkvu".index(bad)
  nan_args = list(args)
  nan_args[which] = nan_args[which].at[:, t, :, 0].set(jnp.nan)
  wo = jnp.asarray(np.random.default_rng(7).standard_normal((B, t, H, dv)), jnp.float32)
  (clean, g_clean), (poisoned, g_nan) = run(wo, *args), run(wo, *nan_args)
  np.testing.assert_array_equal(poisoned[0][:, :t], clean[0][:, :t])
  later = poisoned[0][:, t] if bad == "q" else poisoned[0][:, t:]
  assert not np.isfinite(np.asarray(later)).all()
  assert np.isfinite(np.asarray(poisoned[0][:, t + 1:])).all() == (bad == "q")
  for name, gc, gn in zip(("q", "k", "v", "u", "S0", "A0"), g_clean, g_nan):
    gc, gn = (np.asarray(x) for x in (gc, gn))
    if gc.ndim == 4:       # per token: before t
      gc, gn = gc[:, :t], gn[:, :t]
    np.testing.assert_array_equal(gn, gc, err_msg=f"d{name}")


def test_impl_pallas_value_width_plus_one(x64):
  """impl="pallas" with a value width the kernels do not take (d_h + 1, the layers' "delta"
  readout channel): run on zero value columns, forward and gradients equal impl="scan" in
  float64, packed documents included. (Off a GPU impl="pallas" runs the kernels in
  interpret mode: this CPU run is that check too.)"""
  B, T, H, dk, dv = 2, 37, 1, 16, 17
  args = vla_inputs(5, B, T, H, dk, dv)
  ids = _packed_ids(5, B, T, 16)

  def run(impl, *a):
    o, st = vla_recurrence(*a[:4], initial_state=VLAState(*a[4:]), impl=impl, chunk_size=16,
                           lam0=LAM0, segment_ids=ids)
    return o, st.S, st.A

  w = _weights(6, B, T, H, dk, dv)
  (got, grads), (ref, ref_grads) = (_with_grads(functools.partial(run, impl))(w, *args)
                                    for impl in ("pallas", "scan"))
  chex.assert_shape(got[0], (B, T, H, dv))
  for name, g, r in zip("oSA", got, ref):
    assert_close(g, r, jnp.float64, name)
  for name, g, r in zip(("q", "k", "v", "u", "S0", "A0"), grads, ref_grads):
    if name == "A0":
      g, r = _sym(g), _sym(r)
    assert_close(g, r, jnp.float64, "d" + name)


@pytest.mark.parametrize("dk,dv,C,block_v,match", [
    (24, 16, 16, None, "dk"), (16, 48, 16, None, "dv"), (16, 16, 256, None, "chunk_size"),
    (16, 32, 16, 8, "block_v")])
def test_unsupported_shapes_raise(dk, dv, C, block_v, match):
  q, v = jnp.zeros((1, 16, 1, dk)), jnp.zeros((1, 16, 1, dv))
  with pytest.raises(ValueError, match=match):
    vla_pallas(q, q, v, q, jnp.zeros((1, 1, dv, dk)), jnp.eye(dk)[None, None],
               config=KernelConfig(chunk_size=C, block_v=block_v))


# Packed documents: per row, starts at random tokens plus a start at a chunk boundary (token
# C), two starts inside one chunk and a length-1 document; anisotropic u (ill-conditioned M).
LAM0 = 0.7


def _packed_ids(seed, B, T, C):
  rng = np.random.default_rng(seed)
  ids = np.zeros((B, T), np.int32)
  for b in range(B):
    starts = set(rng.choice(np.arange(1, T), size=T // 8, replace=False).tolist())
    starts |= {C, C + 3, C + 4} if b == 0 else {1, 2 * C - 1}
    ids[b] = np.cumsum(np.isin(np.arange(T), sorted(starts))) * 5 + b
  return ids


def _packed_inputs(seed, B, T, H, dk, dv, dtype=np.float64, u_norm=None):
  """`vla_inputs` with anisotropic u, or with u_norm isotropic u of that norm."""
  args = vla_inputs(seed, B, T, H, dk, dv, dtype)
  rng = np.random.default_rng(seed)
  u = (anisotropic_u(rng, B, H, T, dk) if u_norm is None
       else isotropic_u(rng, B, H, T, dk, norm=u_norm))
  args[3] = jnp.asarray(np.swapaxes(u, 1, 2), dtype)
  return args


def _documents_alone(ids, q, k, v, u, S0, A0):
  """The float64 oracle on each document alone: (o, S_T, A_T of each row's last document)."""
  q, k, v, u, S0, A0 = (np.asarray(x, np.float64) for x in (q, k, v, u, S0, A0))
  o, S, A = np.zeros(v.shape), np.zeros(S0.shape), np.zeros(A0.shape)
  for b in range(ids.shape[0]):
    bounds = np.flatnonzero(np.diff(ids[b])) + 1
    for s, e in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [ids.shape[1]]])):
      init = dict(S0=S0[b:b + 1], A0=A0[b:b + 1]) if s == 0 else dict(lam0=LAM0)
      o_d, S_d, A_d = oracles.vla(*(x[b:b + 1, s:e] for x in (q, k, v, u)), **init)
      o[b, s:e], S[b], A[b] = o_d[0], S_d[0], A_d[0]
  return o, S, A


def _packed_scan(w, ids, *args):
  """The gradients of `_loss` of impl="scan" on the packed rows `ids` in the six inputs."""
  def run(q, k, v, u, S0, A0):
    o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl="scan",
                           lam0=LAM0, segment_ids=ids)
    return o, st.S, st.A
  return jax.grad(_loss(run), argnums=range(1, 7))(w, *args)


# One program per shape (segment_ids an argument): the packed checks' float64 references.
_packed_scan_grads = jax.jit(_packed_scan)


def _packed_case(seed, shape, dtype, u_norm=None, settings=None):
  """(fn, settings, w, args, ids): vla_pallas on `_packed_ids(seed)` rows of
  `_packed_inputs(seed)` (u_norm: there), loss weights in the states' dtype."""
  B, T, H, dk, dv, C = shape
  ids = _packed_ids(seed, B, T, C)
  args = _packed_inputs(seed, B, T, H, dk, dv, dtype, u_norm)
  cfg = KernelConfig(chunk_size=C)
  fn = lambda *a: vla_pallas(*a, segment_ids=ids, lam0=LAM0, config=cfg, interpret=INTERPRET)
  rng = np.random.default_rng(seed + 1)
  w = [rng.standard_normal(s) for s in ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk))]
  state = np.float64 if dtype == np.float64 else np.float32
  return fn, settings or {}, [x.astype(state) for x in w], args, ids


@functools.cache
def _packed_program(C):
  """jit of (w, args, ids) -> (vla_pallas on the packed rows `ids`, the gradients of
  `_loss` in the six inputs): one program per dtype, whatever the rows' documents."""
  cfg = KernelConfig(chunk_size=C)

  def run(w, args, ids):
    fn = lambda *a: vla_pallas(*a, segment_ids=ids, lam0=LAM0, config=cfg, interpret=INTERPRET)
    return fn(*args), jax.grad(_loss(fn), argnums=range(1, 7))(w, *args)
  return jax.jit(run)


@pytest.fixture(scope="module")
def packed_runs():
  """({name: call}, {name: its outputs and gradients}) of the float32 and bfloat16 packed
  checks (`_packed_case`); the two bfloat16 calls run one program."""
  calls = {"f32": _packed_case(12, SHAPES[1], np.float32),
           "bf16": _packed_case(12, SHAPES[1], jnp.bfloat16),
           "large_gains": _packed_case(13, SHAPES[1], jnp.bfloat16,
                                       u_norm=np.sqrt(SHAPES[1][3]))}
  run = _packed_program(SHAPES[1][5])
  return calls, {name: run(w, args, jnp.asarray(ids))
                 for name, (_, _, w, args, ids) in calls.items()}


def _packed_check(call, result, dtype):
  """A packed call's forward against the documents alone and its six gradients against
  jax.grad of impl="scan" on the packed rows (float64, on the inputs' values); returns the
  relative errors."""
  _, _, w, args, ids = call
  (o, S, A), got = result
  chex.assert_type(o, dtype)
  errors = {}
  for name, g, ref in zip("oSA", (o, S, A), _documents_alone(ids, *args)):
    assert_close(g, ref, dtype, name)
    errors[name] = rel(g, ref)
  with jax.enable_x64(True):
    exact = [jnp.asarray(np.asarray(x, np.float64)) for x in args]
    ref = _packed_scan_grads([jnp.asarray(x, np.float64) for x in w], jnp.asarray(ids),
                             *exact)
  for name, g, r in zip(("q", "k", "v", "u", "S0", "A0"), got, ref):
    if name == "A0":
      g, r = _sym(g), _sym(r)
    assert_close(g, r, dtype, "d" + name)
    errors["d" + name] = rel(g, r)
  return errors


@pytest.mark.parametrize("forms", ["split", "fused"])
def test_packed_documents_float64(x64, float64_runs, forms):
  """segment_ids: S and A restart at every document start (inside chunks, at chunk
  boundaries, several in one chunk); outputs, final state and all six gradients exact in
  float64. "fused": the single-loop state passes and the XLA chunk-local VJP (what the plan
  selects at GPU program counts and at head dim 128)."""
  calls, runs = float64_runs
  _packed_check(calls[f"packed_{forms}"], runs[f"packed_{forms}"], np.float64)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_packed_documents_float32_and_bfloat16(packed_runs, dtype):
  """The packed forward and gradients for float32 and bfloat16 inputs (float32 states) within
  the dtype's tolerance of float64 on the same values."""
  name = "f32" if dtype == np.float32 else "bf16"
  _packed_check(packed_runs[0][name], packed_runs[1][name], dtype)


def test_packed_documents_bfloat16_large_penalty_gains(packed_runs):
  """bfloat16 inputs with isotropic u of norm sqrt(dk): a document's first rows have penalty
  gains |u|^2 / lam0 = 46 (A restarts at I / lam0), so the blocks where documents start run
  the accurate branch (`penalty_scan.GAIN_LIMIT`), also from a row after an earlier
  document's rows in the same block; forward and gradients within bfloat16's tolerance of
  float64 on the same values."""
  _packed_check(packed_runs[0]["large_gains"], packed_runs[1]["large_gains"], jnp.bfloat16)


def test_packed_bad_arguments_raise():
  B, T, H, dk, dv, C = SHAPES[0]
  args = vla_inputs(0, B, T, H, dk, dv, np.float32)
  with pytest.raises(ValueError, match=r"segment_ids must have shape \[B, T\]"):
    vla_pallas(*args, segment_ids=np.zeros((B, T + 1), np.int32), interpret=INTERPRET)
  with pytest.raises(ValueError, match="lam0 must be a Python number > 0"):
    vla_pallas(*args, segment_ids=np.zeros((B, T), np.int32), lam0=0.0, interpret=INTERPRET)
