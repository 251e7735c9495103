"""The grids' jobs and scheduler (`lab.grid`), and VLA training with the Pallas
kernels (interpret mode here), which `--vla_impl=pallas` selects on a GPU."""

import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from lab import grid
from vla_jax.configs import base
from vla_jax.training import from_config_dict, jsonl
from vla_jax.training.sweep import SweepTrainer


def _row(T, d_model, label, rate, seed, test, validation=None, steps=4000):
  """A zoology sweep row with the fields `grid.best_rate_table` reads."""
  score = lambda acc: {"mqar": {"accuracy": acc, "exact_match": acc, "targets": 100}}
  return {"seq_len": T, "d_model": d_model, "label": label, "mixer": label.split("_slow")[0],
          "learning_rate": rate, "seed": seed, "steps": steps, "test": score(test),
          "validation": score(test if validation is None else validation)}


def _cell(T, d_model, label, accuracies, steps=4000):
  """Rows of one cell: accuracies {rate: [test accuracy per seed]}."""
  return [_row(T, d_model, label, rate, seed, acc, steps=steps)
          for rate, accs in accuracies.items() for seed, acc in enumerate(accs)]


# A small zoology grid: linear at T = 512 d_model 64 best at its highest rate, Gated DeltaNet
# at its lowest, both unsolved; softmax solved at its highest rate; DeltaNet best inside a
# sweep of three rates.
ROWS = (_cell(512, 64, "linear", {1e-3: [0.0, 0.0, 0.01], 3e-3: [0.01, 0.02, 0.0]})
        + _cell(512, 64, "gated_deltanet", {1e-3: [0.3, 0.2, 0.1], 3e-3: [0.0, 0.0, 0.0]})
        + _cell(512, 128, "softmax", {1e-3: [0.9, 0.9, 0.9], 3e-3: [1.0, 1.0, 0.995]})
        + _cell(64, 64, "deltanet", {3e-4: [0.1] * 3, 1e-3: [0.5] * 3, 3e-3: [0.2] * 3}))


def test_every_grid_has_its_jobs():
  counts = {g: len(grid.grid_jobs(g, zoology_rows=ROWS)) for g in grid.GRIDS}
  assert counts == {"capacity": 8 * 7, "long": 7 * 7, "copy": 7, "zoology": 12 * 7,
                    "ablation": 8, "ablation_demo": 8, "zoology_tuned": 3 + 3 * 3 + 1,
                    "seed_remedies": 2 * 7}
  names = [j.name for g in grid.GRIDS for j in grid.grid_jobs(g, zoology_rows=ROWS)]
  assert len(names) == len(set(names))
  with pytest.raises(ValueError, match="extends the zoology grid's rows"):
    grid.grid_jobs("zoology_tuned")
  zoo = grid.grid_jobs("zoology", zoology_steps=10)[-1]
  assert zoo.name == "zoology-T512-d256-vla_p1" and zoo.tag == {
      "grid": "zoology", "seq_len": 512, "n_pairs": 64, "d_model": 256, "label": "vla_p1"}
  assert zoo.overrides["train.num_steps"] == 10 and zoo.overrides["model.num_heads"] == 8
  with pytest.raises(ValueError, match="grid must be one of"):
    grid.grid_jobs("capcity")


def test_vla_impl_rates_and_only_select_jobs():
  plain = grid.select_jobs(["long"], long_Ts=[1024])
  jobs = grid.select_jobs(["long"], long_Ts=[1024], vla_impl="pallas", rates=["1e-3"])
  assert len(jobs) == len(plain) == len(grid.MIXERS)
  for j, p in zip(jobs, plain):
    assert j.name == p.name and j.rates == ("1e-3",)
    if j.overrides["model.mixer"] == "vla":
      assert j.overrides == {**p.overrides, "model.impl": "pallas"}
    else:
      assert j.overrides == p.overrides and "model.impl" not in j.overrides
  only = grid.select_jobs(["capacity", "long"], long_Ts=[64], only=["long-T64-vla", "n8-soft"])
  assert [j.name for j in only] == ["long-T64-vla", "long-T64-vla_p1", "capacity-n8-softmax",
                                    "capacity-n8-softmax_conv"]


