"""Shapes, T lists and the catalogue of rows the suite measures."""

import dataclasses

TOKENS = 32768            # B * T per call (B = 1 once T > TOKENS)
HEADS = 16
DIMS = (64, 128)
ALL_TS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)   # --Ts all
# Default: every 4x up to 16k, then every 2x, so that both dims and every row fit in about
# 8 minutes on one H200 (compilation, one per row, dominates the run).
DEFAULT_TS = (256, 1024, 4096, 16384, 32768, 65536, 131072)
CHUNK = 64                # chunk size of the chunked / pallas forms
ROW_CAP_S = 10.0          # once one call of a row takes longer, larger T of that row are skipped
SUITE_BUDGET_S = 420.0    # rows not started within this many seconds are recorded as skipped

# CPU smoke run (CI): tiny shapes, XLA optimisations off (compilation dominates on a CPU),
# forward+backward at the smallest T only, the associative scan forward at T = 64 only.
SMOKE = dict(tokens=256, heads=2, dims=(16,), Ts=(64, 128), dtype="float32", chunk=16,
             bwd_max_T=64, max_T={"vla_associative_scan": 64},
             passes={"vla_associative_scan": ("fwd",)})


@dataclasses.dataclass(frozen=True)
class RowSpec:
  """One benchmarked function family. `key` is what --rows selects."""

  key: str
  op: str                 # what is computed: vla, softmax_attention, deltanet, ...
  impl: str               # how: pallas, chunked, cudnn, fla_chunk_delta_rule, ...
  framework: str          # jax or torch
  passes: tuple = ("fwd", "fwd+bwd")
  max_T: int | None = None        # larger T are recorded as skipped (slow or quadratic memory)
  max_T_reason: str = ""
  tier: int = 1                   # run order: tier 1 first (for both dims), then tier 2, ...


CATALOGUE = (
    RowSpec("vla_pallas", "vla", "pallas", "jax", tier=1),
    RowSpec("attn_cudnn", "softmax_attention", "cudnn", "jax", tier=1),
    RowSpec("fla_delta_rule", "deltanet", "fla_chunk_delta_rule", "torch", tier=1),
    RowSpec("triton_vla_seq", "vla", "triton_sequential", "triton", passes=("fwd",), tier=1),
    RowSpec("vla_chunked", "vla", "chunked", "jax", tier=2),
    RowSpec("deltanet", "deltanet", "chunked", "jax", tier=2),
    RowSpec("gated_deltanet", "gated_deltanet", "chunked", "jax", tier=2),
    RowSpec("linear_attention", "linear_attention", "chunked", "jax", tier=2),
    RowSpec("attn_xla", "softmax_attention", "xla", "jax", max_T=16384,
            max_T_reason="T x T scores materialised: quadratic memory and time", tier=3),
    RowSpec("vla_scan", "vla", "scan", "jax", max_T=8192,
            max_T_reason="token-by-token lax.scan: time linear in T at fixed B*T", tier=3),
    RowSpec("vla_associative_scan", "vla", "associative_scan", "jax", max_T=2048,
            max_T_reason="O(T d^3) work and O(T d^2) memory; time flat in T at fixed B*T",
            tier=3),
)
BY_KEY = {spec.key: spec for spec in CATALOGUE}


def batch_for(T, tokens=TOKENS):
  return max(1, tokens // T)


def ordered(specs, dims):
  """(spec, d) in run order: tier by tier, each tier over all dims, so the rows the report
  leans on (VLA pallas, cuDNN, fla) are measured first if the suite budget runs out."""
  out = []
  for tier in sorted({s.tier for s in specs}):
    for d in dims:
      out += [(s, d) for s in specs if s.tier == tier]
  return out
