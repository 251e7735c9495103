"""CPU smoke runs of the kernel scripts: experiments/bench.py and check_kernels.py write their
rows (tiny shapes, Pallas interpret mode), experiments/report_benchmarks.py turns them into a
report; every script answers --help."""

import json
import os
import subprocess
import sys

import pytest

from conftest import run_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(ROOT, "experiments")


def _run(script, *flags, timeout=600):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, os.path.join(EXPERIMENTS, script), *flags], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)


def _rows(path):
  with open(path) as f:
    lines = [json.loads(line) for line in f if line.strip()]
  return lines[0], lines[1:]


SCRIPTS = ("bench.py", "report_benchmarks.py", "check_kernels.py", "profile_kernels.py")


@pytest.fixture(scope="module")
def helps():
  """Each script's `--help` by name (one process, `run_scripts`)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return dict(zip(SCRIPTS, run_scripts(*([os.path.join(EXPERIMENTS, s), "--help"]
                                         for s in SCRIPTS), env=env, cwd=ROOT, timeout=120)))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(helps, script):
  proc = helps[script]   # absl prints the flags and exits with 1
  assert proc.returncode in (0, 1) and not proc.stderr.strip(), proc.stderr[-2000:]
  assert "--name" in proc.stdout or "--bench_dir" in proc.stdout, proc.stdout[-2000:]


def test_bench_and_check_smoke_then_report(tmp_path):
  bench = tmp_path / "bench"
  proc = _run("bench.py", "--smoke", "--name=smoke", f"--out_dir={bench}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  header, rows = _rows(bench / "smoke.jsonl")
  assert header["kind"] == "header" and header["settings"]["smoke"] and header["jax"]
  ok = {(r["impl"], r["pass"]) for r in rows if r["status"] == "ok"}
  assert ok == {("pallas", "fwd"), ("pallas", "fwd+bwd")}, rows
  assert all(r["ms"] > 0 and r["floor_ms"] > 0 for r in rows if r["status"] == "ok")
  for impl in ("cudnn", "fla_chunk_delta_rule"):
    skipped = [r for r in rows if r["impl"] == impl]
    assert skipped and all(r["status"] == "skipped" for r in skipped), skipped

  proc = _run("check_kernels.py", "--smoke", "--name=check", f"--out_dir={bench}")
  assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
  _, checks = _rows(bench / "check.jsonl")
  assert [r["status"] for r in checks] == ["ok"], checks
  assert checks[0]["u"] == "anisotropic" and checks[0]["precision"] == "HIGHEST"
  assert max(checks[0]["errors"].values()) < 1e-4, checks[0]["errors"]

  md = tmp_path / "B.md"
  proc = _run("report_benchmarks.py", f"--bench_dir={bench}", f"--out={md}",
              f"--plots={tmp_path / 'plots'}", timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  text = md.read_text()
  for needle in ("# Benchmarks", "## Verdict", "### fwd: milliseconds", "smoke run",
                 "## Correctness against float64", "anisotropic", "## Rows not measured"):
    assert needle in text, needle
