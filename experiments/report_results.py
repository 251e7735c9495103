r"""Regenerates the generated blocks of RESULTS.md, the full tables and the plots from the rows
under results/training/.

    python experiments/report_results.py [--results=results] [--out=RESULTS.md] [--noplots]

Reads results/training/ (what each file holds: results/README.md) and rewrites the blocks
between `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name -->` in RESULTS.md (the
findings around them are written by hand and left alone), results/tables/*.md and
results/plots/*.png (`lab.report`).
"""

from absl import app, flags

from lab import cli

_RESULTS = flags.DEFINE_string("results", "results", "Folder with training/ and bench/ (the "
                               "rows) and plots/ (written).")
_OUT = flags.DEFINE_string("out", "RESULTS.md", "The report whose generated blocks are "
                           "rewritten.")
_PLOTS = flags.DEFINE_bool("plots", True, "Draw the plots too.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  from lab import report  # pylint: disable=g-import-not-at-top
  with cli.user_errors("report_results.py"):
    report.write_results_md(_RESULTS.value, _OUT.value, draw=_PLOTS.value)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
