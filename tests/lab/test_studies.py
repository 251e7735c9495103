"""lab.studies and experiments/studies.py: every study's jobs build valid configurations and pin
their settings, the baselines plan their 12,000-step jobs from finished sweeps, the parity
study's rates are those the zoology rows chose, a study's files go to its results folder and
back, and the script lists, summarises and exports without training; one parity job (mixed
precision) trains two steps of a tiny model on the CPU, then its table and export read its rows
(the CPU smoke that trains every study's jobs at their sizes is the script's docstring's
command with --override=train.num_steps=4; not run here: minutes a job)."""

import importlib
import json
import pathlib
import re

import pytest

from conftest import run_scripts
from lab import grid, studies
from vla_jax.training import from_config_dict, jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUDY = ROOT / "experiments" / "studies.py"


def _config(job):
  path, _, arg = job.config.partition(":")
  config = importlib.import_module(f"vla_jax.configs.{pathlib.Path(path).stem}").get_config(
      *[arg] if arg else [])
  config.update_from_flattened_dict(job.overrides)
  return config


@pytest.mark.parametrize("study,n_jobs,runs", [("weights_or_data", 5, 25), ("fix", 16, 160),
                                                ("authors", 6, 54), ("baselines", 10, 76),
                                                ("parity", 12, 36)])
def test_every_job_builds_and_pins_its_layer(study, n_jobs, runs):
  jobs = studies.jobs(study)
  assert len(jobs) == n_jobs and len({j.name for j in jobs}) == n_jobs
  assert sum(len(j.seeds) * len(j.rates) for j in jobs) == runs
  for job in jobs:
    assert job.grid == study and job.name.startswith(f"{study}-") and job.seeds
    config = _config(job)
    exp = from_config_dict(config)      # options, task and widths are checked here
    options = exp.model.options
    if exp.model.mixer == "vla":
      pinned = studies.AUTHORS_LAYER if study == "authors" else studies.VLA_DEFAULTS
      for key, value in pinned.items():
        want = dict(studies.FIX_VARIANTS)[job.tag["label"]].get(key, value) if (
            study == "fix") else value
        assert options[key.rsplit(".", 1)[1]] == want, (job.name, key)
    assert exp.train.num_steps == job.tag["steps"]
  if study == "weights_or_data":
    assert [_config(j).train.data_seed for j in jobs] == list(studies.WOD_DATA_SEEDS)
    assert {j.seeds for j in jobs} == {studies.WOD_SEEDS}
  if study == "baselines":
    collapse = [j for j in jobs if "matmul_precision" in j.tag]
    assert [j.tag["matmul_precision"] for j in collapse] == ["default", "highest"]
    assert [j.env for j in collapse] == [(), (("JAX_DEFAULT_MATMUL_PRECISION", "highest"),)]
    for job in collapse:    # the zoology grid's collapsed job, with its gate probed
      options = from_config_dict(_config(job)).model.options
      assert (options["output_gate"], options["expand_v"], options["gate_init"]) == (
          False, 1, "fla")
      assert job.overrides["train.diagnostics_every"] == 100 and job.rates == ("1e-3",)
    assert [j.seeds for j in collapse] == [(0, 1, 2), (2,)]   # one run at the highest
    fla = from_config_dict(_config(jobs[2])).model
    assert (fla.head_dim, fla.num_heads, fla.options["expand_v"]) == (32, 2, 2)
    matched = [from_config_dict(_config(j)).model for j in jobs if "_h64" in j.name]
    assert {(m.head_dim, m.num_heads * 64) for m in matched} == {(64, 64), (64, 128)}
  if study == "parity":   # each (mixer, cell) once per precision, at one rate
    pairs = {}
    for job in jobs:
      exp = from_config_dict(_config(job))
      task, T = dict(exp.task_fields), job.tag["seq_len"]
      assert (exp.model.dtype, exp.model.param_dtype) == (job.tag["precision"], "float32")
      assert (exp.model.d_model, exp.model.num_heads, task["seq_len"], task["n_pairs"]) == (
          128, 4, T, {256: 16, 512: 64}[T])
      assert job.rates == (studies.D128_RATES[(job.tag["label"], T)],)
      if exp.model.mixer == "gated_deltanet":
        assert (exp.model.options["output_gate"], exp.model.options["expand_v"],
                exp.model.options["gate_init"]) == (True, 2, "fla")
      pairs.setdefault((job.tag["label"], T), []).append(job.tag["precision"])
    assert len(pairs) == 6 and set(map(tuple, pairs.values())) == {("float32", "bfloat16")}
  if study == "fix":      # section 9's cells at FIX_RATE (their rows' names), then the grid's
    got = {(j.tag["seq_len"], j.tag["d_model"], j.rates) for j in jobs}
    assert got == {(64, 64, ("3e-3",)), (128, 64, ("3e-3",)), (256, 128, ("1e-2",)),
                   (512, 128, ("3e-3",))}
    assert jobs[0].name == "fix-T64-d64-vla" and jobs[-1].name == "fix-T512-d128-silu_l2_beta"
    big = from_config_dict(_config(jobs[-1]))
    assert (big.model.d_model, big.model.num_heads, dict(big.task_fields)["n_pairs"]) == (
        128, 4, 64)


