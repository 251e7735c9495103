"""The seed paper's VLA kernel design, reimplemented from its description as a raw Triton kernel.

One program per (sequence, head) runs the recurrence token by token with A (dk x dk) and
S (dv x dk) held in registers in float32, forward only:

    khat = k / max(||k||, 1e-6)
    z = A u;  A -= z z^T / (1 + u.z)
    a = A khat / max(||A khat||, 1e-12)
    S += (v - S khat) a^T;  o = S q

It is called from JAX through `jax_triton.triton_call` when that works; otherwise the same
kernel is launched through torch, and the rows say so (`impl` "triton_sequential(jax_triton)" or
"triton_sequential(torch)", with the jax_triton error in the note).
"""

import functools

import numpy as np

KEY_EPS = 1e-6
WRITE_EPS = 1e-12


def available():
  """None when Triton and a CUDA device are usable, else the reason they are not."""
  try:
    import triton  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return "no GPU (triton not installed)"
  import jax  # pylint: disable=import-outside-toplevel
  if jax.default_backend() != "gpu":
    return "no GPU"
  return None


@functools.cache
def kernel():
  import triton  # pylint: disable=import-outside-toplevel
  import triton.language as tl  # pylint: disable=import-outside-toplevel

  @triton.jit
  def vla_sequential_kernel(q_ptr, k_ptr, v_ptr, u_ptr, o_ptr, T: tl.constexpr,
                            H: tl.constexpr, D: tl.constexpr, LAM0_INV: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    r = tl.arange(0, D)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    A = eye * LAM0_INV                       # (lam0 I)^-1
    S = tl.zeros((D, D), dtype=tl.float32)   # rows: value dims, columns: key dims
    base = (b * T * H + h).to(tl.int64) * D
    step = H * D
    for t in range(0, T):
      off = base + t * step
      q = tl.load(q_ptr + off + r).to(tl.float32)
      k = tl.load(k_ptr + off + r).to(tl.float32)
      v = tl.load(v_ptr + off + r).to(tl.float32)
      u = tl.load(u_ptr + off + r).to(tl.float32)
      khat = k / tl.maximum(tl.sqrt(tl.sum(k * k, axis=0)), 1e-6)
      z = tl.sum(A * u[None, :], axis=1)                       # A u (A symmetric)
      den = 1.0 + tl.sum(u * z, axis=0)
      A = A - z[:, None] * z[None, :] / den                    # Sherman-Morrison
      w = tl.sum(A * khat[None, :], axis=1)                    # A khat
      a = w / tl.maximum(tl.sqrt(tl.sum(w * w, axis=0)), 1e-12)
      Sk = tl.sum(S * khat[None, :], axis=1)                   # S khat
      S = S + (v - Sk)[:, None] * a[None, :]                   # erase khat, write a
      o = tl.sum(S * q[None, :], axis=1)                       # S q
      tl.store(o_ptr + off + r, o.to(o_ptr.dtype.element_ty))

  return vla_sequential_kernel


def num_warps(d):
  return 8 if d >= 128 else 4


def import_jax_triton():
  """jax_triton, imported so that Triton's file cache keeps working: jax-triton 0.3.x sets
  TRITON_CACHE_DIR="" at import, after which Triton 3.6 (its driver's helper modules, the torch
  launcher, fla) fails with "Could not create or locate cache dir"."""
  import os  # pylint: disable=import-outside-toplevel
  before = os.environ.get("TRITON_CACHE_DIR")
  import jax_triton  # pylint: disable=import-outside-toplevel
  if os.environ.get("TRITON_CACHE_DIR") == "":
    if before:
      os.environ["TRITON_CACHE_DIR"] = before
    else:
      del os.environ["TRITON_CACHE_DIR"]
  return jax_triton


def jax_call(q, k, v, u, lam0=1.0):
  """o = VLA(q, k, v, u) through jax_triton.triton_call; inputs [B, T, H, d] JAX arrays."""
  import jax  # pylint: disable=import-outside-toplevel
  jt = import_jax_triton()
  B, T, H, d = q.shape
  # T and H are compile-time constants: jax-triton 0.3.1 turns positional Python ints into
  # device arrays (pointers), which failed to compile ("invalid operands of type
  # pointer<fp32> and triton.language.int32" at `pid // H`); keyword arguments are constants.
  return jt.triton_call(q, k, v, u, kernel=kernel(),
                        out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype), grid=(B * H,),
                        num_warps=num_warps(d), num_stages=1, T=T, H=H, D=d,
                        LAM0_INV=1.0 / lam0)


def torch_call(q, k, v, u, lam0=1.0):
  """The same kernel launched by Triton's own launcher; inputs contiguous CUDA tensors."""
  import torch  # pylint: disable=import-outside-toplevel
  B, T, H, d = q.shape
  o = torch.empty_like(v)
  kernel()[(B * H,)](q, k, v, u, o, T=T, H=H, D=d, LAM0_INV=1.0 / lam0,
                     num_warps=num_warps(d), num_stages=1)
  return o


def _small_inputs(d, B=2, T=200, H=3, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (rng.standard_normal((B, T, H, d)).astype(np.float32) for _ in range(3))
  u = (rng.standard_normal((B, T, H, d)) / np.sqrt(d)).astype(np.float32)
  return q, k, v, u


def reference(q, k, v, u):
  """The library's impl="chunked" in float32 on the same NumPy inputs."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from vla_jax import vla_recurrence  # pylint: disable=import-outside-toplevel
  o, _ = vla_recurrence(*(jnp.asarray(x) for x in (q, k, v, u)), impl="chunked")
  return np.asarray(o, np.float64)


def run_numpy(path, q, k, v, u):
  """Runs the kernel on NumPy float32 inputs through `path` ("jax_triton" or "torch")."""
  if path == "jax_triton":
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    out = jax.jit(jax_call)(*(jnp.asarray(x) for x in (q, k, v, u)))
    return np.asarray(out, np.float64)
  import torch  # pylint: disable=import-outside-toplevel
  out = torch_call(*(torch.from_numpy(x).cuda().contiguous() for x in (q, k, v, u)))
  torch.cuda.synchronize()
  return out.double().cpu().numpy()


def relative_error(path, d):
  xs = _small_inputs(d)
  got, want = run_numpy(path, *xs), reference(*xs)
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def choose_path(d):
  """("jax_triton", None) when jax_triton runs the kernel, else ("torch", why jax_triton does
  not), or (None, reason) when neither does."""
  try:
    relative_error("jax_triton", d)
    return "jax_triton", None
  except Exception as err:  # pylint: disable=broad-except
    why = f"jax_triton failed: {type(err).__name__}: {' '.join(str(err).split())[:400]}"
  try:
    import torch  # pylint: disable=import-outside-toplevel
    if not torch.cuda.is_available():
      return None, why + "; torch has no CUDA device"
  except ImportError:
    return None, why + "; torch not installed"
  return "torch", why
