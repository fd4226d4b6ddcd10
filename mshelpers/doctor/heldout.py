"""The runs kept apart: published training runs of another Ascend stack (MindSpeed-LLM on Atlas 900 A2, and one
Pangu Ultra scale point), each translated into a mindformers YAML in tests/data/heldout/ (its README names every
source line and assumption). Never fitted on: the constants come from mindformers' own figures alone
(published.py). Each file is priced as calibration.calibration_table prices a published row, memory as the CLI
checks it (with_reserve; peak stage + HCCL reserve <= the budget, the device memory when the file sets none).

`summarise` reports the "stack factor", the median predicted / published over the dense runs (how much faster
or slower the doctor thinks mindformers is than that stack on the same layout), and every error after dividing
it out. MFU-only rows (no tokens/s/p published) are compared on MFU and kept out of the statistics.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace

from .calibration import fixture_dir
from .cost import memory_per_stage, step_time, with_reserve
from .describe import CALIBRATION
from .profiles import hardware
from .readers import read_config


def heldout_dir() -> str:
    """The folder of held-out runs from another stack (tests/data/heldout/), beside the fixtures.
    Taught with the rest of doctor/heldout.py in notebooks/12_your_config.ipynb."""
    return os.path.join(os.path.dirname(fixture_dir()), "heldout")


def heldout_runs() -> list[dict]:
    """runs.json: file, model, family, moe, seq, devices, hw, mc2, tokens_s_p (or mfu), source, note.
    Taught in notebooks/12_your_config.ipynb."""
    with open(os.path.join(heldout_dir(), "runs.json")) as f:
        return json.load(f)


def price(run: dict, calib=CALIBRATION) -> dict:
    """One run priced: predicted and published tokens/s/p, the error, MFU, whether it fits.
    Taught in: no notebook; doctor/__init__.py calls it."""
    hw = hardware(run["hw"])
    cfg = read_config(os.path.join(heldout_dir(), run["file"]))
    if run.get("mc2"):          # the measured run fused TP's collectives into its matmuls (runs.json says where)
        cfg = replace(cfg, mc2=True)
    if cfg.budget_bytes is None:
        cfg = replace(cfg, budget_bytes=int(hw.memory_bytes))
    cfg = with_reserve(cfg, hw)
    st, mem = step_time(cfg, hw, calib), memory_per_stage(cfg)
    pred, pub = st["tokens_per_s_per_device"], run.get("tokens_s_p")
    return {"file": run["file"], "model": run["model"], "moe": run["moe"], "seq": run["seq"], "devices": cfg.layout.devices,
            "devices_listed": run["devices"], "predicted": round(pred, 1), "published": pub,
            "error": pred / pub - 1 if pub else None, "mfu_published": run.get("mfu"),
            "mfu_6n": st["mfu_6n"], "mfu_attention": st["mfu_attention"], "mfu_hardware": st["mfu_hardware"],
            "step_s": st["step_s"], "fits": mem["fits"],
            "peak_plus_reserve_GiB": round((mem["memory_per_device_bytes"] + mem["reserve_bytes"]) / 2**30, 1),
            "budget_GiB": round(mem["budget_bytes"] / 2**30, 1), "flags": len(cfg.key_flags)}


def summarise(rows: list[dict]) -> dict:
    """The errors in numbers: dense and MoE apart, the stack factor, seq >= 16K, MFU-only rows, runs said not to fit.
    Taught in: no notebook; doctor/__init__.py calls it."""
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
