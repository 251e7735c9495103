r"""Draws a run's curves (loss, accuracy, learning rate, steps/s) from its metrics.jsonl into
one PNG and prints its path.

    python experiments/plot_run.py --workdir=runs/demo            # runs/demo/curves.png
    python experiments/plot_run.py --workdir=runs/sweep --out=plots/sweep.png

A sweep's workdir gives one line per (seed, learning rate) run. Needs matplotlib
(pip install 'vla-jax[plot]').
"""

from absl import app, flags

from vla_jax.training import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's (or sweep's) folder.")
_OUT = flags.DEFINE_string("out", None, "PNG to write (default: <workdir>/curves.png).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()
  from vla_jax.training import curves  # pylint: disable=g-import-not-at-top

  with cli.user_errors("plot_run.py"):
    print(curves.plot_run(_WORKDIR.value, _OUT.value))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
