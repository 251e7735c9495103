"""`resolve_impl`: what impl "auto" runs and which explicit impls are rejected, on abstract
targets (platform and compute capability passed explicitly: no GPU needed)."""

import logging
import re

import jax.numpy as jnp
import pytest

from vla_jax.kernels import config as kernel_config
from vla_jax.ops.impl import Impl, choose_impl, parse_impl, resolve_impl

H100 = dict(platform="gpu", capability=(9, 0))
VLA = dict(op="vla", dtype=jnp.float32, head_dims=(64, 64), chunk_size=64)


def _auto(**kw):
  return resolve_impl("auto", **{**H100, **VLA, **kw})


@pytest.mark.parametrize("kw", [{}, dict(dtype=jnp.bfloat16), dict(dtype=jnp.float64),
                                dict(capability=(8, 0)), dict(capability=(10, 0)),
                                dict(head_dims=(16, 16)), dict(head_dims=(128, 128)),
                                dict(chunk_size=16), dict(chunk_size=128),
                                dict(options={"readout": "additive"}),
                                dict(options={"readout": "delta"}), dict(segment_ids=True),
                                dict(options={"beta": True}),
                                dict(platform="cuda")])
def test_auto_runs_the_kernel_where_it_takes_the_call(kw):
  impl, reason = _auto(**kw)
  assert impl is Impl.PALLAS and "runs 'pallas'" in reason


@pytest.mark.parametrize("kw, why", [
    (dict(platform="cpu", capability=None), "backend is 'cpu'"),
    (dict(platform="tpu", capability=None), "backend is 'tpu'"),
    (dict(capability=(7, 5)), "compute capability 7.5 is below the kernel's 8.0"),
    (dict(capability=None), "compute capability is unknown"),
    (dict(head_dims=(48, 48)), "head_dim \\(keys\\)=48"),
    (dict(head_dims=(64, 65)), "head_dim \\(values\\)=65"),
    (dict(chunk_size=256), "chunk_size=256"),
    (dict(dtype=jnp.float16), "dtype=float16"),
    (dict(op="no_such_op"), "no Pallas kernel for 'no_such_op'"),
    (dict(op="gated_deltanet", segment_ids=True), "does not take segment_ids"),
])
def test_auto_falls_back_to_chunked_and_says_why(kw, why):
  impl, reason = _auto(**kw)
  assert impl is Impl.CHUNKED
  assert reason.startswith("impl='auto' runs 'chunked': ")
  assert re.search(why, reason), reason


@pytest.mark.parametrize("impl, kw, match", [
    ("pallas", dict(platform="cpu", capability=None), "backend is 'cpu'.*'pallas_interpret'"),
    ("pallas", dict(capability=(7, 0)), "compute capability 7.0"),
    ("pallas", dict(head_dims=(40, 40)), "head_dim \\(keys\\)=40"),
    ("pallas", dict(chunk_size=256), "chunk_size=256"),
    ("pallas", dict(op="no_such_op"), "no Pallas kernel for 'no_such_op'"),
    ("pallas", dict(platform=None, chunk_size=256), "chunk_size=256"),   # configuration time
])
def test_explicit_kernel_impls_the_kernel_cannot_run_are_rejected(impl, kw, match):
  with pytest.raises(ValueError, match=f"impl='{impl}' cannot run here: .*{match}"):
    resolve_impl(impl, **{**H100, **VLA, **kw})


def test_explicit_impls_that_run_are_returned_as_given():
  assert resolve_impl("pallas", **{**H100, **VLA})[0] is Impl.PALLAS
  # An unknown capability (a ROCm GPU): the kernel checks the device itself.
  assert resolve_impl("pallas", **{**VLA, "platform": "gpu", "capability": None})[0] is Impl.PALLAS
  assert resolve_impl("pallas_interpret", **{**VLA, "platform": "cpu"})[0] is Impl.PALLAS_INTERPRET
  assert resolve_impl("pallas", **{**VLA, "platform": None})[0] is Impl.PALLAS
  for impl in ("chunked", "scan", "associative_scan"):   # any op, packing, backend
    chosen, reason = resolve_impl(impl, **{**VLA, "platform": "cpu", "op": "deltanet",
                                           "segment_ids": True, "chunk_size": 256})
    assert chosen is Impl(impl) and "as requested" in reason
  with pytest.raises(ValueError, match="impl must be one of 'auto', 'scan'"):
    resolve_impl("triton", **{**H100, **VLA})


