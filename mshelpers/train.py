"""The mini-LLaMA runner: one function trains a RunConfig and logs every step.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers.train import train
    >>> h = train(RunConfig.preset("mini").replace(mode="graph", steps=20))
    >>> h.summary()["median_step_s"]        # steady-state step time, compile step excluded

The step is built functionally (`ms.value_and_grad`), so the same code runs op by op
(PyNative) or compiled as one graph (`ms.jit`), with optional loss scaling, gradient
clipping and gradient accumulation. The first step of a graph run includes the
compile; `History` reports it apart from the median of the steady steps.
"""
from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

# Siblings (config, metrics, data, model, device, checkpoint, stability) are imported inside the functions
# that use them: `lr_at`, `run_lock` and the step builders work from a copy of this file alone; `train()` and
# the CLI need the siblings, in the package or copied side by side.


def _sibling(module: str, *names: str) -> Any:
    """A sibling cookbook module (or names from it), imported when a function needs it:
    mshelpers.<module> inside the package, plain <module> when the files were copied side by side."""
    import importlib
    mod = importlib.import_module(f"{__package__}.{module}" if __package__ else module)
    got = tuple(getattr(mod, n) for n in names)
    return mod if not names else got[0] if len(names) == 1 else got


def lr_at(cfg: "RunConfig", step: int) -> float:
    """Learning rate at 1-based `step`: linear warm-up, then cosine decay to 10% of cfg.lr."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / max(1, cfg.warmup_steps)
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(net, cfg: RunConfig):
    """AdamW with the warm-up + cosine schedule of `lr_at`, one value per step."""
    from mindspore import nn
    lrs = [lr_at(cfg, s) for s in range(1, cfg.steps + 1)]
    return nn.AdamWeightDecay(net.trainable_params(), learning_rate=lrs, weight_decay=cfg.weight_decay)


def make_loss_scaler(cfg: RunConfig):
    """DynamicLossScaler (x2 / /2 every 50 good steps / on overflow) or a static one."""
    from mindspore import amp
    if cfg.dynamic_loss_scale:
        return amp.DynamicLossScaler(scale_value=float(cfg.loss_scale), scale_factor=2, scale_window=50)
    return amp.StaticLossScaler(scale_value=float(cfg.loss_scale))


def make_train_step(net, optimizer, cfg: RunConfig, loss_scaler=None) -> Callable:
    """Return step(input_ids) -> (loss, grad_norm, finite, scale): `train_step.build_step` with cfg's settings, a
    Cell compiled as one graph when cfg.mode == "graph", a Python function run op by op for "pynative".

    Overflowed steps (non-finite gradients) skip the optimizer update; with a dynamic
    scaler the scale halves. With cfg.grad_accum = k the batch is split into k
    micro-batches whose gradients are averaged before one update (GRAPH_MODE: summed in a buffer
    of Parameters by one compiled graph called per micro-batch, then applied by a second graph).

    Taught in notebooks/02_graph_mode.ipynb.
    """
    cache_on = os.environ.get("MS_COMPILER_CACHE_ENABLE", "0") not in ("", "0")
    if cfg.mode == "graph" and cache_on and cfg.grad_accum > 1:
        # Measured on MindSpore 2.9 (tests/_cache_probe.py train-accum, run twice on one cache folder): the
        # accumulation step's two graphs share the model's Parameters, and loaded warm they train on garbage
        # (every loss NaN, where the cold run's fourth loss is 5.56). The k = 1 step is one graph and safe.
        raise ValueError("make_train_step: MS_COMPILER_CACHE_ENABLE=1 with grad_accum > 1: its two graphs share the "
                         "model's Parameters and train on garbage from a warm cache (MindSpore 2.9); fix: unset "
                         "MS_COMPILER_CACHE_ENABLE for this run, or use grad_accum=1")
    scaler = loss_scaler or make_loss_scaler(cfg)
    inner = _sibling("train_step", "build_step")(
        net, optimizer, mode=cfg.mode, scaler=scaler, dynamic=cfg.dynamic_loss_scale, clip=cfg.grad_clip,
        accum=cfg.grad_accum)

    def step(input_ids):
        loss, grad_norm, finite = inner(input_ids)
        return loss, grad_norm, finite, scaler.scale_value
    step.loss_scaler = scaler     # checkpoints save and restore its state
    return step


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN/inf loss (or non-finite weights) without loss scaling to absorb it."""


class CollapsedRun(RuntimeError):
    """Training goes on but learns nothing: zero gradients, or the loss pinned at ln(vocab) (uniform guessing)."""


class NothingToResume(RuntimeError):
    """--resume found checkpoints but none it may continue (all corrupt, or another run's)."""


class RunLocked(RuntimeError):
    """Another process holds the run folder."""


class Preempted(RuntimeError):
    """SIGTERM or SIGINT stopped the run; the state after the last completed step was saved."""

    def __init__(self, msg: str, signo: int) -> None:
        super().__init__(msg)
        self.signo = signo


MAX_STEPS = 1_000_000   # the lr table holds one value per step; far beyond what a CPU run reaches


