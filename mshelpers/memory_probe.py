"""Measured peak memory: a function run in a fresh process, and the peak it reached there.

Example (spawns a process, so not run as a doctest):
    >>> from mshelpers.memory_probe import allocate_bytes, measure_peak
    >>> r = measure_peak(allocate_bytes, 200 * 2**20)        # doctest: +SKIP
    >>> r.work_rss_bytes >= 200 * 2**20, r.source             # doctest: +SKIP
    (True, 'rss')

On Ascend/GPU the headline is the memory pool's peak (`ms.runtime.max_memory_allocated()`); on CPU that call
returns 0, so it is the process's peak resident set size. The estimate it is set against is memory.py's
(`memory.estimate`, `memory.calibrate`). The fresh process and the RSS reader are timing.py's (`_run_child`,
`_rss_mb`): copy timing.py beside this file. Nothing here imports MindSpore except the child of a workload
that uses it.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable


# --- what a fresh process saw ---
@dataclass
class PeakMemory:
    """What `measure_peak` saw in the fresh process (bytes). Taught in notebooks/06_recompute_memory.ipynb."""
    value: Any                     # fn's return value
    peak_bytes: int                # the headline figure: device peak on Ascend/GPU, else peak RSS
    source: str                    # "device" (ms.runtime.max_memory_allocated) or "rss"
    peak_rss_bytes: int            # the child's peak resident set size
    baseline_rss_bytes: int        # RSS just before fn ran (interpreter + preloaded modules)
    device_peak_bytes: int | None  # ms.runtime.max_memory_allocated(), None if MindSpore unused
    wall_s: float                  # fn's wall time in the child

    @property
    def work_rss_bytes(self) -> int:
        """Peak RSS above the baseline: what fn itself added."""
        return self.peak_rss_bytes - self.baseline_rss_bytes

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20


# --- the child's body and the fresh process it runs in ---
def _peak_child(fn: Callable, args: tuple, kwargs: dict, preload: tuple[str, ...], quiet: bool = False) -> dict:
    """Runs inside the spawned process: preload, baseline, run, read the peaks."""
    import importlib
    import sys
    import time
    if quiet:   # the child shares the notebook's stdout/stderr; its import chatter is not the result
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    if __package__:
        from .timing import _rss_mb as rss_mb         # MiB from KiB: x 2**20 gives the bytes back exactly
    else:  # copied beside its siblings as plain files
        from timing import _rss_mb as rss_mb
    for name in preload:
        importlib.import_module(name)
    baseline = int(rss_mb("VmRSS") * 2**20)
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    wall = time.perf_counter() - t0
    device_peak = None
    if "mindspore" in sys.modules:
        ms = sys.modules["mindspore"]
        target = ms.get_context("device_target")
        device_peak = int(ms.runtime.max_memory_allocated()) if target in ("Ascend", "GPU") else 0
    return {"value": value, "wall_s": wall, "baseline": baseline, "peak_rss": int(rss_mb("VmHWM") * 2**20),
            "device_peak": device_peak}


def measure_peak(fn: Callable, *args: Any, preload: tuple[str, ...] = (), quiet: bool = True,
                 timeout: float = 900, env: dict | None = None, **kwargs: Any) -> PeakMemory:
    """Run `fn(*args, **kwargs)` in a fresh spawned process and return its peak memory.

    On Ascend/GPU the headline is `ms.runtime.max_memory_allocated()` (the memory pool's
    peak); on CPU that call returns 0, so the headline is the process's peak RSS.
    `preload` names modules to import before the baseline RSS is read (e.g.
    ("mindspore", "mindformers")), so `work_rss_bytes` excludes their import cost.
    `quiet` sends the child's stdout/stderr to /dev/null (a failure still raises here,
    with the child's traceback).
    `fn` must be importable from a module file (not defined in a notebook cell); its
    arguments and return value must pickle. Needs timing.py beside it (the fresh-process runner).

        >>> from mshelpers.memory_probe import measure_peak
        >>> r = measure_peak(allocate_bytes, 200 * 2**20)        # doctest: +SKIP
        >>> r.work_rss_bytes >= 200 * 2**20                      # doctest: +SKIP
        True

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    if not callable(fn):
        raise ValueError(f"measure_peak: fn={fn!r} is not callable; fix: pass a function defined in a module")
    qual = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in qual or "<lambda>" in qual:
        raise ValueError(f"measure_peak: fn={qual or fn!r} cannot be imported by a fresh process "
                         "(defined in a notebook, a script's __main__, a lambda or a closure); "
                         "fix: define it at the top level of a .py module and import it")
    if isinstance(preload, str):
        preload = (preload,)
    if __package__:
        from .timing import _run_child as run_child
    else:  # copied beside its siblings as plain files
        from timing import _run_child as run_child
    out = run_child(_peak_child, (fn, args, kwargs, tuple(preload), quiet), {}, timeout=timeout, env=env,
                    who="measure_peak", name=getattr(fn, "__name__", repr(fn)))[0]
    return _as_peak_memory(out)


