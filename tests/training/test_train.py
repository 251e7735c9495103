"""Training: loss falls, checkpoints resume exactly, bad configurations fail before training,
and the absl main prints a JSON summary (data parallelism: test_sequence_parallel.py)."""

import json
import os
import pathlib
import shutil
import signal

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[2]

from vla_jax.configs import base  # noqa: E402  pylint: disable=wrong-import-position
from vla_jax.configs import mqar_zoology_bf16  # noqa: E402
from vla_jax.tasks import IGNORE, save_npz  # noqa: E402
from vla_jax.training import checkpoint as ckpt  # noqa: E402
from vla_jax.training import jsonl  # noqa: E402
from vla_jax.training import train as train_lib  # noqa: E402
from vla_jax.training import evaluate, from_config_dict, train_and_evaluate  # noqa: E402


def tiny_config(**train):
  config = base.get_base_config()
  config.task.update({"vocab_size": 16, "n_pairs": 3, "form": "short"})
  # One layer of the cheapest form to compile: checkpoints, resumption and logging do not
  # depend on the depth (the model's layers: tests/models).
  config.model.update({"d_model": 16, "num_heads": 2, "head_dim": 8, "mlp_ratio": 2,
                       "impl": "scan", "num_layers": 1})
  config.train.update({"batch_size": 16, "num_steps": 40, "learning_rate": 1e-2,
                       "warmup_steps": 4, "eval_every": 0, "checkpoint_every": 0,
                       "eval_examples": 32, "eval_batch_size": 16, "log_every": 1, **train})
  return config


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if "loss" in r], [r for r in rows if "eval" in r]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """One uninterrupted 40-step run of tiny_config(): (summary, workdir). Shared by the tests
  that read it (its compiled steps are then reused from the compilation cache)."""
  workdir = tmp_path_factory.mktemp("tiny_run")
  summary = train_and_evaluate(from_config_dict(tiny_config()), str(workdir), log=lambda s: None)
  return summary, workdir


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
  """tiny_config(checkpoint_every=4) stopped after step 8 (checkpoints 4 and 8, an evaluation
  at 8): the start of the tests that damage a run and resume it, each on its own copy."""
  workdir = tmp_path_factory.mktemp("stopped_run") / "run"
  train_and_evaluate(from_config_dict(tiny_config(checkpoint_every=4)), str(workdir),
                     stop_after=8, log=lambda s: None)
  return workdir


def test_tiny_training_loss_falls(tmp_path, tiny_run):
  summary, workdir = tiny_run
  train_rows, eval_rows = _rows(workdir)
  losses = [r["loss"] for r in train_rows]
  assert len(losses) == 40 and np.all(np.isfinite(losses))
  assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
  assert {"task", "mixer", "accuracy", "steps"} <= set(summary)
  assert summary["steps"] == 40 and summary["mixer"] == "vla" and summary["task"] == "mqar"
  assert 0.0 <= summary["accuracy"] <= 1.0 and len(eval_rows) == 1
  assert train_rows[0]["compile_s"] > 0 and "steps_per_s" not in train_rows[0]
  assert all(r["steps_per_s"] > 0 for r in train_rows[1:])   # compilation left out
  assert (workdir / "checkpoints" / "40").is_dir()
  # The checkpoint scores the same on its evaluation set written out as an external .npz,
  # with as many rows again that have no target: those are not scored (exact_match would be
  # (32 x + 32) / 64 if they counted as right).
  config = from_config_dict(tiny_config())
  inputs, labels = config.make_task().eval_sets(0, 32)["mqar"]
  save_npz(tmp_path / "eval.npz", np.concatenate([inputs, inputs]),
           np.concatenate([labels, np.full_like(labels, IGNORE)]))
  result = evaluate(str(workdir), npz_path=str(tmp_path / "eval.npz"))
  assert result["step"] == 40 and summary["exact_match"] < 1
  assert result["evals"]["npz"] == {k: summary["evals"]["mqar"][k]
                                    for k in ("accuracy", "exact_match", "targets")}


def test_resume_equals_uninterrupted(tmp_path, tiny_run):
  """Stopped after 6 of 40 steps (a checkpoint at the stop; periodic checkpoints: the tests
  below), then resumed: the same loss curve, bit for bit, and the same final accuracy as the
  uninterrupted run."""
  _, full = tiny_run
  config = from_config_dict(tiny_config())
  part = str(tmp_path / "part")
  stopped = train_and_evaluate(config, part, stop_after=6, log=lambda s: None)
  assert stopped["steps"] == 6
  resumed = train_and_evaluate(config, part, log=lambda s: None)
  assert resumed["steps"] == 40
  loss_full = [(r["step"], r["loss"]) for r in _rows(full)[0]]
  loss_part = [(r["step"], r["loss"]) for r in _rows(part)[0]]
  assert loss_part == loss_full  # bit-identical curve, steps 1..40
  assert resumed["accuracy"] == _rows(full)[1][-1]["eval"]["mqar"]["accuracy"]


