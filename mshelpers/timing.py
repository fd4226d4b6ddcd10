"""Timing helpers: a tiny `Benchmark` context manager and `run_isolated` (fresh process).

Example:
    >>> from mshelpers.timing import Benchmark
    >>> with Benchmark("sum") as b:
    ...     _ = sum(range(1000))
    sum: ... ms
    >>> b.elapsed > 0
    True

`run_isolated` is what memory and compile-cache measurements need: a fresh process
has no warm caches and its peak RSS belongs to the measured work alone.
"""
from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable


class Benchmark:
    """Time a block: `with Benchmark("graph mode"): ...` prints and keeps `.elapsed` seconds."""

    def __init__(self, name: str = "Done", verbose: bool = True) -> None:
        self.name, self.verbose, self.elapsed = name, verbose, float("nan")

    def __enter__(self) -> "Benchmark":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.elapsed = time.perf_counter() - self._t0
        if self.verbose:
            print(f"{self.name}: {self.elapsed * 1e3:.1f} ms")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    On Linux this reads VmHWM from /proc/self/status: `getrusage().ru_maxrss` survives
    fork+exec, so a fresh child would report its (large) parent's peak instead of its own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / 2**20 if sys.platform == "darwin" else ru / 1024


@dataclass
class IsolatedResult:
    value: Any          # what fn returned
    wall_s: float       # wall time of the call inside the child (imports in fn included)
    peak_rss_mb: float  # the child's peak RSS


def _child(conn, fn, args, kwargs) -> None:  # runs in the fresh process
    try:
        t0 = time.perf_counter()
        value = fn(*args, **kwargs)
        conn.send(("ok", value, time.perf_counter() - t0, peak_rss_mb()))
    except BaseException as e:  # noqa: BLE001 - forwarded to the parent
        conn.send(("err", f"{type(e).__name__}: {e}", traceback.format_exc(), peak_rss_mb()))
    finally:
        conn.close()


def run_isolated(fn: Callable, *args: Any, timeout: float = 900, env: dict | None = None,
                 **kwargs: Any) -> IsolatedResult:
    """Run `fn(*args, **kwargs)` in a fresh spawned process; return value, wall time and peak RSS.

    `fn` must be importable by name (defined in a module, not in a notebook cell), and
    its arguments and result must pickle. `env` adds environment variables for the
    child only (e.g. the compile-cache switches). An exception in the child is re-raised
    here as RuntimeError carrying the child's traceback.
    """
    if getattr(fn, "__module__", None) == "__main__":
        raise ValueError(f"run_isolated: fn={fn.__name__!r} is defined in __main__ (a notebook or script); "
                         "fix: move it into a module file and import it")
    import os
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    try:
        p = ctx.Process(target=_child, args=(child, fn, args, kwargs))
        p.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    child.close()
    if not parent.poll(timeout):
        p.kill()
        raise TimeoutError(f"run_isolated: {fn.__name__} did not finish within timeout={timeout}s")
    try:
        msg = parent.recv()
    except EOFError:
        p.join()
        raise RuntimeError(f"run_isolated: child running {fn.__name__} died with exit code {p.exitcode}")
    p.join()
    if msg[0] == "err":
        raise RuntimeError(f"run_isolated: {fn.__name__} failed in the child: {msg[1]}\n{msg[2]}")
    return IsolatedResult(value=msg[1], wall_s=msg[2], peak_rss_mb=msg[3])
