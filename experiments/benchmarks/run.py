"""Benchmark suite: VLA (pallas, chunked, associative_scan, scan), softmax attention (cuDNN,
XLA), the library's linear attention / DeltaNet / Gated DeltaNet, flash-linear-attention's
`chunk_delta_rule` and the seed paper's sequential kernel as raw Triton, forward and
forward+backward, at H = 16, d in {64, 128}, bf16, B * T = 32,768 (B = 1 beyond).

Every row is one JSON line appended to OUT/bench.jsonl as soon as it is measured (after a
header line with versions and the device). A failing row is recorded (status OOM or error) and
the suite goes on; once one call of a row takes longer than --cap_s, its larger T are skipped;
rows not started within --budget_s seconds of the start are recorded as skipped.

    python3 experiments/benchmarks/run.py --out DIR [--smoke] [--Ts 256,1024] [--dims 64,128]
        [--rows vla_pallas,attn_cudnn,...] [--budget_s 420] [--cap_s 10]

Default T: 256, 1024, 4096, 16384, 32768, 65536, 131072 (--Ts all: every power of two from
256); rows run tier by tier (VLA pallas, cuDNN, fla, the Triton kernel first, for every d), so a spent budget
drops the least important rows.

--smoke runs on a CPU in well under a minute (T in {64, 128}, H = 2, d = 16, float32, pallas in
interpret mode; GPU-only rows are recorded as skipped with reason "no GPU").
Then: python3 experiments/benchmarks/report.py --jsonl OUT/bench.jsonl --out BENCHMARKS.md
--plots DIR.
"""

import argparse
import concurrent.futures
import gc
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import floor  # pylint: disable=wrong-import-position
import measure  # pylint: disable=wrong-import-position
import settings  # pylint: disable=wrong-import-position
from records import Recorder  # pylint: disable=wrong-import-position

