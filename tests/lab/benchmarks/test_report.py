"""`lab.benchmarks.report`: BENCHMARKS.md's generated blocks follow the rows, regenerating them
leaves the committed file unchanged, and every claim of its hand-written findings holds on the
committed rows (each claim a predicate on the rows, named after the finding it checks)."""

import json
import pathlib

import pytest

from lab import markers
from lab.benchmarks import baseline_report, check, model_report, report, train_speed

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


def test_a_new_report_has_every_block_under_its_heading(tmp_path):
  rows_ = _rows() + [dict(_row("cudnn", "softmax_attention", "fwd", 32768, None),
                          status="OOM", note="RESOURCE_EXHAUSTED")]
  _write(tmp_path / "a.jsonl", rows_)
  md = tmp_path / "B.md"
  report.write_report(report.bench_files(str(tmp_path)), str(md))
  text = md.read_text()
  assert markers.block_names(text) == [
      "verdict", "sources", "crossover", "fla", "floor", "field", "time", "profile", "d64",
      "memory", "correctness", "drift", "not_measured"]
  assert [line for line in text.split("\n") if line.startswith("## ")] == [
      "## Verdict", "## Rows and method", "## Crossover against cuDNN causal attention",
      "## VLA pallas against fla `chunk_delta_rule`", "## VLA pallas against the hardware floor",
      "## fla's DeltaNet kernel on the same measures", "## Where VLA pallas's time goes",
      "## Per-kernel profile", "## d = 64", "## Peak device memory",
      "## Correctness against float64", "## bfloat16 over long sequences",
      "## Rows not measured"]
  assert "| `a.jsonl` | 2026-12-02 00:00 | NVIDIA H200 (gpu) | H 16, B * T 32,768 |" in text
  assert "--out_dir=OUT" in text and "/root/out" not in text
  assert "| VLA pallas | `a.jsonl` (10) |" in text
  assert "| 64 | fwd | T ~ 4,096 | 10x | T = 1,024 (10x) | 100x | 0 of 5 T |" in text
  assert "| 64 | softmax cudnn | fwd | 32,768 | OOM | RESOURCE_EXHAUSTED |" in text
  # a hand-written finding between the blocks survives a rewrite
  md.write_text(text.replace("## d = 64\n", "## d = 64\n\nOur words.\n"))
  report.write_report(report.bench_files(str(tmp_path)), str(md))
  assert "## d = 64\n\nOur words.\n" in md.read_text()
  md.write_text(text.replace(markers.begin("fla"), ""))
  with pytest.raises(ValueError, match="fla"):
    report.write_report(report.bench_files(str(tmp_path)), str(md))


def test_the_crossover_follows_the_rows():
  def cross(rows_, pass_="fwd"):
    return report.crossover(report.ratio_series(_data(rows_), 64, pass_, report.PALLAS,
                                                report.CUDNN))
  kind, T = cross(_rows(cudnn_cross=4096))
  assert kind == "at" and T == pytest.approx(4096, rel=1e-6)
  kind, T = cross(_rows(cudnn_cross=8192))
  assert kind == "at" and T == pytest.approx(8192, rel=1e-6)
  assert cross(_rows(cudnn_cross=10 ** 6))[0] == "never"
  assert cross(_rows(), "fwd+bwd")[0] == "never"
  assert report.crossing(report.ratio_series(_data(_rows()), 64, "fwd+bwd", report.PALLAS,
                                             report.CUDNN)) == "beyond T = 16,384"


def test_the_fla_ratio_table_follows_the_rows():
  text = report.fla_block(_data(_rows(fla={16384: 5.0})))
  assert "| 64 | fwd | 2x to 10x | 10 | 10 | 10 | 10 | 2 |" in text
  assert "| 64 | fwd+bwd | 10x | 10 | 10 | 10 | 10 | 10 |" in text


def test_floor_and_fastest_tables_follow_the_rows():
  rows_ = _rows()
  rows_[0] = dict(rows_[0], floor_ms=2.0)        # d = 64 fwd at T = 1,024: 5x its floor
  assert "| 64 | fwd | 5x to 100x | 5x | 100x |" in report.floor_block(_data(rows_))
  body = report.fastest_summary(_data(_rows(cudnn_cross=3000, fla={1024: 5.0})), 64, "fwd")
  assert [line[1] for line in body] == [report.CUDNN] + [report.FLA] * 4
  assert [line[4] for line in body] == ["3 of 3", "3 of 3", "2 of 3", "2 of 3", "2 of 3"]


