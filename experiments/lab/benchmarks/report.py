"""BENCHMARKS.md's generated blocks and log-log plots, from the JSON lines of
`experiments/bench.py` and `experiments/check_kernels.py` (results/bench/) and the profile JSON
of `experiments/profile_kernels.py`.

BENCHMARKS.md is written by hand around marked blocks (`lab.markers`): `blocks` makes each
block's tables, plots and the fixed notes on how they are computed, never a finding, and
`write_report` rewrites the blocks only. tests/lab/benchmarks/test_report.py checks that the
hand-written findings hold on the committed rows.

Files are read oldest run first (by their header's time): a later file's row replaces an
earlier one with the same key, except that a skipped row never replaces a measured one.
Needs only the standard library, plus matplotlib for the plots.
"""

import glob
import json
import math
import os
from collections import OrderedDict

from lab import markers
from lab.benchmarks import check, floor

OP_NAMES = {"vla": "VLA", "softmax_attention": "softmax", "deltanet": "DeltaNet",
            "gated_deltanet": "Gated DeltaNet", "linear_attention": "linear attn",
            "state_path": "state path"}
PARTS = ("state_path",)   # ops that are a part of a model: never "the fastest row"
PASSES = ("fwd", "fwd+bwd")
PALLAS = "VLA pallas"
CUDNN = "softmax cudnn"
FLA = "DeltaNet fla_chunk_delta_rule"
TARGET_T = 4096           # the length the project's kernel aims to beat attention at


def label(row):
  return f"{OP_NAMES.get(row['op'], row['op'])} {row['impl']}"


KEY = ("op", "impl", "pass", "T", "B", "H", "d", "dtype", "precision", "u", "packed", "beta",
       "lam0", "block_factor", "start_inverse", "penalty_layout")
# Flags of KEY that a row made before them lacks: absent and False are the same row.
KEY_FLAGS = ("packed", "beta")


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
        key = tuple(bool(obj.get(k)) if k in KEY_FLAGS else obj.get(k) for k in KEY)
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
  STALE_MARK and every ratio, crossover and plot leaves it out.
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


# -- ratios and crossovers ----------------------------------------------------------------------

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




def crossing(series):
  """Where `series` ((T, ratio), T ascending) goes below 1 for good, as a table cell:
  "T ~ 8,502", "below T = 1,024" (below 1 at every T), "beyond T = 131,072" (at no T),
  "no single T" (below and above 1 in turn), or "no data"."""
  kind, value = crossover(series)
  if kind == "at":
    return f"T ~ {value:,.0f}"
  if kind == "always":
    return f"below T = {series[0][0]:,}"
  if kind == "never":
    return f"beyond T = {series[-1][0]:,}"
  return "no single T" if kind == "mixed" else "no data"


# -- table cells -------------------------------------------------------------------------------

def joined(items):
  """"a", "a and b", "a, b and c"."""
  items = list(items)
  return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def span(lo, hi, unit="x"):
  """"1.52x to 1.94x", or one value when both read the same."""
  a, b = fmt(lo) + unit, fmt(hi) + unit
  return a if a == b else f"{a} to {b}"


def pairs(data, lab=PALLAS):
  """The (d, pass) pairs at which `lab` has a time."""
  return [(d, p) for d in data.dims for p in PASSES if any(data.ms(d, p, lab, T) for T in data.Ts)]


def floor_series(data, d, pass_):
  """[(T, VLA pallas ms / its floor ms)] over the measured lengths."""
  out = []
  for T in data.Ts:
    r = data.get(d, pass_, PALLAS, T)
    if r and r.get("status") == "ok" and r.get("ms") and r.get("floor_ms"):
      out.append((T, r["ms"] / r["floor_ms"]))
  return out


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


def fla_ratios(data):
  return [r for d, p in pairs(data) for _, r in ratio_series(data, d, p, PALLAS, FLA)]


