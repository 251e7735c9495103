"""Block specs for per-token arrays in either of the two layouts the kernels read.

Grid axis 0 of every sequential or per-chunk kernel is batch * head. A per-token array is either
head-major [B * H, T, d] (made by an XLA transpose before the kernels: `KernelConfig(
input_layout="transposed")`) or the caller's own token-major [B, T, H, d], read in place
(`input_layout="direct"`): a block of rows of one head is then rows of stride H * d. Inside the
kernel both are the same [rows, d] ref.
"""

from jax.experimental import pallas as pl


def rows_spec(rows, d, heads=None, time=lambda i, j: j, feature=lambda i, j: 0):
  """BlockSpec of `rows` consecutive tokens of sequence i (grid point (i, j)) and `d` features.

  heads: None for a head-major [B * H, T, D] array; H for a token-major [B, T, H, D] one.
  time(i, j), feature(i, j): the block indices along T and along the features."""
  if heads is None:
    return pl.BlockSpec((None, rows, d), lambda i, j: (i, time(i, j), feature(i, j)))
  return pl.BlockSpec((None, rows, None, d),
                      lambda i, j: (i // heads, time(i, j), i % heads, feature(i, j)))