def test_vla_trains_the_same_with_pallas():
  """One vmapped sweep step (two seeds) with impl="pallas_interpret" and "scan": one
  layer, one head, two chunks."""
  def losses(impl):
    c = base.get_base_config()
    c.task.update({"vocab_size": 32, "seq_len": 32, "n_pairs": 4, "form": "zoology"})
    c.model.update({"d_model": 16, "num_heads": 1, "head_dim": 16, "num_layers": 1,
                    "mixer": "vla", "impl": impl, "chunk_size": 16})
    c.train.update({"batch_size": 4, "num_steps": 2, "eval_examples": 8, "eval_batch_size": 4})
    trainer = SweepTrainer(from_config_dict(c), [0, 1], [1e-3])
    _, metrics = trainer.train_step(trainer.init_state, *trainer.batch(0))
    return np.asarray(metrics["loss"])
  np.testing.assert_allclose(losses("pallas_interpret"), losses("scan"), rtol=2e-5)


@pytest.mark.slow   # the lab's harness (README: the slow tier)
def test_stop_sends_sigterm_then_kills_what_is_left(tmp_path):
  """grid.stop: a job that handles SIGTERM exits by itself (with its own exit code); one that
  ignores it is killed once wait_s has passed."""
  ready = tmp_path / "ready"
  handles = ("import signal, sys, time, pathlib\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
             f"pathlib.Path({str(ready)!r} + '-handles').touch()\n"
             "time.sleep(60)\n")
  ignores = ("import signal, time, pathlib\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             f"pathlib.Path({str(ready)!r} + '-ignores').touch()\n"
             "time.sleep(60)\n")
  procs = [subprocess.Popen([sys.executable, "-c", code]) for code in (handles, ignores)]
  for name in ("-handles", "-ignores"):  # both handlers installed before the signal
    for _ in range(200):
      if pathlib.Path(str(ready) + name).exists():
        break
      time.sleep(0.05)
  grid.stop(procs, wait_s=2.0)
  assert procs[0].returncode == 3 and procs[1].returncode == -9


def test_a_job_is_done_with_every_run_at_the_same_overrides():
  """Done once its rows cover every seed and rate made with the call's result-changing
  overrides (train.checkpoint_every and train.diagnostics_every are not); the sweep command
  records them in its tag."""
  jobs = grid.select_jobs(["zoology"], rates=["1e-3"])
  job, seeds = jobs[0], [0, 1]
  free = [("train.checkpoint_every", "500"), ("train.diagnostics_every", "50")]
  rows = [{"job": job.name, "seed": s, "learning_rate": 1e-3} for s in seeds]
  assert grid.is_done(job, rows, seeds, free) and not grid.is_done(job, rows[:1], seeds, free)
  assert not grid.is_done(jobs[1], rows, seeds, free)
  steps = [("train.num_steps", "10")]
  assert not grid.is_done(job, rows, seeds, steps)   # rows made without that override
  marked = [dict(r, overrides={"train.num_steps": "10"}) for r in rows]
  assert grid.is_done(job, marked, seeds, steps) and not grid.is_done(job, marked, seeds, free)
  cmd = grid.sweep_command(job, sweep_script="sweep.py", root="/repo", workdir="/out",
                           seeds=seeds, overrides=steps + free)
  tag = json.loads(next(c for c in cmd if c.startswith("--tag=")).split("=", 1)[1])
  assert tag["overrides"] == {"train.num_steps": "10"} and tag["job"] == job.name
  assert "--out=/out/zoology.jsonl" in cmd and "--config=/repo/configs/mqar_zoology.py:64" in cmd
  assert cmd[-3:] == ["--config.train.num_steps=10", "--config.train.checkpoint_every=500",
                      "--config.train.diagnostics_every=50"]


def test_best_rate_table_takes_the_best_mean_over_seeds():
  rows = (_cell(64, 64, "vla", {1e-3: [0.6, 0.6, 0.6], 3e-3: [1.0, 0.2, 0.2]})   # mean, not max
          + _cell(64, 64, "vla", {1e-2: [0.9] * 3}, steps=12000)
          + [_row(64, 128, "linear", 1e-3, 0, 0.9, validation=0.1),
             _row(64, 128, "linear", 3e-3, 0, 0.5, validation=0.8)])
  table = grid.best_rate_table(rows, steps=4000)
  assert table[(64, 64, "vla")] == {"rate": 1e-3, "mean": pytest.approx(0.6),
                                    "rates": (1e-3, 3e-3)}
  assert table[(64, 128, "linear")] == {"rate": 3e-3, "mean": 0.5,   # by validation (default),
                                        "rates": (1e-3, 3e-3)}     # the mean is test's
  by_test = grid.best_rate_table(rows, steps=4000, metric="test")
  assert by_test[(64, 128, "linear")]["rate"] == 1e-3                # ... or by test
  assert grid.best_rate_table(rows, steps=12000) == {
      (64, 64, "vla"): {"rate": 1e-2, "mean": pytest.approx(0.9), "rates": (1e-2,)}}
  assert len(grid.best_rate_table(rows)) == 2            # every step count together


