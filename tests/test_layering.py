"""The installed library (vla_jax/, kernels/, configs/) never imports the lab: experiments/lab
is not installed, so an import of it from the library would fail for every user."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ("vla_jax", "kernels", "configs")
FORBIDDEN = ("lab", "experiments")


def imported_modules(source, filename="<source>"):
  """The absolute module names a Python source imports, at any depth (functions included):
  `import a.b` gives "a.b", `from a.b import c` gives "a.b" and "a.b.c"; relative imports are
  left out."""
  names = []
  for node in ast.walk(ast.parse(source, filename)):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
  return names


def forbidden_imports(source, filename="<source>"):
  return sorted({n for n in imported_modules(source, filename)
                 if n.split(".")[0] in FORBIDDEN})


def test_the_check_finds_lab_imports_at_any_depth():
  source = ("import os\nfrom vla_jax import layers\nimport labrador\n"
            "def f():\n  from lab.report import rows\n"
            "class C:\n  import experiments.lab.grid as g\n")
  assert forbidden_imports(source) == ["experiments.lab.grid", "lab.report", "lab.report.rows"]
  assert forbidden_imports("from lab import cli\n") == ["lab", "lab.cli"]
  assert forbidden_imports("from . import lab\n") == []


@pytest.mark.parametrize("package", LIBRARY)
def test_the_library_never_imports_the_lab(package):
  files = sorted((ROOT / package).rglob("*.py"))
  assert files, ROOT / package
  found = {str(f.relative_to(ROOT)): bad for f in files
           if (bad := forbidden_imports(f.read_text(), str(f)))}
  assert not found, found
