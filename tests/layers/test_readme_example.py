"""The README's "Use VLA in your model" example runs as printed (extracted from README.md)."""

import pathlib
import re

import jax
import numpy as np

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## Use VLA in your model"


def example_code():
  """The first ```python block after the section's heading."""
  text = README.read_text(encoding="utf-8")
  assert HEADING in text, f"README.md lost its section {HEADING!r}"
  section = text.split(HEADING, 1)[1]
  match = re.search(r"```python\n(.*?)```", section, re.S)
  assert match, f"no ```python block under {HEADING!r}"
  return match.group(1)


def test_readme_example_runs(capsys):
  namespace = {"__name__": "readme_example"}
  exec(compile(example_code(), str(README), "exec"), namespace)  # pylint: disable=exec-used
  loss, grads = namespace["loss"], namespace["grads"]
  assert np.isfinite(float(loss))
  leaves = [np.asarray(g) for g in jax.tree.leaves(grads)]
  assert leaves and all(np.isfinite(g).all() for g in leaves)
  assert any(np.abs(g).max() > 0 for g in leaves)
  assert "loss" in capsys.readouterr().out
