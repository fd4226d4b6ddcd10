"""MindIR export/load, Ascend AOE commands and switches, and an AOE-shaped tuning loop that runs anywhere.

AOE (Ascend Optimization Engine, part of the CANN toolkit) times candidate tilings of each operator
on the target chip, keeps the fastest in a "custom knowledge bank", and the next graph compile
reads that bank. `autotune` is the same loop for knobs you can time on any machine: try each
candidate, time it `repeats` times, keep the best, save it as JSON, load it on the next run.

Example (`measure_fn` here is a cost model, seq_len**2 * batch_size; `TrainStepTimer(cfg)` times real
training steps instead, see its docstring):
    >>> import os, tempfile
    >>> from mshelpers.tuning import autotune, load_best, aoe_command
    >>> bank = os.path.join(tempfile.mkdtemp(), "bucket.json")   # e.g. build/tuning/bucket.json
    >>> result = autotune([{"seq_len": 128, "batch_size": 8}, {"seq_len": 64, "batch_size": 16}],
    ...                   measure_fn=lambda c: 1e-6 * c["seq_len"] ** 2 * c["batch_size"],
    ...                   repeats=3, save_to=bank, progress=False)
    >>> result.best                         # the fastest candidate
    {'seq_len': 64, 'batch_size': 16}
    >>> [(r["label"], r["vs_best"]) for r in result.rows]
    [('seq_len=64, batch_size=16', 1.0), ('seq_len=128, batch_size=8', 2.0)]
    >>> load_best(bank)                     # ... in the next run
    {'seq_len': 64, 'batch_size': 16}
    >>> aoe_command("build/mini.air", job_type=2, output_dir="build/aoe")
    ['aoe', '--model=build/mini.air', '--framework=1', '--job_type=2', '--output=build/aoe/mini_aoe']

Facts checked against MindSpore 2.9 and the CANN AOE manual:
- online tuning is switched by `mindspore.device_context.ascend.op_tuning.aoe_tune_mode("online")` and
  `aoe_job_type("1"|"2")` (MindSpore >= 2.5); older releases used
  `ms.set_context(aoe_tune_mode="online", aoe_config={"job_type": "2"})`. Each can be set once per process.
- the offline `aoe` CLI reads a MindSpore model as `.air` (`--framework=1`), not `.mindir`; export
  with `ms.export(net, x, file_name=..., file_format="AIR")` on an Ascend machine.
- tuned results land in the knowledge bank under `TUNE_BANK_PATH`; set the same variable when the
  training job compiles next and GE picks the tuned tilings up.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


AOE_JOB_TYPES = {1: "subgraph tuning", 2: "operator tuning"}
# --framework values of the aoe CLI, by model suffix (CANN AOE manual, "--framework").
_AOE_FRAMEWORK = {".air": 1, ".pb": 3, ".onnx": 5}


# ----------------------------------------------------------------------------- MindIR
def export_mindir(net: Any, inputs: Any | Sequence[Any], path: str | os.PathLike) -> Path:
    """Export `net` traced with `inputs` (fixed shapes) to `<path>.mindir`; return the file path.
    Taught with the rest of tuning.py in notebooks/07_mindir_aoe.ipynb."""
    import mindspore as ms
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    if not inputs or not all(isinstance(x, ms.Tensor) for x in inputs):
        raise ValueError("export_mindir: inputs must be one or more mindspore.Tensor with the static shape "
                         "to export, e.g. ms.Tensor(np.zeros((1, 128), np.int32))")
    base = Path(path)
    base = base.with_suffix("") if base.suffix == ".mindir" else base
    base.parent.mkdir(parents=True, exist_ok=True)
    ms.export(net, *inputs, file_name=str(base), file_format="MINDIR")
    out = base.with_suffix(".mindir")
    if not out.exists():
        raise RuntimeError(f"export_mindir: ms.export returned but {out} does not exist")
    return out


def load_mindir(path: str | os.PathLike) -> tuple[Any, float]:
    """`nn.GraphCell` for a .mindir file, plus the load time in seconds.
    Taught with the rest of tuning.py in notebooks/07_mindir_aoe.ipynb."""
    p = Path(path)
    if p.suffix != ".mindir" or not p.is_file():
        raise ValueError(f"load_mindir: path={str(p)!r} is not an existing .mindir file; "
                         "fix: pass the path export_mindir returned")
    import mindspore as ms
    from mindspore import nn
    t0 = time.perf_counter()
    cell = nn.GraphCell(ms.load(str(p)))
    return cell, time.perf_counter() - t0


def _first_array(y: Any):
    return (y[0] if isinstance(y, (tuple, list)) else y).asnumpy()


def mindir_roundtrip(net: Any, inputs: Any | Sequence[Any], path: str | os.PathLike) -> dict:
    """Export `net` to MindIR, load it back as a GraphCell and compare outputs on `inputs`.

    Returns file, file_mb, export_s, load_s, first_call_s (includes the loaded graph's compile),
    max_abs_diff and identical (bitwise equal first outputs).
    Taught in notebooks/07_mindir_aoe.ipynb.
    """
    import numpy as np
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    reference = _first_array(net(*inputs))
    t0 = time.perf_counter()
    file = export_mindir(net, inputs, path)
    export_s = time.perf_counter() - t0
    cell, load_s = load_mindir(file)
    t0 = time.perf_counter()
    loaded = _first_array(cell(*inputs))
    first_call_s = time.perf_counter() - t0
    return {"file": str(file), "file_mb": file.stat().st_size / 2**20, "export_s": export_s,
            "load_s": load_s, "first_call_s": first_call_s, "output_shape": tuple(reference.shape),
            "max_abs_diff": float(np.max(np.abs(reference.astype(np.float64) - loaded.astype(np.float64)))),
            "identical": bool(reference.shape == loaded.shape and np.array_equal(reference, loaded))}


# ----------------------------------------------------------------------------- AOE (Ascend)
def aoe_available() -> bool:
    """True if the CANN `aoe` binary is on PATH (it ships with the Ascend toolkit, not with pip).
    Taught in notebooks/07_mindir_aoe.ipynb."""
    return shutil.which("aoe") is not None


def _job_type(job_type: Any) -> int:
    try:
        jt = int(job_type)
    except (TypeError, ValueError):
        jt = None
    if jt not in AOE_JOB_TYPES or isinstance(job_type, bool):
        raise ValueError(f"job_type={job_type!r} is invalid; fix: use 1 ({AOE_JOB_TYPES[1]}) or "
                         f"2 ({AOE_JOB_TYPES[2]}); tune subgraphs (1) first, then operators (2)")
    return jt


def aoe_command(model_path: str | os.PathLike, job_type: int | str,
                output_dir: str | os.PathLike) -> list[str]:
    """The offline AOE command line as an argument list (for subprocess.run or printing).

    `model_path` is the exported model; for MindSpore that is an `.air` file (`--framework=1`).
    The tuned offline model goes to `<output_dir>/<stem>_aoe.om`; pair the command with
    `aoe_env(output_dir)` so the knowledge bank lands in `output_dir` too.
    Taught in notebooks/07_mindir_aoe.ipynb.
    """
    p = Path(model_path)
    if p.suffix == ".mindir":
        raise ValueError(f"aoe_command: model_path={str(p)!r} is MindIR, which the aoe CLI does not read; "
                         "fix: export with ms.export(net, x, file_name=..., file_format='AIR') on Ascend and "
                         "pass the .air file, or use online tuning (enable_online_tuning) inside training")
    if p.suffix not in _AOE_FRAMEWORK:
        raise ValueError(f"aoe_command: model_path={str(p)!r} has suffix {p.suffix!r}; fix: pass one of "
                         f"{sorted(_AOE_FRAMEWORK)} (MindSpore models: .air)")
    jt = _job_type(job_type)
    if output_dir is None or str(output_dir) == "":
        raise ValueError("aoe_command: output_dir is empty; fix: pass a folder for the tuned model and bank")
    out = Path(output_dir) / f"{p.stem}_aoe"
    return ["aoe", f"--model={p}", f"--framework={_AOE_FRAMEWORK[p.suffix]}", f"--job_type={jt}",
            f"--output={out}"]


def aoe_env(output_dir: str | os.PathLike) -> dict[str, str]:
    """Environment for AOE and for the next compile: both must see the same TUNE_BANK_PATH.
    Taught in notebooks/07_mindir_aoe.ipynb."""
    return {"TUNE_BANK_PATH": str(Path(output_dir).resolve() / "tune_bank")}


def online_tuning_api() -> str:
    """Which switch this MindSpore has for online AOE tuning (introspection only; safe on CPU).
    Taught in notebooks/07_mindir_aoe.ipynb."""
    try:
        from mindspore.device_context.ascend import op_tuning
        if hasattr(op_tuning, "aoe_tune_mode") and hasattr(op_tuning, "aoe_job_type"):
            return "mindspore.device_context.ascend.op_tuning"
    except ImportError:
        pass
    return "mindspore.set_context"


def online_tuning_code(job_type: int | str = 2) -> str:
    """The Python lines that switch online tuning on with this MindSpore's API (for printing).
    Taught in notebooks/07_mindir_aoe.ipynb."""
    jt = _job_type(job_type)
    if online_tuning_api() == "mindspore.device_context.ascend.op_tuning":
        return ('import mindspore as ms\n'
                'ms.device_context.ascend.op_tuning.aoe_tune_mode("online")\n'
                f'ms.device_context.ascend.op_tuning.aoe_job_type("{jt}")')
    return f'import mindspore as ms\nms.set_context(aoe_tune_mode="online", aoe_config={{"job_type": "{jt}"}})'


def enable_online_tuning(job_type: int | str = 2) -> str:
    """Switch online AOE tuning on for the next graph compile (Ascend only); return the API used.

    Call it before the first compile, once per process. On CPU/GPU MindSpore would only log an error,
    so this raises `mshelpers.device.DeviceUnavailable` instead.
    Taught in notebooks/07_mindir_aoe.ipynb.
    """
    jt = _job_type(job_type)
    import mindspore as ms
    target = ms.get_context("device_target")
    if target != "Ascend":
        if __package__:
            from .device import DeviceUnavailable
        else:  # copied beside its siblings as plain files
            from device import DeviceUnavailable
        raise DeviceUnavailable(f"online AOE tuning needs Ascend; this process runs on {target}. "
                                f"On Ascend it would run:\n{online_tuning_code(jt)}")
    api = online_tuning_api()
    if api == "mindspore.device_context.ascend.op_tuning":
        ms.device_context.ascend.op_tuning.aoe_tune_mode("online")
        ms.device_context.ascend.op_tuning.aoe_job_type(str(jt))
    else:
        ms.set_context(aoe_tune_mode="online", aoe_config={"job_type": str(jt)})
    return api


# ----------------------------------------------------------------------------- tuning loop
@dataclass
class TuneResult:
    """Best candidate, one row per candidate (sorted fastest first), and the JSON file written.
    Taught with the rest of tuning.py in notebooks/07_mindir_aoe.ipynb."""

    best: dict
    rows: list[dict]
    path: Path | None = None
    baseline: dict | None = None
    meta: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Baseline median over best median (1.0 if the baseline is the best or absent)."""
        if self.baseline is None:
            return 1.0
        base = next((r for r in self.rows if r["config"] == self.baseline), None)
        return base["median_s"] / self.rows[0]["median_s"] if base else float("nan")


def _describe(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items()) or "(defaults)"


def autotune(candidates: Sequence[dict], measure_fn: Callable[[dict], float | Sequence[float]],
             repeats: int = 3, *, save_to: str | os.PathLike | None = None, baseline: dict | None = None,
             progress: bool = True, aa_control: bool = False, budget_s: float = 0.0, max_repeats: int = 12,
             narrow_to: float | None = None) -> TuneResult:
    """Time every candidate `repeats` times and keep the fastest (lowest median).

    `measure_fn(config)` returns seconds (lower is better), e.g. one step's time. Calls go
    round-robin in rotated order (A B C, B C A, C A B, ...) so slow drift on a shared machine hits every
    candidate alike and none always runs first or last.
    If `measure_fn` returns a list, those are that candidate's samples (use this when one call
    measures all repeats, e.g. a fresh process per candidate) and it is not called again.
    The results table and the best config are saved as JSON to `save_to` when given.
    aa_control: also time `baseline` a second time in every repeat, as one more slot of the rotation (its A/A
    copy, so it is not tied to the last place). Those
    samples go into the baseline's row as `aa_samples_s`, aligned by repeat with `samples_s`: the noise a
    verdict must clear (`report.claim_timing(..., control=...)`). The copy is never a candidate for best.
    budget_s: with aa_control, after `repeats` keep adding whole repeats (the rotation goes on) while some
    candidate's verdict against the baseline (`timing.decide` on the per-repeat seconds, lower is better) is
    'too noisy', or its band is `narrow_to` or wider; while the next repeat fits in `budget_s` seconds counted
    from the first call, and fewer than `max_repeats` ran. A noisier machine then pays time, not a verdict that
    cannot tell. `meta["repeats"]` says how many ran.
    Taught in notebooks/07_mindir_aoe.ipynb.
    """
    if isinstance(candidates, dict) or not isinstance(candidates, (list, tuple)) or not candidates:
        raise ValueError(f"autotune: candidates={candidates!r} is invalid; fix: pass a non-empty list of "
                         "dicts, e.g. [{'grad_accum': 1}, {'grad_accum': 2}]")
    if not all(isinstance(c, dict) for c in candidates):
        raise ValueError("autotune: every candidate must be a dict of knob -> value")
    if len({json.dumps(c, sort_keys=True) for c in candidates}) != len(candidates):
        raise ValueError("autotune: candidates contain duplicates; fix: list each config once")
    if not callable(measure_fn):
        raise ValueError(f"autotune: measure_fn={measure_fn!r} is not callable")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"autotune: repeats={repeats!r} is invalid; fix: pass an integer >= 1 (3 is typical)")
    if baseline is not None and baseline not in candidates:
        raise ValueError(f"autotune: baseline={baseline!r} is not among the candidates; fix: include it")
    if aa_control and (baseline is None or repeats < 2):
        raise ValueError(f"autotune: aa_control=True needs a baseline and repeats >= 2 (got baseline={baseline!r}, "
                         f"repeats={repeats}); fix: name the baseline config and time at least 2 repeats")

    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s >= 0:
        raise ValueError(f"autotune: budget_s={budget_s!r} is invalid; fix: seconds >= 0 (0: exactly `repeats`)")
    if budget_s and not aa_control:
        raise ValueError("autotune: budget_s adds repeats until the verdicts against the A/A copy decide; fix: "
                         "pass aa_control=True with it, or budget_s=0")
    if isinstance(max_repeats, bool) or not isinstance(max_repeats, int) or max_repeats < repeats:
        raise ValueError(f"autotune: max_repeats={max_repeats!r} is below repeats={repeats}; fix: max_repeats >= repeats")
    if narrow_to is not None and (isinstance(narrow_to, bool) or not isinstance(narrow_to, (int, float))
                                  or not 0 < narrow_to < 1):
        raise ValueError(f"autotune: narrow_to={narrow_to!r} is invalid; fix: a relative band, e.g. 0.15, or None")

    import sys
    from tqdm.std import tqdm   # a text bar: renders in nbconvert and JupyterLab, no widget state to go stale
    # the A/A copy is one more slot, timing the baseline's config: the same measure_fn, the same build
    slots = list(candidates) + ([baseline] if aa_control else [])
    samples: list[list[float]] = [[] for _ in slots]
    done = [False] * len(slots)
    bar = tqdm(total=len(slots) * repeats, desc="autotune", disable=not progress, file=sys.stdout,
               mininterval=0.5)

    def one_repeat(r: int) -> None:
        for i in [*range(len(slots))][r % len(slots):] + [*range(len(slots))][:r % len(slots)]:
            if done[i]:
                continue
            cfg = slots[i]
            value = measure_fn(dict(cfg))
            if isinstance(value, (list, tuple)):
                samples[i] = [float(v) for v in value]
                done[i] = True
                bar.update(repeats)
            else:
                samples[i].append(float(value))
                bar.update(1)
            bar.set_postfix(last=_describe(cfg))

    t0 = time.perf_counter()
    for r in range(repeats):
        one_repeat(r)
    if budget_s:
        if __package__:
            from .timing import decide
        else:  # copied beside its siblings as plain files
            from timing import decide
        b = candidates.index(baseline)
    # lists from measure_fn fix their own repeats: nothing to add to
    while budget_s and repeats < max_repeats and not any(done):
        undecided = []
        for i, cfg in enumerate(candidates):
            if i != b and all(v > 0 for v in samples[b] + samples[i] + samples[-1]):
                verdict, band = decide(samples[b], samples[i], samples[-1], higher_is_better=False)
                if verdict == "too noisy" or (narrow_to is not None and band >= narrow_to):
                    undecided.append(f"{_describe(cfg)} (±{100 * band:.0f} %)")
        per_repeat = (time.perf_counter() - t0) / repeats
        if not undecided or time.perf_counter() - t0 + per_repeat > budget_s:
            break
        if progress:
            print(f"repeat {repeats + 1}: {', '.join(undecided)} still too noisy or too wide; one more "
                  f"(~{per_repeat:.0f} s of a {budget_s:.0f} s budget)", flush=True)
        bar.total += len(slots)
        one_repeat(repeats)
        repeats += 1
    bar.close()

    for cfg, s in zip(slots, samples):
        if not s or any(not math.isfinite(v) for v in s):
            raise ValueError(f"autotune: measure_fn returned {s!r} for {cfg}; fix: return finite seconds")
    rows = []
    for cfg, s in zip(candidates, samples):
        rows.append({"config": dict(cfg), "label": _describe(cfg), "median_s": statistics.median(s),
                     "min_s": min(s), "max_s": max(s), "samples_s": s})
        if aa_control and cfg == baseline:
            rows[-1]["aa_samples_s"] = samples[-1]
    rows.sort(key=lambda r: r["median_s"])
    for r in rows:
        r["vs_best"] = r["median_s"] / rows[0]["median_s"]
    result = TuneResult(best=dict(rows[0]["config"]), rows=rows, baseline=baseline,
                        meta={"repeats": repeats, "aa_control": bool(aa_control), "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    if save_to is not None:
        path = Path(save_to)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"best": result.best, "baseline": baseline, "speedup": result.speedup,
                                    "results": rows, **result.meta}, indent=2))
        result.path = path
    return result


