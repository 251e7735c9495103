"""Library code of the kernel scripts (experiments/bench.py, report_benchmarks.py,
check_kernels.py, profile_kernels.py): one module per job.

  rows      the row families timed (VLA pallas, cuDNN attention, fla's chunk_delta_rule)
  suite     the measurement loop behind BENCHMARKS.md
  measure   timing and peak memory (JAX and torch), error classification
  floor     the hardware floor of one VLA (and DeltaNet) call
  records   the JSON-lines writer (header with versions and device, one line per row)
  report    BENCHMARKS.md and its plots from the rows
  check     correctness of vla_pallas against float64 on the device
  profile   per-kernel device time from a profiler trace; offline register/spill report
  context_parallel  the sequence-sharded op on one device against the plain op
                    (experiments/bench_context_parallel.py)
  train_speed  steps/s of short experiments/train.py runs with the library defaults
               (experiments/bench_train_speed.py) and their BENCHMARKS.md block
"""
