"""Pictures of a profiled window: op types by total time, and one recorded step as a Gantt chart.

Example:
    >>> import matplotlib; matplotlib.use("Agg")
    >>> from mshelpers.profile_plots import plot_op_breakdown
    >>> ax = plot_op_breakdown([{"op_type": "MatMul", "total_ms": 3.0}, {"op_type": "Add", "total_ms": 1.0}])
    >>> [t.get_text() for t in ax.get_yticklabels()]
    ['Add', 'MatMul']

Copied alone it needs matplotlib at call time; `plot_step_timeline` reads the trace with `profiling.py`
(copy it beside this file).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:      # annotations only, never imported at run time: the module still copies alone
    from .profiling import ProfileRun


# ----------------------------------------------------------------------------- op types
def plot_op_breakdown(rows: Sequence[dict], *, top: int = 12, ax: Any = None, title: str | None = None):
    """Horizontal bars of total ms per op type (rows from `op_type_table`); the rest is grouped as 'other'.
    Taught in notebooks/08_profiling.ipynb."""
    if not rows:
        raise ValueError("plot_op_breakdown: rows is empty; fix: pass op_type_table(run)")
    import matplotlib.pyplot as plt
    rows = sorted(rows, key=lambda r: r["total_ms"], reverse=True)
    shown = list(rows[:top])
    rest = sum(r["total_ms"] for r in rows[top:])
    labels = [r["op_type"] for r in shown] + (["other"] if rest > 0 else [])
    values = [r["total_ms"] for r in shown] + ([rest] if rest > 0 else [])
    total = sum(values) or 1.0
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.35 * len(labels) + 1.2))
    ax.barh(labels[::-1], values[::-1], color="tab:blue")
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v / total:.0%}", va="center", fontsize=8)
    ax.set_xlabel("total time in the profiled steps (ms)")
    ax.set_title(title or "Op-type breakdown")
    return ax


# ----------------------------------------------------------------------------- one step's timeline
_TIMELINE_COLORS = {"compute": "tab:blue", "communication": "tab:red", "data": "tab:orange"}


def plot_step_timeline(run: "ProfileRun", *, step: int = 0, ax: Any = None, max_rows: int = 14):
    """One recorded step as a Gantt chart: the data fetch, then each op type on its own row.

    Gaps between bars are host time (framework overhead, Python, launches). Taught in notebooks/08_profiling.ipynb."""
    if __package__:
        from .profiling import COMM_OP_PATTERN, ProfileRun, load_trace, op_events
    else:  # copied beside its siblings as plain files
        from profiling import COMM_OP_PATTERN, ProfileRun, load_trace, op_events
    if not isinstance(run, ProfileRun):
        raise ValueError("plot_step_timeline: run must be the ProfileRun returned by profile_steps")
    if not (isinstance(step, int) and 0 <= step < len(run.step_windows_us)):
        raise ValueError(f"plot_step_timeline: step={step!r} is out of range; fix: pass 0.."
                         f"{len(run.step_windows_us) - 1}")
    import matplotlib.pyplot as plt
    lo, hi = run.step_windows_us[step]
    ops = [e for e in op_events(load_trace(run)) if lo <= e["ts"] < hi]
    by_type: dict[str, list[tuple[float, float]]] = {}
    for e in ops:
        op_type = re.sub(r"-op\d+$", "", e["name"].rsplit("/", 1)[-1])
        by_type.setdefault(op_type, []).append(((e["ts"] - lo) / 1e3, e["dur"] / 1e3))
    order = sorted(by_type, key=lambda t: -sum(d for _, d in by_type[t]))[:max_rows]
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.3 * (len(order) + 2) + 1.2))
    rows = []
    d0, d1 = run.data_windows_us[step]
    if d1 > d0:
        rows.append(("data_fn", [((d0 - lo) / 1e3, (d1 - d0) / 1e3)], _TIMELINE_COLORS["data"]))
    for t in order:
        color = _TIMELINE_COLORS["communication" if COMM_OP_PATTERN.search(t) else "compute"]
        rows.append((t, by_type[t], color))
    for y, (label, bars, color) in enumerate(rows[::-1]):
        ax.broken_barh(bars, (y - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows[::-1]], fontsize=8)
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_xlabel(f"ms since the start of recorded step {step}")
    ax.set_title("One profiled step (white = host/framework time)")
    return ax
