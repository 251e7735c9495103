"""The benchmark suite behind BENCHMARKS.md: the measurement loop over (row, d, T, pass).

Every row is one JSON line appended to the output file as soon as it is measured (after a
header line with versions and the device). A failing row is recorded (status OOM or error)
and the suite goes on; once one call of a row takes longer than `cap_s`, its larger T are
skipped; rows not started within `budget_s` seconds are recorded as skipped. Every JAX row of
the run is compiled before the first timing, on worker threads (XLA compiles outside the GIL;
compiles of all families overlap, and no tracing, which holds the GIL, runs while a row is
timed).
"""

import concurrent.futures
import dataclasses
import gc
import time

from lab.benchmarks import floor, measure
from lab.benchmarks import rows as families


@dataclasses.dataclass
class Settings:
  """What one run measures (the defaults are the suite behind BENCHMARKS.md)."""

  rows: tuple = families.DEFAULT_ROWS
  dims: tuple = families.DIMS
  Ts: tuple = families.TS
  passes: tuple = families.PASSES
  tokens: int = families.TOKENS
  heads: int = families.HEADS
  dtype: str = "bfloat16"
  chunk: int = families.CHUNK
  sets: int = 2                 # input sets rotated between calls
  cap_s: float = 10.0
  budget_s: float = 420.0
  warmup: int = 2
  target_s: float = 0.3         # measurement time per row (reps = target / one call, 5..50)
  min_reps: int = 5
  max_reps: int = 50
  compile_workers: int = 8
  smoke: bool = False


SMOKE = dict(tokens=128, heads=2, dims=(16,), Ts=(64,), dtype="float32", chunk=16, warmup=1,
             target_s=0.02, min_reps=2, max_reps=3, compile_workers=1, smoke=True)


