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
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mshelpers.doctor import CALIBRATION, hardware, memory_per_stage, read_config, step_time, with_reserve  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "heldout")


def price(run: dict) -> dict:
    hw = hardware(run["hw"])
    cfg = read_config(os.path.join(HERE, run["file"]))
    if cfg.budget_bytes is None:
        cfg = replace(cfg, budget_bytes=int(hw.memory_bytes))
    cfg = with_reserve(cfg, hw)
    st, mem = step_time(cfg, hw, CALIBRATION), memory_per_stage(cfg)
    pred, pub = st["tokens_per_s_per_device"], run.get("tokens_s_p")
    return {"file": run["file"], "model": run["model"], "moe": run["moe"], "seq": run["seq"], "devices": cfg.devices,
            "devices_listed": run["devices"], "predicted": round(pred, 1), "published": pub,
            "error": pred / pub - 1 if pub else None, "mfu_published": run.get("mfu"),
            "mfu_6n": st["mfu_6n"], "mfu_attention": st["mfu_attention"], "mfu_hardware": st["mfu_hardware"],
            "step_s": st["step_s"], "fits": mem["fits"],
            "peak_plus_reserve_GiB": round((mem["memory_per_device_bytes"] + mem["reserve_bytes"]) / 2**30, 1),
            "budget_GiB": round(mem["budget_bytes"] / 2**30, 1), "flags": len(cfg.key_flags)}


def summarise(rows: list[dict]) -> dict:
    scored = [r for r in rows if r["error"] is not None]
    dense, moe = [r for r in scored if not r["moe"]], [r for r in scored if r["moe"]]
    factor = statistics.median(1 + r["error"] for r in dense)
    for r in scored:
        r["error_after_factor"] = (1 + r["error"]) / factor - 1
    worst = max(dense, key=lambda r: abs(r["error"]))
    worst_f = max(dense, key=lambda r: abs(r["error_after_factor"]))
    return {"n_runs": len(rows), "n_scored": len(scored), "n_dense": len(dense), "n_moe": len(moe),
            "n_mfu_only": len(rows) - len(scored), "n_seq_ge_16k": sum(r["seq"] >= 16384 for r in rows),
            "dense_median_abs_error": statistics.median(abs(r["error"]) for r in dense),
            "dense_worst": {"file": worst["file"], "error": worst["error"]},
            "stack_factor": factor,
            "dense_median_abs_error_after_factor": statistics.median(abs(r["error_after_factor"]) for r in dense),
            "dense_worst_after_factor": {"file": worst_f["file"], "error": worst_f["error_after_factor"]},
            "moe_after_factor": {r["file"]: r["error_after_factor"] for r in moe},
            "moe_median_abs_error": statistics.median(abs(r["error"]) for r in moe) if moe else None,
            "seq_ge_16k": {r["file"]: {"error": r["error"], "after_factor": r["error_after_factor"]}
                           for r in scored if r["seq"] >= 16384},
            "mfu_only": {r["file"]: {"published": r["mfu_published"], "mfu_6n": r["mfu_6n"],
                                     "mfu_attention": r["mfu_attention"], "mfu_hardware": r["mfu_hardware"]}
                         for r in rows if r["error"] is None},
            "n_not_fitting": sum(r["fits"] is False for r in rows),
            "not_fitting": [r["file"] for r in rows if r["fits"] is False],
            "n_key_flags": sum(r["flags"] for r in rows),
            "device_count_mismatch": [r["file"] for r in rows if r["devices"] != r["devices_listed"]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="rows and summary as JSON")
    args = ap.parse_args(argv)
    with open(os.path.join(HERE, "runs.json")) as f:
        runs = json.load(f)
    rows = [price(r) for r in runs]
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
