r"""CPU timings of vla_recurrence's pure-JAX forms: chunked vs associative_scan vs scan.

    python experiments/bench_impls_cpu.py [--lengths=256,1024,4096] [--heads=4] [--dim=64]

Forward only, float32, B = 1; each time is the median of --repeats calls after one warm-up
(compile) call (`lab.report.speed.impl_times`). Speed claims for the GPU are
BENCHMARKS.md's, not this script's.
"""

from absl import app, flags

from lab import cli

_LENGTHS = flags.DEFINE_list("lengths", ["256", "1024", "4096"], "Sequence lengths T.")
_IMPLS = flags.DEFINE_list("impls", ["chunked", "associative_scan", "scan"], "Impls to time.")
_HEADS = flags.DEFINE_integer("heads", 4, "Heads H.")
_DIM = flags.DEFINE_integer("dim", 64, "Head dim dk = dv.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per cell (median reported).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  import jax  # pylint: disable=g-import-not-at-top
  from lab.report import speed  # pylint: disable=g-import-not-at-top

  lengths, impls = [int(t) for t in _LENGTHS.value], _IMPLS.value
  with cli.user_errors("bench_impls_cpu.py"):
    ms = speed.impl_times(lengths, impls, heads=_HEADS.value, dim=_DIM.value,
                          repeats=_REPEATS.value)
  print(f"vla_recurrence forward on {jax.devices()[0].platform.upper()}, B=1, H={_HEADS.value}, "
        f"dk=dv={_DIM.value}, float32, median of {_REPEATS.value} (ms)")
  print(f"{'T':>6} | " + " | ".join(f"{impl:>16}" for impl in impls))
  for T in lengths:
    print(f"{T:>6} | " + " | ".join(f"{ms[(T, impl)]:16.2f}" for impl in impls))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
