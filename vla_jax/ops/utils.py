"""Small numerical helpers shared by the recurrences."""

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def einsum(spec, *operands, precision=HIGHEST):
  """`jnp.einsum` at `precision` (default full float32: no TF32 or bf16 passes on
  accelerators; None: JAX's default matmul precision)."""
  return jnp.einsum(spec, *operands, precision=precision)


PRECISION_NAMES = {
    "default": jax.lax.Precision.DEFAULT, "fastest": jax.lax.Precision.DEFAULT,
    "bfloat16": jax.lax.Precision.DEFAULT, "high": jax.lax.Precision.HIGH,
    "tensorfloat32": jax.lax.Precision.HIGH, "highest": jax.lax.Precision.HIGHEST,
    "float32": jax.lax.Precision.HIGHEST,
}


def resolve_precision(precision) -> jax.lax.Precision:
  """The `jax.lax.Precision` of an op's matrix products.

  precision: None follows JAX's default matmul precision (`jax.default_matmul_precision`,
  read from `jax.config` when the op is traced, as `jax.numpy` does; unset means DEFAULT), a
  `jax.lax.Precision`, or one of the names JAX takes for it: 'default' / 'bfloat16' /
  'fastest', 'high' / 'tensorfloat32', 'highest' / 'float32'; or, as `jnp.matmul` takes, a
  pair (tuple or list) of two of these, one per operand, which must be equal: the ops' products
  take one precision for both operands. Dot algorithm presets ('BF16_BF16_F32',
  'bfloat16_3x', a `jax.lax.DotAlgorithmPreset`), which `jnp.matmul` also takes, are refused,
  passed or set as the default, with an error naming them.
  """
  names = ", ".join(repr(n) for n in PRECISION_NAMES)
  if isinstance(precision, (tuple, list)) and len(precision) == 2:
    first, second = (p if isinstance(p, jax.lax.Precision) else
                     PRECISION_NAMES.get(p.lower()) if isinstance(p, str) else None
                     for p in precision)
    if first is None or second is None:
      raise ValueError(f"precision as a pair must hold two jax.lax.Precision values or names "
                       f"({names}); got {precision!r}")
    if first != second:
      raise ValueError(f"precision must be one precision for both operands (the ops' "
                       f"products take one); got the pair {precision!r}: pass "
                       f"{first.name.lower()!r} or {second.name.lower()!r}, or a pair of "
                       f"equal entries")
    return first
  if precision is None:
    precision = jax.config.jax_default_matmul_precision
    if precision is None:
      return jax.lax.Precision.DEFAULT
    if not (isinstance(precision, str) and precision.lower() in PRECISION_NAMES):
      raise ValueError(f"jax.default_matmul_precision is {precision!r}, which these ops do not "
                       f"take (their products, the Pallas kernels' too, take a "
                       f"jax.lax.Precision): pass precision= to the op, or set one of {names}")
  if isinstance(precision, jax.lax.Precision):
    return precision
  if isinstance(precision, str) and precision.lower() in PRECISION_NAMES:
    return PRECISION_NAMES[precision.lower()]
  raise ValueError(f"precision must be None, a jax.lax.Precision, one of {names}, or a pair of "
                   f"two equal ones; got {precision!r}")


# The floors of `unit`: the unit keys' (khat = unit(k, KEY_EPS): VLA's, DeltaNet's and Gated
# DeltaNet's) and VLA's write directions' (a = unit(A khat, WRITE_EPS)), shared by every form
# of the ops and the kernels.
KEY_EPS = 1e-6
WRITE_EPS = 1e-12


def unit(x, eps):
  """x / ||x|| along the last axis where ||x|| > eps, else 0.

  A vector of norm at most eps (a zero key: padding) has no direction and gives zero, with a
  zero gradient (selects on both sides of the division, so no 1 / eps factor reaches the
  backward). Norms whose square overflows (|x| beyond ~1e19 in float32) are taken after
  dividing by max |x|; below that the result is x * rsqrt(||x||^2), as always.
  """
  sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
  y = x * jax.lax.rsqrt(jnp.where(sq > 0, sq, 1.0))
  m = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
  m = jnp.where(m > 0, m, 1.0)
  s = x / m                                       # the scale-safe branch, used where sq = inf
  s_sq = jnp.sum(jnp.square(s), axis=-1, keepdims=True)
  s = s * jax.lax.rsqrt(jnp.where(s_sq > 0, s_sq, 1.0))
  small = sq <= jnp.asarray(eps, x.dtype) ** 2     # NaN vectors stay NaN
  return jnp.where(small, 0.0, jnp.where(jnp.isinf(sq), s, y)).astype(x.dtype)


