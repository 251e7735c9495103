"""`lab.benchmarks`: timing, the floor, the profile's sums and the correctness check's
inputs (no GPU needed; the report: test_report.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracles
from lab.benchmarks import check, floor, measure, profile, rows
from vla_jax.kernels import penalty_scan


def test_time_jax_and_median_seconds():
  fn = lambda x: jnp.tanh(x @ x.T)
  sets = [(jnp.full((64, 64), 0.01 * (i + 1)),) for i in range(2)]
  res = measure.time_jax(fn, sets, warmup=1, target_s=0.02, min_reps=3, max_reps=5,
                         rounds=3, round_s=0.01, max_per_round=7)
  assert res["ms"] > 0 and res["ms_sync"] > 0 and 3 <= res["reps"] <= 5
  assert 2 <= res["per_round"] <= 7 and not res["over_cap"]
  assert measure.median_seconds(jax.jit(fn), sets[0], repeats=2) > 0
  assert measure.classify(RuntimeError("RESOURCE_EXHAUSTED: out of memory"))[0] == "OOM"


@pytest.mark.slow   # the lab's harness (README: the slow tier)
def test_backward_rows_return_the_output_and_its_pullback():
  fn = rows.jax_function("softmax_attention", "xla", "fwd+bwd")
  *xs, cot = rows.jax_inputs("softmax_attention", 1, 32, 2, 16, jnp.float32, 1, True)
  o, grads = jax.jit(fn)(*xs, cot)
  fwd = rows.jax_function("softmax_attention", "xla", "fwd")
  chex.assert_trees_all_close(o, fwd(*xs), rtol=1e-6)
  want = jax.grad(lambda *a: jnp.sum(fwd(*a) * cot), argnums=(0, 1, 2))(*xs)
  chex.assert_trees_all_close(grads, want, rtol=1e-5, atol=1e-6)


def test_vla_inputs_take_the_layers_path():
  """The timed VLA calls have the layer's unit penalty directions (penalty_scale 1), so they
  run the kernels' path for gains <= 1 (no large-gain blocks), as training does."""
  for dtype in (jnp.float32, jnp.bfloat16):
    *_, u = rows.jax_inputs("vla", 2, 64, 2, 64, dtype, 1, False)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(u, np.float32), axis=-1), 1.0,
                               rtol=1e-2)
    assert not bool(penalty_scan.large_gains(u, jnp.eye(64)))


@pytest.mark.slow   # the lab's harness (README: the slow tier)
def test_state_path_family():
  """The state path alone: outside the default suite; traces forward and forward + backward
  (o, and a cotangent per input) and matches the float64 oracle on the family's inputs
  (S0 = 0)."""
  new = ("state_path_triton",)
  assert not set(new) & set(rows.DEFAULT_ROWS) and set(new) <= set(rows.BY_KEY)
  for spec in (rows.BY_KEY[k] for k in new):
    for pass_ in rows.PASSES:
      args = rows.abstract_inputs(spec.op, 1, 128, 2, 64, jnp.bfloat16, pass_ != "fwd")
      out = jax.eval_shape(rows.jax_function(spec.op, spec.impl, pass_), *args)
      shapes = jax.tree.map(lambda x: x.shape, out)
      assert shapes == ((1, 128, 2, 64) if pass_ == "fwd"
                        else ((1, 128, 2, 64), ((1, 128, 2, 64),) * 4)), (spec.key, shapes)
  q, e, w, v = rows.jax_inputs("state_path", 1, 128, 2, 64, jnp.bfloat16, 1, False)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(e, np.float32), axis=-1), 1, atol=1e-2)
  want, _ = oracles.delta_rule(q, e, w, v, np.zeros((1, 2, 64, 64)))
  o = jax.jit(rows.jax_function("state_path", "triton", "fwd"))(q, e, w, v)
  err = np.linalg.norm(np.asarray(o, np.float64) - want) / np.linalg.norm(want)
  assert err < 1e-2, err


def test_start_inverse_families():
  """vla_kernel_start_xla and vla_kernel_start_tiles: outside the default suite; each traces
  forward and forward + backward at d = 128 (B = 1, two penalty-scan segments), the segment
  starts in the kernels (the Gram kernel and the inverse) with "tiles" only."""
  from vla_jax.kernels.lowering import equations  # pylint: disable=import-outside-toplevel
  starts = {"vla_segment_grams", "vla_spd_inverse"}
  keys = {"vla_kernel_start_xla": set(), "vla_kernel_start_tiles": starts}
  assert not set(keys) & set(rows.DEFAULT_ROWS) and set(keys) <= set(rows.BY_KEY)
  for key, want in keys.items():
    spec = rows.BY_KEY[key]
    for pass_ in rows.PASSES:
      args = rows.abstract_inputs(spec.op, 1, 128, 1, 128, jnp.bfloat16, pass_ != "fwd")
      jaxpr = jax.make_jaxpr(rows.jax_function(spec.op, spec.impl, pass_))(*args)
      kernels = {where for where, _ in equations(jaxpr)}
      assert "vla_penalty_scan" in kernels and kernels & starts == want, (key, pass_, kernels)


