r"""Regenerates RESULTS.md and its plots from the rows under results/training/.

    python experiments/report_results.py [--results=results] [--out=RESULTS.md]

Reads results/training/*.jsonl (and results/bench/*.jsonl for the kernel claim; what each file
holds: results/README.md), writes RESULTS.md and results/plots/*.png (`lab.report`).
Every number in RESULTS.md comes from those files.
"""

from absl import app, flags

from lab import cli

_RESULTS = flags.DEFINE_string("results", "results", "Folder with training/ and bench/ (the "
                               "rows) and plots/ (written).")
_OUT = flags.DEFINE_string("out", "RESULTS.md", "The report written.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  from lab import report  # pylint: disable=g-import-not-at-top
  with cli.user_errors("report_results.py"):
    report.write_results_md(_RESULTS.value, _OUT.value)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
