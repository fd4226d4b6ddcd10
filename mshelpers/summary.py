"""MindInsight: log training scalars with SummaryRecord, and start/query/stop the MindInsight service.

Example:
    >>> from mshelpers.summary import ScalarSummary, MindInsight, mindinsight_command
    >>> with ScalarSummary("build/summary/run1") as log:          # one folder per run
    ...     train(cfg, callbacks=[log])                          # logs loss, lr, grad_norm per step
    >>> " ".join(mindinsight_command("build/summary"))
    'mindinsight start --port 8080 --summary-base-dir build/summary'
    >>> with MindInsight("build/summary") as mi:                  # free port, stopped on exit
    ...     [j["train_id"] for j in mi.train_jobs()]
    ['./run1']

`mindinsight start` launches `gunicorn` by name, so the Python environment's bin folder must be on
PATH; `MindInsight` puts it there for the child process.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SCALAR_KEYS = ("loss", "lr", "grad_norm")


class ScalarSummary:
    """Write scalars to a MindInsight summary folder; callable as a `train(..., callbacks=[...])` hook.

    Called with a step row (a dict with "step" and any of `keys`), it records those keys at that step.
    Non-finite values are skipped (MindInsight rejects them) and counted in `.skipped`.
    Taught in notebooks/08_profiling.ipynb.
    """

    def __init__(self, summary_dir: str | os.PathLike, keys: tuple[str, ...] = SCALAR_KEYS) -> None:
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError(f"ScalarSummary: keys={keys!r} is invalid; fix: pass names such as {SCALAR_KEYS}")
        self.summary_dir = Path(summary_dir)
        self.summary_dir.mkdir(parents=True, exist_ok=True)
        self.keys, self.skipped, self.records = tuple(keys), 0, 0
        self._writer = None

    def __enter__(self) -> "ScalarSummary":
        from mindspore.train import SummaryRecord
        self._writer = SummaryRecord(str(self.summary_dir))
        return self

    def log(self, step: int, **scalars: float) -> None:
        """Record `name=value` scalars at integer `step`."""
        if self._writer is None:
            raise RuntimeError("ScalarSummary.log: use it inside `with ScalarSummary(dir) as log:`")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"ScalarSummary.log: step={step!r} is invalid; fix: pass an integer >= 0")
        import mindspore as ms
        import numpy as np
        wrote = False
        for name, value in scalars.items():
            v = float(value)
            if not math.isfinite(v):
                self.skipped += 1
                continue
            self._writer.add_value("scalar", name, ms.Tensor(np.float32(v)))
            wrote = True
        if wrote:
            self._writer.record(step)
            self.records += 1

    def __call__(self, row: dict) -> None:
        self.log(int(row["step"]), **{k: row[k] for k in self.keys if k in row})

    def __exit__(self, *exc: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def mindinsight_command(summary_base_dir: str | os.PathLike, port: int = 8080) -> list[str]:
    """`mindinsight start` for a folder whose sub-folders are runs (each written by one SummaryRecord).
    Taught in notebooks/08_profiling.ipynb."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"mindinsight_command: port={port!r} is invalid; fix: pass 1..65535, e.g. 8080")
    return ["mindinsight", "start", "--port", str(port), "--summary-base-dir", str(summary_base_dir)]


def free_port() -> int:
    """A TCP port nobody listens on right now.
    Taught in: no notebook; launch.py calls it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MindInsight:
    """Start MindInsight on a free port for `summary_base_dir`, query its REST API, stop it on exit.
    Taught in notebooks/08_profiling.ipynb."""

    def __init__(self, summary_base_dir: str | os.PathLike, port: int | None = None,
                 workspace: str | os.PathLike | None = None, timeout_s: float = 90) -> None:
        base = Path(summary_base_dir)
        if not base.is_dir():
            raise ValueError(f"MindInsight: summary_base_dir={str(base)!r} is not a folder; fix: pass the parent "
                             "of your run folders (the one you gave ScalarSummary sub-folders of)")
        self.base, self.port, self.timeout_s = base.resolve(), port or free_port(), timeout_s
        self.workspace = Path(workspace) if workspace else self.base.parent / ".mindinsight"
        self.started = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _cli(self, *args: str) -> subprocess.CompletedProcess:
        bin_dir = Path(sys.executable).parent
        exe = bin_dir / "mindinsight"
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        return subprocess.run([str(exe) if exe.exists() else "mindinsight", *args], capture_output=True,
                              text=True, timeout=self.timeout_s, env=env)

    def get(self, path: str, **params: str) -> Any:
        """GET `/v1/mindinsight/<path>` and decode the JSON answer."""
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(f"{self.url}/v1/mindinsight/{path}{q}", timeout=10) as r:
            return json.loads(r.read())

    def train_jobs(self) -> list[dict]:
        """The runs MindInsight found under summary_base_dir (REST: datavisual/train-jobs)."""
        return self.get("datavisual/train-jobs").get("train_jobs", [])

    def scalars(self, train_id: str, tag: str) -> list[tuple[int, float]]:
        """(step, value) pairs of one scalar, e.g. tag="loss/scalar"."""
        data = self.get("datavisual/scalar/metadata", train_id=train_id, tag=tag)
        return [(int(m["step"]), float(m["value"])) for m in data.get("metadatas", [])]

    def start(self) -> "MindInsight":
        self.workspace.mkdir(parents=True, exist_ok=True)
        r = self._cli("start", "--port", str(self.port), "--summary-base-dir", str(self.base),
                      "--workspace", str(self.workspace))
        if r.returncode != 0:
            raise RuntimeError(f"mindinsight start failed (exit {r.returncode}): {r.stdout[-600:]} {r.stderr[-600:]}"
                               f"; logs under {self.workspace / 'log'}")
        self.started = True
        deadline = time.time() + self.timeout_s
        while time.time() < deadline:          # the server answers before it has scanned every run
            try:
                if self.get("datavisual/train-jobs").get("load_status") == "loaded":
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"MindInsight on port {self.port} did not finish loading within {self.timeout_s}s")

    def stop(self) -> None:
        if self.started:
            self._cli("stop", "--port", str(self.port))
            self.started = False

    def __enter__(self) -> "MindInsight":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
