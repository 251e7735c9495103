r"""Trains every (seed, learning rate) pair of one experiment at once (vmapped) and appends one
JSON row per run to --out.

    python experiments/sweep.py --config=configs/mqar_paper.py:24 \
        --config.model.mixer=deltanet --seeds=0,1,2 --learning_rates=3e-4,1e-3,3e-3 \
        --workdir=runs/paper24-deltanet --out=rows.jsonl --tag='{"grid": "capacity"}'

Each run equals `experiments/train.py` with that seed and `--config.train.learning_rate`
(`vla_jax.training.sweep`). Re-running with the same --workdir resumes from its checkpoint.
Rows carry test and validation scores (choose a rate on validation, report test), the task's
settings and the --tag fields. Several hosts: as experiments/train.py (--coordinator_address,
--num_processes, --process_id); process 0 prints and writes the rows.
"""

import json
import math
import sys

from absl import app, flags
from ml_collections import config_flags

from lab import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment configuration file.",
                                          lock_config=True)
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (parameters and data).")
_LRS = flags.DEFINE_list("learning_rates", ["1e-3"], "Peak learning rates.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (resumes from checkpoints).")
_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are appended to.")
_TAG = flags.DEFINE_string("tag", "{}", "JSON object of fields added to every row.")
_STOP_AFTER = flags.DEFINE_integer("stop_after", None, "Stop after this many steps.",
                                   lower_bound=1)
flags.mark_flags_as_required(["config", "workdir"])
cli.define_process_flags()


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  primary = cli.start_processes("sweep.py")
  from vla_jax.training import from_config_dict, jsonl  # pylint: disable=g-import-not-at-top
  from vla_jax.training.sweep import train_sweep  # pylint: disable=g-import-not-at-top

  try:
    tag = json.loads(_TAG.value)
  except json.JSONDecodeError as e:
    raise app.UsageError(f"--tag must be a JSON object; got {_TAG.value!r} ({e})") from e
  if not isinstance(tag, dict):
    raise app.UsageError(f"--tag must be a JSON object; got {_TAG.value!r}")
  seeds = _parse_list("seeds", _SEEDS.value, int, "integers in [0, 2**63)",
                      lambda s: 0 <= s < 2 ** 63)
  rates = _parse_list("learning_rates", _LRS.value, float, "positive finite numbers",
                      lambda r: 0 < r < math.inf)
  with cli.user_errors("sweep.py"):
    config = from_config_dict(_CONFIG.value)
    rows = train_sweep(config, seeds, rates, _WORKDIR.value, stop_after=_STOP_AFTER.value,
                       log=lambda line: print(line, file=sys.stderr, flush=True))
  model = config.model
  rows = [{**tag, **row, "task_fields": dict(config.task_fields),
           "model": {"d_model": model.d_model, "num_layers": model.num_layers,
                     "num_heads": model.num_heads, "head_dim": model.head_dim,
                     "impl": model.impl, "mixer_options": dict(model.mixer_options),
                     "dtype": model.dtype},
           "batch_size": config.train.batch_size} for row in rows]
  if not primary:
    return
  for row in rows:
    print(json.dumps(row, sort_keys=True), flush=True)
  if _OUT.value:   # all of the job's rows in one write, so that none is left half-written
    with cli.user_errors("sweep.py"):   # a full disk: one line
      jsonl.append_rows(_OUT.value, rows, sort_keys=True)


def _parse_list(name, values, kind, what, valid):
  """`values` (a flag's list) as `kind`s that are `valid`; a UsageError naming the flag and
  `what` it takes otherwise (an empty list too)."""
  try:
    parsed = [kind(v) for v in values]
  except ValueError:
    parsed = None
  if not parsed or not all(valid(v) for v in parsed):
    raise app.UsageError(f"--{name} must be a comma list of {what}; got "
                         f"{','.join(values) or 'nothing'}")
  return parsed


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
