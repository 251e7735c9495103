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

Both sequential passes are one recurrence, X <- X - (X A^T) B + H over chunks (forward:
A = W', B = W, H = U'^T W, chunks in order; reverse: A = W, B = W', H = dO^T M, chunks in
reverse order), and one Mosaic GPU kernel runs it (`_chain`): a program per (batch * head,
block of 64 state rows), the block [64, dk] carried in registers (wgmma's accumulator layout),
per chunk two wgmma products ([64, dk] x [dk, C], then [64, C] x [C, dk]) with the operands in
swizzled shared memory, TMA loads of the next chunks' A, B^T and H issued as soon as their
buffers are consumed, and a TMA store of X at every chunk start (the forward's S_c, the
reverse's dS_next). Everything that does not touch the carried state is parallel over chunks
and runs in XLA: the factors above, the outputs O = M S_c^T + P U', the reverse terms
dO^T M and the chunk-local cotangents.

Products. wgmma multiplies float32 operands as TF32 (10-bit mantissa). With
precision=HIGHEST every chain product is split into three TF32 products, a b ~ a_hi b_hi +
a_lo b_hi + a_hi b_lo (a_hi: a with its 13 low mantissa bits cleared, exact in TF32;
a_lo = a - a_hi), which is float32-accurate; the XLA parts run at `precision` as in jax.numpy.
TF32 operands must be K-major, so B enters transposed ([dk, C] rows, made by XLA) and the
carried block and the intermediate X A^T are stored row-major, as they are computed.

Layout of the kernel's arrays: head-major chunks [B * H, N, rows, cols] in float32.
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
  )(*operands)


def state_chain(A, Bt, H, X0, *, reverse=False, precision=None, interpret=None):
  """The sequential pass alone: X <- X - (X A_n^T) B_n + H_n over chunks (`_chain`).

  Args:
    A: [BH, N, C, dk]; Bt: [BH, N, dk, C] (B_n transposed); H: [BH, N, dv, dk];
      X0: [BH, dv, dk]; float32 (others are cast). C in (32, 64), dk and dv in (64, 128).
    reverse: chunks from last to first. precision, interpret: as in `state_path_mosaic`.

  Returns:
    X entering every chunk [BH, N, dv, dk] and the final X [BH, dv, dk], float32.
  """
  split = _precision(precision) == lax.Precision.HIGHEST
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  f32 = jnp.float32
  return _chain(A.astype(f32), Bt.astype(f32), H.astype(f32), X0.astype(f32),
                reverse=reverse, split=split, interpret=bool(interpret))


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


def _forward(q, e, w, v, S0, C, precision, interpret):
  """o [B, T, H, dv] (v's dtype), S_T [B, H, dv, dk] float32 and the residuals."""
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
  o, S_T, _ = _forward(q, e, w, v, S0, C, precision, interpret)
  return o, S_T


def _state_path_fwd(q, e, w, v, S0, C, precision, interpret):
  o, S_T, res = _forward(q, e, w, v, S0, C, precision, interpret)
  return (o, S_T), (res, (q, e, w, v, S0))


def _state_path_bwd(C, precision, interpret, residuals, cts):
  (Q, E, W, V, Tinv, Up, Wp, P, M, S_c), primals = residuals
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


def mosaic_supported(device=None):
  """Whether the compiled kernels run on `device` (default `target_device()`): an NVIDIA GPU
  of compute capability 9.0 (Hopper, sm_90a: wgmma and TMA as used here; Blackwell has
  neither wgmma nor its shared-memory budget, and earlier GPUs have no TMA)."""
  device = device or target_device()
  if device.platform not in ("gpu", "cuda"):
    return False
  capability = getattr(device, "compute_capability", None)
  if capability is not None:
    return str(capability) == "9.0"
  words = device.device_kind.upper().split()   # an abstract device: judged by its name
  return any(name in words for name in HOPPER_DEVICE_KINDS)


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
  C = chunk_size or pick_chunk_size(q.shape[-1], precision)
  split = precision == lax.Precision.HIGHEST
  if buffer_plan(q.shape[-1], C, split) is None:
    raise ValueError(f"chunk_size={C} with precision={precision.name} at dk={q.shape[-1]} "
                     f"does not fit in shared memory; use chunk_size=None")
  return _state_path(q, e, w, v, S0, C, precision, bool(interpret))
