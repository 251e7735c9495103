"""Per-kernel device time of the Pallas forward and gradient, read from a JAX profiler trace.

For each T (H = 16, bfloat16 inputs, B * T = --tokens, B = 1 beyond) and each head dim of
--dims, the script runs `vla_pallas` at the library's defaults (`KernelConfig()`), compiles and
warms up its forward and its gradient (of sum(o)), then traces --reps calls of each with
`jax.profiler.trace` and reads the trace back with `jax.profiler.ProfileData`. Every device
event is one kernel launch; the script groups them by name, sums their durations and divides by
--reps, and sorts each kernel into a class:

  pallas   the library's Triton kernels (names that contain "vla_": Pallas names a launch
           after its kernel, `vla_penalty_scan` and so on)
  gemm     library matrix products (cuBLAS / CUTLASS / XLA's Triton gemm fusions)
  copy     memcpy / memset
  xla      every other XLA fusion (elementwise, reductions, transposes, pads, ...)

It prints, per call, the busy time of each class, their sum against the wall time of one call,
the device's idle time inside a call (gaps between kernels: launch overhead, host work) with
the largest gaps and the kernels around them, and the --top kernels, and writes the rows to
OUT/profile_kernels.json. Use it before rewriting a kernel: it says whether a millisecond is in
the kernels or in the XLA glue around them.

    python experiments/profile_kernels.py --out DIR [--Ts 4096,32768] [--dims 64,128]
        [--config grad_scan_warps=1] [--hlo]
"""

import argparse
import collections
import glob
import itertools
import os
import tempfile
import time
import warnings

import jax

from bench_kernels import TOKENS, make_inputs, vla_fns
from timing import Rows
from vla_jax.kernels import KernelConfig

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)

GEMM_MARKS = ("gemm", "cublas", "cutlass", "xmma", "gemv", "sm90_", "dot_")
COPY_MARKS = ("memcpy", "memset")


def kernel_class(name):
  """'pallas', 'gemm', 'copy' or 'xla' for a device event's (kernel) name."""
  low = name.lower()
  if "vla_" in low:
    return "pallas"
  if any(m in low for m in COPY_MARKS):
    return "copy"
  if any(m in low for m in GEMM_MARKS):
    return "gemm"
  return "xla"


def device_events(xspace_path, plane_prefix="/device:GPU:", stats=None):
  """[(name, duration_ns, start_ns)] of every event on the lines of the planes whose name
  starts with `plane_prefix`, from a profiler trace file (*.xplane.pb). Lines named like
  XLA's modules or ops summaries (not streams) are skipped so that each launch counts once.
  With a dict `stats`, the first event of each name also leaves its trace statistics there
  (as text)."""
  data = jax.profiler.ProfileData.from_file(xspace_path)
  events = []
  for plane in data.planes:
    if not plane.name.startswith(plane_prefix):
      continue
    for line in plane.lines:
      if line.name in ("XLA Modules", "XLA Ops", "Steps", "Framework Ops", "Source code"):
        continue
      for ev in line.events:
        events.append((ev.name, ev.duration_ns, ev.start_ns))
        if stats is not None and ev.name not in stats:
          stats[ev.name] = {k: str(v)[:400] for k, v in ev.stats}
  return events


def summarise(events, calls):
  """Per-call time by kernel name and by class, in ms: ({name: (class, ms, launches)},
  {class: ms})."""
  by_name = collections.defaultdict(lambda: [0.0, 0])
  for name, dur, *_ in events:
    by_name[name][0] += dur
    by_name[name][1] += 1
  kernels = {n: (kernel_class(n), t / calls / 1e6, c / calls) for n, (t, c) in by_name.items()}
  classes = collections.Counter()
  for cls, t, _ in kernels.values():
    classes[cls] += t
  return kernels, dict(classes)


def idle_gaps(events, calls, top=5):
  """Device idle time inside the calls: (ms per call, [(ms per call, kernel before, kernel
  after)] of the `top` largest gaps, summed over calls by the pair of kernels around them).

  events: [(name, duration_ns, start_ns)] of `calls` back-to-back calls, any number of
  streams (a gap is time covered by no event). The calls - 1 largest gaps are taken as the
  host's time between calls (dispatch and the wait for the result) and left out."""
  ev = sorted((start, start + dur, name) for name, dur, start in events)
  gaps, end, prev = [], ev[0][1], ev[0][2]
  for start, stop, name in ev[1:]:
    if start > end:
      gaps.append((start - end, prev, name))
    if stop > end:
      end, prev = stop, name
  gaps.sort(key=lambda g: -g[0])
  inner = gaps[calls - 1:]
  pairs = collections.Counter()
  for ns, before, after in inner:
    pairs[(before, after)] += ns
  ranked = sorted(pairs.items(), key=lambda kv: -kv[1])[:top]
  return (sum(g[0] for g in inner) / calls / 1e6,
          [(ns / calls / 1e6, before, after) for (before, after), ns in ranked])


