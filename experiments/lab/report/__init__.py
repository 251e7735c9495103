"""RESULTS.md's generated blocks, full tables and plots, computed from the rows under
results/training/, and the rows the diagnostics and decode scripts measure.

Modules: `rows` (reading rows, best rate per cell, cell summaries, the short labels),
`markdown` (tables and formats), `notes` (the provenance notes under a full table), `plots`,
one module of full tables per group of sections (`memory`, `mqar`, `zoology`, `copy_task`,
`seeds`), `results_md` (the blocks of RESULTS.md and results/tables/), `findings` (the
hand-written findings' claims as predicates on the rows), `diagnostics` (memory-norm and
Jacobian rows of random inputs and trained models) and `speed` (decode and CPU timings).
"""

from lab.report.results_md import write_results_md

__all__ = ["write_results_md"]
