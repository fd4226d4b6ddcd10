"""Launch a script on several ranks with MindSpore's own launcher, msrun, and collect what each rank did.

Example:
    >>> from mshelpers.launch import msrun, msrun_command
    >>> print(msrun_command("train.py", workers=16, local_workers=8, master_addr="10.0.0.1", node_rank=1))
    msrun --worker_num=16 --local_worker_num=8 --master_addr=10.0.0.1 --master_port=8118 --node_rank=1 --log_dir=msrun_log --join=True train.py
    >>> run = msrun("mshelpers/workers/hello.py", workers=2)         # doctest: +SKIP
    >>> [r.exit_code for r in run.ranks], run.ranks[0].result          # doctest: +SKIP
    ([0, 0], {'rank': 0, 'world': 2, 'allreduce_sum': 3.0})

msrun is the launcher used on Ascend clusters; on CPU it runs DATA_PARALLEL jobs and
collective ops (AllReduce, AllGather) between processes on one machine. It starts a
scheduler plus one process per rank, writes `worker_<rank>.log` and `scheduler.log`
into `log_dir`, and starts them as plain `python`, so the venv's bin goes on PATH.

Workers write files into `rank_output_dir()` (one folder per rank, created here) and
may call `write_rank_result({...})`; `msrun()` returns those paths and the JSON.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


def _build_dir(*parts: str) -> Any:
    """config.build_dir(*parts) inside the cookbook; copied alone, $MSHELPERS_BUILD or ./build (created)."""
    import os
    from pathlib import Path
    try:
        if __package__:
            from .config import build_dir
        else:  # copied beside its siblings as plain files
            from config import build_dir
        return build_dir(*parts)
    except ImportError:
        p = Path(os.environ.get("MSHELPERS_BUILD") or Path.cwd() / "build").joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p


OUT_ROOT_ENV = "MSHELPERS_RANK_OUT_ROOT"   # msrun() exports it; workers find their folder through it
RESULT_FILE = "result.json"
PROGRESS_PREFIX = "PROGRESS "              # a worker line "PROGRESS 3/20" advances msrun()'s progress bar

# msrun's own line when a worker dies: "Worker process 5500 exit with exception. Error code: 1."
_WORKER_FAILED = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
# MindSpore log prefixes carry the pid: "[WARNING] ME(5219:1403...,MainProcess)" or "DISTRIBUTED(5219,7fa..."
_LOG_PID = re.compile(r"^\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] [A-Z_]+\((\d+)[,:]")
_FRAMEWORK_LINE = re.compile(r"^\[(?:DEBUG|INFO|WARNING)\] [A-Z_]+\(\d+[,:]")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


class MsrunError(RuntimeError):
    """A rank failed (or msrun timed out). `.result` holds every rank's exit code, log tail and files.
    Taught with the rest of launch.py in notebooks/04_data_parallel.ipynb."""

    def __init__(self, message: str, result: "MsrunResult"):
        super().__init__(message)
        self.result = result


@dataclass
class RankResult:
    """What one rank left behind.
    Taught with the rest of launch.py in notebooks/04_data_parallel.ipynb."""
    rank: int
    exit_code: int | None          # None: msrun stopped it after another rank failed, so its code is unknown
    log_path: Path
    out_dir: Path                  # the rank's rank_output_dir()
    files: list[Path] = field(default_factory=list)
    result: dict | None = None     # the rank's write_rank_result(...) JSON, if it wrote one
    error_line: str | None = None  # the first error line of the log, for a failed rank

    def log_tail(self, n: int = 20, *, framework_lines: bool = False) -> str:
        """Last `n` lines of the rank's log; MindSpore's INFO/WARNING chatter is dropped unless asked for."""
        lines = _read_lines(self.log_path)
        if not framework_lines:
            lines = [ln for ln in lines if not _FRAMEWORK_LINE.match(ln)]
        return "\n".join(lines[-n:])


@dataclass
class MsrunResult:
    """One msrun job: its command, timing and per-rank results (index it by rank).
    Taught with the rest of launch.py in notebooks/04_data_parallel.ipynb."""
    command: str
    log_dir: Path
    returncode: int
    wall_s: float
    ranks: list[RankResult]

    def __getitem__(self, rank: int) -> RankResult:
        return self.ranks[rank]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and all(r.exit_code == 0 for r in self.ranks)

    def results(self) -> list[dict | None]:
        """Each rank's write_rank_result(...) JSON, in rank order."""
        return [r.result for r in self.ranks]


# ---------------------------------------------------------------- worker side
def rank_id() -> int:
    """This process's rank under msrun (RANK_ID, set by msrun before the script starts), else 0.
    Taught with the rest of launch.py in notebooks/04_data_parallel.ipynb."""
    return int(os.environ.get("RANK_ID", "0"))


