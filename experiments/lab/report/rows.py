"""Result rows and what the report computes from them: best rate per cell, cell summaries.

A *sweep row* is one training run as `experiments/sweep.py` writes it: `mixer`, `label` (the
grid's name for the variant, e.g. "vla_p1"), `seed`, `learning_rate`, `test` and `validation`
({set name: {"accuracy", ...}}), `steps`, the setting (`n_pairs`, `seq_len`, `d_model`, ...) and
the model and task settings. A *cell* is one (label, setting) of a grid; its summary is a dict
{"rate": chosen rate, "test": test accuracies over seeds at that rate (np.ndarray), "rates":
sorted rates tried}.
"""

import collections

import numpy as np

from lab.grid import AUTHORS_PENALTY_SCALE, HEAD_DIM
from vla_jax.training import jsonl

MIXER_ORDER = ("softmax", "softmax_conv", "linear", "deltanet", "gated_deltanet",
               "gated_deltanet_slow", "vla", "vla_p1")
# The short labels of RESULTS.md's tables (defined once, at its top). VLA's penalty scale
# defaults to 1 (vla_jax.layers.vla.DEFAULT_PENALTY_SCALE): label vla_p1, "VLA"; label vla has the
# authors' 1/sqrt(d_h), "VLA-a".
MIXER_NAMES = {"softmax": "softmax", "softmax_conv": "softmax+conv", "linear": "linear",
               "deltanet": "DeltaNet", "gated_deltanet": "GDN",
               "gated_deltanet_slow": "GDN-slow", "vla": "VLA-a", "vla_p1": "VLA"}
# The flag that gives VLA the authors' penalty scale 1/sqrt(d_h): a command that made VLA rows
# before the default became 1 needs it to make the same rows again.
AUTHORS_FLAG = f"--config.model.options.vla.penalty_scale={AUTHORS_PENALTY_SCALE}"


def read(path):
  """The rows of a JSON-lines file ([] when it does not exist)."""
  return jsonl.read_rows(path)


def label(row):
  """A sweep row's variant name (its grid label, else its mixer)."""
  return row.get("label", row["mixer"])


def name(mixer):
  """The display name of a label ("vla_p1" -> "VLA, penalty scale 1 (default)")."""
  return MIXER_NAMES.get(mixer, mixer)


def mixer_rank(mixer):
  return MIXER_ORDER.index(mixer) if mixer in MIXER_ORDER else len(MIXER_ORDER)


def cell_order(item):
  """Sort key of a ((label, setting), value) item: by setting, then in MIXER_ORDER."""
  (m, v), _ = item
  return v, mixer_rank(m)


def first_set(scores):
  """The scores of a row's first evaluation set ({"accuracy", ...})."""
  return next(iter(scores.values()))


def accuracy(row):
  """A sweep row's test accuracy (first evaluation set)."""
  return first_set(row["test"])["accuracy"]


def best_rate(rows):
  """(rate, test, rates) for the rows of one cell: the rate with the best mean validation
  accuracy over seeds, the test accuracies at that rate (np.ndarray, row order) and the sorted
  rates tried."""
  by_rate = collections.defaultdict(list)
  for r in rows:
    by_rate[r["learning_rate"]].append(r)
  rate = max(by_rate, key=lambda lr: np.mean([first_set(r["validation"])["accuracy"]
                                              for r in by_rate[lr]]))
  return rate, np.array([accuracy(r) for r in by_rate[rate]]), sorted(by_rate)


def usual_rates(rate_sets):
  """The rate set most cells were swept over (the larger one on a tie): a grid's own sweep."""
  counts = collections.Counter(tuple(sorted(rates)) for rates in rate_sets)
  return set(max(counts, key=lambda k: (counts[k], len(k)), default=()))


def grid_summary(rows, key):
  """{(label, row[key]): cell summary} of a grid's rows (see the module docstring)."""
  groups = collections.defaultdict(list)
  for r in rows:
    groups[(label(r), r[key])].append(r)
  summary = {}
  for cell, group in groups.items():
    rate, test, rates = best_rate(group)
    summary[cell] = {"rate": rate, "test": test, "rates": rates}
  return summary


def mixers_in(summary):
  """The labels of a summary, in MIXER_ORDER (unknown labels last, sorted)."""
  return sorted({m for m, _ in summary}, key=lambda m: (mixer_rank(m), m))


def state_floats(mixer, d_model, T):
  """Recurrent state per layer in floats: the memory matrices S (heads * d_h^2; VLA also its
  penalty inverse A, as many again), or softmax attention's key-value cache (2 T d_model).
  Normalisers and the short convolutions' states add under 4% and are left out."""
  if mixer.startswith("softmax"):
    return 2 * T * d_model
  heads = d_model // HEAD_DIM
  return heads * HEAD_DIM ** 2 * (2 if mixer.startswith("vla") else 1)


def settings_sentence(rows):
  """One sentence of the training settings the rows record (batch, steps, dtype, width,
  layers, test examples per set), the most common value first and the others with their row
  counts: what a section's numbers were measured at, read from the rows, not assumed."""
  def examples(r):
    fields = r.get("task_fields", {})
    if r.get("task") == "mqar" and fields.get("n_pairs"):
      return first_set(r["test"])["targets"] // fields["n_pairs"]
    return None

  parts = []
  for fn, show in ((lambda r: r.get("batch_size"), lambda v: f"batch {v}"),
                   (lambda r: r.get("steps"), lambda v: f"{v:,} steps"),
                   (lambda r: r.get("model", {}).get("dtype", "float32"), str),
                   (lambda r: r.get("model", {}).get("d_model"), lambda v: f"d_model {v}"),
                   (lambda r: r.get("model", {}).get("num_layers"), lambda v: f"{v} layers"),
                   (examples, lambda v: f"{v:,} test examples per set")):
    counts = collections.Counter(fn(r) for r in rows)
    (top, _), rest = counts.most_common(1)[0], counts.most_common()[1:]
    if top is None and not rest:
      continue
    text = show(top) if top is not None else "-"
    if rest:
      text += " (" + ", ".join(f"{show(v) if v is not None else '-'} in {n} row"
                               + ("s" if n != 1 else "") for v, n in rest) + ")"
    parts.append(text)
  return f"Settings of these {len(rows)} rows: " + "; ".join(parts) + "."