def verdict_table(data):
  body = []
  for d, p in pairs(data):
    fla = ratio_series(data, d, p, PALLAS, FLA)
    best = min(fla, key=lambda tr: tr[1]) if fla else None
    floors = [x for _, x in floor_series(data, d, p)]
    fastest = fastest_summary(data, d, p)
    body.append([d, p, crossing(ratio_series(data, d, p, PALLAS, CUDNN)),
                 span(min(r for _, r in fla), max(r for _, r in fla)) if fla else "-",
                 f"T = {best[0]:,} ({fmt(best[1])}x)" if best else "-",
                 span(min(floors), max(floors)) if floors else "-",
                 f"{sum(line[1] == PALLAS for line in fastest)} of {len(fastest)} T"
                 if fastest else "-"])
  return table(["d", "pass", "crosses cuDNN at", "time / fla's", "closest to fla at",
                "time / floor", "fastest row at"], body)


def fixed_tokens(data):
  """The number of tokens per call (B * T) that most timed rows share, or None."""
  counts = {}
  for r in data.timed:
    if r.get("B") and r.get("T"):
      counts[r["B"] * r["T"]] = counts.get(r["B"] * r["T"], 0) + 1
  return max(sorted(counts), key=counts.get) if counts else None


def field_T(data, tokens):
  """The longest T at which fla has a time with B * T = `tokens`, or None."""
  Ts = [T for d, p in pairs(data, FLA) for T in data.Ts if data.ms(d, p, FLA, T)
        and data.get(d, p, FLA, T)["B"] * T == tokens]
  return max(Ts) if Ts else None


def fla_floor(data, d, pass_, T):
  """(fla ms, its floor ms) at (d, pass, T), or None."""
  r = data.get(d, pass_, FLA, T)
  if not (r and r.get("status") == "ok" and r.get("ms")):
    return None
  return r["ms"], floor.delta_rule_floor_ms(r["B"], r["T"], r["H"], r["d"],
                                            backward=pass_ == "fwd+bwd")


def backward_ratios(data, d, lab):
  """[(T, fwd+bwd ms / fwd ms)] of `lab` at head dim d."""
  return [(T, data.ms(d, "fwd+bwd", lab, T) / data.ms(d, "fwd", lab, T)) for T in data.Ts
          if data.ms(d, "fwd", lab, T) and data.ms(d, "fwd+bwd", lab, T)]


def growth(data, d, lab, tokens):
  """(T0, T1, ms at T0, ms at T1): `lab`'s forward at the shortest and longest T with
  B * T = `tokens` where VLA pallas has a forward, or None."""
  Ts = [T for T in data.Ts if data.ms(d, "fwd", PALLAS, T)
        and (data.get(d, "fwd", PALLAS, T) or {}).get("B", 0) * T == tokens]
  if len(Ts) < 2 or not (data.ms(d, "fwd", lab, Ts[0]) and data.ms(d, "fwd", lab, Ts[-1])):
    return None
  return Ts[0], Ts[-1], data.ms(d, "fwd", lab, Ts[0]), data.ms(d, "fwd", lab, Ts[-1])


SHORT = {PALLAS: "VLA pallas", CUDNN: "cuDNN", FLA: "fla"}


# -- plots --------------------------------------------------------------------------------------

def plots(data, plot_dir, title):
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError:
    return []
  os.makedirs(plot_dir, exist_ok=True)
  metrics = zip(PLOT_NAMES, ("ms", "tokens / s", "peak MiB"),
                (lambda r: r["ms"], tokens_per_s, lambda r: r.get("peak_mib")))
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

VERSIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "torch", "triton",
            "fla-core", "python")


def versions(h):
  return ", ".join(f"{k} {h[k]}" for k in VERSIONS if h.get(k))


def command(h):
  """The run's command line, its output folder (the machine's) as OUT."""
  argv = list(h.get("argv") or [])
  for i, a in enumerate(argv):
    for flag in ("--out", "--out_dir"):
      if a.startswith(flag + "="):
        argv[i] = flag + "=OUT"
      elif a == flag and i + 1 < len(argv):
        argv[i + 1] = "OUT"
  return f"`python3 {' '.join(argv)}`" if argv else "-"


