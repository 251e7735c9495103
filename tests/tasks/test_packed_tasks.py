"""Packing task examples into rows: each segment holds one example cut after its last target,
the labels stay the example's own, and a packed batch scores as its examples alone."""

import functools

import jax
import numpy as np
from flax import nnx

from conftest import random_module
from vla_jax.models import LanguageModel, ModelConfig
from vla_jax.tasks import IGNORE, make_task
from vla_jax.tasks.packing import pack_examples
from vla_jax.training.train import model_loss


def test_pack_examples_layout():
  task = make_task("copy", {"vocab_size": 10, "min_len": 1, "max_len": 6})
  inputs, labels = task.train_batch(0, 0, 6)
  x, y, seg = pack_examples(inputs, labels, 3)
  assert x.shape == y.shape == seg.shape == (2, 3 * inputs.shape[1])
  for row in range(2):
    for j in range(3):
      ex = 3 * row + j
      n = np.flatnonzero(labels[ex] != IGNORE).max() + 1
      np.testing.assert_array_equal(x[row][seg[row] == j], inputs[ex, :n])
      np.testing.assert_array_equal(y[row][seg[row] == j], labels[ex, :n])
    tail = seg[row] == 3
    assert (x[row][tail] == 0).all() and (y[row][tail] == IGNORE).all()
  assert (np.diff(seg, axis=1) >= 0).all()          # contiguous documents
  assert (y != IGNORE).sum() == (labels != IGNORE).sum()


@functools.partial(jax.jit, static_argnums=(0, 1))
def losses(graphdef, max_targets, params, packed, alone):
  """model_loss of a packed batch (x, y, segment_ids) and of its examples alone (inputs,
  labels), with their max_targets, in one compilation."""
  model = nnx.merge(graphdef, params)
  return (model_loss(model, *packed[:2], max_targets[0], packed[2]),
          model_loss(model, *alone, max_targets[1]))


def test_packed_task_and_loss():
  task = make_task("mqar", {"vocab_size": 32, "n_pairs": 3, "form": "short", "pack": 2})
  x, y, seg = task.train_batch(0, 0, 2)
  assert x.shape == (2, 20) and task.max_len == 20 and task.max_targets == 6
  inputs, labels = make_task("mqar", {"vocab_size": 32, "n_pairs": 3,
                                      "form": "short"}).train_batch(0, 0, 4)
  config = ModelConfig(vocab_size=32, max_len=20, mixer="vla", d_model=8, num_heads=2,
                       num_layers=1, impl="scan")
  graphdef, params = nnx.split(random_module(lambda: LanguageModel(config, rngs=nnx.Rngs(0)),
                                             scale=0.3))
  (loss, aux), (loss_sep, aux_sep) = losses(graphdef, (task.max_targets, 3), params,
                                            (x, y, seg), (inputs, labels))
  np.testing.assert_allclose(float(loss), float(loss_sep), rtol=1e-5)
  assert int(aux["correct"].sum()) == int(aux_sep["correct"].sum())
  assert int(aux["targets"].sum()) == int(aux_sep["targets"].sum()) == 12
