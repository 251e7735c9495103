r"""Trains each mixer of --mixers at each rate of --learning_rates, one run after another in a
single process, and prints (and with --out appends) one JSON row per run.

    python experiments/mixer_sweep.py --config=configs/mqar_paper.py:24 \
        --learning_rates=1e-3,3e-3 --workdir=runs/mixer_sweep --out=rows.jsonl

One seed (the config's train.seed) and no validation set: a quick look across mixers; the grids
behind RESULTS.md use experiments/sweep.py. Each run has its own folder under --workdir, so an
interrupted sweep resumes.
"""

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from lab import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment configuration file.",
                                          lock_config=True)
_MIXERS = flags.DEFINE_list("mixers", ["vla", "softmax", "linear", "deltanet",
                                       "gated_deltanet"], "Mixers to train, in order.")
_LRS = flags.DEFINE_list("learning_rates", ["1e-3"], "Peak learning rates to try per mixer.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/mixer_sweep", "Parent folder of the runs.")
_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are appended to.")
flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  # pylint: disable=g-import-not-at-top
  import jax
  from vla_jax.training import from_config_dict, jsonl, train_and_evaluate
  # pylint: enable=g-import-not-at-top

  with cli.user_errors("mixer_sweep.py"):
    runs = []
    for mixer in _MIXERS.value:  # build and validate every config before training any
      for lr in _LRS.value:
        config = _CONFIG.value.copy_and_resolve_references()
        config.model.mixer = mixer
        config.train.learning_rate = float(lr)
        runs.append((mixer, lr, from_config_dict(config, num_devices=jax.device_count())))
    for mixer, lr, exp in runs:
      workdir = os.path.join(_WORKDIR.value, f"{mixer}-lr{lr}-s{exp.train.seed}")
      summary = train_and_evaluate(exp, workdir, log=lambda line: print(line, file=sys.stderr,
                                                                        flush=True))
      if summary["evals"] is None:  # stopped by SIGTERM before its evaluation: nothing to report
        sys.exit(f"{workdir}: stopped at step {summary['steps']}; run again to resume")
      row = {"mixer": mixer, "learning_rate": float(lr), "task_fields": dict(exp.task_fields),
             **{k: summary[k] for k in ("accuracy", "exact_match", "steps", "train_loss",
                                        "wall_s", "devices")}}
      print(json.dumps(row), flush=True)
      if _OUT.value:
        jsonl.append_rows(_OUT.value, [row])


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
