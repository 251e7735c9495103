"""The report's PNG plots (matplotlib, Agg backend; imported when a plot is drawn)."""

import numpy as np

from lab.report.rows import MIXER_ORDER, name, state_floats

# Each label's colour in the zoology plot (labels added later take the next colours, so that
# the others keep theirs).
COLORS = {m: f"C{i}" for i, m in enumerate(
    ("softmax", "softmax_conv", "linear", "deltanet", "gated_deltanet", "vla", "vla_p1",
     "gated_deltanet_slow"))}


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _save(fig, path):
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  _pyplot().close(fig)


def plot_capacity(summary, ns, path):
  """Test accuracy (mean ± std over seeds, chosen rate) against n_pairs, one line per mixer.
  summary: {(label, n_pairs): cell summary}; ns: the x ticks."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for m in MIXER_ORDER:
    pts = sorted((n, s["test"]) for (mm, n), s in summary.items() if mm == m)
    if pts:
      ax.errorbar([p[0] for p in pts], [p[1].mean() for p in pts],
                  yerr=[p[1].std() for p in pts], marker="o", capsize=3, label=name(m))
  ax.set_xscale("log", base=2)
  ax.set_xticks(ns, [str(n) for n in ns])
  ax.set_xlabel("key-value pairs n (T = 3n + 1)")
  ax.set_ylabel("test accuracy (best rate, mean ± std over seeds)")
  ax.set_title("MQAR capacity: 2 layers, d_model 128, 4 heads of d_h 32")
  ax.legend(fontsize=8)
  _save(fig, path)


def plot_zoology(summary, n_pairs, path):
  """Test accuracy against recurrent state size, one panel per T. summary: {(label, (T,
  d_model)): cell summary}; n_pairs: {T: n_pairs} for the panel titles."""
  plt = _pyplot()
  Ts = sorted({st[0] for (_, st) in summary})
  fig, axes = plt.subplots(1, len(Ts), figsize=(4.2 * len(Ts), 3.8), squeeze=False,
                           sharey=True)
  handles = {}
  for ax, T in zip(axes[0], Ts):
    for m in MIXER_ORDER:
      pts = sorted((state_floats(m, st[1], T), s["test"]) for (mm, st), s in summary.items()
                   if mm == m and st[0] == T)
      if pts:
        handles[m] = ax.errorbar([p[0] for p in pts], [p[1].mean() for p in pts],
                                 yerr=[p[1].std() for p in pts], marker="o", capsize=3,
                                 color=COLORS.get(m), label=name(m))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("recurrent state per layer (floats)")
    ax.set_title(f"T = {T}, n_pairs = {n_pairs[T]}")
  axes[0][0].set_ylabel("test accuracy (best rate, mean ± std)")
  axes[0][0].set_ylim(0, 1.05)
  shown = [m for m in MIXER_ORDER if m in handles]
  axes[0][0].legend([handles[m] for m in shown], [name(m) for m in shown], fontsize=7,
                    loc="lower right")
  _save(fig, path)


def plot_trained_norms(rows, path):
  """||S_t|| traces inside trained models at the longest T measured (rows of kind
  trained_state_norm)."""
  plt = _pyplot()
  longest = max((r["T"] for r in rows), default=0)
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for r in rows:
    if r["T"] == longest:
      ax.loglog(r["trace_t"], r["trace_median"], label=f"{r['mixer']} layer {r['layer']}")
  ax.set_xlabel("token t")
  ax.set_ylabel("||S_t||_F (median over sequences, heads)")
  ax.set_title(f"Memory norm inside trained models, MQAR inputs, T = {longest}")
  ax.legend(fontsize=7, ncol=2)
  _save(fig, path)


def plot_state_norms(traces, head_dim, path):
  """||S_t|| on random inputs, one line per mixer. traces: {mixer: [T] median over heads}."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for mixer, trace in traces.items():
    ax.loglog(np.arange(1, len(trace) + 1), trace, label=mixer)
  ax.set_xlabel("token t")
  ax.set_ylabel("||S_t||_F (median over heads)")
  ax.set_title(f"Memory norm, random inputs, d_h = {head_dim}")
  ax.legend()
  _save(fig, path)


