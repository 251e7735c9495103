"""CPU smoke run of experiments/profile_kernels.py: a trace of the forward and the gradient in Pallas
interpret mode is read back end to end (on the CPU the host plane stands in for the GPU's)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # the slow tier (setup.cfg)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_profile_smoke(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "profile_kernels.py"),
                         "--interpret", "--plane=/host:CPU", "--Ts=32", "--tokens=32",
                         "--dims=16", "--heads=2", "--reps=1", f"--out_dir={tmp_path}",
                         "--name=p"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / "p.json") as f:
    rows = json.load(f)["rows"]
  assert [r["call"] for r in rows] == ["forward", "gradient"]
  for r in rows:
    assert r["busy_ms"] > 0 and r["wall_ms"] > 0 and r["kernels"] and r["idle_ms"] >= 0, r
