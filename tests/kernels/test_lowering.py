"""Lowering for an abstract NVIDIA H200 (no GPU needed): the Triton IR of every
kernel the defaults select is built, forward and gradient, so code that only runs in interpret
mode cannot land; and the kernels each call runs are the ones the plan says."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels.lowering import abstract_h200, equations, lower_for_h200


def _lowered(dtype, shape, precision, grad, segment_ids, block_factor, start_inverse,
             penalty_layout):
  """The StableHLO text of vla_pallas's forward (or gradient) lowered for the H200."""
  B, T, H, dk, dv, C = shape
  cfg = KernelConfig(chunk_size=C, precision=precision, block_factor=block_factor,
                     start_inverse=start_inverse, penalty_layout=penalty_layout)
  fwd = lambda *a: vla_pallas(*a, segment_ids=segment_ids, config=cfg, interpret=False)
  fn = fwd
  if grad:
    loss = lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in fwd(*a))
    fn = jax.grad(loss, argnums=range(6))
  spec = lambda *s: jax.ShapeDtypeStruct(s, dtype)
  args = (spec(B, T, H, dk), spec(B, T, H, dk), spec(B, T, H, dv), spec(B, T, H, dk),
          jax.ShapeDtypeStruct((B, H, dv, dk), jnp.float32),
          jax.ShapeDtypeStruct((B, H, dk, dk), jnp.float32))
  return lower_for_h200(fn, *args).as_text()


@functools.cache
def _lowered_once(dtype, shape, precision, grad, *settings):
  """`_lowered` without segment_ids, once per call: the calls that several tests make (the
  default plans' gradients at d = 64, the float32 forward at d = 32) are lowered once."""
  return _lowered(dtype, shape, precision, grad, None, *settings)


def _kernels(dtype, shape, precision=jax.lax.Precision.DEFAULT, grad=True, text=False,
             segment_ids=None, block_factor=None, start_inverse=None, penalty_layout=None):
  """Sorted names of the Pallas kernels in the lowered forward (or gradient); with text, also
  the StableHLO. The penalty path's forms: the plan's, or those named."""
  settings = (block_factor, start_inverse, penalty_layout)
  hlo = (_lowered_once(dtype, shape, precision, grad, *settings) if segment_ids is None
         else _lowered(dtype, shape, precision, grad, segment_ids, *settings))
  names = re.findall(r'name = "(vla_[a-z_0-9]+)"', hlo)
  assert hlo.count("__gpu$xla.gpu.triton") == len(names)
  names = sorted(names)
  # Plans with large-gain blocks (`Plan.accurate_dot`: bfloat16 or one-pass TF32 products)
  # compile the penalty scan and the row cotangents twice, with and without them (one
  # `lax.cond`, `penalty_scan.large_gains`); the lists below name each kernel once.
  twice = names.count("vla_penalty_scan") == 2
  assert names.count("vla_penalty_scan") == (2 if twice else 1)
  assert names.count("vla_row_cotangents") == (2 if twice and grad else int(grad))
  if twice:
    names.remove("vla_penalty_scan")
    if grad:
      names.remove("vla_row_cotangents")
  return (names, hlo) if text else names


SCAN_FWD = ["vla_penalty_scan", "vla_segment_grams", "vla_spd_inverse", "vla_spd_inverse"]
EXACT_FWD = ["vla_penalty_scan", "vla_spd_inverse", "vla_spd_inverse"]   # float64 Grams in XLA
SPLIT_FWD = ["vla_state_chain", "vla_state_out", "vla_state_prep"]
SPLIT_BWD = ["vla_adjoint_du", "vla_row_cotangents", "vla_state_bwd_chain",
             "vla_state_bwd_terms"]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_default_kernels_d64(dtype):
  """Few programs (the split state loops), segment starts in Pallas (the Gram kernel for
  bfloat16 u; float32 u's exact Grams are float64 XLA), the chunk-local VJP in one kernel;
  forward and gradient."""
  shape = (1, 100, 2, 64, 64, 32)
  starts = SCAN_FWD if dtype == jnp.bfloat16 else EXACT_FWD
  assert _kernels(dtype, shape, grad=False) == sorted(starts + SPLIT_FWD)
  assert _kernels(dtype, shape) == sorted(starts + SPLIT_FWD + SPLIT_BWD
                                          + ["vla_state_local_vjp"])