def check_steps(steps: int, what: str = "steps") -> None:
    """Refuse a step count outside 1..MAX_STEPS with one line, before anything is built or written."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"{what}={steps!r} is invalid; fix: pass an integer from 1 to {MAX_STEPS:,} "
                         "(the stated maximum)")


class StopSignal:
    """SIGTERM and SIGINT for the training CLI, taken from MindSpore.

    MindSpore's SignalGuard turns a SIGINT into a SIGTERM to the process, and a Python handler installed
    after its own does not run for SIGINT. So `install()` blocks both signals in every thread (call it before
    `import mindspore`: threads inherit the mask), and one thread receives them with `sigwaitinfo`. The
    training loop reads `signo` after every step, saves and stops. A second signal exits at once
    (128 + signo); the checkpoint writes are atomic, so that still loses nothing already saved.
    """

    def __init__(self) -> None:
        self.signo = 0

    def install(self) -> "StopSignal":
        import signal
        import threading
        wanted = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, wanted)

        def wait() -> None:
            while True:
                info = signal.sigwaitinfo(wanted)
                if self.signo:
                    os._exit(128 + info.si_signo)
                self.signo = info.si_signo
        threading.Thread(target=wait, name="stop-signal", daemon=True).start()
        return self

    @property
    def name(self) -> str:
        import signal
        return signal.Signals(self.signo).name


@dataclass
class History:
    """Per-step rows of one run plus its summary (compile step apart from steady steps)."""
    cfg: RunConfig
    rows: list[dict] = field(default_factory=list)
    n_params: int = 0
    flops_per_token: int = 0
    peak_flops: float = float("nan")
    floor: float | None = None
    csv_path: Path | None = None
    rollbacks: list = field(default_factory=list)   # spike-guard events: step, loss, trigger, skipped data position

    def summary(self, skip_first: int = 1) -> dict[str, Any]:
        """metrics.summarize over the rows: step time, tokens/s and MFU are medians over the steps after the first
        `skip_first` (1: the compile step). A short timed run passes half its steps: MindSpore's CPU runtime runs
        the first steps after a compile slower, so a median that includes them lands on that edge."""
        summarize = _sibling("metrics", "summarize")
        s = summarize(self.rows, skip_first=skip_first)
        s.update(rollbacks=len(self.rollbacks), skipped_data_pos=[e["skipped_data_pos"] for e in self.rollbacks])
        s.update(run=self.cfg.name, mode=self.cfg.mode, loss_floor=self.floor,
                 gap_to_floor=(s["final_loss"] - self.floor) if self.floor is not None else None)
        return s

    compile_time_s = property(lambda self: self.summary()["compile_time_s"])
    median_step_s = property(lambda self: self.summary()["median_step_s"])
    tokens_per_s = property(lambda self: self.summary()["tokens_per_s"])
    mfu = property(lambda self: self.summary()["mfu"])
    final_loss = property(lambda self: self.summary()["final_loss"])
    peak_rss_mb = property(lambda self: self.summary()["peak_mem_mb"])

    def column(self, key: str) -> list:
        return [r[key] for r in self.rows]

    def to_csv(self, path: str | Path) -> Path:
        import csv
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            w.writeheader()
            w.writerows(self.rows)
        return path


class _MetricsCSV:
    """metrics.csv, append-only: one line per step, flushed as it is written.

    A resume keeps the rows up to the checkpoint's step exactly as they were written (values untouched),
    drops the rest by writing a new file and renaming it over the old one (a kill mid-way leaves either
    file whole), and repairs a torn last line (a crash mid-write) by dropping it.
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
        parse_cell = _sibling("table", "parse_cell")
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


@contextmanager
def compile_cache(cfg: Any, root: str | Path | None, context: dict | None = None) -> Iterator[bool]:
    """MindSpore's compile cache for the training step of `cfg`, in a fresh process: one folder under `root`
    per graph (the config without seed and name, `context`, MindSpore's version, the sources beside this
    file), so a second process that trains the same graph loads it instead of compiling (a mini step: about
    10 s cold, 2 s warm on 2 CPU cores). Yields True when the cache is on; a no-op (False) for PyNative, for grad_accum > 1 (its three
    ms.jit functions reach Parameters through closures and come back from a warm cache with zeroed weights:
    tests/test_compile_cache.py), and when `root` is None. `cfg` is a RunConfig or a plain dict of its fields.

    MindSpore reads the cache only at the first compile of a process, so use it in fresh processes
    (`timing.run_isolated`, the CLI's --compile-cache); the variables are removed again on exit.

    Example:
        >>> with compile_cache({"mode": "pynative", "grad_accum": 1}, "/tmp/cache") as on:
        ...     on
        False
    """
    fields = dict(cfg) if isinstance(cfg, dict) else cfg.to_dict()
    on = root is not None and fields.get("mode") == "graph" and fields.get("grad_accum", 1) == 1
    if root is not None and not isinstance(root, (str, Path)):
        raise TypeError(f"compile_cache: root={root!r} is invalid; fix: pass a folder path or None")
    if not on:
        yield False
        return
    import hashlib
    import importlib
    import inspect
    import json
    import mindspore as ms
    graph = {k: v for k, v in fields.items() if k not in ("seed", "name")}
    # the sources beside this file too: model.py maps the config onto mindformers' model, and an edit there
    # changes the graph without changing the config or any file MindSpore parses
    here = Path(inspect.getsourcefile(make_train_step)).resolve().parent
    sources = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(here.glob("*.py")))).hexdigest()
    key = hashlib.sha256(json.dumps([graph, context, ms.__version__, sources], sort_keys=True, default=str)
                         .encode()).hexdigest()[:16]
    # read by MindSpore at each compile, so setting them after the import (a forkserver's) works
    os.environ.update(MS_COMPILER_CACHE_ENABLE="1", MS_COMPILER_CACHE_PATH=str(Path(root).resolve() / key))
    # MindSpore hashes its "entry script" (sys.argv[0] at import) into the cache's validity; a forked or
    # `python -c` process has none ('-c': the compile fails on a missing file), so name the file that builds
    # the step: editing it then invalidates the cache
    for mod in ("mindspore.graph.api", "mindspore.common.api"):
        try:
            api = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(api, "entry_script_path") and not os.path.isfile(str(api.entry_script_path)):
            api.entry_script_path = inspect.getsourcefile(make_train_step)
    try:
        yield True
    finally:
        os.environ.pop("MS_COMPILER_CACHE_ENABLE", None)
        os.environ.pop("MS_COMPILER_CACHE_PATH", None)


