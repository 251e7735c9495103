"""Correctness of `vla_pallas` against a float64 reference, on the device it runs on.

Each case: fresh inputs (u isotropic, or anisotropic: a few dominant directions plus noise,
rows normalised to 1 / sqrt(d), the scale a trained layer gives, which makes M_t
ill-conditioned), the forward (o, S_T, A_T) and the gradients of a weighted sum of them with
respect to q, k, v, u, S0, compared with impl="chunked" in float64 on the same inputs (for
bfloat16 inputs, on their bfloat16 values). Relative Frobenius errors, each reported, against
a bound per (dtype, precision) on all of them (du, ill-conditioned with anisotropic u, up to
10x that) and, for float32 at HIGHEST, a bound on the forward's (o, S_T, A_T) that does not
grow with T. One row per case (pass "check"); a long run
(bfloat16 forward + backward at B = 1, H = 16) must finish, finite, without running out of
memory.

Drift cases (pass "drift"): bfloat16 inputs, u anisotropic with rows of unit norm (the layer's
default penalty scale) or isotropic with norm about sqrt(d) (penalty gains |u|^2 / lam0 of 64
to 640 at d = 64 while A is still A0: the large-gain case), A0 = I / lam0, B = 1, H = 2, long
T; the forward's o against impl="chunked" in float32 at HIGHEST (its own error ~1e-6), over the
whole sequence and per quarter of it. An anisotropic row passes when its error is within
`DRIFT_RATIO` of the isotropic row's at the same d, T and lam0 (`drift_verdicts`): the write
directions have almost no component along the dominant directions of u, the state's columns
there are never erased, and a rounding there adds up over the sequence.
"""

import dataclasses
import functools
import time

import numpy as np

from lab.benchmarks import measure

# Relative-error bounds by (dtype, precision) on every error: float32 products at HIGHEST
# ~1e-6, three-pass TF32 likewise, one-pass TF32 ~1e-3, bfloat16 inputs (bfloat16 product
# operands) ~1e-2 (1.1e-2 / 1.3e-2 in o / S at T = 131072 with anisotropic u, CPU).
BOUNDS = {("float32", "HIGHEST"): 1e-4, ("float32", "HIGH"): 1e-4,
          ("float32", "DEFAULT"): 5e-3, ("bfloat16", "DEFAULT"): 3e-2,
          ("bfloat16", "HIGHEST"): 1e-4}
# float32 at HIGH / HIGHEST with anisotropic u: du has its own conditioning (the XLA chunked
# form's du errs by 5.4e-5 at T = 131072, d = 64, CPU), the other errors stay ~1e-6.
ANISOTROPIC_BOUND = 1e-3
# du with anisotropic u, any dtype: up to this many times the dtype's bound (T = 131072,
# d = 64, CPU: float32 HIGHEST du 5.4e-5 against o 1.3e-6 (XLA chunked); bfloat16 du 0.117
# against o 1.1e-2, dk 1.2e-2).
ANISOTROPIC_DU_FACTOR = 10
# The forward (o, S_T, A_T) in float32 at HIGHEST at any T, anisotropic u included (exact
# segment starts; the XLA chunked form's level: 1.3e-6 / 1.9e-6 / 7.4e-7 at T = 131072,
# d = 64, CPU).
FORWARD_BOUNDS = {("float32", "HIGHEST"): 2e-6}
NAMES = ("o", "S", "A", "dq", "dk", "dv", "du", "dS0")
BETA_NAMES = NAMES + ("dbeta",)     # a case with a learned write strength
FORWARD = ("o", "S", "A")


@dataclasses.dataclass(frozen=True)
class Case:
  dtype: str
  precision: str
  u: str          # "isotropic" or "anisotropic"
  T: int
  d: int = 64
  B: int = 1
  H: int = 4
  chunk: int = 64
  packed: bool = False    # segment_ids: documents of PACKED_MEAN tokens on average
  beta: bool = False      # a write strength beta_t = sigmoid(normal) per token and head


