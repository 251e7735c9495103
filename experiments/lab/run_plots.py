"""A run's curves as PNG plots, from the metrics.jsonl rows that `train_and_evaluate` or
`train_sweep` logged (experiments/plot_run.py).

`plot_run(workdir)` draws loss (training, and each text evaluation set's loss, with a bits per
byte axis), accuracy (training, and each evaluation set's accuracy and exact match), learning
rate and steps/s against the step (a sweep: one line per run). Of rows
logged twice for one step (a resumed run repeats the steps after its checkpoint), the last one
counts.

`plot_diagnostics(workdirs)` draws the rows of `train.diagnostics_every` (`probe`) of one or
more runs, a sweep's runs one by one, solved runs in blue and failed ones in red.
"""

import json
import math
import os

from vla_jax.training import jsonl
from vla_jax.training.curves import DIAGNOSTICS_KEY, METRICS_FILE, TRAIN_KEYS, run_labels


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
  learning rate, steps/s); returns its path (default `<workdir>/curves.png`). Evaluation sets
  with a loss (text) add it to the loss panel, whose right axis then reads bits per byte
  (loss / ln 2)."""
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
    evals_with_loss = {n: m["loss"] for n, m in curves["eval"].items() if "loss" in m}
    _lines(ax, points, labels, "train" if key == "accuracy" or (
        key == "loss" and evals_with_loss) else None)
    if key == "loss" and evals_with_loss:
      for name, loss_points in evals_with_loss.items():
        _lines(ax, loss_points, labels, f"{name} loss", marker="o")
      ax.secondary_yaxis("right", functions=(lambda x: x / math.log(2.0),
                                             lambda x: x * math.log(2.0))
                         ).set_ylabel("bits per byte")
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
  return _save(fig, out, dpi=110)


def _save(fig, out, dpi):
  """Writes `fig` to `out` (making its folder), closes it and returns `out`."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=dpi)
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


# The panels of `plot_diagnostics`: (source, key, title, log scale). Source "train" reads the
# training rows, "probe" the diagnostics rows; "layer*" keys are drawn for every layer.
DIAGNOSTIC_PANELS = (
    ("train", "loss", "training loss", True),
    ("train", "accuracy", "training accuracy", False),
    ("train", "grad_norm", "gradient norm (all parameters)", True),
    ("train", "layer*.grad.q_proj", "gradient norm: q projection", True),
    ("train", "layer*.grad.k_proj", "gradient norm: k projection", True),
    ("train", "layer*.grad.v_proj", "gradient norm: v projection", True),
    ("train", "layer*.grad.u_proj", "gradient norm: u projection", True),
    ("train", "layer*.grad.out", "gradient norm: readout (norm, W_o)", True),
    ("probe", "layer*.cond_A.last", "cond(A_T), median over heads", True),
    ("probe", "layer*.align_mean", "a . khat, mean over tokens", False),
    ("probe", "layer*.align_p10", "a . khat, 10th percentile", False),
    ("probe", "layer*.state_norm_end", "||S_T||, median over heads", False),
)
LAYER_STYLES = ("-", "--", ":", "-.")


