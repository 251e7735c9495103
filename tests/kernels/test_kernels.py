"""Tests of the Pallas VLA kernels (`vla_jax.kernels`) on CPU.

The kernels run in Pallas interpret mode (`INTERPRET = True`); the same code is lowered for an
abstract NVIDIA H200 (Triton) in `TestGpuLowering`, so code that only works when interpreted
cannot pass. Numbers are checked against an independent float64 NumPy oracle that runs the
recurrence token by token, and gradients against `jax.grad` of impl="scan" in float64.
"""


import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vla_jax.kernels import KernelConfig, state_path, vla_pallas
from vla_jax.kernels.lowering import lower_for_h200
from vla_jax.ops.vla import VLAState, vla_recurrence

# The Pallas Triton backend warns that it is deprecated; nothing else is silenced.
INTERPRET = True
# Relative error bounds (Frobenius norm) by compute dtype.
TOL = {np.float64: 1e-10, np.float32: 2e-5, jnp.bfloat16: 3e-2}
# (B, T, H, dk, dv, chunk): T not a multiple of the chunk, dk != dv, B and H > 1.
SHAPES = [(2, 37, 2, 16, 32, 16), (1, 50, 3, 32, 16, 16), (1, 64, 1, 16, 16, 32)]
shape_id = lambda s: "B{}T{}H{}dk{}dv{}C{}".format(*s)


def _inputs(seed, B, T, H, dk, dv):
  rng = np.random.default_rng(seed)
  q, k = (rng.standard_normal((B, T, H, dk)) for _ in range(2))
  v = rng.standard_normal((B, T, H, dv))
  u = rng.standard_normal((B, T, H, dk)) / np.sqrt(dk)
  S0 = rng.standard_normal((B, H, dv, dk)) / 4
  X = rng.standard_normal((B, H, dk, dk)) / np.sqrt(dk)
  A0 = np.linalg.inv(0.5 * np.eye(dk) + X @ np.swapaxes(X, -1, -2))  # SPD, not diagonal
  return q, k, v, u, S0, A0


def _oracle(q, k, v, u, S0, A0):
  """VLA token by token in float64 NumPy (VLA.md section 1)."""
  B, T, H, _ = q.shape
  o = np.zeros(v.shape)
  S, A = S0.astype(np.float64).copy(), A0.astype(np.float64).copy()
  for b in range(B):
    for h in range(H):
      Sbh, Abh = S[b, h], A[b, h]
      for t in range(T):
        kh = k[b, t, h] / max(np.linalg.norm(k[b, t, h]), 1e-6)
        z = Abh @ u[b, t, h]
        Abh = Abh - np.outer(z, z) / (1.0 + u[b, t, h] @ z)
        w = Abh @ kh
        a = w / max(np.linalg.norm(w), 1e-12)
        Sbh = Sbh + np.outer(v[b, t, h] - Sbh @ kh, a)
        o[b, t, h] = Sbh @ q[b, t, h]
      S[b, h], A[b, h] = Sbh, Abh
  return o, S, A


def _rel(actual, expected):
  actual, expected = (np.asarray(x, np.float64) for x in (actual, expected))
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _sym(x):
  return 0.5 * (x + jnp.swapaxes(x, -1, -2))


