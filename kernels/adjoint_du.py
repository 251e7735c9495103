"""The u cotangents of the adjoint penalty backward in one Pallas kernel.

`penalty_grad="adjoint"` (the default backward of the penalty path, `penalty_grad.py`) gets
du from the rows U (penalty directions), W = A_t khat_t and Z = A_t dW_t as

    du_s = -(sum over t >= s in s's chunk of Z_t (W_t . u_s) + W_t (Z_t . u_s)) - D_n u_s,

with D_n = E_n + E_n^T the later chunks' Z^T W + W^T Z plus K (`vla_jax.ops.vla.penalty.
suffix_matrices(symmetrize=False)` gives E_n). In XLA (`chunk_u_cotangents`) that is five
batched products and two masks, each writing a [C, C] or [C, dk] float32 array per chunk to
memory. Here one program per (batch * head, chunk) keeps them on chip:

    UW = mask(U W^T),  UZ = mask(U Z^T)   ([C, C], t >= s)
    du = -(UW Z + UZ W + U E + U E^T)     ([C, dk])

reading U, W, Z and E once and writing du once. KernelConfig(adjoint_du="kernel").

`carried_u_cotangents` (KernelConfig(adjoint_du="carried")) does without E in memory: the
suffix sums E_n = sum over m > n of Z_m^T W_m, plus A_T dA_T A_T, are carried through a
segment of chunks in the program, chunk by chunk in reverse, from the segment's start value
(the later segments' Z^T W sums, one batched XLA product per segment and a reverse prefix sum
over the few segments):

    for n = last chunk of the segment down to its first:
      du_n = -(UW Z + UZ W + U E + U E^T);   E <- E + Z_n^T W_n

No [N, dk, dk] array of Z^T W or E is written (at d = 128, T = 4096, B = 8 those were 537 MB
each, and XLA's reverse prefix sum over them took 0.68 ms on an H200).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.layout import rows_spec
from vla_jax.kernels.split_prep import _dot, _iota


def _chunk_du(U, W, Z, get_E, dot):
  """du [C, dk] of one chunk from its rows U, W, Z [C, dk] and get_E() = E [dk, dk]
  (D = E + E^T; called after the masked products, which keeps a loaded E's tile out of their
  shared memory: 80 KB a program at d = 64 instead of 112)."""
  r, c, _ = _iota(U.shape[0])
  UW = jnp.where(r <= c, dot(U, W, tb=True), 0.0)                 # [s, t], t >= s
  UZ = jnp.where(r <= c, dot(U, Z, tb=True), 0.0)
  E = get_E()
  return -(dot(UW, Z) + dot(UZ, W) + dot(U, E) + dot(U, E, tb=True))


def _du_kernel(u_ref, w_ref, z_ref, e_ref, du_ref, *, precision, acc):
  # u_ref, w_ref, z_ref, du_ref: [C, dk] (one chunk); e_ref: [dk, dk] (E_n; D_n = E_n + E_n^T).
  U, W, Z = (ref[...].astype(acc) for ref in (u_ref, w_ref, z_ref))
  du = _chunk_du(U, W, Z, lambda: e_ref[...].astype(acc),
                 functools.partial(_dot, precision=precision))
  du_ref[...] = du.astype(du_ref.dtype)


def chunk_u_cotangents_kernel(U, W, Z, E, *, precision, num_warps=4, interpret=False):
  """`vla_jax.ops.vla.penalty.chunk_u_cotangents` in one kernel: U, W, Z [B, H, N, C, dk] and
  E [B, H, N, dk, dk] (the suffix matrices as `suffix_matrices(symmetrize=False)` gives them:
  D = E + E^T) -> du [B, H, N, C, dk] in U's dtype. `precision`: the
  products' (`jax.lax.Precision`, or a `DotAlgorithmPreset`)."""
  B, H, N, C, dk = U.shape
  flat = lambda x: x.reshape(B * H, N * C, dk)
  acc = U.dtype
  du = pl.pallas_call(
      functools.partial(_du_kernel, precision=precision, acc=acc),
      grid=(B * H, N),
      in_specs=[rows_spec(C, dk)] * 3 + [
          pl.BlockSpec((None, None, dk, dk), lambda b, n: (b, n, 0, 0))],
      out_specs=rows_spec(C, dk),
      out_shape=jax.ShapeDtypeStruct((B * H, N * C, dk), acc),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="vla_adjoint_du",
  )(flat(U), flat(W), flat(Z), E.reshape(B * H, N, dk, dk))
  return du.reshape(B, H, N, C, dk)


def _carried_kernel(u_ref, w_ref, z_ref, e0_ref, du_ref, *, C, L, precision, acc):
  # u_ref, w_ref, z_ref, du_ref: [L * C, dk] (one segment of L chunks); e0_ref: [dk, dk], E of
  # the segment's last chunk (the later segments' Z^T W and A_T dA_T A_T).
  dot = functools.partial(_dot, precision=precision)

  def body(i, E):
    rows = pl.ds(pl.multiple_of((L - 1 - i) * C, C), C)
    U, W, Z = (ref[rows, :].astype(acc) for ref in (u_ref, w_ref, z_ref))
    du_ref[rows, :] = _chunk_du(U, W, Z, lambda: E, dot).astype(du_ref.dtype)
    return E + dot(Z, W, ta=True)                                 # + Z_n^T W_n

  jax.lax.fori_loop(0, L, body, e0_ref[...].astype(acc))


def carried_segment_chunks(N, most=8):
  """Chunks per segment of `carried_u_cotangents`: the largest divisor of N up to `most` (8:
  at T = 4096, B = 8, H = 16 (N = 64) or T = 32768, B = 1 (N = 512) that is 1,024 programs,
  each carrying E through 8 chunks)."""
  return max(L for L in range(1, min(N, most) + 1) if N % L == 0)


def carried_u_cotangents(U, W, Z, E_last, *, segment_chunks, precision, num_warps=4,
                         interpret=False):
  """du [B, H, N, C, dk] of `chunk_u_cotangents` with the suffix matrices carried in the
  kernel (module docstring). U, W, Z: [B, H, N, C, dk], N a multiple of segment_chunks = L;
  E_last: [B, H, N / L, dk, dk], E of each segment's last chunk (`segment_suffix_starts`)."""
  B, H, N, C, dk = U.shape
  L = segment_chunks
  S = N // L
  flat = lambda x: x.reshape(B * H, N * C, dk)
  acc = U.dtype
  seg = pl.BlockSpec((None, L * C, dk), lambda b, s: (b, s, 0))
  du = pl.pallas_call(
      functools.partial(_carried_kernel, C=C, L=L, precision=precision, acc=acc),
      grid=(B * H, S),
      in_specs=[seg] * 3 + [pl.BlockSpec((None, None, dk, dk), lambda b, s: (b, s, 0, 0))],
      out_specs=seg,
      out_shape=jax.ShapeDtypeStruct((B * H, N * C, dk), acc),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="vla_adjoint_du_carried",
  )(flat(U), flat(W), flat(Z), E_last.reshape(B * H, S, dk, dk))
  return du.reshape(B, H, N, C, dk)
