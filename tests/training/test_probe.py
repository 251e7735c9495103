"""Training-time diagnostics (`vla_jax.training.probe`, train.diagnostics_every): the rows of a
run and of a sweep, and their values against float64 references (the seed-comparison plot of
these rows: tests/lab/test_run_plots.py)."""

import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

import oracles
from vla_jax import diagnostics
from vla_jax.models import LanguageModel, ModelConfig
from vla_jax.training import curves, from_config_dict, jsonl, probe, train_and_evaluate
from vla_jax.training.sweep import train_sweep

import test_train  # noqa: E402  pylint: disable=wrong-import-position

VLA_KEYS = {"cond_A.t1", "cond_A.t3", "cond_A.t7", "align_mean", "align_p10", "u_norm_mean",
            "u_norm_min", "state_norm_end", "key_cos_mean", "param.q_proj", "param.k_proj", "param.v_proj",
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
  khat = k / np.linalg.norm(k, axis=-1, keepdims=True)                # [B, T, H, d]
  cos = np.abs(np.einsum("bshd,bthd->bhst", khat, khat))
  off = ~np.eye(16, dtype=bool)
  np.testing.assert_allclose(got["layer0.key_cos_mean"], cos[..., off].mean(), rtol=1e-5)


@pytest.mark.parametrize("mixer,options,names", [
    ("gated_deltanet", {}, {"beta_mean", "beta_p10", "decay_mean", "decay_p10", "decay_p90"}),
    ("vla", {"beta": True}, {"beta_mean", "beta_p10"})])
def test_write_strengths_and_decays(mixer, options, names):
  """The probe's beta and decay statistics are those of the inputs the layer gives its
  recurrence (float64 NumPy over tokens, examples and heads); a layer without them has none
  (VLA without beta: test_a_run_logs_finite_diagnostics_and_gradient_norms_by_group)."""
  config = ModelConfig(vocab_size=13, max_len=16, mixer=mixer, d_model=8, num_heads=2,
                       num_layers=1, mixer_options=options)
  graphdef, params, rest = nnx.split(LanguageModel(config, rngs=nnx.Rngs(3)), nnx.Param, ...)
  model_of = lambda p: nnx.merge(graphdef, p, rest)
  tokens = jax.random.randint(jax.random.key(4), (3, 16), 0, 13)
  got, layers = jax.jit(lambda p, x: (probe.probe_metrics(model_of, p, x),
                                      diagnostics.recurrent_layer_inputs(model_of(p), x)))(
                                          params, tokens)
  assert {k.split(".", 1)[1] for k in got
          if k.split(".", 1)[1].startswith(("beta_", "decay_"))} == names
  (_, layer), = layers
  if "beta_mean" in names:
    beta = np.asarray(layer["beta"], np.float64)
    np.testing.assert_allclose(got["layer0.beta_mean"], beta.mean(), rtol=1e-5)
    np.testing.assert_allclose(got["layer0.beta_p10"], np.percentile(beta, 10), rtol=1e-5)
  if "decay_mean" in names:
    decay = np.exp(np.asarray(layer["log_decay"], np.float64))
    assert 0 < decay.min() and decay.max() < 1
    for key, want in (("mean", decay.mean()), ("p10", np.percentile(decay, 10)),
                      ("p90", np.percentile(decay, 90))):
      np.testing.assert_allclose(got[f"layer0.decay_{key}"], want, rtol=1e-5)