def _assert_grads_match_scan(cfg, T, seed, B=1, H=2, dk=16, dv=16, tol=1e-9):
  """Gradients of a weighted sum of vla_pallas's (o, S_T, A_T) (interpret mode) w.r.t. q, k, v,
  u, S0 and the symmetric part of A0 (the gradient over symmetric perturbations) equal
  impl="scan"'s, relative error below `tol` (call under the x64 fixture)."""
  q, k, v, u, S0, A0 = (jnp.asarray(x) for x in _inputs(seed, B, T, H, dk, dv))
  rng = np.random.default_rng(seed + 1)
  wo, wS, wA = (jnp.asarray(rng.standard_normal(s)) for s in
                ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)))

  def pallas(*a):
    o, S, A = vla_pallas(*a, config=cfg, interpret=True)
    return jnp.sum(wo * o) + jnp.sum(wS * S) + jnp.sum(wA * A)

  def scan(q, k, v, u, S0, A0):
    o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl="scan")
    return jnp.sum(wo * o) + jnp.sum(wS * st.S) + jnp.sum(wA * st.A)

  got = jax.jit(jax.grad(pallas, argnums=range(6)))(q, k, v, u, S0, A0)
  want = jax.jit(jax.grad(scan, argnums=range(6)))(q, k, v, u, S0, A0)
  for name, g, w in zip(("q", "k", "v", "u", "S0", "A0"), got, want):
    if name == "A0":
      g, w = _sym(g), _sym(w)
    assert _rel(g, w) < tol, (name, _rel(g, w))


def _lowered_grad_lines(cfg, T, B=1, H=2, dk=64, dv=64):
  """Lines of jax.grad of vla_pallas (bf16 q, k, v, u; all six inputs) lowered for an abstract
  H200."""
  loss = lambda *a: sum(jnp.sum(x.astype(jnp.float32))
                        for x in vla_pallas(*a, config=cfg, interpret=False))
  spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)
  args = (spec(B, T, H, dk), spec(B, T, H, dk), spec(B, T, H, dv), spec(B, T, H, dk),
          jax.ShapeDtypeStruct((B, H, dv, dk), jnp.float32),
          jax.ShapeDtypeStruct((B, H, dk, dk), jnp.float32))
  return lower_for_h200(jax.grad(loss, argnums=range(6)), *args).as_text().splitlines()


def _kernel_names(lines):
  """Sorted names of the vla_ Pallas kernels in lowered lines (see `_lowered_grad_lines`)."""
  return sorted(l.split('name = "')[1].split('"')[0] for l in lines if 'name = "vla_' in l)


def _config(C, **kw):
  return KernelConfig(chunk_size=C, block_v=16, precision=jax.lax.Precision.HIGHEST, **kw)


