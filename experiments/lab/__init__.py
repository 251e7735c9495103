"""The lab: the code behind this repository's own reports, not part of the installed library.

  report/      RESULTS.md and its plots from the rows under results/training/, and the rows of
               the diagnostics and decode scripts
  benchmarks/  the kernel benchmark suite, BENCHMARKS.md from its rows, the GPU check against
               float64, the profiler
  grid         the grids behind RESULTS.md (jobs) and their GPU scheduler (experiments/grid.py)
  cli          what the absl mains in experiments/ share (flag parsing, one-line errors)
  run_plots    a run's curves and training diagnostics as PNG plots (experiments/plot_run.py)

The mains in experiments/ import it as `lab` (a script's own folder is first on sys.path), the
tests through pytest's `pythonpath = experiments` (setup.cfg). `vla_jax` never imports it
(tests/test_layering.py).
"""