def test_sigterm_checkpoints_the_step_reached_and_resumes_exactly(tmp_path, tiny_run):
  """A SIGTERM during step 7 (checkpoints every 4 steps) stops the run after that step with a
  checkpoint at step 7, not 4, and no evaluation (a strict-JSON summary, scores None);
  resumed (periodic checkpoints off: a setting a run may change), the loss curve equals the
  uninterrupted run's bit for bit and the wall time counts both segments."""
  _, full = tiny_run
  config = from_config_dict(tiny_config(checkpoint_every=4))
  part = tmp_path / "part"

  def log(line):  # the signal arrives while step 7 is logged
    if line.startswith("step 7/"):
      os.kill(os.getpid(), signal.SIGTERM)

  stopped = train_and_evaluate(config, str(part), log=log)
  assert stopped["steps"] == 7 and stopped["evals"] is None
  assert stopped["accuracy"] is None and stopped["exact_match"] is None
  assert stopped["train_loss"] == _rows(part)[0][-1]["loss"]
  json.dumps(stopped, allow_nan=False)  # raises on NaN
  first = _rows(part)[0][-1]["elapsed_s"]
  assert 0 < first <= stopped["wall_s"]
  assert sorted(int(p.name) for p in (part / "checkpoints").iterdir()) == [4, 7]
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed again
  resumed = train_and_evaluate(from_config_dict(tiny_config()), str(part), log=lambda s: None)
  assert resumed["steps"] == 40
  assert [(r["step"], r["loss"]) for r in _rows(part)[0]] == [
      (r["step"], r["loss"]) for r in _rows(full)[0]]
  elapsed = [r["elapsed_s"] for r in _rows(part)[0]]
  assert elapsed == sorted(elapsed) and elapsed[7] > first  # the second segment adds on
  assert resumed["wall_s"] >= elapsed[-1] > first
  assert resumed["accuracy"] == _rows(full)[1][-1]["eval"]["mqar"]["accuracy"]


class Killed(Exception):
  """What a SIGTERM that reaches no StopSignal does here (in place of ending the process)."""


def sigterm_during_save(monkeypatch, step):
  """Sends SIGTERM when checkpoint `step` starts being saved; a SIGTERM outside a StopSignal
  raises Killed, as if the process ended there."""
  save = ckpt.Checkpointer.save

  def saving(self, at, state):
    if at == step:
      os.kill(os.getpid(), signal.SIGTERM)
    return save(self, at, state)

  def killed(signum, frame):
    raise Killed(f"signal {signum}")

  monkeypatch.setattr(ckpt.Checkpointer, "save", saving)
  previous = signal.signal(signal.SIGTERM, killed)
  return lambda: signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_during_the_last_checkpoint_loses_no_step(tmp_path, tiny_run, stopped_run,
                                                            monkeypatch):
  """Checkpoints every 4 steps, resumed at step 8 and stopped after 10: a SIGTERM while
  checkpoint 10 is written lets it finish (the run then skips its evaluation); the rerun
  resumes at step 10, not at 8, and follows the uninterrupted run."""
  _, full = tiny_run
  config = from_config_dict(tiny_config(checkpoint_every=4))
  shutil.copytree(stopped_run, tmp_path, dirs_exist_ok=True)
  restore = sigterm_during_save(monkeypatch, 10)
  try:
    stopped = train_and_evaluate(config, str(tmp_path), stop_after=10, log=lambda s: None)
  finally:
    restore()
  monkeypatch.undo()
  assert stopped["steps"] == 10 and stopped["evals"] is None
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [8, 10]
  lines = []
  train_and_evaluate(config, str(tmp_path), stop_after=12, log=lines.append)
  assert "resumed from step 10" in lines[0]
  assert [(r["step"], r["loss"]) for r in _rows(tmp_path)[0]] == [
      (r["step"], r["loss"]) for r in _rows(full)[0]][:12]


def test_a_stopped_run_never_reports_an_earlier_evaluation(tmp_path):
  """Periodic evaluations every 4 steps: stopped after step 6 by stop_after, the summary
  scores step 6 (a fresh evaluation, logged at step 6); stopped there by SIGTERM, it has no
  scores, not step 4's."""
  config = from_config_dict(tiny_config(eval_every=4))
  stopped = train_and_evaluate(config, str(tmp_path / "a"), stop_after=6, log=lambda s: None)
  evals = _rows(tmp_path / "a")[1]
  assert [r["step"] for r in evals] == [4, 6] and stopped["evals"] == evals[-1]["eval"]

  def log(line):
    if line.startswith("step 6/"):
      os.kill(os.getpid(), signal.SIGTERM)

  stopped = train_and_evaluate(config, str(tmp_path / "b"), log=log)
  assert stopped["steps"] == 6 and stopped["evals"] is None and stopped["accuracy"] is None
  assert [r["step"] for r in _rows(tmp_path / "b")[1]] == [4]