def test_edge_cells_are_unsolved_cells_at_an_edge_of_their_sweep():
  rows = ROWS + (_cell(64, 64, "linear", {3e-3: [0.1] * 3})                 # one rate: no edge
                 + _cell(64, 64, "vla", {1e-2: [0.2] * 3, 3e-2: [0.3] * 3})
                 + _cell(64, 128, "vla", {1e-5: [0.3] * 3, 3e-5: [0.2] * 3}))
  edges = grid.edge_cells(grid.best_rate_table(rows))
  assert edges == {
      (512, 64, "linear"): {"side": "highest", "rate": 3e-3, "mean": pytest.approx(0.01),
                            "extend": ("1e-2",)},
      (512, 64, "gated_deltanet"): {"side": "lowest", "rate": 1e-3, "mean": pytest.approx(0.2),
                                    "extend": ("3e-4",)},
      (64, 64, "vla"): {"side": "highest", "rate": 3e-2, "mean": pytest.approx(0.3),
                        "extend": ("1e-1",)},
      (64, 128, "vla"): {"side": "lowest", "rate": 1e-5, "mean": pytest.approx(0.3),
                         "extend": ()}}                                    # the grid's end
  assert set(grid.edge_cells(grid.best_rate_table(rows), below=0.25)) == {
      (512, 64, "linear"), (512, 64, "gated_deltanet")}
  assert [grid.rate_name(x) for x in (0.003, 3e-4, 1e-2, 2e-3)] == ["3e-3", "3e-4", "1e-2",
                                                                    "0.002"]


def test_the_committed_zoology_rows_have_32_edge_cells():
  """RESULTS.md's count: of the 34 cells below 0.99, 30 chose the highest rate, 2 the lowest."""
  path = pathlib.Path(__file__).resolve().parents[2] / "results/training/mqar_zoology_h200.jsonl"
  table = grid.best_rate_table(jsonl.read_rows(str(path)))
  edges = grid.edge_cells(table)
  assert sum(c["mean"] < 0.99 for c in table.values()) == 34
  assert sorted(c["side"] for c in edges.values()).count("highest") == 30
  assert {k for k, c in edges.items() if c["side"] == "lowest"} == {
      (512, 64, "gated_deltanet"), (512, 128, "gated_deltanet")}
  assert all(c["extend"] == {"highest": ("1e-2",), "lowest": ("3e-4",)}[c["side"]]
             for c in edges.values())
  jobs = grid.grid_jobs("zoology_tuned", zoology_rows=jsonl.read_rows(str(path)))
  solved_at_512 = sum(c["mean"] >= 0.99 for (T, _, _), c in table.items() if T == 512)
  assert solved_at_512 == 6
  # 4,000 steps: 32 edge cells, 12 gated_deltanet_slow settings; 12,000 steps at T = 512: one
  # job per cell (8 labels x 3 widths) and rate, 1 rate at the 6 solved cells and 3 at the
  # other 18.
  assert len(jobs) == 32 + 12 + 6 + 3 * 18
  assert {len(j.rates) for j in jobs if "-s12000-" in j.name} == {1}
  assert sum(len(j.rates) * int(j.overrides["train.num_steps"]) for j in jobs) * 3 == 2_868_000


