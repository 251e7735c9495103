"""`vla_pallas`: the VLA recurrence with the state path in Pallas.

The per-chunk factors come, in the forward, from Pallas kernels: by default (config.prep="scan")
the penalty path carried through 16-token blocks by `penalty_scan.py` and the state-path
factors of `split_prep.state_prep`; or from one kernel `chunk_prep.py` (prep="kernel"), three
`split_prep.py` kernels (prep="split") or XLA (`penalty.py` + `state_path._factors`,
prep="xla"). Under differentiation the XLA path runs and its backward is used (penalty path:
autodiff or `penalty_grad.py`, config.penalty_grad; state path: the Pallas reverse pass), except
that with prep="scan" and penalty_grad="chunk" its penalty forward is the `penalty_scan.py`
kernel, which also writes the chunk-start inverses for the chunk-level penalty backward; with
penalty_grad="scan" (prep="scan" only) the same forward kernel and the reverse penalty kernel
of `penalty_scan_bwd.py` as the penalty backward; with penalty_grad="adjoint" (the default for
prep="scan") the inference path's penalty scan, and as its backward the same scan run again on
the rows' cotangents (`penalty_grad.py`)."""

import functools

import jax
import jax.numpy as jnp

from vla_jax.kernels import split_prep
from vla_jax.kernels.chunk_prep import _factor_precision, chunk_prep
from vla_jax.kernels.penalty import _spd_inverse, penalty_parallel
from vla_jax.kernels.penalty_grad import penalty_chunked_grad, penalty_scan_grad
from vla_jax.kernels.penalty_scan import _chunk_start_matrices, _penalty_segments
from vla_jax.kernels.state_path import KernelConfig, _forward_pass, state_path
from vla_jax.ops.checks import compute_dtype
from vla_jax.ops.utils import unit
from vla_jax.ops.vla.recurrence import KEY_EPS, WRITE_EPS


def _head_major(x, T_pad):
  """[B, T, H, d] -> [B, H, T_pad, d] (zero-padded in time)."""
  x = jnp.pad(x, [(0, 0), (0, T_pad - x.shape[1]), (0, 0), (0, 0)])
  return jnp.swapaxes(x, 1, 2)


def default_interpret():
  """True when the default backend is not a GPU: kernels then run in Pallas interpret mode."""
  return jax.default_backend() != "gpu"


def vla_pallas(q, k, v, u, S0, A0, *, config=KernelConfig(), interpret=None):
  """VLA (Pandey & Singh, 2026) per head:
  A_t = (A_0^-1 + sum_{s<=t} u_s u_s^T)^-1, a_t = unit(A_t khat_t),
  S_t = S_{t-1} + (v_t - S_{t-1} khat_t) a_t^T, o_t = S_t q_t.

  The per-chunk factors come from Pallas kernels (config.prep="scan", the default:
  `penalty_scan.py` + `split_prep.state_prep`; "kernel": `chunk_prep.py`; "split":
  `split_prep.py`; forward only, gradients are the XLA path's, whose penalty forward is
  `penalty_scan.py` too with prep="scan", penalty_grad="chunk" or "scan", the latter also
  with the reverse kernel `penalty_scan_bwd.py` as penalty backward) or from XLA, parallel over
  chunks (`penalty.py` and `state_path._factors`, config.prep="xla"); the state path is the
  Pallas kernel pair of `state_path.py` (forward pass and reverse pass over chunk states).
  The same algorithm runs whatever the backend; only `interpret` changes how the Pallas
  kernels execute.

  Args:
    q, k: [B, T, H, dk] queries and keys (feature-mapped), float32, bfloat16 or float64.
    v: [B, T, H, dv] values.
    u: [B, T, H, dk] penalty directions.
    S0: [B, H, dv, dk] initial memory; A0: [B, H, dk, dk] initial penalty inverse (SPD).
    config: `KernelConfig` (chunk size, value block, warps, stages, precision, refine).
    interpret: True runs the kernels in Pallas interpret mode (slow, any backend); False
      compiles them with Triton (needs a GPU); None (default) picks interpret mode exactly
      when `jax.default_backend()` is not "gpu".

  Returns:
    (o [B, T, H, dv] in v's dtype, S_T [B, H, dv, dk], A_T [B, H, dk, dk]); the states are
    float32, or float64 when any input is float64. Any T: the tail is padded with zero keys
    and zero u, which is exact.

  Raises:
    ValueError for head dims outside {16, 32, 64, 128}, chunk sizes outside 16..128 (powers
    of two) or a bad value block.
  """
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  config.validate(dk, dv)
  if interpret is None:
    interpret = default_interpret()
  if interpret != config.interpret:
    config = type(config)(**{**config.__dict__, "interpret": bool(interpret)})
  config = config.for_inputs(q, k, v, u)
  if config.prep in ("kernel", "split", "scan"):
    return _vla_prep_kernel(config, q, k, v, u, S0, A0)
  return _vla_xla_prep(config, q, k, v, u, S0, A0)


