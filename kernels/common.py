"""Helpers shared by the VLA kernels: products, masks, small factorisations, block specs.

Everything here runs inside a Pallas (Triton) kernel body (and on any backend in interpret
mode): values are whole 2-D tiles, never sliced, and masks are built from iotas.

Non-finite inputs. A NaN or Inf at token t must reach outputs at tokens >= t only. Products
inside a chunk mix its tokens, and a masked product formed by multiplication lets a later row
into an earlier one (0 * NaN = NaN). Every product whose right operand holds rows of later
tokens therefore takes that operand through `finite` (non-finite entries enter as zeros);
`causal_dot` also marks the rows from the first non-finite one on as NaN, so what is later
stays non-finite. For finite inputs both are the identity (bit for bit).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

BF16 = jax.lax.DotAlgorithmPreset.BF16_BF16_F32


# ----------------------------------------------------------------------------- products

def dot(a, b, *, ta=False, tb=False, precision, out=None):
  """(a or a^T) @ (b or b^T) of 2-D tiles, in a's dtype (or `out`). `precision` is a
  `jax.lax.Precision` or a `DotAlgorithmPreset` (`dot_precision`); with `BF16` the operands
  are rounded to bfloat16 here, so that interpret mode computes what the GPU computes, and the
  sums stay float32."""
  dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
  out = a.dtype if out is None else out
  if precision == BF16:
    a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=out)


def split_operand(x, precision):
  """The parts of a float32 value x that products of `precision` take as one operand without
  losing x's accuracy: with `BF16`, (hi, lo) in bfloat16, hi = x rounded and lo = x - hi (exact
  in float32) rounded, so that hi + lo is x to ~2^-17 of each entry (one bfloat16 operand
  rounds by 2^-9); else (x,)."""
  if precision != BF16:
    return (x,)
  hi = x.astype(jnp.bfloat16)
  return hi, (x - hi.astype(x.dtype)).astype(jnp.bfloat16)


def dot_parts(a, parts, *, precision):
  """a @ x for x given as the parts of `split_operand` (the sum of one product per part), in
  a's dtype."""
  y = dot(a, parts[0], precision=precision)
  for p in parts[1:]:
    y = y + dot(a, p, precision=precision)
  return y


def parts_dot(parts, b, *, tb=False, precision):
  """x @ (b or b^T) for x given as the parts of `split_operand` (the left operand: the sum of
  one product per part), in b's dtype."""
  y = dot(parts[0], b, tb=tb, precision=precision, out=b.dtype)
  for p in parts[1:]:
    y = y + dot(p, b, tb=tb, precision=precision, out=b.dtype)
  return y


def dot_precision(kind, acc, interpret):
  """The `precision` argument of `dot` for products of kind "bf16" (bfloat16 operands, float32
  sums), "tf32" (one TF32 pass), "tf32x3" (three TF32 passes, about float32 accuracy) or "ieee"
  (float32 on CUDA cores). Float64 and "ieee" are `Precision.HIGHEST` everywhere; interpret
  mode runs the TF32 kinds at HIGHEST too (the CPU has no TF32) and emulates "bf16"."""
  if acc == jnp.float64 or kind == "ieee":
    return jax.lax.Precision.HIGHEST
  if kind == "bf16":
    return BF16
  if interpret:
    return jax.lax.Precision.HIGHEST
  if kind == "tf32x3":
    return jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
  if kind == "tf32":
    return jax.lax.DotAlgorithmPreset.TF32_TF32_F32
  raise ValueError(f"unknown product kind {kind!r}")


def compiler_params(num_warps, num_stages=1):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


# ----------------------------------------------------------------------------- masks

def iota(n):
  """(row index [n, n], column index [n, n], index [n]) as int32."""
  return (jax.lax.broadcasted_iota(jnp.int32, (n, n), 0),
          jax.lax.broadcasted_iota(jnp.int32, (n, n), 1),
          jax.lax.broadcasted_iota(jnp.int32, (n,), 0))


def eye(n, dtype):
  r, c, _ = iota(n)
  return jnp.where(r == c, 1.0, 0.0).astype(dtype)


def finite(x):
  """x with its non-finite entries replaced by zeros (a select, not a product)."""
  return jnp.where(jnp.abs(x) < jnp.inf, x, 0.0)


def causal_dot(m, x, precision):
  """m @ x for m [n, n] zero above its diagonal (set by a select) and rows x [n, d], where a
  non-finite row j of x reaches rows >= j only: x enters through `finite`, and the rows from
  x's first non-finite row on are NaN (as a sequential pass would leave them)."""
  ok = jnp.abs(x) < jnp.inf
  y = dot(m, jnp.where(ok, x, 0.0), precision=precision)
  n = x.shape[0]
  row_ok = jnp.min(jnp.where(ok, 1.0, 0.0), axis=1)                      # [n]
  first = jnp.min(jnp.where(row_ok > 0, n, iota(n)[2]))                   # first bad row, or n
  return jnp.where(iota(n)[2][:, None] >= first, jnp.nan, y)


# ----------------------------------------------------------------------------- rows

