"""BENCHMARKS.md and log-log plots, from the JSON lines of `experiments/bench.py` and
`experiments/check_kernels.py` (results/bench/).

Each section opens with a finding of two sentences computed from the rows (the `*_finding`
functions: where VLA pallas crosses cuDNN, its ratio to fla, its distance to the floor, ...),
then its tables and plots; the file list at the top says where the rows come from.

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
from lab.benchmarks import floor

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


def crosses(series):
  """`crossing` in a sentence, after "crosses ...": "at T ~ 8,502", "below T = 1,024"."""
  text = crossing(series)
  return text if text.startswith(("below", "beyond")) else "at " + text


# -- words --------------------------------------------------------------------------------------

def joined(items):
  """"a", "a and b", "a, b and c"."""
  items = list(items)
  return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def span(lo, hi, unit="x"):
  """"1.52x to 1.94x", or one value when both read the same."""
  a, b = fmt(lo) + unit, fmt(hi) + unit
  return a if a == b else f"{a} to {b}"


def where(d, pass_, T=None):
  """"d = 64, fwd" or "d = 64, fwd, T = 4,096"."""
  return f"d = {d}, {pass_}" + (f", T = {T:,}" if T is not None else "")


def by_dim(data, phrase):
  """"A (fwd) and B (fwd+bwd) at d = 64; C (fwd) at d = 128" from phrase(d, pass) (None: left
  out)."""
  groups = []
  for d in data.dims:
    items = [f"{text} ({p})" for p in PASSES for text in [phrase(d, p)] if text]
    if items:
      groups.append(f"{joined(items)} at d = {d}")
  return "; ".join(groups)


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


def extremes(points):
  """(smallest, largest) of [(value, *where)] by value (the first of equal ones), or
  (None, None)."""
  if not points:
    return None, None
  return min(points, key=lambda x: x[0]), max(points, key=lambda x: x[0])


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


# -- findings: the two sentences that open each section -----------------------------------------

def fla_relation(ratios):
  """VLA pallas against fla's chunk_delta_rule, given the ratios of their times: "is slower
  than fla's chunk_delta_rule at every measured T", or "" without ratios."""
  if not ratios:
    return ""
  if min(ratios) >= 1:
    return "is slower than fla's chunk_delta_rule at every measured T"
  if max(ratios) < 1:
    return "is faster than fla's chunk_delta_rule at every measured T"
  return (f"is faster than fla's chunk_delta_rule at {sum(r < 1 for r in ratios)} of "
          f"{len(ratios)} measured points")


def fla_ratios(data):
  return [r for d, p in pairs(data) for _, r in ratio_series(data, d, p, PALLAS, FLA)]


def verdict_finding(data):
  """Where VLA pallas crosses cuDNN, how it stands against fla, how often it is the fastest row
  and how far it runs from its floor."""
  cross = [(d, p, crossover(ratio_series(data, d, p, PALLAS, CUDNN))) for d, p in pairs(data)]
  cross = [(d, p, kind, value) for d, p, (kind, value) in cross if kind != "none"]
  at = sorted((value, d, p) for d, p, kind, value in cross if kind == "at")
  if at and len(at) == len(cross):
    (lo, d0, p0), (hi, d1, p1) = at[0], at[-1]
    first = (f"VLA pallas overtakes cuDNN causal attention between T ~ {lo:,.0f} "
             f"({where(d0, p0)}) and T ~ {hi:,.0f} ({where(d1, p1)})" if len(at) > 1 else
             f"VLA pallas overtakes cuDNN causal attention at T ~ {lo:,.0f} ({where(d0, p0)})")
  elif cross:
    ahead = sum(kind in ("at", "always") for _, _, kind, _ in cross)
    first = (f"VLA pallas is faster than cuDNN causal attention at the longest measured T in "
             f"{ahead} of {len(cross)} head dims and passes")
  else:
    first = "VLA pallas has no length measured beside cuDNN causal attention"
  ratios = fla_ratios(data)
  first += (f"; it {fla_relation(ratios)} ({span(min(ratios), max(ratios))} its time)."
            if ratios else ".")
  wins = n = 0
  for d, p in pairs(data):
    body = fastest_summary(data, d, p)
    n += len(body)
    wins += sum(line[1] == PALLAS for line in body)
  floors = [x for d, p in pairs(data) for _, x in floor_series(data, d, p)]
  second = []
  if n:
    second.append(f"is the fastest row at {wins} of {n} measured (head dim, pass, T) points")
  if floors:
    second.append(f"takes {span(min(floors), max(floors))} its hardware floor's time")
  return first + (f" It {joined(second)}." if second else "")


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


