"""The row families the benchmark suite times, their inputs and the functions timed.

  vla_pallas         `vla_recurrence(impl="pallas")` (JAX)
  attn_cudnn         `jax.nn.dot_product_attention(..., is_causal=True, implementation="cudnn")`
  fla_delta_rule     flash-linear-attention's `chunk_delta_rule` (PyTorch + Triton): keys
                     l2-normalised when the inputs are made, beta = 1, scale = 1 (o_t = S_t q_t)
Not in the default suite (--rows selects them):
  deltanet_pallas    `deltanet(impl="pallas")` (JAX; the state path's kernels, `kernels/
                     delta_rule.py`): raw keys (unit-normalised by the op), beta = 1
  gated_deltanet_pallas  `gated_deltanet(impl="pallas")`: as deltanet_pallas, plus per-token
                     log decays g = log sigmoid(N(0, 1) + GATE_SHIFT) (float32)
  fla_gated_delta_rule  flash-linear-attention's `chunk_gated_delta_rule`, inputs as
                     fla_delta_rule plus the same log decays
  vla_kernel_elimination, vla_kernel_newton
                     `vla_pallas` itself (S0 = 0, A0 = I; no op wrapper) with
                     `KernelConfig.block_factor` "elimination" or "newton": the penalty scan's
                     two block factors, timed in one run. Each vla_kernel_* row forces its
                     forms and leaves the others to the plan (`KernelConfig.plan`), so the
                     row of the form the plan picks runs the plan's kernels
  vla_kernel_start_xla, vla_kernel_start_tiles
                     the same with `KernelConfig.start_inverse` "xla" or "tiles": the
                     segment starts at d = 128 in XLA or in the kernels (at d = 64 both run
                     the kernels; starts exist where a sequence has more than one penalty-
                     scan segment, e.g. B = 1 at long T)
  vla_kernel_penalty_rows, vla_kernel_penalty_transposed
                     the same with `KernelConfig.penalty_layout` "rows" or "transposed": the
                     penalty scan's products on the block's rows or transposed (head dim on
                     the M side, the carried A the left operand), and the u-cotangent
                     kernel's E or F = E + E^T
  vla_kernel_combined
                     the same with newton, transposed and tiles together (the plan's forms
                     at d = 128; at d = 64 the plan takes the rows layout)
  state_path_triton  the state path alone (`kernels.state_path`, the generalised delta rule):
                     unit erase keys e, write keys w = unit(e + n / 2), n ~ N(0, I / d), q, v
                     read in place, e and w made head-major float32 inside the timed call (as
                     `vla_pallas` hands them), S0 = 0

Forward (`fwd`) returns o; forward + backward (`fwd+bwd`) returns o and the cotangent of
sum(o * c) pulled back to every input, c a fixed random cotangent (as in training, where o
feeds the next layer: a gradient alone would let XLA drop forward work only o needs).
"""

import dataclasses
import importlib

import numpy as np

TOKENS = 32768            # B * T per call (B = 1 once T > TOKENS)
HEADS = 16
DIMS = (64, 128)
TS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
CHUNK = 64
PASSES = ("fwd", "fwd+bwd")
# Gated DeltaNet rows: log decays log sigmoid(N(0, 1) + GATE_SHIFT), mean about -0.07 a token.
GATE_SHIFT = 3.0


@dataclasses.dataclass(frozen=True)
class RowSpec:
  """One benchmarked function family; `key` is what --rows selects."""

  key: str
  op: str                 # what is computed: vla, softmax_attention, deltanet, state_path
  impl: str               # how: pallas, cudnn, triton, ...
  framework: str          # jax or torch
  default: bool = True    # in the suite behind BENCHMARKS.md


# The `KernelConfig` options of the vla_kernel_* rows, by impl (the options not named: the
# plan's choice).
KERNEL_OPTIONS = {"kernel_elimination": {"block_factor": "elimination"},
                  "kernel_newton": {"block_factor": "newton"},
                  "kernel_start_xla": {"start_inverse": "xla"},
                  "kernel_start_tiles": {"start_inverse": "tiles"},
                  "kernel_penalty_rows": {"penalty_layout": "rows"},
                  "kernel_penalty_transposed": {"penalty_layout": "transposed"},
                  "kernel_combined": {"block_factor": "newton", "penalty_layout": "transposed",
                                      "start_inverse": "tiles"}}

CATALOGUE = (RowSpec("vla_pallas", "vla", "pallas", "jax"),
             RowSpec("attn_cudnn", "softmax_attention", "cudnn", "jax"),
             RowSpec("fla_delta_rule", "deltanet", "fla_chunk_delta_rule", "torch"),
             *(RowSpec(f"vla_{impl}", "vla", impl, "jax", default=False)
               for impl in KERNEL_OPTIONS),
             RowSpec("state_path_triton", "state_path", "triton", "jax", default=False),
             RowSpec("deltanet_pallas", "deltanet", "pallas", "jax", default=False),
             RowSpec("gated_deltanet_pallas", "gated_deltanet", "pallas", "jax", default=False),
             RowSpec("fla_gated_delta_rule", "gated_deltanet", "fla_chunk_gated_delta_rule",
                     "torch", default=False))
