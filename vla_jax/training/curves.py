"""A run's metrics rows (metrics.jsonl) as TensorBoard scalars, and the names those rows use.

`TensorBoardWriter` (with `train.tensorboard=True`, under `<workdir>/tb`) writes each row as it
is logged through tensorboardX, an optional dependency (`pip install 'vla-jax[tensorboard]'`).
The PNG plots of the same rows are drawn by experiments/plot_run.py.
"""

import json
import os

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tb"
TRAIN_KEYS = ("loss", "accuracy", "grad_norm", "lr", "steps_per_s")
DIAGNOSTICS_KEY = "diagnostics"   # `probe`'s rows: {"step": s, "diagnostics": {...}}


def run_labels(workdir):
  """Names of a sweep's runs in stacking order ("seed 0, lr 0.001", ...), or None for a
  single run (or no config.json)."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      sweep = json.load(f).get("sweep")
  except (OSError, ValueError):
    return None
  if not sweep:
    return None
  return [f"seed {s}, lr {lr:g}" for s in sweep["seeds"] for lr in sweep["learning_rates"]]


def scalars(row, labels=None):
  """The (tag, value) pairs of a metrics row: train/<key> for a training row (a sweep's
  per-run values as train/<key>/<label>; with diagnostics its gradient norms by group too),
  eval/<set>/<metric> for an evaluation row, diagnostics/<name> for a diagnostics row."""
  pairs = []
  if "eval" in row:
    for name, scores in row["eval"].items():
      for metric, value in scores.items():
        if metric != "targets" and isinstance(value, (int, float)):
          pairs.append((f"eval/{name}/{metric}", value))
    return pairs
  if DIAGNOSTICS_KEY in row:
    source, prefix = row[DIAGNOSTICS_KEY], DIAGNOSTICS_KEY
    keys = sorted(source)
  else:
    source, prefix = row, "train"
    keys = list(TRAIN_KEYS + ("compile_s",)) + sorted(k for k in row if "grad." in k)
  for key in keys:
    value = source.get(key)
    if isinstance(value, list):
      for r, v in enumerate(value):
        run = labels[r] if labels and r < len(labels) else f"run {r}"
        pairs.append((f"{prefix}/{key}/{run}", v))
    elif value is not None:
      pairs.append((f"{prefix}/{key}", value))
  return pairs


class TensorBoardWriter:
  """Writes metrics rows as TensorBoard scalars under `logdir` (tensorboardX).

  Raises:
    ImportError: tensorboardX is not installed (when built, so before any training).
  """

  def __init__(self, logdir, labels=None):
    try:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("train.tensorboard=True needs tensorboardX: pip install "
                        "'vla-jax[tensorboard]'") from e
    self.labels = labels
    self._writer = SummaryWriter(logdir)

  def write(self, row):
    for tag, value in scalars(row, self.labels):
      self._writer.add_scalar(tag, value, row["step"])
    self._writer.flush()

  def close(self):
    self._writer.close()
