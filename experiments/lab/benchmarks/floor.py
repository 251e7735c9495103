"""Hardware floor of one VLA call: max(bytes / bandwidth, flops / matmul rate).

bytes = inputs read once and outputs written once (bf16: q, k, v, u in,
o out; x3 for forward + backward), flops = the matrix products of the chunked algorithm
(penalty path + state path per chunk of C tokens, x3 for forward + backward).
`delta_rule_floor_ms` is the same model for DeltaNet (the state path alone, no u), the measure
that BENCHMARKS.md applies to fla's `chunk_delta_rule`. Both assume an H200.
"""

BANDWIDTH = 4.2e12     # B/s, H200 device copy (ANCHORS.md)
MATMUL = 8.0e14        # FLOP/s, H200 bf16 matmul (ANCHORS.md: about 798 TFLOP/s)


def floor_ms(B, T, H, d, C=64, backward=False, bytes_per_elem=2):
  n_tok = B * T * H
  io = (15 if backward else 5) * n_tok * d * bytes_per_elem
  per_chunk = 2 * (3 * C * d * d + 4 * C * C * d + 4 * d ** 3      # penalty path
                   + 4 * C * C * d + 3 * C * d * d + C * C * d)    # state path
  flops = per_chunk * n_tok / C * (3 if backward else 1)
  return 1e3 * max(io / BANDWIDTH, flops / MATMUL)


def delta_rule_floor_ms(B, T, H, d, C=64, backward=False, bytes_per_elem=2):
  """floor_ms without the penalty path: q, k, v in and o out (beta, one number a token and
  head, is left out), the state path's products of the chunked delta rule."""
  n_tok = B * T * H
  io = (12 if backward else 4) * n_tok * d * bytes_per_elem
  per_chunk = 2 * (4 * C * C * d + 3 * C * d * d + C * C * d)
  flops = per_chunk * n_tok / C * (3 if backward else 1)
  return 1e3 * max(io / BANDWIDTH, flops / MATMUL)