def test_a_run_resumes_from_its_last_good_checkpoint_and_keeps_a_users_folders(
    tmp_path, tiny_run, stopped_run, caplog):
  """Stopped at step 8 (checkpoints 4 and 8), step 8 then truncated on disk and two
  integer-named folders put under checkpoints/: the resumed run warns, restarts from step 4
  and ends with the uninterrupted run's curve and score; the damaged step is moved aside
  when step 8 is written again; the clean-up deletes only checkpoints the run wrote."""
  config = from_config_dict(tiny_config(checkpoint_every=4))
  work = tmp_path / "run"
  shutil.copytree(stopped_run, work)
  data = [os.path.join(r, f) for r, _, fs in os.walk(work / "checkpoints" / "8" / "default")
          for f in fs if os.sep + "d" + os.sep in os.path.join(r, f)]
  os.truncate(max(data, key=os.path.getsize), 10)
  for name in ("2", "100"):
    (work / "checkpoints" / name).mkdir()
    (work / "checkpoints" / name / "notes.txt").write_text("mine")
  with caplog.at_level("WARNING"):
    resumed = train_and_evaluate(config, str(work), log=lambda s: None)
  last = {r["step"]: r["loss"] for r in jsonl.read_rows(str(work / "metrics.jsonl"))
          if "loss" in r}
  assert sorted(last.items()) == [(r["step"], r["loss"]) for r in _rows(tiny_run[1])[0]]
  assert resumed["accuracy"] == tiny_run[0]["accuracy"]
  assert "truncated?" in caplog.text and "restored step 4" in caplog.text
  names = sorted(p.name for p in (work / "checkpoints").iterdir())
  assert names[:4] == ["100", "2", "36", "40"] and names[4].startswith("8.replaced-")
  assert len(names) == 5 and (work / "checkpoints" / "2" / "notes.txt").read_text() == "mine"


def test_resume_without_config_json_is_refused(tmp_path, tiny_run):
  """config.json deleted from a run with checkpoints: resuming with another learning rate
  (or any settings) is refused, naming the missing file, and nothing is written."""
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run[1], workdir)
  os.remove(workdir / "config.json")
  before = (workdir / "metrics.jsonl").read_text()
  other = from_config_dict(tiny_config(learning_rate=3e-2, num_steps=60))
  with pytest.raises(ValueError, match=r"holds checkpoints \(steps 40\) but no config.json"):
    train_and_evaluate(other, str(workdir), log=lambda s: None)
  assert not (workdir / "config.json").exists()
  assert (workdir / "metrics.jsonl").read_text() == before


def test_logged_row_reads_the_log_up_to_the_resumed_step(tmp_path):
  """A killed run logged steps 4 and 6 past its checkpoint at 2; resumed from 2 it logged 4
  again. Reading at step 4 gives the row written last; rows without `elapsed_s` (an older log)
  count as no time."""
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": 2, "loss": 1.0, "elapsed_s": 5.0}, {"step": 4, "loss": 0.9, "elapsed_s": 7.0},
          {"step": 6, "loss": 0.8, "elapsed_s": 9.0}, {"step": 2, "eval": {}},
          {"step": 4, "loss": 0.7, "elapsed_s": 11.0}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert ckpt.logged_row(str(path), 4)["loss"] == 0.7
  assert ckpt.logged_row(str(path), 3)["loss"] == 1.0
  assert ckpt.logged_row(str(path), 1) is None
  assert ckpt.logged_row(str(tmp_path / "none.jsonl"), 4) is None
  assert ckpt.elapsed_of(ckpt.logged_row(str(path), 5)) == 11.0
  assert ckpt.elapsed_of(ckpt.logged_row(str(path), 0)) == 0.0
  path.write_text(json.dumps({"step": 2, "loss": 1.0}) + "\n")
  assert ckpt.elapsed_of(ckpt.logged_row(str(path), 2)) == 0.0


def test_resume_refuses_a_different_config(tmp_path, tiny_run):
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run[1], workdir)  # a finished run, copied so that it stays unchanged
  other = tiny_config()
  other.model.mixer = "deltanet"
  with pytest.raises(ValueError, match="different model configuration"):
    train_and_evaluate(from_config_dict(other), str(workdir), log=lambda s: None)



def test_resume_may_change_remat_only(tmp_path, tiny_run):
  """model.remat trades memory for compute: a run may resume with it switched, also from a
  config.json written before the setting existed; any other model change is refused."""
  workdir = tmp_path / "run"
  shutil.copytree(tiny_run[1], workdir)
  saved = json.loads((workdir / "config.json").read_text())
  del saved["model"]["remat"]  # as written by an older version, which had no u_init either
  saved["model"]["mixer_options"] = [o for o in saved["model"]["mixer_options"]
                                     if o != ["u_init", "random"]]
  (workdir / "config.json").write_text(json.dumps(saved))
  remat = tiny_config()
  remat.model.remat = True
  summary = train_and_evaluate(from_config_dict(remat), str(workdir), log=lambda s: None)
  assert summary["steps"] == 40 and summary["accuracy"] == tiny_run[0]["accuracy"]
  wider = tiny_config()
  wider.model.remat = True
  wider.model.mlp_ratio = 4
  with pytest.raises(ValueError, match="different model configuration"):
    train_and_evaluate(from_config_dict(wider), str(workdir), log=lambda s: None)

def test_packing_with_impl_auto_is_a_valid_config():
  config = tiny_config()
  config.task.update({"pack": 2})
  config.model.update({"impl": "auto"})
  assert from_config_dict(config).model.impl == "auto"


