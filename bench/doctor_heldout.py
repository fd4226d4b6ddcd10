"""The doctor on a held-out test set: published MindSpeed-LLM (PyTorch / Megatron-core on Ascend) pre-training runs
and one Pangu Ultra scale point, each translated into a mindformers YAML (tests/data/heldout/, see its README.md).

These figures are NEVER fitted on: the doctor's constants come from mindformers' own figures alone
(mshelpers/doctor/published.py); nothing here feeds calibration. Each file is priced exactly as
calibration.calibration_table prices a published row: read_config, step_time(cfg, hardware(hw), CALIBRATION)
-> tokens_per_s_per_device; memory as the CLI checks it (with_reserve, then peak stage + HCCL reserve <= budget,
the budget being the device memory when the file sets none).

    .venv/bin/python bench/doctor_heldout.py [--json]

The "stack factor" is the median over dense rows of predicted / published: how much faster or slower the doctor
thinks mindformers is than MindSpeed-LLM on the same layout; errors are also shown after dividing it out.
MFU-only rows (no tokens/s/p published) are compared on MFU and kept out of the statistics.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mshelpers.doctor.heldout import heldout_runs, price, summarise  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="rows and summary as JSON")
    args = ap.parse_args(argv)
    rows = [price(r) for r in heldout_runs()]
    summary = summarise(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
        return 0
    pc = lambda v: "" if v is None else f"{v:+.1%}"      # noqa: E731
    print(f"{'file':34} {'moe':3} {'seq':>6} {'dev':>5} {'pred':>7} {'pub':>6} {'err':>7} {'/factor':>7} fits  GiB")
    for r in rows:
        pub = "" if r["published"] is None else f"{r['published']:g}"
        print(f"{r['file'][:34]:34} {'y' if r['moe'] else '':3} {r['seq']:>6} {r['devices']:>5} {r['predicted']:>7.0f} "
              f"{pub:>6} {pc(r['error']):>7} {pc(r.get('error_after_factor')):>7} {'yes' if r['fits'] else 'NO':4} "
              f"{r['peak_plus_reserve_GiB']}/{r['budget_GiB']}")
    s = summary
    print(f"\nruns {s['n_runs']}: {s['n_dense']} dense and {s['n_moe']} MoE scored on tokens/s/p, {s['n_mfu_only']} MFU-only;"
          f" seq >= 16K: {s['n_seq_ge_16k']}; key flags (CHECK THE FILE FIRST): {s['n_key_flags']}")
    print(f"dense: median |error| {s['dense_median_abs_error']:.1%}, worst {s['dense_worst']['error']:+.1%} "
          f"({s['dense_worst']['file']})")
    print(f"stack factor (median dense pred/pub): {s['stack_factor']:.3f}")
    print(f"dense after the factor: median |error| {s['dense_median_abs_error_after_factor']:.1%}, worst "
          f"{s['dense_worst_after_factor']['error']:+.1%} ({s['dense_worst_after_factor']['file']})")
    print("MoE after the factor: " + ", ".join(f"{k} {v:+.1%}" for k, v in s["moe_after_factor"].items()))
    print("seq >= 16K (error / after factor): " + ", ".join(
        f"{k} {v['error']:+.1%}/{v['after_factor']:+.1%}" for k, v in s["seq_ge_16k"].items()))
    for k, v in s["mfu_only"].items():
        print(f"MFU-only {k}: published {v['published']:.0%}; doctor 6N {v['mfu_6n']:.1%}, with attention "
              f"{v['mfu_attention']:.1%}, hardware {v['mfu_hardware']:.1%}")
    print(f"said not to fit: {s['n_not_fitting']} {s['not_fitting']}")
    if s["device_count_mismatch"]:
        print(f"device count differs from runs.json: {s['device_count_mismatch']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