def load_best(path: str | os.PathLike) -> dict:
    """The best config saved by `autotune(..., save_to=path)`: what the next run applies.
    Taught in notebooks/07_mindir_aoe.ipynb."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"load_best: {str(p)!r} does not exist; fix: run autotune(..., save_to={str(p)!r}) first")
    data = json.loads(p.read_text())
    if "best" not in data:
        raise ValueError(f"load_best: {str(p)!r} has no 'best' entry; it was not written by autotune")
    return data["best"]


# ----------------------------------------------------------------------------- CPU knobs to tune
def set_cpu_op_threads(n: int) -> str:
    """Set MindSpore's CPU kernel thread count (default 25 in 2.9). Allowed once per process, before
    the first compile; returns the API used.
    Taught with the rest of tuning.py in notebooks/07_mindir_aoe.ipynb."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"set_cpu_op_threads: n={n!r} is invalid; fix: pass a positive integer, "
                         f"e.g. os.cpu_count()={os.cpu_count()}")
    import mindspore as ms
    op_tuning = getattr(getattr(ms, "device_context", None), "cpu", None)
    if op_tuning is not None and hasattr(op_tuning, "op_tuning"):
        ms.device_context.cpu.op_tuning.threads_num(n)
        return "mindspore.device_context.cpu.op_tuning.threads_num"
    ms.set_context(runtime_num_threads=n)   # releases before 2.5
    return "mindspore.set_context(runtime_num_threads=...)"