# Packed cases: document starts at random tokens, about this many tokens a document.
PACKED_MEAN = 300


def default_cases(dims=(64,), max_T=16384, which="all"):
  """The check behind BENCHMARKS.md's correctness table, for each head dim (B = 1, H = 4).
  which "all": at T = min(4096, max_T) every precision (float32 at HIGHEST with isotropic and
  anisotropic u, HIGH and DEFAULT (one-pass TF32) with isotropic u, bfloat16 at DEFAULT), then
  the "long" cases; "long": only those, at max_T (when longer than 4096): anisotropic u in
  float32 at HIGHEST and in bfloat16 at DEFAULT (errors that must not grow with T); "packed"
  (also part of "all"): packed documents (`segment_ids`) at T = min(4096, max_T),
  anisotropic u in float32 at HIGHEST and bfloat16 at DEFAULT. "all" also checks a learned
  write strength (`Case.beta`) at T = min(4096, max_T), anisotropic u, in float32 at HIGHEST
  and bfloat16 at DEFAULT."""
  if which not in ("all", "long", "packed"):
    raise ValueError(f"which must be 'all', 'long' or 'packed'; got {which!r}")
  mid = min(4096, max_T)
  cases = []
  for d in dims:
    case = lambda *a: Case(*a, d=d)
    if which == "all":
      cases += [case("float32", "HIGHEST", u, mid) for u in ("isotropic", "anisotropic")]
      cases += [case("float32", "HIGH", "isotropic", mid),
                case("float32", "DEFAULT", "isotropic", mid),
                case("bfloat16", "DEFAULT", "isotropic", mid)]
      cases += [Case(dtype, precision, "anisotropic", mid, d, beta=True)
                for dtype, precision in (("float32", "HIGHEST"), ("bfloat16", "DEFAULT"))]
    if which in ("all", "packed"):
      cases += [Case(dtype, precision, "anisotropic", mid, d, packed=True)
                for dtype, precision in (("float32", "HIGHEST"), ("bfloat16", "DEFAULT"))]
    if which == "packed":
      continue
    if max_T > mid:
      cases += [case("float32", "HIGHEST", "anisotropic", max_T),
                case("bfloat16", "DEFAULT", "anisotropic", max_T)]
  return cases


# Drift cases: T, lam0, and the most an anisotropic row's error may exceed the isotropic one's.
DRIFT_TS = (16384, 131072)
DRIFT_LAM0 = (0.1, 1.0)
DRIFT_RATIO = 1.5


@dataclasses.dataclass(frozen=True)
class DriftCase:
  u: str          # "isotropic" (norm about sqrt(d)) or "anisotropic" (rows of norm 1)
  T: int
  lam0: float
  d: int = 64
  B: int = 1
  H: int = 2
  chunk: int = 64


def drift_cases(dims=(64,), Ts=DRIFT_TS):
  """Isotropic and anisotropic u at every lam0 of DRIFT_LAM0, for each head dim and T."""
  return [DriftCase(u, T, lam0, d) for d in dims for T in Ts for lam0 in DRIFT_LAM0
          for u in ("isotropic", "anisotropic")]


def smoke_cases():
  """A tiny CPU case (interpret mode): packed documents with a write strength, so the
  script's one check runs the packed path and beta too (the unpacked forward runs in the
  smoke drift pair and long run)."""
  return [Case("float32", "HIGHEST", "anisotropic", 64, 16, 1, 2, 16, packed=True, beta=True)]


def smoke_drift_cases():
  """A tiny CPU drift pair (interpret mode)."""
  return [DriftCase(u, 64, 1.0, 16, chunk=16) for u in ("isotropic", "anisotropic")]


