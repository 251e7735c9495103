"""Where the Pallas VLA kernels' time and resources go.

Device time (`trace_calls`, `summarise`, `idle_gaps`): a JAX profiler trace of a few calls,
read back with `jax.profiler.ProfileData`. Every device event is one kernel launch; events are
grouped by name, summed and divided by the number of calls, and each kernel sorted into a
class: pallas (the library's Triton kernels, named vla_*), gemm (library
matrix products), copy (memcpy / memset) and xla (every other XLA fusion). The device's idle
time inside a call (gaps between kernels: launch overhead, host work) comes with its largest
gaps.

Resources (`kernel_resources`, offline, no GPU): every kernel of a call lowered for an abstract
H200, its Triton IR compiled with the `triton` package for sm_90a at the warps and stages the
plan gives it, and `ptxas -v` run on the PTX: registers, spills, shared memory and static SASS
counts. The GPU's own compile goes through XLA's Triton and ptxas, which may schedule
differently: the counts compare kernels and variants, they are not the GPU's exact code.
"""

import collections
import contextlib
import glob
import io
import os
import re
import subprocess
import tempfile
import time

GEMM_MARKS = ("gemm", "cublas", "cutlass", "xmma", "gemv", "sm90_", "dot_")
COPY_MARKS = ("memcpy", "memset")


# ----------------------------------------------------------------------------- the calls

def vla_calls(B, T, H, d, dtype="bfloat16", interpret=None, config=None):
  """(forward, gradient, inputs): jitted `vla_pallas` forward and gradient (of sum(o), with
  respect to q, k, v, u) with `config` (default: the kernels' defaults), and one input set."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from lab.benchmarks import rows  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig, vla_pallas  # pylint: disable=import-outside-toplevel
  config = config or KernelConfig()
  xs = rows.jax_inputs("vla", B, T, H, d, jnp.dtype(dtype), 1, backward=False)
  S0 = jnp.zeros((B, H, d, d), jnp.float32)
  A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H, d, d))
  fwd = lambda q, k, v, u: vla_pallas(q, k, v, u, S0, A0, config=config, interpret=interpret)
  loss = lambda *a: jnp.sum(fwd(*a)[0].astype(jnp.float32))
  return jax.jit(lambda *a: fwd(*a)[0]), jax.jit(jax.grad(loss, argnums=range(4))), xs


# ----------------------------------------------------------------------------- device time

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


def device_events(xspace_path, plane_prefix="/device:GPU:"):
  """[(name, duration_ns, start_ns)] of every event on the planes whose name starts with
  `plane_prefix`, from a profiler trace file (*.xplane.pb). Lines named like XLA's module or
  op summaries (not streams) are skipped, so that each launch counts once."""
  import jax  # pylint: disable=import-outside-toplevel
  data = jax.profiler.ProfileData.from_file(xspace_path)
  events = []
  for plane in data.planes:
    if not plane.name.startswith(plane_prefix):
      continue
    for line in plane.lines:
      if line.name in ("XLA Modules", "XLA Ops", "Steps", "Framework Ops", "Source code"):
        continue
      events += [(ev.name, ev.duration_ns, ev.start_ns) for ev in line.events]
  return events


def summarise(events, calls):
  """Per-call ms by kernel name and by class: ({name: (class, ms, launches)}, {class: ms})."""
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
  after)] of the `top` largest gaps, summed by the pair of kernels around them). events of
  `calls` back-to-back calls, any number of streams; the calls - 1 largest gaps are the host's
  time between calls and left out."""
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


def trace_calls(fn, args, reps, plane_prefix="/device:GPU:"):
  """Device events of `reps` calls of fn(*args) (compiled and warmed up already) and the wall
  ms per call."""
  import jax  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      start = time.perf_counter()
      for _ in range(reps):
        jax.block_until_ready(fn(*args))
      wall = (time.perf_counter() - start) / reps * 1e3
    path, = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
    return device_events(path, plane_prefix), wall


def profile_row(fn, args, reps, plane_prefix="/device:GPU:", top=12):
  """One call's profile as a dict: wall, busy and idle ms, ms per class, the kernels (sorted
  by time) and the largest idle gaps."""
  import jax  # pylint: disable=import-outside-toplevel
  for _ in range(2):
    jax.block_until_ready(fn(*args))
  events, wall = trace_calls(fn, args, reps, plane_prefix)
  kernels, classes = summarise(events, reps)
  idle, gaps = idle_gaps(events, reps)
  ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])
  return {"wall_ms": wall, "busy_ms": sum(classes.values()), "idle_ms": idle,
          "classes_ms": classes,
          "kernels": [{"name": n, "class": c, "ms": t, "launches": l}
                      for n, (c, t, l) in ranked[:top]],
          "idle_gaps": [{"ms": t, "before": b, "after": a} for t, b, a in gaps]}


# ----------------------------------------------------------------------------- resources

