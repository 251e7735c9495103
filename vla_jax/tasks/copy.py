"""The Copy task: a random string, a separator, then the same string again.

Tokens: 0 = PAD, 1 = SEP, the string's symbols come from [2, vocab_size). An example with a
string s of length L is, as inputs and next-token labels (T = 2 * max_len, padded):

    inputs   s_1 ... s_L  SEP  s_1 ... s_{L-1}  PAD ...
    labels   -100 ...     s_1  s_2 ... s_L      -100 ...

so the answer at each copy position is the next symbol of the string, never the current input
token: the model has to read the string back from memory. Training draws L uniformly from
[min_len, max_len]; evaluation uses a fixed L per length in `eval_lengths`, which may exceed
the training lengths. Scored by token accuracy and exact match (whole string right).
"""

import dataclasses

import numpy as np

from vla_jax.tasks.common import IGNORE, check_int

PAD, SEP = 0, 1
SET_PREFIX = "copy_L"   # evaluation sets are named SET_PREFIX + str(L)


@dataclasses.dataclass(frozen=True)
class CopyConfig:
  """Attributes:
    vocab_size: 2 special tokens + the symbols.
    min_len, max_len: range of training string lengths (inclusive).
    eval_lengths: string lengths to evaluate at (default: max_len only).
  """

  vocab_size: int
  min_len: int
  max_len: int
  eval_lengths: tuple = ()

  def __post_init__(self):
    object.__setattr__(self, "eval_lengths", tuple(int(x) for x in self.eval_lengths))
    self.validate()

  def validate(self):
    check_int("copy.vocab_size", self.vocab_size, 3)
    lo = check_int("copy.min_len", self.min_len, 1)
    hi = check_int("copy.max_len", self.max_len, 1)
    if lo > hi:
      raise ValueError(f"copy.min_len={lo} must be <= copy.max_len={hi}")
    for L in self.eval_lengths:
      check_int("copy.eval_lengths[]", L, 1)

  @property
  def lengths(self):
    return self.eval_lengths or (self.max_len,)


def generate(config: CopyConfig, num_examples, rng, length=None):
  """Draws `num_examples` copy examples.

  Args:
    config: a `CopyConfig`.
    num_examples: N.
    rng: a `numpy.random.Generator`.
    length: a fixed string length L (evaluation), or None to draw L in [min_len, max_len].

  Returns:
    inputs [N, T] int32 and labels [N, T] int32, T = 2 * L (fixed L) or 2 * max_len.
  """
  N = num_examples
  if length is None:
    L = rng.integers(config.min_len, config.max_len + 1, size=N)
    T = 2 * config.max_len
  else:
    L = np.full(N, check_int("length", length, 1))
    T = 2 * int(length)
  Lmax = int(L.max(initial=1))
  s = rng.integers(2, config.vocab_size, size=(N, Lmax))
  pos = np.arange(T)[None]
  Lc = L[:, None]
  src = np.take_along_axis(s, np.clip(pos, 0, Lmax - 1), axis=1)
  rep = np.take_along_axis(s, np.clip(pos - Lc - 1, 0, Lmax - 1), axis=1)
  inputs = np.where(pos < Lc, src, np.where(pos == Lc, SEP, np.where(pos < 2 * Lc, rep, PAD)))
  nxt = np.take_along_axis(s, np.clip(pos - Lc, 0, Lmax - 1), axis=1)
  labels = np.where((pos >= Lc) & (pos < 2 * Lc), nxt, IGNORE)
  return inputs.astype(np.int32), labels.astype(np.int32)


def generation_split(inputs):
  """A fixed-length evaluation set [N, 2L] -> (prompts [N, L + 1] = the string and SEP,
  strings [N, L]): the model must generate the string after the prompt."""
  L = inputs.shape[1] // 2
  return inputs[:, :L + 1], inputs[:, :L]
