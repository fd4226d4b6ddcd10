"""Start servers in their own process group and stop them, with everything they started, whatever happens."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log_path: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Run `cmd` as the leader of a new session (so of a new process group), output to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    finally:
        log.close()          # the child holds its own copy


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen | None, grace_s: float = 10, extra_pgids: set[int] = frozenset()) -> None:
    """SIGTERM the process group of `proc` and of every descendant (kernels and daemons start their own
    sessions), wait up to `grace_s`, then SIGKILL whatever is left. Safe to call twice."""
    if proc is None:
        return
    procs, pgids = [], {proc.pid, *extra_pgids}
    try:
        root = psutil.Process(proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    for p in procs:
        try:
            pgids.add(os.getpgid(p.pid))
        except ProcessLookupError:
            pass
    pgids.discard(os.getpgid(0))          # never our own group
    for g in pgids:
        _signal_group(g, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for g in pgids:
        _signal_group(g, signal.SIGKILL)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return out


def listeners(port: int) -> list[int]:
    """Pids listening on TCP `port` (empty when the port is free)."""
    pids = []
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            pids.append(c.pid)
    return pids


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None, log: Path | None = None,
              ok=lambda body: True) -> bytes:
    """Poll `url` until it answers 200 and `ok(body)`; fail early if `proc` exits."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode} before {url} answered:\n"
                               f"{tail(log) if log else ''}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = r.read()
                if r.status == 200 and ok(body):
                    return body
                last = f"HTTP {r.status}"
        except (urllib.error.URLError, OSError) as e:
            last = repr(e)
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s (last: {last})\n{tail(log) if log else ''}")