def crossover_finding(data):
  """Where VLA pallas crosses cuDNN at each head dim and pass, and the range of the ratio."""
  points = [(r, d, p, T) for d, p in pairs(data)
            for T, r in ratio_series(data, d, p, PALLAS, CUDNN)]
  if not points:
    return "No length has both VLA pallas and cuDNN causal attention measured."
  first = ("VLA pallas crosses cuDNN causal attention (faster from there on) "
           + by_dim(data, lambda d, p: crosses(ratio_series(data, d, p, PALLAS, CUDNN))
                    if ratio_series(data, d, p, PALLAS, CUDNN) else None) + ".")
  (lo, *w_lo), (hi, *w_hi) = extremes(points)
  return (first + f" Its time runs from {fmt(hi)}x cuDNN's ({where(*w_hi)}) to {fmt(lo)}x "
          f"({where(*w_lo)}).")


def fla_finding(data):
  """VLA pallas against fla: the range of the ratio per head dim and pass, and the T where it
  is smallest."""
  ratios = fla_ratios(data)
  if not ratios:
    return "No length has both VLA pallas and fla's chunk_delta_rule measured."

  def ratio_span(d, p):
    series = [r for _, r in ratio_series(data, d, p, PALLAS, FLA)]
    return span(min(series), max(series)) if series else None
  best = {}
  for d, p in pairs(data):
    series = ratio_series(data, d, p, PALLAS, FLA)
    if series:
      best.setdefault(min(series, key=lambda tr: tr[1])[0], []).append(where(d, p))
  if len(best) == 1:
    second = f"The ratio is smallest at T = {next(iter(best)):,} at every head dim and pass."
  else:
    second = ("The ratio is smallest at " + "; ".join(f"T = {T:,} ({joined(w)})"
                                                      for T, w in sorted(best.items())) + ".")
  return (f"VLA pallas {fla_relation(ratios)}, with time ratios of {by_dim(data, ratio_span)}. "
          + second)


def floor_finding(data):
  """How far VLA pallas runs from its hardware floor: overall and per head dim."""
  points = [(x, d, p, T) for d, p in pairs(data) for T, x in floor_series(data, d, p)]
  if not points:
    return "No VLA pallas row carries a floor."
  (lo, *w_lo), (hi, *w_hi) = extremes(points)
  first = (f"VLA pallas takes {fmt(lo)}x ({where(*w_lo)}) to {fmt(hi)}x ({where(*w_hi)}) its "
           "hardware floor's time." if fmt(lo) != fmt(hi) else
           f"VLA pallas takes {fmt(lo)}x its hardware floor's time at every measured point.")
  per_d = []
  for d in data.dims:
    xs = [x for x, d_, _, _ in points if d_ == d]
    if xs:
      per_d.append(f"{span(min(xs), max(xs))} at d = {d}")
  return f"{first} By head dim: {joined(per_d)}."


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


def field_finding(data, T):
  """fla against its own floor at T beside VLA pallas against its own, and where fla's forward
  crosses cuDNN beside VLA pallas's."""
  fla, vla = [], []
  for d, p in pairs(data, FLA):
    ms_floor = fla_floor(data, d, p, T)
    if ms_floor:
      fla.append(ms_floor[0] / ms_floor[1])
    vla += [x for T_, x in floor_series(data, d, p) if T_ == T]
  sentences = []
  if fla:
    text = (f"At T = {T:,}, fla's chunk_delta_rule takes {span(min(fla), max(fla))} the floor "
            "time of its own model")
    if vla:
      text += f", against {span(min(vla), max(vla))} for VLA pallas over its own"
    sentences.append(text + ".")

  fla_x, vla_x = [], []
  for d in data.dims:
    for lab, out in ((FLA, fla_x), (PALLAS, vla_x)):
      series = ratio_series(data, d, "fwd", lab, CUDNN)
      if series:
        out.append(f"{crosses(series)} (d = {d})")
  if fla_x:
    sentences.append(f"Its forward crosses cuDNN causal attention {joined(fla_x)}"
                     + (f"; VLA pallas's {joined(vla_x)}." if vla_x else "."))
  return " ".join(sentences) or f"No fla row at T = {T:,}."


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