def test_zoology_tuned_jobs():
  """Past the edges at 4,000 steps, gated_deltanet_slow from Gated DeltaNet's sweep, then
  every label at T = 512 with 12,000 steps, a job per cell: an unsolved cell at its chosen
  rate and the planned rates either side, a solved one at its chosen rate; names apart from
  the zoology grid's."""
  jobs = grid.grid_jobs("zoology_tuned", zoology_rows=ROWS)
  assert [(j.name, j.rates) for j in jobs] == [
      ("zoology_tuned-T512-d64-linear-s4000-lr1e-2", ("1e-2",)),
      ("zoology_tuned-T512-d64-gated_deltanet-s4000-lr3e-4", ("3e-4",)),
      ("zoology_tuned-T512-d64-gated_deltanet_slow-s4000-lr3e-4_1e-3_3e-3",
       ("3e-4", "1e-3", "3e-3"))] + [
      (f"zoology_tuned-T512-d64-{label}-s12000-lr{rate}", (rate,))
      for label, rates in (("linear", ("1e-3", "3e-3", "1e-2")),
                           ("gated_deltanet", ("3e-4", "1e-3", "3e-3")),
                           ("gated_deltanet_slow", ("3e-4", "1e-3", "3e-3")))
      for rate in rates] + [("zoology_tuned-T512-d128-softmax-s12000-lr3e-3", ("3e-3",))]
  zoology = {j.name for j in grid.grid_jobs("zoology")}
  assert not zoology & {j.name for j in jobs}
  assert all(not j.name.startswith("zoology-") for j in jobs)
  slow = jobs[2]
  assert slow.grid == "zoology_tuned" and slow.config == "configs/mqar_zoology.py:512"
  assert slow.overrides == {"model.mixer": "gated_deltanet", "task.n_pairs": 64,
                            "model.d_model": 64, "model.num_heads": 2, "train.num_steps": 4000,
                            "model.options.gated_deltanet.gate_init": "slow",
                            **grid.EARLIER_GDN}
  assert slow.tag == {"grid": "zoology_tuned", "seq_len": 512, "n_pairs": 64, "d_model": 64,
                      "label": "gated_deltanet_slow", "steps": 4000, "gate_init": "slow"}
  assert jobs[6].overrides["model.options.gated_deltanet.gate_init"] == "fla"
  assert jobs[6].tag["gate_init"] == "fla" and jobs[6].tag["steps"] == 12000
  assert jobs[6].overrides["train.num_steps"] == 12000
  assert "gate_init" not in jobs[3].tag and jobs[-1].overrides["model.num_heads"] == 4
  cmd = grid.sweep_command(slow, sweep_script="sweep.py", root="/repo", workdir="/out",
                           seeds=[0, 1, 2])
  assert "--out=/out/zoology_tuned.jsonl" in cmd and "--learning_rates=3e-4,1e-3,3e-3" in cmd
  assert "--config.model.options.gated_deltanet.gate_init=slow" in cmd
  assert "--config.train.num_steps=4000" in cmd
  assert [j.name for j in grid.grid_jobs("zoology_tuned", zoology_rows=ROWS,
                                         tuned_steps=6000) if "-s6000-" in j.name] == [
      j.name.replace("-s12000-", "-s6000-") for j in jobs[3:]]
  with pytest.raises(ValueError, match="picks each job's rates"):
    grid.select_jobs(["zoology_tuned"], rates=["1e-3"], zoology_rows=ROWS)


def test_zoology_tuned_goes_on_past_the_new_edges_with_its_own_rows():
  """A second round from the first round's rows: linear still best at its new highest rate
  gets the next one, at both step counts, under new names; a cell now solved (the slow gate)
  trains 12,000 steps at its chosen rate only; the finished jobs are gone."""
  first = grid.grid_jobs("zoology_tuned", zoology_rows=ROWS)
  tuned = (_cell(512, 64, "linear", {1e-2: [0.3] * 3})
           + _cell(512, 64, "gated_deltanet", {3e-4: [0.1] * 3})          # 1e-3 stays best
           + _cell(512, 64, "gated_deltanet_slow", {3e-4: [0.0] * 3, 1e-3: [0.2] * 3,
                                                    3e-3: [0.995] * 3})     # solved
           + _cell(512, 64, "linear", {1e-3: [0.1] * 3, 3e-3: [0.2] * 3, 1e-2: [0.4] * 3},
                   steps=12000))
  second = grid.grid_jobs("zoology_tuned", zoology_rows=ROWS + tuned)
  assert [(j.name, j.rates) for j in second] == [
      ("zoology_tuned-T512-d64-linear-s4000-lr3e-2", ("3e-2",)),
      ("zoology_tuned-T512-d64-linear-s12000-lr3e-2", ("3e-2",)),
      ("zoology_tuned-T512-d64-gated_deltanet-s12000-lr3e-4", ("3e-4",)),
      ("zoology_tuned-T512-d64-gated_deltanet-s12000-lr1e-3", ("1e-3",)),
      ("zoology_tuned-T512-d64-gated_deltanet-s12000-lr3e-3", ("3e-3",)),
      ("zoology_tuned-T512-d64-gated_deltanet_slow-s12000-lr3e-3", ("3e-3",)),
      ("zoology_tuned-T512-d128-softmax-s12000-lr3e-3", ("3e-3",))]
  # Unchanged cells keep their job names; the slow gate, now solved, keeps only its chosen
  # rate's job (one that the first round planned too, beside the rates either side).
  names = {j.name for j in first}
  assert {j.name for j in second[2:5]} | {second[6].name} <= names
  assert second[5].name in names


