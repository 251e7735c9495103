r"""Scores a trained checkpoint on its own task, on another task configuration or on an
external `.npz` file, and prints one JSON line.

    python experiments/evaluate.py --workdir=runs/demo
    python experiments/evaluate.py --workdir=runs/demo --npz=test.npz
    python experiments/evaluate.py --workdir=runs/copy --config=configs/copy.py \
        --config.task.eval_lengths=512
    python experiments/evaluate.py --workdir=runs/text --config=configs/text_small.py \
        --config.task.eval_lengths=4096,16384 --eval_batch_size=1

Text sets report loss (nats per byte), bits_per_byte and bits_per_byte_by_position; the line
then carries the first set's bits_per_byte next to its accuracy.
"""

import json
import sys

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from lab import cli  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's folder.")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Optional: evaluate on this configuration's task instead of the run's "
    "(only its task section; --config.task.* overrides it).")
_NPZ = flags.DEFINE_string("npz", None, "Optional: an .npz with `inputs` and `labels`.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest that "
                             "verifies).", lower_bound=0)
_EXAMPLES = flags.DEFINE_integer("eval_examples", None, "Examples per evaluation set (default: "
                                 "the run's train.eval_examples; not with --npz, which is "
                                 "scored whole).", lower_bound=1)
_EVAL_BATCH = flags.DEFINE_integer("eval_batch_size", None, "Rows per evaluation batch "
                                  "(default: the run's); lower it for long contexts.",
                                  lower_bound=1)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  from vla_jax.training import evaluate  # pylint: disable=g-import-not-at-top

  ignored = [a for a in sys.argv[1:] if a.startswith("--config.")
             and not a.startswith("--config.task.")]
  if ignored:
    raise app.UsageError(f"only --config's task section is used (the model and training "
                         f"settings are the run's; --eval_examples sets the examples per set): "
                         f"{' '.join(ignored)}")
  if _NPZ.value and _EXAMPLES.value is not None:
    raise app.UsageError("--eval_examples does not apply to --npz: the file is scored whole")
  task = None
  if _CONFIG.value is not None:
    fields = _CONFIG.value.task.to_dict()
    task = (fields.pop("name"), fields)
  with cli.user_errors("evaluate.py"):
    result = evaluate(_WORKDIR.value, task=task, npz_path=_NPZ.value, step=_STEP.value,
                      eval_examples=_EXAMPLES.value, eval_batch_size=_EVAL_BATCH.value)
  first = next(iter(result["evals"].values()))
  extra = {"bits_per_byte": first["bits_per_byte"]} if "bits_per_byte" in first else {}
  print(json.dumps({"workdir": _WORKDIR.value, "accuracy": first["accuracy"], **extra,
                    **result}))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