def test_mixed_precision_config_trains_a_step_with_float32_parameters_and_states():
  """configs/mqar_zoology_bf16.py, shrunk: bfloat16 activations, float32 parameters, AdamW
  moments and recurrent states; one step's loss is finite and within bfloat16 rounding of the
  float32 model's from the same parameters."""
  def trainer(dtype):
    config = mqar_zoology_bf16.get_config("64")
    config.task.update({"vocab_size": 64, "n_pairs": 4})
    config.model.update({"d_model": 32, "num_heads": 2, "head_dim": 16, "mlp_ratio": 1,
                         "num_layers": 1, "impl": "scan", "dtype": dtype})   # quick to compile
    config.train.update({"batch_size": 4, "eval_examples": 4, "eval_batch_size": 4,
                         "warmup_steps": 0})     # a step that moves the parameters
    return train_lib.Trainer(from_config_dict(config))

  mixed = trainer("bfloat16")
  assert (mixed.config.model.dtype, mixed.config.model.param_dtype) == ("bfloat16", "float32")
  batch = mixed.task.train_batch(0, 0, 4)
  before = jax.device_get(mixed.init_state["params"])    # the step donates its state
  state, metrics = mixed.train_step(mixed.init_state, *batch)
  loss = float(metrics["loss"])
  assert np.isfinite(loss)
  floats = lambda tree: [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
  for name in ("params", "opt_state"):
    assert {x.dtype for x in floats(state[name])} == {jnp.dtype(jnp.float32)}, name
  assert any(not np.array_equal(a, b) for a, b in
             zip(floats(state["params"]), floats(before)))
  model = mixed.model(state["params"])
  tokens = jnp.asarray(batch[0])
  assert jax.eval_shape(model.features, tokens).dtype == jnp.bfloat16    # traced, not run
  _, cache = jax.eval_shape(model.prefill, tokens, model.init_cache(tokens.shape[0]))
  states = [layer.state for layer in cache.layers]     # VLA's S and A (conv prefixes: inputs)
  assert {x.dtype for x in floats(states)} == {jnp.dtype(jnp.float32)}

  full = trainer("float32")
  chex.assert_trees_all_equal(jax.device_get(full.init_state["params"]), before)
  # The float32 model's loss on the batch (what its step would log: the loss before the
  # update), a forward pass rather than a whole training step to compile.
  reference = float(jax.jit(lambda p, x, y: train_lib.model_loss(
      full.model(p), x, y, full.max_targets)[0])(full.init_state["params"], *batch))
  assert abs(loss - reference) <= 2e-2 * reference, (loss, reference)


def test_gated_deltanet_gate_init_comes_from_the_config():
  config = tiny_config()
  assert config.model.options.gated_deltanet.gate_init == "fla"
  config.model.mixer = "gated_deltanet"
  config.model.options.gated_deltanet.gate_init = "slow"
  assert from_config_dict(config).model.options == {"conv_size": 4, "out_norm": True,
                                                    "gate_init": "slow", "output_gate": True,
                                                    "expand_v": 2}

@pytest.mark.parametrize("edit,match", [
    (lambda c: c.model.update({"mixer": "mamba"}), "unknown mixer 'mamba'"),
    (lambda c: c.model.update({"head_dim": 4}), "must equal model.d_model"),
    (lambda c: c.task.update({"n_pairs": 30, "form": "zoology", "seq_len": 64,
                              "vocab_size": 256}), "too large for seq_len=64"),
    (lambda c: c.train.update({"batch_size": 10}), "divisible by the number of devices"),
    (lambda c: c.train.update({"learning_rates": 1.0}), "unknown field"),
    (lambda c: c.task.update({"name": "sort"}), "unknown task 'sort'"),
    (lambda c: c.train.update({"grad_clip": -1.0}), r"train.grad_clip must be in \[0.0, inf\)"),
    (lambda c: c.train.update({"end_lr_ratio": -0.5}), "train.end_lr_ratio"),
    (lambda c: c.train.update({"b2": 1.0}), "train.b2"),
    (lambda c: c.train.update({"learning_rate": float("inf")}), "train.learning_rate"),
    (lambda c: c.model.update({"impl": "pallas", "num_heads": 1, "head_dim": 16,
                               "chunk_size": 256}),
     "model.impl='pallas' cannot run here: chunk_size=256"),
], ids=["mixer", "head_dim", "n_pairs", "batch", "field", "task", "clip", "end_lr", "b2", "lr",
        "chunk_pallas"])
def test_bad_configs_fail_before_training(edit, match):
  config = tiny_config()
  config.model.options.vla.update({})
  edit(config)
  with pytest.raises(ValueError, match=match):
    from_config_dict(config, num_devices=4)


def test_packing_with_a_kernel_that_cannot_take_it_fails_before_training(monkeypatch):
  """Packed rows (task.pack > 1) with impl "pallas" are checked against the kernel's facts at
  configuration time: allowed while the VLA kernel takes segment_ids, refused naming both
  settings where it would not."""
  from vla_jax.kernels import config as kernel_config  # pylint: disable=import-outside-toplevel
  config = tiny_config()
  config.task.update({"pack": 2})
  config.model.update({"impl": "pallas", "num_heads": 1, "head_dim": 16})
  assert from_config_dict(config, num_devices=4).model.impl == "pallas"
  monkeypatch.setitem(kernel_config.KERNEL_SUPPORT, "vla",
                      kernel_config.KernelSupport(segment_ids=False))
  with pytest.raises(ValueError, match="task.pack=2 trains on packed rows .*model.impl='pallas' "
                                       "cannot run here: the kernel does not take segment_ids"):
    from_config_dict(config, num_devices=4)


# tiny_config()'s run (its compiled programs, from the compilation cache) by flags.
TRAIN_PY = [ROOT / "experiments" / "train.py", f"--config={ROOT / 'configs' / 'mqar_demo.py'}",
            "--config.task.n_pairs=3", "--config.task.vocab_size=16", "--config.model.d_model=16",
            "--config.model.head_dim=8", "--config.model.mlp_ratio=2",
            "--config.model.chunk_size=64", "--config.model.num_layers=1",
            "--config.model.impl=scan", "--config.train.num_steps=40",
            "--config.train.learning_rate=1e-2", "--config.train.warmup_steps=4",
            "--config.train.eval_examples=32", "--config.train.eval_batch_size=16",
            "--config.train.batch_size=16"]
# A user's mistakes: one line each, exit 1, before anything is trained or written.
MISTAKES = (
    ("--stop_after=-5", "flag --stop_after=-5: -5 is not a positive integer"),
    ("--config.task.seq_len=64", "--config.task.seq_len: config.task has no field "
                                 "'seq_len' (it has: form, n_pairs, name, pack, vocab_size)"))

# evaluate.py's flags out of range or at odds: a line naming the flag and what it takes.
EVALUATE_MISTAKES = (
    (["--eval_examples=0"], "evaluate.py: flag --eval_examples=0: 0 is not a positive integer"),
    (["--eval_examples=-1"],
     "evaluate.py: flag --eval_examples=-1: -1 is not a positive integer"),
    (["--step=-1"], "evaluate.py: flag --step=-1: -1 is not a non-negative integer"),
    (["--eval_examples=4", "--npz=x.npz"],
     "--eval_examples does not apply to --npz: the file is scored whole"))


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory, tiny_run):
  """({name: subprocess.CompletedProcess}, folder) of this file's script runs, in one process
  in order (`conftest.run_scripts`): train.py's tiny run, a user's mistakes, evaluate.py on that
  run (with its own settings, and with an override it refuses), and evaluate.py on tiny_run
  with an .npz of the wrong keys."""
  from conftest import run_scripts  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp("scripts")
  np.savez(folder / "keys.npz", x=np.zeros((2, 3), np.int32), y=np.zeros((2, 3), np.int32))
  evaluate_py = [ROOT / "experiments" / "evaluate.py", f"--workdir={folder / 'run'}"]
  calls = [("train", TRAIN_PY + [f"--workdir={folder / 'run'}"])]
  calls += [(f"bad{i}", TRAIN_PY + [flag, f"--workdir={folder / f'bad{i}'}"])
            for i, (flag, _) in enumerate(MISTAKES)]
  calls += [("mixer", TRAIN_PY + ["--config.model.mixer=transformer",
                                  f"--workdir={folder / 'bad2'}"]),
            ("evaluate", evaluate_py),
            ("evaluate_override", evaluate_py + [f"--config={ROOT / 'configs' / 'mqar_demo.py'}",
                                                 "--config.train.eval_examples=8"]),
            ("evaluate_keys", [ROOT / "experiments" / "evaluate.py", f"--workdir={tiny_run[1]}",
                               f"--npz={folder / 'keys.npz'}"])]
  calls += [(f"evaluate_flag{i}", evaluate_py + flags)
            for i, (flags, _) in enumerate(EVALUATE_MISTAKES)]
  done = run_scripts(*(argv for _, argv in calls), env=dict(os.environ, JAX_PLATFORMS="cpu"))
  return {name: proc for (name, _), proc in zip(calls, done)}, folder