def settings(h):
  st = h.get("settings", {})
  parts = [f"{name} {fmt(st[key]) if isinstance(st[key], (int, float)) else st[key]}"
           for key, name in (("heads", "H"), ("tokens", "B * T"), ("dtype", "dtype"),
                             ("chunk", "chunk")) if st.get(key) is not None]
  if st.get("smoke"):
    parts.append("**smoke run (CPU, tiny shapes: not a benchmark)**")
  return ", ".join(parts) or "-"


def provenance(headers, n_rows):
  """Lines: a sentence on the runs, a table of each file's run (date, device, settings,
  command) and the versions (one line when every file has the same)."""
  if not headers:
    return []
  devices = list(OrderedDict.fromkeys(h.get("device", "?") for _, h in headers))
  days = sorted(h.get("time", "")[:10] for _, h in headers if h.get("time"))
  when = (f"on {days[0]}" if days and days[0] == days[-1]
          else f"from {days[0]} to {days[-1]}" if days else "")
  same = len({versions(h) for _, h in headers}) == 1
  header = ["file", "date (UTC)", "device", "settings", "command"] + ([] if same else ["versions"])
  body = []
  for path, h in headers:
    t = h.get("time", "?")
    body.append([f"`{os.path.basename(path)}`", t[:16].replace("T", " ") if len(t) >= 16 else t,
                 f"{h.get('device', '?')} ({h.get('jax_backend', '?')})", settings(h),
                 command(h)] + ([] if same else [versions(h) or "-"]))
  lines = [f"{n_rows} rows from {plural(len(headers), 'file')}, run on {joined(devices)} "
           f"{when}.".replace("  ", " ").replace(" .", "."), "", table(header, body), ""]
  if same and versions(headers[0][1]):
    lines += [f"Versions (every file): {versions(headers[0][1])}.", ""]
  return lines


def plural(n, word):
  return f"{n} {word}{'' if n == 1 else 's'}"


def row_sources(data):
  """Lines: a table of the file each row family's measured rows come from, per head dim, so
  that a reader sees which ratios compare rows of one run and which compare runs."""
  groups = OrderedDict()
  for r in data.timed:
    if r.get("status") == "ok":
      files = groups.setdefault(label(r), OrderedDict()).setdefault(r["d"], OrderedDict())
      files[r.get("_file", "?")] = files.get(r.get("_file", "?"), 0) + 1
  if not groups:
    return []
  body = [[lab] + [", ".join(f"`{f}` ({n})" for f, n in per_d.get(d, {}).items()) or "-"
                   for d in data.dims] for lab, per_d in groups.items()]
  lines = ["Measured rows per row family and head dim (file, rows):", "",
           table(["row"] + [f"d = {d}" for d in data.dims], body), ""]
  by_d = OrderedDict()
  for per_d in groups.values():
    for d, files in per_d.items():
      by_d.setdefault(d, set()).update(files)
  mixed = [str(d) for d in data.dims if len(by_d.get(d, ())) > 1]
  if mixed:
    lines += [f"At d = {', '.join(mixed)} the families come from more than one run, so some "
              "ratios compare runs (see the files above); each file's own rows are one run.", ""]
  return lines


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
          f"{STALE_MARK}; every ratio, crossover, floor row and plot leaves "
          "them out: " + "; ".join(items) + ".", ""]


METHOD = [
    "How the rows are measured:", "",
    "- `fwd` returns the output o; `fwd+bwd` returns o and the gradient of sum(o * c) with "
    "respect to every input, c a random cotangent (JAX rows up to the 2026-12-01 runs "
    "returned the gradient alone, which let XLA drop forward work only o needs).",
    "- Times are medians after warm-up, rotating between input sets. JAX rows that carry "
    "`ms_sync` time rounds of calls issued back to back and waited for at the end (round time "
    "/ calls; `ms_sync`, calls each waited for, is kept in the row; calls over 25 ms are "
    "timed one per round); older JAX rows time calls each ended by `block_until_ready`. Torch "
    "rows use `triton.testing.do_bench(return_mode=\"median\")`.",
    "- Peak memory: XLA's compiled memory analysis (arguments + outputs + temporaries) for "
    "JAX rows, `torch.cuda.max_memory_allocated` (peak above the inputs, plus the inputs) for "
    "torch rows.",
    "- `skip`, `OOM`, `err`: rows without a time, listed under \"Rows not measured\".", ""]


