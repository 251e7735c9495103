"""CPU smoke run of experiments/bench_context_parallel.py: it writes one row per pass with
both times and both compiled memories."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_context_parallel_smoke(tmp_path):
  out = tmp_path / "rows.jsonl"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments",
                                                      "bench_context_parallel.py"),
                         f"--out={out}", "--impls=chunked", "--dims=16", "--Ts=64", "--heads=2",
                         "--repeats=1", "--warmup=1"],
                        env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["impl"], r["d"], r["T"], r["pass"]) for r in rows] == [
      ("chunked", 16, 64, "fwd"), ("chunked", 16, 64, "fwd+bwd")]
  for r in rows:
    assert r["plain_ms"] > 0 and r["sharded_ms"] > 0
    assert abs(r["ratio"] - r["sharded_ms"] / r["plain_ms"]) < 1e-12
    assert r["sharded_temp_bytes"] > 0 and r["plain_total_bytes"] > r["plain_temp_bytes"]
