"""Mixers: jit, causality, and agreement with an independent float64 NumPy oracle
(`oracles.mixer`); finite
gradients, bfloat16 activations, options and initialisers."""

import json
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import oracles
from conftest import subprocess_env
from vla_jax.layers import MIXERS, GatedDeltaNet, SoftmaxAttention, VLAAttention, make_mixer
from vla_jax.layers.softmax import resolve_implementation

B, T, D, H = 2, 37, 24, 2  # awkward T (not a multiple of the chunk), d_h = 12
# Recurrent mixers default to conv_size=4; {"conv_size": 0} is the layer without convolution.
CASES = [("vla", {"conv_size": 0}), ("vla", {"readout": "additive", "qk_map": "elu1"}),
         ("vla", {"readout": "delta", "conv_size": 0}), ("vla", {}), ("softmax", {}),
         ("softmax", {"conv_size": 4}), ("linear", {"conv_size": 0}),
         ("linear", {"normalize": False, "conv_size": 3}), ("deltanet", {"conv_size": 0}),
         ("deltanet", {}), ("gated_deltanet", {"conv_size": 0}), ("gated_deltanet", {}),
         ("gated_deltanet", {"output_gate": False, "expand_v": 1}),
         ("deltanet", {"output_gate": True, "expand_v": 2, "out_norm": False}),
         ("vla", {"qk_map": "elu1"}),
         ("vla", {"qk_map": "silu_l2", "beta": True, "readout": "delta", "conv_size": 0})]
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]


def _mixer(name, options, dtype=jnp.float32, impl="chunked", seed=0):
  return make_mixer(name, D, H, impl=impl, chunk_size=16, options=options, dtype=dtype,
                    param_dtype=dtype, rngs=nnx.Rngs(seed))


def _x(seed=1, dtype=jnp.float32, length=T):
  return jax.random.normal(jax.random.key(seed), (B, length, D), dtype)


@pytest.mark.parametrize("name", ["vla", "gated_deltanet"])
def test_grad_finite(name):
  m = _mixer(name, {})
  grads = nnx.jit(nnx.grad(lambda m, x: jnp.sum(m(x) ** 2)))(m, _x())
  leaves = jax.tree.leaves(nnx.state(grads))
  chex.assert_tree_all_finite(leaves)
  assert all(float(jnp.abs(g).max()) > 0 for g in leaves)


# jax.nn.dot_product_attention's XLA path keeps its softmax in float32 even for float64 input.
ORACLE_TOL = {"softmax": 1e-6}


ORACLE_CASES = [c + ("chunked",) for c in CASES] + [("vla", {}, "scan")]
ORACLE_T, CAUSAL_T = 21, 10


@pytest.fixture(scope="module")
def oracle_runs():
  """{case index: (mixer, x, y, y2)}: each case's float64 mixer on x and on x2 (x with the
  tokens after CAUSAL_T redrawn), all cases' outputs from one jitted program run twice. The
  cases share most kernels (projections, convolutions, the delta-rule core), which XLA:CPU
  compiles once a program, not once a case."""
  with jax.enable_x64(True):
    mixers = [_mixer(name, options, dtype=jnp.float64, impl=impl)
              for name, options, impl in ORACLE_CASES]
    x = _x(dtype=jnp.float64, length=ORACLE_T)
    t = CAUSAL_T
    x2 = x.at[:, t + 1:].set(3 * jax.random.normal(jax.random.key(9), (B, ORACLE_T - t - 1, D),
                                                   jnp.float64))
    every = nnx.jit(lambda ms, x: [m(x) for m in ms])
    ys, ys2 = every(mixers, x), every(mixers, x2)
    return {i: (m, x, y, y2) for i, (m, y, y2) in enumerate(zip(mixers, ys, ys2))}


@pytest.mark.parametrize("case", range(len(ORACLE_CASES)), ids=IDS + ["vla-scan"])
def test_matches_float64_oracle_and_is_causal(oracle_runs, case):
  """The jitted mixer equals its oracle; outputs at t <= 10 do not change when inputs after t
  change, later ones do (`oracle_runs`)."""
  name = ORACLE_CASES[case][0]
  m, x, y, y2 = oracle_runs[case]
  t = CAUSAL_T
  with jax.enable_x64(True):
    chex.assert_shape(y, (B, ORACLE_T, D))
    assert y.dtype == jnp.float64
    want = oracles.mixer(m, np.asarray(x))
    tol = ORACLE_TOL.get(name, 1e-9)
    np.testing.assert_allclose(np.asarray(y), want, rtol=tol, atol=tol)
    np.testing.assert_allclose(y[:, :t + 1], y2[:, :t + 1], rtol=tol, atol=tol)
    assert np.abs(np.asarray(y[:, t + 1:] - y2[:, t + 1:])).max() > 1e-3


