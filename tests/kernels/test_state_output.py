"""KernelConfig(state_output="split") and (state_bwd="split"): the state path's forward as a
sequential state-chain kernel plus a parallel output kernel, and its reverse pass as a parallel
per-chunk-term kernel plus the reverse chain. Same function as the fused loops (interpret mode,
float64, forward and gradients), and they lower for an abstract NVIDIA H200."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_chunk_prep import _lower
from test_kernels import TOL, _assert_grads_match_scan, _config, _inputs, _oracle, _rel
from vla_jax.kernels import KernelConfig, vla_pallas


@pytest.mark.parametrize("B,T,H,dk,dv,C", [(2, 37, 2, 16, 32, 16), (1, 100, 1, 32, 16, 32)])
def test_split_forward_matches_oracle_and_fused_float64(x64, B, T, H, dk, dv, C):
  """T not a multiple of C (zero-key padding); dv = 32 with block_v 16: two value blocks in
  the chain kernel, whole rows in the output kernel."""
  args = _inputs(40 + T, B, T, H, dk, dv)
  run = lambda out: jax.jit(lambda *a: vla_pallas(
      *a, config=_config(C, state_output=out), interpret=True))(*map(jnp.asarray, args))
  split, fused = run("split"), run("fused")
  for name, g, w, f in zip("oSA", split, _oracle(*args), fused):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))
    np.testing.assert_allclose(g, f, rtol=1e-12, atol=1e-13)


def test_split_lowers_for_h200():
  cfg = dict(state_output="split")
  shape = (1, 100, 2, 64, 64, 64)
  text = _lower(shape, jnp.bfloat16, "auto", grad=False, prep="scan", **cfg)
  # State prep, penalty scan, state chain, outputs; the segment-start inverses and A0's
  # (segment_inverse="auto" is "kernel" at d = 64) with their Grams (segment_gram="kernel").
  assert text.count("__gpu$xla.gpu.triton") == 7
  assert "vla_state_chain" in text and "vla_state_out" in text and "vla_state_fwd" not in text
  assert "vla_spd_inverse" in text
  text = _lower(shape, jnp.bfloat16, "auto", grad=True, prep="scan", **cfg)
  assert "vla_state_chain" in text and "vla_state_bwd" in text


def test_bad_state_output_raises():
  with pytest.raises(ValueError, match="state_output"):
    KernelConfig(state_output="fast").validate(64, 64)
  with pytest.raises(ValueError, match="state_bwd"):
    KernelConfig(state_bwd="fast").validate(64, 64)
  with pytest.raises(ValueError, match="state_local_vjp"):
    KernelConfig(state_local_vjp="fast").validate(64, 64)
  with pytest.raises(ValueError, match="grad_prep"):
    KernelConfig(grad_prep="fast").validate(64, 64)


def test_split_backward_gradients_match_scan_float64(x64):
  """KernelConfig(state_bwd="split"): per-chunk terms in a parallel kernel, then the reverse
  chain alone; gradients equal impl="scan"'s."""
  _assert_grads_match_scan(_config(16, state_bwd="split"), 40, seed=42, dv=32)