def _as_peak_memory(out: dict) -> PeakMemory:
    """The child's readings as a PeakMemory: the device pool's peak where there is one (Ascend/GPU), else peak RSS."""
    device = out["device_peak"]
    return PeakMemory(value=out["value"], peak_bytes=device if device else out["peak_rss"],
                      source="device" if device else "rss", peak_rss_bytes=out["peak_rss"],
                      baseline_rss_bytes=out["baseline"], device_peak_bytes=device, wall_s=out["wall_s"])


def measure_peaks(fn: Callable, arg_tuples: list[tuple], *, parallel: int = 1, **kwargs: Any) -> list[PeakMemory]:
    """`measure_peak(fn, *args, **kwargs)` for each args tuple, `parallel` fresh processes at a time.

    Peak RSS is per process, so running two at once does not change it; their step times
    do change, so only run memory-only measurements with parallel > 1.

        >>> rs = measure_peaks(allocate_bytes, [(2**20,), (2**21,)], parallel=2)   # doctest: +SKIP

    Taught in notebooks/11_your_own_model.ipynb.
    """
    if not isinstance(parallel, numbers.Integral) or isinstance(parallel, bool) or parallel < 1:
        raise ValueError(f"measure_peaks: parallel={parallel!r} is invalid; fix: pass a positive integer")
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(parallel) as pool:   # threads only wait on their child processes
        return list(pool.map(lambda args: measure_peak(fn, *args, **kwargs), arg_tuples))


# --- the memory pool's own peak, from MindSpore's log (CPU: the API returns 0) ---
_POOL_LINE = "DumpDynamicMemPoolStateInfo"


def pool_log_env(log_dir: Any) -> dict:
    """Environment for a fresh MindSpore process that logs (INFO) to files under `log_dir`, where the memory pool
    writes its totals when the process ends; read them with `pool_peak(log_dir)`. Use one empty folder per run.
    Taught in notebooks/06_recompute_memory.ipynb."""
    return {"GLOG_v": "1", "GLOG_logtostderr": "0", "GLOG_log_dir": str(log_dir)}


def pool_peak(log_dir: Any) -> dict:
    """The memory pool's totals a process logged under `log_dir` (`pool_log_env`), in bytes: {"peak_used": the
    tensors in use at the peak, what `ms.runtime.max_memory_allocated()` reports on Ascend; "actual_peak": the
    pool's highest offset touched, free gaps included; "allocated": the pool's reserved blocks}. On CPU the rest
    of the process's RSS lies outside this pool. Raises FileNotFoundError when no pool line was logged.
    Taught in notebooks/06_recompute_memory.ipynb."""
    import re
    from pathlib import Path
    lines = [ln for f in sorted(Path(log_dir).rglob("*")) if f.is_file()
             for ln in f.read_text(errors="replace").splitlines() if _POOL_LINE in ln]
    if not lines:
        raise FileNotFoundError(f"pool_peak: no {_POOL_LINE} line under {log_dir}; fix: run the process with "
                                "env=pool_log_env(log_dir) and let it exit")
    pick = {"allocated": r"total allocated mem:(\d+)M", "peak_used": r"[^l] peak used mem:(\d+)M",
            "actual_peak": r"actual peak used mem:(\d+)M"}
    return {k: int(re.search(p, lines[-1]).group(1)) * 2**20 for k, p in pick.items()}


# --- workloads ---
def allocate_bytes(n_bytes: int, hold_s: float = 0.0) -> int:
    """Touch `n_bytes` of fresh memory and return how many were touched (a measure_peak self-check).

    No notebook: measure_peak's self-check in the tests.
    """
    import time
    buf = bytearray(n_bytes)
    for i in range(0, n_bytes, 4096):   # write each page so it becomes resident
        buf[i] = 1
    if hold_s:
        time.sleep(hold_s)
    return len(buf)


def train_for_peak(cfg: Any, steps: int = 5, peak_flops: float | None = None,
                   set_memory: dict | None = None) -> dict:
    """Train `cfg` for `steps` steps with `mshelpers.train.train`; return its summary dict.

    A ready-made `measure_peak` workload: `measure_peak(train_for_peak, cfg, 5)` gives the
    peak memory of a short run of `cfg` in a fresh process, and the summary its step time.
    `set_memory` goes to `ms.runtime.set_memory(**set_memory)` first (e.g.
    {"max_size": "28GB", "optimize_level": "O1"}); it must precede the first op, which a
    fresh process guarantees. The per-step CSV goes to build/memory/.

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    if __package__:
        from .config import build_dir
        from .train import train
    else:  # copied beside its siblings as plain files
        from config import build_dir
        from train import train
    if set_memory:
        import mindspore as ms
        ms.runtime.set_memory(**set_memory)
    name = (f"{cfg.name}-{cfg.mode}-b{cfg.batch_size}-s{cfg.seq_len}-{cfg.recompute}"
            f"-acc{cfg.grad_accum}.csv")
    hist = train(cfg, steps, progress=False, peak_flops=peak_flops, csv_path=build_dir("memory") / name)
    return hist.summary()