def plot_seed_runs(panels, path):
  """Training curves of failed and solved seeds, one row of panels per cell: training loss and
  the gradient norm reaching layer 0's penalty projection W_u, against the step.
  panels: {cell title: {variant name: (steps [n], loss [n, runs], u_grad [n, runs],
  solved [runs])}}; the first variant is drawn solid, the next dashed, then dotted."""
  plt = _pyplot()
  fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.4 * len(panels)), squeeze=False)
  styles = ("-", "--", ":")
  for row, (title, variants) in zip(axes, panels.items()):
    for (variant, (steps, loss, u_grad, solved)), style in zip(variants.items(), styles):
      for i, ok in enumerate(solved):
        kw = dict(color="C0" if ok else "C3", ls=style, lw=1, alpha=0.8)
        row[0].plot(steps, np.asarray(loss)[:, i], **kw)
        row[1].semilogy(steps, np.maximum(np.asarray(u_grad)[:, i], 1e-6), **kw)
      row[0].plot([], [], color="k", ls=style, label=variant)
    row[0].plot([], [], color="C0", label="solved (test >= 0.9)")
    row[0].plot([], [], color="C3", label="failed")
    row[0].set_title(f"{title}: training loss")
    row[1].set_title(f"{title}: |grad W_u| (layer 0)")
    for ax in row:
      ax.set_xlabel("step")
    row[0].legend(fontsize=7)
  _save(fig, path)


def plot_text(entries, curve_data, path):
  """The language-modelling figure (`lab.report.text`'s summary entries and curves), three
  panels: test bits per byte against evaluation length, by position at T, training curves."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for i, e in enumerate(entries):
    style = {"label": e["name"], "color": f"C{i}"}   # one colour a mixer in every panel
    if e["test"]:
      Ls = sorted(e["test"])
      axes[0].plot(Ls, [e["test"][L][0] for L in Ls], "o-", **style)
    if e["by_position"]:
      axes[1].plot(range(1, len(e["by_position"]) + 1), e["by_position"], "o-", **style)
    if e["label"] in curve_data:
      steps, bpb = curve_data[e["label"]][:2]
      axes[2].plot(steps, bpb, **style)
  axes[0].set(xscale="log", xlabel="evaluation length (bytes)", ylabel="test bits per byte",
              title="length extrapolation")
  axes[1].set(xlabel="position bucket (of T, in order)", ylabel="test bits per byte",
              title="by position at T")
  axes[2].set(xlabel="step", ylabel="training loss (bits per byte)", title="training")
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  axes[2].legend(fontsize=8)
  _save(fig, path)


def plot_weights_or_data(summary, steps, solved, path):
  """Two panels: the escape step by initialisation seed (rows) and data seed (columns), failed
  runs crossed; layer 0's key collinearity through training, solved runs blue, failed red.
  summary: `lab.report.studies.weights_or_data_summary`; steps: the runs' training steps (the
  colour scale's top); solved: the test accuracy from which a run is solved."""
  plt = _pyplot()
  grid, inits, datas = summary["grid"], summary["inits"], summary["datas"]
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
  escape = lambda p: grid[p]["escape"] if p in grid and grid[p]["escape"] is not None else None
  z = np.array([[np.nan if escape((i, d)) is None else escape((i, d)) for d in datas]
                for i in inits], np.float64)
  im = ax.imshow(z, cmap="viridis", vmin=0, vmax=steps, origin="upper")
  for a, i in enumerate(inits):
    for b, d in enumerate(datas):
      r = grid.get((i, d))
      if r is None:
        ax.text(b, a, "pending", ha="center", va="center", fontsize=7)
      elif r["accuracy"] < solved:
        ax.text(b, a, "x", ha="center", va="center", color="C3", fontsize=14)
  ax.set_xticks(range(len(datas)), [str(d) for d in datas])
  ax.set_yticks(range(len(inits)), [str(i) for i in inits])
  ax.set_xlabel("data seed")
  ax.set_ylabel("initialisation seed")
  ax.set_title("step leaving the plateau (x: failed)")
  fig.colorbar(im, ax=ax)
  for r in grid.values():
    series = r["probes"].get("layer0.key_cos_mean", [])
    if series:
      ax2.plot([p[0] for p in series], [p[1] for p in series],
               color="C0" if r["accuracy"] >= solved else "C3", lw=1, alpha=0.7)
  ax2.plot([], [], color="C0", label=f"solved (test >= {solved})")
  ax2.plot([], [], color="C3", label="failed")
  ax2.set_xlabel("step")
  ax2.set_ylabel("layer 0 key collinearity (mean |cos|)")
  ax2.legend(fontsize=8)
  _save(fig, path)