def test_correctness_table_names_each_rows_worst_error_against_its_bound():
  def row(dtype, precision, u, T, errors, status="ok"):
    case = check.Case(dtype, precision, u, T)
    return {**case.__dict__, "op": "vla", "impl": "pallas", "pass": "check", "errors": errors,
            "bound": check.bound(case), "du_bound": check.du_bound(case),
            "forward_bound": check.forward_bound(case), "status": status}
  rows_ = [row("float32", "HIGHEST", "anisotropic", 4096, {"o": 1e-6, "S": 1.5e-6, "du": 4e-5}),
           row("bfloat16", "DEFAULT", "anisotropic", 4096, {"o": 1e-2, "du": 0.12})]
  text = report.correctness_block(rows_)
  assert "| 0.03; du 0.3 | 0.4 (du) | ok |" in text
  assert "| 0.001; o, S, A 2e-06 | 0.75 (S) | ok |" in text
  assert report.worst_to_bound(rows_[0]) == (pytest.approx(0.75), "S")


def test_correctness_table_names_the_forms_a_row_forced():
  """A check row at the plan's choice records None and names no form; one that forces a form
  names it (elimination included); a row that records all three by name (run while
  elimination, xla and rows were the defaults) names only the others."""
  plan = check.kernel_options({})
  assert report.forced_forms(plan) == []
  assert report.forced_forms({**plan, "block_factor": "elimination"}) == [
      "block_factor=elimination"]
  named = {"block_factor": "elimination", "start_inverse": "xla", "penalty_layout": "rows"}
  assert report.forced_forms(named) == []
  assert report.forced_forms({**named, "start_inverse": "tiles"}) == ["start_inverse=tiles"]


def test_drift_rows_of_each_lam0_are_kept_and_a_non_finite_row_fails(tmp_path):
  def row(u, lam0, err, finite=True):
    return {**check.DriftCase(u, 16384, lam0, 64).__dict__, "op": "vla", "impl": "pallas",
            "pass": "drift", "dtype": "bfloat16", "precision": "DEFAULT",
            "errors": {"o": err}, "o_quarters": [err] * 4, "finite": finite}
  rows_ = [row("isotropic", 1.0, 6e-3), row("anisotropic", 1.0, 6.5e-3),
           row("isotropic", 0.1, float("nan"), finite=False), row("anisotropic", 0.1, 7e-3)]
  path = tmp_path / "drift.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in
                            [{"kind": "header", "time": "2026-01-01T00:00:00"}] + rows_) + "\n")
  _, merged = report.load([str(path)])
  text = report.drift_block(merged)
  assert "| 64 | 16384 | 1 | anisotropic | 6.50e-03 | 1.08 |" in text
  assert "| 64 | 16384 | 0.1 | isotropic | nan |" in text and "| fail |" in text
  assert text.count("| ok |") == 2


def test_profile_block_sums_launches_and_keeps_the_rest():
  profile = {"device": "cuda:0", "jax": "0.11.2", "rows": [
      {"d": 64, "T": 4096, "B": 8, "call": "forward", "wall_ms": 2.0, "busy_ms": 1.5,
       "classes_ms": {"pallas": 1.2, "xla": 0.3},
       "kernels": [{"name": "vla_spd_inverse", "class": "pallas", "ms": 0.1},
                   {"name": "vla_spd_inverse__1", "class": "pallas", "ms": 0.2},
                   {"name": "vla_penalty_scan", "class": "pallas", "ms": 0.8},
                   {"name": "loop_add_fusion", "class": "xla", "ms": 0.3}]}]}
  text = report.profile_block(profile, "p.json")
  assert "| `vla_penalty_scan` | 0.8 |" in text and "| `vla_spd_inverse` | 0.3 |" in text
  assert "| other Pallas | 0.1 |" in text and "| XLA and libraries | 0.3 |" in text
  assert "| busy (wall) | 1.5 (2) |" in text


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


