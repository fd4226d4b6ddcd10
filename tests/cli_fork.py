"""Run `python -m mshelpers.train ARGS` as a child forked from a server that has imported MindSpore once.

`run(argv, cwd=None, timeout=300)` returns a `subprocess.CompletedProcess` like `subprocess.run(...,
capture_output=True, text=True)` of the real command: the child runs the CLI's own `main` as its process
(`cli_process=True`), so exit codes, stderr lines and files on disk are the CLI's. What it skips is the start:
the imports (about 4.5 s a run) and the order in which a real process installs its signal handling before
MindSpore starts threads. The tests that send catchable signals (SIGTERM, SIGINT) therefore start real `python -m`
processes. SIGKILL cannot be caught, so no handling order matters to it: `start(argv)` forks a child that the
caller may SIGKILL at any moment of the CLI's own work (`Child.pid`, `Child.wait(timeout)`).
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

_SERVER: subprocess.Popen | None = None
_LOG = None
# One MindSpore compile cache per test process (an xdist worker), for runs that pass `--compile-cache
# cli_fork.COMPILE_CACHE`: the CLI keeps one folder per graph under it (train.compile_cache), so the many runs
# of the same settings compile once. Kill-, corruption- and full-disk-safe: tests/test_train_cli.py.
COMPILE_CACHE = tempfile.mkdtemp(prefix="ms-compile-cache-")
atexit.register(lambda: __import__("shutil").rmtree(COMPILE_CACHE, ignore_errors=True))


def _server() -> subprocess.Popen:
    global _SERVER, _LOG
    if _SERVER is None or _SERVER.poll() is not None:
        _LOG = tempfile.NamedTemporaryFile("w+", prefix="cli-server-", suffix=".log", delete=False)
        _SERVER = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_cli_server.py"))],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=_LOG, text=True,
                                   bufsize=1)
        atexit.register(_SERVER.kill)
        _read(_SERVER, 120)                         # {"ready": pid}: the imports are done
    return _SERVER


def _read(server: subprocess.Popen, timeout: float) -> dict:
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    line = server.stdout.readline() if ready else ""
    if not line:
        _LOG.flush()
        raise RuntimeError(f"the CLI fork server gave no reply within {timeout} s; its log:\n"
                           f"{Path(_LOG.name).read_text()[-3000:]}")
    return json.loads(line)


class Child:
    """A CLI child forked from the server, running while the caller waits on it or kills it (`start`)."""

    def __init__(self, server: subprocess.Popen, pid: int, tmp: tempfile.TemporaryDirectory):
        self._server, self.pid, self._tmp, self.returncode = server, pid, tmp, None

    def wait(self, timeout: float) -> int:
        """The exit code (negative: killed by that signal); subprocess.TimeoutExpired while it still runs."""
        if self.returncode is None:
            ready, _, _ = select.select([self._server.stdout], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(["mshelpers.train", str(self.pid)], timeout)
            self.returncode = _read(self._server, 60)["rc"]
        return self.returncode

    def stdout(self) -> str:
        return (Path(self._tmp.name) / "stdout").read_text()

    def stderr(self) -> str:
        return (Path(self._tmp.name) / "stderr").read_text()

    def close(self) -> None:
        self._tmp.cleanup()


def start(argv: list[str], cwd: str | os.PathLike | None = None) -> Child:
    """Fork one CLI run and return at once; `wait` on it or `os.kill(child.pid, signal.SIGKILL)`, then `wait`.
    One child at a time per server: wait for its exit code before the next `run` or `start`."""
    server = _server()
    tmp = tempfile.TemporaryDirectory(prefix="cli-")
    out, err = Path(tmp.name) / "stdout", Path(tmp.name) / "stderr"
    server.stdin.write(json.dumps({"argv": [str(a) for a in argv], "cwd": str(cwd or os.getcwd()),
                                   "stdout": str(out), "stderr": str(err)}) + "\n")
    server.stdin.flush()
    return Child(server, _read(server, 60)["pid"], tmp)


def run(argv: list[str], cwd: str | os.PathLike | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """One CLI run to its end, as `subprocess.run(capture_output=True, text=True)` gives it; a run still going
    after `timeout` is killed and raises subprocess.TimeoutExpired."""
    child = start(argv, cwd)
    try:
        try:
            rc = child.wait(timeout)
        except subprocess.TimeoutExpired:           # a hung run: kill it, take its exit code, say so
            os.kill(child.pid, signal.SIGKILL)
            child.wait(60)
            raise subprocess.TimeoutExpired(["mshelpers.train", *argv], timeout) from None
        return subprocess.CompletedProcess([sys.executable, "-m", "mshelpers.train", *argv], rc,
                                           child.stdout(), child.stderr())
    finally:
        child.close()