def not_measured(data):
  groups = OrderedDict()
  for r in data.timed:
    if r.get("status") == "ok":
      continue
    key = (r["d"], label(r), r["pass"], r["status"], r.get("note") or "")
    groups.setdefault(key, []).append(r["T"])
  body = []
  for (d, lab, pass_, status, note), Ts in groups.items():
    span_ = f"{min(Ts):,}" if len(Ts) == 1 else f"{min(Ts):,} to {max(Ts):,}"
    body.append([d, lab, pass_, span_, status, note.replace("|", "/")[:160]])
  return body


def plot_lines(plot_paths, name, out_path):
  """The markdown image line of the plot called `name`, if it was drawn."""
  base = os.path.dirname(os.path.abspath(out_path))
  return [f"![{name}]({os.path.relpath(os.path.abspath(p), base)})" for p in plot_paths
          if os.path.basename(p) == name] + [""] * any(os.path.basename(p) == name
                                                       for p in plot_paths)


def per_T_table(data, first_header, series_fn):
  """Rows (d, pass), columns: first_header's cells, then one per T: series_fn(d, pass) ->
  ([first cells], {T: cell})."""
  body = []
  for d, p in pairs(data):
    first, cells = series_fn(d, p)
    body.append([d, p] + first + [cells.get(T, "-") for T in data.Ts])
  return table(["d", "pass"] + first_header + [f"{T:,}" for T in data.Ts], body)


FORWARD_ERRORS = ("o", "S", "A")


def error_bound(r, name):
  """The bound a check row holds error `name` to (`lab.benchmarks.check`): du its
  `du_bound`, the forward's errors the smaller of `bound` and `forward_bound`, the rest
  `bound`."""
  b = r.get("bound")
  if name == "du" and r.get("du_bound"):
    return r["du_bound"]
  if name in FORWARD_ERRORS and r.get("forward_bound") and b:
    return min(b, r["forward_bound"])
  return b


def worst_to_bound(r):
  """(largest error / its bound, that error's name) of a check row, or (None, None)."""
  errs = {k: v for k, v in (r.get("errors") or {}).items() if v is not None}
  if not errs and r.get("rel_err") is not None:
    errs = {"error": r["rel_err"]}
  ratios = [(v / error_bound(r, k), k) for k, v in sorted(errs.items()) if error_bound(r, k)]
  return max(ratios) if ratios else (None, None)


# -- the blocks ---------------------------------------------------------------------------------

def verdict_block(data):
  if not pairs(data):
    return "No VLA pallas row has a time."
  return ("Per head dim and pass, over the measured lengths (the sections below have each "
          "length):\n\n" + verdict_table(data))


def crossover_block(data, plot_paths, out_path):
  def cells(d, p):
    series = ratio_series(data, d, p, PALLAS, CUDNN)
    return [crossing(series)], {T: fmt(r) for T, r in series}
  if not any(ratio_series(data, d, p, PALLAS, CUDNN) for d, p in pairs(data)):
    return "No length has both VLA pallas and cuDNN causal attention measured."
  return "\n".join(
      ["Ratio = VLA pallas time / `jax.nn.dot_product_attention(..., is_causal=True, "
       "implementation=\"cudnn\")` time; the crossover is interpolated in log-log between "
       "measured lengths.", "", per_T_table(data, ["crossover"], cells), ""]
      + plot_lines(plot_paths, "time_vs_T.png", out_path))


def fla_block(data):
  def cells(d, p):
    rs = [r for _, r in ratio_series(data, d, p, PALLAS, FLA)]
    return [span(min(rs), max(rs)) if rs else "-"], {
        T: fmt(r) for T, r in ratio_series(data, d, p, PALLAS, FLA)}
  if not fla_ratios(data):
    return "No length has both VLA pallas and fla's chunk_delta_rule measured."
  return ("Ratio = VLA pallas time / fla DeltaNet time; above 1 VLA pallas is slower.\n\n"
          + per_T_table(data, ["range"], cells))