def _baseline_rows(label, d_model, accuracies, seeds=(0, 1, 2)):
  """Sweep rows of one 4,000-step baseline cell: {rate: validation accuracy}."""
  job = f"baselines-T512-d{d_model}-{label}-s4000"
  return [{"job": job, "grid": "baselines", "label": label, "mixer": "x", "seq_len": 512,
           "d_model": d_model, "steps": 4000, "seed": s, "learning_rate": float(rate),
           "overrides": {},
           "validation": {"mqar": {"accuracy": acc}}, "test": {"mqar": {"accuracy": acc}}}
          for rate, acc in accuracies.items() for s in seeds]


def test_baselines_plan_the_long_job_at_the_rate_chosen_on_validation():
  rows = _baseline_rows("gdn_fla", 64, {"3e-4": 0.2, "1e-3": 0.9, "3e-3": 0.5})
  long = [j for j in studies.jobs("baselines", rows) if "-s12000-" in j.name]
  assert [(j.name, j.rates) for j in long] == [
      ("baselines-T512-d64-gdn_fla-s12000-lr1e-3", ("1e-3",))]
  assert long[0].overrides["train.num_steps"] == 12000 and long[0].tag["steps"] == 12000
  assert long[0].overrides["model.options.gated_deltanet.output_gate"] is True
  partial = _baseline_rows("gdn_fla", 64, {"3e-4": 0.2, "1e-3": 0.9, "3e-3": 0.5}, (0, 1))
  assert not [j for j in studies.jobs("baselines", partial) if "-s12000-" in j.name]
  # Made with an override: planned for a driver with that override only (or any, None).
  smoke = [dict(r, overrides={"train.num_steps": "4"}, steps=4) for r in rows]
  plan = lambda o: [j.name for j in studies.jobs("baselines", smoke, o) if "-s12000-" in j.name]
  assert plan([("train.num_steps", "4")]) == plan(None) == [long[0].name]
  assert plan(()) == []


def test_parity_and_fix_rates_are_those_the_zoology_rows_chose():
  """Each parity rate, and each rate of the fix study's grid cells, is the one the committed
  zoology rows (4,000 steps) chose on validation for its mixer's zoology label (VLA: vla_p1)
  and cell, as RESULTS.md section 5 chooses."""
  rows = [r for f in ("mqar_zoology_h200.jsonl", "zoology_tuned_h200.jsonl")
          for r in jsonl.read_rows(str(ROOT / "results" / "training" / f))]
  chosen = grid.best_rate_table(rows, steps=4000)
  fix_cells = studies.fix_cells()[len(grid.REMEDY_CELLS):]
  assert [c[:4] for c in fix_cells] == list(studies.D128_CELLS)
  for T, _, d_model, _, rate in fix_cells:
    assert grid.rate_name(chosen[(T, d_model, "vla_p1")]["rate"]) == rate, (T, d_model)
  assert {c[:2] for c in studies.D128_CELLS} <= set(grid.ZOOLOGY)
  assert {c[2:] for c in studies.D128_CELLS} <= set(grid.ZOOLOGY_WIDTHS)
  for (label, T), rate in studies.D128_RATES.items():
    cell = (T, 128, studies.PARITY_ZOOLOGY_LABELS[label])
    assert grid.rate_name(chosen[cell]["rate"]) == rate, (label, T)
  assert set(studies.D128_RATES) == {(label, T) for label, *_ in studies.PARITY_MIXERS
                                       for T, *_ in studies.D128_CELLS}


