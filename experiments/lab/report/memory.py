"""The full tables of RESULTS.md's sections on the memory itself: its norm (1), VLA's state Jacobian (2) and decoding
with a fixed-size state (8).

Rows: `experiments/state_norms.py` (kinds state_norm_random, jacobian_random, trained),
`experiments/trained_diagnostics.py` (trained_model, trained_state_norm, trained_jacobian),
`experiments/bench_decode.py` (one row per mixer and context).
"""

from lab.report import markdown
from lab.report.rows import AUTHORS_FLAG, name

# The random-input rows' mixers and their labels (VLA with the authors' penalty scale: VLA-a).
RANDOM_MIXERS = (("linear_attention", "linear"), ("deltanet", "DeltaNet"),
                 ("gated_deltanet", "GDN"), ("vla", "VLA-a"))


def split_norm_rows(norm_rows, trained_rows):
  """The rows of the two diagnostics files by kind: {kind: rows}."""
  out = {}
  for r in norm_rows + trained_rows:
    out.setdefault(r["kind"], []).append(r)
  return out


def trained_norm_at(norms, mixer, T):
  """{t: largest layer median of ||S_t||} of `mixer` measured at length T ({} if none)."""
  rows = [r for r in norms if r["mixer"] == mixer and r["T"] == T]
  return ({t: max(x["median"][i] for x in rows) for i, t in enumerate(rows[0]["t"])}
          if rows else {})


