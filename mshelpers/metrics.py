"""Throughput and utilisation: FLOPs per token, MFU, share of achievable, a per-step logger.

Example:
    >>> from mshelpers.metrics import flops_per_token, mfu
    >>> fpt = flops_per_token(3_688_704, n_layers=4, hidden_size=256, seq_len=128)
    >>> fpt
    23705088
    >>> round(mfu(tokens_per_s=6000, flops_per_token=fpt, n_devices=1, peak_flops_per_device=185e9), 3)
    0.769

MFU (model FLOPs utilisation, PaLM appendix B) counts only the FLOPs the model needs,
never recomputation, so recompute lowers MFU even though the hardware works as hard.
The denominator is the hardware's peak (`peak.hardware_peak_flops()`: the theoretical peak on a CPU,
the datasheet on an accelerator), as PaLM defines it, so figures compare with published ones; the
measured MatMul peak (`peak.peak_flops()`) is shown beside it as "share of achievable". The peaks, the
clock probe and the peak cache live in peak.py; this module reaches it only in `share_of_achievable`
without a peak given.
"""
from __future__ import annotations

import csv
import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any


# --- FLOPs and MFU ---
def flops_per_token(n_params: int, n_layers: int, hidden_size: int, seq_len: int, *,
                    attention: bool = True) -> int:
    """Training FLOPs per token: 6*N + 12*L*H*T (PaLM, Chowdhery et al. 2022, appendix B).

    6N covers the forward (2N) and backward (4N) matmuls over all N parameters;
    12*L*H*T adds the attention score and value matmuls (H = heads * head_dim =
    hidden_size, T = sequence length). `attention=False` returns 6N only.

    Taught in notebooks/00_environment.ipynb.
    """
    n_params, n_layers, hidden_size, seq_len = (
        _count("flops_per_token", name, v) for name, v in (("n_params", n_params), ("n_layers", n_layers),
                                                            ("hidden_size", hidden_size), ("seq_len", seq_len)))
    return 6 * n_params + (12 * n_layers * hidden_size * seq_len if attention else 0)


