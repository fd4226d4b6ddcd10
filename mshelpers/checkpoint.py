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


class CorruptCheckpoint(RuntimeError):
    """The file exists but cannot be read back intact (truncated, bit-flipped, foreign)."""


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


def save(ckpt_dir: str | os.PathLike, net, optimizer=None, *, step: int, data_pos: int,
         loss_scaler=None, keep: int | None = None) -> Path:
    """Write `ckpt_dir/step_<step>.ckpt` atomically and return its path; keep the last `keep` files."""
    import mindspore as ms
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint.save: step={step!r} is invalid; fix: pass the integer step just completed")
    if keep is not None and keep < 1:
        raise ValueError(f"checkpoint.save: keep={keep} is invalid; fix: keep at least 1 checkpoint")
    d = Path(ckpt_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"step_{step:06d}.ckpt"
    tmp = d / f".tmp-{os.getpid()}-step_{step:06d}.ckpt"   # MindSpore insists on a .ckpt suffix
    entries = [{"name": n, "data": p} for n, p in _state(net, optimizer, loss_scaler).items()]
    meta = {"meta.step": step, "meta.data_pos": int(data_pos), "meta.rng_state": ms.get_rng_state()}
    ms.save_checkpoint(entries, str(tmp), append_dict=meta, crc_check=True)
    with open(tmp, "rb") as f:          # the bytes must be on disk before the rename makes them visible
        os.fsync(f.fileno())
    os.replace(tmp, final)
    if keep:
        prune(d, keep)
    return final


def list_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files in `ckpt_dir`, newest step first (temporary files ignored)."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def prune(ckpt_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints; return the deleted paths."""
    old = list_checkpoints(ckpt_dir)[keep:]
    for p in old:
        p.unlink(missing_ok=True)
    return old


def read(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint into a name -> Parameter dict, or raise CorruptCheckpoint naming the file."""
    import mindspore as ms
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; fix: pass a file from list_checkpoints()")
    try:
        params = ms.load_checkpoint(str(path), crc_check=True)
    except (ValueError, RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt or truncated ({first})") from e
    if "meta.step" not in params:
        raise CorruptCheckpoint(f"checkpoint {path} has no meta.step entry: it was not written by checkpoint.save")
    return params


def load(path: str | os.PathLike, net, optimizer=None, loss_scaler=None) -> dict[str, Any]:
    """Restore net, optimizer, loss scaler and RNG state from `path`; return {"step", "data_pos", "path"}."""
    import mindspore as ms
    params = read(path)
    for cell in (net, optimizer):
        if cell is not None:
            try:
                not_loaded, _ = ms.load_param_into_net(cell, params, strict_load=True)
            except RuntimeError as e:   # a shape mismatch: another model size or lr-schedule length
                raise CorruptCheckpoint(f"checkpoint {path} does not fit this {type(cell).__name__}: "
                                        f"{str(e).splitlines()[0][:300]}; fix: resume with the config that "
                                        "wrote it (same model and steps)") from e
            missing = [n for n in not_loaded if not n.startswith(("meta.", "loss_scaler."))]
            if missing:
                raise CorruptCheckpoint(f"checkpoint {path} lacks {len(missing)} parameters of {type(cell).__name__}, "
                                        f"e.g. {missing[0]!r}; fix: resume with the config that wrote it")
    if loss_scaler is not None:
        for attr in ("scale_value", "counter"):
            key = f"loss_scaler.{attr}"
            if key in params and hasattr(loss_scaler, attr):
                getattr(loss_scaler, attr).set_data(params[key].value())
    if "meta.rng_state" in params:
        ms.set_rng_state(params["meta.rng_state"].value())
    return {"step": int(params["meta.step"].asnumpy()), "data_pos": int(params["meta.data_pos"].asnumpy()),
            "path": Path(path)}


def latest_good(ckpt_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """The newest checkpoint that reads back intact, with its metadata; reports each corrupt one it skips."""
    for p in list_checkpoints(ckpt_dir):
        try:
            params = read(p)
        except CorruptCheckpoint as e:
            # printed, not warnings.warn: mindformers silences Python warnings process-wide
            print(f"{e}; falling back to the previous checkpoint", file=sys.stderr)
            continue
        return p, {"step": int(params["meta.step"].asnumpy()), "data_pos": int(params["meta.data_pos"].asnumpy())}
    return None