def train(cfg: "RunConfig", steps: int | None = None, callbacks: Iterable[Callable[[dict], Any]] = (), *,
          csv_path: str | Path | None = None, progress: bool = True, peak_flops: float | None = None,
          net=None, ckpt_dir: str | Path | None = None, ckpt_every: int = 0, keep: int = 3,
          resume: bool = False, stop_on_nonfinite: bool = True, run: dict | None = None,
          collapse_after: int = 5, on_ready: Callable[[], Any] | None = None,
          stop: StopSignal | None = None) -> History:
    """Train `cfg` for `steps` (default cfg.steps) steps and return its History.

    callbacks: callables receiving each step's row (dict) after it is logged.
    csv_path: where the per-step CSV goes (default build/runs/<name>-<mode>-s<seed>.csv). Rows are appended
        and flushed one per step; a resume keeps the rows up to the checkpoint untouched.
    peak_flops: the device's peak FLOP/s for MFU (default: peak.hardware_peak_flops(), the theoretical
        peak on a CPU, so every run and notebook shares one denominator, PaLM's).
    net: an already built model (default: build_model(cfg)).
    ckpt_dir, ckpt_every, keep: a checkpoint every `ckpt_every` steps and at the last step; the newest
        `keep` intact ones are kept. A checkpoint becomes visible only once the next step's loss with its
        weights came out finite (the last one: once its weights are checked finite).
    resume: continue from the newest intact checkpoint in ckpt_dir (of run `run["id"]` when given);
        says which one. Checkpoints that exist but are all corrupt raise NothingToResume and touch nothing.
    run: the run's identity, e.g. {"id": "3f9c...", "config_hash": cfg.config_hash()}, stored in every
        checkpoint; with it a resume never continues another run's checkpoints.
    stop_on_nonfinite: without dynamic loss scaling, a NaN/inf loss raises NonFiniteLoss naming the
        step and the newest checkpoint with finite weights. With dynamic loss scaling the step is skipped.
    collapse_after: stop with CollapsedRun after this many consecutive steps with a zero gradient norm, or
        with the loss pinned at ln(vocab_size) (0 disables).
    on_ready: called once every check has passed (the model built, the checkpoint loaded) and before
        anything is written: the CLI writes config.yaml there, so a refused run changes no file.
    stop: a StopSignal; when it fires, the current step is finished, a checkpoint of it is saved (ckpt_dir
        is needed) and Preempted is raised naming it.
    """
    build_dir = _sibling("config", "build_dir")
    COLUMNS, StepLogger, flops_per_token = _sibling("metrics", "COLUMNS", "StepLogger", "flops_per_token")
    hardware_peak_flops = _sibling("peak", "hardware_peak_flops")
    steps = cfg.steps if steps is None else steps
    check_steps(steps, "train: steps")
    if not isinstance(ckpt_every, int) or ckpt_every < 0:
        raise ValueError(f"train: ckpt_every={ckpt_every!r} is invalid; fix: pass 0 (off) or a positive integer")
    if ckpt_every and ckpt_dir is None:
        raise ValueError("train: ckpt_every is set but ckpt_dir=None; fix: pass the directory for checkpoints")
    if resume and ckpt_dir is None:
        raise ValueError("train: resume=True needs ckpt_dir; fix: pass the directory holding the checkpoints")
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"train: keep={keep!r} is invalid; fix: keep at least 1 checkpoint")
    if steps > cfg.steps:
        cfg = cfg.replace(steps=steps)    # the lr schedule must cover every step
    cfg.validate()                          # before any MindSpore work
    _sibling("data", "check_fits")(cfg)
    run_id = (run or {}).get("id")

    checkpoint = _sibling("checkpoint")
    if resume:   # decide before building anything: all-corrupt or too-few-steps fail with nothing touched
        recs = checkpoint.scan(ckpt_dir, run_id=run_id)
        good = [r for r in recs if r["status"] == "good"]
        if recs and not good:
            why = "; ".join(r.get("error") or f"{r['path'].name} belongs to run {r.get('run', {}).get('id')}"
                            for r in recs)
            raise NothingToResume(f"no checkpoint in {ckpt_dir} can be resumed ({why}); nothing was changed; "
                                  "fix: restore a checkpoint, or start a fresh run in another folder")
        if good and good[0]["step"] > steps:
            raise ValueError(f"steps={steps} is fewer than the checkpoint's step {good[0]['step']} "
                             f"({good[0]['path'].name}); fix: pass steps >= {good[0]['step']}")
        if good and good[0]["step"] == steps:   # a finished run: nothing to do, nothing touched
            print(f"the run is complete: {good[0]['path']} is step {steps} of {steps}; nothing to do "
                  "(pass a larger --steps to extend it)", file=sys.stderr, flush=True)
            return History(cfg)

    import mindspore as ms
    import numpy as np
    from tqdm.std import tqdm   # a text bar: renders in nbconvert and JupyterLab, no widget left frozen at 0 %

    entropy_floor, numpy_batches = _sibling("data", "entropy_floor", "numpy_batches")
    setup = _sibling("device", "setup")
    build_model, count_params = _sibling("model", "build_model", "count_params")

    device = setup(mode=cfg.mode, seed=cfg.seed)
    net = net if net is not None else build_model(cfg, device)
    n_params = count_params(net)
    fpt = flops_per_token(n_params, cfg.num_layers, cfg.hidden_size, cfg.seq_len)
    peak = peak_flops or hardware_peak_flops()   # PaLM MFU: the hardware peak, not a benchmark's
    optimizer = make_optimizer(net, cfg)
    step_fn = make_train_step(net, optimizer, cfg)
    floor = entropy_floor(cfg.vocab_size) if cfg.data == "markov" else None
    csv_path = Path(csv_path) if csv_path else build_dir("runs") / f"{cfg.name}-{cfg.mode}-s{cfg.seed}.csv"
    metrics_csv = _MetricsCSV(csv_path, COLUMNS)

    start, data_pos, last_ckpt, kept_rows = 1, 0, None, []
    guard = _SpikeGuard(cfg, net, optimizer, step_fn.loss_scaler) if cfg.spike_guard else None
    if resume and good:
        # the lr table is re-derived from cfg (a longer run stretches the cosine), so it is not restored
        meta = checkpoint.load(good[0]["path"], net, optimizer, step_fn.loss_scaler, ignore=("learning_rate",))
        start, data_pos, last_ckpt = meta["step"] + 1, meta["data_pos"], good[0]["path"]
        if guard:
            guard.load(good[0]["path"])
        if on_ready:
            on_ready()
        passed = recs[:recs.index(good[0])] + [r for r in recs[recs.index(good[0]):] if r["status"] == "misnamed"]
        for r in passed:     # newer ones passed over, and every misnamed one, each with its reason
            why = r.get("error") or f"checkpoint {r['path']} belongs to run {r.get('run', {}).get('id')}"
            print(f"{why}; skipping it", file=sys.stderr)
        kept_rows, note = metrics_csv.keep_upto(meta["step"], meta.get("loss"))
        if ckpt_every:
            checkpoint.prune(ckpt_dir, keep, run_id=run_id)   # room for the next write on a nearly full disk
        print(f"resumed from {good[0]['path']} (step {meta['step']}, data position {data_pos}); "
              f"continuing at step {start} of {steps}" + (f"; {note}" if note else ""), file=sys.stderr, flush=True)
    else:
        if on_ready:
            on_ready()
        if resume:
            print(f"resume: no checkpoint in {ckpt_dir} yet; starting at step 1", file=sys.stderr, flush=True)
        metrics_csv.start_fresh()
    logger = StepLogger(None, cfg.tokens_per_step, fpt, peak, n_devices=cfg.dp)
    logger.rows.extend(kept_rows)
    hist = History(cfg, logger.rows, n_params, fpt, peak, floor, csv_path)
    hist.rollbacks = guard.events if guard else []

    batches = numpy_batches(cfg.replace(batch_size=cfg.batch_size * cfg.grad_accum))
    for _ in range(data_pos):          # the data position is part of exact resume
        next(batches)
    params = [p for p in net.get_parameters()]
    ln_vocab, flat = math.log(cfg.vocab_size), 0
    pending, pending_guard = None, None
    bar = tqdm(total=steps - start + 1, desc=f"{cfg.name} {cfg.mode}", disable=not progress, file=sys.stdout,
               mininterval=0.5)

    def commit_pending() -> None:
        nonlocal pending, pending_guard, last_ckpt
        last_ckpt = checkpoint.commit(pending, run_id=run_id)
        if pending_guard is not None:
            guard.save(last_ckpt, pending_guard)
        pending, pending_guard = None, None
        checkpoint.prune(ckpt_dir, keep, run_id=run_id)

    def newest_finite() -> str:
        found = checkpoint.latest_good(ckpt_dir, run_id=run_id, finite=True) if ckpt_dir else None
        return f"{found[0]} (step {found[1]['step']})" if found else "none written yet"

    def save_now(step: int) -> Path | None:
        """Preempted after `step`: make the state after it visible as a checkpoint, return its path."""
        nonlocal pending, pending_guard
        if pending is not None and f"step_{step:06d}" not in Path(pending).name:
            commit_pending()       # an older pending one: this step's finite loss vouched for it
        if ckpt_dir is None or step < start:
            return last_ckpt
        bad = next((p.name for p in params if not np.isfinite(p.asnumpy()).all()), None)
        if bad:                    # never save non-finite weights, not even on the way out
            if pending is not None:
                Path(pending).unlink(missing_ok=True)
            pending = pending_guard = None
            return last_ckpt
        if pending is None:
            pending = checkpoint.write_pending(ckpt_dir, net, optimizer, step=step, data_pos=data_pos,
                                               loss_scaler=step_fn.loss_scaler, run=run, loss=done_loss)
            pending_guard = guard.state() if guard else None
        commit_pending()
        return last_ckpt

    def preempted(step: int) -> Preempted:
        saved = save_now(step)
        where = f"saved {saved} (step {step})" if saved and step >= start else \
            f"no step completed in this process; newest checkpoint: {saved or 'none'}"
        return Preempted(f"{stop.name} after step {step}: {where}; fix: rerun with --resume to continue",
                         stop.signo)

    step, redo, done_loss = start, False, None
    try:
        while step <= steps:
            if stop is not None and stop.signo:
                raise preempted(step - 1)
            if guard:
                guard.snapshot()           # the state before this step: what a rollback restores
            x = ms.Tensor(next(batches), ms.int32)
            data_pos += 1
            t0 = time.perf_counter()
            loss, grad_norm, finite, scale = step_fn(x)
            loss = float(loss.asnumpy())       # synchronises: the step is done when its loss is on the host
            dt = time.perf_counter() - t0
            grad_norm, finite = float(grad_norm.asnumpy()), bool(finite.asnumpy())
            if pending is not None:            # this loss was computed with the pending checkpoint's weights
                if math.isfinite(loss):
                    commit_pending()
                else:
                    Path(pending).unlink(missing_ok=True)
                    pending = pending_guard = None
            if guard and finite and guard.is_spike(loss, grad_norm):
                guard.roll_back(step, loss, grad_norm, skipped=data_pos - 1)   # this batch is skipped for good
                redo = True
                continue                   # the same step again, on the next batch
            row = logger.log_step(step, loss, dt, lr=lr_at(cfg, step), grad_norm=grad_norm,
                                  overflow=not finite, loss_scale=float(scale.asnumpy()), spike=redo)
            metrics_csv.append(row, logger.rows)
            done_loss, redo = loss, False
            if stop_on_nonfinite and not cfg.dynamic_loss_scale and not math.isfinite(loss):
                raise NonFiniteLoss(f"loss is {loss} at step {step}; newest checkpoint with finite weights: "
                                    f"{newest_finite()}. Fix: lower lr, check the init, "
                                    "or enable dynamic_loss_scale to skip overflowed steps")
            if collapse_after:
                pinned = abs(loss - ln_vocab) < 1e-3 and step > cfg.warmup_steps
                # overflowed steps still count when the loss is pinned: a dynamic scaler hides nothing here
                flat = flat + 1 if (finite and grad_norm == 0.0) or pinned else 0
                if flat >= collapse_after:
                    raise CollapsedRun(f"the run collapsed: {flat} steps in a row up to step {step} with zero "
                                       f"gradients or the loss pinned at ln vocab ({loss:.4f} vs {ln_vocab:.4f}; "
                                       f"last grad norm {grad_norm:g}); "
                                       f"newest checkpoint with finite weights: {newest_finite()}. "
                                       "Fix: lower lr (the weights saturated) and resume from that checkpoint")
            if ckpt_every and (step % ckpt_every == 0 or step == steps):
                bad = next((p.name for p in params if not np.isfinite(p.asnumpy()).all()), None)
                if bad:
                    raise NonFiniteLoss(f"parameter {bad!r} is non-finite after step {step}; not saved; newest "
                                        f"checkpoint with finite weights: {newest_finite()}. Fix: lower lr")
                pending = checkpoint.write_pending(ckpt_dir, net, optimizer, step=step, data_pos=data_pos,
                                                   loss_scaler=step_fn.loss_scaler, run=run, loss=loss)
                pending_guard = guard.state() if guard else None
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", ms=f"{dt * 1e3:.0f}")
            for cb in callbacks:
                cb(row)
            if stop is not None and stop.signo and step < steps:
                raise preempted(step)
            step += 1
        if pending is not None:        # the last step: no next forward to vouch for it; its weights are finite
            commit_pending()
    finally:
        if pending is not None:
            Path(pending).unlink(missing_ok=True)
        metrics_csv.close(logger.rows)
        bar.close()
    return hist


