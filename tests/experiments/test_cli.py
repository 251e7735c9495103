"""Smoke runs of the experiment scripts, as a user runs them (`python experiments/X.py`, against
the installed package): each prints its help, and a tiny run of each writes what it says.

Every run of this file happens in one process, in order (`runs`: `conftest.run_scripts`, each
script run as `python SCRIPT` runs it, the package imported once); the tests read their
runs' exit status, output and files."""

import json
import pathlib

import pytest

from conftest import run_scripts

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ("grid", "sweep", "mixer_sweep", "report_results", "state_norms",
           "trained_diagnostics", "bench_decode", "bench_impls_cpu")
# The smallest model the configs take: one head of 8, scan form (the cheapest to compile).
TINY_MODEL = ["model.d_model=8", "model.num_heads=1", "model.head_dim=8", "model.mlp_ratio=1",
              "model.impl=scan"]
TINY_TRAIN = ["train.num_steps=2", "train.batch_size=4", "train.warmup_steps=1",
              "train.eval_examples=4", "train.eval_batch_size=4", "train.eval_every=0",
              "train.checkpoint_every=0"]


def config_flags(*overrides):
  return [f"--config.{o}" for o in TINY_MODEL + TINY_TRAIN + list(overrides)]


def test_the_scripts_are_absl_mains_over_the_installed_package():
  """No sys.path edits, no script imported by another, absl flags parsed by
  `lab.cli` (one-line errors)."""
  names = {p.stem for p in (ROOT / "experiments").glob("*.py")}
  for script in SCRIPTS + ("train", "evaluate"):
    text = (ROOT / "experiments" / f"{script}.py").read_text()
    assert "sys.path" not in text and "argparse" not in text, script
    assert "app.run(main, flags_parser=cli.parse_flags)" in text, script
    imported = {line.split()[1].split(".")[0] for line in text.splitlines()
                if line.lstrip().startswith(("import ", "from "))}
    assert not imported & names, (script, imported & names)


MISTAKE = ["--workdir=x", "--grids=capcity"]
# sweep.py's flags out of range: the message names the flag and what it takes.
SWEEP_MISTAKES = (
    (["--seeds=0,-1"], "--seeds must be a comma list of integers in [0, 2**63); got 0,-1"),
    (["--learning_rates=1e-3,0"],
     "--learning_rates must be a comma list of positive finite numbers; got 1e-3,0"),
    (["--learning_rates=nan"],
     "--learning_rates must be a comma list of positive finite numbers; got nan"),
    (["--stop_after=0"], "sweep.py: flag --stop_after=0: 0 is not a positive integer"))