def read_diagnostics(workdir):
  """A run's (or a sweep's) per-run curves for `plot_diagnostics`.

  Returns:
    {"labels": [run name], "final": [final accuracy or None] per run, "train": {key:
    [(step, [value per run])]} (every numeric key of the training rows), "probe": the same
    for the "diagnostics" rows}, steps sorted, the last row written for a step winning.

  Raises:
    ValueError: no metrics file, or no rows in it.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    raise ValueError(f"no metrics file {path} (a run writes it at its first logged step)")
  rows = jsonl.read_rows(path)
  if not rows:
    raise ValueError(f"{path} has no rows")
  by_step = {"train": {}, "probe": {}}
  last_eval = None
  for row in rows:
    if "eval" in row:
      last_eval = row
    elif DIAGNOSTICS_KEY in row:
      by_step["probe"][row["step"]] = row[DIAGNOSTICS_KEY]
    elif "loss" in row:
      by_step["train"][row["step"]] = row
  out = {}
  for source, steps in by_step.items():
    keys = {}
    for step, row in sorted(steps.items()):
      for key, value in row.items():
        values = _values(value)
        if key not in ("step", "steps_per_s", "tokens_per_s", "elapsed_s",
                       "compile_s") and values and all(
            isinstance(v, (int, float)) for v in values):
          keys.setdefault(key, []).append((step, values))
    out[source] = keys
  width = max([len(v) for points in (*out["train"].values(), *out["probe"].values())
               for _, v in points[:1]] or [1])
  labels = run_labels(workdir) or [os.path.basename(os.path.abspath(workdir))]
  out["labels"] = [f"{os.path.basename(os.path.abspath(workdir))}: {l}" if width > 1 else l
                   for l in labels][:width]
  out["final"] = _final_accuracies(workdir, width, last_eval, out["train"].get("accuracy"))
  return out


def _final_accuracies(workdir, width, last_eval, train_accuracy):
  """Per run: the test accuracy of the first set (a finished sweep's results, a run's last
  evaluation), else the last training accuracy, else None."""
  results = jsonl.read_rows(os.path.join(workdir, "sweep_results.jsonl"))
  if len(results) == width:
    return [next(iter(r["test"].values()))["accuracy"] if r.get("test") else None
            for r in results]
  if last_eval is not None and width == 1:
    return [next(iter(last_eval["eval"].values()))["accuracy"]]
  if train_accuracy:
    return list(train_accuracy[-1][1])
  return [None] * width


def run_outcomes(finals, solved=0.9):
  """"solved" (final accuracy >= `solved`), "failed" or "unknown" (None) for each run."""
  return ["unknown" if a is None else "solved" if a >= solved else "failed" for a in finals]


def plot_diagnostics(workdirs, out=None, solved=0.9):
  """Draws the diagnostics of one or more runs (`train.diagnostics_every` > 0; a sweep's runs
  one by one) into one PNG comparing the runs that solved their task (final test accuracy >=
  `solved`, blue shades) with those that did not (red shades): loss, accuracy, gradient norms
  overall and of the VLA layers' projections, cond(A_T), the alignment a . khat and ||S_T||
  against the step; each layer in its own line style. Runs without diagnostics rows draw
  the training panels only. Returns the PNG's path (default `<first workdir>/diagnostics.png`).
  """
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError("plotting needs matplotlib: pip install 'vla-jax[plot]'") from e
  workdirs = [workdirs] if isinstance(workdirs, str) else list(workdirs)
  runs = []   # (label, final, outcome, curves, index in its workdir)
  for workdir in workdirs:
    got = read_diagnostics(workdir)
    for r, (label, final, outcome) in enumerate(zip(
        got["labels"], got["final"], run_outcomes(got["final"], solved))):
      runs.append((label, final, outcome, got, r))
  colours = _outcome_colours([outcome for _, _, outcome, _, _ in runs])
  out = out or os.path.join(workdirs[0], "diagnostics.png")
  fig, axes = plt.subplots(4, 3, figsize=(15, 14))
  for ax, (source, key, title, log_y) in zip(axes.flat, DIAGNOSTIC_PANELS):
    drawn = False
    for (label, final, _, got, r), colour in zip(runs, colours):
      for layer, layer_key in _layer_keys(got[source], key):
        points = [(s, v[r]) for s, v in got[source][layer_key] if r < len(v)]
        if not points:
          continue
        name = None
        if ax is axes.flat[0] and layer in (None, 0):
          name = f"{label} ({'?' if final is None else f'{final:.3f}'})"
        ax.plot([s for s, _ in points], [v for _, v in points], color=colour,
                linestyle=LAYER_STYLES[(layer or 0) % len(LAYER_STYLES)], linewidth=1.2,
                label=name)
        drawn = True
    if log_y and drawn and all(l.get_ydata().min() > 0 for l in ax.get_lines()):
      ax.set_yscale("log")
    if not drawn:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  if axes.flat[0].get_legend_handles_labels()[0]:
    axes.flat[0].legend(fontsize=7, title="run (final accuracy)", title_fontsize=7)
  layers = max(len(_layer_keys(got["probe"], "layer*.align_mean")) for *_, got, _ in runs)
  if layers > 1:
    axes.flat[-1].legend(
        [plt.Line2D([], [], color="black", linestyle=LAYER_STYLES[i % len(LAYER_STYLES)])
         for i in range(layers)], [f"layer {i}" for i in range(layers)], fontsize=7)
  fig.suptitle(f"{_title(workdirs[0])}: solved (final accuracy >= {solved:g}) in blue, "
               "failed in red")
  return _save(fig, out, dpi=90)


def has_diagnostics(workdir):
  """Whether the run in `workdir` logged diagnostics rows (`train.diagnostics_every`)."""
  rows = jsonl.read_rows(os.path.join(workdir, METRICS_FILE))
  return any(DIAGNOSTICS_KEY in row for row in rows)


def _layer_keys(curves, key):
  """[(layer or None, key)] of the curves matching `key` ("layer*.<name>": one per layer, in
  order; "layer*.cond_A.last": each layer's cond_A.t<t> of the largest t)."""
  if not key.startswith("layer*."):
    return [(None, key)] if key in curves else []
  name = key[len("layer*."):]
  found = {}
  for k in curves:
    layer, _, rest = k.partition(".")
    if not (layer.startswith("layer") and layer[5:].isdigit()):
      continue
    i = int(layer[5:])
    if name == "cond_A.last" and rest.startswith("cond_A.t"):
      t = int(rest[len("cond_A.t"):])
      if t > found.get(i, (0, None))[0]:
        found[i] = (t, k)
    elif rest == name:
      found[i] = (0, k)
  return [(i, found[i][1]) for i in sorted(found)]


def _outcome_colours(outcomes):
  """A colour per run: blue shades for solved runs, red for failed, grey for unknown."""
  from matplotlib import colormaps  # pylint: disable=import-outside-toplevel

  maps = {"solved": colormaps["Blues"], "failed": colormaps["Reds"],
          "unknown": colormaps["Greys"]}
  counts = {o: outcomes.count(o) for o in maps}
  seen = {o: 0 for o in maps}
  colours = []
  for outcome in outcomes:
    n, i = counts[outcome], seen[outcome]
    colours.append(maps[outcome](0.5 + 0.45 * (i / max(n - 1, 1)) if n > 1 else 0.75))
    seen[outcome] += 1
  return colours
