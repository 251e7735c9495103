r"""GPU check of the Pallas VLA kernels against float64: forward (o, S_T, A_T) and gradients of
`vla_pallas` against impl="chunked" in float64 on the same device, each error reported
(`lab.benchmarks.check.default_cases`, B = 1, H = 4): at T = 4096 float32 at HIGHEST (u
isotropic and anisotropic), HIGH and DEFAULT, bfloat16 at DEFAULT, and a learned write strength
(beta, anisotropic u) in float32 at HIGHEST and bfloat16; at --max_T anisotropic u in
float32 at HIGHEST (o, S_T, A_T within 2e-6 at any T: exact segment starts) and in bfloat16;
packed documents (`segment_ids`, about 300 tokens a document, anisotropic u) in float32 at
HIGHEST and bfloat16 against impl="chunked" in float64 on the same documents; the drift cases
(`check.drift_cases`: bfloat16, u anisotropic of unit norm and isotropic of norm ~sqrt(d), lam0
0.1 and 1, B = 1, H = 2, at --drift_Ts; o against impl="chunked" in float32 at HIGHEST,
anisotropic within 1.5x of isotropic, and a Markdown table of them printed at the end); then a
long bfloat16 forward + backward (B = 1, H = 16, d = 64) that must stay finite and fit. With
--ops naming baselines (deltanet, gated_deltanet, linear_attention), their Pallas kernels the
same way (`lab.benchmarks.check_baselines`: float32 at HIGHEST and bfloat16 at T = 4096 and
--max_T, packed documents where the kernel takes them).

    python experiments/check_kernels.py --name=check_h200_d64 --dims=64
    python experiments/check_kernels.py --name=check_h200_d64_long --dims=64 --cases=long \
        --long_T=0
    python experiments/check_kernels.py --name=check_h200_d128 --dims=128 --max_T=4096 --long_T=0
    python experiments/check_kernels.py --name=check_h200_packed --dims=64,128 --cases=packed \
        --long_T=0
    python experiments/check_kernels.py --name=drift_h200_d64 --dims=64 --cases=drift --long_T=0
    python experiments/check_kernels.py --name=check_h200_baselines --dims=64,128 \
        --ops=deltanet,gated_deltanet,linear_attention --max_T=32768 --long_T=0

The penalty path's forms are the plan's (`KernelConfig.plan`: the Newton block factor; at
d = 128 the transposed layout and the segment starts in the kernels, the rows layout below)
unless --block_factor, --start_inverse or --penalty_layout names one, which every VLA case,
the drift cases and the long run then take. --newton_fallback adds each case's fraction of
blocks where the Newton block factor falls back to the elimination. The check of the plan's
forms (bfloat16, packed and long T included):

    python experiments/check_kernels.py --name=check_h100_plan --dims=64,128 --newton_fallback

A form the plan does not take, e.g. the elimination and the rows layout at d = 128:

    python experiments/check_kernels.py --name=check_h100_d128_forced --dims=128 \
        --block_factor=elimination --penalty_layout=rows --max_T=32768 --long_T=0

Rows (pass "check", "drift", and one "long") go to --out_dir/<name>.jsonl (default
results/bench/), where `experiments/report_benchmarks.py` tabulates the check rows. Exits 1
when a case exceeds its bounds (`lab.benchmarks.check.BOUNDS`, `FORWARD_BOUNDS`,
`DRIFT_RATIO`) or is not finite.
--smoke: a tiny packed case, a tiny drift pair, a tiny long run (T = 64) and a tiny
case of each baseline in --ops, on the CPU in interpret mode.
"""

import dataclasses
import os

from absl import app, flags
from lab import cli

_NAME = flags.DEFINE_string("name", None, "Output file name (without .jsonl).")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("results", "bench"), "Output folder.")
_DIMS = flags.DEFINE_list("dims", ["64"], "Head dims (dk = dv) of the checked cases.")
_MAX_T = flags.DEFINE_integer("max_T", 131072, "T of the long anisotropic cases (none when "
                              "<= 4096; the other cases then run at max_T).")
_CASES = flags.DEFINE_enum("cases", "all", ["all", "long", "packed", "drift"],
                           "all: every precision at T = 4096, the packed, the long and the "
                           "drift cases; long: only the long anisotropic cases at --max_T; "
                           "packed: only the packed-document cases; drift: only the drift "
                           "cases.")
