"""Triangular inverses from matrix products only (no `triangular_solve`).

For lower-triangular L = (I + N) diag(l), N strictly lower (nilpotent, N^C = 0):
    (I + N)^-1 = sum_k (-N)^k = prod_{j < log2 C} (I + (-N)^(2^j)),
so L^-1 = diag(1/l) (I + N)^-1 costs 2 log2(C) - 1 batched C x C products, which XLA runs as
plain matmuls (batched small `triangular_solve` calls are slow on GPUs).

`solver="doubling"` uses `vla_jax.ops.utils.tril_inverse` instead: block doubling (merge pairs
of diagonal blocks of sizes 1, 2, ..., C/2; log2 C rounds of batched products, always at
HIGHEST precision), whose intermediates are principal sub-inverses (bounded like the inverse).
"""

import functools

import jax
import jax.numpy as jnp

from vla_jax.ops.utils import tril_inverse

SOLVERS = ("triangular_solve", "nilpotent", "doubling")


def tri_inverse(L, *, unit_diagonal, precision):
  """Inverse of lower-triangular L [..., C, C] (unit diagonal assumed when asked)."""
  C = L.shape[-1]
  eye = jnp.eye(C, dtype=L.dtype)
  diag = None if unit_diagonal else jnp.diagonal(L, axis1=-2, axis2=-1)
  X = -jnp.tril(L if diag is None else L / diag[..., None, :], -1)   # -N
  inv, power, k = eye + X, X, 2
  while k < C:
    power = jnp.matmul(power, power, precision=precision)             # (-N)^k
    inv = inv + jnp.matmul(inv, power, precision=precision)           # inv (I + (-N)^k)
    k *= 2
  return inv if diag is None else inv / diag[..., :, None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def tril_inverse_products(L, unit_diagonal, precision):
  """`tril_inverse` (block doubling) with a two-product backward pass: for Z = L^-1 and its
  cotangent Zbar, Lbar = -Z^T Zbar Z^T restricted to the entries L varies in (the lower
  triangle, strictly lower for a unit diagonal). Autodiff would instead retrace every doubling
  round. L [..., C, C], C a power of two."""
  return tril_inverse(L, unit_diagonal=unit_diagonal)


def _tril_inverse_fwd(L, unit_diagonal, precision):
  Z = tril_inverse(L, unit_diagonal=unit_diagonal)
  return Z, Z


def _tril_inverse_bwd(unit_diagonal, precision, Z, Zbar):
  mm = functools.partial(jnp.matmul, precision=precision)
  Zt = jnp.swapaxes(Z, -1, -2)
  return (-jnp.tril(mm(mm(Zt, Zbar), Zt), -1 if unit_diagonal else 0),)


tril_inverse_products.defvjp(_tril_inverse_fwd, _tril_inverse_bwd)