class SpikeStorm(RuntimeError):
    """The spike guard rolled back too often in a short span: the run needs a person, not another retry."""


class _SpikeGuard:
    """In-memory rollback for `train()`: a snapshot before every step, restored when the step spikes.

    The flagged step's batch is skipped (its data position is recorded), and the step is redone on the
    next batch. The detector state and the record of rollbacks go into a JSON file beside each checkpoint
    (`step_N.guard.json`), so a resumed run flags and skips exactly what an uninterrupted one would.
    MAX_ROLLBACKS rollbacks within WITHIN steps stop the run with SpikeStorm instead of looping.
    """
    MAX_ROLLBACKS, WITHIN = 5, 50   # ~1 % of batches poisoned gave 1-3 rollbacks per 50 steps here

    def __init__(self, cfg, net, optimizer, loss_scaler) -> None:
        SpikeDetector = _sibling("stability", "SpikeDetector")
        self.detector = SpikeDetector(window=cfg.spike_window, threshold=cfg.spike_threshold,
                                      warmup=min(10, cfg.spike_window))
        state: dict = {}
        for cell in (net, optimizer):
            for p in cell.get_parameters():
                state.setdefault(p.name, p)
        for attr in ("scale_value", "counter"):
            if hasattr(loss_scaler, attr):
                state[f"loss_scaler.{attr}"] = getattr(loss_scaler, attr)
        self.params = list(state.values())
        self.saved: list = []
        self.events: list[dict] = []

    def snapshot(self) -> None:
        self.saved = [p.asnumpy().copy() for p in self.params]

    def is_spike(self, loss: float, grad_norm: float) -> bool:
        return self.detector.update(loss, grad_norm)

    def roll_back(self, step: int, loss: float, grad_norm: float, skipped: int) -> None:
        import mindspore as ms
        for p, a in zip(self.params, self.saved):
            # assign writes into the parameter's own buffer; set_data would swap in a new one that an
            # already compiled graph never sees
            ms.ops.assign(p, ms.Tensor(a))
        ev = {"step": step, "loss": loss, "grad_norm": grad_norm, "trigger": self.detector.last_reason,
              "skipped_data_pos": skipped}
        self.events.append(ev)
        print(f"rolled back step {step}: {ev['trigger']}; skipped data position {skipped}; redoing step {step} "
              "on the next batch", flush=True)
        recent = [e["step"] for e in self.events if e["step"] > step - self.WITHIN]
        if len(recent) >= self.MAX_ROLLBACKS:
            raise SpikeStorm(f"spike guard: {len(recent)} rollbacks within {self.WITHIN} steps (steps {recent}, "
                             f"skipped data positions {[e['skipped_data_pos'] for e in self.events[-len(recent):]]}); "
                             "fix: lower lr or inspect those batches rather than skipping more")

    def state(self) -> str:
        import json
        return json.dumps({"detector": self.detector.state_dict(), "events": self.events})

    def save(self, ckpt_path, state: str | None = None) -> None:
        path = Path(ckpt_path).with_suffix(".guard.json")
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        try:
            tmp.write_text(self.state() if state is None else state)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        for stale in path.parent.glob("step_*.guard.json"):   # sidecars whose checkpoint was pruned
            if not stale.with_name(stale.name.replace(".guard.json", ".ckpt")).exists():
                stale.unlink(missing_ok=True)

    def load(self, ckpt_path) -> None:
        import json
        path = Path(ckpt_path).with_suffix(".guard.json")
        if path.exists():
            state = json.loads(path.read_text())
            self.detector.load_state_dict(state["detector"])
            self.events[:] = state["events"]


