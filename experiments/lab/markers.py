"""Generated blocks inside a hand-written markdown file.

A block is the text between `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name -->`
lines; `replace_blocks` rewrites the blocks it is given and leaves every other line as it is, so
that the findings around them stay the words of whoever wrote them.
"""

import re

_BLOCK = re.compile(r"^<!-- BEGIN GENERATED: (?P<name>[\w.-]+) -->\n(?P<body>.*?)"
                    r"^<!-- END GENERATED: (?P=name) -->$", re.MULTILINE | re.DOTALL)


def begin(name):
  return f"<!-- BEGIN GENERATED: {name} -->"


def end(name):
  return f"<!-- END GENERATED: {name} -->"


def block_names(text):
  """The names of the generated blocks in `text`, in order."""
  return [m["name"] for m in _BLOCK.finditer(text)]


def replace_blocks(text, blocks, path="the file"):
  """`text` with the body of each block named in `blocks` ({name: markdown}) replaced.

  Raises ValueError naming `path` and the blocks when a block of `blocks` has no marker pair in
  `text` (a hand edit removed it: put back the two marker lines), or when `text` has a marked
  block that `blocks` does not fill (the generator no longer makes it: remove its markers)."""
  found = block_names(text)
  missing = [n for n in blocks if n not in found]
  unknown = [n for n in found if n not in blocks]
  if missing or unknown or len(found) != len(set(found)):
    raise ValueError(
        f"{path}: generated blocks do not match: "
        + "; ".join(filter(None, [
            f"no marker pair for {missing} (add lines {begin(missing[0])!r} and "
            f"{end(missing[0])!r})" if missing else "",
            f"marked but not generated: {unknown}" if unknown else "",
            "a block is marked twice" if len(found) != len(set(found)) else ""])))
  return _BLOCK.sub(lambda m: (f"{begin(m['name'])}\n{blocks[m['name']].strip()}\n"
                               f"{end(m['name'])}"), text)


def skeleton(blocks):
  """A file with empty marked blocks, in the order of `blocks`: a start for a new report."""
  return "\n\n".join(f"{begin(n)}\n{end(n)}" for n in blocks) + "\n"
