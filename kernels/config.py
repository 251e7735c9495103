"""What a user sets (`KernelConfig`) and what the kernels derive from it for one call (`Plan`).

`KernelConfig` holds the three choices a user may reasonably make: the chunk size, the
precision of the matrix products (JAX's meaning) and the value rows per program of the
sequential state loops, and three forms of the penalty path that tests and benchmarks may
force (by default the plan's). Everything else is decided per call by
`KernelConfig.plan` from the input dtype, the head dims, the number of programs and the GPU
compiled for (`Target`), each rule with the measurement behind it (H200, H = 16,
B * T = 32,768 unless said otherwise; kernels/DESIGN.md, "The plan").
"""

import dataclasses

import jax
import jax.numpy as jnp

from vla_jax.kernels.common import dot_precision

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
MIN_CHUNK, MAX_CHUNK = 16, 128
PRECISIONS = (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGH, jax.lax.Precision.HIGHEST)
# The forms a config may force (None: the plan's choice, `KernelConfig.plan`). How the
# penalty scan factors each block's I + X U^T (`KernelConfig.block_factor`):
BLOCK_FACTORS = ("elimination", "newton")
# How the segment starts are formed at dk = 128 (`KernelConfig.start_inverse`):
START_INVERSES = ("xla", "tiles")
# Which side of the penalty path's products the head dim sits on
# (`KernelConfig.penalty_layout`):
PENALTY_LAYOUTS = ("rows", "transposed")

# The kernels (Triton) need compute capability 8.0 or later (bfloat16 and TF32 tensor cores).
TRITON_MIN_CAPABILITY = (8, 0)
# Abstract devices (`kernels/lowering.py`) carry no compute capability: these names are 9.0.
HOPPER_DEVICE_KINDS = ("H100", "H200", "H800", "H20", "GH200")


def pad_value_width(v, S0):
  """(v, S0, dv_run): values v [B, T, H, dv] and a state S0 [B, H, dv, dk] of a width dv the
  kernels do not take run on zero value columns up to the next width they do (a zero column
  of v and of S0 keeps its row of S at zero: exact); the caller drops the extra outputs."""
  dv = v.shape[-1]
  dv_run = min((d for d in SUPPORTED_HEAD_DIMS if d >= dv), default=dv)
  if dv_run != dv:
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, dv_run - dv)])
    S0 = jnp.pad(S0, [(0, 0), (0, 0), (0, dv_run - dv), (0, 0)])
  return v, S0, dv_run


@dataclasses.dataclass(frozen=True)
class KernelSupport:
  """What the Pallas kernel of one recurrence takes: the facts `vla_jax.ops.impl.resolve_impl`
  reads (impl "auto" runs the kernel exactly where it takes the call; impl "pallas" is
  rejected elsewhere, naming the fact).

  Attributes:
    head_dims: key and value head dims.
    chunk_sizes: tokens per chunk.
    dtypes: input dtypes (names).
    min_capability: the lowest NVIDIA compute capability (major, minor) it compiles for.
    segment_ids: whether it takes packed documents (`segment_ids`).
    unsupported: (option, values) pairs: layer options whose values it does not take.
    auto: whether impl "auto" runs it: only once it has been checked against float64 on a
      GPU (`experiments/check_kernels.py`); until then it runs where impl "pallas" or
      "pallas_interpret" asks for it.
  """

  head_dims: tuple = SUPPORTED_HEAD_DIMS
  chunk_sizes: tuple = tuple(2 ** i for i in range(MIN_CHUNK.bit_length() - 1,
                                                  MAX_CHUNK.bit_length()))
  dtypes: tuple = ("float32", "bfloat16", "float64")
  min_capability: tuple = TRITON_MIN_CAPABILITY
  segment_ids: bool = False
  unsupported: tuple = ()
  auto: bool = True


