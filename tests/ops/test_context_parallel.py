"""Sequence-sharded ops (`vla_jax.parallel`) against the single-device ops: outputs, final
state and every gradient, on 2, 4 or 8 simulated CPU devices; causality and exact padding of
the sharded ops (tests/ops/test_properties.py's properties).

The multi-device checks run in one subprocess (`XLA_FLAGS=--xla_force_host_platform_device_
count=8`; this process has one CPU device) that prints a JSON table of relative errors and
property failures; the tests read their rows from it. They are in the slow tier (`-m slow`,
about a minute); the CI tier trains sequence-sharded on a 2 x 2 mesh
(tests/training/test_sequence_parallel.py)."""

import functools
import json
import pathlib
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import rel_err, subprocess_env
from vla_jax import vla_recurrence
from vla_jax.parallel import shard_sequence

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEVICES = (2, 4, 8)
# Every device count takes the same path (each device's segment, then a gather and a scan over
# the P segments): VLA's XLA op runs on the most devices (T = 160: 20 tokens a device, ending
# inside a chunk) and, with a write strength beta, on the fewest (80 tokens a device), each
# other XLA op on one of them, the Pallas op on 4 (T = 64: one chunk a device) and with beta
# on 2; the long
# float32 case on the most (the most segment states folded).
LONG_DEVICES = (8,)
TOL = {"float64": 1e-10, "float32": 1e-5}
# (op, impl, dtype, device counts): every op in float64 at a small shape ("vla_beta":
# vla_recurrence with a write strength beta); float32 is checked
# on VLA at T = 16,384 (test_float32_long_anisotropic) and on the Pallas op (interpret mode,
# a tiny shape, whose kernels take float32 or bfloat16 products).
CASES = [("vla_recurrence", "chunked", "float64", (8,)),
         ("vla_recurrence", "pallas", "float32", (4,)),
         ("vla_beta", "chunked", "float64", (2,)),
         ("vla_beta", "pallas", "float32", (2,)),
         ("deltanet", "chunked", "float64", (8,)),
         ("gated_deltanet", "chunked", "float64", (2,)),
         ("linear_attention", "chunked", "float64", (8,))]
LONG_T = 16384
# The causality and padding properties of tests/ops/test_properties.py with the sequence
# sharded, checked with the programs of the XLA cases above (each op on its most devices,
# float64, T = 160, from its initial state; linear attention on raw q and k, unnormalised, as
# in test_properties.py): one op an impl, as the sharded fold is the same for every impl.
# "later_token": a token on a later device than the first, perturbed, NaN or Inf in any one
# input, changes no output or gradient before it and leaves every gradient finite (its own
# output NaN); "padding": the last PAD tokens with zero keys (zero u, zero log decay) and NaN
# and Inf q and v leave the outputs before them, their gradients and the final state as the
# op on one device leaves them (which equal the unpadded sequence's: test_properties.py).
# The sharded ops of these cases take these token arrays by keyword (the others by position;
# the one-device references always by position).
BY_KEYWORD = {"vla_beta": ("beta",), "gated_deltanet": ("log_decay",)}
PROPERTY_OPS = [(name, max(devices)) for name, impl, _, devices in CASES if impl == "chunked"]
PROPERTIES = ("later_token", "padding")
PAD = 12


# ------------------------------------------------------------------------------------------
# The subprocess: every case at every device count, one JSON table.

def _inputs(name, impl, dtype, seed, T=None):
  """(args, initial_state, static kwargs) of one case; float64 NumPy draws cast to dtype."""
  from vla_jax import LinearAttentionState, VLAState   # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  if impl == "pallas":
    B, T, H, dk, dv, C = 1, 64, 1, 16, 16, 16
  else:
    B, T, H, dk, dv, C = 2, T or 160, 2, 8, 6, 16
  cast = lambda x: jnp.asarray(x, dtype)
  q, k = (cast(rng.standard_normal((B, T, H, dk))) for _ in range(2))
  v = cast(rng.standard_normal((B, T, H, dv)))
  S0 = cast(rng.standard_normal((B, H, dv, dk)) / 4)
  kw = dict(impl=impl, chunk_size=C)
  beta = cast(rng.uniform(0.05, 1.0, (B, T, H)))
  if name in ("vla_recurrence", "vla_beta"):
    u = cast(rng.standard_normal((B, T, H, dk)) / np.sqrt(dk))
    R = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
    A0 = cast(np.linalg.inv(np.eye(dk) + R @ np.swapaxes(R, -1, -2)))
    return (q, k, v, u) + ((beta,) if name == "vla_beta" else ()), VLAState(S0, A0), kw
  if name == "deltanet":
    return (q, k, v, beta), S0, kw
  if name == "gated_deltanet":
    return (q, k, v, beta, cast(-rng.uniform(0.0, 0.3, (B, T, H)))), S0, kw
  z0 = cast(rng.uniform(0.0, 1.0, (B, H, dk)))
  return (q, k, v), LinearAttentionState(S0, z0), dict(kw, normalize=True)


