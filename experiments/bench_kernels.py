"""Benchmark of VLA forms against cuDNN causal softmax attention on one GPU.

H = 16 heads, head dim 64, bfloat16 inputs, B * T = 32,768 tokens (B = 1 beyond T = 32,768).
Rows: impl="pallas" (`vla_pallas`) forward and forward + backward, impl="chunked" (XLA),
impl="scan" (T <= 8,192 only) and `jax.nn.dot_product_attention(..., is_causal=True,
implementation="cudnn")`. Times are medians of `--reps` runs after `--warmup` runs, each ended
by `block_until_ready`; `first_fwd_bwd_s` is the wall time of the first forward + backward call
(mostly its compilation). The pallas rows also get a hardware floor: max(bytes / 4.2 TB/s,
flops / 800 TFLOP/s), bytes = inputs read once and outputs written once, flops = the matrix
products of the chunked algorithm (penalty path + state path, x3 for forward + backward).

    python experiments/bench_kernels.py --out DIR [--Ts 512,2048,8192] [--impls pallas,cudnn]
        [--block_v 64] [--chunk 64] [--reps 20] [--prep xla,kernel] [--prep_dot tf32x3,ieee]
        [--prep_form panels,tiles] [--prep_warps 1,2,4] [--solver triangular_solve,doubling]
        [--penalty_grad auto,autodiff,chunk,scan] [--scan_bwd_unroll 1,0] [--breakdown]
        [--state_split fused,split] [--state_prep_dot auto,bf16]
        [--factor_dtype float32,bfloat16] [--input_layout transposed,direct]
        [--reverse_dot auto,tf32]

`--prep` (comma list of KernelConfig.prep) gives each pallas row per value, labelled; prep=kernel
rows time the `chunk_prep` kernel in the forward, prep=split rows the three `split_prep` kernels,
prep=scan rows `penalty_scan` and the split state-prep kernel. `--penalty_grad` (comma list:
autodiff, chunk, scan, auto) chooses the penalty path's backward per row; the defaults (prep
scan, solver doubling, penalty_grad auto) are the library's. `--scan_bwd_unroll` (comma list
of 0/1, KernelConfig.scan_bwd_unroll) gives the rows whose penalty backward is the reverse
kernel one row per value, labelled bwd_unroll=. `--breakdown` also times parts
alone: the XLA penalty path and the state path (XLA prep + kernels), forward and
forward+backward, and, when "kernel" / "split" is in --prep, the chunk-prep kernel(s) alone on
precomputed inputs.
"""

import argparse
import json
import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from timing import ms
from vla_jax.kernels import KernelConfig, state_path, vla_pallas
from vla_jax.kernels import split_prep
from vla_jax.kernels.chunk_prep import _factor_precision, chunk_prep
from vla_jax.kernels.penalty import penalty_parallel
from vla_jax.kernels.penalty_scan import segments_for
from vla_jax.kernels.state_path import _forward_pass
from vla_jax.kernels.vla import _chunk_start_matrices, _penalty_segments
from vla_jax.ops.vla import vla_recurrence

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)

H, D, TOKENS = 16, 64, 32768
BANDWIDTH, MATMUL = 4.2e12, 8.0e14
ALL_TS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ALL_IMPLS = ("pallas", "chunked", "scan", "cudnn")


def segment_chunks(BH, N, mult):
  """Chunks per penalty-scan segment for `mult` times the one-wave segment count of 4-warp
  programs (`segments_for`) over BH sequences of N chunks; mult < 1: fewer, longer segments."""
  return max(1, int(segments_for(BH, N) / mult))


def floor_ms(B, T, C, backward):
  """Hardware floor of one VLA call (bf16 I/O), milliseconds."""
  n_tok, d = B * T * H, D
  io = 5 * n_tok * d * 2 if not backward else 15 * n_tok * d * 2
  per_chunk = 2 * (3 * C * d * d + 4 * C * C * d + 4 * d ** 3     # penalty path
                   + 4 * C * C * d + 3 * C * d * d + C * C * d)   # state path
  flops = per_chunk * n_tok / C * (3 if backward else 1)
  return 1e3 * max(io / BANDWIDTH, flops / MATMUL)


# KernelConfig options of the prep="scan" rows that get one row per listed value:
# (field, default, values, label).
SCAN_OPTIONS = (("state_prep_dot", "auto", "auto, tf32, bf16", "sprep"),
                ("factor_dtype", "auto", "auto, float32, bfloat16", "store"),
                ("input_layout", "auto", "auto, transposed, direct", "layout"),
                ("reverse_dot", "auto", "auto, tf32, bf16", "rev"))


