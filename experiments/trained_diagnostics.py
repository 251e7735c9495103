r"""Memory norms and VLA's Jacobians inside trained models (RESULTS.md sections 1 and 2).

    python experiments/trained_diagnostics.py --config=configs/mqar_long.py:64 \
        --config.model.d_model=64 --config.model.num_heads=2 --Ts=1000,8192 --out=rows.jsonl

Trains (or resumes, in --workdir/<mixer>) one model per mixer of --mixers with the config (its
model.mixer set per run, model.pos_emb set to "none" so that the model runs at any length),
then feeds it MQAR sequences of each length in --Ts (the config's task otherwise) and appends
the rows of `lab.report.diagnostics.long_sequence_rows` to --out: ||S_t|| in every
layer, and for VLA the Jacobian statistics and their products over spans.
"""

import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from lab import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment configuration file "
                                          "(MQAR).", lock_config=True)
_MIXERS = flags.DEFINE_list("mixers", ["vla", "linear", "deltanet", "gated_deltanet"],
                            "Mixers to train and measure.")
_TS = flags.DEFINE_list("Ts", ["1000", "16384"], "Lengths of the measured sequences.")
_EXAMPLES = flags.DEFINE_integer("examples", 8, "Sequences per measured length.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/trained_diagnostics", "Parent of the runs.")
_OUT = flags.DEFINE_string("out", None, "JSONL file the rows are appended to.")
flags.mark_flags_as_required(["config", "out"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  cli.quiet_libraries()   # libraries' INFO logs only with --verbosity=0
  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp
  from lab.report import diagnostics
  from vla_jax.tasks import make_task
  from vla_jax.training import from_config_dict, jsonl, load_model, train_and_evaluate
  # pylint: enable=g-import-not-at-top

  def emit(rows):
    for row in rows:
      print(json.dumps(row), flush=True)
    jsonl.append_rows(_OUT.value, rows)

  with cli.user_errors("trained_diagnostics.py"):
    for mixer in _MIXERS.value:
      config = _CONFIG.value.copy_and_resolve_references()
      config.model.mixer = mixer
      config.model.pos_emb = "none"
      exp = from_config_dict(config)
      workdir = os.path.join(_WORKDIR.value, mixer)
      summary = train_and_evaluate(exp, workdir, log=lambda s: print(s, file=sys.stderr))
      if summary["evals"] is None:  # stopped by SIGTERM before its evaluation: nothing to report
        sys.exit(f"{workdir}: stopped at step {summary['steps']}; run again to resume")
      emit([{"kind": "trained_model", "mixer": mixer, "train_T": dict(exp.task_fields)["seq_len"],
             "d_model": exp.model.d_model, "accuracy": summary["accuracy"],
             "steps": summary["steps"], "learning_rate": exp.train.learning_rate}])
      model = load_model(workdir)
      for T in (int(t) for t in _TS.value):
        task = make_task(exp.task_name, {**dict(exp.task_fields), "seq_len": T})
        tokens = jnp.asarray(next(iter(task.eval_sets(7, _EXAMPLES.value).values()))[0])
        emit(diagnostics.long_sequence_rows(model, mixer, tokens))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