def _by_keyword(fn, names):
  """`fn` given its last positional arguments by keyword, as `names` (the sharded op splits
  token arrays however they are passed: BY_KEYWORD)."""
  def run(*args, **kw):
    head = len(args) - len(names)
    return fn(*args[:head], **dict(zip(names, args[head:])), **kw)
  return run


def _anisotropic_u(rng, B, T, H, d):
  """Rank 4 + 1% noise, rows normalised / sqrt(d): cond(M) grows to about 1e3 at 16k."""
  basis = rng.standard_normal((H, 4, d))
  u = np.einsum("bthr,hrd->bthd", rng.standard_normal((B, T, H, 4)), basis)
  u = u + 0.01 * rng.standard_normal((B, T, H, d))
  return u / np.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(d)


def _program(fn):
  """jit of (args, state, cts) -> ((o, final state), (args' and state's cotangents)): the op's
  outputs and the pullback of the output cotangents cts."""
  @jax.jit
  def run(args, state, cts):
    out, pull = jax.vjp(lambda a, s: fn(*a, initial_state=s), args, state)
    return out, pull(cts)
  return run


def _cotangents(fn, args, state, seed):
  """Random cotangents of the outputs (o, final state) of fn, in their dtypes."""
  out_shape = jax.eval_shape(lambda a, s: fn(*a, initial_state=s), args, state)
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), out_shape)


def _named(result):
  (o, final), (d_args, d_state) = result
  named = {"o": o}
  named.update({f"state.{i}": x for i, x in enumerate(jax.tree.leaves(final))})
  named.update({f"d_arg{i}": x for i, x in enumerate(d_args) if x is not None})
  named.update({f"d_state.{i}": x for i, x in enumerate(jax.tree.leaves(d_state))})
  return named


def _results(fn, args, state, seed):
  """Outputs, final state and the gradients of a random linear function of both."""
  return _named(_program(fn)(args, state, _cotangents(fn, args, state, seed)))


def _errors(got, ref):
  return {name: rel_err(got[name], ref[name]) for name in ref}


def _loss_before(cts, t):
  """cts with the output cotangent zero from token t on and the final state's zero: the
  gradients of a loss on the outputs before t."""
  o_ct, state_ct = cts
  return (o_ct.at[:, t:].set(0), jax.tree.map(jnp.zeros_like, state_ct))


def _replace(args, i, x):
  return args[:i] + (jnp.asarray(x, args[i].dtype),) + args[i + 1:]


def _later_token(run, args, state, cts, t):
  """Token t perturbed, NaN or Inf (q and v) in each input: the outputs and gradients before t
  equal the clean run's bit for bit (the same program) and are finite; with a non-finite
  input every gradient is finite and o[t] is NaN (every token input carries state or is q)."""
  cts = _loss_before(cts, t)
  (o_ref, _), (d_ref, _) = run(args, state, cts)
  rng = np.random.default_rng(1)
  for i, x in enumerate(args):
    for value in ["perturbed", np.nan] + ([np.inf] if i in (0, 2) else []):
      y = np.array(x)
      y[:, t] = y[:, t] + rng.standard_normal(y[:, t].shape) if value == "perturbed" else value
      (o, _), (d_args, _) = run(_replace(args, i, y), state, cts)
      case = f"input {i} {value} at t = {t}"
      pairs = [("o", o, o_ref)] + [(f"d_arg{j}", g, r) for j, (g, r) in enumerate(zip(d_args,
                                                                                   d_ref))]
      for what, a, a_ref in pairs:
        a, a_ref = np.asarray(a[:, :t]), np.asarray(a_ref[:, :t])
        assert np.all(np.isfinite(a)), f"non-finite {what} before t: {case}"
        np.testing.assert_array_equal(a, a_ref, err_msg=f"{what}: {case}")
      if value != "perturbed":
        for j, g in enumerate(d_args):
          assert np.all(np.isfinite(np.asarray(g))), f"non-finite d_arg{j}: {case}"
        assert np.all(np.isnan(np.asarray(o[:, t]))), case


