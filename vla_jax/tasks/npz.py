"""Externally generated examples: an `.npz` file with `inputs` and `labels` [N, T] int arrays
in the MQAR format (labels -100 except at scored positions)."""

import numpy as np

from vla_jax.tasks.common import check_examples


def load_npz(path, vocab_size=None):
  """Loads and checks `inputs` and `labels` from `path`; returns them as int32 [N, T]."""
  try:
    with np.load(path) as data:
      missing = {"inputs", "labels"} - set(data.files)
      if missing:
        raise ValueError(f"{path}: missing array(s) {', '.join(sorted(missing))}; an external "
                         f"data file needs `inputs` and `labels` [N, T] int arrays, has "
                         f"{', '.join(data.files) or 'nothing'}")
      inputs, labels = data["inputs"], data["labels"]
  except FileNotFoundError:
    raise ValueError(f"data file {path} does not exist") from None
  return check_examples(inputs, labels, vocab_size, where=str(path))


def save_npz(path, inputs, labels):
  """Writes `inputs` and `labels` in the format `load_npz` reads."""
  np.savez(path, inputs=np.asarray(inputs), labels=np.asarray(labels))