def time_finding(data, tokens):
  """How forward time grows with T at a fixed number of tokens per call, per row, and the
  cost of the backward."""
  sentences = []
  grown = {lab: [(d, g) for d in data.dims for g in [growth(data, d, lab, tokens)] if g]
           for lab in SHORT}
  if grown[PALLAS]:
    T0, T1 = grown[PALLAS][0][1][:2]
    dims = lambda lab: [d for d, _ in grown[lab]]
    phrase = lambda lab: joined(
        f"x{fmt(b / a)}" + (f" (d = {d})" if lab == PALLAS or dims(lab) != dims(PALLAS) else "")
        for d, (_, _, a, b) in grown[lab])
    s = (f"From T = {T0:,} to {T1:,} at {tokens:,} tokens per call, VLA pallas's forward time "
         f"grows {phrase(PALLAS)}")
    others = [f"{phrase(lab)} for {SHORT[lab]}" for lab in (FLA, CUDNN) if grown[lab]]
    sentences.append(s + (f", against {joined(others)}." if others else "."))
  back = {lab: [r for d in data.dims for _, r in backward_ratios(data, d, lab)] for lab in SHORT}
  if back[PALLAS]:
    others = [f"{span(min(back[lab]), max(back[lab]))} for {SHORT[lab]}"
              for lab in (FLA, CUDNN) if back[lab]]
    sentences.append(f"Its forward + backward takes {span(min(back[PALLAS]), max(back[PALLAS]))} "
                     "its forward's time" + (f", against {joined(others)}." if others else "."))
  return " ".join(sentences) or "VLA pallas has no forward at two lengths."


def runs(seq):
  """[(value, first T, last T)] of consecutive equal values in [(T, value)]."""
  out = []
  for T, v in seq:
    if out and out[-1][0] == v:
      out[-1] = (v, out[-1][1], T)
    else:
      out.append((v, T, T))
  return out


def fastest_phrase(body):
  """"softmax cudnn up to T = 2,048 and DeltaNet fla_chunk_delta_rule from T = 4,096" from the
  rows of `fastest_summary`."""
  spans = runs([(int(line[0].replace(",", "")), line[1]) for line in body])
  if len(spans) == 1:
    return f"{spans[0][0]} at every T"
  parts = []
  for i, (lab, t0, t1) in enumerate(spans):
    if i == 0:
      parts.append(f"{lab} up to T = {t1:,}")
    elif i == len(spans) - 1:
      parts.append(f"{lab} from T = {t0:,}")
    else:
      parts.append(f"{lab} at T = {t0:,}" + (f" to {t1:,}" if t1 != t0 else ""))
  return joined(parts)


def dim_finding(data, d):
  """At head dim d: which row is the fastest at each T, and VLA pallas's best place."""
  bodies = {p: fastest_summary(data, d, p) for p in PASSES}
  bodies = {p: b for p, b in bodies.items() if b}
  if not bodies:
    return f"No length at d = {d} has every baseline measured."
  phrases = {p: fastest_phrase(b) for p, b in bodies.items()}
  if len(set(phrases.values())) == 1:
    first = f"The fastest row is {next(iter(phrases.values()))} in {joined(phrases)}."
  else:
    first = "The fastest row is " + "; ".join(f"{ph} ({p})" for p, ph in phrases.items()) + "."
  places = [(int(line[4].split()[0]), p, int(line[0].replace(",", "")), line[4])
            for p, b in bodies.items() for line in b if line[4] != "-"]
  if not places:
    return first
  wins = sum(place == 1 for place, *_ in places)
  best = min(places)[0]
  firsts = OrderedDict()
  for place, p, T, text in sorted(places, key=lambda x: (PASSES.index(x[1]), x[2])):
    if place == best:
      firsts.setdefault(p, (T, text))
  at = joined(f"T = {T:,} ({p})" for p, (T, _) in firsts.items())
  return (first + f" VLA pallas is the fastest row at {wins} of "
          f"{sum(len(b) for b in bodies.values())} (pass, T) points; its best place, "
          f"{next(iter(firsts.values()))[1]}, comes first at {at}.")