def floor_block(data):
  def cells(d, p):
    xs = [x for _, x in floor_series(data, d, p)]
    return [span(min(xs), max(xs)) if xs else "-"], {
        T: fmt(x) + "x" for T, x in floor_series(data, d, p)}
  if not any(floor_series(data, d, p) for d, p in pairs(data)):
    return "No VLA pallas row carries a floor."
  return ("VLA pallas time / floor, with floor = max(bytes / 4.2 TB/s, flops / 800 TFLOP/s), "
          "bytes = inputs read and outputs written once, flops = the chunked algorithm's "
          "matrix products (`experiments/lab/benchmarks/floor.py`; each row's `floor_ms`).\n\n"
          + per_T_table(data, ["range"], cells))


def field_block(data):
  at_T = field_T(data, fixed_tokens(data))
  if not at_T:
    return "No fla row at the common number of tokens per call."
  body = []
  for d, p in pairs(data, FLA):
    ms_floor = fla_floor(data, d, p, at_T)
    vla = dict(floor_series(data, d, p)).get(at_T)
    at_target = dict(ratio_series(data, d, p, FLA, CUDNN)).get(TARGET_T)
    body.append([d, p, fmt(ms_floor[0]) if ms_floor else "-",
                 fmt(ms_floor[1]) if ms_floor else "-",
                 fmt(ms_floor[0] / ms_floor[1]) + "x" if ms_floor else "-",
                 fmt(vla) + "x" if vla else "-",
                 crossing(ratio_series(data, d, p, FLA, CUDNN)),
                 crossing(ratio_series(data, d, p, PALLAS, CUDNN)),
                 fmt(at_target) if at_target else "-"])
  return ("The floor of fla's model is VLA's without the penalty path "
          "(`floor.delta_rule_floor_ms`: q, k, v in, o out, the state path's products); VLA "
          "does the same state path plus a penalty path of about 1.4 times its products.\n\n"
          + table(["d", "pass", f"fla ms at T = {at_T:,}", "its floor ms", "fla / floor",
                   "VLA pallas / its floor", "fla crosses cuDNN at", "VLA pallas crosses at",
                   f"fla / cuDNN at T = {TARGET_T:,}"], body))


def time_block(data, plot_paths, out_path):
  tokens = fixed_tokens(data)
  grow, back = [], []
  if tokens:
    for d in data.dims:
      for lab in SHORT:
        g = growth(data, d, lab, tokens)
        if g:
          grow.append([d, lab, f"{g[0]:,}", fmt(g[2]), f"{g[1]:,}", fmt(g[3]),
                       f"x{fmt(g[3] / g[2])}"])
    back = [[d, lab] + [fmt(dict(backward_ratios(data, d, lab)).get(T)) for T in data.Ts]
            for d in data.dims for lab in SHORT if backward_ratios(data, d, lab)]
  if not (grow or back):
    return "VLA pallas has no forward at two lengths."
  md = []
  if grow:
    md += [f"Forward time at {tokens:,} tokens per call (B * T):", "",
           table(["d", "row", "from T", "ms", "to T", "ms", "growth"], grow), ""]
  if back:
    md += ["Forward + backward time / forward time:", "",
           table(["d", "row"] + [f"{T:,}" for T in data.Ts], back), ""]
  return "\n".join(md + plot_lines(plot_paths, "tokens_per_s_vs_T.png", out_path))


def kernel_name(name):
  """A profiled kernel's name without XLA's `__<n>` suffix of a second launch site."""
  base, _, n = name.rpartition("__")
  return base if base and n.isdigit() else name