def bound(case):
  """The bound on every error of the case (du with anisotropic u: `du_bound`)."""
  b = BOUNDS.get((case.dtype, case.precision), 3e-2)
  if case.u == "anisotropic" and case.dtype == "float32" and case.precision != "DEFAULT":
    b = max(b, ANISOTROPIC_BOUND)
  return b


def du_bound(case):
  """The bound on du's error."""
  if case.u != "anisotropic":
    return bound(case)
  return max(bound(case), ANISOTROPIC_DU_FACTOR * BOUNDS.get((case.dtype, case.precision), 3e-2))


def forward_bound(case):
  """The bound on the forward's errors (o, S_T, A_T), or None."""
  return FORWARD_BOUNDS.get((case.dtype, case.precision))


def penalty_directions(key, B, T, H, d, kind, rank=4, noise=0.01):
  """u [B, T, H, d] in float32: isotropic normal / sqrt(d), or anisotropic: per head `rank`
  fixed directions with normal weights plus `noise` times isotropic noise, rows normalised to
  1 / sqrt(d)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  k1, k2, k3 = jax.random.split(key, 3)
  if kind == "isotropic":
    return jax.random.normal(k1, (B, T, H, d), jnp.float32) / np.sqrt(d)
  basis = jax.random.normal(k1, (H, rank, d), jnp.float32)
  weights = jax.random.normal(k2, (B, T, H, rank), jnp.float32)
  u = (jnp.einsum("bthr,hrd->bthd", weights, basis, precision="highest")
       + noise * jax.random.normal(k3, (B, T, H, d), jnp.float32))
  return u / jnp.linalg.norm(u, axis=-1, keepdims=True) / np.sqrt(d)


def inputs(case, seed=0):
  """(q, k, v, u) in the case's dtype, S0 [B, H, d, d] float32, the output weights wo."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  B, T, H, d = case.B, case.T, case.H, case.d
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  q, k, v = (jax.random.normal(x, (B, T, H, d), jnp.float32) for x in ks[:3])
  u = penalty_directions(ks[3], B, T, H, d, case.u)
  S0 = jax.random.normal(ks[4], (B, H, d, d), jnp.float32) / 8
  wo = jax.random.normal(ks[5], (B, T, H, d), jnp.float32)
  dtype = jnp.dtype(case.dtype)
  return [x.astype(dtype) for x in (q, k, v, u)], S0, wo


def write_strengths(case, seed=0):
  """[B, T, H] write strengths sigmoid(normal) in the case's dtype (as the layer's
  sigmoid(W_beta x)), or None for a case without beta."""
  if not case.beta:
    return None
  import jax  # pylint: disable=import-outside-toplevel
  key = jax.random.fold_in(jax.random.PRNGKey(seed), 7)
  return jax.nn.sigmoid(jax.random.normal(key, (case.B, case.T, case.H))).astype(case.dtype)


def segment_ids(case, seed=0):
  """[B, T] int32 document ids of a packed case (starts at random tokens, one in
  PACKED_MEAN on average, and at token 1 and a chunk boundary), or None."""
  if not case.packed:
    return None
  rng = np.random.default_rng(seed)
  starts = rng.random((case.B, case.T)) < 1 / PACKED_MEAN
  starts[:, [1, min(case.chunk, case.T - 1)]] = True
  starts[:, 0] = False
  return np.cumsum(starts, axis=1).astype(np.int32)


def _loss(run):
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  def loss(*args):
    *xs, wo = args
    o, S, A = run(*xs)
    return jnp.sum(wo.astype(S.dtype) * o.astype(S.dtype)) + jnp.sum(S) + jnp.sum(A)
  return loss


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _diff_args(with_beta):
  """The differentiated arguments of run(q, k, v, u, S0, ids, beta): q, k, v, u, S0 (and
  beta)."""
  return tuple(range(5)) + ((6,) if with_beta else ())


