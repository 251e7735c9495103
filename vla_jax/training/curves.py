"""A run's curves: PNG plots of its metrics.jsonl, and the same rows as TensorBoard scalars.

`plot_run(workdir)` draws loss, accuracy (training, and each evaluation set's accuracy and
exact match), learning rate and steps/s against the step, from the rows that
`train_and_evaluate` or `train_sweep` logged (a sweep: one line per run). Of rows logged twice
for one step (a resumed run repeats the steps after its checkpoint), the last one counts.

`TensorBoardWriter` (with `train.tensorboard=True`, under `<workdir>/tb`) writes each row as it
is logged through tensorboardX, an optional dependency (`pip install 'vla-jax[tensorboard]'`).
"""

import json
import os

from vla_jax.training import jsonl

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tb"
TRAIN_KEYS = ("loss", "accuracy", "grad_norm", "lr", "steps_per_s")


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


def read_curves(metrics_path):
  """The curves in a metrics.jsonl file.

  Returns:
    {"train": {key: [(step, value)]} for the TRAIN_KEYS present (a sweep's values are lists,
    one per run), "eval": {set: {metric: [(step, value)]}}}, each sorted by step, the last
    row written for a step winning.

  Raises:
    ValueError: no such file, or no rows in it.
  """
  if not os.path.exists(metrics_path):
    raise ValueError(f"no metrics file {metrics_path} (a run writes it at its first logged "
                     "step)")
  train_rows, eval_rows = {}, {}
  for row in jsonl.read_rows(metrics_path):
    if "eval" in row:
      eval_rows[row["step"]] = row["eval"]
    elif "loss" in row:
      train_rows[row["step"]] = row
  if not train_rows and not eval_rows:
    raise ValueError(f"{metrics_path} has no training or evaluation rows")
  train = {}
  for key in TRAIN_KEYS:
    points = [(s, r[key]) for s, r in sorted(train_rows.items()) if r.get(key) is not None]
    if points:
      train[key] = points
  evals = {}
  for step, sets in sorted(eval_rows.items()):
    for name, scores in sets.items():
      for metric, value in scores.items():
        if metric != "targets" and isinstance(value, (int, float)):
          evals.setdefault(name, {}).setdefault(metric, []).append((step, value))
  return {"train": train, "eval": evals}


def plot_run(workdir, out=None):
  """Draws the curves of the run in `workdir` into one PNG of four panels (loss, accuracy,
  learning rate, steps/s); returns its path (default `<workdir>/curves.png`)."""
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("plotting needs matplotlib: pip install 'vla-jax[plot]'") from e
  curves = read_curves(os.path.join(workdir, METRICS_FILE))
  labels = run_labels(workdir)
  out = out or os.path.join(workdir, "curves.png")
  fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
  panels = (("loss", "training loss", True), ("accuracy", "accuracy", False),
            ("lr", "learning rate", False), ("steps_per_s", "steps/s (compilation excluded)",
                                             False))
  for ax, (key, title, log_y) in zip(axes.flat, panels):
    points = curves["train"].get(key, [])
    _lines(ax, points, labels, "train" if key == "accuracy" else None)
    if key == "accuracy":
      for name, metrics in curves["eval"].items():
        for metric in ("accuracy", "exact_match"):
          if metric in metrics:
            _lines(ax, metrics[metric], labels, f"{name} {metric.replace('_', ' ')}",
                   marker="o" if metric == "accuracy" else "s")
      ax.set_ylim(-0.02, 1.02)
    values = [v for _, vs in points for v in _values(vs) if v == v]   # NaN left out
    if log_y and values and min(values) > 0 and max(values) > 20 * min(values):
      ax.set_yscale("log")   # only for a range of more than a decade
    if not points and key != "accuracy":
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.suptitle(_title(workdir))
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110)
  plt.close(fig)
  return out


def _values(value):
  return value if isinstance(value, list) else [value]


def _lines(ax, points, labels, name, marker=None):
  """One line per run: a value per step, or (a sweep) a list of values per step."""
  if not points:
    return
  steps = [s for s, _ in points]
  width = len(_values(points[0][1]))
  for r in range(width):
    values = [_values(v)[r] if len(_values(v)) == width else float("nan") for _, v in points]
    run = labels[r] if labels and width > 1 and r < len(labels) else None
    label = ", ".join(x for x in (name, run) if x) or None
    ax.plot(steps, values, marker=marker, markersize=4 if marker else None, label=label,
            linewidth=1.2)


def _title(workdir):
  title = os.path.basename(os.path.abspath(workdir))
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
    return (f"{title}: {config['task']['name']}, mixer {config['model']['mixer']}, "
            f"{config['train']['num_steps']} steps")
  except (OSError, ValueError, KeyError):
    return title


def scalars(row, labels=None):
  """The (tag, value) pairs of a metrics row: train/<key> for a training row (a sweep's
  per-run values as train/<key>/<label>), eval/<set>/<metric> for an evaluation row."""
  pairs = []
  if "eval" in row:
    for name, scores in row["eval"].items():
      for metric, value in scores.items():
        if metric != "targets" and isinstance(value, (int, float)):
          pairs.append((f"eval/{name}/{metric}", value))
    return pairs
  for key in TRAIN_KEYS + ("compile_s",):
    value = row.get(key)
    if isinstance(value, list):
      for r, v in enumerate(value):
        run = labels[r] if labels and r < len(labels) else f"run {r}"
        pairs.append((f"train/{key}/{run}", v))
    elif value is not None:
      pairs.append((f"train/{key}", value))
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