class Suite:
  """Runs the families of `settings` and writes rows through `recorder`."""

  def __init__(self, settings, recorder):
    self.s = settings
    self.rec = recorder
    self.start = time.perf_counter()
    workers = settings.compile_workers
    self.pool = (concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compile")
                 if workers > 1 else None)

  def elapsed(self):
    return time.perf_counter() - self.start

  def run(self):
    runs = [(families.BY_KEY[k], d) for k in self.s.rows for d in self.s.dims]
    plans, jobs = {}, {}
    t0 = time.perf_counter()
    for spec, d in runs:
      reason = self.unavailable(spec)
      plans[spec.key, d] = [(T, families.batch_for(T, self.s.tokens), p, reason)
                            for T in self.s.Ts for p in self.s.passes]
      jobs[spec.key, d] = self.submit_compiles(spec, d, plans[spec.key, d])
    pending = [job for family_jobs in jobs.values() for job in family_jobs.values()]
    if pending and not self.s.smoke:
      concurrent.futures.wait(pending)
      print(f"# {len(pending)} compiles in {time.perf_counter() - t0:.1f} s", flush=True)
    for spec, d in runs:
      try:
        self.run_family(spec, d, plans[spec.key, d], jobs[spec.key, d])
      except Exception as err:  # pylint: disable=broad-except
        status, note = measure.classify(err)
        self.rec.row(impl=spec.impl, op=spec.op, T=None, B=None, H=self.s.heads, d=d,
                     dtype=self.s.dtype, status=status, note=f"family failed: {note}",
                     **{"pass": None})
    if self.pool is not None:
      self.pool.shutdown(wait=False, cancel_futures=True)

  def unavailable(self, spec):
    import jax  # pylint: disable=import-outside-toplevel
    if spec.framework == "torch":
      return families.fla_unavailable(spec.op)
    if spec.impl == "cudnn" and jax.default_backend() != "gpu":
      return "no GPU"
    return None

  def run_family(self, spec, d, plan, jobs):
    """Times the rows of `plan` [(T, B, pass, reason to skip or None)] with their compile
    jobs {(T, pass): future}."""
    s = self.s
    print(f"# {spec.key} d={d} (t = {self.elapsed():.0f} s)", flush=True)
    stopped = {}   # pass -> why larger T are skipped
    for T, B, pass_, skip in plan:
      base = dict(impl=spec.impl, op=spec.op, T=T, B=B, H=s.heads, d=d, dtype=s.dtype,
                  tokens=B * T, **{"pass": pass_})
      job = jobs.pop((T, pass_), None)
      skip = skip or stopped.get(pass_)
      if skip is None and self.elapsed() > s.budget_s:
        skip = f"suite budget of {s.budget_s:.0f} s spent"
      if skip is not None:
        if job is not None:
          job.cancel()
        self.rec.row(**base, status="skipped", note=skip)
        continue
      row = self.measure_row(spec, pass_, B, T, d, job)
      if spec.op == "vla":
        row["floor_ms"] = floor.floor_ms(B, T, s.heads, d, s.chunk, backward=pass_ != "fwd",
                                         bytes_per_elem=2 if s.dtype == "bfloat16" else 4)
      row = self.rec.row(**base, **row, t_s=round(self.elapsed(), 1))
      if row["status"] == "OOM":
        stopped[pass_] = f"OOM at T = {T}"
      elif row.get("over_cap"):
        stopped[pass_] = f"one call took {row['ms'] / 1e3:.1f} s at T = {T} (cap {s.cap_s} s)"
    for job in jobs.values():
      job.cancel()

  def submit_compiles(self, spec, d, plan):
    """{(T, pass): future of (executable, seconds)} for a JAX family's rows."""
    if spec.framework != "jax" or self.pool is None or self.elapsed() > self.s.budget_s:
      return {}
    jobs = {}
    for T, B, pass_, skip in plan:
      if skip is not None:
        continue
      fn = families.jax_function(spec.op, spec.impl, pass_, self.s.chunk)

      def job(fn=fn, B=B, T=T, backward=pass_ != "fwd"):
        args = families.abstract_inputs(spec.op, B, T, self.s.heads, d, self.s.dtype, backward)
        return measure.compile_jax(fn, args)
      jobs[(T, pass_)] = self.pool.submit(job)
    return jobs

  def measure_row(self, spec, pass_, B, T, d, job=None):
    s = self.s
    t0 = time.perf_counter()
    sets = None
    try:
      if spec.framework == "jax":
        import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
        fn = families.jax_function(spec.op, spec.impl, pass_, s.chunk)
        sets = families.jax_input_sets(spec.op, B, T, s.heads, d, jnp.dtype(s.dtype), s.sets,
                                   pass_ != "fwd")
        res = measure.time_jax(fn, sets, warmup=s.warmup, target_s=s.target_s,
                               min_reps=s.min_reps, max_reps=s.max_reps, cap_s=s.cap_s,
                               compiled=job.result() if job is not None else None)
      else:
        sets = families.fla_input_sets(B, T, s.heads, d, s.dtype, s.sets, pass_ != "fwd",
                                       spec.op)
        guard = (families.lift_fla_gate_guard()
                 if spec.op == "gated_deltanet" and pass_ != "fwd" else None)
        res = measure.time_torch(families.fla_call(pass_, spec.op), sets, cap_s=s.cap_s)
      res.update(status="ok", note=None if spec.framework == "jax" else guard)
      if res["over_cap"]:
        res["note"] = "; ".join(filter(None, (
            res["note"], f"one call over the {s.cap_s} s cap: 1 run timed, larger T skipped")))
    except Exception as err:  # pylint: disable=broad-except
      status, note = measure.classify(err)
      res = {"status": status, "note": note, "ms": None, "peak_mib": None}
    finally:
      del sets
      gc.collect()
      if spec.framework == "torch":
        try:
          import torch  # pylint: disable=import-outside-toplevel
          torch.cuda.empty_cache()
        except Exception:  # pylint: disable=broad-except
          pass
    res["row_s"] = round(time.perf_counter() - t0, 2)
    return res
