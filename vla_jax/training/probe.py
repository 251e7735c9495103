"""Training-time diagnostics: gradient norms by layer and projection, and what each layer does
on one fixed probe batch.

With `train.diagnostics_every` = N > 0:
- the training step adds `group_norms` of its gradients to every training row of
  metrics.jsonl (names "grad.<g>" and "layer<i>.grad.<g>", beside the global `grad_norm`);
- `train_and_evaluate` and `train_sweep` measure each run on its probe batch (`probe_inputs`:
  train.batch_size examples of the task's training stream at index PROBE_STEP, which no run
  trains on) at step 0 and every N steps with `probe_metrics`, and append a row
  {"step": s, "diagnostics": {name: value}}.
A sweep's values are lists, one per run in stacking order. The training itself is unchanged.

Names; i is the block index; statistics over examples and heads unless said:
  grad.<g>, param.<g>              gradient / parameter norms of the model's own parameters
                                   (g: embed, pos_embed, final_norm; head when untied)
  layer<i>.grad.<g>, .param.<g>    per block: g is each of the mixer's submodules (VLA: q_proj,
                                   k_proj, v_proj, u_proj, conv, out = the readout's LayerNorm
                                   and W_o), mlp, and norms (the block's two LayerNorms)
  layer<i>.state_norm_end          median of ||S_T||_F (recurrent mixers)
  layer<i>.key_cos_mean            mean |cos| between the key directions of two tokens of an
                                   example (`diagnostics.key_collinearity`; recurrent mixers)
  layer<i>.beta_mean, beta_p10     the write strengths beta_t over tokens (DeltaNet, Gated
                                   DeltaNet, VLA with `beta`)
  layer<i>.decay_mean, decay_p10,  the per-token decays gamma_t = exp(g_t) of Gated DeltaNet's
    decay_p90                      gate (1: keeps the state, 0: forgets it)
VLA layers only:
  layer<i>.cond_A.t<t>             median of cond(A_t) = cond(M_t), M_t = lam0 I + sum u_s u_s^T,
                                   at t = T/8, T/2 and T (`diagnostics.penalty_conditioning`)
  layer<i>.align_mean, align_p10   mean and 10th percentile of a_t . khat_t over tokens,
                                   examples and heads (1: A_t leaves khat_t's direction alone)
  layer<i>.u_norm_mean, u_norm_min ||u_t||: penalty_scale by construction, less only where
                                   W_u k_raw has vanished (norm below 1e-6)
"""

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax import diagnostics
from vla_jax.layers.vla import VLAAttention
from vla_jax.training import curves

PROBE_STEP = 2**31 - 1   # the probe batch's index in the training stream: no run reaches it


def probe_inputs(task, seed: int, batch_size: int):
  """A run's fixed probe batch: inputs [batch_size, T] of `task`'s training stream under
  `seed`, at an index no run trains on."""
  return task.train_batch(seed, PROBE_STEP, batch_size)[0]