@pytest.mark.slow   # the lab's harness (README: the slow tier)
def test_penalty_layout_families():
  """vla_kernel_penalty_rows and vla_kernel_penalty_transposed: outside the default suite;
  each traces forward and forward + backward with its `KernelConfig.penalty_layout` (in
  vla_penalty_scan the [dk, dk] operand of every product is the right one for "rows", the
  left one for "transposed")."""
  from vla_jax.kernels.lowering import equations  # pylint: disable=import-outside-toplevel
  keys = {"vla_kernel_penalty_rows": 1, "vla_kernel_penalty_transposed": 0}
  assert not set(keys) & set(rows.DEFAULT_ROWS) and set(keys) <= set(rows.BY_KEY)
  for key, side in keys.items():
    spec = rows.BY_KEY[key]
    for pass_ in rows.PASSES:
      args = rows.abstract_inputs(spec.op, 1, 64, 2, 32, jnp.float32, pass_ != "fwd")
      jaxpr = jax.make_jaxpr(rows.jax_function(spec.op, spec.impl, pass_, chunk=16))(*args)
      shapes = [[x.aval.shape for x in e.invars] for where, e in equations(jaxpr)
                if where == "vla_penalty_scan" and e.primitive.name == "dot_general"]
      square = [s for s in shapes if (32, 32) in s]
      assert square and all(s[side] == (32, 32) for s in square), (key, pass_, square)


def test_check_names_the_known_kernel_options():
  """`check.check`, `drift` and `long_run` take the `KernelConfig` options as keywords
  (check_kernels' smoke run in tests/experiments/test_benchmarks.py passes each and reads
  them back from the rows); an unknown one is an error that names the known ones."""
  assert check.kernel_options({"start_inverse": "tiles"}) == {
      **check.OPTION_DEFAULTS, "start_inverse": "tiles"}
  for run in (lambda: check.check(check.smoke_cases()[0], interpret=True, layout="rows"),
              lambda: check.drift(check.smoke_drift_cases()[0], interpret=True, layout="rows")):
    with pytest.raises(ValueError, match="unknown KernelConfig options \\['layout'\\]"):
      run()


def test_a_case_that_raises_is_a_row_and_the_check_goes_on(monkeypatch):
  """A kernel that fails to launch (the GPU's shared-memory limit) or runs out of memory in one
  case gives that case a row with status "error" / "OOM" and the stage that raised, instead of
  ending the check; the drift verdicts and table keep such a row as it is."""
  def failing(stage):
    def fn(*args):
      raise RuntimeError("RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested "
                         "262144, available: 232448" if stage == "gradient" else "boom")
    return fn
  ok = lambda *args: (jnp.zeros(1),)
  monkeypatch.setattr(check, "_pallas_fns", lambda *a: (ok, failing("gradient")))
  case = check.smoke_cases()[0]
  row = check.check(case, interpret=True, block_factor="newton")
  assert (row["status"], row["stage"], row["pass"]) == ("OOM", "gradient", "check"), row
  assert "262144" in row["note"] and row["block_factor"] == "newton" and row["T"] == case.T
  monkeypatch.setattr(check, "_pallas_fns", lambda *a: (failing("forward"), ok))
  row = check.check(case, interpret=True)
  assert (row["status"], row["stage"], row["note"]) == ("error", "forward", "RuntimeError: boom")
  drift_case = check.smoke_drift_cases()[1]
  monkeypatch.setattr(check, "_drift_fns", lambda *a: (failing("forward"), ok))
  failed = check.drift(drift_case, interpret=True)
  assert (failed["status"], failed["stage"], failed["pass"]) == ("error", "forward", "drift")
  iso = {"d": drift_case.d, "T": drift_case.T, "lam0": drift_case.lam0, "u": "isotropic",
         "errors": {"o": 1e-2}, "finite": True, "o_quarters": [1e-2] * 4}
  got = check.drift_verdicts([iso, failed])
  assert [r["status"] for r in got] == ["ok", "error"]
  assert "| error (forward) |" in check.drift_table(got)


def test_floor():
  fl = floor.delta_rule_floor_ms(1, 32768, 16, 64)
  assert fl == pytest.approx(max(4 * 32768 * 16 * 64 * 2 / 4.2e12,
                                 2 * (5 * 64 * 64 * 64 + 3 * 64 * 64 * 64) * 32768 * 16 / 64
                                 / 8e14) * 1e3)
  assert fl < floor.floor_ms(1, 32768, 16, 64) < floor.floor_ms(1, 32768, 16, 64, backward=True)


