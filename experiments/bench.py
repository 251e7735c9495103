r"""The benchmark suite behind BENCHMARKS.md: VLA pallas, fla's chunk_delta_rule (when torch and
fla are importable and a GPU is there), cuDNN causal attention, each row with VLA's hardware
floor; forward and forward + backward; H = 16, bfloat16, B * T = 32,768 (B = 1 beyond).

    python experiments/bench.py --name=h100_d64 --dims=64
    python experiments/bench.py --name=h100_d128 --dims=128
    python experiments/report_benchmarks.py

The state path alone (`lab.benchmarks.rows` lists every row family):
--rows=state_path_triton. The penalty scan's two block factors (`KernelConfig.block_factor`)
in one run:

    python experiments/bench.py --name=block_factor_h200 --dims=64,128 \
        --Ts=4096,32768,131072 --rows=vla_kernel_elimination,vla_kernel_newton

The segment starts at d = 128 in XLA or in the kernels (`KernelConfig.start_inverse`; at
T = 4096, B = 8 each sequence is one penalty-scan segment and has no starts):

    python experiments/bench.py --name=start_inverse_h200 --dims=128 --Ts=16384,32768,131072 \
        --rows=vla_kernel_start_xla,vla_kernel_start_tiles

The penalty path's two layouts (`KernelConfig.penalty_layout`: the scan's products on the
block's rows, or transposed with the head dim on the M side and the u-cotangent kernel carrying
F = E + E^T), aimed at d = 128:

    python experiments/bench.py --name=penalty_layout_h200 --dims=64,128 --Ts=4096,32768 \
        --rows=vla_kernel_penalty_rows,vla_kernel_penalty_transposed

DeltaNet and Gated DeltaNet on the Pallas kernels beside fla's:

    python experiments/bench.py --name=h200_delta_d64 --dims=64 --Ts=4096,32768 \
        --rows=deltanet_pallas,fla_delta_rule,gated_deltanet_pallas,fla_gated_delta_rule

Rows go to --out_dir/<name>.jsonl (default results/bench/), one JSON line each as soon as it
is measured, after a header line (versions, device, settings). Medians after warm-up, rotating
between input sets (`lab.benchmarks.measure`). --smoke: a tiny CPU run (interpret mode;
GPU-only rows recorded as skipped).
"""

import dataclasses
import os

from absl import app, flags

_NAME = flags.DEFINE_string("name", None, "Output file name (without .jsonl).")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("results", "bench"), "Output folder.")
_ROWS = flags.DEFINE_list("rows", None, "Row families (default vla_pallas, attn_cudnn, "
                          "fla_delta_rule; also vla_kernel_elimination, vla_kernel_newton, "
                          "vla_kernel_start_xla, vla_kernel_start_tiles, "
                          "state_path_triton, deltanet_pallas, "
                          "gated_deltanet_pallas, fla_gated_delta_rule).")
_DIMS = flags.DEFINE_list("dims", None, "Head dims (default 64,128).")
_TS = flags.DEFINE_list("Ts", None, "Sequence lengths (default 1024 ... 131072, every 2x).")
_PASSES = flags.DEFINE_list("passes", None, "fwd, fwd+bwd or both (default both).")
_BUDGET = flags.DEFINE_float("budget_s", None, "Rows not started by then are skipped.")
_CAP = flags.DEFINE_float("cap_s", None, "Larger T of a row are skipped once a call takes this.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny CPU run (interpret mode).")
flags.mark_flag_as_required("name")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _SMOKE.value:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax  # pylint: disable=import-outside-toplevel
  from lab.benchmarks import records, rows, suite  # pylint: disable=import-outside-toplevel
  settings = suite.Settings(**(suite.SMOKE if _SMOKE.value else {}))
  overrides = {"rows": _ROWS.value, "dims": _DIMS.value and [int(d) for d in _DIMS.value],
               "Ts": _TS.value and [int(t) for t in _TS.value], "passes": _PASSES.value,
               "budget_s": _BUDGET.value, "cap_s": _CAP.value}
  settings = dataclasses.replace(settings, **{k: tuple(v) if isinstance(v, list) else v
                                              for k, v in overrides.items() if v is not None})
  unknown = [r for r in settings.rows if r not in rows.BY_KEY]
  if unknown:
    raise app.UsageError(f"unknown --rows {unknown}; known: {list(rows.BY_KEY)}")
  if settings.smoke:
    jax.config.update("jax_disable_most_optimizations", True)
  print(jax.devices(), flush=True)
  rec = records.Recorder(os.path.join(_OUT_DIR.value, _NAME.value + ".jsonl"))
  rec.header(dataclasses.asdict(settings))
  bench = suite.Suite(settings, rec)
  bench.run()
  print(f"{rec.count} rows in {bench.elapsed():.1f} s -> {rec.path}", flush=True)


if __name__ == "__main__":
  app.run(main)
