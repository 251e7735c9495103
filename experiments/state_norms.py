r"""Memory norms and VLA's state Jacobians on random inputs, and in a trained VLA run.

    python experiments/state_norms.py --out=norms.jsonl --plot=norms.png [--max_T=65536] \
        [--workdir=runs/demo]

Random inputs: ||S_t||_F of linear attention, DeltaNet, Gated DeltaNet and VLA on one sequence
(--heads heads of --head_dim) up to --max_T tokens, and the spectral norm of VLA's Jacobian
I - khat_t a_t^T with its closed form. With --workdir (a finished VLA run), the same Jacobian
statistics on the run's evaluation inputs. Rows: `lab.report.diagnostics`.
"""

import json
import os

from absl import app, flags

from lab import cli

_MAX_T = flags.DEFINE_integer("max_T", 65536, "Longest sequence of the random-input traces.")
_HEADS = flags.DEFINE_integer("heads", 4, "Heads H (random inputs).")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 32, "Head dim d_h (random inputs).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A finished VLA run to measure as well.")
_EXAMPLES = flags.DEFINE_integer("examples", 256, "Evaluation examples of the trained run.")
_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are written to.")
_PLOT = flags.DEFINE_string("plot", None, "PNG of the random-input traces.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  # pylint: disable=g-import-not-at-top
  from lab.report import diagnostics, plots
  from vla_jax.training import config_from_workdir, jsonl, load_model
  # pylint: enable=g-import-not-at-top

  with cli.user_errors("state_norms.py"):
    rows, traces = diagnostics.random_input_rows(_MAX_T.value, _HEADS.value, _HEAD_DIM.value,
                                                 _SEED.value)
    if _WORKDIR.value:
      config = config_from_workdir(_WORKDIR.value)
      inputs, _ = next(iter(config.make_task().eval_sets(config.train.seed + 1,
                                                         _EXAMPLES.value).values()))
      rows += diagnostics.trained_run_rows(load_model(_WORKDIR.value), inputs,
                                           os.path.basename(os.path.normpath(_WORKDIR.value)))
  for row in rows:
    print(json.dumps(row), flush=True)
  if _OUT.value:
    jsonl.write_rows(_OUT.value, rows)
  if _PLOT.value:
    plots.plot_state_norms(traces, _HEAD_DIM.value, _PLOT.value)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
