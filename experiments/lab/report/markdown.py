"""Markdown pieces of the reports: tables, bullet lists, number formats."""


def table(header, body):
  """A markdown table: `header` (cell strings) and `body` (rows of cells, str() each); a "|"
  inside a cell (as in ||S||) is escaped so that it does not split the cell."""
  cells = lambda row: " | ".join(str(c).replace("|", "\\|") for c in row)
  lines = ["| " + cells(header) + " |", "| --- |" + " --- |" * (len(header) - 1)]
  lines += ["| " + cells(row) + " |" for row in body]
  return "\n".join(lines)


def bullets(items):
  """A markdown bullet list of the non-empty items ("" when none is left)."""
  return "\n".join(f"- {item}" for item in items if item)


def fmt(x, digits=3):
  """x with `digits` significant digits ("n/a" for None)."""
  return "n/a" if x is None else f"{x:.{digits}g}"


def accuracy_cell(test):
  """Test accuracies over seeds: "mean ± std (min min)", or "x (1 seed)"."""
  if len(test) == 1:
    return f"{test[0]:.3f} (1 seed)"
  return f"{test.mean():.3f} ± {test.std():.3f} (min {test.min():.3f})"


def mean_std(x):
  return f"{x.mean():.3f} ± {x.std():.3f}"


def listed(items):
  """"a", "a and b", "a, b and c"."""
  items = list(items)
  return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def plural(n, word, suffix="s"):
  return f"{n} {word}{suffix if n != 1 else ''}"