def test_zoology_tuned_goes_past_a_12000_step_edge_once_its_rates_have_run():
  """A 12,000-step cell below 0.99 whose best rate is an edge of its planned rates, all run,
  gets the rate past that edge; one with planned rates still to run gets those only; one
  solved at an edge gets nothing more."""
  long_jobs = lambda rows: [j.name for j in grid.grid_jobs("zoology_tuned", zoology_rows=rows)
                            if ("-s12000-" in j.name and "-d64-gated_deltanet-" in j.name)
                            or "-d128-softmax-s12000" in j.name]
  edge = _cell(512, 64, "gated_deltanet", {3e-4: [0.5] * 3, 1e-3: [0.3] * 3, 3e-3: [0.1] * 3},
               steps=12000)
  assert long_jobs(ROWS + edge) == ["zoology_tuned-T512-d64-gated_deltanet-s12000-lr1e-4",
                                    "zoology_tuned-T512-d128-softmax-s12000-lr3e-3"]
  assert long_jobs(ROWS + edge[:6]) == ["zoology_tuned-T512-d64-gated_deltanet-s12000-lr3e-3",
                                        "zoology_tuned-T512-d128-softmax-s12000-lr3e-3"]
  solved = _cell(512, 64, "gated_deltanet", {3e-4: [1.0] * 3, 1e-3: [0.3] * 3, 3e-3: [0.1] * 3},
                 steps=12000) + _cell(512, 128, "softmax", {3e-3: [1.0] * 3}, steps=12000)
  assert long_jobs(ROWS + solved) == []


def test_seed_remedies_jobs_carry_their_seeds_and_diagnostics():
  """Two zoology cells x seven VLA variants at rate 3e-3, seeds 0-4 carried by the jobs (the
  driver's seeds only where given), diagnostics every 50 steps, rows labelled by variant."""
  jobs = grid.grid_jobs("seed_remedies")
  variants = ["defaults", "penalty-1", "lam0-0.1", "lam0-10", "u-identity", "warmup-1000",
              "readout-additive"]
  assert [j.name for j in jobs] == [f"seed_remedies-T{T}-d64-{v}" for T in (64, 128)
                                    for v in variants]
  assert {(j.grid, j.rates, j.seeds) for j in jobs} == {
      ("seed_remedies", ("3e-3",), (0, 1, 2, 3, 4))}
  extra = {"defaults": {}, "penalty-1": {"model.options.vla.penalty_scale": 1.0},
           "lam0-0.1": {"model.options.vla.lam0": 0.1},
           "lam0-10": {"model.options.vla.lam0": 10.0},
           "u-identity": {"model.options.vla.u_init": "identity"},
           "warmup-1000": {"train.warmup_steps": 1000},
           "readout-additive": {"model.options.vla.readout": "additive"}}
  for job in jobs:
    T, variant = job.tag["seq_len"], job.tag["label"]
    n = {64: 4, 128: 8}[T]
    assert job.config == f"configs/mqar_zoology.py:{T}"
    assert job.overrides == {"model.mixer": "vla", "task.n_pairs": n, "model.d_model": 64,
                             "model.num_heads": 2, "train.num_steps": 4000,
                             "train.diagnostics_every": 50,   # the authors' penalty scale
                             "model.options.vla.penalty_scale": "inv_sqrt_dh",
                             "model.options.vla.qk_map": "elu1", **extra[variant]}
    assert job.tag == {"grid": "seed_remedies", "seq_len": T, "n_pairs": n, "d_model": 64,
                       "label": variant, "steps": 4000}
  base_options = base.mixer_options()["vla"]
  assert all(k.rsplit(".", 1)[-1] in base_options or k == "train.warmup_steps"
             for e in extra.values() for k in e)   # each override names a real option
  from vla_jax.layers.vla import U_INITS  # pylint: disable=import-outside-toplevel
  assert "identity" in U_INITS

  job = jobs[4]
  cmd = grid.sweep_command(job, sweep_script="sweep.py", root="/repo", workdir="/out",
                           seeds=[0, 1, 2])
  assert "--seeds=0,1,2,3,4" in cmd and "--learning_rates=3e-3" in cmd
  assert "--out=/out/seed_remedies.jsonl" in cmd and "--workdir=/out/runs/" + job.name in cmd
  assert "--config.train.diagnostics_every=50" in cmd
  assert "--config.model.options.vla.u_init=identity" in cmd
  rows = [{"job": job.name, "seed": s, "learning_rate": 3e-3} for s in range(3)]
  assert not grid.is_done(job, rows, [0, 1, 2])      # the job's own five seeds
  assert grid.is_done(job, rows + [dict(rows[0], seed=s) for s in (3, 4)], [0])
  picked = grid.select_jobs(["seed_remedies"], seeds=[7], vla_impl="pallas", only=["T128"])
  assert len(picked) == 7 and {j.seeds for j in picked} == {(7,)}
  assert {j.overrides["model.impl"] for j in picked} == {"pallas"}
  text = grid.listing(jobs, {}, [0, 1, 2])
  assert text.splitlines()[0] == ("todo seed_remedies-T64-d64-defaults rates 3e-3 "
                                  "num_steps=4000 seeds=0,1,2,3,4")
  assert text.endswith("14 jobs (14 to do), 70 runs, 280,000 run-steps")