class TrainStepTimer:
    """`measure_fn` for `autotune`: the median wall time of `steps` training steps of one RunConfig.

    Each candidate is a dict of RunConfig fields applied to `base` (e.g. {"seq_len": 64,
    "batch_size": 16} keeps 1,024 tokens per step in shorter sequences). Keep tokens per step equal
    across candidates so that step times compare. The model and its compiled step are built once
    per candidate and kept, so repeats time only steady steps.

    Example:
        >>> from mshelpers.config import RunConfig
        >>> from mshelpers.tuning import TrainStepTimer, autotune
        >>> timer = TrainStepTimer(RunConfig.preset("mini").replace(mode="graph"), steps=2)
        >>> [timer.config_for(c).tokens_per_step for c in ({"seq_len": 128, "batch_size": 8},
        ...                                                {"seq_len": 64, "batch_size": 16})]
        [1024, 1024]
        >>> autotune([{"seq_len": 128, "batch_size": 8}, {"seq_len": 64, "batch_size": 16}], timer)  # builds and compiles one model per candidate (15 s even for the tiny preset)  # doctest: +SKIP

    Taught in notebooks/06_recompute_memory.ipynb.
    """

    def __init__(self, base: Any, steps: int = 2, warmup: int = 1) -> None:
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"TrainStepTimer: steps={steps!r} is invalid; fix: pass an integer >= 1")
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"TrainStepTimer: warmup={warmup!r} is invalid; fix: pass an integer >= 0")
        base.validate()
        self.base, self.steps, self.warmup = base, steps, warmup
        self._built: dict[str, tuple] = {}
        self.compile_s: dict[str, float] = {}

    def config_for(self, candidate: dict) -> Any:
        cfg = self.base.replace(**candidate)
        return cfg.replace(steps=max(cfg.steps, 1000)).validate()   # lr schedule long enough for repeats

    def _build(self, candidate: dict) -> tuple:
        key = json.dumps(candidate, sort_keys=True)
        if key not in self._built:
            import mindspore as ms

            if __package__:
                from .data import numpy_batches
                from .device import setup
                from .model import build_model
                from .train import make_optimizer, make_train_step
            else:  # copied beside its siblings as plain files
                from data import numpy_batches
                from device import setup
                from model import build_model
                from train import make_optimizer, make_train_step
            cfg = self.config_for(candidate)
            setup(mode=cfg.mode, seed=cfg.seed)
            net = build_model(cfg)
            step = make_train_step(net, make_optimizer(net, cfg), cfg)
            batches = numpy_batches(cfg.replace(batch_size=cfg.batch_size * cfg.grad_accum))
            t0 = time.perf_counter()
            for _ in range(max(self.warmup, 1)):          # first call compiles
                step(ms.Tensor(next(batches), ms.int32))[0].asnumpy()
            self.compile_s[key] = time.perf_counter() - t0
            self._built[key] = (step, batches)
        return self._built[key]

    def __call__(self, candidate: dict) -> float:
        import mindspore as ms
        step, batches = self._build(candidate)
        times = []
        for _ in range(self.steps):
            x = ms.Tensor(next(batches), ms.int32)
            t0 = time.perf_counter()
            step(x)[0].asnumpy()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def isolated_step_times(overrides: dict, *, preset: str = "mini", mode: str = "graph",
                        cpu_threads: int | None = None, steps: int = 2, repeats: int = 3,
                        compile_cache: str | None = None) -> list[float]:
    """In THIS process: set the CPU thread count (if given), then time `repeats` medians of `steps` steps.

    Meant to run through `mshelpers.timing.run_isolated`, one fresh process per candidate, because
    the thread count can only be set before the first compile of a process (as AOE results are read
    at the next compile). `compile_cache`: a folder for MindSpore's compile cache (`train.compile_cache`,
    one subfolder per graph), so that the processes after the first load the step instead of compiling it.
    Taught with the rest of tuning.py in notebooks/07_mindir_aoe.ipynb.
    """
    if cpu_threads is not None:
        set_cpu_op_threads(cpu_threads)
    if __package__:
        from .config import RunConfig
        from .train import compile_cache as cached
    else:  # copied beside its siblings as plain files
        from config import RunConfig
        from train import compile_cache as cached
    timer = TrainStepTimer(RunConfig.preset(preset).replace(mode=mode, **overrides), steps=steps)
    with cached(timer.config_for({}), compile_cache):
        return [timer({}) for _ in range(repeats)]


def isolated_median_step_s(overrides: dict, *, preset: str = "mini", mode: str = "graph",
                           cpu_threads: int | None = None, steps: int = 3, compile_cache: str | None = None) -> float:
    """`isolated_step_times` reduced to one number (median seconds per step of `steps` steady steps), for
    `mshelpers.timing.compare_interleaved`, which runs each call in a fresh process.
    Taught in notebooks/07_mindir_aoe.ipynb."""
    return isolated_step_times(overrides, preset=preset, mode=mode, cpu_threads=cpu_threads, steps=steps,
                               repeats=1, compile_cache=compile_cache)[0]
