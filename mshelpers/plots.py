"""Three pictures the cookbook draws again and again (matplotlib only).

Example (two made-up runs; a real one passes e.g. `{"pynative": hist_a.rows, "graph": hist_b.rows}`):
    >>> from mshelpers.plots import plot_loss
    >>> run_a = [{"step": s, "loss": 3.0 - 0.10 * s} for s in range(10)]
    >>> run_b = [{"step": s, "loss": 3.0 - 0.12 * s} for s in range(10)]
    >>> ax = plot_loss({"pynative": run_a, "graph": run_b}, floor=1.71)
    >>> ax.get_legend_handles_labels()[1]
    ['pynative', 'graph', 'entropy floor 1.710']

Inputs are per-step rows (dicts with "step", "loss", "tokens_per_s", "mfu"), as logged
by `metrics.StepLogger` or read back with `table.read_csv`.
"""
from __future__ import annotations

from typing import Mapping, Sequence


def _ax(ax):
    import matplotlib.pyplot as plt
    return ax if ax is not None else plt.subplots(figsize=(6, 3.5))[1]


def plot_loss(runs: Mapping[str, Sequence[dict]], floor: float | None = None, ax=None):
    """Loss per step for each named run, with the data's entropy floor as a dashed line.
    Taught in notebooks/01_pynative_baseline.ipynb."""
    ax = _ax(ax)
    for name, rows in runs.items():
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=name)
    if floor is not None:
        ax.axhline(floor, ls="--", color="k", lw=1, label=f"entropy floor {floor:.3f}")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title="Health: loss vs the floor")
    ax.legend()
    return ax


def plot_throughput(runs: Mapping[str, Sequence[dict]], skip_first: int = 1, axes=None):
    """Tokens/s and MFU per step (the compile step is skipped: it would flatten the plot).
    Taught in notebooks/01_pynative_baseline.ipynb."""
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, rows in runs.items():
        rows = rows[skip_first:]
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["tokens_per_s"] for r in rows], label=name)
        axes[1].plot(steps, [100 * r["mfu"] for r in rows], label=name)
    axes[0].set(xlabel="step", ylabel="tokens/s", title="Efficiency: throughput")
    axes[1].set(xlabel="step", ylabel="MFU (%)", title="Efficiency: MFU")
    for a in axes:
        a.legend()
    return axes


def plot_comparison(rows: Sequence[dict], metrics: Sequence[str], label: str = "run", axes=None):
    """Side-by-side bars: one panel per metric, one bar per run (each row is a run).
    Taught with the rest of plots.py in notebooks/01_pynative_baseline.ipynb."""
    import matplotlib.pyplot as plt
    if not rows or not metrics:
        raise ValueError("plot_comparison: rows and metrics must be non-empty; fix: pass run rows and metric names")
    missing = [m for m in metrics if m not in rows[0]]
    if missing:
        raise ValueError(f"plot_comparison: metric {missing[0]!r} is not in the rows; fix: use one of {list(rows[0])}")
    if axes is None:
        _, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.2), squeeze=False)
        axes = axes[0]
    names = [str(r[label]) for r in rows]
    for a, m in zip(axes, metrics):
        a.bar(names, [r[m] for r in rows], color=[f"C{i}" for i in range(len(rows))])
        a.set_title(m)
        a.tick_params(axis="x", rotation=30)
    axes[0].figure.tight_layout()
    return axes
