"""Tests of the chunk-prep kernel path of `vla_pallas` (KernelConfig.prep="kernel") on CPU.

The kernel (`vla_jax.kernels.chunk_prep`) runs in Pallas interpret mode against the float64
NumPy oracle of tests/test_kernels.py; gradients (which run the XLA path's backward) against
impl="chunked" in float64; and the same code is lowered for an abstract NVIDIA H200 (Triton).
"""


import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_kernels import TOL, _inputs, _oracle, _rel, shape_id
from vla_jax.kernels.lowering import lower_for_h200
from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.ops.vla import VLAState, vla_recurrence

# (B, T, H, dk, dv, chunk): T not a multiple of the chunk, dk != dv, several tiles per matrix.
SHAPES = [(2, 37, 2, 16, 32, 16), (1, 50, 2, 32, 16, 16), (1, 70, 1, 32, 32, 32)]


def _config(C, **kw):
  return KernelConfig(chunk_size=C, block_v=16, precision=jax.lax.Precision.HIGHEST,
                      **{"prep": "kernel", **kw})


def _run(cfg, *args):
  return jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=True))(*args)


@pytest.mark.parametrize("shape,form", [(s, "panels") for s in SHAPES] + [(SHAPES[2], "tiles")],
                         ids=lambda x: shape_id(x) if isinstance(x, tuple) else x)
def test_forward_matches_oracle_float64(x64, shape, form):
  B, T, H, dk, dv, C = shape
  args = _inputs(10, B, T, H, dk, dv)
  o, S, A = _run(_config(C, prep_form=form), *(jnp.asarray(x) for x in args))
  chex.assert_shape(o, (B, T, H, dv))
  for name, got, want in zip("oSA", (o, S, A), _oracle(*args)):
    assert _rel(got, want) < TOL[np.float64], (name, _rel(got, want))


@pytest.mark.parametrize("refine,form", [(True, "panels"), (False, "panels"), (True, "tiles")])
def test_forward_float32(refine, form):
  B, T, H, dk, dv, C = SHAPES[1]
  args = _inputs(11, B, T, H, dk, dv)
  o, S, A = _run(_config(C, refine=refine, prep_form=form),
                 *(jnp.asarray(x, jnp.float32) for x in args))
  chex.assert_type([o, S, A], jnp.float32)
  for name, got, want in zip("oSA", (o, S, A), _oracle(*args)):
    assert _rel(got, want) < TOL[np.float32], (name, _rel(got, want))


def test_matches_xla_prep_bfloat16():
  """bf16 inputs: the kernel and the XLA prep compute the same function (f32 accumulation)."""
  B, T, H, dk, dv, C = SHAPES[0]
  args = _inputs(12, B, T, H, dk, dv)
  xs = [jnp.asarray(x, jnp.bfloat16) for x in args[:4]]
  xs += [jnp.asarray(x, jnp.float32) for x in args[4:]]
  got = _run(_config(C), *xs)
  want = _run(_config(C, prep="xla"), *xs)
  chex.assert_type(got[0], jnp.bfloat16)
  for name, g, w in zip("oSA", got, want):
    assert _rel(g, w) < (1e-2 if name == "o" else 1e-5), (name, _rel(g, w))


def test_doubling_solver_float64(x64):
  """prep="xla" with solver="doubling" (block-doubling triangular inverses from products):
  forward against the oracle, gradients against the default solver."""
  B, T, H, dk, dv, C = SHAPES[0]
  args = [jnp.asarray(x) for x in _inputs(15, B, T, H, dk, dv)]
  cfg = _config(C, prep="xla", solver="doubling")
  got = _run(cfg, *args)
  for name, g, w in zip("oSA", got, _oracle(*(np.asarray(x) for x in args))):
    assert _rel(g, w) < TOL[np.float64], (name, _rel(g, w))
  loss = lambda c: lambda *a: sum(jnp.sum(jnp.sin(x)) for x in vla_pallas(
      *a, config=c, interpret=True))
  got = jax.jit(jax.grad(loss(cfg), argnums=range(5)))(*args)
  want = jax.jit(jax.grad(loss(_config(C, prep="xla")), argnums=range(5)))(*args)
  for name, g, w in zip(("q", "k", "v", "u", "S0"), got, want):
    assert _rel(g, w) < 1e-9, (name, _rel(g, w))


