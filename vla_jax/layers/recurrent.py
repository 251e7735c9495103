"""`RecurrentMixer`: the skeleton that VLA, DeltaNet, Gated DeltaNet and linear attention share.

The checks, the impl choice (`common.check_recurrence_options` at construction,
`common.recurrence_impl` per call), padding and packing (`vla_jax.layers.common`), the
parameter order, and `__call__` / `prefill` / `step` / `init_cache` with their
`common.RecurrentCache` live here once. A subclass supplies its op and step (class attributes),
its own parameters, the inputs of its op from the projected q, k, v, its empty state, and, if
its readout carries a state (VLA's "additive" sum), its readout.
"""

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import DTypeLike

from vla_jax import parallel
from vla_jax.layers import common
from vla_jax.ops import checks


class RecurrentMixer(nnx.Module):
  """The shared skeleton of the recurrent mixers, x [B, T, d_model] -> [B, T, d_model].

  A subclass's `__init__` calls `super().__init__` (widths and dtypes), checks its own options,
  then `self._build(...)`: impl and chunk size, then the parameters in a fixed order (W_q, W_k,
  W_v, `_init_params`, the convolutions, `_init_late_params`, W_o: the order of the seed's
  draws).

  Attributes:
    d_model, num_heads, head_dim: widths; the projections map d_model -> num_heads * head_dim
      (head_dim None: d_model // num_heads), W_v to num_heads * value_head_dim.
    value_head_dim: the width of a head's values (head_dim unless a subclass widens them
      before `_build`: `DeltaNet`'s expand_v); the state is [value_head_dim, head_dim] per
      head.
    impl: "auto" (default): the Pallas kernel where one takes the call (`vla_jax.kernels.config`
      support table), else "chunked"; the choice and its reason are logged (absl INFO) once
      (`vla_jax.ops.impl.resolve_impl`). Or "chunked", "scan", "associative_scan", "pallas",
      "pallas_interpret": a kernel impl that cannot take the layer's calls raises ValueError
      at construction, and with `segment_ids` where the kernel does not pack, at the call.
    chunk_size: tokens per chunk of "chunked" and the kernels. Traced under a mesh with a "seq"
      axis of more than one device (`jax.set_mesh`), the op runs with T split over it
      (`vla_jax.parallel.sequence_op`).
    conv_size: the width of the causal depthwise convolution with SiLU on the projected q, k
      and v (`common.short_convs`; default `common.DEFAULT_CONV_SIZE`); 0 for none.
    out_norm: LayerNorm over the merged heads before W_o (default True).
    dtype, param_dtype: activation and parameter dtypes (default float32); the recurrence's
      state is float32 (float64 under x64) and its output is cast back to `dtype`.
  """

  RECURRENT = True
  # The op's name in the kernels' support table (`vla_jax.kernels.config`).
  OP: str
  # The op, (q, k, v, ..., initial_state=, impl=, chunk_size=, segment_ids=,
  # **_recurrence_options()) -> (o, state), and its one-token form, (state, q_t, k_t, v_t, ...,
  # **_step_options()) -> (o_t, state): staticmethods in each subclass.
  RECURRENCE = None
  STEP = None
  QK_BIAS = False          # whether W_q and W_k have a bias (W_v has none)
  KERNEL_OPTIONS: dict = {}  # {option: default} of the options a kernel may not take
  # The names of `_inputs`' arrays, in order (an input a layer does not use is None or absent).
  INPUT_NAMES = ("q", "k", "v")

  def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None, *,
               dtype: DTypeLike = jnp.float32, param_dtype: DTypeLike = jnp.float32):
    name = type(self).__name__
    common.check_dtype(name, "dtype", dtype)
    common.check_dtype(name, "param_dtype", param_dtype)
    self.head_dim = common.resolve_head_dim(name, d_model, num_heads, head_dim)
    self.value_head_dim = self.head_dim
    self.num_heads = num_heads
    self.dtype = dtype

  def _build(self, d_model, *, impl, chunk_size, conv_size, out_norm, param_dtype, rngs):
    """Checks `impl` and `chunk_size`, then draws the parameters in the module's order."""
    name = type(self).__name__
    out_norm = common.check_bool(name, "out_norm", out_norm)
    self.impl, self.chunk_size = common.check_recurrence_options(
        name, impl, chunk_size, **self._kernel_facts())
    inner = self.num_heads * self.head_dim
    values = self.num_heads * self.value_head_dim
    kw = dict(dtype=self.dtype, param_dtype=param_dtype, rngs=rngs)
    self.q_proj = common.dense(d_model, inner, use_bias=self.QK_BIAS, **kw)
    self.k_proj = common.dense(d_model, inner, use_bias=self.QK_BIAS, **kw)
    self.v_proj = common.dense(d_model, values, use_bias=False, **kw)
    self._init_params(d_model, inner, **kw)
    self.conv = common.short_convs(name, (inner, inner, values), conv_size, **kw)
    self._init_late_params(d_model, **kw)
    self.out = common.OutputProjection(values, d_model, out_norm=out_norm, **kw)

  def _init_params(self, d_model, inner, *, dtype, param_dtype, rngs):
    """The subclass's parameters drawn after W_q, W_k, W_v (none by default)."""

  def _init_late_params(self, d_model, *, dtype, param_dtype, rngs):
    """The subclass's parameters drawn after the convolutions (none by default)."""

  @classmethod
  def kernel_facts(cls, head_dim: int, dtype: DTypeLike, options) -> dict:
    """What decides whether a Pallas kernel takes the calls of a layer of this head dim,
    dtype and `options` (its keyword options; missing ones at their defaults):
    `resolve_impl`'s op, dtype, head_dims and options."""
    return dict(op=cls.OP, dtype=dtype,
                head_dims=(head_dim, cls.value_width(head_dim, options)),
                options={k: options.get(k, d) for k, d in cls.KERNEL_OPTIONS.items()})

  @classmethod
  def value_width(cls, head_dim: int, options) -> int:
    """The value head width a layer of this head dim and `options` has (head_dim unless the
    subclass widens its values)."""
    del options
    return head_dim

  def _kernel_facts(self):
    facts = self.kernel_facts(self.head_dim, self.dtype,
                              {k: getattr(self, k) for k in self.KERNEL_OPTIONS})
    return dict(facts, head_dims=(self.head_dim, self.value_head_dim))

  def _recurrence_options(self):
    """Keyword options of `RECURRENCE` beyond the skeleton's (none by default)."""
    return {}

  def _step_options(self):
    """Keyword options of `STEP` (none by default)."""
    return {}

  def _inputs(self, x, q, k, v, mask):
    """x [B, T, d_model] (0 at pads) and its projected q, k, v [B, T, H * D] -> the
    recurrence's inputs, a tuple of [B, T, H, ...] arrays (or None) starting with q, k, v,
    with the writes (k, v, ...) 0 at the pads of `mask` (a step that leaves the state
    unchanged)."""
    raise NotImplementedError

  def _initial_state(self, batch_size):
    """The recurrence's empty state for `batch_size` sequences."""
    raise NotImplementedError

  def _initial_norm(self, batch_size):
    """The readout's empty state (none by default)."""
    del batch_size
    return ()

  def _readout(self, o, inputs, norm, docs=None, x=None):
    """o [B, T, H, dv] -> (y [B, T, d_model], the readout's state after o); by default
    W_o LayerNorm(merge_heads(o)), with no state. x: the layer's input [B, T, d_model], 0 at
    the pads (for a readout gated by it)."""
    del inputs, docs, x
    return self.out(o), norm

  def features(self, x: jax.Array, conv_prefix: tuple | None = None, *,
               attention_mask: jax.Array | None = None, docs: jax.Array | None = None
               ) -> tuple[tuple, tuple]:
    """x [B, T, d_model] in `dtype` -> (the recurrence's inputs, a tuple of [B, T, H, ...]
    arrays beginning q, k, v; the convolutions' prefixes after x). `conv_prefix`: the
    convolutions' prefixes before x (None: zeros); `attention_mask` ([B, T] bool) and `docs`
    (`common.document_ids`) as in `prefill`: the writes are 0 at the pads, the convolutions
    stay inside their document."""
    mask = attention_mask
    x = common.mask_tokens(mask, x)
    (q, k, v), tails = common.convolve(
        self.conv, (self.q_proj(x), self.k_proj(x), self.v_proj(x)), conv_prefix, mask, docs)
    return self._inputs(x, q, k, v, mask), tails

  def init_cache(self, batch_size: int, max_len: int | None = None) -> common.RecurrentCache:
    """The empty streaming cache for `batch_size` (an int >= 0) sequences (`max_len` is not
    needed: the state has a fixed size)."""
    del max_len
    batch_size = checks.check_size(f"{type(self).__name__}: batch_size", batch_size)
    return common.RecurrentCache(
        state=self._initial_state(batch_size),
        conv=common.empty_prefixes(self.conv, batch_size),
        norm=self._initial_norm(batch_size))

  def _check_cache(self, cache, batch, arg):
    common.check_cache(type(self).__name__, cache, common.RecurrentCache,
                       lambda: jax.eval_shape(lambda: self.init_cache(batch)), batch, arg)

  def prefill(self, x: jax.Array, cache: common.RecurrentCache | None = None, *,
              attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None
              ) -> tuple[jax.Array, common.RecurrentCache]:
    """Runs x [B, T, d_model] from `cache` (None: the empty cache) with `impl`; returns
    (y [B, T, d_model] in `dtype`, the cache after x). `attention_mask` ([B, T] bool, True =
    a real token; None: all real) deletes the padded positions; `segment_ids` ([B, T] int,
    None: one document) packs documents, each computed alone (the state, the convolutions
    and any readout state restart; see `vla_jax.layers.common`)."""
    name = type(self).__name__
    common.check_input(name, x, self.q_proj.in_features)
    mask = common.check_attention_mask(name, attention_mask, *x.shape[:2])
    docs = common.document_ids(name, segment_ids, *x.shape[:2], mask)
    x = x.astype(self.dtype)
    if cache is None:
      cache = self.init_cache(x.shape[0])
    else:
      self._check_cache(cache, x.shape[0], "x")
    impl = common.recurrence_impl(name, self.impl, chunk_size=self.chunk_size, docs=docs,
                                  **self._kernel_facts())
    inputs, tails = self.features(x, cache.conv, attention_mask=mask, docs=docs)
    o, state = parallel.sequence_op(self.RECURRENCE)(
        *inputs, initial_state=cache.state, impl=impl, chunk_size=self.chunk_size,
        segment_ids=docs, **self._recurrence_options())
    y, norm = self._readout(o, inputs, cache.norm, docs, x=common.mask_tokens(mask, x))
    return common.mask_tokens(mask, y), common.RecurrentCache(state, tails, norm)

  def step(self, x_t: jax.Array, cache: common.RecurrentCache
           ) -> tuple[jax.Array, common.RecurrentCache]:
    """One token x_t [B, d_model] -> (y_t [B, d_model], cache); work and memory independent
    of the tokens before."""
    common.check_input(type(self).__name__, x_t, self.q_proj.in_features, step=True)
    self._check_cache(cache, x_t.shape[0], "x_t")
    x = x_t[:, None].astype(self.dtype)
    inputs, tails = self.features(x, cache.conv)
    o_t, state = self.STEP(cache.state, *(None if a is None else a[:, 0] for a in inputs),
                           **self._step_options())
    y, norm = self._readout(o_t[:, None], inputs, cache.norm, x=x)
    return y[:, 0], common.RecurrentCache(state, tails, norm)

  def __call__(self, x: jax.Array, *, attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
    """x: [B, T, d_model] in any float dtype -> [B, T, d_model] in `dtype`; `attention_mask`
    and `segment_ids` as in `prefill`."""
    return self.prefill(x, attention_mask=attention_mask, segment_ids=segment_ids)[0]
