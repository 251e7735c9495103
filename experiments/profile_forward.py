"""Where the Pallas forward's time goes, and variants of its penalty scan, on one GPU.

H = 16, d = 64 (--dim), bfloat16 inputs, B * T = 32,768 tokens (B = 1 beyond). For each T it
times, with warm-up and medians of `--reps` runs:

  forward           `vla_pallas` at the library's defaults (what a user calls), once per
                    value of --state_outputs (KernelConfig.state_output)
  cudnn             causal softmax attention, `jax.nn.dot_product_attention(implementation=
                    "cudnn")`, the same run's baseline
  state_only        the state path alone (`split_prep.state_prep` + the sequential state
                    kernel, or with state_output="split" the chain and output kernels) on
                    write directions made outside the timed call
  penalty(...)      the penalty path alone (`penalty_scan._penalty_segments`: XLA segment-start
                    inverses + the `penalty_scan` kernel) for each variant of --variants
  inverses(...)     the segment-start inverses alone (`segment_start_inverses`, XLA, or
                    `segment_start_inverses_kernel`), and two of their parts: grams (the
                    per-segment Grams and their prefix sums) and a0_inverse (A0's inverse)
  kernel(...)       the `penalty_scan` kernel alone on segment-start inverses made outside

A variant is warps:prep_dot:segments[:inverse] (KernelConfig.scan_warps, prep_dot,
segment_chunks and segment_inverse, "xla" when left out; "kernel" only at d = 64),
segments a multiple of the one-wave count of 4-warp programs (`segments_for`; "0.01" is about
one segment: A carried through the whole sequence, the longest carry and so the largest drift
of one-pass TF32 products). The library's default at precision=DEFAULT is 1:tf32:4 (1-warp
programs, four times as many segments). Each penalty variant's unit write directions are
compared with the float64 XLA penalty path (`penalty.penalty_parallel`), worst row error.

    python experiments/profile_forward.py --out DIR [--Ts 4096,32768] [--reps 20]
        [--variants 4:tf32x3:1,2:tf32x3:2,1:tf32x3:4] [--state_outputs fused,split]
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from bench_kernels import H, TOKENS, make_inputs, segment_chunks
from timing import Rows, ms, profile_parser
from vla_jax.kernels import KernelConfig, split_prep, vla_pallas
from vla_jax.kernels.chunk_prep import _factor_precision
from vla_jax.kernels.penalty import penalty_parallel
from vla_jax.kernels.penalty_scan import (_a0_inverse, _penalty_segments, _segment_gram_prefix,
                                          forward_scan_warps, penalty_scan, segment_layout,
                                          segment_start_inverses,
                                          segment_start_inverses_kernel)
from vla_jax.kernels.state_path import _forward_pass

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)

DEFAULT_VARIANTS = ("4:tf32x3:1,4:tf32:1,4:ieee:1,4:tf32x3:2,8:tf32x3:1,2:tf32x3:1,"
                    "2:tf32x3:2,2:tf32:2,1:tf32x3:4,1:tf32:4,1:ieee:4")


def main():
  parser = profile_parser(__doc__.splitlines()[0], tokens=TOKENS, variants=DEFAULT_VARIANTS)
  parser.add_argument("--state_outputs", default="fused",
                      help="comma list of KernelConfig.state_output: forward and state_only "
                           "rows per value")
  args = parser.parse_args()
  D = args.dim
  interpret = jax.default_backend() != "gpu"       # CPU: interpret mode, a smoke run only
  print(jax.devices(), flush=True)
  table = Rows()
  emit = table.emit

  for T in [int(t) for t in args.Ts.split(",")]:
    B = max(1, args.tokens // T)
    q, k, v, u = make_inputs(B, T, d=D)
    base = KernelConfig(interpret=interpret)
    C, N = base.chunk_size, T // base.chunk_size
    A0 = jnp.broadcast_to(jnp.eye(D, dtype=jnp.float32), (B, H, D, D))
    S0 = jnp.zeros((B, H, D, D), jnp.float32)
    hm = lambda x: jnp.swapaxes(x, 1, 2).astype(jnp.float32)              # [B, H, T, d]
    e = hm(k) / jnp.linalg.norm(hm(k), axis=-1, keepdims=True)
    u_h = hm(u)
    flat = lambda x: x.reshape(B * H, *x.shape[2:])

    outs = args.state_outputs.split(",")
    for out in outs:
      cfg_out = KernelConfig(state_output=out)
      emit({"T": T, "B": B, "part": "forward", "state_output": out, "ms": ms(jax.jit(
          lambda q, k, v, u, c=cfg_out: vla_pallas(q, k, v, u, S0, A0, config=c)[0]),
          (q, k, v, u), args.reps, args.warmup)})
    if not interpret:
      emit({"T": T, "B": B, "part": "cudnn", "ms": ms(jax.jit(
          lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                       implementation="cudnn")),
          (q, k, v), args.reps, args.warmup)})

    # Reference write directions: float64 XLA penalty path (parallel over chunks).
    with jax.enable_x64(True):
      ch = lambda x: x.astype(jnp.float64).reshape(B, H, N, C, D)
      W64 = penalty_parallel(ch(e), ch(u_h), A0.astype(jnp.float64), refine=True,
                             precision=jax.lax.Precision.HIGHEST)[0]
      W64 = np.array(W64.reshape(B * H, T, D))
    W64 /= np.linalg.norm(W64, axis=-1, keepdims=True)

    fprec0 = _factor_precision(base.factor_dot, jnp.float32, interpret)
    Ah, _ = jax.jit(lambda e, u: _penalty_segments(base, e, u, A0, fprec0))(e, u_h)
    q_f, v_f, e_f = flat(hm(q)), flat(hm(v)), flat(e)

    def state_only(e, Ah, q, v, cfg):
      Up, Wp, P = split_prep.state_prep(e, Ah, q, v, chunk_size=C, precision=base.precision,
                                        factor_precision=fprec0, num_warps=base.prep_warps,
                                        interpret=interpret)
      return _forward_pass(cfg, q, Ah, Up, Wp, P, flat(S0), jnp.bfloat16)[0]
    for out in outs:
      cfg_out = KernelConfig(state_output=out, interpret=interpret)
      emit({"T": T, "B": B, "part": "state_only", "state_output": out,
            "ms": ms(jax.jit(lambda *a, c=cfg_out: state_only(*a, c)), (e_f, Ah, q_f, v_f),
                     args.reps, args.warmup)})

    for spec in args.variants.split(","):
      warps, dot, mult, *inv = spec.split(":")
      inv = inv[0] if inv else "xla"
      seg_chunks = segment_chunks(B * H, N, float(mult))
      cfg = KernelConfig(scan_warps=int(warps), prep_dot=dot, segment_chunks=seg_chunks,
                         segment_inverse=inv, interpret=interpret)
      S, L = segment_layout(cfg, B * H, N)
      label = f"w{warps},{dot},S{S},inv={inv}"
      row = {"T": T, "B": B, "variant": label, "warps": int(warps), "prep_dot": dot,
             "segments": S, "segment_inverse": inv}
      try:
        fprec = _factor_precision(dot, jnp.float32, interpret)
        fn = jax.jit(lambda e, u, cfg=cfg, fprec=fprec: _penalty_segments(cfg, e, u, A0, fprec))
        row["penalty_ms"] = ms(fn, (e, u_h), args.reps, args.warmup)
        W = np.asarray(fn(e, u_h)[0], np.float64)
        row["max_row_err"] = float(np.max(np.linalg.norm(W - W64, axis=-1)))
        row["mean_row_err"] = float(np.mean(np.linalg.norm(W - W64, axis=-1)))
        # The segment-start inverses alone (prefix sums of Grams and the inversions), then the
        # kernel alone on inverses made outside.
        A_start = A0[:, :, None]
        if S > 1:
          inverses = (segment_start_inverses_kernel if inv == "kernel"
                      else segment_start_inverses)
          row["inverses_ms"] = ms(jax.jit(lambda u, cfg=cfg, f=inverses: f(u, A0, cfg, S, L)),
                                  (u_h,), args.reps, args.warmup)
          A_start = jnp.concatenate([A_start, inverses(u_h, A0, cfg, S, L)], 2)
          # Its parts: the per-segment Grams and their prefix sums, and the inverse of A0.
          row["grams_ms"] = ms(jax.jit(lambda u: _segment_gram_prefix(u, S, L)), (u_h,),
                               args.reps, args.warmup)
          if inv == "kernel":   # the spd_inverse kernel, as segment_start_inverses_kernel
            a0_inverse = lambda a: split_prep.spd_inverse(
                a.reshape(B * H, 1, D, D), refine=False, interpret=interpret,
                factor_precision=_factor_precision("tf32x3", a.dtype, interpret))
          else:
            a0_inverse = lambda a: _a0_inverse(a, a.dtype)
          row["a0_inverse_ms"] = ms(jax.jit(a0_inverse), (A0,), args.reps, args.warmup)
        pad = lambda x: jnp.pad(x, [(0, 0), (0, 0), (0, S * L - T), (0, 0)])
        kin = jax.block_until_ready((flat(A_start), flat(pad(e)), flat(pad(u_h))))
        kern = jax.jit(lambda a, e, u, cfg=cfg, fprec=fprec: penalty_scan(
            a, e, u, block=cfg.scan_block, factor_precision=fprec,
            num_warps=forward_scan_warps(cfg, D), interpret=interpret))
        row["kernel_ms"] = ms(kern, kin, args.reps, args.warmup)
      except Exception as err:  # a variant that fails to compile is a result, not a crash
        row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
      emit(row)

  table.dump(args.out, "profile_forward.json")


if __name__ == "__main__":
  main()
