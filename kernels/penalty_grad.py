"""Penalty path of VLA with a chunk-level backward pass (`KernelConfig(penalty_grad="chunk")`).

Forward: exactly `penalty.penalty_parallel` (chunk-start inverses A_n from prefix sums, then the
per-chunk map), also keeping A_n. Plain autodiff of that forward differentiates every chunk-start
inverse (a batched Cholesky and its triangular solves per chunk). The backward here needs none
of them. Per chunk, with rows U, E (unit keys) and A = A_n,

    f(A, U, E) = (W, A_next):  X = U A,  I + X U^T = L L^T,  Y = L^-1 X,
                               W = E A - tril(E Y^T) Y,  A_next = A - Y^T Y,

and A_next = (A^-1 + U^T U)^-1, so for symmetric perturbations dA_next = Q dA Q^T with
Q = A_next A^-1 = I - Y^T Z, Z = L^-1 U. The cotangent of A_n therefore obeys

    D_n = Q_n^T D_(n+1) Q_n + sym(J_n),    D_N = sym(dA_T),

where J_n is the A-cotangent of W_n alone (a VJP of f with a zero A_next cotangent: local to the
chunk). The recurrence is affine in D, and affine maps D -> P^T D P + K compose associatively,
(P1, K1) after (P2, K2) = (P2 P1, P1^T K2 P1 + K1), so it runs as one reverse
`lax.associative_scan` over chunks (log2 N levels of batched d x d products). Then the
cotangents of U and E of every chunk come from one more VJP of f, fed (dW_n, D_(n+1)), in
parallel over chunks. Only symmetric parts of D matter for U and E (A_next is symmetric in
them); the returned A_0 cotangent is the gradient over symmetric perturbations of A_0.

`penalty_scan_grad` has the same backward but the forward of `penalty_scan.py` (A carried
through the downdates, inverted directly only at segment starts), which also writes the carried
A_n that the backward takes as residuals (KernelConfig(prep="scan", penalty_grad="chunk")). The
backward only assumes A_next = (A_n^-1 + U^T U)^-1, which carried and inverted A_n both satisfy.

With KernelConfig(prep="scan", penalty_grad="scan") `penalty_scan_grad` has a sequential backward
instead: the reverse Pallas kernel of `penalty_scan_bwd.py` walks
each segment's blocks backwards (A recomputed from the carried chunk starts), carrying the
A-cotangent; the segment-start inverses of segments 1.. are differentiated in XLA (their prefix
sums of u u^T and Cholesky inverses), fed the kernel's segment-start cotangents.

With KernelConfig(prep="scan", penalty_grad="adjoint") (the default: penalty_grad="auto" with
prep="scan") it has neither: in M_t = A_t^-1, additive
in the u u^T, the cotangent of the keys is A_t dW_t (the forward scan run again on the rows dW)
and that of u a reverse prefix sum of Z_t W_t^T (`_scan_adjoint_bwd`; the formulas are
`vla_jax.ops.vla.penalty`'s, whose chunked XLA form has the same backward).
"""

import functools

import jax
import jax.numpy as jnp

from vla_jax.kernels.adjoint_du import (carried_segment_chunks, carried_u_cotangents,
                                        chunk_u_cotangents_kernel)
from vla_jax.kernels.chunk_prep import _factor_precision
from vla_jax.kernels.penalty import _sym, chunk_rows, penalty_parallel
from vla_jax.kernels.penalty_scan import (_a0_inverse, _penalty_segments, forward_scan_warps,
                                          penalty_scan, scan_warps, segment_layout,
                                          segment_start_inverses)
from vla_jax.kernels.penalty_scan_bwd import penalty_scan_bwd
from vla_jax.ops.vla.penalty import (chunk_u_cotangents, segment_suffix_starts,
                                     suffix_matrices)


