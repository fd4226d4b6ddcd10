"""The mini-LLaMA runner: one function trains a RunConfig and logs every step.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers.train import train
    >>> h = train(RunConfig.preset("mini").replace(mode="graph", steps=20))
    >>> h.summary()["median_step_s"]        # steady-state step time, compile step excluded

The step is `train_step.build_step`'s: op by op (PyNative) or one compiled graph, with optional loss scaling,
gradient clipping and gradient accumulation. The first step of a graph run includes the compile; `History`
reports it apart from the median of the steady steps. `train()` reads as set up, loop, save: resume, commit and
preemption are checkpoint.CheckpointManager's, the spike guard is stability.SpikeGuard, the metrics CSV is
metrics.MetricsCSV, and the CLI (`python -m mshelpers.train`) is train_cli.py.
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

# Siblings (train_step, config, metrics, peak, data, model, device, checkpoint, stability) are imported inside the
# functions that use them: `lr_at`, `check_steps` and `compile_cache` work from a copy of this file alone;
# `make_train_step` needs train_step.py, and `train()` the siblings, in the package or copied side by side.


# --- the schedule, the optimizer, the step ---
def lr_at(cfg: "RunConfig", step: int) -> float:
    """Learning rate at 1-based `step`: linear warm-up, then cosine decay to 10% of cfg.lr.
    Taught in notebooks/01_pynative_baseline.ipynb (the lr column of every run)."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / max(1, cfg.warmup_steps)
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(net, cfg: RunConfig):
    """AdamW with the warm-up + cosine schedule of `lr_at`, one value per step.
    Taught in notebooks/02_graph_mode.ipynb."""
    from mindspore import nn
    lrs = [lr_at(cfg, s) for s in range(1, cfg.steps + 1)]
    return nn.AdamWeightDecay(net.trainable_params(), learning_rate=lrs, weight_decay=cfg.weight_decay)


def make_loss_scaler(cfg: RunConfig):
    """DynamicLossScaler (x2 / /2 every 50 good steps / on overflow) or a static one.
    Taught in notebooks/03_mixed_precision.ipynb (loss scaling)."""
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
    if __package__:
        from .train_step import build_step
    else:  # copied beside its siblings as plain files
        from train_step import build_step
    inner = build_step(
        net, optimizer, mode=cfg.mode, scaler=scaler, dynamic=cfg.dynamic_loss_scale, clip=cfg.grad_clip,
        accum=cfg.grad_accum)

    def step(input_ids):
        loss, grad_norm, finite = inner(input_ids)
        return loss, grad_norm, finite, scaler.scale_value
    step.loss_scaler = scaler     # checkpoints save and restore its state
    return step


# --- errors and limits ---
class NonFiniteLoss(RuntimeError):
    """Training produced a NaN/inf loss (or non-finite weights) without loss scaling to absorb it.
    Taught with the rest of train.py in notebooks/01_pynative_baseline.ipynb."""


class CollapsedRun(RuntimeError):
    """Training goes on but learns nothing: zero gradients, or the loss pinned at ln(vocab) (uniform guessing).
    Taught with the rest of train.py in notebooks/01_pynative_baseline.ipynb."""


MAX_STEPS = 1_000_000   # the lr table holds one value per step; far beyond what a CPU run reaches