def _count(fn: str, name: str, v: Any) -> int:
    """A positive count from any integral number: int, numpy ints, or a float with an integral value (7e9)."""
    import numbers
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{fn}: {name}={v!r} is not a number; fix: pass a positive integer")
    if isinstance(v, numbers.Integral) or (math.isfinite(float(v)) and float(v).is_integer()):
        if int(v) > 0:
            return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer"
                     + (" (a count has no fraction)" if isinstance(v, numbers.Real) and math.isfinite(float(v))
                        and int(v) > 0 else ""))


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation as a fraction: achieved model FLOP/s over the devices' peak.

    tokens_per_s is global (all devices). Warns when the result exceeds 1.0, which
    cannot happen: the peak is too low or the token rate is wrong.

    Taught in notebooks/01_pynative_baseline.ipynb.
    """
    import numbers
    for name, v in (("tokens_per_s", tokens_per_s), ("flops_per_token", flops_per_token),
                    ("peak_flops_per_device", peak_flops_per_device)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(float(v)) or float(v) < 0:
            raise ValueError(f"mfu: {name}={v!r} is invalid; fix: pass a number >= 0")
    tokens_per_s, flops_per_token, peak_flops_per_device = (float(tokens_per_s), float(flops_per_token),
                                                            float(peak_flops_per_device))
    if peak_flops_per_device == 0:
        raise ValueError("mfu: peak_flops_per_device=0 is invalid; fix: measure it with "
                         "peak_flops() or use the device's datasheet figure")
    n_devices = _count("mfu", "n_devices", n_devices)
    value = tokens_per_s * flops_per_token / (n_devices * peak_flops_per_device)
    if value > 1.0:
        warnings.warn(f"MFU = {value:.2f} > 1 is impossible: {tokens_per_s:.4g} tokens/s x "
                      f"{flops_per_token:.4g} FLOPs/token exceeds {n_devices} x {peak_flops_per_device:.4g} FLOP/s; "
                      "the peak is too low or the token rate is wrong", UserWarning, stacklevel=2)
    return value


def share_of_achievable(tokens_per_s: float, flops_per_token: float, n_devices: int = 1,
                        measured_peak_flops: float | None = None) -> float:
    """Achieved model FLOP/s over the measured MatMul peak (`peak.peak_flops()`, cached; read from peak.py
    only when `measured_peak_flops` is not given): how much of what this machine's kernels actually reach.
    Shown beside MFU, never instead of it.

    Taught in notebooks/01_pynative_baseline.ipynb.
    """
    peak = measured_peak_flops
    if peak is None:
        if __package__:
            from .peak import peak_flops
        else:  # copied beside its siblings as plain files
            from peak import peak_flops
        peak = peak_flops()
    return float(tokens_per_s) * float(flops_per_token) / (_count("share_of_achievable", "n_devices", n_devices)
                                                           * float(peak))


# --- this process's peak memory ---
def peak_memory_mb() -> float:
    """Peak memory of this process in MiB: device peak on Ascend/GPU, peak RSS on CPU.

    On CPU `ms.runtime.max_memory_allocated()` returns 0, so the process peak RSS
    (which only grows) is the figure; compare runs in fresh processes.

    Taught in notebooks/11_your_own_model.ipynb (StepLogger's peak_mem_mb).
    """
    import sys
    ms = sys.modules.get("mindspore")   # a process that has not imported MindSpore has no device memory
    if ms is not None:
        try:
            dev = ms.runtime.max_memory_allocated()
            if dev:
                return dev / 2**20
        except Exception:  # noqa: BLE001
            pass
    # timing.peak_rss_mb is the reader; these lines of it are inlined because StepLogger logs this every step
    # and metrics works copied alone. VmHWM: this process's own peak (ru_maxrss survives fork+exec: a parent's).
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        import resource
        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return ru / 2**20 if sys.platform == "darwin" else ru / 1024


# --- StepLogger: one CSV row per step ---
COLUMNS = ("step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu",
           "peak_mem_mb", "overflow", "loss_scale", "spike")

# What a train cell returns, and how StepLogger reads it (the `outputs=` contract).
OUTPUT_FORMATS = ("loss", "loss_overflow_scale")

_CALLBACK_CLASSES: dict[type, type] = {}


def _as_callback_class(cls: type) -> type:
    """cls with mindspore.train.Callback mixed in (MindSpore's Model.train checks isinstance(cb, Callback))."""
    if cls not in _CALLBACK_CLASSES:
        from mindspore.train import Callback
        _CALLBACK_CLASSES[cls] = cls if issubclass(cls, Callback) else type(cls.__name__, (cls, Callback),
                                                                            {"__module__": cls.__module__})
    return _CALLBACK_CLASSES[cls]


def _scalar(what: str, v: Any) -> float:
    """A Python float from a number, a 0-d or one-element array, or a MindSpore Tensor; else one ValueError."""
    import numbers
    if hasattr(v, "asnumpy"):
        v = v.asnumpy()
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    size = getattr(v, "size", None)
    if size == 1 and hasattr(v, "reshape"):
        return float(v.reshape(()))
    shape = getattr(v, "shape", None)
    raise ValueError(f"StepLogger: {what}={v!r:.80} is not a scalar"
                     + (f" (shape {tuple(shape)})" if shape is not None else f" (type {type(v).__name__})")
                     + f"; fix: reduce it to one number (e.g. .mean()) in the network, or pass "
                       f"outputs=<function returning {{'loss': float, ...}}>")


class StepLogger:
    """One CSV row per step: loss, lr, grad norm, time, tokens/s, MFU, peak memory, overflow, scale.

    From a plain loop:
        log = StepLogger("build/runs/x.csv", tokens_per_step=1024, flops_per_token=fpt,
                         peak_flops_per_device=185e9)
        log.log_step(step=1, loss=6.9, step_time_s=0.2)
    As a MindSpore Callback (`model.train(..., callbacks=[log])`) it times each step and reads
    the network's output by an explicit contract, `outputs=`:
        "loss"                 (default) the train cell returns one scalar loss; anything else is a ValueError
        "loss_overflow_scale"  it returns (loss, overflow, loss_scale), as TrainOneStepWithLossScaleCell does
        a function             f(net_outputs) -> dict with "loss" and any of "overflow", "loss_scale",
                               "grad_norm", "lr" (e.g. for a cell returning (loss, acc, n_tokens))
    lr and grad_norm come from `lr_fn(step) -> float` and `grad_norm_fn(step) -> float` when given (a
    train cell can keep its last grad norm in a Parameter for grad_norm_fn to read); otherwise lr is the
    optimizer's learning rate when it is a fixed number, and grad_norm is NaN.
    The logger is a `mindspore.train.Callback` when MindSpore is already imported at construction;
    `log.as_callback()` makes it one explicitly. The module itself never imports MindSpore.

    An existing non-empty CSV is never truncated silently: pass `append=True` to continue it (a resumed
    run) or `overwrite=True` to start it over; with neither, the constructor raises ValueError.
    tokens_per_step and n_devices are global, so tokens/s is the job's, not one rank's.

    Taught in notebooks/11_your_own_model.ipynb.
    """

    def __init__(self, csv_path: str | os.PathLike | None, tokens_per_step: int, flops_per_token: float,
                 peak_flops_per_device: float, n_devices: int = 1, lr_fn: Any = None, *,
                 grad_norm_fn: Any = None, outputs: Any = "loss", append: bool = False,
                 overwrite: bool = False) -> None:
        import numbers
        import sys
        if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, numbers.Real) \
                or not tokens_per_step > 0:
            raise ValueError(f"StepLogger: tokens_per_step={tokens_per_step!r} is invalid; fix: pass batch*seq_len > 0")
        if isinstance(n_devices, bool) or not isinstance(n_devices, numbers.Real) or not n_devices >= 1:
            raise ValueError(f"StepLogger: n_devices={n_devices!r} is invalid; fix: pass >= 1")
        tokens_per_step = _count("StepLogger", "tokens_per_step", tokens_per_step)
        n_devices = _count("StepLogger", "n_devices", n_devices)
        for name, v in (("flops_per_token", flops_per_token), ("peak_flops_per_device", peak_flops_per_device)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not float(v) > 0:
                raise ValueError(f"StepLogger: {name}={v!r} is invalid; fix: pass a number > 0")
        if not (outputs in OUTPUT_FORMATS or callable(outputs)):
            raise ValueError(f"StepLogger: outputs={outputs!r} is invalid; fix: one of {OUTPUT_FORMATS} or a "
                             "function net_outputs -> {'loss': ..., 'overflow': ..., 'loss_scale': ...}")
        for name, fn in (("lr_fn", lr_fn), ("grad_norm_fn", grad_norm_fn)):
            if fn is not None and not callable(fn):
                raise ValueError(f"StepLogger: {name}={fn!r} is not callable; fix: pass a function step -> float")
        if append and overwrite:
            raise ValueError("StepLogger: append=True and overwrite=True contradict; fix: pick one")
        if "mindspore" in sys.modules and type(self) is not _as_callback_class(type(self)):
            self.__class__ = _as_callback_class(type(self))
            super(StepLogger, self).__init__()          # Callback.__init__, if it has one
        self.csv_path = Path(csv_path) if csv_path else None
        self.tokens_per_step, self.flops_per_token = tokens_per_step, float(flops_per_token)
        self.peak_flops_per_device, self.n_devices = float(peak_flops_per_device), n_devices
        self.lr_fn, self.grad_norm_fn, self.outputs = lr_fn, grad_norm_fn, outputs
        self.rows: list[dict] = []
        if self.csv_path:
            exists = self.csv_path.exists() and self.csv_path.stat().st_size > 0
            if exists and not (append or overwrite):
                raise ValueError(f"StepLogger: csv_path={str(self.csv_path)!r} already exists and is not empty; "
                                 "fix: append=True to continue it (a resumed run) or overwrite=True to start over")
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            if exists and append:
                with self.csv_path.open(newline="") as f:
                    header = next(csv.reader(f), [])
                if tuple(header) != COLUMNS:
                    raise ValueError(f"StepLogger: csv_path={str(self.csv_path)!r} has columns {header}, not "
                                     f"{list(COLUMNS)}; fix: append only to a StepLogger CSV, or overwrite=True")
            else:
                with self.csv_path.open("w", newline="") as f:
                    csv.writer(f).writerow(COLUMNS)

    def as_callback(self) -> "StepLogger":
        """This logger as a `mindspore.train.Callback` (imports MindSpore); returns self."""
        if type(self) is not _as_callback_class(type(self)):
            self.__class__ = _as_callback_class(type(self))
        return self

    def log_step(self, step: int, loss: float, step_time_s: float, *, lr: float = float("nan"),
                 grad_norm: float = float("nan"), overflow: bool = False, loss_scale: float = 1.0,
                 peak_mem_mb: float | None = None, spike: bool = False) -> dict:
        """Log one step; `spike=True` marks a step redone after a spike rollback (mshelpers.stability).

        loss, lr, grad_norm, step_time_s may be Python or numpy numbers, 0-d arrays or MindSpore Tensors;
        a loss with more than one element is a ValueError (reduce it first).
        """
        loss, step_time_s = _scalar("loss", loss), _scalar("step_time_s", step_time_s)
        lr, grad_norm = _scalar("lr", lr), _scalar("grad_norm", grad_norm)
        tps = self.tokens_per_step / step_time_s if step_time_s > 0 else float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a compile step can look odd; MFU > 1 is checked on summaries
            u = mfu(tps, self.flops_per_token, self.n_devices, self.peak_flops_per_device) if tps == tps else tps
        row = dict(step=int(step), loss=loss, lr=lr, grad_norm=grad_norm,
                   step_time_s=step_time_s, tokens_per_s=tps, mfu=u,
                   peak_mem_mb=peak_memory_mb() if peak_mem_mb is None else float(peak_mem_mb),
                   overflow=bool(overflow), loss_scale=_scalar("loss_scale", loss_scale), spike=bool(spike))
        self.rows.append(row)
        if self.csv_path:
            with self.csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=COLUMNS).writerow(row)
        return row

    def read_outputs(self, net_outputs: Any) -> dict:
        """The `outputs=` contract applied to what the train cell returned: a dict with at least "loss"."""
        if callable(self.outputs):
            got = self.outputs(net_outputs)
            if not isinstance(got, dict) or "loss" not in got:
                raise ValueError(f"StepLogger: outputs function returned {got!r:.80}; fix: return a dict with "
                                 "'loss' and optionally 'overflow', 'loss_scale', 'grad_norm', 'lr'")
            return dict(got)
        if self.outputs == "loss_overflow_scale":
            if not isinstance(net_outputs, (tuple, list)) or len(net_outputs) != 3:
                raise ValueError(f"StepLogger: outputs='loss_overflow_scale' but the network returned "
                                 f"{_describe(net_outputs)}; fix: outputs='loss' for a single loss, or a function")
            loss, overflow, scale = net_outputs
            # a Python bool is the natural overflow flag (a scalar for the flag, though not for a loss)
            flag = overflow if isinstance(overflow, bool) else bool(_scalar("overflow", overflow))
            return {"loss": loss, "overflow": flag,
                    "loss_scale": _scalar("loss_scale", scale)}
        if isinstance(net_outputs, (tuple, list)):
            raise ValueError(f"StepLogger: outputs='loss' but the network returned {_describe(net_outputs)}; "
                             "fix: outputs='loss_overflow_scale' for TrainOneStepWithLossScaleCell, or "
                             "outputs=lambda out: {'loss': out[0]} to pick the loss yourself")
        return {"loss": net_outputs}

    # ---- MindSpore Callback hooks
    def on_train_step_begin(self, run_context) -> None:
        self._t0 = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        dt = time.perf_counter() - self._t0
        got = self.read_outputs(cb.net_outputs)
        step = cb.cur_step_num
        optimizer = getattr(cb, "optimizer", None) or getattr(getattr(cb, "train_network", None), "optimizer", None)
        lr = got.get("lr", self.lr_fn(step) if self.lr_fn else _fixed_lr(optimizer))
        grad_norm = got.get("grad_norm", self.grad_norm_fn(step) if self.grad_norm_fn else float("nan"))
        self.log_step(step, got["loss"], dt, lr=lr, grad_norm=grad_norm,
                      overflow=bool(got.get("overflow", False)), loss_scale=got.get("loss_scale", 1.0))


def _describe(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    return f"one {type(out).__name__}" + (f" of shape {tuple(out.shape)}" if hasattr(out, "shape") else "")


def _fixed_lr(optimizer: Any) -> float:
    """The optimizer's learning rate when it is one number (a Parameter); NaN for schedules or no optimizer."""
    lr = getattr(optimizer, "learning_rate", None)
    try:
        if lr is not None and hasattr(lr, "asnumpy") and lr.asnumpy().size == 1:
            return float(lr.asnumpy().reshape(()))
    except Exception:  # noqa: BLE001 - a schedule cell has no single value
        pass
    return float("nan")


# --- a run's summary ---
def summarize(rows: list[dict], skip_first: int = 1) -> dict[str, Any]:
    """Compile time (first step), medians over the steady steps, final loss and counts.

    Taught in notebooks/11_your_own_model.ipynb.
    """
    if not rows:
        raise ValueError("summarize: rows is empty; fix: log at least one step")
    steady = rows[skip_first:] or rows
    med = lambda k: statistics.median(r[k] for r in steady)
    return dict(steps=len(rows), compile_time_s=rows[0]["step_time_s"], median_step_s=med("step_time_s"),
                tokens_per_s=med("tokens_per_s"), mfu=med("mfu"), final_loss=rows[-1]["loss"],
                peak_mem_mb=max(r["peak_mem_mb"] for r in rows),
                overflow_steps=sum(bool(r["overflow"]) for r in rows),
                spike_steps=sum(bool(r.get("spike", False)) for r in rows),
                nonfinite_losses=sum(not math.isfinite(r["loss"]) for r in rows))


# --- the metrics CSV of a training run: append-only, cut back on resume ---
class MetricsCSV:
    """metrics.csv, append-only: one line per step, flushed as it is written.

    A resume keeps the rows up to the checkpoint's step exactly as they were written (values untouched),
    drops the rest by writing a new file and renaming it over the old one (a kill mid-way leaves either
    file whole), and repairs a torn last line (a crash mid-write) by dropping it. `train.train` writes one per run.
    Taught in notebooks/01_pynative_baseline.ipynb (the CSV every run writes).
    """

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path, self.columns, self._f = path, list(columns), None

    def _replace_with(self, lines: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".tmp-{os.getpid()}-{self.path.name}")
        try:
            with tmp.open("w", newline="") as f:
                f.write("".join(line + "\n" for line in [",".join(self.columns), *lines]))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def start_fresh(self) -> None:
        self._replace_with([])

    def keep_upto(self, step: int, loss: float | None = None) -> tuple[list[dict], str]:
        """Keep rows with step <= `step`; return them parsed and a note on what was repaired or missing.

        Steps must rise: a row whose step repeats or runs backwards is dropped and reported. For the
        checkpoint's own step, the row whose loss equals the checkpoint's recorded `loss` is the one kept.
        """
        import csv
        import io
        if __package__:
            from .table import parse_cell
        else:  # copied beside its siblings as plain files
            from table import parse_cell
        notes = []
        raw = self.path.read_bytes().decode("utf-8", errors="replace") if self.path.exists() else ""
        lines = raw.split("\n")
        if lines[-1]:
            notes.append(f"dropped a torn last line ({lines[-1][:40]!r}...)")
        lines = lines[:-1]
        cands = []                                   # (line number, step, line, row) of well-formed rows
        if lines:
            header = next(csv.reader([lines[0]]))
            for n, line in enumerate(lines[1:], start=2):
                vals = next(csv.reader([line]), [])
                if len(vals) != len(header):
                    notes.append(f"dropped a malformed line ({line[:40]!r})")
                    continue
                r = dict(zip(header, vals))
                try:
                    st = int(r["step"])
                except (KeyError, ValueError):
                    notes.append(f"dropped a line without a step ({line[:40]!r})")
                    continue
                if st <= step:
                    cands.append((n, st, line, r))
        at = [c for c in cands if c[1] == step]
        if loss is not None and at:
            def matches(c):
                try:
                    return float(c[3].get("loss", "nan")) == loss
                except ValueError:
                    return False
            real = next((c for c in at if matches(c)), None)
            if real is None:
                notes.append(f"no row for step {step} has the checkpoint's loss {loss!r}; kept line {at[0][0]}")
            elif real is not at[0]:
                cands = [c for c in cands if c[1] != step or c is real]
                notes.append(f"kept line {real[0]} for step {step} (its loss matches the checkpoint's), "
                             f"dropped line{'s' if len(at) > 2 else ''} "
                             f"{', '.join(str(c[0]) for c in at if c is not real)}")
        kept_lines, rows, last, dropped = [], [], 0, []
        for n, st, line, r in cands:
            if st <= last:                           # a repeat, or running backwards
                dropped.append(f"step {st} at line {n} after step {last}")
                continue
            last = st
            if header != self.columns:   # an older column set: re-serialise under the current header
                buf = io.StringIO()
                csv.DictWriter(buf, fieldnames=self.columns, extrasaction="ignore", lineterminator="").writerow(r)
                line = buf.getvalue()
            kept_lines.append(line)
            rows.append({k: parse_cell(r.get(k, "")) for k in self.columns})
        if dropped:
            notes.append(f"dropped {len(dropped)} row{'s' if len(dropped) > 1 else ''} whose step repeats or runs "
                         f"backwards ({'; '.join(dropped[:5])}), keeping the first of each")
        seen = {r["step"] for r in rows}
        missing = sorted(set(range(1, step + 1)) - seen)
        if missing:
            notes.append(f"metrics.csv has no rows for {len(missing)} of steps 1..{step} (e.g. step {missing[0]}); "
                         "those steps ran before the checkpoint and are not redone")
        self._replace_with(kept_lines)
        return rows, "; ".join(notes)

    def _gone(self) -> bool:
        """The file we append to was deleted or replaced under us."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        f = os.fstat(self._f.fileno())
        return (st.st_ino, st.st_dev) != (f.st_ino, f.st_dev)

    def _recreate(self, rows: list[dict]) -> None:
        import csv
        import io
        import sys
        self._f.close()
        self._f = None
        buf = io.StringIO()
        csv.DictWriter(buf, fieldnames=self.columns, extrasaction="ignore", lineterminator="\n").writerows(rows)
        self._replace_with(buf.getvalue().splitlines())
        span = f"steps {rows[0]['step']}..{rows[-1]['step']}" if rows else "no rows"
        print(f"{self.path} disappeared during the run; re-created it from the {len(rows)} rows held in memory "
              f"({span}); no row lost", file=sys.stderr, flush=True)

    def append(self, row: dict, rows: list[dict] | None = None) -> None:
        """Append `row`; with `rows` (every row so far, this one included) a deleted file is re-created."""
        import csv
        if self._f is not None and rows is not None and self._gone():
            self._recreate(rows)
            return
        if self._f is None:
            self._f = self.path.open("a", newline="")
            self._w = csv.DictWriter(self._f, fieldnames=self.columns, extrasaction="ignore")
        self._w.writerow(row)
        self._f.flush()

    def close(self, rows: list[dict] | None = None) -> None:
        if self._f is not None and rows is not None and self._gone():
            self._recreate(rows)
        if self._f is not None:
            self._f.close()
            self._f = None
