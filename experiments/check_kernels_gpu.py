"""GPU check of the Pallas VLA kernels against a float64 reference.

Forward (o, S_T, A_T) and gradients (q, k, v, u, S0) of `vla_pallas` vs `jax.grad` of
impl="chunked" run in float64 on the same device, at T up to 16,384; then a long-sequence
forward + backward (B = 1, H = 16, d = 64, T = 131,072) that must run without running out of
memory. Bounds: float32 with precision=HIGHEST, rel. error <= 1e-4; bfloat16 inputs <= 2e-2
(against the float64 reference on the bf16-rounded inputs). Prints a table; exits 1 on failure.

    python experiments/check_kernels_gpu.py [--out DIR] [--max_T 16384] [--long_T 131072]
        [--min_T 0] [--prep xla,kernel,split,scan] [--prep_dot tf32x3] [--solver doubling]
        [--penalty_grad auto,autodiff,chunk,scan,adjoint] [--segment_chunks auto,100000]
        [--state_prep_dot auto] [--factor_dtype auto] [--input_layout auto]
        [--local_vjp_dot auto] [--grad_stride auto] [--state_bwd auto] [--segment_gram xla]
        [--adjoint_du xla] [--state_local_vjp products] [--grad_layout direct]
        [--write_norm kernel] [--inverse_tile 32] [--d 128]

--d sets the head dim of the checked cases (default 64; the long run stays at 64).

--factor_dtype and --input_layout change only the inference forward (o, S_T, A_T); the
gradients come from the differentiated forward, which keeps float32 factors and the transposed
layout.

Every case runs once per value of `--prep` (KernelConfig.prep): "kernel" / "split" check the
chunk-prep kernel(s)' forward (their gradients are the XLA path's, checked too).
"""

import argparse
import json
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax.kernels import KernelConfig, vla_pallas
from vla_jax.ops.vla import VLAState, vla_recurrence

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)

BOUND = {"float32": 1e-4, "bfloat16": 2e-2}
INTERPRET = [False]  # --interpret: a CPU smoke run of this script
# KernelConfig options of the prep="scan" kernels that the check takes (field, label, where).
SCAN_OPTIONS = (("state_prep_dot", "sprep", "prep=scan"),
                ("factor_dtype", "store", "inference forward, prep=scan"),
                ("input_layout", "layout", "inference forward, prep=scan"),
                ("local_vjp_dot", "lvjp", "gradient, state_local_vjp=products"),
                ("grad_stride", "stride", "gradient, reverse penalty kernel; auto: chunk_size"),
                ("state_bwd", "sbwd", "gradient, state path's reverse pass"),
                ("segment_gram", "gram", "prep=scan, segment-start inverses in the kernel"),
                ("adjoint_du", "adu", "gradient, penalty_grad=adjoint"),
                ("state_local_vjp", "lvjp_form", "gradient, state path's chunk-local VJP"),
                ("grad_layout", "glayout", "gradient, state kernels' q, v layout"),
                ("write_norm", "wnorm", "gradient, penalty_grad=adjoint's unit rows"),
                ("inverse_tile", "itile", "segment-start inverses in the kernel; auto: None"))
INT_OPTIONS = ("grad_stride", "inverse_tile")   # an integer unless "auto"


def option_value(field, text):
  """A SCAN_OPTIONS flag's text as the KernelConfig value ("auto": the field's default)."""
  if text == "auto":
    return KernelConfig.__dataclass_fields__[field].default
  return int(text) if field in INT_OPTIONS else text


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def inputs(seed, B, T, H, d, dtype):
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  q, k = (jax.random.normal(x, (B, T, H, d), jnp.float32) for x in ks[:2])
  v = jax.random.normal(ks[2], (B, T, H, d), jnp.float32)
  u = jax.random.normal(ks[3], (B, T, H, d), jnp.float32) / np.sqrt(d)
  S0 = jax.random.normal(ks[4], (B, H, d, d), jnp.float32) / 8
  wo = jax.random.normal(ks[5], (B, T, H, d), jnp.float32)
  return [x.astype(dtype) for x in (q, k, v, u)], S0, wo


def loss_pallas(cfg):
  def loss(q, k, v, u, S0, wo):
    A0 = jnp.broadcast_to(jnp.eye(q.shape[-1], dtype=jnp.float32),
                          S0.shape[:2] + (q.shape[-1],) * 2)
    o, S, A = vla_pallas(q, k, v, u, S0, A0, config=cfg, interpret=INTERPRET[0])
    return jnp.sum(wo * o.astype(jnp.float32)) + jnp.sum(S) + jnp.sum(A)
  return loss