def test_split_backward_lowers_for_h200():
  text = _lower((1, 100, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=True, prep="scan",
                state_bwd="split")
  assert "vla_state_bwd_terms" in text and "vla_state_bwd_chain" in text
  assert 'vla_state_bwd"' not in text


@pytest.mark.parametrize("option,value,extra", [
    ("state_local_vjp", "kernel", {}),
    ("grad_prep", "kernel", {}),
    ("state_local_vjp", "products", {}),                         # the forward's T reused
    ("state_local_vjp", "products", {"grad_prep": "kernel"}),    # T from the kernel
    ("state_local_vjp", "fused", {}),                            # products' VJP, one kernel
    ("state_local_vjp", "fused", {"grad_prep": "kernel"}),
])
def test_kernel_options_match_xla_float64(x64, option, value, extra):
  """KernelConfig(state_local_vjp="kernel"): the chunk-local cotangents written out in one
  kernel; KernelConfig(grad_prep="kernel"): the chunk factors of the differentiated state path
  from the state-prep kernel. Gradients of state_path alone (all of q, e, w, v, S0) equal the
  XLA path's (vla_pallas's gradients with every option on: the last test).
  KernelConfig(state_local_vjp="products"): the same written-out VJP as batched XLA products."""
  from vla_jax.kernels import state_path
  rng = np.random.default_rng(44)
  BH, T, dk, dv = 3, 48, 16, 32
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q, e, w = (rng.standard_normal((BH, T, dk)) for _ in range(3))
  e, w = unit(e), unit(w)
  v, S0 = rng.standard_normal((BH, T, dv)), rng.standard_normal((BH, dv, dk)) / 4
  cot_o, cot_S = rng.standard_normal((BH, T, dv)), rng.standard_normal((BH, dv, dk))
  args = [jnp.asarray(x) for x in (q, e, w, v, S0)]

  def grads(value, **kw):
    cfg = _config(16, interpret=True, **{option: value}, **kw)
    loss = lambda *a: (lambda o, S: jnp.sum(o * cot_o) + jnp.sum(S * cot_S))(
        *state_path(*a, config=cfg))
    return jax.jit(jax.grad(loss, argnums=range(5)))(*args)

  want = grads("xla")   # the default: autodiff of the chunk map (and XLA factors)
  for name, g, x in zip(("q", "e", "w", "v", "S0"), grads(value, **extra), want):
    assert _rel(g, x) < 1e-12, (name, _rel(g, x))


def test_all_state_kernel_options_together_float64(x64):
  """Every state-path option on (split forward and reverse pass, local-VJP kernel, kernel
  factors under differentiation): vla_pallas's gradients equal impl="scan"'s. T = 75 at
  C = 32: 3 chunks, the last partly padding."""
  cfg = _config(32, state_output="split", state_bwd="split", state_local_vjp="kernel",
                grad_prep="kernel")
  _assert_grads_match_scan(cfg, 75, seed=46, dv=32)


def test_written_out_backward_options_match_scan_float64(x64):
  """state_local_vjp="products" with T from the state-prep kernel (grad_prep="kernel") and
  segment_grad="products", through vla_pallas: gradients equal impl="scan"'s; 3 chunks at
  C = 32, the last partly padding, one chunk per segment."""
  cfg = _config(32, state_local_vjp="products", grad_prep="kernel", segment_grad="products",
                segment_chunks=1)
  _assert_grads_match_scan(cfg, 75, seed=47, dv=32)


def test_written_out_backward_options_lower_for_h200():
  text = _lower((1, 200, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=True, prep="scan",
                state_local_vjp="products", grad_prep="kernel", segment_grad="products",
                segment_chunks=2)
  assert "vla_state_prep" in text and "vla_state_bwd" in text and "vla_penalty_scan" in text


def test_fused_local_vjp_bf16_equals_products():
  """state_local_vjp="fused" with local_vjp_dot="bf16": the kernel rounds the same operands to
  bfloat16 as the XLA products do, so float32 gradients of the two agree far inside the
  bfloat16 bound (only the sums' order differs)."""
  B, T, H, dk, dv, C = 1, 70, 2, 32, 32, 16
  args = [jnp.asarray(x, jnp.float32) for x in _inputs(48, B, T, H, dk, dv)]

  def grads(local):
    cfg = KernelConfig(chunk_size=C, prep="scan", state_local_vjp=local, local_vjp_dot="bf16",
                       interpret=True)
    loss = lambda *a: jnp.sum(vla_pallas(*a, config=cfg)[0])
    return jax.jit(jax.grad(loss, argnums=range(4)))(*args)

  for name, g, w in zip("qkvu", grads("fused"), grads("products")):
    assert _rel(g, w) < 1e-3, (name, _rel(g, w))


def test_fused_local_vjp_lowers_for_h200():
  """bf16 inputs (local_vjp_dot resolves to "bf16"): the gradient lowers with the fused
  local-VJP kernel and no separate recomputing one."""
  text = _lower((1, 100, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=True, prep="scan",
                state_local_vjp="fused", grad_prep="kernel")
  assert 'name = "vla_state_fused_vjp"' in text and "vla_state_local_vjp" not in text
  text = _lower((1, 128, 1, 128, 128, 64), jnp.bfloat16, "auto", grad=True, prep="scan",
                state_local_vjp="fused")
  assert 'name = "vla_state_fused_vjp"' in text           # d = 128 too (it fits, with spills)
  with pytest.raises(ValueError, match="up to 64"):
    KernelConfig(state_local_vjp="kernel").validate(128, 128)
  KernelConfig(state_local_vjp="fused", local_vjp_dot="bf16").validate(128, 128)


def test_local_vjp_auto_avoids_the_fused_program_with_float32_operands_at_d128():
  """state_local_vjp="auto": "fused" for bfloat16 inputs at any head dim and for float32
  inputs up to d = 64; "products" for float32 inputs at d = 128 (the fused program with float32
  operands needs 352 KB of shared memory there, above an H200 SM's 227 KB: the GPU refuses it
  at launch). An explicit "fused" there raises; the float32 d = 128 gradient lowers without
  the fused kernel."""
  x = lambda d, dtype: jnp.zeros((1, 16, 1, d), dtype)
  form = lambda cfg, d, dtype: cfg.for_inputs(*[x(d, dtype)] * 4).local_vjp_form
  assert KernelConfig().local_vjp_form == "fused"
  assert form(KernelConfig(), 128, jnp.bfloat16) == "fused"
  assert form(KernelConfig(), 64, jnp.float32) == "fused"
  assert form(KernelConfig(), 128, jnp.float32) == "products"
  assert form(KernelConfig(local_vjp_dot="bf16"), 128, jnp.float32) == "fused"
  assert form(KernelConfig(state_local_vjp="xla"), 128, jnp.float32) == "xla"
  with pytest.raises(ValueError, match="352 KB"):
    KernelConfig(state_local_vjp="fused").for_inputs(*[x(128, jnp.float32)] * 4)
  text = _lower((1, 128, 1, 128, 128, 64), jnp.float32, "auto", grad=True, prep="scan")
  assert "vla_state_fused_vjp" not in text and "vla_penalty_scan" in text


def test_fused_local_vjp_writes_final_dtypes():
  """chunk_local_vjp(dq_dtype=, dv_dtype=): dq and dv written in bfloat16 by the kernel are the
  float32 results rounded once (bit-identical to casting afterwards), token-major with heads;
  de and dw stay float32. The state path asks for the caller's q and v dtypes."""
  from vla_jax.kernels.state_grad import chunk_local_vjp
  B, H, N, C, dk, dv = 1, 2, 2, 16, 16, 16
  rng = np.random.default_rng(61)
  f32 = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  q, v, dO = (f32(B, N * C, H, d).astype(jnp.bfloat16) for d in (dk, dv, dv))
  e, w = f32(B * H, N * C, dk), f32(B * H, N * C, dk) / 4
  S_c, dS_next = f32(B * H, N, dv, dk), f32(B * H, N, dv, dk)
  r, c = np.arange(C)[:, None], np.arange(C)[None, :]
  P = jnp.where(jnp.asarray(r >= c)[None, None], f32(B * H, N, C, C), 0.0).reshape(B * H, N * C, C)
  Tinv = jnp.broadcast_to(jnp.eye(C, dtype=jnp.float32), (B * H, N, C, C))
  run = lambda **kw: chunk_local_vjp(q, e, w, v, dO, S_c, dS_next, chunk_size=C,
                                     precision=jax.lax.Precision.HIGHEST, interpret=True, P=P,
                                     Tinv=Tinv, heads=H, **kw)
  wide, low = run(), run(dq_dtype=jnp.bfloat16, dv_dtype=jnp.bfloat16)
  chex.assert_shape([wide[0], low[0]], (B, N * C, H, dk))
  chex.assert_type([low[0], low[3], low[1], low[2]],
                   [jnp.bfloat16, jnp.bfloat16, jnp.float32, jnp.float32])
  for i in (0, 3):
    np.testing.assert_array_equal(np.asarray(low[i], np.float32),
                                  np.asarray(wide[i].astype(jnp.bfloat16), np.float32))
  for i in (1, 2):
    np.testing.assert_array_equal(low[i], wide[i])
  text = _lower((1, 100, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=True, prep="scan")
  line = next(l for l in text.splitlines() if 'name = "vla_state_fused_vjp"' in l)
  assert "tensor<1x128x2x64xbf16>" in line.split("->")[-1], line.split("->")[-1]


def test_kernel_options_lower_for_h200():
  text = _lower((1, 100, 2, 64, 64, 64), jnp.bfloat16, "auto", grad=True, prep="scan",
                state_local_vjp="kernel", grad_prep="kernel")
  assert "vla_state_local_vjp" in text and "vla_state_bwd" in text
  assert "vla_state_prep" in text   # the differentiated forward's factors from the kernel


def test_local_vjp_kernel_rejects_head_dim_128():
  with pytest.raises(ValueError, match="state_local_vjp"):
    KernelConfig(state_local_vjp="kernel").validate(128, 64)


def test_auto_backward_splits_up_to_512_programs():
  """At 256 programs of the sequential loops (B * H = 128, dv = 64, value blocks of 32) the
  default "auto" forms keep the fused forward (SPLIT_OUTPUT_BELOW = 132) and split the
  reverse pass (SPLIT_BWD_UP_TO = 512): terms + reverse chain."""
  shape = (8, 64, 16, 64, 64, 64)
  text = _lower(shape, jnp.bfloat16, "auto", grad=True, prep="scan", state_output="auto")
  for name in ("vla_state_fwd", "vla_state_bwd_terms", "vla_state_bwd_chain"):
    assert f'name = "{name}"' in text, name
  assert "vla_state_chain" not in text and 'name = "vla_state_bwd"' not in text


def test_auto_forms_split_at_head_dim_128():
  """d = 128 with 512 programs in each sequential loop (B * H = 128, value blocks of 32): the
  "auto" forms split both the forward (chain + outputs) and the reverse pass, whatever the
  programs (SPLIT_OUTPUT_FROM_DK, SPLIT_BWD_FROM_DK)."""
  shape = (8, 128, 16, 128, 128, 64)
  text = _lower(shape, jnp.bfloat16, "auto", grad=True, prep="scan", state_output="auto")
  for name in ("vla_state_chain", "vla_state_out", "vla_state_bwd_terms", "vla_state_bwd_chain"):
    assert f'name = "{name}"' in text, name
  assert 'name = "vla_state_fwd"' not in text and 'name = "vla_state_bwd"' not in text


@pytest.mark.parametrize("form", ["fused", "split"])
def test_reverse_pass_and_state_prep_write_bf16_residuals(form):
  """With local_vjp_dot="bf16" the residuals that only feed its bfloat16 products come out of
  the kernels in bfloat16: the reverse pass's dS_next (both forms) and the state-prep kernel's
  T. Each equals the float32 output rounded to bfloat16 (interpret mode)."""
  import importlib   # pylint: disable=import-outside-toplevel
  sp = importlib.import_module("vla_jax.kernels.state_path")
  from vla_jax.kernels.split_prep import state_prep   # pylint: disable=import-outside-toplevel
  BH, N, C, d = 2, 3, 16, 16
  rng = np.random.default_rng(7)
  x = lambda *s: jnp.asarray(rng.standard_normal(s) / 4, jnp.float32)
  q, w, Wp, dO, P = x(BH, N * C, d), x(BH, N * C, d), x(BH, N * C, d), x(BH, N * C, d), x(
      BH, N * C, C)
  dS_T = x(BH, d, d)
  cfg = KernelConfig(chunk_size=C, state_bwd=form, interpret=True)
  full, dS0 = sp._backward_pass(cfg, dO, q, w, Wp, P, dS_T)
  low, dS0_low = sp._backward_pass(cfg, dO, q, w, Wp, P, dS_T, jnp.bfloat16)
  assert full.dtype == jnp.float32 and low.dtype == jnp.bfloat16 and dS0_low.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(low), np.asarray(full.astype(jnp.bfloat16)))
  np.testing.assert_array_equal(np.asarray(dS0_low), np.asarray(dS0))
  e = x(BH, N * C, d)
  e = e / jnp.linalg.norm(e, axis=-1, keepdims=True)
  kw = dict(chunk_size=C, precision=jax.lax.Precision.HIGHEST,
            factor_precision=jax.lax.Precision.HIGHEST, interpret=True, with_inverse=True)
  *factors, T = state_prep(e, w, q, dO, **kw)
  *factors_low, T_low = state_prep(e, w, q, dO, inverse_dtype=jnp.bfloat16, **kw)
  assert T.dtype == jnp.float32 and T_low.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(T_low), np.asarray(T.astype(jnp.bfloat16)))
  for a, b in zip(factors_low, factors):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kw", [
    {},                                                          # the defaults (fused VJP)
    {"state_output": "fused", "state_bwd": "fused"},
    {"state_output": "split", "state_bwd": "split", "state_local_vjp": "products"},
    {"state_local_vjp": "xla", "grad_prep": "xla"},
    {"state_local_vjp": "kernel"},
])
def test_token_major_state_path_equals_head_major_float64(x64, kw):
  """state_path(heads=H): q, v and the output cotangent read token-major [B, T, H, d], o, dq
  and dv written so. Output and every gradient equal the head-major call's in float64, for
  the kernel forms and the XLA fallbacks (which copy to head-major themselves)."""
  from vla_jax.kernels import state_path
  rng = np.random.default_rng(48)
  B, H, T, dk, dv = 2, 2, 48, 16, 32
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q, v = rng.standard_normal((B, T, H, dk)), rng.standard_normal((B, T, H, dv))
  e, w = (unit(rng.standard_normal((B * H, T, dk))) for _ in range(2))
  S0 = rng.standard_normal((B * H, dv, dk)) / 4
  cot_o, cot_S = rng.standard_normal((B, T, H, dv)), rng.standard_normal((B * H, dv, dk))
  heads = lambda x: jnp.swapaxes(x, 1, 2).reshape(B * H, T, x.shape[-1])
  cfg = _config(16, interpret=True, **kw)

  def token_major(q, e, w, v, S0):
    o, S = state_path(q, e, w, v, S0, config=cfg, heads=H)
    return jnp.sum(o * cot_o) + jnp.sum(S * cot_S), o

  def head_major(q, e, w, v, S0):
    o, S = state_path(heads(q), e, w, heads(v), S0, config=cfg)
    o = jnp.swapaxes(o.reshape(B, H, T, dv), 1, 2)
    return jnp.sum(o * cot_o) + jnp.sum(S * cot_S), o

  args = [jnp.asarray(x) for x in (q, e, w, v, S0)]
  (got_o, got), (want_o, want) = (
      (f(*args)[1], jax.jit(jax.grad(lambda *a, f=f: f(*a)[0], argnums=range(5)))(*args))
      for f in (token_major, head_major))
  chex.assert_shape(got_o, (B, T, H, dv))
  np.testing.assert_allclose(got_o, want_o, rtol=1e-12, atol=1e-13)
  for name, g, x in zip(("q", "e", "w", "v", "S0"), got, want):
    chex.assert_equal_shape([g, x])
    assert _rel(g, x) < 1e-12, (name, _rel(g, x))
  with pytest.raises(ValueError, match="heads=2"):
    state_path(heads(args[0]), *args[1:3], heads(args[3]), args[4], config=cfg, heads=H)