_DRIFT_TS = flags.DEFINE_list("drift_Ts", [str(t) for t in (16384, 131072)],
                              "T of the drift cases (none: an empty list).")
_FALLBACK = flags.DEFINE_bool("newton_fallback", False,
                              "Also report each case's fraction of penalty-scan blocks where "
                              "block_factor 'newton' falls back to the elimination.")
cli.define_kernel_option_flags("checked calls (--start_inverse: d = 128)")
flags.adopt_module_key_flags(cli)   # --help lists them
_LONG_T = flags.DEFINE_integer("long_T", 131072, "T of the long run (0: none).")
_OPS = flags.DEFINE_list("ops", ["vla"], "The ops checked: vla and/or the baselines "
                        "deltanet, gated_deltanet, linear_attention (--cases, --drift_Ts, "
                        "--block_factor, --newton_fallback, --start_inverse and "
                        "--penalty_layout apply to vla).")
_SMOKE = flags.DEFINE_bool("smoke", False, "A tiny packed case, a drift pair and a "
                            "long run (T = 64) on the CPU (interpret mode), and a tiny case of "
                            "each baseline in --ops.")
flags.mark_flag_as_required("name")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _SMOKE.value:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from lab.benchmarks import check, check_baselines, records
  unknown = set(_OPS.value) - {"vla", *check_baselines.OPS}
  if unknown or not _OPS.value:
    raise app.UsageError(f"--ops: unknown {sorted(unknown)}; choose from vla, "
                         f"{', '.join(check_baselines.OPS)}")
  dims = [int(d) for d in _DIMS.value]
  baselines = [op for op in _OPS.value if op != "vla"]
  cases, drift_cases = [], []
  if "vla" in _OPS.value and _SMOKE.value:
    cases, drift_cases = check.smoke_cases(), check.smoke_drift_cases()
  elif "vla" in _OPS.value:
    cases = ([] if _CASES.value == "drift"
             else check.default_cases(dims, _MAX_T.value, _CASES.value))
    drift_cases = (check.drift_cases(dims, [int(t) for t in _DRIFT_TS.value])
                   if _CASES.value in ("all", "drift") else [])
  if baselines:
    cases += ([c for c in check_baselines.smoke_cases() if c.op in baselines] if _SMOKE.value
              else check_baselines.default_cases(dims, _MAX_T.value, baselines))
  if not cases and not drift_cases:
    raise app.UsageError("no cases: --cases=long needs --max_T > 4096, --cases=drift "
                         "--drift_Ts")
  print(jax.devices(), flush=True)
  rec = records.Recorder(os.path.join(_OUT_DIR.value, _NAME.value + ".jsonl"))
  rec.header({"suite": "check", "cases": [dataclasses.asdict(c) for c in cases],
              "drift_cases": [dataclasses.asdict(c) for c in drift_cases],
              "long_T": 64 if _SMOKE.value else _LONG_T.value, "smoke": _SMOKE.value})
  failed = []
  kernel = cli.kernel_options()   # the forms named on the command line, None: the plan's
  options = dict(kernel, fallback=_FALLBACK.value)
  for case in cases:
    row = rec.row(**(check_baselines.check_case(case) if isinstance(case, check_baselines.Case)
                     else check.check(case, **options)))
    if row["status"] != "ok":
      failed.append(row)
  # Each drift row's verdict compares it with its isotropic twin: recorded once all ran.
  drift_rows = [rec.row(**r) for r in check.drift_verdicts(
      [check.drift(case, **options) for case in drift_cases])]
  failed += [r for r in drift_rows if r["status"] != "ok"]
  if drift_rows:
    print(check.drift_table(drift_rows), flush=True)
  if "vla" in _OPS.value and (_LONG_T.value or _SMOKE.value):
    # The smoke run's long run is tiny (interpret mode): the path, not the length.
    size = dict(T=64, H=2, d=16, chunk=16) if _SMOKE.value else dict(T=_LONG_T.value)
    row = rec.row(**check.long_run(**size, **kernel))
    if row["status"] != "ok":
      failed.append(row)
  print(f"{rec.count} rows -> {rec.path}; " + (f"{len(failed)} FAILED" if failed else "all pass"),
        flush=True)
  if failed:
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
