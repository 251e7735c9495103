r"""Registers, spills and shared memory of the Pallas kernels, compiled for an H200 without one.

    python experiments/kernel_resources.py [--prep=kernel,split] [--prep_dot=tf32x3]
        [--prep_form=panels] [--warps=2,4,8] [--dk=64] [--chunk=64] [--only=NAME,...]
        [--block_v=64] [--num_stages=2] [--triton_path=DIR] [--state_prep_dot=auto]
        [--factor_dtype=auto]
    python experiments/kernel_resources.py --grad [--prep=scan] [--scan_bwd_unroll=1,0]
        [--segment_chunks=2] [--chunks=4] [--grad_stride=16] ...

Lowers the forward of `vla_pallas` (one run per value of --prep) for an abstract H200, takes
every pallas_call's Triton IR (Pallas' `debug` print), strips its debug locations and compiles
it with the `triton` package (3.6, needs no GPU) for sm_90a, then runs `ptxas -v` on the PTX:
the resource report that decides occupancy and local-memory traffic, and `cuobjdump -sass` on
the cubin for static instruction counts (all, inside loops, tensor-core HMMA; wgmma kernels
show HGMMA instead, counted in "SASS"; set SASS_DUMP=FILE to keep a listing). Costs no device
time. The GPU's own compile goes through XLA's Triton and ptxas, which may unroll or schedule
differently: the counts compare variants, they are not the GPU's exact code.
`--grad` lowers `jax.grad` of a loss of `vla_pallas` (all of q, k, v, u) instead, so the
backward's kernels (vla_penalty_scan_bwd, vla_state_bwd) are compiled too, one run per value
of --prep and of --scan_bwd_unroll (KernelConfig.scan_bwd_unroll), and the compile time is
split into Triton IR -> PTX and PTX -> cubin (Triton's ptxas call). Compile times are this
machine's CPU's, not a GPU host's; they compare kernels and options, not absolute first-call
latency.
Needs the `triton` package: installed, or in a folder given by `--triton_path` or the
TRITON_PATH environment variable (prepended to sys.path), e.g. /tmp/tritonsite.
"""

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.kernels.lowering import lower_for_h200


def triton_modules(cfg, B, T, H, dk, dv, grad=False, dtype=jnp.bfloat16):
  """{kernel name: Triton IR text} of every pallas_call in the forward of `vla_pallas` on q, k,
  v, u of `dtype`, or with `grad` in `jax.grad` (w.r.t. q, k, v, u) of the sum of its outputs:
  forward and backward kernels."""
  original = pl.pallas_call

  def debug_call(*args, **kwargs):
    kwargs["debug"] = True
    return original(*args, **kwargs)

  spec = lambda *s, dtype=dtype: jax.ShapeDtypeStruct(s, dtype)
  args = (spec(B, T, H, dk), spec(B, T, H, dk), spec(B, T, H, dv), spec(B, T, H, dk),
          spec(B, H, dv, dk, dtype=jnp.float32), spec(B, H, dk, dk, dtype=jnp.float32))
  forward = lambda *a: vla_pallas(*a, config=cfg, interpret=False)
  fn = forward
  if grad:
    loss = lambda *a: sum(jnp.sum(x.astype(jnp.float32)) for x in forward(*a))
    fn = jax.grad(loss, argnums=range(4))
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
    name = re.search(r"module @(\w+)", text).group(1)
    modules[name] = strip_locations(text)
  return modules


def strip_locations(text):
  """Pretty-printed debug locations -> plain MLIR the triton parser accepts."""
  lines = [l for l in text.splitlines() if not l.startswith("#loc")]
  text = "\n".join(lines)
  text = re.sub(r' \[[^\]\n]*\](?=[ ,):{]|$)', "", text, flags=re.M)
  text = re.sub(r' "[^"\n]*"\(#loc\d*\)', "", text)
  text = re.sub(r" #loc\d*(?=[ ,):{]|$)", "", text, flags=re.M)
  return text[:text.rfind("\n}") + 2] + "\n"


