"""BENCHMARKS.md's "Training speed with the library defaults": steps/s of experiments/train.py
at three settings for five mixers, each a short train.py run of its own, one at a time
(experiments/bench_train_speed.py), and the block its rows make.

A run's steps/s is its last progress line's (`vla_jax.training.progress`: the steps since the
line before, `Setting.window` of them, with compilation, evaluations and checkpoints left
out), read from the metrics row that line logs (`steps_per_s` in metrics.jsonl). The runs
evaluate and checkpoint only at their end (train.eval_every and checkpoint_every 0, an
evaluation set of EVAL_EXAMPLES), which the runner does not wait for: once the last row is
written it stops the run (SIGTERM, then SIGKILL after `stop_s`; train.py then skips its
evaluation). The impl a recurrent mixer ran is the one its layer logged (train.py with
--verbosity=0 shows `vla_jax.ops.impl.choose_impl`'s INFO line) or the one the run asked for;
softmax attention's is `vla_jax.layers.softmax.resolve_implementation` of the config's
"auto" on the device's platform and the run's dtype.

The rows file: a header line (time, command line, settings, the device and versions as
`records.environment` reads them in a process of their own, the git commit) and one row per
(setting, column) as it finishes: the settings train.py ran (its config.json), steps_per_s,
tokens_per_s, compile_s (its first step), the impl, wall_s (launch to stop), status ("ok",
"OOM", "error", "timeout") and note, device, git_commit. A call with the same file resumes
it when the header's git commit, device and smoke flag are this call's (its measured rows
are kept, the others run); otherwise the call starts the file anew.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time

from lab import grid
from lab.benchmarks import records
from lab.benchmarks.model_report import load
from lab.benchmarks.report import fmt, table
from vla_jax.layers.softmax import resolve_implementation
from vla_jax.training import jsonl, provenance

ROWS_FILE = os.path.join("results", "bench", "train_speed", "train_speed.jsonl")
COMMAND = "python experiments/bench_train_speed.py --workdir=OUT"


@dataclasses.dataclass(frozen=True)
class Setting:
  """One row of the table.

  Attributes:
    name: its name in rows and flags; config: the config argument, relative to the checkout;
    overrides: {config field: value} on top of it; steps: train.num_steps; window:
    train.log_every, so that the last progress line's steps/s covers the last `window` steps;
    expected: the steps/s the estimate assumes for its slowest column on one H100.
  """
  name: str
  config: str
  overrides: dict
  steps: int
  window: int
  expected: float


# d_model 512 of 8 heads of 64 in mixed precision, batch 8 (configs/mqar_long.py otherwise).
LONG = {"model.d_model": 512, "model.num_heads": 8, "model.head_dim": 64,
        "model.dtype": "bfloat16", "train.batch_size": 8}
# The expected steps/s scale the whole-model rows of results/bench/model/model_h100.jsonl (12
# blocks of d_model 1024, 32,768 tokens a step) to 2 blocks of d_model 512 at 65,536 (T =
# 8,192) and 262,144 (T = 32,768) tokens a step: Gated DeltaNet on XLA, the slowest there,
# about 30 and 290 ms a step; at T = 512 the float32 runs are bound by the host's batches
# (about 5 ms each) more than by the GPU.
SETTINGS = (
    Setting("zoology_512", "configs/mqar_zoology.py:512", {}, 200, 100, 40.0),
    Setting("long_8192", "configs/mqar_long.py:8192", LONG, 80, 40, 20.0),
    Setting("long_32768", "configs/mqar_long.py:32768", LONG, 30, 15, 3.0),
)
# (name, title, mixer, overrides): each mixer on its library defaults, VLA also on the XLA
# chunked form (the default before impl="auto").
COLUMNS = (("vla", "VLA (auto)", "vla", {}),
           ("vla_chunked", "VLA chunked", "vla", {"model.impl": "chunked"}),
           ("softmax", "softmax", "softmax", {}),
           ("gated_deltanet", "Gated DeltaNet", "gated_deltanet", {}),
           ("deltanet", "DeltaNet", "deltanet", {}))
EVAL_EXAMPLES = 8
# Every run: no evaluation or checkpoint before the end, a small evaluation set (generated at
# start-up, scored only if the run is not stopped first).
COMMON = {"train.eval_every": 0, "train.checkpoint_every": 0,
          "train.eval_examples": EVAL_EXAMPLES, "train.eval_batch_size": EVAL_EXAMPLES}
# --smoke: the same settings at T = 64 with a tiny model, 4 steps, a progress line every 2.
SMOKE_T = 64
SMOKE = {"model.d_model": 16, "model.num_heads": 2, "model.head_dim": 8, "model.mlp_ratio": 1,
         "train.batch_size": 2, "train.warmup_steps": 1, "train.eval_examples": 2,
         "train.eval_batch_size": 2}
SMOKE_STEPS, SMOKE_WINDOW = 4, 2
# The estimate's seconds a run takes to start (Python, JAX, the device, the model, the
# evaluation set) and compile its step, and the device probe's.
START_S, PROBE_S = 12.0, 5.0


@dataclasses.dataclass(frozen=True)
class Run:
  """One train.py run: `name` "<setting>-<column>", its config argument, overrides (every
  --config.FIELD=VALUE), steps and window, and what the estimate assumes."""
  setting: str
  column: str
  mixer: str
  config: str
  overrides: dict
  steps: int
  window: int
  expected: float

  @property
  def name(self):
    return f"{self.setting}-{self.column}"


def plan(settings=(), columns=(), smoke=False):
  """The runs of the named settings and columns (all where empty), setting by setting; with
  smoke=True each at T = SMOKE_T with SMOKE's tiny model and SMOKE_STEPS steps."""
  known_s, known_c = [s.name for s in SETTINGS], [c[0] for c in COLUMNS]
  for kind, names, known in (("settings", settings, known_s), ("columns", columns, known_c)):
    unknown = [n for n in names if n not in known]
    if unknown:
      raise ValueError(f"{kind} must be among {', '.join(known)}; got {', '.join(unknown)}")
  out = []
  for s in SETTINGS:
    if settings and s.name not in settings:
      continue
    config, steps, window = s.config, s.steps, s.window
    if smoke:
      config, steps, window = f"{s.config.split(':')[0]}:{SMOKE_T}", SMOKE_STEPS, SMOKE_WINDOW
    for column, _, mixer, extra in COLUMNS:
      if columns and column not in columns:
        continue
      overrides = {"model.mixer": mixer, **s.overrides, **extra, **COMMON,
                   **(SMOKE if smoke else {}), "train.num_steps": steps,
                   "train.log_every": window}
      out.append(Run(s.name, column, mixer, config, overrides, steps, window, s.expected))
  return out


