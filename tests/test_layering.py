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


def _module_name(path):
  """The installed name of a library file (kernels/ installs as vla_jax.kernels)."""
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[0] == "kernels":
    parts = ["vla_jax"] + parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources):
  """{module: the library modules it imports, at any depth}; `from pkg import sub` counts as
  an import of the submodule pkg.sub where that is a module, else of pkg."""
  graph = {}
  for name, source in sources.items():
    edges = set()
    for node in ast.walk(ast.parse(source, name)):
      if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        for alias in node.names:
          sub = f"{node.module}.{alias.name}"
          edges.add(sub if sub in sources else node.module)
      elif isinstance(node, ast.Import):
        edges.update(alias.name for alias in node.names)
    graph[name] = {m for m in edges if m in sources and m != name}
  return graph


def cycles(graph):
  """The import cycles of `graph` (strongly connected sets of more than one module)."""
  index, low, stack, found, counter = {}, {}, [], [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while not group or group[-1] != v:
        group.append(stack.pop())
      if len(group) > 1:
        found.append(sorted(group))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_the_cycle_check_finds_cycles_through_deferred_imports():
  sources = {"p.a": "from p.b import f\n", "p.b": "def f():\n  from p.a import g\n",
             "p": "from p import a\n", "p.c": "from p import a\n"}
  assert cycles(import_graph(sources)) == [["p.a", "p.b"]]


def test_the_library_has_no_import_cycles():
  """No two library modules import each other, directly or through others, at any depth
  (deferred imports in functions included): the ops and the kernels share constants and
  checks through leaf modules (vla_jax.ops.utils, vla_jax.ops.checks)."""
  files = [f for package in ("vla_jax", "kernels") for f in sorted((ROOT / package).rglob("*.py"))]
  graph = import_graph({_module_name(f): f.read_text() for f in files})
  assert "vla_jax.kernels.vla" in graph and "vla_jax.ops.vla.recurrence" in graph
  assert cycles(graph) == []
