"""Externally generated examples: an `.npz` file with `inputs` and `labels` [N, T] int arrays
in the MQAR format (labels -100 except at scored positions)."""

import zipfile

import numpy as np

from vla_jax.tasks.common import check_examples


def load_npz(path, vocab_size=None):
  """Loads and checks `inputs` and `labels` from `path`; returns them as int32 [N, T].

  Raises ValueError naming the file when it is missing, not an .npz archive, lacks either
  array or holds bad examples (see `check_examples`)."""
  try:
    data = np.load(path, allow_pickle=False)
  except FileNotFoundError:
    raise ValueError(f"data file {path} does not exist") from None
  except (ValueError, EOFError, OSError, zipfile.BadZipFile):
    raise ValueError(f"{path}: not an .npz archive (the zip of .npy arrays that numpy.savez "
                     f"and vla_jax.tasks.save_npz write)") from None
  if not isinstance(data, np.lib.npyio.NpzFile):
    raise ValueError(f"{path}: not an .npz archive but a single .npy array; write one with "
                     f"`inputs` and `labels` [N, T] int arrays (vla_jax.tasks.save_npz)")
  with data:
    missing = {"inputs", "labels"} - set(data.files)
    if missing:
      raise ValueError(f"{path}: missing array(s) {', '.join(sorted(missing))}; an external "
                       f"data file needs `inputs` and `labels` [N, T] int arrays, has "
                       f"{', '.join(data.files) or 'nothing'}")
    try:
      inputs, labels = data["inputs"], data["labels"]
    except (ValueError, OSError, zipfile.BadZipFile) as e:
      raise ValueError(f"{path}: cannot read its arrays ({str(e).splitlines()[0][:120]})"
                       ) from None
  return check_examples(inputs, labels, vocab_size, where=str(path))


def save_npz(path, inputs, labels):
  """Writes `inputs` and `labels` in the format `load_npz` reads."""
  np.savez(path, inputs=np.asarray(inputs), labels=np.asarray(labels))
