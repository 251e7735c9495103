r"""Whole-model training throughput: tokens/s and peak memory of one full training step
(forward, backward, AdamW update) of `LanguageModel`, every mixer, at equal tokens per step.

    python experiments/bench_model.py --out=results/bench/model_h200.jsonl
    python experiments/bench_model.py --smoke          # a tiny CPU run of every row kind

Rows (one JSON line each, written as measured; the first line is a header with the device and
the settings):
  kind "step":  the model's training step; `ms` (median of --reps steps after 2 warm-up steps,
                each waited for), `tokens_per_s`, `peak_gib` (XLA's compiled memory analysis:
                arguments + outputs + temporaries - aliased), `impl` (what the mixer ran).
  kind "layer": one mixer layer alone, forward + backward (gradients of x and the layer's
                parameters), times `layers` (so that it reads against "step").
  kind "op":    the recurrence alone (q, k, v, u -> o), forward + backward, times `layers`:
                with "layer" it says how much of a VLA step is the op and how much the layer
                around it (projections, convolution, norms).
  kind "fla":   fla's `GatedDeltaNetForCausalLM` (PyTorch), the same widths, head dim and
                tokens per step, a full AdamW step (fused), `triton.testing.do_bench` median;
                written when torch and fla import and a GPU is there.

The model: --layers blocks of d_model --d_model, heads of --head_dims, MLP ratio 4, vocabulary
--vocab, bfloat16 activations and float32 parameters and optimizer state, the mixers'
library defaults otherwise (impl "auto" where the mixer has one).
"""

import json
import os
import time

from absl import app, flags

_MIXERS = flags.DEFINE_list("mixers", ["vla", "softmax", "gated_deltanet", "deltanet", "linear"],
                            "Mixers timed.")
_TS = flags.DEFINE_list("Ts", ["2048", "8192", "32768"], "Sequence lengths.")
_TOKENS = flags.DEFINE_integer("tokens", 32768, "Tokens per step (batch = tokens // T).")
_HEAD_DIMS = flags.DEFINE_list("head_dims", ["64", "128"], "Head dims.")
_D_MODEL = flags.DEFINE_integer("d_model", 1024, "Model width.")
_LAYERS = flags.DEFINE_integer("layers", 12, "Blocks.")
_VOCAB = flags.DEFINE_integer("vocab", 32000, "Vocabulary size.")
_IMPLS = flags.DEFINE_list("impls", [], "mixer:impl pairs (e.g. vla:pallas); other mixers take "
                           "the library's default impl.")
_KINDS = flags.DEFINE_list("kinds", ["step", "layer", "op", "fla"], "Row kinds measured.")
_SPLIT_MIXERS = flags.DEFINE_list("split_mixers", ["vla"],
                                  "Mixers whose step is split into op and layer rows.")
_REPS = flags.DEFINE_integer("reps", 5, "Timed steps (median).")
_BUDGET = flags.DEFINE_float("budget_s", None, "Rows not started by then are skipped.")
_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are written to.")
_SMOKE = flags.DEFINE_bool("smoke", False, "A tiny CPU run: 2 layers, d_model 64, T 32/64.")

GIB = 2.0 ** 30


def _peak_gib(compiled):
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
           + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
  return round(total / GIB, 3)


def _median_ms(fn, args):
  """Median milliseconds of fn(*args) over --reps calls after 2 warm-up calls, each waited for
  (`lab.benchmarks.measure.median_seconds`)."""
  from lab.benchmarks import measure  # pylint: disable=import-outside-toplevel
  return 1e3 * measure.median_seconds(fn, args, repeats=_REPS.value, warmup=2)


# Mixer options of the timed models: Gated DeltaNet as the rows of results/bench/model/ were
# made, without fla's output gate and value expansion (the layer's defaults since).
MIXER_OPTIONS = {"gated_deltanet": {"output_gate": False, "expand_v": 1}}


def model_config(mixer, T, head_dim, impl):
  from vla_jax.models import ModelConfig  # pylint: disable=import-outside-toplevel
  kw = {} if impl is None else {"impl": impl}
  return ModelConfig(vocab_size=_VOCAB.value, max_len=T, mixer=mixer, d_model=_D_MODEL.value,
                     num_layers=_LAYERS.value, num_heads=_D_MODEL.value // head_dim,
                     head_dim=head_dim, dtype="bfloat16", param_dtype="float32",
                     mixer_options=MIXER_OPTIONS.get(mixer, {}), **kw)