def rank_output_dir(rank: int | None = None) -> Path:
    """The folder this rank writes its outputs to (created). Outside msrun(): build/msrun/standalone/rank_0.
    Taught in: no notebook; workers/dp_train.py calls it."""
    root = os.environ.get(OUT_ROOT_ENV)
    if root is None:
        build_dir = _build_dir
        root = str(build_dir("msrun", "standalone"))
    p = Path(root) / f"rank_{rank_id() if rank is None else rank}"
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_rank_result(result: dict) -> Path:
    """Write this rank's JSON summary (losses, timings, checksums...); msrun() returns it as `.result`.
    Taught in: no notebook; doctor/cpu_check.py, workers/__init__.py, workers/allreduce_check.py call it."""
    if not isinstance(result, dict):
        raise ValueError(f"write_rank_result: result={type(result).__name__} is not a dict; "
                         "fix: pass a JSON-serialisable dict")
    path = rank_output_dir() / RESULT_FILE
    path.write_text(json.dumps(result, indent=1))
    return path


def report_progress(done: int, total: int) -> None:
    """Print a PROGRESS line that msrun(progress=...) turns into a progress bar in the notebook.
    Taught in: no notebook; doctor/cpu_check.py, workers/collectives_bench.py, workers/dp_train.py call it."""
    print(f"{PROGRESS_PREFIX}{done}/{total}", flush=True)


# ---------------------------------------------------------------- launcher side
def msrun_command(script: str | os.PathLike, workers: int = 2, args: Sequence[str] = (), *,
                  local_workers: int | None = None, master_addr: str = "127.0.0.1", master_port: int = 8118,
                  node_rank: int | None = None, log_dir: str | os.PathLike = "msrun_log", join: bool = True,
                  extra: Sequence[str] = ()) -> str:
    """The shell command that launches `script` on `workers` ranks (run it once per node).

    For several nodes set `local_workers` (ranks on this node), `master_addr` (node 0's IP,
    where the scheduler runs) and `node_rank` (0 on the master node, 1, 2... elsewhere).

        >>> msrun_command("tp.py", workers=2, master_port=9000)
        'msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=9000 --log_dir=msrun_log --join=True tp.py'

    Taught in notebooks/04_data_parallel.ipynb.
    """
    local = workers if local_workers is None else local_workers
    _check_counts("msrun_command", workers, local)
    if node_rank is None and local < workers:
        raise ValueError(f"msrun_command: node_rank=None with local_workers={local} < workers={workers}; "
                         "fix: pass node_rank=0 on the master node and 1, 2, ... on the others")
    parts = ["msrun", f"--worker_num={workers}", f"--local_worker_num={local}",
             f"--master_addr={master_addr}", f"--master_port={int(master_port)}"]
    if node_rank is not None:
        parts.append(f"--node_rank={int(node_rank)}")
    parts += [f"--log_dir={log_dir}", f"--join={join}", *extra, str(script), *map(str, args)]
    return shlex.join(parts)


