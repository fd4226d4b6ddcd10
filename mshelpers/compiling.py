"""Graph-compile measurements: first-step time in a fresh process, recompiles as shapes vary,
and bucketing sequence lengths so a graph compiles once per bucket.

Example:
    >>> from mshelpers.timing import run_isolated
    >>> from mshelpers.compiling import first_steps, shape_sweep, bucket_length
    >>> r = run_isolated(first_steps, "mini", steps=3, jit_level="O1")
    >>> r.value["first_step_s"], r.value["steady_step_s"]
    >>> bucket_length(70, (64, 128))
    128

`first_steps` is meant for `run_isolated`: compile caches and jit settings are per
process, so each measurement needs a process of its own.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np


def _build_dir(*parts: str) -> Any:
    """config.build_dir(*parts) inside the cookbook; copied alone, $MSHELPERS_BUILD or ./build (created)."""
    import os
    from pathlib import Path
    try:
        if __package__:
            from .config import build_dir
        else:  # copied beside its siblings as plain files
            from config import build_dir
        return build_dir(*parts)
    except ImportError:
        p = Path(os.environ.get("MSHELPERS_BUILD") or Path.cwd() / "build").joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p


JIT_LEVELS = ("O0", "O1")


def bucket_length(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= n. A graph compiled per bucket covers every length up to it.
    Taught with the rest of compiling.py in notebooks/02_graph_mode.ipynb."""
    if not buckets or sorted(buckets) != list(buckets) or any(b <= 0 for b in buckets):
        raise ValueError(f"bucket_length: buckets={buckets!r} must be positive and ascending, e.g. (64, 128)")
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"bucket_length: n={n} exceeds the largest bucket {buckets[-1]}; fix: add a bigger bucket "
                     f"or truncate the sequence")


def pad_to_bucket(batch: np.ndarray, buckets: Sequence[int], pad_id: int = 0) -> np.ndarray:
    """Right-pad a (batch, length) token array to `bucket_length(length, buckets)` with `pad_id`.

    mindformers' LLaMA masks pad_token_id out of the loss, so padding changes the shape the
    graph sees, not what it learns from.
    Taught in notebooks/02_graph_mode.ipynb.
    """
    if batch.ndim != 2:
        raise ValueError(f"pad_to_bucket: batch has shape {batch.shape}; fix: pass a 2-D (batch, length) array")
    target = bucket_length(batch.shape[1], buckets)
    out = np.full((batch.shape[0], target), pad_id, dtype=batch.dtype)
    out[:, :batch.shape[1]] = batch
    return out


def shape_sweep(step: Callable[[Any], Any], batches: Iterable[Any], factor: float = 3.0) -> list[dict]:
    """Call `step(x)` for each batch and time it; flag the calls that compiled.

    A call counts as a compile when it took more than `factor` times the median of the calls
    whose shape had been seen before (steady calls). Rows: {"call", "shape", "new_shape",
    "time_s", "compiled"}. `step` must block until done (return something with .asnumpy()
    or a Python number).
    Taught in notebooks/02_graph_mode.ipynb.
    """
    rows, seen = [], set()
    for i, x in enumerate(batches, 1):
        shape = tuple(x.shape)
        t0 = time.perf_counter()
        out = step(x)
        first = out[0] if isinstance(out, tuple) else out
        if hasattr(first, "asnumpy"):
            first.asnumpy()  # wait for the device
        rows.append({"call": i, "shape": "x".join(map(str, shape)), "new_shape": shape not in seen,
                     "time_s": time.perf_counter() - t0})
        seen.add(shape)
    steady = [r["time_s"] for r in rows if not r["new_shape"]] or [min(r["time_s"] for r in rows)]
    limit = factor * statistics.median(steady)
    for r in rows:
        r["compiled"] = r["time_s"] > limit
    return rows