OPS = {"vla": "vla", "deltanet": "deltanet", "gated_deltanet": "gated_deltanet",
       "linear": "linear_attention"}


def ran_impl(layer, mixer, config):
  """What the layer runs here: softmax attention's kernel choice, or the recurrence's impl
  with "auto" resolved on this backend (`vla_jax.ops.impl.resolve_impl`)."""
  from vla_jax.ops import impl as impl_lib  # pylint: disable=import-outside-toplevel
  if mixer not in OPS:
    return str(getattr(layer, "implementation", None))
  platform, capability = impl_lib.current_target()
  chosen, _ = impl_lib.resolve_impl(
      layer.impl, op=OPS[mixer], platform=platform, capability=capability,
      dtype=config.dtype, head_dims=(config.resolved_head_dim,) * 2,
      chunk_size=config.chunk_size, options=config.options)
  return chosen.value


def step_row(mixer, T, B, head_dim, impl):
  """The training step of the whole model."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vla_jax.models import LanguageModel  # pylint: disable=import-outside-toplevel

  config = model_config(mixer, T, head_dim, impl)
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adamw(1e-4, weight_decay=0.1)
  state = (params, tx.init(params))

  def train_step(state, tokens):
    params, opt_state = state

    def loss_fn(params):
      logits = nnx.merge(graphdef, params, rest)(tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  tokens = jax.random.randint(jax.random.key(1), (B, T + 1), 0, _VOCAB.value, jnp.int32)
  start = time.perf_counter()
  compiled = jax.jit(train_step, donate_argnums=0).lower(state, tokens).compile()
  compile_s = time.perf_counter() - start
  out = [state]

  def call(tokens):
    out[0], loss = compiled(out[0], tokens)
    return loss

  ms = _median_ms(call, (tokens,))
  loss = call(tokens)
  n_params = sum(int(p.size) for p in jax.tree.leaves(params))
  mixer_impl = ran_impl(model.blocks[0].mixer, mixer, config)
  return {"ms": round(ms, 3), "tokens_per_s": round(B * T / ms * 1e3),
          "peak_gib": _peak_gib(compiled), "compile_s": round(compile_s, 1),
          "params_m": round(n_params / 1e6, 1), "impl": mixer_impl,
          "loss": float(loss)}


def layer_row(mixer, T, B, head_dim, impl):
  """One mixer layer, forward + backward, times the number of layers."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from vla_jax.layers import make_mixer  # pylint: disable=import-outside-toplevel

  kw = {} if impl is None else {"impl": impl}
  layer = make_mixer(mixer, _D_MODEL.value, _D_MODEL.value // head_dim, head_dim,
                     dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0), **kw)
  graphdef, params = nnx.split(layer, nnx.Param)
  x = jax.random.normal(jax.random.key(2), (B, T, _D_MODEL.value), jnp.bfloat16)

  @jax.jit
  def fwd_bwd(params, x):
    f = lambda p, x: nnx.merge(graphdef, p)(x).astype(jnp.float32).sum()
    return jax.grad(f, argnums=(0, 1))(params, x)

  ms = _median_ms(fwd_bwd, (params, x))
  return {"ms": round(ms * _LAYERS.value, 3), "ms_one": round(ms, 3)}