def test_train_speed_block_reads_each_runs_last_row(tmp_path):
  """One cell per (setting, column): steps/s and the impl, the status of a failed run, "not
  run" without a row, the VLA auto / chunked ratio; a resumed file's later row wins."""
  def row(column, steps_per_s, status="ok", impl="pallas", setting="long_8192"):
    return {"setting": setting, "column": column, "config": "configs/mqar_long.py:8192",
            "T": 8192, "d_model": 512, "heads": 8, "head_dim": 64, "dtype": "bfloat16",
            "batch": 8, "steps": 80, "window": 40, "steps_per_s": steps_per_s, "impl": impl,
            "status": status}
  header = {"kind": "header", "time": "2026-12-07T10:00:00+00:00", "device": "NVIDIA H100",
            "git_commit": "0123456789abcdef", "smoke": False}
  path = tmp_path / "speed.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in [
      header, row("vla", 10.0, "error"), row("vla", 51.2), row("vla_chunked", 20.0, impl="chunked"),
      row("softmax", None, "OOM", impl="cudnn")]) + "\n")
  text = train_speed.block(str(path))
  assert text.startswith("NVIDIA H100, commit 0123456, 2026-12-07T10:00 UTC: steps/s")
  assert ("| `configs/mqar_long.py:8192` | 8,192 | d_model 512, 8 x 64, bfloat16 | 8 | "
          "last 40 of 80 | 51.2 (pallas) | 20 (chunked) | OOM | not run | not run | 2.56x |"
          in text), text
  assert "zoology" not in text            # a setting without rows has no line
  assert train_speed.block(str(tmp_path / "none.jsonl")).startswith("Not run yet: `python "
                                                                     "experiments/bench_train")


def test_train_speed_plan_names_each_run_and_refuses_unknown_names():
  runs = train_speed.plan()
  assert len(runs) == len(train_speed.SETTINGS) * len(train_speed.COLUMNS) == 15
  long = next(r for r in runs if r.name == "long_32768-vla_chunked")
  assert long.config == "configs/mqar_long.py:32768"
  assert {k: long.overrides[k] for k in ("model.mixer", "model.impl", "model.d_model",
                                         "model.dtype", "train.batch_size", "train.eval_every",
                                         "train.checkpoint_every")} == {
      "model.mixer": "vla", "model.impl": "chunked", "model.d_model": 512,
      "model.dtype": "bfloat16", "train.batch_size": 8, "train.eval_every": 0,
      "train.checkpoint_every": 0}
  assert "model.impl" not in next(r for r in runs if r.name == "long_32768-vla").overrides
  smoke = train_speed.plan(["zoology_512"], ["softmax"], smoke=True)
  assert [(r.config, r.steps, r.overrides["train.log_every"]) for r in smoke] == [
      ("configs/mqar_zoology.py:64", 4, 2)]
  assert train_speed.ran_impl(smoke[0], "", "cpu") == "xla"   # softmax: its attention on the CPU
  with pytest.raises(ValueError, match="columns must be among vla, vla_chunked"):
    train_speed.plan(columns=["vla_pallas"])
  assert 200 < train_speed.estimate_s(runs) < 300     # about 4-5 minutes of one H100


# -- BENCHMARKS.md against the committed rows -----------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[3]
BENCH, PLOTS = "results/bench", "results/plots"
PROFILE = "results/bench/decisions/profile_h100.json"
MODEL = "results/bench/model/model_h100.jsonl"
BASELINES = ("results/bench/baselines/h100_delta.jsonl",
             "results/bench/baselines/h100_gated.jsonl")
TRAIN_SPEED = "results/bench/train_speed/train_speed.jsonl"


@pytest.fixture(scope="module")
def committed():
  """(headers, rows, Data, profile) of the committed files."""
  headers, rows_ = report.load(report.bench_files(str(ROOT / BENCH)))
  return headers, rows_, report.Data(rows_), report.load_profile(str(ROOT / PROFILE))


def test_regenerating_the_blocks_leaves_benchmarks_md_unchanged(committed):
  headers, rows_, _, profile = committed
  out = ROOT / "BENCHMARKS.md"
  text = out.read_text()
  plots = [str(ROOT / PLOTS / name) for name in report.PLOT_NAMES]
  blocks = report.blocks(headers, rows_, plots, str(out),
                         report.regenerate_command(BENCH, "BENCHMARKS.md", PLOTS, PROFILE),
                         profile, PROFILE,
                         {"baselines": baseline_report.blocks(
                             [model_report.load(str(ROOT / path)) for path in BASELINES]),
                          "model": model_report.block(*model_report.load(str(ROOT / MODEL))),
                          "train_speed": train_speed.block(str(ROOT / TRAIN_SPEED))})
  assert markers.block_names(text) == list(blocks)
  assert markers.replace_blocks(text, blocks) == text