def cond_positions(T: int) -> list[int]:
  """The token counts at which cond(A_t) is measured: T/8, T/2 and T (at least 1, distinct)."""
  return sorted({max(T // 8, 1), max(T // 2, 1), T})


def _path_names(path):
  return [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]


def group_norms(tree, kind: str) -> dict:
  """Norms of groups of a parameter-shaped pytree (nnx.State of a `LanguageModel`'s params).

  Args:
    tree: gradients or parameters; kind: "grad" or "param", the middle of each name.

  Returns:
    {name: scalar}: "<kind>.<g>" for top-level groups and "layer<i>.<kind>.<g>" per block
    (g as in the module docstring).
  """
  squares = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    names = _path_names(path)
    if names[0] == "blocks":
      i, part = names[1], names[2]
      group = names[3] if part == "mixer" else ("norms" if part.startswith("norm") else part)
      name = f"layer{i}.{kind}.{group}"
    else:
      name = f"{kind}.{names[0]}"
    squares[name] = squares.get(name, 0.0) + jnp.sum(jnp.square(leaf.astype(jnp.float32)))
  return {name: jnp.sqrt(s) for name, s in squares.items()}


def vla_layer_metrics(layer: dict) -> dict:
  """cond(A_t), alignment and ||u|| statistics of one VLA layer.

  Args:
    layer: one entry of `diagnostics.vla_layer_inputs` (q, k, v, u [B, T, H, d_h], lam0).

  Returns:
    {"cond_A.t<t>", "align_mean", "align_p10", "u_norm_mean", "u_norm_min": scalar}.
  """
  k, u, lam0 = layer["k"], layer["u"], layer["lam0"]
  T = k.shape[1]
  positions = cond_positions(T)
  cond = diagnostics.penalty_conditioning(u, positions, lam0=lam0)    # [B, P, H]
  cond = jnp.median(jnp.moveaxis(cond, 1, 0).reshape(len(positions), -1), axis=1)
  khat, a = diagnostics.khat_and_write_directions(k, u, lam0)
  align = jnp.sum(khat * a, axis=-1).reshape(-1)
  u_norm = jnp.linalg.norm(u.astype(jnp.float32), axis=-1).reshape(-1)
  out = {f"cond_A.t{t}": c for t, c in zip(positions, cond)}
  out.update({"align_mean": jnp.mean(align), "align_p10": jnp.percentile(align, 10.0),
              "u_norm_mean": jnp.mean(u_norm), "u_norm_min": jnp.min(u_norm)})
  return out


def gate_metrics(layer: dict) -> dict:
  """The write strengths' and decays' statistics of one recurrent layer.

  Args:
    layer: {name: array} of `diagnostics.recurrent_layer_inputs` (beta, log_decay [B, T, H]
      where the layer has them).

  Returns:
    {"beta_mean", "beta_p10"} with beta, {"decay_mean", "decay_p10", "decay_p90"} of
    exp(log_decay) with a gate: scalars over tokens, examples and heads.
  """
  out = {}
  if "beta" in layer:
    beta = layer["beta"].astype(jnp.float32).reshape(-1)
    out.update({"beta_mean": jnp.mean(beta), "beta_p10": jnp.percentile(beta, 10.0)})
  if "log_decay" in layer:
    decay = jnp.exp(layer["log_decay"].astype(jnp.float32)).reshape(-1)
    out.update({"decay_mean": jnp.mean(decay), "decay_p10": jnp.percentile(decay, 10.0),
                "decay_p90": jnp.percentile(decay, 90.0)})
  return out


def probe_metrics(model_of, params, inputs) -> dict:
  """The probe diagnostics of one run (parameter norms, state norms, key collinearity, write
  strengths and decays, VLA's cond(A_t), alignment and ||u||; see the module docstring); jit-
  and vmap-able (a sweep maps it over its stacked runs).

  Args:
    model_of: params -> `LanguageModel` (`Trainer.model`, `SweepTrainer.model`).
    params: the run's parameters (nnx.State).
    inputs: [B, T] int, the probe batch's inputs.

  Returns:
    {name: float32 scalar}.
  """
  out = group_norms(params, "param")
  model = model_of(params)
  recurrent = [i for i, b in enumerate(model.blocks) if getattr(b.mixer, "RECURRENT", False)]
  for i, trace in zip(recurrent, diagnostics.layer_state_norms(model, inputs)):
    out[f"layer{i}.state_norm_end"] = jnp.median(trace[:, -1].reshape(-1))
  for i, layer in diagnostics.recurrent_layer_inputs(model, inputs):
    if inputs.shape[1] >= 2:
      out[f"layer{i}.key_cos_mean"] = diagnostics.key_collinearity(layer["k"])
    out.update({f"layer{i}.{name}": value for name, value in gate_metrics(layer).items()})
  vla = [i for i, b in enumerate(model.blocks) if isinstance(b.mixer, VLAAttention)]
  if vla:
    for i, layer in zip(vla, diagnostics.vla_layer_inputs(model, inputs)):
      out.update({f"layer{i}.{name}": value for name, value in vla_layer_metrics(layer).items()})
  return {name: jnp.asarray(value, jnp.float32) for name, value in out.items()}


def row(step: int, metrics: dict) -> dict:
  """The metrics.jsonl row of `probe_metrics` values (scalars, or [R] arrays of a sweep)."""
  values = {}
  for name, value in jax.device_get(metrics).items():
    value = np.asarray(value, np.float64)
    values[name] = value.tolist() if value.ndim else float(value)
  return {"step": int(step), curves.DIAGNOSTICS_KEY: values}