def test_vla_rows_keep_the_authors_penalty_scale_and_vla_p1_the_default():
  """The layer's default penalty scale is 1; the rows labelled vla, and the ablation and
  seed_remedies variants but the penalty ones, were made with 1 / sqrt(d_h) and keep it by name
  ("inv_sqrt_dh"); every VLA job keeps the authors' ELU + 1 it was made with (the default is
  "silu_l2" since); every job's config has the d_h the report assumes (HEAD_DIM)."""
  import importlib  # pylint: disable=import-outside-toplevel
  from vla_jax.layers.vla import (  # pylint: disable=import-outside-toplevel
      DEFAULT_PENALTY_SCALE, DEFAULT_QK_MAP)
  assert DEFAULT_PENALTY_SCALE == 1.0 == base.mixer_options()["vla"]["penalty_scale"]
  assert DEFAULT_QK_MAP == "silu_l2" == base.mixer_options()["vla"]["qk_map"]
  assert grid.AUTHORS_PENALTY_SCALE == "inv_sqrt_dh"
  scales, qk_maps = {}, set()
  for g in grid.GRIDS:
    for job in grid.grid_jobs(g, zoology_rows=ROWS):
      if job.overrides["model.mixer"] != "vla":
        continue
      path, _, arg = job.config.partition(":")
      config = importlib.import_module(f"vla_jax.configs.{pathlib.Path(path).stem}").get_config(
          *[arg] if arg else [])
      config.update_from_flattened_dict(job.overrides)
      assert config.model.head_dim == grid.HEAD_DIM, job.name
      label = job.tag.get("label") if "variant" not in job.tag else job.tag["variant"]
      scales.setdefault(label, set()).add(config.model.options.vla.penalty_scale)
      qk_maps.add(config.model.options.vla.qk_map)
  assert qk_maps == {"elu1"}
  authors = "inv_sqrt_dh"
  assert scales.pop("vla_p1") == scales.pop("penalty-1") == {1.0}
  assert scales.pop("penalty-0") == {0.0}
  assert scales == {label: {authors} for label in scales} and "vla" in scales

def test_gated_deltanet_rows_keep_the_layer_they_were_made_with():
  """Every grid job of Gated DeltaNet pins no output gate and values of the key width (the
  layer's defaults are fla's since), so that its command makes its rows again."""
  from vla_jax.layers.registry import mixer_options  # pylint: disable=import-outside-toplevel
  defaults = mixer_options("gated_deltanet")
  assert (defaults["output_gate"], defaults["expand_v"]) == (True, 2)
  assert grid.EARLIER_GDN == {"model.options.gated_deltanet.output_gate": False,
                              "model.options.gated_deltanet.expand_v": 1}
  jobs = [j for g in grid.GRIDS for j in grid.grid_jobs(g, zoology_rows=ROWS)
          if j.overrides["model.mixer"] == "gated_deltanet"]
  assert len(jobs) > 20
  assert all(grid.EARLIER_GDN.items() <= j.overrides.items() for j in jobs)
  cmd = grid.sweep_command(jobs[0], sweep_script="sweep.py", root="/repo", workdir="/out",
                           seeds=[0])
  assert {"--config.model.options.gated_deltanet.output_gate=False",
          "--config.model.options.gated_deltanet.expand_v=1"} <= set(cmd)


