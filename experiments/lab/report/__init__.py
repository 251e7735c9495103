"""The numbers behind RESULTS.md: the rows the diagnostics and decode scripts measure, and the
report (tables, findings, plots) computed from the rows under results/training/.

Modules: `rows` (reading rows, best rate per cell, cell summaries), `markdown` (tables and
formats), `notes` (the notes under a grid's table), `plots`, one module per group of sections
(`claims`, `memory`, `mqar`, `zoology`, `copy_task`, `seeds`), `results_md` (RESULTS.md
itself), `diagnostics` (memory-norm and Jacobian rows of random inputs and trained models) and
`speed` (decode and CPU timings).
"""

from lab.report.results_md import results_markdown, write_results_md

__all__ = ["results_markdown", "write_results_md"]
