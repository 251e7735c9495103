"""A script runs with experiments/ first on sys.path, so a script named like a standard-library
module (profile.py, trace.py, ...) would be imported in its place by any library that imports
that module (torch and fla import `profile` through cProfile); so would a package there
(experiments/lab)."""

import pathlib
import sys

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[2] / "experiments"


def test_no_script_shadows_a_standard_library_module():
  names = {p.stem for p in EXPERIMENTS.glob("*.py")}
  assert names, EXPERIMENTS
  names |= {p.parent.name for p in EXPERIMENTS.glob("*/__init__.py")}
  assert "lab" in names
  assert not names & set(sys.stdlib_module_names), sorted(names & set(sys.stdlib_module_names))
