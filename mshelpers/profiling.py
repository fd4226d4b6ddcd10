"""Profile a short window of training steps and turn MindSpore's profiler output into tables and a diagnosis.

The profiler slows every step it records, so it should see a few steps, not a whole run:
`profile_steps` runs `skip_first + wait + warmup + active` steps under
`mindspore.profiler.profile(schedule=schedule(...))` and only the `active` ones are recorded.

Example (a one-layer net, so its ops take microseconds and the framework the rest of each step):
    >>> import tempfile, numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> from mshelpers.profiling import profile_steps, op_type_table, step_breakdown, diagnose
    >>> net = nn.Dense(8, 1)
    >>> train_step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
    >>> x, y = ms.Tensor(np.ones((4, 8), np.float32)), ms.Tensor(np.zeros((4, 1), np.float32))
    >>> run = profile_steps(lambda: train_step(x, y).asnumpy(), wait=1, warmup=1, active=3,
    ...                     output_dir=tempfile.mkdtemp())   # e.g. mshelpers.config.build_dir("profile", "demo")
    >>> len(run.step_times_s), run.active_steps
    (5, [2, 3, 4])
    >>> table = op_type_table(run.profile_dir)           # op types by total time, largest first
    >>> sorted(table[0]), round(sum(r["share"] for r in table), 6)
    (['avg_ms', 'core', 'count', 'op_type', 'share', 'total_ms'], 1.0)
    >>> parts = step_breakdown(run)                      # compute / communication / data / host shares
    >>> diagnose(parts).bottleneck                       # print(diagnose(parts)) adds the rule and numbers
    'launch/host-bound'

Files read (MindSpore 2.9):
- CPU: `<run>_ascend_ms/FRAMEWORK/cpu_op_type_info_*.csv`, `cpu_op_detail_info_*.csv`
- Ascend: `<run>_ascend_ms/ASCEND_PROFILER_OUTPUT/op_statistic.csv`, `kernel_details.csv`
- both: `<run>_ascend_ms/ASCEND_PROFILER_OUTPUT/trace_view.json` (Chrome trace format; open it in
  https://ui.perfetto.dev or MindStudio Insight).

The window's pictures are in `mshelpers.profile_plots`, per-rank step times in `mshelpers.stragglers`. This
module holds the whole path from a window to a diagnosis, because notebook 11 copies it alone and runs that path.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

# Collective and point-to-point communication op names (MindSpore, HCCL and NCCL spellings). An op name
# ends at the token: no letter may follow, so BroadcastTo (a compute op) and a "Sender" are not
# communication, while "AllReduce-op12", "hcom_allReduce_" and "InnerCommIsend" are.
COMM_OP_PATTERN = re.compile(
    r"(?:hcom_|Hcom|HcclAll|NcclAll)"
    r"|(?:MatMulAllReduce|AllReduce|AllGatherV?|ReduceScatterV?|Broadcast|AlltoAllV?|AllToAllV?|"
    r"Send|Receive|Recv|Barrier)(?![A-Za-z])", re.IGNORECASE)

# Trace "processes" whose complete events are operator executions.
_OP_PROCESS_NAMES = ("CPU OP", "Ascend Hardware", "HCCL", "GPU OP")


# ----------------------------------------------------------------------------- profiling window
@dataclass
class ProfileRun:
    """What `profile_steps` measured. Times are wall-clock; windows are epoch microseconds,
    the same clock as `trace_view.json`'s `ts`. Taught in notebooks/08_profiling.ipynb."""

    profile_dir: Path                                   # the `*_ascend_ms` folder the profiler wrote
    step_times_s: list[float]                           # every step, profiled or not
    data_times_s: list[float]                           # time spent in `data_fn` per step (0 without one)
    active_steps: list[int]                             # indices into step_times_s that were recorded
    step_windows_us: list[tuple[float, float]] = field(default_factory=list)   # active steps only
    data_windows_us: list[tuple[float, float]] = field(default_factory=list)   # active steps only

    @property
    def trace_path(self) -> Path:
        return self.profile_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"

    @property
    def active_step_times_s(self) -> list[float]:
        return [self.step_times_s[i] for i in self.active_steps]

    @property
    def unprofiled_step_times_s(self) -> list[float]:
        """Steps outside the recorded window (wait steps and any skip_first steps after the first)."""
        return [t for i, t in enumerate(self.step_times_s) if i not in self.active_steps]


