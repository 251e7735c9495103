"""State path of VLA as Pallas Mosaic GPU kernels (Hopper): the generalised delta rule, no decay.

Per head, with erase keys e_t (VLA: khat_t) and write keys w_t (VLA: a_t):

    S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T,    o_t = S_t q_t.

Chunkwise (chunks of C tokens, chunk-start state S_c, rows of Q, E, W, V stacked):

    T  = (I + strictly_lower(E W^T))^-1                 [C, C]   unit lower triangular
    U' = T V,  W' = T E,  P = tril(Q W^T)                [C, dv], [C, dk], [C, C]
    M  = Q - P W'                                         [C, dk]
    O  = Q S_c^T + P (U' - W' S_c^T) = M S_c^T + P U'     [C, dv]
    S_next = S_c + (U' - W' S_c^T)^T W = S_c - (S_c W'^T) W + U'^T W

Reverse. The chunk map is affine in S_c, so the state cotangent runs backwards through

    dS_c = dS_next - (dS_next W^T) W' + dO^T M,

and with every chunk's S_c and dS_next known, the cotangents of the chunk-local inputs are
independent per chunk (written out in `_local_vjp`).

Two paths, by input dtype:

bfloat16 inputs (precision=DEFAULT): the forward is three Mosaic GPU kernels that read q, e,
w, v in place ([B, T, H, d], TMA) and multiply bfloat16 wgmma operands with float32
accumulation. Values computed in the kernels enter products as two bfloat16 pieces, x ~ x_0 +
x_1 (x_0 = bf16(x), x_1 = bf16(x - x_0)), and a product as the three terms a_0 b_0 + a_0 b_1 +
a_1 b_0 (~16 bits, finer than TF32; one piece is not enough for ill-conditioned chunks);
intermediate arrays are stored as pieces too (the bytes of float32).
  `chunk_factors`, a program per (batch * head, chunk): L = E W^T, T by block doubling with
    masks, W' = T E, U'^T = V^T T^T.
  `forward_chain`, a program per (batch * head, 64 state rows), the rows X [64, dk] of the state
    carried in registers (float32): Z = U'^T - X W'^T, X <- X + Z W, with double-buffered TMA
    loads of the next chunks' W', W, U'^T and a TMA store of every chunk-start state.
  `_outputs`, a program per (batch * head, chunk): P = tril(Q W^T), M = Q - P W',
    O = M S_c^T + P U', written in place.
Its backward: the chunk-local residuals rebuilt in XLA from the kernels' pieces (T, W', U',
S_c; P and M from two products), then the float32 path's reverse chain and XLA cotangents.

Other inputs (float32, float16; or precision=HIGHEST): the factors, the outputs, the reverse
terms dO^T M and the chunk-local cotangents run in XLA, both sequential passes in one Mosaic GPU
kernel (`_chain`): X <- X - (X A^T) B + H over chunks (forward: A = W', B = W, H = U'^T W,
chunks in order; reverse: A = W, B = W', H = dO^T M, chunks in reverse order), a program per
(batch * head, block of 64 state rows), the block [64, dk] carried in registers, per chunk two
wgmma products with the operands in swizzled shared memory, TMA loads of the next chunks' A,
B^T and H, and a TMA store of X at every chunk start (the forward's S_c, the reverse's
dS_next). wgmma multiplies float32 operands as TF32 (10-bit mantissa); with
precision=HIGHEST every chain product is split into three TF32 products, a b ~ a_hi b_hi +
a_lo b_hi + a_hi b_lo (a_hi: a with its 13 low mantissa bits cleared, exact in TF32;
a_lo = a - a_hi), which is float32-accurate; the XLA parts run at `precision` as in jax.numpy.
TF32 operands must be K-major (no transposed operands), so B enters transposed ([dk, C] rows,
made by XLA). Layout of `_chain`'s arrays: head-major chunks [B * H, N, rows, cols] in float32.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from vla_jax.ops.utils import from_chunks, to_chunks, tril_inverse

SUPPORTED_HEAD_DIMS = (64, 128)
CHUNK_SIZES = (32, 64)
VALUE_BLOCK = 64                # state rows per program: wgmma's M
SMEM_LIMIT = 227 * 1024         # opt-in shared memory per block of an H100 / H200 SM
_SMEM_RESERVED = 1024           # barriers and alignment (lowering measured: 56 bytes)
_SWIZZLE = 128                  # bytes; 32 float32 per swizzled row
_TRANSFORMS = (plgpu.TilingTransform((8, _SWIZZLE // 4)), plgpu.SwizzleTransform(_SWIZZLE))
_TF32_MASK = -(1 << 13)         # int32 0xFFFFE000: keeps sign, exponent and 10 mantissa bits


# ----------------------------------------------------------------------------- configuration

def _precision(precision):
  """The float32 product precision: DEFAULT (TF32) or HIGHEST (three TF32 products). None
  follows `jax.default_matmul_precision`'s float32 setting; HIGH counts as DEFAULT."""
  if precision is None:
    precision = jax.config.jax_default_matmul_precision or "default"
  if isinstance(precision, str):
    names = {"default": "DEFAULT", "bfloat16": "DEFAULT", "tensorfloat32": "DEFAULT",
             "float32": "HIGHEST", "fastest": "DEFAULT", "high": "DEFAULT",
             "highest": "HIGHEST"}
    if precision.lower() not in names:
      raise ValueError(f"precision must be one of {sorted(names)}, a jax.lax.Precision or "
                       f"None; got {precision!r}")
    precision = lax.Precision[names[precision.lower()]]
  if isinstance(precision, tuple):
    precision = max(precision, key=lambda p: p.value)
  if not isinstance(precision, lax.Precision):
    raise TypeError(f"precision must be a jax.lax.Precision or None; got {precision!r}")
  return lax.Precision.HIGHEST if precision == lax.Precision.HIGHEST else lax.Precision.DEFAULT


