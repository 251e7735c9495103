"""CPU smoke runs of the benchmark scripts: experiments/bench.py and check_kernels.py write their
rows (tiny shapes, Pallas interpret mode), experiments/bench_train_speed.py times a tiny
train.py run, experiments/report_benchmarks.py turns them into a report,
experiments/bench_model.py times a tiny model's training step; every script answers --help."""

import json
import os

import pytest

from conftest import run_scripts

pytestmark = pytest.mark.slow   # the slow tier (setup.cfg)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(ROOT, "experiments")


def _rows(path):
  with open(path) as f:
    lines = [json.loads(line) for line in f if line.strip()]
  return lines[0], lines[1:]


SCRIPTS = ("bench.py", "report_benchmarks.py", "check_kernels.py", "profile_kernels.py",
           "bench_train_speed.py")
# check_kernels' smoke run checks the tiny cases with KernelConfig forms named on its command
# line: those the plan does not take at their d = 16 (newton and rows there).
KERNEL_OPTIONS = {"block_factor": "elimination", "penalty_layout": "transposed"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """({script: its `--help`}, the smoke runs of bench.py, check_kernels.py,
  bench_train_speed.py (and its --dry_run) and report_benchmarks.py, their folder): every run
  of this file in one process, in order (`run_scripts`; the report reads the rows)."""
  tmp_path = tmp_path_factory.mktemp("smoke")
  bench, md = tmp_path / "bench", tmp_path / "B.md"
  speed = [os.path.join(EXPERIMENTS, "bench_train_speed.py"), f"--workdir={tmp_path / 'speed'}"]
  *helps, ran, checked, planned, timed, reported, model = run_scripts(
      *([os.path.join(EXPERIMENTS, s), "--help"] for s in SCRIPTS),
      [os.path.join(EXPERIMENTS, "bench.py"), "--smoke", "--name=smoke", f"--out_dir={bench}"],
      [os.path.join(EXPERIMENTS, "check_kernels.py"), "--smoke", "--name=check",
       "--ops=vla,linear_attention", f"--out_dir={bench}", *(f"--{k}={v}" for k, v in
                                                            KERNEL_OPTIONS.items())],
      [*speed, "--dry_run"],
      [*speed, "--smoke", "--settings=long_8192", "--columns=vla",
       f"--out={tmp_path / 'speed.jsonl'}"],
      [os.path.join(EXPERIMENTS, "report_benchmarks.py"), f"--bench_dir={bench}", f"--out={md}",
       f"--plots={tmp_path / 'plots'}", f"--train_speed={tmp_path / 'speed.jsonl'}"],
      [os.path.join(EXPERIMENTS, "bench_model.py"), "--smoke", "--mixers=vla",
       f"--out={tmp_path / 'model.jsonl'}"], cwd=ROOT)
  return (dict(zip(SCRIPTS, helps)), (ran, checked, reported, model, planned, timed),
          tmp_path)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(runs, script):
  proc = runs[0][script]   # absl prints the flags and exits with 1
  assert proc.returncode in (0, 1) and not proc.stderr.strip(), proc.stderr[-2000:]
  assert any(f in proc.stdout for f in ("--name", "--bench_dir", "--workdir")), proc.stdout[-2000:]


def test_bench_and_check_smoke_then_report(runs):
  """The three scripts run in order: the report reads the rows."""
  (ran, checked, reported, *_), tmp_path = runs[1:]
  bench, md = tmp_path / "bench", tmp_path / "B.md"
  assert ran.returncode == 0, ran.stderr[-3000:]
  header, rows = _rows(bench / "smoke.jsonl")
  assert header["kind"] == "header" and header["settings"]["smoke"] and header["jax"]
  ok = {(r["impl"], r["pass"]) for r in rows if r["status"] == "ok"}
  assert ok == {("pallas", "fwd"), ("pallas", "fwd+bwd")}, rows
  assert all(r["ms"] > 0 and r["floor_ms"] > 0 for r in rows if r["status"] == "ok")
  for impl in ("cudnn", "fla_chunk_delta_rule"):
    skipped = [r for r in rows if r["impl"] == impl]
    assert skipped and all(r["status"] == "skipped" for r in skipped), skipped

  assert checked.returncode == 0, checked.stderr[-3000:] + checked.stdout[-2000:]
  _, rows = _rows(bench / "check.jsonl")
  checks = [r for r in rows if r["pass"] == "check"]
  drift = [r for r in rows if r["pass"] == "drift"]
  long = [r for r in rows if r["pass"] == "long"]   # a tiny one: the path runs
  assert [(r["T"], r["status"], r["finite"]) for r in long] == [(64, "ok", True)], long
  assert {k: long[0][k] for k in KERNEL_OPTIONS} == KERNEL_OPTIONS, long
  assert [r["status"] for r in checks] == ["ok", "ok"], checks
  assert [(r["op"], r["packed"]) for r in checks] == [("vla", True), ("linear_attention", False)], \
      checks
  assert checks[0]["beta"] and "dbeta" in checks[0]["errors"]   # a learned write strength
  assert [(r["u"], r["status"]) for r in drift] == [("isotropic", "ok"), ("anisotropic", "ok")]
  assert all(0 < r["errors"]["o"] < 3e-2 and len(r["o_quarters"]) == 4 for r in drift), drift
  assert "| anisotropic |" in checked.stdout
  for row in checks + drift:   # the options the run passed, recorded (VLA's rows)
    if row["op"] == "vla":
      assert {k: row[k] for k in KERNEL_OPTIONS} == KERNEL_OPTIONS, row
  for row in checks:
    assert row["u"] == ("anisotropic" if row["op"] == "vla" else None)
    assert row["precision"] == "HIGHEST"
    assert max(row["errors"].values()) < 1e-4, row["errors"]
  assert set(checks[-1]["errors"]) == {"o", "S", "dq", "dk", "dv"}

  assert reported.returncode == 0, reported.stderr[-3000:]
  text = md.read_text()
  for needle in ("# Benchmarks", "## Verdict", "### fwd: milliseconds", "smoke run",
                 "## Correctness against float64", "anisotropic", "linear_attention",
                 "## Rows not measured"):
    assert needle in text, needle


def test_bench_model_smoke(runs):
  """A tiny VLA model's training step, its layer and its op on the CPU: every row measured,
  fla's skipped without a GPU."""
  (_, _, _, model, *_), tmp_path = runs[1:]
  assert model.returncode == 0, model.stderr[-3000:]
  header, rows = _rows(tmp_path / "model.jsonl")
  assert header["kind"] == "header" and header["layers"] == 2
  assert {r["kind"]: r["status"] for r in rows} == {"step": "ok", "layer": "ok", "op": "ok",
                                                    "fla": "skipped"}, rows
  step = next(r for r in rows if r["kind"] == "step")
  assert step["ms"] > 0 and step["tokens_per_s"] > 0 and step["peak_gib"] > 0
  assert step["impl"] == "chunked"   # "auto" resolved on this CPU
  assert next(r for r in rows if r["kind"] == "op")["impl"] == "chunked"


def test_train_speed_smoke_then_report(runs):
  """--dry_run prints the 15 runs' commands and the estimate; the smoke times VLA at the long
  setting (T = 64, a tiny bfloat16 model, 4 steps) through train.py: a row with the settings
  it ran, its steps/s and the impl ("auto" as its layer logged it on this CPU); the report's
  block reads it. (Every column runs train.py the same way; softmax's impl, which no log
  gives: tests/lab/benchmarks/test_report.py.)"""
  (*_, reported, _, planned, timed), tmp_path = runs[1:]
  assert planned.returncode == 0, planned.stderr[-3000:]
  lines = planned.stdout.strip().splitlines()
  assert len(lines) == 16 and lines[-1].startswith("15 runs, about "), lines[-1]
  assert lines[0].startswith("python experiments/train.py --config=configs/mqar_zoology.py:512 "
                             "--workdir=OUT/runs/zoology_512-vla --verbosity=0 ")
  assert timed.returncode == 0, timed.stderr[-3000:] + timed.stdout[-2000:]
  header, rows = _rows(tmp_path / "speed.jsonl")
  assert header["kind"] == "header" and header["smoke"] and header["device"] == "cpu"
  assert header["jax"] and header["git_commit"]
  assert [(r["setting"], r["column"], r["status"], r["impl"]) for r in rows] == [
      ("long_8192", "vla", "ok", "chunked")], rows
  for r in rows:
    assert (r["T"], r["d_model"], r["dtype"], r["batch"], r["steps"], r["window"]) == (
        64, 16, "bfloat16", 2, 4, 2)
    assert r["steps_per_s"] > 0 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
    assert r["device"] == "cpu" and r["git_commit"] == header["git_commit"]
    assert (tmp_path / "speed" / "logs" / f"long_8192-{r['column']}.log").exists()
  assert reported.returncode == 0, reported.stderr[-3000:]
  text = (tmp_path / "B.md").read_text()
  assert "## Training speed with the library defaults" in text
  assert "(a CPU smoke run: tiny model, T = 64)" in text
  assert ("| `configs/mqar_long.py:64` | 64 | d_model 16, 2 x 8, bfloat16 | 2 | last 2 of 4 | "
          in text), text
