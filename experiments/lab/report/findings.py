"""The claims of RESULTS.md's hand-written findings, each a predicate on the rows.

Each claim is a function of `results_md.Results` that returns True while the rows support the
sentence it names; tests/lab/report/test_findings.py checks every claim on the committed rows,
so a finding the rows stop supporting fails a test (then rewrite the finding and its claim).
"""

from lab.grid import PAPER_N, TUNED_STEPS
from lab.report import memory, mqar, seeds
from lab.report.zoology import STEPS, settings_run

SOLVED = mqar.SOLVED   # a cell "reaches" the task at this mean test accuracy


def _mean(summary, key):
  c = summary.get(key)
  return None if c is None else float(c["test"].mean())


def _solved(summary, key):
  m = _mean(summary, key)
  return m is not None and m >= SOLVED


def _random_norm(res, mixer, t):
  return next(r[mixer] for r in res.kinds["state_norm_random"] if r["t"] == t)


def _trained_growth(res, mixer):
  """Largest-layer median ||S_t|| at the longest T over the same at t = 1,000."""
  norms = res.kinds["trained_state_norm"]
  T = max(r["T"] for r in norms)
  at = memory.trained_norm_at(norms, mixer, T)
  return at[T] / at[1000]


# -- 1, 2: the memory -----------------------------------------------------------------------------

def linear_memory_grows_on_random_inputs(res):
  """Linear attention's ||S|| grows over 5x from t = 1,000 to 65,536 on random inputs."""
  return _random_norm(res, "linear_attention", 65536) > 5 * _random_norm(res,
                                                                         "linear_attention", 1000)


def delta_memories_flat_on_random_inputs(res):
  """DeltaNet's, GDN's and VLA-a's ||S|| stay within 10% from t = 1,000 to 65,536."""
  return all(abs(_random_norm(res, m, 65536) / _random_norm(res, m, 1000) - 1) < 0.1
             for m in ("deltanet", "gated_deltanet", "vla"))


def trained_vla_memory_grows_in_part(res):
  """Inside trained models VLA-a's memory grows 2x to 10x from t = 1,000 to the longest T,
  DeltaNet's under 1.5x and linear attention's over 10x."""
  return (2 < _trained_growth(res, "vla") < 10 and _trained_growth(res, "deltanet") < 1.5
          and _trained_growth(res, "linear") > 10)


def jacobian_norm_above_one(res):
  """VLA's state Jacobian has norm above 1 for at least 99.9% of the tokens of every set."""
  every = (res.kinds["jacobian_random"] + res.kinds["trained"] + res.kinds["trained_jacobian"])
  return min(r["frac_above_1"] for r in every) >= 0.999 and min(r["max"] for r in every) > 1


def jacobian_grows_in_trained_model(res):
  """In trained models the per-token norm reaches over 1.3 and a product over a span over 2;
  on random inputs the per-token norm stays under 1.01."""
  trained = res.kinds["trained_jacobian"]
  spans = [v for r in trained for k, v in r.items() if k.startswith("product_span_")
           and k.endswith("_max")]
  return (max(r["max"] for r in trained) > 1.3 and max(spans) > 2
          and res.kinds["jacobian_random"][0]["max"] < 1.01)


# -- 3, 4: capacity and long context -------------------------------------------------------------

def capacity_solved_by_vla_deltanet_linear_softmax_conv(res):
  """VLA, DeltaNet, linear and softmax+conv reach 0.99 at every n of the capacity grid."""
  return all(_solved(res.capacity, (m, n)) for m in ("vla_p1", "deltanet", "linear",
                                                      "softmax_conv") for n in PAPER_N)


def capacity_boundary_solved(res):
  """At n = d_h = 32 VLA, VLA-a, DeltaNet and linear reach 0.99 (the seed reports 62%)."""
  return all(_solved(res.capacity, (m, 32)) for m in ("vla_p1", "vla", "deltanet", "linear"))


def vla_a_splits_seeds_at_small_n(res):
  """VLA-a has a seed below 0.5 at n = 8 and at n = 12, VLA none at any n."""
  low = lambda m, n: bool((res.capacity[(m, n)]["test"] < 0.5).any())
  return (low("vla", 8) and low("vla", 12)
          and not any(low("vla_p1", n) for n in PAPER_N if ("vla_p1", n) in res.capacity))


def softmax_fails_capacity(res):
  """Plain softmax attention stays below 0.99 at every n, below 0.2 from n = 8 on."""
  return (all(not _solved(res.capacity, ("softmax", n)) for n in PAPER_N)
          and all(_mean(res.capacity, ("softmax", n)) < 0.2 for n in PAPER_N if n >= 8))


def long_context_solved_to_2048(res):
  """Every mixer reaches 0.99 at every T up to 2,048."""
  return all(_mean(res.long, k) >= SOLVED for k in res.long if k[1] <= 2048)


