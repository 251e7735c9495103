r"""GPU check of the Pallas VLA kernels against float64: forward (o, S_T, A_T) and gradients of
`vla_pallas` against impl="chunked" in float64 on the same device, each error reported
(`lab.benchmarks.check.default_cases`, B = 1, H = 4): at T = 4096 float32 at HIGHEST (u
isotropic and anisotropic), HIGH and DEFAULT, bfloat16 at DEFAULT; at --max_T anisotropic u in
float32 at HIGHEST (o, S_T, A_T within 2e-6 at any T: exact segment starts) and in bfloat16;
packed documents (`segment_ids`, about 300 tokens a document, anisotropic u) in float32 at
HIGHEST and bfloat16 against impl="chunked" in float64 on the same documents; then a long
bfloat16 forward + backward (B = 1, H = 16, d = 64) that must stay finite and fit. With
--ops naming baselines (deltanet, gated_deltanet, linear_attention), their Pallas kernels the
same way (`lab.benchmarks.check_baselines`: float32 at HIGHEST and bfloat16 at T = 4096 and
--max_T, packed documents where the kernel takes them).

    python experiments/check_kernels.py --name=check_h200_d64 --dims=64
    python experiments/check_kernels.py --name=check_h200_d64_long --dims=64 --cases=long \
        --long_T=0
    python experiments/check_kernels.py --name=check_h200_d128 --dims=128 --max_T=4096 --long_T=0
    python experiments/check_kernels.py --name=check_h200_packed --dims=64,128 --cases=packed \
        --long_T=0
    python experiments/check_kernels.py --name=check_h200_baselines --dims=64,128 \
        --ops=deltanet,gated_deltanet,linear_attention --max_T=32768 --long_T=0

Rows (pass "check", and one "long") go to --out_dir/<name>.jsonl (default results/bench/),
where `experiments/report_benchmarks.py` tabulates them. Exits 1 when a case exceeds its
bounds (`lab.benchmarks.check.BOUNDS`, `FORWARD_BOUNDS`) or is not finite. --smoke: two
tiny cases (one packed) on the CPU in interpret mode.
"""

import dataclasses
import os

from absl import app, flags

_NAME = flags.DEFINE_string("name", None, "Output file name (without .jsonl).")
_OUT_DIR = flags.DEFINE_string("out_dir", os.path.join("results", "bench"), "Output folder.")
_DIMS = flags.DEFINE_list("dims", ["64"], "Head dims (dk = dv) of the checked cases.")
_MAX_T = flags.DEFINE_integer("max_T", 131072, "T of the long anisotropic cases (none when "
                              "<= 4096; the other cases then run at max_T).")
_CASES = flags.DEFINE_enum("cases", "all", ["all", "long", "packed"],
                           "all: every precision at T = 4096, the packed and the long cases; "
                           "long: only the long anisotropic cases at --max_T; packed: only "
                           "the packed-document cases.")
_LONG_T = flags.DEFINE_integer("long_T", 131072, "T of the long run (0: none).")
_OPS = flags.DEFINE_list("ops", ["vla"], "The ops checked: vla and/or the baselines "
                        "deltanet, gated_deltanet, linear_attention (--cases applies to vla).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Two tiny cases on the CPU (interpret mode).")
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
  cases = []
  if "vla" in _OPS.value:
    cases += (check.smoke_cases() if _SMOKE.value
              else check.default_cases(dims, _MAX_T.value, _CASES.value))
  if baselines:
    cases += ([c for c in check_baselines.smoke_cases() if c.op in baselines] if _SMOKE.value
              else check_baselines.default_cases(dims, _MAX_T.value, baselines))
  if not cases:
    raise app.UsageError("no cases: --cases=long needs --max_T > 4096")
  print(jax.devices(), flush=True)
  rec = records.Recorder(os.path.join(_OUT_DIR.value, _NAME.value + ".jsonl"))
  rec.header({"suite": "check", "cases": [dataclasses.asdict(c) for c in cases],
              "long_T": 0 if _SMOKE.value else _LONG_T.value, "smoke": _SMOKE.value})
  failed = []
  for case in cases:
    row = rec.row(**(check_baselines.check_case(case)
                     if isinstance(case, check_baselines.Case) else check.check(case)))
    if row["status"] != "ok":
      failed.append(row)
  if _LONG_T.value and not _SMOKE.value and "vla" in _OPS.value:
    row = rec.row(**check.long_run(_LONG_T.value))
    if row["status"] != "ok":
      failed.append(row)
  print(f"{rec.count} rows -> {rec.path}; " + (f"{len(failed)} FAILED" if failed else "all pass"),
        flush=True)
  if failed:
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