@pytest.mark.parametrize("layout", ["direct", "transposed"])
def test_grad_layouts_match_scan_float64(x64, layout):
  """KernelConfig(grad_layout=...) through vla_pallas: gradients equal impl="scan"'s;
  T = 75 at C = 32 (the last chunk partly padding, padded token-major for "direct", the
  default)."""
  assert KernelConfig().grad_layout == "direct"
  _assert_grads_match_scan(_config(32, grad_layout=layout), 75, seed=49, dv=32)
  with pytest.raises(ValueError, match="grad_layout"):
    KernelConfig(grad_layout="token").validate(16, 16)


def test_grad_layout_direct_lowers_for_h200():
  """bf16 inputs, d = 64: the gradient with grad_layout="direct" (the default) lowers for an
  H200 with the same kernels as "transposed", and fewer transposes of [B, T, H, d] arrays."""
  shape = (1, 200, 2, 64, 64, 64)
  direct = _lower(shape, jnp.bfloat16, "auto", grad=True, prep="scan")
  default = _lower(shape, jnp.bfloat16, "auto", grad=True, prep="scan",
                   grad_layout="transposed")
  kernels = lambda text: sorted(l.split('name = "')[1].split('"')[0]
                                for l in text.splitlines() if 'name = "vla_' in l)
  assert kernels(direct) == kernels(default)
  transposes = lambda text: text.count("stablehlo.transpose")
  assert transposes(direct) < transposes(default), (transposes(direct), transposes(default))


def test_default_value_block_at_few_programs_float64(x64):
  """block_v=None at B * H = 2, dv = 32: 16-row value blocks (two per sequence, the few-program
  rule of `KernelConfig.value_block`); forward equals the oracle, gradients impl="scan"'s."""
  cfg = KernelConfig(chunk_size=16, precision=jax.lax.Precision.HIGHEST)
  assert cfg.value_block(32, 2) == 16
  args = _inputs(50, 1, 40, 2, 16, 32)
  got = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*map(jnp.asarray, args))
  for name, g, w in zip("oSA", got, _oracle(*args)):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))
  _assert_grads_match_scan(cfg, 40, seed=51, dv=32)
