"""Task generators: determinism and the invariants of MQAR and Copy; npz loading."""

import numpy as np
import pytest

from vla_jax.tasks import IGNORE, CopyConfig, MQARConfig, load_npz, make_task, rng_for, save_npz
from vla_jax.tasks import copy as copy_task
from vla_jax.tasks import mqar
from vla_jax.tasks.common import token_metrics


def _mqar(config, n=64, seed=0):
  return mqar.generate(config, n, rng_for(seed, 1, 0))


@pytest.mark.parametrize("config", [
    MQARConfig(vocab_size=64, n_pairs=8, seq_len=64),
    MQARConfig(vocab_size=8192, n_pairs=16, seq_len=256),
    MQARConfig(vocab_size=40, n_pairs=12, form="short"),
], ids=["zoology-small", "zoology-8192", "short"])
def test_mqar_invariants(config):
  inputs, labels = _mqar(config)
  n, V = config.n_pairs, config.vocab_size
  assert inputs.shape == labels.shape == (64, config.length)
  assert inputs.dtype == labels.dtype == np.int32
  keys, values = inputs[:, 0:2 * n:2], inputs[:, 1:2 * n:2]
  # Disjoint halves of the vocabulary; distinct within an example.
  assert keys.min() >= 1 and keys.max() < V // 2
  assert values.min() >= V // 2 and values.max() < V
  for row in range(inputs.shape[0]):
    assert len(set(keys[row])) == n and len(set(values[row])) == n
    answer = dict(zip(keys[row], values[row]))
    pos = np.flatnonzero(labels[row] != IGNORE)
    # One query per key: n labelled positions, each on a key, labelled with its value.
    assert len(pos) == n
    assert sorted(inputs[row, pos]) == sorted(keys[row])
    assert all(labels[row, p] == answer[inputs[row, p]] for p in pos)
    assert pos.min() >= 2 * n
  if config.form == "zoology":
    q = np.flatnonzero(labels[0] != IGNORE)
    assert np.all((q - 2 * n) % 2 == 0)  # queries at even offsets of the query region
  else:
    assert np.all(inputs[:, 2 * n] == mqar.SEP)
    assert np.all(labels[:, 2 * n + 1:] != IGNORE)


def test_mqar_power_law_places_queries_near_context():
  config = MQARConfig(vocab_size=8192, n_pairs=4, seq_len=512)
  _, labels = _mqar(config, n=512)
  offsets = (np.nonzero(labels != IGNORE)[1] - 8) // 2
  space = (512 - 8) // 2
  assert np.mean(offsets < space // 4) > 0.4  # uniform placement would give about 0.25


def test_mqar_is_deterministic_and_seeded():
  config = MQARConfig(vocab_size=64, n_pairs=4, seq_len=32)
  a, b = _mqar(config, seed=3), _mqar(config, seed=3)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[0], _mqar(config, seed=4)[0])
  task = make_task("mqar", {"vocab_size": 64, "n_pairs": 4, "seq_len": 32})
  np.testing.assert_array_equal(task.train_batch(0, 7, 8)[0], task.train_batch(0, 7, 8)[0])
  assert not np.array_equal(task.train_batch(0, 7, 8)[0], task.train_batch(0, 8, 8)[0])


@pytest.mark.parametrize("fields,match", [
    ({"vocab_size": 64, "n_pairs": 20, "seq_len": 64}, "too large for seq_len=64"),
    ({"vocab_size": 16, "n_pairs": 8, "form": "short"}, "do not fit in the key half"),
    ({"vocab_size": 64, "n_pairs": 4, "seq_len": 33}, "must be even"),
    ({"vocab_size": 64, "n_pairs": 4, "form": "short", "seq_len": 20}, "3 \\* n_pairs \\+ 1"),
    ({"vocab_size": 64, "n_pairs": 4, "form": "long"}, "form must be one of"),
])
def test_mqar_bad_configs(fields, match):
  with pytest.raises(ValueError, match=match):
    MQARConfig(**fields)


def test_copy_invariants():
  config = CopyConfig(vocab_size=10, min_len=1, max_len=9)
  inputs, labels = copy_task.generate(config, 200, rng_for(0, 1, 0))
  assert inputs.shape == (200, 18)
  for x, y in zip(inputs, labels):
    L = int(np.flatnonzero(x == copy_task.SEP)[0])
    s = x[:L]
    assert 1 <= L <= 9 and s.min() >= 2
    np.testing.assert_array_equal(x[L + 1:2 * L], s[:-1])
    np.testing.assert_array_equal(y[L:2 * L], s)  # the next symbol of the copy
    assert np.all(y[:L] == IGNORE) and np.all(y[2 * L:] == IGNORE)
    assert np.all(x[2 * L:] == copy_task.PAD)
    assert y[L] != x[L]  # the first answer is read from memory, not echoed (x[L] is SEP)
  fixed, _ = copy_task.generate(config, 4, rng_for(0, 2, 30), length=30)
  assert fixed.shape == (4, 60)


def test_copy_eval_sets_include_longer_lengths():
  task = make_task("copy", {"vocab_size": 10, "min_len": 1, "max_len": 8,
                            "eval_lengths": (8, 32)})
  sets = task.eval_sets(0, 5)
  assert set(sets) == {"copy_L8", "copy_L32"}
  assert sets["copy_L32"][0].shape == (5, 64) and task.max_len == 64