def _ratios(data, d, num, den, passes=report.PASSES):
  return [r for p in passes for _, r in report.ratio_series(data, d, p, num, den)]


# Each claim: a predicate on (data, profile) for one sentence of BENCHMARKS.md's findings.

def slower_than_fla_at_every_length(data, profile):
  """Verdict: 'slower than fla's chunk_delta_rule at every length measured: 1.5-2.2x forward +
  backward and 1.9-2.8x forward at head dim 64, 2.5-3.3x and 2.9-3.8x at 128'."""
  return all((r := _ratios(data, d, report.PALLAS, report.FLA, (p,))) and lo <= min(r)
             and max(r) <= hi
             for d, p, lo, hi in ((64, "fwd+bwd", 1.5, 2.25), (64, "fwd", 1.9, 2.85),
                                  (128, "fwd+bwd", 2.5, 3.35), (128, "fwd", 2.85, 3.8)))


def crosses_cudnn_past_10k_to_22k(data, profile):
  """Verdict and crossover: 'beats cuDNN causal attention only past roughly 10k-15k tokens at
  d = 64 and 17k-22k at d = 128'."""
  return all(kind == "at" and lo <= T <= hi
             for d, lo, hi in ((64, 10000, 16000), (128, 16500, 22000)) for p in report.PASSES
             for kind, T in [report.crossover(report.ratio_series(data, d, p, report.PALLAS,
                                                                  report.CUDNN))])


def a_tenth_of_cudnn_at_131k(data, profile):
  """Crossover: 'at 131,072 tokens VLA pallas needs 9-15% of cuDNN's time'."""
  r = [dict(report.ratio_series(data, d, p, report.PALLAS, report.CUDNN))[131072]
       for d, p in report.pairs(data)]
  return 0.085 <= min(r) and max(r) <= 0.155


def fla_gap_smallest_at_the_longest_length(data, profile):
  """fla: 'The gap narrows as T grows and is smallest at ... 131,072 tokens, in every row'."""
  return all(min(s, key=lambda tr: tr[1])[0] == max(T for T, _ in s) == 131072
             for d, p in report.pairs(data)
             for s in [report.ratio_series(data, d, p, report.PALLAS, report.FLA)])


def floor_distance_9_to_27_closer_at_128(data, profile):
  """Verdict and floor: '9-27x its hardware floor', 'closer at d = 128 than at d = 64'."""
  x = {d: [v for p in report.PASSES for _, v in report.floor_series(data, d, p)]
       for d in (64, 128)}
  return (9 <= min(x[128]) and max(x[64]) <= 27.5 and max(x[128]) < min(x[64]))


def fla_as_far_from_its_floor(data, profile):
  """Verdict and field: 'fla ... at 13-21x its own'; 'fla's forward crosses cuDNN near
  4k-5k tokens at both head dims'."""
  T = report.field_T(data, report.fixed_tokens(data))
  fla = [ms / fl for d, p in report.pairs(data, report.FLA)
         for ms, fl in [report.fla_floor(data, d, p, T)]]
  cross = [report.crossover(report.ratio_series(data, d, "fwd", report.FLA, report.CUDNN))
           for d in (64, 128)]
  return (12.5 <= min(fla) and max(fla) <= 21.5
          and all(kind == "at" and 4000 <= T_ <= 5000 for kind, T_ in cross))


def forward_time_flat_in_T(data, profile):
  """Time: 'forward time hardly depends on T (under 1.4x from 1k to 32k), like fla's and unlike
  attention's'."""
  tokens = report.fixed_tokens(data)
  grow = {lab: [g[3] / g[2] for d in data.dims for g in [report.growth(data, d, lab, tokens)]]
          for lab in (report.PALLAS, report.FLA, report.CUDNN)}
  return max(grow[report.PALLAS]) < 1.4 and max(grow[report.FLA]) < 1.6 and min(
      grow[report.CUDNN]) > 10


def backward_costs_fewer_forwards(data, profile):
  """Time: 'Its forward + backward costs fewer forwards than fla's and cuDNN's at every length
  and head dim but d = 128, T = 4k (3.88 against fla's 3.87)'."""
  fewer = {(d, T): dict(report.backward_ratios(data, d, report.PALLAS))[T]
           < min(dict(report.backward_ratios(data, d, lab))[T] for lab in (report.FLA,
                                                                          report.CUDNN))
           for d in data.dims for T, _ in report.backward_ratios(data, d, report.PALLAS)}
  return [k for k, v in fewer.items() if not v] == [(128, 4096)]