def _parse_set(items: list[str]) -> dict[str, Any]:
    """--set key=value pairs, each value converted to the RunConfig field's type."""
    import dataclasses

    RunConfig = _sibling("config", "RunConfig")
    types = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r} is not key=value; fix: e.g. --set lr=1e-3")
        if key not in types:
            raise ValueError(f"--set {key}: unknown RunConfig field; fix: use one of {sorted(types)}")
        t = str(types[key])
        try:
            if "bool" in t:
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                out[key] = raw.lower() in ("true", "1")
            elif "int" in t:
                out[key] = int(raw)
            elif "float" in t:
                out[key] = float(raw)
            else:
                out[key] = raw
        except ValueError:
            raise ValueError(f"--set {key}={raw!r}: {key} expects {t}; fix: pass a valid {t}") from None
    return out


class run_lock:
    """Exclusive lock on a run folder for the whole run: `fcntl.flock` on `<folder>/.lock`.

    A second process is refused at once with RunLocked naming the holder's PID. The kernel drops the
    lock when its holder dies, however it dies, so a stale lock file never blocks.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def __enter__(self) -> "run_lock":
        import fcntl
        if self.folder.exists() and not self.folder.is_dir():
            raise NotADirectoryError(f"--out {self.folder} is a file, not a folder; fix: pass a folder path")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._f = open(self.folder / ".lock", "a+")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            holder = self._f.read().strip() or "unknown"
            self._f.close()
            raise RunLocked(f"{self.folder} is in use by another run (pid {holder}); "
                            "fix: wait for it to finish, or pass another --out") from None
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"{os.getpid()}\n")
        self._f.flush()
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()         # closing releases the flock


def _move_aside(out: Path, what: list[Path]) -> Path:
    """--overwrite: move a previous run's files into <out>/previous/<time>/ (nothing is deleted)."""
    dest = out / "previous" / time.strftime("%Y%m%d-%H%M%S")
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for p in what:
        os.replace(p, dest / p.name)
    return dest


