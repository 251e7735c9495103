"""Where the Pallas forward + backward's time goes, on one GPU.

H = 16, d = 64 (--dim), bfloat16 inputs, B * T = 32,768 tokens (B = 1 beyond). For each T and each
variant of --variants (split:local[:prep[:seg[:fwarps[:bwarps[:segs]]]]]; split =
KernelConfig.state_output and state_bwd together, "fused" or "split"; local =
KernelConfig.state_local_vjp, "xla", "kernel" or "products"; prep = KernelConfig.grad_prep,
"xla" or "kernel"; seg = KernelConfig.segment_grad, "autodiff" or "products"; fwarps, bwarps =
KernelConfig.grad_scan_warps and bwd_scan_warps, 0 for None; segs = the penalty scans'
segments as a multiple of the one-wave count of 4-warp programs
(`bench_kernels.segment_chunks`, as in profile_forward.py), 0 for the library's layout; fields
left out are
"xla", "xla", "autodiff", 0, 0, 0, the defaults before the written-out backward, so that
"fused:xla" keeps naming the same configuration across result files; the library's defaults
are fused:products:kernel:products) it times, with
warm-up and medians of `--reps` runs, each part's forward and its forward + backward (the
gradient of sum(out * c), c a random cotangent):

  vla            `vla_pallas` at the library's defaults (q, k, v, u)
  penalty        the penalty path as the differentiated call runs it
                 (`penalty_grad.penalty_scan_grad`: the `penalty_scan` kernel forward, the
                 reverse kernel and the XLA segment-start VJP backward), on unit keys and u
  state          the state path (`state_path`: the chunk factors, the sequential kernel(s),
                 the reverse kernel(s) and the chunk-local VJPs, as the variant says), on
                 write directions made outside the timed call
  state_reverse  the state path's reverse pass alone (`state_path._backward_pass`)

What the parts leave out of `vla`'s time is glue (layout changes, unit keys, normalising the
write directions).

    python experiments/profile_backward.py --out DIR [--Ts 4096,32768] [--reps 20]
        [--variants fused:xla,split:xla,split:kernel,split:kernel:kernel]
"""

import warnings

import jax
import jax.numpy as jnp

from bench_kernels import H, TOKENS, make_inputs, segment_chunks
from timing import Rows, ms, profile_parser
from vla_jax.kernels import KernelConfig, state_path, vla_pallas
from vla_jax.kernels.penalty_grad import penalty_scan_grad
from vla_jax.kernels.state_path import _backward_pass, _prepare

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)



def fwd_and_grad(fn, n_args, cotangents):
  """(jit(fn), jit(grad of sum(out_i * c_i) w.r.t. the first n_args arguments))."""
  def loss(*a):
    return sum(jnp.sum(o.astype(jnp.float32) * c) for o, c in zip(fn(*a), cotangents))
  return jax.jit(fn), jax.jit(jax.grad(loss, argnums=range(n_args)))


def main():
  parser = profile_parser(__doc__.splitlines()[0], tokens=TOKENS,
                          variants="fused:xla,split:xla,split:kernel")
  args = parser.parse_args()
  D = args.dim
  interpret = jax.default_backend() != "gpu"       # CPU: interpret mode, a smoke run only
  print(jax.devices(), flush=True)
  table = Rows()
  emit = table.emit

  for T in [int(t) for t in args.Ts.split(",")]:
    B = max(1, args.tokens // T)
    q, k, v, u = make_inputs(B, T, seed=T, d=D)
    ks = jax.random.split(jax.random.PRNGKey(T + 1), 8)      # cotangents: ks[4:]
    A0 = jnp.broadcast_to(jnp.eye(D, dtype=jnp.float32), (B, H, D, D))
    S0 = jnp.zeros((B, H, D, D), jnp.float32)
    hm = lambda x: jnp.swapaxes(x, 1, 2).astype(jnp.float32)              # [B, H, T, d]
    e = hm(k) / jnp.linalg.norm(hm(k), axis=-1, keepdims=True)
    flat = lambda x: x.reshape(B * H, *x.shape[2:])
    for variant in args.variants.split(","):
      spec = variant.split(":")
      split, local, prep, seg, gw, bw, segs = spec + ["fused", "xla", "xla", "autodiff", "0",
                                                      "0", "0"][len(spec):]
      N = T // KernelConfig().chunk_size
      seg_chunks = segment_chunks(B * H, N, float(segs)) if float(segs) else None
      cfg = KernelConfig(state_output=split, state_bwd=split, state_local_vjp=local,
                         grad_prep=prep, segment_grad=seg, grad_scan_warps=int(gw) or None,
                         bwd_scan_warps=int(bw) or None, segment_chunks=seg_chunks,
                         interpret=interpret)
      C = cfg.chunk_size
      parts = {}
      c_o = jax.random.normal(ks[4], (B, T, H, D), jnp.float32)
      parts["vla"] = (lambda q, k, v, u: vla_pallas(q, k, v, u, S0, A0, config=cfg)[:1],
                      (q, k, v, u), (c_o,))
      ch = lambda x: x.reshape(B, H, N, C, D)
      c_w = jax.random.normal(ks[5], (B, H, N, C, D), jnp.float32)
      parts["penalty"] = (lambda e, u: penalty_scan_grad(e, u, A0, cfg)[:1],
                          (ch(e), ch(hm(u))), (c_w,))
      w = e[:, :, ::-1]                                   # unit rows, another order than e
      c_s = jax.random.normal(ks[6], (B * H, T, D), jnp.float32)
      parts["state"] = (lambda q, e, w, v: state_path(q, e, w, v, flat(S0), config=cfg)[:1],
                        (flat(hm(q)), flat(e), flat(w), flat(hm(v))), (c_s,))
      for name, (fn, xs, cts) in parts.items():
        fwd, grad = fwd_and_grad(fn, len(xs), cts)
        xs = jax.block_until_ready(xs)
        emit({"T": T, "B": B, "variant": variant, "part": name,
              "fwd_ms": ms(fwd, xs, args.reps, args.warmup),
              "fwd_bwd_ms": ms(grad, xs, args.reps, args.warmup)})
      # The state path's reverse pass alone, on the factors of the same inputs.
      q_f, e_f, w_f, v_f = (flat(hm(q)), flat(e), flat(w), flat(hm(v)))
      Up, Wp, P = jax.jit(lambda *a: _prepare(cfg, *a))(q_f, e_f, w_f, v_f)
      dO = jax.random.normal(ks[7], (B * H, T, D), jnp.float32)
      rev = jax.jit(lambda dO, q, w, Wp, P: _backward_pass(cfg, dO, q, w, Wp, P,
                                                           jnp.zeros_like(flat(S0))))
      emit({"T": T, "B": B, "variant": variant, "part": "state_reverse",
            "ms": ms(rev, jax.block_until_ready((dO, q_f, w_f, Wp, P)), args.reps, args.warmup)})

  table.dump(args.out, "profile_backward.json")


if __name__ == "__main__":
  main()