def long_context_vla_a_fails_at_4096(res):
  """At T = 4,096 VLA-a is below 0.5 with two of three seeds under 0.5; VLA, DeltaNet and GDN
  reach 0.99; DeltaNet at every T."""
  c = res.long[("vla", 4096)]["test"]
  return (c.mean() < 0.5 and (c < 0.5).sum() == 2
          and all(_solved(res.long, (m, 4096)) for m in ("vla_p1", "deltanet", "gated_deltanet"))
          and all(_solved(res.long, k) for k in res.long if k[0] == "deltanet"))


# -- 5: zoology ------------------------------------------------------------------------------------

def _zoology_count(res, m):
  return sum(_solved(res.zoology, (m, st)) for st in settings_run(res.zoology))


def zoology_counts(res):
  """Settings of 12 at 0.99 (4,000 steps): softmax+conv 12, softmax and DeltaNet 10, VLA,
  linear and GDN 9, VLA-a 8."""
  want = {"softmax_conv": 12, "softmax": 10, "deltanet": 10, "vla_p1": 9, "linear": 9,
          "gated_deltanet": 9, "vla": 8}
  return (len(settings_run(res.zoology)) == 12
          and all(_zoology_count(res, m) == n for m, n in want.items()))


def zoology_up_to_256(res):
  """Up to T = 256 DeltaNet, GDN, GDN-slow and VLA reach 0.99 at every width, linear and VLA-a
  do not."""
  up = [st for st in settings_run(res.zoology) if st[0] <= 256]
  every = lambda m: all(_solved(res.zoology, (m, st)) for st in up)
  return (all(every(m) for m in ("deltanet", "gated_deltanet", "gated_deltanet_slow", "vla_p1"))
          and not every("linear") and not every("vla"))


def zoology_t512(res):
  """At T = 512 softmax and softmax+conv reach 0.99 at every width and no recurrent mixer does;
  VLA is above DeltaNet at d_model 64 and below at 256, with a seed below 0.1 there; GDN stays
  below 0.5 at every width."""
  widths = [d for T, d in settings_run(res.zoology) if T == 512]
  z = lambda m, d: _mean(res.zoology, (m, (512, d)))
  recurrent = ("linear", "deltanet", "gated_deltanet", "gated_deltanet_slow", "vla", "vla_p1")
  return (all(_solved(res.zoology, (m, (512, d))) for m in ("softmax", "softmax_conv")
              for d in widths)
          and all(any(z(m, d) is not None and z(m, d) < SOLVED for d in widths)
                  for m in recurrent)
          and z("vla_p1", 64) > z("deltanet", 64) and z("vla_p1", 256) < z("deltanet", 256)
          and res.zoology[("vla_p1", (512, 256))]["test"].min() < 0.1
          and all(z("gated_deltanet", d) < 0.5 for d in widths))


def zoology_longer_training_lifts_vla(res):
  """At T = 512, d_model 64, VLA's 12,000-step cell is above its 4,000-step cell and below
  0.99."""
  after = _mean(res.zoology_long, ("vla_p1", (512, 64)))
  return (after is not None and after > _mean(res.zoology, ("vla_p1", (512, 64)))
          and after < SOLVED)


# -- 6: copy ---------------------------------------------------------------------------------------

def _exact(res, m, L):
  return float(res.copy[m]["scores"][(L, "generated_exact_match")].mean())


def copy_beyond_training_length_only_softmax_conv(res):
  """Only softmax+conv copies whole strings at L = 128 and 256."""
  return all((_exact(res, m, L) > 0) == (m == "softmax_conv") for m in res.copy
             for L in (128, 256))


def copy_vla_best_recurrent(res):
  """At L = 64 VLA has the most exact copies of the recurrent mixers, VLA-a fewer than
  DeltaNet."""
  recurrent = [m for m in res.copy if not m.startswith("softmax")]
  return (max(recurrent, key=lambda m: _exact(res, m, 64)) == "vla_p1"
          and _exact(res, "vla", 64) < _exact(res, "deltanet", 64))


# -- 7: VLA's settings -----------------------------------------------------------------------------

def ablation_n24(res):
  """At n = 24, rate 0.003, every variant but no-conv has every seed at 0.99 (penalty-0
  included); no-conv every seed below 0.1."""
  rows = [r for r in res.rows["ablation"] if r["learning_rate"] == 3e-3]
  acc = lambda v: [mqar.accuracy(r) for r in rows if r["variant"] == v]
  variants = {r["variant"] for r in rows}
  return ("penalty-0" in variants
          and all(min(acc(v)) >= SOLVED for v in variants if v != "no-conv")
          and max(acc("no-conv")) < 0.1)