def to_chunks(x, chunk_size):
  """[B, T, H, ...] -> [B, H, N, C, ...], zero-padding T up to N * C."""
  b, t, h = x.shape[:3]
  n = -(-t // chunk_size)
  pad = n * chunk_size - t
  if pad:
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  x = x.reshape((b, n, chunk_size, h) + x.shape[3:])
  return jnp.moveaxis(x, 3, 1)


def from_chunks(x, length):
  """[B, H, N, C, ...] -> [B, T, H, ...], dropping padding beyond `length`."""
  b, h, n, c = x.shape[:4]
  x = jnp.moveaxis(x, 1, 3).reshape((b, n * c, h) + x.shape[4:])
  return x[:, :length]


def tril_inverse(M, *, unit_diagonal=False, precision=HIGHEST):
  """Inverse of lower-triangular matrices [..., C, C] (C a power of two) by block doubling.

  Starting from the inverted diagonal, pairs of diagonal blocks are merged,
      [[A, 0], [X, D]]^-1 = [[A^-1, 0], [-D^-1 X A^-1, D^-1]],
  for block sizes 1, 2, 4, ..., C/2: log2(C) rounds of batched matmuls and no sequential
  row loop (the merge flash-linear-attention's `solve_tril` uses above 16 x 16). Every
  intermediate is a principal sub-inverse, so entries stay as bounded as the inverse itself.
  """
  C = M.shape[-1]
  if C & (C - 1):
    raise ValueError(f"tril_inverse needs a power-of-two size; got {C}")
  batch = M.shape[:-2]
  diag = jnp.diagonal(M, axis1=-2, axis2=-1)
  inv = (jnp.ones_like(diag) if unit_diagonal else 1.0 / diag)[..., None, None]  # [..., C, 1, 1]
  s = 1
  while s < C:
    nb = C // (2 * s)
    blocks = M.reshape(batch + (nb, 2 * s, nb, 2 * s))
    blocks = jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)  # [..., nb, 2s, 2s]
    X = blocks[..., s:, :s]
    A_inv, D_inv = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
    off = -einsum("...ij,...jk,...kl->...il", D_inv, X, A_inv, precision=precision)
    top = jnp.concatenate([A_inv, jnp.zeros_like(A_inv)], axis=-1)
    bottom = jnp.concatenate([off, D_inv], axis=-1)
    inv = jnp.concatenate([top, bottom], axis=-2)
    s *= 2
  return inv[..., 0, :, :]


def spd_inverse(M, *, newton_step=False, solve=False):
  """Inverse of symmetric positive definite matrices M [..., d, d] at full float32 precision.

  M = L L^T (Cholesky of its symmetric part); L^-1 by block doubling (`tril_inverse`, batched
  products: fast for many small matrices on a GPU; d a power of two) or, with solve=True, by a
  triangular solve; A = L^-T L^-1, symmetrised. newton_step: one Newton step
  A <- A + A (I - M A), symmetrised. (The Pallas kernels' XLA segment-start inverses.)
  """
  sym = lambda x: 0.5 * (x + jnp.swapaxes(x, -1, -2))
  mm = lambda a, b: jnp.matmul(a, b, precision=HIGHEST)
  eye = jnp.eye(M.shape[-1], dtype=M.dtype)
  L = jnp.linalg.cholesky(sym(M))
  if solve:
    Linv = jax.lax.linalg.triangular_solve(L, jnp.broadcast_to(eye, L.shape), left_side=True,
                                           lower=True)
  else:
    Linv = tril_inverse(L)
  A = sym(mm(jnp.swapaxes(Linv, -1, -2), Linv))
  if newton_step:
    A = sym(A + mm(A, eye - mm(M, A)))
  return A


def document_starts(segment_ids):
  """segment_ids [B, T] int -> [B, T] bool, True at the first token of every document but the
  row's first (where the id differs from the previous token's): where a state restarts."""
  change = segment_ids[:, 1:] != segment_ids[:, :-1]
  return jnp.concatenate([jnp.zeros_like(segment_ids[:, :1], bool), change], axis=1)


def _segmented_add(earlier, later):
  f1, x1 = earlier
  f2, x2 = later
  flag = f2.reshape(f2.shape + (1,) * (x2.ndim - f2.ndim))
  return f1 | f2, jnp.where(flag, x2, x1 + x2)


def segment_cumsum(x, starts, axis=1):
  """Inclusive prefix sums of x [B, T, ...] along `axis` (the time axis, 1) that restart at the
  tokens where `starts` [B, T] bool is True (`document_starts`): a segmented
  `lax.associative_scan`, exact (no differences of running sums)."""
  return jax.lax.associative_scan(_segmented_add, (starts, x), axis=axis)[1]


def in_first_document(starts):
  """[B, T] bool: no document start at or before the token (it continues the row's first
  document, and with it any state carried in)."""
  return jnp.cumsum(starts, axis=1) == 0