def _check_count(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"profile_steps: {name}={value!r} is invalid; fix: pass an integer >= {minimum}")


def profile_steps(step_fn: Callable[..., Any], *, wait: int = 1, warmup: int = 1, active: int = 3,
                  output_dir: str | os.PathLike, skip_first: int = 0,
                  data_fn: Callable[[], Any] | None = None,
                  activities: Sequence[Any] | None = None,
                  experimental_config: Any = None) -> ProfileRun:
    """Run `skip_first + wait + warmup + active` steps and record only the `active` ones.

    `step_fn()` runs one training step (or `step_fn(batch)` with `batch = data_fn()` when `data_fn`
    is given; the time spent in `data_fn` is measured separately so the diagnosis can name a data
    bottleneck). `step_fn` should block until the step has finished (e.g. call `.asnumpy()` on the
    loss) so that wall-clock windows match the work. Activities default to CPU, plus NPU on Ascend;
    `experimental_config` (a `mindspore.profiler._ExperimentalConfig`, e.g. profiler_level and
    aic_metrics on Ascend) is passed through.

    Example (a forward pass stands in for the training step):
        >>> import tempfile, numpy as np, mindspore as ms
        >>> from mindspore import nn
        >>> step, x = nn.Dense(8, 8), ms.Tensor(np.ones((4, 8), np.float32))
        >>> run = profile_steps(lambda: step(x).asnumpy(), active=3, output_dir=tempfile.mkdtemp())
        >>> run.trace_path.exists(), len(run.active_step_times_s)
        (True, 3)

    Taught in notebooks/08_profiling.ipynb (used in 11_your_own_model.ipynb).
    """
    if not callable(step_fn):
        raise ValueError(f"profile_steps: step_fn={step_fn!r} is not callable; fix: pass a function "
                         "that runs one training step")
    if data_fn is not None and not callable(data_fn):
        raise ValueError(f"profile_steps: data_fn={data_fn!r} is not callable; fix: pass a function "
                         "returning the next batch, or None")
    _check_count("wait", wait, 0)
    _check_count("warmup", warmup, 0)
    _check_count("active", active, 1)
    _check_count("skip_first", skip_first, 0)
    if output_dir is None or str(output_dir) == "":
        raise ValueError("profile_steps: output_dir is empty; fix: pass a folder, "
                         "e.g. mshelpers.config.build_dir('profile', 'run1')")

    import mindspore as ms
    from mindspore.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    before = set(glob.glob(str(out / "*_ascend_ms")))
    if activities is None:
        activities = [ProfilerActivity.CPU]
        if ms.get_context("device_target") == "Ascend":
            activities.append(ProfilerActivity.NPU)

    total = skip_first + wait + warmup + active
    first_active = skip_first + wait + warmup
    step_times, data_times, step_windows, data_windows = [], [], [], []
    # repeat=1: one window; with repeat=0 MindSpore keeps cycling and writes a truncated extra window.
    sched = schedule(wait=wait, warmup=warmup, active=active, repeat=1, skip_first=skip_first)
    # The profiler's parser prints "Start parsing profiling data" and a child process draws progress bars on
    # the terminal (file descriptors 1 and 2): kept in <output_dir>/profiler_output.log, out of the notebook.
    with _output_to(out / "profiler_output.log"), \
            profile(activities=list(activities), schedule=sched, experimental_config=experimental_config,
                    on_trace_ready=tensorboard_trace_handler(str(out))) as prof:
        for i in range(total):
            t0 = time.time_ns()
            if data_fn is not None:
                batch = data_fn()
                t_data = time.time_ns()
                step_fn(batch)
            else:
                t_data = t0
                step_fn()
            t1 = time.time_ns()
            step_times.append((t1 - t0) / 1e9)
            data_times.append((t_data - t0) / 1e9)
            if i >= first_active:
                step_windows.append((t0 / 1e3, t1 / 1e3))
                data_windows.append((t0 / 1e3, t_data / 1e3))
            prof.step()

    new = sorted(set(glob.glob(str(out / "*_ascend_ms"))) - before, key=os.path.getmtime)
    if not new:
        raise RuntimeError(f"profile_steps: the profiler wrote no *_ascend_ms folder under {out}")
    return ProfileRun(profile_dir=Path(new[-1]), step_times_s=step_times, data_times_s=data_times,
                      active_steps=list(range(first_active, total)),
                      step_windows_us=step_windows, data_windows_us=data_windows)


