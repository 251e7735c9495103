"""BENCHMARKS.md (tables and verdicts computed from the rows) and log-log plots, from the
JSON lines of `experiments/bench.py` and `experiments/check_kernels.py` (results/bench/).

Files are read oldest run first (by their header's time): a later file's row replaces an
earlier one with the same key, except that a skipped row never replaces a measured one.
Needs only the standard library, plus matplotlib for the plots.
"""

import glob
import json
import math
import os
from collections import OrderedDict

from vla_jax.benchmarks import floor

OP_NAMES = {"vla": "VLA", "softmax_attention": "softmax", "deltanet": "DeltaNet",
            "gated_deltanet": "Gated DeltaNet", "linear_attention": "linear attn",
            "state_path": "state path"}
PARTS = ("state_path",)   # ops that are a part of a model: never "the fastest row"
PASSES = ("fwd", "fwd+bwd")
PALLAS = "VLA pallas"
CUDNN = "softmax cudnn"
FLA = "DeltaNet fla_chunk_delta_rule"


def label(row):
  return f"{OP_NAMES.get(row['op'], row['op'])} {row['impl']}"


KEY = ("op", "impl", "pass", "T", "B", "H", "d", "dtype", "precision", "u")


def header_time(path):
  """The `time` of a JSON-lines file's header line ("" when it has none)."""
  with open(path) as f:
    for line in f:
      if line.strip():
        obj = json.loads(line)
        return obj.get("time", "") if obj.get("kind") == "header" else ""
  return ""


def bench_files(folder):
  """The *.jsonl files of `folder`, oldest run first."""
  return sorted(glob.glob(os.path.join(folder, "*.jsonl")), key=lambda p: (header_time(p), p))


def load(paths):
  """(headers, rows) of the JSON-lines files `paths` (oldest run first): a later file's row
  replaces an earlier one with the same key, and each row keeps the index of its file
  (`_order`) so that `Data` can tell which rows an older run left behind."""
  headers, rows = [], OrderedDict()
  for order, path in enumerate(paths):
    with open(path) as f:
      for line in f:
        line = line.strip()
        if not line:
          continue
        obj = json.loads(line)
        if obj.get("kind") == "header":
          headers.append((path, obj))
          continue
        key = tuple(obj.get(k) for k in KEY)
        if obj.get("status") == "skipped" and rows.get(key, {}).get("status") not in (
            None, "skipped"):
          continue   # a later run that skipped a row does not erase an earlier measurement
        rows.pop(key, None)
        rows[key] = dict(obj, _file=os.path.basename(path), _order=order)
  return headers, list(rows.values())


def family(row):
  """A row family: one implementation at one head dim, dtype and head count, both passes."""
  return (row.get("op"), row.get("impl"), row.get("d"), row.get("dtype"), row.get("H"))


class Data:
  """Rows indexed by (d, pass) -> label -> T -> row.

  A measured row is *stale* when a later file measured its family again (at other lengths,
  say): the implementation may have changed in between, so the tables show it marked with
  STALE_MARK and every computed sentence, ratio, crossover and plot leaves it out.
  """

  def __init__(self, rows):
    self.rows = rows
    self.timed = [r for r in rows if r.get("pass") in PASSES and r.get("T") is not None]
    newest = {}
    for r in self.timed:
      if r.get("status") != "skipped":
        newest[family(r)] = max(newest.get(family(r), -1), r.get("_order", 0))
    for r in self.timed:
      r["_stale"] = (r.get("status") != "skipped"
                     and r.get("_order", 0) < newest.get(family(r), -1))
    self.stale = [r for r in self.timed if r["_stale"]]
    self.dims = sorted({r["d"] for r in self.timed})
    self.Ts = sorted({r["T"] for r in self.timed})
    self.labels = list(OrderedDict.fromkeys(label(r) for r in self.timed))
    self.index = {}
    for r in self.timed:
      self.index.setdefault((r["d"], r["pass"]), {}).setdefault(label(r), {})[r["T"]] = r

  def get(self, d, pass_, lab, T, stale=False):
    """The row, or None; a stale row only with stale=True (the tables)."""
    r = self.index.get((d, pass_), {}).get(lab, {}).get(T)
    return None if r is not None and r["_stale"] and not stale else r

  def ms(self, d, pass_, lab, T):
    r = self.get(d, pass_, lab, T)
    return r["ms"] if r and r.get("status") == "ok" and r.get("ms") else None

  def labels_for(self, d, pass_, measured_only=False):
    have = self.index.get((d, pass_), {})
    labs = [lab for lab in self.labels if lab in have]
    if measured_only:   # rows never measured are listed under "Rows not measured" instead
      labs = [lab for lab in labs if any(r.get("status") in ("ok", "OOM")
                                         for r in have[lab].values())]
    return labs

  def batch(self, T):
    for r in self.timed:
      if r["T"] == T:
        return r["B"]
    return None


