"""Notes under a grid's table, computed from its rows or cell summaries.

Each returns a markdown string ("" when there is nothing to say). `where(setting)` names a
setting in prose, e.g. `lambda T: f"T = {T}"`.
"""

import collections

from lab.report import markdown
from lab.report.rows import accuracy, cell_order, label, name, usual_rates


def seeds_text(seeds):
  seeds = sorted(seeds)
  return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def pallas_note(rows, key, where):
  """Names the runs trained with the Pallas kernels (model impl "pallas"): the settings
  (key(row), named by where) of each set of seeds."""
  by_key = collections.defaultdict(set)
  for r in rows:
    if r.get("model", {}).get("impl") == "pallas":
      by_key[key(r)].add(r["seed"])
  if not by_key:
    return ""
  by_seeds = collections.defaultdict(list)
  for k, s in sorted(by_key.items()):
    by_seeds[tuple(sorted(s))].append(where(k))
  return ("VLA runs trained with the Pallas kernels (`--vla_impl=pallas`, the same function as "
          "the default XLA chunked form; `tests/experiments/test_grid.py` checks a training "
          "step of each against impl=\"scan\"): " + "; ".join(
              f"{seeds_text(s)} at " + ", ".join(ws)
              for s, ws in sorted(by_seeds.items(), key=lambda kv: (-len(kv[0]), kv[0]))) + ".")


def edge_rate_note(summary, where, below=0.99, name_of=name, pending=None):
  """Counts the cells below `below` whose chosen rate is the lowest or the highest of two or
  more rates tried there (the best rate may lie outside the sweep), with a table of them by
  mixer (named by name_of). With `pending` (the cells whose sweep is being extended past its
  edge, the rows not all in yet), the sweep counts as extended and those cells are marked."""
  swept = [(k, c) for k, c in sorted(summary.items(), key=cell_order) if len(c["rates"]) > 1]
  low = [(k, c) for k, c in swept if c["test"].mean() < below]
  if not low:
    return ""
  sides = {"lowest": [], "highest": []}
  for k, c in low:
    if c["rate"] == min(c["rates"]):
      sides["lowest"].append((k, c))
    elif c["rate"] == max(c["rates"]):
      sides["highest"].append((k, c))
  inside = len(low) - len(sides["lowest"]) - len(sides["highest"])
  if not sides["lowest"] and not sides["highest"]:
    return f"Every cell below {below} ({len(low)}) chose a rate inside its sweep."
  text = (f"Rate sweep edges: of the {markdown.plural(len(low), 'cell')} below {below}, "
          f"{len(sides['lowest'])} chose the lowest rate tried, {len(sides['highest'])} the "
          f"highest and {inside} one inside the sweep")
  if pending is None:
    text += "; where the chosen rate is an edge, a wider sweep (not run) may score higher:\n\n"
  else:
    text += ("; where the chosen rate is an edge, a wider sweep may score higher (*pending*: "
             "the rows past the edge are not all in yet):\n\n")
  mark = lambda k: " (pending)" if pending is not None and k in pending else ""
  body = []
  for m in sorted({k[0] for k, _ in sides["lowest"] + sides["highest"]},
                  key=lambda m: min(i for i, (k, _) in enumerate(low) if k[0] == m)):
    body.append([name_of(m)] + [", ".join(f"{where(v)} @ {c['rate']:g}{mark((mm, v))}"
                                          for (mm, v), c in cells if mm == m) or "-"
                                for cells in (sides["lowest"], sides["highest"])])
  return text + markdown.table(["mixer", "at the lowest rate tried", "at the highest rate tried"],
                               body)


def wider_sweep_note(summary, where):
  """Names the cells whose rates tried go beyond the usual sweep (the rate set of most cells),
  with the rates added and the rate chosen."""
  usual = usual_rates(c["rates"] for c in summary.values())
  wider = [(k, c) for k, c in sorted(summary.items(), key=cell_order) if set(c["rates"]) - usual]
  if not wider:
    return ""
  return ("Rates added to the usual sweep (" + ", ".join(f"{x:g}" for x in sorted(usual))
          + ") at some cells: " + "; ".join(
              f"{name(m)} at {where(v)}: "
              + ", ".join(f"{x:g}" for x in sorted(set(c["rates"]) - usual))
              + f" (chosen: {c['rate']:g})" for (m, v), c in wider) + ".")


def partial_rates_note(rows, key, where):
  """Lists, per (label, row[key]), the learning rates trained on fewer seeds than that cell's
  most-seeded rate, with their test accuracies (the best rate then compares mean validation
  accuracy over unequal seed sets, so the reader sees them)."""
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in rows:
    groups[(label(r), r[key])][r["learning_rate"]].append(r)
  parts = []
  for (m, v), by_rate in sorted(groups.items(), key=cell_order):
    most = max(len(rs) for rs in by_rate.values())
    for rate, rs in sorted(by_rate.items()):
      if len(rs) < most:
        rs = sorted(rs, key=lambda r: r["seed"])
        parts.append(f"{name(m)} at {where(v)}, rate {rate:g}, "
                     + seeds_text(r["seed"] for r in rs) + ": "
                     + ", ".join(f"{accuracy(r):.3f}" for r in rs))
  if not parts:
    return ""
  return ("Rates also tried on fewer seeds (test accuracy per seed; the table keeps the best "
          "rate by mean validation accuracy): " + "; ".join(parts) + ".")


def dtype_note(rows, where):
  """Names the runs whose activations were not float32 (the row's model "dtype"; rows without
  it ran at the configs' float32), by where(row)."""
  odd = sorted({(where(r), r["model"]["dtype"]) for r in rows
                if r.get("model", {}).get("dtype", "float32") != "float32"})
  if not odd:
    return ""
  return ("Trained with " + ", ".join(sorted({d for _, d in odd})) + " activations "
          "(`--override=model.dtype=bfloat16`; float32 parameters and optimiser state; softmax "
          "attention then runs cuDNN's fused kernel instead of XLA's float32 attention, whose "
          "T x T scores do not fit in memory there): " + "; ".join(w for w, _ in odd) + ".")


def seed_split_note(summary, where, spread=0.5, name_of=name):
  """A table of the cells whose seeds split between learning the task and a plateau (test
  accuracies over seeds at the chosen rate more than `spread` apart); mixers named by
  name_of."""
  split = [(k, c) for k, c in sorted(summary.items(), key=cell_order)
           if c["test"].max() - c["test"].min() > spread]
  if not split:
    return ""
  return (f"Seeds that split between recall and a plateau near chance (1 / n_pairs) at the "
          f"chosen rate (test accuracies more than {spread} apart):\n\n" + markdown.table(
              ["setting", "mixer", "test accuracy per seed"],
              [[where(v), name_of(m), ", ".join(f"{a:.3f}" for a in c["test"])]
               for (m, v), c in split]))