def reference(qkvu, S0, wo, C):
  """float64 forward and gradients with impl='chunked'."""
  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(x, np.float64)) for x in (*qkvu, S0)]
    wo64 = jnp.asarray(np.asarray(wo, np.float64))

    def run(q, k, v, u, S0):
      d = q.shape[-1]
      A0 = jnp.broadcast_to(jnp.eye(d), S0.shape[:2] + (d, d))
      o, st = vla_recurrence(q, k, v, u, initial_state=VLAState(S0, A0), impl="chunked",
                             chunk_size=C)
      return o, st

    def loss(*a):
      o, st = run(*a)
      return jnp.sum(wo64 * o) + jnp.sum(st.S) + jnp.sum(st.A)

    o, st = jax.jit(run)(*args)
    grads = jax.jit(jax.grad(loss, argnums=range(5)))(*args)
    return [np.asarray(x) for x in (o, st.S, st.A)], [np.asarray(g) for g in grads]


_REFERENCES = {}


def check(dtype, precision, T, B=1, H=4, d=64, C=64, seed=0, solver="doubling",
          prep="scan", prep_dot="auto", penalty_grad="auto", segment_chunks=None,
          **options):
  qkvu, S0, wo = inputs(seed, B, T, H, d, dtype)
  cfg = KernelConfig(chunk_size=C, precision=precision, solver=solver, prep=prep,
                     prep_dot=prep_dot, penalty_grad=penalty_grad,
                     segment_chunks=segment_chunks, **options)
  A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H, d, d))
  fwd = jax.jit(lambda *a: vla_pallas(*a, config=cfg, interpret=INTERPRET[0]))
  o, S, A = fwd(*qkvu, S0, A0)
  grads = jax.jit(jax.grad(loss_pallas(cfg), argnums=range(5)))(*qkvu, S0, wo)
  key = (jnp.dtype(dtype).name, B, T, H, d, C, seed)   # the same inputs for every prep/solver
  if key not in _REFERENCES:
    _REFERENCES[key] = reference(qkvu, S0, wo, C)
  ref_fwd, ref_grads = _REFERENCES[key]
  errs = {n: rel(x, r) for n, x, r in zip(("o", "S", "A"), (o, S, A), ref_fwd)}
  errs.update({"d" + n: rel(g, r) for n, g, r in zip(("q", "k", "v", "u", "S0"), grads,
                                                       ref_grads)})
  finite = all(bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))) for x in (o, S, A, *grads))
  return errs, finite


