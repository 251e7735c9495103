"""BENCHMARKS.md's baseline-kernel block: DeltaNet and Gated DeltaNet on the library's Pallas
kernels (`vla_jax.kernels.delta_rule`) beside fla's `chunk_delta_rule` /
`chunk_gated_delta_rule` and VLA's kernel, all measured in one `experiments/bench.py` run
(results/bench/baselines/), as a table of milliseconds and ratios to fla's kernel for the
same recurrence (the file read by `model_report.load`)."""

from lab.benchmarks.report import fmt, table

# (row label, op, impl) in table order; the ratio column divides by fla's kernel of `op`
# (VLA against fla's DeltaNet, the delta rule it generalises).
ROWS = (("DeltaNet, Pallas", "deltanet", "pallas"),
        ("DeltaNet, fla", "deltanet", "fla_chunk_delta_rule"),
        ("Gated DeltaNet, Pallas", "gated_deltanet", "pallas"),
        ("Gated DeltaNet, fla", "gated_deltanet", "fla_chunk_gated_delta_rule"),
        ("VLA, Pallas", "vla", "pallas"))
FLA = {"deltanet": "fla_chunk_delta_rule", "gated_deltanet": "fla_chunk_gated_delta_rule",
       "vla": "fla_chunk_delta_rule"}
FLA_OP = {"vla": "deltanet"}


def _ms(rows, op, impl, d, pass_, T):
  for r in rows:
    if (r.get("op"), r.get("impl"), r.get("d"), r.get("pass"), r.get("T")) == (
        op, impl, d, pass_, T) and r.get("status") == "ok":
      return r["ms"]
  return None


def block(header, rows):
  """The markdown of one run's table: per head dim, pass and T, each row's ms and its ratio
  to fla's kernel for the same recurrence ("not run" where the run skipped it; a row the run
  never timed is left out), then the notes fla's rows carry."""
  Ts = sorted({r["T"] for r in rows if r.get("T")})
  dims = sorted({r["d"] for r in rows if r.get("d")})
  timed = {(r.get("op"), r.get("impl")) for r in rows if r.get("status") == "ok"}
  body = []
  for d in dims:
    for pass_ in ("fwd", "fwd+bwd"):
      for T in Ts:
        for label, op, impl in ROWS:
          if (op, impl) not in timed:
            continue
          ms = _ms(rows, op, impl, d, pass_, T)
          ref = _ms(rows, FLA_OP.get(op, op), FLA[op], d, pass_, T)
          ratio = fmt(ms / ref, 3) + "x" if ms and ref and impl == "pallas" else "-"
          body.append([d, pass_, f"{T:,}", label, fmt(ms) if ms else "not run", ratio])
  settings = header.get("settings") or {}
  run = header.get("note") or "one `experiments/bench.py` run"
  return (f"{header.get('device', '?')}, {run} "
          f"({header.get('time', '?')[:16]} UTC): H = {settings.get('H', 16)}, bfloat16, "
          "B * T = 32,768 (B = 1 beyond), medians after warm-up. Ratio = the Pallas row's "
          "time / fla's kernel for the same recurrence (VLA: / fla's DeltaNet); above 1 the "
          "library's kernel is slower.\n\n"
          + table(["d", "pass", "T", "row", "ms", "/ fla"], body)
          + "".join(f"\n\n{note}." for note in sorted(
              {r["note"] for r in rows if r.get("status") == "ok" and r.get("note")
               and r.get("impl", "").startswith("fla")})))


def blocks(runs):
  """The block of several runs ((header, rows) pairs), one table each, in the order given."""
  return "\n\n".join(block(header, rows) for header, rows in runs)