def smem_bytes(dk, chunk_size, split, stages):
  """Shared memory of one `_chain` program. stages = (buffers of each product input: A
  [C, dk] and B^T [dk, C], with `split` also their low parts; buffers of H [64, dk]); plus the
  carried block X [64, dk] and Y [64, C] (with `split` their low parts and a full X for the
  TMA store) and Mosaic's reserve."""
  C, BV = chunk_size, VALUE_BLOCK
  ab, h = stages
  inputs = 2 * C * dk * (2 if split else 1) * ab + BV * dk * h
  staged = BV * dk * (3 if split else 1) + BV * C * (2 if split else 1)
  return 4 * (inputs + staged) + _SMEM_RESERVED


def buffer_plan(dk, chunk_size, split):
  """(buffers of A and B^T, buffers of H) of `_chain`: two where they fit (the next chunk's
  loads overlap this chunk's products), H then A and B^T down to one; None if nothing fits."""
  for stages in ((2, 2), (2, 1), (1, 1)):
    if smem_bytes(dk, chunk_size, split, stages) <= SMEM_LIMIT:
      return stages
  return None


def pick_chunk_size(dk, precision):
  """Chunk size C of the state path: 64, or 32 where 64 does not fit an SM's shared memory
  (precision=HIGHEST at dk = 128)."""
  split = _precision(precision) == lax.Precision.HIGHEST
  for C in CHUNK_SIZES[::-1]:
    if buffer_plan(dk, C, split) is not None:
      return C
  raise ValueError(f"no chunk size fits dk={dk} in shared memory")


# ----------------------------------------------------------------------------- TF32 splits

def _tf32_hi(x):
  """x with its 13 low mantissa bits cleared: exact in TF32, |x - hi| < 2^-10 |x|."""
  bits = lax.bitcast_convert_type(x, jnp.int32)
  return lax.bitcast_convert_type(bits & jnp.int32(_TF32_MASK), jnp.float32)


def tf32_split(x):
  """(hi, lo) with x = hi + lo exactly, hi exact in TF32: a b ~ a_hi b_hi + a_lo b_hi + a_hi b_lo
  to float32 accuracy when each product reads its operands as TF32."""
  hi = _tf32_hi(x)
  return hi, x - hi


# ----------------------------------------------------------------------------- the chain kernel

def _chain(A, Bt, H, X0, *, reverse, split, interpret):
  """X <- X - (X A_n^T) B_n + H_n over chunks n = 0..N-1 (reverse: N-1..0), per row block.

  Args:
    A: [BH, N, C, dk]; Bt: [BH, N, dk, C] (B_n^T); H: [BH, N, dv, dk]; X0: [BH, dv, dk];
      all float32.
    reverse: run the chunks from last to first.
    split: three TF32 products per product (float32 accuracy) instead of one.
    interpret: run in Mosaic GPU interpret mode (CPU).

  Returns:
    Xs [BH, N, dv, dk]: X entering chunk n (before its update), and X_final [BH, dv, dk].
  """
  BH, N, C, dk = A.shape
  dv = X0.shape[1]
  BV = VALUE_BLOCK
  plan = buffer_plan(dk, C, split)
  if plan is None:
    raise ValueError(f"chunk_size={C} at dk={dk} does not fit in shared memory")
  ab, hb = plan
  f32 = jnp.float32
  smem = lambda *shape: plgpu.SMEM(shape, f32, transforms=_TRANSFORMS)
  if split:
    (A, A_lo), (Bt, Bt_lo) = tf32_split(A), tf32_split(Bt)
    operands = (A, Bt, H, X0, A_lo, Bt_lo)
  else:
    operands = (A, Bt, H, X0)
  chunk = (lambda i: N - 1 - i) if reverse else (lambda i: i)

  def body(*refs):
    a_g, bt_g, h_g, x0_g = refs[:4]
    alo_g, btlo_g = refs[4:6] if split else (None, None)
    xs_g, xf_g, s = refs[-3:]
    a_s, bt_s, h_s, alo_s, btlo_s = (s[k] for k in ("a", "bt", "h", "alo", "btlo"))
    x_s, xlo_s, y_s, ylo_s = s["x"], s["xlo"], s["y"], s["ylo"]
    xout_s = s["xout"] if split else x_s   # the buffer the TMA stores read
    a_bar, bt_bar, h_bar, alo_bar, btlo_bar, x0_bar = (
        s[k] for k in ("a_bar", "bt_bar", "h_bar", "alo_bar", "btlo_bar", "x0_bar"))
    bh, vb = lax.axis_index("bh"), lax.axis_index("vb")
    rows = pl.ds(vb * BV, BV)
    # (source, buffers, barriers, number of buffers, H's row block)
    feeds = [(a_g, a_s, a_bar, ab, False), (bt_g, bt_s, bt_bar, ab, False),
             (h_g, h_s, h_bar, hb, True)]
    if split:
      feeds += [(alo_g, alo_s, alo_bar, ab, False), (btlo_g, btlo_s, btlo_bar, ab, False)]

    def fetch(k, i):
      """TMA of input k for iteration i into its buffer i % (number of buffers)."""
      src, dst, bar, n_buf, blocked = feeds[k]
      slot = i % n_buf
      src = src.at[bh, chunk(i), rows] if blocked else src.at[bh, chunk(i)]
      plgpu.copy_gmem_to_smem(src, dst.at[slot], bar.at[slot])

    def fetch_next(ks, i):
      """Refills the buffers of inputs ks that iteration i has consumed."""
      n_buf = feeds[ks[0]][3]
      @pl.when(i + n_buf < N)
      def _():
        for k in ks:
          fetch(k, i + n_buf)

    def slot(k, i):
      return i % feeds[k][3]

    def stage(value, hi_ref, lo_ref, full_ref=None):
      """Stores value [rows, cols] as a wgmma operand (with `split`: hi and lo parts)."""
      if split:
        hi = _tf32_hi(value)
        hi_ref[...] = hi
        lo_ref[...] = value - hi
        if full_ref is not None:
          full_ref[...] = value
      else:
        hi_ref[...] = value

    for k in range(len(feeds)):
      for i in range(min(feeds[k][3], N)):
        fetch(k, i)
    plgpu.copy_gmem_to_smem(x0_g.at[bh, rows], xout_s, x0_bar)
    plgpu.barrier_wait(x0_bar)
    X = plgpu.load(xout_s, layout=plgpu.Layout.WGMMA)
    if split:
      stage(X, x_s, xlo_s)
      plgpu.commit_smem()

    def step(i, X):
      sab, sh = slot(0, i), slot(2, i)
      plgpu.copy_smem_to_gmem(xout_s, xs_g.at[bh, chunk(i), rows])

      # Y = X A^T  [BV, C]
      plgpu.barrier_wait(a_bar.at[sab])
      if split:
        plgpu.barrier_wait(alo_bar.at[sab])

      def x_at(acc):
        plgpu.wgmma(acc, x_s, a_s.at[sab].T)
        if split:
          plgpu.wgmma(acc, xlo_s, a_s.at[sab].T)
          plgpu.wgmma(acc, x_s, alo_s.at[sab].T)
        return acc[...]

      Y = pl.run_scoped(x_at, plgpu.ACC((BV, C), f32))
      fetch_next([0, 3] if split else [0], i)
      stage(-Y, y_s, ylo_s)
      plgpu.commit_smem()

      # X + H + (-Y) B  [BV, dk]
      plgpu.barrier_wait(h_bar.at[sh])
      X = X + h_s[sh]
      fetch_next([2], i)
      plgpu.barrier_wait(bt_bar.at[sab])
      if split:
        plgpu.barrier_wait(btlo_bar.at[sab])

      def update(acc):   # (GPU interpret mode has no accumulator initialised from a value)
        plgpu.wgmma(acc, y_s, bt_s.at[sab].T)
        if split:
          plgpu.wgmma(acc, ylo_s, bt_s.at[sab].T)
          plgpu.wgmma(acc, y_s, btlo_s.at[sab].T)
        return acc[...]

      X = X + pl.run_scoped(update, plgpu.ACC((BV, dk), f32))
      fetch_next([1, 4] if split else [1], i)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the store of xout_s has read it
      stage(X, x_s, xlo_s, xout_s)
      plgpu.commit_smem()
      return X

    lax.fori_loop(jnp.int32(0), jnp.int32(N), step, X)   # int32 indices under x64 too
    plgpu.copy_smem_to_gmem(xout_s, xf_g.at[bh, rows])
    plgpu.wait_smem_to_gmem(0)

  bars = lambda n: plgpu.Barrier(num_barriers=n)
  maybe = lambda t: t if split else None
  scratch = dict(
      a=smem(ab, C, dk), bt=smem(ab, dk, C), h=smem(hb, BV, dk),
      alo=maybe(smem(ab, C, dk)), btlo=maybe(smem(ab, dk, C)),
      x=smem(BV, dk), xlo=maybe(smem(BV, dk)), xout=maybe(smem(BV, dk)),
      y=smem(BV, C), ylo=maybe(smem(BV, C)),
      a_bar=bars(ab), bt_bar=bars(ab), h_bar=bars(hb), alo_bar=maybe(bars(ab)),
      btlo_bar=maybe(bars(ab)), x0_bar=plgpu.Barrier(),
  )
  return plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((BH, N, dv, dk), f32),
                jax.ShapeDtypeStruct((BH, dv, dk), f32)),
      scratch_types=(scratch,),
      grid=(BH, dv // BV),
      grid_names=("bh", "vb"),
      interpret=plgpu.InterpretGPUParams() if interpret else None,
      kernel_name="vla_mosaic_chain_f32",
  )(*operands)