def penalty_scan_leads_the_forward(data, profile):
  """Profile: 'The penalty scan is the forward's largest kernel, except at d = 64 with B = 1,
  where the state chain ... takes longer'."""
  def largest(r):
    return report.kernel_name(max(r["kernels"], key=lambda k: k["ms"])["name"])
  fwd = [r for r in profile["rows"] if r["call"] == "forward"]
  return all(largest(r) == ("vla_state_chain" if (r["d"], r["B"]) == (64, 1)
                            else "vla_penalty_scan") for r in fwd)


def three_kernels_dominate_the_d128_gradient(data, profile):
  """Profile: 'At d = 128 three kernels of the gradient ... take half of its busy time'."""
  three = ("vla_state_local_vjp", "vla_penalty_scan", "vla_adjoint_du")
  shares = [sum(k["ms"] for k in r["kernels"] if report.kernel_name(k["name"]) in three)
            / r["busy_ms"]
            for r in profile["rows"] if r["call"] == "gradient" and r["d"] == 128]
  return shares and 0.45 <= min(shares) and max(shares) <= 0.6


def fastest_rows_per_dim(data, profile):
  """d = 64 and d = 128: 'cuDNN is the fastest row up to 4k tokens and fla from 8k on, in both
  passes; VLA pallas is never the fastest and comes second from 16k tokens in both passes'; at
  d = 128 second 'only from 32k tokens in both passes'."""
  second_from = {(64, "fwd"): 16384, (64, "fwd+bwd"): 16384, (128, "fwd"): 32768,
                 (128, "fwd+bwd"): 32768}
  for (d, p), T2 in second_from.items():
    body = report.fastest_summary(data, d, p)
    Ts = [int(line[0].replace(",", "")) for line in body]
    if [line[1] for line in body] != [report.CUDNN if T <= 4096 else report.FLA for T in Ts]:
      return False
    if [line[4] for line in body] != ["2 of 3" if T >= T2 else "3 of 3" for T in Ts]:
      return False
  return True


def memory_above_fla_and_cudnn(data, profile):
  """Memory: '1.3-1.9x fla's and 3.0-3.6x cuDNN's; its largest peak, the d = 128 gradient at
  131,072 tokens, is about 18 GB'."""
  ratios = {report.FLA: [], report.CUDNN: []}
  peaks = []
  for d, p in report.pairs(data):
    for T in data.Ts:
      mine = data.get(d, p, report.PALLAS, T)
      peaks.append((mine["peak_mib"], d, p, T))
      for lab in ratios:
        ratios[lab].append(mine["peak_mib"] / data.get(d, p, lab, T)["peak_mib"])
  top = max(peaks)
  return (1.3 <= min(ratios[report.FLA]) and max(ratios[report.FLA]) <= 1.9
          and 3.0 <= min(ratios[report.CUDNN]) and max(ratios[report.CUDNN]) <= 3.65
          and top[1:] == (128, "fwd+bwd", 131072) and 17 <= top[0] * 2 ** 20 / 1e9 <= 19.5)


def checks_hold_their_bounds(data, profile):
  """Verdict and correctness: 'Every check row holds its bounds. bf16 errs by about 1e-2 (du up
  to 0.13 ...), float32 at DEFAULT by about 1e-3, HIGH and HIGHEST by about 1e-6 in VLA's
  forward (linear attention's unnormalised state S 6e-6 at T = 131,072); the row closest to its
  bound is VLA's at HIGHEST and T = 131,072'."""
  checks = [r for r in data.rows if r.get("pass") == "check"]
  def worst(pred, names):
    return max(v for r in checks if pred(r) for k, v in r["errors"].items()
               if k in names and v is not None)
  fwd = report.FORWARD_ERRORS
  closest = max(checks, key=lambda r: report.worst_to_bound(r)[0])
  return (checks and all(r["status"] == "ok" for r in checks)
          and 3e-3 <= worst(lambda r: r["dtype"] == "bfloat16", fwd) <= 3e-2
          and worst(lambda r: r["dtype"] == "bfloat16", ("du",)) <= 0.13
          and 3e-4 <= worst(lambda r: r["precision"] == "DEFAULT"
                            and r["dtype"] == "float32", fwd + ("du",)) <= 3e-3
          and worst(lambda r: r["op"] == "vla" and r["precision"] in ("HIGH", "HIGHEST"),
                    fwd) <= 3e-6
          and worst(lambda r: r["precision"] in ("HIGH", "HIGHEST"), fwd) <= 1e-5
          and (closest["op"], closest["precision"], closest["T"]) == ("vla", "HIGHEST", 131072))