class _output_to:
    """Send Python's and the OS's stdout/stderr (this process and its children) to `path` while active."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> "_output_to":
        import contextlib
        import sys
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:  # noqa: BLE001 - a closed stream has nothing to flush
                pass
        self._file = open(self.path, "a")
        self._saved = [os.dup(1), os.dup(2)]
        os.dup2(self._file.fileno(), 1)
        os.dup2(self._file.fileno(), 2)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(self._file))
        self._stack.enter_context(contextlib.redirect_stderr(self._file))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        self._file.flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._file.close()


# ----------------------------------------------------------------------------- locating files
def find_profile_dirs(root: str | os.PathLike) -> list[Path]:
    """All `*_ascend_ms` folders under `root` (or `[root]` if it is one), oldest first.
    Taught in notebooks/08_profiling.ipynb, through op_type_table and load_trace."""
    root = Path(root)
    if root.name.endswith("_ascend_ms"):
        return [root]
    found = [Path(p) for p in glob.glob(str(root / "**" / "*_ascend_ms"), recursive=True)]
    return sorted(found, key=os.path.getmtime)


def _profile_dir(where: "str | os.PathLike | ProfileRun") -> Path:
    if isinstance(where, ProfileRun):
        return where.profile_dir
    dirs = find_profile_dirs(where)
    if not dirs:
        raise ValueError(f"no profiler output (*_ascend_ms folder) under {str(where)!r}; "
                         "fix: pass the output_dir given to profile_steps or its *_ascend_ms folder")
    return dirs[-1]


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in row.items()}
                for row in csv.DictReader(f)]


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _with_shares(rows: list[dict]) -> list[dict]:
    total = sum(r["total_ms"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["total_ms"] / total
    return sorted(rows, key=lambda r: r["total_ms"], reverse=True)


# ----------------------------------------------------------------------------- op tables
def op_type_table(where: "str | os.PathLike | ProfileRun") -> list[dict]:
    """Time per op type, largest first: op_type, core, count, total_ms, avg_ms, share (0..1 of op time).

    Reads Ascend's `ASCEND_PROFILER_OUTPUT/op_statistic.csv` when present, else the CPU table
    `FRAMEWORK/cpu_op_type_info_*.csv` (summed over ranks if there are several files).

    Taught in notebooks/08_profiling.ipynb.
    """
    d = _profile_dir(where)
    ascend = d / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv"
    merged: dict[tuple[str, str], dict] = {}
    if ascend.exists():
        for r in _read_csv(ascend):
            key = (r.get("OP Type", ""), r.get("Core Type", ""))
            m = merged.setdefault(key, {"op_type": key[0], "core": key[1], "count": 0, "total_ms": 0.0})
            m["count"] += int(_num(r.get("Count")))
            m["total_ms"] += _num(r.get("Total Time(us)")) / 1e3
    else:
        files = sorted((d / "FRAMEWORK").glob("cpu_op_type_info_*.csv"))
        if not files:
            raise ValueError(f"op_type_table: neither ASCEND_PROFILER_OUTPUT/op_statistic.csv nor "
                             f"FRAMEWORK/cpu_op_type_info_*.csv in {d}; fix: profile at least one step "
                             "that runs operators (active >= 1)")
        for path in files:
            for r in _read_csv(path):
                key = (r["op_type"], "CPU")
                m = merged.setdefault(key, {"op_type": key[0], "core": "CPU", "count": 0, "total_ms": 0.0})
                m["count"] += int(_num(r.get("type_occurrences")))
                m["total_ms"] += _num(r.get("total_compute_time"))     # milliseconds in MindSpore 2.9
    rows = list(merged.values())
    for r in rows:
        r["avg_ms"] = r["total_ms"] / r["count"] if r["count"] else 0.0
    return [{k: r[k] for k in ("op_type", "core", "count", "total_ms", "avg_ms", "share")}
            for r in _with_shares(rows)]


def top_ops(where: "str | os.PathLike | ProfileRun", k: int = 10) -> list[dict]:
    """The `k` op instances with the largest total time: op_name, op_type, count, total_ms, avg_ms, share.

    Reads Ascend's `kernel_details.csv` when present, else `FRAMEWORK/cpu_op_detail_info_*.csv`.

    Taught in notebooks/08_profiling.ipynb.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top_ops: k={k!r} is invalid; fix: pass an integer >= 1")
    d = _profile_dir(where)
    kernels = d / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    merged: dict[str, dict] = {}
    if kernels.exists():
        for r in _read_csv(kernels):
            name = r.get("Name", "")
            m = merged.setdefault(name, {"op_name": name, "op_type": r.get("Type", ""), "count": 0,
                                         "total_ms": 0.0})
            m["count"] += 1
            m["total_ms"] += _num(r.get("Duration(us)")) / 1e3
    else:
        files = sorted((d / "FRAMEWORK").glob("cpu_op_detail_info_*.csv"))
        if not files:
            raise ValueError(f"top_ops: no kernel_details.csv or FRAMEWORK/cpu_op_detail_info_*.csv in {d}")
        for path in files:
            for r in _read_csv(path):
                name = r.get("full_op_name") or r.get("op_name", "")
                m = merged.setdefault(name, {"op_name": name, "op_type": r.get("op_type", ""), "count": 0,
                                             "total_ms": 0.0})
                m["count"] += int(_num(r.get("op_occurrences")))
                m["total_ms"] += _num(r.get("op_total_time(ms)"))
    rows = list(merged.values())
    for r in rows:
        r["avg_ms"] = r["total_ms"] / r["count"] if r["count"] else 0.0
    rows = _with_shares(rows)[:k]
    return [{k_: r[k_] for k_ in ("op_name", "op_type", "count", "total_ms", "avg_ms", "share")} for r in rows]


