r"""Draws a run's curves (loss, accuracy, learning rate, steps/s) from its metrics.jsonl into
one PNG and prints its path; a run trained with train.diagnostics_every > 0 also gets
diagnostics.png, its runs compared by outcome (solved in blue, failed in red).

    python experiments/plot_run.py --workdir=runs/demo            # runs/demo/curves.png
    python experiments/plot_run.py --workdir=runs/sweep --out=plots/sweep.png
    python experiments/plot_run.py --workdir=runs/seed0 --compare=runs/seed1,runs/seed2

A sweep's workdir gives one line per (seed, learning rate) run. --compare adds other runs (or
sweeps) to the diagnostics figure. Needs matplotlib (pip install 'vla-jax[plot]').
"""

import os

from absl import app, flags

from lab import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's (or sweep's) folder.")
_OUT = flags.DEFINE_string("out", None, "PNG to write (default: <workdir>/curves.png).")
_COMPARE = flags.DEFINE_list("compare", [], "More runs' folders for the diagnostics figure.")
_DIAGNOSTICS_OUT = flags.DEFINE_string("diagnostics_out", None, "Diagnostics PNG (default: "
                                       "<workdir>/diagnostics.png).")
_SOLVED = flags.DEFINE_float("solved", 0.9, "Final test accuracy from which a run counts as "
                             "solved in the diagnostics figure.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()
  from lab import run_plots  # pylint: disable=g-import-not-at-top

  with cli.user_errors("plot_run.py"):
    print(run_plots.plot_run(_WORKDIR.value, _OUT.value))
    workdirs = [_WORKDIR.value] + _COMPARE.value
    if any(run_plots.has_diagnostics(w) for w in workdirs):
      out = _DIAGNOSTICS_OUT.value or os.path.join(_WORKDIR.value, "diagnostics.png")
      print(run_plots.plot_diagnostics(workdirs, out, solved=_SOLVED.value))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
