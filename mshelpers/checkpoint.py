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
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

NAME = re.compile(r"^step_(\d{6,})\.ckpt$")
TMP_PREFIX = ".tmp-"


class CorruptCheckpoint(RuntimeError):
    """The file exists but cannot be read back intact (truncated, bit-flipped, foreign)."""


def _as_step(fn: str, name: str, v) -> int:
    import numbers
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 0:
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and float(v).is_integer() and v >= 0:
        return int(v)
    raise ValueError(f"checkpoint.{fn}: {name}={v!r} is invalid; fix: pass a non-negative integer")


def _state(net, optimizer, loss_scaler) -> dict[str, Any]:
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


def write_pending(ckpt_dir: str | os.PathLike, net, optimizer=None, *, step: int, data_pos: int,
                  loss_scaler=None, run: dict | None = None, loss: float | None = None) -> Path:
    """Write the checkpoint of `step` under a temporary name (invisible to readers) and return that path.

    `commit(path)` makes it visible. Training writes a checkpoint this way and commits it only after
    the next step's loss came out finite, so weights that blow up the next forward are never kept.
    `run` (e.g. {"id": ..., "config_hash": ...}) is stored as text entries `meta.run.<key>`; `loss` (the
    step's logged loss, a float32 value, so stored exactly) as `meta.loss`, so a resume can tell which metrics
    row is the real one.
    A failed write (a full disk, a kill signal turned into an exception) removes its own temp file.
    """
    import mindspore as ms
    step = _as_step("save", "step", step)
    data_pos = _as_step("save", "data_pos", data_pos)
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f"{TMP_PREFIX}{os.getpid()}-step_{step:06d}.ckpt"   # MindSpore insists on a .ckpt suffix
    entries = [{"name": n, "data": p} for n, p in _state(net, optimizer, loss_scaler).items()]
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
    """Write `ckpt_dir/step_<step>.ckpt` atomically and return its path; keep the newest `keep` good files."""
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"checkpoint.save: keep={keep} is invalid; fix: keep at least 1 checkpoint")
    final = commit(write_pending(ckpt_dir, net, optimizer, step=step, data_pos=data_pos,
                                 loss_scaler=loss_scaler, run=run), run_id=(run or {}).get("id"))
    if keep:
        prune(ckpt_dir, keep, run_id=(run or {}).get("id"))
    return final


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files in `ckpt_dir`, newest step first (temporary files ignored)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def clean_temp(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Delete leftover temp files (from a killed or failed write); call it only while no writer runs."""
    d = Path(ckpt_dir)
    gone = [p for p in d.glob(f"{TMP_PREFIX}*")] if d.is_dir() else []
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def read(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint into a name -> Parameter dict, or raise CorruptCheckpoint naming the file."""
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
    """Step, data position and run identity of a `read()` result."""
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
    """Names of the float entries holding NaN or inf (weights, moments)."""
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


def scan(ckpt_dir: str | os.PathLike, run_id: str | None = None, finite: bool = False) -> list[dict[str, Any]]:
    """Every checkpoint, newest first, as {"path", "status", ...info}: status is good, corrupt, foreign
    (another run's id when `run_id` is given), misnamed (the step inside is not the one in its name: it is
    reported and left alone, never resumed from nor pruned) or nonfinite (NaN/inf weights, checked when
    `finite`). "Newest" is the step stored inside."""
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
    with its metadata; reports each one it skips."""
    for rec in scan(ckpt_dir, run_id=run_id, finite=finite):
        if rec["status"] == "good":
            return rec["path"], {k: v for k, v in rec.items() if k in ("step", "data_pos", "run")}
        why = rec.get("error") or f"checkpoint {rec['path']} belongs to run {rec.get('run', {}).get('id')}, not {run_id}"
        # printed, not warnings.warn: mindformers silences Python warnings process-wide
        print(f"{why}; skipping it", file=sys.stderr)
    return None
