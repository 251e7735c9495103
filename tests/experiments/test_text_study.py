"""experiments/text_study.py plans its jobs without running them (--list): a rate job per
mixer, then, from the rows of a finished rate job, that mixer's seed job at the rate with the
lowest validation bits per byte; --summary reads the rows. (The sweeps themselves and their
bits per byte: tests/training/test_sweep.py.)"""

import json
import pathlib

from conftest import run_scripts

STUDY = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "text_study.py"


def test_the_study_plans_rate_jobs_then_the_best_rates_seed_jobs(tmp_path):
  rows = [{"label": "linear", "phase": "rates", "job": "text-linear-rates", "seed": 0,
           "learning_rate": lr, "overrides": {}, "diverged": False,
           "validation": {"text_T1024": {"bits_per_byte": bpb}},
           "test": {"text_T1024": {"bits_per_byte": bpb, "bits_per_byte_by_position": [bpb] * 8}}}
          for lr, bpb in ((3e-4, 2.5), (1e-3, 2.4), (3e-3, 2.1))]
  empty, done = tmp_path / "empty", tmp_path / "done"
  done.mkdir()
  (done / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  before, after, summary = run_scripts([STUDY, f"--workdir={empty}", "--list"],
                                       [STUDY, f"--workdir={done}", "--list"],
                                       [STUDY, f"--workdir={done}", "--summary"])
  lines = before.stdout.strip().splitlines()
  assert [l.split()[:2] for l in lines[:-1]] == [
      ["todo", f"text-{m}-rates"] for m in ("softmax_rope", "linear", "deltanet",
                                            "gated_deltanet", "vla", "vla_authors")]
  assert lines[-1] == "6 jobs (6 to do), 18 runs"
  lines = after.stdout.strip().splitlines()
  assert "done text-linear-rates rates 3e-4,1e-3,3e-3 seeds=0" in lines
  assert "todo text-linear-seeds rates 3e-3 seeds=1,2" in lines
  assert lines[-1] == "7 jobs (6 to do), 20 runs"
  linear = [json.loads(l) for l in summary.stdout.splitlines()][1]
  assert linear["learning_rate"] == 3e-3 and linear["seeds"] == [0]
  assert linear["test"]["text_T1024"]["bits_per_byte"] == 2.1
