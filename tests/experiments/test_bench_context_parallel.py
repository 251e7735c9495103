"""CPU smoke run of experiments/bench_context_parallel.py: a header line, then one row per
path with a time and a compiled peak (the forward + backward pass, which runs the forward's
function under jax.grad; the sharded op's gradients: tests/ops/test_context_parallel.py)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # the slow tier (setup.cfg)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_context_parallel_smoke(tmp_path):
  out = tmp_path / "rows.jsonl"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments",
                                                      "bench_context_parallel.py"),
                         f"--out={out}", "--impls=chunked", "--dims=16", "--Ts=64", "--heads=2",
                         "--passes=fwd+bwd", "--warmup=1", "--min_reps=1", "--target_s=0"],
                        env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  header, *rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert header["kind"] == "header" and header["settings"]["Ts"] == [64]
  assert header["settings"]["passes"] == ["fwd+bwd"]
  assert [(r["impl"], r["d"], r["T"], r["pass"], r["path"]) for r in rows] == [
      ("chunked", 16, 64, "fwd+bwd", path) for path in ("plain", "sharded", "segment")]
  for r in rows:
    assert r["status"] == "ok" and r["ms"] > 0 and r["peak_mib"] > 0, r
