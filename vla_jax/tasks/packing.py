"""Packing: several examples of a task in one row, told apart by segment ids.

A packed row holds `per_row` examples one after another, each cut after its last target (the
tokens after it carry no label and, the model being causal, change no prediction), then
padding (token 0, label IGNORE) up to `per_row` * T. Segment ids number the examples of a row
0, 1, ..., per_row - 1 and give the trailing padding its own id, per_row. The model restarts
every state at each new id (`LanguageModel(tokens, segment_ids=...)`), so each example is
scored exactly as it would be alone, and the labels (hence the loss and accuracy masks) are
the examples' own.
"""

import numpy as np

from vla_jax.tasks.common import IGNORE


def pack_examples(inputs, labels, per_row):
  """Packs examples [N, T] into rows [N / per_row, per_row * T].

  Args:
    inputs, labels: [N, T] int arrays (labels IGNORE where there is no target), N divisible
      by `per_row`.
    per_row: examples per row (>= 1).

  Returns:
    (inputs, labels, segment_ids), each [N / per_row, per_row * T] int32.
  """
  inputs, labels = np.asarray(inputs), np.asarray(labels)
  N, T = inputs.shape
  if per_row < 1 or N % per_row:
    raise ValueError(f"pack_examples: {N} examples do not split into rows of per_row="
                     f"{per_row}")
  rows, width = N // per_row, per_row * T
  has_target = labels != IGNORE
  # Each example's length: up to and including its last target (1 without targets).
  lengths = np.where(has_target.any(1), T - np.argmax(has_target[:, ::-1], axis=1), 1)
  lengths = lengths.reshape(rows, per_row)
  ends = np.cumsum(lengths, axis=1)                           # [rows, per_row]
  pos = np.arange(width)[None, :]
  example = (pos[:, None, :] >= ends[:, :, None]).sum(1)      # [rows, width]: 0..per_row
  starts = np.concatenate([np.zeros((rows, 1), ends.dtype), ends[:, :-1]], axis=1)
  inside = example < per_row
  slot = np.minimum(example, per_row - 1)
  offset = pos - np.take_along_axis(starts, slot, axis=1)
  source = np.arange(rows)[:, None] * per_row + slot          # the example's row in inputs
  take = lambda a: a[source, np.clip(offset, 0, T - 1)]
  packed_inputs = np.where(inside, take(inputs), 0)
  packed_labels = np.where(inside, take(labels), IGNORE)
  return (packed_inputs.astype(np.int32), packed_labels.astype(np.int32),
          example.astype(np.int32))


class PackedTask:
  """A task whose training batches are packed (`pack_examples`) `per_row` examples a row;
  evaluation sets stay one example a row (each example scored alone either way)."""

  def __init__(self, task, per_row):
    self.task = task
    self.per_row = int(per_row)
    self.name = task.name
    self.vocab_size = task.vocab_size
    self.max_len = max(self.per_row * task.max_len, task.max_len)
    inner = getattr(task, "max_targets", None)
    self.max_targets = None if inner is None else self.per_row * inner

  def train_batch(self, seed, step, batch_size):
    """(inputs, labels, segment_ids) [batch_size, per_row * T]: batch_size * per_row of the
    task's examples, packed."""
    inputs, labels = self.task.train_batch(seed, step, batch_size * self.per_row)[:2]
    return pack_examples(inputs, labels, self.per_row)

  def eval_sets(self, seed, num_examples):
    return self.task.eval_sets(seed, num_examples)

  def validation_sets(self, seed, num_examples):
    return self.task.validation_sets(seed, num_examples)

  def __getattr__(self, name):   # the task's own attributes (config, ...)
    return getattr(self.__dict__["task"], name)