def _padding(name, run, ref_run, args, state, cts):
  """The last PAD tokens with zero keys (u, log decay) and NaN and Inf v and q: the outputs
  before them, the gradients of a loss on those and the final state, sharded, equal the op's
  on one device (float64 rounding) and are finite."""
  T = args[0].shape[1]
  cut = T - PAD
  padded = [np.array(x) for x in args]
  for i in [1] + {"vla_recurrence": [3], "gated_deltanet": [4]}.get(name, []):
    padded[i][:, cut:] = 0.0
  padded[2][:, cut:cut + 4] = np.nan
  padded[2][:, cut + 4] = np.inf
  padded[0][:, T - 2] = np.nan
  padded = tuple(jnp.asarray(y, x.dtype) for x, y in zip(args, padded))
  cts = _loss_before(cts, cut)
  got, want = (_named(f(padded, state, cts)) for f in (run, ref_run))
  for key, x in got.items():
    if key.startswith("d_state"):
      continue
    a, a_ref = (np.asarray(y if key.startswith("state") else y[:, :cut]) for y in (x, want[key]))
    assert np.all(np.isfinite(a)), f"non-finite {key}"
    assert rel_err(a, a_ref) < TOL["float64"], (key, rel_err(a, a_ref))


def _property_rows(cases):
  """A row {property, op, devices, failure (None or the assertion's message)} for each of
  PROPERTIES and PROPERTY_OPS; cases: {name: (sharded program, one-device program, args,
  state, cts)}."""
  rows = []
  for name, n in PROPERTY_OPS:
    sharded, one, args, state, cts = cases[name]
    t = (2 if n > 2 else 1) * (args[0].shape[1] // n) + 5   # inside a chunk, not its first
    checks = {"later_token": lambda: _later_token(sharded, args, state, cts, t),
              "padding": lambda: _padding(name, sharded, one, args, state, cts)}
    for prop in PROPERTIES:
      try:
        checks[prop]()
        failure = None
      except AssertionError as e:
        failure = str(e)[-2000:]
      rows.append(dict(property=prop, op=name, devices=n, failure=failure))
  return rows


def main():
  """Prints one JSON list of rows {op, impl, dtype, devices, errors} (run with 8 devices)."""
  jax.config.update("jax_enable_x64", True)
  # Small shapes: compiling is most of the time, and XLA's optimisations only slow it.
  jax.config.update("jax_disable_most_optimizations", True)
  import vla_jax   # pylint: disable=import-outside-toplevel
  from vla_jax.parallel import shard_sequence   # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh   # pylint: disable=import-outside-toplevel
  assert jax.device_count() == 8, jax.devices()
  meshes = {n: Mesh(np.array(jax.devices()[:n]), ("seq",)) for n in DEVICES}
  rows, properties = [], {}
  for seed, (name, impl, dtype, devices) in enumerate(CASES):
    op = getattr(vla_jax, "vla_recurrence" if name == "vla_beta" else name)
    args, state, kw = _inputs(name, impl, dtype, seed)
    fns = {1: functools.partial(op, **kw)}
    fns.update({n: _by_keyword(functools.partial(shard_sequence(op, mesh=meshes[n]), **kw),
                               BY_KEYWORD.get(name, ())) for n in devices})
    cts = _cotangents(fns[1], args, state, seed)
    programs = {n: _program(fn) for n, fn in fns.items()}
    ref = _named(programs[1](args, state, cts))
    for n in devices:
      got = _named(programs[n](args, state, cts))
      rows.append(dict(op=name, impl=impl, dtype=dtype, devices=n, errors=_errors(got, ref)))
    if impl == "chunked":
      n = max(devices)
      if name == "linear_attention":   # raw q, k, unnormalised (two more small programs)
        kw = dict(kw, normalize=False, feature_map=None)
        programs = {1: _program(functools.partial(op, **kw)),
                    n: _program(functools.partial(shard_sequence(op, mesh=meshes[n]), **kw))}
      properties[name] = (programs[n], programs[1], args, state, cts)
  rows += _property_rows(properties)
  # Long and ill-conditioned: float32 at T = 16,384 with rank-4 u, against the float32 op and
  # against the float64 op (the sharded op must be about as accurate as the op itself).
  rng = np.random.default_rng(99)
  B, T, H, d = 1, LONG_T, 1, 16
  q, k, v = (rng.standard_normal((B, T, H, d)) for _ in range(3))
  u = _anisotropic_u(rng, B, T, H, d)
  state = vla_jax.initial_vla_state(B, H, d, d, dtype=np.float64)
  for dtype in ("float32", "float64"):
    args = tuple(jnp.asarray(x, dtype) for x in (q, k, v, u))
    st = jax.tree.map(lambda x, dt=dtype: x.astype(dt), state)
    results = _results(vla_jax.vla_recurrence, args, st, 7)
    if dtype == "float32":
      ref32, args32, st32 = results, args, st
    else:
      ref64 = results
  rows.append(dict(op="vla_recurrence", impl="chunked", dtype="float32", devices=1,
                   long=True, errors=_errors(ref32, ref64)))
  for n in LONG_DEVICES:
    got = _results(shard_sequence(vla_jax.vla_recurrence, mesh=meshes[n]), args32, st32, 7)
    rows.append(dict(op="vla_recurrence", impl="chunked", dtype="float32", devices=n,
                     long=True, errors=_errors(got, ref32), errors64=_errors(got, ref64)))
  print(json.dumps(rows))


@pytest.fixture(scope="module")
def table():
  env = subprocess_env(devices=8)
  code = ("import sys; sys.path[:0] = sys.argv[1:]; import test_context_parallel as t; "
          "t.main()")
  proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests" / "ops"),
                         str(ROOT / "tests")], env=env, capture_output=True, text=True,
                        timeout=1200, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _row(table, **key):
  rows = [r for r in table if all(r.get(k) == v for k, v in key.items())]
  assert len(rows) == 1, key
  return rows[0]


