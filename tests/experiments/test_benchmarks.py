"""The benchmark suite's CPU smoke run and the BENCHMARKS.md generator."""

import json
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "experiments", "benchmarks")
sys.path.insert(0, BENCH)

import floor  # pylint: disable=wrong-import-position
import records  # pylint: disable=wrong-import-position
import report  # pylint: disable=wrong-import-position


def _rows(path):
  with open(path) as f:
    lines = [json.loads(line) for line in f if line.strip()]
  return lines[0], lines[1:]


def test_smoke_suite_then_report(tmp_path):
  out = tmp_path / "bench"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), "--smoke", "--out",
                         str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  header, rows = _rows(out / "bench.jsonl")
  assert header["kind"] == "header" and header["settings"]["smoke"]
  assert header["jax"] and header["device"]
  for row in rows:
    assert set(records.FIELDS) <= set(row), row
    assert row["status"] in ("ok", "OOM", "skipped", "error"), row
  assert not [r for r in rows if r["status"] == "error"], [r["note"] for r in rows
                                                            if r["status"] == "error"]
  ok = {(r["op"], r["impl"], r["pass"], r["T"]) for r in rows if r["status"] == "ok"}
  for T in (64, 128):
    assert ("vla", "pallas", "fwd", T) in ok
    assert ("vla", "chunked", "fwd", T) in ok
    assert ("softmax_attention", "xla", "fwd", T) in ok
  assert ("vla", "pallas", "fwd+bwd", 64) in ok
  for impl in ("fla_chunk_delta_rule", "triton_sequential", "cudnn"):
    skipped = [r for r in rows if r["impl"].startswith(impl)]
    assert skipped and all(r["status"] == "skipped" and "no GPU" in r["note"] for r in skipped)
  pallas = [r for r in rows if r["impl"] == "pallas" and r["status"] == "ok"]
  assert all(r["ms"] > 0 and r["peak_mib"] > 0 and r["floor_ms"] > 0 for r in pallas)
  assert all(r["ms_sync"] > 0 and 1 <= r["per_round"] <= 20 for r in pallas)

  md = tmp_path / "BENCHMARKS.md"
  report.main(["--jsonl", str(out / "bench.jsonl"), "--out", str(md), "--plots",
               str(tmp_path / "plots")])
  text = md.read_text()
  for needle in ("# Benchmarks", "## Verdict", "### fwd: milliseconds",
                 "### fwd+bwd: peak device memory (MiB)", "VLA pallas", "smoke run",
                 "## Rows not measured", "no GPU"):
    assert needle in text, needle
  pytest.importorskip("matplotlib")
  assert (tmp_path / "plots" / "time_vs_T.png").stat().st_size > 0


def test_time_jax_rounds_of_back_to_back_calls():
  """`measure.time_jax`: `ms` from rounds of back-to-back calls (k between 2 and the cap,
  sized to the round's time), `ms_sync` from calls each waited for; both positive, and the
  compiled function is what runs (its output checked once). Calls longer than half a round
  are timed synchronously only."""
  import jax.numpy as jnp   # pylint: disable=import-outside-toplevel
  import measure   # pylint: disable=import-outside-toplevel
  fn = lambda x: jnp.tanh(x @ x.T)
  sets = [(jnp.full((64, 64), 0.01 * (i + 1)),) for i in range(2)]
  res = measure.time_jax(fn, sets, warmup=1, target_s=0.02, min_reps=3, max_reps=5,
                         rounds=3, round_s=0.01, max_per_round=7)
  assert res["ms"] > 0 and res["ms_sync"] > 0 and 3 <= res["reps"] <= 5
  assert 2 <= res["per_round"] <= 7 and not res["over_cap"]
  slow = measure.time_jax(fn, sets, warmup=1, target_s=0.02, min_reps=3, max_reps=5,
                          round_s=1e-9)        # every call "longer" than a round
  assert slow["per_round"] == 1 and slow["ms"] == slow["ms_sync"]
  compiled, _ = measure.compile_jax(fn, sets[0])
  assert jnp.allclose(compiled(*sets[0]), fn(*sets[0]))


