"""The Mosaic GPU state path on one Hopper GPU: accuracy against float64, then timings against the
Triton-Pallas state path and flash-linear-attention's chunk_delta_rule.

    python experiments/bench_mosaic.py --out DIR [--Ts 4096,32768,1024,16384,131072]
        [--ds 64,128] [--impls mosaic,triton,fla] [--fla_Ts 4096,32768] [--fla_ds 64]
        [--check_T 16384] [--checks bfloat16] [--reps 10] [--budget_s 300]

Rows go to DIR/bench_mosaic.jsonl (one JSON object a line, written as soon as measured).

Checks ("pass": "check"): `state_path_mosaic` on B = 1, H = 2, T = --check_T, d in --ds, against
the float64 chunked delta rule (`delta_rule_chunked` under x64, on the same inputs rounded to the
tested dtype): bfloat16 inputs with the default precision (the bfloat16 kernels; bound 1e-2) and,
with --checks float32, float32 inputs with precision=HIGHEST (the float32 path; bound 1e-5);
relative Frobenius errors of o, S_T and of the gradients of sum(o * do) + sum(S_T * dS) w.r.t.
q, e, w, v, S0 (the largest is `err_grad`).

Timings ("pass": "fwd" / "fwd_bwd" / "prep" / "chain"): H = 16, dk = dv = d, bfloat16 inputs
[B, T, H, d] (unit e; w = unit(e + n / 2) with n a random vector of norm about 1, VLA-like), S0
float32, B = max(1, 32768 // T). Every impl gets the same [B, T, H, d] arrays and returns
o [B, T, H, d] and S_T. "mosaic": `state_path_mosaic`, default precision (the bfloat16 kernels);
its "prep" rows time the chunk-factor kernel alone (`chunk_factors`) and its "chain" rows the
sequential kernel alone (`forward_chain`, on the forward's own factors); the output kernel is
the rest of "fwd". "triton": the Triton-Pallas `state_path` with its default KernelConfig; e and
w made head-major float32 inside the timed call (as `vla_pallas` hands them), q and v read in
place. "triton_xla" (not in the default list): the same with KernelConfig(grad_prep="xla").
"fla": `fla.ops.delta_rule.chunk_delta_rule` (PyTorch), e as its keys, beta = 1, scale = 1 (the
DeltaNet rule: same algorithm family and cost), at --fla_Ts x --fla_ds only and after every other
row (its first call at a shape autotunes for ~45 s): all fwd rows, then the fwd_bwd rows; skipped
when torch or fla is missing. JAX rows are compiled ahead of time (`compile_s`), called --warmup
times, then timed in --reps rounds of back-to-back calls (at least 20 ms a round) each waited
for once: `ms` is the median per call, `ms_min` the fastest round. fla rows:
`triton.testing.do_bench(..., return_mode="median")`. Rows run by T in --Ts order (the decision's
T = 4k and 32k first), both head dims per T, mosaic then triton.

No row starts after --budget_s seconds (they are written as "skipped"), and a watchdog ends
the process at --budget_s + 40 s, writing which row was running, so one run stays under six
minutes even if a kernel hangs.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # torch shares the GPU

import importlib   # noqa: E402
import inspect   # noqa: E402
import json   # noqa: E402
import statistics   # noqa: E402
import threading   # noqa: E402
import time   # noqa: E402

import jax   # noqa: E402
import jax.numpy as jnp   # noqa: E402
import numpy as np   # noqa: E402
from absl import app, flags   # noqa: E402

from vla_jax.kernels.state_path_mosaic import (chunk_factors, forward_chain,   # noqa: E402
                                              state_path_mosaic)
from vla_jax.ops.delta_rule import delta_rule_chunked   # noqa: E402

_OUT = flags.DEFINE_string("out", None, "Output folder for bench_mosaic.jsonl.", required=True)
_TS = flags.DEFINE_list("Ts", ["4096", "32768", "1024", "16384", "131072"],
                        "Sequence lengths of the mosaic and triton rows, in this order.")
_FLA_TS = flags.DEFINE_list("fla_Ts", ["4096", "32768"], "Sequence lengths of the fla rows.")
_FLA_DS = flags.DEFINE_list("fla_ds", ["64"], "Head dims of the fla rows.")
_DS = flags.DEFINE_list("ds", ["64", "128"], "Head dims (dk = dv).")
_IMPLS = flags.DEFINE_list("impls", ["mosaic", "triton", "fla"], "Implementations timed: "
                           "mosaic, triton, fla, triton_xla.")
_CHECK_T = flags.DEFINE_integer("check_T", 16384, "T of the float64 checks (0: no checks).")
_CHECKS = flags.DEFINE_list("checks", ["bfloat16"], "Input dtypes checked: bfloat16 (the "
                            "bfloat16 kernels), float32 (the float32 path at HIGHEST).")
_HEADS = flags.DEFINE_integer("heads", 16, "Heads H of the timings.")
_TOKENS = flags.DEFINE_integer("tokens", 32768, "B * T of the timings (B >= 1).")
_REPS = flags.DEFINE_integer("reps", 10, "Timed rounds per row.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls per row after compilation.")
_BUDGET = flags.DEFINE_integer("budget_s", 300, "No row starts after this many seconds.")
_INTERPRET = flags.DEFINE_bool("interpret", False, "Run the Mosaic kernels in GPU interpret "
                               "mode (a smoke test of this script on a CPU; times meaningless).")

START = time.perf_counter()
STATE = {"row": "startup"}


def elapsed():
  return time.perf_counter() - START


class Rows:
  """Appends JSON rows to DIR/bench_mosaic.jsonl and echoes them."""

  def __init__(self, folder):
    os.makedirs(folder, exist_ok=True)
    self.path = os.path.join(folder, "bench_mosaic.jsonl")
    self.lock = threading.Lock()

  def emit(self, **row):
    row["elapsed_s"] = round(elapsed(), 1)
    line = json.dumps(row, default=str)
    with self.lock, open(self.path, "a") as f:
      f.write(line + "\n")
    print(line, flush=True)


def describe(err):
  text = " ".join(f"{type(err).__name__}: {err}".split())
  return ("OOM" if "resource_exhausted" in text.lower() or "out of memory" in text.lower()
          else "error"), text[:500]


# ----------------------------------------------------------------------------- inputs

def make_inputs(seed, B, T, H, d, dtype):
  """q, e, w, v [B, T, H, d] in dtype (e unit, w = unit(e + n / 2)) and S0 [B, H, d, d] float32,
  drawn on the device."""
  keys = jax.random.split(jax.random.key(seed), 5)
  normal = lambda k, shape: jax.random.normal(k, shape, jnp.float32)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  q, v = normal(keys[0], (B, T, H, d)), normal(keys[3], (B, T, H, d))
  e = unit(normal(keys[1], (B, T, H, d)))
  w = unit(e + 0.5 * normal(keys[2], (B, T, H, d)) / np.sqrt(d))
  S0 = 0.1 * normal(keys[4], (B, H, d, d))
  return tuple(x.astype(dtype) for x in (q, e, w, v)) + (S0,)


def weighted_loss(fn, do, dS):
  def loss(*args):
    o, S = fn(*args)
    return (jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32))
            + jnp.sum(S.astype(jnp.float32) * dS))
  return loss


# ----------------------------------------------------------------------------- checks

def outputs_and_grads(fn):
  """(do, dS, *args) -> (o, S_T, and the gradients of sum(o * do) + sum(S_T * dS) w.r.t. args):
  one compiled function."""
  def run(do, dS, *args):
    (o, S), pullback = jax.vjp(fn, *args)
    return (o, S) + tuple(pullback((do.astype(o.dtype), dS)))
  return run

def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def check(rows, T, d, dtype, precision, tol):
  B, H = 1, 2
  args = make_inputs(T + d, B, T, H, d, dtype)
  k_do, k_dS = jax.random.split(jax.random.key(1))
  do = jax.random.normal(k_do, (B, T, H, d), jnp.float32).astype(dtype)   # in o's dtype
  dS = jax.random.normal(k_dS, (B, H, d, d), jnp.float32)
  fn = lambda *a: state_path_mosaic(*a, precision=precision, interpret=_INTERPRET.value)
  got = [np.asarray(x, np.float64) for x in jax.jit(outputs_and_grads(fn))(do, dS, *args)]
  with jax.enable_x64(True):
    exact = tuple(jnp.asarray(np.asarray(x, np.float64)) for x in (do, dS) + args)
    ref = lambda q, e, w, v, S0: delta_rule_chunked(q, e, w, v, None, S0, 64)
    want = [np.asarray(x) for x in jax.jit(outputs_and_grads(ref))(*exact)]
  errs = [rel(a, b) for a, b in zip(got, want)]
  ok = all(np.isfinite(errs)) and max(errs) <= tol
  rows.emit(impl="mosaic", **{"pass": "check"}, T=T, B=B, H=H, d=d,
            dtype=jnp.dtype(dtype).name, precision=precision, err_o=errs[0], err_S=errs[1],
            err_grad=max(errs[2:]), err_grads=dict(zip(("q", "e", "w", "v", "S0"), errs[2:])),
            tol=tol, status="ok" if ok else "FAIL")


# ----------------------------------------------------------------------------- timing

def time_jax(fn, args, reps, warmup):
  """(median ms per call, fastest ms per call, compile seconds)."""
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  for _ in range(warmup):
    jax.block_until_ready(compiled(*args))
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  single = time.perf_counter() - t0
  k = max(1, int(0.02 / max(single, 1e-6)))
  per_call = []
  for _ in range(reps):
    t0 = time.perf_counter()
    out = None
    for _ in range(k):
      out = compiled(*args)
    jax.block_until_ready(out)
    per_call.append((time.perf_counter() - t0) / k)
  return 1e3 * statistics.median(per_call), 1e3 * min(per_call), compile_s


def triton_state_path():
  """The Triton-Pallas state path (`state_path`, `KernelConfig`) wherever the package keeps
  it, or None."""
  for name in ("vla_jax.kernels", "vla_jax.kernels.state_path", "vla_jax.kernels.state"):
    try:
      module = importlib.import_module(name)
    except ImportError:
      continue
    fn, config = getattr(module, "state_path", None), getattr(module, "KernelConfig", None)
    if callable(fn) and config is not None:
      return fn, config
  return None


def triton_call(B, T, H, d, xla_prep=False):
  """[B, T, H, d] inputs -> (o [B, T, H, d], S_T [B, H, d, d]) through the Triton state path
  (xla_prep: with its chunk factors from XLA, as the Mosaic path's, where it has that option)."""
  found = triton_state_path()
  if found is None:
    raise ImportError("no Triton-Pallas state_path in vla_jax.kernels")
  fn, config_type = found
  config = (lambda: config_type(grad_prep="xla")) if xla_prep else config_type
  config()   # a TypeError here if the option is gone
  takes_heads = "heads" in inspect.signature(fn).parameters

  def call(q, e, w, v, S0):
    rows = lambda x: jnp.swapaxes(x, 1, 2).reshape(B * H, T, x.shape[-1])
    S0_r = S0.reshape(B * H, d, d)
    if takes_heads:   # q, v token-major, read in place (vla_pallas's layout)
      o, S_T = fn(q, rows(e).astype(jnp.float32), rows(w).astype(jnp.float32), v, S0_r,
                  config=config(), heads=H)
    else:
      o, S_T = fn(rows(q), rows(e).astype(jnp.float32), rows(w).astype(jnp.float32),
                  rows(v), S0_r, config=config())
      o = jnp.swapaxes(o.reshape(B, H, T, d), 1, 2)
    return o, S_T.reshape(B, H, d, d)
  return call


def fla_available():
  try:
    import torch  # pylint: disable=import-outside-toplevel
    if not torch.cuda.is_available():
      return "torch has no CUDA device"
    from fla.ops.delta_rule import chunk_delta_rule  # noqa: F401  pylint: disable=all
  except Exception as err:  # pylint: disable=broad-except
    return f"{type(err).__name__}: {err}"
  return None


def time_fla(args, backward):
  """Median ms of fla's chunk_delta_rule (forward, or forward + backward) on the same inputs."""
  import torch  # pylint: disable=import-outside-toplevel
  import triton  # pylint: disable=import-outside-toplevel
  from fla.ops.delta_rule import chunk_delta_rule  # pylint: disable=import-outside-toplevel
  def to_torch(x):
    try:
      return torch.from_dlpack(x)   # the same device buffer
    except Exception:  # pylint: disable=broad-except
      return torch.from_numpy(np.asarray(x, np.float32)).cuda()
  q, e, _, v, S0 = (to_torch(x) for x in args)
  q, e, v = (x.to(torch.bfloat16).contiguous() for x in (q, e, v))
  S0 = S0.float()
  beta = torch.ones(q.shape[:3], device="cuda", dtype=torch.bfloat16)
  h0 = S0.transpose(-1, -2).contiguous()   # fla's state is [B, H, dk, dv]
  kwargs = dict(scale=1.0, initial_state=h0, output_final_state=True)
  if "head_first" in inspect.signature(chunk_delta_rule).parameters:
    kwargs["head_first"] = False
  if not backward:
    def call():
      with torch.no_grad():
        return chunk_delta_rule(q, e, v, beta, **kwargs)
  else:
    for x in (q, e, v, beta, h0):
      x.requires_grad_(True)
    do = torch.randn_like(v)

    def call():
      o, _ = chunk_delta_rule(q, e, v, beta, **kwargs)
      return torch.autograd.grad((o.float() * do.float()).sum(), (q, e, v, beta, h0))
  t0 = time.perf_counter()
  call()
  torch.cuda.synchronize()
  first_s = time.perf_counter() - t0
  return triton.testing.do_bench(call, return_mode="median"), first_s


def timing_rows(rows, d, T, impls, have_fla, passes):
  H = _HEADS.value
  B = max(1, _TOKENS.value // T)
  base = dict(T=T, B=B, H=H, d=d, dtype="bfloat16")
  args = make_inputs(T, B, T, H, d, jnp.bfloat16)
  k_do, k_dS = jax.random.split(jax.random.key(2))
  do = jax.random.normal(k_do, (B, T, H, d), jnp.float32).astype(jnp.bfloat16)
  dS = jax.random.normal(k_dS, (B, H, d, d), jnp.float32)
  jobs = []
  for impl in impls:
    if impl == "mosaic":
      fn = lambda *a: state_path_mosaic(*a, interpret=_INTERPRET.value)
    elif impl in ("triton", "triton_xla"):
      try:
        fn = triton_call(B, T, H, d, xla_prep=impl == "triton_xla")
      except Exception as err:  # pylint: disable=broad-except
        status, note = describe(err)
        rows.emit(impl=impl, **{"pass": "fwd"}, **base, status=status, note=note)
        continue
    else:
      fn = None
    for pass_ in passes:
      jobs.append((impl, pass_, fn))
    if impl == "mosaic":
      jobs += [(impl, "prep", None), (impl, "chain", None)]
  for impl, pass_, fn in jobs:
    STATE["row"] = f"{impl} {pass_} d={d} T={T} B={B}"
    if elapsed() > _BUDGET.value:
      rows.emit(impl=impl, **{"pass": pass_}, **base, status="skipped", note="time budget")
      continue
    try:
      if impl == "fla":
        if have_fla is not None:
          rows.emit(impl=impl, **{"pass": pass_}, **base, status="skipped", note=have_fla)
          continue
        ms, first_s = time_fla(args, pass_ == "fwd_bwd")
        rows.emit(impl=impl, **{"pass": pass_}, **base, ms=ms, first_call_s=first_s,
                  status="ok")
        continue
      if pass_ == "prep":
        prep = lambda q, e, w, v, S0: chunk_factors(e, w, v, interpret=_INTERPRET.value)
        ms, ms_min, compile_s = time_jax(prep, args, _REPS.value, _WARMUP.value)
      elif pass_ == "chain":   # on the forward's own factors
        Wp, Ut = jax.jit(lambda e, w, v: chunk_factors(e, w, v, interpret=_INTERPRET.value))(
            *args[1:4])
        chain_args = (Wp, args[2], Ut, args[4].reshape(B * H, d, d))
        chain = lambda *a: forward_chain(*a, interpret=_INTERPRET.value)
        ms, ms_min, compile_s = time_jax(chain, chain_args, _REPS.value, _WARMUP.value)
      elif pass_ == "fwd":
        ms, ms_min, compile_s = time_jax(fn, args, _REPS.value, _WARMUP.value)
      else:
        grad = jax.grad(weighted_loss(fn, do, dS), argnums=range(5))
        ms, ms_min, compile_s = time_jax(grad, args, _REPS.value, _WARMUP.value)
      rows.emit(impl=impl, **{"pass": pass_}, **base, ms=ms, ms_min=ms_min,
                compile_s=compile_s, status="ok")
    except Exception as err:  # pylint: disable=broad-except
      status, note = describe(err)
      rows.emit(impl=impl, **{"pass": pass_}, **base, status=status, note=note)


def main(argv):
  del argv
  rows = Rows(_OUT.value)

  def watchdog():
    rows.emit(status="watchdog", note=f"stopped at {_BUDGET.value + 40} s while running "
              f"{STATE['row']}")
    os._exit(3)
  timer = threading.Timer(_BUDGET.value + 40, watchdog)
  timer.daemon = True
  timer.start()

  device = jax.devices()[0]
  have_fla = fla_available() if "fla" in _IMPLS.value else "not requested"
  rows.emit(status="header", device=device.device_kind, jax=jax.__version__,
            compute_capability=getattr(device, "compute_capability", None),
            triton_state_path=triton_state_path() is not None, fla=have_fla or "available")
  ds = [int(d) for d in _DS.value]
  if _CHECK_T.value:
    for d in ds:
      for dtype, precision, tol in ((jnp.bfloat16, "default", 1e-2),
                                    (jnp.float32, "highest", 1e-5)):
        if jnp.dtype(dtype).name not in _CHECKS.value:
          continue
        STATE["row"] = f"check d={d} {jnp.dtype(dtype).name}"
        if elapsed() > _BUDGET.value:
          continue
        try:
          check(rows, _CHECK_T.value, d, dtype, precision, tol)
        except Exception as err:  # pylint: disable=broad-except
          status, note = describe(err)
          rows.emit(impl="mosaic", **{"pass": "check"}, T=_CHECK_T.value, d=d,
                    dtype=jnp.dtype(dtype).name, status=status, note=note)
  impls = [impl for impl in _IMPLS.value if impl != "fla"]
  for T in map(int, _TS.value):   # both head dims per T: a budget stop loses the last Ts
    for d in ds:
      timing_rows(rows, d, T, impls, have_fla, ("fwd", "fwd_bwd"))
  if "fla" in _IMPLS.value:       # last: its first call at a shape autotunes (~45 s)
    for pass_ in ("fwd", "fwd_bwd"):
      for T in map(int, _FLA_TS.value):
        for d in map(int, _FLA_DS.value):
          timing_rows(rows, d, T, ["fla"], have_fla, (pass_,))
  rows.emit(status="done")
  timer.cancel()


if __name__ == "__main__":
  app.run(main)