# -- formatting ---------------------------------------------------------------------------------

def fmt(x, digits=3):
  if x is None:
    return "-"
  if x == 0:
    return "0"
  mag = abs(x)
  if mag >= 1000:
    return f"{x:,.0f}"
  return f"{x:.{digits}g}"


STALE_MARK = "†"


def cell(row, value):
  if row is None:
    return ""
  status = row.get("status")
  if status == "ok":
    return fmt(value) + (f" {STALE_MARK}" if row.get("_stale") else "")
  return {"OOM": "OOM", "skipped": "skip", "error": "err"}.get(status, status or "?")


def table(header, body):
  out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
  out += ["| " + " | ".join(str(c) for c in line) + " |" for line in body]
  return "\n".join(out)


def metric_table(data, d, pass_, value_fn, Ts=None):
  labs = data.labels_for(d, pass_, measured_only=True)
  body = []
  for T in Ts or data.Ts:
    line = [f"{T:,}", data.batch(T)]
    for lab in labs:
      r = data.get(d, pass_, lab, T, stale=True)
      line.append(cell(r, value_fn(r) if r and r.get("status") == "ok" else None))
    body.append(line)
  return table(["T", "B"] + labs, body)


def tokens_per_s(r):
  return r["B"] * r["T"] / (r["ms"] / 1e3) if r.get("ms") else None


# -- verdicts -----------------------------------------------------------------------------------

def ratio_series(data, d, pass_, num, den):
  out = []
  for T in data.Ts:
    a, b = data.ms(d, pass_, num, T), data.ms(d, pass_, den, T)
    if a and b:
      out.append((T, a / b))
  return out


def crossover(series):
  """(kind, value): kind "always" (ratio < 1 at every T), "never" (>= 1 at every T),
  "at" (T interpolated in log-log where the ratio last goes below 1), "none" (no data)."""
  if not series:
    return "none", None
  if all(r < 1 for _, r in series):
    return "always", None
  if all(r >= 1 for _, r in series):
    return "never", None
  last_change = None
  for (t0, r0), (t1, r1) in zip(series, series[1:]):
    if r0 >= 1 > r1:
      frac = math.log(r0) / (math.log(r0) - math.log(r1))
      last_change = math.exp(math.log(t0) + frac * (math.log(t1) - math.log(t0)))
  if last_change is None or series[-1][1] >= 1:
    return "mixed", None
  return "at", last_change


def crossover_sentence(data, d, pass_, other, other_name):
  series = ratio_series(data, d, pass_, PALLAS, other)
  kind, value = crossover(series)
  if kind == "none":
    return f"no T with both VLA pallas and {other_name} measured"
  lo, hi = min(r for _, r in series), max(r for _, r in series)
  Tmax = series[-1][0]
  if kind == "always":
    return (f"VLA pallas is faster than {other_name} at every measured T "
            f"({fmt(1 / hi)}x to {fmt(1 / lo)}x faster)")
  if kind == "never":
    return (f"**VLA pallas is slower than {other_name} at every measured T up to {Tmax:,}** "
            f"({fmt(lo)}x to {fmt(hi)}x its time); no crossover in range")
  if kind == "mixed":
    worse = [T for T, r in series if r >= 1]
    return (f"VLA pallas and {other_name} trade places; VLA pallas is slower at T = "
            + ", ".join(f"{T:,}" for T in worse) + f" (up to {fmt(hi)}x)")
  slower = [T for T, r in series if r >= 1]
  return (f"VLA pallas is slower than {other_name} below T ~ {value:,.0f} (slower at T = "
          + ", ".join(f"{T:,}" for T in slower) + f", by up to {fmt(hi)}x) and faster from "
          f"there up to T = {Tmax:,}")