def free_port() -> int:
    """A TCP port that is free right now on this machine (msrun's scheduler listens on it).
    Taught with the rest of launch.py in notebooks/04_data_parallel.ipynb."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# msrun's cluster retries: a worker re-tries to register with the scheduler, and at the end to report that it
# finished, every MS_RETRY_INTERVAL_LOWER..UPPER seconds (MindSpore 2.9 picks at random, 3 to 5 s by default).
# On one machine the scheduler answers within milliseconds, so the default left the workers waiting: a 2-rank
# all-reduce job took 15.3 s and 14.8 s by default and 10.4 s twice with 1 s (Intel Xeon, 2 cores,
# 2026-12-02), the saving in registration and shutdown. A cluster job keeps MindSpore's own default: this
# applies only to msrun() below, which launches local ranks, and only when neither bound is set (the
# environment or env=), so a user's bound is never paired with ours into a lower above the upper.
LOCAL_RETRY_INTERVAL_S = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}


def worker_env(out_root: str | os.PathLike, env: dict | None = None) -> dict[str, str]:
    """The environment msrun() gives its local ranks: this one, with this interpreter's bin folder first on
    PATH (msrun starts workers as plain `python`), the mshelpers checkout on PYTHONPATH, unbuffered output,
    the ranks' result folder, `env` on top (values as text), and 1 s cluster retries when neither retry
    bound is set (above).

        >>> worker_env("/tmp/out", {"MS_RETRY_INTERVAL_LOWER": 2, "MS_RETRY_INTERVAL_UPPER": 4})["MS_RETRY_INTERVAL_LOWER"]
        '2'
        >>> worker_env("/tmp/out", {"X": 1})["MSHELPERS_RANK_OUT_ROOT"]
        '/tmp/out'

    Taught with the rest of launch.py in notebooks/04_data_parallel.ipynb.
    """
    if env is not None and not (isinstance(env, dict) and all(isinstance(k, str) for k in env)):
        raise ValueError(f"worker_env: env={env!r} is invalid; fix: pass a dict of variable names to values, "
                         "e.g. {'GLOG_v': 3}")
    bin_dir = str(Path(sys.executable).parent)
    pkg_root = str(Path(__file__).resolve().parents[1])
    run_env = dict(os.environ)
    run_env["PATH"] = bin_dir + os.pathsep + run_env.get("PATH", "")
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, run_env.get("PYTHONPATH")) if p)
    run_env[OUT_ROOT_ENV] = str(out_root)
    run_env["PYTHONUNBUFFERED"] = "1"
    run_env.update({k: str(v) for k, v in (env or {}).items()})
    if not LOCAL_RETRY_INTERVAL_S.keys() & run_env.keys():
        run_env.update(LOCAL_RETRY_INTERVAL_S)
    return run_env


def msrun(script: str | os.PathLike, workers: int = 2, args: Sequence[str] = (), log_dir: str | os.PathLike | None = None,
          port: int | None = None, timeout: float = 600, *, env: dict | None = None, grace_s: float = 8.0,
          progress: Any = None, cwd: str | os.PathLike | None = None) -> MsrunResult:
    """Run `script` under msrun on `workers` local ranks, wait, and return every rank's result.

    Picks a free port unless `port` is given, puts this interpreter's bin folder on PATH
    (msrun starts workers as plain `python`) and the mshelpers checkout on PYTHONPATH.
    `log_dir` defaults to build/msrun/<script>-<time>; old logs there are removed first.
    `env` adds environment variables for the workers; cluster retries are 1 s unless set (`worker_env`).
    `progress` may be a tqdm bar (or True to make one) that follows rank 0's `report_progress` lines.
    A failed rank raises `MsrunError` quoting the first error line of its log; when a
    rank dies, msrun stops the others, and after `grace_s` seconds its scheduler too.
    Does not take /tmp/heavy.lock itself: wrap the notebook or test run in flock instead.
    Taught in notebooks/04_data_parallel.ipynb.
    """
    script = Path(script).resolve()
    if not script.is_file():
        raise ValueError(f"msrun: script={str(script)!r} does not exist; fix: pass the path of a .py file "
                         "(msrun needs a real file, not a notebook cell)")
    _check_counts("msrun", workers, workers)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"msrun: timeout={timeout!r} is invalid; fix: pass seconds > 0")
    if log_dir is None:
        build_dir = _build_dir
        log_dir = build_dir("msrun", f"{script.stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    log_dir = Path(log_dir).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in [*log_dir.glob("worker_*.log"), log_dir / "scheduler.log", log_dir / "msrun.log"]:
        old.unlink(missing_ok=True)
    out_root = log_dir / "out"
    for w in range(workers):
        d = out_root / f"rank_{w}"
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            if f.is_file():
                f.unlink()
    port = free_port() if port is None else int(port)
    cmd = msrun_command(script, workers, args, master_port=port, log_dir=log_dir,
                        extra=("--tail_worker_log=-1",))   # keep worker output out of msrun.log; it is in worker_N.log

    run_env = worker_env(out_root, env)

    bar, own_bar = _progress_bar(progress)
    t0 = time.perf_counter()
    msrun_log = log_dir / "msrun.log"
    timed_out = False
    with open(msrun_log, "w") as out:
        # Own session: msrun, its scheduler and their children form one group we can stop together.
        proc = subprocess.Popen(shlex.split(cmd), stdout=out, stderr=subprocess.STDOUT, env=run_env,
                                cwd=str(cwd or script.parent), start_new_session=True)
        failed_at = None
        while proc.poll() is None:
            time.sleep(0.5)
            if bar is not None:
                _advance(bar, log_dir / "worker_0.log")
            now = time.perf_counter()
            if failed_at is None and _WORKER_FAILED.search(_read_text(msrun_log)):
                failed_at = now
            if failed_at is not None and now - failed_at > grace_s:
                _stop(proc)   # the scheduler waits up to its cluster timeout (600 s) for a dead rank
            elif now - t0 > timeout:
                timed_out = True
                _stop(proc)
        wall = time.perf_counter() - t0
    if bar is not None:
        _advance(bar, log_dir / "worker_0.log")
        if own_bar:
            bar.close()

    result = _collect(cmd, log_dir, out_root, workers, proc.returncode, wall)
    if timed_out:
        raise MsrunError(f"msrun: {script.name} did not finish within timeout={timeout} s; "
                         f"logs in {log_dir}", result)
    if not result.ok:
        bad = [r for r in result.ranks if r.exit_code not in (0, None)] or \
              [r for r in result.ranks if r.error_line] or result.ranks[:1]
        r = bad[0]
        code = "unknown" if r.exit_code is None else r.exit_code
        raise MsrunError(f"msrun: rank {r.rank} of {script.name} failed (exit code {code}): "
                         f"{r.error_line or 'no error line in its log'}; see {r.log_path}", result)
    return result


# ---------------------------------------------------------------- internals
def _check_counts(fn: str, workers: Any, local: Any) -> None:
    for name, v in (("workers", workers), ("local_workers", local)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer")
    if local > workers:
        raise ValueError(f"{fn}: local_workers={local} exceeds workers={workers}; "
                         "fix: local_workers is the ranks on this node, at most the total")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _read_lines(path: Path) -> list[str]:
    return _read_text(path).splitlines()


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT first: msrun's handler kills its workers and scheduler. Then end the group we started."""
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # the group of the msrun process this function started
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _first_error_line(lines: list[str]) -> str | None:
    """The exception line of the first Python traceback, else the first [ERROR] line, else a bare message."""
    for i, ln in enumerate(lines):
        if ln.startswith("Traceback (most recent call last)"):
            for j, nxt in enumerate(lines[i + 1:], start=i + 1):
                if nxt and not nxt.startswith((" ", "\t", "Traceback")):
                    if nxt.rstrip().endswith(":"):   # MindSpore puts its message on the lines below
                        more = [m.strip() for m in lines[j + 1:j + 8] if m.strip() and not m.startswith("-")]
                        return (nxt.strip() + " " + more[0]) if more else nxt.strip()
                    return nxt.strip()
    for ln in lines:
        if ln.startswith("[ERROR]") or ln.startswith("[CRITICAL]"):
            return ln.strip()
    plain = [ln for ln in lines if ln.strip() and not _FRAMEWORK_LINE.match(ln)]
    for ln in plain:
        if _EXC_LINE.match(ln):
            return ln.strip()
    return plain[-1].strip() if plain else None


