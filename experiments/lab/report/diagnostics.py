"""The rows of RESULTS.md sections 1 and 2: memory norms and VLA's state Jacobians, on random
inputs and inside trained models (measured with `vla_jax.diagnostics`).

Row kinds: `state_norm_random` (one per mark t), `jacobian_random`, `trained` (a trained VLA
run's layers on its own evaluation inputs), `trained_model`, `trained_state_norm` and
`trained_jacobian` (models trained on MQAR, measured at longer T).
"""

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax import diagnostics

RANDOM_MIXERS = ("linear_attention", "deltanet", "gated_deltanet", "vla")
PRODUCT_SPANS = (16, 256, 1024)   # spans of the Jacobian products inside trained models

# The diagnostics, compiled whole (op by op they would compile every operation on its own).
_state_norm_trace = jax.jit(diagnostics.state_norm_trace, static_argnums=0,
                            static_argnames="lam0")
_jacobian_norms = jax.jit(diagnostics.vla_jacobian_norms, static_argnames="lam0")
_product_norms = jax.jit(diagnostics.vla_jacobian_product_norms, static_argnames=("span", "lam0"))
_layer_inputs = jax.jit(diagnostics.vla_layer_inputs)
_layer_state_norms = jax.jit(diagnostics.layer_state_norms)


def layer_inputs(model, tokens):
  """`diagnostics.vla_layer_inputs`, compiled; lam0 as a Python float."""
  return [dict(f, lam0=float(f["lam0"])) for f in _layer_inputs(model, tokens)]


def marks(T):
  """t = 1, 10, 100, ... up to T, and T."""
  return sorted({t for t in (1, 10, 100, 1000, 10000, 100000) if t <= T} | {T})


def random_inputs(T, H, d, seed):
  """(q, k, v, u, beta, log_decay): q, k, v ~ N(0, 1) [1, T, H, d]; u a random unit vector
  / sqrt(d) (as the VLA layer scales it); beta = sigmoid(N(0, 1)) and Gated DeltaNet's log
  decay -0.01 softplus(N(0, 1)), [1, T, H]; float32."""
  keys = jax.random.split(jax.random.key(seed), 6)
  q, k, v = (jax.random.normal(keys[i], (1, T, H, d)) for i in range(3))
  u = jax.random.normal(keys[3], (1, T, H, d))
  u = u / jnp.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(d)
  beta = jax.nn.sigmoid(jax.random.normal(keys[4], (1, T, H)))
  log_decay = -0.01 * jax.nn.softplus(jax.random.normal(keys[5], (1, T, H)))
  return q, k, v, u, beta, log_decay


def jacobian_summary(k, u, lam0):
  """Statistics of the spectral norm of I - khat_t a_t^T over every token of k, u
  ([B, T, H, d]): tokens, mean, p50, p99, max, share above 1, the largest gap to the closed
  form, and the median cosine a_t . khat_t."""
  out = _jacobian_norms(k, u, lam0=float(lam0))
  m = np.asarray(out["measured"]).ravel()
  return {"tokens": int(m.size), "mean": float(m.mean()), "p50": float(np.median(m)),
          "p99": float(np.quantile(m, 0.99)), "max": float(m.max()),
          "frac_above_1": float(np.mean(m > 1 + 1e-5)),
          "max_abs_closed_form_gap": float(
              np.abs(m - np.asarray(out["closed_form"]).ravel()).max()),
          "cosine_p50": float(np.median(np.asarray(out["cosine"])))}


