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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .config import RunConfig, build_dir
from .metrics import StepLogger, flops_per_token, mfu, summarize
from .metrics import peak_flops as _peak_flops   # `peak_flops` is also train()'s keyword


def lr_at(cfg: RunConfig, step: int) -> float:
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
    """Return step(input_ids) -> (loss, grad_norm, finite, scale), jitted when cfg.mode == "graph".

    Overflowed steps (non-finite gradients) skip the optimizer update; with a dynamic
    scaler the scale halves. With cfg.grad_accum = k the batch is split into k
    micro-batches whose gradients are averaged before one update.
    """
    import mindspore as ms
    from mindspore import amp, ops

    scaler = loss_scaler or make_loss_scaler(cfg)
    dynamic = cfg.dynamic_loss_scale
    params = optimizer.parameters
    clip = float(cfg.grad_clip)
    k = cfg.grad_accum

    def forward(input_ids):
        return scaler.scale(net(input_ids))

    grad_fn = ms.value_and_grad(forward, None, params)

    def compute_grads(input_ids):
        loss, grads = grad_fn(input_ids)
        return scaler.unscale(loss), scaler.unscale(grads)

    def apply_grads(grads):
        finite = amp.all_finite(grads)
        grad_norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]))
        if clip > 0:
            factor = ops.minimum(clip / (grad_norm + 1e-6), 1.0)   # reuse the norm instead of recomputing it
            grads = tuple(g * factor.astype(g.dtype) for g in grads)
        if finite:
            optimizer(grads)
        if dynamic:
            scaler.adjust(finite)
        return grad_norm, finite

    def fused_step(input_ids):
        loss, grads = compute_grads(input_ids)
        grad_norm, finite = apply_grads(grads)
        return loss, grad_norm, finite

    def accumulate(acc, grads):
        return tuple(a + g / k for a, g in zip(acc, grads))

    jit = ms.jit if cfg.mode == "graph" else (lambda f: f)
    if k == 1:
        step_fn = jit(fused_step)

        def step(input_ids):
            loss, grad_norm, finite = step_fn(input_ids)
            return loss, grad_norm, finite, scaler.scale_value
        step.loss_scaler = scaler     # checkpoints save and restore its state
        return step

    grads_fn, add_fn, apply_fn = jit(compute_grads), jit(accumulate), jit(apply_grads)

    def accum_step(input_ids):
        micro = input_ids.shape[0] // k
        total, acc = 0.0, None
        for i in range(k):
            loss, grads = grads_fn(input_ids[i * micro:(i + 1) * micro])
            # mutable: a plain tuple of tensors is a compile-time constant to ms.jit, and recompiles every call
            acc = tuple(g / k for g in grads) if acc is None else add_fn(ms.mutable(acc), ms.mutable(grads))
            total = total + loss / k
        grad_norm, finite = apply_fn(ms.mutable(tuple(acc)))
        return total, grad_norm, finite, scaler.scale_value
    accum_step.loss_scaler = scaler
    return accum_step


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN/inf loss without loss scaling to absorb it."""


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

    def summary(self) -> dict[str, Any]:
        s = summarize(self.rows)
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


def train(cfg: RunConfig, steps: int | None = None, callbacks: Iterable[Callable[[dict], Any]] = (), *,
          csv_path: str | Path | None = None, progress: bool = True, peak_flops: float | None = None,
          net=None, ckpt_dir: str | Path | None = None, ckpt_every: int = 0, keep: int = 3,
          resume: bool = False, stop_on_nonfinite: bool = True) -> History:
    """Train `cfg` for `steps` (default cfg.steps) steps and return its History.

    callbacks: callables receiving each step's row (dict) after it is logged.
    csv_path: where the per-step CSV goes (default build/runs/<name>-<mode>-s<seed>.csv).
    peak_flops: the device's peak FLOP/s for MFU (default: metrics.peak_flops(), measured once per machine
        and cached, so every run and notebook shares one denominator).
    net: an already built model (default: build_model(cfg)).
    ckpt_dir, ckpt_every, keep: write a checkpoint every `ckpt_every` steps, keep the newest `keep`.
    resume: continue from the newest intact checkpoint in ckpt_dir (corrupt ones are skipped with a
        warning); the CSV keeps its rows up to that step and continues from there.
    stop_on_nonfinite: without dynamic loss scaling, a NaN/inf loss raises NonFiniteLoss naming the
        step and the last good checkpoint. With dynamic loss scaling the step is skipped and counted.
    """
    steps = cfg.steps if steps is None else steps
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"train: steps={steps!r} is invalid; fix: pass a positive integer")
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

    import mindspore as ms
    from tqdm.auto import tqdm

    from . import checkpoint
    from .data import entropy_floor, numpy_batches
    from .device import setup
    from .model import build_model, count_params
    from .table import read_csv

    device = setup(mode=cfg.mode, seed=cfg.seed)
    net = net if net is not None else build_model(cfg, device)
    n_params = count_params(net)
    fpt = flops_per_token(n_params, cfg.num_layers, cfg.hidden_size, cfg.seq_len)
    peak = peak_flops or _peak_flops()
    optimizer = make_optimizer(net, cfg)
    step_fn = make_train_step(net, optimizer, cfg)
    floor = entropy_floor(cfg.vocab_size) if cfg.data == "markov" else None
    csv_path = Path(csv_path) if csv_path else build_dir("runs") / f"{cfg.name}-{cfg.mode}-s{cfg.seed}.csv"

    start, data_pos, last_ckpt, kept_rows = 1, 0, None, []
    guard = _SpikeGuard(cfg, net, optimizer, step_fn.loss_scaler) if cfg.spike_guard else None
    if resume:
        found = checkpoint.latest_good(ckpt_dir)
        if found:
            meta = checkpoint.load(found[0], net, optimizer, step_fn.loss_scaler)
            start, data_pos, last_ckpt = meta["step"] + 1, meta["data_pos"], found[0]
            if guard:
                guard.load(found[0])
            if csv_path.exists():   # rows written after the checkpoint are redone, so drop them
                kept_rows = [r for r in read_csv(csv_path) if r["step"] <= meta["step"]]
    logger = StepLogger(csv_path, cfg.tokens_per_step, fpt, peak, n_devices=cfg.dp)
    for r in kept_rows:
        logger.log_step(r["step"], r["loss"], r["step_time_s"], lr=r["lr"], grad_norm=r["grad_norm"],
                        overflow=r["overflow"], loss_scale=r["loss_scale"], peak_mem_mb=r["peak_mem_mb"],
                        spike=bool(r.get("spike", False)))
    hist = History(cfg, logger.rows, n_params, fpt, peak, floor, csv_path)
    hist.rollbacks = guard.events if guard else []

    batches = numpy_batches(cfg.replace(batch_size=cfg.batch_size * cfg.grad_accum))
    for _ in range(data_pos):          # the data position is part of exact resume
        next(batches)
    bar = tqdm(total=steps - start + 1, desc=f"{cfg.name} {cfg.mode}", disable=not progress, leave=False)
    step, redo = start, False
    while step <= steps:
        if guard:
            guard.snapshot()           # the state before this step: what a rollback restores
        x = ms.Tensor(next(batches), ms.int32)
        data_pos += 1
        t0 = time.perf_counter()
        loss, grad_norm, finite, scale = step_fn(x)
        loss = float(loss.asnumpy())       # synchronises: the step is done when its loss is on the host
        dt = time.perf_counter() - t0
        grad_norm, finite = float(grad_norm.asnumpy()), bool(finite.asnumpy())
        if guard and finite and guard.is_spike(loss, grad_norm):
            guard.roll_back(step, loss, grad_norm, skipped=data_pos - 1)   # this batch is skipped for good
            redo = True
            continue                   # the same step again, on the next batch
        row = logger.log_step(step, loss, dt, lr=lr_at(cfg, step), grad_norm=grad_norm,
                              overflow=not finite, loss_scale=float(scale.asnumpy()), spike=redo)
        redo = False
        if stop_on_nonfinite and not cfg.dynamic_loss_scale and not math.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss} at step {step}; last good checkpoint: "
                                f"{last_ckpt or 'none written yet'}. Fix: lower lr, check the init, "
                                "or enable dynamic_loss_scale to skip overflowed steps")
        if ckpt_every and step % ckpt_every == 0:
            last_ckpt = checkpoint.save(ckpt_dir, net, optimizer, step=step, data_pos=data_pos,
                                        loss_scaler=step_fn.loss_scaler, keep=keep)
            if guard:
                guard.save(last_ckpt)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", ms=f"{dt * 1e3:.0f}")
        for cb in callbacks:
            cb(row)
        step += 1
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
        from .stability import SpikeDetector
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

    def save(self, ckpt_path) -> None:
        import json
        import os
        path = Path(ckpt_path).with_suffix(".guard.json")
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        tmp.write_text(json.dumps({"detector": self.detector.state_dict(), "events": self.events}))
        os.replace(tmp, path)
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


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m mshelpers.train --preset mini --steps 50 --out DIR [--ckpt-every K] [--resume]."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m mshelpers.train",
                                 description="Train a RunConfig preset; write DIR/metrics.csv and checkpoints.")
    ap.add_argument("--preset", default="mini", help="RunConfig preset name (default mini)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a RunConfig field")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--ckpt-every", type=int, default=0, help="checkpoint every K steps (0 = never)")
    ap.add_argument("--keep", type=int, default=3, help="checkpoints to keep")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint in --out")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    saved = Path(a.out) / "config.yaml"
    try:
        # A resumed run keeps the config that wrote its checkpoints (the lr schedule's length included).
        base = RunConfig.from_yaml(saved) if a.resume and saved.exists() else RunConfig.preset(a.preset)
        cfg = base.replace(**_parse_set(a.set))
        if a.steps < 1:
            raise ValueError(f"--steps {a.steps} is invalid; fix: pass a positive integer")
        if a.ckpt_every < 0 or a.keep < 1:
            raise ValueError(f"--ckpt-every {a.ckpt_every} / --keep {a.keep} invalid; fix: ckpt-every >= 0, keep >= 1")
        cfg = cfg.replace(steps=max(cfg.steps, a.steps)).validate()
    except ValueError as e:
        ap.error(str(e))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(out / "config.yaml")
    try:
        h = train(cfg, steps=a.steps, csv_path=out / "metrics.csv", progress=not a.quiet,
                  ckpt_dir=out / "checkpoints", ckpt_every=a.ckpt_every, keep=a.keep, resume=a.resume)
    except (NonFiniteLoss, SpikeStorm) as e:   # a stop with a reason, not a crash: one line, non-zero exit
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    s = h.summary()
    if s["rollbacks"]:
        print(f"spike guard: {s['rollbacks']} rollbacks, skipped data positions {s['skipped_data_pos']}")
    print(f"done: {s['steps']} steps, final loss {s['final_loss']:.4f}, median step {s['median_step_s'] * 1e3:.0f} ms; "
          f"metrics in {out / 'metrics.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
