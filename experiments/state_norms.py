"""Memory norms and VLA's state Jacobians: random inputs, and the VLA layers of a trained model.

    python experiments/state_norms.py --out_dir=results [--max_T=65536] [--workdir=runs/demo]

Random inputs (one sequence, H heads of d_h, q, k, v ~ N(0, 1), u ~ unit / sqrt(d_h) as in the
VLA layer, beta = sigmoid(N(0, 1)), Gated DeltaNet's log decay -0.01 softplus(N(0, 1))): the
Frobenius norm ||S_t||_F of linear attention (ELU + 1 features), DeltaNet, Gated DeltaNet and
VLA at t = 1, 10, 100, 1,000, 10,000, ... up to --max_T (median over heads), a log-log plot,
and the distribution of the spectral norm of VLA's Jacobian I - khat_t a_t^T with its closed
form. With --workdir (a trained VLA run), the same Jacobian statistics and state norms on the
run's evaluation inputs, from `vla_jax.diagnostics`.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from vla_jax import diagnostics

_MAX_T = flags.DEFINE_integer("max_T", 65536, "Longest sequence for the random-input traces.")
_HEADS = flags.DEFINE_integer("heads", 4, "Heads H (random inputs).")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 32, "Head dim d_h (random inputs).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Optional trained VLA run to measure.")
_EXAMPLES = flags.DEFINE_integer("examples", 256, "Evaluation examples of the trained run.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Folder for the JSONL rows and the PNG plot.")

MIXERS = ("linear_attention", "deltanet", "gated_deltanet", "vla")


def random_inputs(T, H, d, seed):
  keys = jax.random.split(jax.random.key(seed), 6)
  q, k, v = (jax.random.normal(keys[i], (1, T, H, d)) for i in range(3))
  u = jax.random.normal(keys[3], (1, T, H, d))
  u = u / jnp.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(d)
  beta = jax.nn.sigmoid(jax.random.normal(keys[4], (1, T, H)))
  log_decay = -0.01 * jax.nn.softplus(jax.random.normal(keys[5], (1, T, H)))
  return q, k, v, u, beta, log_decay


def jacobian_summary(k, u, lam0):
  out = diagnostics.vla_jacobian_norms(k, u, lam0=lam0)
  m = np.asarray(out["measured"]).ravel()
  return {"tokens": int(m.size), "mean": float(m.mean()), "p50": float(np.median(m)),
          "p99": float(np.quantile(m, 0.99)), "max": float(m.max()),
          "frac_above_1": float(np.mean(m > 1 + 1e-5)),
          "max_abs_closed_form_gap": float(
              np.abs(m - np.asarray(out["closed_form"]).ravel()).max()),
          "cosine_p50": float(np.median(np.asarray(out["cosine"])))}


def main(argv):
  del argv
  rows = []
  H, d, T = _HEADS.value, _HEAD_DIM.value, _MAX_T.value
  q, k, v, u, beta, log_decay = random_inputs(T, H, d, _SEED.value)
  marks = sorted({t for t in (1, 10, 100, 1000, 10000, 100000) if t <= T} | {T})
  traces = {}
  print(f"||S_t||_F, random inputs, H={H}, d_h={d} (median over heads)")
  print(f"{'t':>8} | " + " | ".join(f"{m:>16}" for m in MIXERS))
  for mixer in MIXERS:
    trace = jax.jit(diagnostics.state_norm_trace, static_argnums=0)(
        mixer, q, k, v, u=u, beta=beta, log_decay=log_decay)
    traces[mixer] = np.median(np.asarray(trace[0]), axis=-1)  # [T]
  for t in marks:
    print(f"{t:>8} | " + " | ".join(f"{traces[m][t - 1]:16.2f}" for m in MIXERS))
    rows.append({"kind": "state_norm_random", "t": t, "H": H, "d_h": d,
                 **{m: float(traces[m][t - 1]) for m in MIXERS}})
  jac = jacobian_summary(k[:, :min(T, 4096)], u[:, :min(T, 4096)], 1.0)
  print("VLA Jacobian spectral norm, random inputs (first 4096 tokens):", json.dumps(jac))
  rows.append({"kind": "jacobian_random", **jac})

  if _WORKDIR.value:
    from vla_jax.training import config_from_workdir, load_model  # pylint: disable=import-outside-toplevel
    config = config_from_workdir(_WORKDIR.value)
    model = load_model(_WORKDIR.value)
    inputs, _ = next(iter(config.make_task().eval_sets(config.train.seed + 1,
                                                       _EXAMPLES.value).values()))
    for layer, feats in enumerate(diagnostics.vla_layer_inputs(model, jnp.asarray(inputs))):
      jac = jacobian_summary(feats["k"], feats["u"], feats["lam0"])
      norms = diagnostics.state_norm_trace("vla", feats["q"], feats["k"], feats["v"],
                                           u=feats["u"], lam0=feats["lam0"])
      spans = [s for s in (4, 8, inputs.shape[1]) if s <= inputs.shape[1]]
      products = {f"product_span_{s}_max": float(jnp.max(diagnostics.vla_jacobian_product_norms(
          feats["k"], feats["u"], span=s, lam0=feats["lam0"]))) for s in spans}
      row = {"kind": "trained", "workdir": os.path.basename(os.path.normpath(_WORKDIR.value)),
             "layer": layer, "T": int(inputs.shape[1]),
             "state_norm_final_median": float(jnp.median(norms[:, -1])),
             "state_norm_max": float(jnp.max(norms)), **jac, **products}
      print("trained VLA layer", layer, json.dumps(row))
      rows.append(row)

  if _OUT_DIR.value:
    os.makedirs(_OUT_DIR.value, exist_ok=True)
    with open(os.path.join(_OUT_DIR.value, "state_norms.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    fig, ax = plt.subplots(figsize=(6, 4))
    t = np.arange(1, T + 1)
    for mixer in MIXERS:
      ax.loglog(t, traces[mixer], label=mixer)
    ax.set_xlabel("token t")
    ax.set_ylabel("||S_t||_F (median over heads)")
    ax.set_title(f"Memory norm, random inputs, d_h = {d}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(_OUT_DIR.value, "state_norms.png"), dpi=120)


if __name__ == "__main__":
  app.run(main)
