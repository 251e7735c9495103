"""Penalty path of VLA as a sequential Pallas (Triton) kernel over segments of the sequence.

The split prep (`split_prep.py`) inverts M_c at every chunk start and factorises every C x C
block with C elimination steps on whole [C, C] or [dk, dk] values: parallel, but each step is a
few cross-warp reductions on a large value, and there are dk + C of them per chunk. Here A is
instead *carried* through the Sherman-Morrison downdates, as the sequential definition does,
in blocks of `block` tokens (rows U_j, E_j of the block; A the inverse at the block start):

    X = U_j A,   I + X U_j^T = L L^T,   Y = L^-1 X          [b, dk], [b, b], [b, dk]
    W_j = E_j A - tril(E_j Y^T) Y                           rows A_t khat_t of the block
    A  <- A - Y^T Y                                         the inverse after the block

(the chunkwise identity of the penalty path, VLA.md section 4, on blocks of b = 16 tokens:
the b x b factorisation is b elimination steps on a small value, and every product is small).
A [dk, dk] stays in registers; the only values are [b, dk], [b, b] and [dk, dk].

Parallelism. One program per (batch * head, segment): the sequence is cut into S segments of
L tokens and A at each segment start is M^-1 with M = A_0^-1 + sum of u u^T before it (computed
in XLA by `_penalty_segments`: a prefix sum and S batched Cholesky inverses). With S = 1 the
whole path is carried (most accurate: no inversion at all); larger S fills the GPU when B * H is
small, at the accuracy of a direct inversion at S - 1 points (eps * cond(M), see NOTES.md)
instead of every chunk start.

Gradients (`penalty_grad.penalty_scan_grad`): with `chunk_size` the kernel also writes A at
every chunk start of its segment (an outer loop over chunks, an inner one over their blocks)
and, with normalize=False, the rows A_t khat_t instead of unit rows: the residuals and the
output of the chunk-level penalty backward.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.chunk_prep import _factor_precision
from vla_jax.kernels.layout import rows_spec
from vla_jax.kernels.penalty import _spd_inverse
from vla_jax.kernels.split_prep import _chol_inv, _dot, _eye, _iota, spd_inverse, unit_rows
from vla_jax.ops.vla.recurrence import KEY_EPS, WRITE_EPS

BLOCKS = (16, 32, 64)


def block_factors(A, U, *, precision, eye=None):
  """Factors of one block (A [dk, dk] its start inverse, U [b, dk] its rows): X = U A,
  G = I + X U^T, Linv = chol(G)^-1, Y = Linv X. Shared by this kernel and its reverse
  (`penalty_scan_bwd.py`)."""
  dot = functools.partial(_dot, precision=precision)
  X = dot(U, A)
  G = (_eye(U.shape[0], A.dtype) if eye is None else eye) + dot(X, U, tb=True)
  Linv = _chol_inv(G)
  return X, G, Linv, dot(Linv, X)


def unit_rows_vjp(W, dA, eps):
  """Cotangent of W [n, d] under a = unit_rows(W, eps), given dA = the cotangent of a: with
  r = 1 / max(|W|, eps), dW = r (dA - [|W| > eps] a (a . dA)), a = r W (the VJP of
  `vla_jax.ops.utils.unit`, row by row)."""
  sq = jnp.sum(W * W, axis=1)
  inv = jax.lax.rsqrt(jnp.maximum(sq, eps ** 2))
  a = W * inv[:, None]
  along = jnp.where(sq > eps ** 2, jnp.sum(a * dA, axis=1), 0.0)
  return inv[:, None] * (dA - along[:, None] * a)


def _scan_kernel(*refs, L, b, C, normalize, prefetch, fprec, acc, unit_keys=False,
                 unit_vjp=False):
  # Inputs a0_ref [dk, dk] (segment-start inverse), e_ref, u_ref [L, dk] (unit keys, penalty
  # directions), with unit_vjp also wv_ref [L, dk]; outputs ah_ref [L, dk] (write directions),
  # with normalize="both" also wr_ref [L, dk] (the rows before normalising), at_ref [dk, dk]
  # (segment-end inverse) and, with a chunk size C, ac_ref [L / C, dk, dk] (the inverse at
  # every chunk start). unit_vjp: e_ref holds the cotangents of unit rows of wv_ref's rows, and
  # the scan runs on their VJP (`unit_rows_vjp`) instead.
  n_in = 4 if unit_vjp else 3
  a0_ref, e_ref, u_ref = refs[:3]
  wv_ref = refs[3] if unit_vjp else None
  outs = refs[n_in:]
  both = normalize == "both"
  ah_ref, wr_ref = (outs[0], outs[1]) if both else (outs[0], None)
  at_ref, *ac_refs = outs[2:] if both else outs[1:]
  dot = functools.partial(_dot, precision=fprec)
  r, c, _ = _iota(b)
  eye = _eye(b, acc)
  n_blocks = L // b
  start = lambda j: j * b if isinstance(j, int) else pl.multiple_of(j * b, b)
  def load(j):
    U, E = (ref[pl.ds(start(j), b), :].astype(acc) for ref in (u_ref, e_ref))
    if unit_vjp:
      return U, unit_rows_vjp(wv_ref[pl.ds(start(j), b), :].astype(acc), E, WRITE_EPS)
    return U, unit_rows(E, KEY_EPS) if unit_keys else E

  def step(j, A, U, E):
    X, _, _, Y = block_factors(A, U, precision=fprec, eye=eye)
    W = dot(E, A) - dot(jnp.where(r >= c, dot(E, Y, tb=True), 0.0), Y)
    if both:
      wr_ref[pl.ds(start(j), b), :] = W.astype(wr_ref.dtype)
    if normalize:
      W = unit_rows(W, WRITE_EPS)
    ah_ref[pl.ds(start(j), b), :] = W.astype(ah_ref.dtype)
    return A - dot(Y, Y, ta=True)

  A0 = a0_ref[...].astype(acc)
  if prefetch:
    # Block j + 1's rows are loaded before block j's products, so their latency overlaps
    # the products instead of starting each block (the last block reloads itself).
    def body(j, carry):
      A, U, E = carry
      nxt = load(jnp.minimum(j + 1, n_blocks - 1))
      return (step(j, A, U, E),) + nxt
    carry = (A0,) + load(0)
  else:
    body = lambda j, carry: (step(j, carry[0], *load(j)),)
    carry = (A0,)
  if C is None:
    A = jax.lax.fori_loop(0, n_blocks, body, carry)[0]
  else:
    # Chunks of C / b blocks: A written as it reaches each chunk start.
    per, (ac_ref,) = C // b, ac_refs

    def chunk(n, carry):
      ac_ref[n] = carry[0].astype(ac_ref.dtype)
      return jax.lax.fori_loop(0, per, lambda i, carry: body(n * per + i, carry), carry)
    A = jax.lax.fori_loop(0, L // C, chunk, carry)[0]
  at_ref[...] = (0.5 * (A + A.T)).astype(at_ref.dtype)


def penalty_scan(A_start, e, u, *, block=16, prefetch=False, factor_precision, num_warps=4,
                 chunk_size=None, normalize=True, rows_dtype=None, heads=None, unit_keys=False,
                 vjp_rows=None, interpret=False):
  """Write directions of every token and the inverse at every segment end.

  Args:
    A_start: [BH, S, dk, dk] inverse at each segment start (symmetric positive definite).
    e: [BH, S * L, dk] unit keys; u: [BH, S * L, dk] penalty directions (zero rows pad: exact).
    block: tokens per Sherman-Morrison block b (16, 32 or 64; L must be a multiple).
    prefetch: load block j + 1's rows before block j's products (same result; measured
      within noise on an H200, so off by default).
    factor_precision: precision of the products (tf32, tf32x3, ieee or bf16 on GPUs,
      HIGHEST otherwise; bf16 also in interpret mode).
    chunk_size: None, or C (a multiple of `block` dividing L): also return the carried inverse
      at every chunk start (the residuals of `penalty_grad.penalty_scan_grad`).
    normalize: write unit rows unit(A_t khat_t) (default); False writes the rows A_t khat_t;
      "both" writes the unit rows and, as a second output after them, the rows A_t khat_t in
      A_start's dtype (the unit rows feed the state path, the plain rows the adjoint backward:
      no XLA pass normalises them).
    rows_dtype: dtype of the written rows (default A_start's; the computation is in
      A_start's dtype either way).
    heads: None, or H when e and u are token-major [B, S * L, H, dk] (read in place; the
      output stays head-major [B * H, ...]).
    unit_keys: e holds raw keys; the kernel divides each row by max(norm, KEY_EPS).
    vjp_rows: None, or rows W [BH, S * L, dk] (head-major) of which e holds the cotangents of
      the unit rows unit(W) (WRITE_EPS): the scan runs on their VJP, W's cotangents
      (`unit_rows_vjp`), made on load (the adjoint backward's Z = A dW without an XLA pass).

  Returns:
    (Ahat [BH, S * L, dk] unit write directions (or the rows A_t khat_t; `rows_dtype`), A_end
    [BH, S, dk, dk]), with chunk_size also A_c [BH, S * L / C, dk, dk] (not symmetrised), in
    A_start's dtype; with normalize="both" the rows A_t khat_t [BH, S * L, dk] second.
  """
  BH, S, dk, _ = A_start.shape
  L = e.shape[1] // S   # [BH, S * L, dk] or [B, S * L, H, dk]
  if block not in BLOCKS or L % block:
    raise ValueError(f"block must be one of {BLOCKS} and divide the segment length {L}; "
                     f"got {block!r}")
  if chunk_size is not None and (chunk_size % block or L % chunk_size):
    raise ValueError(f"chunk_size must be a multiple of the block {block} and divide the "
                     f"segment length {L}; got {chunk_size!r}")
  acc = A_start.dtype
  mat = pl.BlockSpec((None, None, dk, dk), lambda h, s: (h, s, 0, 0))
  rows = rows_spec(L, dk)
  out_specs = [rows, mat]
  out_shape = [jax.ShapeDtypeStruct((BH, S * L, dk), rows_dtype or acc),
               jax.ShapeDtypeStruct((BH, S, dk, dk), acc)]
  if normalize == "both":
    out_specs.insert(1, rows)
    out_shape.insert(1, jax.ShapeDtypeStruct((BH, S * L, dk), acc))
  in_specs = [mat, rows_spec(L, dk, heads), rows_spec(L, dk, heads)]
  args = (A_start, e, u)
  if vjp_rows is not None:
    if heads is not None or unit_keys:
      raise ValueError("vjp_rows needs head-major e and u (heads=None, unit_keys=False)")
    in_specs.append(rows)
    args += (vjp_rows,)
  if chunk_size is not None:
    n = L // chunk_size
    out_specs.append(pl.BlockSpec((None, n, dk, dk), lambda h, s: (h, s, 0, 0)))
    out_shape.append(jax.ShapeDtypeStruct((BH, S * n, dk, dk), acc))
  return pl.pallas_call(
      functools.partial(_scan_kernel, L=L, b=block, C=chunk_size, normalize=normalize,
                        prefetch=prefetch, fprec=factor_precision, acc=acc,
                        unit_keys=unit_keys, unit_vjp=vjp_rows is not None),
      grid=(BH, S),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="vla_penalty_scan",
  )(*args)


def _a0_inverse(A0, dtype):
  """M0 = A0^-1 [..., dk, dk] in `dtype` (XLA Cholesky inverse, HIGHEST products, no Newton
  step): the penalty matrix before the first token, which every segment start adds to."""
  return _spd_inverse(A0.astype(dtype), refine=False, precision=jax.lax.Precision.HIGHEST)


def _chunk_start_matrices(u_h, A0, C, acc):
  """M_c = A_0^-1 + sum of the Grams U_m^T U_m of all earlier chunks: [B, H, N, dk, dk]."""
  return _a0_inverse(A0, acc)[:, :, None] + _gram_prefix(u_h, C)


def _gram_prefix(u_h, C):
  """The sums of the Grams U_m^T U_m of the chunks before each chunk (of C rows of u_h
  [B, H, T_pad, dk]): [B, H, T_pad / C, dk, dk], zero for the first."""
  B, H, T_pad, dk = u_h.shape
  U = u_h.reshape(B, H, T_pad // C, C, dk)
  gram = jnp.einsum("bhnci,bhncj->bhnij", U, U, precision=jax.lax.Precision.HIGHEST)
  return jnp.concatenate([jnp.zeros_like(gram[:, :, :1]),     # exclusive prefix sum
                          jnp.cumsum(gram, axis=2)[:, :, :-1]], axis=2)


def segment_layout(config, BH, N, warps=4):
  """(S, L): the number of segments and tokens per segment for B * H = BH sequences of N
  chunks (`config.segment_chunks`, or `segments_for` with the kernel's `warps`: 264 resident
  programs at 4 warps, 4 / warps times as many at other counts. At 8 warps (dk = 128) that is
  132, one per SM: such a program holds the whole register file, so 264 would make a second
  wave of segments that only adds inverses)."""
  seg = config.segment_chunks or segments_for(BH, N, resident=264 * 4 // warps)
  return -(-N // seg), seg * config.chunk_size


def segment_start_inverses(u_h, A0, config, S, L, token_major=False):
  """The inverses at the starts of segments 1..S-1, [B, H, S - 1, dk, dk]: M^-1 with M = A0^-1
  plus the sum of u u^T before the segment (XLA: prefix sums of Grams, Cholesky inverse).
  u_h: [B, H, T_pad, dk] (zero-padded to S * L inside). The backward of `penalty_scan_grad`'s
  kernel variant differentiates this same function."""
  return _spd_inverse(_segment_start_matrices(u_h, A0, S, L, token_major),
                      refine=config.newton_step,
                      precision=jax.lax.Precision.HIGHEST, solver=config.solver)


def _segment_start_matrices(u_h, A0, S, L, token_major=False):
  """M = A0^-1 + the sum of u u^T before each of segments 1..S-1: [B, H, S - 1, dk, dk]."""
  return (_a0_inverse(A0, A0.dtype)[:, :, None]
          + _segment_gram_prefix(u_h, S, L, token_major).astype(A0.dtype))


def _segment_gram_prefix(u_h, S, L, token_major=False):
  """The sum of u u^T before each of segments 1..S-1 (u_h [B, H, T_pad, dk] zero-padded to
  S * L, or with token_major u [B, S * L, H, dk] in any float dtype): [B, H, S - 1, dk, dk]."""
  if token_major:
    B, _, H, dk = u_h.shape
    U = u_h.reshape(B, S, L, H, dk)            # read once in its own dtype, summed in float32+
    gram = jnp.einsum("bslhi,bslhj->bhsij", U, U, precision=jax.lax.Precision.HIGHEST,
                      preferred_element_type=jnp.promote_types(u_h.dtype, jnp.float32))
    return jnp.cumsum(gram, axis=2)[:, :, :-1]
  u_s = jnp.pad(u_h, [(0, 0), (0, 0), (0, S * L - u_h.shape[2]), (0, 0)])
  return _gram_prefix(u_s, L)[:, :, 1:]


def _gram_kernel(u_ref, g_ref, *, L, C, precision, acc):
  # One program = one (batch * head, segment): u_ref [L, dk] (the segment's tokens, read in
  # place when token-major), g_ref [dk, dk] = the sum of u u^T over them, C tokens a step.
  def body(n, G):
    U = u_ref[pl.ds(pl.multiple_of(n * C, C), C), :].astype(acc)
    return G + _dot(U, U, ta=True, precision=precision)

  dk = g_ref.shape[-1]
  g_ref[...] = jax.lax.fori_loop(0, L // C, body, jnp.zeros((dk, dk), acc)).astype(g_ref.dtype)


def segment_grams(u, S, L, *, chunk_size, precision, acc=jnp.float32, heads=None,
                  num_warps=4, interpret=False):
  """The Grams G_s = sum of u_t u_t^T over the L tokens of segment s, for s = 0..S-2 (the
  last segment's is never needed): [BH, S - 1, dk, dk] in acc. One Pallas program per
  (sequence, segment), chunk_size tokens a step. u: head-major [BH, >= S * L, dk], or with
  heads=H the caller's token-major [B, >= S * L, H, dk] read in place (no transposed copy)."""
  dk = u.shape[-1]
  BH = u.shape[0] * (heads or 1)
  return pl.pallas_call(
      functools.partial(_gram_kernel, L=L, C=chunk_size, precision=precision, acc=acc),
      grid=(BH, S - 1),
      in_specs=[rows_spec(L, dk, heads)],
      out_specs=pl.BlockSpec((None, None, dk, dk), lambda i, j: (i, j, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((BH, S - 1, dk, dk), acc),
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret, name="vla_segment_grams",
  )(u)


def _segment_gram_prefix_kernel(u_h, config, S, L, token_major, acc):
  """`_segment_gram_prefix` with the Grams from `segment_grams` (config.segment_gram="kernel"):
  bfloat16 products (float32 sums) for bfloat16 u, or when the scan's own factor products are
  bfloat16 (`factor_dot`, the bf16-input default: the differentiated forward gets u cast to
  float32, whose values are then bfloat16 values, so the products stay exact; for other u they
  take the rounding the scan gives u anyway); else tf32x3 products."""
  if token_major:
    B, _, H, dk = u_h.shape
  else:
    B, H, _, dk = u_h.shape
    pad = S * L - u_h.shape[2]
    u_h = jnp.pad(u_h, [(0, 0), (0, 0), (0, pad), (0, 0)]).reshape(B * H, S * L, dk)
  low = u_h.dtype == jnp.bfloat16 or config.factor_dot == "bf16"
  prec = _factor_precision("bf16" if low else "tf32x3", acc, config.interpret)
  G = segment_grams(u_h, S, L, chunk_size=config.chunk_size, precision=prec, acc=acc,
                    heads=H if token_major else None, num_warps=config.prep_warps,
                    interpret=config.interpret)
  return jnp.cumsum(G, axis=1).reshape(B, H, S - 1, dk, dk)


def segment_start_inverses_kernel(u_h, A0, config, S, L, token_major=False):
  """As `segment_start_inverses`, the inversions in the `split_prep.spd_inverse` kernel (one
  program per segment start: dk elimination steps, A = Linv^T Linv, the Newton step with
  `config.newton_step`; tf32x3 products on a GPU, whatever `prep_dot` says: an inverse of a possibly
  ill-conditioned M needs about float32 accuracy). XLA keeps the prefix sums of the per-segment
  Grams (or, with `config.segment_gram="kernel"`, the Grams come from `segment_grams`, which
  reads token-major u in place); A0's inverse runs in the same kernel (a second launch)
  instead of XLA's Cholesky chain. No VJP: the inference path and the forward of
  penalty_grad="adjoint" only (`KernelConfig.segment_inverse="kernel"`)."""
  B, H, dk = A0.shape[0], A0.shape[1], A0.shape[-1]
  fprec = _factor_precision("tf32x3", A0.dtype, config.interpret)
  inverse = lambda M, refine: spd_inverse(M.reshape(B * H, -1, dk, dk), refine=refine,
                                          factor_precision=fprec, interpret=config.interpret,
                                          tile=config.inverse_tile_size)
  if config.segment_gram == "kernel":
    grams = _segment_gram_prefix_kernel(u_h, config, S, L, token_major, A0.dtype)
  else:
    grams = _segment_gram_prefix(u_h, S, L, token_major).astype(A0.dtype)
  M = inverse(A0, False).reshape(B, H, 1, dk, dk) + grams
  return inverse(M, config.newton_step).reshape(B, H, S - 1, dk, dk)


def scan_warps(config, dk):
  """Warps of the scan kernels: dk = 128 needs 8 for the carried [128, 128] A (ptxas, sm_90a:
  0.9 KB of spills per thread at 8 warps against 2.5 KB at 4)."""
  return max(config.prep_warps, 8) if dk >= 128 else config.prep_warps


def forward_scan_warps(config, dk):
  """Warps of the inference path's forward scan kernel: `config.scan_warps`, or (None) 1 for
  one-pass TF32 (or bfloat16) factor products at dk <= 64 (H200, d = 64: penalty path 1.38 ms
  against 1.83 at 4 warps, T = 4096, B = 8, with 4x the segments), else `scan_warps`."""
  if config.scan_warps is not None:
    return config.scan_warps
  if dk <= 64 and config.factor_dot in ("tf32", "bf16"):
    return 1
  return scan_warps(config, dk)


def grad_scan_warps(config, dk):
  """Warps of the differentiated forward's scan kernel: `config.grad_scan_warps`, or (None) 1
  for bfloat16 factor products at dk <= 64 (H200, d = 64, bf16 inputs: that kernel 0.42 ms
  against 0.89 at 4 warps, gradient 8.07 ms of device time against 8.56, T = 4096, B = 8;
  with TF32 products 1 warp was within noise), else `scan_warps` (the reverse kernel's)."""
  if config.grad_scan_warps is not None:
    return config.grad_scan_warps
  if dk <= 64 and config.factor_dot == "bf16":
    return 1
  return scan_warps(config, dk)


def _penalty_segments(config, khat, u_h, A0, fprec, chunk_starts=False, rows_dtype=None,
                      token_major=False, stride=None, segment_starts=False, both_rows=False):
  """Write directions [B*H, T_pad, dk] and A_T [B*H, dk, dk] from `penalty_scan`: the sequence
  cut into segments of `segment_chunks` chunks (auto: enough to fill the GPU), A carried through
  each segment, A at segment starts from XLA (`segment_start_inverses`).
  chunk_starts: instead the rows A_t khat_t (not unit), A_T and the inverse at every chunk start
  [B*H, T_pad / C, dk, dk] (with `stride`, a divisor of C: every `stride` tokens,
  [B*H, T_pad / stride, dk, dk]). rows_dtype: dtype of the written rows (default the computation's).
  token_major: khat and u_h are the caller's raw keys and u, [B, T_pad, H, dk] in their own
  dtype, read in place (the kernel makes the unit keys); inference only.
  segment_starts: the inference layout, but the rows A_t khat_t (not unit), A_T and the
  inverses the segments started from [B*H, S, dk, dk] (the forward of penalty_grad="adjoint",
  whose backward runs the same scan again from them: `segment_layout` with
  `forward_scan_warps` gives both the same segments). With both_rows (segment_starts only):
  (unit rows [B*H, T_pad, dk], the rows A_t khat_t [B*H, S * L, dk] (the segments' whole
  length, as the backward's scan reads them), A_T, the segments' start inverses)."""
  if token_major:
    B, T_pad, H, dk = u_h.shape
  else:
    B, H, T_pad, dk = u_h.shape
  C = config.chunk_size
  N = T_pad // C
  # The differentiated forward (chunk_starts) has its own warps and segments
  # (`grad_scan_warps`); the reverse kernel starts from the inverses it saves (every chunk, or
  # every `stride` tokens), whatever the layout.
  if chunk_starts:
    warps = grad_scan_warps(config, dk)
  else:
    warps = forward_scan_warps(config, dk)
  S, L = segment_layout(config, B * H, N, warps)
  time_axis = 1 if token_major else 2
  pad = lambda x: x if S * L == T_pad else jnp.pad(
      x, [(0, S * L - T_pad) if a == time_axis else (0, 0) for a in range(4)])
  if token_major:   # padded once: the segment Grams and the kernel read the same arrays
    khat, u_h = pad(khat), pad(u_h)
  A_start = A0[:, :, None]
  if S > 1:
    # The differentiated forward keeps the XLA inversions (their VJP is the backward's).
    inverses = (segment_start_inverses_kernel
                if config.segment_inverter(dk) == "kernel" and not chunk_starts
                else segment_start_inverses)
    A_start = jnp.concatenate([A_start, inverses(u_h, A0, config, S, L, token_major)], axis=2)
  flat = lambda x: x.reshape(B * H, *x.shape[2:])
  rows = (lambda x: x) if token_major else (lambda x: flat(pad(x)))
  stride = stride or C
  kw = (dict(chunk_size=stride, normalize=False) if chunk_starts
        else dict(normalize="both" if both_rows else False) if segment_starts else {})
  out = penalty_scan(flat(A_start), rows(khat), rows(u_h), block=config.scan_block,
                     prefetch=config.scan_prefetch, factor_precision=fprec,
                     num_warps=warps, rows_dtype=rows_dtype, interpret=config.interpret,
                     heads=H if token_major else None, unit_keys=token_major, **kw)
  if segment_starts and both_rows:
    return out[0][:, :T_pad], out[1], out[2][:, -1], flat(A_start)
  Ah, A_end = out[0][:, :T_pad], out[1][:, -1]
  if segment_starts:
    return Ah, A_end, flat(A_start)
  return (Ah, A_end, out[2][:, :T_pad // stride]) if chunk_starts else (Ah, A_end)


def segments_for(BH, N, resident=264):
  """Chunks per segment: as many segments as fit in one wave of `resident` programs (two per
  SM of an H200), at least one, never fewer than one chunk per segment. A second, partial wave
  adds a whole segment's latency: measured on an H200 at d = 64, one wave is 11% faster at
  T = 4096, B = 8 (2 segments instead of 3) and 16% at T = 32768, B = 1 (16 instead of 17)."""
  S = min(N, max(1, resident // BH))
  return -(-N // S)