def test_large_gain_blocks_compile_a_second_scan():
  """bfloat16 and one-pass TF32 plans compile the penalty scan and the row cotangents with
  and without the large-gain blocks (`penalty_scan.large_gains` picks one per call); float32
  at HIGHEST has no such blocks and compiles one of each."""
  shape = (1, 100, 2, 64, 64, 32)
  count = lambda hlo, name: hlo.count(f'name = "{name}"')
  for dtype, p, n in ((jnp.bfloat16, jax.lax.Precision.DEFAULT, 2),
                      (jnp.float32, jax.lax.Precision.DEFAULT, 2),
                      (jnp.float32, jax.lax.Precision.HIGHEST, 1)):
    _, hlo = _kernels(dtype, shape, p, text=True)
    assert count(hlo, "vla_penalty_scan") == n and count(hlo, "vla_row_cotangents") == n


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_default_kernels_d128(dtype):
  """dk = 128 (two one-chunk segments), the transposed penalty path: the exact segment starts
  in the kernels (the plan's "tiles"; the Gram kernel for bfloat16 u, float64 XLA Grams for
  float32 u); float32 operands take the chunk-local VJP as XLA products (the kernel would
  need 352 KB of shared memory), bfloat16 ones the kernel."""
  shape = (1, 128, 1, 128, 128, 64)
  bf16 = dtype == jnp.bfloat16
  scan = SCAN_FWD if bf16 else EXACT_FWD
  local_vjp = ["vla_state_local_vjp"] if bf16 else []
  assert _kernels(dtype, shape) == sorted(scan + SPLIT_FWD + SPLIT_BWD + local_vjp)


@pytest.mark.parametrize("dtype,precision", [(jnp.bfloat16, "DEFAULT"), (jnp.float32, "DEFAULT"),
                                             (jnp.float32, "HIGHEST")],
                         ids=["bf16", "f32", "f32_highest"])
def test_tiled_starts_lower_at_d128(dtype, precision):
  """The segment starts at dk = 128 (two one-chunk segments) in the form "tiles" (the plan's
  for float32 states): the Gram kernel (8 warps; bfloat16 u only: float32 u's exact Grams are
  float64 XLA) and the inverse kernel on tiles in a workspace (barriers between its phases)
  lower for the H200, each product at the plan's precision."""
  p = getattr(jax.lax.Precision, precision)
  shape = (1, 128, 1, 128, 128, 64)
  grams = ["vla_segment_grams"] if dtype == jnp.bfloat16 else []
  assert _kernels(dtype, shape, p, grad=False, start_inverse="tiles") == sorted(
      ["vla_penalty_scan", "vla_spd_inverse", "vla_spd_inverse"] + grams + SPLIT_FWD)
  cfg = KernelConfig(chunk_size=64, precision=p, start_inverse="tiles")
  plan = cfg.plan(low=dtype == jnp.bfloat16, acc=jnp.float32, dk=128, dv=128, BH=1, N=2,
                  interpret=False)
  assert plan.inverse_kernel
  spec = lambda *s, dt=dtype: jax.ShapeDtypeStruct(s, dt)
  args = [spec(1, 128, 1, 128)] * 4 + [spec(1, 1, 128, 128, dt=jnp.float32)] * 2
  products = _products(lambda *a: vla_pallas(*a, config=cfg, interpret=False), args)
  name = lambda x: str((x, x)) if isinstance(x, jax.lax.Precision) else str(x)
  assert {q for w, q in products if w == "vla_spd_inverse"} == {name(plan.inverse_dot)}
  assert {q for w, q in products if w == "vla_segment_grams"} == (
      {name(plan.gram_dot)} if grams else set())


def test_compiling_for_a_cpu_raises_a_clear_error():
  """interpret=False where the target device is a CPU: an error that names it and the
  alternatives at trace time, not a crash inside lowering."""
  x = jax.ShapeDtypeStruct((1, 64, 1, 64), jnp.bfloat16)
  S = jax.ShapeDtypeStruct((1, 1, 64, 64), jnp.float32)
  cpu = AbstractDevice(device_kind="cpu", num_cores=1, platform="cpu")
  with (use_abstract_mesh(AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=cpu)),
        pytest.raises(RuntimeError, match=r"'cpu'.*impl='chunked'.*interpret=True")):
    jax.jit(lambda *a: vla_pallas(*a, interpret=False)).trace(x, x, x, x, S, S)