def test_main_prints_json_and_rejects_bad_config(script_runs):
  runs, folder = script_runs
  proc = runs["train"]
  assert proc.returncode == 0, proc.stderr[-3000:]
  last = json.loads(proc.stdout.strip().splitlines()[-1])
  assert last["task"] == "mqar" and last["mixer"] == "vla" and last["steps"] == 40
  assert "steps/s" in proc.stdout
  for i, (_, message) in enumerate(MISTAKES):
    out = runs[f"bad{i}"]
    lines = out.stderr.strip().splitlines()   # a flag's error adds a line on --helpshort
    assert out.returncode == 1 and any(line.endswith(message) for line in lines[:1] + lines[-1:]), (
        out.stderr[-3000:])
    assert "Traceback" not in out.stderr and not (folder / f"bad{i}").exists()
  mixer = runs["mixer"]
  assert mixer.returncode != 0 and "unknown mixer 'transformer'" in mixer.stderr
  assert not (folder / "bad2").exists()
  # evaluate.py scores the run with its own settings: a training or model override is refused.
  ok, refused = runs["evaluate"], runs["evaluate_override"]
  assert ok.returncode == 0 and ok.stderr == "", ok.stderr[-3000:]   # no library INFO logs
  assert json.loads(ok.stdout.strip().splitlines()[-1])["accuracy"] == last["accuracy"]
  assert refused.returncode != 0 and "--config.train.eval_examples=8" in refused.stderr
  for i, (_, message) in enumerate(EVALUATE_MISTAKES):
    out = runs[f"evaluate_flag{i}"]
    assert out.returncode != 0 and out.stdout == "", out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()   # a flag's line, or usage then the message
    assert message in (lines[0], lines[-1]) and "Traceback" not in out.stderr, lines[-3:]


