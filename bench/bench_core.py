"""Benchmark: PyNative vs graph mode step time for the mini preset, medians over steady steps.

    python bench/bench_core.py [--steps 12] [--repeats 2]

Each mode runs in a fresh process per repeat; the result is a Markdown table and one row per
mode appended to build/bench/bench_core.csv. Timing claims live here, not in pass/fail tests.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mshelpers.config import RunConfig, build_dir  # noqa: E402
from mshelpers.report import run_summaries  # noqa: E402
from mshelpers.table import append_csv, markdown_table  # noqa: E402
from mshelpers.timing import run_isolated  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for mode in ("pynative", "graph"):
        cfg = RunConfig.preset("mini").replace(mode=mode, name=f"bench-{mode}")
        step_ms, compile_s, peak = [], [], []
        for _ in range(a.repeats):
            res = run_isolated(run_summaries, cfg.to_yaml(), (0,), a.steps, str(build_dir("bench", "runs")))
            s = res.value[0]
            step_ms.append(s["median_step_s"] * 1e3)
            compile_s.append(s["compile_time_s"])
            peak.append(res.peak_rss_mb)
        rows.append({"when": time.strftime("%Y-%m-%d %H:%M"), "mode": mode, "steps": a.steps,
                     "median_step_ms": statistics.median(step_ms), "first_step_s": statistics.median(compile_s),
                     "peak_rss_mb": max(peak)})
    rows[1]["speedup_vs_pynative"] = rows[0]["median_step_ms"] / rows[1]["median_step_ms"]
    rows[0]["speedup_vs_pynative"] = 1.0
    for r in rows:
        append_csv(r, build_dir("bench") / "bench_core.csv")
    print(markdown_table(rows))
