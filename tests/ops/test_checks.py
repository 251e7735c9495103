"""vla_jax.ops.checks: the scalar checks shared by the ops, layers and models."""

import jax.numpy as jnp
import numpy as np
import pytest

from vla_jax.ops import checks


@pytest.mark.parametrize("value,want", [(0, 0.0), (1.5, 1.5), (np.float32(2.0), 2.0),
                                        (np.int64(3), 3.0), (jnp.float32(0.5), 0.5)])
def test_nonnegative_takes_finite_reals_at_least_zero(value, want):
  got = checks.nonnegative(value)
  assert isinstance(got, float) and got == want


@pytest.mark.parametrize("value", [-1e-9, float("nan"), float("inf"), "1.0", True, np.bool_(True),
                                   jnp.ones(2), jnp.array(True), None, [1.0]])
def test_nonnegative_refuses_the_rest(value):
  assert checks.nonnegative(value) is None


def test_check_size_names_the_argument_and_type():
  assert checks.check_size("n", np.int32(4)) == 4
  for bad in (-1, 2.0, True, "3"):
    with pytest.raises(ValueError, match=rf"n must be an int >= 0; got {type(bad).__name__} "):
      checks.check_size("n", bad)
