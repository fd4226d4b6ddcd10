"""Stragglers: is one data-parallel rank slower than the others, beyond the run's own noise?

In synchronous data parallelism every rank waits for the slowest at the gradient all-reduce, so one slow rank
sets everyone's step time. `straggler_table` compares each rank's own step times (the work before the
all-reduce) and calls a straggler only when the gap between ranks exceeds how much a rank's typical step wanders.

Example:
    >>> from mshelpers.stragglers import straggler_table
    >>> straggler_table({0: [1.0, 1.02, 0.98], 1: [1.5, 1.49, 1.52]})["verdict"]
    'straggler'

Copied alone it needs the standard library.
"""
from __future__ import annotations

import statistics
from typing import Sequence


# ----------------------------------------------------------------------------- the straggler table
def straggler_table(times_by_rank: dict[int, Sequence[float]], *, rel_floor: float = 0.02) -> dict:
    """Per-rank step-time table and a straggler verdict ("long tail") from each rank's own step times.

    times_by_rank: {rank: [seconds per step, ...]}, at least 2 ranks with at least 2 steps each;
    use the time of each rank's own work (e.g. forward + backward before the gradient all-reduce):
    in synchronous data parallelism the whole step of every rank follows the slowest one.
    Rows: rank, steps, median, p90, max, and the interquartile range (IQR, q3 - q1; quantiles by
    nearest rank). The ratio is slowest median / fastest median. The noise is the run's own: the
    largest relative IQR (IQR / median) of any rank, at least `rel_floor`. The IQR, unlike p90 or
    max, is not moved by a few spikes (a busy neighbour for a moment), so it measures how far a
    rank's typical step wanders. Verdict "straggler" when ratio - 1 exceeds the noise, else "balanced".

        >>> t = straggler_table({0: [1.0, 1.0, 1.1, 0.9, 3.0], 1: [2.0, 2.0, 2.1, 1.9, 2.0]})
        >>> t["slowest"], round(t["ratio"], 2), round(t["noise"], 2), t["verdict"]
        (1, 2.0, 0.1, 'straggler')

    Taught in notebooks/08_profiling.ipynb.
    """
    if not isinstance(times_by_rank, dict) or len(times_by_rank) < 2:
        raise ValueError(f"straggler_table: need {{rank: step times}} for at least 2 ranks, got "
                         f"{type(times_by_rank).__name__} with {len(times_by_rank) if hasattr(times_by_rank, '__len__') else 0}; "
                         "fix: pass one list of step times per rank")
    rows = []
    for rank in sorted(times_by_rank):
        xs = [float(x) for x in times_by_rank[rank]]
        if len(xs) < 2 or any(not x > 0 for x in xs):
            raise ValueError(f"straggler_table: rank {rank} has {len(xs)} step times (need >= 2, all > 0); "
                             "fix: time more steps, drop the compile step")
        med = statistics.median(xs)
        rows.append({"rank": rank, "steps": len(xs), "median_s": med, "p90_s": _p90(xs), "max_s": max(xs),
                     "iqr_s": _quartile(xs, 3) - _quartile(xs, 1)})
    slow = max(rows, key=lambda r: r["median_s"])
    fast = min(rows, key=lambda r: r["median_s"])
    ratio = slow["median_s"] / fast["median_s"]
    noise = max(max(r["iqr_s"] / r["median_s"] for r in rows), rel_floor)
    return {"rows": rows, "slowest": slow["rank"], "fastest": fast["rank"], "ratio": ratio, "noise": noise,
            "verdict": "straggler" if ratio - 1 > noise else "balanced"}


# ----------------------------------------------------------------------------- internals
def _p90(xs: Sequence[float]) -> float:
    """Nearest-rank 90th percentile: the smallest value with at least 90 % of the values at or below it."""
    s = sorted(xs)
    return s[max(0, -(-9 * len(s) // 10) - 1)]


def _quartile(xs: Sequence[float], q: int) -> float:
    """Nearest-rank quartile q (1 or 3): the ceil(n/4)-th smallest or largest value."""
    s, k = sorted(xs), -(-len(xs) // 4)
    return s[k - 1] if q == 1 else s[len(s) - k]
