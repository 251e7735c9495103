r"""Runs the sweeps behind RESULTS.md, several processes per GPU, and collects their rows.

    python experiments/grid.py --grids=capacity,long --out_dir=OUT [--gpus=0,1] [--per_gpu=4]
        [--budget_s=540]

Each job is one `experiments/sweep.py` call (one mixer and one task setting; its seeds and
learning rates vmapped inside) writing rows to OUT/<grid>.jsonl. Jobs start in the order of
`--grids` and of the lists below; none starts after --budget_s, and jobs still running at
--budget_s + --grace_s are stopped (SIGTERM: each checkpoints the step it reached; killed
--stop_s later) and listed as unfinished. A job whose rows are already in OUT/<grid>.jsonl is
skipped and a stopped one resumes from its checkpoint, so a second call continues the grid. A
job counts as done when its rows cover every seed and rate made with the same result-changing
--override settings (recorded in each row as `overrides`; FREE_OVERRIDES such as
train.checkpoint_every are not).

Grids (the settings of RESULTS.md):
  capacity: configs/mqar_paper.py, n_pairs in 4..64, 3000 steps, rates 3e-4, 1e-3, 3e-3.
  long:     configs/mqar_long.py, 8 pairs, T = 64..4096 (--long_Ts), rates 1e-3, 3e-3.
  copy:     configs/copy.py, rates 1e-3, 3e-3; scored at lengths 64, 128, 256.
  zoology:  configs/mqar_zoology.py at T/n = 64/4, 128/8, 256/16, 512/64, d_model 64/128/256.
  ablation: VLA on configs/mqar_paper.py:24 with lam0, penalty_scale and readout varied.
  ablation_demo: the same variants on configs/mqar_demo.py (--demo_steps steps, rate 3e-3;
            small enough for a CPU).
Every job trains seeds 0, 1, 2 (--seeds). --vla_impl=pallas trains the VLA jobs with the Pallas
kernels (GPU; the same function as impl="chunked", tested, and vmapped over a job's runs).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (label, mixer, config overrides): softmax_conv is softmax attention with the recurrent
# mixers' short convolution, the like-for-like backbone; vla_p1 is VLA with penalty_scale 1
# (the best setting of the demo ablation) instead of the authors' 1 / sqrt(d_h).
MIXERS = (("softmax", "softmax", {}),
          ("softmax_conv", "softmax", {"model.options.softmax.conv_size": 4}),
          ("linear", "linear", {}), ("deltanet", "deltanet", {}),
          ("gated_deltanet", "gated_deltanet", {}), ("vla", "vla", {}),
          ("vla_p1", "vla", {"model.options.vla.penalty_scale": 1.0}))
PAPER_N = (4, 8, 12, 16, 24, 32, 48, 64)
ZOOLOGY = ((64, 4), (128, 8), (256, 16), (512, 64))
ZOOLOGY_WIDTHS = ((64, 2), (128, 4), (256, 8))  # (d_model, heads of d_h 32)


def jobs_for(grid, args):
  """[(name, config argument, overrides {flag: value}, learning rates, tag)]."""
  out = []
  if grid == "capacity":
    for n in PAPER_N:
      for label, mixer, extra in MIXERS:
        out.append((f"capacity-n{n}-{label}", f"configs/mqar_paper.py:{n}",
                    {"model.mixer": mixer, **extra}, ("3e-4", "1e-3", "3e-3"),
                    {"grid": grid, "n_pairs": n, "label": label}))
  elif grid == "long":
    for T in args.long_Ts:
      for label, mixer, extra in MIXERS:
        out.append((f"long-T{T}-{label}", f"configs/mqar_long.py:{T}",
                    {"model.mixer": mixer, **extra}, ("1e-3", "3e-3"),
                    {"grid": grid, "seq_len": T, "label": label}))
  elif grid == "copy":
    for label, mixer, extra in MIXERS:
      out.append((f"copy-{label}", "configs/copy.py", {"model.mixer": mixer, **extra},
                  ("1e-3", "3e-3"), {"grid": grid, "label": label}))
  elif grid == "zoology":
    for T, n in ZOOLOGY:
      for d_model, heads in ZOOLOGY_WIDTHS:
        for label, mixer, extra in MIXERS:
          out.append((f"zoology-T{T}-d{d_model}-{label}", f"configs/mqar_zoology.py:{T}",
                      {"model.mixer": mixer, "task.n_pairs": n, "model.d_model": d_model,
                       "model.num_heads": heads, "train.num_steps": args.zoology_steps,
                       **extra}, ("1e-3", "3e-3"),
                      {"grid": grid, "seq_len": T, "n_pairs": n, "d_model": d_model,
                       "label": label}))
  elif grid in ("ablation", "ablation_demo"):
    variants = [("defaults", {}), ("lam0-0.1", {"model.options.vla.lam0": 0.1}),
                ("lam0-10", {"model.options.vla.lam0": 10.0}),
                ("penalty-0", {"model.options.vla.penalty_scale": 0.0}),
                ("penalty-1", {"model.options.vla.penalty_scale": 1.0}),
                ("readout-additive", {"model.options.vla.readout": "additive"}),
                ("readout-delta", {"model.options.vla.readout": "delta"}),
                ("no-conv", {"model.options.vla.conv_size": 0})]
    for name, overrides in variants:
      if grid == "ablation":
        out.append((f"ablation-{name}", "configs/mqar_paper.py:24",
                    {"model.mixer": "vla", **overrides}, ("1e-3", "3e-3"),
                    {"grid": grid, "variant": name, "n_pairs": 24}))
      else:  # the README's demo problem, small enough for a CPU
        out.append((f"ablation_demo-{name}", "configs/mqar_demo.py",
                    {"model.mixer": "vla", "train.num_steps": args.demo_steps, **overrides},
                    ("3e-3",), {"grid": grid, "variant": name, "n_pairs": 8}))
  else:
    raise ValueError(f"unknown grid {grid!r}")
  return [(grid,) + job for job in out]


def all_jobs(args):
  """The jobs of every grid in --grids, with --rates and --vla_impl applied."""
  jobs = [j for g in args.grids.split(",") for j in jobs_for(g, args)]
  if args.rates:
    jobs = [j[:4] + (tuple(args.rates.split(",")),) + j[5:] for j in jobs]
  if args.vla_impl:   # the other mixers have no Pallas form; rows record model.impl
    jobs = [j[:3] + ({**j[3], "model.impl": args.vla_impl},) + j[4:]
            if j[3].get("model.mixer") == "vla" else j for j in jobs]
  return jobs


# --override settings that do not change a job's results (as `training.checkpoint` lets them
# change on resume): they are not recorded in its rows and do not make a finished job rerun.
FREE_OVERRIDES = ("train.log_every", "train.eval_every", "train.eval_batch_size",
                  "train.checkpoint_every", "train.keep_checkpoints", "model.remat")


def read_rows(path):
  """The rows of `path` ([] if none); a last line cut short by a kill is skipped."""
  rows = []
  if os.path.exists(path):
    with open(path) as f:
      lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        if number != len(lines):  # only a last line cut short is skipped
          raise ValueError(f"{path}:{number}: not a JSON object") from None
  return rows


def result_overrides(args):
  """The --override settings that change results: recorded in every row of the call."""
  return {k: v for k, v in args.override if k not in FREE_OVERRIDES}


def is_done(job, rows, args):
  """Whether `rows` hold every (seed, rate) run of `job` made with this call's overrides."""
  overrides = result_overrides(args)
  have = {(r.get("seed"), r.get("learning_rate")) for r in rows
          if r.get("job") == job[1] and r.get("overrides", {}) == overrides}
  return all((int(s), float(lr)) in have for s in args.seeds.split(",") for lr in job[4])


