"""experiments/text_study.py plans its jobs without running them (--list): a rate job per
mixer, then, from the rows of a finished rate job, a run at the next rate where the best is at
an edge of the rates tried, else that mixer's seed job at the rate with the lowest validation
bits per byte; --summary reads the rows; --rows_from adds committed rows that a fresh
workdir lacks. (The sweeps themselves and their
bits per byte: tests/training/test_sweep.py.)"""

import json
import pathlib

from conftest import run_scripts

STUDY = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "text_study.py"


def _rows(label, scores, job=None):
  """Rate-phase rows of `label`: {rate: validation bits per byte, or None for a diverged run}."""
  return [{"label": label, "phase": "rates", "job": job or f"text-{label}-rates", "seed": 0,
           "learning_rate": lr, "overrides": {}, "diverged": bpb is None,
           "validation": {"text_T1024": {"bits_per_byte": bpb if bpb is not None else
                                         float("nan")}},
           "test": {"text_T1024": {"bits_per_byte": bpb, "bits_per_byte_by_position": [bpb] * 8}}
           if bpb is not None else {}}
          for lr, bpb in scores.items()]


def test_the_study_plans_rate_jobs_then_past_an_edge_then_the_best_rates_seed_jobs(tmp_path):
  first = _rows("linear", {3e-4: 2.5, 1e-3: 2.4, 3e-3: 2.1})            # best at the top
  past = (_rows("linear", {1e-2: 2.2}, "text-linear-rates-lr1e-2")        # worse: 3e-3 stays
          + _rows("vla", {3e-4: 2.0, 1e-3: 2.3, 3e-3: 2.4})               # best at the bottom
          + _rows("deltanet", {3e-4: 2.5, 1e-3: 2.4, 3e-3: None}))        # top rate diverged
  folders = {}
  for name, rows in (("empty", []), ("edge", first), ("done", first + past)):
    folders[name] = tmp_path / name
    folders[name].mkdir()
    (folders[name] / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  # A fresh machine: its workdir holds one of linear's rows, the committed folder the same
  # three in two files (one of them twice).
  committed, fresh = tmp_path / "committed", tmp_path / "fresh"
  committed.mkdir()
  fresh.mkdir()
  (fresh / "text.jsonl").write_text(json.dumps(first[0]) + "\n")
  (committed / "text_study_h100.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                           for r in first[:2]))
  (committed / "text_study_h200.jsonl").write_text(json.dumps(first[2]) + "\n"
                                                   + json.dumps(first[0]) + "\n")
  before, edge, done, summary, resumed = run_scripts(
      *[[STUDY, f"--workdir={folders[name]}", "--list"] for name in ("empty", "edge", "done")],
      [STUDY, f"--workdir={folders['done']}", "--summary"],
      [STUDY, f"--workdir={fresh}", f"--rows_from={committed}", "--list"])
  assert resumed.stdout.splitlines()[0] == f"2 rows added from {committed}"
  assert resumed.stdout.splitlines()[1:] == edge.stdout.splitlines()
  assert sorted(json.loads(l)["learning_rate"] for l in
                (fresh / "text.jsonl").read_text().splitlines()) == [3e-4, 1e-3, 3e-3]
  lines = before.stdout.strip().splitlines()
  assert [l.split()[:2] for l in lines[:-1]] == [
      ["todo", f"text-{m}-rates"] for m in ("softmax_rope", "linear", "deltanet",
                                            "gated_deltanet", "vla", "vla_authors")]
  assert lines[-1] == "6 jobs (6 to do), 18 runs"
  lines = edge.stdout.strip().splitlines()
  assert "done text-linear-rates rates 3e-4,1e-3,3e-3 seeds=0" in lines
  assert "todo text-linear-rates-lr1e-2 rates 1e-2 seeds=0" in lines
  assert not any("seeds rates" in l for l in lines)      # no seed job before the edge is passed
  assert lines[-1] == "7 jobs (6 to do), 19 runs"
  lines = done.stdout.strip().splitlines()
  assert "done text-linear-rates-lr1e-2 rates 1e-2 seeds=0" in lines
  assert "todo text-linear-seeds rates 3e-3 seeds=1,2" in lines
  assert "todo text-vla-rates-lr1e-4 rates 1e-4 seeds=0" in lines
  assert "todo text-deltanet-seeds rates 1e-3 seeds=1,2" in lines     # the diverged rate lost
  assert not any(l.startswith("todo text-vla-seeds") for l in lines)
  assert lines[-1] == "10 jobs (6 to do), 24 runs"
  linear = [json.loads(l) for l in summary.stdout.splitlines()][1]
  assert linear["learning_rate"] == 3e-3 and linear["seeds"] == [0]
  assert linear["rates_tried"] == [3e-4, 1e-3, 3e-3, 1e-2]
  assert linear["test"]["text_T1024"]["bits_per_byte"] == 2.1