def long_run(T, B=1, H=16, d=64, C=64, penalty_grad="auto", solver="doubling"):
  qkvu, S0, wo = inputs(7, B, T, H, d, jnp.bfloat16)
  cfg = KernelConfig(chunk_size=C, penalty_grad=penalty_grad, solver=solver)
  step = jax.jit(jax.value_and_grad(loss_pallas(cfg), argnums=range(4)))
  t0 = time.perf_counter()
  val, grads = step(*qkvu, S0, wo)
  jax.block_until_ready(grads)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  val, grads = step(*qkvu, S0, wo)
  jax.block_until_ready(grads)
  second = time.perf_counter() - t0
  stats = jax.devices()[0].memory_stats() or {}
  finite = bool(jnp.isfinite(val)) and all(
      bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads)
  return {"T": T, "first_s": first, "second_s": second, "finite": finite,
          "peak_GiB": stats.get("peak_bytes_in_use", 0) / 2**30}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=".", help="folder for the JSON rows and the plot")
  parser.add_argument("--max_T", type=int, default=16384)
  parser.add_argument("--min_T", type=int, default=0, help="skip the cases of shorter T")
  parser.add_argument("--long_T", type=int, default=131072)
  parser.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU)")
  parser.add_argument("--solver", default="doubling",
                      help="KernelConfig.solver (doubling, triangular_solve, nilpotent)")
  parser.add_argument("--prep", default="scan", help="comma list of KernelConfig.prep")
  parser.add_argument("--prep_dot", default="auto", help="KernelConfig.prep_dot")
  parser.add_argument("--penalty_grad", default="auto",
                      help="comma list of KernelConfig.penalty_grad (auto, autodiff, chunk, scan, "
                           "adjoint)")
  parser.add_argument("--d", type=int, default=64, help="head dim (dk = dv) of the checked cases")
  parser.add_argument("--dtypes", default="float32,bfloat16",
                      help="comma list: the input dtypes whose cases run")
  parser.add_argument("--segment_chunks", default="auto",
                      help="comma list of KernelConfig.segment_chunks (auto, or chunks per "
                           "segment of the penalty scan: a large value carries A through the "
                           "whole sequence)")
  for field, _, where in SCAN_OPTIONS:
    parser.add_argument(f"--{field}", default="auto", help=f"KernelConfig.{field} ({where})")
  args = parser.parse_args()
  flags = {f: getattr(args, f) for f, _, _ in SCAN_OPTIONS}
  options = {f: option_value(f, text) for f, text in flags.items()}
  INTERPRET[0] = args.interpret
  print(jax.devices(), jax.__version__, flush=True)

  HIGHEST, DEFAULT = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT
  cases = []
  if args.max_T > 0:  # --max_T 0: only the long run
    cases = [(jnp.float32, HIGHEST, T) for T in (1000, 4096, 16384) if T <= args.max_T] or [
        (jnp.float32, HIGHEST, args.max_T)]
    cases += [(jnp.bfloat16, DEFAULT, T) for T in (4096, 16384) if T <= args.max_T] or [
        (jnp.bfloat16, DEFAULT, args.max_T)]
    cases += [(jnp.float32, DEFAULT, min(4096, args.max_T))]
    cases = [c for c in cases if c[2] >= args.min_T
             and jnp.dtype(c[0]).name in args.dtypes.split(",")]
  rows, ok = [], True
  segs = [None if g == "auto" else int(g) for g in args.segment_chunks.split(",")]
  variants = [(p, g, sg) for p in args.prep.split(",") for g in args.penalty_grad.split(",")
              for sg in segs]
  for (dtype, precision, T), (prep, grad, seg) in ((c, v) for c in cases for v in variants):
    name = jnp.dtype(dtype).name
    t0 = time.perf_counter()
    errs, finite = check(dtype, precision, T, d=args.d, solver=args.solver, prep=prep,
                         prep_dot=args.prep_dot, penalty_grad=grad, segment_chunks=seg,
                         **options)
    bound = BOUND[name] if (name == "bfloat16" or precision == HIGHEST) else None
    passed = finite and (bound is None or max(errs.values()) <= bound)
    ok &= passed
    row = {"dtype": name, "precision": precision.name, "T": T, "d": args.d,
           "solver": args.solver,
           "prep": prep if prep == "xla" else f"{prep}({args.prep_dot})" + (
               "".join(f"+{tag}({flags[f]})" for f, tag, _ in SCAN_OPTIONS
                       if flags[f] != "auto")),
           "penalty_grad": grad, "segment_chunks": seg or "auto", **errs, "finite": finite,
           "bound": bound, "pass": passed, "seconds": time.perf_counter() - t0}
    rows.append(row)
    print(json.dumps(row), flush=True)

  long = (long_run(args.long_T, penalty_grad=args.penalty_grad.split(",")[-1],
                   solver=args.solver)
          if args.long_T else None)
  if long:
    print(json.dumps(long), flush=True)
    ok &= long["finite"]

  names = ["o", "S", "A", "dq", "dk", "dv", "du", "dS0"]
  print("\n| dtype | precision | T | prep | penalty_grad | segment_chunks | " + " | ".join(names)
        + " | bound | pass |")
  print("|" + " --- |" * (len(names) + 8))
  for r in rows:
    print(f"| {r['dtype']} | {r['precision']} | {r['T']} | {r['prep']} | {r['penalty_grad']} | "
          f"{r['segment_chunks']} | "
          + " | ".join(f"{r[n]:.1e}" for n in names)
          + f" | {r['bound'] if r['bound'] else 'info'} | {r['pass']} |")
  if long:
    print(f"\nlong run B=1 H=16 d=64 T={long['T']} bf16 fwd+bwd: "
          f"first call {long['first_s']:.1f} s, "
          f"then {long['second_s'] * 1e3:.1f} ms, peak {long['peak_GiB']:.1f} GiB, "
          f"finite={long['finite']}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "check_kernels_gpu.json"), "w") as f:
    json.dump({"rows": rows, "long": long, "ok": ok}, f, indent=1)
  print("ALL PASS" if ok else "FAILURES")
  raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
  main()