def profile_block(profile, path):
  """Tables of device time per Pallas kernel (ms, summed over launches), one per call
  (forward, gradient), a column per (d, T, B), from `experiments/profile_kernels.py`'s JSON."""
  if not profile or not profile.get("rows"):
    return "No profile given (`experiments/report_benchmarks.py --profile=FILE.json`)."
  md = [f"Device time in ms per kernel from a profiler trace, summed over launches "
        f"(`{path}`: `experiments/profile_kernels.py` on {profile.get('device', '?')}, jax "
        f"{profile.get('jax', '?')}; bf16, H = 16). Each row lists the trace's largest "
        "kernels only: \"other Pallas\" is the Pallas time not among them, \"XLA and "
        "libraries\" every non-Pallas kernel; busy = the sum, wall = first start to last end.", ""]
  for call in dict.fromkeys(r["call"] for r in profile["rows"]):
    rows = [r for r in profile["rows"] if r["call"] == call]
    times = [{} for _ in rows]
    for t, r in zip(times, rows):
      for k in r["kernels"]:
        if k.get("class") == "pallas":
          t[kernel_name(k["name"])] = t.get(kernel_name(k["name"]), 0) + k["ms"]
    names = sorted({n for t in times for n in t}, key=lambda n: -max(t.get(n, 0) for t in times))
    body = [[f"`{n}`"] + [fmt(t.get(n)) if n in t else "-" for t in times] for n in names]
    rest = [r["classes_ms"].get("pallas", 0) - sum(t.values()) for t, r in zip(times, rows)]
    body.append(["other Pallas"] + [fmt(x if x > 1e-6 else 0) for x in rest])
    body.append(["XLA and libraries"] + [fmt(sum(v for c, v in r["classes_ms"].items()
                                                 if c != "pallas")) for r in rows])
    body.append(["busy (wall)"] + [f"{fmt(r['busy_ms'])} ({fmt(r['wall_ms'])})" for r in rows])
    md += [f"### {call}", "",
           table(["kernel"] + [f"d = {r['d']}, T = {r['T']:,}, B = {r['B']}" for r in rows],
                 body), ""]
  return "\n".join(md)


def dim_block(data, d):
  """Milliseconds, the fastest row per T and tokens per second at head dim d, per pass."""
  md = []
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
  return "\n".join(md)


def memory_block(data, plot_paths, out_path):
  md = []
  for d in data.dims:
    for pass_ in PASSES:
      if data.labels_for(d, pass_, measured_only=True):
        md += [f"### d = {d}, {pass_}: peak device memory (MiB)", "",
               metric_table(data, d, pass_, lambda r: r.get("peak_mib")), ""]
  return "\n".join(md + plot_lines(plot_paths, "memory_vs_T.png", out_path)) or "No timed rows."


# The check rows' `KernelConfig` forms (`check.OPTION_DEFAULTS`' names) that a row's impl
# leaves unnamed: None (the plan's choice) and, in a row that records all three by name (a
# check run while these were the options' defaults), these.
NAMED_DEFAULTS = {"block_factor": "elimination", "start_inverse": "xla",
                  "penalty_layout": "rows"}


def forced_forms(row):
  """["name=form", ...]: the `KernelConfig` forms a check row ran that were not its defaults."""
  forms = {k: row.get(k) for k in check.OPTION_DEFAULTS}
  named = None not in forms.values()
  return [f"{k}={v}" for k, v in forms.items()
          if v is not None and not (named and v == NAMED_DEFAULTS[k])]


