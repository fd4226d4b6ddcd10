"""The command line: python -m mshelpers.doctor CONFIG.yaml [options]. Exit 0, or 2 with one line on bad input."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from .cost import flops_per_token, step_time
from .describe import DoctorError
from .profiles import HARDWARE_NAMES
from . import logs as _logs  # noqa: F401  (imported here so measured_run finds it)
from .diagnosis import diagnose, render_text, summary_json, write_outputs
from .search import better_layouts


def measured_run(r: dict, log_path: str, *, refit: bool = False, skip: int | None = None) -> dict:
    """A training log (mindformers' or the cookbook's metrics.csv) against the diagnosis `r`: measured
    tokens/s/p at the steady median, MFU in the three conventions against the profile's datasheet peak, the
    prediction error; with `refit`, the compute efficiency re-fitted on this run (every other constant kept)
    and the top layouts re-ranked. `skip`: leading steps left out as warm-up (default max(1, 10%)).
    Taught in notebooks/12_your_config.ipynb."""
    logs = _logs
    cfg, st, hw = r["config"], r["step"], r["hardware"]
    lay, m = cfg.layout, cfg.model
    try:
        got = logs.read_training_log(log_path)
        thr = logs.measured_throughput(got["steps"], global_batch=lay.global_batch, seq_len=m.seq,
                                       devices=lay.devices, skip=skip)
    except logs.LogError as e:
        raise DoctorError("--log", log_path, str(e).split("fix: ", 1)[-1]) from None
    steady = thr["step_time"]
    measured = thr["tokens_per_s_per_device"]
    f = flops_per_token(m)
    peak = st["peak_flops"]
    hw_per_token = st["mfu_hardware"] * st["peak_flops"] / st["tokens_per_s_per_device"]
    lo, hi = thr["tokens_per_s_per_device_range"]
    out = {"path": str(log_path), "format": got["format"], "notes": got.get("notes", []) + thr["notes"],
           "n_steps": len(got["steps"]), "n_used": steady["steps_used"],
           "n_skipped": steady["skipped_warmup"] + steady["skipped_slow"],
           "n_warmup": steady["skipped_warmup"], "n_slow": steady["skipped_slow"],
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
        eff = refit_efficiency(cfg, hw, cal, measured)
        # replace, not a new Calibration: half_width, head_dim_half, attention_efficiency, comm_time_factor (and whatever
        # constant is added later) stay as fitted; only the compute efficiency and the fit set change
        new = replace(cal, compute_efficiency=eff, fitted_on=(str(log_path),))
        again = step_time(cfg, hw, new)["tokens_per_s_per_device"]
        if eff > 1:
            out["notes"].append(f"the refit puts the compute efficiency at {eff:.2f} of the datasheet peak (> 1 is "
                                "impossible): check --devices, --hardware and the YAML's global batch and seq_len "
                                "against the run")
        before = r["layouts"] or better_layouts(cfg, hw, calib=cal)
        after = better_layouts(cfg, hw, calib=new)
        out["refit"] = {"compute_efficiency": eff, "was": cal.compute_efficiency, "calibration": new.row(),
                        "assumption": REFIT_ASSUMPTION,
                        "predicted_tokens_per_s_per_device": again, "error": again / measured - 1,
                        "before": [f"{x['layout']} ({x['tokens_per_s_per_device']})" for x in before],
                        "after": [f"{x['layout']} ({x['tokens_per_s_per_device']})" for x in after]}
        out["refit_layouts"] = after
        out["refit_calibration"] = new
    return out


# What a refit on one run assumes, said wherever its figures are shown
REFIT_ASSUMPTION = ("the whole error is put on the compute efficiency: one run's step time cannot tell compute from "
                    "communication apart, and compute is most of the step on every published run (the other "
                    "constants, fitted on mindformers' published figures, are kept); a run whose error is in its "
                    "communication (a slow link, another topology) will carry it into every layout's compute")


def refit_efficiency(cfg, hw, cal, measured: float, rel_tol: float = 1e-4) -> float:
    """The compute efficiency at which the model, all other constants of `cal` kept, predicts `measured`
    tokens/s/p for `cfg` on `hw`.

    Not a one-line ratio: the pipeline bubble is other stages' compute, and the window that hides the DP
    reduction is backward compute, so the non-compute terms move with the efficiency too. The predicted
    step is increasing in x = 1 / efficiency (compute grows as x, the exposed DP time shrinks no faster), so
    false position on x inside a bracket (Illinois: an end kept twice has its value halved, so neither end
    sticks) finds it in a few steps; the answer predicts `measured` within rel_tol.
    Taught with the rest of doctor/cli.py in notebooks/12_your_config.ipynb.
    """
    def miss(x: float) -> float:             # measured / predicted - 1 = predicted step / measured step - 1
        return measured / step_time(cfg, hw, replace(cal, compute_efficiency=1 / x))["tokens_per_s_per_device"] - 1

    floor = miss(1e-9)                       # the step with compute free: what the other terms take alone
    if floor >= 0:
        pred = step_time(cfg, hw, replace(cal, compute_efficiency=1e9))["tokens_per_s_per_device"]
        raise DoctorError("--refit", f"{measured:.0f} tokens/s/p", f"a run slower than the non-compute terms "
                          f"alone allow ({pred:.0f} tokens/s/p at free compute): check --devices, --hardware "
                          "and the YAML's batch against the run")
    x = 1 / cal.compute_efficiency
    fx = miss(x)
    lo, f_lo, hi, f_hi = 0.0, floor, x, fx
    while f_hi < 0:                          # widen until the measured step lies inside [lo, hi]
        lo, f_lo, hi = hi, f_hi, hi * 2
        f_hi = miss(hi)
    kept = 0
    for _ in range(100):
        if abs(fx) < rel_tol:
            break
        x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        fx = miss(x)
        if fx < 0:
            lo, f_lo = x, fx
            f_hi, kept = (f_hi / 2 if kept < 0 else f_hi), -1
        else:
            hi, f_hi = x, fx
            f_lo, kept = (f_lo / 2 if kept > 0 else f_lo), 1
    return 1 / x


EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_REFUSED = 0, 1, 2


def _plain(md: str) -> str:
    """The Markdown report as plain text: headings underlined, bold marks dropped, tables kept as they read."""
    out = []
    for line in md.splitlines():
        line = line.replace("**", "")
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            out += [title, "=" * len(title) if line.startswith("# ") else "-" * len(title)]
        elif line.startswith("|") and set(line) <= set("|-: "):
            continue
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The CLI; returns the exit code: 0 the config fits, 1 it does not fit, 2 the input was refused (one line on
    stderr; with --format json, also a JSON object on stdout).
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    import argparse
    doc = sys.modules[__package__].__doc__ if __package__ in sys.modules else __doc__
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args or any(a in ("--format=json",) for a in args) or \
        any(a == "--format" and i + 1 < len(args) and args[i + 1] == "json" for i, a in enumerate(args))

    class _Parser(argparse.ArgumentParser):
        def error(self, message):
            raise DoctorError("arguments", " ".join(args), message)

    ap = _Parser(prog="python -m mshelpers.doctor", description=(doc or "").splitlines()[0],
                 epilog="exit codes: 0 the config fits, 1 it does not fit the budget, 2 the input was refused")
    ap.add_argument("config", help="a mindformers training YAML (r1.x, 1.x mcore or 2.x PyNative)")
    ap.add_argument("--hardware", default="atlas-800t-a2", help="the device profile to price on (default "
                    "atlas-800t-a2; 'cpu' is this machine): one of " + ", ".join(HARDWARE_NAMES))
    ap.add_argument("--devices", type=int, default=None, help="the device count to run on; other than the file's "
                    "own dp*tp*pp*cp, the doctor searches the layouts of that count (same model and global batch)")
    ap.add_argument("--budget", default=None, help='per-device memory budget, e.g. "58GB" (GB = 2^30 bytes, as '
                    "MindSpore counts it; default: the file's context.max_device_memory, else the device's memory)")
    ap.add_argument("--model-config", default=None, help="a Hugging Face config.json (or its folder) for the model keys "
                    "the YAML leaves to pretrained_model_dir")
    ap.add_argument("--release", default=None, help="the mindformers release the file runs on, e.g. r1.3.0 (where its "
                    "code prices the file differently; default: the newest)")
    ap.add_argument("--moe-imbalance", type=float, default=None, help="MoE: the busiest expert-parallel rank's load "
                    "over the mean, minus 1 (e.g. 0.3 for a router 30%% uneven; default: as balanced as chance)")
    ap.add_argument("--mc2", action="store_true", help="TP's all-gather / reduce-scatter fused into their matmuls "
                    "(MC2; a static-graph file has no key for it, a 2.x file says parallelism.enable_mc2)")
    ap.add_argument("--doc-len", type=int, default=None, help="packed documents' mean length in tokens, where the file "
                    "confines attention to them (use_eod_attn_mask_compression; default: one per sequence)")
    ap.add_argument("--log", default=None, help="a mindformers training log or the cookbook's metrics.csv of this run")
    ap.add_argument("--refit", action="store_true", help="with --log: re-fit the compute efficiency on that run")
    ap.add_argument("--out", default=None, help="a folder to write improved.yaml (the file with the best layout's "
                    "keys changed), report.md, report.html and the pictures into")
    ap.add_argument("--format", choices=("md", "text", "json"), default=None, help="the report on stdout: md "
                    "(Markdown, the default), text (plain) or json (one JSON object, nothing else)")
    ap.add_argument("--json", action="store_true", help="the same as --format json")
    ap.add_argument("--no-search", action="store_true", help="skip the layout search (faster; no better layouts)")
    try:
        a = ap.parse_args(args)
        fmt = "json" if a.json else (a.format or "md")
        if a.json and a.format not in (None, "json"):
            raise DoctorError("--format", a.format, "give --json or --format, not both with different formats")
        if a.refit and not a.log:
            raise DoctorError("--refit", True, "give --log FILE (the run to re-fit on)")
        r = diagnose(a.config, a.hardware, a.devices, a.budget, search=not a.no_search, model_config=a.model_config,
                     release=a.release, moe_imbalance=a.moe_imbalance, mc2=a.mc2, doc_len=a.doc_len)
        if a.log:
            lg = measured_run(r, a.log, refit=a.refit)
            if a.refit:     # everything the report says from here on is priced with the refitted calibration
                r = diagnose(a.config, a.hardware, a.devices, a.budget, calib=lg["refit_calibration"],
                             search=not a.no_search, model_config=a.model_config, release=a.release,
                             moe_imbalance=a.moe_imbalance, mc2=a.mc2, doc_len=a.doc_len)
            r["log"] = lg
        text = render_text(r)
        paths = None
        if a.out:
            try:
                paths = write_outputs(r, a.out, a.config)
            except OSError as e:
                raise DoctorError("--out", a.out, f"a writable folder with free space ({e.strerror or e})") from None
    except DoctorError as e:
        print(f"doctor: error: {e}", file=sys.stderr)
        if as_json:
            print(json.dumps({"error": {"field": e.field, "value": repr(e.value), "fix": e.fix, "line": str(e)},
                              "exit_code": EXIT_REFUSED}))
        return EXIT_REFUSED
    code = EXIT_FITS if r["fits"] else EXIT_DOES_NOT_FIT
    if fmt == "json":
        out = summary_json(r)
        out["written"] = paths or {}
        out["exit_code"] = code
        print(json.dumps(out, default=str))
        return code
    print(text if fmt == "md" else _plain(text))
    if paths:
        print("wrote " + ", ".join(paths.values()))
    return code


def console() -> None:
    """The `ms-doctor` console script and `python -m mshelpers.doctor`: main()'s code as the exit status.
    Taught in: no notebook; doctor/__main__.py calls it."""
    import os
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader closed the pipe (`... | head`): no traceback for the rest, and exit 1 as Python's own
        # guidance for EPIPE has it (the output was not all delivered)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    raise SystemExit(code)