class TestKernelsInterpret:
  """Numerics of `vla_pallas` in interpret mode (the GPU twin is
  experiments/check_kernels_gpu.py)."""

  @pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
  def test_forward_matches_oracle_float64(self, x64, shape):
    B, T, H, dk, dv, C = shape
    args = _inputs(0, B, T, H, dk, dv)
    fn = jax.jit(lambda *a: vla_pallas(*a, config=_config(C), interpret=INTERPRET))
    o, S, A = fn(*(jnp.asarray(x) for x in args))
    o_ref, S_ref, A_ref = _oracle(*args)
    chex.assert_shape(o, (B, T, H, dv))
    for name, got, want in (("o", o, o_ref), ("S", S, S_ref), ("A", A, A_ref)):
      assert _rel(got, want) < TOL[np.float64], name

  @pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
  def test_forward_float32_and_bfloat16(self, shape):
    B, T, H, dk, dv, C = shape
    args = _inputs(1, B, T, H, dk, dv)
    o_ref, S_ref, A_ref = _oracle(*args)
    for dtype in (np.float32, jnp.bfloat16):
      q, k, v, u = (jnp.asarray(x, dtype) for x in args[:4])
      S0, A0 = (jnp.asarray(x, jnp.float32) for x in args[4:])
      o, S, A = jax.jit(lambda *a: vla_pallas(*a, config=_config(C), interpret=INTERPRET))(
          q, k, v, u, S0, A0)
      chex.assert_type(o, dtype)
      chex.assert_type([S, A], jnp.float32)
      if dtype == jnp.bfloat16:  # compare with the oracle on the rounded inputs
        o_ref, S_ref, A_ref = _oracle(*(np.asarray(x, np.float64) for x in (q, k, v, u)),
                                      *args[4:])
      for name, got, want in (("o", o, o_ref), ("S", S, S_ref), ("A", A, A_ref)):
        assert _rel(got, want) < TOL[dtype], (dtype, name, _rel(got, want))

  @pytest.mark.parametrize("shape", SHAPES[:2], ids=shape_id)
  def test_gradients_match_scan_float64(self, x64, shape):
    B, T, H, dk, dv, C = shape
    q, k, v, u, S0, A0 = (jnp.asarray(x) for x in _inputs(2, B, T, H, dk, dv))
    rng = np.random.default_rng(3)
    wo, wS, wA = (jnp.asarray(rng.standard_normal(s)) for s in
                  ((B, T, H, dv), (B, H, dv, dk), (B, H, dk, dk)))

    def loss(impl, q, k, v, u, S0):
      o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl=impl,
                             chunk_size=C)
      return jnp.sum(wo * o) + jnp.sum(wS * st.S) + jnp.sum(wA * st.A)

    names = ("q", "k", "v", "u", "S0")
    got = jax.jit(jax.grad(lambda *a: loss("pallas", *a), argnums=range(5)))(q, k, v, u, S0)
    want = jax.jit(jax.grad(lambda *a: loss("scan", *a), argnums=range(5)))(q, k, v, u, S0)
    for name, g, w in zip(names, got, want):
      assert _rel(g, w) < 1e-9, (name, _rel(g, w))

  @pytest.mark.parametrize("solver", ["nilpotent"])
  def test_matrix_product_solver(self, x64, solver):
    """solver="nilpotent" (triangular inverses by products) computes the same function."""
    B, T, H, dk, dv, C = SHAPES[0]
    args = [jnp.asarray(x) for x in _inputs(6, B, T, H, dk, dv)]
    cfg = _config(C, solver=solver)
    o_ref, S_ref, A_ref = _oracle(*(np.asarray(x) for x in args))
    o, S, A = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=INTERPRET))(*args)
    for name, got, want in (("o", o, o_ref), ("S", S, S_ref), ("A", A, A_ref)):
      assert _rel(got, want) < TOL[np.float64], name
    loss = lambda c: lambda *a: sum(jnp.sum(jnp.sin(x)) for x in vla_pallas(
        *a, config=c, interpret=INTERPRET))
    got = jax.jit(jax.grad(loss(cfg), argnums=range(5)))(*args)
    want = jax.jit(jax.grad(loss(_config(C)), argnums=range(5)))(*args)
    for name, g, w in zip(("q", "k", "v", "u", "S0"), got, want):
      assert _rel(g, w) < 1e-9, name

  def test_state_path_gradient_and_vmap(self, x64):
    """`state_path` alone: custom VJP vs autodiff of a plain loop; composes with vmap."""
    BH, T, dk, dv, C = 2, 32, 16, 16, 16
    rng = np.random.default_rng(4)
    q, e, w = (jnp.asarray(rng.standard_normal((BH, T, dk)) / 3) for _ in range(3))
    v, S0 = jnp.asarray(rng.standard_normal((BH, T, dv))), jnp.zeros((BH, dv, dk))
    cfg = _config(C, interpret=INTERPRET)

    def loop(q, e, w, v, S0):
      def step(S, x):
        q_t, e_t, w_t, v_t = x
        S = S + jnp.einsum("bv,bk->bvk", v_t - jnp.einsum("bvk,bk->bv", S, e_t), w_t)
        return S, jnp.einsum("bvk,bk->bv", S, q_t)
      S, o = jax.lax.scan(step, S0, tuple(jnp.swapaxes(x, 0, 1) for x in (q, e, w, v)))
      return jnp.swapaxes(o, 0, 1), S

    loss = lambda f: lambda *a: sum(jnp.sum(jnp.cos(x)) for x in f(*a))
    kern = lambda *a: state_path(*a, config=cfg)
    got = jax.jit(jax.grad(loss(kern), argnums=range(5)))(q, e, w, v, S0)
    want = jax.jit(jax.grad(loss(loop), argnums=range(5)))(q, e, w, v, S0)
    for name, g, x in zip("qewvS", got, want):
      assert _rel(g, x) < 1e-10, name
    batched = jax.jit(jax.vmap(kern))(*(x[:, None] for x in (q, e, w, v, S0)))
    np.testing.assert_allclose(batched[0][:, 0], jax.jit(kern)(q, e, w, v, S0)[0], rtol=1e-12)

  def test_impl_pallas_uses_interpret_on_cpu(self):
    args = [jnp.asarray(x, jnp.float32) for x in _inputs(5, 1, 20, 1, 16, 16)[:4]]
    o, st = jax.jit(lambda *a: vla_recurrence(*a, impl="pallas", chunk_size=16))(*args)
    o_ref, st_ref = jax.jit(lambda *a: vla_recurrence(*a, impl="chunked", chunk_size=16))(*args)
    assert _rel(o, o_ref) < 1e-3 and _rel(st.S, st_ref.S) < 1e-3