def estimate_s(runs):
  """Seconds of device time `runs` are expected to take on one H100, the probe included."""
  return PROBE_S + sum(START_S + r.steps / r.expected for r in runs)


def command(run, *, root, run_dir):
  """The argv of `run`: experiments/train.py under `root` with its config and overrides, its
  folder `run_dir`, absl's INFO lines shown (the impl each layer runs)."""
  return ([sys.executable, os.path.join(root, "experiments", "train.py"),
           f"--config={os.path.join(root, run.config)}",
           f"--workdir={run_dir}", "--verbosity=0"]
          + [f"--config.{k}={v}" for k, v in run.overrides.items()])


# A process of its own reads the device, so that this one starts no backend (and holds no
# device memory while the runs train).
_PROBE = ("import json; from lab.benchmarks import records; "
          "print(json.dumps(records.environment()))")


def probe(root, env=None):
  """`records.environment()` read in a fresh process (the device the runs will see)."""
  proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=os.path.join(root, "experiments"),
                        env=env, capture_output=True, text=True, timeout=300, check=False)
  if proc.returncode:
    raise RuntimeError(f"reading the device failed: {proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


_AUTO = re.compile(r"impl='auto' runs '(\w+)'")


def ran_impl(run, log_text, platform):
  """What `run`'s mixer ran: softmax's attention implementation on `platform`, else the impl
  its layers logged choosing ("auto"), else the one it asked for."""
  dtype = run.overrides.get("model.dtype", "float32")
  if run.mixer == "softmax":
    return resolve_implementation("auto", dtype, backend=platform)
  chosen = sorted(set(_AUTO.findall(log_text)))
  if chosen:
    return ",".join(chosen)
  return run.overrides.get("model.impl", "auto")


def _tail(text, n=400):
  return " ".join(text.split())[-n:]


def measure(run, *, root, workdir, platform, env=None, timeout_s=150.0, stop_s=20.0,
            poll_s=0.2):
  """Runs `run` in `workdir`/runs/<name> (a fresh folder; its log in `workdir`/logs) until its
  last metrics row is written, stops it and returns the row's fields (without device and
  commit)."""
  run_dir = os.path.join(workdir, "runs", run.name)
  shutil.rmtree(run_dir, ignore_errors=True)
  os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)
  log_path = os.path.join(workdir, "logs", run.name + ".log")
  metrics_path = os.path.join(run_dir, "metrics.jsonl")
  start = time.time()
  with open(log_path, "w") as log:
    proc = subprocess.Popen(command(run, root=root, run_dir=run_dir), stdout=log,
                            stderr=subprocess.STDOUT, cwd=root, env=env)
    status, last = None, None
    while status is None:
      time.sleep(poll_s)
      exited = proc.poll() is not None      # asked first: a run that ended wrote its rows
      rows = [r for r in jsonl.read_rows(metrics_path) if "loss" in r]
      last = next((r for r in rows if r["step"] == run.steps and "steps_per_s" in r), None)
      if last is not None:
        status = "ok"
      elif exited:
        status = "error"
      elif time.time() - start > timeout_s:
        status = "timeout"
    grid.stop([proc], stop_s)
  wall_s = time.time() - start
  with open(log_path, errors="replace") as f:
    log_text = f.read()
  try:
    with open(os.path.join(run_dir, "config.json")) as f:
      config = json.load(f)
  except (OSError, ValueError):
    config = None
  first = next(iter(rows), {})
  out = {"setting": run.setting, "column": run.column, "mixer": run.mixer,
         "config": run.config, "overrides": {k: v for k, v in run.overrides.items()
                                             if k != "model.mixer"}}
  if config is not None:
    task, model, train = config["task"], config["model"], config["train"]
    out.update(T=task["seq_len"], d_model=model["d_model"], heads=model["num_heads"],
               head_dim=model["head_dim"], dtype=model["dtype"], batch=train["batch_size"])
  out.update(steps=run.steps, window=run.window,
             steps_per_s=last and round(last["steps_per_s"], 3),
             tokens_per_s=last and round(last["tokens_per_s"]),
             compile_s=first.get("compile_s"), impl=ran_impl(run, log_text, platform),
             wall_s=round(wall_s, 1), status=status, note=None)
  if status != "ok":
    out["status"] = "OOM" if "RESOURCE_EXHAUSTED" in log_text else status
    out["note"] = (f"no row at step {run.steps} after {timeout_s:g} s" if status == "timeout"
                   else _tail(log_text))
  return out