def trained_norm_command(models, jacobians, out):
  """The trained_diagnostics.py commands behind the rows (one per --examples value)."""
  m0 = models[0]
  heads = max(1, m0["d_model"] // 32)
  by_examples = {}
  for r in jacobians:
    by_examples.setdefault(r["tokens"] // (r["T"] * heads), set()).add(r["T"])
  base = (f"python experiments/trained_diagnostics.py --config=configs/mqar_long.py:"
          f"{m0['train_T']} --config.model.d_model={m0['d_model']} --config.model.num_heads="
          f"{heads} --config.train.num_steps={m0['steps']} "
          f"--config.train.learning_rate={m0['learning_rate']:g} {AUTHORS_FLAG}")
  return [f"`{base} --Ts={','.join(str(t) for t in sorted(Ts))} --examples={e} --out={out}`"
          for e, Ts in sorted(by_examples.items(), key=lambda kv: min(kv[1]))]


def norms_tables(kinds):
  """The full tables of section 1 (markdown blocks) from the diagnostics rows by kind."""
  random_norm = {r["t"]: r for r in kinds.get("state_norm_random", [])}
  models = kinds.get("trained_model", [])
  norms = kinds.get("trained_state_norm", [])
  jacobians = kinds.get("trained_jacobian", [])
  blocks = []
  if random_norm:
    blocks.append(markdown.bullets([
        "Random inputs: `python experiments/state_norms.py --max_T=65536 --workdir=RUN "
        "--out=results/training/state_norms_cpu.jsonl "
        "--plot=results/plots/state_norms_random.png` (CPU; RUN is a finished "
        f"configs/mqar_demo.py run, `{AUTHORS_FLAG}`: the authors' penalty scale, measured in "
        "section 2). One sequence, 4 heads of d_h 32, "
        "q, k, v ~ N(0, 1), u a random unit vector / sqrt(d_h); median over heads."]))
    blocks.append(markdown.table(
        ["t"] + [n for _, n in RANDOM_MIXERS],
        [[f"{t:,}"] + [f"{random_norm[t][m]:.1f}" for m, _ in RANDOM_MIXERS]
         for t in sorted(random_norm)]))
  if models:
    cmds = trained_norm_command(models, jacobians,
                                "results/training/trained_diagnostics_cpu.jsonl")
    m0 = models[0]
    accuracy = {r["mixer"]: r["accuracy"] for r in reversed(models)}
    blocks.append(markdown.bullets([
        "Inside trained models: one model per recurrent mixer trained on MQAR (8 pairs, T = "
        f"{m0['train_T']}, d_model {m0['d_model']}, no position embeddings), then fed longer "
        "MQAR sequences of the same task; `vla_jax.diagnostics.layer_state_norms` follows each "
        "layer's memory token by token.",
        "Rows (CPU): " + ", then ".join(cmds)
        + (" with the same --workdir, which reuses the trained models" if len(cmds) > 1 else "")
        + ".",
        "Training accuracy at its own length: " + ", ".join(
            f"{name(m)} {a:.3f}" for m, a in accuracy.items()) + "."]))
    marks = sorted({t for r in norms for t in r["t"]})
    body = []
    for r in norms:
      at = dict(zip(r["t"], r["median"]))
      body.append([name(r["mixer"]), r["layer"], f"{r['T']:,}"]
                  + [f"{at[t]:.3g}" if t in at else "" for t in marks] + [f"{max(r['max']):.3g}"])
    blocks.append("||S_t|| at token t (median over sequences and heads) and its largest value "
                  "over all tokens:")
    blocks.append(markdown.table(["mixer", "layer", "T"] + [f"t = {t:,}" for t in marks]
                                 + ["max over tokens"], body))
  else:
    blocks.append("Inside trained models: not measured yet (`experiments/trained_diagnostics.py`).")
  return blocks


def jacobian_tables(kinds):
  """The full table of section 2 from the Jacobian rows of both diagnostics files."""
  random = (kinds.get("jacobian_random") or [None])[0]
  demo, trained = kinds.get("trained", []), kinds.get("trained_jacobian", [])
  blocks = []
  blocks.append(markdown.bullets([
      "`vla_jax.diagnostics.vla_jacobian_norms` measures the spectral norm per token and its "
      "closed form sqrt((3 - 2c + sqrt(5 - 4c)) / 2), c = a_t . khat_t (*closed-form gap*: the "
      "largest difference); `vla_jacobian_product_norms` the norm of products over spans. Rows: "
      "the commands of section 1 (every model with the authors' penalty scale 1/sqrt(d_h))."]))
  body = []
  if random:
    body.append(["random, d_h 32", f"{random['tokens']:,}", f"{random['p50']:.5f}",
                 f"{random['p99']:.5f}", f"{random['max']:.5f}", f"{random['frac_above_1']:.4f}",
                 f"{random['max_abs_closed_form_gap']:.1e}", ""])
  for r in demo:
    prods = ", ".join(f"span {k.split('_')[2]}: {v:.3g}" for k, v in r.items()
                      if k.startswith("product_span_"))
    body.append([f"trained demo model (T {r['T']}), layer {r['layer']}", f"{r['tokens']:,}",
                 f"{r['p50']:.5f}", f"{r['p99']:.5f}", f"{r['max']:.5f}",
                 f"{r['frac_above_1']:.4f}", f"{r['max_abs_closed_form_gap']:.1e}",
                 f"max {prods}"])
  for r in trained:
    prods = ", ".join(f"span {k.split('_')[2]}: {r[k]:.3g}" for k in sorted(r)
                      if k.startswith("product_span_") and k.endswith("_max"))
    body.append([f"trained MQAR model, T {r['T']:,}, layer {r['layer']}", f"{r['tokens']:,}",
                 f"{r['p50']:.5f}", f"{r['p99']:.5f}", f"{r['max']:.5f}",
                 f"{r['frac_above_1']:.4f}", f"{r['closed_form_gap']:.1e}", f"max {prods}"])
  if body:
    blocks.append(markdown.table(["inputs", "tokens", "median", "p99", "max", "share above 1",
                                  "closed-form gap", "products"], body))
  return blocks


def decode_tables(rows):
  """The full table of section 8 from bench_decode.py's rows."""
  blocks = []
  if not rows:
    return ["Not measured yet: `python experiments/bench_decode.py --out=OUT.jsonl` on a GPU."]
  at = {(r["mixer"], r["context"]): r for r in rows}
  contexts = sorted({r["context"] for r in rows})
  blocks.append(markdown.bullets([
      "Rows: `python experiments/bench_decode.py --out=results/training/decode_h200.jsonl` "
      "(NVIDIA H200). One mixer layer, H = 16, d_h = 64 (d_model 1024), bfloat16 activations, "
      "batch 1, 256 tokens per compiled `lax.scan` of `step` calls, median of 10 calls; VLA "
      "after a real prefill of the context, softmax with a KV cache filled up to it."]))
  cell = lambda m, L, f: f(at[(m, L)]) if (m, L) in at else ""
  blocks.append(markdown.table(
      ["context", "VLA ms/token", "VLA tokens/s", "VLA state MiB/seq", "softmax ms/token",
       "softmax tokens/s", "KV cache MiB/seq"],
      [[f"{L:,}"] + [cell(m, L, f) for m in ("vla", "softmax") for f in (
          lambda r: f"{r['ms_per_token']:.3f}", lambda r: f"{r['tokens_per_s']:,.0f}",
          lambda r: f"{r['cache_mib_per_seq']:.3g}")] for L in contexts]))
  return blocks