def main(argv: list[str] | None = None, cli_process: bool | None = None) -> int:
    """CLI: python -m mshelpers.train --preset mini --steps 50 --out DIR [--ckpt-every K] [--resume].

    Every expected failure (bad input, a busy or unwritable folder, a full disk, a stopped run) ends in
    one line `error: ...` and a non-zero exit; --debug shows the traceback instead, and MindSpore's own log.
    SIGTERM or SIGINT (a scheduler's preemption, Ctrl-C) saves a checkpoint of the last completed step,
    prints one line saying where, and exits 143 or 130.

    `cli_process` (default: this is `python -m mshelpers.train`, i.e. no argv and MindSpore not yet imported)
    makes this process the CLI's own: its signal handling and MindSpore's quiet log. A caller that imports
    MindSpore and then forks one process per run (a fork server, to skip the imports) passes True in the
    child, which has no other thread yet; called from a program that keeps running, leave it False.
    """
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):          # one line, not usage + message
            print(f"error: {message}", file=sys.stderr)
            raise SystemExit(2)

    ap = Parser(prog="python -m mshelpers.train",
                description="Train a RunConfig preset; write DIR/metrics.csv, DIR/config.yaml and checkpoints.")
    ap.add_argument("--preset", default=None, help="RunConfig preset name (default mini; a resume keeps the run's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a RunConfig field")
    ap.add_argument("--steps", type=int, required=True,
                    help=f"train up to this step, at most {MAX_STEPS:,} (a resume may extend the run)")
    ap.add_argument("--ckpt-every", type=int, default=None,
                    help="checkpoint every K steps and at the end (0 = never; default 0, a resume keeps the run's)")
    ap.add_argument("--keep", type=int, default=3, help="intact checkpoints to keep")
    ap.add_argument("--out", required=True, help="run folder (one run per folder)")
    ap.add_argument("--resume", action="store_true", help="continue this folder's run from its newest intact checkpoint")
    ap.add_argument("--allow-change", action="store_true",
                    help="on --resume, apply --set values that differ from the checkpoint's settings")
    ap.add_argument("--allow-data-change", action="store_true",
                    help="on --resume, continue although the data file's content changed")
    ap.add_argument("--overwrite", action="store_true", help="start fresh in a used folder, moving the old run "
                                                             "into DIR/previous/")
    ap.add_argument("--compile-cache", default=None, metavar="DIR",
                    help="keep MindSpore's compile cache of the training step under DIR (one folder per graph), so a "
                         "resumed or repeated run of the same settings loads its graph instead of compiling it")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--debug", action="store_true", help="show tracebacks and MindSpore's own log")
    a = ap.parse_args(argv)
    stop = None
    if cli_process is None:
        cli_process = argv is None and "mindspore" not in sys.modules
    if cli_process:                    # the CLI process itself, before MindSpore's threads
        if not a.debug:  # MindSpore's C++ and Python log: only CRITICAL, so a failure prints the CLI's one line
            os.environ.setdefault("GLOG_v", "4")
            os.environ.setdefault("GLOG_logtostderr", "1")
        stop = StopSignal().install()
        a.quiet_mindspore = not a.debug
    try:
        return _run(a, stop)
    except Preempted as e:
        print(f"error: Preempted: {e}", file=sys.stderr)
        return 128 + e.signo
    except (OSError, ValueError, RuntimeError) as e:
        if a.debug:
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"error: {type(e).__name__}: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; resume with --resume", file=sys.stderr)
        return 130


