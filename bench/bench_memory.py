"""Benchmark: estimated vs measured peak memory of the mini LLaMA, one fresh process per config.

Usage (from the repo root; heavy, so take the shared lock):
    flock /tmp/heavy.lock .venv/bin/python bench/bench_memory.py [--modes pynative graph] [--steps 3]

For every (mode, batch, seq_len, recompute, grad_accum) in the grid it trains a few steps
in a fresh process (`mshelpers.memory_probe.measure_peak`), then prints a Markdown table and
appends each row to build/bench/memory.csv: the estimate, the measured peak, the import
baseline, the median step time and tokens/s. The last lines give the calibration
(activation scale and constant overhead) fitted per mode on the recompute="none" rows.
"""
from __future__ import annotations

import argparse
import time

from mshelpers.config import RunConfig, build_dir
from mshelpers.peak import peak_flops as cached_peak_flops
from mshelpers.memory import calibrate, estimate
from mshelpers.memory_probe import measure_peak, train_for_peak
from mshelpers.table import append_csv, markdown_table

GRID = [  # (batch, seq_len, recompute, grad_accum)
    (2, 128, "none", 1), (4, 128, "none", 1), (8, 128, "none", 1), (16, 128, "none", 1),
    (4, 256, "none", 1), (8, 64, "none", 1),
    (8, 128, "selective", 1), (8, 128, "full", 1), (16, 128, "full", 1),
    (4, 128, "none", 2),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["pynative", "graph"], choices=["pynative", "graph"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--limit", type=int, default=len(GRID), help="run only the first N grid entries")
    args = ap.parse_args()
    out = build_dir("bench") / "memory.csv"
    mib = 2**20
    rows, fits = [], {}
    # measured once here: left to train(), every child would hold its 2048x2048 probe matrices in the peak
    peak_flops = cached_peak_flops()
    for mode in args.modes:
        base_cfgs, base_peaks = [], []
        for b, s, rc, acc in GRID[:args.limit]:
            cfg = RunConfig.preset("mini").replace(mode=mode, batch_size=b, seq_len=s, recompute=rc,
                                                   grad_accum=acc, steps=args.steps)
            t0 = time.perf_counter()
            r = measure_peak(train_for_peak, cfg, args.steps, peak_flops, preload=("mindspore", "mindformers"))
            e = estimate(cfg)
            row = {"mode": mode, "batch": b, "seq": s, "recompute": rc, "grad_accum": acc,
                   "estimate_mib": e["total"] / mib, "peak_mib": r.peak_bytes / mib,
                   "baseline_mib": r.baseline_rss_bytes / mib, "work_mib": r.work_rss_bytes / mib,
                   "median_step_ms": r.value["median_step_s"] * 1e3, "tokens_per_s": r.value["tokens_per_s"],
                   "process_s": time.perf_counter() - t0}
            rows.append(row)
            append_csv(row, out)
            print(markdown_table([row]).splitlines()[-1], flush=True)
            if rc == "none" and acc == 1:
                base_cfgs.append(cfg)
                base_peaks.append(r.peak_bytes)
        if len(base_cfgs) >= 2:
            fits[mode] = calibrate([estimate(c) for c in base_cfgs], base_peaks)
    print(markdown_table(rows))
    for mode, cal in fits.items():
        print(f"{mode}: activation scale {cal['activation_scale']:.2f}, overhead {cal['overhead_bytes'] / mib:.0f} MiB")
    print(f"rows appended to {out}")


if __name__ == "__main__":
    main()