def resources(ttir, warps, stages):
  """Compiles Triton IR for sm_90a; returns ptxas's register/spill lines, shared bytes and the
  seconds of the compilation's steps: Triton IR -> PTX (triton_s) and PTX -> cubin (ptxas_s,
  Triton's own ptxas call; the `ptxas -v` run for the report is not counted)."""
  import triton  # pylint: disable=import-outside-toplevel
  from triton.backends.compiler import GPUTarget  # pylint: disable=import-outside-toplevel
  times = []
  triton.knobs.compilation.always_compile = True   # a cache hit would time nothing
  triton.knobs.compilation.listener = lambda **kw: times.append(kw["times"])
  try:
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "kernel.ttir")
      with open(path, "w") as f:
        f.write(ttir)
      kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})
      ptx = os.path.join(tmp, "kernel.ptx")
      with open(ptx, "w") as f:
        f.write(kernel.asm["ptx"])
      ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                           "ptxas")
      report = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                              capture_output=True, text=True, check=True).stderr
      cubin = os.path.join(tmp, "kernel.cubin")
      with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
      sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass",
                             cubin], capture_output=True, text=True, check=True).stdout
      if os.environ.get("SASS_DUMP"):
        with open(os.environ["SASS_DUMP"], "w") as f:
          f.write(sass)
  finally:
    triton.knobs.compilation.listener = None
  stage_us = dict(times[-1].lowering_stages)          # microseconds per stage
  ptxas_s = stage_us.pop("cubin", 0) / 1e6
  triton_s = (times[-1].ir_initialization + sum(stage_us.values())) / 1e6
  used = re.search(r"Used (\d+) registers", report)
  stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                    r"loads", report)
  cumulative = re.search(r"(\d+) bytes cumulative stack size", report)
  return {"registers": int(used.group(1)) if used else None,
          "stack_bytes": int(stack.group(1)) if stack else (
              int(cumulative.group(1)) if cumulative else 0),
          "spill_stores": int(stack.group(2)) if stack else None,
          "shared_bytes": kernel.metadata.shared,
          "ptx_lines": kernel.asm["ptx"].count("\n"),
          **sass_counts(sass),
          "triton_s": triton_s, "ptxas_s": ptxas_s}