# ----------------------------------------------------------------------------- bfloat16 kernels

# Products on pieces: a b is the sum of a_i b_j over i + j < PIECES (an input is its one
# piece), 3 wgmmas with 2 pieces. One piece (plain bfloat16 factors) is not enough: chunks
# whose keys are nearly parallel give (I + strictly_lower(E W^T))^-1 whose application cancels
# to a few bits (offline emulation of the kernels, keys near a 4-dim subspace, T = 256: 18% error
# in o with one piece, 0.4% (o's own bfloat16 rounding) with two; isotropic keys: 0.5% / 0.3%).

BF16_CHUNK = 64                 # tokens per chunk of the bfloat16 kernels (wgmma's M)
PIECES = 2                      # bfloat16 pieces of computed operands (precision=DEFAULT)


def bf16_pieces(x, n):
  """x (float32) as n bfloat16 arrays with x ~ sum of them (each the bfloat16 rounding of
  what the earlier ones leave; relative error ~2^-(8n+1))."""
  parts = []
  for _ in range(n):
    hi = x.astype(jnp.bfloat16)
    parts.append(hi)
    x = x - hi.astype(jnp.float32)
  return parts


def _smem(shape, dtype):
  """A swizzled shared-memory buffer of wgmma operand tiles (rows of 128 bytes)."""
  per_row = _SWIZZLE // jnp.dtype(dtype).itemsize
  return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, per_row)),
                                              plgpu.SwizzleTransform(_SWIZZLE)))


def _iota(n):
  layout = plgpu.Layout.WGMMA
  return (plgpu.broadcasted_iota(jnp.int32, (n, n), 0, layout=layout),
          plgpu.broadcasted_iota(jnp.int32, (n, n), 1, layout=layout))


class _Products:
  """wgmma products on bfloat16 pieces for one warpgroup.

  stage: None when compiled (left operands computed in the kernel are register arrays), or, in
  GPU interpret mode (which takes left operands from shared memory only), a dict of
  [pieces, rows, cols] buffers the left operands are staged through."""

  def __init__(self, pieces, stage):
    self.pieces = pieces
    self.stage = stage

  def lhs(self, x, name):
    """The pieces of x (float32 [64 or 128, K], a value) as left wgmma operands."""
    parts = bf16_pieces(x, self.pieces)
    if self.stage is None:
      return parts
    buf = self.stage[name]
    for k, part in enumerate(parts):
      buf.at[k][...] = part
    plgpu.commit_smem()
    return [buf.at[k] for k in range(len(parts))]

  def dot(self, shape, *pairs):
    """Sum over (a pieces, b pieces) pairs of a b, float32 [M, N] (one accumulator)."""
    def body(acc):
      for a_parts, b_parts in pairs:
        for i, a in enumerate(a_parts):
          for j, b in enumerate(b_parts):
            if i + j < self.pieces:
              plgpu.wgmma(acc, a, b)
      return acc[...]
    return pl.run_scoped(body, plgpu.ACC(shape, jnp.float32))


