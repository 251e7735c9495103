"""Benchmark suite behind BENCHMARKS.md: `run.py` measures, `report.py` writes the tables and plots.

Modules (one job each):
  settings.py   shapes, T lists, row catalogue, per-impl T limits, smoke settings
  records.py    the JSONL writer (header line with versions and device, one line per row)
  floor.py      flop/byte hardware floor of one VLA call
  measure.py    timing and peak-memory measurement (JAX and torch), error classification
  jax_rows.py   the JAX functions timed: VLA impls, softmax attention, library baselines
  torch_rows.py flash-linear-attention `chunk_delta_rule` (PyTorch + Triton)
  triton_vla.py the seed paper's sequential VLA kernel as a raw Triton kernel
  run.py        entry point: the measurement loop
  report.py     entry point: BENCHMARKS.md tables and log-log plots from the JSONL rows
"""
