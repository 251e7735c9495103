"""Packing task examples into rows: each segment holds one example cut after its last target,
the labels stay the example's own, and a packed batch scores as its examples alone."""

import numpy as np
from flax import nnx

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


def test_packed_task_and_loss():
  task = make_task("mqar", {"vocab_size": 32, "n_pairs": 3, "form": "short", "pack": 2})
  x, y, seg = task.train_batch(0, 0, 2)
  assert x.shape == (2, 20) and task.max_len == 20 and task.max_targets == 6
  config = ModelConfig(vocab_size=32, max_len=20, mixer="vla", d_model=32, num_heads=2,
                       num_layers=1, chunk_size=16)
  model = LanguageModel(config, rngs=nnx.Rngs(0))
  loss, aux = model_loss(model, x, y, task.max_targets, seg)
  inputs, labels = make_task("mqar", {"vocab_size": 32, "n_pairs": 3,
                                      "form": "short"}).train_batch(0, 0, 4)
  loss_sep, aux_sep = model_loss(model, inputs, labels, 3)
  np.testing.assert_allclose(float(loss), float(loss_sep), rtol=1e-5)
  assert int(aux["correct"].sum()) == int(aux_sep["correct"].sum())
  assert int(aux["targets"].sum()) == int(aux_sep["targets"].sum()) == 12
