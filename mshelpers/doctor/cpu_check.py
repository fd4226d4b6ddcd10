"""The doctor's step model checked on this CPU: the cookbook's mini LLaMA in one process and on 2 msrun ranks,
recompute none and full, against measured graph-mode steps (notebook 12, section 6). One CPU efficiency is
fitted on CPU_FIT_SET only and checked on CPU_CHECK_SET."""
from __future__ import annotations

import os
import statistics
from typing import Any

from .calibration import Calibration
from .cost import step_time
from .describe import Config, DoctorError
from .profiles import DoctorHardware
from .readers import read_config

CPU_FIT_SET = (("single", "none"),)
CPU_CHECK_SET = (("single", "full"), ("2 ranks", "none"), ("2 ranks", "full"))
CPU_ALLREDUCE_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)

_RUN_KEYS = ("hidden_size", "num_layers", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len", "batch_size",
             "dp", "recompute", "compute_dtype")


def mini_config(run: Any = None, **changes: Any) -> Config:
    """The doctor's `Config` for a cookbook run: a `RunConfig` (default `RunConfig.preset("mini")`) or a dict
    with its field names (hidden_size, num_layers, num_heads, ffn_hidden_size, vocab_size, seq_len, batch_size =
    the global batch, dp, recompute "none"/"selective"/"full", compute_dtype), with `changes` applied. It is
    read through the same `read_config` as a mindformers YAML (runner_config.batch_size = batch_size / dp).
    Taught in notebooks/04_data_parallel.ipynb."""
    if run is None:
        if "." in __package__:
            from ..config import RunConfig
        else:  # the doctor/ folder copied beside its siblings as plain files
            from config import RunConfig
        run = RunConfig.preset("mini")
    d = dict(run) if isinstance(run, dict) else run.to_dict() if hasattr(run, "to_dict") else None
    if d is None:
        raise DoctorError("run", type(run).__name__, "pass a RunConfig or a dict of its fields")
    d.update(changes)
    missing = [k for k in _RUN_KEYS[:7] if k not in d]
    if missing:
        raise DoctorError(f"run.{missing[0]}", None, f"give {', '.join(missing)} (RunConfig field names)")
    dp, B, rc = d.get("dp", 1), d["batch_size"], d.get("recompute", "none")
    if rc not in ("none", "selective", "full"):
        raise DoctorError("run.recompute", rc, "one of 'none', 'selective', 'full'")
    if not isinstance(dp, int) or isinstance(dp, bool) or dp <= 0:
        raise DoctorError("run.dp", dp, "a positive integer")
    if not isinstance(B, int) or isinstance(B, bool) or B <= 0 or B % dp:
        raise DoctorError("run.batch_size", B, f"a positive global batch that dp={dp} divides")
    y = {"model": {"model_config": {
            "hidden_size": d["hidden_size"], "num_layers": d["num_layers"], "num_heads": d["num_heads"],
            "intermediate_size": d["ffn_hidden_size"], "vocab_size": d["vocab_size"], "seq_length": d["seq_len"],
            "compute_dtype": d.get("compute_dtype", "float32"), "param_init_type": "float32"}},
         "parallel_config": {"data_parallel": dp, "model_parallel": 1, "pipeline_stage": 1},
         "runner_config": {"batch_size": B // dp},
         "recompute_config": {"recompute": rc == "full", "select_recompute": rc == "selective"}}
    return read_config(y)


def cpu_hardware(ranks: int = 1, *, alpha_beta: Any = None, peak: float | None = None,
                 cores: int | None = None) -> DoctorHardware:
    """This CPU as measured, for `ranks` processes sharing it (the ranks of an msrun on this machine).

    compute: `peak.peak_flops()` (the cached measured MatMul peak), divided by `ranks`: the ranks split the
      cores (each rank runs cores/ranks kernel threads), so each gets 1/ranks of the peak.
    collectives: an alpha-beta fit of the all-reduce measured on these ranks (`parallel.fit_alpha_beta`, or an
      (alpha_s, beta_bytes_per_s) pair), entered so that `step_time`'s DP term gives back alpha + S/beta for a
      gradient buffer of S bytes: link = beta * 2(n-1)/n, latency alpha/2 on each of its two halves.
    overlap: none (dp_overlap 0): on CPU the gradient all-reduce runs after the backward, not behind it.
    Taught in notebooks/04_data_parallel.ipynb.
    """
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise DoctorError("ranks", ranks, "a positive integer (processes sharing this CPU)")
    if "." in __package__:
        from ..peak import cpu_info, peak_flops, peak_flops_record
    else:  # the doctor/ folder copied beside its siblings as plain files
        from peak import cpu_info, peak_flops, peak_flops_record
    cores = cores or os.cpu_count() or 1
    if peak is None:
        peak = peak_flops()
        rec = peak_flops_record() or {}
        psrc = (f"measured: {rec.get('method', 'peak.peak_flops()')}; {rec.get('cpu_model')}, "
                f"{rec.get('threads')} threads, {rec.get('date')} (build/peak_flops.json)")
    else:
        psrc = "given"
    if not (isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0):
        raise DoctorError("peak", peak, "a measured FLOP/s > 0, e.g. mshelpers.peak.peak_flops()")
    per_rank = peak / ranks
    bw, lat, csrc = 1e9, 1e-3, "not used (one process)"
    if ranks > 1:
        if alpha_beta is None:
            raise DoctorError("alpha_beta", None, f"pass the alpha-beta fit of the all-reduce measured on {ranks} ranks "
                              "(mshelpers.parallel.fit_alpha_beta)")
        try:
            alpha, beta = (float(v) for v in alpha_beta)
        except (TypeError, ValueError):
            raise DoctorError("alpha_beta", alpha_beta, "an AlphaBetaFit or an (alpha_s, beta_bytes_per_s) pair") from None
        if not (alpha >= 0 and beta > 0):
            raise DoctorError("alpha_beta", (alpha, beta), "alpha >= 0 s and beta > 0 bytes/s")
        bw, lat = beta * 2 * (ranks - 1) / ranks, alpha / 2
        csrc = (f"measured: all-reduce on {ranks} msrun ranks, alpha {alpha * 1e3:.2f} ms, beta {beta / 1e6:.0f} MB/s "
                "(alpha-beta fit); link = beta x 2(n-1)/n, latency alpha/2 per half of the all-reduce")
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        mem = 8 * 2**30
    model = cpu_info().get("cpu_model")
    return DoctorHardware(
        name=f"this CPU, measured ({model}; {ranks} rank{'s' if ranks > 1 else ''} on {cores} cores)",
        peak_flops={"float32": per_rank, "float16": per_rank, "bfloat16": per_rank}, hbm_bytes_per_s=20e9,
        intra_link_bytes_per_s=bw, links_per_device=1, inter_bytes_per_s=bw, devices_per_node=max(ranks, 1),
        intra_latency_s=lat, inter_latency_s=lat, memory_bytes=mem, dp_overlap=0.0,
        sources={"peak": f"{psrc}; per rank 1/{ranks} of it ({ranks} rank(s) share {cores} cores)",
                 "intra": csrc, "hbm": "assumed 20 GB/s (the optimizer term only; not measured)",
                 "overlap": "none: the CPU runs the gradient all-reduce after the backward"})


def fit_cpu_calibration(measured_s: float, cfg: Config, hw: DoctorHardware, fitted_on: tuple = CPU_FIT_SET) -> Calibration:
    """The compute efficiency that makes `step_time(cfg, hw)` equal `measured_s` (one measured step; the other
    terms kept as they are). On the CPU it absorbs what the FLOP count leaves out: elementwise ops, softmax,
    norms, kernel launches.
    Taught in notebooks/12_your_config.ipynb."""
    if not (isinstance(measured_s, (int, float)) and not isinstance(measured_s, bool) and measured_s > 0):
        raise DoctorError("measured_s", measured_s, "a measured step time in seconds > 0")
    st = step_time(cfg, hw, Calibration(1.0, 1.0))
    rest = st["step_s"] - st["compute_s"]
    if measured_s <= rest:
        raise DoctorError("measured_s", measured_s, f"more than the non-compute terms ({rest:.4f} s)")
    return Calibration(st["compute_s"] / (measured_s - rest), 1.0,
                       fitted_on=tuple(" ".join(map(str, r)) if isinstance(r, tuple) else str(r) for r in fitted_on))


def predict_cpu(calib: Calibration, hws: dict, run: Any = None) -> list[dict]:
    """Predicted step of the mini model for single / 2 ranks x recompute none / full: one row per run with
    each term. `hws` maps "single" and "2 ranks" to `cpu_hardware(1)` and `cpu_hardware(2, alpha_beta=...)`.
    Taught with the rest of doctor/cpu_check.py in notebooks/12_your_config.ipynb."""
    rows = []
    for where in ("single", "2 ranks"):
        for rc in ("none", "full"):
            dp = 1 if where == "single" else 2
            st = step_time(mini_config(run, dp=dp, recompute=rc), hws[where], calib)
            rows.append({"run": where, "recompute": rc, "role": "fit" if (where, rc) in CPU_FIT_SET else "check",
                         "predicted_s": st["step_s"], "compute_s": st["compute_s"], "dp_s": st["dp_s"],
                         "optimizer_s": st["optimizer_s"], "recompute_factor": st["recompute_factor"]})
    return rows


def measure_cpu_steps(recomputes: tuple = ("none", "full"), steps: int = 8, *, world: int = 1, rank: int = 0,
                      run: Any = None, progress: Any = None, keep: dict | None = None) -> dict:
    """Graph-mode step times of the mini model on this rank, one model per recompute setting, their steps
    alternated (ABAB, then BABA...) so that load drifts hit both alike. The step is the DP worker's Cell
    (`workers/dp_train.py`: train_step.build_step, the step train() builds: value_and_grad, all-reduce mean over
    `world` ranks, the norm in float32, clip, AdamW) with the same
    data shards; the first step of each model includes its compile. Returns {"times": {recompute: [seconds
    per step]}, "losses": ...}. `keep`: a dict that holds the built steps, so a second call with the same
    dict continues them (no new compile), e.g. to measure before and after another run.
    Taught in notebooks/12_your_config.ipynb."""
    import time
    import mindspore as ms
    from mindspore import nn
    if "." in __package__:
        from ..config import RunConfig
        from ..data import numpy_batches
        from ..model import build_model
        from ..train import make_optimizer
        from ..workers.dp_train import make_dp_step
    else:  # the doctor/ folder copied beside its siblings as plain files
        from config import RunConfig
        from data import numpy_batches
        from model import build_model
        from train import make_optimizer
        from workers.dp_train import make_dp_step
    run = run or RunConfig.preset("mini")
    made = keep if keep is not None else {}
    for rc in recomputes:
        if rc in made:
            continue
        cfg = run.replace(mode="graph", dp=world, recompute=rc)
        ms.set_seed(cfg.seed)
        net = build_model(cfg)
        opt = make_optimizer(net, cfg)
        reducer = nn.DistributedGradReducer(opt.parameters, mean=True) if world > 1 else None
        made[rc] = (make_dp_step(net, opt, reducer, float(cfg.grad_clip)), numpy_batches(cfg, num_shards=world, shard_id=rank))
    times = {rc: [] for rc in recomputes}
    losses = {rc: [] for rc in recomputes}
    done, total = 0, steps * len(recomputes)
    for i in range(steps):
        for rc in (recomputes if i % 2 == 0 else recomputes[::-1]):
            step, batches = made[rc]
            x = ms.Tensor(next(batches), ms.int32)
            t0 = time.perf_counter()
            loss = step(x)[0]
            losses[rc].append(float(loss.asnumpy()))
            times[rc].append(time.perf_counter() - t0)
            done += 1
            if progress is not None:
                progress(done, total)
    return {"times": times, "losses": losses, "world": world, "rank": rank}


def cpu_check(times: dict, hws: dict, tolerance: float = 0.25, run: Any = None) -> list[dict]:
    """The CPU check decided from measured steps, their noise included. `times` maps (run, recompute), for
    run "single" / "2 ranks" and recompute "none" / "full", to the seconds of each measured step (compile step
    left out; for 2 ranks the slower rank's). The efficiency is fitted on CPU_FIT_SET's median step only.

    Each row of `predict_cpu` gets measured_s (median), error (predicted / measured - 1), and error_lo /
    error_hi: the same error with the fit run and this run taken at their quartiles, the way that widens it
    (this run's own step-to-step spread). verdict: "fit" for the fit set; for the check set "within" when
    |error| <= tolerance, "beyond" when all of [error_lo, error_hi] lies outside +-tolerance (the model misses
    by more than the noise), else "undecided" (the medians miss, but the spread reaches the tolerance).

        >>> hw = cpu_hardware(1, peak=60e9, cores=2)
        >>> t = {("single", "none"): [0.50, 0.52, 0.48], ("single", "full"): [0.60, 0.64, 0.62]}
        >>> [(r["recompute"], r["verdict"]) for r in cpu_check(t, {"single": hw, "2 ranks": hw}) if r["run"] == "single"]
        [('none', 'fit'), ('full', 'within')]

    Taught in notebooks/12_your_config.ipynb.
    """
    import numpy as np
    if not (isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and 0 < tolerance < 10):
        raise DoctorError("tolerance", tolerance, "a relative error > 0, e.g. 0.25")
    q = {}
    for key, ts in times.items():
        try:
            a = np.asarray(ts, dtype=float).ravel()
        except (TypeError, ValueError):
            a = np.asarray([np.nan])
        if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise DoctorError(f"times[{key!r}]", ts, "measured step seconds, > 0 and finite, at least one")
        q[tuple(key)] = tuple(float(v) for v in np.percentile(a, (25, 50, 75)))
    fit_key = CPU_FIT_SET[0]
    if fit_key not in q:
        raise DoctorError("times", sorted(q), f"include the fit run {fit_key!r}")
    cfg = mini_config(run)
    preds = [predict_cpu(fit_cpu_calibration(v, cfg, hws["single"]), hws, run) for v in q[fit_key]]
    rows = []
    for i, r in enumerate(preds[1]):
        key = (r["run"], r["recompute"])
        if key not in q:
            continue
        lo_m, med_m, hi_m = q[key]
        r = dict(r, measured_s=med_m, error=r["predicted_s"] / med_m - 1,
                 error_lo=preds[0][i]["predicted_s"] / hi_m - 1, error_hi=preds[2][i]["predicted_s"] / lo_m - 1)
        if r["role"] == "fit":
            r["verdict"] = "fit"
        elif abs(r["error"]) <= tolerance:
            r["verdict"] = "within"
        elif r["error_lo"] > tolerance or r["error_hi"] < -tolerance:
            r["verdict"] = "beyond"
        else:
            r["verdict"] = "undecided"
        rows.append(r)
    return rows


def _time_allreduce(sizes: tuple, repeats: int = 5) -> list[dict]:
    """Median seconds of ops.AllReduce at each size on this rank (PyNative, .asnumpy() synchronises; the ranks
    meet in a 4-byte all-reduce before each timed call)."""
    import time
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ar, one = ops.AllReduce(), ms.Tensor(np.ones((1,), np.float32))
    rows = []
    for nbytes in sizes:
        x = ms.Tensor(np.ones((max(2, nbytes // 4),), np.float32))
        ar(x).asnumpy()                                   # warm-up
        ts = []
        for _ in range(repeats):
            ar(one).asnumpy()
            t0 = time.perf_counter()
            ar(x).asnumpy()
            ts.append(time.perf_counter() - t0)
        rows.append({"op": "all_reduce", "bytes": int(x.size * 4), "median_s": statistics.median(ts), "times_s": ts})
    return rows


def _cpu_check_worker(argv: list[str]) -> int:
    """One msrun rank of the CPU check: the steps of `measure_cpu_steps`, then the all-reduce timed at
    CPU_ALLREDUCE_SIZES (for the alpha-beta fit). Run as: msrun ... doctor.py --cpu-check-worker --steps N."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-check-worker", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--recompute", default="none,full")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    import mindspore as ms
    if a.threads:
        from mindspore.device_context.cpu.op_tuning import threads_num
        threads_num(a.threads)
    from mindspore.communication import get_group_size, get_rank, init
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    init()                 # the msrun scheduler process runs this file too and stops inside init()
    if "." in __package__:
        from ..launch import report_progress, write_rank_result
    else:  # the doctor/ folder copied beside its siblings as plain files
        from launch import report_progress, write_rank_result
    rank, world = get_rank(), get_group_size()
    rcs = tuple(r for r in a.recompute.split(",") if r)
    total = a.steps * len(rcs) + 1
    out = measure_cpu_steps(rcs, a.steps, world=world, rank=rank, progress=lambda i, n: report_progress(i, total))
    out["allreduce"] = _time_allreduce(CPU_ALLREDUCE_SIZES)
    report_progress(total, total)
    write_rank_result(out)
    return 0


