"""RESULTS.md section 5: zoology's MQAR against state size, from the zoology grid's rows and the
zoology_tuned grid's.

The zoology grid (`mqar_zoology_h200.jsonl`) trains every label 4,000 steps at rates 1e-3 and
3e-3. The zoology_tuned grid (`zoology_tuned_h200.jsonl`) carries it on, as
`lab.grid.tuned_jobs` plans from the zoology rows: at 4,000 steps, the rate past
the edge of every cell below 0.99 that chose an edge, and Gated DeltaNet with the slow gate
initialisation (label gated_deltanet_slow) at every setting; at T = 512, every label at 12,000
steps, at its 4,000-step chosen rate where that cell is solved, else at it and the rates either
side. A 4,000-step cell is chosen on validation across both files' rows (the *combined sweep*),
and the plan is made from both files' rows, so that it goes on past the edges that the tuned
rows found. A cell whose planned rows are not all there is *pending*: its table cell says so
(with the rates run so far), never standing for the tuned result.
"""

import collections

from lab.grid import (HEAD_DIM, TUNED_STEPS, TUNED_T, ZOOLOGY, ZOOLOGY_WIDTHS,
                      rate_name, tuned_jobs)
from lab.report import markdown, notes
from lab.report.mqar import GRID_LABELS, SOLVED, grid_command
from lab.report.rows import (cell_order, grid_summary, mixers_in, name, settings_sentence,
                             state_floats, usual_rates)

STEPS = 4000   # the zoology grid's training steps
CELLS = ("Cells: test accuracy at the rate chosen on validation (among the zoology grid's rates "
         "and the tuned rows'), mean ± std (min) over seeds, "
         "@ that rate; \"(of N rates)\" marks a cell swept over another number of rates than "
         "the zoology grid's two, \"edge\" a cell below 0.99 whose chosen rate is still the "
         "lowest or highest it tried; *pending*: the tuned rows are not all in yet (the rates "
         "missing, then the best of the rates run so far).")


def where(st):
  return f"T = {st[0]} d_model {st[1]}"


def planned_rates(rows):
  """{(label, (T, d_model), steps): set of rates} of the zoology_tuned grid's jobs still to run,
  planned from `rows` (`tuned_jobs`)."""
  plan = collections.defaultdict(set)
  for _, _, _, rates, tag in tuned_jobs(rows, steps=STEPS):
    plan[(tag["label"], (tag["seq_len"], tag["d_model"]), tag["steps"])] |= {float(r)
                                                                            for r in rates}
  return dict(plan)


def missing_rates(plan, tuned_rows):
  """{(label, setting, steps): sorted rates planned for that cell that no tuned row holds}, for
  the cells with any missing (the pending cells)."""
  ran = collections.defaultdict(set)
  for r in tuned_rows:
    ran[(r["label"], (r["seq_len"], r["d_model"]), r["steps"])].add(float(r["learning_rate"]))
  return {k: sorted(rates - ran[k]) for k, rates in sorted(plan.items()) if rates - ran[k]}


def edge_side(c):
  """"lowest" or "highest" when a cell below SOLVED chose an edge of two or more rates tried,
  else None."""
  if c["test"].mean() >= SOLVED or len(c["rates"]) < 2:
    return None
  return {min(c["rates"]): "lowest", max(c["rates"]): "highest"}.get(c["rate"])


def cell_text(c, missing, usual):
  """A table cell: the cell summary `c` (None: no rows) with its marks, or pending when rates
  are `missing`; usual: the zoology grid's number of rates."""
  if c is None:
    return "pending" if missing else "not run"
  marks = [f"of {markdown.plural(len(c['rates']), 'rate')}"] if len(c["rates"]) != usual else []
  if edge_side(c) and not missing:
    marks.append(f"edge: the {edge_side(c)} rate tried")
  text = (f"{markdown.accuracy_cell(c['test'])} @ {c['rate']:g}"
          + (f" ({'; '.join(marks)})" if marks else ""))
  if missing:
    return (f"pending ({', '.join(rate_name(x) for x in missing)} not run); so far "
            + text)
  return text