def _row(impl, op, pass_, T, ms, d=64):
  B = max(1, 32768 // T)
  return {"impl": impl, "op": op, "pass": pass_, "T": T, "B": B, "H": 16, "d": d,
          "dtype": "bfloat16", "ms": ms, "peak_mib": 100.0, "status": "ok", "note": None,
          "floor_ms": 0.1 if impl == "pallas" else None}


def test_report_verdicts_from_data(tmp_path):
  Ts = (1024, 2048, 4096, 8192, 16384)
  rows = []
  for T in Ts:
    rows.append(_row("pallas", "vla", "fwd", T, 10.0))
    rows.append(_row("cudnn", "softmax_attention", "fwd", T, 10.0 * T / 4096))   # crosses at 4096
    rows.append(_row("fla_chunk_delta_rule", "deltanet", "fwd", T, 1.0))
    rows.append(_row("pallas", "vla", "fwd+bwd", T, 30.0))
    rows.append(_row("cudnn", "softmax_attention", "fwd+bwd", T, 1.0))           # never crosses
  rows.append(dict(_row("xla", "softmax_attention", "fwd", 16384, None), status="OOM",
                   note="RESOURCE_EXHAUSTED"))
  # A length only the scan was timed at (no cuDNN or fla row there) is not ranked.
  rows.append(_row("scan", "vla", "fwd", 6000, 500.0))
  rows.append(_row("pallas", "vla", "fwd", 6000, 10.0))
  path = tmp_path / "rows.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in
                            [{"kind": "header", "device": "NVIDIA H200", "jax": "0.11.2",
                              "settings": {"heads": 16, "tokens": 32768}}] + rows) + "\n")
  md = tmp_path / "B.md"
  report.main(["--jsonl", str(path), "--out", str(md)])
  text = md.read_text()
  assert "NVIDIA H200" in text
  assert "faster from there" in text and "T ~ 4,096" in text
  assert "VLA pallas is slower than cuDNN causal attention at every measured T" in text
  assert "VLA pallas is slower than fla's chunk_delta_rule (DeltaNet) at every measured T" in text
  assert "10x to 10x" in text
  assert "| OOM |" in text or "OOM" in text
  # "Why VLA pallas loses": forward times from the shortest to the longest T, and the
  # forward+backward / forward ratio (30 / 10).
  assert "## Why VLA pallas loses" in text
  assert "VLA pallas 10 -> 10 ms (x1)" in text and "cuDNN 2.5 -> 40 ms (x16)" in text
  assert "3x at 1,024" in text and "3x at 16,384" in text
  fwd_verdict = next(line for line in text.splitlines() if line.startswith("- d = 64, fwd:"))
  assert fwd_verdict.endswith("VLA pallas is the fastest row at 0 of 5 lengths."), fwd_verdict

  data = report.Data(report.load([str(path)])[1])
  kind, value = report.crossover(report.ratio_series(data, 64, "fwd", report.PALLAS,
                                                     report.CUDNN))
  assert kind == "at" and value == pytest.approx(4096, rel=1e-6)