def _collect(cmd: str, log_dir: Path, out_root: Path, workers: int, returncode: int, wall: float) -> MsrunResult:
    failed_codes: dict[int, int] = {}
    for pid, code in _WORKER_FAILED.findall(_read_text(log_dir / "msrun.log")):
        failed_codes[int(pid)] = int(code)
    logs = [_read_lines(log_dir / f"worker_{r}.log") for r in range(workers)]
    pids = [{int(m.group(1)) for ln in lines if (m := _LOG_PID.match(ln))} for lines in logs]
    # A rank that died before MindSpore logged anything has no pid in its log: give it the one unclaimed code.
    unclaimed = [c for p, c in failed_codes.items() if not any(p in s for s in pids)]
    pidless = [r for r in range(workers) if not pids[r] and logs[r]]
    ranks = []
    for r in range(workers):
        log_path = log_dir / f"worker_{r}.log"
        out_dir = out_root / f"rank_{r}"
        files = sorted(p for p in out_dir.rglob("*") if p.is_file()) if out_dir.is_dir() else []
        res_path = out_dir / RESULT_FILE
        res = json.loads(res_path.read_text()) if res_path.is_file() else None
        code: int | None
        if returncode == 0 and not failed_codes:
            code = 0
        else:
            mine = [failed_codes[p] for p in pids[r] if p in failed_codes]
            if mine:
                code = mine[0]
            elif len(unclaimed) == 1 and pidless == [r]:
                code = unclaimed[0]
            elif any(ln.startswith("Traceback") for ln in logs[r]):
                code = 1
            else:
                code = None
        err = None if code == 0 else _first_error_line(logs[r])
        ranks.append(RankResult(rank=r, exit_code=code, log_path=log_path, out_dir=out_dir,
                                files=files, result=res, error_line=err))
    if failed_codes and returncode == 0:
        returncode = 1   # we stopped msrun with SIGINT after a rank died, and its handler exits 0
    return MsrunResult(command=cmd, log_dir=log_dir, returncode=returncode, wall_s=wall, ranks=ranks)


def _progress_bar(progress: Any) -> tuple[Any, bool]:
    if progress is None or progress is False:
        return None, False
    if progress is True:
        import sys
        from tqdm.std import tqdm   # a text bar: it renders in nbconvert and JupyterLab, and never freezes as a widget
        return tqdm(total=None, desc="msrun rank 0", file=sys.stdout, mininterval=0.5), True
    return progress, False


def _advance(bar: Any, log_path: Path) -> None:
    last = None
    for ln in _read_lines(log_path):
        if ln.startswith(PROGRESS_PREFIX):
            last = ln[len(PROGRESS_PREFIX):].strip()
    if not last:
        return
    done, _, total = last.partition("/")
    try:
        done_i, total_i = int(done), int(total)
    except ValueError:
        return
    if bar.total != total_i:
        bar.total = total_i
    if done_i > bar.n:
        bar.update(done_i - bar.n)