def sweep_summaries(rows, tuned_rows):
  """(combined 4,000-step summary, T = TUNED_T summary at TUNED_STEPS, pending {(label,
  setting, steps): missing rates}, the zoology grid's number of rates)."""
  keyed = lambda rs: [dict(r, setting=(r["seq_len"], r["d_model"])) for r in rs]
  short = keyed([r for r in rows if r.get("steps", STEPS) == STEPS]
                + [r for r in tuned_rows if r["steps"] == STEPS])
  long = keyed([r for r in tuned_rows if r["steps"] == TUNED_STEPS and r["seq_len"] == TUNED_T])
  pending = missing_rates(planned_rates(list(rows) + list(tuned_rows)), tuned_rows)
  usual = len(usual_rates(c["rates"] for c in grid_summary(keyed(rows), "setting").values()))
  return grid_summary(short, "setting"), grid_summary(long, "setting"), pending, usual


def labels_of(summary, pending, steps):
  """The labels with rows or planned rows at `steps`, in the report's order."""
  return mixers_in({**summary, **{(m, st): None for m, st, s in pending if s == steps}})


def short_table(summary, pending, usual, settings):
  labels = labels_of(summary, pending, STEPS)
  return markdown.table(
      ["setting"] + [name(m) for m in labels],
      [[f"T = {T}, d_model = {d}"]
       + [cell_text(summary.get((m, (T, d))), pending.get((m, (T, d), STEPS)), usual)
          for m in labels] for T, d in settings])


def long_table(summary, pending, usual):
  labels = labels_of(summary, pending, TUNED_STEPS)
  widths = [d for d, _ in ZOOLOGY_WIDTHS]
  return markdown.table(
      ["mixer"] + [f"d_model = {d}" for d in widths],
      [[name(m)]
       + [cell_text(summary.get((m, (TUNED_T, d))), pending.get((m, (TUNED_T, d), TUNED_STEPS)),
                    usual) for d in widths] for m in labels])


def long_notes(long, pending):
  """Bullet items under the 12,000-step table: how many of its cells are pending."""
  planned = {(m, st) for m, st, s in pending if s == TUNED_STEPS} | set(long)
  waiting = sum(1 for _, _, s in pending if s == TUNED_STEPS)
  return [f"Pending (rows not all in yet): {waiting} of {len(planned)} cells."] if waiting else []


def settings_run(short):
  """The (T, d_model) settings of the zoology grid that have rows, in the grid's order."""
  settings = [(T, d) for T, _ in ZOOLOGY for d, _ in ZOOLOGY_WIDTHS]
  return [st for st in settings if any(v == st for _, v in short)]