warnings.filterwarnings("ignore", "The Pallas Triton backend", DeprecationWarning)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True, help="folder for bench.jsonl")
  p.add_argument("--smoke", action="store_true", help="tiny CPU run (CI)")
  p.add_argument("--Ts", default=None,
                 help="comma list of sequence lengths, or 'all' (256 to 131072, every 2x); "
                      "default " + ",".join(map(str, settings.DEFAULT_TS)))
  p.add_argument("--dims", default=None, help="comma list of head dims (64,128)")
  p.add_argument("--rows", default=None,
                 help="comma list of row keys: " + ",".join(s.key for s in settings.CATALOGUE))
  p.add_argument("--passes", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both")
  p.add_argument("--tokens", type=int, default=None, help="B * T per call (default 32768)")
  p.add_argument("--heads", type=int, default=None)
  p.add_argument("--dtype", default=None, help="bfloat16 (default) or float32")
  p.add_argument("--chunk", type=int, default=None, help="chunk size of chunked/pallas forms")
  p.add_argument("--cap_s", type=float, default=settings.ROW_CAP_S,
                 help="skip larger T of a row once one call takes longer")
  p.add_argument("--budget_s", type=float, default=settings.SUITE_BUDGET_S,
                 help="rows not started within this many seconds are recorded as skipped")
  p.add_argument("--target_s", type=float, default=0.3,
                 help="measurement time per row (JAX reps = target / one call, 5..50)")
  p.add_argument("--sets", type=int, default=2, help="input sets rotated between calls (2-3)")
  p.add_argument("--compile_workers", type=int, default=None,
                 help="threads compiling a JAX row family ahead of its timing (1: serial; "
                      "default 8, smoke 2)")
  p.add_argument("--no_limits", action="store_true",
                 help="ignore the per-impl T limits (scan, associative_scan, XLA attention)")
  return p.parse_args(argv)


def resolve(args):
  cfg = {"tokens": settings.TOKENS, "heads": settings.HEADS, "dims": settings.DIMS,
         "Ts": settings.DEFAULT_TS, "dtype": "bfloat16", "chunk": settings.CHUNK,
         "bwd_max_T": None, "max_T": {}, "passes_by_row": {}}
  timing = {"warmup": 2, "target_s": args.target_s, "min_reps": 5, "max_reps": 50}
  if args.smoke:
    smoke = dict(settings.SMOKE)
    cfg.update(max_T=smoke.pop("max_T"), passes_by_row=smoke.pop("passes"), **smoke)
    timing.update(warmup=1, target_s=0.02, min_reps=2, max_reps=3)
  for key, val in (("tokens", args.tokens), ("heads", args.heads), ("dtype", args.dtype),
                   ("chunk", args.chunk)):
    if val is not None:
      cfg[key] = val
  if args.Ts == "all":
    cfg["Ts"] = settings.ALL_TS
  elif args.Ts:
    cfg["Ts"] = tuple(int(t) for t in args.Ts.split(","))
  if args.dims:
    cfg["dims"] = tuple(int(d) for d in args.dims.split(","))
  keys = args.rows.split(",") if args.rows else [s.key for s in settings.CATALOGUE]
  unknown = [k for k in keys if k not in settings.BY_KEY]
  if unknown:
    raise SystemExit(f"unknown --rows {unknown}; known: {list(settings.BY_KEY)}")
  cfg["rows"] = keys
  cfg["passes"] = tuple(args.passes.split(","))
  workers = args.compile_workers or (2 if args.smoke else 8)
  cfg.update(compile_workers=workers, cap_s=args.cap_s, budget_s=args.budget_s, sets=args.sets, smoke=args.smoke,
             no_limits=args.no_limits, timing=timing)
  return cfg


class Suite:
  """The measurement loop over (row family, d, T, pass)."""

  def __init__(self, cfg, recorder):
    self.cfg = cfg
    self.rec = recorder
    self.start = time.perf_counter()
    self._triton_path = {}
    workers = cfg["compile_workers"]
    self.pool = (concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compile")
                 if workers > 1 else None)

  def elapsed(self):
    return time.perf_counter() - self.start

  # -- availability -------------------------------------------------------------------------

  def unavailable(self, spec):
    import jax  # pylint: disable=import-outside-toplevel
    on_gpu = jax.default_backend() == "gpu"
    if spec.framework == "torch":
      if not on_gpu:
        return "no GPU"
      import torch_rows  # pylint: disable=import-outside-toplevel
      return torch_rows.available()
    if spec.framework == "triton":
      import triton_vla  # pylint: disable=import-outside-toplevel
      return triton_vla.available()
    if spec.impl == "cudnn" and not on_gpu:
      return "no GPU"
    return None

  # -- one family ---------------------------------------------------------------------------

  def run_family(self, spec, d):
    cfg = self.cfg
    print(f"# {spec.key} d={d} (t = {self.elapsed():.0f} s)", flush=True)
    H, dtype = cfg["heads"], cfg["dtype"]
    passes = [p for p in cfg["passes_by_row"].get(spec.key, spec.passes) if p in cfg["passes"]]
    max_T, max_T_reason = spec.max_T, spec.max_T_reason
    if spec.key in cfg["max_T"]:
      max_T, max_T_reason = cfg["max_T"][spec.key], "smoke: slow to compile on a CPU"
    label = spec.impl
    reason = self.unavailable(spec)
    path = None
    if reason is None and spec.framework == "triton":
      path, label, reason = self.triton_setup(spec, d)
    plan = []      # (T, B, pass, skip reason or None)
    for T in cfg["Ts"]:
      B = settings.batch_for(T, cfg["tokens"])
      for pass_ in passes:
        skip = reason
        if skip is None and max_T and T > max_T and not cfg["no_limits"]:
          skip = f"T > {max_T}: {max_T_reason}"
        if skip is None and pass_ == "fwd+bwd" and cfg["bwd_max_T"] and T > cfg["bwd_max_T"]:
          skip = f"smoke: fwd+bwd at T <= {cfg['bwd_max_T']} only"
        plan.append((T, B, pass_, skip))
    t0 = time.perf_counter()
    jobs = self.submit_compiles(spec, path, d, plan)
    # Timing starts once the family is compiled: tracing on a worker thread holds the GIL and
    # would stretch the main thread's timed calls.
    # (The smoke run overlaps them: its timings mean nothing and CI time matters.)
    if not cfg["smoke"]:
      concurrent.futures.wait(list(jobs.values()))
    if jobs:
      print(f"# {spec.key} d={d}: {len(jobs)} compiles in {time.perf_counter() - t0:.1f} s "
            f"(t = {self.elapsed():.0f} s)", flush=True)
    stopped = {}   # pass -> reason larger T are skipped
    for T, B, pass_, skip in plan:
      base = dict(impl=label, op=spec.op, T=T, B=B, H=H, d=d, dtype=dtype, tokens=B * T)
      base["pass"] = pass_
      job = jobs.pop((T, pass_), None)
      skip = skip or stopped.get(pass_)
      if skip is None and self.elapsed() > cfg["budget_s"]:
        skip = f"suite budget of {cfg['budget_s']:.0f} s spent"
      if skip is not None:
        if job is not None:
          job.cancel()
        self.rec.row(**base, status="skipped", note=skip)
        continue
      row = self.measure_row(spec, path, pass_, B, T, H, d, dtype, job)
      if spec.impl == "pallas" and spec.op == "vla":
        row["floor_ms"] = floor.floor_ms(B, T, H, d, cfg["chunk"],
                                         backward=(pass_ == "fwd+bwd"),
                                         bytes_per_elem=2 if dtype == "bfloat16" else 4)
      row = self.rec.row(**base, **row, t_s=round(self.elapsed(), 1))
      if row["status"] == "OOM":
        stopped[pass_] = f"OOM at T = {T}"
      elif row.get("over_cap"):
        stopped[pass_] = f"one call took {row['ms'] / 1e3:.1f} s at T = {T} (cap {cfg['cap_s']} s)"
    for job in jobs.values():
      job.cancel()

  def _jax_function(self, spec, path, pass_):
    import jax_rows  # pylint: disable=import-outside-toplevel
    if spec.framework == "jax":
      return jax_rows.function(spec.op, spec.impl, pass_, self.cfg["chunk"]), "vla"
    import triton_vla  # pylint: disable=import-outside-toplevel
    return triton_vla.jax_call, "vla"

  def submit_compiles(self, spec, path, d, plan):
    """Compiles a JAX family's rows on worker threads (XLA compiles outside the GIL); the main
    thread then times them one by one in order: {(T, pass): future of (executable, s)}."""
    if (not (spec.framework == "jax" or path == "jax_triton") or self.pool is None
        or self.elapsed() > self.cfg["budget_s"]):
      return {}
    import jax_rows  # pylint: disable=import-outside-toplevel
    jobs = {}
    for T, B, pass_, skip in plan:
      if skip is not None:
        continue
      fn, _ = self._jax_function(spec, path, pass_)
      op = spec.op if spec.framework == "jax" else "vla"
      backward = pass_ == "fwd+bwd" and spec.framework == "jax"

      def job(fn=fn, op=op, B=B, T=T, backward=backward):
        args = jax_rows.abstract_inputs(op, B, T, self.cfg["heads"], d, self.cfg["dtype"],
                                        backward)
        return measure.compile_jax(fn, args)
      jobs[(T, pass_)] = self.pool.submit(job)
    return jobs

  def measure_row(self, spec, path, pass_, B, T, H, d, dtype, job=None):
    cfg, tm = self.cfg, self.cfg["timing"]
    t0 = time.perf_counter()
    sets = None
    try:
      if spec.framework == "jax" or path == "jax_triton":
        import jax_rows  # pylint: disable=import-outside-toplevel
        fn, op = self._jax_function(spec, path, pass_)
        backward = pass_ == "fwd+bwd" and spec.framework == "jax"
        compiled = job.result() if job is not None else None
        sets = jax_rows.input_sets(spec.op if spec.framework == "jax" else op, B, T, H, d,
                                   jax_rows.jnp.dtype(dtype), cfg["sets"], backward)
        res = measure.time_jax(fn, sets, warmup=tm["warmup"], target_s=tm["target_s"],
                               min_reps=tm["min_reps"], max_reps=tm["max_reps"],
                               cap_s=cfg["cap_s"], compiled=compiled)
      else:
        res = self.measure_torch(spec, pass_, B, T, H, d, dtype)
      res.update(status="ok", note=None)
      if res["over_cap"]:
        res["note"] = f"one call over the {cfg['cap_s']} s cap: 1 run timed, larger T skipped"
    except Exception as err:  # pylint: disable=broad-except
      status, note = measure.classify(err)
      res = {"status": status, "note": note, "ms": None, "peak_mib": None}
    finally:
      del sets
      self.cleanup(spec)
    res["row_s"] = round(time.perf_counter() - t0, 2)
    return res

  def measure_torch(self, spec, pass_, B, T, H, d, dtype):
    cfg = self.cfg
    if spec.framework == "torch":
      import torch_rows  # pylint: disable=import-outside-toplevel
      sets = torch_rows.input_sets(B, T, H, d, dtype, cfg["sets"], pass_ == "fwd+bwd")
      make = torch_rows.make_call(pass_)
    else:  # the Triton kernel through torch
      import torch  # pylint: disable=import-outside-toplevel
      import torch_rows  # pylint: disable=import-outside-toplevel
      import triton_vla  # pylint: disable=import-outside-toplevel
      dt = torch_rows.torch_dtype(dtype)
      sets = []
      for s in range(cfg["sets"]):
        g = torch.Generator(device="cuda").manual_seed(100 * s + 1)
        rnd = lambda: torch.randn(B, T, H, d, device="cuda", generator=g)
        sets.append((rnd().to(dt), rnd().to(dt), rnd().to(dt), (rnd() / d ** 0.5).to(dt)))
      make = lambda xs: (lambda: triton_vla.torch_call(*xs))
    return measure.time_torch(make, sets, cap_s=cfg["cap_s"])

  def cleanup(self, spec):
    gc.collect()
    if spec.framework != "jax":
      try:
        import torch  # pylint: disable=import-outside-toplevel
        torch.cuda.empty_cache()
      except Exception:  # pylint: disable=broad-except
        pass

  # -- the Triton kernel: path choice and correctness check ---------------------------------

  def triton_setup(self, spec, d):
    """(path, label, skip reason or None); records one pass="check" row with the relative
    error against impl="chunked" on a small float32 shape."""
    import triton_vla  # pylint: disable=import-outside-toplevel
    if "path" not in self._triton_path:
      self._triton_path["path"], self._triton_path["why"] = triton_vla.choose_path(d)
    path, why = self._triton_path["path"], self._triton_path["why"]
    label = f"{spec.impl}({path})" if path else spec.impl
    base = dict(impl=label, op=spec.op, T=200, B=2, H=3, d=d, dtype="float32", tokens=400)
    base["pass"] = "check"
    if path is None:
      self.rec.row(**base, status="error", note=why)
      return None, label, why
    try:
      err = triton_vla.relative_error(path, d)
      print(f"triton sequential kernel ({path}), d = {d}: relative error vs impl='chunked' "
            f"= {err:.3g}", flush=True)
      ok = err < 2e-3
      self.rec.row(**base, status="ok" if ok else "error", rel_err=err,
                   note=(f"relative error vs impl='chunked' (float32) = {err:.3g}"
                         + (f"; {why}" if why else "")))
      if not ok:
        return None, label, f"kernel check failed: relative error {err:.3g}"
    except Exception as exc:  # pylint: disable=broad-except
      status, note = measure.classify(exc)
      note = note + (f"; before that, {why}" if why else "")
      self.rec.row(**base, status=status, note=note)
      return None, label, f"kernel check failed: {note}"
    return path, label, None


def main(argv=None):
  args = parse_args(argv)
  cfg = resolve(args)
  if cfg["smoke"]:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax  # pylint: disable=import-outside-toplevel
  if cfg["smoke"]:
    jax.config.update("jax_disable_most_optimizations", True)
  print(jax.devices(), flush=True)
  rec = Recorder(args.out)
  rec.header({k: v for k, v in cfg.items()})
  suite = Suite(cfg, rec)
  specs = [settings.BY_KEY[k] for k in cfg["rows"]]
  for spec, d in settings.ordered(specs, cfg["dims"]):
    try:
      suite.run_family(spec, d)
    except Exception as err:  # pylint: disable=broad-except
      status, note = measure.classify(err)
      rec.row(impl=spec.impl, op=spec.op, T=None, B=None, H=cfg["heads"], d=d,
              dtype=cfg["dtype"], status=status, note=f"family failed: {note}", **{"pass": None})
  if suite.pool is not None:
    suite.pool.shutdown(wait=False, cancel_futures=True)
  print(f"{rec.count} rows in {suite.elapsed():.1f} s -> {rec.path}", flush=True)


if __name__ == "__main__":
  main()
