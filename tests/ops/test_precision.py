"""`precision` of the sequence ops: None follows `jax.default_matmul_precision`, an explicit
value overrides it, and it reaches every matrix product of every impl (read off the jaxpr,
inside the Pallas kernels too)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vla_jax.kernels.lowering import equations
from vla_jax.ops.baselines import gated_deltanet, linear_attention
from vla_jax.ops.step import deltanet_step, gated_deltanet_step, linear_attention_step, vla_step
from vla_jax.ops.utils import resolve_precision
from vla_jax.ops.vla.recurrence import vla_recurrence

P = jax.lax.Precision
HIGHEST = str((P.HIGHEST, P.HIGHEST))
DEFAULT = str((P.DEFAULT, P.DEFAULT))


def _precisions(fn, *args):
  """The set of dot_general precisions in fn's jaxpr, Pallas kernels and sub-jaxprs included."""
  return {str(e.params["precision"]) for _, e in equations(jax.make_jaxpr(fn)(*args).jaxpr)
          if e.primitive.name == "dot_general"}


def _args(dk=16):
  x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 24, 2, dk)), jnp.float32)
  return x, x + 1.0, x - 1.0, x / 4.0


def _vla_loss(impl, precision):
  return lambda *a: jnp.sum(vla_recurrence(*a, impl=impl, chunk_size=16,
                                           precision=precision)[0])


def _baseline_loss(op, impl, precision):
  def loss(q, k, v, u):
    if op == "linear":
      return jnp.sum(linear_attention(q, k, v, impl=impl, chunk_size=16, precision=precision)[0])
    return jnp.sum(gated_deltanet(q, k, v, u[..., 0], -jnp.abs(u[..., 1]), impl=impl,
                                  chunk_size=16, precision=precision)[0])
  return loss


def test_resolve_precision_names_and_default():
  assert resolve_precision(None) == P.DEFAULT
  for name, want in (("default", P.DEFAULT), ("bfloat16", P.DEFAULT), ("high", P.HIGH),
                     ("tensorfloat32", P.HIGH), ("highest", P.HIGHEST), ("float32", P.HIGHEST),
                     (P.HIGH, P.HIGH)):
    assert resolve_precision(name) == want
  with jax.default_matmul_precision("highest"):
    assert resolve_precision(None) == P.HIGHEST
    assert resolve_precision("default") == P.DEFAULT
  with pytest.raises(ValueError, match="precision"):
    vla_recurrence(*_args(), precision="fast")


def test_a_pair_of_equal_precisions_is_that_precision():
  """jnp.matmul's per-operand pair: two equal entries are that precision (reaching every
  product), two different ones are refused by every op (their products take one)."""
  assert resolve_precision((P.HIGH, P.HIGH)) == P.HIGH
  assert resolve_precision(["highest", "float32"]) == P.HIGHEST
  args = _args()
  fwd = lambda *a: vla_recurrence(*a, impl="scan", precision=(P.HIGHEST, P.HIGHEST))[0]
  with jax.default_matmul_precision("bfloat16"):
    assert _precisions(fwd, *args) == {HIGHEST}
  match = (r"precision must be one precision for both operands \(the ops' products take one\); "
           r"got the pair \(Precision.HIGH, Precision.HIGHEST\): pass 'high' or 'highest'")
  bad = (P.HIGH, P.HIGHEST)
  with pytest.raises(ValueError, match=match):
    vla_recurrence(*args, precision=bad)
  with pytest.raises(ValueError, match=match):
    linear_attention(*args[:3], precision=bad)
  with pytest.raises(ValueError, match=match):
    gated_deltanet(*args[:3], args[3][..., 0], None, precision=bad)
  with pytest.raises(ValueError, match=r"precision as a pair must hold two jax.lax.Precision "
                                       r"values or names"):
    resolve_precision(("high", "fast"))