def _store_pieces(ref, x, n):
  """The n bfloat16 pieces of x into ref [n, rows, cols] (then `plgpu.commit_smem`)."""
  for k, part in enumerate(bf16_pieces(x, n)):
    ref.at[k][...] = part


def _parts(ref, n, transpose=False):
  return [ref.at[k].T if transpose else ref.at[k] for k in range(n)]


def _interpret_default(interpret):
  return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def _interpret_params(interpret):
  return plgpu.InterpretGPUParams() if interpret else None


def prep_smem_bytes(dk, dv, pieces):
  """Shared memory of one `chunk_factors` program, bfloat16: T (pieces), W and N (pieces) or
  then W' (pieces), E and V or then U'^T (pieces)."""
  C = BF16_CHUNK
  return 2 * (pieces * C * C + max(C * dk + pieces * C * C, pieces * C * dk)
              + max(C * (dk + dv), pieces * dv * C)) + _SMEM_RESERVED


def chain_smem_bytes(dk, pieces, slots):
  """Shared memory of one `forward_chain` program: `slots` buffers of W' (pieces), W and U'^T
  rows (pieces), and the chunk-start state (pieces) or the float32 start / final state."""
  C, BV = BF16_CHUNK, VALUE_BLOCK
  staged = slots * 2 * (pieces * C * dk + C * dk + pieces * BV * C)
  return staged + max(2 * pieces, 4) * BV * dk + _SMEM_RESERVED


def chain_slots(dk, pieces):
  """Buffers per input of `forward_chain`: 2 (the next chunk's loads overlap this chunk's
  products) where they fit, else 1 (precision=HIGHEST at dk = 128)."""
  return 2 if chain_smem_bytes(dk, pieces, 2) <= SMEM_LIMIT else 1


def out_smem_bytes(dk, dv, pieces, out_bytes):
  """Shared memory of one `_outputs` program: Q, W and W' (pieces) or then O, U'^T and S_c
  (pieces)."""
  C = BF16_CHUNK
  return (2 * (C * dk + pieces * dv * C + pieces * dv * dk)
          + max(2 * (1 + pieces) * C * dk, out_bytes * C * dv) + _SMEM_RESERVED)


def chunk_factors(e, w, v, *, with_inverse=False, interpret=None):
  """Chunk factors of the bfloat16 path, one program per (batch * head, chunk):

      L = E W^T,  T = (I + strictly_lower(L))^-1,  W' = T E,  U'^T = V^T T^T.

  T by block doubling on the whole [C, C] matrix (`vla_jax.ops.utils.tril_inverse`'s merge,
  with masks): from the 2 x 2 blocks' inverse, log2(C) - 1 merges inv <- inv - inv N_s inv,
  N_s the part of N = strictly_lower(L) coupling the halves of each 2s-block; inv N_s is
  inv N masked to those entries (inv is block diagonal), so N is staged once.

  Args:
    e, w: [B, T, H, dk], v: [B, T, H, dv] bfloat16, T a multiple of 64.
    with_inverse: also return T.
    interpret: GPU interpret mode; None (default): when the default backend is not a GPU.

  Returns:
    W' [B * H, N, PIECES, C, dk] and U'^T [B * H, N, PIECES, dv, C] as bfloat16 pieces
    (and T [B * H, N, PIECES, C, C]).
  """
  interpret = _interpret_default(interpret)
  pieces = PIECES
  B, T, H, dk = e.shape
  dv = v.shape[-1]
  C = BF16_CHUNK
  N = T // C
  bf16 = jnp.bfloat16

  def body(e_g, w_g, v_g, *refs):
    outs, s = refs[:-1], refs[-1]
    wp_g, ut_g = outs[:2]
    (w_s, n_s), (wp_s,) = s["w_n|wp"]       # shared memory reused once its values are dead
    (e_s, v_s), (ut_s,) = s["e_v|ut"]
    bh, n = lax.axis_index("bh"), lax.axis_index("n")
    b, h = bh // H, bh % H
    tok = pl.ds(n * C, C)
    for k, (src, dst) in enumerate(((e_g, e_s), (w_g, w_s), (v_g, v_s))):
      plgpu.copy_gmem_to_smem(src.at[b, tok, h], dst, s["bar"].at[k])
    mm = _Products(pieces, s["stage"])
    plgpu.barrier_wait(s["bar"].at[0])
    plgpu.barrier_wait(s["bar"].at[1])
    L = mm.dot((C, C), ([e_s], [w_s.T]))
    r, c = _iota(C)
    _store_pieces(n_s, jnp.where(r > c, L, 0.0), pieces)
    inv = jnp.where(r == c, 1.0, 0.0) - jnp.where((r == c + 1) & ((r & 1) == 1), L, 0.0)
    half = 2
    while half < C:
      shift = jnp.int32((2 * half).bit_length() - 1)
      merged = ((lax.shift_right_logical(r, shift) == lax.shift_right_logical(c, shift))
                & ((r & (2 * half - 1)) >= half) & ((c & (2 * half - 1)) < half))
      _store_pieces(s["t"], inv, pieces)
      plgpu.commit_smem()
      inv_N = jnp.where(merged, mm.dot((C, C), (mm.lhs(inv, "cc"), _parts(n_s, pieces))), 0.0)
      inv = inv - mm.dot((C, C), (mm.lhs(inv_N, "cc"), _parts(s["t"], pieces)))
      half *= 2
    _store_pieces(s["t"], inv, pieces)
    plgpu.commit_smem()
    if with_inverse:
      for k in range(pieces):
        plgpu.copy_smem_to_gmem(s["t"].at[k], outs[2].at[bh, n, k])
    Wp = mm.dot((C, dk), (mm.lhs(inv, "cc"), [e_s]))
    _store_pieces(wp_s, Wp, pieces)             # over W and N
    plgpu.commit_smem()
    for k in range(pieces):
      plgpu.copy_smem_to_gmem(wp_s.at[k], wp_g.at[bh, n, k])
    plgpu.barrier_wait(s["bar"].at[2])
    Ut = mm.dot((dv, C), ([v_s.T], _parts(s["t"], pieces, transpose=True)))
    _store_pieces(ut_s, Ut, pieces)             # over E and V
    plgpu.commit_smem()
    for k in range(pieces):
      plgpu.copy_smem_to_gmem(ut_s.at[k], ut_g.at[bh, n, k])
    plgpu.wait_smem_to_gmem(0)

  scratch = {
      "w_n|wp": plgpu.RefUnion((_smem((C, dk), bf16), _smem((pieces, C, C), bf16)),
                               (_smem((pieces, C, dk), bf16),)),
      "e_v|ut": plgpu.RefUnion((_smem((C, dk), bf16), _smem((C, dv), bf16)),
                               (_smem((pieces, dv, C), bf16),)),
      "t": _smem((pieces, C, C), bf16),
      "bar": plgpu.Barrier(num_barriers=3),
      "stage": dict(cc=_smem((pieces, C, C), bf16)) if interpret else None}
  out_type = [jax.ShapeDtypeStruct((B * H, N, pieces, C, dk), bf16),
              jax.ShapeDtypeStruct((B * H, N, pieces, dv, C), bf16)]
  if with_inverse:
    out_type.append(jax.ShapeDtypeStruct((B * H, N, pieces, C, C), bf16))
  return plgpu.kernel(body, out_type=tuple(out_type), scratch_types=(scratch,),
                      grid=(B * H, N), grid_names=("bh", "n"),
                      interpret=_interpret_params(interpret),
                      kernel_name="vla_mosaic_factors")(e, w, v)