def launch_params(fn, args):
  """{kernel name: (num_warps, num_stages)} of every Triton pallas_call in fn's jaxpr on args,
  traced for an abstract H200 (the device the resource report compiles for)."""
  import jax  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels.lowering import (  # pylint: disable=import-outside-toplevel
      abstract_h200, equations)
  found = {}
  with abstract_h200():
    for _, e in equations(jax.make_jaxpr(fn)(*args).jaxpr):
      if e.primitive.name != "pallas_call":
        continue
      cp = e.params["compiler_params"]
      cp = cp.get("triton", cp) if isinstance(cp, dict) else cp
      if hasattr(cp, "num_warps"):   # a Triton kernel
        name = e.params.get("name") or e.params["name_and_src_info"].name
        found[str(name)] = (cp.num_warps, cp.num_stages)
  return found


def triton_modules(fn, args):
  """{kernel name: Triton IR text, debug locations stripped} of every pallas_call in fn
  lowered for an abstract H200 (Pallas' `debug` print)."""
  from jax.experimental import pallas as pl  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels.lowering import lower_for_h200  # pylint: disable=import-outside-toplevel
  original = pl.pallas_call

  def debug_call(*a, **kw):
    kw["debug"] = True
    return original(*a, **kw)

  printed = io.StringIO()
  pl.pallas_call = debug_call
  try:
    with contextlib.redirect_stdout(printed):
      lower_for_h200(fn, *args)
  finally:
    pl.pallas_call = original
  modules = {}
  for block in printed.getvalue().split("\nThe Triton module for pallas_call ")[1:]:
    text = block[block.index("module @"):].split("\nThe kernel jaxpr")[0]
    modules[re.search(r"module @(\w+)", text).group(1)] = strip_locations(text)
  return modules


def strip_locations(text):
  """Pretty-printed debug locations -> plain MLIR that the triton parser accepts."""
  text = "\n".join(l for l in text.splitlines() if not l.startswith("#loc"))
  text = re.sub(r' \[[^\]\n]*\](?=[ ,):{]|$)', "", text, flags=re.M)
  text = re.sub(r' "[^"\n]*"\(#loc\d*\)', "", text)
  text = re.sub(r" #loc\d*(?=[ ,):{]|$)", "", text, flags=re.M)
  return text[:text.rfind("\n}") + 2] + "\n"


def _ptxas(triton):
  """The ptxas that `triton` itself runs for sm_90 (Triton >= 3.5 ships a newer one, whose PTX
  versions the older bundled ptxas rejects)."""
  try:
    from triton.backends.nvidia.compiler import get_ptxas  # pylint: disable=import-outside-toplevel
    return get_ptxas(90).path
  except (ImportError, TypeError):   # older Triton: get_ptxas() without an arch, or none
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_resources(ttir, warps, stages):
  """Compiles Triton IR for sm_90a: registers, stack bytes, spill stores, shared bytes and
  static SASS counts (all, in loops, HMMA)."""
  import triton  # pylint: disable=import-outside-toplevel
  from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
  triton.knobs.compilation.always_compile = True
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "kernel.ttir")
    with open(path, "w") as f:
      f.write(ttir)
    kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps, "num_stages": stages})
    ptx, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
    with open(ptx, "w") as f:
      f.write(kernel.asm["ptx"])
    with open(cubin, "wb") as f:
      f.write(kernel.asm["cubin"])
    ptxas = _ptxas(triton)
    report = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                            capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", cubin],
                          capture_output=True, text=True, check=True).stdout
  used = re.search(r"Used (\d+) registers", report)
  stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", report)
  return {"registers": int(used.group(1)) if used else None,
          "stack_bytes": int(stack.group(1)) if stack else 0,
          "spill_stores": int(stack.group(2)) if stack else 0,
          "shared_bytes": kernel.metadata.shared, **sass_counts(sass)}


def sass_counts(sass):
  """Static counts of a `cuobjdump -sass` listing: all instructions, tensor-core products
  (HMMA / HGMMA) and those inside loops (between a backward branch's target and the branch)."""
  instrs = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
  addr = [int(a, 16) for a, _ in instrs]
  in_loop = [False] * len(instrs)
  for i, (_, text) in enumerate(instrs):
    target = re.search(r"\bBRA(?:\.\S+)?\s+(?:\S+\s+)?(0x[0-9a-f]+)", text)
    if target and int(target.group(1), 16) < addr[i]:
      dest = int(target.group(1), 16)
      for j in range(len(instrs)):
        if dest <= addr[j] <= addr[i]:
          in_loop[j] = True
  return {"sass": len(instrs), "sass_mma": sum("MMA" in t for _, t in instrs),
          "sass_in_loops": sum(in_loop)}


def kernel_resources(fn, args, only=()):
  """[{kernel, warps, stages, registers, ...}] of every kernel of fn on abstract args."""
  modules = triton_modules(fn, args)   # first: a trace cached by launch_params prints no IR
  params = launch_params(fn, args)
  out = []
  for name, ttir in modules.items():
    if only and name not in only:
      continue
    warps, stages = params.get(name, (4, 1))
    out.append({"kernel": name, "warps": warps, "stages": stages,
                **compile_resources(ttir, warps, stages)})
  return out