@pytest.mark.slow   # the 8-device table (about a minute): README's slow tier
@pytest.mark.parametrize("name,impl,dtype,devices",
                         [(n, i, d, p) for n, i, d, ps in CASES for p in ps],
                         ids=lambda x: str(x))
def test_sharded_equals_one_device(table, name, impl, dtype, devices):
  errors = _row(table, op=name, impl=impl, dtype=dtype, devices=devices, long=None)["errors"]
  bad = {k: e for k, e in errors.items() if not e < TOL[dtype]}
  assert not bad, bad


@pytest.mark.slow   # the 8-device table (about a minute): README's slow tier
@pytest.mark.parametrize("prop,name,devices", [(p, n, d) for n, d in PROPERTY_OPS
                                               for p in PROPERTIES])
def test_sharded_properties(table, prop, name, devices):
  """The causality and padding properties (tests/ops/test_properties.py) with the sequence
  sharded (PROPERTY_OPS): a NaN or Inf at a token of device 2 (of 8; device 1 of 2) leaves
  every output and gradient before it as it was (no 0 * NaN in the folds, the gathers'
  transposes or a later segment's backward); NaN and Inf at zero-key pads reach nothing."""
  failure = _row(table, property=prop, op=name, devices=devices)["failure"]
  assert failure is None, failure


@pytest.mark.slow   # the 8-device table (about a minute): README's slow tier
@pytest.mark.parametrize("devices", LONG_DEVICES)
def test_float32_long_anisotropic(table, devices):
  """T = 16,384, rank-4 u, float32: the sharded op equals the float32 op to 1e-5, except
  where the float32 op itself is further than 5e-6 from the float64 op (du: 2e-5 here); and
  it is at least about as close to the float64 op as the float32 op is, everywhere."""
  op_error = _row(table, devices=1, long=True)["errors"]
  row = _row(table, devices=devices, long=True)
  bad = {k: (e, op_error[k]) for k, e in row["errors"].items()
         if not e < max(1e-5, 2 * op_error[k])}
  assert not bad, bad
  worse = {k: (e, op_error[k]) for k, e in row["errors64"].items()
           if not e < 1.5 * op_error[k] + 1e-6}
  assert not worse, worse


# ------------------------------------------------------------------------------------------
# One device (this process): the API's checks.

