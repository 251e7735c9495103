"""Shared pieces of the synthetic tasks: the ignore label, seeding, metrics."""

import numpy as np

IGNORE = -100  # label of positions that carry no target (PyTorch's and zoology's convention)


def rng_for(seed, stream, index):
  """The NumPy generator of batch `index` in `stream` (1 = train, 2 = eval) under `seed`.

  Batches are a pure function of (seed, stream, index): resuming at step s regenerates exactly
  the batches an uninterrupted run would have seen.
  """
  return np.random.default_rng(np.random.SeedSequence([int(seed), int(stream), int(index)]))


def check_int(name, value, minimum):
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
  return int(value)


def check_examples(inputs, labels, vocab_size=None, where="data"):
  """Checks a batch of `inputs` [N, T] and `labels` [N, T] int arrays (labels IGNORE or a
  token id, at least one target) and returns them as int32."""
  inputs, labels = np.asarray(inputs), np.asarray(labels)
  for name, arr in (("inputs", inputs), ("labels", labels)):
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
      raise ValueError(f"{where}: {name} must be a 2-D integer array [N, T]; got shape "
                       f"{arr.shape} dtype {arr.dtype}")
  if inputs.shape != labels.shape:
    raise ValueError(f"{where}: inputs {inputs.shape} and labels {labels.shape} must have the "
                     "same shape")
  if inputs.size and inputs.min() < 0:
    raise ValueError(f"{where}: inputs must be token ids >= 0; got min {inputs.min()}")
  bad = (labels != IGNORE) & (labels < 0)
  if bad.any():
    raise ValueError(f"{where}: labels must be token ids or {IGNORE}; got {labels[bad][0]}")
  if not (labels != IGNORE).any():   # nothing to score: every metric would be vacuous
    raise ValueError(f"{where}: labels hold no targets (every label is {IGNORE}, or there are "
                     f"no examples; shape {labels.shape})")
  if vocab_size is not None:
    for name, arr in (("inputs", inputs), ("labels", labels)):
      over = np.argwhere(arr >= vocab_size)
      if over.size:
        row, col = (int(i) for i in over[0])
        raise ValueError(f"{where}: token id {int(arr[row, col])} does not fit vocab_size="
                         f"{vocab_size} (ids lie in [0, {vocab_size})), at {name}[{row}, "
                         f"{col}] (example {row}, position {col})")
  return inputs.astype(np.int32), labels.astype(np.int32)


def token_metrics(predictions, labels):
  """Per-target accuracy and exact match (all targets of an example right) in NumPy.

  Args:
    predictions, labels: [N, T] ints; positions with label IGNORE are not scored.

  Returns:
    dict with `accuracy` (correct / targets), `exact_match` (share of the examples with
    targets that have every target right; examples without targets are not scored) and
    `targets`.

  Raises:
    ValueError: no example has a target (nothing to score).
  """
  mask = labels != IGNORE
  correct = (predictions == labels) & mask
  targets = int(mask.sum())
  scored = mask.any(axis=1)
  if not scored.any():
    raise ValueError(f"labels hold no targets (every label is {IGNORE}, or there are no "
                     f"examples; shape {labels.shape}): nothing to score")
  return {
      "accuracy": float(correct.sum() / targets),
      "exact_match": float(np.mean(correct.sum(1)[scored] == mask.sum(1)[scored])),
      "targets": targets,
  }
