r"""Trains a model on a synthetic task and prints a final JSON summary line.

    python experiments/train.py --config=configs/mqar_demo.py
    python experiments/train.py --config=configs/mqar_paper.py --config.model.mixer=deltanet \
        --workdir=runs/paper_deltanet

Re-running with the same --workdir resumes from its latest checkpoint. Without --workdir a
new folder runs/<config>-<mixer>-<time> is used.

Several hosts: start one process per host with the same flags and --workdir (a shared folder),
plus --coordinator_address=HOST0:PORT --num_processes=N --process_id=I; process 0 prints.
"""

import json
import os
import time

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lab import cli  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment configuration file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (resumes if it has checkpoints).")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None,
                                   "Stop after this many steps, as an interruption would.",
                                   lower_bound=1)
flags.mark_flags_as_required(["config"])
cli.define_process_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  primary = cli.start_processes("train.py")
  from vla_jax.training import from_config_dict, train_and_evaluate  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  with cli.user_errors("train.py"):
    config = from_config_dict(_CONFIG.value, num_devices=jax.device_count())
    workdir = _WORKDIR.value
    if not workdir:
      if jax.process_count() > 1:   # each process would name its own folder
        raise ValueError("a run of several processes needs --workdir (one folder they share)")
      name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
      workdir = os.path.join("runs",
                             f"{name}-{config.model.mixer}-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = train_and_evaluate(config, workdir, stop_after=_STOP_AFTER.value,
                                 log=lambda line: print(line, flush=True))
  if primary:
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