class TestErrors:

  def test_unknown_op(self):
    from vla_jax.parallel import shard_sequence   # pylint: disable=import-outside-toplevel
    with pytest.raises(TypeError, match="op must be one of"):
      shard_sequence(jnp.sum)

  def test_no_mesh(self):
    from vla_jax import deltanet   # pylint: disable=import-outside-toplevel
    from vla_jax.parallel import shard_sequence   # pylint: disable=import-outside-toplevel
    x = jnp.zeros((1, 4, 1, 4))
    with pytest.raises(ValueError, match="needs a mesh"):
      shard_sequence(deltanet)(x, x, x, x[..., 0])

  def test_missing_axis_and_indivisible_length(self):
    from jax.sharding import Mesh   # pylint: disable=import-outside-toplevel
    from vla_jax import deltanet   # pylint: disable=import-outside-toplevel
    from vla_jax.parallel import shard_sequence   # pylint: disable=import-outside-toplevel
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    x = jnp.zeros((1, 4, 1, 4))
    with pytest.raises(ValueError, match="no axis 'seq'"):
      shard_sequence(deltanet, mesh=mesh)(x, x, x, x[..., 0])
    with pytest.raises(ValueError, match="T=4 must be divisible"):
      shard_sequence(deltanet, mesh=jax.sharding.AbstractMesh((3,), ("seq",)))(
          x, x, x, x[..., 0])


  def test_values_shapes_and_arguments_are_checked_before_the_split(self):
    """As the op called eagerly: a concrete positive log decay or too small a lam0 array raise
    (inside shard_map they are traced, and the op skips a traced value's checks), a token
    array whose B, T differ from q's, and an argument the op does not take."""
    from vla_jax import gated_deltanet   # pylint: disable=import-outside-toplevel
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("seq",))
    x = jnp.ones((1, 4, 1, 4))
    g = jnp.full((1, 4, 1), 0.5)
    with pytest.raises(ValueError, match="log_decay must be <= 0"):
      shard_sequence(gated_deltanet, mesh=mesh)(x, x, x, g, log_decay=g)
    for lam0, match in ((-1.0, "lam0 must be a finite number > 0"),
                        (1e-6, "lam0=1e-06 is below 0.001")):
      with pytest.raises(ValueError, match=match):
        shard_sequence(vla_recurrence, mesh=mesh)(x, x, x, x, lam0=jnp.float32(lam0))
    with pytest.raises(ValueError, match=r"k must have B, T = \(1, 4\) like q"):
      shard_sequence(vla_recurrence, mesh=mesh)(x, x[:, :2], x, x)
    with pytest.raises(TypeError, match="vla_recurrence: .*'gamma'"):
      shard_sequence(vla_recurrence, mesh=mesh)(x, x, x, x, gamma=1.0)

  def test_no_tokens_run_the_op(self):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("seq",))
    x = jnp.ones((1, 0, 1, 4))
    o, state = shard_sequence(vla_recurrence, mesh=mesh)(q=x, k=x, v=x, u=x, lam0=2.0)
    o_ref, state_ref = vla_recurrence(x, x, x, x, lam0=2.0)
    chex.assert_shape(o, (1, 0, 1, 4))
    chex.assert_trees_all_equal(state, state_ref)

  def test_segment_ops_check_their_options(self):
    """The per-device ops check the options as the ops do: lam0 a number > 0 also when an
    initial state makes it unused, linear attention's normalize a bool and eps a number > 0
    (a str such as "no" is not read for its truth)."""
    from vla_jax import VLAState   # pylint: disable=import-outside-toplevel
    from vla_jax.parallel import segments   # pylint: disable=import-outside-toplevel
    x = jnp.zeros((1, 4, 1, 4))
    state = VLAState(jnp.zeros((1, 1, 4, 4)), jnp.broadcast_to(jnp.eye(4), (1, 1, 4, 4)))
    with pytest.raises(ValueError, match="lam0 must be a real number"):
      segments.vla_segments(x, x, x, x, axis_name="seq", lam0="abc", initial_state=state)
    with pytest.raises(ValueError, match="normalize must be True or False; got str 'no'"):
      segments.linear_attention_segments(x, x, x, axis_name="seq", normalize="no")
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
      segments.linear_attention_segments(x, x, x, axis_name="seq", normalize=True, eps=-1.0)


def test_one_device_axis_runs_the_op_itself():
  """On a sequence axis of one device `shard_sequence` is the op: the same jaxpr ops, no
  collectives and no augmented value channels."""
  rng = np.random.default_rng(0)
  q, k, v, u = (rng.standard_normal((1, 32, 2, 16)).astype(np.float32) for _ in range(4))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("seq",))
  sharded = shard_sequence(vla_recurrence, mesh=mesh)
  text = str(jax.make_jaxpr(lambda *a: sharded(*a, chunk_size=16))(q, k, v, u))
  assert "all_gather" not in text and "psum" not in text
  # Jitted (one compilation each rather than one per eager operation).
  o, state = jax.jit(functools.partial(sharded, chunk_size=16))(q, k, v, u)
  o_ref, state_ref = jax.jit(functools.partial(vla_recurrence, chunk_size=16))(q, k, v, u)
  np.testing.assert_array_equal(np.asarray(o), np.asarray(o_ref))
  np.testing.assert_array_equal(np.asarray(state.A), np.asarray(state_ref.A))