def zoology_tables(rows, tuned_rows=()):
  """The full tables of section 5 (markdown blocks) from the zoology grid's rows and the
  zoology_tuned grid's (`tuned_rows`)."""
  blocks = []
  tuned_rows = list(tuned_rows)
  short, long, pending, usual = sweep_summaries(rows, tuned_rows)
  if not rows:
    return [f"Not run yet: {grid_command('zoology')}."]
  settings = [(T, d) for T, _ in ZOOLOGY for d, _ in ZOOLOGY_WIDTHS]
  ran = settings_run(short)
  short_rows = [r for r in rows + tuned_rows if r.get("steps", STEPS) == STEPS]
  long_rows = [r for r in tuned_rows if r["steps"] == TUNED_STEPS]
  extend_pending = {(m, st) for m, st, s in pending if s == STEPS and (m, st) in short}
  blocks.append(markdown.bullets([
      f"Rows: {grid_command('zoology')} (`results/training/mqar_zoology_h200.jsonl`: "
      f"{STEPS:,} steps, rates 1e-3 and 3e-3; `--only=zoology-T64-d128-vla,zoology-T64-d128-` "
      "runs part of the grid).",
      "Tuned rows: `python experiments/grid.py --grids=zoology_tuned --workdir=OUT --gpus=0` "
      "(`results/training/zoology_tuned_h200.jsonl`; planned from the rows above by "
      f"`lab.grid.tuned_jobs`): the rate past the edge at every cell below {SOLVED} "
      "that chose an edge, Gated DeltaNet with the slow gate init at every setting, every "
      f"mixer at T = {TUNED_T} with {TUNED_STEPS:,} steps (at its {STEPS:,}-step chosen rate "
      f"where that cell reaches {SOLVED}, else at it and the rates either side).",
      "configs/mqar_zoology.py: vocabulary 8,192, power-law query placement, keys and values "
      "from disjoint halves of the vocabulary; T / n_pairs = "
      + ", ".join(f"{T}/{n}" for T, n in ZOOLOGY) + f"; heads of d_h = {HEAD_DIM} (d_model "
      + ", ".join(str(d) for d, _ in ZOOLOGY_WIDTHS) + ": "
      + ", ".join(str(h) for _, h in ZOOLOGY_WIDTHS) + " heads).",
      "Gated DeltaNet: fla's gate initialisation (the layer's default, per-token decay at "
      "initialisation in [0.20, 0.999]), the labelled baseline; slow gate init: dt 10x smaller "
      "(decay in [0.85, 0.9999]), a state that forgets more slowly early in training.",
      settings_sentence(short_rows), CELLS]))
  blocks.append(f"**{STEPS:,} steps**, every setting:")
  blocks.append(short_table(short, pending, usual, ran))
  blocks.append(f"**T = {TUNED_T} ({dict(ZOOLOGY).get(TUNED_T, '?')} pairs), "
                f"{TUNED_STEPS:,} steps** (3x as many), every mixer at its {STEPS:,}-step "
                f"chosen rate (and the rates either side where that cell is below {SOLVED}):")
  blocks.append(long_table(long, pending, usual))
  blocks.append(markdown.bullets([settings_sentence(long_rows) if long_rows else ""]
                                + long_notes(long, pending)))
  widths = sorted({d for _, d in ran})
  Ts = sorted({T for T, _ in ran})
  families = [("linear, DeltaNet, Gated DeltaNet (S)", "deltanet"), ("VLA (S and A)", "vla")]
  blocks.append("Recurrent state per layer, in floats (memory matrices S = heads x d_h^2, VLA also "
                "its penalty inverse A of the same size; softmax attention: the key-value cache "
                "2 T d_model):")
  blocks.append(markdown.table(
      ["d_model"] + [f for f, _ in families] + [f"softmax, T = {T}" for T in Ts],
      [[d] + [f"{state_floats(m, d, Ts[0]):,}" for _, m in families]
       + [f"{state_floats('softmax', d, T):,}" for T in Ts] for d in widths]))
  missing = [st for st in settings if st not in ran]
  partial = [(st, [m for m in GRID_LABELS if (m, st) not in short]) for st in ran]
  blocks.append(markdown.bullets([
      notes.pallas_note(short_rows + long_rows,
                        lambda r: (r["seq_len"], r["d_model"], r["steps"]),
                        lambda k: f"T = {k[0]}, d_model {k[1]}"
                        + (f" ({k[2]:,} steps)" if k[2] != STEPS else "")),
      ("Not run yet (device time): " + ", ".join(where(st) for st in missing) + ".")
      if missing else "",
      ("Mixers not yet run at a setting: " + "; ".join(
          f"T = {T}, d_model {d}: " + " / ".join(name(m) for m in ms)
          for (T, d), ms in partial if ms) + ".") if any(ms for _, ms in partial) else ""]))
  blocks += [notes.seed_split_note(short, where, name_of=name),
             notes.seed_split_note(long, lambda st: where(st) + f", {TUNED_STEPS:,} steps",
                                   name_of=name),
             notes.edge_rate_note(short, where, name_of=name, pending=extend_pending)]
  return blocks