def sass_counts(sass):
  """Static SASS instruction counts of a `cuobjdump -sass` listing: all instructions, tensor-core
  products (HMMA), and those inside loops (between a backward branch's target and the branch,
  the body of every `fori_loop`; nested loops counted once)."""
  instrs = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
  addr = [int(a, 16) for a, _ in instrs]
  in_loop = [False] * len(instrs)
  for i, (_, text) in enumerate(instrs):
    target = re.search(r"\bBRA(?:\.\S+)?\s+(?:\S+\s+)?(0x[0-9a-f]+)", text)
    if target:
      dest = int(target.group(1), 16)
      if dest < addr[i]:   # a backward branch (not the trap loop after EXIT)
        for j in range(len(instrs)):
          if dest <= addr[j] <= addr[i]:
            in_loop[j] = True
  return {"sass": len(instrs), "sass_hmma": sum("HMMA" in t for _, t in instrs),
          "sass_in_loops": sum(in_loop)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--prep", default="kernel",
                      help="comma list of KernelConfig.prep values (xla, kernel, split, scan)")
  parser.add_argument("--only", default="",
                      help="comma list of kernel names to compile (default: all)")
  parser.add_argument("--triton_path", default=os.environ.get("TRITON_PATH", ""),
                      help="folder holding the triton package, prepended to sys.path")
  parser.add_argument("--prep_dot", default="auto")
  parser.add_argument("--state_prep_dot", default="auto", help="KernelConfig.state_prep_dot")
  parser.add_argument("--factor_dtype", default="auto", help="KernelConfig.factor_dtype")
  parser.add_argument("--block_v", type=int, default=None, help="KernelConfig.block_v")
  parser.add_argument("--num_stages", type=int, default=2,
                      help="KernelConfig.num_stages (vla_state_fwd, vla_state_bwd; the prep "
                           "kernels use 1)")
  parser.add_argument("--prep_form", default="panels")
  parser.add_argument("--warps", default="2,4")
  parser.add_argument("--dk", type=int, default=64)
  parser.add_argument("--chunk", type=int, default=64)
  parser.add_argument("--grad", action="store_true",
                      help="lower jax.grad (q, k, v, u) of vla_pallas: backward kernels too")
  parser.add_argument("--scan_bwd_unroll", default="0",
                      help="comma list of 0/1: KernelConfig.scan_bwd_unroll (with --grad and "
                           "the reverse penalty kernel)")
  parser.add_argument("--state_output", default="fused",
                      help="KernelConfig.state_output (fused, split)")
  parser.add_argument("--state_bwd", default="fused",
                      help="KernelConfig.state_bwd (fused, split; with --grad)")
  parser.add_argument("--state_local_vjp", default=KernelConfig().state_local_vjp,
                      help="KernelConfig.state_local_vjp (products, xla, kernel, fused; "
                      "with --grad)")
  parser.add_argument("--adjoint_du", default=KernelConfig().adjoint_du,
                      help="KernelConfig.adjoint_du (xla, kernel, carried; with --grad)")
  parser.add_argument("--grad_layout", default=KernelConfig().grad_layout,
                      help="KernelConfig.grad_layout (transposed, direct; with --grad)")
  parser.add_argument("--refine", default="auto", choices=("auto", "1", "0"),
                      help="KernelConfig.refine (auto; 1: the Newton step in the inverses; 0: "
                           "none)")
  parser.add_argument("--inverse_tile", default="auto", choices=("auto", "0", "16", "32"),
                      help="KernelConfig.inverse_tile (auto; 0: the whole-matrix form; 16, 32)")
  parser.add_argument("--write_norm", default=KernelConfig().write_norm,
                      help="KernelConfig.write_norm (xla, kernel; with --grad)")
  parser.add_argument("--dtype", default="bfloat16",
                      help="dtype of q, k, v, u (bfloat16 or float32)")
  parser.add_argument("--precision", default="DEFAULT",
                      help="KernelConfig.precision: DEFAULT or HIGHEST")
  parser.add_argument("--chunks", type=int, default=2,
                      help="chunks in the lowered sequence (T = chunks * chunk)")
  parser.add_argument("--grad_stride", type=int, default=None,
                      help="KernelConfig.grad_stride (--grad: tokens between the saved penalty "
                           "inverses the reverse kernel starts from)")
  parser.add_argument("--segment_chunks", type=int, default=None,
                      help="KernelConfig.segment_chunks (default: auto, which is one chunk per "
                           "segment at these small shapes)")
  args = parser.parse_args()
  if args.triton_path:
    sys.path.insert(0, args.triton_path)
  only = [n for n in args.only.split(",") if n]
  unrolls = [bool(int(x)) for x in args.scan_bwd_unroll.split(",")] if args.grad else [True]
  print(f"dk = dv = {args.dk}, C = {args.chunk}, prep_dot={args.prep_dot}, "
        f"prep_form={args.prep_form}" + (
            f", jax.grad, T = {args.chunks * args.chunk}, segment_chunks="
            f"{args.segment_chunks or 'auto'}" if args.grad else ""))
  if args.grad:
    print("| prep | scan_bwd_unroll | kernel | warps | registers | stack bytes/thread | "
          "spill stores | shared bytes | PTX lines | SASS | SASS in loops | Triton->PTX s | "
          "ptxas s | total s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  else:
    print("| prep | kernel | warps | registers | stack bytes/thread | spill stores | "
          "shared bytes | PTX lines | SASS | SASS in loops | HMMA | compile s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for prep in args.prep.split(","):
    for unroll in unrolls:
      cfg = KernelConfig(chunk_size=args.chunk, prep=prep, prep_dot=args.prep_dot,
                         state_prep_dot=args.state_prep_dot, factor_dtype=args.factor_dtype,
                         prep_form=args.prep_form, block_v=args.block_v,
                         num_stages=args.num_stages, segment_chunks=args.segment_chunks,
                         scan_bwd_unroll=unroll, state_output=args.state_output,
                         state_bwd=args.state_bwd, state_local_vjp=args.state_local_vjp,
                         grad_stride=args.grad_stride, grad_layout=args.grad_layout,
                         adjoint_du=args.adjoint_du, write_norm=args.write_norm,
                         inverse_tile={"auto": "auto", "0": None, "16": 16,
                                       "32": 32}[args.inverse_tile],
                         refine={"auto": "auto", "1": True, "0": False}[args.refine],
                         precision=getattr(jax.lax.Precision, args.precision))
      modules = triton_modules(cfg, 1, args.chunks * args.chunk, 2, args.dk, args.dk,
                               grad=args.grad, dtype=jnp.dtype(args.dtype))
      for name, ttir in modules.items():
        if only and name not in only:
          continue
        for warps in (int(w) for w in args.warps.split(",")):
          start = time.perf_counter()
          r = resources(ttir, warps,
                        cfg.num_stages if name.startswith("vla_state_")
                        and name not in ("vla_state_prep", "vla_state_local_vjp") else 1)
          cells = [prep] + ([str(int(unroll))] if args.grad else []) + [
              name, warps, r["registers"], r["stack_bytes"], r["spill_stores"],
              r["shared_bytes"], r["ptx_lines"]]
          if args.grad:          # static SASS counts, the compilation's steps and their sum
            cells += [r["sass"], r["sass_in_loops"], f"{r['triton_s']:.1f}", f"{r['ptxas_s']:.1f}",
                      f"{r['triton_s'] + r['ptxas_s']:.0f}"]
          else:                  # static SASS counts, then wall time (ptxas -v included)
            cells += [r["sass"], r["sass_in_loops"], r["sass_hmma"]]
            cells.append(f"{time.perf_counter() - start:.0f}")
          print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
  sys.exit(main())