# ----------------------------------------------------------------------------- trace timeline
def load_trace(where: "str | os.PathLike | ProfileRun") -> list[dict]:
    """Events of `trace_view.json` with numeric `ts`/`dur` (µs) and a `process` name added.
    Taught in notebooks/08_profiling.ipynb."""
    if isinstance(where, ProfileRun):
        path = where.trace_path
    else:
        p = Path(where)
        path = p if p.suffix == ".json" else _profile_dir(p) / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    if not path.exists():
        raise ValueError(f"load_trace: {str(path)!r} does not exist; fix: pass a trace_view.json, a "
                         "*_ascend_ms folder, or the ProfileRun returned by profile_steps")
    raw = json.loads(path.read_text())
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    names = {e.get("pid"): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = []
    for e in events:
        if e.get("ph") != "X":
            continue
        e = dict(e)
        e["ts"] = _num(e.get("ts"))
        e["dur"] = _num(e.get("dur"))
        e["process"] = names.get(e.get("pid"), "")
        e["thread"] = threads.get((e.get("pid"), e.get("tid")), "")
        out.append(e)
    return out


def op_events(events: Iterable[dict]) -> list[dict]:
    """The events that are operator executions (CPU kernels, Ascend tasks, HCCL), sorted by start.
    Taught in notebooks/08_profiling.ipynb."""
    ops = [e for e in events
           if e.get("process") in _OP_PROCESS_NAMES or e.get("args", {}).get("type") == "HostCpuOps"]
    return sorted(ops, key=lambda e: e["ts"])


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _clip(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _subtract(base: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the (disjoint, sorted) `base` intervals not covered by `cut`."""
    out = []
    cut = _union(cut)
    for a, b in base:
        cur = a
        for c, d in cut:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def step_breakdown(where: "str | os.PathLike | ProfileRun | list[dict]", *,
                   step_windows_us: Sequence[tuple[float, float]] | None = None,
                   data_windows_us: Sequence[tuple[float, float]] | None = None) -> dict:
    """Split the recorded steps' wall time into compute, communication, data and host/idle.

    - compute: time covered by at least one non-communication op;
    - communication: time covered by communication ops and not by compute (exposed communication);
    - data: time inside `data_fn` (only known when profiling ran with `profile_steps(data_fn=...)`)
      and not covered by ops;
    - host: the rest of the step: framework/Python overhead, kernel launches, waiting.

    On Ascend, the trace's "Overlap Analysis" process (Computing / Communication(Not Overlapped) /
    Free) is used directly. Without step windows (a bare trace file) the window is first op start to
    last op end, so host time outside that span is not counted. Returns totals in ms, shares (0..1)
    and a per-step list. Taught in notebooks/08_profiling.ipynb.
    """
    if isinstance(where, ProfileRun):
        step_windows_us = step_windows_us or where.step_windows_us
        data_windows_us = data_windows_us or where.data_windows_us
    events = where if isinstance(where, list) else load_trace(where)
    overlap = [e for e in events if e.get("process") == "Overlap Analysis"]
    ops = op_events(events)
    if not ops and not overlap:
        raise ValueError("step_breakdown: the trace holds no operator events; fix: profile at least one "
                         "active step that runs a MindSpore network")

    if overlap:
        def kind(e: dict) -> str:
            label = f"{e.get('name', '')} {e.get('thread', '')}"
            if "Not Overlapped" in label:
                return "comm"
            if "Communication" in label:
                return "comm_total"
            if "Computing" in label:
                return "compute"
            if "Free" in label:
                return "free"
            return "other"
        compute_iv = [(e["ts"], e["ts"] + e["dur"]) for e in overlap if kind(e) == "compute"]
        comm_iv = [(e["ts"], e["ts"] + e["dur"]) for e in overlap if kind(e) == "comm"]
    else:
        compute_iv = [(e["ts"], e["ts"] + e["dur"]) for e in ops if not COMM_OP_PATTERN.search(e.get("name", ""))]
        comm_iv = [(e["ts"], e["ts"] + e["dur"]) for e in ops if COMM_OP_PATTERN.search(e.get("name", ""))]

    all_iv = compute_iv + comm_iv
    windows = list(step_windows_us or [(min(a for a, _ in all_iv), max(b for _, b in all_iv))])
    data_windows = list(data_windows_us or [])

    per_step = []
    for i, (lo, hi) in enumerate(windows):
        comp = _union(_clip(compute_iv, lo, hi))
        comm_exposed = _subtract(_union(_clip(comm_iv, lo, hi)), comp)
        busy = _union(comp + comm_exposed)
        data = _subtract(_union(_clip(data_windows, lo, hi)), busy)
        step_us = hi - lo
        c, m, dt = _length(comp), _length(comm_exposed), _length(data)
        host = max(step_us - c - m - dt, 0.0)
        per_step.append({"step": i, "start_us": lo, "step_ms": step_us / 1e3, "compute_ms": c / 1e3,
                         "communication_ms": m / 1e3, "data_ms": dt / 1e3, "host_ms": host / 1e3})
    tot = {k: sum(s[k] for s in per_step) for k in ("step_ms", "compute_ms", "communication_ms",
                                                    "data_ms", "host_ms")}
    denom = tot["step_ms"] or 1.0
    n_ops = sum(1 for e in ops if any(lo <= e["ts"] < hi for lo, hi in windows))
    return {
        **tot,
        "steps": len(per_step),
        "compute_share": tot["compute_ms"] / denom,
        "communication_share": tot["communication_ms"] / denom,
        "data_share": tot["data_ms"] / denom,
        "host_share": tot["host_ms"] / denom,
        "ops_per_step": n_ops / max(len(per_step), 1),
        "mean_op_us": (tot["compute_ms"] + tot["communication_ms"]) * 1e3 / n_ops if n_ops else 0.0,
        "source": "Overlap Analysis" if overlap else "op events",
        "per_step": per_step,
    }


# ----------------------------------------------------------------------------- diagnosis
@dataclass(frozen=True)
class Diagnosis:
    """A bottleneck class, the rule that chose it and the numbers it used. Taught in notebooks/08_profiling.ipynb."""

    bottleneck: str            # "compute-bound" | "communication-bound" | "data-bound" | "launch/host-bound"
    rule: str
    numbers: dict
    advice: str

    def __str__(self) -> str:
        nums = ", ".join(f"{k}={v:.1%}" if k.endswith("share") else f"{k}={v:.4g}"
                         for k, v in self.numbers.items())
        return f"{self.bottleneck}: {self.rule} [{nums}] -> {self.advice}"


_ADVICE = {
    "data-bound": "feed faster: raise num_parallel_workers, prefetch (ds.config.set_prefetch_size), "
                  "move preprocessing offline (MindRecord)",
    "communication-bound": "cut or hide communication: fuse gradients (comm fusion), overlap with compute, "
                           "rethink the dp/mp/pp split so less crosses the slow links",
    "launch/host-bound": "give the device bigger, fewer kernels: GRAPH_MODE / jit, larger batch or "
                         "sequence, operator fusion; check the host thread settings",
    "compute-bound": "the ops themselves dominate: tune the top op types (AOE on Ascend), lower precision "
                     "where it is faster, recompute less",
}


def diagnose(breakdown: dict, *, threshold: float = 0.3) -> Diagnosis:
    """Name the bottleneck from `step_breakdown(...)` output.

    Rule: among the non-compute shares (data, communication, host) take the largest; if it is at least
    `threshold` of step time, that is the bottleneck, otherwise the step is compute-bound. The default
    0.3 follows the rule of thumb that a pipeline stage eating 30% of the step is worth fixing first.

    Example:
        >>> diagnose({"compute_share": 0.5, "communication_share": 0.05, "data_share": 0.4,
        ...           "host_share": 0.05}).bottleneck
        'data-bound'

    Taught in notebooks/08_profiling.ipynb.
    """
    need = ("compute_share", "communication_share", "data_share", "host_share")
    if not isinstance(breakdown, dict) or any(k not in breakdown for k in need):
        raise ValueError(f"diagnose: breakdown must be the dict returned by step_breakdown with keys {need}; "
                         f"got {type(breakdown).__name__} with keys "
                         f"{sorted(breakdown) if isinstance(breakdown, dict) else '-'}")
    if not (isinstance(threshold, (int, float)) and 0 < threshold < 1):
        raise ValueError(f"diagnose: threshold={threshold!r} is invalid; fix: pass a share in (0, 1), e.g. 0.3")
    numbers = {k: float(breakdown[k]) for k in need}
    if breakdown.get("mean_op_us"):
        numbers["mean_op_us"] = float(breakdown["mean_op_us"])
    candidates = {"data-bound": numbers["data_share"],
                  "communication-bound": numbers["communication_share"],
                  "launch/host-bound": numbers["host_share"]}
    name, share = max(candidates.items(), key=lambda kv: kv[1])
    if share >= threshold:
        label = {"data-bound": "data_share", "communication-bound": "communication_share",
                 "launch/host-bound": "host_share"}[name]
        rule = f"{label} = {share:.1%} is the largest non-compute share and >= threshold {threshold:.0%}"
    else:
        name = "compute-bound"
        rule = (f"every non-compute share is < threshold {threshold:.0%} (largest: {share:.1%}); "
                f"compute covers {numbers['compute_share']:.1%} of step time")
    return Diagnosis(bottleneck=name, rule=rule, numbers=numbers, advice=_ADVICE[name])


def window_coverage(run: "ProfileRun", *, events: list[dict] | None = None) -> dict:
    """How much of the op time in the profiler's trace lies inside the wall-clock step windows.

    `profile_steps` stamps each recorded step with `time.time_ns()` around the call; the op events come from
    the profiler's own `trace_view.json`. The two are measured independently, so they are a check on each
    other: the step function blocks until its ops finish and only the active steps are recorded, so every op
    of the trace should run inside a window (coverage 1). Coverage well below 1 means the clocks disagree or
    the trace holds ops from steps outside the windows, and then `step_breakdown`'s shares (ops inside a
    window over its wall time) do not mean what they say.
    Returns {"trace_op_ms": busy time of all ops in the trace, "in_windows_ms": the part inside the windows,
    "coverage": their ratio, "windows": number of windows}.

    Example (a synthetic trace: ops 0-40 and 90-110 us, one window 0-100 us):
        >>> ev = [{"ts": 0.0, "dur": 40.0, "process": "CPU OP"}, {"ts": 90.0, "dur": 20.0, "process": "CPU OP"}]
        >>> window_coverage(ProfileRun(Path("."), [1e-4], [0.0], [0], step_windows_us=[(0.0, 100.0)]), events=ev)
        {'trace_op_ms': 0.06, 'in_windows_ms': 0.05, 'coverage': 0.8333333333333334, 'windows': 1}

    Taught in notebooks/08_profiling.ipynb.
    """
    if not isinstance(run, ProfileRun) or not run.step_windows_us:
        raise ValueError("window_coverage: run must be the ProfileRun returned by profile_steps (it carries the "
                         "wall-clock step windows); fix: pass profile_steps(...)'s result")
    ops = op_events(events if events is not None else load_trace(run))
    busy = _union((e["ts"], e["ts"] + e["dur"]) for e in ops)
    total = _length(busy)
    inside = sum(_length(_clip(busy, lo, hi)) for lo, hi in run.step_windows_us)
    return {"trace_op_ms": total / 1e3, "in_windows_ms": inside / 1e3,
            "coverage": inside / total if total else float("nan"), "windows": len(run.step_windows_us)}


_NON_COMPUTE = {"data-bound": "data", "communication-bound": "communication", "launch/host-bound": "host"}


def diagnosis_margin(breakdown: dict, *, threshold: float = 0.3, min_steps: int = 3) -> dict:
    """`diagnose`'s verdict with its distance to the threshold, against the deciding share's step-to-step range.

    The deciding share is the largest non-compute share of the window (data, communication or host): it alone
    decides between its own bottleneck (>= threshold) and compute-bound (< threshold). Each recorded step gives
    its own value of that share (its part over its wall time); their range (max - min) is the noise of this run.
    The verdict is decided when the window's share is farther from the threshold than that range, from at least
    `min_steps` steps (the range of two steps says little); otherwise `verdict` is 'undecided', which no caller
    may claim as a result. Returns {verdict, bottleneck (diagnose's, decided or not), share_name, share,
    threshold, margin, per_step, step_range, steps, decided}.

    Example (host 28 % against the 30 % threshold, steps at 24 % and 32 %: undecided):
        >>> b = {"compute_share": 0.72, "communication_share": 0.0, "data_share": 0.0, "host_share": 0.28,
        ...      "per_step": [{"step_ms": 10, "compute_ms": 7.6, "communication_ms": 0, "data_ms": 0, "host_ms": 2.4},
        ...                   {"step_ms": 10, "compute_ms": 6.8, "communication_ms": 0, "data_ms": 0, "host_ms": 3.2},
        ...                   {"step_ms": 10, "compute_ms": 7.2, "communication_ms": 0, "data_ms": 0, "host_ms": 2.8}]}
        >>> m = diagnosis_margin(b)
        >>> m["bottleneck"], m["verdict"], round(m["margin"], 3), round(m["step_range"], 3)
        ('compute-bound', 'undecided', 0.02, 0.08)

    Taught in notebooks/08_profiling.ipynb.
    """
    d = diagnose(breakdown, threshold=threshold)
    if not isinstance(min_steps, int) or min_steps < 2:
        raise ValueError(f"diagnosis_margin: min_steps={min_steps!r} is invalid; fix: at least 2 steps give a range")
    shares = {name: float(breakdown[f"{kind}_share"]) for name, kind in _NON_COMPUTE.items()}
    name = max(shares, key=shares.get)
    kind = _NON_COMPUTE[name]
    per_step = [s[f"{kind}_ms"] / s["step_ms"] for s in breakdown.get("per_step", []) if s.get("step_ms")]
    step_range = (max(per_step) - min(per_step)) if per_step else float("nan")
    margin = abs(shares[name] - threshold)
    decided = len(per_step) >= min_steps and margin > step_range
    return {"verdict": d.bottleneck if decided else "undecided", "bottleneck": d.bottleneck,
            "share_name": f"{kind}_share", "share": shares[name], "threshold": threshold, "margin": margin,
            "per_step": per_step, "step_range": step_range, "steps": len(per_step), "decided": decided}


def overhead_ratio(profiled_step_s: Sequence[float], plain_step_s: Sequence[float]) -> float:
    """Median profiled step time over median plain step time (1.0 = no overhead).
    Taught in notebooks/08_profiling.ipynb, which compares profiled and plain steps with claim_timing."""
    if not len(profiled_step_s) or not len(plain_step_s):
        raise ValueError("overhead_ratio: both step-time lists must be non-empty; fix: time at least one "
                         "step with and one without the profiler")
    return statistics.median(profiled_step_s) / statistics.median(plain_step_s)
