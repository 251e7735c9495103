"""Baseline recurrences on the same generalised delta-rule core as VLA.

Each takes [B, T, H, D] inputs, an optional initial state and `impl` in {"scan",
"associative_scan", "chunked", "pallas", "pallas_interpret"} ("pallas": the Pallas kernels of
`vla_jax.kernels.delta_rule`, on the state path VLA's kernels share; `KERNEL_SUPPORT` in
`vla_jax.kernels.config` says what they take), and returns (o [B, T, H, dv] in v's dtype,
final state) with the state in float32 (float64 when an input is float64). Each takes `segment_ids` ([B, T] int
document ids, or None) for packed rows: the state restarts at 0 (by selection) at every token
whose id differs from the previous token's, the row's first document continues from the
initial state, and the final state is the last document's (see `vla_recurrence`).

- `linear_attention`: S_t = S_{t-1} + v_t phi(k_t)^T, o_t = S_t phi(q_t) [/ z_t . phi(q_t)]
  with z_t = sum_s phi(k_s) (Katharopoulos et al., 2020, arXiv 2006.16236).
- `deltanet`: S_t = S_{t-1} + beta_t (v_t - S_{t-1} khat_t) khat_t^T, o_t = S_t q_t
  (Schlag et al., 2021; Yang et al., 2024, arXiv 2406.06484).
- `gated_deltanet`: S_t = gamma_t S_{t-1} (I - beta_t khat_t khat_t^T) + beta_t v_t khat_t^T
  with gamma_t = exp(g_t), g_t <= 0 (Yang et al., 2024, arXiv 2412.06464).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from vla_jax.ops import checks, nonfinite
from vla_jax.ops.delta_rule import (delta_rule_associative_scan, delta_rule_chunked,
                                    delta_rule_scan)
from vla_jax.ops.impl import KERNEL_IMPLS, Impl, parse_impl
from vla_jax.ops.utils import (KEY_EPS, document_starts, in_first_document, resolve_precision,
                               segment_cumsum, unit)

BASELINE_IMPLS = (Impl.SCAN, Impl.ASSOCIATIVE_SCAN, Impl.CHUNKED) + KERNEL_IMPLS


class LinearAttentionState(NamedTuple):
  """S: [B, H, dv, dk] sum of v phi(k)^T; z: [B, H, dk] sum of phi(k) (the normaliser)."""

  S: jax.Array
  z: jax.Array


def elu_plus_one(x: jax.Array) -> jax.Array:
  """phi(x) = ELU(x) + 1 > 0, the feature map of Katharopoulos et al."""
  return jax.nn.elu(x) + 1.0


def _core(impl, chunk_size, precision):
  if impl is Impl.SCAN:
    core = delta_rule_scan
  elif impl is Impl.ASSOCIATIVE_SCAN:
    core = delta_rule_associative_scan
  else:
    core = lambda *args, **kw: delta_rule_chunked(*args[:6], chunk_size, *args[6:], **kw)

  def run(q, e, w, v, log_decay, S0, starts=None):
    if q.shape[1] == 0:   # no tokens: the state passes through (a scan needs one element)
      return jnp.zeros(q.shape[:3] + v.shape[-1:], v.dtype), S0
    return core(q, e, w, v, log_decay, S0, starts, precision=precision)
  return run


def _kernel_options(impl, chunk_size, precision):
  """The keyword arguments of `vla_jax.kernels.delta_rule`'s ops for `impl` "pallas" or
  "pallas_interpret" (interpret mode on any backend; "pallas" picks it off GPUs)."""
  from vla_jax.kernels import KernelConfig  # pylint: disable=import-outside-toplevel
  return dict(config=KernelConfig(chunk_size=chunk_size, precision=precision),
              interpret=True if impl is Impl.PALLAS_INTERPRET else None)


def _starts(segment_ids):
  return None if segment_ids is None else document_starts(segment_ids)


def _check_common(q, k, v, impl, chunk_size):
  impl = parse_impl(impl, BASELINE_IMPLS)
  chunk_size = checks.check_chunk_size(chunk_size)
  B, T, H, dk = checks.check_tokens("q", q)
  checks.check_tokens("k", k, batch=B, time=T, heads=H, dim=dk)
  dv = checks.check_tokens("v", v, batch=B, time=T, heads=H)[3]
  return impl, chunk_size, (B, T, H, dk, dv)


def _initial_S(initial_S, shape, dtype):
  if initial_S is None:
    return jnp.zeros(shape, dtype)
  checks.check_state("initial_state", initial_S, shape)
  return initial_S.astype(dtype)


def check_feature_map(q, k, lead):
  """The width df of feature-mapped q and k, which must be alike and keep the leading dims
  `lead` ((B, T, H) for a sequence, (B, H) for one token)."""
  if q.shape[:-1] != lead or k.shape != q.shape:
    raise ValueError(f"feature_map must map q and k to arrays of one shape {lead + ('df',)}; "
                     f"got {q.shape} and {k.shape}")
  return q.shape[-1]


def linear_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                     feature_map: Callable[[jax.Array], jax.Array] | None = elu_plus_one,
                     normalize: bool = False, eps: float = 1e-6,
                     initial_state: LinearAttentionState | None = None,
                     impl: str | Impl = "chunked", chunk_size: int = 64,
                     segment_ids: jax.Array | None = None,
                     precision: str | jax.lax.Precision | None = None
                     ) -> tuple[jax.Array, LinearAttentionState]:
  """Causal linear attention.

  Args:
    q, k: [B, T, H, dk]; v: [B, T, H, dv].
    feature_map: applied to q and k (default ELU + 1; pass `None` for raw q, k); it may change
      the last dim, dk -> df, and the state is then [.., dv, df].
    normalize: True or False (default): divide by the additive normaliser
      max(z_t . phi(q_t), eps).
    eps: the normaliser's floor, a finite number > 0 (default 1e-6; checked when concrete).
    initial_state: `LinearAttentionState` or None (zeros).
    segment_ids: [B, T] int document ids or None (module docstring); S and z restart.
    precision: of the matrix products, as for `gated_deltanet`.

  Non-finite inputs at token t leave outputs (and their gradients) before t unchanged, as
  for `gated_deltanet`.

  Returns:
    o [B, T, H, dv] in v's dtype and the final `LinearAttentionState`.

  Raises:
    ValueError / TypeError naming the argument for bad shapes or dtypes, a normalize that is
    not a bool, an eps that is not a finite number > 0, or a bad impl, chunk_size or state.
  """
  impl, chunk_size, (B, T, H, dk, dv) = _check_common(q, k, v, impl, chunk_size)
  normalize = checks.check_bool("normalize", normalize)
  checks.check_positive("eps", eps)
  segment_ids = checks.check_segment_ids(segment_ids, B, T)
  if initial_state is not None and not isinstance(initial_state, LinearAttentionState):
    raise TypeError("initial_state must be a LinearAttentionState(S, z) or None; got "
                    f"{type(initial_state).__name__}")
  dtype = checks.compute_dtype(q, k, v, *(initial_state or ()))
  out_dtype = checks.output_dtype(v)
  in_dtypes = q.dtype, k.dtype, v.dtype
  q, k, v = (x.astype(dtype) for x in (q, k, v))
  if feature_map is not None:
    q, k = feature_map(q), feature_map(k)
    dk = check_feature_map(q, k, (B, T, H))
  if initial_state is None:
    initial_state = LinearAttentionState(jnp.zeros((B, H, dv, dk), dtype),
                                         jnp.zeros((B, H, dk), dtype))
  checks.check_state("initial_state.S", initial_state.S, (B, H, dv, dk))
  checks.check_state("initial_state.z", initial_state.z, (B, H, dk))
  starts = _starts(segment_ids)
  if impl in KERNEL_IMPLS:
    # phi(q), phi(k) and v go in the caller's dtypes (bfloat16 ones: bfloat16 products at
    # precision DEFAULT), with the non-finite entries of phi(k) and v zeroed and o and the
    # state marked NaN after them, as `vla_recurrence` does (`_deltanet_kernel`); the
    # normaliser z is a prefix sum in XLA.
    from vla_jax.kernels.delta_rule import (  # pylint: disable=import-outside-toplevel
        linear_attention_pallas)
    guard, k, _, (v,) = nonfinite.contain_entries(k, writes=(v,), starts=starts)
    num, S = linear_attention_pallas(
        q.astype(in_dtypes[0]), k.astype(in_dtypes[1]), v.astype(in_dtypes[2]),
        initial_state.S.astype(dtype), segment_ids=segment_ids,
        **_kernel_options(impl, chunk_size, resolve_precision(precision)))
    z = _running_normaliser(k, initial_state.z.astype(dtype), starts)      # [B, T, H, dk]
    if normalize:
      den = jnp.sum(z * q, axis=-1)
      num = num / jnp.maximum(den, eps)[..., None]
    z_T = z[:, -1] if T else initial_state.z.astype(dtype)
    return (guard.outputs(num.astype(out_dtype)),
            LinearAttentionState(guard.state(S), guard.state(z_T)))
  guard, q, k, _, (v,) = nonfinite.contain(q, k, writes=(v,), starts=starts)
  # The normaliser z is one more value channel of constant 1: row dv of the state.
  v1 = jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), dtype)], axis=-1)
  S0 = jnp.concatenate([initial_state.S, initial_state.z[:, :, None].astype(dtype)], axis=2)
  o, S = _core(impl, chunk_size, resolve_precision(precision))(
      q, None, k, v1, None, S0.astype(dtype), starts)
  num, den = o[..., :dv], o[..., dv]
  if normalize:
    num = num / jnp.maximum(den, eps)[..., None]
  return (guard.outputs(num.astype(out_dtype)),
          LinearAttentionState(guard.state(S[:, :, :dv]), guard.state(S[:, :, dv])))


def _running_normaliser(k, z0, starts):
  """z_t = z_0 + sum_{s <= t} k_s [B, T, H, dk], restarting at 0 at document starts (the row's
  first document continues from z0 [B, H, dk])."""
  if starts is None:
    return z0[:, None] + jnp.cumsum(k, axis=1)
  first = in_first_document(starts)[:, :, None, None]
  return segment_cumsum(k, starts) + jnp.where(first, z0[:, None], jnp.zeros((), k.dtype))


def deltanet(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array, *,
             initial_state: jax.Array | None = None, impl: str | Impl = "chunked",
             chunk_size: int = 64, segment_ids: jax.Array | None = None,
             precision: str | jax.lax.Precision | None = None) -> tuple[jax.Array, jax.Array]:
  """DeltaNet with unit keys khat = k / max(||k||, 1e-6) and per-token beta.

  Args:
    q, k: [B, T, H, dk]; v: [B, T, H, dv]; beta: [B, T, H] write strengths (usually in (0, 1)).
    initial_state: S [B, H, dv, dk] or None (zeros).
    segment_ids: [B, T] int document ids or None (module docstring).
    precision: as for `gated_deltanet`.

  Returns:
    o [B, T, H, dv] in v's dtype and the final S [B, H, dv, dk].
  """
  return gated_deltanet(q, k, v, beta, None, initial_state=initial_state, impl=impl,
                        chunk_size=chunk_size, segment_ids=segment_ids, precision=precision)


def gated_deltanet(q: jax.Array, k: jax.Array, v: jax.Array, beta: jax.Array,
                   log_decay: jax.Array | None, *, initial_state: jax.Array | None = None,
                   impl: str | Impl = "chunked", chunk_size: int = 64,
                   segment_ids: jax.Array | None = None,
                   precision: str | jax.lax.Precision | None = None) -> tuple[jax.Array, jax.Array]:
  """Gated DeltaNet: a DeltaNet whose state decays by gamma_t = exp(log_decay_t) per token.

  Args:
    q, k: [B, T, H, dk]; v: [B, T, H, dv]; beta: [B, T, H]; log_decay: [B, T, H] (<= 0;
      -inf is a hard reset), or None for no decay (DeltaNet). impl="chunked" floors each
      token's log decay at 2 log(eps) of the compute dtype (a reset to working precision).
    initial_state: S [B, H, dv, dk] or None (zeros).
    segment_ids: [B, T] int document ids or None (module docstring).
    precision: of the matrix products, as for `vla_recurrence`: None (default) follows JAX's
      default matmul precision (`jax.default_matmul_precision`; unset: DEFAULT, which is
      exact float32 on CPU and one-pass TF32 on a GPU, ~1e-3 relative error); a
      `jax.lax.Precision` or 'default' / 'high' / 'highest' (also 'bfloat16' /
      'tensorfloat32' / 'float32') overrides it, as does a pair of two equal ones (an unequal
      pair is a ValueError: the products take one precision).

  A NaN or Inf at token t (in k, v, beta or log_decay; a NaN or +inf log decay) leaves the
  outputs before t and their gradients unchanged; o from t on (to the end of its document
  with `segment_ids`) and the final state are NaN. A token with a zero key writes nothing,
  whatever v and beta are (padding); a non-finite query makes its own output NaN only.

  Returns:
    o [B, T, H, dv] in v's dtype and the final S [B, H, dv, dk].

  Raises:
    ValueError for a finite positive log decay when log_decay is concrete (under jit it is
    the caller's to keep; `GatedDeltaNet` makes it <= 0 by construction).
  """
  impl, chunk_size, (B, T, H, dk, dv) = _check_common(q, k, v, impl, chunk_size)
  segment_ids = checks.check_segment_ids(segment_ids, B, T)
  checks.check_tokens("beta", beta, rank=3, batch=B, time=T, heads=H)
  if log_decay is not None:
    checks.check_tokens("log_decay", log_decay, rank=3, batch=B, time=T, heads=H)
    checks.check_log_decay(log_decay)
  dtype = checks.compute_dtype(q, k, v, beta, log_decay, initial_state)
  S0 = _initial_S(initial_state, (B, H, dv, dk), dtype)
  out_dtype = checks.output_dtype(v)
  if impl in KERNEL_IMPLS:
    return _deltanet_kernel(q, k, v, beta, log_decay, S0, segment_ids, impl, chunk_size,
                            resolve_precision(precision))
  q, k, v, beta = (x.astype(dtype) for x in (q, k, v, beta))
  gate_bad, log_decay = nonfinite.gate_breaks(
      None if log_decay is None else log_decay.astype(dtype))
  starts = _starts(segment_ids)
  guard, q, k, _, (v, beta) = nonfinite.contain(q, k, writes=(v, beta), state_bad=gate_bad,
                                                starts=starts)
  khat = unit(k, KEY_EPS)
  o, S = _core(impl, chunk_size, resolve_precision(precision))(
      q, khat, beta[..., None] * khat, v, log_decay, S0, starts)
  return guard.outputs(o.astype(out_dtype)), guard.state(S)


def _deltanet_kernel(q, k, v, beta, log_decay, S0, segment_ids, impl, chunk_size, precision):
  """`gated_deltanet` on the Pallas kernels (`vla_jax.kernels.delta_rule`): q, k and v in the
  caller's dtypes (bfloat16 ones: bfloat16 products at precision DEFAULT).

  The kernels keep a non-finite token from earlier tokens but not from the later documents of
  a packed row, and a non-finite input's own gradient may be non-finite, so they run on k, v,
  beta with their non-finite entries zeroed and a NaN or +inf log decay set to 0
  (`nonfinite.contain_entries`, the XLA forms' rules); o is marked NaN from the bad token to
  its document's end and the final state when the row's last document holds it. q goes in as
  it is: a non-finite query leaves its own output non-finite, which is marked NaN."""
  # pylint: disable-next=import-outside-toplevel
  from vla_jax.kernels.delta_rule import deltanet_pallas, gated_deltanet_pallas
  options = _kernel_options(impl, chunk_size, precision)
  if log_decay is not None and segment_ids is not None:
    raise ValueError(f"impl={impl.value!r}: the Gated DeltaNet kernel does not take "
                     "segment_ids (packed documents); use impl='chunked'")
  gate_bad, log_decay = nonfinite.gate_breaks(log_decay)
  guard, k, _, (v, beta) = nonfinite.contain_entries(k, writes=(v, beta), state_bad=gate_bad,
                                                     starts=_starts(segment_ids))
  if log_decay is None:
    o, S = deltanet_pallas(q, k, v, beta, S0, segment_ids=segment_ids, **options)
  else:
    o, S = gated_deltanet_pallas(q, k, v, beta, log_decay, S0, **options)
  return guard.outputs(o), guard.state(S)
