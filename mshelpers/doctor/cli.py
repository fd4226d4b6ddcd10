"""The command line: python -m mshelpers.doctor CONFIG.yaml [options]. Exit 0, or 2 with one line on bad input."""
from __future__ import annotations

import json
import sys

from .calibration import Calibration
from .cost import flops_per_token
from .describe import DoctorError
from . import logs as _logs  # noqa: F401  (imported here so measured_run finds it)
from .report import diagnose, render_text, summary_json, write_outputs
from .search import better_layouts


def measured_run(r: dict, log_path: str, *, refit: bool = False, skip: int | None = None) -> dict:
    """A training log (mindformers' or the cookbook's metrics.csv) against the diagnosis `r`: measured
    tokens/s/p at the steady median, MFU in the three conventions against the profile's datasheet peak, the
    prediction error; with `refit`, the compute efficiency re-fitted on this run and the top layouts re-ranked."""
    logs = _logs
    cfg, st, hw = r["config"], r["step"], r["hardware"]
    lay, m = cfg.layout, cfg.model
    try:
        got = logs.read_training_log(log_path)
        steady = logs.steady_step_time(got["steps"], skip=skip)
        thr = logs.measured_throughput(got["steps"], global_batch=lay.global_batch, seq_len=m.seq,
                                       devices=lay.devices)
    except logs.LogError as e:
        raise DoctorError("--log", log_path, str(e).split("fix: ", 1)[-1]) from None
    measured = thr["tokens_per_s_per_device"]
    f = flops_per_token(m)
    peak = st["peak_flops"]
    hw_per_token = st["mfu_hardware"] * st["peak_flops"] / st["tokens_per_s_per_device"]
    lo, hi = thr["tokens_per_s_per_device_range"]
    out = {"path": str(log_path), "format": got["format"], "notes": got.get("notes", []) + thr["notes"],
           "n_steps": len(got["steps"]), "n_used": steady["steps_used"],
           "n_skipped": steady["skipped_warmup"] + steady["skipped_slow"],
           "measured_step_s": steady["median_s"], "measured_tokens_per_s_per_device": measured,
           "measured_q1": lo, "measured_q3": hi,
           "logged_tokens_per_s_per_device": thr.get("log_tokens_per_s_per_device"),
           "predicted_tokens_per_s_per_device": st["tokens_per_s_per_device"],
           "error": st["tokens_per_s_per_device"] / measured - 1,
           "mfu_6n": f["6n"] * measured / peak, "mfu_attention": f["palm"] * measured / peak,
           "mfu_hardware": hw_per_token * measured / peak, "peak_flops": peak,
           "peak_source": f"{lay.compute_dtype} peak of {hw.name}"}
    if refit:
        cal = r["calibration"]
        rest = st["step_s"] - st["compute_s"]
        if steady["median_s"] <= rest:
            raise DoctorError("--refit", f"{steady['median_s']:.4f} s", f"a measured step longer than the "
                              f"non-compute terms ({rest:.4f} s): check --devices and the YAML's batch")
        eff = cal.compute_efficiency * st["compute_s"] / (steady["median_s"] - rest)
        new = Calibration(eff, cal.comm_time_factor, fitted_on=(str(log_path),))
        before = r["layouts"] or better_layouts(cfg, hw, calib=cal)
        after = better_layouts(cfg, hw, calib=new)
        out["refit"] = {"compute_efficiency": eff, "was": cal.compute_efficiency,
                        "before": [f"{x['layout']} ({x['tokens_per_s_per_device']})" for x in before],
                        "after": [f"{x['layout']} ({x['tokens_per_s_per_device']})" for x in after]}
        out["refit_layouts"] = after
    return out


def main(argv: list[str] | None = None) -> int:
    """The CLI; returns the exit code (0 ok, 2 bad input)."""
    import argparse
    doc = sys.modules[__package__].__doc__ if __package__ in sys.modules else __doc__

    class _Parser(argparse.ArgumentParser):
        def error(self, message):
            raise DoctorError("arguments", " ".join(argv if argv is not None else sys.argv[1:]), message)

    ap = _Parser(prog="python -m mshelpers.doctor", description=(doc or "").splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--hardware", default="atlas-800t-a2")
    ap.add_argument("--devices", type=int, default=None)
    ap.add_argument("--budget", default=None, help='per-device memory budget, e.g. "58GB" (default: max_device_memory)')
    ap.add_argument("--model-config", default=None, help="a Hugging Face config.json (or its folder) for the model keys "
                    "the YAML leaves to pretrained_model_dir")
    ap.add_argument("--log", default=None, help="a mindformers training log or the cookbook's metrics.csv of this run")
    ap.add_argument("--refit", action="store_true", help="with --log: re-fit the compute efficiency on that run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-search", action="store_true")
    try:
        a = ap.parse_args(argv)
        if a.refit and not a.log:
            raise DoctorError("--refit", True, "give --log FILE (the run to re-fit on)")
        r = diagnose(a.config, a.hardware, a.devices, a.budget, search=not a.no_search, model_config=a.model_config)
        if a.log:
            r["log"] = measured_run(r, a.log, refit=a.refit)
        text = render_text(r)
        paths = None
        if a.out:
            try:
                paths = write_outputs(r, a.out, a.config)
            except OSError as e:
                raise DoctorError("--out", a.out, f"a writable folder with free space ({e.strerror or e})") from None
    except DoctorError as e:
        print(f"doctor: error: {e}", file=sys.stderr)
        return 2
    print(text)
    if paths:
        print("wrote " + ", ".join(paths.values()))
    if a.json:
        print(json.dumps(summary_json(r), default=str))
    return 0