def command(job, args):
  grid, name, config, overrides, rates, tag = job
  cmd = [sys.executable, os.path.join(ROOT, "experiments", "sweep.py"),
         f"--config={os.path.join(ROOT, config)}", f"--seeds={args.seeds}",
         f"--learning_rates={','.join(rates)}",
         f"--workdir={os.path.join(args.out_dir, 'runs', name)}",
         f"--results={os.path.join(args.out_dir, grid + '.jsonl')}",
         f"--tag={json.dumps({**tag, 'job': name, 'overrides': result_overrides(args)})}"]
  cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
  cmd += [f"--config.{k}={v}" for k, v in args.override]
  return cmd


def stop(procs, wait_s):
  """SIGTERM to each (a sweep checkpoints the step it reached and exits); SIGKILL to those
  still running wait_s seconds later."""
  for proc in procs:
    proc.terminate()
  deadline = time.time() + wait_s
  for proc in procs:
    try:
      proc.wait(timeout=max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--grids", default="capacity")
  parser.add_argument("--out_dir", required=True)
  parser.add_argument("--gpus", default="", help="Comma list of GPU ids; empty: no pinning.")
  parser.add_argument("--per_gpu", type=int, default=4, help="Processes per GPU.")
  parser.add_argument("--budget_s", type=float, default=540.0)
  parser.add_argument("--grace_s", type=float, default=30.0)
  parser.add_argument("--stop_s", type=float, default=60.0,
                      help="Seconds a job stopped at the deadline has to checkpoint and exit "
                           "after SIGTERM before it is killed.")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--long_Ts", default="64,128,256,512,1024,2048,4096")
  parser.add_argument("--zoology_steps", type=int, default=4000)
  parser.add_argument("--demo_steps", type=int, default=500)
  parser.add_argument("--rates", default="",
                      help="Comma list replacing every job's learning rates (default: the grid's).")
  parser.add_argument("--vla_impl", default="",
                      help="model.impl of the VLA jobs (e.g. pallas on a GPU: the same function "
                           "as the default chunked, faster at long T); empty: the config's.")
  parser.add_argument("--only", default="",
                      help="Comma list: run only jobs whose name contains one of these, in "
                           "the order of the list.")
  parser.add_argument("--override", nargs=2, action="append", default=[],
                      metavar=("FIELD", "VALUE"), help="Extra --config.FIELD=VALUE for all.")
  args = parser.parse_args(argv)
  args.long_Ts = [int(t) for t in args.long_Ts.split(",")]
  return args


def main():
  args = parse_args()
  os.makedirs(os.path.join(args.out_dir, "logs"), exist_ok=True)
  jobs = all_jobs(args)
  # Jobs run in the order of the --only patterns (the first each matches), then grid order.
  only = args.only.split(",")
  rank = lambda j: next((i for i, o in enumerate(only) if o in j[1]), None)
  rows = {g: read_rows(os.path.join(args.out_dir, g + ".jsonl")) for g in {j[0] for j in jobs}}
  jobs = sorted((j for j in jobs if rank(j) is not None and not is_done(j, rows[j[0]], args)),
                key=rank)
  # Slots alternate between GPUs, so that the first jobs (started first) spread over all of them.
  slots = [g for _ in range(args.per_gpu) for g in (args.gpus.split(",") if args.gpus else [""])]
  start = time.time()
  running = {}  # slot index -> (job, process, started)
  finished, unfinished = [], []
  print(f"{len(jobs)} jobs on {len(slots)} slots", flush=True)
  while jobs or running:
    overdue = []
    for i, (job, proc, t0) in list(running.items()):
      if proc.poll() is not None:
        del running[i]
        finished.append((job[1], proc.returncode, round(time.time() - t0, 1)))
        print(f"[{time.time() - start:6.0f}s] done {job[1]} rc={proc.returncode} "
              f"{time.time() - t0:.0f}s", flush=True)
      elif time.time() - start > args.budget_s + args.grace_s:
        overdue.append(proc)
        del running[i]
        unfinished.append(job[1])
    stop(overdue, args.stop_s)
    if time.time() - start > args.budget_s:
      unfinished += [j[1] for j in jobs]
      jobs = []
    for i, gpu in enumerate(slots):
      if i not in running and jobs:
        job = jobs.pop(0)
        env = dict(os.environ)
        if gpu:
          env["CUDA_VISIBLE_DEVICES"] = gpu
        # Appended: a resumed job's log keeps the earlier attempts (an out-of-memory trace).
        log = open(os.path.join(args.out_dir, "logs", job[1] + ".log"), "a")
        log.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} start, GPU {gpu or '-'}\n")
        log.flush()
        running[i] = (job, subprocess.Popen(command(job, args), env=env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=ROOT), time.time())
    time.sleep(0.5)
  summary = {"finished": finished, "unfinished": unfinished,
             "wall_s": round(time.time() - start, 1)}
  with open(os.path.join(args.out_dir, "grid_summary.json"), "a") as f:
    f.write(json.dumps(summary) + "\n")
  failed = [f for f in finished if f[1] != 0]
  print(f"finished {len(finished)} (failed {len(failed)}: {failed}), "
        f"unfinished {len(unfinished)}: {unfinished}", flush=True)


if __name__ == "__main__":
  main()
