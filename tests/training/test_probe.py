"""Training-time diagnostics (`vla_jax.training.probe`, train.diagnostics_every): the rows of a
run and of a sweep, their values against float64 references, and the seed-comparison plot."""

import json
import pathlib
import struct
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

import oracles
from vla_jax import diagnostics
from vla_jax.models import LanguageModel, ModelConfig
from vla_jax.training import curves, from_config_dict, jsonl, probe, train_and_evaluate
from vla_jax.training.sweep import train_sweep

ROOT = pathlib.Path(__file__).resolve().parents[2]

import test_train  # noqa: E402  pylint: disable=wrong-import-position

VLA_KEYS = {"cond_A.t1", "cond_A.t3", "cond_A.t7", "align_mean", "align_p10", "u_norm_mean",
            "u_norm_min", "state_norm_end", "param.q_proj", "param.k_proj", "param.v_proj",
            "param.u_proj", "param.conv", "param.out", "param.mlp", "param.norms"}
GRAD_GROUPS = {"q_proj", "k_proj", "v_proj", "u_proj", "conv", "out", "mlp", "norms"}


def tiny_config(**train):
  """A one-layer VLA model of d_model 8 on MQAR with T = 7 (2 pairs): the cheapest to compile."""
  config = test_train.tiny_config(**{"num_steps": 4, "batch_size": 4, "log_every": 2,
                                     "diagnostics_every": 2, "eval_examples": 4,
                                     "eval_batch_size": 4, **train})
  config.task.update({"n_pairs": 2})
  config.model.update({"num_layers": 1, "d_model": 8, "num_heads": 1, "head_dim": 8,
                       "mlp_ratio": 1})
  return from_config_dict(config)


def _split(workdir):
  rows = jsonl.read_rows(str(pathlib.Path(workdir) / "metrics.jsonl"))
  return ([r for r in rows if "loss" in r], [r for r in rows if curves.DIAGNOSTICS_KEY in r])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("probe_run")
  train_and_evaluate(tiny_config(), str(workdir), log=lambda s: None)
  return workdir


def test_a_run_logs_finite_diagnostics_and_gradient_norms_by_group(run):
  train, diag = _split(run)
  assert [r["step"] for r in diag] == [0, 2, 4] and [r["step"] for r in train] == [2, 4]
  for r in diag:
    values = r[curves.DIAGNOSTICS_KEY]
    assert set(values) == {f"layer0.{k}" for k in VLA_KEYS} | {
        "param.embed", "param.pos_embed", "param.final_norm"}
    assert all(np.isfinite(v) for v in values.values())
    assert values["layer0.cond_A.t7"] >= values["layer0.cond_A.t1"] >= 1.0
    assert 0.0 < values["layer0.align_p10"] <= values["layer0.align_mean"] <= 1.0 + 1e-6
    # u = penalty_scale * unit(W_u k_raw), penalty_scale = 1 (the default)
    np.testing.assert_allclose(values["layer0.u_norm_mean"], 1.0, rtol=1e-5)
  for r in train:
    groups = {k: v for k, v in r.items() if "grad." in k}
    assert set(groups) == {f"layer0.grad.{g}" for g in GRAD_GROUPS} | {
        "grad.embed", "grad.pos_embed", "grad.final_norm"}
    # The groups partition the parameters: their norms make up the global one.
    np.testing.assert_allclose(np.sqrt(sum(v ** 2 for v in groups.values())), r["grad_norm"],
                               rtol=1e-5)