BY_KEY = {spec.key: spec for spec in CATALOGUE}
DEFAULT_ROWS = tuple(spec.key for spec in CATALOGUE if spec.default)


def batch_for(T, tokens=TOKENS):
  return max(1, tokens // T)


# ----------------------------------------------------------------------------- JAX rows

def jax_inputs(op, B, T, H, d, dtype, seed, backward):
  """Inputs of one call ([B, T, H, d]; VLA: q, k, v, u with unit rows u (the layer's default
  penalty_scale 1, so the calls run the kernels' path for gains <= 1, as training does); the
  state path: q, e, w, v with unit keys; DeltaNet: q, k, v, beta = 1 [B, T, H]; Gated
  DeltaNet: also the log decays [B, T, H] (float32)), plus the cotangent for forward +
  backward."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  shape = (B, T, H, d)
  normal = lambda key, scale=1.0: scale * jax.random.normal(key, shape, jnp.float32)
  if op == "state_path":
    unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    e = unit(normal(ks[1]))
    xs = tuple(x.astype(dtype) for x in (normal(ks[0]), e,
                                         unit(e + normal(ks[3], 0.5 / np.sqrt(d))),
                                         normal(ks[2])))
  else:
    xs = tuple(normal(x).astype(dtype) for x in ks[:3])
  if op == "vla":
    u = normal(ks[3])
    xs += ((u / jnp.linalg.norm(u, axis=-1, keepdims=True)).astype(dtype),)
  if op in ("deltanet", "gated_deltanet"):
    xs += (jnp.ones((B, T, H), dtype),)
  if op == "gated_deltanet":
    xs += (jax.nn.log_sigmoid(jax.random.normal(ks[3], (B, T, H), jnp.float32) + GATE_SHIFT),)
  if backward:
    xs += (jax.random.normal(ks[4], shape, jnp.float32).astype(dtype),)
  return xs


def jax_input_sets(op, B, T, H, d, dtype, n_sets, backward):
  return [jax_inputs(op, B, T, H, d, dtype, 100 * s + 1, backward) for s in range(n_sets)]


def abstract_inputs(op, B, T, H, d, dtype, backward):
  """Shapes and dtypes of one input set (no device memory)."""
  import jax  # pylint: disable=import-outside-toplevel
  return jax.eval_shape(lambda: jax_inputs(op, B, T, H, d, dtype, 1, backward))


def _state_path(chunk):
  """(q, e, w, v) -> o of the Triton `state_path` alone (S0 = 0; e and w made head-major in
  the accumulation dtype, q and v read in place)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig, state_path  # pylint: disable=import-outside-toplevel

  def fwd(q, e, w, v):
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    rows = lambda x: jnp.swapaxes(x, 1, 2).reshape(B * H, T, dk).astype(jnp.float32)
    return state_path(q, rows(e), rows(w), v, jnp.zeros((B * H, dv, dk), jnp.float32),
                      config=KernelConfig(chunk_size=chunk), heads=H)[0]
  return fwd


def _vla_kernel(chunk, options):
  """(q, k, v, u) -> o of `vla_pallas` with the `KernelConfig` options (S0 = 0, A0 = I)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig, vla_pallas  # pylint: disable=import-outside-toplevel
  cfg = KernelConfig(chunk_size=chunk, **options)

  def fwd(q, k, v, u):
    B, _, H, dk = q.shape
    dv = v.shape[-1]
    S0 = jnp.zeros((B, H, dv, dk), jnp.float32)
    A0 = jnp.broadcast_to(jnp.eye(dk, dtype=jnp.float32), (B, H, dk, dk))
    return vla_pallas(q, k, v, u, S0, A0, config=cfg)[0]
  return fwd


def jax_function(op, impl, pass_, chunk=CHUNK):
  """The function one JAX row times: fn(*inputs) -> o, or (o, cotangents)."""
  import jax  # pylint: disable=import-outside-toplevel
  from vla_jax import (deltanet, gated_deltanet,  # pylint: disable=import-outside-toplevel
                       vla_recurrence)
  if op == "vla" and impl in KERNEL_OPTIONS:
    fwd, n = _vla_kernel(chunk, KERNEL_OPTIONS[impl]), 4
  elif op == "vla":
    fwd, n = (lambda q, k, v, u: vla_recurrence(q, k, v, u, impl=impl, chunk_size=chunk)[0]), 4
  elif op == "state_path":
    fwd, n = _state_path(chunk), 4
  elif op == "deltanet":
    fwd, n = (lambda q, k, v, beta: deltanet(q, k, v, beta, impl=impl, chunk_size=chunk)[0]), 4
  elif op == "gated_deltanet":
    fwd, n = (lambda q, k, v, beta, g: gated_deltanet(q, k, v, beta, g, impl=impl,
                                                      chunk_size=chunk)[0]), 5
  elif op == "softmax_attention":
    fwd, n = (lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                           implementation=impl)), 3
  else:
    raise ValueError(f"no JAX row for op {op!r}")
  if pass_ == "fwd":
    return fwd

  def call(*args):
    o, pullback = jax.vjp(fwd, *args[:n])
    return o, pullback(args[n].astype(o.dtype))
  return call


# ----------------------------------------------------------------------------- torch rows

FLA_MODULES = {"deltanet": "fla.ops.delta_rule", "gated_deltanet": "fla.ops.gated_delta_rule"}


def fla_unavailable(op="deltanet"):
  """None when fla (its module for `op`) and a CUDA device are usable, else the reason they
  are not."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    return f"no torch ({err})"
  if not torch.cuda.is_available():
    return "no GPU"
  try:
    importlib.import_module(FLA_MODULES[op])
  except Exception as err:  # pylint: disable=broad-except
    return f"fla import failed: {type(err).__name__}: {err}"
  return None


def lift_fla_gate_guard():
  """fla 0.6 refuses the backward of its gated kernels (`chunk_bwd_dqkwg`) on Hopper GPUs with
  Triton >= 3.4 and < 3.7.1: those Triton versions compile it to wrong dq / dk (fla's issue
  640). The benchmarks' GPU image has Triton 3.6, and a timing does not read
  the gradients, so the benchmarks lift the guard for their fla Gated DeltaNet rows and say so.
  Returns the note those rows carry, or None where the guard does not apply."""
  import triton  # pylint: disable=import-outside-toplevel
  from fla.ops.common import chunk_o  # pylint: disable=import-outside-toplevel
  from fla.utils import env, hardware  # pylint: disable=import-outside-toplevel
  # env keeps the true version test; only the kernel module's copy is lifted (every call
  # asks env, so every row after the first carries the note too).
  if not (hardware.IS_NVIDIA_HOPPER and env.TRITON_ABOVE_3_4_0 and not env.TRITON_ABOVE_3_7_1):
    return None
  chunk_o.TRITON_ABOVE_3_7_1 = True
  return (f"fla's Triton guard lifted: Triton {triton.__version__} on Hopper computes fla's "
          "gated dq/dk wrongly (fla issue 640); a time only, its gradients are not used")


def fla_input_sets(B, T, H, d, dtype, n_sets, backward, op="deltanet"):
  """q, k (l2-normalised), v, beta = 1 [B, T, H] (Gated DeltaNet: then the log decays, float32,
  before beta, fla's argument order), and the cotangent of o for forward + backward."""
  import torch  # pylint: disable=import-outside-toplevel
  import torch.nn.functional as F  # pylint: disable=import-outside-toplevel
  dt = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
  sets = []
  for s in range(n_sets):
    g = torch.Generator(device="cuda").manual_seed(100 * s + 1)
    rnd = lambda: torch.randn(B, T, H, d, device="cuda", dtype=torch.float32, generator=g)
    q, v = rnd().to(dt), rnd().to(dt)
    k = F.normalize(rnd(), p=2, dim=-1).to(dt)
    xs = [q, k, v, torch.ones(B, T, H, device="cuda", dtype=dt)]
    if op == "gated_deltanet":
      noise = torch.randn(B, T, H, device="cuda", dtype=torch.float32, generator=g)
      xs.insert(3, F.logsigmoid(noise + GATE_SHIFT))
    if backward:
      for x in xs:
        x.requires_grad_(True)
      xs.append(rnd().to(dt))
    sets.append(tuple(xs))
  return sets


def fla_call(pass_, op="deltanet"):
  """inputs -> zero-argument callable running one forward (or forward + backward) of fla's
  `chunk_delta_rule` (op "deltanet") or `chunk_gated_delta_rule` ("gated_deltanet")."""
  import torch  # pylint: disable=import-outside-toplevel
  module = importlib.import_module(FLA_MODULES[op])
  fn = module.chunk_gated_delta_rule if op == "gated_deltanet" else module.chunk_delta_rule

  def make(inputs):
    if pass_ == "fwd":
      def call():
        with torch.no_grad():
          return fn(*inputs, scale=1.0)[0]
      return call
    *args, cot = inputs

    def call_bwd():
      o = fn(*args, scale=1.0)[0]
      return o, torch.autograd.grad((o.float() * cot.float()).sum(), tuple(args))
    return call_bwd
  return make