def _header_matches(header, fresh):
  keep = ("git_commit", "device", "smoke")
  return all(header.get(k) == fresh.get(k) for k in keep)


def run_all(runs, *, root, workdir, out, smoke=False, budget_s=420.0, timeout_s=150.0,
            stop_s=20.0, restart=False, log=print):
  """Measures `runs` one at a time, none started after `budget_s`, and writes their rows to
  `out` (the module docstring: resumed or started anew). Returns the rows written by this
  call."""
  env = dict(os.environ)
  device = probe(root, env)
  header = {**records.header({"runs": [r.name for r in runs], "eval_examples": EVAL_EXAMPLES},
                            device),
            "smoke": smoke, "git_commit": provenance.git_commit()}
  old_header, old_rows = load(out) if os.path.exists(out) else ({}, [])
  if restart or not old_header or not _header_matches(old_header, header):
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    jsonl.write_rows(out, [header])
    old_rows = []
  done = {(r["setting"], r["column"]) for r in old_rows if r.get("status") == "ok"}
  todo = [r for r in runs if (r.setting, r.column) not in done]
  log(f"{len(todo)} of {len(runs)} runs to do on {device.get('device')}"
      + (f"; about {estimate_s(todo) - PROBE_S:.0f} s on one H100" if todo else ""))
  start, written = time.time(), []
  for run in todo:
    if time.time() - start > budget_s:
      log(f"budget: {run.name} and the runs after it not started")
      break
    row = measure(run, root=root, workdir=workdir, env=env, timeout_s=timeout_s,
                  platform=device.get("jax_backend") or "unknown", stop_s=stop_s)
    row.update(device=device.get("device"), git_commit=header["git_commit"])
    jsonl.append_rows(out, [row])
    written.append(row)
    log(f"[{time.time() - start:5.0f}s] {run.name}: {row['status']} "
        f"{fmt(row['steps_per_s'])} steps/s ({row['impl']}), {row['wall_s']:.0f} s")
  return written


def listing(runs):
  """The runs' commands (from the checkout's root, OUT the workdir), one a line, and the
  estimate."""
  lines = [" ".join(["python"] + command(r, root="", run_dir=f"OUT/runs/{r.name}")[1:])
           for r in runs]
  lines.append(f"{len(runs)} runs, about {estimate_s(runs):.0f} s on one H100 (assumed: "
               f"{START_S:g} s a run to start and compile, the device probe {PROBE_S:g} s, "
               "and each setting's slowest steps/s for every column: "
               + ", ".join(f"{s.name} {s.expected:g}" for s in SETTINGS) + ")")
  return "\n".join(lines)


# -- the block -------------------------------------------------------------------------------

def _cell(row):
  if row is None:
    return "not run"
  if row.get("status") != "ok":
    return {"OOM": "OOM", "timeout": "timeout"}.get(row.get("status"), "err")
  return f"{fmt(row['steps_per_s'])} ({row['impl']})"


