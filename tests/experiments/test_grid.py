"""The grid driver's job list (experiments/grid.py), and VLA training with the Pallas kernels
(interpret mode here), which `--vla_impl=pallas` selects on a GPU."""

import json
import os
import pathlib
import site
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import grid  # noqa: E402  pylint: disable=wrong-import-position
from configs import base  # noqa: E402  pylint: disable=wrong-import-position
from vla_jax.training import from_config_dict  # noqa: E402  pylint: disable=wrong-import-position
from vla_jax.training.sweep import SweepTrainer  # noqa: E402  pylint: disable=wrong-import-position


def test_vla_impl_only_changes_the_vla_jobs():
  plain = grid.all_jobs(grid.parse_args(["--out_dir", "x", "--grids", "long", "--long_Ts", "1024"]))
  jobs = grid.all_jobs(grid.parse_args(["--out_dir", "x", "--grids", "long", "--long_Ts", "1024",
                                        "--vla_impl", "pallas", "--rates", "1e-3"]))
  assert len(jobs) == len(plain) == len(grid.MIXERS)
  for j, p in zip(jobs, plain):
    assert j[1] == p[1] and j[4] == ("1e-3",)
    if j[3]["model.mixer"] == "vla":
      assert j[3] == {**p[3], "model.impl": "pallas"}
    else:
      assert j[3] == p[3] and "model.impl" not in j[3]


def test_vla_trains_the_same_with_pallas():
  """One vmapped sweep step (two seeds) with impl="pallas" (interpret mode) and "scan"."""
  def losses(impl):
    c = base.get_base_config()
    c.task.update({"vocab_size": 32, "seq_len": 32, "n_pairs": 4, "form": "zoology"})
    c.model.update({"d_model": 32, "num_heads": 2, "head_dim": 16, "mixer": "vla",
                    "impl": impl, "chunk_size": 16})
    c.train.update({"batch_size": 4, "num_steps": 2, "eval_examples": 8, "eval_batch_size": 4})
    trainer = SweepTrainer(from_config_dict(c), [0, 1], [1e-3])
    state, out = trainer.init_state, []
    for step in range(1):
      state, metrics = trainer.train_step(state, *trainer.batch(step))
      out.append(np.asarray(metrics["loss"]))
    return np.array(out)
  np.testing.assert_allclose(losses("pallas"), losses("scan"), rtol=2e-5)


def test_kernels_import_from_a_source_checkout(tmp_path):
  """Grid jobs run experiments/*.py, which put the checkout first on sys.path: `vla_jax` is then
  the checkout's folder, and `vla_jax.kernels` must still resolve (to the top-level kernels/)."""
  script = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import vla_jax; "
            "from vla_jax.kernels.penalty_scan import penalty_scan; "
            "import vla_jax.kernels as k; print(vla_jax.__file__); print(k.__file__)")
  # -S: site-packages on the path but no .pth files run, so no editable-install finder (as on a
  # machine where the project is not installed and PYTHONPATH points at its dependencies).
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(site.getsitepackages())}
  out = subprocess.run([sys.executable, "-S", "-c", script], cwd=tmp_path, env=env,
                       capture_output=True, text=True, check=True).stdout.split()
  assert out == [str(ROOT / "vla_jax" / "__init__.py"), str(ROOT / "kernels" / "__init__.py")]


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


def test_a_job_is_done_with_every_run_at_the_same_overrides(tmp_path):
  """Done once its rows cover every seed and rate made with the call's result-changing
  --override settings (train.checkpoint_every is not one); a last line cut short by a kill
  is not a row; a malformed line elsewhere is an error naming the file and line."""
  args = grid.parse_args(["--out_dir", "x", "--grids", "zoology", "--seeds", "0,1",
                          "--rates", "1e-3", "--override", "train.checkpoint_every", "500"])
  job = grid.all_jobs(args)[0]
  rows = [{"job": job[1], "seed": s, "learning_rate": 1e-3} for s in (0, 1)]
  path = tmp_path / "zoology.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"job": "a"')
  assert grid.read_rows(str(path)) == rows
  assert grid.is_done(job, rows, args) and not grid.is_done(job, rows[:1], args)
  assert not grid.is_done(grid.all_jobs(args)[1], rows, args)
  other = grid.parse_args(["--out_dir", "x", "--grids", "zoology", "--seeds", "0,1",
                           "--rates", "1e-3", "--override", "train.num_steps", "10"])
  assert not grid.is_done(job, rows, other)   # rows made without that override
  marked = [dict(r, overrides={"train.num_steps": "10"}) for r in rows]
  assert grid.is_done(job, marked, other) and not grid.is_done(job, marked, args)
  assert "'overrides': {'train.num_steps': '10'}" in str(
      [json.loads(c.split("=", 1)[1]) for c in grid.command(job, other) if c.startswith("--tag")])
  path.write_text('{"job": "a"\n{"job": "b"}\n')
  with pytest.raises(ValueError, match="zoology.jsonl:1"):
    grid.read_rows(str(path))