@pytest.mark.parametrize("impl", ["scan", "associative_scan", "chunked"])
def test_precision_reaches_every_product(impl):
  """Forward and gradient: an explicit 'highest' overrides a 'bfloat16' default, and None
  under default_matmul_precision('highest') is HIGHEST, in every product; None with no
  setting leaves the forward's products at DEFAULT (scan and chunked: no linear solve)."""
  args = _args()
  for op in ("vla", "gated_deltanet", "linear"):
    loss = (_vla_loss if op == "vla" else lambda i, p: _baseline_loss(op, i, p))
    grad = lambda p: jax.grad(loss(impl, p), argnums=(0, 1, 2, 3))
    with jax.default_matmul_precision("bfloat16"):
      assert _precisions(grad("highest"), *args) == {HIGHEST}, op
    with jax.default_matmul_precision("highest"):
      assert _precisions(grad(None), *args) == {HIGHEST}, op
    if impl != "associative_scan" or op != "vla":
      assert _precisions(loss(impl, None), *args) == {DEFAULT}, op


def test_default_matmul_precision_reaches_the_pallas_kernels():
  """impl='pallas' (interpret mode): JAX's 'highest' setting makes every product of the
  kernels and of their XLA parts HIGHEST; without it the kernels' products are not."""
  args = _args()
  fwd = lambda *a: vla_recurrence(*a, impl="pallas", chunk_size=16)[0]
  default = _precisions(fwd, *args)
  with jax.default_matmul_precision("highest"):
    highest = _precisions(fwd, *args)
  assert highest == {HIGHEST}
  assert DEFAULT in default, default
  assert _precisions(lambda *a: vla_recurrence(*a, impl="pallas", chunk_size=16,
                                               precision="highest")[0], *args) == {HIGHEST}


def test_dot_algorithm_presets_are_refused_by_name():
  """JAX's default set to a dot algorithm preset (which jnp.matmul takes) is refused naming
  the setting, not as if the caller had passed a bad precision; passed, likewise."""
  args = _args()
  for preset in ("BF16_BF16_F32", "F32_F32_F32"):
    with jax.default_matmul_precision(preset):
      with pytest.raises(ValueError, match=f"jax.default_matmul_precision is '{preset}', which "
                                           "these ops do not take"):
        vla_recurrence(*args)
      explicit = lambda *a: vla_recurrence(*a, precision="highest")[0]
      assert _precisions(explicit, *args) == {HIGHEST}   # an explicit one still runs
  with pytest.raises(ValueError, match="precision must be None, a jax.lax.Precision"):
    gated_deltanet(*args[:3], args[3][..., 0], None, precision="bfloat16_3x")


def test_steps_follow_precision_as_the_sequence_ops():
  """The one-token steps take `precision` as the ops do: None follows JAX's default (their
  products were always HIGHEST, so a decode after a prefill at the default differed from
  the full pass by the default's rounding), an explicit value overrides it."""
  x = _args()[0][:, 0]
  b = jnp.full(x.shape[:2], 0.5)
  steps = {"vla": lambda p: lambda *a: vla_step(None, *a, precision=p),
           "gated_deltanet": lambda p: lambda q, k, v, u: gated_deltanet_step(
               None, q, k, v, b, -jnp.abs(u[..., 0]), precision=p),
           "deltanet": lambda p: lambda q, k, v, u: deltanet_step(None, q, k, v, b, precision=p),
           "linear": lambda p: lambda q, k, v, u: linear_attention_step(None, q, k, v,
                                                                        precision=p)}
  for name, step in steps.items():
    assert _precisions(step(None), x, x, x, x) == {DEFAULT}, name
    with jax.default_matmul_precision("highest"):
      assert _precisions(step(None), x, x, x, x) == {HIGHEST}, name
    with jax.default_matmul_precision("bfloat16"):
      assert _precisions(step("highest"), x, x, x, x) == {HIGHEST}, name