def test_token_metrics():
  labels = np.array([[IGNORE, 3, 4], [IGNORE, IGNORE, 5]])
  preds = np.array([[9, 3, 0], [1, 2, 5]])
  m = token_metrics(preds, labels)
  assert m["accuracy"] == pytest.approx(2 / 3) and m["exact_match"] == 0.5
  # Examples without targets are not scored; none with a target is an error.
  labels = np.concatenate([labels, np.full((2, 3), IGNORE)])
  m = token_metrics(np.concatenate([preds, preds]), labels)
  assert m["exact_match"] == 0.5 and m["targets"] == 3
  with pytest.raises(ValueError, match="labels hold no targets"):
    token_metrics(preds, np.full((2, 3), IGNORE))


def test_npz_round_trip_and_errors(tmp_path):
  config = MQARConfig(vocab_size=64, n_pairs=4, seq_len=32)
  inputs, labels = _mqar(config, n=10)
  path = tmp_path / "mqar.npz"
  save_npz(path, inputs.astype(np.int64), labels.astype(np.int64))
  x, y = load_npz(path, vocab_size=64)
  np.testing.assert_array_equal(x, inputs)
  np.testing.assert_array_equal(y, labels)
  with pytest.raises(ValueError, match="does not fit vocab_size=32"):
    load_npz(path, vocab_size=32)
  np.savez(tmp_path / "bad.npz", inputs=inputs)
  with pytest.raises(ValueError, match="missing array"):
    load_npz(tmp_path / "bad.npz")
  np.savez(tmp_path / "bad2.npz", inputs=inputs, labels=labels[:, :5])
  with pytest.raises(ValueError, match="same shape"):
    load_npz(tmp_path / "bad2.npz")


def test_npz_files_that_are_not_what_they_claim(tmp_path):
  """A file with no targets (every label ignored) would score exact_match 1.0 on nothing;
  a text file, a truncated archive or a bare .npy are not archives: each is a ValueError
  naming the file, not numpy's BadZipFile."""
  inputs, labels = _mqar(MQARConfig(vocab_size=64, n_pairs=4, seq_len=32), n=4)
  save_npz(tmp_path / "untargeted.npz", inputs, np.full_like(labels, IGNORE))
  with pytest.raises(ValueError, match="untargeted.npz: labels hold no targets"):
    load_npz(tmp_path / "untargeted.npz")
  (tmp_path / "text.npz").write_text("inputs,labels\n1,2\n")
  save_npz(tmp_path / "whole.npz", inputs, labels)
  whole = (tmp_path / "whole.npz").read_bytes()
  (tmp_path / "cut.npz").write_bytes(whole[:len(whole) // 2])
  for name in ("text.npz", "cut.npz"):
    with pytest.raises(ValueError, match=f"{name}: not an .npz archive"):
      load_npz(tmp_path / name)
  np.save(tmp_path / "array.npy", inputs)
  with pytest.raises(ValueError, match="array.npy: not an .npz archive but a single .npy"):
    load_npz(tmp_path / "array.npy")


@pytest.mark.parametrize("num,low,high,size,spare", [
    (64, 1, 4096, 4, 6.0), (8, 4096, 8192, 64, 6.0), (128, 1, 4096, 64, 6.0),
    (128, 1, 4096, 64, -2.0),          # a threshold too low for some rows: those sorted whole
    (5, 1, 21, 19, 6.0), (5, 1, 21, 20, 6.0), (3, 0, 10, 1, 6.0)])
def test_distinct_is_the_full_argsort_sample(num, low, high, size, spare):
  """MQAR's key and value sampler (the uniforms below a threshold, sorted) draws exactly what
  the full argsort of the same uniforms gives, so the data of earlier runs is unchanged."""
  from vla_jax.tasks.mqar import _distinct
  for seed in range(5):
    u = np.random.default_rng(seed).random((num, high - low))
    want = low + np.argsort(u, axis=1)[:, :size]
    got = _distinct(np.random.default_rng(seed), num, low, high, size, spare=spare)
    np.testing.assert_array_equal(got, want)
    assert all(len(set(r)) == size for r in got.tolist())
    if spare < 0:     # the case meant: rows on both paths
      below = (u < (size + spare * np.sqrt(size) + 10) / (high - low)).sum(axis=1)
      assert (below < size).any() and (below >= size).any()


def test_npz_token_id_past_the_vocabulary_is_named(tmp_path):
  """An id >= vocab_size in an .npz task is an error at load time naming the file, the id,
  vocab_size, the array and its position."""
  config = MQARConfig(vocab_size=64, n_pairs=4, seq_len=32)
  inputs, labels = _mqar(config, n=4)
  path = tmp_path / "over.npz"
  inputs = inputs.copy()
  inputs[2, 5] = 64
  save_npz(path, inputs, labels)
  with pytest.raises(ValueError, match=r"over.npz: token id 64 does not fit vocab_size=64 "
                                       r"\(ids lie in \[0, 64\)\), at inputs\[2, 5\]"):
    load_npz(path, vocab_size=64)
