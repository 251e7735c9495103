"""The grids' jobs and scheduler (`vla_jax.training.grid`), and VLA training with the Pallas
kernels (interpret mode here), which `--vla_impl=pallas` selects on a GPU."""

import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from vla_jax.configs import base
from vla_jax.training import from_config_dict, grid
from vla_jax.training.sweep import SweepTrainer


def test_every_grid_has_its_jobs():
  counts = {g: len(grid.grid_jobs(g)) for g in grid.GRIDS}
  assert counts == {"capacity": 8 * 7, "long": 7 * 7, "copy": 7, "zoology": 12 * 7,
                    "ablation": 8, "ablation_demo": 8}
  names = [j.name for g in grid.GRIDS for j in grid.grid_jobs(g)]
  assert len(names) == len(set(names))
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
  """One vmapped sweep step (two seeds) with impl="pallas" (interpret mode) and "scan": one
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
  np.testing.assert_allclose(losses("pallas"), losses("scan"), rtol=2e-5)


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