def check_steps(steps: int, what: str = "steps") -> None:
    """Refuse a step count outside 1..MAX_STEPS with one line, before anything is built or written.
    Taught in: no notebook (README, Reliability)."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"{what}={steps!r} is invalid; fix: pass an integer from 1 to {MAX_STEPS:,} "
                         "(the stated maximum)")


# --- a run's history ---
@dataclass
class History:
    """Per-step rows of one run plus its summary (compile step apart from steady steps).
    Taught in notebooks/01_pynative_baseline.ipynb."""
    cfg: RunConfig
    rows: list[dict] = field(default_factory=list)
    n_params: int = 0
    flops_per_token: int = 0
    peak_flops: float = float("nan")
    floor: float | None = None
    csv_path: Path | None = None
    rollbacks: list = field(default_factory=list)   # spike-guard events: step, loss, trigger, skipped data position
    net: Any = field(default=None, repr=False, compare=False)      # the trained model (train() sets it)
    # (cfg, net, optimizer, step) as train() built them: what a later train(warm=this) reuses
    built: tuple | None = field(default=None, repr=False, compare=False)

    def summary(self, skip_first: int = 1) -> dict[str, Any]:
        """metrics.summarize over the rows: step time, tokens/s and MFU are medians over the steps after the first
        `skip_first` (1: the compile step). A short timed run passes half its steps: MindSpore's CPU runtime runs
        the first steps after a compile slower, so a median that includes them lands on that edge."""
        if __package__:
            from .metrics import summarize
        else:  # copied beside its siblings as plain files
            from metrics import summarize
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


# --- the compile cache ---
@contextmanager
def compile_cache(cfg: Any, root: str | Path | None, context: dict | None = None) -> Iterator[bool]:
    """MindSpore's compile cache for the training step of `cfg`, in a fresh process: one folder under `root`
    per graph (the config without seed and name, `context`, MindSpore's version, the sources beside this
    file), so a second process that trains the same graph loads it instead of compiling (a mini step: about
    10 s cold, 2 s warm on 2 CPU cores). Yields True when the cache is on; a no-op (False) for PyNative, for grad_accum > 1 (its three
    ms.jit functions reach Parameters through closures and come back from a warm cache with zeroed weights:
    tests/test_train.py), and when `root` is None. `cfg` is a RunConfig or a plain dict of its fields.

    MindSpore reads the cache only at the first compile of a process, so use it in fresh processes
    (`timing.run_isolated`, the CLI's --compile-cache); the variables are removed again on exit.

    Taught in notebooks/02_graph_mode.ipynb.

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


# --- train(): set up, loop, save ---
def train(cfg: "RunConfig", steps: int | None = None, callbacks: Iterable[Callable[[dict], Any]] = (), *,
          csv_path: str | Path | None = None, progress: bool = True, peak_flops: float | None = None,
          net=None, ckpt_dir: str | Path | None = None, ckpt_every: int = 0, keep: int = 3,
          resume: bool = False, stop_on_nonfinite: bool = True, run: dict | None = None,
          collapse_after: int = 5, on_ready: Callable[[], Any] | None = None, stop: Any = None,
          warm: History | None = None) -> History:
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
    stop: a train_cli.StopSignal; when it fires, the current step is finished, a checkpoint of it is saved (ckpt_dir
        is needed) and checkpoint.Preempted is raised naming it.
    warm: the History of an earlier run in this process of the same graph (its config may differ only in
        WARM_MAY_DIFFER: seed, name, data, the spike guard's settings). Its model, optimizer and compiled step are
        reused, every Parameter overwritten with this run's fresh start (the weights of `net`, or of
        build_model(cfg) under cfg.seed; a new optimizer's zeroed moments and step count; the initial loss scale),
        so the step is not compiled again (notebook 10's 23 runs of 200 tiny steps: 275 s cold, 165 s warm, an Intel
        Xeon with 2 cores). It trains exactly as a fresh run (tests/test_train.py compares every loss). The runs then share one model:
        History.net is that model, so score or save a run's weights before the next warm run overwrites them.

    Resume, commit and preemption are checkpoint.CheckpointManager's; the spike guard is stability.SpikeGuard.
    Taught in notebooks/01_pynative_baseline.ipynb (and used by every training notebook after it).
    """
    cfg, steps = _checked(cfg, steps, ckpt_dir, ckpt_every, keep, resume)
    _check_warm(warm, cfg, resume)
    if __package__:
        from .checkpoint import CheckpointManager
        from .stability import SpikeGuard
    else:  # copied beside its siblings as plain files
        from checkpoint import CheckpointManager
        from stability import SpikeGuard
    ckpts = CheckpointManager(ckpt_dir, every=ckpt_every, keep=keep, run=run)
    if resume and ckpts.check_resume(steps):   # refused (all corrupt, too few steps) before anything is built
        return History(cfg)                    # or already complete: nothing to do, nothing touched
    from tqdm.std import tqdm   # a text bar: renders in nbconvert and JupyterLab, no widget left frozen at 0 %

    # set up: the model, its step, the spike guard, the log; then the checkpoint (resume) or a fresh start
    net, optimizer, step_fn = _build(cfg, net, warm)
    guard = SpikeGuard(cfg, net, optimizer, step_fn.loss_scaler) if cfg.spike_guard else None
    ckpts.attach(net, optimizer, step_fn.loss_scaler, guard)
    hist, logger, metrics_csv = _history(cfg, net, csv_path, peak_flops, guard)
    hist.net, hist.built = net, (cfg, net, optimizer, step_fn)
    start, data_pos, kept_rows = ckpts.begin(resume, steps, metrics_csv, on_ready)
    logger.rows.extend(kept_rows)
    batches = _batches(cfg, data_pos)
    health = _Health(cfg, ckpts, stop_on_nonfinite, collapse_after)
    bar = tqdm(total=steps - start + 1, desc=f"{cfg.name} {cfg.mode}", disable=not progress, file=sys.stdout,
               mininterval=0.5)

    # the loop: one step, its row, the checks, a checkpoint when due
    step, redo, done_loss = start, False, None
    try:
        while step <= steps:
            if stop is not None and stop.signo:
                raise ckpts.preempted(step - 1, data_pos, done_loss, stop)
            if guard:
                guard.snapshot()           # the state before this step: what a rollback restores
            loss, grad_norm, finite, scale, dt = _timed(step_fn, next(batches))
            data_pos += 1
            ckpts.vouch(loss)                  # this loss was computed with the pending checkpoint's weights
            if guard and finite and guard.is_spike(loss, grad_norm):
                guard.roll_back(step, loss, grad_norm, skipped=data_pos - 1)   # this batch is skipped for good
                redo = True
                continue                   # the same step again, on the next batch
            row = logger.log_step(step, loss, dt, lr=lr_at(cfg, step), grad_norm=grad_norm,
                                  overflow=not finite, loss_scale=scale, spike=redo)
            metrics_csv.append(row, logger.rows)
            done_loss, redo = loss, False
            health.check(step, loss, grad_norm, finite)
            if ckpts.due(step, steps):
                health.check_weights(step)
                ckpts.write(step, data_pos, loss)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", ms=f"{dt * 1e3:.0f}")
            for cb in callbacks:
                cb(row)
            if stop is not None and stop.signo and step < steps:
                raise ckpts.preempted(step, data_pos, done_loss, stop)
            step += 1
        ckpts.finish()                 # the last step: no next forward vouches for it; its weights were checked
    finally:
        ckpts.drop()                   # a pending checkpoint nobody vouched for
        metrics_csv.close(logger.rows)
        bar.close()
    return hist


# --- train()'s parts: its checks, its set-up, its health checks ---
def _checked(cfg, steps, ckpt_dir, ckpt_every, keep, resume) -> tuple:
    """train()'s arguments, checked before any MindSpore work; returns (cfg covering every step, steps)."""
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
    if __package__:
        from .data import check_fits
    else:  # copied beside its siblings as plain files
        from data import check_fits
    check_fits(cfg)
    return cfg, steps


# A warm run may differ from the run it reuses only in these: none of them is part of the compiled step (the
# data arrives as batches, the guard works between steps)
WARM_MAY_DIFFER = ("seed", "name", "data", "log_dir", "spike_guard", "spike_threshold", "spike_window")


def _check_warm(warm, cfg, resume: bool) -> None:
    """train()'s `warm`, refused in one line before anything is built: not a History that train() built, another
    graph, or a resume (whose checkpoint would be loaded into a step built for another run: not measured)."""
    if warm is None:
        return
    if not isinstance(warm, History) or warm.built is None:
        raise ValueError(f"train: warm={type(warm).__name__} holds no built step; fix: pass the History that an "
                         "earlier train() returned in this process, or warm=None")
    if resume:
        raise ValueError("train: warm= with resume=True is not supported (a checkpoint loaded into a reused step "
                         "is not measured); fix: resume without warm=")
    if cfg.grad_accum > 1:
        raise ValueError(f"train: warm= with grad_accum={cfg.grad_accum}: its accumulation buffers are not reset "
                         "(not measured); fix: grad_accum=1, or warm=None")
    before = warm.built[0]
    for k, v in cfg.to_dict().items():
        if k not in WARM_MAY_DIFFER and getattr(before, k) != v:
            raise ValueError(f"train: warm= holds the step of another graph ({k}={getattr(before, k)!r} there, "
                             f"{v!r} here); fix: warm only runs that differ in {', '.join(WARM_MAY_DIFFER)}, "
                             "or warm=None")


def _build(cfg, net=None, warm: History | None = None) -> tuple:
    """The device set up (mode and seed), the model (unless given), AdamW and the step, in this order: the
    seed's draws are part of exact resume. With `warm`, its model, optimizer and step are returned instead,
    every Parameter assigned this fresh start's value (assign writes into the Parameter's own buffer, which the
    compiled step reads; set_data would swap in one it never sees)."""
    if __package__:
        from .checkpoint import training_state
        from .device import setup
        from .model import build_model
    else:  # copied beside its siblings as plain files
        from checkpoint import training_state
        from device import setup
        from model import build_model
    device = setup(mode=cfg.mode, seed=cfg.seed)
    net = net if net is not None else build_model(cfg, device)
    optimizer = make_optimizer(net, cfg)
    step = make_train_step(net, optimizer, cfg)
    if warm is None:
        return net, optimizer, step
    import mindspore as ms
    _, w_net, w_opt, w_step = warm.built
    fresh, kept = training_state(net, optimizer, step.loss_scaler), training_state(w_net, w_opt, w_step.loss_scaler)
    # every name and shape checked before the first assign: a refused warm start leaves the earlier run's model whole
    for name in fresh.keys() | kept.keys():
        there = tuple(kept[name].shape) if name in kept else "missing"
        here = tuple(fresh[name].shape) if name in fresh else "missing"
        if there != here:
            raise ValueError(f"train: warm= holds another model: its {name!r} is {there}, this run's {here}; "
                             "fix: pass net=None or a model of this config, or warm=None")
    for name, p in fresh.items():
        ms.ops.assign(kept[name], ms.Tensor(p.asnumpy()))
    return w_net, w_opt, w_step


def _history(cfg, net, csv_path, peak_flops, guard=None) -> tuple:
    """(History, StepLogger, MetricsCSV) of a run: FLOPs per token, the MFU denominator, the loss floor, the CSV,
    the spike guard's rollbacks."""
    if __package__:
        from .config import build_dir
        from .data import entropy_floor
        from .metrics import COLUMNS, MetricsCSV, StepLogger, flops_per_token
        from .model import count_params
        from .peak import hardware_peak_flops
    else:  # copied beside its siblings as plain files
        from config import build_dir
        from data import entropy_floor
        from metrics import COLUMNS, MetricsCSV, StepLogger, flops_per_token
        from model import count_params
        from peak import hardware_peak_flops
    n_params = count_params(net)
    fpt = flops_per_token(n_params, cfg.num_layers, cfg.hidden_size, cfg.seq_len)
    peak = peak_flops or hardware_peak_flops()   # PaLM MFU: the hardware peak
    floor = entropy_floor(cfg.vocab_size) if cfg.data == "markov" else None
    csv_path = Path(csv_path) if csv_path else build_dir("runs") / f"{cfg.name}-{cfg.mode}-s{cfg.seed}.csv"
    logger = StepLogger(None, cfg.tokens_per_step, fpt, peak, n_devices=cfg.dp)
    hist = History(cfg, logger.rows, n_params, fpt, peak, floor, csv_path, guard.events if guard else [])
    return hist, logger, MetricsCSV(csv_path, COLUMNS)


def _batches(cfg, data_pos: int):
    """The run's batches (grad_accum micro-batches each), from data position `data_pos`: part of exact resume."""
    if __package__:
        from .data import numpy_batches
    else:  # copied beside its siblings as plain files
        from data import numpy_batches
    batches = numpy_batches(cfg.replace(batch_size=cfg.batch_size * cfg.grad_accum))
    for _ in range(data_pos):
        next(batches)
    return batches


def _timed(step_fn, batch) -> tuple:
    """One step on `batch`, timed until its loss is on the host (reading it synchronises); Python numbers:
    (loss, grad_norm, finite, loss scale, seconds)."""
    import mindspore as ms
    x = ms.Tensor(batch, ms.int32)
    t0 = time.perf_counter()
    loss, grad_norm, finite, scale = step_fn(x)
    loss = float(loss.asnumpy())
    dt = time.perf_counter() - t0
    return loss, float(grad_norm.asnumpy()), bool(finite.asnumpy()), float(scale.asnumpy()), dt


class _Health:
    """What stops a run after a logged step: a NaN/inf loss without dynamic loss scaling, or weights gone
    non-finite before a checkpoint is written (NonFiniteLoss); `collapse_after` steps in a row with a zero
    gradient norm or the loss pinned at ln(vocab) (CollapsedRun). Each names the newest checkpoint to go back to."""

    def __init__(self, cfg, ckpts, stop_on_nonfinite: bool, collapse_after: int) -> None:
        self.cfg, self.ckpts, self.stop_on_nonfinite = cfg, ckpts, stop_on_nonfinite
        self.collapse_after = collapse_after
        self.ln_vocab, self.flat = math.log(cfg.vocab_size), 0

    def check(self, step: int, loss: float, grad_norm: float, finite: bool) -> None:
        if self.stop_on_nonfinite and not self.cfg.dynamic_loss_scale and not math.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss} at step {step}; newest checkpoint with finite weights: "
                                f"{self.ckpts.newest_finite()}. Fix: lower lr, check the init, "
                                "or enable dynamic_loss_scale to skip overflowed steps")
        if self.collapse_after:
            pinned = abs(loss - self.ln_vocab) < 1e-3 and step > self.cfg.warmup_steps
            # overflowed steps still count when the loss is pinned: a dynamic scaler hides nothing here
            self.flat = self.flat + 1 if (finite and grad_norm == 0.0) or pinned else 0
            if self.flat >= self.collapse_after:
                raise CollapsedRun(f"the run collapsed: {self.flat} steps in a row up to step {step} with zero "
                                   f"gradients or the loss pinned at ln vocab ({loss:.4f} vs {self.ln_vocab:.4f}; "
                                   f"last grad norm {grad_norm:g}); "
                                   f"newest checkpoint with finite weights: {self.ckpts.newest_finite()}. "
                                   "Fix: lower lr (the weights saturated) and resume from that checkpoint")

    def check_weights(self, step: int) -> None:
        bad = self.ckpts.nonfinite_weight()
        if bad:
            raise NonFiniteLoss(f"parameter {bad!r} is non-finite after step {step}; not saved; newest "
                                f"checkpoint with finite weights: {self.ckpts.newest_finite()}. Fix: lower lr")


if __name__ == "__main__":      # python -m mshelpers.train: the CLI (train_cli.py)
    if __package__:
        from .train_cli import main
    else:  # copied beside its siblings as plain files
        from train_cli import main
    raise SystemExit(main())