def memory_finding(data):
  """VLA pallas's peak memory against each other row's, and its peak at the longest T."""
  ratios, peaks = {}, []
  for d in data.dims:
    for p in PASSES:
      for T in data.Ts:
        mine = data.get(d, p, PALLAS, T)
        if not (mine and mine.get("status") == "ok" and mine.get("peak_mib")):
          continue
        peaks.append((mine["peak_mib"], d, p, T))
        for lab in (FLA, CUDNN):
          r = data.get(d, p, lab, T)
          if r and r.get("status") == "ok" and r.get("peak_mib"):
            ratios.setdefault(lab, []).append(mine["peak_mib"] / r["peak_mib"])
  if not peaks:
    return "No VLA pallas row carries a peak memory."
  T_max = max(T for *_, T in peaks)
  longest = [(mib, d, p) for mib, d, p, T in peaks if T == T_max]
  sentences = []
  if ratios:
    sentences.append("VLA pallas's peak memory is " + joined(
        f"{span(min(x), max(x))} {SHORT[lab]}'s" for lab, x in ratios.items())
        + " at the same head dim, pass and T.")
  (lo, *w_lo), (hi, *w_hi) = extremes(longest)
  sentences.append(f"At its longest T, {T_max:,}, it peaks at {fmt(lo)} MiB ({where(*w_lo)})"
                   + (f" to {fmt(hi)} MiB ({where(*w_hi)})." if hi != lo else "."))
  return " ".join(sentences)


def not_measured_finding(data):
  """How many timed rows carry no time, by status, and the shortest such T."""
  missing = [r for r in data.timed if r.get("status") != "ok"]
  counts = OrderedDict()
  for r in missing:
    status = cell(r, None)
    counts[status] = counts.get(status, 0) + 1
  first = min(missing, key=lambda r: (r["T"], r["d"], PASSES.index(r["pass"])
                                      if r["pass"] in PASSES else 0))
  verb = "carries" if len(missing) == 1 else "carry"
  return (f"{len(missing)} of the {len(data.timed)} timed rows {verb} no time ("
          + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"). The shortest such T is "
          f"{first['T']:,} ({label(first)}, {where(first['d'], first['pass'])}).")


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
          f"{STALE_MARK}; every computed sentence, ratio, crossover, floor row and plot leaves "
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