def unit_rows(x, eps):
  """Rows of x [n, d] divided by their norm where it exceeds eps, zero rows elsewhere:
  `vla_jax.ops.utils.unit` in a kernel. A row whose squared norm overflows float32 (entries
  beyond ~1e19) becomes NaN, not zero: the XLA forms rescale such rows, which here cost 11% of
  the bf16 forward (d = 64, T = 4096, H200), so the kernel reports them instead of dropping
  the token. NaN rows stay NaN."""
  sq = jnp.sum(x * x, axis=1)[:, None]
  y = jnp.where(sq == jnp.inf, jnp.nan, x * jax.lax.rsqrt(jnp.where(sq > 0, sq, 1.0)))
  return jnp.where(sq <= eps ** 2, 0.0, y)


def unit_rows_vjp(w, da, eps):
  """Cotangent of w [n, d] under a = unit_rows(w, eps) given da, the cotangent of a:
  dw = (da - a (a . da)) / |w| where |w| > eps, zero elsewhere (the zero rows of padding
  have no direction and no gradient)."""
  sq = jnp.sum(w * w, axis=1)[:, None]
  inv = jnp.where(sq == jnp.inf, jnp.nan, jax.lax.rsqrt(jnp.where(sq > 0, sq, 1.0)))
  a = w * inv
  along = jnp.sum(a * da, axis=1)[:, None]
  return jnp.where(sq <= eps ** 2, 0.0, inv * (da - along * a))


# ----------------------------------------------------------------------------- factorisations

def chol_inv(g):
  """L^-1 for g = L L^T (g [n, n] symmetric positive definite), by n elimination steps on the
  whole matrix: step j takes column j of the Schur complement, l = col / sqrt(pivot) (column j
  of L), removes l l^T, and applies the elementary inverse to Z (from I): row j of Z is divided
  by l_j, then rows i > j lose l_i times it. Carries two [n, n] values. Row i of L^-1 depends on
  rows <= i of g only: the new row j enters the update through `finite`."""
  n = g.shape[0]
  r, c, v = iota(n)

  def body(j, carry):
    g, z_mat = carry
    col = jnp.sum(jnp.where(c == j, g, 0.0), axis=1)               # g[:, j]
    inv_piv = jax.lax.rsqrt(jnp.sum(jnp.where(v == j, col, 0.0)))  # 1 / sqrt(g[j, j])
    l = jnp.where(v > j, col * inv_piv, 0.0)                       # L[i, j], i > j
    z = jnp.sum(jnp.where(r == j, z_mat, 0.0), axis=0) * inv_piv   # new row j of Z
    g = g - l[:, None] * l[None, :]
    z_mat = jnp.where(r == j, z[None, :], z_mat - l[:, None] * finite(z)[None, :])
    return g, z_mat

  return jax.lax.fori_loop(0, n, body, (g, eye(n, g.dtype)))[1]


def newton_chol_inv(g, precision):
  """L^-1 for g = L L^T (g [n, n] symmetric positive definite near I) by Newton steps on the
  lower triangular Z with Z g Z^T = I: from Z = I - low(g - I), Z <- Z - low(Z g Z^T - I) Z,
  where low(E) is E's strict lower part plus half its diagonal (the first-order lower factor
  of I + E). Each step squares the residual Z g Z^T - I: with ||g - I||_F <= `NEWTON_RADIUS`
  two steps leave <= 4.4e-8 relative error in float64 arithmetic (blocks of the penalty scan,
  u of norm 1 / sqrt(d) and 1, lam0 0.1 to 10; 1.9e-9 on a random g at 0.23), float32
  rounding in float32; float64 takes a third step. `guarded_chol_inv` keeps `chol_inv` for
  the rest. Six [n, n] products (nine in float64) instead of n dependent elimination steps.
  Every row depends on every row of g (products): a non-finite g must go to `chol_inv`."""
  n = g.shape[0]
  r, c, _ = iota(n)
  one = eye(n, g.dtype)
  low = lambda e: jnp.where(r > c, e, jnp.where(r == c, 0.5 * e, 0.0))
  z = one - low(g - one)
  for _ in range(3 if g.dtype == jnp.float64 else 2):
    e = dot(dot(z, g, precision=precision), z, tb=True, precision=precision) - one
    z = z - dot(low(e), z, precision=precision)
  return z


# The largest ||g - I||_F at which `guarded_chol_inv` takes the Newton steps.
NEWTON_RADIUS = 0.25


def guarded_chol_inv(g, precision):
  """L^-1 for g = L L^T: `newton_chol_inv` where ||g - I||_F <= NEWTON_RADIUS, else (and for
  a non-finite g) `chol_inv`. The test is one scalar per value: the branch is uniform over the
  program's threads."""
  dev = g - eye(g.shape[0], g.dtype)
  near = jnp.sum(jnp.sum(dev * dev, axis=1)) <= NEWTON_RADIUS ** 2   # False for NaN or Inf
  return jax.lax.cond(near, lambda x: newton_chol_inv(x, precision), chol_inv, g)