def one_run_per_head_dim(data, profile):
  """Rows and method: 'Each head dim's timings come from one run'."""
  return all(len({r["_file"] for r in data.timed if r["d"] == d and r["status"] == "ok"}) == 1
             for d in data.dims)


CLAIMS = {f.__name__: f for f in (
    slower_than_fla_at_every_length, crosses_cudnn_past_10k_to_22k, a_tenth_of_cudnn_at_131k,
    fla_gap_smallest_at_the_longest_length, floor_distance_9_to_27_closer_at_128,
    fla_as_far_from_its_floor, forward_time_flat_in_T, backward_costs_fewer_forwards,
    penalty_scan_leads_the_forward, three_kernels_dominate_the_d128_gradient,
    fastest_rows_per_dim, memory_above_fla_and_cudnn, checks_hold_their_bounds,
    one_run_per_head_dim)}


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_claim_holds_on_the_committed_rows(committed, claim):
  _, _, data, profile = committed
  assert CLAIMS[claim](data, profile), CLAIMS[claim].__doc__


def test_a_claim_fails_when_its_rows_change(committed):
  """The predicates read the rows: a faster VLA pallas row at d = 64 breaks the fla and
  fastest-row claims; a failing check row breaks the correctness claim."""
  _, rows_, _, profile = committed
  changed = [dict(r, ms=r["ms"] / 3) if (r.get("impl"), r.get("d"), r.get("T")) == (
      "pallas", 64, 4096) and r.get("ms") else dict(r) for r in rows_]
  data = report.Data(changed)
  assert not slower_than_fla_at_every_length(data, profile)
  assert not fastest_rows_per_dim(data, profile)
  failed = [dict(r, status="fail") if r.get("pass") == "check" else r for r in rows_]
  assert not checks_hold_their_bounds(report.Data(failed), profile)


# -- The whole-model block: each claim of its finding holds on the committed rows ---------------

@pytest.mark.parametrize("claim", model_report.CLAIMS, ids=lambda c: c.__name__)
def test_the_whole_model_claims_hold(claim):
  assert claim(model_report.load(str(ROOT / MODEL))[1]), claim.__doc__


def test_the_whole_model_claims_can_fail():
  """A VLA step made twice as slow at 32k breaks the speed claims."""
  rows_ = model_report.load(str(ROOT / MODEL))[1]
  slow = [dict(r, ms=2 * r["ms"]) if (r["kind"], r["mixer"], r["T"]) == ("step", "vla", 32768)
          else r for r in rows_]
  assert not model_report.vla_step_flat_in_T(slow)
  assert not model_report.vla_behind_softmax_to_8k_ahead_at_32k(slow)
  assert not model_report.vla_within_1_5x_of_fla_gated_deltanet(slow)
  assert not model_report.vla_between_deltanet_and_gated_deltanet(slow)
  assert not model_report.layer_is_two_thirds_of_the_step(slow)


# -- The training-speed block: each claim of its finding holds on the committed rows -------------

@pytest.mark.parametrize("claim", train_speed.CLAIMS, ids=lambda c: c.__name__)
def test_the_training_speed_claims_hold(claim):
  assert claim(train_speed.load(str(ROOT / TRAIN_SPEED))[1]), claim.__doc__


def test_the_training_speed_claims_can_fail():
  """VLA's runs made twice as fast, or DeltaNet's at 8k halved, break the claims."""
  rows_ = train_speed.load(str(ROOT / TRAIN_SPEED))[1]
  fast = [dict(r, steps_per_s=2 * r["steps_per_s"]) if r.get("column") == "vla" else r
          for r in rows_]
  assert not train_speed.auto_runs_the_kernels_and_pays(fast)
  assert not train_speed.softmax_ahead_to_8k_vla_ahead_at_32k(fast)
  slow = [dict(r, steps_per_s=r["steps_per_s"] / 2)
          if (r.get("setting"), r.get("column")) == ("long_8192", "deltanet") else r
          for r in rows_]
  assert not train_speed.deltanet_faster_gated_deltanet_slower(slow)
  chunked = [dict(r, impl="chunked") if r.get("column") == "vla" else r for r in rows_]
  assert not train_speed.auto_runs_the_kernels_and_pays(chunked)
