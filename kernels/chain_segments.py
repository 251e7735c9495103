"""Sequence segments for the state path's chains when they have few programs.

The state chain is affine per chunk: forward S_{c+1} = S_c F_c + G_c with F_c = I - W'_c^T W_c
(`state_path.py`), reverse dS_c = dS_{c+1} B_c + G'_c with B_c = I - W_c^T W'_c
(`state_backward.py`). With B * H * dv / BV programs far below one wave (B = 1 at long T), the
chain runs at its latency on a few SMs. Cut the N chunks into G segments of N / G:

  1. each segment runs the chain from zero: its end value Psi_g (the chain kernel itself);
  2. `vla_state_transfer` forms each segment's product Phi_g of F (or, reverse, of B in the
     reverse order), one program per (batch * head, segment): Phi <- Phi - (Phi A^T) B per
     chunk, [dk, dk];
  3. XLA stitches the segments' starts (forward: S_{g+1} = S_g Phi_g + Psi_g from S_0;
     reverse: the same from the last segment back), G small products at HIGHEST;
  4. the chain runs again from the stitched starts, writing the per-chunk values.

The same recurrence with G times the programs, at twice the chain's work plus the transfers.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from vla_jax.kernels.common import dot, eye, finite


def _transfer_kernel(a_ref, b_ref, phi_ref, *, C, N, reverse, precision, acc):
  # One (batch * head, segment of N chunks): a_ref, b_ref [N*C, dk]; phi_ref [dk, dk], the
  # product of the chunks' I - A^T B in chain order (reverse: from the last chunk back). Rows
  # enter through `finite`, as in the chain kernels: in the reverse pass zero cotangents meet
  # the non-finite rows of later tokens.
  mm = functools.partial(dot, precision=precision)
  dk = phi_ref.shape[0]

  def body(i, Phi):
    n = N - 1 - i if reverse else i
    rows = pl.ds(pl.multiple_of(n * C, C), C)
    a, b = finite(a_ref[rows, :].astype(acc)), finite(b_ref[rows, :].astype(acc))
    return Phi - mm(mm(Phi, a, tb=True), b)

  phi_ref[...] = jax.lax.fori_loop(0, N, body, eye(dk, acc)).astype(phi_ref.dtype)


def transfers(a, b, *, plan, reverse, params):
  """Phi [BH, G, dk, dk] (G = `Plan.chain_segments`) of rows a, b [BH, N*C, dk]: forward
  a = W', b = W; reverse a = W, b = W'."""
  BH, NC, dk = a.shape
  G, C = plan.chain_segments, plan.chunk_size
  Ns = NC // C // G
  return pl.pallas_call(
      functools.partial(_transfer_kernel, C=C, N=Ns, reverse=reverse,
                        precision=plan.state_dot, acc=jnp.dtype(plan.acc)),
      grid=(BH, G),
      in_specs=[pl.BlockSpec((None, Ns * C, dk), lambda h, g: (h, g, 0))] * 2,
      out_specs=pl.BlockSpec((None, None, dk, dk), lambda h, g: (h, g, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((BH, G, dk, dk), jnp.dtype(plan.acc)),
      compiler_params=params, interpret=plan.interpret, name="vla_state_transfer",
  )(a, b)


def stitch(first, Phi, Psi, *, reverse):
  """The chain's value at every segment's start [BH, G, dv, dk] (reverse: at every segment's
  end), from `first` [BH, dv, dk] (S_0; reverse: dS_T), the transfers Phi [BH, G, dk, dk] and
  the segments' runs from zero Psi [BH, G, dv, dk]."""
  def step(S, x):
    phi, psi = x
    return jnp.einsum("bvk,bkl->bvl", S, phi, precision=jax.lax.Precision.HIGHEST) + psi, S

  _, values = jax.lax.scan(step, first, (jnp.moveaxis(Phi, 1, 0), jnp.moveaxis(Psi, 1, 0)),
                           reverse=reverse)
  return jnp.moveaxis(values, 0, 1)
