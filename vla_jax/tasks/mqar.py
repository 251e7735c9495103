"""Multi-query associative recall (MQAR), as in zoology (Arora et al., 2023, arXiv 2312.04927).

Zoology form (`form="zoology"`, zoology's `multiquery_ar` semantics), length T = seq_len:

    k_1 v_1 k_2 v_2 ... k_n v_n | x x x k_i x x x x k_j ...
    keys from [1, V/2), values from [V/2, V), distinct within an example; every key is queried
    exactly once, the query of pair i at offset 2 * g_i of the query region, where the gaps g_i
    are drawn without replacement with P(g) ~ a * (g + 1)^(a - 1) (power law, a = power_a =
    0.01 by default: queries cluster near the context); the label at a query position is its
    value, -100 everywhere else; the other positions hold random tokens from [0, V)
    (zoology's `random_non_queries=True`). Requires T even and 4 n <= T.

Short form (`form="short"`, the paper's setting), T = 3 n + 1:

    k_1 v_1 ... k_n v_n  SEP  k_pi(1) ... k_pi(n)
    the n keys queried once each in a random order, right after a separator (token 0); labels
    are the values at the query positions, -100 elsewhere.

A model is scored per query: accuracy = right answers / queries.
"""

import dataclasses
import math

import numpy as np

from vla_jax.tasks.common import IGNORE, check_int

FORMS = ("zoology", "short")
SEP = 0


@dataclasses.dataclass(frozen=True)
class MQARConfig:
  """Attributes:
    vocab_size: V; keys come from [1, V/2), values from [V/2, V).
    n_pairs: key-value pairs (= queries) per example.
    seq_len: T for the zoology form; for the short form 0 or 3 * n_pairs + 1.
    form: "zoology" (default) or "short".
    power_a: exponent of the zoology form's power law of query gaps.
  """

  vocab_size: int
  n_pairs: int
  seq_len: int = 0
  form: str = "zoology"
  power_a: float = 0.01

  def __post_init__(self):
    self.validate()

  @property
  def length(self):
    return 3 * self.n_pairs + 1 if self.form == "short" else self.seq_len

  def validate(self):
    if self.form not in FORMS:
      raise ValueError(f"mqar.form must be one of {FORMS}; got {self.form!r}")
    V = check_int("mqar.vocab_size", self.vocab_size, 4)
    n = check_int("mqar.n_pairs", self.n_pairs, 1)
    if V // 2 - 1 < n:
      raise ValueError(f"mqar: n_pairs={n} distinct keys do not fit in the key half [1, {V // 2}) "
                       f"of vocab_size={V}; raise vocab_size to at least {2 * (n + 1)}")
    if self.form == "short":
      if self.seq_len not in (0, 3 * n + 1):
        raise ValueError(f"mqar: the short form has seq_len = 3 * n_pairs + 1 = {3 * n + 1}; "
                         f"got seq_len={self.seq_len}")
    else:
      T = check_int("mqar.seq_len", self.seq_len, 2)
      if T % 2:
        raise ValueError(f"mqar: seq_len must be even in the zoology form; got {T}")
      if 4 * n > T:
        raise ValueError(f"mqar: n_pairs={n} is too large for seq_len={T}: the zoology form "
                         f"needs 4 * n_pairs <= seq_len (at most {T // 4} pairs)")
      if not self.power_a > 0:
        raise ValueError(f"mqar.power_a must be > 0; got {self.power_a}")


def _distinct(rng, num, low, high, size, spare=6.0):
  """[num, size] ints from [low, high), distinct within a row: an ordered uniform sample (the
  positions of each row's `size` smallest of high - low uniforms, in increasing order of the
  uniforms: the same result as a full argsort).

  The smallest are found among the uniforms below a threshold that about size + spare *
  sqrt(size) + 10 of a row's uniforms pass (all of them where that is a large part of the
  row): a short sort of those instead of a partial sort of the row, about 4x faster at
  zoology's vocabulary. A row with fewer than `size` below it (probability ~1e-9 at spare 6)
  is partially sorted whole."""
  width = high - low
  u = rng.random((num, width))
  expected = size + spare * math.sqrt(size) + 10
  if 4 * expected >= width:    # (expected > size)
    return low + _smallest(u, size)
  below = u < expected / width
  counts = below.sum(axis=1)
  flat = np.flatnonzero(below)                     # row-major: row by row, in column order
  rows, cols = np.divmod(flat, width)
  slot = np.arange(flat.size) - np.repeat(np.cumsum(counts) - counts, counts)
  values = np.full((num, max(int(counts.max(initial=0)), size)), np.inf)
  positions = np.zeros(values.shape, np.int64)
  values[rows, slot], positions[rows, slot] = u.ravel()[flat], cols
  out = np.take_along_axis(positions, np.argsort(values, axis=1)[:, :size], axis=1)
  few = counts < size
  if few.any():
    out[few] = _smallest(u[few], size)
  return low + out


def _smallest(u, size):
  """The column positions of each row's `size` smallest entries of u, smallest first."""
  if size < u.shape[1]:
    part = np.argpartition(u, size - 1, axis=1)[:, :size]
  else:
    part = np.broadcast_to(np.arange(u.shape[1]), u.shape)
  order = np.argsort(np.take_along_axis(u, part, axis=1), axis=1)
  return np.take_along_axis(part, order, axis=1)


def generate(config: MQARConfig, num_examples, rng):
  """Draws `num_examples` MQAR examples.

  Args:
    config: an `MQARConfig`.
    num_examples: N.
    rng: a `numpy.random.Generator` (the result is a pure function of its state).

  Returns:
    inputs [N, T] int32 and labels [N, T] int32 (IGNORE = -100 except at query positions).
  """
  N, n, V = num_examples, config.n_pairs, config.vocab_size
  keys = _distinct(rng, N, 1, V // 2, n)
  values = _distinct(rng, N, V // 2, V, n)
  rows = np.arange(N)[:, None]
  if config.form == "short":
    T = 3 * n + 1
    inputs = np.zeros((N, T), np.int64)
    inputs[:, 0:2 * n:2], inputs[:, 1:2 * n:2] = keys, values
    inputs[:, 2 * n] = SEP
    order = rng.permuted(np.tile(np.arange(n), (N, 1)), axis=1)
    inputs[:, 2 * n + 1:] = keys[rows, order]
    labels = np.full((N, T), IGNORE, np.int64)
    labels[:, 2 * n + 1:] = values[rows, order]
    return inputs.astype(np.int32), labels.astype(np.int32)

  T = config.seq_len
  space = (T - 2 * n) // 2
  g = np.arange(1, space + 1, dtype=np.float64)
  logp = np.log(config.power_a) + (config.power_a - 1) * np.log(g)
  # Gumbel top-n: the same law as numpy's successive sampling without replacement with p.
  scores = logp - np.log(-np.log(rng.random((N, space))))
  gaps = np.argsort(-scores, axis=1)[:, :n]
  inputs = np.zeros((N, T), np.int64)
  inputs[:, 0:2 * n:2], inputs[:, 1:2 * n:2] = keys, values
  query_pos = 2 * n + 2 * gaps
  filler = rng.integers(0, V, size=(N, T))
  is_query = np.zeros((N, T), bool)
  is_query[rows, query_pos] = True
  is_query[:, :2 * n] = True
  inputs = np.where(is_query, inputs, filler)
  inputs[rows, query_pos] = keys
  labels = np.full((N, T), IGNORE, np.int64)
  labels[rows, query_pos] = values
  return inputs.astype(np.int32), labels.astype(np.int32)