def test_fused_loops_at_many_programs():
  """B * H * dv / 32 > 512 programs: one forward loop, one reverse loop."""
  names = _kernels(jnp.bfloat16, (64, 32, 16, 32, 32, 16))
  assert "vla_state_fwd" in names and "vla_state_bwd" in names
  assert "vla_state_chain" not in names and "vla_state_bwd_chain" not in names


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_packed_documents_lower(dtype):
  """segment_ids: the packed kernels (document indices, masks, one penalty-scan segment) lower
  for the H200 in their split forms, their fused forms (many programs) and at d = 128, forward
  and gradient."""
  ids = lambda B, T: jnp.asarray(np.arange(B * T).reshape(B, T) // 23, jnp.int32)
  assert _kernels(dtype, (1, 100, 2, 64, 64, 32), grad=False, segment_ids=ids(1, 100)) == sorted(
      ["vla_penalty_scan", "vla_state_chain", "vla_state_out", "vla_state_prep"])
  assert _kernels(dtype, (1, 100, 2, 64, 64, 32), segment_ids=ids(1, 100)) == sorted(
      ["vla_penalty_scan"] + SPLIT_FWD + SPLIT_BWD + ["vla_state_local_vjp"])
  names = _kernels(dtype, (64, 32, 16, 32, 32, 16), segment_ids=ids(64, 32))
  assert "vla_state_fwd" in names and "vla_state_bwd" in names
  local_vjp = ["vla_state_local_vjp"] if dtype == jnp.bfloat16 else []
  assert _kernels(dtype, (1, 64, 1, 128, 128, 64), segment_ids=ids(1, 64)) == sorted(
      ["vla_penalty_scan"] + SPLIT_FWD + SPLIT_BWD + local_vjp)


@pytest.mark.parametrize("precision", ["HIGH", "HIGHEST"])
def test_precisions_lower(precision):
  """Three-pass TF32 and IEEE float32 products lower in every kernel, forward and gradient;
  the exact segment starts' float64 Grams, prefix sums and Newton steps lower as XLA (no
  float64 in a kernel), as they do for one-pass TF32 at DEFAULT."""
  names, hlo = _kernels(jnp.float32, (1, 64, 2, 32, 32, 32),
                        getattr(jax.lax.Precision, precision), text=True)
  assert names == sorted(EXACT_FWD + SPLIT_FWD + SPLIT_BWD + ["vla_state_local_vjp"])
  assert "xf64>" in hlo
  names, hlo = _kernels(jnp.float32, (1, 64, 2, 32, 32, 32), grad=False, text=True)
  assert names == sorted(EXACT_FWD + SPLIT_FWD) and "xf64>" in hlo


@pytest.mark.parametrize("dtype,precision", [(jnp.bfloat16, "DEFAULT"), (jnp.float32, "HIGHEST")],
                         ids=["bf16", "f32_highest"])
def test_elimination_block_factor_lowers(dtype, precision):
  """block_factor="elimination" (the elimination in every block, without the plan's guarded
  Newton steps, which the default kernels lower) lowers, forward and gradient, packed
  documents too."""
  shape, p = (1, 100, 2, 64, 64, 32), getattr(jax.lax.Precision, precision)
  fwd = EXACT_FWD if precision == "HIGHEST" else SCAN_FWD
  assert _kernels(dtype, shape, p, block_factor="elimination") == sorted(
      fwd + SPLIT_FWD + SPLIT_BWD + ["vla_state_local_vjp"])
  ids = jnp.asarray(np.arange(100).reshape(1, 100) // 23, jnp.int32)
  assert "vla_penalty_scan" in _kernels(dtype, shape, p, grad=False, segment_ids=ids,
                                        block_factor="elimination")


@pytest.mark.parametrize("dtype,precision,d", [(jnp.bfloat16, "DEFAULT", 128),
                                               (jnp.float32, "HIGH", 16)],
                         ids=["bf16_d128", "f32_high_d16"])
def test_penalty_layouts_lower(dtype, precision, d):
  """The penalty layout the plan does not pick at each head dim (the plan's lowers in the
  default kernels' tests) lowers for the H200 in the gradient (which runs the forward scan
  too): the rows layout (the carried A the right operand of [16, dk] products, the
  u-cotangent kernel's U E + U E^T) bfloat16 at d = 128 plain and with packed documents; the
  transposed one (A the left operand of [dk, 16] products and the downdate's accumulator,
  the u-cotangent kernel's F = E + E^T) float32 at HIGH (three-pass TF32) at d = 16. In the
  transposed penalty scan the [dk, dk] operand of every product is the left one."""
  p = getattr(jax.lax.Precision, precision)
  ids = jnp.asarray(np.arange(64).reshape(1, 64) // 23, jnp.int32)
  for segment_ids in (None, ids) if d == 128 else (None,):
    names = _kernels(dtype, (1, 64, 1, d, d, 64), p, segment_ids=segment_ids,
                     penalty_layout="rows" if d == 128 else "transposed")
    assert {"vla_penalty_scan", "vla_row_cotangents", "vla_adjoint_du"} <= set(names)
  cfg = KernelConfig(chunk_size=64, precision=p, penalty_layout="transposed")
  spec = lambda *s, dt=dtype: jax.ShapeDtypeStruct(s, dt)
  args = [spec(1, 64, 1, 32)] * 4 + [spec(1, 1, 32, 32, dt=jnp.float32)] * 2
  with abstract_h200():
    jaxpr = jax.make_jaxpr(lambda *a: vla_pallas(*a, config=cfg, interpret=False))(*args)
  square = [(e.invars[0].aval.shape, e.invars[1].aval.shape)
            for where, e in equations(jaxpr.jaxpr)
            if where == "vla_penalty_scan" and e.primitive.name == "dot_general"
            and (32, 32) in (e.invars[0].aval.shape, e.invars[1].aval.shape)]
  assert square and all(lhs == (32, 32) for lhs, _ in square), square


def _products(fn, args):
  """{(where, precision)} of every matrix product in fn's jaxpr: where is the Pallas kernel's
  name or "xla"."""
  with abstract_h200():
    return {(where, str(e.params["precision"]))
            for where, e in equations(jax.make_jaxpr(fn)(*args).jaxpr)
            if e.primitive.name == "dot_general"}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_highest_leaves_no_tf32_or_bf16_product(dtype):
  """precision=HIGHEST: every product of every kernel and XLA part of the forward and the
  gradient is HIGHEST (Triton: IEEE float32), at d = 64 and at d = 128 (the tiled segment
  starts, XLA chunk-local VJP for float32)."""
  for d in (64, 128):
    cfg = KernelConfig(chunk_size=32, precision=jax.lax.Precision.HIGHEST)
    fwd = lambda *a: vla_pallas(*a, config=cfg, interpret=False)
    loss = lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in fwd(*a))
    spec = lambda *s: jax.ShapeDtypeStruct(s, dtype)
    args = (spec(1, 96, 2, d), spec(1, 96, 2, d), spec(1, 96, 2, d), spec(1, 96, 2, d),
            jax.ShapeDtypeStruct((1, 2, d, d), jnp.float32),
            jax.ShapeDtypeStruct((1, 2, d, d), jnp.float32))
    products = _products(jax.grad(loss, argnums=range(6)), args)
    kernels = {w for w, _ in products if w != "xla"}
    assert "vla_penalty_scan" in kernels and "vla_state_prep" in kernels, kernels
    highest = str((jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST))
    assert all(p == highest for _, p in products), sorted(products)


def test_high_runs_three_tf32_passes_everywhere():
  """precision=HIGH with float32 inputs: every product of the gradient, in the kernels and in
  the XLA parts between them (the penalty adjoint's segment sums; the chunk-local VJP at
  d = 128), runs three TF32 passes or IEEE float32, never one TF32 pass (which XLA and Triton
  make of Precision.HIGH on GPUs)."""
  allowed = {str(jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3),
             str((jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST))}
  for d in (64, 128):
    cfg = KernelConfig(chunk_size=32, precision=jax.lax.Precision.HIGH)
    fwd = lambda *a: vla_pallas(*a, config=cfg, interpret=False)
    loss = lambda *a: sum(jnp.sum(x) for x in fwd(*a))
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    args = (spec(1, 96, 2, d),) * 4 + (spec(1, 2, d, d), spec(1, 2, d, d))
    products = _products(jax.grad(loss, argnums=range(6)), args)
    assert {w for w, _ in products} >= {"xla", "vla_row_cotangents", "vla_adjoint_du"}
    assert {p for _, p in products} <= allowed, sorted(products)


@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated_deltanet"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_delta_rule_kernels_lower(dtype, gated):
  """DeltaNet and Gated DeltaNet on the state path (`kernels/delta_rule.py`), forward and
  gradient: the Triton IR of the state-path kernels (the decays' exponentials and chunk-end
  minimum included) is built; Gated DeltaNet's chunk-local VJP is XLA products."""
  from vla_jax.kernels.delta_rule import (  # pylint: disable=import-outside-toplevel
      deltanet_pallas, gated_deltanet_pallas)
  B, T, H, d, C = 1, 100, 2, 64, 32
  cfg = KernelConfig(chunk_size=C)
  spec = lambda *s, dt=dtype: jax.ShapeDtypeStruct(s, dt)
  args = [spec(B, T, H, d), spec(B, T, H, d), spec(B, T, H, d), spec(B, T, H, dt=jnp.float32)]
  if gated:
    args.append(spec(B, T, H, dt=jnp.float32))
  args.append(spec(B, H, d, d, dt=jnp.float32))
  op = gated_deltanet_pallas if gated else deltanet_pallas
  fwd = lambda *a: op(*a, config=cfg, interpret=False)
  loss = lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in fwd(*a))
  for fn, want in ((fwd, SPLIT_FWD),
                   (jax.grad(loss, argnums=range(len(args))),
                    SPLIT_FWD + ["vla_state_bwd_chain", "vla_state_bwd_terms"]
                    + ([] if gated else ["vla_state_local_vjp"]))):
    hlo = lower_for_h200(fn, *args).as_text()
    names = re.findall(r'name = "(vla_[a-z_0-9]+)"', hlo)
    assert hlo.count("__gpu$xla.gpu.triton") == len(names)
    assert sorted(names) == sorted(want)