def _setup(config, acc, k, u):
  """Shared preamble: padded length, chunk count, unit keys and u head-major [B, H, T_pad, dk]."""
  C = config.chunk_size
  T_pad = -(-k.shape[1] // C) * C
  khat = _head_major(_unit_rows(k.astype(acc), KEY_EPS), T_pad)
  return T_pad, T_pad // C, khat, _head_major(u, T_pad).astype(acc)


def _unit_rows(x, eps):
  """`unit` along the last axis of x, computed on x viewed as 2-D rows [-1, d] and reshaped
  back. The same numbers; the point is the layout: on a 3-D or 4-D view XLA may give the
  per-row norms (and, under differentiation, the per-row sums of the unit VJP) a transposed
  layout. It did for the write directions' norms [B, H, T] in the gradient on an H200: a
  transpose fusion of 0.92 ms at T = 4096, B = 8, d = 64 (`experiments/profile_kernels.py`).
  A 1-D row of norms has one layout: with row views that fusion takes 0.07 ms and the gradient's
  device time fell 8.07 -> 7.39 ms."""
  return unit(x.reshape(-1, x.shape[-1]), eps).reshape(x.shape)


def _vla_xla_prep(config, q, k, v, u, S0, A0):
  """Penalty path and state-path prep in XLA (`penalty.py`, `state_path._factors`); with
  prep="scan" and penalty_grad="chunk" the penalty path is the `penalty_scan` kernel (with
  penalty_grad="scan" also its backward: `penalty_scan_bwd.py`)."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  acc = compute_dtype(q, k, v, u, S0, A0)
  T_pad, N, khat, u_h = _setup(config, acc, k, u)
  C = config.chunk_size
  chunks = lambda x: x.reshape(B, H, N, C, x.shape[-1])
  args = (chunks(khat), chunks(u_h), A0.astype(acc))
  if config.prep == "scan" and config.penalty_backward in ("chunk", "scan", "adjoint"):
    W, A_T = penalty_scan_grad(*args, config)
  elif config.penalty_backward == "chunk":
    W, A_T = penalty_chunked_grad(*args, config.newton_step, jax.lax.Precision.HIGHEST,
                                  config.solver)
  else:
    W, A_T = penalty_parallel(*args, refine=config.newton_step, precision=jax.lax.Precision.HIGHEST,
                              solver=config.solver)
  # With write_norm="kernel" the scan wrote the unit rows itself (and their VJP is its own).
  a = (W.reshape(B, H, T_pad, dk) if config.scan_unit_rows
       else _unit_rows(W.reshape(B, H, T_pad, dk), WRITE_EPS))

  flat = lambda x: x.reshape(B * H, T_pad, x.shape[-1])
  S0_r = S0.astype(acc).reshape(B * H, dv, dk)
  if config.grad_layout == "direct":    # q, v (and o, dq, dv) token-major, read in place
    pad = lambda x: x if T_pad == T else jnp.pad(x, [(0, 0), (0, T_pad - T), (0, 0), (0, 0)])
    o, S_T = state_path(pad(q), flat(khat), flat(a), pad(v), S0_r, config=config, heads=H)
    o = o[:, :T]
  else:
    o, S_T = state_path(flat(_head_major(q, T_pad)), flat(khat), flat(a),
                        flat(_head_major(v, T_pad)), S0_r, config=config)
    o = jnp.swapaxes(o.reshape(B, H, T_pad, dv), 1, 2)[:, :T]
  return o, S_T.reshape(B, H, dv, dk), A_T


def _vla_kernel_forward(config, q, k, v, u, S0, A0):
  """Forward with the per-chunk factors from the `chunk_prep` kernel (prep="kernel"), the
  three `split_prep` kernels (prep="split") or the `penalty_scan` kernel and the split
  state-prep kernel (prep="scan")."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  acc = compute_dtype(q, k, v, u, S0, A0)
  if config.prep == "scan":
    return _vla_scan_forward(config, acc, q, k, v, u, S0, A0)
  T_pad, N, khat, u_h = _setup(config, acc, k, u)
  C = config.chunk_size
  flat = lambda x: x.reshape(B * H, *x.shape[2:])
  M = _chunk_start_matrices(u_h, A0, C, acc)
  q_h = _head_major(q, T_pad)
  if config.prep == "split":
    fprec = _factor_precision(config.factor_dot, acc, config.interpret)
    kw = dict(num_warps=config.prep_warps, interpret=config.interpret)
    if config.split_inverse == "kernel" or (config.split_inverse == "auto" and dk <= 64):
      A_c = split_prep.spd_inverse(flat(M), refine=config.newton_step, factor_precision=fprec, **kw)
    else:
      A_c = _spd_inverse(flat(M), refine=config.newton_step, precision=jax.lax.Precision.HIGHEST,
                         solver=config.solver)
    Ah, A_T = split_prep.penalty_rows(A_c, flat(khat), flat(_head_major(u, T_pad)),
                                      chunk_size=C, factor_precision=fprec, **kw)
    Up, Wp, P = split_prep.state_prep(flat(khat), Ah, flat(q_h), flat(_head_major(v, T_pad)),
                                      chunk_size=C, precision=config.precision,
                                      factor_precision=fprec, **kw)
  else:
    Ah, Up, Wp, P, A_T = chunk_prep(
        flat(M), flat(khat), flat(_head_major(u, T_pad)), flat(q_h),
        flat(_head_major(v, T_pad)), chunk_size=C, precision=config.precision,
        refine=config.newton_step, prep_dot=config.factor_dot, form=config.prep_form,
        num_warps=config.prep_warps, interpret=config.interpret)
  o, S_T, _ = _forward_pass(config, flat(q_h), Ah, Up, Wp, P,
                            S0.astype(acc).reshape(B * H, dv, dk), v.dtype)
  o = jnp.swapaxes(o.reshape(B, H, T_pad, dv), 1, 2)[:, :T]
  return o, S_T.reshape(B, H, dv, dk), A_T.reshape(B, H, dk, dk)


def _vla_scan_forward(config, acc, q, k, v, u, S0, A0):
  """The prep="scan" forward: the `penalty_scan` kernel, the split state-prep kernel and the
  state kernels. With input_layout "transposed" (and "auto" that `for_inputs` left unresolved)
  they read head-major copies (unit keys and u in `acc`, made by XLA); with "direct"
  (`config.direct_inputs`; "auto" for bfloat16 inputs) the caller's [B, T, H, d] arrays in place
  (padded in time only when T is not a whole number of chunks; the kernels make the unit keys
  and write o token-major). Factors pass between kernels in `config.factor_store(acc)`."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  C = config.chunk_size
  direct = config.direct_inputs
  if direct:
    T_pad = -(-T // C) * C
    pad = lambda x: x if T_pad == T else jnp.pad(x, [(0, 0), (0, T_pad - T), (0, 0), (0, 0)])
    q_r, e, v_r, u_r = map(pad, (q, k, v, u))
    keys = e
  else:
    T_pad, _, khat, u_r = _setup(config, acc, k, u)
    flat = lambda x: x.reshape(B * H, *x.shape[2:])
    e, keys = khat, flat(khat)
    q_r, v_r = flat(_head_major(q, T_pad)), flat(_head_major(v, T_pad))
  heads = H if direct else None
  store = config.factor_store(acc)
  fprec = _factor_precision(config.factor_dot, acc, config.interpret)
  Ah, A_T = _penalty_segments(config, e, u_r, A0.astype(acc), fprec, rows_dtype=store,
                              token_major=direct)
  sfprec, sprec = config.state_prep_precisions(acc)
  Up, Wp, P = split_prep.state_prep(keys, Ah, q_r, v_r, chunk_size=C, precision=sprec,
                                    factor_precision=sfprec, num_warps=config.prep_warps,
                                    interpret=config.interpret, out_dtype=store, heads=heads,
                                    acc=acc)
  o, S_T, _ = _forward_pass(config, q_r, Ah, Up, Wp, P, S0.astype(acc).reshape(B * H, dv, dk),
                            v.dtype, heads=heads)
  o = o[:, :T] if direct else jnp.swapaxes(o.reshape(B, H, T_pad, dv), 1, 2)[:, :T]
  return o, S_T.reshape(B, H, dv, dk), A_T.reshape(B, H, dk, dk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _vla_prep_kernel(config, q, k, v, u, S0, A0):
  return _vla_kernel_forward(config, q, k, v, u, S0, A0)


def _vla_prep_kernel_fwd(config, q, k, v, u, S0, A0):
  # Under differentiation the forward runs the XLA path and keeps its residuals: the backward
  # is exactly the XLA path's (penalty autodiff or `penalty_grad.py` + the state path's custom
  # VJP), with no recomputation. Only primal (inference) calls use the prep kernels, except
  # `penalty_scan` with prep="scan", penalty_grad="chunk" (`penalty_grad.penalty_scan_grad`)
  # or "scan" (the same function, with the reverse kernel as its backward).
  out, pullback = jax.vjp(functools.partial(_vla_xla_prep, config), q, k, v, u, S0, A0)
  return out, pullback


def _vla_prep_kernel_bwd(config, pullback, cts):
  return pullback(cts)


_vla_prep_kernel.defvjp(_vla_prep_kernel_fwd, _vla_prep_kernel_bwd)