def unit_tril_inv(nm, precision):
  """(I + nm)^-1 for strictly lower nm [n, n] (n a power of two), by block doubling: with inv
  block diagonal in s x s blocks (the inverse restricted to them), the 2s x 2s blocks' inverse
  is inv - inv N_s inv, N_s = nm on the (lower, upper) halves of each 2s-block (the merge of
  `vla_jax.ops.utils.tril_inverse`, with masks instead of slices). Row i depends on rows <= i
  of nm: nm enters through `finite`, and rows from its first non-finite row on are NaN."""
  n = nm.shape[0]
  r, c, v = iota(n)
  ok = jnp.abs(nm) < jnp.inf
  first = jnp.min(jnp.where(jnp.min(jnp.where(ok, 1.0, 0.0), axis=1) > 0, n, v))
  nm = jnp.where(ok, nm, 0.0)
  inv = (jnp.where(r == c, 1.0, 0.0).astype(nm.dtype)                  # 2 x 2 blocks
         + jnp.where((r == c + 1) & (r % 2 == 1), -nm, 0.0))
  s = 2
  while s < n:
    m = 2 * s
    mask = (r // m == c // m) & (r % m >= s) & (c % m < s)
    inv = inv - dot(dot(inv, jnp.where(mask, nm, 0.0), precision=precision), inv,
                    precision=precision)
    s = m
  return jnp.where(v[:, None] >= first, jnp.nan, inv)


# ----------------------------------------------------------------------------- documents

def doc_masks(rel):
  """Masks of one chunk of packed documents from rel [C] int32, the chunk-relative document
  index (0: the document running at the chunk start; k > 0: the k-th document that starts
  inside the chunk; `vla.document_indices`): (same [C, C], row and column token in one
  document; first [C, 1], rel = 0: the token continues from the chunk-start state; last
  [C, 1], the chunk's last document, whose tokens reach the chunk-end state; keep, a scalar:
  no document starts in the chunk, so the chunk-start state reaches its end)."""
  top = jnp.max(rel)
  col = rel[:, None]
  return col == rel[None, :], col == 0, col == top, top == 0


# ----------------------------------------------------------------------------- decays

def decay_factors(g):
  """Decays of one chunk of Gated DeltaNet from g [C], the cumulative log decays G_i (the sum
  of the chunk's per-token log decays up to token i, each floored: `delta_rule.py`):
  (D [C, C] = exp(G_i - G_j) for i >= j, else 0; gam [C, 1] = exp(G_i), the decay from the
  chunk start to token i; rest [C, 1] = exp(G_C - G_i), from token i to the chunk end;
  last, a scalar exp(G_C), over the whole chunk). The log decays are <= 0, so G is
  non-increasing: G_C = min G, and every factor is at most 1."""
  n = g.shape[0]
  r, c, _ = iota(n)
  diff = g[:, None] - g[None, :]
  D = jnp.where(r >= c, jnp.exp(jnp.where(r >= c, diff, 0.0)), 0.0)
  end = jnp.min(g)
  return D, jnp.exp(g)[:, None], jnp.exp(end - g)[:, None], jnp.exp(end)


# ----------------------------------------------------------------------------- block specs

def doc_spec(rows, time=lambda i, j: j):
  """BlockSpec of `rows` consecutive entries of sequence i's [B * H, T] document indices."""
  return pl.BlockSpec((None, rows), lambda i, j: (i, time(i, j)))


def rows_spec(rows, d, heads=None, time=lambda i, j: j, feature=lambda i, j: 0):
  """BlockSpec of `rows` consecutive tokens of sequence i (grid point (i, j)) and `d` features.

  A per-token array is head-major [B * H, T, d] (heads=None) or the caller's token-major
  [B, T, H, d] read in place (heads=H: a block of one head's rows has stride H * d); inside
  the kernel both are the same [rows, d] ref. time(i, j), feature(i, j): the block indices
  along T and along the features."""
  if heads is None:
    return pl.BlockSpec((None, rows, d), lambda i, j: (i, time(i, j), feature(i, j)))
  return pl.BlockSpec((None, rows, None, d),
                      lambda i, j: (i // heads, time(i, j), i % heads, feature(i, j)))


def head_rows(x, heads):
  """A token-major [B, T, H, d] array as head-major rows [B * H, T, d] (heads=H; an XLA
  transpose), or x itself (heads=None)."""
  if heads is None:
    return x
  B, T, H, d = x.shape
  return jnp.swapaxes(x, 1, 2).reshape(B * H, T, d)


def token_rows(x, heads):
  """The inverse of `head_rows`: [B * H, T, d] -> [B, T, H, d] (heads=H), or x."""
  if heads is None:
    return x
  BH, T, d = x.shape
  return jnp.swapaxes(x.reshape(BH // heads, heads, T, d), 1, 2)


def split_chunks(x, C):
  """[BH, N * C, d] -> [BH, N, C, d]."""
  return x.reshape(x.shape[0], -1, C, x.shape[-1])


def merge_chunks(x):
  """[BH, N, C, d] -> [BH, N * C, d]."""
  return x.reshape(x.shape[0], -1, x.shape[-1])