def test_head_at_targets_equals_full_head():
  """model_loss with max_targets (the head at target positions only) gives the full head's
  loss, counts and gradients; rows with fewer targets are padded, too many raise."""
  import jax
  from flax import nnx
  from vla_jax.models import LanguageModel
  from vla_jax.training.train import check_max_targets, lm_loss, model_loss
  config = tiny_config()
  config.task.update({"form": "zoology", "seq_len": 32, "n_pairs": 4, "vocab_size": 64})
  config = from_config_dict(config)
  task = config.make_task()
  assert task.max_targets == 4
  x, y = task.train_batch(0, 0, 8)
  y = y.copy()
  y[0, np.flatnonzero(y[0] != IGNORE)[-1]] = IGNORE          # one row with 3 targets
  graphdef, params, rest = nnx.split(LanguageModel(config.model, rngs=nnx.Rngs(3)),
                                     nnx.Param, ...)

  def loss(p, max_targets):
    return model_loss(nnx.merge(graphdef, p, rest), x, y, max_targets)

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (full, aux_f), g_full = grad(params, None)
  (part, aux_p), g_part = grad(params, 4)
  np.testing.assert_allclose(part, full, rtol=1e-6)
  np.testing.assert_allclose(aux_p["loss_sum"], aux_f["loss_sum"], rtol=1e-6)
  np.testing.assert_array_equal(aux_p["correct"], aux_f["correct"])
  np.testing.assert_array_equal(aux_p["targets"], [3] + [4] * 7)
  for a, b in zip(jax.tree.leaves(g_part), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
  ref = jax.jit(lambda p: lm_loss(nnx.merge(graphdef, p, rest)(x), y)[0])(params)
  np.testing.assert_allclose(full, ref, rtol=1e-7)
  check_max_targets(y, 4)
  with pytest.raises(ValueError, match="max_targets=3"):
    check_max_targets(task.train_batch(0, 1, 8)[1], 3)


def test_jsonl_rows_survive_a_cut_short_write(tmp_path):
  path = tmp_path / "rows.jsonl"
  jsonl.append_rows(str(path), [{"step": 1}, {"step": 2}])
  jsonl.append_rows(str(path), [])
  assert jsonl.read_rows(str(path)) == [{"step": 1}, {"step": 2}]
  with open(path, "a") as f:
    f.write('{"step": 3, "lo')        # a kill during a write
  assert jsonl.read_rows(str(path)) == [{"step": 1}, {"step": 2}]
  assert ckpt.logged_row(str(path), 5, key="step") == {"step": 2}
  jsonl.append_rows(str(path), [{"step": 3}])   # the cut line is dropped, not glued onto
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
  with open(path, "a") as f:
    f.write('{"step": 4}')              # a whole row, cut before its newline: kept
  jsonl.append_rows(str(path), [{"step": 5}])
  assert jsonl.read_rows(str(path)) == [{"step": s} for s in (1, 2, 3, 4, 5)]
  path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match="rows.jsonl:2"):
    jsonl.read_rows(str(path))


def test_jsonl_rows_are_appended_where_flock_is_not_supported(tmp_path, monkeypatch, caplog):
  """An object store's FUSE mount or NFS without locking: flock fails; rows are appended
  without it, with one warning."""
  import errno  # pylint: disable=import-outside-toplevel
  import fcntl  # pylint: disable=import-outside-toplevel

  def refuse(*args):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(fcntl, "flock", refuse)
  monkeypatch.setattr(jsonl, "_said_no_flock", [], raising=False)
  path = tmp_path / "rows.jsonl"
  with caplog.at_level("WARNING", logger=jsonl.__name__):
    jsonl.append_rows(path, [{"step": 1}])
    jsonl.append_rows(path, [{"step": 2}, {"step": 3}])
  assert jsonl.read_rows(path) == [{"step": 1}, {"step": 2}, {"step": 3}]
  assert len(caplog.records) == 1 and "does not support flock" in caplog.text


def test_a_full_disk_names_the_jsonl_file(tmp_path, monkeypatch):
  """os.write's ENOSPC names no file: append_rows and write_atomic name theirs, and
  write_atomic leaves the old file whole."""
  import errno  # pylint: disable=import-outside-toplevel
  path = tmp_path / "rows.jsonl"
  jsonl.write_rows(path, [{"step": 1}])

  def full(*args):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "write", full)
  with pytest.raises(OSError, match=f"No space left on device: '{path}'"):
    jsonl.append_rows(path, [{"step": 2}])
  monkeypatch.undo()
  monkeypatch.setattr(jsonl.os, "replace", full)
  with pytest.raises(OSError, match=f"No space left on device: '{path}'"):
    jsonl.write_rows(path, [{"step": 3}])
  monkeypatch.undo()
  assert jsonl.read_rows(path) == [{"step": 1}] and os.listdir(tmp_path) == ["rows.jsonl"]