def op_row(mixer, T, B, head_dim, impl):
  """The recurrence alone, forward + backward, times the number of layers, on the benchmark
  suite's inputs (`lab.benchmarks.rows.jax_inputs`: VLA's u of unit rows, as the layer makes
  them at its default penalty_scale, so the op runs the penalty path the layer runs, not the
  large-gain blocks; DeltaNet's beta = 1)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import vla_jax  # pylint: disable=import-outside-toplevel
  from lab.benchmarks import rows  # pylint: disable=import-outside-toplevel

  if mixer not in ("vla", "deltanet"):
    raise ValueError(f"op rows exist for vla and deltanet; got {mixer!r}")
  args = rows.jax_inputs(mixer, B, T, _D_MODEL.value // head_dim, head_dim, jnp.bfloat16, 3,
                         backward=False)
  if impl is None:   # the ops take concrete impls: the one the layers' "auto" runs here
    impl = "pallas" if jax.default_backend() == "gpu" else "chunked"
  kw = {"impl": impl}
  if mixer == "vla":
    fn = lambda q, k, v, u: vla_jax.vla_recurrence(q, k, v, u, **kw)[0]
  else:
    fn = lambda q, k, v, beta: vla_jax.deltanet(q, k, v, beta, **kw)[0]

  @jax.jit
  def fwd_bwd(*args):
    return jax.grad(lambda *a: fn(*a).astype(jnp.float32).sum(), argnums=tuple(range(len(args))))(
        *args)

  ms = _median_ms(fwd_bwd, args)
  return {"ms": round(ms * _LAYERS.value, 3), "ms_one": round(ms, 3), "impl": impl}


def fla_row(T, B, head_dim):
  """fla's Gated DeltaNet language model in PyTorch: a full AdamW step."""
  import torch  # pylint: disable=import-outside-toplevel
  import triton  # pylint: disable=import-outside-toplevel
  from fla.models import (GatedDeltaNetConfig,  # pylint: disable=import-outside-toplevel
                          GatedDeltaNetForCausalLM)

  config = GatedDeltaNetConfig(hidden_size=_D_MODEL.value, num_hidden_layers=_LAYERS.value,
                               num_heads=_D_MODEL.value // head_dim, head_dim=head_dim,
                               expand_v=1, vocab_size=_VOCAB.value, hidden_ratio=4,
                               fuse_cross_entropy=True)
  from lab.benchmarks.rows import lift_fla_gate_guard  # pylint: disable=import-outside-toplevel
  note = lift_fla_gate_guard()
  model = GatedDeltaNetForCausalLM(config).cuda().to(torch.bfloat16)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
  tokens = torch.randint(0, _VOCAB.value, (B, T), device="cuda")

  def step():
    out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

  step()
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  ms = triton.testing.do_bench(step, warmup=50, rep=500, return_mode="median")
  peak = torch.cuda.max_memory_allocated() / GIB
  n_params = sum(p.numel() for p in model.parameters())
  del model, opt
  torch.cuda.empty_cache()
  return {"ms": round(ms, 3), "tokens_per_s": round(B * T / ms * 1e3), "peak_gib": round(peak, 3),
          "params_m": round(n_params / 1e6, 1), "impl": "fla chunk (bf16 params)", "note": note}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _SMOKE.value:
    for name, value in (("d_model", 64), ("layers", 2), ("vocab", 64), ("reps", 1),
                        ("tokens", 128), ("Ts", ["32"]), ("head_dims", ["32"])):
      flags.FLAGS[name].value = value
  import jax  # pylint: disable=import-outside-toplevel

  device = jax.devices()[0]
  header = {"kind": "header", "device": device.device_kind, "platform": device.platform,
            "jax": jax.__version__, "d_model": _D_MODEL.value, "layers": _LAYERS.value,
            "vocab": _VOCAB.value, "tokens": _TOKENS.value, "impls": _IMPLS.value,
            "dtype": "bfloat16 activations, float32 params", "git": os.environ.get("GIT_COMMIT")}
  out = open(_OUT.value, "a") if _OUT.value else None
  emit = lambda row: (print(json.dumps(row), flush=True),
                      out and (out.write(json.dumps(row) + "\n"), out.flush()))
  emit(header)
  start = time.perf_counter()
  impls = dict(pair.split(":", 1) for pair in _IMPLS.value)
  jobs = []
  for head_dim in map(int, _HEAD_DIMS.value):
    for T in map(int, _TS.value):
      B = max(_TOKENS.value // T, 1)
      for mixer in _MIXERS.value:
        jobs.append(("step", mixer, T, B, head_dim))
        if mixer in _SPLIT_MIXERS.value:
          jobs += [("layer", mixer, T, B, head_dim), ("op", mixer, T, B, head_dim)]
      jobs.append(("fla", "gated_deltanet", T, B, head_dim))
  for kind, mixer, T, B, head_dim in jobs:
    if kind not in _KINDS.value:
      continue
    row = {"kind": kind, "mixer": mixer, "T": T, "B": B, "head_dim": head_dim}
    if _BUDGET.value is not None and time.perf_counter() - start > _BUDGET.value:
      emit({**row, "status": "skipped", "note": "budget"})
      continue
    try:
      if kind == "fla":
        if device.platform != "gpu":
          emit({**row, "status": "skipped", "note": "no GPU"})
          continue
        result = fla_row(T, B, head_dim)
      else:
        fn = {"step": step_row, "layer": layer_row, "op": op_row}[kind]
        result = fn(mixer, T, B, head_dim, impls.get(mixer))
      emit({**row, "status": "ok", **result})
    except Exception as err:  # pylint: disable=broad-except
      text = " ".join(f"{type(err).__name__}: {err}".split())[:400]
      status = "OOM" if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() else "error"
      emit({**row, "status": status, "note": text})
  if out:
    out.close()


if __name__ == "__main__":
  app.run(main)