def vla_sections(data, plot_paths, out_path):
  """The sections on VLA pallas against cuDNN, fla and its floor, fla on the same measures and
  where VLA pallas's time goes."""
  md = ["## Verdict", "", verdict_finding(data), "", verdict_table(data), ""]

  def cudnn_cells(d, p):
    series = ratio_series(data, d, p, PALLAS, CUDNN)
    return [crossing(series)], {T: fmt(r) for T, r in series}
  if any(ratio_series(data, d, p, PALLAS, CUDNN) for d, p in pairs(data)):
    md += ["## Crossover against cuDNN causal attention", "", crossover_finding(data), "",
           "Ratio = VLA pallas time / `jax.nn.dot_product_attention(..., is_causal=True, "
           "implementation=\"cudnn\")` time; the crossover is interpolated in log-log between "
           "measured lengths.", "", per_T_table(data, ["crossover"], cudnn_cells), ""]
  md += plot_lines(plot_paths, "time_vs_T.png", out_path)

  def fla_cells(d, p):
    series = ratio_series(data, d, p, PALLAS, FLA)
    rs = [r for _, r in series]
    return [span(min(rs), max(rs)) if rs else "-"], {T: fmt(r) for T, r in series}
  if fla_ratios(data):
    md += ["## VLA pallas against fla `chunk_delta_rule`", "", fla_finding(data), "",
           "Ratio = VLA pallas time / fla DeltaNet time; above 1 VLA pallas is slower.", "",
           per_T_table(data, ["range"], fla_cells), ""]

  def floor_cells(d, p):
    series = floor_series(data, d, p)
    xs = [x for _, x in series]
    return [span(min(xs), max(xs)) if xs else "-"], {T: fmt(x) + "x" for T, x in series}
  if any(floor_series(data, d, p) for d, p in pairs(data)):
    md += ["## VLA pallas against the hardware floor", "", floor_finding(data), "",
           "VLA pallas time / floor, with floor = max(bytes / 4.2 TB/s, flops / 800 TFLOP/s), "
           "bytes = inputs read and outputs written once, flops = the chunked algorithm's "
           "matrix products (`experiments/lab/benchmarks/floor.py`; each row's `floor_ms`).", "",
           per_T_table(data, ["range"], floor_cells), ""]

  tokens = fixed_tokens(data)
  at_T = field_T(data, tokens)
  if at_T:
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
    md += ["## fla's DeltaNet kernel on the same measures", "", field_finding(data, at_T), "",
           "The floor of fla's model is VLA's without the penalty path "
           "(`floor.delta_rule_floor_ms`: q, k, v in, o out, the state path's products); VLA "
           "does the same state path plus a penalty path of about 1.4 times its products.", "",
           table(["d", "pass", f"fla ms at T = {at_T:,}", "its floor ms", "fla / floor",
                  "VLA pallas / its floor", "fla crosses cuDNN at", "VLA pallas crosses at",
                  f"fla / cuDNN at T = {TARGET_T:,}"], body), ""]

  if tokens:
    grow = []
    for d in data.dims:
      for lab in SHORT:
        g = growth(data, d, lab, tokens)
        if g:
          grow.append([d, lab, f"{g[0]:,}", fmt(g[2]), f"{g[1]:,}", fmt(g[3]),
                       f"x{fmt(g[3] / g[2])}"])
    back = [[d, lab] + [fmt(dict(backward_ratios(data, d, lab)).get(T)) for T in data.Ts]
            for d in data.dims for lab in SHORT if backward_ratios(data, d, lab)]
    if grow or back:
      md += ["## Where VLA pallas's time goes", "", time_finding(data, tokens), ""]
      if grow:
        md += [f"Forward time at {tokens:,} tokens per call (B * T):", "",
               table(["d", "row", "from T", "ms", "to T", "ms", "growth"], grow), ""]
      if back:
        md += ["Forward + backward time / forward time:", "",
               table(["d", "row"] + [f"{T:,}" for T in data.Ts], back), ""]
      md += plot_lines(plot_paths, "tokens_per_s_vs_T.png", out_path)
      md += ["Per kernel (a profiler trace, `experiments/profile_kernels.py`) and why: "
             "`kernels/DESIGN.md`.", ""]
  return md


def dim_sections(data, plot_paths, out_path):
  """One section per head dim (milliseconds, fastest row, tokens per second), then the peak
  memory of every head dim."""
  md = []
  for d in data.dims:
    if not any(data.labels_for(d, p, measured_only=True) for p in PASSES):
      continue
    md += [f"## d = {d}", "", dim_finding(data, d), ""]
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
  if md:
    md += ["## Peak device memory", "", memory_finding(data), ""]
    for d in data.dims:
      for pass_ in PASSES:
        if data.labels_for(d, pass_, measured_only=True):
          md += [f"### d = {d}, {pass_}: peak device memory (MiB)", "",
                 metric_table(data, d, pass_, lambda r: r.get("peak_mib")), ""]
    md += plot_lines(plot_paths, "memory_vs_T.png", out_path)
  return md


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
  md += provenance(headers, len(rows)) + row_sources(data) + stale_note(data) + METHOD
  if pairs(data):
    md += vla_sections(data, plot_paths, out_path)
  else:
    md += ["## Verdict", "", "No VLA pallas row has a time.", ""]
  md += dim_sections(data, plot_paths, out_path)
  md += correctness_section(rows)
  missing = not_measured(data)
  if missing:
    md += ["## Rows not measured", "", not_measured_finding(data), "",
           table(["d", "row", "pass", "T", "status", "reason"], missing), ""]
  return "\n".join(md)


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


def check_where(r):
  return (f"d = {r.get('d')}, {r.get('dtype')} {r.get('precision') or '-'}, "
          f"{r.get('u') or '-'} u, T = {r['T']:,}" if r.get("T") else "")