def test_bfloat16_activations_keep_float32_state():
  m = _mixer("vla", {}, dtype=jnp.bfloat16)
  y = nnx.jit(lambda m, x: m(x))(m, _x(dtype=jnp.bfloat16))
  chex.assert_type(y, jnp.bfloat16)
  chex.assert_tree_all_finite(y.astype(jnp.float32))


def test_softmax_implementation_choice_is_explicit():
  assert resolve_implementation("auto", jnp.float32, backend="gpu") == "xla"
  assert resolve_implementation("auto", jnp.bfloat16, backend="gpu") == "cudnn"
  assert resolve_implementation("auto", jnp.bfloat16, backend="cpu") == "xla"
  assert resolve_implementation("xla", jnp.bfloat16, backend="gpu") == "xla"
  with pytest.raises(ValueError, match="cudnn.*bfloat16"):
    SoftmaxAttention(D, H, implementation="cudnn", rngs=nnx.Rngs(0))
  # The backend is checked at construction, as the recurrent mixers' impl (it built on a CPU
  # and failed at the first call: "cuDNN is not detected").
  with pytest.raises(ValueError, match="SoftmaxAttention: implementation='cudnn' cannot run "
                                       "here: the backend is 'cpu'.* or 'xla'"):
    SoftmaxAttention(D, H, implementation="cudnn", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("call,match", [
    (lambda: make_mixer("mamba", 16, 2, rngs=nnx.Rngs(0)), "unknown mixer 'mamba'"),
    (lambda: make_mixer("vla", 16, 2, options={"normalize": True}, rngs=nnx.Rngs(0)),
     "does not take option"),
    (lambda: VLAAttention(10, 3, rngs=nnx.Rngs(0)), "not divisible by num_heads"),
    (lambda: SoftmaxAttention(16, 2, 4, rngs=nnx.Rngs(0)), "must equal d_model"),
    (lambda: SoftmaxAttention(32, 3, rngs=nnx.Rngs(0)),
     r"d_model=32 is not divisible by num_heads=3; choose a num_heads that divides d_model "
     r"\(num_heads \* head_dim must equal d_model here\)$"),
    (lambda: VLAAttention(16, 2, readout="ratio", rngs=nnx.Rngs(0)), "readout must be one of"),
    (lambda: VLAAttention(16, 2, lam0=0.0, rngs=nnx.Rngs(0)), "lam0"),
    (lambda: VLAAttention(16, 2, lam0="1", rngs=nnx.Rngs(0)),
     "lam0 must be a real number .* got str '1'"),
    (lambda: VLAAttention(16, 2, lam0=1e-4, rngs=nnx.Rngs(0)),
     r"lam0=0.0001 is below 0.001, the smallest impl='auto' takes in float32"),
    # float64 activations without x64 compute in float32: float32's smallest lam0 applies
    (lambda: VLAAttention(16, 2, lam0=1e-4, dtype=jnp.float64, rngs=nnx.Rngs(0)),
     r"lam0=0.0001 is below 0.001, the smallest impl='auto' takes in float32"),
    (lambda: VLAAttention(16, 2, u_init="zeros", rngs=nnx.Rngs(0)), "u_init must be one of"),
    (lambda: VLAAttention(16, 2, qk_map="relu", rngs=nnx.Rngs(0)),
     "qk_map must be one of 'elu1', 'silu_l2'; got 'relu'"),
    (lambda: VLAAttention(16, 2, beta=1, rngs=nnx.Rngs(0)), "beta must be True or False"),
    (lambda: VLAAttention(16, 2, qk_map="silu_l2", readout="additive", rngs=nnx.Rngs(0)),
     "qk_map='silu_l2' .* readout='additive'"),
], ids=["unknown-mixer", "unknown-option", "indivisible", "softmax-width",
        "softmax-indivisible", "readout", "lam0",
        "lam0-str", "lam0-small", "lam0-small-float64-without-x64", "u_init", "qk_map", "beta",
        "silu_l2-additive"])
def test_bad_arguments(call, match):
  with pytest.raises(ValueError, match=match):
    call()


def test_u_init_identity_sets_w_u_only():
  default = VLAAttention(D, H, rngs=nnx.Rngs(0))
  identity = VLAAttention(D, H, u_init="identity", rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(identity.u_proj.kernel[...], np.eye(D))
  assert not np.allclose(default.u_proj.kernel[...], np.eye(D), atol=0.1)
  for name in ("q_proj", "k_proj", "v_proj"):   # the other draws are unchanged
    np.testing.assert_array_equal(getattr(identity, name).kernel[...],
                                  getattr(default, name).kernel[...])



def test_beta_projection_is_drawn_last():
  """With `beta` every other parameter is the layer's without it (W_beta is drawn last; the
  layer on the kernels: test_the_kernel_takes_packing_beta_and_the_delta_readout)."""
  default = nnx.state(VLAAttention(D, H, rngs=nnx.Rngs(0)), nnx.Param)
  with_beta = nnx.state(VLAAttention(D, H, beta=True, rngs=nnx.Rngs(0)), nnx.Param)
  assert set(with_beta) == set(default) | {"beta_proj"}
  chex.assert_trees_all_equal({k: with_beta[k] for k in default}, dict(default))


def test_penalty_scale_defaults_to_1_and_inv_sqrt_dh_is_the_authors():
  """1 is the default (RESULTS.md sections 9 and 5); "inv_sqrt_dh" is the authors'
  1 / sqrt(d_h); None, negative or non-finite numbers and other strings are refused naming the
  option."""
  assert VLAAttention(D, H, rngs=nnx.Rngs(0)).penalty_scale == 1.0
  for head_dim in (None, 5):
    authors = VLAAttention(D, H, head_dim, penalty_scale="inv_sqrt_dh", rngs=nnx.Rngs(0))
    assert authors.penalty_scale == 1.0 / np.sqrt(head_dim or D // H)
  assert make_mixer("vla", D, H, rngs=nnx.Rngs(0)).penalty_scale == 1.0
  assert make_mixer("vla", D, H, options={"penalty_scale": 0}, rngs=nnx.Rngs(0)
                    ).penalty_scale == 0.0
  for bad in (None, -0.5, "inv_sqrt", True, float("nan"), float("inf")):
    with pytest.raises(ValueError,
                       match="penalty_scale must be a finite number >= 0 or 'inv_sqrt_dh'"):
      VLAAttention(D, H, penalty_scale=bad, rngs=nnx.Rngs(0))

def test_registry_covers_all_mixers():
  assert set(MIXERS) == {"vla", "softmax", "linear", "deltanet", "gated_deltanet"}


def test_impl_and_chunk_size_are_checked_when_a_layer_is_built():
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vla_jax.layers import make_mixer  # pylint: disable=import-outside-toplevel
  for mixer, kw, match in (("vla", dict(impl="bogus"), "VLAAttention: impl must be one of"),
                           ("vla", dict(chunk_size=10), "VLAAttention: chunk_size must be"),
                           ("deltanet", dict(impl="pallas"), "DeltaNet: impl='pallas'"),
                           ("linear", dict(chunk_size=512), "chunk_size must be"),
                           ("vla", dict(impl="pallas_interpret", chunk_size=256),
                            "chunk_size=256 is not one of the kernel's")):
    with pytest.raises(ValueError, match=match):
      make_mixer(mixer, 32, 2, rngs=nnx.Rngs(0), **kw)


# A mixer's forward pass, jitted: one program a configuration, rather than one eager dispatch
# (and one small compilation) per operation.
_forward = nnx.jit(lambda m, x, **kw: m(x, **kw))


def test_impl_defaults_to_auto_which_runs_chunked_here():
  """Every recurrent mixer defaults to impl "auto"; on this CPU it runs "chunked" (the same
  outputs; VLA packed too). What "auto" runs where is `resolve_impl`'s (tests/ops/test_impl.py)."""
  x = _x(length=20)
  ids = jnp.repeat(jnp.array([[0, 1]]), 10, axis=1).repeat(B, axis=0)
  for name in ("vla", "linear", "deltanet", "gated_deltanet"):
    auto = make_mixer(name, D, H, chunk_size=16, rngs=nnx.Rngs(0))
    assert auto.impl == "auto" and type(auto)(D, H, rngs=nnx.Rngs(0)).impl == "auto"
    if name == "vla":
      chunked = make_mixer(name, D, H, impl="chunked", chunk_size=16, rngs=nnx.Rngs(0))
      for kw in ({}, dict(segment_ids=ids)):
        np.testing.assert_array_equal(_forward(auto, x, **kw), _forward(chunked, x, **kw))


@pytest.mark.parametrize("kw, match", [
    (dict(impl="pallas"), "backend is 'cpu'.*impl='pallas_interpret'"),
    (dict(impl="pallas_interpret", head_dim=24), r"head_dim \(keys\)=24"),
    (dict(impl="pallas_interpret", chunk_size=256), "chunk_size=256"),
    (dict(impl="pallas_interpret", dtype=jnp.float16), "dtype=float16"),
])
def test_a_kernel_impl_the_kernel_cannot_run_fails_at_construction(kw, match):
  kw = {"chunk_size": 16, "head_dim": 16, **kw}
  with pytest.raises(ValueError, match=f"^VLAAttention: impl='{kw['impl']}' cannot run here: "
                                       f".*{match}"):
    make_mixer("vla", 32, 2, rngs=nnx.Rngs(0), **kw)


def test_the_kernel_takes_packing_beta_and_the_delta_readout():
  """VLA on the kernels (interpret mode) with packed rows, a learned write strength and the
  delta readout (value width d_h + 1) equals the chunked form (the additive readout packed:
  tests/ops/test_packed_ops.py; the layer on the kernels without segment_ids:
  tests/lab/test_grid.py; the op with the value width d_h + 1 or beta, forward and gradients:
  tests/kernels/test_vla_pallas.py)."""
  kw = dict(chunk_size=16, options={"readout": "delta", "beta": True})
  kernel = make_mixer("vla", 32, 2, impl="pallas_interpret", rngs=nnx.Rngs(0), **kw)
  chunked = make_mixer("vla", 32, 2, impl="chunked", rngs=nnx.Rngs(0), **kw)
  x = jax.random.normal(jax.random.key(3), (1, 24, 32))
  ids = jnp.array([[0] * 5 + [1] * 12 + [2] * 7])
  np.testing.assert_allclose(_forward(kernel, x, segment_ids=ids),
                             _forward(chunked, x, segment_ids=ids), rtol=0, atol=2e-5)


# A_log and dt_bias (float32 bits) of GatedDeltaNet(64, 4, rngs=nnx.Rngs(0)) as the layer drew
# them before gate_init existed: gate_init="fla" must keep them.
_FLA_A_LOG_BITS = [1074536798, 1072994095, 1068244538, 1070182296]
_FLA_DT_BIAS_BITS = [3231614143, 3232368714, 3223706977, 3233618052]


def _gate(layer):
  """(a, dt) at initialisation: exp(A_log) and softplus(dt_bias), float64."""
  a = np.exp(np.asarray(layer.A_log[...], np.float64))
  return a, np.log1p(np.exp(np.asarray(layer.dt_bias[...], np.float64)))


_FLA_BITS = """
import json
import numpy as np
from flax import nnx
from vla_jax.layers import GatedDeltaNet
fla = GatedDeltaNet(64, 4, gate_init="fla", rngs=nnx.Rngs(0))
print(json.dumps([np.asarray(p[...]).view(np.uint32).tolist() for p in (fla.A_log, fla.dt_bias)]))
"""


def test_gated_deltanet_fla_gate_init_is_the_paper_code_bit_for_bit():
  default = GatedDeltaNet(64, 4, rngs=nnx.Rngs(0))
  fla = GatedDeltaNet(64, 4, gate_init="fla", rngs=nnx.Rngs(0))
  assert fla.gate_init == default.gate_init == "fla"
  chex.assert_trees_all_equal(nnx.state(fla), nnx.state(default))
  # The bits as drawn at LLVM's level 1 (its exp and log round as when they were recorded;
  # the tests' level 0 differs in a last bit): in a process of its own at that level.
  env = subprocess_env()
  env["XLA_FLAGS"] += " --xla_backend_optimization_level=1"   # the last one counts
  proc = subprocess.run([sys.executable, "-c", _FLA_BITS], env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == [_FLA_A_LOG_BITS,
                                                              _FLA_DT_BIAS_BITS]


@pytest.mark.parametrize("gate_init,dt_range,decay_range", [
    ("fla", (1e-3, 1e-1), (np.exp(-1.6), np.exp(-1e-3))),
    ("slow", (1e-4, 1e-2), (np.exp(-0.16), np.exp(-1e-4)))])
def test_gated_deltanet_gate_init_decay_range(gate_init, dt_range, decay_range):
  """At W_a x = 0 the per-token decay is exp(-a dt), a in [1, 16], dt in the init's range;
  over many heads the draws fill most of it. "slow" draws the same a, and dt 10x smaller."""
  H = 4096
  layer = GatedDeltaNet(64, H, head_dim=1, gate_init=gate_init, rngs=nnx.Rngs(0))
  a, dt = _gate(layer)
  lo, hi = dt_range
  assert a.min() >= 1 - 1e-6 and a.max() <= 16 * (1 + 1e-6)
  assert dt.min() >= lo * (1 - 1e-4) and dt.max() <= hi * (1 + 1e-4)
  assert dt.min() < lo * 1.05 and dt.max() > hi / 1.05     # log-uniform: both ends reached
  np.testing.assert_allclose(np.median(np.log(dt)), np.log(np.sqrt(lo * hi)), atol=0.1)
  decay = np.exp(-a * dt)
  assert decay_range[0] <= decay.min() < decay_range[0] * 1.3
  assert decay_range[1] >= decay.max() > 1 - (1 - decay_range[1]) * 1.3
  fla_a, fla_dt = _gate(GatedDeltaNet(64, H, head_dim=1, rngs=nnx.Rngs(0)))
  np.testing.assert_array_equal(a, fla_a)
  np.testing.assert_allclose(dt, fla_dt * (lo / 1e-3), rtol=1e-4)


def test_gated_deltanet_defaults_are_the_paper_codes_and_deltanet_keeps_its_own():
  """Gated DeltaNet: fla's output gate (gated RMSNorm in place of the merged LayerNorm) and
  values twice the key width; DeltaNet: neither. The options are checked, naming them."""
  gdn, dn = (make_mixer(n, 32, 2, rngs=nnx.Rngs(0)) for n in ("gated_deltanet", "deltanet"))
  assert (gdn.output_gate, gdn.expand_v, gdn.value_head_dim) == (True, 2, 32)
  assert gdn.out.norm is None and gdn.o_norm.weight[...].shape == (32,)
  assert gdn.v_proj.kernel[...].shape == (32, 64) and gdn.g_proj.kernel[...].shape == (32, 64)
  assert gdn.out.proj.kernel[...].shape == (64, 32)
  assert (dn.output_gate, dn.expand_v, dn.value_head_dim) == (False, 1, 16)
  assert dn.out.norm is not None and not hasattr(dn, "g_proj")
  for bad, match in (({"expand_v": 0}, "expand_v must be an int >= 1; got 0"),
                     ({"expand_v": 1.5}, "expand_v must be an int >= 1; got 1.5"),
                     ({"output_gate": "yes"}, "output_gate must be True or False")):
    with pytest.raises(ValueError, match=f"GatedDeltaNet: {match}"):
      make_mixer("gated_deltanet", 32, 2, options=bad, rngs=nnx.Rngs(0))


def test_gated_deltanet_kernel_takes_the_wider_values():
  """Values of twice the key width run on the kernels (interpret mode) as on "chunked"; a
  value width the kernels do not take is refused at construction, naming it."""
  kw = dict(chunk_size=16, head_dim=16)
  kernel, chunked = (make_mixer("gated_deltanet", 32, 2, impl=impl, rngs=nnx.Rngs(0), **kw)
                     for impl in ("pallas_interpret", "chunked"))
  x = jax.random.normal(jax.random.key(3), (1, 24, 32))
  f = nnx.jit(lambda m, x: m(x))
  np.testing.assert_allclose(f(kernel, x), f(chunked, x), rtol=0, atol=2e-5)
  with pytest.raises(ValueError, match=r"head_dim \(values\)=48 is not one of the kernel's"):
    make_mixer("gated_deltanet", 32, 2, impl="pallas_interpret", options={"expand_v": 3},
               rngs=nnx.Rngs(0), **kw)


def test_gated_deltanet_gate_init_is_checked():
  with pytest.raises(ValueError, match="gate_init must be one of 'fla', 'slow'"):
    GatedDeltaNet(16, 2, gate_init="fast", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="does not take option"):
    make_mixer("deltanet", 16, 2, options={"gate_init": "slow"}, rngs=nnx.Rngs(0))
  layer = make_mixer("gated_deltanet", 16, 2, options={"gate_init": "slow"}, rngs=nnx.Rngs(0))
  assert layer.gate_init == "slow" and _gate(layer)[1].max() <= 1e-2 * (1 + 1e-4)


@pytest.mark.parametrize("call,match", [
    (lambda: VLAAttention(32, 2, penalty_scale=float("inf"), rngs=nnx.Rngs(0)),
     "VLAAttention: penalty_scale must be a finite number >= 0 or 'inv_sqrt_dh'.* got inf"),
    (lambda: SoftmaxAttention(32, 2, positions="rope", rope_base=float("inf"),
                              rngs=nnx.Rngs(0)),
     "SoftmaxAttention: rope_base must be a finite number > 1; got inf"),
], ids=["penalty_scale", "rope_base"])
def test_float_options_must_be_finite(call, match):
  """Every float option of the layers refuses inf at construction, naming the option (inf
  passed `>= 0` and gave NaN outputs, or a meaningless rotation)."""
  with pytest.raises(ValueError, match=match):
    call()


@pytest.mark.parametrize("name,option", [
    ("linear", "normalize"), ("vla", "out_norm"), ("linear", "out_norm"),
    ("deltanet", "out_norm"), ("gated_deltanet", "out_norm"), ("vla", "beta"),
    ("deltanet", "output_gate")])
def test_bool_options_must_be_bools(name, option):
  """A bool option takes True or False only: a string such as "no" (which bool() makes True)
  is refused at construction, naming the layer and the option."""
  with pytest.raises(ValueError, match=f"{MIXERS[name].__name__}: {option} must be True or "
                                       "False; got str 'no'"):
    make_mixer(name, 32, 2, options={option: "no"}, rngs=nnx.Rngs(0))
  make_mixer(name, 32, 2, options={option: np.bool_(False)}, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("bad,match", [
    (-1.0, "a finite number > 0; got -1.0"), (0.0, "a finite number > 0; got 0.0"),
    (float("inf"), "a finite number > 0; got inf"), ("a", "a real number .* > 0; got str 'a'")],
    ids=["negative", "zero", "inf", "str"])
def test_readout_eps_must_be_a_finite_positive_number(bad, match):
  with pytest.raises(ValueError, match=f"VLAAttention: readout_eps must be {match}"):
    VLAAttention(32, 2, readout="delta", readout_eps=bad, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_inputs_are_checked_naming_x(name):
  """`__call__` and `prefill` take x [B, T, d_model] of a floating dtype: another rank, width
  or an integer dtype raises naming x and the expected shape (not a concatenate, broadcast or
  dot_general error, nor a silent cast), as `step` does for x_t."""
  mixer = make_mixer(name, 16, 2, rngs=nnx.Rngs(0))
  cache = mixer.init_cache(2, 8)
  for call in (mixer, lambda x: mixer.prefill(x, cache)):
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, d_model=16\] \(a "
                                         r"sequence; .*\); got \(2, 16\)"):
      call(jnp.zeros((2, 16)))
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, d_model=16\]; got "
                                         r"\(2, 3, 8\)"):
      call(jnp.zeros((2, 3, 8)))
    with pytest.raises(TypeError, match="x must have a floating dtype .*; got int32"):
      call(jnp.zeros((2, 3, 16), jnp.int32))
  with pytest.raises(TypeError, match="x_t must have a floating dtype .*; got int32"):
    mixer.step(jnp.zeros((2, 16), jnp.int32), cache)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_dtypes_must_be_floating(name):
  """A non-float dtype or param_dtype is refused at construction, naming it (it built, then
  failed inside flax with "Dtype must be inexact")."""
  for arg in ("dtype", "param_dtype"):
    for bad, shown in ((jnp.int32, "int32"), ("bogus", "'bogus'")):
      with pytest.raises(TypeError, match=f"{MIXERS[name].__name__}: {arg} must be a floating "
                                          f"dtype .*; got {shown}$"):
        make_mixer(name, 16, 2, rngs=nnx.Rngs(0), **{arg: bad})