@functools.cache
def _reference_fns(chunk, with_beta=False):
  """Jitted float64 forward (o, S, A) and gradients (q, k, v, u, S0, and with_beta beta) of
  impl="chunked" (compiled once per shape)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.ops.vla import VLAState, vla_recurrence  # pylint: disable=import-outside-toplevel

  def run(q, k, v, u, S0, ids, beta=None):
    d = q.shape[-1]
    A0 = jnp.broadcast_to(jnp.eye(d, dtype=S0.dtype), S0.shape[:2] + (d, d))
    o, st = vla_recurrence(q, k, v, u, beta, initial_state=VLAState(S0, A0), impl="chunked",
                           chunk_size=chunk, segment_ids=ids)
    return o, st.S, st.A
  return jax.jit(run), jax.jit(jax.grad(_loss(run), argnums=_diff_args(with_beta)))


# The `KernelConfig` options a check runs with (check_kernels.py's flags of the same names)
# and their defaults, None: the plan's choice (`KernelConfig.plan`); every VLA row records
# all of them (the report's row key holds them).
OPTION_DEFAULTS = {"block_factor": None, "start_inverse": None, "penalty_layout": None}


def kernel_options(options):
  """`OPTION_DEFAULTS` with `options` (a mapping of some of them) over it; an unknown name is
  an error that lists the known ones."""
  unknown = sorted(set(options) - set(OPTION_DEFAULTS))
  if unknown:
    raise ValueError(f"unknown KernelConfig options {unknown}; expected some of "
                     f"{sorted(OPTION_DEFAULTS)}")
  return {**OPTION_DEFAULTS, **options}


@functools.cache
def _pallas_fns(precision, chunk, interpret, options, with_beta=False):
  """Jitted forward and gradients (`_reference_fns`' arguments) of `vla_pallas` at A0 = I
  with `KernelConfig` options (a tuple of (name, value) pairs; compiled once per shape)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig, vla_pallas  # pylint: disable=import-outside-toplevel
  cfg = KernelConfig(chunk_size=chunk, precision=getattr(jax.lax.Precision, precision),
                     **dict(options))

  def run(q, k, v, u, S0, ids, beta=None):
    d = q.shape[-1]
    A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), S0.shape[:2] + (d, d))
    return vla_pallas(q, k, v, u, S0, A0, beta=beta, segment_ids=ids, config=cfg,
                      interpret=interpret)
  return jax.jit(run), jax.jit(jax.grad(_loss(run), argnums=_diff_args(with_beta)))


def reference(qkvu, S0, wo, chunk, ids=None, beta=None):
  """Float64 forward (o, S, A) and gradients (q, k, v, u, S0, and beta where given) of
  impl="chunked" (packed documents with ids)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  with jax.enable_x64(True):
    f64 = lambda x: None if x is None else jnp.asarray(np.asarray(x, np.float64))
    args = [f64(x) for x in (*qkvu, S0)]
    fwd, grad = _reference_fns(chunk, beta is not None)
    return ([np.asarray(x) for x in fwd(*args, ids, f64(beta))],
            [np.asarray(g) for g in grad(*args, ids, f64(beta), f64(wo))])


def check(case, interpret=None, fallback=False, **options):
  """One row: the case, its errors against float64, bound, status ("ok" or "fail");
  `vla_pallas` with the `KernelConfig` options (`OPTION_DEFAULTS`: block_factor,
  start_inverse, ...); with fallback, also "newton_fallback" (`newton_fallback_rate`; None for
  packed documents)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  options = kernel_options(options)
  t0 = time.perf_counter()
  qkvu, S0, wo = inputs(case)
  ids, beta = segment_ids(case), write_strengths(case)
  fwd, grad = _pallas_fns(case.precision, case.chunk, interpret, tuple(options.items()),
                          case.beta)
  stage = "forward"
  try:
    out = fwd(*qkvu, S0, ids, beta)
    stage = "gradient"
    grads = grad(*qkvu, S0, ids, beta, wo)
  except Exception as err:  # pylint: disable=broad-except
    return error_row(case, "check", stage, err, t0, **options)
  ref_out, ref_grads = reference(qkvu, S0, wo, case.chunk, ids, beta)
  names = BETA_NAMES if case.beta else NAMES
  got, want = (*out, *grads), (*ref_out, *ref_grads)
  assert len(got) == len(want) == len(names), (len(got), len(want), names)
  errors = dict(zip(names, [rel(x, r) for x, r in zip(got, want)]))
  finite = all(bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))) for x in (*out, *grads))
  b, fb, db = bound(case), forward_bound(case), du_bound(case)
  ok = (finite and max(e for n, e in errors.items() if n != "du") <= b and errors["du"] <= db
        and (fb is None or max(errors[n] for n in FORWARD) <= fb))
  rate = None
  if fallback and not case.packed:
    A0 = jnp.broadcast_to(jnp.eye(case.d, dtype=jnp.float32), S0.shape)
    try:
      rate = newton_fallback_rate(qkvu[1], qkvu[3], A0, case.chunk, case.precision, interpret)
    except Exception as err:  # pylint: disable=broad-except
      return error_row(case, "check", "newton_fallback", err, t0, **options, errors=errors)
  return {**dataclasses.asdict(case), "op": "vla", "impl": "pallas", "pass": "check",
          **options, "errors": errors, "bound": b, "du_bound": db,
          "forward_bound": fb, "newton_fallback": rate, "status": "ok" if ok else "fail",
          "note": None if finite else "non-finite output or gradient",
          "seconds": round(time.perf_counter() - t0, 1)}