def correctness_finding(checks):
  """Whether every check row holds its bounds (which one comes closest), and the worst error
  per dtype and precision."""
  failed = [r for r in checks if r.get("status") != "ok"]
  if failed:
    first = (f"{len(failed)} of the {len(checks)} check rows fail their bounds: "
             + "; ".join(check_where(r) for r in failed) + ".")
  else:
    close = max((worst_to_bound(r) + (i,) for i, r in enumerate(checks)
                 if worst_to_bound(r)[0] is not None), default=None)
    first = f"All {len(checks)} check rows hold their bounds"
    if close:
      ratio, name, i = close
      first += (f"; the closest, {check_where(checks[i])}, has its {name} error at "
                f"{fmt(ratio, 2)} of its bound")
    first += "."
  worst = OrderedDict()
  for r in sorted(checks, key=lambda r: (str(r.get("dtype")), str(r.get("precision")))):
    errs = {k: v for k, v in (r.get("errors") or {}).items() if v is not None}
    if not errs and r.get("rel_err") is not None:
      errs = {"error": r["rel_err"]}
    for k, v in errs.items():
      key = f"{r.get('dtype')} {r.get('precision') or ''}".strip()
      if key not in worst or v > worst[key][0]:
        worst[key] = (v, k)
  if not worst:
    return first
  return first + " The worst error per precision: " + joined(
      f"{fmt(v)} ({k}) in {key}" for key, (v, k) in worst.items()) + "."


def correctness_section(rows):
  """Lines of "Correctness against float64": a finding, then the check rows
  (`experiments/check_kernels.py`) as a table of relative errors against a float64
  reference."""
  checks = [r for r in rows if r.get("pass") == "check"]
  if not checks:
    return []
  checks.sort(key=lambda r: (r.get("d") or 0, str(r.get("dtype")), str(r.get("precision")),
                             str(r.get("u")), r.get("T") or 0))
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
    body.append([r.get("d"), r.get("impl"), r.get("dtype"), r.get("precision") or "-",
                 r.get("u") or "-", f"{r['T']:,}" if r.get("T") else "-", r.get("B") or "-",
                 worst(fwd), worst(grad) if grad else "-", bounds,
                 f"{fmt(ratio, 2)} ({name})" if ratio is not None else "-", r.get("status")]
                + ([(r.get("note") or "").replace("|", "/")[:120]] if notes else []))
  return ["## Correctness against float64", "", correctness_finding(checks), "",
          "Relative Frobenius errors against a float64 reference on the same inputs (o, S_T, "
          "A_T forward; the gradients of a weighted sum of them), on the GPU at the rows' "
          "precision; `u` isotropic or anisotropic (a few dominant directions plus noise, "
          "rows normalised, the scale a trained layer gives). Bounds: `bound` on every error, "
          "du's own with anisotropic u, the forward's own at float32 HIGHEST "
          "(`experiments/lab/benchmarks/check.py`).", "",
          table(["d", "impl", "dtype", "precision", "u", "T", "B", "worst forward",
                 "worst gradient", "bounds", "worst / its bound", "status"]
                + (["note"] if notes else []), body), ""]


def write_report(paths, out_path, plot_dir=None, command=None):
  """Reads `paths` (oldest run first), rewrites the generated block of `out_path` (a new file
  holds the block alone; `lab.markers`) and the plots (under plot_dir, if given); returns
  (number of rows, plot paths)."""
  headers, rows = load(paths)
  data = Data(rows)
  device = ", ".join(dict.fromkeys(h.get("device", "?") for _, h in headers)) or "?"
  plot_paths = plots(data, plot_dir, f"{device}; log-log") if plot_dir else []
  body = render(headers, rows, plot_paths, out_path, command=command)
  body = body.removeprefix("# Benchmarks\n").strip()
  if os.path.exists(out_path):   # the hand-written verdict around the block stays as it is
    with open(out_path) as f:
      text = f.read()
  else:
    text = "# Benchmarks\n\n" + markers.skeleton(["benchmarks"])
  text = markers.replace_blocks(text, {"benchmarks": body}, out_path)
  with open(out_path, "w") as f:
    f.write(text)
  return len(rows), plot_paths