def test_listing_names_each_job_and_whether_it_is_done():
  jobs = grid.grid_jobs("zoology_tuned", zoology_rows=ROWS)[:3]
  done = [{"job": jobs[0].name, "seed": s, "learning_rate": 1e-2} for s in (0, 1)]
  text = grid.listing(jobs, {"zoology_tuned": done}, [0, 1])
  assert text.splitlines() == [
      "done zoology_tuned-T512-d64-linear-s4000-lr1e-2 rates 1e-2 num_steps=4000",
      "todo zoology_tuned-T512-d64-gated_deltanet-s4000-lr3e-4 rates 3e-4 num_steps=4000 "
      "gate_init=fla",
      "todo zoology_tuned-T512-d64-gated_deltanet_slow-s4000-lr3e-4_1e-3_3e-3 rates "
      "3e-4,1e-3,3e-3 num_steps=4000 gate_init=slow",
      "3 jobs (2 to do), 10 runs, 40,000 run-steps"]
  smoke = grid.listing(jobs, {}, [0], [("train.num_steps", "2")])
  assert smoke.splitlines()[0].endswith("num_steps=2") and smoke.endswith("5 runs, 10 run-steps")


# A stand-in for experiments/sweep.py: logs its start and end to <workdir>/events; the "big"
# jobs run out of device memory on their first attempt, job "broken" fails otherwise.
_FAKE_SWEEP = r"""
import os, sys, time
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
run, name = args["workdir"], os.path.basename(args["workdir"])
events = os.path.join(os.path.dirname(os.path.dirname(run)), "events")
first = not os.path.exists(run)
os.makedirs(run, exist_ok=True)
with open(events, "a") as f:
  f.write(f"start {name} {time.time()}\n")
if name.startswith("big") and first:
  sys.exit("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 32 GiB")
if name == "broken":
  sys.exit("ValueError: a bug")
time.sleep(1.0)
with open(events, "a") as f:
  f.write(f"end {name} {time.time()}\n")
"""


@pytest.mark.slow   # the lab's harness (README: the slow tier)
def test_a_job_that_runs_out_of_memory_runs_again_alone(tmp_path):
  """The scheduler requeues a job that ran out of device memory, once, and starts it when no
  other job runs on its GPU (and nothing beside it: two such jobs run one after the other);
  another failure is final."""
  script = tmp_path / "fake_sweep.py"
  script.write_text(_FAKE_SWEEP)
  jobs = [grid.Job("g", name, "configs/x.py", {}, ("1e-3",), {})
          for name in ("small-1", "big", "small-2", "big-2", "broken")]
  lines = []
  summary = grid.run_grid(jobs, sweep_script=str(script), root=str(tmp_path),
                          workdir=str(tmp_path), seeds=[0], per_gpu=3, log=lines.append)
  assert sorted(summary["alone"]) == ["big", "big-2"] and summary["unfinished"] == []
  assert sorted((n, rc) for n, rc, _ in summary["finished"]) == [
      ("big", 0), ("big-2", 0), ("broken", 1), ("small-1", 0), ("small-2", 0)]
  assert any("out of memory: big, again alone on a GPU" in line for line in lines)
  events = [line.split() for line in (tmp_path / "events").read_text().splitlines()]
  times = {(kind, name): float(t) for kind, name, t in events}   # the last of each
  for big in ("big", "big-2"):
    assert [name for kind, name, _ in events if kind == "start"].count(big) == 2
    alone_from, alone_to = times[("start", big)], times[("end", big)]
    assert alone_from >= max(times[("end", "small-1")], times[("end", "small-2")])
    assert not [e for e in events if alone_from < float(e[2]) < alone_to and e[1] != big]
  log = (tmp_path / "logs" / "big.log").read_text()
  assert log.count(grid.START_MARK) == 2 and ", alone\n" in log
  assert not grid.ran_out_of_memory(tmp_path / "logs" / "big.log")   # the last attempt's
