"""Throughput and utilisation: FLOPs per token, MFU, measured peak FLOP/s, a per-step logger.

Example:
    >>> from mshelpers.metrics import flops_per_token, mfu
    >>> fpt = flops_per_token(3_688_704, n_layers=4, hidden_size=256, seq_len=128)
    >>> fpt
    23705088
    >>> round(mfu(tokens_per_s=6000, flops_per_token=fpt, n_devices=1, peak_flops_per_device=185e9), 3)
    0.769

MFU (model FLOPs utilisation, PaLM appendix B) counts only the FLOPs the model needs,
never recomputation, so recompute lowers MFU even though the hardware works as hard.
Use a measured or looked-up peak per device: a hard-coded A100 figure on other
hardware is how MFU above 100% gets reported.
"""
from __future__ import annotations

import csv
import functools
import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

try:  # StepLogger is a MindSpore Callback when MindSpore is present; plain loops work without it
    from mindspore.train import Callback as _Callback
except Exception:  # noqa: BLE001
    _Callback = object


def flops_per_token(n_params: int, n_layers: int, hidden_size: int, seq_len: int, *,
                    attention: bool = True) -> int:
    """Training FLOPs per token: 6*N + 12*L*H*T (PaLM, Chowdhery et al. 2022, appendix B).

    6N covers the forward (2N) and backward (4N) matmuls over all N parameters;
    12*L*H*T adds the attention score and value matmuls (H = heads * head_dim =
    hidden_size, T = sequence length). `attention=False` returns 6N only.
    """
    for name, v in (("n_params", n_params), ("n_layers", n_layers), ("hidden_size", hidden_size),
                    ("seq_len", seq_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"flops_per_token: {name}={v!r} is invalid; fix: pass a positive integer")
    return 6 * n_params + (12 * n_layers * hidden_size * seq_len if attention else 0)


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation as a fraction: achieved model FLOP/s over the devices' peak.

    tokens_per_s is global (all devices). Warns when the result exceeds 1.0, which
    cannot happen: the peak is too low or the token rate is wrong.
    """
    for name, v in (("tokens_per_s", tokens_per_s), ("flops_per_token", flops_per_token),
                    ("peak_flops_per_device", peak_flops_per_device)):
        if not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
            raise ValueError(f"mfu: {name}={v!r} is invalid; fix: pass a number >= 0")
    if peak_flops_per_device == 0:
        raise ValueError("mfu: peak_flops_per_device=0 is invalid; fix: measure it with "
                         "measure_peak_flops() or use the device's datasheet figure")
    if not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"mfu: n_devices={n_devices!r} is invalid; fix: pass a positive integer")
    value = tokens_per_s * flops_per_token / (n_devices * peak_flops_per_device)
    if value > 1.0:
        warnings.warn(f"MFU = {value:.2f} > 1 is impossible: {tokens_per_s:.4g} tokens/s x "
                      f"{flops_per_token:.4g} FLOPs/token exceeds {n_devices} x {peak_flops_per_device:.4g} FLOP/s; "
                      "the peak is too low or the token rate is wrong", UserWarning, stacklevel=2)
    return value


@functools.lru_cache(maxsize=None)
def measure_peak_flops(n: int = 2048, repeats: int = 8, dtype: str = "float32") -> float:
    """FLOP/s of a timed n x n matmul on the current MindSpore device (best of `repeats`).

    This is the practical peak a dense kernel reaches here (float32 on CPU), which is
    the fair denominator for MFU on hardware with no datasheet figure. Cached per process.
    """
    import mindspore as ms
    import numpy as np
    from mindspore import ops
    if n < 64 or repeats < 1:
        raise ValueError(f"measure_peak_flops: n={n}, repeats={repeats}; fix: n >= 64 and repeats >= 1")
    rng = np.random.default_rng(0)
    a = ms.Tensor(rng.standard_normal((n, n)), getattr(ms, dtype))
    b = ms.Tensor(rng.standard_normal((n, n)), getattr(ms, dtype))
    ops.matmul(a, b).asnumpy()  # warm-up: kernel selection and allocation
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops.matmul(a, b).asnumpy()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def peak_memory_mb() -> float:
    """Peak memory of this process in MiB: device peak on Ascend/GPU, peak RSS on CPU.

    On CPU `ms.runtime.max_memory_allocated()` returns 0, so the process peak RSS
    (which only grows) is the figure; compare runs in fresh processes.
    """
    try:
        import mindspore as ms
        dev = ms.runtime.max_memory_allocated()
        if dev:
            return dev / 2**20
    except Exception:  # noqa: BLE001
        pass
    from .timing import peak_rss_mb   # VmHWM: this process's own peak, not a forking parent's
    return peak_rss_mb()


COLUMNS = ("step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu",
           "peak_mem_mb", "overflow", "loss_scale")


class StepLogger(_Callback):
    """One CSV row per step: loss, lr, grad norm, time, tokens/s, MFU, peak memory, overflow, scale.

    From a plain loop:
        log = StepLogger("build/runs/x.csv", tokens_per_step=1024, flops_per_token=fpt,
                         peak_flops_per_device=185e9)
        log.log_step(step=1, loss=6.9, step_time_s=0.2)
    As a MindSpore Callback (`model.train(..., callbacks=[log])`) it times each step
    and reads the loss (and overflow/scale, if the network returns them) itself.
    tokens_per_step and n_devices are global, so tokens/s is the job's, not one rank's.
    """

    def __init__(self, csv_path: str | os.PathLike | None, tokens_per_step: int, flops_per_token: float,
                 peak_flops_per_device: float, n_devices: int = 1, lr_fn=None) -> None:
        if tokens_per_step <= 0:
            raise ValueError(f"StepLogger: tokens_per_step={tokens_per_step} is invalid; fix: pass batch*seq_len > 0")
        if n_devices < 1:
            raise ValueError(f"StepLogger: n_devices={n_devices} is invalid; fix: pass >= 1")
        super().__init__()
        self.csv_path = Path(csv_path) if csv_path else None
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_flops_per_device, self.n_devices, self.lr_fn = peak_flops_per_device, n_devices, lr_fn
        self.rows: list[dict] = []
        if self.csv_path:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            with self.csv_path.open("w", newline="") as f:
                csv.writer(f).writerow(COLUMNS)

    def log_step(self, step: int, loss: float, step_time_s: float, *, lr: float = float("nan"),
                 grad_norm: float = float("nan"), overflow: bool = False, loss_scale: float = 1.0,
                 peak_mem_mb: float | None = None) -> dict:
        tps = self.tokens_per_step / step_time_s if step_time_s > 0 else float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a compile step can look odd; MFU > 1 is checked on summaries
            u = mfu(tps, self.flops_per_token, self.n_devices, self.peak_flops_per_device) if tps == tps else tps
        row = dict(step=int(step), loss=float(loss), lr=float(lr), grad_norm=float(grad_norm),
                   step_time_s=float(step_time_s), tokens_per_s=tps, mfu=u,
                   peak_mem_mb=peak_memory_mb() if peak_mem_mb is None else float(peak_mem_mb),
                   overflow=bool(overflow), loss_scale=float(loss_scale))
        self.rows.append(row)
        if self.csv_path:
            with self.csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=COLUMNS).writerow(row)
        return row

    # ---- MindSpore Callback hooks
    def on_train_step_begin(self, run_context) -> None:
        self._t0 = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        out = cb.net_outputs
        overflow, scale = False, 1.0
        if isinstance(out, (tuple, list)):   # TrainOneStepWithLossScaleCell: (loss, overflow, scale)
            loss = out[0]
            if len(out) >= 3:
                overflow, scale = bool(out[1].asnumpy()), float(out[2].asnumpy())
        else:
            loss = out
        loss = float(loss.asnumpy())
        step = cb.cur_step_num
        lr = self.lr_fn(step) if self.lr_fn else float("nan")
        self.log_step(step, loss, time.perf_counter() - self._t0, lr=lr, overflow=overflow, loss_scale=scale)


def summarize(rows: list[dict], skip_first: int = 1) -> dict[str, Any]:
    """Compile time (first step), medians over the steady steps, final loss and counts."""
    if not rows:
        raise ValueError("summarize: rows is empty; fix: log at least one step")
    steady = rows[skip_first:] or rows
    med = lambda k: statistics.median(r[k] for r in steady)
    return dict(steps=len(rows), compile_time_s=rows[0]["step_time_s"], median_step_s=med("step_time_s"),
                tokens_per_s=med("tokens_per_s"), mfu=med("mfu"), final_loss=rows[-1]["loss"],
                peak_mem_mb=max(r["peak_mem_mb"] for r in rows),
                overflow_steps=sum(bool(r["overflow"]) for r in rows),
                nonfinite_losses=sum(not math.isfinite(r["loss"]) for r in rows))