def forward_chain(Wp, w, Ut, S0, *, interpret=None):
  """The forward state chain of the bfloat16 path, a program per (batch * head, block of 64
  state rows), the block X [64, dk] carried in registers (float32):

      Z = U'^T - X W'^T  (= R^T, [64, C]),   X <- X + Z W.

  Args:
    Wp: [B * H, N, PIECES, C, dk], Ut: [B * H, N, PIECES, dv, C] (`chunk_factors`);
    w: [B, T, H, dk] bfloat16 (read in place); S0: [B * H, dv, dk] float32.
    interpret: as in `chunk_factors`.

  Returns:
    the chunk-start states S_c [B * H, N, PIECES, dv, dk] as bfloat16 pieces and the final
    state [B * H, dv, dk] float32.
  """
  interpret = _interpret_default(interpret)
  BH, N, pieces, C, dk = Wp.shape
  H = w.shape[2]
  dv = Ut.shape[3]
  BV = VALUE_BLOCK
  slots = chain_slots(dk, pieces)
  bf16, f32 = jnp.bfloat16, jnp.float32

  def body(wp_g, w_g, ut_g, s0_g, sc_g, st_g, s):
    (x_s,), (sc_s,) = s["x|sc"]     # the start / final state, or the chunk-start state
    bh, vb = lax.axis_index("bh"), lax.axis_index("vb")
    b, h = bh // H, bh % H
    rows = pl.ds(vb * BV, BV)
    mm = _Products(pieces, s["stage"])

    def fetch(i, slot):
      for k in range(pieces):
        plgpu.copy_gmem_to_smem(wp_g.at[bh, i, k], s["wp"].at[slot, k], s["wp_bar"].at[slot])
        plgpu.copy_gmem_to_smem(ut_g.at[bh, i, k, rows], s["ut"].at[slot, k],
                                s["ut_bar"].at[slot])
      plgpu.copy_gmem_to_smem(w_g.at[b, pl.ds(i * C, C), h], s["w"].at[slot],
                              s["w_bar"].at[slot])

    for i in range(min(slots, N)):
      fetch(i, i)
    plgpu.copy_gmem_to_smem(s0_g.at[bh, rows], x_s, s["x_bar"])
    plgpu.barrier_wait(s["x_bar"])
    X = plgpu.load(x_s, layout=plgpu.Layout.WGMMA)

    def step(i, X):
      slot = i % slots
      x_parts = mm.lhs(X, "x")
      plgpu.barrier_wait(s["wp_bar"].at[slot])

      def y_and_stores(acc):   # Y = X W'^T, and while it runs: S_c out, U'^T rows in
        for i_, a in enumerate(x_parts):
          for j, b in enumerate(_parts(s["wp"].at[slot], pieces, transpose=True)):
            if i_ + j < pieces:
              plgpu.wgmma(acc, a, b)
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)   # the last chunk start is read
        _store_pieces(sc_s, X, pieces)
        plgpu.commit_smem()
        for k in range(pieces):
          plgpu.copy_smem_to_gmem(sc_s.at[k], sc_g.at[bh, i, k, rows])
        plgpu.barrier_wait(s["ut_bar"].at[slot])
        U = sum(plgpu.load(s["ut"].at[slot, k], layout=plgpu.Layout.WGMMA).astype(f32)
                for k in range(pieces))
        return U - acc[...]

      Z = pl.run_scoped(y_and_stores, plgpu.ACC((BV, C), f32))
      plgpu.barrier_wait(s["w_bar"].at[slot])
      X = X + mm.dot((BV, dk), (mm.lhs(Z, "z"), [s["w"].at[slot]]))

      @pl.when(i + slots < N)
      def _():
        fetch(i + slots, slot)
      return X

    X = lax.fori_loop(jnp.int32(0), jnp.int32(N), step, X)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)     # x shares memory with S_c's pieces
    x_s[...] = X
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(x_s, st_g.at[bh, rows])
    plgpu.wait_smem_to_gmem(0)

  bars = lambda arrivals: plgpu.Barrier(num_arrivals=arrivals, num_barriers=slots)
  scratch = {
      "wp": _smem((slots, pieces, C, dk), bf16), "w": _smem((slots, C, dk), bf16),
      "ut": _smem((slots, pieces, BV, C), bf16),
      "x|sc": plgpu.RefUnion((_smem((BV, dk), f32),), (_smem((pieces, BV, dk), bf16),)),
      "wp_bar": bars(pieces), "ut_bar": bars(pieces), "w_bar": bars(1),
      "x_bar": plgpu.Barrier(),
      "stage": (dict(x=_smem((pieces, BV, dk), bf16), z=_smem((pieces, BV, C), bf16))
                if interpret else None)}
  return plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((BH, N, pieces, dv, dk), bf16),
                jax.ShapeDtypeStruct((BH, dv, dk), f32)),
      scratch_types=(scratch,), grid=(BH, dv // BV), grid_names=("bh", "vb"),
      interpret=_interpret_params(interpret), kernel_name="vla_mosaic_chain")(Wp, w, Ut, S0)