def make_inputs(B, T, seed=0, d=D):
  """q, k, v, u [B, T, H, d] bfloat16 (u scaled by 1 / sqrt(d))."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v = (jax.random.normal(x, (B, T, H, d), jnp.bfloat16) for x in ks[:3])
  u = (jax.random.normal(ks[3], (B, T, H, d), jnp.float32) / np.sqrt(d)).astype(jnp.bfloat16)
  return q, k, v, u


def vla_fns(impl, cfg, B, T, d=D, interpret=None):
  """jit(forward o) and jit((o, the gradient of sum(o) w.r.t. q, k, v, u)) of `impl` at head
  dim d (pallas: `vla_pallas` with `cfg`, and `interpret` as it takes it). The second returns
  o too, as training needs it: a gradient alone lets XLA drop the forward work that only o
  needs."""
  A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H, d, d))
  S0 = jnp.zeros((B, H, d, d), jnp.float32)
  if impl == "pallas":
    fwd = lambda q, k, v, u: vla_pallas(q, k, v, u, S0, A0, config=cfg, interpret=interpret)[0]
  else:
    fwd = lambda q, k, v, u: vla_recurrence(q, k, v, u, impl=impl, chunk_size=cfg.chunk_size)[0]
  def fwd_bwd(*a):
    o, pullback = jax.vjp(fwd, *a)
    return o, pullback(jnp.ones_like(o))
  return jax.jit(fwd), jax.jit(fwd_bwd)


def part_fns(part, cfg, q, k, v, u, stage="all"):
  """One part of vla_pallas alone: the XLA penalty path, the state path (XLA prep + kernels),
  the chunk-prep kernel(s) on precomputed inputs, or (`stage`) one split kernel alone."""
  B, T, H_, d = q.shape
  C = cfg.chunk_size
  hm = lambda x: jnp.swapaxes(x, 1, 2).astype(jnp.float32)        # [B, H, T, d]
  if part in ("prep_split_only", "prep_kernel_only"):
    # The kernels' own inputs, made once outside the timed call: chunk-start matrices M_c,
    # unit keys, and u, q, v head-major.
    fl = lambda x: hm(x).reshape(B * H_, T, d)
    A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H_, d, d))
    M = _chunk_start_matrices(hm(u), A0, C, jnp.float32).reshape(B * H_, T // C, d, d)
    e = fl(k) / jnp.linalg.norm(fl(k), axis=-1, keepdims=True)
    fl_raw = lambda x: jnp.swapaxes(x, 1, 2).reshape(B * H_, T, d)
    xs = jax.block_until_ready((M, e, fl_raw(u), fl_raw(q), fl_raw(v)))
    if part == "prep_kernel_only":
      fn = lambda M, e, u, q, v: chunk_prep(M, e, u, q, v, chunk_size=C, precision=cfg.precision,
                                            refine=cfg.newton_step, prep_dot=cfg.factor_dot,
                                            form=cfg.prep_form, num_warps=cfg.prep_warps)
      return jax.jit(fn), None, xs
    fprec = _factor_precision(cfg.factor_dot, jnp.float32, cfg.interpret)
    kw = dict(num_warps=cfg.prep_warps, interpret=cfg.interpret)

    def chain(M, e, u, q, v):
      A_c = split_prep.spd_inverse(M, refine=cfg.newton_step, factor_precision=fprec, **kw)
      Ah, _ = split_prep.penalty_rows(A_c, e, u, chunk_size=C, factor_precision=fprec, **kw)
      return A_c, Ah, split_prep.state_prep(e, Ah, q, v, chunk_size=C, precision=cfg.precision,
                                            factor_precision=fprec, **kw)

    if stage == "all":
      return jax.jit(lambda *a: chain(*a)[2]), None, xs
    # One of the three kernels (or the sequential state kernel) alone, on inputs that the
    # earlier stages made outside the timed call.
    M, e, u_, q_, v_ = xs
    A_c, Ah, (Up, Wp, P) = chain(*xs)
    S0 = jnp.zeros((B * H_, d, d), jnp.float32)
    stages = {
        "spd_inverse": (lambda M: split_prep.spd_inverse(
            M, refine=cfg.newton_step, factor_precision=fprec, **kw), (M,)),
        "penalty_rows": (lambda A_c, e, u: split_prep.penalty_rows(
            A_c, e, u, chunk_size=C, factor_precision=fprec, **kw), (A_c, e, u_)),
        "state_prep": (lambda e, Ah, q, v: split_prep.state_prep(
            e, Ah, q, v, chunk_size=C, precision=cfg.precision, factor_precision=fprec,
            **kw), (e, Ah, q_, v_)),
        "state_kernel": (lambda q, Ah, Up, Wp, P, S0: _forward_pass(
            cfg, q, Ah, Up, Wp, P, S0, jnp.bfloat16)[:2], (q_, Ah, Up, Wp, P, S0)),
    }
    fn, xs = stages[stage]
    return jax.jit(fn), None, jax.block_until_ready(xs)
  if part == "scan_penalty_only":
    # penalty_scan with its XLA segment-start inverses, on unit keys and u made outside.
    A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H_, d, d))
    e = hm(k) / jnp.linalg.norm(hm(k), axis=-1, keepdims=True)
    fprec = _factor_precision(cfg.factor_dot, jnp.float32, cfg.interpret)
    fn = lambda e, u: _penalty_segments(cfg, e, u, A0, fprec)
    return jax.jit(fn), None, jax.block_until_ready((e, hm(u)))
  if part == "penalty_only":
    A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H_, d, d))
    ch = lambda x: hm(x).reshape(B, H_, T // C, C, d)
    fn = lambda k, u: penalty_parallel(ch(k), ch(u), A0, refine=cfg.newton_step,
                                       precision=jax.lax.Precision.HIGHEST, solver=cfg.solver)[0]
    xs = (k / jnp.linalg.norm(k.astype(jnp.float32), axis=-1, keepdims=True).astype(k.dtype), u)
  else:
    S0 = jnp.zeros((B * H_, d, d), jnp.float32)
    fl = lambda x: hm(x).reshape(B * H_, T, d)
    fn = lambda q, k, v, u: state_path(fl(q), fl(k), fl(u), fl(v), S0, config=cfg)[0]
    xs = (q, k, v, u)
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
  return jax.jit(fn), jax.jit(jax.grad(loss, argnums=range(len(xs)))), xs


def cudnn_fns():
  fwd = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                     implementation="cudnn")
  loss = lambda *a: jnp.sum(fwd(*a).astype(jnp.float32))
  return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=range(3)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=".", help="folder for the JSON rows and the plot")
  parser.add_argument("--Ts", default=",".join(map(str, ALL_TS)))
  parser.add_argument("--impls", default=",".join(ALL_IMPLS))
  parser.add_argument("--block_v", default="32", help="comma list: pallas value blocks")
  parser.add_argument("--chunk", type=int, default=64)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--no_bwd", action="store_true", help="forward rows only")
  parser.add_argument("--solver", default="doubling",
                      help="comma list of KernelConfig.solver values for the pallas rows "
                           "(triangular_solve, nilpotent, doubling)")
  parser.add_argument("--prep", default="scan",
                      help="comma list of KernelConfig.prep values (xla, kernel, split, scan), "
                      "pallas rows")
  parser.add_argument("--prep_dot", default="auto",
                      help="comma list of KernelConfig.prep_dot values for prep=kernel rows")
  parser.add_argument("--prep_form", default="panels",
                      help="comma list of KernelConfig.prep_form values (panels, tiles)")
  parser.add_argument("--prep_warps", default="4",
                      help="comma list of KernelConfig.prep_warps values for prep=kernel rows")
  parser.add_argument("--scan_block", default="16",
                      help="comma list of KernelConfig.scan_block values for prep=scan rows")
  parser.add_argument("--scan_prefetch", default="0",
                      help="comma list of 0/1: KernelConfig.scan_prefetch for prep=scan rows")
  parser.add_argument("--segment_chunks", default="auto",
                      help="comma list of KernelConfig.segment_chunks (auto or an int)")
  parser.add_argument("--penalty_grad", default="auto",
                      help="comma list of KernelConfig.penalty_grad (auto, autodiff, chunk, "
                           "scan): pallas rows")
  parser.add_argument("--scan_bwd_unroll", default="0",
                      help="comma list of 0/1: KernelConfig.scan_bwd_unroll, pallas rows whose "
                           "penalty backward is the reverse kernel (penalty_grad scan, or auto "
                           "with prep scan)")
  parser.add_argument("--state_split", default="fused",
                      help="comma list of fused/split: KernelConfig.state_output and state_bwd "
                           "of the pallas rows (one row per value, labelled state=)")
  for field, default, values, tag in SCAN_OPTIONS:
    parser.add_argument(f"--{field}", default=default,
                        help=f"comma list of KernelConfig.{field} ({values}) for the prep=scan "
                             f"rows, labelled {tag}=")
  parser.add_argument("--breakdown", action="store_true",
                      help="also time the penalty path and the state path alone (forward)")
  args = parser.parse_args()
  Ts = [int(t) for t in args.Ts.split(",")]
  impls = args.impls.split(",")
  preps = args.prep.split(",")
  print(jax.devices(), flush=True)

  rows = []
  for T in Ts:
    B = max(1, TOKENS // T)
    q, k, v, u = make_inputs(B, T)
    variants = []
    for impl in impls:
      if impl == "pallas":
        for prep in preps:
          kern = prep in ("kernel", "split", "scan")
          dots = args.prep_dot.split(",") if kern else ["auto"]
          warps = [int(w) for w in args.prep_warps.split(",")] if kern else [4]
          forms = args.prep_form.split(",") if prep == "kernel" else ["panels"]
          # The solver matters for every prep: the backward (and prep="scan"'s segment-start
          # inverses) run the XLA path, whose triangular inverses it selects.
          sv_list = args.solver.split(",")
          blocks = [int(b) for b in args.scan_block.split(",")] if prep == "scan" else [16]
          fetch = ([bool(int(p)) for p in args.scan_prefetch.split(",")] if prep == "scan"
                   else [False])
          segs = ([None if g == "auto" else int(g) for g in args.segment_chunks.split(",")]
                  if prep == "scan" else [None])
          variants += [(f"pallas(bv={bv},{sv[:4]},prep={prep}"
                        + (f",{pf},{pd},w{pw})" if prep == "kernel" else
                           f",{pd},w{pw})" if prep == "split" else
                           f",b{sb},{pd},w{pw},pf{int(sp)},seg{sg or 'auto'})" if prep == "scan"
                           else ")"), "pallas",
                        dict(block_v=int(bv), solver=sv, prep=prep, penalty_grad="autodiff",
                             prep_dot=pd, prep_warps=pw,
                             prep_form=pf, scan_block=sb, scan_prefetch=sp, segment_chunks=sg))
                       for bv in args.block_v.split(",") for sv in sv_list for pd in dots
                       for pw in warps for pf in forms for sb in blocks for sp in fetch
                       for sg in segs]
        # Gradient variants of the penalty path (forward+backward rows; same forward).
        extra = [g for g in args.penalty_grad.split(",") if g != "autodiff"]
        variants += [(f"{lab[:-1]},grad={g})", imp, {**kw, "penalty_grad": g})
                     for lab, imp, kw in list(variants) if imp == "pallas" for g in extra]
        if "autodiff" not in args.penalty_grad.split(","):
          variants = [v for v in variants if v[1] != "pallas" or "grad=" in v[0]]
        # Block walk of the reverse penalty kernel, on the rows whose backward runs it.
        unrolls = [bool(int(x)) for x in args.scan_bwd_unroll.split(",")]
        variants = [w for v in variants for w in (
            [(f"{v[0][:-1]},bwd_unroll={int(ur)})", v[1], {**v[2], "scan_bwd_unroll": ur})
             for ur in unrolls]
            if v[1] == "pallas" and KernelConfig(**v[2]).penalty_backward == "scan" else [v])]
        for field, default, _, tag in SCAN_OPTIONS:
          values = getattr(args, field).split(",")
          if values != [default]:
            variants = [w for v in variants for w in (
                [(f"{v[0][:-1]},{tag}={x})", v[1], {**v[2], field: x}) for x in values]
                if v[1] == "pallas" and v[2].get("prep") == "scan" else [v])]
        splits = args.state_split.split(",")
        if splits != ["fused"]:
          variants = [w for v in variants for w in (
              [(f"{v[0][:-1]},state={sp})", v[1],
                {**v[2], "state_output": sp, "state_bwd": sp}) for sp in splits]
              if v[1] == "pallas" else [v])]
        if args.breakdown:
          bv0 = int(args.block_v.split(",")[0])
          # The XLA penalty path and the state path alone, forward and forward+backward
          # (autodiff): where a full call's backward time goes, whatever the prep.
          variants += [(f"{part}({sv[:4]})", part, dict(block_v=bv0, solver=sv))
                       for part in ("penalty_only", "state_only")
                       for sv in args.solver.split(",")]
          if "kernel" in preps:
            variants += [(f"prep_kernel_only({pf},{pd},w{pw})", "prep_kernel_only",
                          dict(block_v=bv0, prep="kernel", prep_dot=pd, prep_warps=int(pw),
                               prep_form=pf))
                         for pd in args.prep_dot.split(",") for pw in args.prep_warps.split(",")
                         for pf in args.prep_form.split(",")]
          if "scan" in preps:
            variants += [(f"scan_penalty_only(b{sb},{pd},w{pw},pf{sp},seg{sg})",
                          "scan_penalty_only",
                          dict(block_v=bv0, prep="scan", prep_dot=pd, prep_warps=int(pw),
                               scan_block=int(sb), scan_prefetch=bool(int(sp)),
                               segment_chunks=None if sg == "auto" else int(sg)))
                         for pd in args.prep_dot.split(",") for pw in args.prep_warps.split(",")
                         for sb in args.scan_block.split(",")
                         for sp in args.scan_prefetch.split(",")
                         for sg in args.segment_chunks.split(",")]
          if "split" in preps:
            variants += [(f"prep_split_only({pd},w{pw})" if st == "all" else
                          f"split_{st}_only({pd},w{pw})", "prep_split_only",
                          dict(block_v=bv0, prep="split", prep_dot=pd, prep_warps=int(pw)), st)
                         for pd in args.prep_dot.split(",") for pw in args.prep_warps.split(",")
                         for st in ("all", "spd_inverse", "penalty_rows", "state_prep",
                                    "state_kernel")]
      elif impl == "scan" and T > 8192:
        continue
      else:
        variants.append((impl, impl, None))
    for label, impl, bv, *stage in variants:
      row = {"T": T, "B": B, "impl": label}
      try:
        if impl == "cudnn":
          fwd, bwd = cudnn_fns()
          xs = (q, k, v)
        elif impl in ("penalty_only", "state_only", "prep_kernel_only", "prep_split_only",
                      "scan_penalty_only"):
          cfg = KernelConfig(chunk_size=args.chunk, **bv)
          fwd, bwd, xs = part_fns(impl, cfg, q, k, v, u, *stage)
        else:
          cfg = KernelConfig(chunk_size=args.chunk, **(bv or {}))
          fwd, bwd = vla_fns(impl, cfg, B, T)
          xs = (q, k, v, u)
        row["fwd_ms"] = ms(fwd, xs, args.reps, args.warmup)
        if not args.no_bwd and bwd is not None:
          start = time.perf_counter()         # the first call compiles (the forward's kernels
          jax.block_until_ready(bwd(*xs))     # are already compiled by then)
          row["first_fwd_bwd_s"] = round(time.perf_counter() - start, 1)
          row["fwd_bwd_ms"] = ms(bwd, xs, max(3, args.reps // 2), args.warmup)
        if impl in ("pallas",):
          row["floor_fwd_ms"] = floor_ms(B, T, args.chunk, False)
          row["floor_fwd_bwd_ms"] = floor_ms(B, T, args.chunk, True)
      except Exception as err:  # a failed row is reported, the others still run
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
      rows.append(row)
      print(json.dumps(row), flush=True)

  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
    json.dump(rows, f, indent=1)
  fmt = lambda r, key: f"{r[key]:.3f}" if key in r else "-"
  print("\n| T | B | impl | fwd ms | fwd+bwd ms | floor fwd | floor fwd+bwd | fwd/floor |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in rows:
    has_floor = "floor_fwd_ms" in r and "fwd_ms" in r
    ratio = f"{r['fwd_ms'] / r['floor_fwd_ms']:.0f}x" if has_floor else "-"
    print(f"| {r['T']} | {r['B']} | {r['impl']} | {fmt(r, 'fwd_ms')} | {fmt(r, 'fwd_bwd_ms')} | "
          f"{fmt(r, 'floor_fwd_ms')} | {fmt(r, 'floor_fwd_bwd_ms')} | {ratio} |"
          + (f" {r['error']}" if "error" in r else ""))
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("fwd_ms", "fwd_bwd_ms")):
      for label in dict.fromkeys(r["impl"] for r in rows):
        pts = [(r["T"], r[key]) for r in rows if r["impl"] == label and key in r]
        if pts:
          ax.plot(*zip(*pts), marker="o", label=label)
      ax.set(xscale="log", yscale="log", xlabel="T (B*T = 32768, B = 1 beyond)",
             ylabel="ms", title=key.replace("_ms", "").replace("_", "+"))
      ax.grid(True, which="both", alpha=0.3)
      ax.legend(fontsize=7)
    fig.suptitle(f"VLA vs cuDNN attention, H={H}, d={D}, bf16, {jax.devices()[0].device_kind}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench_kernels.png"), dpi=120)
  except ImportError:
    print("matplotlib missing: no plot")


if __name__ == "__main__":
  main()