def random_input_rows(max_T, heads, head_dim, seed, jacobian_T=4096):
  """(rows, traces): ||S_t||_F of each mixer in RANDOM_MIXERS on one random sequence of
  max_T tokens (median over heads) at `marks(max_T)`, and the Jacobian statistics of VLA on
  its first `jacobian_T` tokens; traces {mixer: [max_T] median norm} for the plot."""
  q, k, v, u, beta, log_decay = random_inputs(max_T, heads, head_dim, seed)
  traces = {m: np.median(np.asarray(_state_norm_trace(m, q, k, v, u=u, beta=beta,
                                                      log_decay=log_decay)[0]), axis=-1)
            for m in RANDOM_MIXERS}
  rows = [{"kind": "state_norm_random", "t": t, "H": heads, "d_h": head_dim,
           **{m: float(traces[m][t - 1]) for m in RANDOM_MIXERS}} for t in marks(max_T)]
  n = min(max_T, jacobian_T)
  rows.append({"kind": "jacobian_random", **jacobian_summary(k[:, :n], u[:, :n], 1.0)})
  return rows, traces


def trained_run_rows(model, inputs, run_name):
  """Rows of kind `trained`: for each VLA layer of `model` on `inputs` ([B, T] tokens), the
  Jacobian statistics, the state norms and the largest product norm over spans 4, 8 and T."""
  rows = []
  T = inputs.shape[1]
  for layer, feats in enumerate(layer_inputs(model, jnp.asarray(inputs))):
    norms = _state_norm_trace("vla", feats["q"], feats["k"], feats["v"], u=feats["u"],
                              lam0=feats["lam0"])
    products = {f"product_span_{s}_max": float(jnp.max(_product_norms(
        feats["k"], feats["u"], span=s, lam0=feats["lam0"]))) for s in (4, 8, T) if s <= T}
    rows.append({"kind": "trained", "workdir": run_name, "layer": layer, "T": int(T),
                 "state_norm_final_median": float(jnp.median(norms[:, -1])),
                 "state_norm_max": float(jnp.max(norms)),
                 **jacobian_summary(feats["k"], feats["u"], feats["lam0"]), **products})
  return rows


def long_sequence_rows(model, mixer, tokens):
  """Rows of a model trained on MQAR, fed `tokens` ([B, T], longer than its training
  sequences): one `trained_state_norm` row per layer (||S_t|| median and max over sequences
  and heads at marks(T), and a 200-point median trace), and for VLA one `trained_jacobian` row
  per layer (Jacobian statistics, a histogram on [1, 1.2], products over PRODUCT_SPANS)."""
  T = tokens.shape[1]
  rows = []
  trace_t = np.unique(np.geomspace(1, T, 200).astype(int))
  for layer, trace in enumerate(_layer_state_norms(model, tokens)):
    trace = np.asarray(trace)                                  # [B, T, H]
    median = np.median(trace, axis=(0, 2))
    rows.append({"kind": "trained_state_norm", "mixer": mixer, "layer": layer, "T": T,
                 "t": marks(T), "median": [float(median[t - 1]) for t in marks(T)],
                 "max": [float(trace[:, t - 1].max()) for t in marks(T)],
                 "trace_median": [float(x) for x in median[trace_t - 1]],
                 "trace_t": [int(x) for x in trace_t]})
  if mixer == "vla":
    for layer, feats in enumerate(layer_inputs(model, tokens)):
      jac = _jacobian_norms(feats["k"], feats["u"], lam0=feats["lam0"])
      m = np.asarray(jac["measured"]).ravel()
      row = {"kind": "trained_jacobian", "layer": layer, "T": T, "tokens": int(m.size),
             "p50": float(np.median(m)), "p99": float(np.quantile(m, 0.99)),
             "max": float(m.max()), "frac_above_1": float(np.mean(m > 1 + 1e-5)),
             "closed_form_gap": float(np.abs(m - np.asarray(jac["closed_form"]).ravel()).max()),
             "cosine_p50": float(np.median(np.asarray(jac["cosine"]))),
             "cosine_min": float(np.min(np.asarray(jac["cosine"]))),
             "histogram": np.histogram(m, bins=40, range=(1.0, 1.2))[0].tolist()}
      for span in PRODUCT_SPANS:
        if span <= T:
          p = _product_norms(feats["k"], feats["u"], span=span, lam0=feats["lam0"])
          row[f"product_span_{span}_max"] = float(jnp.max(p))
          row[f"product_span_{span}_p50"] = float(jnp.median(p))
      rows.append(row)
  return rows
