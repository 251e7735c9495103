"""A run of several processes (`vla_jax.training.distributed`): a SIGTERM to one of two
processes of 2 simulated CPU devices each (a localhost coordinator, gloo collectives) stops
both after the same step; two processes resume there, and the run's loss curve and final
parameters equal those of one process of 4 devices. A workdir held by another run refuses
every process of a run at once; the process flags of train.py and sweep.py fail in one line.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from conftest import run_scripts, subprocess_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
NUM_STEPS = 16
STOP_AT = 5      # process 0 gets a SIGTERM once it has logged this step

# One process of a run: initialize (when given a port), then train_and_evaluate a tiny MQAR
# model (test_train.tiny_config's, without importing the test module); prints the summary.
# With a stop step, process 0's log sends it a SIGTERM after that step and waits 2 s, then 1 s
# after each later step: time for JAX's preemption service (which looks for the signal every
# second) to agree on the step to stop at.
_RUN = r"""
import json, os, re, signal, sys, time
workdir, port, processes, index, stop_at = sys.argv[1:6]
from vla_jax.training import distributed
if port:
  distributed.initialize(f"localhost:{port}", int(processes), int(index))
import jax
from vla_jax.configs import base
from vla_jax.training import from_config_dict, train_and_evaluate

def log(line):
  found = re.match(r"step (\d+)/", line)
  step = int(found.group(1)) if found else 0
  if int(stop_at) and step == int(stop_at):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(2)
  elif int(stop_at) and step > int(stop_at):
    time.sleep(1)

config = base.get_base_config()
config.task.update({"vocab_size": 16, "n_pairs": 3, "form": "short"})
config.model.update({"d_model": 16, "num_heads": 2, "head_dim": 8, "mlp_ratio": 2,
                     "impl": "scan", "num_layers": 1})
config.train.update({"batch_size": 16, "num_steps": %d, "learning_rate": 1e-2,
                     "warmup_steps": 4, "eval_examples": 16, "eval_batch_size": 16,
                     "log_every": 1})
summary = train_and_evaluate(from_config_dict(config, num_devices=jax.device_count()),
                             workdir, log=log)
print(json.dumps(summary))
""" % NUM_STEPS


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(workdir, processes, stop_at=0):
  """Starts the processes of one run (1: 4 devices and no coordinator; 2: 2 devices each)."""
  port = str(_free_port()) if processes > 1 else ""
  env = subprocess_env(devices=4 // processes)
  return [subprocess.Popen([sys.executable, "-c", _RUN, str(workdir), port,
                            str(processes), str(i), str(stop_at)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(processes)]


def _last_lines(procs, timeout=240):
  """The last line each process printed; every process is ended if one fails (the others
  would wait for it)."""
  lines = []
  try:
    for proc in procs:
      out, err = proc.communicate(timeout=timeout)
      assert proc.returncode == 0, err[-3000:]
      lines.append(out.strip().splitlines()[-1])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return lines


def _finish(procs):
  """Each process's summary."""
  return [json.loads(line) for line in _last_lines(procs)]


