"""RESULTS.md: its generated blocks are what the committed rows make, and every claim of its
hand-written findings (`lab.report.findings`) holds on those rows."""

import copy
import pathlib

import numpy as np
import pytest

from lab import markers
from lab.report import findings, results_md, rows

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def res():
  return results_md.load(str(ROOT / "results" / "training"))


def test_regenerating_the_blocks_leaves_results_md_unchanged(res):
  committed = (ROOT / "RESULTS.md").read_text()
  blocks = results_md.generated_blocks(res, str(ROOT), str(ROOT / "results"))
  assert markers.block_names(committed) == list(blocks)
  assert markers.replace_blocks(committed, blocks) == committed


def test_the_full_tables_are_what_the_rows_make(res):
  for stem, text in results_md.full_tables(res).items():
    assert (ROOT / "results" / "tables" / f"{stem}.md").read_text() == text, stem


def test_results_md_defines_every_label_its_tables_use():
  text = (ROOT / "RESULTS.md").read_text()
  labels = text.split("**Labels.**")[1].split("\n")[0]
  for short in rows.MIXER_NAMES.values():
    assert f"{short}:" in labels or f"**{short}**:" in labels, short


@pytest.mark.parametrize("claim", sorted(findings.CLAIMS))
def test_claim_holds_on_the_committed_rows(res, claim):
  assert findings.CLAIMS[claim](res), findings.CLAIMS[claim].__doc__


def test_a_claim_fails_when_its_rows_change(res):
  """The predicates read the rows: flipping the cells behind two findings breaks them."""
  changed = copy.copy(res)
  changed.capacity = dict(res.capacity)
  cell = dict(res.capacity[("vla_p1", 32)])
  cell["test"] = np.array([1.0, 0.03, 1.0])
  changed.capacity[("vla_p1", 32)] = cell
  assert not findings.capacity_boundary_solved(changed)
  assert not findings.vla_a_splits_seeds_at_small_n(changed)
  changed.remedies = {c: dict(t, **{"penalty-1": t["defaults"]}) for c, t in res.remedies.items()}
  assert not findings.penalty_one_fails_fewer_seeds(changed)