def test_gradients_match_chunked_float64(x64):
  B, T, H, dk, dv, C = SHAPES[1]
  q, k, v, u, S0, A0 = (jnp.asarray(x) for x in _inputs(13, B, T, H, dk, dv))
  rng = np.random.default_rng(14)
  wo, wS, wA = (jnp.asarray(rng.standard_normal(s)) for s in
                ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)))

  def loss_kernel(q, k, v, u, S0, A0):
    o, S, A = vla_pallas(q, k, v, u, S0, A0, config=_config(C), interpret=True)
    return jnp.sum(wo * o) + jnp.sum(wS * S) + jnp.sum(wA * A)

  def loss_chunked(q, k, v, u, S0, A0):
    o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl="chunked",
                           chunk_size=C)
    return jnp.sum(wo * o) + jnp.sum(wS * st.S) + jnp.sum(wA * st.A)

  got = jax.jit(jax.grad(loss_kernel, argnums=range(6)))(q, k, v, u, S0, A0)
  want = jax.jit(jax.grad(loss_chunked, argnums=range(6)))(q, k, v, u, S0, A0)
  sym = lambda x: 0.5 * (x + jnp.swapaxes(x, -1, -2))  # vla_pallas symmetrises A0
  for name, g, w in zip(("q", "k", "v", "u", "S0", "A0"), got, want):
    if name == "A0":
      g, w = sym(g), sym(w)
    assert _rel(g, w) < 1e-9, (name, _rel(g, w))


def test_bad_prep_options_raise():
  x = jnp.zeros((1, 16, 1, 16))
  for kw, match in (({"prep": "fused"}, "prep"), ({"prep_dot": "fp8"}, "prep_dot"),
                    ({"prep_warps": 3}, "prep_warps"), ({"prep_form": "rows"}, "prep_form")):
    with pytest.raises(ValueError, match=match):
      vla_pallas(x, x, x, x, jnp.zeros((1, 1, 16, 16)), jnp.eye(16)[None, None],
                 config=KernelConfig(chunk_size=16, **kw))


def _lower(shape, dtype, prep_dot, grad, form="panels", prep="kernel", **kw):
  """The lowered text for an abstract H200. The state path's forward is pinned to the fused
  loop (`vla_state_fwd`) unless `state_output` is given: "auto" splits it at these few
  programs, which tests/test_state_output.py covers."""
  B, T, H, dk, dv, C = shape
  kw.setdefault("state_output", "fused")
  cfg = KernelConfig(chunk_size=C, prep=prep, prep_dot=prep_dot, prep_form=form, **kw)
  fwd = lambda *a: vla_pallas(*a, config=cfg, interpret=False)
  fn = jax.grad(lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in fwd(*a)),
                argnums=range(4)) if grad else fwd
  spec = lambda *s: jax.ShapeDtypeStruct(s, dtype)
  args = (spec(B, T, H, dk), spec(B, T, H, dk), spec(B, T, H, dv), spec(B, T, H, dk),
          jax.ShapeDtypeStruct((B, H, dv, dk), jnp.float32),
          jax.ShapeDtypeStruct((B, H, dk, dk), jnp.float32))
  return lower_for_h200(fn, *args).as_text()


class TestGpuLowering:
  """Lowers the kernel path for an abstract H200 (no GPU needed): Triton IR is built."""

  @pytest.mark.parametrize("shape,prep_dot,form", [
      ((1, 100, 2, 64, 64, 64), "tf32x3", "panels"), ((1, 100, 2, 64, 64, 64), "ieee", "panels"),
      ((1, 64, 1, 128, 64, 64), "tf32x3", "panels"), ((2, 40, 1, 32, 128, 32), "tf32x3", "panels"),
      ((1, 128, 1, 128, 128, 128), "tf32x3", "panels"),
      ((1, 100, 2, 64, 64, 64), "tf32x3", "tiles")],
      ids=lambda x: shape_id(x) if isinstance(x, tuple) else x)
  def test_forward_lowers_for_h200(self, shape, prep_dot, form):
    text = _lower(shape, jnp.bfloat16, prep_dot, grad=False, form=form)
    assert text.count("__gpu$xla.gpu.triton") == 2
    assert "vla_chunk_prep" in text and "vla_state_fwd" in text

  def test_gradient_lowers_for_h200(self):
    """Under differentiation the XLA prep runs (the kernel is not in the graph)."""
    text = _lower((1, 100, 2, 64, 64, 64), jnp.float32, "tf32x3", grad=True)
    assert "vla_state_fwd" in text and "vla_state_bwd" in text
    assert "vla_chunk_prep" not in text