def ablation_demo_only_penalty_one_solves(res):
  """On the CPU demo, penalty-1 is the only variant with every seed at 0.99."""
  demo = res.rows["ablation_demo"]
  every = {v for v in {r["variant"] for r in demo}
           if all(mqar.accuracy(r) >= SOLVED for r in demo if r["variant"] == v)}
  return every == {"penalty-1"}


# -- 8: decoding -----------------------------------------------------------------------------------

def decode_flat_and_softmax_grows(res):
  """VLA's time per token varies under 5% over every context and its state not at all;
  softmax attention's time at the longest context is 5x to 7x VLA's."""
  at = {(r["mixer"], r["context"]): r for r in res.rows["decode"]}
  vla = [r for r in res.rows["decode"] if r["mixer"] == "vla"]
  ms = [r["ms_per_token"] for r in vla]
  last = max(r["context"] for r in vla)
  ratio = at[("softmax", last)]["ms_per_token"] / at[("vla", last)]["ms_per_token"]
  return (max(ms) / min(ms) < 1.05 and len({r["cache_mib_per_seq"] for r in vla}) == 1
          and 5 < ratio < 7)


# -- 9: failing seeds ------------------------------------------------------------------------------

def _failed_over_cells(res, variant):
  return sum(len(seeds.failed(t[variant])) for t in res.remedies.values())


def penalty_one_fails_fewer_seeds(res):
  """Over both remedy cells VLA-a fails 7 of 10 seeds and penalty scale 1 4 of 10, fewer at
  each cell."""
  cells = list(res.remedies.values())
  return (len(cells) == 2 and _failed_over_cells(res, "defaults") == 7
          and _failed_over_cells(res, "penalty-1") == 4
          and all(len(seeds.failed(t["penalty-1"])) < len(seeds.failed(t["defaults"]))
                  for t in cells))


def failed_seeds_stay_on_plateau(res):
  """Most failed runs (over 80%) never leave the plateau."""
  lost = [r for t in res.remedies.values() for table in t.values() for r in seeds.failed(table)]
  return sum(r["escape"] is None for r in lost) > 0.8 * len(lost)


def w_u_gradient_larger_with_penalty_one(res):
  """Layer 0's W_u gets over 10x more gradient at the first logged step with penalty scale 1
  than with VLA-a, at every cell."""
  grads = seeds.w_u_gradients(res.remedies, sorted(res.remedies))
  return bool(grads) and all(g_p > 10 * g_d for _, _, g_d, g_p in grads)


def no_other_remedy_beats_defaults_everywhere(res):
  """No variant but penalty-1 fails fewer seeds than the defaults at both cells."""
  cells = list(res.remedies.values())
  others = [v for v, _ in seeds.REMEDY_VARIANTS if v not in ("defaults", "penalty-1")]
  return not any(all(len(seeds.failed(t[v])) < len(seeds.failed(t["defaults"])) for t in cells)
                 for v in others)


def rate_001_solves_every_seed(res):
  """At rate 0.01 (T = 64, d_model 64) every seed of VLA-a and of VLA solves."""
  runs = [r for t in res.lr.values() for r in t if r["rate"] == 0.01]
  return len(res.lr) == 2 and bool(runs) and not seeds.failed(runs)


# -- the answer's pending work ---------------------------------------------------------------------

def pending_counts(res):
  """20 of the 24 12,000-step zoology cells and one 4,000-step cell (GDN-slow, T = 512,
  d_model 256) are pending."""
  short = [(m, st) for m, st, s in res.pending if s == STEPS]
  waiting = sum(1 for _, _, s in res.pending if s == TUNED_STEPS)
  planned = {(m, st) for m, st, s in res.pending if s == TUNED_STEPS} | set(res.zoology_long)
  return short == [("gated_deltanet_slow", (512, 256))] and (waiting, len(planned)) == (20, 24)


CLAIMS = {f.__name__: f for f in (
    linear_memory_grows_on_random_inputs, delta_memories_flat_on_random_inputs,
    trained_vla_memory_grows_in_part, jacobian_norm_above_one, jacobian_grows_in_trained_model,
    capacity_solved_by_vla_deltanet_linear_softmax_conv, capacity_boundary_solved,
    vla_a_splits_seeds_at_small_n, softmax_fails_capacity, long_context_solved_to_2048,
    long_context_vla_a_fails_at_4096, zoology_counts, zoology_up_to_256, zoology_t512,
    zoology_longer_training_lifts_vla, copy_beyond_training_length_only_softmax_conv,
    copy_vla_best_recurrent, ablation_n24, ablation_demo_only_penalty_one_solves,
    decode_flat_and_softmax_grows, penalty_one_fails_fewer_seeds, failed_seeds_stay_on_plateau,
    w_u_gradient_larger_with_penalty_one, no_other_remedy_beats_defaults_everywhere,
    rate_001_solves_every_seed, pending_counts)}