class TestBadShapes:

  @pytest.mark.parametrize("dk,dv,C,block_v,match", [
      (24, 16, 16, None, "dk"), (16, 48, 16, None, "dv"), (16, 16, 256, None, "chunk_size"),
      (16, 16, 8, None, "chunk_size"), (16, 32, 16, 8, "block_v"), (16, 32, 16, 64, "block_v")])
  def test_unsupported_shapes_raise(self, dk, dv, C, block_v, match):
    q = jnp.zeros((1, 16, 1, dk))
    v = jnp.zeros((1, 16, 1, dv))
    with pytest.raises(ValueError, match=match):
      vla_pallas(q, q, v, q, jnp.zeros((1, 1, dv, dk)), jnp.eye(dk)[None, None],
                 config=KernelConfig(chunk_size=C, block_v=block_v))

  def test_state_path_needs_whole_chunks(self):
    x = jnp.zeros((1, 24, 16))
    with pytest.raises(ValueError, match="multiple of chunk_size"):
      state_path(x, x, x, x, jnp.zeros((1, 16, 16)), config=KernelConfig(chunk_size=16))

  def test_impl_pallas_rejects_unsupported_head_dim(self):
    x = jnp.zeros((1, 16, 1, 8))
    with pytest.raises(ValueError, match="dk"):
      vla_recurrence(x, x, x, x, impl="pallas", chunk_size=16)


