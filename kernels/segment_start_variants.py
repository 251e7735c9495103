"""Segment-start variants measured against the exact starts (a record; not in the pipeline).

Each function has the signature of `segment_starts.segment_start_inverses` for head-major
float32 u [B, H, T_pad, dk] and A0 [B, H, dk, dk] and returns the starts of segments 1..S-1
[B, H, S - 1, dk, dk]. `python -m vla_jax.kernels.segment_start_variants` prints, on the CPU
(interpret mode), the errors against float64 of each variant's starts and of `vla_pallas`'s
o, S_T, A_T with them (float32 at HIGHEST, anisotropic u, the plan forced to many segments).

  direct               float32 Grams, prefix sums and Cholesky inverses (plus a float32
                       Newton step): the starts before the exact form.
  float32_grams        float32 Grams (the Gram kernel), float64 prefix sums, float32 inverse,
                       two float64 Newton steps: the Grams' own rounding remains.
  no_newton            float64 Grams and prefix sums, float32 inverse, no Newton step: the
                       Cholesky of the float32-rounded M remains.
  float64_cholesky     everything in float64 in XLA (jnp.linalg.inv).
  linearised_carry     VLA.md section 5: direct starts A~_s, a first penalty scan from them to
                       each segment's end F_s, Q_s = I - F_s G_s, D_s = F_s - A~_{s+1}, then
                       E_{s+1} = Q_s E_s Q_s^T + D_s over the segments (an associative scan of
                       affine maps; a sequential stitch gives the same numbers) and
                       A_s = A~_s + E_s. Float32 throughout, one extra penalty scan.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from vla_jax.kernels import penalty_scan as penalty_scan_module
from vla_jax.kernels import segment_starts as starts_module

HIGHEST = jax.lax.Precision.HIGHEST
mm = functools.partial(jnp.matmul, precision=HIGHEST)


def _prefix64(u, S, L, grams64=True, plan=None):
  """float64 sums of u u^T before segments 1..S-1 (under enable_x64)."""
  B, H, _, dk = u.shape
  U = u[:, :, :(S - 1) * L]
  if grams64:
    U = U.astype(jnp.float64).reshape(B, H, S - 1, L, dk)
    G = jnp.einsum("bhsli,bhslj->bhsij", U, U, precision=HIGHEST)
  else:
    G = starts_module.segment_grams(U.reshape(B * H, (S - 1) * L, dk), S, L, plan=plan)
    G = G.reshape(B, H, S - 1, dk, dk).astype(jnp.float64)
  return jnp.cumsum(G, axis=2)


def direct(u, A0, S, L, *, plan):
  plan = dataclasses.replace(plan, exact_starts=False, newton_step=True, inverse_tile=None)
  return starts_module.segment_start_inverses(u, A0, S, L, plan=plan)


def _refined(u, A0, S, L, plan, grams64, steps):
  inverse = lambda M: starts_module.spd_inverse_kernel(
      M.reshape(-1, M.shape[2], *M.shape[3:]), newton_step=False, precision=plan.inverse_dot,
      tile=None, interpret=plan.interpret).reshape(M.shape)
  X0 = inverse(A0[:, :, None])
  f32_grams = None if grams64 else _prefix64(u, S, L, False, plan)   # kernel outside x64
  with jax.enable_x64(True):
    M0 = _newton(X0, A0[:, :, None], 2)
    M = M0 + (_prefix64(u, S, L) if grams64 else f32_grams)
    M32 = M.astype(jnp.float32)
  X = inverse(M32)
  with jax.enable_x64(True):
    return _newton(X, M, steps).astype(jnp.float32)


def _newton(X, M, steps):
  X, M = X.astype(jnp.float64), M.astype(jnp.float64)
  eye = jnp.eye(X.shape[-1], dtype=jnp.float64)
  for _ in range(steps):
    X = X + mm(X, eye - mm(M, X))
  return 0.5 * (X + jnp.swapaxes(X, -1, -2))


def float32_grams(u, A0, S, L, *, plan):
  return _refined(u, A0, S, L, plan, grams64=False, steps=2)


def no_newton(u, A0, S, L, *, plan):
  return _refined(u, A0, S, L, plan, grams64=True, steps=0)


def one_newton_step(u, A0, S, L, *, plan):
  return _refined(u, A0, S, L, plan, grams64=True, steps=1)


def float64_cholesky(u, A0, S, L, *, plan):
  del plan
  with jax.enable_x64(True):
    M = jnp.linalg.inv(A0.astype(jnp.float64))[:, :, None] + _prefix64(u, S, L)
    A = jnp.linalg.inv(0.5 * (M + jnp.swapaxes(M, -1, -2)))
    return (0.5 * (A + jnp.swapaxes(A, -1, -2))).astype(jnp.float32)


def linearised_carry(u, A0, S, L, *, plan, keys):
  """keys: the unit keys [B, H, T_pad, dk] (the first scan needs them only to run)."""
  B, H, T_pad, dk = u.shape
  At = direct(u, A0, S, L, plan=plan)                                   # A~_1..A~_{S-1}
  starts = jnp.concatenate([A0[:, :, None], At], axis=2).reshape(B * H, S, dk, dk)
  rows = lambda x: jnp.pad(x, [(0, 0), (0, 0), (0, S * L - T_pad), (0, 0)]).reshape(
      B * H, S * L, dk)
  _, F = penalty_scan_module.penalty_scan(starts, rows(keys), rows(u), plan=plan,
                                          warps=plan.scan_warps)
  F = F.reshape(B, H, S, dk, dk)[:, :, :-1]                             # ends of 0..S-2
  U = rows(u).reshape(B, H, S, L, dk)[:, :, :-1]
  G = jnp.einsum("bhsli,bhslj->bhsij", U, U, precision=HIGHEST)
  Q = jnp.eye(dk) - mm(F, G)
  D = F - At

  def compose(a, b):      # a then b: E -> Qb (Qa E Qa^T + Da) Qb^T + Db
    Qa, Da = a
    Qb, Db = b
    return mm(Qb, Qa), mm(mm(Qb, Da), jnp.swapaxes(Qb, -1, -2)) + Db

  _, E = jax.lax.associative_scan(compose, (Q, D), axis=2)
  return At + E


VARIANTS = ("direct", "float32_grams", "no_newton", "one_newton_step", "float64_cholesky",
            "linearised_carry")


def measure(T=16384, d=32, lam0=0.1, segment_chunks=4, C=16, seed=0):
  """{variant: (max start error, o, S_T, A_T errors)} against float64, B = H = 1."""
  from vla_jax.benchmarks.check import penalty_directions  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import KernelConfig  # pylint: disable=import-outside-toplevel
  from vla_jax.kernels import vla as vla_module  # pylint: disable=import-outside-toplevel
  from vla_jax.ops.vla import VLAState, vla_recurrence  # pylint: disable=import-outside-toplevel
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k, v = (jax.random.normal(x, (1, T, 1, d)) for x in ks[:3])
  u = penalty_directions(ks[3], 1, T, 1, d, "anisotropic")
  S0 = jax.random.normal(ks[4], (1, 1, d, d)) / 8
  A0 = jnp.eye(d)[None, None] / lam0
  with jax.enable_x64(True):
    f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))
    o_r, st = vla_recurrence(*(f64(x) for x in (q, k, v, u)),
                             initial_state=VLAState(f64(S0), f64(A0)), impl="scan")
    ref = [np.asarray(x) for x in (o_r, st.S, st.A)]
  N = T // C
  plan = KernelConfig(chunk_size=C, precision=HIGHEST).plan(
      low=False, acc=jnp.float32, dk=d, dv=d, BH=1, N=N, interpret=True)
  plan = dataclasses.replace(plan, segment_chunks=segment_chunks, segments=N // segment_chunks)
  S, L = plan.segments, segment_chunks * C
  u64 = np.asarray(u, np.float64)[0, :, 0]
  rel = lambda a, b: float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))
  keys = jnp.swapaxes(k / jnp.linalg.norm(k, axis=-1, keepdims=True), 1, 2)
  out = {}
  original = penalty_scan_module.segment_start_inverses
  for name in VARIANTS:
    fn = globals()[name]
    if name == "linearised_carry":
      fn = functools.partial(fn, keys=keys)
    A = fn(jnp.swapaxes(u, 1, 2), A0, S, L, plan=plan)
    start = max(rel(A[0, 0, s - 1], np.linalg.inv(lam0 * np.eye(d) + u64[:s * L].T
                                                  @ u64[:s * L])) for s in range(1, S))
    penalty_scan_module.segment_start_inverses = lambda *a, A=A, **kw: A
    try:
      o, S_T, A_T = vla_module._vla(plan, q, k, v, u, S0, A0)  # pylint: disable=protected-access
    finally:
      penalty_scan_module.segment_start_inverses = original
    out[name] = (start, *(rel(x, r) for x, r in zip((o, S_T, A_T), ref)))
  return out


if __name__ == "__main__":
  for T, d, lam0 in ((16384, 32, 0.1), (4096, 16, 0.01)):
    for name, errs in measure(T, d, lam0).items():
      print(f"T={T} d={d} lam0={lam0} {name:18s} start {errs[0]:.1e}  o/S/A "
            + " / ".join(f"{e:.1e}" for e in errs[1:]), flush=True)