def _outputs(q, w, Wp, Ut, S_c, *, out_dtype, interpret):
  """Outputs of the bfloat16 path, one program per (batch * head, chunk), parallel over chunks
  as the Triton path's split output form (`vla_state_out`):

      P = tril(Q W^T),  M = Q - P W',  O = M S_c^T + P U'   (= Q S_c^T + P (U' - W' S_c^T)).

  Args:
    q, w: [B, T, H, dk] bfloat16 (read in place); Wp, Ut, S_c: bfloat16 pieces as
      `chunk_factors` and `forward_chain` return them.

  Returns:
    o [B, T, H, dv] in out_dtype (written in place of the token-major layout).
  """
  B, T, H, dk = q.shape
  BH, N, pieces, dv, C = Ut.shape
  bf16, f32 = jnp.bfloat16, jnp.float32

  def body(q_g, w_g, wp_g, ut_g, sc_g, o_g, s):
    (w_s, wp_s), (o_s,) = s["w_wp|o"]   # O is written once W and W' are dead
    bh, n = lax.axis_index("bh"), lax.axis_index("n")
    b, h = bh // H, bh % H
    tok = pl.ds(n * C, C)
    bar = s["bar"]
    plgpu.copy_gmem_to_smem(q_g.at[b, tok, h], s["q"], bar[0])
    plgpu.copy_gmem_to_smem(w_g.at[b, tok, h], w_s, bar[1])
    for k in range(pieces):
      plgpu.copy_gmem_to_smem(wp_g.at[bh, n, k], wp_s.at[k], bar[2])
      plgpu.copy_gmem_to_smem(ut_g.at[bh, n, k], s["ut"].at[k], bar[3])
      plgpu.copy_gmem_to_smem(sc_g.at[bh, n, k], s["s"].at[k], bar[4])
    mm = _Products(pieces, s["stage"])
    plgpu.barrier_wait(bar[0])
    plgpu.barrier_wait(bar[1])
    r, c = _iota(C)
    P = mm.lhs(jnp.where(r >= c, mm.dot((C, C), ([s["q"]], [w_s.T])), 0.0), "p")
    plgpu.barrier_wait(bar[2])
    M = (plgpu.load(s["q"], layout=plgpu.Layout.WGMMA).astype(f32)
         - mm.dot((C, dk), (P, _parts(wp_s, pieces))))
    M = mm.lhs(M, "m")
    plgpu.barrier_wait(bar[3])
    plgpu.barrier_wait(bar[4])
    O = mm.dot((C, dv), (M, _parts(s["s"], pieces, transpose=True)),
               (P, _parts(s["ut"], pieces, transpose=True)))
    o_s[...] = O.astype(out_dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_g.at[b, tok, h])
    plgpu.wait_smem_to_gmem(0)

  arrivals = (1, 1, pieces, pieces, pieces)
  scratch = {
      "q": _smem((C, dk), bf16),
      "w_wp|o": plgpu.RefUnion((_smem((C, dk), bf16), _smem((pieces, C, dk), bf16)),
                               (_smem((C, dv), out_dtype),)),
      "ut": _smem((pieces, dv, C), bf16), "s": _smem((pieces, dv, dk), bf16),
      "bar": [plgpu.Barrier(num_arrivals=a) for a in arrivals],
      "stage": (dict(p=_smem((pieces, C, C), bf16), m=_smem((pieces, C, dk), bf16))
                if interpret else None)}
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((B, T, H, dv), out_dtype),
      scratch_types=(scratch,), grid=(BH, N), grid_names=("bh", "n"),
      interpret=_interpret_params(interpret), kernel_name="vla_mosaic_out")(q, w, Wp, Ut, S_c)


# ----------------------------------------------------------------------------- chunk algebra (XLA)

def _heads(x):
  """[B, H, ...] -> [B * H, ...]."""
  return x.reshape((-1,) + x.shape[2:])


def _factors(Q, E, W, V, precision):
  """The chunk-local factors, all chunks at once. Q, E, W: [B, H, N, C, dk]; V: [..., C, dv].

  Returns T (I + strictly_lower(E W^T))^-1 [..., C, C], U' = T V, W' = T E, P = tril(Q W^T)
  and M = Q - P W'."""
  C = Q.shape[-2]
  mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=precision)
  r = jnp.arange(C)
  L = jnp.where(r[:, None] > r[None, :], mm("...ik,...jk->...ij", E, W), 0.0)
  Tinv = tril_inverse(L + jnp.eye(C, dtype=L.dtype), unit_diagonal=True)
  Up, Wp = mm("...ij,...jv->...iv", Tinv, V), mm("...ij,...jk->...ik", Tinv, E)
  P = jnp.where(r[:, None] >= r[None, :], mm("...ik,...jk->...ij", Q, W), 0.0)
  M = Q - mm("...ij,...jk->...ik", P, Wp)
  return Tinv, Up, Wp, P, M