# Overrides of the grid jobs' tiny runs.
GRID_OVERRIDES = [f"--override={o}" for o in TINY_MODEL + TINY_TRAIN]
ZOOLOGY_JOB = "zoology_tuned-T64-d64-gated_deltanet_slow-s4000-lr1e-3_3e-3"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """({name: subprocess.CompletedProcess} of every script run of this file, {name: folder}
  of their outputs); the runs in the order listed (a second grid call after the first)."""
  d = {name: tmp_path_factory.mktemp(name) for name in (
      "zoology_list", "zoology", "mixer_sweep", "diagnostics", "decode")}
  rows = d["diagnostics"] / "results" / "training"
  rows.mkdir(parents=True)
  (d["diagnostics"] / "results" / "plots").mkdir()
  zoology = ["--grids=zoology_tuned", f"--only={ZOOLOGY_JOB}", "--seeds=0",
             f"--workdir={d['zoology']}", "--per_gpu=1", "--budget_s=300", *GRID_OVERRIDES]
  calls = [(f"help/{s}", s, ["--help"]) for s in SCRIPTS] + [
      ("mistake", "grid", MISTAKE),
      ("grid/zoology_list", "grid", ["--grids=zoology_tuned",
                                     f"--workdir={d['zoology_list']}", "--list"]),
      ("grid/zoology", "grid", zoology),
      ("grid/zoology_again", "grid", zoology),
      ("grid/zoology_list_done", "grid", zoology + ["--list"]),
      ("mixer_sweep", "mixer_sweep", [
          "--config=configs/mqar_demo.py", *config_flags(), "--mixers=softmax",
          "--learning_rates=1e-2", f"--workdir={d['mixer_sweep']}",
          f"--out={d['mixer_sweep'] / 'rows.jsonl'}"]),
      ("trained_diagnostics", "trained_diagnostics", [
          "--config=configs/mqar_long.py:32",
          *config_flags("task.n_pairs=2", "train.learning_rate=1e-2", "model.num_layers=1"),
          "--mixers=vla", "--Ts=40", "--examples=1", f"--workdir={d['diagnostics'] / 'runs'}",
          f"--out={rows / 'trained_diagnostics_cpu.jsonl'}"]),
      ("state_norms", "state_norms", [
          "--max_T=64", "--heads=1", "--head_dim=8", "--examples=2",
          f"--workdir={d['diagnostics'] / 'runs' / 'vla'}",
          f"--out={rows / 'state_norms_cpu.jsonl'}",
          f"--plot={d['diagnostics'] / 'results' / 'plots' / 'state_norms_random.png'}"]),
      ("report_results", "report_results", [f"--results={d['diagnostics'] / 'results'}",
                                            f"--out={d['diagnostics'] / 'RESULTS.md'}"]),
      ("bench_decode", "bench_decode", [
          "--contexts=16,48", "--steps=2", "--repeats=1", "--heads=1", "--head_dim=8",
          "--impl=scan", f"--out={d['decode'] / 'decode.jsonl'}"]),
      ("bench_impls_cpu", "bench_impls_cpu", [
          "--lengths=32", "--impls=scan,chunked", "--repeats=1", "--heads=1", "--dim=16"])]
  calls += [(f"sweep_flag{i}", "sweep", ["--config=configs/mqar_demo.py",
                                         f"--workdir={d['mixer_sweep'] / 'bad'}", *flags])
            for i, (flags, _) in enumerate(SWEEP_MISTAKES)]
  done = run_scripts(*([ROOT / "experiments" / f"{script}.py", *args]
                       for _, script, args in calls), cwd=ROOT)
  return {name: proc for (name, _, _), proc in zip(calls, done)}, d