def _quiet_mindspore() -> None:
    """The CLI's MindSpore Python logger drops even CRITICAL lines (GLOG_v=4 still prints them), so a refused
    run prints only the CLI's `error:` line. The reason is in that line; --debug shows everything."""
    import logging
    from mindspore import log
    getattr(log, "_get_logger", lambda: logging.getLogger("mindspore"))().setLevel(logging.CRITICAL + 1)


def _diff(old: dict, new: dict, skip=("steps", "log_dir")) -> dict:
    """Fields whose values differ, as {field: (old, new)}; `steps` (a resume may extend) and log_dir left out."""
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k not in skip and old.get(k) != new.get(k)}


def _fmt(d: dict) -> str:
    return ", ".join(f"{k} {o!r} -> {n!r}" for k, (o, n) in d.items())


def _run(a, stop: StopSignal | None = None) -> int:
    import json
    import uuid

    checkpoint = _sibling("checkpoint")
    RunConfig = _sibling("config", "RunConfig")
    check_fits, data_id = _sibling("data", "check_fits", "data_id")
    check_steps(a.steps, "--steps")
    if (a.ckpt_every is not None and a.ckpt_every < 0) or a.keep < 1:
        raise ValueError(f"--ckpt-every {a.ckpt_every} / --keep {a.keep} invalid; fix: ckpt-every >= 0, keep >= 1")
    if a.resume and a.overwrite:
        raise ValueError("--resume and --overwrite contradict each other; fix: pass one of them")
    overrides = _parse_set(a.set)
    out = Path(a.out)
    saved, csv, ckpts = out / "config.yaml", out / "metrics.csv", out / "checkpoints"
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} is a file, not a folder; fix: pass a folder path")
    fresh = RunConfig.preset(a.preset or "mini").replace(**overrides)
    fresh = fresh.replace(steps=max(fresh.steps, a.steps))
    if not (a.resume and saved.exists()):
        fresh.validate()                       # bad input fails before the folder is made
        check_fits(fresh)
    if getattr(a, "quiet_mindspore", False):
        _quiet_mindspore()
    notes: list[str] = []                      # printed once every check has passed
    moved: list[Path] = []
    with run_lock(out):
        for d in (out, ckpts):                 # we hold the lock: any temp file is a dead writer's
            checkpoint.clean_temp(d)
        if a.resume and saved.exists():
            d = RunConfig.read_yaml(saved)
            ident = d.get("run") if isinstance(d.get("run"), dict) else {}
            if not ident.get("id"):
                raise ValueError(f"{saved} has no run identity (written by an older version); "
                                 "fix: start a fresh run in another --out")
            base = RunConfig.from_dict(d).validate()
            if a.preset and a.preset != base.name:
                raise ValueError(f"--preset {a.preset} but the run in {out} is {base.name!r}; "
                                 "fix: drop --preset when resuming")
            cfg = base.replace(**overrides)
            if a.steps > cfg.steps:
                notes.append(f"extending the run from {cfg.steps} to {a.steps} steps: the learning-rate schedule "
                             f"(warm-up {cfg.warmup_steps}, then cosine to 10 %) is recomputed over {a.steps} "
                             "steps; steps already run keep the rates they had")
                cfg = cfg.replace(steps=a.steps)
            cfg.validate()
            check_fits(cfg)
            # what the run was trained with: the settings stored in the checkpoint it continues
            good = [r for r in checkpoint.scan(ckpts, run_id=ident["id"]) if r["status"] == "good"]
            ck_run = good[0].get("run", {}) if good else {}
            where = good[0]["path"].name if good else None
            if "config" in ck_run:
                trained = json.loads(ck_run["config"])
                edited = {k: v for k, v in _diff(trained, base.to_dict()).items() if k not in overrides}
                if edited:
                    raise ValueError(
                        f"{saved} differs from the settings {where} was trained with, not given with --set: "
                        f"{_fmt(edited)}; fix: restore those values in config.yaml, or pass them with "
                        f"--set ({' '.join(f'{k}={n}' for k, (_, n) in edited.items())}) and --allow-change")
            else:                              # no checkpoint yet, or one without its settings: the hash
                trained = base.to_dict()
                want = ck_run.get("config_hash") or ident.get("config_hash")
                if want and want != base.config_hash() and good:
                    raise ValueError(f"{saved} no longer matches config_hash {want} of {where} (edited by hand); "
                                     "fix: restore config.yaml, or start a fresh run in another --out")
            changed = _diff(trained, cfg.to_dict()) if good else {}   # no checkpoint: a fresh start, nothing mixed
            if changed and not a.allow_change:
                raise ValueError(f"--set changes the run's results: {_fmt(changed)}; fix: add --allow-change "
                                 "to mean it, or drop the --set")
            if _diff(base.to_dict(), cfg.to_dict()):
                notes.append("resume with changed settings: " + _fmt(_diff(base.to_dict(), cfg.to_dict())))
            data = data_id(cfg)
            was = ck_run.get("data") or ident.get("data")
            if was and was != data and cfg.data == trained.get("data"):
                if not a.allow_data_change:
                    raise ValueError(f"the data {cfg.data!r} changed since {where or 'the run started'}: was {was}, "
                                     f"now {data}; fix: restore it, or pass --allow-data-change to continue on it")
                notes.append(f"continuing on changed data {cfg.data!r}: was {was}, now {data}")
            stored = int(ck_run.get("ckpt_every") or ident.get("ckpt_every") or 0)
            ckpt_every = stored if a.ckpt_every is None else a.ckpt_every
            if a.ckpt_every is None and stored:
                notes.append(f"checkpoint every {ckpt_every} steps, as the run was started")
            run_id = ident["id"]
        else:
            if a.resume:
                found = checkpoint.list_checkpoints(ckpts)
                if found or csv.exists():
                    raise ValueError(f"--resume: {out} holds {len(found)} checkpoints and "
                                     f"{'a' if csv.exists() else 'no'} metrics.csv but no config.yaml to say "
                                     "which run they belong to; fix: restore config.yaml, or start fresh with --overwrite")
                notes.append(f"resume: nothing to resume in {out}; starting a fresh run")
            cfg = fresh
            used = [p for p in (saved, csv, ckpts) if p.exists()
                    and (p.is_file() or any(p.iterdir()))]
            if used and not a.resume:
                if not a.overwrite:
                    raise ValueError(f"{out} already holds a run ({', '.join(p.name for p in used)}); fix: --resume "
                                     "to continue it, --overwrite to move it aside, or another --out")
                moved = used
            data, ckpt_every, run_id = data_id(cfg), a.ckpt_every or 0, uuid.uuid4().hex[:12]
        ident = {"id": run_id, "config_hash": cfg.config_hash(), "data": data, "ckpt_every": ckpt_every}
        # every checkpoint carries the settings it was trained with, so a resume can name a hand edit
        run = {**ident, "config": json.dumps({k: v for k, v in cfg.to_dict().items() if k != "steps"},
                                             sort_keys=True)}

        def ready() -> None:                   # every check passed: only now is anything written
            if moved:
                print(f"moved the previous run to {_move_aside(out, moved)}", file=sys.stderr)
            cfg.to_yaml(saved, run=ident)
            for n in notes:
                print(n, file=sys.stderr)

        with compile_cache(cfg, a.compile_cache):
            h = train(cfg, steps=a.steps, csv_path=csv, progress=not a.quiet, ckpt_dir=ckpts,
                      ckpt_every=ckpt_every, keep=a.keep, resume=a.resume, run=run, on_ready=ready, stop=stop)
    s = h.summary() if h.rows else None
    if s and s["rollbacks"]:
        print(f"spike guard: {s['rollbacks']} rollbacks, skipped data positions {s['skipped_data_pos']}")
    if s:
        print(f"done: {s['steps']} steps, final loss {s['final_loss']:.4f}, median step "
              f"{s['median_step_s'] * 1e3:.0f} ms; metrics in {csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
