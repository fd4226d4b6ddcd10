"""The training CLI: `python -m mshelpers.train --preset mini --steps 50 --out DIR [--ckpt-every K] [--resume]`.

One run per folder: DIR/config.yaml (the settings and the run's identity), DIR/metrics.csv (one row per step) and
DIR/checkpoints/. Every expected failure is one line `error: ...` and a non-zero exit; SIGTERM or SIGINT saves
the last completed step. train.py's `__main__` calls `main` here, so `python -m mshelpers.train` is this module.
Taught in notebooks/12_your_config.ipynb; README's Reliability section lists every refusal.

Needs its siblings (train, checkpoint, config, data and what train() needs), in the package or copied side by side.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


# --- signals: SIGTERM and SIGINT stop the run after a step ---
class StopSignal:
    """SIGTERM and SIGINT for the training CLI, taken from MindSpore.

    MindSpore's SignalGuard turns a SIGINT into a SIGTERM to the process, and a Python handler installed
    after its own does not run for SIGINT. So `install()` blocks both signals in every thread (call it before
    `import mindspore`: threads inherit the mask), and one thread receives them with `sigwaitinfo`. The
    training loop reads `signo` after every step, saves and stops. A second signal exits at once
    (128 + signo); the checkpoint writes are atomic, so that still loses nothing already saved.
    Taught in: no notebook (README, Reliability: SIGTERM at a random moment).
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


# --- the command line ---
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
    Taught in notebooks/12_your_config.ipynb; README's Reliability section lists what each failure prints.
    """
    import argparse
    if __package__:
        from .checkpoint import Preempted
        from .train import MAX_STEPS
    else:  # copied beside its siblings as plain files
        from checkpoint import Preempted
        from train import MAX_STEPS

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

    if __package__:
        from . import checkpoint
        from .config import RunConfig
        from .data import check_fits, data_id
        from .train import check_steps, compile_cache, train
    else:  # copied beside its siblings as plain files
        import checkpoint
        from config import RunConfig
        from data import check_fits, data_id
        from train import check_steps, compile_cache, train
    run_lock = checkpoint.run_lock
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
                print(f"moved the previous run to {checkpoint.move_run_aside(out, moved)}", file=sys.stderr)
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


# --- --set values and settings diffs ---
def _parse_set(items: list[str]) -> dict[str, Any]:
    """--set key=value pairs, each value converted to the RunConfig field's type."""
    import dataclasses

    if __package__:
        from .config import RunConfig
    else:  # copied beside its siblings as plain files
        from config import RunConfig
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