def trace_calls(fn, args, reps, plane_prefix, stats=None):
  """Device events of `reps` calls of fn(*args) (already compiled), and the wall ms per call
  (`stats`: see `device_events`)."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      start = time.perf_counter()
      for _ in range(reps):
        jax.block_until_ready(fn(*args))
      wall = (time.perf_counter() - start) / reps * 1e3
    path, = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
    return device_events(path, plane_prefix, stats), wall


def parse_config(text):
  """"a=1,b=x,c=False" -> {"a": 1, "b": "x", "c": False} (KernelConfig overrides; integers,
  True, False and None where they parse)."""
  out = {}
  for item in filter(None, text.split(",")):
    key, value = item.split("=")
    out[key] = (int(value) if value.lstrip("-").isdigit()
                else {"True": True, "False": False, "None": None}.get(value, value))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=".")
  parser.add_argument("--Ts", default="4096,32768")
  parser.add_argument("--dims", default="64")
  parser.add_argument("--tokens", type=int, default=TOKENS, help="B * T (smaller: CPU smoke)")
  parser.add_argument("--reps", type=int, default=10)
  parser.add_argument("--top", type=int, default=12, help="kernels listed per call")
  parser.add_argument("--interpret", action="store_true", help="CPU smoke: interpret mode")
  parser.add_argument("--plane", default="/device:GPU:", help="trace planes read (prefix)")
  parser.add_argument("--config", default="",
                      help="KernelConfig fields, e.g. grad_scan_warps=1,segment_chunks=8 "
                           "(integers, or text); default: the library's defaults. Several "
                           "configs separated by ';' are profiled one after another in this "
                           "process (an empty one is the defaults)")
  parser.add_argument("--hlo", action="store_true",
                      help="also write each call's optimised HLO to OUT/hlo_{call}_d{d}_T{T}.txt")
  args = parser.parse_args(argv)
  configs = [(text, KernelConfig(**parse_config(text))) for text in args.config.split(";")]
  rows = Rows()
  for (index, (text, config)), d, T in itertools.product(
      enumerate(configs), map(int, args.dims.split(",")), map(int, args.Ts.split(","))):
    B = max(1, args.tokens // T)
    xs = make_inputs(B, T, d=d)
    fwd, grad = vla_fns("pallas", config, B, T, d=d, interpret=args.interpret or None)
    if len(configs) > 1:
      print(f"\n### config: {text or 'defaults'}")
    for call, fn in (("forward", fwd), ("gradient", grad)):
      for _ in range(2):
        jax.block_until_ready(fn(*xs))
      if args.hlo:
        tag = f"_{index}" if len(configs) > 1 else ""
        name = os.path.join(args.out, f"hlo_{call}_d{d}_T{T}{tag}.txt")
        os.makedirs(args.out, exist_ok=True)
        with open(name, "w") as f:
          f.write(fn.lower(*xs).compile().as_text())
      stats = {}
      events, wall = trace_calls(fn, xs, args.reps, args.plane, stats)
      kernels, classes = summarise(events, args.reps)
      busy = sum(classes.values())
      idle, top_gaps = idle_gaps(events, args.reps)
      top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]
      print(f"\nd = {d}, T = {T}, B = {B}, {call}: wall {wall:.3f} ms, device busy {busy:.3f} ms "
            + ", ".join(f"{c} {t:.3f}" for c, t in sorted(classes.items(), key=lambda x: -x[1]))
            + f"; idle inside the call {idle:.3f} ms")
      for name, (cls, t, n) in top:
        print(f"  {t:8.3f} ms  {n:4.1f}x  {cls:6s}  {name[:110]}")
      for t, before, after in top_gaps:
        print(f"  {t:8.3f} ms  idle between {before[:50]} and {after[:50]}")
      rows.emit({"d": d, "T": T, "B": B, "call": call, "config": text,
                 "wall_ms": wall, "busy_ms": busy, "idle_ms": idle,
                 "idle_gaps": [{"ms": t, "before": b, "after": a} for t, b, a in top_gaps],
                 "classes_ms": classes,
                 "kernels": [{"name": n, "class": c, "ms": t, "launches": l,
                              "stats": stats.get(n, {}) if t > 0.05 else {}}
                             for n, (c, t, l) in sorted(kernels.items(),
                                                        key=lambda kv: -kv[1][1])]})
  rows.dump(args.out, "profile_kernels.json")
  return rows.rows


if __name__ == "__main__":
  main()