def test_a_sweep_logs_the_same_diagnostics_per_run(run, tmp_path):
  rows = train_sweep(tiny_config(), [0, 1], [1e-2], str(tmp_path), log=lambda s: None)
  assert [r["seed"] for r in rows] == [0, 1]
  train, diag = _split(tmp_path)
  single_train, single_diag = _split(run)
  assert [r["step"] for r in diag] == [0, 2, 4]
  for r, single in zip(diag, single_diag):
    values = r[curves.DIAGNOSTICS_KEY]
    assert set(values) == set(single[curves.DIAGNOSTICS_KEY])
    assert all(len(v) == 2 and np.all(np.isfinite(v)) for v in values.values())
    for key, value in single[curves.DIAGNOSTICS_KEY].items():   # seed 0 is the single run
      np.testing.assert_allclose(values[key][0], value, rtol=2e-4, atol=1e-6, err_msg=key)
    assert values["layer0.param.u_proj"][0] != values["layer0.param.u_proj"][1]
  for r, single in zip(train, single_train):
    for key in single:
      if "grad" in key:
        np.testing.assert_allclose(r[key][0], single[key], rtol=2e-4, err_msg=key)
  out = curves.plot_diagnostics([str(tmp_path), str(run)], str(tmp_path / "d.png"))
  assert pathlib.Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_vla_layer_metrics_match_float64_references():
  config = ModelConfig(vocab_size=13, max_len=16, mixer="vla", d_model=8, num_heads=2,
                       num_layers=1, mixer_options={"penalty_scale": 1.5})
  model = LanguageModel(config, rngs=nnx.Rngs(3))
  tokens = jax.random.randint(jax.random.key(4), (3, 16), 0, 13)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  model_of = lambda p: nnx.merge(graphdef, p, rest)
  got, layer = jax.jit(lambda p, x: (probe.probe_metrics(model_of, p, x),
                                     diagnostics.vla_layer_inputs(model_of(p), x)[0]))(
                                         params, tokens)
  q, k, v, u = (np.asarray(layer[n], np.float64) for n in "qkvu")
  conds, aligns = {}, []
  for t in range(1, 17):
    A = oracles.vla(q[:, :t], k[:, :t], v[:, :t], u[:, :t])[2]       # [B, H, dk, dk]
    eig = np.linalg.eigvalsh(A)
    conds[t] = np.median(eig[..., -1] / eig[..., 0])
    khat = k[:, t - 1] / np.linalg.norm(k[:, t - 1], axis=-1, keepdims=True)
    w = np.einsum("bhij,bhj->bhi", A, khat)
    aligns.append(np.sum(khat * w, -1) / np.linalg.norm(w, axis=-1))
  aligns = np.stack(aligns)
  assert probe.cond_positions(16) == [2, 8, 16]
  for t in (2, 8, 16):
    np.testing.assert_allclose(got[f"layer0.cond_A.t{t}"], conds[t], rtol=1e-4)
  assert conds[16] > 3.0     # penalty_scale 1.5: a spread spectrum, not A ~ I
  np.testing.assert_allclose(got["layer0.align_mean"], aligns.mean(), rtol=1e-5)
  np.testing.assert_allclose(got["layer0.align_p10"], np.percentile(aligns, 10), rtol=1e-5)
  np.testing.assert_allclose(got["layer0.u_norm_mean"], 1.5, rtol=1e-5)
  S = oracles.vla(q, k, v, u)[1]
  np.testing.assert_allclose(got["layer0.state_norm_end"],
                             np.median(np.linalg.norm(S, axis=(-2, -1))), rtol=1e-4)


def _synthetic_sweep(workdir, finals):
  """A sweep folder of 3 seeds with two layers' diagnostics and finished results."""
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({
      "task": {"name": "mqar"}, "model": {"mixer": "vla"}, "train": {"num_steps": 4},
      "sweep": {"seeds": [0, 1, 2], "learning_rates": [3e-3]}}))
  rows = []
  for step in (0, 2, 4):
    probe_values = {f"layer{i}.{k}": [1.0 + step + r for r in range(3)] for i in (0, 1)
                    for k in ("cond_A.t2", "cond_A.t8", "align_mean", "align_p10",
                              "state_norm_end")}
    rows.append({"step": step, curves.DIAGNOSTICS_KEY: probe_values})
    if step:
      rows.append({"step": step, "loss": [2.0, 1.0, float("nan")], "accuracy": [0.1, 0.5, 0.2],
                   "grad_norm": [1.0, 2.0, 3.0], "layer0.grad.u_proj": [0.1, 0.2, 0.3],
                   "elapsed_s": 1.0})
  jsonl.append_rows(str(workdir / "metrics.jsonl"), rows)
  jsonl.write_rows(str(workdir / "sweep_results.jsonl"), [
      {"seed": s, "learning_rate": 3e-3, "test": {"mqar": {"accuracy": a}}}
      for s, a in enumerate(finals)])


def test_diagnostics_plot_compares_solved_and_failed_seeds(tmp_path):
  _synthetic_sweep(tmp_path / "sweep", [0.97, 0.25, 0.99])
  got = curves.read_diagnostics(str(tmp_path / "sweep"))
  assert got["labels"] == ["sweep: seed 0, lr 0.003", "sweep: seed 1, lr 0.003",
                           "sweep: seed 2, lr 0.003"]
  assert got["final"] == [0.97, 0.25, 0.99]
  assert curves.run_outcomes(got["final"] + [None]) == ["solved", "failed", "solved", "unknown"]
  assert got["probe"]["layer1.cond_A.t8"] == [(0, [1.0, 2.0, 3.0]), (2, [3.0, 4.0, 5.0]),
                                              (4, [5.0, 6.0, 7.0])]
  assert got["train"]["layer0.grad.u_proj"][0] == (2, [0.1, 0.2, 0.3])
  assert "elapsed_s" not in got["train"]
  proc = subprocess.run(
      [sys.executable, str(ROOT / "experiments" / "plot_run.py"),
       f"--workdir={tmp_path / 'sweep'}", f"--out={tmp_path / 'c.png'}",
       f"--diagnostics_out={tmp_path / 'd.png'}", "--solved=0.95"],
      capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == [str(tmp_path / "c.png"), str(tmp_path / "d.png")]
  png = (tmp_path / "d.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1350, 1260)