def test_a_run_resumes_past_a_metrics_line_cut_by_a_kill(tmp_path, tiny_run, stopped_run,
                                                         caplog):
  """A run killed while it wrote the row of step 8, before its checkpoint there (checkpoints
  every 4 steps), resumes from step 4; the cut line is dropped rather than glued to the next
  row, so that a later resume still reads the log, and no step's row is missing: the curve
  equals the uninterrupted run's (the last segment without periodic checkpoints)."""
  config = from_config_dict(tiny_config(checkpoint_every=4))
  work = tmp_path / "run"
  shutil.copytree(stopped_run, work)
  shutil.rmtree(work / "checkpoints" / "8")
  path = work / "metrics.jsonl"
  lines = path.read_text().splitlines(keepends=True)
  assert '"eval"' in lines[-1] and json.loads(lines[-2])["step"] == 8
  path.write_text("".join(lines[:-2]) + lines[-2][:len(lines[-2]) // 2])
  with caplog.at_level("WARNING"):
    train_and_evaluate(config, str(work), stop_after=10, log=lambda s: None)
    train_and_evaluate(from_config_dict(tiny_config()), str(work), log=lambda s: None)
  last = {r["step"]: r["loss"] for r in jsonl.read_rows(str(path)) if "loss" in r}
  assert sorted(last.items()) == [(r["step"], r["loss"]) for r in _rows(tiny_run[1])[0]]
  assert "dropping a last line cut short" in caplog.text


def test_a_single_run_refuses_a_sweep_workdir(tmp_path):
  """train.py pointed at a sweep's workdir: refused before anything is written, so that the
  sweep still resumes."""
  workdir = tmp_path / "sweep"
  workdir.mkdir()
  saved = json.loads(from_config_dict(tiny_config()).to_json())
  (workdir / "config.json").write_text(json.dumps({**saved, "sweep": {"seeds": [0, 1]}}))
  with pytest.raises(ValueError, match="holds a sweep over"):
    train_and_evaluate(from_config_dict(tiny_config()), str(workdir), log=lambda s: None)
  assert json.loads((workdir / "config.json").read_text())["sweep"] == {"seeds": [0, 1]}
  other = tiny_config(num_steps=50)
  (workdir / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match="num_steps: 40 -> 50"):
    train_and_evaluate(from_config_dict(other), str(workdir), log=lambda s: None)


def test_evaluate_refuses_token_ids_outside_the_vocabulary(tiny_run):
  """Scoring the vocabulary-16 model on a vocabulary-64 MQAR task would embed ids past the
  table (NaN logits scored as wrong answers); it is an error naming the set."""
  other = dict(tiny_config().task)
  other.pop("name")
  other["vocab_size"] = 64
  with pytest.raises(ValueError, match=r"evaluation set mqar: token id \d+ does not fit "
                                       r"vocab_size=16"):
    evaluate(str(tiny_run[1]), task=("mqar", other))


def test_evaluate_reports_a_users_mistakes_in_one_line(tmp_path, tiny_run, script_runs):
  """evaluate.py with an .npz of the wrong keys: one line, exit 1; sequences longer than the
  learned positions and token ids past the vocabulary are ValueErrors (the same one line)."""
  runs, folder = script_runs
  proc = runs["evaluate_keys"]
  assert proc.returncode == 1 and proc.stdout == ""
  assert proc.stderr.strip().splitlines() == [
      f"evaluate.py: error: {folder / 'keys.npz'}: missing array(s) inputs, labels; an "
      "external data file needs `inputs` and `labels` [N, T] int arrays, has x, y"]
  inputs, labels = from_config_dict(tiny_config()).make_task().eval_sets(0, 4)["mqar"]
  save_npz(tmp_path / "long.npz", np.tile(inputs, 2), np.tile(labels, 2))
  with pytest.raises(ValueError, match=r"sequences of length \d+ exceed the model's learned "
                                       r"positions \(max_len=\d+\)"):
    evaluate(str(tiny_run[1]), npz_path=str(tmp_path / "long.npz"))
  save_npz(tmp_path / "vocab.npz", inputs + 16, labels)
  with pytest.raises(ValueError, match="token id .* does not fit vocab_size=16"):
    evaluate(str(tiny_run[1]), npz_path=str(tmp_path / "vocab.npz"))


def test_scores_count_only_examples_with_targets():
  """16 examples, 8 without targets and 8 with every target wrong: exact match 0, not 0.5;
  no target at all is an error naming the set, not 0 / 0."""
  counts = np.array([[0, 0]] * 8 + [[1, 3]] * 8)
  assert train_lib.count_scores(counts) == {"accuracy": 1 / 3, "exact_match": 0.0,
                                            "targets": 24}
  counts[8:] = [[2, 2]] * 4 + [[0, 1]] * 4
  assert train_lib.count_scores(counts)["exact_match"] == 0.5
  with pytest.raises(ValueError, match="evaluation set npz: no example has a target"):
    train_lib.count_scores(np.zeros((4, 2), np.int64), where="evaluation set npz")


def test_evaluate_checks_eval_examples(tiny_run):
  """0 is not replaced by the run's setting, and -1 is not a NumPy shape error."""
  for bad in (0, -1, 2.5):
    with pytest.raises(ValueError, match=f"eval_examples must be an int >= 1; got {bad}"):
      evaluate(str(tiny_run[1]), eval_examples=bad)


def test_an_evaluation_mesh_splits_the_run_batches():
  assert train_lib.splitting_devices(8, 64, 250) == 2
  assert train_lib.splitting_devices(4, 64, 256) == 4 and train_lib.splitting_devices(1, 7) == 1
  assert train_lib.evaluation_mesh(from_config_dict(tiny_config())).size == 1


def text_config(data_dir, **train):
  """A one-layer softmax + RoPE model on the byte-level text task (T = 32) of a cache at
  `data_dir` (`text_cache`)."""
  config = tiny_config(**{"batch_size": 4, "num_steps": 3, "warmup_steps": 1,
                          "eval_examples": 8, "eval_batch_size": 4, **train})
  config.task = type(config.task)({"name": "text", "seq_len": 32, "data_dir": str(data_dir)})
  config.model.update({"mixer": "softmax", "pos_emb": "none"})
  config.model.options.softmax.update({"positions": "rope"})
  return config


def text_cache(folder):
  """A small text cache of random lowercase documents (no network)."""
  from vla_jax.tasks import text  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  docs = {f"doc/{i}": bytes(rng.integers(97, 123, int(rng.integers(300, 600)), np.uint8))
          for i in range(80)}
  text.write_splits(docs, str(folder))
  return folder


def test_a_text_run_reports_bits_per_byte_overall_and_by_position(tmp_path):
  """The loss of a text set is the mean cross-entropy of its bytes (checked against the
  trained model's logits in NumPy), bits per byte its value over ln 2, and the position
  buckets split it by eighths of the context; evaluate.py scores a 4x longer context."""
  from vla_jax.tasks import make_task  # pylint: disable=import-outside-toplevel
  from lab import run_plots  # pylint: disable=import-outside-toplevel
  cache = str(text_cache(tmp_path / "cache"))
  workdir = str(tmp_path / "run")
  summary = train_and_evaluate(from_config_dict(text_config(cache)), workdir,
                               log=lambda s: None)
  scores = summary["evals"]["text_T32"]
  assert summary["bits_per_byte"] == scores["bits_per_byte"]
  np.testing.assert_allclose(scores["bits_per_byte"], scores["loss"] / np.log(2), rtol=1e-12)
  assert len(scores["bits_per_byte_by_position"]) == 8 and scores["targets"] == 8 * 32
  # Equal buckets, every position a target: the overall value is the buckets' mean.
  np.testing.assert_allclose(np.mean(scores["bits_per_byte_by_position"]),
                             scores["bits_per_byte"], rtol=1e-9)
  inputs, labels = make_task("text", {"seq_len": 32, "data_dir": cache}).eval_sets(0, 8)[
      "text_T32"]
  # Jitted: one program (eagerly, each operation of the forward pass compiles on its own).
  forward = nnx.jit(lambda model, tokens: model(tokens))
  logits = np.asarray(forward(train_lib.load_model(workdir), inputs), np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)
                         ) - logits.max(-1, keepdims=True)
  nll = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]            # [N, T]
  np.testing.assert_allclose(scores["loss"], nll.mean(), rtol=1e-5)
  np.testing.assert_allclose(scores["bits_per_byte_by_position"],
                             nll.reshape(8, 8, 4).mean((0, 2)) / np.log(2), rtol=1e-5)
  # Length extrapolation: a context of 128 (the run's model was built for 32).
  longer = evaluate(workdir, task=("text", {"seq_len": 32, "eval_lengths": (128,),
                                            "data_dir": cache}), eval_batch_size=1)
  assert list(longer["evals"]) == ["text_T128"] and longer["evals"]["text_T128"]["targets"] == (
      2 * 128)
  assert len(longer["evals"]["text_T128"]["bits_per_byte_by_position"]) == 8
  got = run_plots.read_curves(os.path.join(workdir, "metrics.jsonl"))["eval"]["text_T32"]
  assert got["bits_per_byte"] == [(3, scores["bits_per_byte"])]
  assert os.path.exists(run_plots.plot_run(workdir))


