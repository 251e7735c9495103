r"""Where the Pallas VLA kernels' time goes: per-kernel device time of the forward and the
gradient from a JAX profiler trace (`lab.benchmarks.profile`), at the kernels' defaults (the
plan's forms, unless --block_factor, --start_inverse or --penalty_layout names one), H = 16,
bfloat16, B * T = --tokens (B = 1 beyond).

    python experiments/profile_kernels.py --name=profile_h100 --Ts=4096,32768 --dims=64,128
    python experiments/profile_kernels.py --resources --dims=64,128    # offline, no GPU: registers,
                                                               # spills, shared memory, SASS
    python experiments/profile_kernels.py --name=profile_h200_start_xla --Ts=32768,131072 \
        --dims=128 --start_inverse=xla    # the d = 128 segment starts in XLA
    python experiments/profile_kernels.py --name=profile_h200_penalty_rows \
        --Ts=4096,32768 --dims=64,128 --penalty_layout=rows    # the penalty path on rows

Prints per call the busy time of each kernel class (pallas, gemm, copy, xla), the idle time
inside the call and the largest kernels, and writes the rows to --out_dir/<name>.json.
--resources compiles every kernel's Triton IR for sm_90a with the `triton` package instead
(needs it installed; no GPU).
"""

import itertools
import json
import os

from absl import app, flags
from lab import cli

_NAME = flags.DEFINE_string("name", "profile", "Output file name (without .json).")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("results", "bench"), "Output folder.")
_TS = flags.DEFINE_list("Ts", ["4096", "32768"], "Sequence lengths.")
_DIMS = flags.DEFINE_list("dims", ["64"], "Head dims.")
_TOKENS = flags.DEFINE_integer("tokens", 32768, "B * T per call.")
_HEADS = flags.DEFINE_integer("heads", 16, "Heads.")
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "Input dtype.")
_REPS = flags.DEFINE_integer("reps", 10, "Traced calls.")
_PLANE = flags.DEFINE_string("plane", "/device:GPU:", "Trace planes read (prefix; CPU smoke: "
                             "/host:CPU).")
_RESOURCES = flags.DEFINE_bool("resources", False, "Offline resource report instead.")
_INTERPRET = flags.DEFINE_bool("interpret", False, "Pallas interpret mode (CPU smoke).")
cli.define_kernel_option_flags("profiled calls")
flags.adopt_module_key_flags(cli)   # --help lists them


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  from lab.benchmarks import profile  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig  # pylint: disable=import-outside-toplevel
  options = cli.kernel_options()
  config = KernelConfig(**options)
  rows = []
  for d, T in itertools.product(map(int, _DIMS.value), map(int, _TS.value)):
    B, H = max(1, _TOKENS.value // T), _HEADS.value
    if _RESOURCES.value:
      fwd, grad, xs = profile.vla_calls(B, T, H, d, _DTYPE.value, interpret=False,
                                        config=config)
      spec = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs]
      for call, fn in (("forward", fwd), ("gradient", grad)):
        for r in profile.kernel_resources(fn, spec):
          rows.append({"d": d, "T": T, "B": B, "call": call, **r})
          print(json.dumps(rows[-1]), flush=True)
      continue
    fwd, grad, xs = profile.vla_calls(B, T, H, d, _DTYPE.value,
                                      interpret=True if _INTERPRET.value else None,
                                      config=config)
    for call, fn in (("forward", fwd), ("gradient", grad)):
      row = {"d": d, "T": T, "B": B, "H": H, "dtype": _DTYPE.value, "call": call,
             **profile.profile_row(fn, xs, _REPS.value, _PLANE.value)}
      rows.append(row)
      print(f"\nd = {d}, T = {T}, B = {B}, {call}: wall {row['wall_ms']:.3f} ms, device busy "
            f"{row['busy_ms']:.3f} ms (" + ", ".join(
                f"{c} {t:.3f}" for c, t in sorted(row["classes_ms"].items(), key=lambda x: -x[1]))
            + f"), idle inside the call {row['idle_ms']:.3f} ms")
      for k in row["kernels"]:
        print(f"  {k['ms']:8.3f} ms  {k['launches']:4.1f}x  {k['class']:6s}  {k['name'][:100]}")
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  path = os.path.join(_OUT_DIR.value, _NAME.value + ".json")
  with open(path, "w") as f:
    json.dump({"device": str(jax.devices()[0]), "jax": jax.__version__,
               "resources": _RESOURCES.value, **{k: v or "plan" for k, v in options.items()},
               "rows": rows}, f, indent=1)
  print(f"{len(rows)} rows -> {path}")


if __name__ == "__main__":
  app.run(main)