def error_row(case, pass_, stage, err, t0, **fields):
  """The row of a case whose `stage` ("forward", "gradient", "newton_fallback") raised: a kernel
  that fails to compile or launch (such as a shared-memory request over the device's) or runs
  out of memory. status "error" or "OOM" (`measure.classify`), the message in "note"; the
  check goes on with the next case."""
  status, note = measure.classify(err)
  print(f"# {pass_} {dataclasses.asdict(case)}: {stage} raised {note}", flush=True)
  return {**dataclasses.asdict(case), "op": "vla", "impl": "pallas", "pass": pass_, **fields,
          "status": status, "stage": stage, "note": note,
          "seconds": round(time.perf_counter() - t0, 1)}


@functools.cache
def _deviation_fn(precision, chunk, interpret):
  """Jitted (k, u, A0) -> ||G - I||_F of every 16-token block of the penalty scan (as the
  differentiated forward runs it: head-major unit keys and u in float32)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import config, penalty_scan  # pylint: disable=import-outside-toplevel
  from vla_jax.ops.utils import unit  # pylint: disable=import-outside-toplevel
  from vla_jax.ops.utils import KEY_EPS  # pylint: disable=import-outside-toplevel
  cfg = KernelConfig(chunk_size=chunk, precision=getattr(jax.lax.Precision, precision))

  def deviations(k, u, A0):
    B, T, H, d = u.shape
    T_pad = -(-T // chunk) * chunk
    plan = cfg.plan(low=k.dtype == jnp.bfloat16, acc=jnp.float32, dk=d, dv=d, BH=B * H,
                    N=T_pad // chunk, interpret=interpret,
                    target=config.compile_target(interpret))
    heads = lambda x: jnp.pad(jnp.swapaxes(x.astype(jnp.float32), 1, 2),
                              [(0, 0), (0, 0), (0, T_pad - T), (0, 0)])
    uh = heads(u)
    khat = heads(unit(k.astype(jnp.float32), KEY_EPS))
    _, _, Y, A_chunks, _, _ = penalty_scan.penalty_forward(plan, khat, uh, A0, both=True)
    return penalty_scan.block_deviations(uh.reshape(B * H, T_pad, d), Y, A_chunks, plan)
  return jax.jit(deviations)


def newton_fallback_rate(k, u, A0, chunk, precision, interpret=None):
  """The fraction of the penalty scan's 16-token blocks (of the first T tokens) where
  `KernelConfig.block_factor` "newton" falls back to the elimination: ||G - I||_F >
  `NEWTON_RADIUS`, from the scan's own residuals (`penalty_scan.block_deviations`). k, u:
  [B, T, H, d]; A0: [B, H, d, d] float32."""
  import jax  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels.common import NEWTON_RADIUS  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels.config import SCAN_BLOCK  # pylint: disable=import-outside-toplevel
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  dev = np.asarray(_deviation_fn(precision, chunk, interpret)(k, u, A0))
  blocks = -(-u.shape[1] // SCAN_BLOCK)
  return float(np.mean(dev[:, :blocks] > NEWTON_RADIUS))


def long_run(T, B=1, H=16, d=64, chunk=64, interpret=None, **options):
  """A bfloat16 forward + backward at length T (`KernelConfig` options as in `check`): seconds of the first (compiling) and second call, peak device memory, finiteness (a row
  with pass "long")."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig, vla_pallas  # pylint: disable=import-outside-toplevel
  case = Case("bfloat16", "DEFAULT", "isotropic", T, d, B, H, chunk)
  qkvu, S0, wo = inputs(case, seed=7)
  A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (B, H, d, d))
  options = kernel_options(options)
  cfg = KernelConfig(chunk_size=chunk, **options)
  run = lambda q, k, v, u: vla_pallas(q, k, v, u, S0, A0, config=cfg, interpret=interpret)
  step = jax.jit(jax.value_and_grad(_loss(run), argnums=range(4)))
  times = []
  for _ in range(2):
    t0 = time.perf_counter()
    val, grads = step(*qkvu, wo)
    jax.block_until_ready(grads)
    times.append(time.perf_counter() - t0)
  stats = jax.devices()[0].memory_stats() or {}
  finite = bool(jnp.isfinite(val)) and all(bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))
                                           for g in grads)
  return {**dataclasses.asdict(case), "op": "vla", "impl": "pallas", "pass": "long",
          **options, "first_s": round(times[0], 2), "ms": 1e3 * times[1],
          "finite": finite,
          "peak_gib": stats.get("peak_bytes_in_use", 0) / 2 ** 30,
          "status": "ok" if finite else "fail"}