def _losses(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [(r["step"], r["loss"]) for r in map(json.loads, f) if "loss" in r]


def _params(workdir):
  """The final parameters of the run in `workdir`, restored on this process's one device."""
  from vla_jax.training import load_model  # pylint: disable=import-outside-toplevel
  state = nnx.state(load_model(str(workdir)), nnx.Param)
  return {jax.tree_util.keystr(p): np.asarray(v)
          for p, v in jax.tree_util.tree_leaves_with_path(state)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """{name: summaries of its processes} and the workdirs {"one", "two"}: "one" is a run of
  one process of 4 devices; "stopped" two processes of 2 devices in workdir "two", process 0
  sent a SIGTERM after step STOP_AT; "resumed" two processes again in "two", to the end."""
  folder = tmp_path_factory.mktemp("distributed")
  one, stopped = _start(folder / "one", 1), _start(folder / "two", 2, STOP_AT)
  out = {"one": _finish(one), "stopped": _finish(stopped)}
  out["resumed"] = _finish(_start(folder / "two", 2))
  return out, {"one": folder / "one", "two": folder / "two"}


@pytest.mark.slow   # the slow tier (setup.cfg): two processes training
def test_a_sigterm_to_one_process_stops_both_after_the_same_step(runs):
  (summaries, workdirs) = runs
  stopped, resumed = summaries["stopped"], summaries["resumed"]
  assert stopped[0] == {**stopped[1], "wall_s": stopped[0]["wall_s"],
                        "compile_s": stopped[0]["compile_s"]}   # the same step and loss
  step = stopped[0]["steps"]
  print(f"process 0 got a SIGTERM after step {STOP_AT}; both stopped after step {step}")
  assert STOP_AT < step < NUM_STEPS and stopped[0]["evals"] is None
  assert [s["steps"] for s in resumed] == [NUM_STEPS, NUM_STEPS]
  assert resumed[0]["accuracy"] == resumed[1]["accuracy"]
  checkpoints = workdirs["two"] / "checkpoints"
  assert sorted(int(p.name) for p in checkpoints.iterdir()) == [step, NUM_STEPS]
  assert not (workdirs["two"] / "lock.owner").exists()   # released by process 0


@pytest.mark.slow   # the slow tier (setup.cfg): two processes training
def test_two_processes_train_as_one_process_of_as_many_devices(runs):
  """The stopped and resumed run of two processes against one process: losses (one row per
  step, written once) and final parameters equal to float32 rounding (the gradients of the
  four devices are summed in another order)."""
  (summaries, workdirs) = runs
  (one,), two = summaries["one"], summaries["resumed"]
  assert one["devices"] == 4 and one["processes"] == 1
  assert [s["devices"] for s in two] == [4, 4] and [s["processes"] for s in two] == [2, 2]
  one_losses, two_losses = _losses(workdirs["one"]), _losses(workdirs["two"])
  assert [s for s, _ in two_losses] == [s for s, _ in one_losses] == list(
      range(1, NUM_STEPS + 1))
  loss_diff = max(abs(a - b) for (_, a), (_, b) in zip(one_losses, two_losses))
  one_params, two_params = _params(workdirs["one"]), _params(workdirs["two"])
  assert one_params.keys() == two_params.keys()
  param_diff = max(float(np.abs(one_params[k] - two_params[k]).max()) for k in one_params)
  print(f"two processes against one: max |loss difference| {loss_diff:.3g}, "
        f"max |parameter difference| {param_diff:.3g}")
  assert loss_diff <= 1e-5 and param_diff <= 1e-5
  assert two_losses[-1][1] < 0.9 * two_losses[0][1]
  assert two[0]["accuracy"] == pytest.approx(one["accuracy"], abs=1 / 16)


# Process `index` of two tries to hold `workdir` (`distributed.hold_workdir`) and says how it
# went.
_HOLD = r"""
import sys
from vla_jax.training import distributed, lock
workdir, port, index = sys.argv[1:4]
distributed.initialize(f"localhost:{port}", 2, int(index))
try:
  with distributed.hold_workdir(workdir):
    print("held")
except lock.WorkdirInUseError as e:
  print(f"refused: {e}")
"""


def test_a_workdir_held_by_another_run_refuses_every_process_at_once(tmp_path):
  """Process 0 names the holder; process 1 fails too instead of waiting for process 0."""
  from vla_jax.training import lock  # pylint: disable=import-outside-toplevel
  port = str(_free_port())
  with lock.WorkdirLock(tmp_path):
    lines = _last_lines([subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path), port, str(i)], env=subprocess_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)])
  assert lines[0].startswith(f"refused: workdir {tmp_path} is in use by another run (pid "
                             f"{os.getpid()} on host"), lines
  assert lines[1] == (f"refused: workdir {tmp_path} could not be held by process 0 of this run "
                      "(its error names the cause, such as another run using it)")


# The process flags of train.py and sweep.py out of range or at odds, and values that neither
# the flags nor the environment give: one line naming them, before any training.
PROCESS_MISTAKES = (
    (["--num_processes=0"], "flag --num_processes=0: 0 is not a positive integer"),
    (["--process_id=-1"], "flag --process_id=-1: -1 is not a non-negative integer"),
    (["--num_processes=2", "--process_id=2"], "--process_id must be below --num_processes"),
    (["--coordinator_address=localhost"],
     "--coordinator_address must be host:port, such as localhost:12345"),
    (["--num_processes=2"], "cannot start a run of several processes: coordinator_address and "
                            "process_id not given, and the environment gives none"))


def test_process_flags_report_mistakes_in_one_line(tmp_path, monkeypatch):
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  config = f"--config={ROOT / 'configs' / 'mqar_demo.py'}"
  scripts = {"train.py": [], "sweep.py": [f"--out={tmp_path / 'rows.jsonl'}"]}
  argvs = [[ROOT / "experiments" / script, config, f"--workdir={tmp_path / 'run'}", *extra,
            *flags] for script, extra in scripts.items() for flags, _ in PROCESS_MISTAKES]
  done = run_scripts(*argvs, env=subprocess_env())
  for proc, (_, message) in zip(done, PROCESS_MISTAKES * len(scripts)):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and message in lines[0], lines
  assert not (tmp_path / "run").exists()


def test_initialize_checks_its_arguments_and_does_nothing_for_one_process(monkeypatch):
  from vla_jax.training import distributed  # pylint: disable=import-outside-toplevel
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  assert distributed.initialize() is False and not jax.distributed.is_initialized()
  for args, message in ((("localhost:1", 0, 0), "num_processes must be an int >= 1; got 0"),
                        (("localhost:1", 2, -1), "process_id must be an int >= 0; got -1"),
                        (("localhost:1", 2, 2), "process_id=2 must be below num_processes=2"),
                        (("localhost", 2, 0), "coordinator_address must be host:port"),
                        (("localhost:1", 2.0, 0), "num_processes must be an int >= 1")):
    with pytest.raises(ValueError, match=message):
      distributed.initialize(*args)
  assert not jax.distributed.is_initialized()
