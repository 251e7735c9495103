"""Timing and peak-memory measurement, JAX and torch, and error classification.

JAX: the function is compiled ahead of time (`jit(f).lower(...).compile()`, so compile time is
separate), called `warmup` times, then timed two ways, rotating over 2-3 input sets: `reps`
calls each ended by `block_until_ready` (their median is `ms_sync`: it includes the host's
dispatch and the wait for the result of every call), and `rounds` rounds of k calls issued
back to back and waited for once at the end (the median of round time / k is `ms`, the figure
reported: like `triton.testing.do_bench`'s CUDA events around back-to-back launches of the
torch rows, it leaves out the per-call host latency whenever the host issues calls faster than
the device runs them; calls over half a round, 25 ms, are timed synchronously only). Peak
memory is XLA's compiled memory analysis (arguments + outputs + temporaries - aliased), which
is per call and needs no reset; where the backend reports `memory_stats()` and its
`peak_bytes_in_use` rose during the row, the runtime figure (peak - bytes in use before + input
bytes) is recorded as well.

torch: `triton.testing.do_bench(..., return_mode="median")` (which flushes the L2 cache between
calls), peak memory from `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`
(peak - allocated before + input bytes).
"""

import statistics
import time

MIB = 2.0 ** 20


def classify(err):
  """(status, note) for an exception: OOM for out-of-memory, else error."""
  text = f"{type(err).__name__}: {err}"
  low = text.lower()
  if "resource_exhausted" in low or "out of memory" in low or "outofmemory" in low:
    return "OOM", text.splitlines()[0][:300]
  return "error", " ".join(text.split())[:400]


def nbytes(tree):
  import jax  # pylint: disable=import-outside-toplevel
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def _memory_stats():
  import jax  # pylint: disable=import-outside-toplevel
  try:
    return jax.devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    return {}


def median_seconds(fn, args, *, repeats, warmup=1):
  """Median wall time of fn(*args) over `repeats` runs after `warmup` untimed calls (the first
  compiles); every call is waited for with `jax.block_until_ready`."""
  import jax  # pylint: disable=import-outside-toplevel
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def compile_jax(fn, abstract_args):
  """(executable, seconds): `jit(fn)` compiled ahead of time for these shapes. Safe to call
  from worker threads (XLA compiles outside the GIL), so the suite compiles a row family's
  lengths in parallel before timing them one by one."""
  import jax  # pylint: disable=import-outside-toplevel
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*abstract_args).compile()
  return compiled, time.perf_counter() - t0


def time_jax(fn, input_sets, *, warmup=2, target_s=0.4, min_reps=5, max_reps=50, cap_s=10.0,
             compiled=None, rounds=5, round_s=0.05, max_per_round=20):
  """Returns a dict: ms (median per call over back-to-back rounds), ms_sync (median of
  synchronous calls), reps, per_round, compile_s, peak_mib, runtime_peak_mib, over_cap.
  `compiled`: (executable, compile seconds) from `compile_jax`, or None to compile here.
  Each of `rounds` rounds issues k = min(round_s / one call, max_per_round) calls; where k
  would be below 2 (calls over round_s / 2), ms is ms_sync and per_round 1."""
  compiled, compile_s = compiled or compile_jax(fn, input_sets[0])
  import jax  # pylint: disable=import-outside-toplevel
  peak_mib = None
  try:
    ma = compiled.memory_analysis()
    peak_mib = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                - ma.alias_size_in_bytes) / MIB
  except Exception:  # pylint: disable=broad-except
    pass
  stats0 = _memory_stats()
  times = []
  for i in range(max(1, warmup)):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*input_sets[i % len(input_sets)]))
    times.append(time.perf_counter() - start)
  stats1 = _memory_stats()
  runtime_peak = None
  if stats1.get("peak_bytes_in_use", 0) > stats0.get("peak_bytes_in_use", 0):
    runtime_peak = (stats1["peak_bytes_in_use"] - stats0.get("bytes_in_use", 0)
                    + nbytes(input_sets[0])) / MIB
  warm = times[-1]
  result = {"compile_s": round(compile_s, 3), "peak_mib": peak_mib,
            "runtime_peak_mib": runtime_peak, "over_cap": warm > cap_s}
  if warm > cap_s:  # one warm call is all we take
    result.update(ms=1e3 * warm, ms_sync=1e3 * warm, reps=1, per_round=1)
    return result
  reps = int(min(max_reps, max(min_reps, target_s / max(warm, 1e-6))))
  times = []
  for i in range(reps):
    args = input_sets[i % len(input_sets)]
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  ms_sync = 1e3 * statistics.median(times)
  per_round = int(min(max_per_round, round_s / max(ms_sync / 1e3, 1e-6)))
  if per_round < 2:   # calls longer than half a round: the host's share is negligible
    result.update(ms=ms_sync, ms_sync=ms_sync, reps=reps, per_round=1)
    return result
  per_call = []
  for _ in range(rounds):
    start = time.perf_counter()
    out = None
    for i in range(per_round):
      out = compiled(*input_sets[i % len(input_sets)])
    jax.block_until_ready(out)   # one stream: the last call ends after the others
    per_call.append((time.perf_counter() - start) / per_round)
    del out
  result.update(ms=1e3 * statistics.median(per_call), ms_sync=ms_sync, reps=reps,
                per_round=per_round)
  return result


def time_torch(make_call, input_sets, *, cap_s=10.0, rep_ms=200, warmup_ms=25):
  """make_call(inputs) -> a zero-argument callable. Returns the same dict as `time_jax`."""
  import torch  # pylint: disable=import-outside-toplevel
  import triton  # pylint: disable=import-outside-toplevel
  calls = [make_call(inputs) for inputs in input_sets]
  in_bytes = sum(t.numel() * t.element_size() for t in input_sets[0] if torch.is_tensor(t))
  t0 = time.perf_counter()
  calls[0]()          # first call: Triton compilation / autotuning
  torch.cuda.synchronize()
  compile_s = time.perf_counter() - t0
  torch.cuda.reset_peak_memory_stats()
  before = torch.cuda.memory_allocated()
  start = time.perf_counter()
  calls[1 % len(calls)]()
  torch.cuda.synchronize()
  warm = time.perf_counter() - start
  peak_mib = (torch.cuda.max_memory_allocated() - before + in_bytes) / MIB
  result = {"compile_s": round(compile_s, 3), "peak_mib": peak_mib, "over_cap": warm > cap_s}
  if warm > cap_s:
    result.update(ms=1e3 * warm, reps=1)
    return result
  counter = [0]

  def rotating():
    counter[0] += 1
    return calls[counter[0] % len(calls)]()

  result["ms"] = float(triton.testing.do_bench(rotating, warmup=warmup_ms, rep=rep_ms,
                                               return_mode="median"))
  result["reps"] = counter[0]
  return result
