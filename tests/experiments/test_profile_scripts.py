"""CPU smoke runs (Pallas interpret mode) of the GPU profiling scripts
`experiments/profile_forward.py` and `experiments/profile_backward.py`: they run end to end and
write their rows; the forward profile's penalty variants match the float64 reference."""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(ROOT, "experiments")


def _run(script, out, T, *flags):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(EXPERIMENTS, script), "--out", str(out),
                         "--Ts", str(T), "--tokens", str(T), "--reps", "1", "--warmup", "0",
                         *flags],
                        cwd=EXPERIMENTS, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out / script.replace(".py", ".json")) as f:
    return json.load(f)["rows"]


def test_profile_forward_smoke(tmp_path):
  rows = _run("profile_forward.py", tmp_path, 128, "--variants", "4:tf32:1,4:tf32:1:kernel",
              "--state_outputs", "split")
  parts = [(r.get("part"), r.get("state_output")) for r in rows if "part" in r]
  assert parts == [("forward", "split"), ("state_only", "split")]
  variants = [r for r in rows if "variant" in r]
  assert [r["segments"] for r in variants] == [2, 2]     # 2 chunks, one segment each
  assert [r["segment_inverse"] for r in variants] == ["xla", "kernel"]
  for r in variants:   # interpret mode runs the products at full precision
    assert "error" not in r and r["max_row_err"] < 1e-5, r
    assert np.isfinite(r["penalty_ms"]) and np.isfinite(r["kernel_ms"])
    assert np.isfinite(r["inverses_ms"])
    assert np.isfinite(r["grams_ms"]) and np.isfinite(r["a0_inverse_ms"])


def test_profile_backward_smoke(tmp_path):
  rows = _run("profile_backward.py", tmp_path, 64, "--variants",
              "split:kernel:kernel:products:1:2:1", "--dim", "32")
  assert [r["part"] for r in rows] == ["vla", "penalty", "state", "state_reverse"]
  assert all(np.isfinite(v) for r in rows for k, v in r.items() if k.endswith("ms"))


def test_profile_target_runs_one_forward_and_gradient():
  """`experiments/profile_target.py` (a profiler's target): one forward, four finite
  gradients, at the library's defaults (bf16 inputs: bfloat16 penalty products)."""
  sys.path.insert(0, EXPERIMENTS)
  import profile_target   # pylint: disable=import-outside-toplevel
  out, grads = profile_target.main(["--T", "32", "--tokens", "32"])
  assert out.shape == (1, 32, 16, 64) and len(grads) == 4
  assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)


def test_profile_kernels_classes_and_sums():
  """`experiments/profile_kernels.py`: kernel names sorted into classes, durations summed per
  name and per class and divided by the number of calls."""
  sys.path.insert(0, EXPERIMENTS)
  import profile_kernels   # pylint: disable=import-outside-toplevel
  assert profile_kernels.kernel_class("vla_penalty_scan_bwd") == "pallas"
  assert profile_kernels.kernel_class("loop_transpose_fusion_3") == "xla"
  assert profile_kernels.kernel_class("sm90_xmma_gemm_bf16bf16_f32") == "gemm"
  assert profile_kernels.kernel_class("Memcpy DtoD") == "copy"
  events = [("vla_state_bwd", 3e6), ("fusion_1", 1e6), ("vla_state_bwd", 1e6), ("fusion_2", 2e6)]
  kernels, classes = profile_kernels.summarise(events, calls=2)
  assert kernels["vla_state_bwd"] == ("pallas", 2.0, 1.0)
  assert kernels["fusion_2"] == ("xla", 1.0, 0.5)
  assert classes == {"pallas": 2.0, "xla": 1.5}
  # Two calls of [a (0-10), gap 5, b (15-20) on one stream, c (16-18) on another]; 100 ns
  # between the calls (the host's, left out).
  events = [("a", 10, 0), ("b", 5, 15), ("c", 2, 16),
            ("a", 10, 120), ("b", 5, 135), ("c", 2, 136)]
  idle, top = profile_kernels.idle_gaps(events, calls=2)
  assert idle == 5 / 1e6 and top == [(5 / 1e6, "a", "b")]


def test_profile_kernels_smoke(tmp_path):
  """The trace is read back end to end (on CPU the host plane stands in for the GPU's)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(EXPERIMENTS, "profile_kernels.py"),
                         "--out", str(tmp_path), "--Ts", "32", "--tokens", "32", "--dims", "16",
                         "--reps", "1", "--interpret", "--plane", "/host:CPU",
                         "--config", "grad_scan_warps=1", "--hlo"],
                        cwd=EXPERIMENTS, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "profile_kernels.json") as f:
    rows = json.load(f)["rows"]
  assert [r["call"] for r in rows] == ["forward", "gradient"]
  for r in rows:
    assert r["busy_ms"] > 0 and r["wall_ms"] > 0 and r["kernels"] and r["idle_ms"] >= 0, r
    assert r["config"] == "grad_scan_warps=1"
    assert (tmp_path / f"hlo_{r['call']}_d16_T32.txt").read_text().startswith("HloModule")


def test_profile_kernels_config_overrides():
  sys.path.insert(0, EXPERIMENTS)
  import profile_kernels   # pylint: disable=import-outside-toplevel
  assert profile_kernels.parse_config("") == {}
  assert profile_kernels.parse_config("grad_scan_warps=1,prep=scan") == {
      "grad_scan_warps": 1, "prep": "scan"}
  assert profile_kernels.parse_config("refine=False,inverse_tile=32,block_v=None") == {
      "refine": False, "inverse_tile": 32, "block_v": None}