def _fake_workdir(workdir):
  """A weights_or_data workdir with one finished job (data seed 2): rows, metrics, runs."""
  job = studies.jobs("weights_or_data")[2]
  runs = [{"seed": s, "learning_rate": 3e-3, "test": {"mqar": {"accuracy": a}},
           "train_loss": 0.1} for s, a in zip(studies.WOD_SEEDS, (1.0, 0.25, 1.0, 1.0, 0.3))]
  metrics = [{"step": 0, "diagnostics": {"layer0.key_cos_mean": [0.99] * 5,
                                         "layer0.param.q_proj": [1.0] * 5}},
             {"step": 50, "loss": [1.0] * 5, "accuracy": [0.6, 0.2, 0.3, 0.3, 0.3]},
             {"step": 100, "loss": [1.0] * 5, "accuracy": [0.9, 0.2, 0.7, 0.3, 0.3]},
             {"step": 100, "diagnostics": {"layer0.key_cos_mean": [0.123456789] * 5,
                                           "layer0.param.q_proj": [1.0] * 5}}]
  run = workdir / "runs" / job.name
  run.mkdir(parents=True)
  jsonl.write_rows(str(run / "metrics.jsonl"), metrics)
  jsonl.write_rows(str(run / "sweep_results.jsonl"), runs)
  rows = [{**r, **job.tag, "job": job.name, "overrides": {}, "mixer": "vla"} for r in runs]
  jsonl.write_rows(str(workdir / "weights_or_data.jsonl"), rows)
  return job, rows, metrics, runs


def test_a_study_goes_to_its_results_folder_and_back(tmp_path):
  job, rows, metrics, runs = _fake_workdir(tmp_path / "work")
  got = studies.collect(str(tmp_path / "work"), "weights_or_data")
  assert got.rows == rows and got.files == {"T64-d64-data2": (metrics, runs)}
  assert studies.export(str(tmp_path / "work"), "weights_or_data", str(tmp_path / "out")) == [
      "T64-d64-data2"]
  back = studies.load(str(tmp_path / "out"), "weights_or_data")
  assert back.rows == rows
  slim_metrics, slim_runs = back.files["T64-d64-data2"]
  assert slim_runs == runs
  assert slim_metrics[-1] == {"step": 100, "diagnostics": {"layer0.key_cos_mean": [0.1235] * 5}}
  # Another machine's job already in the folder stays; this workdir's job is replaced.
  other = {**rows[0], "job": "weights_or_data-T64-d64-data4"}
  jsonl.write_rows(str(tmp_path / "out" / "rows.jsonl"), [other, {**rows[1], "seed": 99}])
  studies.export(str(tmp_path / "work"), "weights_or_data", str(tmp_path / "out"))
  assert studies.load(str(tmp_path / "out"), "weights_or_data").rows == [other] + rows
  assert studies.load(str(tmp_path / "nowhere"), "fix") == studies.StudyData("fix", [], {})
  with pytest.raises(ValueError, match="study must be one of"):
    studies.jobs("bogus")