def correctness_block(rows):
  """The check rows (`experiments/check_kernels.py`) as a table of relative errors against a
  float64 reference."""
  checks = [r for r in rows if r.get("pass") == "check"]
  if not checks:
    return "No check rows."
  checks.sort(key=lambda r: (r.get("op") != "vla", str(r.get("op")), r.get("d") or 0,
                             str(r.get("dtype")), str(r.get("precision")),
                             str(r.get("u")), bool(r.get("packed")), bool(r.get("beta")),
                             r.get("T") or 0))
  notes = any(r.get("note") for r in checks)
  body = []
  for r in checks:
    errs = r.get("errors") or {}
    fwd = [errs[k] for k in FORWARD_ERRORS if errs.get(k) is not None]
    grad = [v for k, v in errs.items() if k.startswith("d") and v is not None]
    worst = lambda xs: fmt(max(xs)) if xs else fmt(r.get("rel_err"))
    bounds = fmt(r.get("bound"))
    if r.get("du_bound") and r["du_bound"] != r.get("bound"):
      bounds += f"; du {fmt(r['du_bound'])}"
    if r.get("forward_bound"):
      bounds += f"; o, S, A {fmt(r['forward_bound'])}"
    ratio, name = worst_to_bound(r)
    options = forced_forms(r)
    impl = f"{r.get('impl')} ({', '.join(options)})" if options else r.get("impl")
    body.append([r.get("op") or "vla", r.get("d"), impl, r.get("dtype"), r.get("precision") or "-",
                 r.get("u") or "-", "yes" if r.get("packed") else "-",
                 "yes" if r.get("beta") else "-", f"{r['T']:,}" if r.get("T") else "-",
                 r.get("B") or "-",
                 worst(fwd), worst(grad) if grad else "-", bounds,
                 f"{fmt(ratio, 2)} ({name})" if ratio is not None else "-", r.get("status")]
                + ([(r.get("note") or "").replace("|", "/")[:120]] if notes else []))
  return ("Relative Frobenius errors against a float64 reference on the same inputs (o, S_T, "
          "A_T forward (the baselines: o, S_T); the gradients of a weighted sum of them), on the GPU at the rows' "
          "precision; `u` isotropic or anisotropic (a few dominant directions plus noise, "
          "rows normalised, the scale a trained layer gives); impl names the `KernelConfig` "
          "options a row ran where they are not the defaults; packed rows hold documents of about "
          "300 tokens (`segment_ids`), checked against impl=\"chunked\" on the same documents; "
          "beta rows have a learned write strength sigmoid(normal) per token and head. "
          "Bounds: `bound` on every error, "
          "du's own with anisotropic u, the forward's own at float32 HIGHEST "
          "(`experiments/lab/benchmarks/check.py`, the baselines' in `check_baselines.py`).\n\n"
          + table(["op", "d", "impl", "dtype", "precision", "u", "packed", "beta", "T", "B",
                   "worst forward",
                   "worst gradient", "bounds", "worst / its bound", "status"]
                  + (["note"] if notes else []), body))


def drift_block(rows):
  """The drift rows (`experiments/check_kernels.py --cases=drift`) as a table: bfloat16 o's
  error against impl="chunked" in float32 at HIGHEST, over the sequence and per quarter, with
  u anisotropic of unit norm and isotropic of norm about sqrt(d)."""
  drift = [r for r in rows if r.get("pass") == "drift"]
  if not drift:
    return "No drift rows."
  return ("bfloat16 inputs; u anisotropic (a few dominant directions) with rows of unit norm "
          "(the layer's default penalty scale), or isotropic with norm about sqrt(d) (large "
          "penalty gains |u|^2 / lam0 while A is near A_0); A_0 = I / lam0, B = 1, H = 2: "
          "the relative error of `vla_pallas`'s o against impl=\"chunked\" in float32 at "
          "HIGHEST, over the sequence and per quarter of it; an anisotropic row fails beyond "
          f"{check.DRIFT_RATIO}x its isotropic twin's error, any row when o is not finite "
          "(`lab.benchmarks.check.drift`).\n\n" + check.drift_table(check.drift_verdicts(drift)))


def not_measured_block(data):
  missing = not_measured(data)
  if not missing:
    return "None: every timed row has a time."
  return table(["d", "row", "pass", "T", "status", "reason"], missing)


def sources_block(headers, rows, data, command=None):
  md = ["Generated by `experiments/report_benchmarks.py` from the JSON lines in `results/bench/` "
        "(written by `experiments/bench.py` and `experiments/check_kernels.py`): the tables "
        "between the generated markers are computed from those rows, the words between them "
        "are written by hand.", ""]
  if command:
    md += [f"Regenerate (files oldest run first; a later file's row replaces an earlier "
           f"one's): `{command}`", ""]
  return "\n".join(md + provenance(headers, len(rows)) + row_sources(data) + stale_note(data)
                   + METHOD)