def test_the_ops_take_concrete_impls_only():
  assert parse_impl("pallas_interpret") is Impl.PALLAS_INTERPRET
  with pytest.raises(ValueError, match="impl='auto' is not available here.*resolve_impl"):
    parse_impl("auto")


def test_the_kernel_facts_are_one_table(monkeypatch):
  """Flipping a fact of `KERNEL_SUPPORT` (packing and an option value in the VLA kernel, the
  DeltaNet kernel removed and restored) changes what "auto" runs and what "pallas" refuses,
  with nothing else edited."""
  for kw in (dict(segment_ids=True), dict(options={"readout": "delta"})):
    assert _auto(**kw)[0] is Impl.PALLAS
  monkeypatch.setitem(kernel_config.KERNEL_SUPPORT, "vla", kernel_config.KernelSupport(
      segment_ids=False, unsupported=(("readout", ("delta",)),)))
  for kw, why in ((dict(segment_ids=True), "does not take segment_ids"),
                  (dict(options={"readout": "delta"}), "does not take readout='delta'")):
    impl, reason = _auto(**kw)
    assert impl is Impl.CHUNKED and why in reason, reason
    for explicit, target in (("pallas", H100), ("pallas", dict(platform=None)),
                             ("pallas_interpret", dict(platform="cpu"))):
      with pytest.raises(ValueError, match=f"impl='{explicit}' cannot run here: .*{why}"):
        resolve_impl(explicit, **{**H100, **VLA, **target, **kw})
  # The baselines' kernels: "pallas" runs them; "auto" once they are marked checked on a GPU
  # (all three are).
  for op in ("deltanet", "linear_attention"):
    for kw in ({}, dict(segment_ids=True)):
      assert _auto(op=op, **kw)[0] is Impl.PALLAS
  assert _auto(op="gated_deltanet")[0] is Impl.PALLAS
  monkeypatch.setitem(kernel_config.KERNEL_SUPPORT, "deltanet",
                      kernel_config.KernelSupport(segment_ids=True, auto=False))
  impl, reason = _auto(op="deltanet")
  assert impl is Impl.CHUNKED and "kernel for 'deltanet' is not yet checked on a GPU" in reason
  assert resolve_impl("pallas", **{**H100, **VLA, "op": "deltanet"})[0] is Impl.PALLAS
  monkeypatch.delitem(kernel_config.KERNEL_SUPPORT, "deltanet")
  impl, reason = _auto(op="deltanet")
  assert impl is Impl.CHUNKED and "no Pallas kernel for 'deltanet'" in reason, reason


def test_choose_impl_logs_each_decision_once(caplog):
  """On this (CPU) backend "auto" runs "chunked"; the choice and its reason are logged once
  per distinct decision, and an explicit impl is not logged."""
  call = dict(VLA, name="test_choose_impl_logs_each_decision_once")
  with caplog.at_level(logging.INFO):
    for _ in range(3):
      assert choose_impl("auto", **call) is Impl.CHUNKED
    assert choose_impl("auto", **{**call, "head_dims": (48, 48)}) is Impl.CHUNKED
    assert choose_impl("chunked", **call) is Impl.CHUNKED
  lines = [r.getMessage() for r in caplog.records if call["name"] in r.getMessage()]
  assert len(lines) == 2, lines
  assert "backend is 'cpu'" in lines[0] and "head_dim (keys)=48" in lines[1]
  with pytest.raises(ValueError, match="^test_choose_impl_logs_each_decision_once: "
                                       "impl='pallas' cannot run here"):
    choose_impl("pallas", **call)