def first_steps(preset: str = "mini", steps: int = 3, jit_level: str = "O0", seed: int = 0,
                compile_cache: str | None = None, **cfg_changes: Any) -> dict:
    """Train `steps` GRAPH_MODE steps of the preset with `nn.TrainOneStepCell` at `jit_level`;
    return {"jit_level", "first_step_s", "first_step_cpu_s", "steady_step_s", "final_loss",
    "setup_s"}.

    Run it through `run_isolated` (fresh process): MindSpore's compile cache
    (MS_COMPILER_CACHE_ENABLE / MS_COMPILER_CACHE_PATH) is read at a process's first compile, and a
    second compile in the same process would hit MindSpore's in-memory graph cache.
    compile_cache: a folder: the step compiles through `train.compile_cache` (the two variables, set in
        this process before its first compile, one subfolder per graph), so the run can be forked from a
        server that imported MindSpore already (`run_isolated(..., forkserver_preload=...)`).
    Taught in notebooks/02_graph_mode.ipynb.
    """
    if jit_level not in JIT_LEVELS:
        raise ValueError(f"first_steps: jit_level={jit_level!r} is invalid; fix: use one of {JIT_LEVELS}")
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"first_steps: steps={steps!r} must be an int >= 2 (one compile step, one steady step)")
    t0 = time.perf_counter()
    import mindspore  # noqa: F401 - imported here so that setup_s counts it

    if __package__:
        from .config import RunConfig
        from .data import numpy_batches
        from .device import setup
        from .model import build_model
        from .train import compile_cache as cache_for
    else:  # copied beside its siblings as plain files
        from config import RunConfig
        from data import numpy_batches
        from device import setup
        from model import build_model
        from train import compile_cache as cache_for

    cfg = RunConfig.preset(preset).replace(mode="graph", seed=seed, **cfg_changes)
    with cache_for(cfg, compile_cache, {"jit_level": jit_level}):
        return _time_first_steps(cfg, steps, jit_level, seed, t0, setup, build_model, numpy_batches)


def _time_first_steps(cfg: Any, steps: int, jit_level: str, seed: int, t0: float, setup: Callable,
                      build_model: Callable, numpy_batches: Callable) -> dict:
    """first_steps' body: build, then time `steps` steps (the first compiles, or loads the compile cache)."""
    import mindspore as ms
    from mindspore import nn

    setup(mode="graph", seed=seed)
    net = build_model(cfg)
    train_cell = nn.TrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params(), cfg.lr))
    # A Cell's own JitConfig is how GRAPH_MODE takes a per-network jit level.
    train_cell.set_jit_config(ms.JitConfig(jit_level=jit_level))
    batches = numpy_batches(cfg)
    setup_s = time.perf_counter() - t0
    times, cpu_times, loss = [], [], float("nan")
    for _ in range(steps):
        x = ms.Tensor(next(batches), ms.int32)
        t, c = time.perf_counter(), time.process_time()
        loss = float(train_cell(x).asnumpy())
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)   # CPU time of all threads: a busy neighbour does not inflate it
    return {"jit_level": jit_level, "first_step_s": times[0], "first_step_cpu_s": cpu_times[0],
            "steady_step_s": statistics.median(times[1:]), "final_loss": loss, "setup_s": setup_s}


def capture_compile_error(fn: Callable[..., Any], *args: Any, workdir: str | None = None) -> dict:
    """Call `fn(*args)` expecting a graph-compile failure and split the message into the parts
    worth reading: {"error": exception type or None, "first_line": the one-line cause,
    "code": the "In file ..." lines of "The Traceback of Net Construct Code" (your source, then
    the library's), "analyze_fail": path of the IR dump or None}.

    MindSpore writes analyze_fail.ir under ./rank_0/om of the current directory, so the call
    runs inside `workdir` (default build/compile_errors) to keep the notebook folder clean.
    Taught in notebooks/02_graph_mode.ipynb.
    """
    import contextlib
    import os
    import re

    build_dir = _build_dir

    workdir = workdir or str(build_dir("compile_errors"))
    cwd = os.getcwd()
    try:
        os.chdir(workdir)
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the point is to inspect it
        text = str(e)
        lines = text.splitlines()
        code = [ln.strip() for ln in lines if re.match(r"\s*#( \d+)? In file ", ln)]
        m = re.search(r"See file '([^']*analyze_fail\.ir)'", text)
        path = m.group(1) if m else None
        if path and not os.path.isabs(path):
            path = os.path.join(workdir, path)
        return {"error": type(e).__name__, "first_line": lines[0] if lines else "", "code": code,
                "analyze_fail": path}
    finally:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
    return {"error": None, "first_line": "", "code": [], "analyze_fail": None}


# ---------------------------------------------------------------- operator fusion, counted from the IR
FINAL_GRAPH_GLOB = "actor_set/final_actor_set_kernel_graph_*.ir"