# (block name, the heading a new file gives it); the dims' blocks follow "profile"
SECTIONS = (("verdict", "## Verdict"), ("sources", "## Rows and method"),
            ("crossover", "## Crossover against cuDNN causal attention"),
            ("fla", "## VLA pallas against fla `chunk_delta_rule`"),
            ("floor", "## VLA pallas against the hardware floor"),
            ("field", "## fla's DeltaNet kernel on the same measures"),
            ("time", "## Where VLA pallas's time goes"), ("profile", "## Per-kernel profile"),
            ("memory", "## Peak device memory"),
            ("baselines", "## Baseline kernels against fla"),
            ("model", "## Whole-model training step"),
            ("train_speed", "## Training speed with the library defaults"),
            ("correctness", "## Correctness against float64"),
            ("drift", "## bfloat16 over long sequences"),
            ("not_measured", "## Rows not measured"))


def blocks(headers, rows, plot_paths, out_path, command=None, profile=None,
           profile_path=None, extra=None):
  """{block name: markdown} of BENCHMARKS.md, in order: tables, plots and the fixed notes on
  how they are computed, with `extra` ({name: markdown}, made from other rows) after the memory
  block; no findings (those are written by hand around the blocks)."""
  data = Data(rows)
  out = {"verdict": verdict_block(data),
         "sources": sources_block(headers, rows, data, command),
         "crossover": crossover_block(data, plot_paths, out_path),
         "fla": fla_block(data), "floor": floor_block(data), "field": field_block(data),
         "time": time_block(data, plot_paths, out_path),
         "profile": profile_block(profile, profile_path)}
  for d in data.dims:
    if any(data.labels_for(d, p, measured_only=True) for p in PASSES):
      out[f"d{d}"] = dim_block(data, d)
  out.update(memory=memory_block(data, plot_paths, out_path), **(extra or {}),
             correctness=correctness_block(rows), drift=drift_block(rows),
             not_measured=not_measured_block(data))
  return out


def skeleton(names):
  """A new BENCHMARKS.md: a title, then each block under its heading."""
  titles = dict(SECTIONS)
  parts = ["# Benchmarks"]
  for name in names:
    title = titles.get(name) or f"## d = {name[1:]}"
    parts.append(f"{title}\n\n{markers.begin(name)}\n{markers.end(name)}")
  return "\n\n".join(parts) + "\n"


PLOT_NAMES = ("time_vs_T.png", "tokens_per_s_vs_T.png", "memory_vs_T.png")


def regenerate_command(bench_dir, out, plots_dir, profile):
  """The command line BENCHMARKS.md shows for regenerating it with these flags."""
  return (f"python3 experiments/report_benchmarks.py --bench_dir={bench_dir} --out={out} "
          f"--plots={plots_dir} --profile={profile}")


def load_profile(path):
  """The JSON of `experiments/profile_kernels.py` at `path`, or None without a path."""
  if not path:
    return None
  with open(path) as f:
    return json.load(f)


def write_report(paths, out_path, plot_dir=None, command=None, profile_path=None, extra=None):
  """Reads `paths` (oldest run first) and the profile JSON (if given), rewrites the generated
  blocks of `out_path` (its other lines stay as written; a new file gets every block under a
  heading; `lab.markers`) and the plots (under plot_dir, if given); returns (number of rows,
  plot paths). Raises ValueError when `out_path`'s markers do not match the blocks."""
  headers, rows = load(paths)
  data = Data(rows)
  device = ", ".join(dict.fromkeys(h.get("device", "?") for _, h in headers)) or "?"
  plot_paths = plots(data, plot_dir, f"{device}; log-log") if plot_dir else []
  new = blocks(headers, rows, plot_paths, out_path, command, load_profile(profile_path),
               profile_path, extra)
  if os.path.exists(out_path):
    with open(out_path) as f:
      text = f.read()
  else:
    text = skeleton(list(new))
  text = markers.replace_blocks(text, new, out_path)
  with open(out_path, "w") as f:
    f.write(text)
  return len(rows), plot_paths