class TestGpuLowering:
  """Lowers forward and backward for an abstract H200 (no GPU needed): Triton IR is built."""

  @pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
  @pytest.mark.parametrize("shape", [(1, 40, 2, 64, 64, 16), (2, 100, 1, 32, 128, 32)],
                           ids=shape_id)
  def test_lowers_for_h200(self, dtype, shape):
    B, T, H, dk, dv, C = shape
    cfg = KernelConfig(chunk_size=C)

    def loss(q, k, v, u, S0, A0):
      o, S, A = vla_pallas(q, k, v, u, S0, A0, config=cfg, interpret=False)
      return jnp.sum(o.astype(jnp.float32)) + jnp.sum(S) + jnp.sum(A)

    spec = lambda *s: jax.ShapeDtypeStruct(s, dtype)
    args = (spec(B, T, H, dk), spec(B, T, H, dk), spec(B, T, H, dv), spec(B, T, H, dk),
            jax.ShapeDtypeStruct((B, H, dv, dk), jnp.float32),
            jax.ShapeDtypeStruct((B, H, dk, dk), jnp.float32))
    lowered = lower_for_h200(jax.grad(loss, argnums=range(4)), *args)
    text = lowered.as_text()
    # The default config's gradient (penalty_grad="adjoint"): the penalty scan twice (the
    # forward, then on the rows' cotangents) with its segment-start and A0 inverses
    # (segment_inverse="auto" is the kernel at dk <= 64), the state path's chunk factors
    # (grad_prep="kernel"), and at these few programs (state_output and state_bwd "auto") the
    # chain + output pair forward and the terms + chain reverse; the segment Grams
    # (segment_gram="kernel"), the adjoint's chunk-local du (adjoint_du="carried") and the
    # state path's chunk-local VJP (state_local_vjp="auto": "fused") in one kernel each, except
    # that float32 operands at a head dim above 64 take the VJP as XLA products (the fused
    # program would need 352 KB of shared memory).
    assert cfg.output_form(B * H, dv) == "split" and cfg.backward_form(B * H, dv) == "split"
    fused = int(dtype == jnp.bfloat16 or max(dk, dv) <= 64)
    counts = {"vla_penalty_scan": 2, "vla_spd_inverse": 2, "vla_penalty_scan_bwd": 0,
              "vla_state_prep": 1, "vla_state_chain": 1, "vla_state_out": 1,
              "vla_state_bwd_terms": 1, "vla_state_bwd_chain": 1, "vla_state_bwd": 0,
              "vla_segment_grams": 1, "vla_adjoint_du": 0, "vla_adjoint_du_carried": 1,
              "vla_state_fused_vjp": fused}
    assert text.count("__gpu$xla.gpu.triton") == sum(counts.values()) == 11 + fused
    for name, n in counts.items():
      assert text.count(f'name = "{name}"') == n, name

  def test_value_block_auto(self):
    """block_v=None: 16 value rows where 32 would leave at most SMALL_VALUE_BLOCK_AT programs
    in the sequential loops (B = 1, H = 16, d = 64), else 32; an explicit block_v stays."""
    cfg = KernelConfig()
    assert cfg.value_block(64, 16) == 16       # T = 32768, B = 1, H = 16: 32 programs at 32
    assert cfg.value_block(64, 32) == 32       # 64 programs
    assert cfg.value_block(64, 128) == 32      # T = 4096, B = 8
    assert cfg.value_block(128, 16) == 32      # d = 128, B = 1: 64 programs
    assert cfg.value_block(64) == 32 and cfg.value_block(16, 4) == 16
    assert KernelConfig(block_v=64).value_block(64, 16) == 64
    assert cfg.output_form(16, 64) == "split" and cfg.backward_form(16, 64) == "split"

  def test_state_output_auto(self):
    cfg = KernelConfig()
    assert cfg.output_form(128, 64) == "fused"      # T = 4096, B = 8, H = 16: 256 programs
    assert cfg.output_form(16, 64) == "split"       # B = 1, H = 16: 32 programs
    assert cfg.output_form(64, 128) == "fused"      # 64 x 4 value blocks of 32
    assert cfg.output_form(64, 128, 128) == "split"  # ... at dk = 128
    assert cfg.output_form(128, 64, 64) == "fused"
    assert KernelConfig(state_output="fused").output_form(16, 64) == "fused"
    assert KernelConfig(state_output="split").output_form(128, 64) == "split"

  def test_state_bwd_auto(self):
    """state_bwd="auto" (the default): split up to 512 programs of the reverse loop, and at
    dk >= 128 whatever the programs."""
    cfg = KernelConfig()
    assert cfg.state_bwd == "auto"
    assert cfg.backward_form(128, 64) == "split"      # T = 4096, B = 8, H = 16: 256 programs
    assert cfg.backward_form(16, 64) == "split"
    assert cfg.backward_form(128, 128) == "split"       # dk not given: 512 programs
    assert cfg.backward_form(256, 128) == "fused"       # 1,024 programs
    assert cfg.backward_form(256, 64, 64) == "split"    # T = 2048, B = 16: 512 programs
    assert cfg.backward_form(512, 64, 64) == "fused"    # T = 1024, B = 32: 1024 programs
    assert cfg.backward_form(128, 128, 128) == "split"  # d = 128, T = 4096, B = 8: 512
    assert KernelConfig(state_bwd="fused").backward_form(16, 64) == "fused"
    assert KernelConfig(state_bwd="split").backward_form(128, 64) == "split"