# The recurrences with a Pallas kernel, by op name ("vla", "deltanet", "gated_deltanet",
# "linear_attention"); an op without an entry has none. VLA's kernels take packed documents,
# and its readout "delta" (one more value channel of constant 1, value width d_h + 1) runs on
# zero value columns up to the next head dim (`vla_jax.ops.vla_recurrence`), and a learned
# write strength (`beta`) scales the write directions between their kernels. DeltaNet and
# linear attention run on the same state path (`kernels/delta_rule.py`), packed documents
# included; linear attention's normaliser (`normalize`) is an XLA prefix sum beside it. Gated
# DeltaNet's decays run in the same kernels, without packed documents. DeltaNet's and Gated
# DeltaNet's and linear attention's kernels have passed the GPU check (BENCHMARKS.md,
# "Correctness against float64"; their times beside fla's: "Baseline kernels against fla").
KERNEL_SUPPORT = {
    "vla": KernelSupport(segment_ids=True),
    "deltanet": KernelSupport(segment_ids=True),
    "gated_deltanet": KernelSupport(segment_ids=False),
    "linear_attention": KernelSupport(segment_ids=True),
}

# Tokens per Sherman-Morrison block of the penalty scan (32, whole op, bf16, T = 4096, B = 8:
# forward 1.40 against 1.22 ms at d = 64, 3.32 against 3.26 at d = 128; its longer
# eliminations cost more than the halved block count saves; VARIANTS.md, "Penalty scan at d = 128").
SCAN_BLOCK = 16
# Programs resident on an H200 at 4 warps (two per SM); the penalty scan cuts each sequence
# into as many segments as fill one wave (a second, partial wave cost 11% at T = 4096, B = 8).
RESIDENT_AT_4_WARPS = 264
# The state loops' warps and pipeline stages (whole op, bf16: 8 warps, 1 or 3 stages all within
# 3% of these at d = 64 and 128, T = 4096 and 32768; VARIANTS.md, "Plan knobs re-tuned").
STATE_WARPS, STATE_STAGES = 4, 2
# Value rows per program of the state loops: 32 (64 was 15% slower at B = 1 and needs 240 KB
# of shared memory at dk = 128), or 16 where 32 leaves at most this many programs (d = 64,
# T = 32768, B = 1: forward 1.90 -> 1.77 ms; at 256 programs 16 rows were slower).
SMALL_VALUE_BLOCK_AT = 32
# The state forward as a chain kernel plus a parallel output kernel below this many programs
# of the loop (an H200 has 132 SMs; d = 64: 1.88 against 2.43 ms at 32 programs, fused 1.20
# against 1.27 at 256) and at dk >= 128 (d = 128, 512 programs: 0.82 against 0.99 ms).
SPLIT_OUTPUT_BELOW = 132
SPLIT_OUTPUT_FROM_DK = 128
# The reverse state pass as a per-chunk terms kernel plus a chain up to this many programs
# (d = 64: 1.13 against 1.96 ms at 32 programs, 0.37 against 0.40 at 256, 0.32 against 0.40
# at 512; not measured above) and at dk >= 128 (1.00 against 2.80 ms at 512 programs).
SPLIT_BWD_UP_TO = 512
SPLIT_BWD_FROM_DK = 128
# The chunk-local VJP of the state path in one kernel (4.81 against 5.45 ms of gradient device
# time as XLA products, d = 64, T = 4096) up to this head dim with float32 operands: at 128
# the program needs 352 KB of shared memory (an SM has 227 KB), so XLA products there.
FUSED_VJP_F32_UP_TO = 64
# Segment-start inverses in one Pallas program each up to this dk (penalty path 1.34 against
# 1.49 ms in XLA at T = 4096, B = 8); above it the program spills and needs 256 KB, so there
# a program whose tiles go through a workspace (start_inverse "tiles") or XLA.
INVERSE_KERNEL_UP_TO = 64
# The penalty path's products transposed (penalty_layout "transposed") from this dk, on the
# block's rows below it (the plan's choice; kernels/DESIGN.md, "The plan").
TRANSPOSED_PENALTY_FROM_DK = 128
# The differentiated penalty scan keeps A (the row cotangents' [dk, dk] residual) at every
# this-many-th chunk start of each scan segment, the segment's first chunk included; the
# row-cotangent kernel rebuilds a chunk start between them from the kept one and the
# Woodbury rows of the up to CHUNK_START_STRIDE - 1 chunks between, downdate by downdate as
# the scan carried A (kernels/DESIGN.md, "Penalty backward"). 4 against 1 (every start), one
# H100, bf16 fwd + bwd, H = 16, B * T = 32768: peak 4825 -> 4321 MB at d = 128 (2003 -> 1907
# at d = 64), time within 1% either way at d = 64 / 128 and T = 4k / 32k, gradients
# bit-identical (results/bench/decisions/chunk_start_stride_h100.jsonl).
CHUNK_START_STRIDE = 4


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Options of the Pallas VLA kernels (hashable).

  Attributes:
    chunk_size: tokens per chunk C, a power of two in [16, 128]. Default 64.
    precision: `jax.lax.Precision` of the matrix products of every kernel and of the XLA parts,
      JAX's meaning (README.md, "Precision"); default DEFAULT. The products it gives each
      stage, float64 inputs and interpret mode: kernels/DESIGN.md, "Precision".
    block_v: value rows BV of the state per program of the sequential state loops (a power of
      two >= 16 dividing dv), or None (default): min(dv, 32), or 16 where that leaves at most
      32 programs (`Plan.block_v`).
    block_factor, start_inverse, penalty_layout: None (default) for the plan's choice, or a
      string that forces one form (tests, benchmarks, the GPU check). Each form computes the
      same function to float32 rounding; None picks the forms that were faster on a GPU, by
      key head dim dk (kernels/DESIGN.md, "The plan"):
    block_factor: how the penalty scan gets L^-1 of each 16-token block's I + X U^T = L L^T:
      "newton" (None's choice; two Newton steps of 16 x 16 products where ||X U^T||_F <= 0.25,
      the elimination elsewhere; `common.guarded_chol_inv`) or "elimination" (16 dependent
      elimination steps in every block, `common.chol_inv`).
    start_inverse: how the segment starts are formed at dk = 128 (at dk <= 64 always in the
      kernels): "tiles" (None's choice for float32 states, whose starts are exact: the Gram
      kernel for bfloat16 inputs, and one program per start: a block Cholesky inverse on
      32 x 32 tiles that live in a global-memory workspace; `segment_starts.py`; float64
      states stay XLA: the Gram kernel's [128, 128] float64 sum spills), or "xla" (Grams and
      batched Cholesky inverses in XLA).
    penalty_layout: how the penalty path's products are laid out: "rows" (None's choice at
      dk <= 64; the penalty scan's products on the block's rows, X = U A,
      W = E A - tril(E Y^T) Y, A <- A - Y^T Y: the 16 tokens on the products' M side and the
      carried A their right operand; the u-cotangent kernel carries E and forms U E + U E^T)
      or "transposed" (None's choice at dk = 128; the same products transposed,
      X^T = A U^T, W^T = A E^T - Y^T tril(E Y^T)^T, A <- A + (-Y^T) Y: the head dim on the
      M side, A the left operand and the downdate's accumulator; the u-cotangent kernel
      carries the symmetric F = E + E^T and forms one U F).
  """

  chunk_size: int = 64
  precision: jax.lax.Precision = jax.lax.Precision.DEFAULT
  block_v: int | None = None
  block_factor: str | None = None
  start_inverse: str | None = None
  penalty_layout: str | None = None

  def __post_init__(self):
    p = self.precision
    if p is None:
      p = jax.lax.Precision.DEFAULT
    elif isinstance(p, str):
      try:
        p = jax.lax.Precision(p)
      except ValueError:
        pass
    object.__setattr__(self, "precision", p)

  def validate(self, dk, dv):
    """Raises ValueError for shapes or options the kernels do not support."""
    C = self.chunk_size
    if (not isinstance(C, int) or isinstance(C, bool) or C < MIN_CHUNK or C > MAX_CHUNK
        or C & (C - 1)):
      raise ValueError(f"chunk_size must be a power of two in [{MIN_CHUNK}, {MAX_CHUNK}] for "
                       f"the Pallas kernels; got {C!r}")
    for name, d in (("dk (key/query head dim)", dk), ("dv (value head dim)", dv)):
      if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{name} must be one of {SUPPORTED_HEAD_DIMS} for the Pallas "
                         f"kernels; got {d}")
    if self.precision not in PRECISIONS:
      raise ValueError("precision must be a jax.lax.Precision (DEFAULT, HIGH or HIGHEST); got "
                       f"{self.precision!r}")
    bv = self.block_v
    if bv is not None and (not isinstance(bv, int) or isinstance(bv, bool) or bv < 16
                           or bv & (bv - 1) or dv % bv):
      raise ValueError(f"block_v must be None or a power of two >= 16 that divides dv={dv}; "
                       f"got {bv!r}")
    for name, allowed in (("block_factor", BLOCK_FACTORS), ("start_inverse", START_INVERSES),
                          ("penalty_layout", PENALTY_LAYOUTS)):
      if getattr(self, name) is not None and getattr(self, name) not in allowed:
        raise ValueError(f"{name} must be None (the plan's choice) or one of {allowed}; got "
                         f"{getattr(self, name)!r}")

  def plan(self, *, low, acc, dk, dv, BH, N, interpret, target=None):
    """The kernels' choices for one call (`Plan`). low: the inputs are all bfloat16 (so that
    at precision DEFAULT products, factors between kernels and the inference forward's layout
    follow them); acc: the accumulation dtype (float32 or float64); BH = B * H sequences of N
    chunks; interpret: Pallas interpret mode; target: the GPU compiled for (`Target`, from
    `compile_target`), None in interpret mode or where unknown.

    Raises RuntimeError for a compiled call whose kernels cannot run on `target` (naming it
    and the alternatives)."""
    P = jax.lax.Precision
    low = bool(low) and self.precision == P.DEFAULT
    _check_target(interpret, target)
    if self.precision == P.HIGHEST:
      kind = "ieee"
    elif self.precision == P.HIGH:
      kind = "tf32x3"
    else:
      kind = "bf16" if low else "tf32"
    accurate = "tf32x3" if kind in ("bf16", "tf32") else kind   # products that must be ~f32
    prec = lambda k: dot_precision(k, acc, interpret)
    # The state kernels and the chunk-local VJP: `precision` itself at DEFAULT and HIGHEST
    # (Triton: TF32 and IEEE), three TF32 passes at HIGH (Triton runs Precision.HIGH as TF32).
    state_dot = prec("tf32x3") if self.precision == P.HIGH else self.precision
    # Penalty-scan warps: one warp for one-pass TF32 or bfloat16 products at dk <= 64 (d = 64:
    # penalty path 1.38 against 1.83 ms at 4 warps, T = 4096, B = 8, with 4x the segments;
    # with three-pass products one warp spills), else 4, and 8 at dk = 128 (the carried
    # [128, 128] A spills 0.9 KB a thread at 8 warps against 2.5 KB at 4).
    scan_warps = 8 if dk >= 128 else (1 if dk <= 64 and kind in ("bf16", "tf32") else 4)
    seg = segments_for(BH, N, RESIDENT_AT_4_WARPS * 4 // scan_warps)
    bv = self.block_v
    if bv is None:
      bv = min(dv, 16) if BH * (dv // min(dv, 32)) <= SMALL_VALUE_BLOCK_AT else min(dv, 32)
    # Exact segment starts (float64 prefix sums and Newton steps; segment_starts.py) for every
    # float32 state: direct float32 starts err by ~eps * cond(M), 3.4e-5 in o at T = 16384,
    # d = 32, anisotropic u (CPU), against 1.1e-6 exact. With bfloat16 or one-pass TF32
    # products that error, small beside the products' own, reaches the state's columns that no
    # write erases and adds up over the sequence (kernels/DESIGN.md, "Precision"): float32
    # inputs at DEFAULT, d = 128, T = 131072, lam0 = 0.1, anisotropic unit-norm u, one H100:
    # o 1.34e-2 against float64 with direct XLA starts (4.3e-3 -> 1.9e-2 by quarter), 2.5e-3
    # exact (isotropic u 7.7e-4; results/bench/decisions/drift_stages_h100.jsonl). (Direct
    # starts on the tiles gave NaN there from token 42,782: start_tiles_nan_h200.jsonl.)
    # Cost, d = 64, T = 4096, B = 8, one H100: float32 DEFAULT forward 3.28 against 2.81 ms
    # direct (+17%), fwd + bwd 7.30 against 6.57 (+11%); bfloat16 1.95 against 1.65 (+18%),
    # 5.29 against 4.83 (+9%) (results/bench/decisions/guard_and_starts_h100.jsonl).
    exact = jnp.dtype(acc) == jnp.float32
    # The penalty path's forms where the config leaves them None, by key head dim (timed
    # against each other on one H100, in both orders: kernels/DESIGN.md, "The plan";
    # results/bench/decisions/options_h100.jsonl): the Newton block factor at every dk (the
    # elimination stays its fallback), and at dk = 128 the transposed layout and, for exact
    # starts, the segment starts in the kernels (float32 states; float64 ones stay XLA,
    # `inverse_kernel`); at dk <= 64 the rows layout (the starts run in the kernels there
    # either way).
    block_factor = self.block_factor or "newton"
    penalty_layout = self.penalty_layout or (
        "transposed" if dk >= TRANSPOSED_PENALTY_FROM_DK else "rows")
    start_inverse = self.start_inverse or (
        "tiles" if dk > INVERSE_KERNEL_UP_TO and exact else "xla")
    programs = BH * (dv // bv)
    # The Newton step in the states' own dtype only on direct starts (float64 states): exact
    # starts take float64 steps after the float32 inverse, which then runs on 32 x 32 tiles
    # (0.123 against 0.200 ms whole-matrix with the step at d = 64, T = 4096, B = 8). At
    # dk = 128 (start_inverse "tiles") always tiles: the whole matrix spills.
    newton = not exact
    adjoint_warps = 8 if dk >= 128 else 4
    return Plan(
        chunk_size=self.chunk_size, interpret=bool(interpret), acc=jnp.dtype(acc).name,
        precision=self.precision, low=low,
        factor_dot=prec(kind), block_factor=block_factor,
        # Newton steps for the block factor: one TF32 pass where the scan's products are
        # bfloat16 or one-pass TF32 (its L^-1 then enters Y = L^-1 X rounded to bfloat16 or
        # TF32 anyway), the scan's own kind at HIGH and HIGHEST.
        newton_dot=prec("tf32" if kind == "bf16" else kind),
        # Penalty-scan blocks and row cotangents of large penalty gain
        # (`penalty_scan.GAIN_LIMIT`: early in a sequence or document, or along a direction u
        # has not taken) in three TF32 passes where the scan's own products are bfloat16 or
        # one-pass TF32. (bfloat16 products of split operands, hi hi + hi lo + lo hi, err
        # ~2^-16 of A: o 0.15 off at d = 64, |u| = 8, lam0 = 1e-3, gains 6e4, interpret mode.)
        accurate_dot=prec("tf32x3") if kind in ("bf16", "tf32") else None,
        scan_warps=scan_warps, segment_chunks=seg,
        segments=-(-N // seg), chunk_start_stride=CHUNK_START_STRIDE, exact_starts=exact,
        inverse_kernel=dk <= INVERSE_KERNEL_UP_TO or (start_inverse == "tiles"
                                                      and jnp.dtype(acc) == jnp.float32),
        # The segment starts' Grams in three TF32 passes for bfloat16 u too: with bfloat16
        # tensor-core products (exact products of bfloat16 numbers, float32 sums) o drifted
        # with T where u is anisotropic (one H100, d = 128, T = 131072, lam0 = 0.1, unit-norm
        # u: 1.47e-2 against the float64 reference, by quarter 6.5e-3 -> 2.1e-2; isotropic
        # 5.0e-3); with three passes 5.3e-3, flat, and raising any other stage's products
        # left it at 1.44-1.47e-2 (results/bench/decisions/drift_stages_h100.jsonl). One TF32
        # pass drifts as bfloat16 does (1.56e-2; bfloat16 values are exact in TF32, so the
        # sums, not the operands, err). Cost: forward +0-4% at d = 64 / 128, T = 4k / 32k,
        # +7-12% at d = 128, 32k (B = 1), fwd + bwd +1-2%
        # (results/bench/decisions/gram_products_h100.jsonl).
        inverse_dot=prec(accurate), gram_dot=prec(accurate),
        newton_step=newton,
        inverse_tile=32 if dk % 32 == 0 and not newton else None,
        state_factor_dot=prec("bf16" if low else kind),
        state_apply_dot=prec("bf16") if low and acc != jnp.float64 else state_dot,
        state_dot=state_dot, xla_dot=state_dot,
        # Three-pass TF32 products in the u-cotangent kernel at dk = 128 ask for 256 KB of
        # shared memory (H200: 227 KB; the launch fails), so there they run in IEEE float32.
        du_dot=prec("ieee") if kind == "tf32x3" and dk >= 128 else state_dot,
        block_v=bv,
        split_output=dk >= SPLIT_OUTPUT_FROM_DK or programs < SPLIT_OUTPUT_BELOW,
        split_backward=dk >= SPLIT_BWD_FROM_DK or programs <= SPLIT_BWD_UP_TO,
        penalty_layout=penalty_layout,
        fused_vjp=max(dk, dv) <= FUSED_VJP_F32_UP_TO or low,
        adjoint_warps=adjoint_warps,
        # The row-cotangent kernel with large-gain rows (its one-pass and three-pass products
        # both on float32 operands) asks for 256 KB of shared memory at 8 warps and dk = 128
        # (H100: 227 KB; the launch fails, and with it every float32 gradient at DEFAULT, as
        # XLA loads both branches of the call's choice); 4 warps launch.
        guarded_row_warps=4 if kind == "tf32" else adjoint_warps)


def _check_target(interpret, target):
  """RuntimeError for a compiled call whose target GPU the Triton kernels do not run on."""
  capability = None if interpret or target is None else target.capability
  if capability is not None and capability < TRITON_MIN_CAPABILITY:
    raise RuntimeError(
        "the Pallas VLA kernels (Triton) need an NVIDIA GPU of compute capability >= "
        f"{'%d.%d' % TRITON_MIN_CAPABILITY}; the target is {target}. Use impl='chunked' "
        "(XLA, any device) or interpret=True (slow).")


@dataclasses.dataclass(frozen=True)
class Plan:
  """The kernels' internal choices for one call, from `KernelConfig.plan` (hashable: the
  static argument of the custom VJPs). Products are `common.dot` precisions.

  Attributes:
    chunk_size, interpret, precision: from the config and the call; acc: accumulation dtype.
    low: bfloat16 inputs at precision DEFAULT: bfloat16 product operands in the penalty and
      state-prep kernels and the chunk-local VJP, factors passed between the inference
      forward's kernels in bfloat16 (half the bytes; d = 64, T = 4096: forward 2.12 -> 1.61
      ms with the in-place layout below), except the write directions a (float32: their
      rounding adds up in the state where u is anisotropic; kernels/DESIGN.md, "Precision"),
      and the inference kernels reading the caller's [B, T, H, d] arrays in place (no XLA
      transposes; the kernels make the unit keys).
    factor_dot: the penalty scan's and the row-cotangent kernel's products (in bfloat16 mode
      the carried A and A_c as two bfloat16 parts, `common.split_operand`).
    block_factor: `KernelConfig.block_factor`, "newton" where it is None; newton_dot: the
      products of its Newton steps.
    accurate_dot: None, or the products of the penalty-scan blocks and row cotangents whose
      penalty gains exceed `penalty_scan.GAIN_LIMIT` where `factor_dot` is bfloat16 or
      one-pass TF32 (three TF32 passes: such a block shrinks A by more than the low-precision
      products resolve).
    scan_warps: warps of the penalty scans; segment_chunks: chunks per segment of the scan
      (one wave of programs); segments: segments per sequence.
    chunk_start_stride: the differentiated scan keeps A at every this-many-th chunk start
      of each segment (`CHUNK_START_STRIDE`); the row-cotangent kernel rebuilds the others.
    exact_starts: segment starts from float64 Grams, prefix sums and Newton steps (error
      ~eps at any T; every float32 state), else direct (in the states' dtype: float64).
    inverse_kernel: segment starts (Grams and inverses) in the Pallas kernels (else XLA: at
      dk = 128 for float64 states or `KernelConfig.start_inverse` "xla");
      inverse_dot: the inverse kernel's products; gram_dot: the Gram kernel's products;
      newton_step: one Newton step on each direct segment-start inverse in its own dtype;
      inverse_tile: None or 32 (block Cholesky on tiles).
    state_factor_dot, state_apply_dot: the state-prep kernel's products that form its
      inverse (block doubling) and those that apply it; state_dot: the state loops' and the
      reverse pass's products.
    block_v: value rows per program of the state loops.
    split_output, split_backward: the state forward and reverse pass as a chain plus a
      parallel per-chunk kernel (else one fused loop).
    penalty_layout: `KernelConfig.penalty_layout` (where None, "transposed" at dk = 128,
      "rows" below), the layout of the penalty scan's and the u-cotangent kernel's products.
    fused_vjp: the chunk-local VJP of the state path in one kernel (else XLA products).
    adjoint_warps: warps of the row-cotangent and u-cotangent kernels (4, 8 at dk = 128: the
      u-cotangent kernel then takes 175 registers, no spills).
    guarded_row_warps: warps of the row-cotangent kernel with large-gain rows
      (`accurate_dot`): 4 with float32 operands (one-pass TF32 at DEFAULT), else
      `adjoint_warps`.
    du_dot: the u-cotangent kernel's products (`state_dot`, IEEE at HIGH with dk = 128).
    xla_dot: the XLA products between the kernels (the penalty adjoint's segment sums, the
      chunk-local VJP where it is XLA): `precision`, except three TF32 passes at HIGH (XLA,
      like Triton, runs Precision.HIGH as one TF32 pass on GPUs).
  """

  chunk_size: int
  interpret: bool
  acc: str
  precision: jax.lax.Precision
  low: bool
  factor_dot: object
  block_factor: str
  newton_dot: object
  accurate_dot: object
  scan_warps: int
  segment_chunks: int
  segments: int
  chunk_start_stride: int
  exact_starts: bool
  inverse_kernel: bool
  inverse_dot: object
  gram_dot: object
  newton_step: bool
  inverse_tile: int | None
  state_factor_dot: object
  state_apply_dot: object
  state_dot: object
  block_v: int
  split_output: bool
  split_backward: bool
  penalty_layout: str
  fused_vjp: bool
  adjoint_warps: int
  guarded_row_warps: int
  xla_dot: object
  du_dot: object

  @property
  def store(self):
    """dtype of the per-token factors between the inference forward's kernels."""
    return jnp.dtype(jnp.bfloat16 if self.low and self.acc == "float32" else self.acc)


@dataclasses.dataclass(frozen=True)
class Target:
  """The GPU a compiled call is for: `kind` (its device_kind, for messages) and `capability`
  (compute capability (major, minor); None where unknown: a ROCm GPU, an abstract device of
  unknown kind)."""

  kind: str
  capability: tuple[int, int] | None

  def __str__(self):
    known = self.capability is not None
    return (f"{self.kind!r} (compute capability "
            f"{'%d.%d' % self.capability if known else 'unknown'})")


def compile_target(interpret):
  """The `Target` of a call: None in interpret mode, else the device it compiles for
  (`target_device`: the abstract mesh's while lowering for one, else JAX's default device).
  RuntimeError when that device is not a GPU."""
  if interpret:
    return None
  device = target_device()
  if device.platform not in ("gpu", "cuda", "rocm"):
    raise RuntimeError(
        "the Pallas VLA kernels compile for a GPU; the target device is "
        f"{device.device_kind!r} ({device.platform}). Use impl='chunked' (XLA, any device) "
        "or interpret=True (the same kernels in Pallas interpret mode, slow).")
  return Target(device.device_kind, compute_capability(device))


def segments_for(BH, N, resident=RESIDENT_AT_4_WARPS):
  """Chunks per segment of the penalty scan: as many segments as fit in one wave of `resident`
  programs, at least one, never fewer than one chunk per segment (one wave against two:
  11% faster at T = 4096, B = 8 and 16% at T = 32768, B = 1)."""
  S = min(N, max(1, resident // BH))
  return -(-N // S)


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
