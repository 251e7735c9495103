r"""Trains every mixer on one MQAR setting, one after another in a single process, and prints
one JSON line per (mixer, learning rate).

    python experiments/mixer_sweep.py --n_pairs=24 --num_steps=3000 --workdir=runs/sweep

Default: the paper's setting (configs/mqar_paper.py: d_model 128, 4 heads, d_h 32, short form
T = 3 n + 1) with n_pairs = 24. Each run has its own workdir, so an interrupted sweep resumes.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

_MIXERS = flags.DEFINE_list("mixers", ["vla", "softmax", "linear", "deltanet",
                                       "gated_deltanet"], "Mixers to train, in order.")
_N_PAIRS = flags.DEFINE_integer("n_pairs", 24, "Key-value pairs per example.")
_STEPS = flags.DEFINE_integer("num_steps", 3000, "Training steps per run.")
_LRS = flags.DEFINE_list("learning_rates", ["1e-3"], "Peak learning rates to try per mixer.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Global batch size.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of parameters and data.")
_IMPL = flags.DEFINE_string("impl", "chunked", "Recurrence form of the recurrent mixers.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Activation dtype (float32 | bfloat16).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/mixer_sweep", "Parent folder of the runs.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top
  from configs import mqar_paper  # pylint: disable=g-import-not-at-top
  from vla_jax.training import from_config_dict, train_and_evaluate  # pylint: disable=g-import-not-at-top

  configs = []
  for mixer in _MIXERS.value:  # build and validate every config before training any
    for lr in _LRS.value:
      config = mqar_paper.get_config(str(_N_PAIRS.value))
      config.model.mixer = mixer
      config.model.dtype = _DTYPE.value
      config.model.impl = _IMPL.value
      config.train.update({"num_steps": _STEPS.value, "learning_rate": float(lr),
                           "batch_size": _BATCH.value, "seed": _SEED.value,
                           "eval_every": 0, "log_every": 100})
      configs.append((mixer, lr, from_config_dict(config, num_devices=jax.device_count())))
  for mixer, lr, config in configs:
    workdir = os.path.join(_WORKDIR.value, f"n{_N_PAIRS.value}-{mixer}-lr{lr}-s{_SEED.value}")
    summary = train_and_evaluate(config, workdir, log=lambda line: print(line, file=sys.stderr,
                                                                         flush=True))
    if summary["evals"] is None:  # stopped by SIGTERM before its evaluation: nothing to report
      sys.exit(f"{workdir}: stopped at step {summary['steps']}; run again to resume")
    print(json.dumps({"mixer": mixer, "n_pairs": _N_PAIRS.value, "learning_rate": float(lr),
                      "accuracy": summary["accuracy"], "exact_match": summary["exact_match"],
                      "steps": summary["steps"], "train_loss": summary["train_loss"],
                      "wall_s": summary["wall_s"], "devices": summary["devices"]}), flush=True)


if __name__ == "__main__":
  app.run(main)