def ok(proc):
  """The stdout of a run that exited 0 (fails the test otherwise)."""
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return proc.stdout


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
@pytest.mark.parametrize("script", SCRIPTS)
def test_help(runs, script):
  usage = runs[0][f"help/{script}"].stdout + runs[0][f"help/{script}"].stderr
  first_line = (ROOT / "experiments" / f"{script}.py").read_text().split('"""')[1].split("\n")[0]
  assert first_line.strip() in usage and f"experiments/{script}.py:" in usage, usage[-2000:]


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_a_mistake_is_one_line(runs):
  out = runs[0]["mistake"]
  assert out.returncode == 1 and out.stdout == ""
  assert out.stderr.strip().splitlines() == [
      "grid.py: error: grid must be one of ('capacity', 'long', 'copy', 'zoology', 'ablation', "
      "'ablation_demo', 'zoology_tuned', 'seed_remedies'); got 'capcity'"]


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_sweep_checks_its_flags(runs):
  done, folders = runs
  for i, (_, message) in enumerate(SWEEP_MISTAKES):
    out = done[f"sweep_flag{i}"]
    lines = out.stderr.strip().splitlines()   # a flag's line, or usage then the message
    assert out.returncode != 0 and message in (lines[0], lines[-1]), lines[-3:]
    assert "Traceback" not in out.stderr
  assert not (folders["mixer_sweep"] / "bad").exists()


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_grid_lists_runs_then_skips_a_zoology_tuned_job(runs):
  """--list prints the zoology_tuned jobs from the committed zoology rows and runs none; grid.py
  runs sweep.py for one tiny gated_deltanet_slow job (its rows land in <workdir>/<grid>.jsonl
  with its label, steps, gate initialisation and the result-changing overrides); a second
  call finds it done and starts nothing, and --list names it done. (The grids' jobs:
  tests/lab/test_grid.py.)"""
  done, folders = runs
  lines = ok(done["grid/zoology_list"]).strip().splitlines()
  assert lines[-1] == "104 jobs (104 to do), 357 runs, 2,868,000 run-steps"
  assert ("todo zoology_tuned-T512-d128-gated_deltanet-s4000-lr3e-4 rates 3e-4 num_steps=4000 "
          "gate_init=fla") in lines
  assert not list(folders["zoology_list"].iterdir())
  out = ok(done["grid/zoology"])
  assert "1 jobs on 1 slots" in out and "finished 1 (failed 0" in out, out
  rows = [json.loads(line) for line in open(folders["zoology"] / "zoology_tuned.jsonl")]
  assert [(r["job"], r["seed"], r["label"], r["learning_rate"], r["steps"], r["gate_init"],
           r["model"]["mixer_options"]["gate_init"]) for r in rows] == [
      (ZOOLOGY_JOB, 0, "gated_deltanet_slow", lr, 2, "slow", "slow") for lr in (1e-3, 3e-3)]
  assert all(r["n_pairs"] == 4 and r["model"]["mixer_options"]["conv_size"] == 4
             for r in rows)
  assert rows[0]["overrides"]["model.d_model"] == "8"
  assert "train.eval_every" not in rows[0]["overrides"]       # does not change results
  assert "0 jobs on 1 slots" in ok(done["grid/zoology_again"])
  assert ok(done["grid/zoology_list_done"]).splitlines()[0].startswith(f"done {ZOOLOGY_JOB} ")


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_mixer_sweep_writes_a_row_per_run(runs):
  done, folders = runs
  ok(done["mixer_sweep"])
  rows = [json.loads(line) for line in open(folders["mixer_sweep"] / "rows.jsonl")]
  assert [(r["mixer"], r["learning_rate"], r["steps"]) for r in rows] == [("softmax", 1e-2, 2)]
  assert all(0 <= r["accuracy"] <= 1 for r in rows) and rows[0]["task_fields"]["n_pairs"] == 8


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_diagnostics_then_report(runs):
  """trained_diagnostics.py trains a tiny VLA model and measures it at a longer T;
  state_norms.py measures random inputs and that run; report_results.py writes sections 1
  and 2 of a report from these rows (and says the grids have no rows)."""
  done, folders = runs
  results = folders["diagnostics"] / "results"
  ok(done["trained_diagnostics"])
  kinds = [json.loads(line)["kind"]
           for line in open(results / "training" / "trained_diagnostics_cpu.jsonl")]
  assert kinds == ["trained_model", "trained_state_norm", "trained_jacobian"]

  ok(done["state_norms"])
  rows = [json.loads(line) for line in open(results / "training" / "state_norms_cpu.jsonl")]
  assert [r["t"] for r in rows if r["kind"] == "state_norm_random"] == [1, 10, 64]
  assert [r["kind"] for r in rows[3:]] == ["jacobian_random", "trained"]
  assert (results / "plots" / "state_norms_random.png").stat().st_size > 0

  ok(done["report_results"])
  text = (folders["diagnostics"] / "RESULTS.md").read_text()
  assert "| trained MQAR model, T = 40 |" in text
  assert ("<!-- BEGIN GENERATED: capacity -->\nNo rows yet: "
          "`results/training/mqar_capacity_h200.jsonl`.") in text
  tables = results / "tables"
  assert "| VLA-a | 0 | 40 |" in (tables / "memory.md").read_text()
  assert "| trained MQAR model, T 40, layer 0 |" in (tables / "jacobian.md").read_text()
  assert (results / "plots" / "trained_state_norms.png").exists()


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_bench_decode_writes_a_row_per_mixer_and_context(runs):
  """VLA's cache has one size at every context; softmax's KV cache grows with it."""
  done, folders = runs
  ok(done["bench_decode"])
  rows = {(r["mixer"], r["context"]): r
          for r in map(json.loads, open(folders["decode"] / "decode.jsonl"))}
  assert sorted(rows) == [("softmax", 16), ("softmax", 48), ("vla", 16), ("vla", 48)]
  assert all(r["ms_per_token"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
  mib = lambda m, L: rows[(m, L)]["cache_mib_per_seq"] * 2 ** 20
  assert mib("vla", 16) == mib("vla", 48)
  # K and V (bfloat16) and the padding mask (one byte a position)
  assert mib("softmax", 48) - mib("softmax", 16) == 2 * 32 * 8 * 2 + 32


@pytest.mark.slow   # the slow tier (setup.cfg): the scripts' runs
def test_bench_impls_cpu_times_each_impl(runs):
  line = ok(runs[0]["bench_impls_cpu"]).strip().splitlines()[-1].split("|")
  assert line[0].strip() == "32" and all(float(x) > 0 for x in line[1:])
