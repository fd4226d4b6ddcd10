"""Checkpoints that survive a crash: atomic writes, CRC-checked reads, fallback to the last good one.

Example:
    >>> import tempfile
    >>> from mindspore import nn
    >>> from mshelpers import checkpoint
    >>> net = nn.Dense(4, 3)
    >>> optimizer = nn.Adam(net.trainable_params())
    >>> out = tempfile.mkdtemp()
    >>> checkpoint.save(out, net, optimizer, step=100, data_pos=100).name
    'step_000100.ckpt'
    >>> path, meta = checkpoint.latest_good(out)      # skips corrupt files, says which
    >>> meta
    {'step': 100, 'data_pos': 100}
    >>> checkpoint.load(path, net, optimizer)["step"]
    100

A checkpoint holds the parameters, the optimizer state (moments and its step
counter, hence the learning-rate position), the loss-scaler state, the step, the data
position and MindSpore's RNG state: everything exact resume needs. It is written to a
temporary file and renamed into place, so a kill mid-write never leaves a half file
under the final name; MindSpore's CRC check catches files damaged afterwards.

A training run's checkpoints are one `CheckpointManager`, which owns their state (torchtitan's components do
this): which checkpoint a resume continues, the pending write that the next finite loss commits, and what a
preemption saves. `run_lock` and `move_run_aside` keep one run per folder (the CLI, train_cli.py).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

NAME = re.compile(r"^step_(\d{6,})\.ckpt$")
TMP_PREFIX = ".tmp-"


# --- errors, and what a checkpoint holds ---
class CorruptCheckpoint(RuntimeError):
    """The file exists but cannot be read back intact (truncated, bit-flipped, foreign).
    Taught in notebooks/11_your_own_model.ipynb."""


def _as_step(fn: str, name: str, v) -> int:
    import numbers
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 0:
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and float(v).is_integer() and v >= 0:
        return int(v)
    raise ValueError(f"checkpoint.{fn}: {name}={v!r} is invalid; fix: pass a non-negative integer")


def training_state(net, optimizer, loss_scaler) -> dict[str, Any]:
    """Every Parameter a training step changes, by name, once each: the model's, the optimizer's (its moments and
    step count; a Parameter it shares with the model counted once) and the loss scaler's scale and counter.
    What a checkpoint holds, and what `train(warm=...)` overwrites with a fresh start.
    Taught in: no notebook; train() calls it (README, Reliability)."""
    entries: dict[str, Any] = {}
    for cell in (net, optimizer):
        if cell is not None:
            for p in cell.get_parameters():
                entries.setdefault(p.name, p)
    if loss_scaler is not None:
        for attr in ("scale_value", "counter"):
            if hasattr(loss_scaler, attr):
                entries[f"loss_scaler.{attr}"] = getattr(loss_scaler, attr)
    return entries


# --- write and commit ---
def write_pending(ckpt_dir: str | os.PathLike, net, optimizer=None, *, step: int, data_pos: int,
                  loss_scaler=None, run: dict | None = None, loss: float | None = None) -> Path:
    """Write the checkpoint of `step` under a temporary name (invisible to readers) and return that path.

    `commit(path)` makes it visible. Training writes a checkpoint this way and commits it only after
    the next step's loss came out finite, so weights that blow up the next forward are never kept.
    `run` (e.g. {"id": ..., "config_hash": ...}) is stored as text entries `meta.run.<key>`; `loss` (the
    step's logged loss, a float32 value, so stored exactly) as `meta.loss`, so a resume can tell which metrics
    row is the real one.
    A failed write (a full disk, a kill signal turned into an exception) removes its own temp file.
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability).
    """
    import mindspore as ms
    step = _as_step("save", "step", step)
    data_pos = _as_step("save", "data_pos", data_pos)
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f"{TMP_PREFIX}{os.getpid()}-step_{step:06d}.ckpt"   # MindSpore insists on a .ckpt suffix
    entries = [{"name": n, "data": p} for n, p in training_state(net, optimizer, loss_scaler).items()]
    meta: dict[str, Any] = {"meta.step": step, "meta.data_pos": data_pos, "meta.rng_state": ms.get_rng_state()}
    for k, v in (run or {}).items():
        meta[f"meta.run.{k}"] = str(v)
    if loss is not None:
        meta["meta.loss"] = float(loss)
    try:
        ms.save_checkpoint(entries, str(tmp), append_dict=meta, crc_check=True)
        with open(tmp, "rb") as f:      # the bytes must be on disk before a rename makes them visible
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".tmp").unlink(missing_ok=True)   # MindSpore's own scratch name for the same write
        raise
    return tmp


FOREIGN_DIR = "foreign"    # another run's (or a misnamed) file found at a name we write: moved here, kept


def _move_aside(path: Path, why: str) -> Path:
    """Move `path` into <its folder>/foreign/ under a name no reader picks up, say so, return the new path."""
    dest_dir = path.parent / FOREIGN_DIR
    dest_dir.mkdir(exist_ok=True)
    dest, n = dest_dir / path.name, 0
    while dest.exists():
        n += 1
        dest = dest_dir / f"{path.stem}.{n}{path.suffix}"
    os.replace(path, dest)
    print(f"{path} {why}; moved it to {dest} (kept) before writing ours", file=sys.stderr)
    return dest


def commit(pending: str | os.PathLike, run_id: str | None = None) -> Path:
    """Rename a `write_pending` file to its final `step_<N>.ckpt` name (atomic) and return the final path.

    With `run_id`, a file already at that name that belongs to another run, or holds another step, is moved
    into `foreign/` first (kept, and said), never overwritten.
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability).
    """
    pending = Path(pending)
    m = re.match(rf"^{re.escape(TMP_PREFIX)}\d+-(step_\d{{6,}}\.ckpt)$", pending.name)
    if not m:
        raise ValueError(f"checkpoint.commit: {pending} is not a pending checkpoint; fix: pass write_pending()'s path")
    final = pending.with_name(m.group(1))
    if run_id is not None and final.exists():
        try:
            there = info(read(final))
        except (CorruptCheckpoint, FileNotFoundError):
            there = None                    # damaged: ours replaces it
        if there is not None and there.get("run", {}).get("id") != run_id:
            _move_aside(final, f"belongs to run {there.get('run', {}).get('id')}")
        elif there is not None and there.get("step") != int(NAME.match(final.name).group(1)):
            _move_aside(final, f"holds step {there.get('step')}, not the step its name says")
    os.replace(pending, final)
    return final


def save(ckpt_dir: str | os.PathLike, net, optimizer=None, *, step: int, data_pos: int,
         loss_scaler=None, keep: int | None = None, run: dict | None = None) -> Path:
    """Write `ckpt_dir/step_<step>.ckpt` atomically and return its path; keep the newest `keep` good files.
    Taught in notebooks/11_your_own_model.ipynb."""
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"checkpoint.save: keep={keep} is invalid; fix: keep at least 1 checkpoint")
    final = commit(write_pending(ckpt_dir, net, optimizer, step=step, data_pos=data_pos,
                                 loss_scaler=loss_scaler, run=run), run_id=(run or {}).get("id"))
    if keep:
        prune(ckpt_dir, keep, run_id=(run or {}).get("id"))
    return final


# --- list, read, load ---
def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files in `ckpt_dir`, newest step first (temporary files ignored).
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def clean_temp(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Delete leftover temp files (from a killed or failed write); call it only while no writer runs.
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability)."""
    d = Path(ckpt_dir)
    gone = [p for p in d.glob(f"{TMP_PREFIX}*")] if d.is_dir() else []
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def read(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint into a name -> Parameter dict, or raise CorruptCheckpoint naming the file.
    Taught in notebooks/11_your_own_model.ipynb."""
    import mindspore as ms
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; fix: pass a file from list_checkpoints()")
    try:
        params = ms.load_checkpoint(str(path), crc_check=True)
    except (ValueError, RuntimeError, OSError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt or truncated ({first})") from e
    if "meta.step" not in params:
        raise CorruptCheckpoint(f"checkpoint {path} has no meta.step entry: it was not written by checkpoint.save")
    return params


def info(params: dict[str, Any]) -> dict[str, Any]:
    """Step, data position and run identity of a `read()` result.
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability)."""
    def value(v):
        return int(v.asnumpy() if hasattr(v, "asnumpy") else v)
    out = {k: value(params[f"meta.{k}"]) for k in ("step", "data_pos") if f"meta.{k}" in params}
    if "meta.loss" in params:
        v = params["meta.loss"]
        out["loss"] = float(v.asnumpy() if hasattr(v, "asnumpy") else v)
    run = {k[len("meta.run."):]: v for k, v in params.items() if k.startswith("meta.run.")}
    if run:
        out["run"] = run
    return out


def nonfinite_params(params: dict[str, Any]) -> list[str]:
    """Names of the float entries holding NaN or inf (weights, moments).
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability)."""
    import numpy as np
    bad = []
    for k, v in params.items():
        if k.startswith("meta.") or isinstance(v, str):
            continue
        a = np.asarray(v.asnumpy() if hasattr(v, "asnumpy") else v)   # Parameters, or plain numpy arrays
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            bad.append(k)
    return bad


def _nearest(name: str, candidates: list[str]) -> str:
    """A hint for a missing parameter: the closest checkpoint key and, when only a prefix differs, the fix."""
    import difflib
    for c in candidates:
        if c.endswith("." + name) or name.endswith("." + c):
            longer, shorter = (c, name) if len(c) > len(name) else (name, c)
            prefix = longer[: len(longer) - len(shorter)]
            side = "checkpoint" if longer == c else "net"
            return (f"the checkpoint has {c!r}: the names differ by the prefix {prefix!r} on the {side} side; fix: "
                    f"load into the cell the checkpoint was saved from, or rename keys "
                    f"({{k.removeprefix({prefix!r}): v}} or {{{prefix!r} + k: v}}) before load_param_into_net")
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5)
    if close:
        return f"nearest checkpoint key: {close[0]!r}; fix: resume with the config and model that wrote it"
    return "fix: resume with the config and model that wrote it"


def load(path: str | os.PathLike, net, optimizer=None, loss_scaler=None, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """Restore net, optimizer, loss scaler and RNG state from `path`; return step, data_pos, run, path.

    ignore: checkpoint entries to leave out (train() re-derives the optimizer's `learning_rate` table
    when a run is extended, so the table's length may differ).
    Taught in notebooks/11_your_own_model.ipynb.
    """
    import mindspore as ms
    params = read(path)
    for k in ignore:
        params.pop(k, None)
    keys = [k for k in params if not k.startswith(("meta.", "loss_scaler."))]
    for cell in (net, optimizer):
        if cell is not None:
            try:
                not_loaded, _ = ms.load_param_into_net(cell, params, strict_load=True)
            except RuntimeError as e:   # a shape mismatch: another model size
                raise CorruptCheckpoint(f"checkpoint {path} does not fit this {type(cell).__name__}: "
                                        f"{str(e).splitlines()[0][:300]}; fix: resume with the config that "
                                        "wrote it (same model)") from e
            missing = [n for n in not_loaded if not n.startswith(("meta.", "loss_scaler.")) and n not in ignore]
            if missing:
                raise CorruptCheckpoint(f"checkpoint {path} lacks {len(missing)} parameters of {type(cell).__name__}, "
                                        f"e.g. {missing[0]!r}; {_nearest(missing[0], keys)}")
    if loss_scaler is not None:
        for attr in ("scale_value", "counter"):
            key = f"loss_scaler.{attr}"
            if key in params and hasattr(loss_scaler, attr):
                getattr(loss_scaler, attr).set_data(params[key].value())
    if "meta.rng_state" in params:
        ms.set_rng_state(params["meta.rng_state"].value())
    return {**info(params), "path": Path(path)}


# --- scan, prune, the newest good one ---
def scan(ckpt_dir: str | os.PathLike, run_id: str | None = None, finite: bool = False) -> list[dict[str, Any]]:
    """Every checkpoint, newest first, as {"path", "status", ...info}: status is good, corrupt, foreign
    (another run's id when `run_id` is given), misnamed (the step inside is not the one in its name: it is
    reported and left alone, never resumed from nor pruned) or nonfinite (NaN/inf weights, checked when
    `finite`). "Newest" is the step stored inside.
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability)."""
    out = []
    for p in list_checkpoints(ckpt_dir):
        try:
            params = read(p)
        except (CorruptCheckpoint, FileNotFoundError) as e:
            out.append({"path": p, "status": "corrupt", "error": str(e)})
            continue
        rec = {"path": p, **info(params)}
        rec["status"] = "good"
        named = int(NAME.match(p.name).group(1))
        if run_id is not None and rec.get("run", {}).get("id") != run_id:
            rec["status"] = "foreign"
        elif rec.get("step") != named:
            rec["status"], rec["error"] = "misnamed", (f"checkpoint {p} holds step {rec.get('step')}, not {named}; "
                                                       "left alone (rename it to match, or remove it)")
        elif finite and (bad := nonfinite_params(params)):
            rec["status"], rec["error"] = "nonfinite", f"checkpoint {p} holds non-finite values in {bad[0]!r}"
        out.append(rec)
    return out


def prune(ckpt_dir: str | os.PathLike, keep: int, run_id: str | None = None) -> list[Path]:
    """Keep the newest `keep` checkpoints that read back intact; delete older ones; return the deleted paths.

    Integrity first: a corrupt file never counts toward `keep`, so the newest good checkpoint is never
    deleted in favour of a damaged one. Corrupt files older than a kept good one are deleted too.
    With `run_id`, another run's checkpoints are neither counted nor deleted. A file whose stored step
    disagrees with its name is neither counted nor deleted either (see `scan`).
    Taught in: no notebook; train()'s CheckpointManager calls it (README, Reliability).
    """
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"checkpoint.prune: keep={keep!r} is invalid; fix: keep at least 1 checkpoint")
    kept, gone = 0, []
    for rec in scan(ckpt_dir, run_id=run_id):
        if rec["status"] in ("foreign", "misnamed"):
            continue
        if rec["status"] == "good" and kept < keep:
            kept += 1
            continue
        if kept:            # older than a kept good checkpoint: surplus or damaged
            rec["path"].unlink(missing_ok=True)
            gone.append(rec["path"])
    return gone


def latest_good(ckpt_dir: str | os.PathLike, run_id: str | None = None,
                finite: bool = False) -> tuple[Path, dict] | None:
    """The newest checkpoint that reads back intact (of run `run_id`, with finite weights when `finite`),
    with its metadata; reports each one it skips.
    Taught in notebooks/11_your_own_model.ipynb."""
    for rec in scan(ckpt_dir, run_id=run_id, finite=finite):
        if rec["status"] == "good":
            return rec["path"], {k: v for k, v in rec.items() if k in ("step", "data_pos", "run")}
        why = rec.get("error") or f"checkpoint {rec['path']} belongs to run {rec.get('run', {}).get('id')}, not {run_id}"
        # printed, not warnings.warn: mindformers silences Python warnings process-wide
        print(f"{why}; skipping it", file=sys.stderr)
    return None


# --- a run's folder: its lock, and a previous run moved aside ---
class NothingToResume(RuntimeError):
    """--resume found checkpoints but none it may continue (all corrupt, or another run's).
    Taught with the rest of checkpoint.py in notebooks/10_stability.ipynb."""


class RunLocked(RuntimeError):
    """Another process holds the run folder.
    Taught with the rest of checkpoint.py in notebooks/10_stability.ipynb."""


class Preempted(RuntimeError):
    """SIGTERM or SIGINT stopped the run; the state after the last completed step was saved.
    Taught in: no notebook; train.py, train_cli.py call it."""

    def __init__(self, msg: str, signo: int) -> None:
        super().__init__(msg)
        self.signo = signo


class run_lock:
    """Exclusive lock on a run folder for the whole run: `fcntl.flock` on `<folder>/.lock`.

    A second process is refused at once with RunLocked naming the holder's PID. The kernel drops the
    lock when its holder dies, however it dies, so a stale lock file never blocks.
    Taught in: no notebook (README, Reliability; the CLI `python -m mshelpers.train` takes it).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
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


def move_run_aside(out: Path, what: list[Path]) -> Path:
    """--overwrite: move a previous run's files into <out>/previous/<time>/ (nothing is deleted); return that folder.
    Taught in: no notebook (README, Reliability)."""
    import time
    dest = out / "previous" / time.strftime("%Y%m%d-%H%M%S")
    n = 0
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{dest.name.split('.')[0]}.{n}")
    dest.mkdir(parents=True)
    for p in what:
        os.replace(p, dest / p.name)
    return dest


# --- resume, commit and preemption: the checkpoints of one training run ---
class CheckpointManager:
    """The checkpoints of one `train.train` run, with the state they need, so the training loop only calls it.

    - `check_resume(steps)`, before anything is built: which checkpoint a resume continues; all corrupt (or
      another run's) raises NothingToResume, a finished run returns True. `attach(...)` then names what is saved.
    - `begin(...)`: restore the newest good checkpoint (weights, optimizer, loss scale, RNG, the spike guard's
      state) and cut the metrics log back to its step, or start the log fresh; returns (start step, data position,
      the log's kept rows).
    - `write(...)` every `every` steps and at the last step writes a checkpoint under a temporary name; `vouch(loss)`
      commits it (renamed into place, the oldest beyond `keep` pruned) only once the next step's loss with its
      weights came out finite, and drops it otherwise; `finish()` commits the last one (its weights are checked).
    - `preempted(...)`: a SIGTERM or SIGINT stopped the run: save the state after the last completed step and
      return the Preempted error naming it.
    `run` (e.g. {"id": ..., "config_hash": ...}) goes into every checkpoint; with an id, a resume never continues
    another run's checkpoints. Taught in notebooks/09_evaluation_report.ipynb (exact resume) and
    notebooks/12_your_config.ipynb (the CLI).
    """

    def __init__(self, folder: str | os.PathLike | None, *, every: int = 0, keep: int = 3,
                 run: dict | None = None) -> None:
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"CheckpointManager: keep={keep!r} is invalid; fix: keep at least 1 checkpoint")
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ValueError(f"CheckpointManager: every={every!r} is invalid; fix: 0 (never) or a step count >= 1")
        self.folder = Path(folder) if folder is not None else None
        self.every, self.keep, self.run = every, keep, run
        self.run_id = (run or {}).get("id")
        self.recs: list[dict] = []
        self.good: list[dict] = []
        self.pending: Path | None = None
        self.pending_guard: str | None = None
        self.last: Path | None = None         # the newest committed checkpoint
        self.start = 1
        self.net = self.optimizer = self.loss_scaler = self.guard = None

    def check_resume(self, steps: int) -> bool:
        """Decide before building anything: all-corrupt or too-few-steps fail with nothing touched. True: the
        run is already complete (said on stderr), nothing to do."""
        self.recs = scan(self.folder, run_id=self.run_id)
        self.good = [r for r in self.recs if r["status"] == "good"]
        if self.recs and not self.good:
            why = "; ".join(r.get("error") or f"{r['path'].name} belongs to run {r.get('run', {}).get('id')}"
                            for r in self.recs)
            raise NothingToResume(f"no checkpoint in {self.folder} can be resumed ({why}); nothing was changed; "
                                  "fix: restore a checkpoint, or start a fresh run in another folder")
        if self.good and self.good[0]["step"] > steps:
            raise ValueError(f"steps={steps} is fewer than the checkpoint's step {self.good[0]['step']} "
                             f"({self.good[0]['path'].name}); fix: pass steps >= {self.good[0]['step']}")
        if self.good and self.good[0]["step"] == steps:   # a finished run: nothing to do, nothing touched
            print(f"the run is complete: {self.good[0]['path']} is step {steps} of {steps}; nothing to do "
                  "(pass a larger --steps to extend it)", file=sys.stderr, flush=True)
            return True
        return False

    def attach(self, net, optimizer, loss_scaler=None, guard=None) -> "CheckpointManager":
        """What every checkpoint holds: the model, the optimizer, the loss scaler; a spike guard's state beside it."""
        self.net, self.optimizer, self.loss_scaler, self.guard = net, optimizer, loss_scaler, guard
        return self

    def begin(self, resume: bool, steps: int, log, on_ready=None) -> tuple[int, int, list[dict]]:
        """Restore the newest good checkpoint (resume) or start fresh; `log` is the metrics CSV (`keep_upto`,
        `start_fresh`); `on_ready` runs once everything is checked, before anything is written."""
        if not (resume and self.good):
            if on_ready:
                on_ready()
            if resume:
                print(f"resume: no checkpoint in {self.folder} yet; starting at step 1", file=sys.stderr, flush=True)
            log.start_fresh()
            return 1, 0, []
        best = self.good[0]
        # the lr table is re-derived from cfg (a longer run stretches the cosine), so it is not restored
        meta = load(best["path"], self.net, self.optimizer, self.loss_scaler, ignore=("learning_rate",))
        self.start, self.last = meta["step"] + 1, best["path"]
        if self.guard:
            self.guard.load(best["path"])
        if on_ready:
            on_ready()
        at = self.recs.index(best)
        for r in self.recs[:at] + [r for r in self.recs[at:] if r["status"] == "misnamed"]:
            # newer ones passed over, and every misnamed one, each with its reason
            why = r.get("error") or f"checkpoint {r['path']} belongs to run {r.get('run', {}).get('id')}"
            print(f"{why}; skipping it", file=sys.stderr)
        rows, note = log.keep_upto(meta["step"], meta.get("loss"))
        if self.every:
            prune(self.folder, self.keep, run_id=self.run_id)   # room for the next write on a nearly full disk
        print(f"resumed from {best['path']} (step {meta['step']}, data position {meta['data_pos']}); "
              f"continuing at step {self.start} of {steps}" + (f"; {note}" if note else ""),
              file=sys.stderr, flush=True)
        return self.start, meta["data_pos"], rows

    def due(self, step: int, last_step: int) -> bool:
        """A checkpoint is written after this step: every `every` steps and at the last one."""
        return bool(self.every) and (step % self.every == 0 or step == last_step)

    def nonfinite_weight(self) -> str | None:
        """The name of the first model parameter holding NaN or inf, or None."""
        import numpy as np
        return next((p.name for p in self.net.get_parameters() if not np.isfinite(p.asnumpy()).all()), None)

    def write(self, step: int, data_pos: int, loss: float | None) -> None:
        """The checkpoint of `step`, pending (invisible) until `vouch` or `finish` commits it."""
        self.pending = write_pending(self.folder, self.net, self.optimizer, step=step, data_pos=data_pos,
                                     loss_scaler=self.loss_scaler, run=self.run, loss=loss)
        self.pending_guard = self.guard.state() if self.guard else None

    def vouch(self, loss: float) -> None:
        """This step's loss was computed with the pending checkpoint's weights: commit it if finite, else drop it."""
        import math
        if self.pending is not None and math.isfinite(loss):
            self._commit()
        elif self.pending is not None:
            self.drop()

    def _commit(self) -> None:
        self.last = commit(self.pending, run_id=self.run_id)
        if self.pending_guard is not None:
            self.guard.save(self.last, self.pending_guard)
        self.pending, self.pending_guard = None, None
        prune(self.folder, self.keep, run_id=self.run_id)

    def drop(self) -> None:
        """Delete a pending checkpoint nobody vouched for (the run stopped, or the next loss was not finite)."""
        if self.pending is not None:
            Path(self.pending).unlink(missing_ok=True)
        self.pending = self.pending_guard = None

    def finish(self) -> None:
        """The last step: no next forward vouches for it; its weights were checked finite before the write."""
        if self.pending is not None:
            self._commit()

    def newest_finite(self) -> str:
        """The newest checkpoint of this run with finite weights, for an error message."""
        found = latest_good(self.folder, run_id=self.run_id, finite=True) if self.folder else None
        return f"{found[0]} (step {found[1]['step']})" if found else "none written yet"

    def save_now(self, step: int, data_pos: int, loss: float | None) -> Path | None:
        """Stopped after `step`: make the state after it visible as a checkpoint, return its path."""
        if self.pending is not None and f"step_{step:06d}" not in Path(self.pending).name:
            self._commit()         # an older pending one: this step's finite loss vouched for it
        if self.folder is None or step < self.start:
            return self.last
        if self.nonfinite_weight():   # never save non-finite weights, not even on the way out
            self.drop()
            return self.last
        if self.pending is None:
            self.write(step, data_pos, loss)
        self._commit()
        return self.last

    def preempted(self, step: int, data_pos: int, loss: float | None, stop) -> Preempted:
        """`stop` (a train_cli.StopSignal) fired after `step`: save, and return the error that says where."""
        saved = self.save_now(step, data_pos, loss)
        # save_now names every file it writes step_<step>; anything else is an older one it kept
        if saved and step >= self.start and saved.name.startswith(f"step_{step:06d}"):
            where = f"saved {saved} (step {step})"
        elif step >= self.start and self.folder is not None:   # this step's state was not saved (non-finite weights)
            where = f"step {step} was not saved (non-finite weights); newest checkpoint: {self.newest_finite()}"
        else:
            where = f"no step completed in this process; newest checkpoint: {saved or 'none'}"
        return Preempted(f"{stop.name} after step {step}: {where}; fix: rerun with --resume to continue",
                         stop.signo)