# ----------------------------------------------------------------------------- drift

def drift_inputs(case, seed=0):
  """(q, k, v, u) bfloat16 [B, T, H, d] with u anisotropic of unit norm or isotropic of norm
  about sqrt(d), S0 [B, H, d, d] and A0 = I / lam0 (float32)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  B, T, H, d = case.B, case.T, case.H, case.d
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k, v = (jax.random.normal(x, (B, T, H, d), jnp.float32) for x in ks[:3])
  u = penalty_directions(ks[3], B, T, H, d, case.u) * np.sqrt(d)
  S0 = jax.random.normal(ks[4], (B, H, d, d), jnp.float32) / 8
  A0 = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32) / case.lam0, (B, H, d, d))
  return [x.astype(jnp.bfloat16) for x in (q, k, v, u)], S0, A0


@functools.cache
def _drift_fns(chunk, interpret, options):
  """Jitted o of `vla_pallas` (bfloat16, DEFAULT, `KernelConfig` options as (name, value)
  pairs) and of impl="chunked" in float32 at HIGHEST, both (q, k, v, u, S0, A0) -> o
  (compiled once per shape)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig, vla_pallas  # pylint: disable=import-outside-toplevel
  from vla_jax.ops.vla import VLAState, vla_recurrence  # pylint: disable=import-outside-toplevel
  cfg = KernelConfig(chunk_size=chunk, **dict(options))

  def pallas(q, k, v, u, S0, A0):
    return vla_pallas(q, k, v, u, S0, A0, config=cfg, interpret=interpret)[0]

  def chunked(q, k, v, u, S0, A0):
    f32 = lambda x: x.astype(jnp.float32)
    return vla_recurrence(f32(q), f32(k), f32(v), f32(u), initial_state=VLAState(S0, A0),
                          impl="chunked", chunk_size=chunk, precision="highest")[0]
  return jax.jit(pallas), jax.jit(chunked)