def fastest_summary(data, d, pass_):
  """Lines: at each T, the fastest row and VLA pallas's place. Only at the lengths where every
  field baseline of this (d, pass) (cuDNN, fla) has a row: elsewhere (a run that timed only
  the scans, say) VLA pallas would be "fastest" among the few rows measured there."""
  body = []
  baselines = [lab for lab in (CUDNN, FLA) if lab in data.labels_for(d, pass_)]
  for T in data.Ts:
    if any(data.get(d, pass_, lab, T) is None for lab in baselines):
      continue
    times = [(data.ms(d, pass_, lab, T), lab) for lab in data.labels_for(d, pass_)
             if not any(lab.startswith(OP_NAMES[op] + " ") for op in PARTS)]
    times = sorted((t, lab) for t, lab in times if t)
    if not times:
      continue
    best_t, best = times[0]
    mine = data.ms(d, pass_, PALLAS, T)
    rank = next((i + 1 for i, (_, lab) in enumerate(times) if lab == PALLAS), None)
    body.append([f"{T:,}", best, fmt(best_t), fmt(mine),
                 f"{rank} of {len(times)}" if rank else "-",
                 fmt(mine / best_t) + "x" if mine else "-"])
  return body


def verdicts(data):
  lines = []
  for d in data.dims:
    for pass_ in PASSES:
      if not data.labels_for(d, pass_):
        continue
      head = f"- d = {d}, {pass_}: "
      parts = [crossover_sentence(data, d, pass_, CUDNN, "cuDNN causal attention")]
      fla = ratio_series(data, d, pass_, PALLAS, FLA)
      if fla:
        lo, hi = min(r for _, r in fla), max(r for _, r in fla)
        word = "slower" if lo >= 1 else ("faster" if hi < 1 else "mixed")
        if word == "slower":
          parts.append(f"**VLA pallas is slower than fla's chunk_delta_rule (DeltaNet) at every "
                       f"measured T, taking {fmt(lo)}x to {fmt(hi)}x its time**")
        elif word == "faster":
          parts.append(f"VLA pallas takes {fmt(lo)}x to {fmt(hi)}x the time of fla's "
                       f"chunk_delta_rule")
        else:
          parts.append(f"VLA pallas takes {fmt(lo)}x to {fmt(hi)}x the time of fla's "
                       f"chunk_delta_rule (slower at some T)")
      wins = [row for row in fastest_summary(data, d, pass_) if row[1] == PALLAS]
      n = len(fastest_summary(data, d, pass_))
      if n:
        parts.append(f"VLA pallas is the fastest row at {len(wins)} of {n} lengths")
      lines.append(head + "; ".join(parts) + ".")
  return lines


# -- plots --------------------------------------------------------------------------------------