def block(path):
  """The markdown of the block from the rows file at `path` ("not run yet" without one)."""
  if not path or not os.path.exists(path):
    return (f"Not run yet: `{COMMAND}` (its rows go to `{ROWS_FILE}`; "
            "`python experiments/report_benchmarks.py` then fills this table).")
  header, rows = load(path)
  latest = {}
  for r in rows:                      # a resumed file: the last row of a run wins
    latest[(r["setting"], r["column"])] = r
  body = []
  for s in SETTINGS:
    got = {c: latest.get((s.name, c)) for c, *_ in COLUMNS}
    any_row = next((r for r in got.values() if r and r.get("T")), None)
    if any_row is None:
      continue
    vla, chunked = got["vla"], got["vla_chunked"]
    ratio = (fmt(vla["steps_per_s"] / chunked["steps_per_s"]) + "x"
             if vla and chunked and vla.get("status") == chunked.get("status") == "ok"
             else "-")
    body.append([f"`{any_row['config']}`", f"{any_row['T']:,}",
                 f"d_model {any_row['d_model']}, {any_row['heads']} x {any_row['head_dim']}, "
                 f"{any_row['dtype']}", any_row["batch"],
                 f"last {any_row['window']:,} of {any_row['steps']:,}"]
                + [_cell(got[c]) for c, *_ in COLUMNS] + [ratio])
  commit = (header.get("git_commit") or "?")[:7]
  return "\n\n".join([
      f"{header.get('device', '?')}, commit {commit}, {header.get('time', '?')[:16]} UTC"
      + (" (a CPU smoke run: tiny model, T = 64)" if header.get("smoke") else "")
      + ": steps/s of `experiments/train.py`, one run at a time, its last progress line's "
      "figure (the steps since the line before; compilation, evaluation and checkpoints left "
      "out), and in brackets the impl the mixer ran. Each mixer on its library defaults "
      "(VLA chunked: `impl=\"chunked\"`, its default before \"auto\"; softmax: the config's "
      "\"auto\", cuDNN in bfloat16 on a GPU); `experiments/bench_train_speed.py`, rows in "
      "`results/bench/train_speed/`.",
      table(["config", "T", "model", "batch", "steps timed"] + [t for _, t, *_ in COLUMNS]
            + ["VLA auto / chunked"], body)])


# Claims of the hand-written finding above the block, each a predicate on the rows.

def steps_per_s(rows, setting, column):
  """The last ok row's steps/s of (setting, column), None unless measured."""
  got = None
  for r in rows:
    if (r.get("setting"), r.get("column")) == (setting, column):
      got = r["steps_per_s"] if r.get("status") == "ok" else None
  return got


def _ratio(rows, setting, a, b):
  x, y = steps_per_s(rows, setting, a), steps_per_s(rows, setting, b)
  return x / y if x and y else None


def auto_runs_the_kernels_and_pays(rows):
  """VLA's default ran its Pallas kernels in every setting, 1.3-2x the chunked form's speed at
  T = 512 and 6-10x at T = 8k and 32k."""
  auto = [r for r in rows if r.get("column") == "vla" and r.get("status") == "ok"]
  return (len(auto) == 3 and all(r["impl"] == "pallas" for r in auto)
          and 1.3 < _ratio(rows, "zoology_512", "vla", "vla_chunked") < 2
          and all(6 < _ratio(rows, s, "vla", "vla_chunked") < 10
                  for s in ("long_8192", "long_32768")))


def softmax_ahead_to_8k_vla_ahead_at_32k(rows):
  """Softmax attention trains faster at T = 512 and 8k (VLA at 0.65-0.95x of its steps/s);
  at 32k VLA is 1.5-2.5x faster."""
  return (0.65 < _ratio(rows, "zoology_512", "vla", "softmax") < 0.95
          and 0.65 < _ratio(rows, "long_8192", "vla", "softmax") < 0.95
          and 1.5 < _ratio(rows, "long_32768", "vla", "softmax") < 2.5)


def deltanet_faster_gated_deltanet_slower(rows):
  """On their kernels, DeltaNet trains faster than VLA at 8k and 32k and Gated DeltaNet slower
  (at 512 all three are within a fifth of each other)."""
  return (all(_ratio(rows, s, "deltanet", "vla") > 1 and _ratio(rows, s, "gated_deltanet", "vla") < 1
              for s in ("long_8192", "long_32768"))
          and all(0.8 < _ratio(rows, "zoology_512", m, "vla") < 1.2
                  for m in ("deltanet", "gated_deltanet")))


CLAIMS = (auto_runs_the_kernels_and_pays, softmax_ahead_to_8k_vla_ahead_at_32k,
          deltanet_faster_gated_deltanet_slower)