def _forward_f32(q, e, w, v, S0, C, precision, interpret):
  """The float32 path: o [B, T, H, dv] (v's dtype), S_T [B, H, dv, dk] float32 and the
  residuals (chunk-local factors from XLA, the chain kernel, outputs from XLA)."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  f32 = jnp.float32
  Q, E, W, V = (to_chunks(x.astype(f32), C) for x in (q, e, w, v))   # [B, H, N, C, d]
  N = Q.shape[2]
  Tinv, Up, Wp, P, M = _factors(Q, E, W, V, precision)
  mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=precision)
  Hf = mm("bhncv,bhnck->bhnvk", Up, W)                                 # U'^T W
  S_c, S_T = _chain(_heads(Wp), _heads(jnp.swapaxes(W, -1, -2)), _heads(Hf),
                    _heads(S0.astype(f32)), reverse=False,
                    split=precision == lax.Precision.HIGHEST, interpret=interpret)
  S_c = S_c.reshape(B, H, N, dv, dk)
  O = mm("bhnck,bhnvk->bhncv", M, S_c) + mm("bhnij,bhnjv->bhniv", P, Up)
  o = from_chunks(O, T).astype(v.dtype)
  return o, S_T.reshape(B, H, dv, dk), (Q, E, W, V, Tinv, Up, Wp, P, M, S_c)


def _forward_bf16(q, e, w, v, S0, interpret, with_inverse):
  """The bfloat16 path (`chunk_factors`, `forward_chain`, `_outputs`): o [B, T, H, dv] bfloat16,
  S_T [B, H, dv, dk] float32 and the kernels' pieces (W', U'^T[, T]) and S_c."""
  B, T, H, dk = q.shape
  dv = v.shape[-1]
  pad = -T % BF16_CHUNK
  if pad:   # zero keys and values leave the state unchanged
    q, e, w, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, e, w, v))
  factors = chunk_factors(e, w, v, with_inverse=with_inverse, interpret=interpret)
  S_c, S_T = forward_chain(factors[0], w, factors[1],
                           S0.reshape(B * H, dv, dk).astype(jnp.float32), interpret=interpret)
  o = _outputs(q, w, factors[0], factors[1], S_c, out_dtype=v.dtype, interpret=interpret)
  return o[:, :T], S_T.reshape(B, H, dv, dk), (factors, S_c)


def _bf16_residuals(q, e, w, v, factors, S_c, precision):
  """The float32 residuals of the backward (as `_forward_f32` returns them) from the bfloat16
  path's pieces."""
  B, T, H, dk = q.shape
  f32 = jnp.float32
  Q, E, W, V = (to_chunks(x.astype(f32), BF16_CHUNK) for x in (q, e, w, v))
  N = Q.shape[2]
  whole = lambda x: jnp.sum(x.astype(f32), axis=2).reshape((B, H, N) + x.shape[3:])
  Wp, Ut, Tinv = (whole(x) for x in factors)
  Up, S_c = jnp.swapaxes(Ut, -1, -2), whole(S_c)
  mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=precision)
  r = jnp.arange(BF16_CHUNK)
  P = jnp.where(r[:, None] >= r[None, :], mm("...ik,...jk->...ij", Q, W), 0.0)
  M = Q - mm("...ij,...jk->...ik", P, Wp)
  return Q, E, W, V, Tinv, Up, Wp, P, M, S_c


def _bf16_path(q, e, w, v, precision):
  """Whether the bfloat16 kernels run: bfloat16 q, e, w, v and precision=DEFAULT."""
  return (precision == lax.Precision.DEFAULT
          and all(x.dtype == jnp.bfloat16 for x in (q, e, w, v)))


def _local_vjp(Q, E, W, V, Tinv, Up, Wp, P, S_c, dO, dS_next, precision):
  """Cotangents (dq, de, dw, dv) [B, H, N, C, d] of every chunk's map (S_c fixed) given the
  output cotangents dO and the chunk-end state cotangents dS_next:

      R = U' - W' S^T,  dR = P^T dO + W dS_next^T,  dP = tril(dO R^T),  dX = T^T dR,
      dL = strictly_lower(-dX R^T),  dq = dO S + dP W,  dw = dP^T Q + R dS_next + dL^T E,
      de = dL W - dX S,  dv = dX."""
  C = Q.shape[-2]
  mm = lambda spec, a, b: jnp.einsum(spec, a, b, precision=precision)
  r = jnp.arange(C)
  R = Up - mm("...ck,...vk->...cv", Wp, S_c)
  dR = mm("...ij,...iv->...jv", P, dO) + mm("...ck,...vk->...cv", W, dS_next)
  dP = jnp.where(r[:, None] >= r[None, :], mm("...iv,...jv->...ij", dO, R), 0.0)
  dX = mm("...ij,...iv->...jv", Tinv, dR)
  dL = jnp.where(r[:, None] > r[None, :], -mm("...iv,...jv->...ij", dX, R), 0.0)
  dq = mm("...cv,...vk->...ck", dO, S_c) + mm("...ij,...jk->...ik", dP, W)
  dw = (mm("...ij,...ik->...jk", dP, Q) + mm("...cv,...vk->...ck", R, dS_next)
        + mm("...ij,...ik->...jk", dL, E))
  de = mm("...ij,...jk->...ik", dL, W) - mm("...cv,...vk->...ck", dX, S_c)
  return dq, de, dw, dX


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _state_path(q, e, w, v, S0, C, precision, interpret):
  if _bf16_path(q, e, w, v, precision):
    o, S_T, _ = _forward_bf16(q, e, w, v, S0, interpret, with_inverse=False)
  else:
    o, S_T, _ = _forward_f32(q, e, w, v, S0, C, precision, interpret)
  return o, S_T


def _state_path_fwd(q, e, w, v, S0, C, precision, interpret):
  if _bf16_path(q, e, w, v, precision):
    o, S_T, (factors, S_c) = _forward_bf16(q, e, w, v, S0, interpret, with_inverse=True)
    return (o, S_T), ((factors, S_c), (q, e, w, v, S0))
  o, S_T, res = _forward_f32(q, e, w, v, S0, C, precision, interpret)
  return (o, S_T), (res, (q, e, w, v, S0))


def _state_path_bwd(C, precision, interpret, residuals, cts):
  res, primals = residuals
  if _bf16_path(*primals[:4], precision):
    C = BF16_CHUNK
    res = _bf16_residuals(*primals[:4], *res, precision)
  Q, E, W, V, Tinv, Up, Wp, P, M, S_c = res
  dO, dS_T = cts
  B, H, N, _, dk = Q.shape
  dv = V.shape[-1]
  T = primals[0].shape[1]
  dO = to_chunks(dO.astype(jnp.float32), C)
  G = jnp.einsum("bhncv,bhnck->bhnvk", dO, M, precision=precision)       # dO^T M
  dS_next, dS0 = _chain(_heads(W), _heads(jnp.swapaxes(Wp, -1, -2)), _heads(G),
                        _heads(dS_T.astype(jnp.float32)), reverse=True,
                        split=precision == lax.Precision.HIGHEST, interpret=interpret)
  dS_next = dS_next.reshape(B, H, N, dv, dk)
  grads = _local_vjp(Q, E, W, V, Tinv, Up, Wp, P, S_c, dO, dS_next, precision)
  grads = tuple(from_chunks(g, T).astype(x.dtype) for g, x in zip(grads, primals[:4]))
  return (*grads, dS0.reshape(B, H, dv, dk).astype(primals[4].dtype))


