"""State path of VLA as a Pallas (Triton) kernel: the generalised delta rule without decay.

Per head, with erase keys e_t (VLA: khat_t) and write keys w_t (VLA: a_t):

    S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T,    o_t = S_t q_t.

Chunkwise form (chunks of C tokens, chunk-start state S_c, rows of Q, E, W, V stacked):

    L  = strictly_lower(E W^T),  T = (I + L)^-1          [C, C]  (unit lower triangular)
    U' = T V,  W' = T E,  P = tril(Q W^T)                 [C, dv], [C, dk], [C, C]
    R  = U' - W' S_c^T                                    [C, dv]  residuals
    O  = Q S_c^T + P R                                    [C, dv]
    S_next = S_c + R^T W                                  [dv, dk]

U', W' and P do not depend on S_c: they are computed for all chunks at once in XLA. Only the
pass over chunk states is sequential; it runs in `_fwd_kernel`, one program per (batch * head,
block of BV value rows), the state [BV, dk] carried in registers.

Backward. The chunk map is affine in S: S_next = S F + G with F = I - W'^T W, and
O = (Q - P W') S^T + P U'. So the cotangent of the state runs backwards through
    dS_c = dS_next - (dS_next W^T) W' + dO^T (Q - P W'),
which `_bwd_kernel` carries in registers (reverse over chunks), storing dS_next of every chunk.
With the chunk-start states S_c saved by the forward kernel, the cotangents of the chunk-local
inputs (q, e, w, v of each chunk) are then independent: one `jax.vmap` of `jax.vjp` of the
pure-JAX chunk map `_chunk_map(S_c, q, e, w, v) -> (O, S_next)` fed (dO, dS_next).

Layout inside this module: head-major, time flattened: [BH, N * C, d] with BH = B * H.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vla_jax.kernels.layout import rows_spec
from vla_jax.kernels.state_grad import chunk_local_vjp
from vla_jax.kernels.triangular import SOLVERS, tri_inverse, tril_inverse_products
from vla_jax.ops.checks import compute_dtype

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
MIN_CHUNK, MAX_CHUNK = 16, 128
PREPS = ("xla", "kernel", "split", "scan")
PREP_DOTS = ("auto", "tf32x3", "ieee", "tf32", "bf16")
STATE_PREP_DOTS = ("auto", "tf32", "bf16")
REVERSE_DOTS = ("auto", "tf32", "bf16")
FACTOR_DTYPES = ("auto", "float32", "bfloat16")
INPUT_LAYOUTS = ("auto", "transposed", "direct")
GRAD_LAYOUTS = ("transposed", "direct")
PREP_FORMS = ("panels", "tiles")
SPLIT_INVERSES = ("auto", "kernel", "xla")
PENALTY_GRADS = ("auto", "autodiff", "chunk", "scan", "adjoint")
STATE_OUTPUTS = ("auto", "fused", "split")
# state_output="auto": the split chain + output kernels when the fused loop would have fewer
# programs than this (an H200 has 132 SMs; measured, d = 64: split 1.88 against 2.43 ms at
# 32 programs, fused 1.20 against 1.27 ms at 256), and at dk >= SPLIT_OUTPUT_FROM_DK whatever
# the programs (d = 128, T = 4096, B = 8, 512 programs: the forward's state path 0.82 ms split
# (chain 0.46 + outputs 0.36) against 0.99 fused; gradient device time 13.31 -> 12.54 ms).
SPLIT_OUTPUT_BELOW = 132
SPLIT_OUTPUT_FROM_DK = 128
# state_bwd="auto": the split reverse pass (per-chunk terms, then the chain) below this many
# programs. H200, d = 64, bf16, the reverse pass's device time: 0.37 ms split against 0.40 fused
# at 256 programs (T = 4096, B = 8); 1.13 against 1.96 at 32 (T = 32768, B = 1); 0.32 (terms
# 0.18 + chain 0.14) against 0.40 at 512 (T = 2048, B = 16; gradient 4.08 -> 4.00 ms). Not
# measured above 512 programs (T <= 1024 at 32k tokens), which stay fused. At dk >=
# SPLIT_BWD_FROM_DK always split: d = 128, T = 4096, B = 8 (512 programs), reverse pass 1.00 ms
# (terms 0.46 + chain 0.55) against 2.80 fused, gradient device time 15.58 -> 13.80 ms.
SPLIT_BWD_UP_TO = 512
SPLIT_BWD_FROM_DK = 128
# block_v=None: value blocks of 16 rows instead of 32 when the sequential state loops would
# have at most this many programs at 32 (B * H * dv / 32): twice the programs for a GPU that
# few of them leave mostly idle. H200, d = 64, bf16, T = 32768, B = 1, H = 16 (32 programs):
# device time of the forward 1.90 -> 1.77 ms (state chain 0.74 -> 0.61), of the gradient
# 6.92 -> 6.65 (reverse chain 0.97 -> 0.80); at 256 programs (T = 4096, B = 8) 16 rows were
# slower (gradient 5.45 -> 5.99). Not measured between.
SMALL_VALUE_BLOCK_AT = 32
STATE_BWDS = ("auto", "fused", "split")
STATE_LOCAL_VJPS = ("auto", "xla", "kernel", "products", "fused")
# state_local_vjp values that reuse the forward's P and unit-triangular inverses (residuals).
REUSE_LOCAL_VJPS = ("products", "fused")
LOCAL_VJP_DOTS = ("auto", "bf16")
GRAD_PREPS = ("xla", "kernel")
SEGMENT_INVERSES = ("auto", "xla", "kernel")
SEGMENT_GRADS = ("autodiff", "products")
SEGMENT_GRAMS = ("xla", "kernel")
ADJOINT_DUS = ("xla", "kernel", "carried")
WRITE_NORMS = ("xla", "kernel")


# ----------------------------------------------------------------------------- configuration

@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Options of the Pallas VLA kernels (hashable: one static argument of `custom_vjp`).

  Attributes:
    chunk_size: tokens per chunk C, a power of two in [16, 128]. Default 64.
    block_v: value rows BV of the state per program (a power of two >= 16 dividing dv), or
      None: min(dv, 32), or 16 where the sequential loops would have at most
      `SMALL_VALUE_BLOCK_AT` programs (B = 1 at d = 64; `value_block`). The grid is
      (B * H, dv / BV).
    num_warps: Triton warps per program. Default 4.
    num_stages: Triton software-pipelining stages of the chunk loop. Default 2.
    precision: precision of float32 matrix products, in the kernels and the XLA parts:
      `jax.lax.Precision.DEFAULT` (TF32 on NVIDIA GPUs; fast) or `HIGHEST` (full float32).
    refine: one Newton step A <- A + A (I - M A) on each chunk-start inverse of the penalty
      path (see `penalty.py`): True, False or "auto" (default: False for bfloat16 inputs
      with prep="scan" and precision=DEFAULT (`for_inputs`), whose outputs round to 8 bits,
      while with float32-accurate products the step gains at most ~2x on M^-1 (relative error
      ~7e-9 * cond(M) either way at cond 1e2-1e5, kernels/NOTES.md); True otherwise).
      H200, d = 64, bf16, T = 4096, B = 8, with inverse_tile=32: the segment-start inverse
      kernel 0.225 ms with the step (the tiled program spills) against 0.123 without.
    solver: how the XLA parts apply triangular inverses: "doubling" (default: block-doubling
      inverse from batched products, `vla_jax.ops.utils.tril_inverse`; its backward is
      products only too: `penalty._chol_inverse_products`, `triangular.tril_inverse_products`,
      no triangular solve anywhere in the gradient; H200, H = 16, d = 64, T = 4096:
      forward+backward 18.7 ms against 29.9 with "triangular_solve"), "triangular_solve"
      (XLA's batched solve) or "nilpotent" (matrix products only, `triangular.py`). Same
      function.
    prep: how `vla_pallas`'s forward computes the per-chunk factors: "xla" (the XLA penalty path
      of `penalty.py` plus `_factors`), "kernel" (one Pallas program per chunk,
      `chunk_prep.py`), "split" (three smaller Pallas kernels, each parallel over chunks:
      chunk-start inverses, penalty rows, state-path factors; `split_prep.py`) or "scan" (A
      carried through the downdates by `penalty_scan.py`, one program per segment, then the
      split state-path-factor kernel). Gradients are
      the same either way (the backward is the XLA path's; with prep="scan" and
      penalty_grad="chunk" the differentiated forward keeps `penalty_scan.py`, see below).
    prep_dot: with prep="kernel", "split" or "scan" on a GPU, how the factorisation products
      run: "tf32x3" (three TF32 tensor-core products, about float32 accuracy), "ieee" (full
      float32 on CUDA cores), "tf32" (one TF32 product), "bf16" (below) or "auto" (default:
      with prep="scan" and precision=DEFAULT "bf16" for bfloat16 inputs (`for_inputs`, which
      `vla_pallas` applies) and "tf32" for others, i.e. products at the inputs' precision;
      else "tf32x3"; `factor_dot` is the resolved value). H200, H = 16, d = 64, bf16,
      T = 4096: the penalty kernel 1.26 ms with "tf32" against 1.67 with "tf32x3", unit write
      directions within 7.8e-4 of float64 against 1.3e-6 (kernels/NOTES.md). "bf16"
      (prep="scan" only): the penalty kernels (`penalty_scan.py`, `penalty_scan_bwd.py`) round
      their product operands to bfloat16 (float32 accumulation, A carried in float32), which
      saves TF32's per-element rounding (four instructions an element, most of the 1-warp
      kernel's non-product work) and halves the tensor-core instructions; the state-path
      factor products keep "tf32" unless `state_prep_dot` says otherwise. Float64 always uses
      full precision; interpret mode uses full precision except for "bf16", which it emulates
      (operands rounded to bfloat16).
    prep_form: layout of the chunk-prep kernel's in-register matrices: "panels" (A_c one
      [dk, dk] value, C-row matrices as 16-row panels: few, larger products) or "tiles" (all
      16 x 16 tiles: many small products, smaller live values). Same function.
    split_inverse: with prep="split", where the chunk-start inverses A_c = M_c^-1 come from:
      "kernel" (`split_prep.spd_inverse`), "xla" (`penalty._spd_inverse` with `solver`) or
      "auto" (default: the kernel for dk <= 64; at dk = 128 it spills and its shared memory
      exceeds an H200 SM's, so XLA).
    state_prep_dot: with prep="scan", the products of the state-path factor kernel
      (`split_prep.state_prep`: N = E Ahat^T, the block-doubling inverse T = (I + N)^-1, U' = T V,
      W' = T E, P = Q Ahat^T) in the forward and, with grad_prep="kernel", in the gradient:
      "auto" (default: "bf16" for bfloat16 inputs (`for_inputs`), else `factor_dot`, "tf32"
      where that is "bf16"), "tf32" (one TF32 product, `precision` for the products that
      apply T) or "bf16" (bfloat16 operands, float32 accumulation, all of them). H200, d = 64,
      T = 4096: state-prep kernel -0.24 ms with "bf16". Interpret mode emulates "bf16" and runs
      the others at full precision; float64 always runs at full precision.
    reverse_dot: with penalty_grad="scan", the products of the reverse penalty kernel
      (`penalty_scan_bwd.py`): "auto" (default: `factor_dot`, as the forward), "tf32" or
      "bf16". Offline, bfloat16 operands make that kernel spill at d = 64 where TF32 does not
      (kernels/NOTES.md); this option times the two apart.
    factor_dtype: with prep="scan", the dtype in which the inference forward stores the
      per-token factors between its kernels (the write directions, U', W', P): "auto"
      (default: "bfloat16" for bfloat16 inputs (`for_inputs`), else "float32"), "float32" or
      "bfloat16" (half the bytes the sequential state kernel reads; the kernels still compute
      in float32). The differentiated forward keeps float32. Ignored for
      float64 inputs.
    input_layout: with prep="scan", how the inference forward's kernels get q, k, v, u:
      "auto" (default: "direct" for bfloat16 inputs (`for_inputs`), else "transposed"),
      "transposed" (XLA first makes head-major [B * H, T, d] copies, the keys unit and u in
      the accumulation dtype) or "direct" (the kernels read the caller's [B, T, H, d]
      arrays in place, make the unit keys themselves, and write o as [B, T, H, dv]: no
      transposes or widened copies; the segment-start Grams read u once). Same function; the
      differentiated forward keeps "transposed" (see `grad_layout`).
    grad_layout: how the differentiated path's state kernels get q and v: "direct"
      (default: the state-prep, state, reverse and chunk-local VJP kernels read q, v and the
      output cotangent in place as [B, T, H, d] and write o, dq, dv so: about six XLA
      transposes fewer a forward+backward) or "transposed" (head-major [B * H, T, d] copies
      made by XLA, and o, dq, dv copied back). The keys and u keep their head-major unit
      copies. Same function. H200, H = 16, bf16, gradient device time: d = 64, T = 4096,
      B = 8: 4.23 ms against 4.32 transposed; T = 32768, B = 1: 5.42 against 5.51; with
      adjoint_du="carried" 4.03 against 4.14 and 5.24 against 5.34; d = 128, T = 4096, B = 8:
      14.86 against 15.34.
    scan_block: with prep="scan", tokens per Sherman-Morrison block of `penalty_scan` (16,
      32 or 64). Default 16.
    scan_prefetch: with prep="scan", load the next block's rows before the current block's
      products (same result). Default False: measured within noise of the plain loop (H200).
    segment_chunks: with prep="scan", chunks per segment of `penalty_scan` (one program per
      (batch * head, segment); A is carried through a segment and inverted directly at segment
      starts). None (default): as many segments as fit in one wave of 264 * 4 / warps
      programs (two 4-warp programs per H200 SM; one 8-warp dk = 128 program, which holds the
      whole register file: d = 128, T = 4096, B = 8 forward 7.38 -> 6.36 ms with 1 segment
      instead of 2).
    penalty_grad: how gradients flow through the penalty path: "auto" (default: "adjoint"
      with prep="scan", else "autodiff"; `penalty_backward` is the resolved value), "autodiff"
      (plain autodiff of `penalty.penalty_parallel`, which differentiates every chunk-start
      inverse)
      or "chunk" (`penalty_grad.py`: the chunk-start inverses' cotangents by a reverse
      associative scan of the congruences A_next = Q A Q^T, no inverse differentiated; same
      gradients for q, k, v, u, S0; A0's is its gradient over symmetric perturbations). With
      prep="scan", "chunk" also makes the differentiated forward's penalty path the
      `penalty_scan` kernel (`penalty_grad.penalty_scan_grad`: chunk-start inverses carried,
      inverted directly only at segment starts) instead of `penalty.penalty_parallel`.
      "scan" (prep="scan" only): the same forward kernel, and the backward a reverse Pallas
      kernel over the same segments (`penalty_scan_bwd.py`, `penalty_grad.
      penalty_scan_grad`: A recomputed block by block from the carried chunk starts,
      the A-cotangent carried back through the blocks; segment-start inverses differentiated
      in XLA). Same gradients as "chunk". H200, d = 64, T = 4096, doubling solver:
      forward+backward 16.9 ms ("scan", unrolled block walk; 13.9 with the default loop),
      18.8 ("chunk"), 18.7 ("autodiff"). "adjoint" (prep="scan" only): the
      same forward kernel; the backward needs no reverse walk: since A_t = M_t^-1 with M_t
      additive in the u u^T, dkhat_t = A_t dW_t is the penalty scan run again on the rows
      dW, and du, dA0 follow from reverse prefix sums of Z_t W_t^T (linear-attention-shaped
      products; `penalty_grad._scan_adjoint_bwd`). Its differentiated forward is the
      inference path's scan (layout by `scan_warps`, not `grad_scan_warps`; segment-start
      inverses by `segment_inverse`), writing unnormalised rows and no chunk-start inverses.
      Same gradients. H200, bf16, H = 16, gradient device time (kernels/NOTES.md): d = 64,
      T = 4096, B = 8: 5.84 ms against 7.39 with "scan"; d = 128: 16.7 against 19.8 ms.
    scan_bwd_unroll: with the reverse penalty kernel (penalty_grad "scan"), how it walks a chunk's
      blocks (`penalty_scan_bwd`'s `unroll`): False (default) loops over them, each block's start
      recomputed from the chunk start (more downdates, a smaller program); True unrolls them, the
      block-start inverses kept as values. Same function. H200, H = 16, d = 64, bf16, T = 4096:
      forward+backward 13.9 ms with False against 17.0 with True, first call (compilation) 8.9 s
      against 59 s (kernels/NOTES.md).
    grad_stride: with the reverse penalty kernel, tokens between the penalty inverses that
      the differentiated forward saves for it, or None (default): `chunk_size`. A multiple of
      `scan_block` that divides `chunk_size`. The reverse kernel walks each stretch of
      grad_stride tokens backwards and recomputes the starts of its blocks from the saved
      inverse (with the default loop, (s - 1) s / 2 extra block factorisations a stretch of
      s = grad_stride / scan_block blocks: 6 per 64 tokens at the defaults, none at
      grad_stride = scan_block), at the cost of T / grad_stride saved [dk, dk] inverses
      instead of T / chunk_size. Same function.
    state_output: how the state path's forward computes the outputs: "fused" (in the
      sequential chunk loop, `vla_state_fwd`), "split" (the loop keeps only the state chain
      R = U' - W' S^T, S <- S + R^T Ahat and writes every chunk-start state
      (`vla_state_chain`); a second kernel, parallel over (batch * head, chunk), computes
      O = Q S_c^T + P R (`vla_state_out`), as flash-linear-attention splits its delta rule)
      or "auto" (default: "split" when the loop's grid B * H * dv / BV has fewer than 132
      programs, i.e. fewer than an H200's SMs, and at dk >= 128; `output_form` resolves it).
      Same function. d = 128, T = 4096, B = 8 (512 programs): 0.82 ms split against 0.99.
      H200, H = 16, d = 64, bf16: state path 1.88 ms split against 2.43 fused at T = 32768,
      B = 1 (32 programs); 1.27 against 1.20 at T = 4096, B = 8 (256 programs).
    state_bwd: how the state path's reverse pass runs: "auto" (default: "split" up to
      SPLIT_BWD_UP_TO = 512 programs of the loop and at dk >= 128; `backward_form`), "fused" (one
      sequential loop over chunks, `vla_state_bwd`) or "split" (the state-independent term G_n =
      dO_n^T (Q_n - P_n W'_n) of every chunk first, in a kernel parallel over (batch * head, chunk),
      `vla_state_bwd_terms`; then a loop with the chain dS <- dS - (dS Ahat^T) W' + G_n alone,
      `vla_state_bwd_chain`). Same function. H200, d = 64, T = 4096: the reverse pass 0.72 ms
      against 0.76 fused, forward+backward within noise (11.7 against 11.8 ms); T = 32768, B = 1 (32
      programs): 1.13 ms (terms 0.17 + chain 0.96) against 1.96 fused; d = 128, T = 4096, B = 8 (512
      programs): 1.00 ms (terms 0.46 + chain 0.55) against 2.80 fused.
    state_local_vjp: how the state path's backward computes the chunk-local cotangents of q, e, w, v
      (the VJP of each chunk map with its start state fixed, after the reverse pass): "auto"
      (default: "fused", except at head dims above 64 with float32 operands (local_vjp_dot not
      "bf16": float32 inputs), where the fused program needs 352 KB of shared memory: "products";
      `for_inputs`), "fused" (the VJP written out, reusing the forward's P and unit-triangular
      inverse T, kept as residuals (no triangular inverse in the kernel), in one Pallas program per
      (batch * head, chunk), `state_grad._reuse_vjp_kernel`, with `local_vjp_dot`'s operands; 8
      warps (ptxas, sm_90a, bf16 inputs: 224 registers and no spills at d = 64, 56 KB of shared
      memory; at d = 128 136 KB and 416 stack bytes per thread)), "products" (the same VJP as 14
      batched XLA products over all chunks: `_local_vjp_products`; with grad_prep="kernel" the
      state-prep kernel writes T out), "xla" (`jax.vmap` of `jax.vjp` of `_chunk_map`, which
      recomputes the chunk factors and differentiates them) or "kernel" (one Pallas program per
      (batch * head, chunk) that recomputes the factors: `state_grad.py`; dk, dv <= 64 only (ptxas,
      sm_90a: 160 KB of shared memory and 240 stack bytes per thread at d = 64, 8 warps; ~480 KB at
      d = 128, above an SM's 227 KB)). Same function. H200, H = 16, d = 64, bf16, gradient device
      time: "fused" 4.81 ms against 5.45 with "products" at T = 4096, B = 8, 6.28 against 6.92 at T
      = 32768, B = 1. Earlier, at T = 4096, B = 8: the state path's forward+backward 4.1 ms with
      "products" against 5.7 with "xla" (6.2 with "kernel").
    local_vjp_dot: the operands of the written-out local VJP (state_local_vjp="fused" or
      "products"):
      "auto" (default: "bf16" for bfloat16 inputs (`for_inputs`), else `precision`, float32
      operands: TF32 at DEFAULT on a GPU) or "bf16"
      (operands rounded to bfloat16, float32 accumulation: half the bytes read by the 14
      memory-bound products; at T = 4096, B = 8, d = 64 they move ~5.6 GB, 1.5 ms on an
      H200). Float32 inputs, T = 70, d = 32, against float64: gradient errors 3-4.5e-3
      instead of ~5e-7. H200, H = 16, d = 64, T = 4096, B = 8, bf16, with penalty_grad=
      "adjoint": gradient device time 5.65 against 5.84 ms. The intermediates that only feed
      further products (R, dP, dLm, and dX for bfloat16 values) are written in bfloat16 by
      their products (bit-identical on CPU to writing float32 and casting; with the bf16
      writes of the reverse pass: gradient device time 5.65 -> 5.45 ms, same shape).
    grad_prep: where the state path's chunk factors (U', W', P) come from when it runs
      under differentiation (`state_path`, and `vla_pallas`'s gradient): "kernel" (default:
      the `split_prep.state_prep` kernel that the prep="scan" / "split" forward already runs;
      products at `factor_dot`) or "xla" (`_factors`). Same function. H200, d = 64, T = 4096:
      alone within noise (the whole call 11.9 against 11.8 ms with "xla"); with the other
      written-out backward defaults it also supplies T, and the three together give 9.7 ms
      against 11.8.
    segment_inverse: with prep="scan", where the inference path's segment-start inverses
      (`penalty_scan.segment_start_inverses`) run: "kernel" (one Pallas program per segment
      start, and one for A0, `split_prep.spd_inverse` with tf32x3 products; dk <= 64, where
      it does not spill), "xla" (a batched Cholesky, block-doubling inverses and the Newton
      step, several XLA kernels) or "auto" (default: "kernel" at dk <= 64, else "xla";
      `segment_inverter`). Same function; the differentiated path keeps XLA. H200, H = 16,
      d = 64, bf16: penalty path 1.34 ms against 1.49 at T = 4096, B = 8; 1.32 against 1.55
      at T = 32768, B = 1.
    adjoint_du: with penalty_grad="adjoint", where the chunk-local part of the u cotangents
      runs: "carried" (default: one program per (batch * head, chunk) keeps the products on
      chip, the later chunks' suffix sums carried through segments of up to 8 chunks inside
      the kernel (`adjoint_du.carried_u_cotangents`) with one XLA product per segment),
      "kernel" (`adjoint_du.chunk_u_cotangents_kernel`: the same products on the suffix sums
      of every chunk, written per chunk by XLA's reverse prefix sum, and the kernel adds
      their transpose itself) or "xla" (`vla_jax.ops.vla.penalty.chunk_u_cotangents`, five
      batched products and two masks, each writing a [C, C] or [C, dk] float32 array per
      chunk). Same function. H200, H = 16, bf16, gradient device time: d = 64, T = 4096,
      B = 8: "carried" 4.14 ms against 4.32 with "kernel" (the carried kernel 0.34 ms
      against 0.31; "xla" 4.85 against "kernel"'s 4.42 a session earlier); T = 32768, B = 1:
      5.34 against 5.51; d = 128, T = 4096, B = 8: 15.34 against 15.58 (the carried kernel
      2.06 ms against 1.38: it spills, 360 stack bytes).
    inverse_tile: with the segment-start inverses in the kernel (`segment_inverse`), how the
      `split_prep.spd_inverse` program inverts each [dk, dk] matrix: None (dk elimination steps on
      the whole matrix, `_chol_inv`) or 16 / 32 (a block Cholesky on t x t tiles: dk / t elimination
      loops of t steps on one tile each, the rest tile products; `_tiled_inverse_kernel`), or "auto"
      (default: 32 where `for_inputs` turns `refine` off (bfloat16 inputs) and 32 divides dk, else
      None). Same function. H200, d = 64, bf16, B * H = 128 sequences (896 programs at T = 4096),
      without the Newton step: 0.123 ms against 0.200 for the whole-matrix form (with it, 0.225:
      tile 32 with the step spills 256 bytes); tile 16: 0.126 ms. Forward device time 1.13 -> 1.05
      ms at T = 4096, B = 8 and 1.67 -> 1.58 at T = 32768, B = 1.
    write_norm: with penalty_grad="adjoint", where the differentiated path makes the unit write
      directions a_t = unit(A_t khat_t) and their VJP: "xla" (the scan writes the rows A_t khat_t,
      XLA normalises them, and XLA's autodiff of the normalisation feeds the backward's second scan)
      or "kernel" (the forward scan writes both the unit rows and the plain rows
      (`penalty_scan(normalize="both")`), and the backward's second scan makes the rows' cotangents
      from the unit rows' on load (`penalty_scan(vjp_rows=)`): no XLA pass over the rows either way;
      the default). Same function. H200, bf16, H = 16, gradient device time: d = 64, T = 4096, B =
      8: 3.76 ms against 3.90 with "xla" (XLA 0.44 ms against 0.71; the two scan kernels 0.13 ms
      slower); T = 32768, B = 1: 4.97 against 5.10; d = 128, T = 4096, B = 8: 11.68 against 11.97.
    segment_gram: with the segment-start inverses in the kernel (`segment_inverse`), where the
      per-segment Grams sum u u^T: "kernel" (default: `penalty_scan.segment_grams`, one
      program per (sequence, segment) reading u in place, bf16 products for bf16 u, exact in
      float32 sums; tf32x3 otherwise) or "xla" (one batched product; on the inference path's
      token-major u XLA first copies u into two transposed layouts, 0.04 ms each at d = 64,
      T = 4096, B = 8, beside the 0.04 ms product). Same function. H200, H = 16, d = 64,
      bf16: forward device time 1.13 ms against 1.23 at T = 4096, B = 8 (the kernel
      0.03 ms), 1.81 against 1.90 at T = 32768, B = 1.
    segment_grad: how the backward of the penalty reverse kernel (penalty_grad "scan")
      differentiates the segment-start inverses A_s = (A0^-1 + sum of u u^T before segment
      s)^-1: "products" (default: written out, `penalty_grad.segment_start_vjp`: dM_s = -A_s
      sym(dA_s) A_s, suffix sums over segments, du_t = 2 (sum of dM_s over the segments after
      t's) u_t, dA0 = -A0^-1 (sum of dM_s) A0^-1, with the A_s the forward carried; the
      gradient of the exact inverse, equal to autodiff's to rounding, tested in float64) or
      "autodiff" (`jax.vjp` through the XLA Cholesky, block-doubling inverse, Newton step and
      prefix sums). H200, d = 64, T = 4096, B = 8: forward+backward 11.5 ms against 11.8.
    prep_warps: Triton warps per program of the chunk-prep kernel(s) (prep="kernel": its tiles
      are 16 x 16, so fewer warps than the state kernel may pay). Default 4.
    scan_warps: Triton warps of the forward penalty-scan kernel on the inference path (the
      differentiated forward and the reverse kernel keep `prep_warps`), or None (default):
      1 when `factor_dot` is "tf32" and dk <= 64, else `prep_warps` (8 at dk = 128). With
      fewer warps more programs fit on an SM, so the default segments (`segment_chunks=None`)
      grow to fill them: 4 / warps times as many. H200, d = 64, one-pass TF32: penalty path
      1.38 ms at 1 warp (8 segments) against 1.83 at 4 (2 segments), T = 4096, B = 8; with
      tf32x3 products 1 warp spills and is slower.
    grad_scan_warps: with penalty_grad "scan" or "chunk" (the "adjoint" default runs the
      inference layout, `scan_warps`), Triton warps of the penalty-scan kernel in the
      differentiated forward (which also writes every chunk-start inverse for the backward),
      or None (default): 1
      when `factor_dot` is "bf16" (bfloat16 inputs) and dk <= 64, else the reverse kernel's
      (`prep_warps`, 8 at dk = 128) and its segments (`penalty_scan.grad_scan_warps`). With
      fewer warps the forward's segments grow as on the inference path (4 / warps times as
      many); the reverse kernel keeps its own layout, which it may (it reads A at every chunk
      start, and the function does not depend on where segments start). H200, d = 64,
      T = 4096, B = 8: with TF32 products 1 warp was within noise (9.6 against 9.7 ms
      forward+backward); with bfloat16 products the kernel takes 0.42 ms against 0.89 and the
      gradient 8.07 ms of device time against 8.56.
    bwd_scan_warps: Triton warps of the reverse penalty kernel (penalty_grad "scan"), or None
      (default): `prep_warps` (8 at dk = 128). Its segments grow with fewer warps as the
      forward's do (more segment starts to differentiate: see `segment_grad`). Same function.
      H200, d = 64, T = 4096, B = 8: 2 warps 10.9 ms forward+backward against 9.7 at the
      default (the 2-warp program spills 2 KB a thread: it carries A and its cotangent).
      With penalty_grad="adjoint", the warps of its second forward scan (the Z scan on the
      rows' cotangents), which keeps the forward scan's segments whatever its warps; None:
      the forward scan's (`penalty_scan.forward_scan_warps`, 1 at d = 64 for bf16 inputs).
      H200, d = 64, T = 4096, B = 8 (bf16, write_norm="kernel"): the Z scan takes 0.52 ms
      at 1 warp, 0.67 at 2 and 0.82 at 4 (the gradient 3.69 / 3.84 / 4.00 ms of device
      time), although the 1-warp program spills and the 2-warp one hardly does.
    interpret: run the Pallas kernels in interpret mode (any backend, slow; for CPU tests).
  """

  chunk_size: int = 64
  block_v: int | None = None
  num_warps: int = 4
  num_stages: int = 2
  precision: jax.lax.Precision = jax.lax.Precision.DEFAULT
  refine: bool | str = "auto"
  solver: str = "doubling"
  prep: str = "scan"
  prep_dot: str = "auto"
  prep_form: str = "panels"
  state_prep_dot: str = "auto"
  factor_dtype: str = "auto"
  reverse_dot: str = "auto"
  input_layout: str = "auto"
  grad_layout: str = "direct"
  split_inverse: str = "auto"
  prep_warps: int = 4
  scan_warps: int | None = None
  grad_scan_warps: int | None = None
  bwd_scan_warps: int | None = None
  scan_block: int = 16
  scan_prefetch: bool = False
  segment_chunks: int | None = None
  penalty_grad: str = "auto"
  scan_bwd_unroll: bool = False
  grad_stride: int | None = None
  state_output: str = "auto"
  state_bwd: str = "auto"
  state_local_vjp: str = "auto"
  local_vjp_dot: str = "auto"
  grad_prep: str = "kernel"
  segment_inverse: str = "auto"
  segment_gram: str = "kernel"
  adjoint_du: str = "carried"
  write_norm: str = "kernel"
  inverse_tile: int | str | None = "auto"
  segment_grad: str = "products"
  interpret: bool = False

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
    for name, allowed in (("solver", SOLVERS),
                          ("prep", PREPS),
                          ("prep_form", PREP_FORMS),
                          ("split_inverse", SPLIT_INVERSES),
                          ("penalty_grad", PENALTY_GRADS),
                          ("state_output", STATE_OUTPUTS),
                          ("state_local_vjp", STATE_LOCAL_VJPS),
                          ("local_vjp_dot", LOCAL_VJP_DOTS),
                          ("segment_grad", SEGMENT_GRADS),
                          ("segment_inverse", SEGMENT_INVERSES),
                          ("grad_layout", GRAD_LAYOUTS),
                          ("adjoint_du", ADJOINT_DUS),
                          ("write_norm", WRITE_NORMS),
                          ("segment_gram", SEGMENT_GRAMS),
                          ("grad_prep", GRAD_PREPS),
                          ("state_bwd", STATE_BWDS),
                          ("prep_dot", PREP_DOTS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}")
    bv = self.value_block(dv)
    if bv < 16 or bv & (bv - 1) or dv % bv:
      raise ValueError(f"block_v must be a power of two >= 16 that divides dv={dv}; got "
                       f"{self.block_v!r}")
    if self.scan_block not in (16, 32, 64) or self.scan_block > C:
      raise ValueError(f"scan_block must be 16, 32 or 64 and at most chunk_size={C}; got "
                       f"{self.scan_block!r}")
    r = self.grad_stride
    if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r <= 0
                          or r % self.scan_block or C % r):
      raise ValueError(f"grad_stride must be None or a multiple of scan_block="
                       f"{self.scan_block} that divides chunk_size={C}; got {r!r}")
    t = self.inverse_tile
    if t != "auto" and t is not None and (t not in (16, 32) or isinstance(t, bool) or dk % t):
      raise ValueError(f'inverse_tile must be "auto", None, 16 or 32 (dividing dk={dk}); got '
                       f"{t!r}")
    if self.refine not in ("auto", True, False) or not isinstance(self.refine, (bool, str)):
      raise ValueError(f'refine must be True, False or "auto"; got {self.refine!r}')
    if self.segment_chunks is not None and (not isinstance(self.segment_chunks, int)
                                            or self.segment_chunks < 1):
      raise ValueError(f"segment_chunks must be None or a positive int; got "
                       f"{self.segment_chunks!r}")
    if self.penalty_backward in ("scan", "adjoint") and self.prep != "scan":
      raise ValueError(f'penalty_grad="{self.penalty_backward}" needs prep="scan" (it '
                       f'differentiates the penalty_scan kernel); got prep={self.prep!r}')
    if self.local_vjp_dot == "bf16" and self.local_vjp_form not in REUSE_LOCAL_VJPS:
      raise ValueError('local_vjp_dot="bf16" needs state_local_vjp="products" or "fused"; '
                       f"got {self.state_local_vjp!r}")
    if self.state_local_vjp == "kernel" and max(dk, dv) > 64:
      raise ValueError('state_local_vjp="kernel" supports head dims up to 64 (at 128 its '
                       f"program needs ~480 KB of shared memory); got dk={dk}, dv={dv}")
    if self.segment_inverse == "kernel" and dk > 64:
      raise ValueError('segment_inverse="kernel" supports dk up to 64 (at 128 its program '
                       f"spills and needs 256 KB of shared memory); got dk={dk}")
    if self.prep_warps not in (1, 2, 4, 8):
      raise ValueError(f"prep_warps must be 1, 2, 4 or 8; got {self.prep_warps!r}")
    for name in ("scan_warps", "grad_scan_warps", "bwd_scan_warps"):
      if getattr(self, name) not in (None, 1, 2, 4, 8):
        raise ValueError(f"{name} must be None, 1, 2, 4 or 8; got {getattr(self, name)!r}")
    for name, allowed, default in (("state_prep_dot", STATE_PREP_DOTS, "auto"),
                                   ("factor_dtype", FACTOR_DTYPES, "auto"),
                                   ("reverse_dot", REVERSE_DOTS, "auto"),
                                   ("input_layout", INPUT_LAYOUTS, "auto")):
      value = getattr(self, name)      # options of the prep="scan" kernels only
      if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
      if value != default and self.prep != "scan":
        raise ValueError(f'{name}={value!r} needs prep="scan"; got prep={self.prep!r}')
    if self.prep_dot == "bf16" and self.prep != "scan":
      raise ValueError(f'prep_dot="bf16" needs prep="scan" (only the penalty scan kernels '
                       f'take bfloat16 products); got prep={self.prep!r}')
    if self.precision not in (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST):
      raise ValueError("precision must be jax.lax.Precision.DEFAULT or HIGHEST; got "
                       f"{self.precision!r}")

  @property
  def factor_dot(self):
    """prep_dot with "auto" resolved: "tf32" for prep="scan" at precision=DEFAULT, else
    "tf32x3"."""
    if self.prep_dot != "auto":
      return self.prep_dot
    return ("tf32" if self.prep == "scan" and self.precision == jax.lax.Precision.DEFAULT
            else "tf32x3")

  def for_inputs(self, *xs):
    """This config with the input-dependent "auto" options resolved for inputs xs (q, k, v,
    u). When they are all bfloat16, with prep="scan" and precision=DEFAULT, the products
    round to the inputs' own precision and the inference forward takes its bandwidth options:
    prep_dot and state_prep_dot "bf16", factor_dtype "bfloat16", input_layout "direct" (each
    only where it is "auto"; H200, d = 64, T = 4096: forward 2.12 -> 1.61 ms, kernels/NOTES.md),
    the gradient local_vjp_dot "bf16" (with state_local_vjp="products")), refine False and
    inverse_tile 32 (where 32 divides dk and refine is off).
    Otherwise they are left for `factor_dot`, `state_factor_dot`, `factor_store` and
    `direct_inputs`, which resolve "auto" to the float32 choices."""
    if (self.prep == "scan" and self.precision == jax.lax.Precision.DEFAULT
        and all(x.dtype == jnp.bfloat16 for x in xs)):
      pick = lambda name, value: value if getattr(self, name) == "auto" else getattr(self, name)
      refine = pick("refine", False)
      return dataclasses.replace(
          self, prep_dot=pick("prep_dot", "bf16"), state_prep_dot=pick("state_prep_dot", "bf16"),
          factor_dtype=pick("factor_dtype", "bfloat16"),
          input_layout=pick("input_layout", "direct"),
          local_vjp_dot=(pick("local_vjp_dot", "bf16")
                         if self.local_vjp_form in REUSE_LOCAL_VJPS
                         else self.local_vjp_dot),
          refine=refine,
          inverse_tile=pick("inverse_tile", 32 if refine is False
                            and xs[0].shape[-1] % 32 == 0 else None))._with_local_vjp(xs)
    return self._with_local_vjp(xs)

  def _with_local_vjp(self, xs):
    """state_local_vjp resolved for inputs xs: "auto" is "fused" unless the fused program's
    float32 operands do not fit an SM (head dim above 64 without local_vjp_dot="bf16": 352 KB
    of shared memory at d = 128, an H200 SM has 227 KB), then "products". An explicit
    "fused" there raises."""
    d = max(xs[0].shape[-1], xs[2].shape[-1])
    fits = d <= 64 or self.local_vjp_dot == "bf16"
    if self.state_local_vjp == "auto":
      return dataclasses.replace(self, state_local_vjp="fused" if fits else "products")
    if self.state_local_vjp == "fused" and not fits:
      raise ValueError(
          'state_local_vjp="fused" with float32 operands supports head dims up to 64 (at '
          f'{d} its program needs 352 KB of shared memory); use local_vjp_dot="bf16" or '
          'state_local_vjp="products"')
    return self

  @property
  def local_vjp_form(self):
    """state_local_vjp with "auto" resolved: "fused" (unless `for_inputs` chose "products")."""
    return "fused" if self.state_local_vjp == "auto" else self.state_local_vjp

  @property
  def newton_step(self):
    """refine with "auto" resolved: True (unless `for_inputs` turned it off)."""
    return True if self.refine == "auto" else bool(self.refine)

  @property
  def inverse_tile_size(self):
    """inverse_tile with "auto" resolved: None (unless `for_inputs` chose 32)."""
    return None if self.inverse_tile == "auto" else self.inverse_tile

  @property
  def direct_inputs(self):
    """input_layout with "auto" resolved: True only for "direct" ("auto" is "transposed"
    unless `for_inputs` made it "direct")."""
    return self.input_layout == "direct"

  def factor_store(self, acc):
    """The dtype in which the inference forward passes its per-token factors between kernels
    for accumulation dtype acc: bfloat16 with factor_dtype="bfloat16" and float32 acc, else
    acc."""
    return jnp.bfloat16 if self.factor_dtype == "bfloat16" and acc == jnp.float32 else acc

  @property
  def reverse_factor_dot(self):
    """reverse_dot with "auto" resolved: factor_dot."""
    return self.factor_dot if self.reverse_dot == "auto" else self.reverse_dot

  @property
  def state_factor_dot(self):
    """state_prep_dot with "auto" resolved: factor_dot, except "tf32" where that is "bf16"
    (which only the penalty kernels take unless state_prep_dot says so)."""
    if self.state_prep_dot != "auto":
      return self.state_prep_dot
    return "tf32" if self.factor_dot == "bf16" else self.factor_dot

  def state_prep_precisions(self, acc):
    """(factor_precision, precision) of `split_prep.state_prep` for accumulation dtype acc:
    the block-doubling products' and those that apply its inverse."""
    from vla_jax.kernels.chunk_prep import _factor_precision   # chunk_prep imports this module
    fprec = _factor_precision(self.state_factor_dot, acc, self.interpret)
    if self.state_factor_dot == "bf16" and acc != jnp.float64:
      return fprec, fprec
    return fprec, self.precision

  def segment_inverter(self, dk):
    """segment_inverse with "auto" resolved for key head dim dk: "kernel" when dk <= 64
    (where the spd_inverse program does not spill), else "xla"."""
    if self.segment_inverse == "auto":
      return "kernel" if dk <= 64 else "xla"
    return self.segment_inverse

  @property
  def penalty_backward(self):
    """penalty_grad with "auto" resolved: "adjoint" for prep="scan", else "autodiff"."""
    if self.penalty_grad == "auto":
      return "adjoint" if self.prep == "scan" else "autodiff"
    return self.penalty_grad

  @property
  def scan_unit_rows(self):
    """True when the differentiated penalty scan writes the unit write directions itself
    (write_norm="kernel" with the adjoint backward; other backwards ignore write_norm)."""
    return (self.write_norm == "kernel" and self.prep == "scan"
            and self.penalty_backward == "adjoint")

  @property
  def residual_stride(self):
    """Tokens between the penalty inverses the differentiated forward saves: `grad_stride`
    (or `chunk_size`) for the reverse penalty kernel, `chunk_size` for the chunk-level
    backward (penalty_grad="chunk"), which needs them at chunk starts."""
    if self.penalty_backward == "scan" and self.grad_stride is not None:
      return self.grad_stride
    return self.chunk_size

  def output_form(self, BH, dv, dk=None):
    """state_output with "auto" resolved for B * H = BH sequences of value dim dv and key dim
    dk: "split" below SPLIT_OUTPUT_BELOW programs of the sequential loop, or from dk =
    SPLIT_OUTPUT_FROM_DK on."""
    if self.state_output != "auto":
      return self.state_output
    if dk is not None and dk >= SPLIT_OUTPUT_FROM_DK:
      return "split"
    return "split" if BH * (dv // self.value_block(dv, BH)) < SPLIT_OUTPUT_BELOW else "fused"

  def backward_form(self, BH, dv, dk=None):
    """state_bwd with "auto" resolved for B * H = BH sequences of value dim dv and key dim dk:
    "split" up to SPLIT_BWD_UP_TO programs of the sequential loop, or from dk =
    SPLIT_BWD_FROM_DK on."""
    if self.state_bwd != "auto":
      return self.state_bwd
    if dk is not None and dk >= SPLIT_BWD_FROM_DK:
      return "split"
    return "split" if BH * (dv // self.value_block(dv, BH)) <= SPLIT_BWD_UP_TO else "fused"

  def value_block(self, dv, BH=None):
    """BV for B * H = BH sequences (None: not known; the 32-row rule). By default 32: at B = 1
    it doubles the programs of the sequential pass (measured 15% faster than 64 at T = 32k,
    equal at B > 1), and at dk = 128 a 64-row block needs 240 KB of shared memory per
    program, above an H200 SM's 227 KB; 16 where even that leaves at most
    `SMALL_VALUE_BLOCK_AT` programs."""
    if self.block_v is not None:
      return self.block_v
    if BH is not None and BH * (dv // min(dv, 32)) <= SMALL_VALUE_BLOCK_AT:
      return min(dv, 16)
    return min(dv, 32)


# ----------------------------------------------------------------------------- chunk algebra (XLA)

def _factors(q, e, w, v, precision, solver, with_inverse=False):
  """U' = T V, W' = T E, P = tril(Q W^T) for chunks q, e, w: [..., C, dk], v: [..., C, dv]
  (with_inverse: also T = (I + strictly_lower(E W^T))^-1 [..., C, C])."""
  C, dv = q.shape[-2], v.shape[-1]
  mm = functools.partial(jnp.einsum, precision=precision)
  strict = jnp.tril(jnp.ones((C, C), bool), -1)
  L = jnp.where(strict, mm("...ik,...jk->...ij", e, w), 0.0) + jnp.eye(C, dtype=e.dtype)
  VE = jnp.concatenate([v, e], axis=-1)
  Tinv = None
  if solver == "nilpotent":
    Tinv = tri_inverse(L, unit_diagonal=True, precision=precision)
  elif solver == "doubling" or with_inverse:
    Tinv = tril_inverse_products(L, True, precision)
  if Tinv is not None:
    X = mm("...ij,...jd->...id", Tinv, VE)
  else:
    X = jax.lax.linalg.triangular_solve(L, VE, left_side=True, lower=True,
                                        unit_diagonal=True)
  P = jnp.where(jnp.tril(jnp.ones((C, C), bool)), mm("...ik,...jk->...ij", q, w), 0.0)
  if with_inverse:
    return X[..., :dv], X[..., dv:], P, Tinv
  return X[..., :dv], X[..., dv:], P


def _chunk_map(S, q, e, w, v, precision, solver):
  """One chunk: (S_c [dv, dk], q, e, w [C, dk], v [C, dv]) -> (O [C, dv], S_next [dv, dk])."""
  mm = functools.partial(jnp.einsum, precision=precision)
  Up, Wp, P = _factors(q, e, w, v, precision, solver)
  R = Up - mm("ck,vk->cv", Wp, S)
  O = mm("ck,vk->cv", q, S) + mm("ij,jv->iv", P, R)
  return O, S + mm("cv,ck->vk", R, w)


# ----------------------------------------------------------------------------- kernels

def _mm(a, b, *, trans_a=False, trans_b=False, precision):
  """2-D product (a or a^T) @ (b or b^T), accumulated in a's dtype (float32 or float64)."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=a.dtype)


def _residuals(up, wp, S, dot):
  """R = U' - W' S^T [C, BV] of one chunk (the fused, chain and output kernels)."""
  return up - dot(wp, S, trans_b=True)


def _outputs(q, p, S, R, dot):
  """O = Q S^T + P R [C, BV] of one chunk."""
  return dot(q, S, trans_b=True) + dot(p, R)


def _reverse_term(do, q, wp, p, dot):
  """dO^T (Q - P W') [BV, dk]: the state-independent term of the reverse pass of one chunk
  (the fused reverse kernel and state_bwd="split"'s terms kernel)."""
  return dot(do, q - dot(p, wp), trans_a=True)


def _fwd_kernel(q_ref, w_ref, up_ref, wp_ref, p_ref, s0_ref,   # inputs
                o_ref, st_ref, sc_ref,                           # outputs
                *, C, N, precision, acc):
  # Refs (one program = one (batch*head, value block)):
  #   q_ref, w_ref, wp_ref: [N*C, dk]   up_ref, o_ref: [N*C, BV]   p_ref: [N*C, C]
  #   s0_ref, st_ref: [BV, dk]          sc_ref: [N, BV, dk] (chunk-start states)
  dot = functools.partial(_mm, precision=precision)

  def body(n, S):                                        # S: [BV, dk] in `acc`
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    sc_ref[n, :, :] = S.astype(sc_ref.dtype)
    q = q_ref[rows, :].astype(acc)                       # [C, dk]
    w = w_ref[rows, :].astype(acc)                       # [C, dk]
    wp = wp_ref[rows, :].astype(acc)                     # [C, dk]
    up = up_ref[rows, :].astype(acc)                     # [C, BV]
    p = p_ref[rows, :].astype(acc)                       # [C, C]
    R = _residuals(up, wp, S, dot)                       # [C, BV]
    o_ref[rows, :] = _outputs(q, p, S, R, dot).astype(o_ref.dtype)
    return S + dot(R, w, trans_a=True)                   # [BV, dk]

  S = jax.lax.fori_loop(0, N, body, s0_ref[...].astype(acc))
  st_ref[...] = S.astype(st_ref.dtype)


def _chain_kernel(w_ref, up_ref, wp_ref, s0_ref,              # inputs
                  st_ref, sc_ref,                               # outputs
                  *, C, N, precision, acc):
  # The state chain alone (state_output="split"); refs as in _fwd_kernel.
  dot = functools.partial(_mm, precision=precision)

  def body(n, S):                                        # S: [BV, dk] in `acc`
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    sc_ref[n, :, :] = S.astype(sc_ref.dtype)
    R = _residuals(up_ref[rows, :].astype(acc), wp_ref[rows, :].astype(acc), S, dot)
    return S + dot(R, w_ref[rows, :].astype(acc), trans_a=True)

  S = jax.lax.fori_loop(0, N, body, s0_ref[...].astype(acc))
  st_ref[...] = S.astype(st_ref.dtype)


def _out_kernel(q_ref, up_ref, wp_ref, p_ref, sc_ref, o_ref, *, precision, acc):
  # One (batch*head, chunk): q_ref, wp_ref: [C, dk]; up_ref, o_ref: [C, dv]; p_ref: [C, C];
  # sc_ref: [dv, dk] the chunk-start state.
  dot = functools.partial(_mm, precision=precision)
  S = sc_ref[...].astype(acc)
  R = _residuals(up_ref[...].astype(acc), wp_ref[...].astype(acc), S, dot)
  o_ref[...] = _outputs(q_ref[...].astype(acc), p_ref[...].astype(acc), S, R,
                        dot).astype(o_ref.dtype)


def _bwd_kernel(do_ref, q_ref, w_ref, wp_ref, p_ref, dst_ref,  # inputs
                dsn_ref, ds0_ref,                               # outputs
                *, C, N, precision, acc):
  # Refs: do_ref: [N*C, BV]   q_ref, w_ref, wp_ref: [N*C, dk]   p_ref: [N*C, C]
  #       dst_ref, ds0_ref: [BV, dk]   dsn_ref: [N, BV, dk] (cotangent of each chunk's S_next)
  dot = functools.partial(_mm, precision=precision)

  def body(i, dS):                                       # dS: [BV, dk] in `acc`
    n = N - 1 - i
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    dsn_ref[n, :, :] = dS.astype(dsn_ref.dtype)
    do = do_ref[rows, :].astype(acc)                     # [C, BV]
    q = q_ref[rows, :].astype(acc)                       # [C, dk]
    w = w_ref[rows, :].astype(acc)                       # [C, dk]
    wp = wp_ref[rows, :].astype(acc)                     # [C, dk]
    p = p_ref[rows, :].astype(acc)                       # [C, C]
    dS = dS - dot(dot(dS, w, trans_b=True), wp)          # [BV, C] x [C, dk]
    return dS + _reverse_term(do, q, wp, p, dot)         # [BV, dk]

  dS = jax.lax.fori_loop(0, N, body, dst_ref[...].astype(acc))
  ds0_ref[...] = dS.astype(ds0_ref.dtype)


def _bwd_terms_kernel(do_ref, q_ref, wp_ref, p_ref, g_ref, *, precision, acc):
  # One (batch*head, chunk): do_ref: [C, dv]; q_ref, wp_ref: [C, dk]; p_ref: [C, C];
  # g_ref: [dv, dk] the chunk's term dO^T (Q - P W').
  dot = functools.partial(_mm, precision=precision)
  g_ref[...] = _reverse_term(*(ref[...].astype(acc) for ref in (do_ref, q_ref, wp_ref, p_ref)),
                            dot).astype(g_ref.dtype)


def _bwd_chain_kernel(w_ref, wp_ref, g_ref, dst_ref,           # inputs
                      dsn_ref, ds0_ref,                         # outputs
                      *, C, N, precision, acc):
  # Refs: w_ref, wp_ref: [N*C, dk]; g_ref, dsn_ref: [N, BV, dk]; dst_ref, ds0_ref: [BV, dk].
  dot = functools.partial(_mm, precision=precision)

  def body(i, dS):
    n = N - 1 - i
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    dsn_ref[n, :, :] = dS.astype(dsn_ref.dtype)
    dS = dS - dot(dot(dS, w_ref[rows, :].astype(acc), trans_b=True),
                  wp_ref[rows, :].astype(acc))
    return dS + g_ref[n, :, :].astype(acc)

  dS = jax.lax.fori_loop(0, N, body, dst_ref[...].astype(acc))
  ds0_ref[...] = dS.astype(ds0_ref.dtype)


def _params(cfg):
  return plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _forward_pass(cfg, q, w, Up, Wp, P, S0, out_dtype, heads=None):
  """Sequential pass. q, w, Wp: [BH, N*C, dk]; Up: [BH, N*C, dv]; P: [BH, N*C, C];
  S0: [BH, dv, dk]. Returns O [BH, N*C, dv] (out_dtype), S_T [BH, dv, dk] and the
  chunk-start states [BH, N, dv, dk] (accumulation dtype). When `cfg.output_form` is "split"
  the state chain and the outputs run as two kernels (`_state_chain`, `_state_outputs`).
  heads: None, or H when q is the caller's token-major [B, >= N*C, H, dk] (read in place); O is
  then written token-major too, [B, N*C, H, dv]."""
  BH, NC, dk = w.shape
  if cfg.output_form(BH, Up.shape[-1], Wp.shape[-1]) == "split":
    S_T, S_c = _state_chain(cfg, w, Up, Wp, S0)
    return _state_outputs(cfg, q, Up, Wp, P, S_c, out_dtype, heads), S_T, S_c
  dv, C = Up.shape[-1], cfg.chunk_size
  N, BV, acc = NC // C, cfg.value_block(dv, BH), S0.dtype     # factors may be stored narrower
  kernel = functools.partial(_fwd_kernel, C=C, N=N, precision=cfg.precision, acc=acc)
  # Whole sequences: all NC rows of (batch * head) b; `value` blocks take the j-th BV columns.
  seq = lambda d, h=None: rows_spec(NC, d, h, time=lambda b, j: 0)
  value = lambda h=None: rows_spec(NC, BV, h, time=lambda b, j: 0, feature=lambda b, j: j)
  s_spec = pl.BlockSpec((None, BV, dk), lambda b, j: (b, j, 0))
  o_shape = (BH, NC, dv) if heads is None else (BH // heads, NC, heads, dv)
  return pl.pallas_call(
      kernel,
      grid=(BH, dv // BV),
      in_specs=[seq(dk, heads), seq(dk), value(), seq(dk), seq(C), s_spec],
      out_specs=[value(heads), s_spec,
                 pl.BlockSpec((None, N, BV, dk), lambda b, j: (b, 0, j, 0))],
      out_shape=[jax.ShapeDtypeStruct(o_shape, out_dtype),
                 jax.ShapeDtypeStruct((BH, dv, dk), acc),
                 jax.ShapeDtypeStruct((BH, N, dv, dk), acc)],
      compiler_params=_params(cfg),
      interpret=cfg.interpret,
      name="vla_state_fwd",
  )(q, w, Up, Wp, P, S0)


def _state_chain(cfg, w, Up, Wp, S0):
  """The state chain alone: S_T [BH, dv, dk] and the chunk-start states [BH, N, dv, dk]
  (grid (B * H, dv / BV), a loop over chunks)."""
  BH, NC, dk = w.shape
  dv, C = Up.shape[-1], cfg.chunk_size
  N, BV, acc = NC // C, cfg.value_block(dv, BH), S0.dtype
  k_spec = pl.BlockSpec((None, NC, dk), lambda b, j: (b, 0, 0))
  s_spec = pl.BlockSpec((None, BV, dk), lambda b, j: (b, j, 0))
  return pl.pallas_call(
      functools.partial(_chain_kernel, C=C, N=N, precision=cfg.precision, acc=acc),
      grid=(BH, dv // BV),
      in_specs=[k_spec, pl.BlockSpec((None, NC, BV), lambda b, j: (b, 0, j)), k_spec, s_spec],
      out_specs=[s_spec, pl.BlockSpec((None, N, BV, dk), lambda b, j: (b, 0, j, 0))],
      out_shape=[jax.ShapeDtypeStruct((BH, dv, dk), acc),
                 jax.ShapeDtypeStruct((BH, N, dv, dk), acc)],
      compiler_params=_params(cfg),
      interpret=cfg.interpret,
      name="vla_state_chain",
  )(w, Up, Wp, S0)


def _state_outputs(cfg, q, Up, Wp, P, S_c, out_dtype, heads=None):
  """O [BH, N*C, dv] from the chunk-start states, one program per (batch * head, chunk):
  R = U' - W' S_c^T, O = Q S_c^T + P R. heads: as in `_forward_pass` (q read, O written
  token-major)."""
  BH, NC, dk = Wp.shape
  dv, C = Up.shape[-1], cfg.chunk_size
  N, acc = NC // C, S_c.dtype
  rows = lambda d, h=None: rows_spec(C, d, h)
  o_shape = (BH, NC, dv) if heads is None else (BH // heads, NC, heads, dv)
  return pl.pallas_call(
      functools.partial(_out_kernel, precision=cfg.precision, acc=acc),
      grid=(BH, N),
      in_specs=[rows(dk, heads), rows(dv), rows(dk), rows(C),
                pl.BlockSpec((None, None, dv, dk), lambda b, n: (b, n, 0, 0))],
      out_specs=rows(dv, heads),
      out_shape=jax.ShapeDtypeStruct(o_shape, out_dtype),
      compiler_params=_params(cfg),
      interpret=cfg.interpret,
      name="vla_state_out",
  )(q, Up, Wp, P, S_c)


def _backward_pass(cfg, dO, q, w, Wp, P, dS_T, next_dtype=None, heads=None):
  """Reverse pass. dO: [BH, N*C, dv]; q, w, Wp: [BH, N*C, dk]; P: [BH, N*C, C];
  dS_T: [BH, dv, dk]. Returns dS_next per chunk [BH, N, dv, dk] (in next_dtype, default the
  accumulation dtype) and dS_0 [BH, dv, dk].
  cfg.state_bwd="split": the per-chunk terms in a parallel kernel, then the chain alone.
  heads: None, or H when dO and q are token-major [B, N*C, H, d] (read in place)."""
  BH, NC, dk = w.shape
  if cfg.backward_form(BH, dO.shape[-1], dk) == "split":
    return _backward_chain(cfg, w, Wp, _backward_terms(cfg, dO, q, Wp, P, heads), dS_T,
                           next_dtype)
  dv, C = dO.shape[-1], cfg.chunk_size
  N, BV, acc = NC // C, cfg.value_block(dv, BH), Wp.dtype
  kernel = functools.partial(_bwd_kernel, C=C, N=N, precision=cfg.precision, acc=acc)
  k_spec = pl.BlockSpec((None, NC, dk), lambda b, j: (b, 0, 0))
  s_spec = pl.BlockSpec((None, BV, dk), lambda b, j: (b, j, 0))
  seq = lambda d, f=lambda b, j: 0: rows_spec(NC, d, heads, time=lambda b, j: 0, feature=f)
  return pl.pallas_call(
      kernel,
      grid=(BH, dv // BV),
      in_specs=[seq(BV, lambda b, j: j), seq(dk), k_spec, k_spec,
                pl.BlockSpec((None, NC, C), lambda b, j: (b, 0, 0)), s_spec],
      out_specs=[pl.BlockSpec((None, N, BV, dk), lambda b, j: (b, 0, j, 0)), s_spec],
      out_shape=[jax.ShapeDtypeStruct((BH, N, dv, dk), next_dtype or acc),
                 jax.ShapeDtypeStruct((BH, dv, dk), acc)],
      compiler_params=_params(cfg),
      interpret=cfg.interpret,
      name="vla_state_bwd",
  )(dO, q, w, Wp, P, dS_T)


def _backward_terms(cfg, dO, q, Wp, P, heads=None):
  """G [BH, N, dv, dk], G_n = dO_n^T (Q_n - P_n W'_n): one program per (batch * head, chunk).
  heads: as in `_backward_pass`."""
  BH, NC, dk = Wp.shape
  dv, C = dO.shape[-1], cfg.chunk_size
  N, acc = NC // C, Wp.dtype
  rows = lambda d, h=None: rows_spec(C, d, h)
  return pl.pallas_call(
      functools.partial(_bwd_terms_kernel, precision=cfg.precision, acc=acc),
      grid=(BH, N),
      in_specs=[rows(dv, heads), rows(dk, heads), rows(dk), rows(C)],
      out_specs=pl.BlockSpec((None, None, dv, dk), lambda b, n: (b, n, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((BH, N, dv, dk), acc),
      compiler_params=_params(cfg),
      interpret=cfg.interpret,
      name="vla_state_bwd_terms",
  )(dO, q, Wp, P)


def _backward_chain(cfg, w, Wp, G, dS_T, next_dtype=None):
  """The reverse chain alone: dS_next per chunk [BH, N, dv, dk] (next_dtype, default the
  accumulation dtype) and dS_0 [BH, dv, dk]."""
  BH, NC, dk = w.shape
  N, dv = G.shape[1], G.shape[2]
  C, BV, acc = cfg.chunk_size, cfg.value_block(dv, BH), Wp.dtype
  k_spec = pl.BlockSpec((None, NC, dk), lambda b, j: (b, 0, 0))
  n_spec = pl.BlockSpec((None, N, BV, dk), lambda b, j: (b, 0, j, 0))
  s_spec = pl.BlockSpec((None, BV, dk), lambda b, j: (b, j, 0))
  return pl.pallas_call(
      functools.partial(_bwd_chain_kernel, C=C, N=N, precision=cfg.precision, acc=acc),
      grid=(BH, dv // BV),
      in_specs=[k_spec, k_spec, n_spec, s_spec],
      out_specs=[n_spec, s_spec],
      out_shape=[jax.ShapeDtypeStruct((BH, N, dv, dk), next_dtype or acc),
                 jax.ShapeDtypeStruct((BH, dv, dk), acc)],
      compiler_params=_params(cfg),
      interpret=cfg.interpret,
      name="vla_state_bwd_chain",
  )(w, Wp, G, dS_T)


# ----------------------------------------------------------------------------- custom_vjp

def _split(x, C):
  """[BH, N*C, d] -> [BH, N, C, d]."""
  return x.reshape(x.shape[0], -1, C, x.shape[-1])


def _merge(x):
  """[BH, N, C, d] -> [BH, N*C, d]."""
  return x.reshape(x.shape[0], -1, x.shape[-1])


def _head_rows(x, heads):
  """A token-major [B, T, H, d] array as head-major rows [B * H, T, d] (heads=H; an XLA
  transpose), or x itself (heads=None)."""
  if heads is None:
    return x
  B, T, H, d = x.shape
  return jnp.swapaxes(x, 1, 2).reshape(B * H, T, d)


def _token_rows(x, heads):
  """The inverse of `_head_rows`: [B * H, T, d] -> [B, T, H, d] (heads=H), or x."""
  if heads is None:
    return x
  BH, T, d = x.shape
  return jnp.swapaxes(x.reshape(BH // heads, heads, T, d), 1, 2)


def _prepare(cfg, q, e, w, v, with_inverse=False, heads=None):
  """U', W', P [BH, N*C, .] of every chunk: XLA `_factors`, or with cfg.grad_prep="kernel" the
  `split_prep.state_prep` kernel. with_inverse: also the chunks' unit-triangular inverses T
  [BH, N, C, C] (from the kernel in bfloat16 when local_vjp_dot="bf16": the products that
  read it take bfloat16 operands). heads: None, or H when q and v are token-major
  [B, N*C, H, d] (the kernel reads them in place; XLA's `_factors` gets head-major copies)."""
  acc = compute_dtype(q, e, w, v)
  C = cfg.chunk_size
  if cfg.grad_prep != "kernel":
    q, v = _head_rows(q, heads), _head_rows(v, heads)
  if cfg.grad_prep == "kernel":
    from vla_jax.kernels.split_prep import state_prep
    fprec, sprec = cfg.state_prep_precisions(acc)
    low = cfg.local_vjp_dot == "bf16" and cfg.local_vjp_form in REUSE_LOCAL_VJPS
    out = state_prep(e.astype(acc), w.astype(acc), q, v, chunk_size=C, precision=sprec,
                     factor_precision=fprec, num_warps=cfg.prep_warps,
                     interpret=cfg.interpret, with_inverse=with_inverse,
                     inverse_dtype=jnp.bfloat16 if low else None, qv_heads=heads)
    if with_inverse:
      Up, Wp, P, Tinv = out
      return Up, Wp, P, _split(Tinv, C)
    return out
  chunks = [_split(x.astype(acc), C) for x in (q, e, w, v)]
  Up, Wp, P, *Tinv = _factors(*chunks, cfg.precision, cfg.solver, with_inverse=with_inverse)
  return (_merge(Up), _merge(Wp), _merge(P), *Tinv)


def _local_vjp_products(cfg, q, e, w, v, dO, S_c, dS_next, P, Tinv):
  """Chunk-local cotangents (dq, de, dw, dv), the VJP of `_chunk_map` with each chunk's start
  state fixed, written out (`state_grad.py` has the derivation) as batched products over all
  chunks. P [BH, N*C, C] and Tinv [BH, N, C, C] are the forward's."""
  acc, C = S_c.dtype, cfg.chunk_size
  if cfg.local_vjp_dot == "bf16":
    # bfloat16 operands, accumulation in acc. R, dP, dLm (and dX when the values are bfloat16,
    # as the returned dv is then) only ever meet the next products as bfloat16 operands, so
    # their products write bfloat16 directly: the same rounding as writing acc and casting,
    # without the acc-sized array and the cast's pass over it.
    low = jnp.bfloat16
    mm = lambda spec, a, b, out=acc: jnp.einsum(spec, a.astype(low), b.astype(low),
                                                preferred_element_type=out)
    mid, mid_dx = low, (low if v.dtype == low else acc)
  else:
    mm = lambda spec, a, b, out=None: jnp.einsum(spec, a, b, precision=cfg.precision)
    mid = mid_dx = None
  Q, E, W, V, dOc = (_split(x.astype(acc), C) for x in (q, e, w, v, dO))
  P = _split(P, C)
  r = jnp.arange(C)
  lower, strict = r[:, None] >= r[None, :], r[:, None] > r[None, :]
  R = mm("bnij,bnjv->bniv", Tinv, V - mm("bnck,bnvk->bncv", E, S_c), mid)     # [C, dv]
  dR = mm("bnij,bniv->bnjv", P, dOc) + mm("bnck,bnvk->bncv", W, dS_next)     # P^T dO + W dSn^T
  dP = jnp.where(lower, mm("bniv,bnjv->bnij", dOc, R, mid), 0)
  dX = mm("bnij,bniv->bnjv", Tinv, dR, mid_dx)                               # T^T dR
  dLm = jnp.where(strict, -mm("bniv,bnjv->bnij", dX, R, mid), 0)
  dq = mm("bncv,bnvk->bnck", dOc, S_c) + mm("bnij,bnjk->bnik", dP, W)
  dw = (mm("bnij,bnik->bnjk", dP, Q) + mm("bncv,bnvk->bnck", R, dS_next)
        + mm("bnij,bnik->bnjk", dLm, E))
  de = mm("bnij,bnjk->bnik", dLm, W) - mm("bncv,bnvk->bnck", dX, S_c)
  return tuple(_merge(g).astype(x.dtype) for g, x in zip((dq, de, dw, dX), (q, e, w, v)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 6))
def _state_path(cfg, q, e, w, v, S0, heads):
  Up, Wp, P = _prepare(cfg, q, e, w, v, heads=heads)
  O, S_T, _ = _forward_pass(cfg, q, w, Up, Wp, P, S0.astype(Up.dtype), v.dtype, heads=heads)
  return O, S_T


def _state_path_fwd(cfg, q, e, w, v, S0, heads):
  products = cfg.local_vjp_form in REUSE_LOCAL_VJPS
  Up, Wp, P, *Tinv = _prepare(cfg, q, e, w, v, with_inverse=products, heads=heads)
  O, S_T, S_c = _forward_pass(cfg, q, w, Up, Wp, P, S0.astype(Up.dtype), v.dtype,
                              heads=heads)
  return (O, S_T), (q, e, w, v, S0, Wp, P, S_c, Tinv[0] if products else None)


def _state_path_bwd(cfg, heads, res, cts):
  q, e, w, v, S0, Wp, P, S_c, Tinv = res
  dO, dS_T = cts
  acc, C = Wp.dtype, cfg.chunk_size
  reuse = cfg.local_vjp_form in REUSE_LOCAL_VJPS
  low = reuse and cfg.local_vjp_dot == "bf16"
  # With bfloat16 products dS_next only ever meets them as a bfloat16 operand: the reverse
  # kernel writes it so (the same rounding, half the bytes, no cast pass).
  dS_next, dS0 = _backward_pass(cfg, dO, q, w, Wp, P, dS_T.astype(acc),
                                jnp.bfloat16 if low else None, heads=heads)
  if cfg.local_vjp_form in ("fused", "kernel"):
    fused = cfg.local_vjp_form == "fused"
    precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if low else cfg.precision
    grads = chunk_local_vjp(q, e, w, v, dO, S_c, dS_next, chunk_size=C, precision=precision,
                            num_warps=8, interpret=cfg.interpret,   # fewer spills than 4
                            P=P if fused else None, Tinv=Tinv if fused else None,
                            heads=heads, dq_dtype=q.dtype, dv_dtype=v.dtype)
    dq, de, dw, dv = (g.astype(x.dtype) for g, x in zip(grads, (q, e, w, v)))
    return dq, de, dw, dv, dS0.astype(S0.dtype)
  # The XLA forms work head-major: token-major q, v, dO are copied, dq, dv copied back.
  q, v, dO = (_head_rows(x, heads) for x in (q, v, dO))
  dq, de, dw, dv = _local_vjp_xla(cfg, q, e, w, v, dO, S_c, dS_next, P, Tinv)
  return _token_rows(dq, heads), de, dw, _token_rows(dv, heads), dS0.astype(S0.dtype)


def _local_vjp_xla(cfg, q, e, w, v, dO, S_c, dS_next, P, Tinv):
  """The chunk-local cotangents (dq, de, dw, dv) in XLA, head-major: state_local_vjp
  "products" (written out) or "xla" (`jax.vmap` of `jax.vjp` of `_chunk_map`)."""
  acc, C = S_c.dtype, cfg.chunk_size
  if cfg.local_vjp_form == "products":
    return _local_vjp_products(cfg, q, e, w, v, dO, S_c, dS_next, P, Tinv)
  # Chunk-local cotangents, all chunks at once: flatten (BH, N) into one batch axis.
  BH, N = S_c.shape[:2]
  flat = lambda x: _split(x.astype(acc), C).reshape((BH * N, C, x.shape[-1]))
  local = lambda S, *xs: _chunk_map(S, *xs, cfg.precision, cfg.solver)

  def vjp_one(S, q_n, e_n, w_n, v_n, dO_n, dSn_n):
    _, pullback = jax.vjp(lambda *xs: local(S, *xs), q_n, e_n, w_n, v_n)
    return pullback((dO_n, dSn_n))

  grads = jax.vmap(vjp_one)(
      S_c.reshape((BH * N,) + S_c.shape[2:]), flat(q), flat(e), flat(w), flat(v), flat(dO),
      dS_next.reshape((BH * N,) + dS_next.shape[2:]))
  return tuple(g.reshape(x.shape).astype(x.dtype) for g, x in zip(grads, (q, e, w, v)))


_state_path.defvjp(_state_path_fwd, _state_path_bwd)


# ----------------------------------------------------------------------------- entry point

def state_path(q, e, w, v, S0, *, config=KernelConfig(), heads=None):
  """Generalised delta rule S_t = S_{t-1} + (v_t - S_{t-1} e_t) w_t^T, o_t = S_t q_t.

  Args:
    q, e, w: [BH, T, dk] queries, erase keys and write keys (head-major; float32, bfloat16 or
      float64). T must be a multiple of `config.chunk_size` (pad with zero e and w: exact).
    v: [BH, T, dv] values.
    S0: [BH, dv, dk] initial state.
    config: a `KernelConfig`.
    heads: None, or H when q and v are token-major [B, T, H, d] instead (B * H = BH): the
      kernels read them in place, and o and the cotangents of q and v are token-major too.

  Returns:
    o [BH, T, dv] (with heads: [B, T, H, dv]) in v's dtype and S_T [BH, dv, dk] in the
    accumulation dtype (float32, or float64 when any input is float64). Differentiable
    (custom VJP with a reverse kernel).
  """
  BH, T, dk = e.shape
  dv = v.shape[-1]
  config.validate(dk, dv)
  if T % config.chunk_size:
    raise ValueError(f"T={T} must be a multiple of chunk_size={config.chunk_size} here; "
                     "pad with zero keys first")
  if heads is not None:
    want = (BH // heads, T, heads)
    if BH % heads or q.shape[:3] != want or v.shape[:3] != want:
      raise ValueError(f"with heads={heads}, q and v must be [B, T, H, d] with B * H = {BH} "
                       f"and T = {T}; got q {q.shape}, v {v.shape}")
  return _state_path(config, q, e, w, v, S0, heads)
