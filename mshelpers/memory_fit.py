"""Training memory, fitted to a measurement: `calibrate` fits measured ≈ overhead + model states + scale ·
activations over several runs of `memory.estimate`, and returns the keywords (activation_scale, overhead_bytes)
that `estimate`, `fits` and `max_batch_for_budget` take.

Pure Python, no sibling imports: the module can be copied alone (it reads the estimates' dicts).
"""
from __future__ import annotations

import numbers


def calibrate(estimates: list[dict], measured_bytes: list[float], *,
              overhead_bytes: float | None = None) -> dict[str, float]:
    """Fit measured ≈ overhead + model states + scale · activations over several runs.

    `estimates` are `estimate(...)` dicts (made with the default scale 1 and no overhead),
    `measured_bytes` the peaks measured for the same configs. Model states are taken as
    exact; a least-squares line through (activations, measured - states) gives the
    activation scale (slope) and the constant overhead (intercept). Pass `overhead_bytes`
    (from an earlier fit) to fit the scale alone, which one run suffices for: e.g. a
    recompute mode whose activations the published count gets wrong. The result is a
    dict of keywords for `estimate`, `fits` and `max_batch_for_budget`.

        >>> es = [{"activations": a, "params": 1, "grads": 1, "optimizer_states": 2} for a in (10, 20, 40)]
        >>> calibrate(es, [4 + 100 + 2 * a for a in (10, 20, 40)])
        {'activation_scale': 2.0, 'overhead_bytes': 100.0}
        >>> calibrate(es[:1], [4 + 100 + 3 * 10], overhead_bytes=100)
        {'activation_scale': 3.0, 'overhead_bytes': 100}

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    need = 1 if overhead_bytes is not None else 2
    if len(estimates) != len(measured_bytes) or len(estimates) < need:
        raise ValueError(f"calibrate: got {len(estimates)} estimates and {len(measured_bytes)} measurements; "
                         f"fix: pass two equally long lists with at least {need} run(s)"
                         + ("" if need == 1 else " of different sizes, or pass overhead_bytes"))
    xs = [float(e["activations"]) for e in estimates]
    ys = [float(m) - (e["params"] + e["grads"] + e["optimizer_states"])   # (an accumulation buffer is in grads)
          for e, m in zip(estimates, measured_bytes)]
    if overhead_bytes is not None:
        if not isinstance(overhead_bytes, numbers.Real) or isinstance(overhead_bytes, bool) or overhead_bytes < 0:
            raise ValueError(f"calibrate: overhead_bytes={overhead_bytes!r} is invalid; fix: pass a number >= 0")
        slope = sum(x * (y - overhead_bytes) for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        if slope <= 0:
            raise ValueError(f"calibrate: the runs sit below overhead_bytes={overhead_bytes!r}; "
                             "fix: pass the overhead fitted on the same kind of runs (same mode and device)")
        return {"activation_scale": round(slope, 4), "overhead_bytes": overhead_bytes}
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("calibrate: all runs have the same activation estimate; "
                         "fix: measure at least two different batch sizes or sequence lengths")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        raise ValueError(f"calibrate: measured peaks do not grow with the activations (slope={slope:.3g}); "
                         "fix: measure over a wider range of batch sizes, each in a fresh process")
    return {"activation_scale": round(slope, 4), "overhead_bytes": round(max(0.0, my - slope * mx), 0)}