def test_profile_sums_classes_and_gaps():
  assert profile.kernel_class("vla_penalty_scan") == "pallas"
  assert profile.kernel_class("loop_transpose_fusion_3") == "xla"
  assert profile.kernel_class("sm90_xmma_gemm_bf16bf16_f32") == "gemm"
  assert profile.kernel_class("Memcpy DtoD") == "copy"
  events = [("vla_state_bwd", 3e6), ("fusion_1", 1e6), ("vla_state_bwd", 1e6), ("fusion_2", 2e6)]
  kernels, classes = profile.summarise(events, calls=2)
  assert kernels["vla_state_bwd"] == ("pallas", 2.0, 1.0)
  assert classes == {"pallas": 2.0, "xla": 1.5}
  events = [("a", 10, 0), ("b", 5, 15), ("c", 2, 16),
            ("a", 10, 120), ("b", 5, 135), ("c", 2, 136)]
  idle, top = profile.idle_gaps(events, calls=2)
  assert idle == 5 / 1e6 and top == [(5 / 1e6, "a", "b")]


def test_profile_launch_params_are_the_plans():
  """The warps and stages each kernel launches with (read from the jaxpr, as the resource
  report compiles them): 1-warp penalty scans for bf16 at d = 64, 4 for the state loops."""
  fwd, grad, xs = profile.vla_calls(1, 128, 2, 64, interpret=False)
  params = profile.launch_params(grad, [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs])
  assert params["vla_penalty_scan"] == (1, 1) and params["vla_state_chain"] == (4, 2)
  assert params["vla_state_local_vjp"] == (8, 1) and params["vla_adjoint_du"] == (4, 1)
  del fwd


def test_anisotropic_u_is_ill_conditioned():
  """Anisotropic u: rows of norm 1 / sqrt(d) (a trained layer's scale) that make
  M = I + sum u u^T far worse conditioned (4 dominant directions) than isotropic rows of the
  same norm."""
  key, d = jax.random.PRNGKey(0), 32
  u = np.asarray(check.penalty_directions(key, 1, 2048, 2, d, "anisotropic"))[0, :, 0]
  np.testing.assert_allclose(np.linalg.norm(u, axis=-1), 1 / np.sqrt(d), rtol=1e-4)
  iso = np.asarray(check.penalty_directions(key, 1, 2048, 2, d, "isotropic"))[0, :, 0]
  iso = iso / np.linalg.norm(iso, axis=-1, keepdims=True) / np.sqrt(d)
  cond = lambda x: np.linalg.cond(np.eye(d) + x.T @ x)
  assert cond(u) > 5 * cond(iso), (cond(u), cond(iso))
  assert check.bound(check.Case("float32", "HIGHEST", "anisotropic", 4096)) == 1e-3
  assert check.bound(check.Case("bfloat16", "DEFAULT", "isotropic", 4096)) == 3e-2


def test_drift_verdicts():
  """`drift_verdicts` holds each anisotropic drift row to DRIFT_RATIO times its isotropic
  twin's error (same d, T, lam0)."""
  row = lambda u, e: {"d": 16, "T": 256, "lam0": 0.1, "u": u, "errors": {"o": e},
                      "finite": True, "o_quarters": [e] * 4}
  got = check.drift_verdicts([row("isotropic", 1e-2), row("anisotropic", 1.4e-2)])
  assert [r["status"] for r in got] == ["ok", "ok"] and got[1]["ratio"] == pytest.approx(1.4)
  got = check.drift_verdicts([row("isotropic", 1e-2), row("anisotropic", 1.6e-2)])
  assert got[1]["status"] == "fail"
  assert "| anisotropic |" in check.drift_table(got)


@pytest.mark.slow   # the lab's harness (README: the slow tier)
def test_newton_fallback_rate():
  """The fraction of penalty-scan blocks with ||U A U^T||_F > NEWTON_RADIUS, against NumPy
  (A0 = 10 I, unit-norm anisotropic u: the early blocks exceed it, the later ones do not)."""
  B, T, H, d = 1, 256, 1, 16
  (_, k, _, u), _, A0 = check.drift_inputs(check.DriftCase("anisotropic", T, 0.1, d, B, H, 16))
  rate = check.newton_fallback_rate(k, u, A0, 16, "DEFAULT", interpret=True)
  U = np.asarray(u, np.float64)[0, :, 0]
  A, over = np.asarray(A0, np.float64)[0, 0], []
  for j in range(0, T, 16):
    over.append(np.linalg.norm(U[j:j + 16] @ A @ U[j:j + 16].T) > 0.25)
    A = np.linalg.inv(np.linalg.inv(A) + U[j:j + 16].T @ U[j:j + 16])
  assert 0 < rate < 1 and rate == pytest.approx(np.mean(over)), (rate, over)