def test_the_script_lists_summarises_and_exports(tmp_path):
  _fake_workdir(tmp_path / "work")
  rows = _baseline_rows("linear_h64", 128, {"1e-3": 0.5, "3e-3": 0.7, "1e-2": 0.6})
  (tmp_path / "base").mkdir()
  jsonl.write_rows(str(tmp_path / "base" / "baselines.jsonl"), rows)
  listing, base, summary, export = run_scripts(
      [STUDY, "--study=fix", f"--workdir={tmp_path / 'empty'}", "--list"],
      [STUDY, "--study=baselines", f"--workdir={tmp_path / 'base'}", "--list"],
      [STUDY, "--study=weights_or_data", f"--workdir={tmp_path / 'work'}", "--summary"],
      [STUDY, "--study=weights_or_data", f"--workdir={tmp_path / 'work'}",
       f"--export={tmp_path / 'out'}"])
  lines = listing.stdout.strip().splitlines()
  assert lines[0] == ("todo fix-T64-d64-vla rates 3e-3 num_steps=4000 "
                      "seeds=0,1,2,3,4,5,6,7,8,9")
  assert "todo fix-T512-d128-silu_l2_beta rates 3e-3 num_steps=4000 seeds=0,1,2,3,4,5,6,7,8,9" \
      in lines
  assert lines[-1] == "16 jobs (16 to do), 160 runs, 640,000 run-steps"
  lines = base.stdout.strip().splitlines()
  assert "done baselines-T512-d128-linear_h64-s4000 rates 1e-3,3e-3,1e-2 num_steps=4000 " \
         "seeds=0,1,2" in lines
  assert lines[-2] == ("todo baselines-T512-d128-linear_h64-s12000-lr3e-3 rates 3e-3 "
                       "num_steps=12000 seeds=0,1,2")
  assert lines[1].endswith("JAX_DEFAULT_MATMUL_PRECISION=highest")
  text = summary.stdout
  assert "| 2 | pending | pending | 100 | pending | pending | 0 |" in text   # init seed 2
  assert "| 1 | 2 | 0.250 | never | 0.99 / 0.12 | n/a |" in text
  assert export.stdout.startswith("copied the rows and 1 jobs' files")
  assert json.loads((tmp_path / "out" / "rows.jsonl").read_text().splitlines()[0])["seed"] == 0


# A tiny model on the CPU: the job's config and settings but for the widths, batch and steps.
TINY = ["train.num_steps=2", "train.batch_size=2", "train.eval_examples=2",
        "train.eval_batch_size=2", "train.warmup_steps=1", "model.d_model=16",
        "model.num_heads=2", "model.head_dim=8", "model.mlp_ratio=1"]


@pytest.mark.slow   # the slow tier (setup.cfg): a study's job trained by its script
def test_a_mixed_precision_parity_job_trains_then_reads_in_its_table(tmp_path):
  """The bfloat16 Gated DeltaNet job (configs/mqar_zoology_bf16.py) trains its three seeds two
  steps; its rows say bfloat16 activations and float32 parameters, --summary puts them in the
  bfloat16 column (its float32 pair pending) and --export copies them."""
  work, job = tmp_path / "work", "parity-T256-d128-gdn_fla-bfloat16"
  common = [STUDY, "--study=parity", f"--workdir={work}"]
  ran, summary, export = run_scripts(
      [*common, f"--only={job}", *(f"--override={o}" for o in TINY)],
      [*common, "--summary"], [*common, f"--export={tmp_path / 'out'}"], cwd=ROOT)
  assert ran.returncode == 0, ran.stderr[-3000:]
  assert f"done {job} rates 3e-3 num_steps=2" in ran.stdout, ran.stdout[-2000:]
  rows = jsonl.read_rows(str(work / "parity.jsonl"))
  assert [r["seed"] for r in rows] == [0, 1, 2]
  for r in rows:
    assert (r["job"], r["precision"], r["label"], r["seq_len"]) == (job, "bfloat16", "gdn_fla",
                                                                      256)
    assert r["model"]["dtype"] == "bfloat16" and r["model"]["mixer_options"]["expand_v"] == 2
  assert summary.returncode == 0, summary.stderr[-3000:]
  assert re.search(r"\| GDN-fla \(d_h 32, values 64\) \| 256 \(16\) \| 0\.003 \| pending \| "
                   r"\d\.\d{3} \(\d of 3\) \| - \|", summary.stdout), summary.stdout
  assert "| VLA | 512 (64) | 0.003 | pending | pending | - |" in summary.stdout
  assert export.stdout.startswith("copied the rows and 1 jobs' files"), export.stdout
  assert studies.load(str(tmp_path / "out"), "parity").rows == rows