_state_path.defvjp(_state_path_fwd, _state_path_bwd)


# ----------------------------------------------------------------------------- entry point

HOPPER_DEVICE_KINDS = ("H100", "H200", "H800", "H20", "GH200")


def target_device():
  """The device a compiled call targets: the abstract mesh's device while lowering for one
  (`kernels/lowering.py`), else JAX's default device."""
  abstract = jax.sharding.get_abstract_mesh().abstract_device
  return abstract if abstract is not None else jax.devices()[0]


def compute_capability(device):
  """(major, minor) of a GPU `device`'s compute capability, or None where unknown (a ROCm GPU;
  an abstract device, judged by its name, of a kind other than HOPPER_DEVICE_KINDS)."""
  capability = getattr(device, "compute_capability", None)
  if capability is not None:
    try:
      major, minor = str(capability).split(".")
      return int(major), int(minor)
    except ValueError:
      return None
  words = device.device_kind.upper().split()
  return (9, 0) if any(name in words for name in HOPPER_DEVICE_KINDS) else None


def mosaic_supported(device=None):
  """Whether the compiled kernels run on `device` (default `target_device()`): an NVIDIA GPU
  of compute capability 9.x (Hopper, sm_90a: wgmma and TMA as used here; Blackwell has
  neither wgmma nor its shared-memory budget, and earlier GPUs have no TMA)."""
  device = device or target_device()
  if device.platform not in ("gpu", "cuda"):
    return False
  capability = compute_capability(device)
  return capability is not None and capability[0] == 9


def _check(q, e, w, v, S0, chunk_size):
  for name, x in (("q", q), ("e", e), ("w", w), ("v", v), ("S0", S0)):
    if not hasattr(x, "shape") or len(x.shape) != 4:
      raise ValueError(f"{name} must be a rank-4 array; got "
                       f"{getattr(x, 'shape', type(x).__name__)}")
    if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
      raise TypeError(f"{name} must be float32, bfloat16 or float16 (the Mosaic state path "
                      f"computes in float32; use impl='chunked' for float64); got {x.dtype}")
  B, T, H, dk = q.shape
  if e.shape != q.shape or w.shape != q.shape:
    raise ValueError(f"q, e and w must all be [B, T, H, dk]; got {q.shape}, {e.shape}, "
                     f"{w.shape}")
  dv = v.shape[-1]
  if v.shape[:3] != (B, T, H):
    raise ValueError(f"v must be [B, T, H, dv] = [{B}, {T}, {H}, dv]; got {v.shape}")
  if S0.shape != (B, H, dv, dk):
    raise ValueError(f"S0 must be [B, H, dv, dk] = {(B, H, dv, dk)}; got {S0.shape}")
  if dk not in SUPPORTED_HEAD_DIMS or dv not in SUPPORTED_HEAD_DIMS:
    raise ValueError(f"dk and dv must be in {SUPPORTED_HEAD_DIMS}; got dk={dk}, dv={dv}")
  if T == 0:
    raise ValueError("q must have at least one token (T >= 1)")
  if chunk_size is not None and chunk_size not in CHUNK_SIZES:
    raise ValueError(f"chunk_size must be None or one of {CHUNK_SIZES}; got {chunk_size!r}")


def state_path_mosaic(q, e, w, v, S0, *, chunk_size=None, precision=None, interpret=None):
  """Generalised delta rule S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T, o_t = S_t q_t, with
  the sequential passes as Mosaic GPU kernels (Hopper).

  Args:
    q, e, w: [B, T, H, dk] queries, erase keys (VLA: unit keys khat) and write keys (VLA: the
      unit write directions a); float32, bfloat16 or float16. dk in (64, 128).
    v: [B, T, H, dv] values, dv in (64, 128).
    S0: [B, H, dv, dk] initial state.
    chunk_size: tokens per chunk C, 32 or 64, or None (default): `pick_chunk_size` (64; 32
      for precision=HIGHEST at dk = 128, where 64 does not fit shared memory). Any T works
      (the tail is padded with zero keys, which leave the state unchanged).
    precision: float32 product precision as in jax.numpy: None (default:
      `jax.default_matmul_precision`), DEFAULT (TF32 products) or HIGHEST (float32-accurate:
      three TF32 products each in the kernels).
    interpret: run the kernels in Mosaic GPU interpret mode (on the CPU); None (default):
      when the default backend is not a GPU.

  Returns:
    o [B, T, H, dv] in v's dtype and S_T [B, H, dv, dk] float32. Differentiable in all five
    inputs (custom VJP: the reverse chain as the same kernel run backwards over chunks, the
    chunk-local cotangents in XLA).

  Raises:
    RuntimeError: compiled (interpret=False) for a device that is not a Hopper GPU
      (`mosaic_supported`); the caller's fallback is `impl="chunked"` or the Triton kernels.
  """
  _check(q, e, w, v, S0, chunk_size)
  precision = _precision(precision)
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  if not interpret and not mosaic_supported():
    device = target_device()
    raise RuntimeError(
        "the Mosaic GPU state path needs an NVIDIA Hopper GPU (compute capability 9.0); "
        f"the target is {device.device_kind!r} ({device.platform}). Use impl='chunked', "
        "the Triton kernels, or interpret=True.")
  if _bf16_path(q, e, w, v, precision):
    if chunk_size not in (None, BF16_CHUNK):
      raise ValueError(f"chunk_size must be None or {BF16_CHUNK} for bfloat16 inputs at the "
                       f"default precision; got {chunk_size!r}")
    return _state_path(q, e, w, v, S0, BF16_CHUNK, precision, bool(interpret))
  C = chunk_size or pick_chunk_size(q.shape[-1], precision)
  split = precision == lax.Precision.HIGHEST
  if buffer_plan(q.shape[-1], C, split) is None:
    raise ValueError(f"chunk_size={C} with precision={precision.name} at dk={q.shape[-1]} "
                     f"does not fit in shared memory; use chunk_size=None")
  return _state_path(q, e, w, v, S0, C, precision, bool(interpret))