def drift(case, interpret=None, fallback=False, **options):
  """One drift row: o's relative error against impl="chunked" in float32 at HIGHEST, over the
  sequence ("o") and per quarter of it ("o_quarters"), and whether it is finite; status is set
  by `drift_verdicts`. fallback, options: as in `check`."""
  options = kernel_options(options)
  t0 = time.perf_counter()
  qkvu, S0, A0 = drift_inputs(case)
  pallas, chunked = _drift_fns(case.chunk, interpret, tuple(options.items()))
  try:
    o = np.asarray(pallas(*qkvu, S0, A0), np.float64)
  except Exception as err:  # pylint: disable=broad-except
    return error_row(case, "drift", "forward", err, t0, dtype="bfloat16", precision="DEFAULT",
                     **options)
  ref = np.asarray(chunked(*qkvu, S0, A0), np.float64)
  quarter = case.T // 4
  quarters = [rel(o[:, i * quarter:(i + 1) * quarter], ref[:, i * quarter:(i + 1) * quarter])
              for i in range(4)]
  finite = bool(np.isfinite(o).all())
  return {**dataclasses.asdict(case), "dtype": "bfloat16", "precision": "DEFAULT",
          "op": "vla", "impl": "pallas", "pass": "drift", "reference": "chunked float32 HIGHEST",
          **options, "errors": {"o": rel(o, ref)}, "o_quarters": quarters,
          "finite": finite,
          "newton_fallback": (newton_fallback_rate(qkvu[1], qkvu[3], A0, case.chunk, "DEFAULT",
                                                   interpret) if fallback else None),
          "note": None if finite else "non-finite output",
          "seconds": round(time.perf_counter() - t0, 1)}


def drift_verdicts(rows, ratio=DRIFT_RATIO):
  """The drift rows with "ratio" (error / the isotropic row's at the same d, T, lam0) and
  "status": "ok" when finite and (anisotropic) within `ratio`, else "fail"."""
  iso = {(r["d"], r["T"], r["lam0"]): r["errors"]["o"] for r in rows
         if r["u"] == "isotropic" and "errors" in r}
  out = []
  for r in rows:
    if "errors" not in r:   # a case that raised (`error_row`) keeps its status
      out.append({**r, "ratio": None, "bound_ratio": ratio})
      continue
    base = iso.get((r["d"], r["T"], r["lam0"]))
    x = r["errors"]["o"] / base if base else None
    ok = r["finite"] and (r["u"] == "isotropic" or (x is not None and x <= ratio))
    out.append({**r, "ratio": x, "bound_ratio": ratio, "status": "ok" if ok else "fail"})
  return out


def drift_table(rows):
  """The drift rows as a Markdown table: o's error per (d, T, lam0, u), its ratio to isotropic
  u's, and per quarter of the sequence."""
  lines = ["| d | T | lam0 | u | o error | / isotropic | quarters | Newton fallback | status |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in sorted(rows, key=lambda r: (r["d"], r["T"], r["lam0"], r["u"] != "isotropic")):
    if "errors" not in r:
      lines.append(f"| {r['d']} | {r['T']} | {r['lam0']:g} | {r['u']} | - | - | - | - "
                   f"| {r['status']} ({r['stage']}) |")
      continue
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
    quarters = " ".join(f"{x:.1e}" for x in r["o_quarters"])
    rate = "-" if r.get("newton_fallback") is None else f"{r['newton_fallback']:.1%}"
    lines.append(f"| {r['d']} | {r['T']} | {r['lam0']:g} | {r['u']} | {r['errors']['o']:.2e} "
                 f"| {ratio} | {quarters} | {rate} | {r['status']} |")
  return "\n".join(lines)