def ir_dump_env(ir_dir: Any) -> dict:
    """Environment variables that make a fresh MindSpore process save only the IR `count_kernels` reads.

    MS_DEV_SAVE_GRAPHS=1 with MS_DEV_DUMP_IR_PASSES=actor_set writes the runtime's actor set (a few
    MB) instead of every compile pass (hundreds of MB, and a 5x slower first step).
    Taught in notebooks/02_graph_mode.ipynb.
    """
    return {"MS_DEV_SAVE_GRAPHS": "1", "MS_DEV_SAVE_GRAPHS_PATH": str(ir_dir), "MS_DEV_DUMP_IR_PASSES": "actor_set"}


def count_kernels(ir_dir: Any) -> dict:
    """Count the kernels of the graph MindSpore finally executes, from its saved IR.

    Reads `<ir_dir>/actor_set/final_actor_set_kernel_graph_*.ir` (saved with `ir_dump_env`), the
    actor set after the last runtime optimisation: one line `%N = kernel_graph0:<Type>-op<K>(...)`
    per kernel launched each step. Actor lines (`..._FusionActor`, DataPrepareActor...) are the
    runtime's scheduling units, not kernels, and are not counted. Kernels whose type starts with
    `GraphKernel_` are fusions made by graph-kernel fusion (AKG on CPU).
    Returns {"file", "kernels", "fused_kernels", "by_type": {type: count}, most frequent first}.
    Taught in notebooks/02_graph_mode.ipynb.
    """
    import re
    from collections import Counter
    from pathlib import Path
    files = sorted(Path(ir_dir).glob(FINAL_GRAPH_GLOB))
    if not files:
        raise FileNotFoundError(f"count_kernels: no {FINAL_GRAPH_GLOB} under {ir_dir}; fix: run the graph in a "
                                "fresh process with env=ir_dump_env(ir_dir) and call it at least once")
    pat = re.compile(r"^%\d+ = kernel_graph\d+:([A-Za-z0-9_]+)-op\d+\(")
    types = Counter(m.group(1) for f in files for line in f.read_text().splitlines() if (m := pat.match(line)))
    return {"file": str(files[-1]), "kernels": sum(types.values()),
            "fused_kernels": sum(n for t, n in types.items() if t.startswith("GraphKernel_")),
            "by_type": dict(types.most_common())}


def fusion_steps(preset: str = "tiny", steps: int = 4, jit_level: str = "O0", seed: int = 0, *,
                 ir_dir: Any, compile_env: dict | None = None) -> dict:
    """`first_steps` in `ir_dir` (the working folder, where AKG also keeps its kernel cache), then
    `count_kernels(ir_dir)`: {first_step_s, steady_step_s, final_loss, kernels, fused_kernels}.

    Run it in a fresh process with `ir_dump_env(ir_dir)`, plus MS_DEV_GRAPH_KERNEL_FLAGS
    (e.g. "--opt_level=1") to switch graph-kernel fusion on: either `run_isolated(..., env=...)` (spawned),
    or `compile_env=` here, which sets them in this process before its first compile. MindSpore 2.9 reads these
    four at compile time, so a child forked from a server that imported MindSpore already
    (`run_isolated(..., forkserver_preload=...)`) still dumps and fuses. Old IR in `ir_dir` is removed first.
    Meant for a fresh process only: it changes the working folder and sends the process's
    stdout/stderr to <ir_dir>/output.log.
    Taught in notebooks/02_graph_mode.ipynb.
    """
    import os
    import shutil
    from pathlib import Path
    env_ok = compile_env is None or (isinstance(compile_env, dict) and
                                     all(isinstance(k, str) and isinstance(v, str) for k, v in compile_env.items()))
    if not env_ok:
        raise ValueError(f"fusion_steps: compile_env={compile_env!r} is invalid; fix: a dict of variable names to "
                         "string values")
    os.environ.update(compile_env or {})
    d = Path(ir_dir)
    shutil.rmtree(d / "actor_set", ignore_errors=True)
    d.mkdir(parents=True, exist_ok=True)
    os.chdir(d)
    # AKG's compiler processes print "Please set tiling repo path..." per kernel: keep this fresh
    # process's output (and its children's) in <ir_dir>/output.log
    log = os.open(d / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    out = first_steps(preset, steps=steps, jit_level=jit_level, seed=seed)
    k = count_kernels(d)
    out.update(kernels=k["kernels"], fused_kernels=k["fused_kernels"])
    return out