def _chunk_map(A, U, E, precision, solver):
  """The chunk map A [..., dk, dk], U, E [..., C, dk] -> (W [..., C, dk], A_next), with its
  factors (Y [..., C, dk], Z = L^-1 U [..., C, dk]) as auxiliary output."""
  W, Y, Linv = chunk_rows(A, U, E, precision, solver)
  mm = functools.partial(jnp.matmul, precision=precision)
  return (W, _sym(A - mm(jnp.swapaxes(Y, -1, -2), Y))), (Y, mm(Linv, U))


def _forward(khat, u, A0, refine, precision, solver):
  return penalty_parallel(khat, u, A0, refine=refine, precision=precision, solver=solver,
                          return_starts=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def penalty_chunked_grad(khat, u, A0, refine=True, precision=jax.lax.Precision.HIGHEST,
                         solver="triangular_solve"):
  """`penalty_parallel(khat, u, A0)` -> (W [B, H, N, C, dk], A_T [B, H, dk, dk]) with the
  chunk-level backward pass of this module. Same arguments as `penalty_parallel`."""
  return _forward(khat, u, A0, refine, precision, solver)[:2]


def _fwd(khat, u, A0, refine, precision, solver):
  W, A_T, A_c = _forward(khat, u, A0, refine, precision, solver)
  return (W, A_T), (khat, u, A_c)


def _compose(later, earlier):
  """Reverse-scan combine: `later` holds the maps of chunks n+1.. (applied first to D), and
  `earlier` those of chunk n; D -> P^T D P + K for each."""
  P2, K2 = later
  P1, K1 = earlier
  mm = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
  T = lambda x: jnp.swapaxes(x, -1, -2)
  return mm(P2, P1), mm(mm(T(P1), K2), P1) + K1


def _bwd(refine, precision, solver, res, cts):
  del refine
  khat, u, A_c = res
  dW, dA_T = cts
  mm = functools.partial(jnp.matmul, precision=precision)
  T = lambda x: jnp.swapaxes(x, -1, -2)
  f = functools.partial(_chunk_map, precision=precision, solver=solver)
  _, pullback, (Y, Z) = jax.vjp(f, A_c, u, khat, has_aux=True)  # one pass of the chunk map
  J = pullback((dW, jnp.zeros_like(A_c)))[0]                     # [B, H, N, dk, dk]
  eye = jnp.eye(A_c.shape[-1], dtype=A_c.dtype)
  Q = eye - mm(T(Y), Z)                                           # A_next = Q A Q^T
  # D_n for every n: scan the maps (Q_n, sym(J_n)) from the last chunk back, applied to
  # D_N = sym(dA_T). Prefix results are the maps from chunk n to the end: D_n = P^T D_N P + K.
  P, K = jax.lax.associative_scan(_compose, (Q, _sym(J)), axis=2, reverse=True)
  D = mm(mm(T(P), _sym(dA_T)[:, :, None]), P) + K                 # D_n, n = 0..N-1
  D_next = jnp.concatenate([D[:, :, 1:], _sym(dA_T)[:, :, None]], axis=2)
  _, du, dkhat = pullback((dW, D_next))
  return dkhat, du, D[:, :, 0]


penalty_chunked_grad.defvjp(_fwd, _bwd)


def _scan_forward(khat, u, A0, config):
  """(W, A_T, A_c): A_c [B, H, N * C / r, dk, dk] the inverses every r =
  `config.residual_stride` tokens (chunk starts unless `grad_stride` says otherwise); with
  penalty_grad="adjoint" instead the inverses its segments started from, [B * H, S, dk, dk]
  (the inference layout: `_penalty_segments(segment_starts=True)`). With
  `config.scan_unit_rows`: (unit rows, A_T, (those inverses, the plain rows [B * H, S * L,
  dk]))."""
  B, H, N, C, dk = khat.shape
  r = config.residual_stride
  flat = lambda x: x.reshape(B, H, N * C, dk)
  fprec = _factor_precision(config.factor_dot, khat.dtype, config.interpret)
  if config.penalty_backward == "adjoint":
    if config.scan_unit_rows:    # the unit rows out, the plain rows kept for the backward
      a, W_full, A_T, A_start = _penalty_segments(config, flat(khat), flat(u), A0, fprec,
                                                  segment_starts=True, both_rows=True)
      return a.reshape(B, H, N, C, dk), A_T.reshape(B, H, dk, dk), (A_start, W_full)
    W, A_T, A_start = _penalty_segments(config, flat(khat), flat(u), A0, fprec,
                                        segment_starts=True)
    return W.reshape(B, H, N, C, dk), A_T.reshape(B, H, dk, dk), A_start
  W, A_T, A_c = _penalty_segments(config, flat(khat), flat(u), A0, fprec, chunk_starts=True,
                                  stride=r)
  return (W.reshape(B, H, N, C, dk), A_T.reshape(B, H, dk, dk),
          _sym(A_c.reshape(B, H, N * C // r, dk, dk)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def penalty_scan_grad(khat, u, A0, config):
  """(W [B, H, N, C, dk] rows A_t khat_t, A_T [B, H, dk, dk]) like `penalty_chunked_grad`, from
  the `penalty_scan` kernel (segments, block and warps of the `KernelConfig` `config`); with
  `config.scan_unit_rows` the unit rows unit(A_t khat_t) instead of W. The
  backward, on the chunk-start inverses that the kernel carried, is `penalty_chunked_grad`'s
  (config.penalty_grad="chunk") or the reverse kernel `penalty_scan_bwd.penalty_scan_bwd` plus
  the XLA VJP of the segment-start inverses ("scan"). The returned A0 cotangent is the gradient
  over symmetric perturbations. khat, u: [B, H, N, C, dk]; A0: [B, H, dk, dk], one dtype."""
  return _scan_forward(khat, u, A0, config)[:2]


def _scan_fwd(khat, u, A0, config):
  W, A_T, A_c = _scan_forward(khat, u, A0, config)
  if config.scan_unit_rows:      # W holds the unit rows; the plain rows come with A_c
    A_start, W_full = A_c
    return (W, A_T), (khat, u, A0, A_start, W_full, A_T)
  outputs = (W, A_T) if config.penalty_backward == "adjoint" else ()  # its backward reads them
  return (W, A_T), (khat, u, A0, A_c, *outputs)


def _scan_bwd(config, res, cts):
  if config.penalty_backward == "scan":
    return _scan_kernel_bwd(config, res, cts)
  if config.penalty_backward == "adjoint":
    return _scan_adjoint_bwd(config, res, cts)
  khat, u, _, A_c = res[:4]
  return _bwd(config.newton_step, jax.lax.Precision.HIGHEST, config.solver, (khat, u, A_c), cts)


def _segment_rows(x, acc, length):
  """Chunked rows [B, H, N, C, dk] as the scan kernels read them: [B * H, length, dk] in acc,
  zero-padded from N * C to the segments' whole `length` (zero rows are exact padding)."""
  B, H, N, C, dk = x.shape
  return jnp.pad(x.astype(acc).reshape(B * H, N * C, dk), [(0, 0), (0, length - N * C), (0, 0)])


def _scan_adjoint_bwd(config, res, cts):
  """The backward of penalty_grad="adjoint": a second forward scan and products.

  With M_t = A_0^-1 + sum_{s<=t} u_s u_s^T, A_t = M_t^-1 and W_t = A_t khat_t (A_t symmetric):

      dkhat_t = A_t dW_t =: Z_t,
      dL/dM_t = -A_t (dW_t khat_t^T) A_t = -Z_t W_t^T       (plus -A_T dA_T A_T at t = T),
      du_s    = -(D_s + D_s^T) u_s,   D_s = sum_{t >= s} Z_t W_t^T + A_T dA_T A_T,
      dA_0    = M_0 sym(D_0) M_0      (M_0 = A_0^-1; the gradient over symmetric perturbations).

  Z is the penalty path applied to the rows dW instead of the unit keys: the same
  `penalty_scan` kernel (normalize=False) in the same layout, from the inverses the forward's
  segments started from (its only residual besides W and A_T). The sums over t >= s are a
  reverse causal product of linear-attention form, chunk by chunk: within a chunk the masked
  products (U W^T) Z and (U Z^T) W, across chunks the reverse prefix sums of the chunks'
  Z^T W. No inverse is differentiated and no cotangent of A is carried through the blocks.
  With `config.scan_unit_rows` the cotangent is that of the unit rows a_t = unit(W_t), and the
  scan makes dW_t from it on load (`penalty_scan(vjp_rows=W)`)."""
  khat, u, A0, A_start, W, A_T = res
  dW, dA_T = cts
  B, H, N, C, dk = khat.shape
  acc = A_start.dtype
  BH, T_pad = B * H, N * C
  # Z_t = A_t dW_t: the forward's scan again, same layout (the inference rule), from the
  # inverses the forward's segments started from.
  warps = forward_scan_warps(config, dk)
  S, L = segment_layout(config, BH, N, warps)
  warps = config.bwd_scan_warps or warps     # the Z scan's own warps, the same segments
  rows = lambda x: _segment_rows(x, acc, S * L)
  fprec = _factor_precision(config.reverse_factor_dot, acc, config.interpret)
  vjp_rows = None
  if config.scan_unit_rows:      # W: the plain rows [BH, S * L, dk]; dW: the unit rows' cotangent
    vjp_rows, W = W, W[:, :T_pad].reshape(B, H, N, C, dk)
  Z = penalty_scan(A_start, rows(dW), rows(u), block=config.scan_block, factor_precision=fprec,
                   num_warps=warps, normalize=False, vjp_rows=vjp_rows,
                   interpret=config.interpret)[0]
  Z = Z[:, :T_pad].reshape(B, H, N, C, dk)
  U, W = u.astype(acc), W.astype(acc)
  ends = (A_T.astype(acc), dA_T.astype(acc), A0.astype(acc))
  if config.adjoint_du == "carried":   # the suffix sums carried through segments in a kernel
    L = carried_segment_chunks(N)
    E_last, dA0 = segment_suffix_starts(W, Z, *ends, L, precision=config.precision)
    du = carried_u_cotangents(U, W, Z, E_last, segment_chunks=L, precision=config.precision,
                              num_warps=scan_warps(config, dk), interpret=config.interpret)
    return Z.astype(khat.dtype), du.astype(u.dtype), dA0.astype(A0.dtype)
  kernel_du = config.adjoint_du == "kernel"
  D, dA0 = suffix_matrices(W, Z, *ends, precision=config.precision, symmetrize=not kernel_du)
  if kernel_du:    # the chunk-local part in one Pallas kernel; D is E there (D = E + E^T)
    # 4 warps at dk <= 64 (158 registers, no spills, sm_90a), 8 at 128 (175, no spills).
    du = chunk_u_cotangents_kernel(U, W, Z, D, precision=config.precision,
                                   num_warps=scan_warps(config, dk), interpret=config.interpret)
  else:
    du = chunk_u_cotangents(U, W, Z, D, precision=config.precision)
  return Z.astype(khat.dtype), du.astype(u.dtype), dA0.astype(A0.dtype)


def _scan_kernel_bwd(config, res, cts):
  khat, u, A0, A_c = res[:4]
  dW, dA_T = cts
  B, H, N, C, dk = khat.shape
  acc = A_c.dtype
  # The reverse kernel's own layout (the forward wrote A at every chunk start, so the two need
  # not match): `bwd_scan_warps` warps, or the default `scan_warps`.
  warps = config.bwd_scan_warps or scan_warps(config, dk)
  S, L = segment_layout(config, B * H, N, warps)
  T_pad = N * C
  r = config.residual_stride                 # tokens between the saved inverses A_c
  n, N_r = L // r, T_pad // r
  rows = lambda x: _segment_rows(x, acc, S * L)
  # Padded stretches (zero rows) leave A and its cotangent unchanged: any SPD start will do.
  eye = jnp.broadcast_to(jnp.eye(dk, dtype=acc), (B * H, S * n - N_r, dk, dk))
  A_s = jnp.concatenate([A_c.reshape(B * H, N_r, dk, dk), eye], axis=1)
  dA_end = jnp.zeros((B * H, S, dk, dk), acc).at[:, -1].set(
      _sym(dA_T.astype(acc)).reshape(B * H, dk, dk))
  fprec = _factor_precision(config.reverse_factor_dot, acc, config.interpret)
  dU, dE, dA_start = penalty_scan_bwd(A_s, rows(khat), rows(u), rows(dW), dA_end,
                                      chunk_size=r, block=config.scan_block,
                                      unroll=config.scan_bwd_unroll,
                                      factor_precision=fprec, num_warps=warps,
                                      interpret=config.interpret)
  chunked = lambda x: x[:, :T_pad].reshape(B, H, N, C, dk)
  dkhat, du = chunked(dE), chunked(dU)
  dA_start = dA_start.reshape(B, H, S, dk, dk)
  dA0 = dA_start[:, :, 0]
  if S > 1 and config.segment_grad == "products":
    A_seg = A_c[:, :, n::n][:, :, :S - 1]                # the inverses the forward started from
    du_x, dA0_x = segment_start_vjp(u.reshape(B, H, T_pad, dk), A0, A_seg, dA_start[:, :, 1:],
                                    S, L)
    du = du + du_x.reshape(B, H, N, C, dk)
    dA0 = dA0 + dA0_x
  elif S > 1:
    _, pullback = jax.vjp(lambda u_h, A0: segment_start_inverses(u_h, A0, config, S, L),
                          u.reshape(B, H, T_pad, dk), A0)
    du_x, dA0_x = pullback(dA_start[:, :, 1:])
    du = du + du_x.reshape(B, H, N, C, dk)
    dA0 = dA0 + dA0_x
  return dkhat.astype(khat.dtype), du.astype(u.dtype), _sym(dA0).astype(A0.dtype)


penalty_scan_grad.defvjp(_scan_fwd, _scan_bwd)


def segment_start_vjp(u_h, A0, A_seg, dA_seg, S, L):
  """The VJP of `penalty_scan.segment_start_inverses` written out (KernelConfig(segment_grad=
  "products")): the gradient of the exact inverses A_s = M_s^-1, M_s = A0^-1 + sum of u_t u_t^T
  over t < s L, s = 1..S-1.

      dM_s = -A_s sym(dA_s) A_s,     du_t = 2 (sum of dM_s over s > t // L) u_t,
      dA0  = -A0^-1 (sum of dM_s) A0^-1.

  u_h: [B, H, T_pad, dk]; A0: [B, H, dk, dk]; A_seg, dA_seg: [B, H, S - 1, dk, dk] the
  segment-start inverses (as the forward used them) and their cotangents. Returns (du_h, dA0)."""
  B, H, T_pad, dk = u_h.shape
  mm = functools.partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)
  dM = -mm(mm(A_seg, _sym(dA_seg)), A_seg)                         # [B, H, S - 1, dk, dk]
  # Segment j's tokens feed M_s for s > j: suffix sums over s = j + 1 .. S - 1, j = 0 .. S - 2.
  K = 2.0 * jnp.cumsum(dM[:, :, ::-1], axis=2)[:, :, ::-1]
  u_s = u_h[:, :, :(S - 1) * L].reshape(B, H, S - 1, L, dk)      # (S - 1) L < T_pad always
  du = mm(u_s, K).reshape(B, H, (S - 1) * L, dk)                  # K symmetric: rows u_t^T K
  du = jnp.pad(du, [(0, 0), (0, 0), (0, T_pad - (S - 1) * L), (0, 0)])
  M0 = _a0_inverse(A0, A0.dtype)
  dA0 = -mm(mm(M0, jnp.sum(dM, axis=2)), M0)
  return du.astype(u_h.dtype), dA0.astype(A0.dtype)
