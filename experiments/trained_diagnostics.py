r"""Memory norms and VLA's Jacobians inside trained models (RESULTS.md items 1 and 2).

    python experiments/trained_diagnostics.py --out=trained.jsonl --workdir=runs/diag \
        [--mixers=vla,linear,deltanet,gated_deltanet] [--num_steps=1500] [--Ts=1000,16384]

Trains (or resumes) one model per recurrent mixer on MQAR at T = --train_T (default 256;
configs/mqar_long.py: 8 pairs, vocabulary 256; width --d_model) without position embeddings,
so that it runs on any length, then
feeds it longer MQAR sequences of the same task (T in --Ts) and records, from
`vla_jax.diagnostics`:
  - ||S_t||_F in every layer at t = 1, 10, 100, 1000, ... (median and max over sequences and
    heads), and the full median trace for the plot (`layer_state_norms`);
  - for VLA layers, the spectral norm of each token's Jacobian I - khat_t a_t^T (measured and
    closed form) and of its products over spans of 16, 256 and 1024 tokens.
Rows are appended to --out as JSON lines.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags, logging  # noqa: E402

_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are appended to.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/trained_diagnostics", "Parent of the runs.")
_MIXERS = flags.DEFINE_list("mixers", ["vla", "linear", "deltanet", "gated_deltanet"],
                            "Recurrent mixers to train and measure.")
_STEPS = flags.DEFINE_integer("num_steps", 1500, "Training steps per model.")
_LR = flags.DEFINE_float("learning_rate", 3e-3, "Peak learning rate.")
_TS = flags.DEFINE_list("Ts", ["1000", "16384"], "Lengths of the measured sequences.")
_EXAMPLES = flags.DEFINE_integer("examples", 8, "Sequences per measured length.")
_TRAIN_T = flags.DEFINE_integer("train_T", 256, "Training sequence length (MQAR, 8 pairs).")
_D_MODEL = flags.DEFINE_integer("d_model", 128, "Model width (heads of d_h = 32).")
_CHUNK = flags.DEFINE_integer("chunk_size", 64, "Chunk size of the recurrences in training.")
flags.mark_flags_as_required(["out"])


def marks(T):
  return sorted({t for t in (1, 10, 100, 1000, 10000, 100000) if t <= T} | {T})


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from configs import mqar_long  # pylint: disable=g-import-not-at-top
  from vla_jax import diagnostics  # pylint: disable=g-import-not-at-top
  from vla_jax.tasks import make_task  # pylint: disable=g-import-not-at-top
  from vla_jax.training import (from_config_dict, load_model,  # pylint: disable=g-import-not-at-top
                                train_and_evaluate)

  def emit(row):
    print(json.dumps(row), flush=True)
    with open(_OUT.value, "a") as f:
      f.write(json.dumps(row) + "\n")

  for mixer in _MIXERS.value:
    config = mqar_long.get_config(str(_TRAIN_T.value))
    config.model.mixer = mixer
    config.model.d_model = _D_MODEL.value
    config.model.num_heads = _D_MODEL.value // 32
    config.model.chunk_size = _CHUNK.value
    config.model.pos_emb = "none"
    config.train.update({"num_steps": _STEPS.value, "learning_rate": _LR.value,
                         "checkpoint_every": 0, "log_every": 250})
    exp = from_config_dict(config)
    workdir = os.path.join(_WORKDIR.value, mixer)
    summary = train_and_evaluate(exp, workdir, log=lambda s: print(s, file=sys.stderr))
    if summary["evals"] is None:  # stopped by SIGTERM before its evaluation: nothing to report
      sys.exit(f"{workdir}: stopped at step {summary['steps']}; run again to resume")
    emit({"kind": "trained_model", "mixer": mixer, "train_T": _TRAIN_T.value,
          "d_model": _D_MODEL.value, "accuracy": summary["accuracy"],
          "steps": summary["steps"], "learning_rate": _LR.value})
    model = load_model(workdir)
    for T in (int(t) for t in _TS.value):
      task = make_task("mqar", {**dict(exp.task_fields), "seq_len": T})
      tokens = jnp.asarray(next(iter(task.eval_sets(7, _EXAMPLES.value).values()))[0])
      traces = jax.jit(diagnostics.layer_state_norms)(model, tokens)
      for layer, trace in enumerate(traces):
        trace = np.asarray(trace)                                  # [B, T, H]
        median = np.median(trace, axis=(0, 2))
        emit({"kind": "trained_state_norm", "mixer": mixer, "layer": layer, "T": T,
              "t": marks(T), "median": [float(median[t - 1]) for t in marks(T)],
              "max": [float(trace[:, t - 1].max()) for t in marks(T)],
              "trace_median": [float(x) for x in median[np.unique(np.geomspace(
                  1, T, 200).astype(int)) - 1]],
              "trace_t": [int(x) for x in np.unique(np.geomspace(1, T, 200).astype(int))]})
      if mixer == "vla":
        for layer, feats in enumerate(diagnostics.vla_layer_inputs(model, tokens)):
          jac = diagnostics.vla_jacobian_norms(feats["k"], feats["u"], lam0=feats["lam0"])
          m = np.asarray(jac["measured"]).ravel()
          gap = np.abs(m - np.asarray(jac["closed_form"]).ravel()).max()
          row = {"kind": "trained_jacobian", "layer": layer, "T": T, "tokens": int(m.size),
                 "p50": float(np.median(m)), "p99": float(np.quantile(m, 0.99)),
                 "max": float(m.max()), "frac_above_1": float(np.mean(m > 1 + 1e-5)),
                 "closed_form_gap": float(gap),
                 "cosine_p50": float(np.median(np.asarray(jac["cosine"]))),
                 "cosine_min": float(np.min(np.asarray(jac["cosine"]))),
                 "histogram": np.histogram(m, bins=40, range=(1.0, 1.2))[0].tolist()}
          for span in (16, 256, 1024):
            if span <= T:
              p = diagnostics.vla_jacobian_product_norms(feats["k"], feats["u"], span=span,
                                                         lam0=feats["lam0"])
              row[f"product_span_{span}_max"] = float(jnp.max(p))
              row[f"product_span_{span}_p50"] = float(jnp.median(p))
          emit(row)


if __name__ == "__main__":
  app.run(main)