def test_floor_matches_bench_kernels():
  sys.path.insert(0, os.path.join(ROOT, "experiments"))
  bench_kernels = pytest.importorskip("bench_kernels")
  for T in (512, 32768):
    B = max(1, 32768 // T)
    for backward in (False, True):
      assert floor.floor_ms(B, T, 16, 64, 64, backward) == pytest.approx(
          bench_kernels.floor_ms(B, T, 64, backward))


def test_later_skipped_row_keeps_earlier_measurement(tmp_path):
  """Files merge later-wins, but a row a later run skipped does not erase a measurement; the
  report names the file each family's rows came from."""
  first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
  first.write_text(json.dumps(_row("cudnn", "softmax_attention", "fwd", 4096, 1.0)) + "\n"
                   + json.dumps(_row("pallas", "vla", "fwd", 4096, 9.0)) + "\n")
  second.write_text(json.dumps(dict(_row("cudnn", "softmax_attention", "fwd", 4096, None),
                                    status="skipped", note="budget")) + "\n"
                    + json.dumps(_row("pallas", "vla", "fwd", 4096, 3.0)) + "\n")
  data = report.Data(report.load([str(first), str(second)])[1])
  assert data.ms(64, "fwd", report.CUDNN, 4096) == 1.0
  assert data.ms(64, "fwd", report.PALLAS, 4096) == 3.0
  text = "\n".join(report.row_sources(data))
  assert "`first.jsonl`: 1" in text and "`second.jsonl`: 1" in text
  assert "more than one run" in text


def test_backward_rows_return_the_output_and_its_pullback():
  """A fwd+bwd row returns the forward's output (so that no forward work can be dropped) and
  the cotangent pulled back to every input: equal to the gradient of sum(o * cot)."""
  jax_rows = pytest.importorskip("jax_rows")
  fn = jax_rows.function("linear_attention", "chunked", "fwd+bwd", 16)
  *xs, cot = jax_rows.input_sets("linear_attention", 1, 32, 2, 16, jnp.float32, 1, True)[0]
  o, grads = jax.jit(fn)(*xs, cot)
  fwd = jax_rows.forward("linear_attention", "chunked", 16)
  chex.assert_trees_all_close(o, fwd(*xs), rtol=1e-6)
  want = jax.grad(lambda *a: jnp.sum(fwd(*a) * cot), argnums=(0, 1, 2))(*xs)
  chex.assert_trees_all_close(grads, want, rtol=1e-5, atol=1e-6)
  assert len(grads) == 3


def test_field_section_measures_fla_like_vla(tmp_path):
  """fla's rows get the marks VLA pallas gets: its ms over the delta-rule floor at 32,768, its
  forward+backward / forward ratio and its crossover with cuDNN."""
  rows = []
  for T in (4096, 8192, 32768):
    rows.append(_row("fla_chunk_delta_rule", "deltanet", "fwd", T, 1.0))
    rows.append(_row("fla_chunk_delta_rule", "deltanet", "fwd+bwd", T, 3.5))
    rows.append(_row("cudnn", "softmax_attention", "fwd", T, T / 8192))  # crosses at 8k
    rows.append(_row("pallas", "vla", "fwd", T, 2.0))
  data = report.Data(rows)
  text = "\n".join(report.field_section(data))
  fl = floor.delta_rule_floor_ms(1, 32768, 16, 64)
  assert fl == pytest.approx(max(4 * 32768 * 16 * 64 * 2 / 4.2e12,
                                 2 * (5 * 64 * 64 * 64 + 3 * 64 * 64 * 64) * 32768 * 16 / 64
                                 / 8e14) * 1e3)
  assert f"1 ms against a floor of {report.fmt(fl)} ms, {report.fmt(1 / fl)}x" in text
  assert "(VLA pallas 20x its own)" in text            # 2.0 ms over the rows' floor_ms 0.1
  assert "3.5x at 4,096" in text and "3.5x at 32,768" in text
  assert "forward crosses cuDNN at T ~ 8,192" in text
  assert "fla / cuDNN forward at T = 4,096: 2." in text  # 1 ms against 0.5
  # The delta-rule floor is the VLA floor without the penalty path's products and u.
  assert floor.delta_rule_floor_ms(1, 32768, 16, 64) < floor.floor_ms(1, 32768, 16, 64)


def test_rows_a_newer_run_of_their_family_left_behind_are_marked_and_not_computed(tmp_path):
  """VLA pallas measured at 1,024 and 2,048 in an old run, then at 1,024 and 4,096 in a new one
  (the kernel may have changed): the old 2,048 row stays in the tables with the stale mark
  but no ratio, ranking, floor row or sentence uses it; cuDNN's old rows, whose family was not
  measured again, are not stale."""
  old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
  old_rows = [_row("pallas", "vla", p, T, ms) for T in (1024, 2048)
              for p, ms in (("fwd", 5.0), ("fwd+bwd", 50.0))]
  old_rows += [_row("cudnn", "softmax_attention", p, T, 1.0) for T in (1024, 2048, 4096)
               for p in ("fwd", "fwd+bwd")]
  new_rows = [_row("pallas", "vla", p, T, ms) for T in (1024, 4096)
              for p, ms in (("fwd", 2.0), ("fwd+bwd", 6.0))]
  header = json.dumps({"kind": "header", "device": "NVIDIA H200",
                       "settings": {"heads": 16, "tokens": 32768}})
  old.write_text("\n".join([header] + [json.dumps(r) for r in old_rows]) + "\n")
  new.write_text("\n".join([header] + [json.dumps(r) for r in new_rows]) + "\n")
  data = report.Data(report.load([str(old), str(new)])[1])
  assert data.ms(64, "fwd", report.PALLAS, 2048) is None
  assert data.get(64, "fwd", report.PALLAS, 2048, stale=True)["ms"] == 5.0
  assert data.ms(64, "fwd", report.PALLAS, 1024) == 2.0 and data.ms(64, "fwd", report.CUDNN,
                                                                    2048) == 1.0
  assert [(r["T"], r["pass"]) for r in data.stale] == [(2048, "fwd"), (2048, "fwd+bwd")]
  assert report.ratio_series(data, 64, "fwd", report.PALLAS, report.CUDNN) == [
      (1024, 2.0), (4096, 2.0)]
  md = tmp_path / "B.md"
  report.main(["--jsonl", str(old), str(new), "--out", str(md), "--plots", str(tmp_path)])
  text = md.read_text()
  assert "| 2,048 | 16 | 5 † | 1 |" in text           # the table keeps it, marked
  assert "d = 64 VLA pallas fwd at T = 2,048 (`old.jsonl`)" in text
  assert "3x at 1,024, 3x at 4,096." in text and "10x" not in text  # 50 / 5 is not computed
  assert f"report.py --jsonl {old} {new} --out {md} --plots {tmp_path}" in text
  # The same files in the other order: the 4,096 row is the old one now.
  data = report.Data(report.load([str(new), str(old)])[1])
  assert {r["T"] for r in data.stale} == {4096}