def plots(data, plot_dir, title):
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return []
  os.makedirs(plot_dir, exist_ok=True)
  metrics = (("time_vs_T.png", "ms", lambda r: r["ms"]),
             ("tokens_per_s_vs_T.png", "tokens / s", tokens_per_s),
             ("memory_vs_T.png", "peak MiB", lambda r: r.get("peak_mib")))
  dims = [d for d in data.dims if any(data.labels_for(d, p, measured_only=True) for p in PASSES)]
  if not dims:
    return []
  paths = []
  for name, ylabel, fn in metrics:
    fig, axes = plt.subplots(len(PASSES), len(dims), squeeze=False,
                             figsize=(5.5 * len(dims), 4 * len(PASSES)))
    for i, pass_ in enumerate(PASSES):
      for j, d in enumerate(dims):
        ax = axes[i][j]
        for lab in data.labels_for(d, pass_):
          pts, old = [], []   # old: stale rows, drawn as open markers off the line
          for T in data.Ts:
            r = data.get(d, pass_, lab, T, stale=True)
            if r and r.get("status") == "ok" and r.get("ms"):
              v = fn(r)
              if v:
                (old if r["_stale"] else pts).append((T, v))
          style = dict(lw=2.5, color="black") if lab == PALLAS else {}
          if pts:
            line, = ax.plot(*zip(*pts), marker="o", ms=3, label=lab, **style)
            style["color"] = line.get_color()
          if old:
            ax.plot(*zip(*old), ls="none", marker="o", ms=5, mfc="none",
                    color=style.get("color"), label=None if pts else f"{lab} {STALE_MARK}")
        ax.set(xscale="log", yscale="log", xlabel="T (B * T fixed up to its maximum, then B = 1)",
               ylabel=ylabel, title=f"d = {d}, {pass_} (open markers: {STALE_MARK} rows)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
          ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = os.path.join(plot_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
  return paths


# -- the document -------------------------------------------------------------------------------

def provenance(headers):
  """Lines: each file's run (time, device, versions, settings) and its command."""
  out = []
  for path, h in headers:
    st = h.get("settings", {})
    versions = ", ".join(f"{k} {h[k]}" for k in ("jax", "jaxlib", "jax-cuda13-plugin",
                                                  "jax-cuda12-plugin", "torch", "triton",
                                                  "fla-core", "python") if h.get(k))
    out.append(f"- `{os.path.basename(path)}` ({h.get('time', '?')}): **{h.get('device', '?')}**"
               f" (backend {h.get('jax_backend', '?')}); {versions}; H = {st.get('heads')}, "
               f"B * T = {st.get('tokens')}, dtype {st.get('dtype')}, chunk {st.get('chunk')}"
               + (", **smoke run (CPU, tiny shapes: not a benchmark)**" if st.get("smoke")
                  else ""))
    argv = list(h.get("argv") or [])
    for i, a in enumerate(argv[:-1]):   # an output folder is the machine's: a placeholder
      if a == "--out":
        argv[i + 1] = "OUT"
    if argv:
      out.append(f"  - command: `python3 {' '.join(argv)}`")
  return out


def row_sources(data):
  """Lines: which file each (d, row family) was measured in, so that a reader sees which
  ratios compare rows of one run and which compare runs."""
  groups = OrderedDict()
  for r in data.timed:
    if r.get("status") == "ok":
      files = groups.setdefault((r["d"], label(r)), OrderedDict())
      files[r.get("_file", "?")] = files.get(r.get("_file", "?"), 0) + 1
  lines = ["Source of the measured rows (file: rows), per head dim and row family:", ""]
  for (d, lab), files in sorted(groups.items(), key=lambda kv: kv[0][0]):
    lines.append(f"- d = {d}, {lab}: " + ", ".join(f"`{f}`: {n}" for f, n in files.items()))
  by_d = OrderedDict()
  for (d, _), files in groups.items():
    by_d.setdefault(d, set()).update(files)
  mixed = [d for d, files in by_d.items() if len(files) > 1]
  if mixed:
    lines += ["", "At d = " + ", ".join(str(d) for d in mixed) + " the families come from more "
              "than one run, so some ratios compare runs (same machine kind and versions, see "
              "above); each file's own rows are one run."]
  return lines + [""]


def stale_note(data):
  """Lines naming the stale rows (see `Data`), or none."""
  if not data.stale:
    return []
  groups = OrderedDict()
  for r in data.stale:
    groups.setdefault((r["d"], label(r), r["pass"], r.get("_file", "?")), []).append(r["T"])
  items = [f"d = {d} {lab} {pass_} at T = {', '.join(f'{T:,}' for T in sorted(Ts))} "
           f"(`{f}`)" for (d, lab, pass_, f), Ts in groups.items()]
  return [f"{STALE_MARK} Rows from an older run of their row family than its newest file, "
          "left there because the newer run did not measure those lengths; the "
          "implementation may have changed in between. The tables show them marked "
          f"{STALE_MARK}; every computed sentence, ratio, crossover, floor row and plot leaves "
          "them out: " + "; ".join(items) + ".", ""]


def not_measured(data):
  groups = OrderedDict()
  for r in data.timed:
    if r.get("status") == "ok":
      continue
    key = (r["d"], label(r), r["pass"], r["status"], r.get("note") or "")
    groups.setdefault(key, []).append(r["T"])
  body = []
  for (d, lab, pass_, status, note), Ts in groups.items():
    span = f"{min(Ts):,}" if len(Ts) == 1 else f"{min(Ts):,} to {max(Ts):,}"
    body.append([d, lab, pass_, span, status, note.replace("|", "/")[:160]])
  return body


def field_section(data, tokens_T=32768):
  """Lines of "fla's DeltaNet kernel on the same measures": the field's tuned delta-rule kernel
  against its own floor (`floor.delta_rule_floor_ms`), its forward+backward / forward ratio
  and its crossover with cuDNN, computed like VLA pallas's above, so that a reader can see how
  far the best delta-rule kernel itself is from those marks."""
  lines = []
  for d in data.dims:
    fwd = [(T, data.get(d, "fwd", FLA, T)) for T in data.Ts]
    fwd = [(T, r) for T, r in fwd if r and r.get("status") == "ok" and r.get("ms")]
    if not fwd:
      continue
    parts = []
    for pass_ in PASSES:
      r = data.get(d, pass_, FLA, tokens_T)
      if r and r.get("status") == "ok" and r.get("ms"):
        fl = floor.delta_rule_floor_ms(r["B"], r["T"], r["H"], r["d"],
                                       backward=pass_ == "fwd+bwd")
        vla = data.get(d, pass_, PALLAS, tokens_T)
        beside = (f" (VLA pallas {fmt(vla['ms'] / vla['floor_ms'])}x its own)"
                  if vla and vla.get("status") == "ok" and vla.get("floor_ms") else "")
        parts.append(f"{pass_} at T = {tokens_T:,}: {fmt(r['ms'])} ms against a floor of "
                     f"{fmt(fl)} ms, {fmt(r['ms'] / fl)}x{beside}")
    ratios = [(T, data.ms(d, "fwd+bwd", FLA, T) / r["ms"]) for T, r in fwd
              if data.ms(d, "fwd+bwd", FLA, T)]
    if ratios:
      parts.append("forward+backward / forward " + ", ".join(
          f"{fmt(x)}x at {T:,}" for T, x in ratios))
    series = ratio_series(data, d, "fwd", FLA, CUDNN)
    kind, value = crossover(series)
    if kind == "at":
      parts.append(f"forward crosses cuDNN at T ~ {value:,.0f}")
    elif kind != "none":
      parts.append({"always": "forward faster than cuDNN at every T",
                    "never": "forward slower than cuDNN at every T",
                    "mixed": "forward trades places with cuDNN"}[kind])
    at4k = [(T, x) for T, x in series if T == 4096]
    if at4k:
      parts.append(f"fla / cuDNN forward at T = 4,096: {fmt(at4k[0][1])}")
    lines.append(f"- d = {d}: " + "; ".join(parts) + ".")
  if not lines:
    return []
  return (["## fla's DeltaNet kernel on the same measures", "",
           "The field's tuned delta-rule kernel measured against the marks applied to VLA "
           "pallas above: its distance to a floor of the same model without the penalty "
           "path (`floor.delta_rule_floor_ms`: q, k, v in, o out, the state path's "
           "products), its forward+backward / forward ratio, and where its forward crosses "
           "cuDNN causal attention. VLA does the same state path plus a penalty path of "
           "about 1.4 times its products (`floor.py`).", ""] + lines + [""])


def why_section(data, tokens=32768):
  """Lines of "Why VLA pallas loses": how its time scales with T at a fixed number of tokens
  (B * T = `tokens`) against cuDNN and fla, and its backward-to-forward ratio, computed; then
  the cause as traced in kernels/NOTES.md."""
  lines = []
  for d in data.dims:
    Ts = [T for T in data.Ts if T <= tokens and data.ms(d, "fwd", PALLAS, T)]
    if len(Ts) < 2:
      continue
    lo, hi = Ts[0], Ts[-1]
    parts = []
    for lab, name in ((PALLAS, "VLA pallas"), (CUDNN, "cuDNN"), (FLA, "fla")):
      a, b = data.ms(d, "fwd", lab, lo), data.ms(d, "fwd", lab, hi)
      if a and b:
        parts.append(f"{name} {fmt(a)} -> {fmt(b)} ms (x{fmt(b / a)})")
    ratios = [(T, data.ms(d, "fwd+bwd", PALLAS, T) / data.ms(d, "fwd", PALLAS, T))
              for T in Ts if data.ms(d, "fwd+bwd", PALLAS, T)]
    line = (f"- d = {d}: forward from T = {lo:,} to {hi:,} at {tokens:,} tokens per call: "
            + "; ".join(parts) + ".")
    if ratios:
      line += (" Forward+backward / forward for VLA pallas: "
               + ", ".join(f"{fmt(r)}x at {T:,}" for T, r in ratios) + ".")
    lines.append(line)
  if not lines:
    return []
  return (["## Where VLA pallas's time goes", "",
           "Computed from the rows above: forward time at a fixed number of tokens, from the "
           "shortest to the longest T, and the cost of the backward:", ""]
          + lines + ["", "Per kernel (a profiler trace, `experiments/profile_kernels.py`) and why: "
                     "`kernels/NOTES.md`, \"Profile\".", ""])


def render(headers, rows, plot_paths, out_path, command=None):
  """The markdown text. `command`: the report command that regenerates it, shown at the top."""
  data = Data(rows)
  md = ["# Benchmarks", "",
        "Generated by `experiments/report_benchmarks.py` from the JSON lines in `results/bench/` "
        "(written by `experiments/bench.py` and `experiments/check_kernels.py`); every number "
        "and every sentence below is computed from those rows.", ""]
  if command:
    md += [f"Regenerate (files oldest run first; a later file's row replaces an earlier "
           f"one's): `{command}`", ""]
  md += provenance(headers) + [""] + row_sources(data) + stale_note(data)
  md += ["Forward (`fwd`) and forward + backward (`fwd+bwd`: the output o and the gradient "
         "of sum(o * c) with respect to every input, c a random cotangent; JAX rows up to the "
         "2026-12-01 runs returned the gradient alone, which let XLA drop forward work only o "
         "needs). Medians after warm-up, rotating between "
         "input sets. JAX rows: rows that carry `ms_sync` time rounds of calls issued back to "
         "back and waited for at the end (median of round time / calls; `ms_sync`, the median "
         "of calls each waited for, is kept in the row; calls over 25 ms, where the host's "
         "share is negligible, are timed that way only: `per_round` 1); older rows time calls "
         "each ended by `block_until_ready`, which adds the host's dispatch and wait to every "
         "call. Torch "
         "rows use `triton.testing.do_bench(return_mode=\"median\")` (CUDA events around "
         "back-to-back launches). Peak memory: XLA's compiled memory "
         "analysis (arguments + outputs + temporaries) for JAX rows, "
         "`torch.cuda.max_memory_allocated` (peak above the inputs, plus the inputs) for torch "
         "rows. `skip`, `OOM`, `err`: see the last section.", ""]
  md += ["## Verdict", ""] + (verdicts(data) or ["- no rows"]) + [""]

  if any(data.ms(d, p, PALLAS, T) for d in data.dims for p in PASSES for T in data.Ts):
    md += ["## Crossover against cuDNN causal attention", "",
           "T at which VLA pallas becomes faster than `jax.nn.dot_product_attention(..., "
           "is_causal=True, implementation=\"cudnn\")` (log-log interpolation between measured "
           "lengths); ratio = VLA pallas time / cuDNN time.", ""]
    body = []
    for d in data.dims:
      for pass_ in PASSES:
        series = ratio_series(data, d, pass_, PALLAS, CUDNN)
        kind, value = crossover(series)
        text = {"always": "faster at every T", "never": "none (slower at every T)",
                "mixed": "mixed", "none": "no data"}.get(kind) or f"{value:,.0f}"
        body.append([d, pass_, text, ", ".join(f"{T:,}: {fmt(r)}" for T, r in series) or "-"])
    md += [table(["d", "pass", "crossover T", "ratio per T"], body), ""]

    md += ["## VLA pallas against fla `chunk_delta_rule`", "",
           "Ratio of times (VLA pallas / fla DeltaNet), per T; above 1 means VLA pallas is "
           "slower.", ""]
    body = []
    for d in data.dims:
      for pass_ in PASSES:
        series = dict(ratio_series(data, d, pass_, PALLAS, FLA))
        body.append([d, pass_] + [fmt(series.get(T)) for T in data.Ts])
    md += [table(["d", "pass"] + [f"{T:,}" for T in data.Ts], body), ""]

    md += ["## VLA pallas against the hardware floor", "",
           "floor = max(bytes / 4.2 TB/s, flops / 800 TFLOP/s) with bytes = inputs read and "
           "outputs written once and flops = the chunked algorithm's matrix products "
           "(`vla_jax/benchmarks/floor.py`).", ""]
    body = []
    for d in data.dims:
      for pass_ in PASSES:
        for T in data.Ts:
          r = data.get(d, pass_, PALLAS, T)
          if r and r.get("status") == "ok" and r.get("floor_ms"):
            body.append([d, pass_, f"{T:,}", fmt(r["ms"]), fmt(r["floor_ms"]),
                         fmt(r["ms"] / r["floor_ms"]) + "x"])
    md += [table(["d", "pass", "T", "ms", "floor ms", "ms / floor"], body) if body else "-", ""]
    md += field_section(data)
    md += why_section(data)

  for d in data.dims:
    if not any(data.labels_for(d, p, measured_only=True) for p in PASSES):
      continue
    md += [f"## d = {d}", ""]
    for pass_ in PASSES:
      if not data.labels_for(d, pass_, measured_only=True):
        continue
      md += [f"### {pass_}: milliseconds", "", metric_table(data, d, pass_, lambda r: r["ms"]), ""]
      body = fastest_summary(data, d, pass_)
      if body:
        md += [f"### {pass_}: fastest row per T", "",
               table(["T", "fastest", "its ms", "VLA pallas ms", "VLA pallas place",
                      "VLA pallas / fastest"], body), ""]
      md += [f"### {pass_}: tokens per second (millions)", "",
             metric_table(data, d, pass_,
                          lambda r: tokens_per_s(r) / 1e6 if tokens_per_s(r) else None), ""]
      md += [f"### {pass_}: peak device memory (MiB)", "",
             metric_table(data, d, pass_, lambda r: r.get("peak_mib")), ""]

  md += correctness_section(rows)
  if plot_paths:
    md += ["## Plots", ""]
    base = os.path.dirname(os.path.abspath(out_path))
    md += [f"![{os.path.basename(p)}]({os.path.relpath(os.path.abspath(p), base)})"
           for p in plot_paths] + [""]
  missing = not_measured(data)
  if missing:
    md += ["## Rows not measured", "",
           table(["d", "row", "pass", "T", "status", "reason"], missing), ""]
  return "\n".join(md)


def correctness_section(rows):
  """Lines of "Correctness against float64": the check rows (`experiments/check_kernels.py`)
  as a table of relative errors against a float64 reference."""
  checks = [r for r in rows if r.get("pass") == "check"]
  if not checks:
    return []
  body = []
  for r in sorted(checks, key=lambda r: (r.get("d") or 0, str(r.get("dtype")),
                                         str(r.get("precision")), str(r.get("u")),
                                         r.get("T") or 0)):
    errs = r.get("errors") or {}
    fwd = [errs[k] for k in ("o", "S", "A") if errs.get(k) is not None]
    grad = [v for k, v in errs.items() if k.startswith("d") and v is not None]
    worst = lambda xs: fmt(max(xs)) if xs else fmt(r.get("rel_err"))
    body.append([r.get("d"), r.get("impl"), r.get("dtype"), r.get("precision") or "-",
                 r.get("u") or "-", f"{r['T']:,}" if r.get("T") else "-", r.get("B") or "-",
                 worst(fwd), worst(grad) if grad else "-", fmt(r.get("bound")),
                 r.get("status"), (r.get("note") or "").replace("|", "/")[:120]])
  return ["## Correctness against float64", "",
          "Relative Frobenius errors against a float64 reference on the same inputs (o, S_T, "
          "A_T forward; the gradients of a weighted sum of them), on the GPU at the rows' "
          "precision; `u` isotropic or anisotropic (a few dominant directions plus noise, "
          "rows normalised, the scale a trained layer gives).", "",
          table(["d", "impl", "dtype", "precision", "u", "T", "B", "worst forward",
                 "worst gradient", "bound", "status", "note"], body), ""]


def write_report(paths, out_path, plot_dir=None, command=None):
  """Reads `paths` (oldest run first), writes `out_path` and the plots (under plot_dir, if
  given); returns (number of rows, plot paths)."""
  headers, rows = load(paths)
  data = Data(rows)
  device = ", ".join(dict.fromkeys(h.get("device", "?") for _, h in headers)) or "?"
  plot_paths = plots(data, plot_dir, f"{device}; log-log") if plot_dir else []
  text = render(headers, rows, plot_paths, out_path, command=command)
  with open(out_path, "w") as f:
    f.write(text)
  return len(rows), plot_paths
