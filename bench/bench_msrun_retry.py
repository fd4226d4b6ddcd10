"""Benchmark: a 2-rank msrun job with MindSpore's cluster retry interval (3-5 s) against launch.msrun's 1 s.

    python bench/bench_msrun_retry.py [--rounds 3]

The job is workers/allreduce_check.py (import, init, one all-reduce, exit). The two settings alternate
over the rounds in rotated order (`timing.compare_interleaved`); the table gives the median wall time
of msrun, its range and the verdict, and one row per setting is appended to build/bench/bench_msrun_retry.csv.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mshelpers.config import build_dir  # noqa: E402
from mshelpers.launch import msrun  # noqa: E402
from mshelpers.table import append_csv, markdown_table  # noqa: E402
from mshelpers.timing import compare_interleaved  # noqa: E402
from mshelpers.workers import script_path  # noqa: E402

SETTINGS = {"MindSpore's default (3-5 s)": {"MS_RETRY_INTERVAL_LOWER": 3, "MS_RETRY_INTERVAL_UPPER": 5},
            "launch.msrun's default (1 s)": None}


def job_wall_s(env):
    return {"wall_s": msrun(script_path("allreduce_check"), workers=2, env=env, timeout=300,
                            log_dir=build_dir("bench", "msrun_retry")).wall_s}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    res = compare_interleaved({name: (job_wall_s, (env,)) for name, env in SETTINGS.items()}, rounds=a.rounds,
                              isolate=False, progress=False, metrics={"wall_s": False})
    rows = [{"when": time.strftime("%Y-%m-%d %H:%M"), "setting": r["name"], "rounds": a.rounds,
             "median_wall_s": r["wall_s"], "min_s": r["wall_s min"], "max_s": r["wall_s max"],
             "verdict": r.get("wall_s verdict", "baseline")} for r in res["table"]]
    for r in rows:
        append_csv(r, build_dir("bench") / "bench_msrun_retry.csv")
    print(markdown_table(rows))
