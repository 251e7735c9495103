"""One forward and one gradient call of `vla_pallas`, nothing else: a target for profilers.

H = 16, bfloat16, the library's default KernelConfig; B = max(1, --tokens // T). For example
(Nsight Compute on the forward and backward kernels, on a GPU):

    ncu --target-processes all --clock-control none -k regex:vla_ --set full -c 24 \\
        -o OUT/vla python3 experiments/profile_target.py --T 4096
    ncu --import OUT/vla.ncu-rep --page details
"""

import argparse
import warnings

import jax

from bench_kernels import TOKENS, make_inputs, vla_fns
from vla_jax.kernels import KernelConfig

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--T", type=int, default=4096)
  parser.add_argument("--tokens", type=int, default=TOKENS, help="B * T (smaller: CPU smoke)")
  args = parser.parse_args(argv)
  B = max(1, args.tokens // args.T)
  q, k, v, u = make_inputs(B, args.T)
  fwd, grad = vla_fns("pallas", KernelConfig(), B, args.T)
  out = jax.block_until_ready(fwd(q, k, v, u))
  _, grads = jax.block_until_ready(grad(q, k, v, u))
  print(f"B = {B}, T = {args.T}: o {out.shape}, {len(grads)} gradients")
  return out, grads


if __name__ == "__main__":
  main()