@pytest.mark.parametrize("name,low,high", [("text_small", 9.5e6, 12.5e6),
                                           ("text_medium", 37e6, 45e6)])
def test_text_configs_sizes_for_every_mixer(name, low, high):
  """configs/text_*.py build for every mixer (chosen by override) at ~10M and ~40M parameters
  (Gated DeltaNet, with fla's output gate and values twice the key width, up to 1.3x that),
  context 1024 with base's impl; softmax attention has RoPE and no model gets a position
  table."""
  import importlib  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vla_jax.models import LanguageModel  # pylint: disable=import-outside-toplevel
  module = importlib.import_module(f"vla_jax.configs.{name}")
  for mixer in ("softmax", "linear", "deltanet", "gated_deltanet", "vla"):
    config = module.get_config()
    config.model.mixer = mixer
    experiment = from_config_dict(config)
    model = experiment.model
    assert (model.vocab_size, model.max_len, model.pos_emb) == (256, 1024, "none")
    assert model.impl == base.get_base_config().model.impl
    if mixer == "softmax":
      assert model.options["positions"] == "rope"
    shapes = nnx.eval_shape(lambda m=model: LanguageModel(m, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(shapes, nnx.Param)))
    assert low < count < high * (1.3 if mixer == "gated_deltanet" else 1), (name, mixer, count)
