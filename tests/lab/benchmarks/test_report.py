"""`lab.benchmarks.report`: BENCHMARKS.md computed from rows; each section's finding follows
its rows (a crossover that moves, a ratio whose smallest point moves, a check row that fails)."""

import json

import pytest

from lab.benchmarks import check, report

TS = (1024, 2048, 4096, 8192, 16384)


def _row(impl, op, pass_, T, ms, d=64, floor_ms=None):
  B = max(1, 32768 // T)
  return {"impl": impl, "op": op, "pass": pass_, "T": T, "B": B, "H": 16, "d": d,
          "dtype": "bfloat16", "ms": ms, "peak_mib": 100.0, "status": "ok", "note": None,
          "floor_ms": floor_ms if floor_ms is not None else (0.1 if impl == "pallas" else None)}


def _write(path, rows_, time="2026-12-02T00:00:00", argv=None):
  header = {"kind": "header", "time": time, "device": "NVIDIA H200", "jax": "0.11.2",
            "jax_backend": "gpu", "settings": {"heads": 16, "tokens": 32768},
            "argv": argv or ["experiments/bench.py", "--name=a", "--out_dir=/root/out/m"]}
  path.write_text("\n".join(json.dumps(r) for r in [header] + rows_) + "\n")


def _rows(cudnn_cross=4096, fla=None, d=64):
  """VLA pallas at 10 ms (fwd) and 30 ms (fwd+bwd) at every T; cuDNN's forward crosses it at
  `cudnn_cross`, its forward+backward is always faster; fla's forward takes fla[T] ms (1 ms
  where not given) and its forward+backward 3 ms."""
  fla = fla or {}
  out = []
  for T in TS:
    out += [_row("pallas", "vla", "fwd", T, 10.0, d), _row("pallas", "vla", "fwd+bwd", T, 30.0, d),
            _row("cudnn", "softmax_attention", "fwd", T, 10.0 * T / cudnn_cross, d),
            _row("cudnn", "softmax_attention", "fwd+bwd", T, 1.0, d),
            _row("fla_chunk_delta_rule", "deltanet", "fwd", T, fla.get(T, 1.0), d),
            _row("fla_chunk_delta_rule", "deltanet", "fwd+bwd", T, 3.0, d)]
  return out


def _data(rows_):
  return report.Data([dict(r, _order=0) for r in rows_])


def test_report_sections_open_with_findings(tmp_path):
  rows_ = _rows() + [dict(_row("cudnn", "softmax_attention", "fwd", 32768, None),
                          status="OOM", note="RESOURCE_EXHAUSTED")]
  _write(tmp_path / "a.jsonl", rows_)
  md = tmp_path / "B.md"
  report.write_report(report.bench_files(str(tmp_path)), str(md))
  text = md.read_text()
  sections = text.split("\n## ")[1:]
  assert [s.split("\n")[0] for s in sections] == [
      "Verdict", "Crossover against cuDNN causal attention",
      "VLA pallas against fla `chunk_delta_rule`", "VLA pallas against the hardware floor",
      "fla's DeltaNet kernel on the same measures", "Where VLA pallas's time goes", "d = 64",
      "Peak device memory", "Rows not measured"]
  for s in sections:   # a heading, a blank line, then a finding of two sentences
    finding = s.split("\n")[2]
    assert finding and not finding.startswith(("|", "#", "!")), s[:300]
    assert finding.count(". ") + finding.endswith(".") >= 2, finding
  assert "| `a.jsonl` | 2026-12-02 00:00 | NVIDIA H200 (gpu) | H 16, B * T 32,768 |" in text
  assert "--out_dir=OUT" in text and "/root/out" not in text
  assert "| VLA pallas | `a.jsonl` (10) |" in text
  assert "| 64 | fwd | T ~ 4,096 | 10x | T = 1,024 (10x) | 100x | 0 of 5 T |" in text
  assert "1 of the 31 timed rows carries no time (1 OOM)" in text
  assert "VLA pallas 10 -> 10" not in text   # no generated enumerations left
  assert report.render(*report.load([str(tmp_path / "a.jsonl")]), [], str(md)) == \
      report.render(*report.load([str(tmp_path / "a.jsonl")]), [], str(md))


def test_crossover_finding_follows_the_crossover():
  early, late = _data(_rows(cudnn_cross=4096)), _data(_rows(cudnn_cross=8192))
  assert report.crossover_finding(early) == (
      "VLA pallas crosses cuDNN causal attention (faster from there on) at T ~ 4,096 (fwd) and "
      "beyond T = 16,384 (fwd+bwd) at d = 64. Its time runs from 30x cuDNN's (d = 64, fwd+bwd, "
      "T = 1,024) to 0.25x (d = 64, fwd, T = 16,384).")
  assert "at T ~ 8,192 (fwd)" in report.crossover_finding(late)
  assert "to 0.5x (d = 64, fwd, T = 16,384)" in report.crossover_finding(late)
  never = _data([r for r in _rows(cudnn_cross=10 ** 6) if r["pass"] == "fwd"])
  assert "beyond T = 16,384 (fwd) at d = 64" in report.crossover_finding(never)
  assert report.verdict_finding(early).startswith(
      "VLA pallas is faster than cuDNN causal attention at the longest measured T in 1 of 2 "
      "head dims and passes; it is slower than fla's chunk_delta_rule")
  assert report.verdict_finding(_data([r for r in _rows() if r["pass"] == "fwd"])).startswith(
      "VLA pallas overtakes cuDNN causal attention at T ~ 4,096 (d = 64, fwd); it is slower "
      "than fla's chunk_delta_rule at every measured T (10x its time).")


def test_fla_finding_follows_the_ratio():
  closest_long = report.fla_finding(_data(_rows(fla={16384: 5.0})))
  assert closest_long == (
      "VLA pallas is slower than fla's chunk_delta_rule at every measured T, with time ratios of "
      "2x to 10x (fwd) and 10x (fwd+bwd) at d = 64. The ratio is smallest at "
      "T = 1,024 (d = 64, fwd+bwd); T = 16,384 (d = 64, fwd).")
  closest_short = report.fla_finding(_data(_rows(fla={2048: 5.0})))
  assert "T = 2,048 (d = 64, fwd)" in closest_short and "16,384" not in closest_short
  mixed = report.fla_finding(_data(_rows(fla={16384: 20.0})))
  assert mixed.startswith("VLA pallas is faster than fla's chunk_delta_rule at 1 of 10 "
                          "measured points, with time ratios of 0.5x to 10x (fwd)")


def test_floor_and_dim_findings_follow_the_rows():
  rows_ = _rows()
  rows_[0] = dict(rows_[0], floor_ms=2.0)        # d = 64 fwd at T = 1,024: 5x its floor
  data = _data(rows_)
  assert report.floor_finding(data) == (
      "VLA pallas takes 5x (d = 64, fwd, T = 1,024) to 300x (d = 64, fwd+bwd, T = 1,024) its "
      "hardware floor's time. By head dim: 5x to 300x at d = 64.")
  assert report.dim_finding(_data(_rows(cudnn_cross=3000, fla={1024: 5.0})), 64) == (
      "The fastest row is softmax cudnn up to T = 1,024 and DeltaNet fla_chunk_delta_rule from "
      "T = 2,048 (fwd); softmax cudnn at every T (fwd+bwd). VLA pallas is the fastest row at 0 "
      "of 10 (pass, T) points; its best place, 2 of 3, comes first at T = 4,096 (fwd).")
  assert report.dim_finding(_data(_rows(cudnn_cross=3000, fla={1024: 5.0, 2048: 8.0})),
                            64).startswith(
      "The fastest row is softmax cudnn up to T = 2,048 and DeltaNet fla_chunk_delta_rule from "
      "T = 4,096 (fwd)")


def test_correctness_finding_names_the_worst_errors_and_failures():
  def row(dtype, precision, u, T, errors, status="ok"):
    case = check.Case(dtype, precision, u, T)
    return {**case.__dict__, "op": "vla", "impl": "pallas", "pass": "check", "errors": errors,
            "bound": check.bound(case), "du_bound": check.du_bound(case),
            "forward_bound": check.forward_bound(case), "status": status}
  rows_ = [row("float32", "HIGHEST", "anisotropic", 4096, {"o": 1e-6, "S": 1.5e-6, "du": 4e-5}),
           row("bfloat16", "DEFAULT", "anisotropic", 4096, {"o": 1e-2, "du": 0.12})]
  text = "\n".join(report.correctness_section(rows_))
  assert ("All 2 check rows hold their bounds; the closest, d = 64, float32 HIGHEST, "
          "anisotropic u, T = 4,096, has its S error at 0.75 of its bound. The worst error per "
          "precision: 0.12 (du) in bfloat16 DEFAULT and 4e-05 (du) in float32 HIGHEST.") in text
  assert "| 0.03; du 0.3 | 0.4 (du) | ok |" in text
  assert "| 0.001; o, S, A 2e-06 | 0.75 (S) | ok |" in text
  rows_[1] = dict(rows_[1], errors={"o": 0.05}, status="fail")
  assert report.correctness_finding(rows_).startswith(
      "1 of the 2 check rows fail their bounds: d = 64, bfloat16 DEFAULT, anisotropic u, "
      "T = 4,096.")


def test_a_part_of_a_model_is_never_the_fastest_row():
  """State-path rows (a part of VLA) sit in the tables but not in "fastest row per T"."""
  rows_ = [_row("pallas", "vla", "fwd", 4096, 2.0), _row("cudnn", "softmax_attention", "fwd",
                                                          4096, 1.0),
           _row("fla_chunk_delta_rule", "deltanet", "fwd", 4096, 3.0),
           _row("triton", "state_path", "fwd", 4096, 0.5)]
  data = _data(rows_)
  assert "state path triton" in data.labels_for(64, "fwd")
  assert [line[1] for line in report.fastest_summary(data, 64, "fwd")] == [report.CUDNN]


def test_files_merge_oldest_first_and_stale_rows_are_marked(tmp_path):
  """Files are read by their header time; a later file's row wins, a later skipped row does
  not erase a measurement, and a family's rows that a later file left behind are marked and
  not computed with."""
  old, new = tmp_path / "z_old.jsonl", tmp_path / "a_new.jsonl"
  _write(old, [_row("pallas", "vla", "fwd", T, 5.0) for T in (1024, 2048)]
         + [_row("cudnn", "softmax_attention", "fwd", T, 1.0) for T in (1024, 2048, 4096)],
         time="2026-11-01T00:00:00")
  _write(new, [_row("pallas", "vla", "fwd", T, 2.0) for T in (1024, 4096)]
         + [dict(_row("cudnn", "softmax_attention", "fwd", 4096, None), status="skipped")],
         time="2026-12-01T00:00:00")
  paths = report.bench_files(str(tmp_path))
  assert [p.split("/")[-1] for p in paths] == ["z_old.jsonl", "a_new.jsonl"]
  data = report.Data(report.load(paths)[1])
  assert data.ms(64, "fwd", report.CUDNN, 4096) == 1.0
  assert data.ms(64, "fwd", report.PALLAS, 1024) == 2.0
  assert data.ms(64, "fwd", report.PALLAS, 2048) is None
  assert data.get(64, "fwd", report.PALLAS, 2048, stale=True)["ms"] == 5.0
  assert report.ratio_series(data, 64, "fwd", report.PALLAS, report.CUDNN) == [
      (1024, 2.0), (4096, 2.0)]
  kind, value = report.crossover(report.ratio_series(_data(_rows()), 64, "fwd", report.PALLAS,
                                                     report.CUDNN))
  assert kind == "at" and value == pytest.approx(4096, rel=1e-6)


# -- BENCHMARKS.md's hand-written verdict, checked against the committed rows --------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def committed():
  return report.Data(report.load(report.bench_files(str(ROOT / "results" / "bench")))[1])


def test_verdict_vla_slower_than_fla_everywhere(committed):
  """'slower than fla's chunk_delta_rule at every length, by about 1.3-1.9x at head dim 64 and
  2.5-3.9x at 128'."""
  for d, lo, hi in ((64, 1.25, 1.95), (128, 2.4, 3.9)):
    ratios = [r for p in report.PASSES
              for _, r in report.ratio_series(committed, d, p, report.PALLAS, report.FLA)]
    assert ratios and lo <= min(ratios) and max(ratios) <= hi, (d, min(ratios), max(ratios))


def test_verdict_crossover_against_cudnn(committed):
  """'beats cuDNN causal attention only past roughly 6k-9k tokens at d = 64 and 13k-17k at
  d = 128'."""
  for d, lo, hi in ((64, 6000, 9000), (128, 13000, 17500)):
    for p in report.PASSES:
      kind, T = report.crossover(report.ratio_series(committed, d, p, report.PALLAS,
                                                     report.CUDNN))
      assert kind == "at" and lo <= T <= hi, (d, p, kind, T)


def test_verdict_floor_distance(committed):
  """'8-17x its hardware floor (fla, measured the same way, 12-20x its own)'."""
  ours = [x for d, p in report.pairs(committed) for _, x in report.floor_series(committed, d, p)]
  assert 8 <= min(ours) and max(ours) <= 17.5
  T = report.field_T(committed, report.fixed_tokens(committed))
  fla = [ms / fl for d, p in report.pairs(committed, report.FLA)
         for ms, fl in [report.fla_floor(committed, d, p, T)]]
  assert 11.5 <= min(fla) and max(fla) <= 20


def test_verdict_checks_hold_their_bounds(committed):
  """'Its forward and gradients hold their float64 error bounds at every precision checked'."""
  checks = [r for r in committed.rows if r.get("pass") == "check"]
  assert checks and all(r["status"] == "ok" for r in checks)
