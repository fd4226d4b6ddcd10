"""Run mutmut's pending mutants of one module as plain pytest processes, and store the results where mutmut keeps them.

Why: under mutmut 3.8.1's fork server a mutant of `memory` took 20-70 s, though the same tests with the same mutant
active (`MUTANT_UNDER_TEST`) take about 1.7 s as a fresh `python -m pytest` (2026-12-05, AMD EPYC family 26 model 2).
This runs what mutmut would run, and nothing less: for each mutant not yet run, the tests that mutmut's stats map to
its function (`mutants/mutmut-stats.json`), in `mutants/`, `-x`, with `[tool.mutmut]`'s `-k` deselection, in a
build folder of its own (`MSHELPERS_BUILD`). Each function's tests are first run with no mutant active and must pass,
or its mutants are not run.

Exit codes go into `mutants/<module>.py.meta` as mutmut writes them (so `mutmut results` lists survivors):
0 survived, 1 killed, and a timeout as -24 (mutmut's SIGXCPU). pytest's exit 4 (a test module's import-time call
raised under the mutant, so collection failed) is stored as 1, killed: mutmut's own runner files it as 255, a timeout.

    .venv/bin/python tests/mutate_direct.py mshelpers/memory.py [--jobs 2] [--timeout 120]
    .venv/bin/python tests/mutate_direct.py mshelpers/memory.py --rerun x__spec__mutmut_1 --add-tests tests/test_memory.py
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
DESELECT = "not two_rank and not measure_peak and not this_process_peak_rss and not rollback and not rolls_back"


def pytest_cmd(tests: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--rootdir=.", "--tb=no", "-x", "-q", "-p", "no:randomly",
            "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:nbval", "-k", DESELECT, *tests]


def _child_env(build: str) -> dict:
    """A test process's environment: its own build folder, the machine's peak cache, bytecode allowed."""
    env = dict(os.environ, MSHELPERS_BUILD=build)
    env.setdefault("MSHELPERS_PEAK_CACHE", str(ROOT / "build" / "peak_flops.json"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(tests: list[str], mutant: str, timeout: float) -> tuple[int, float]:
    # Each run writes into a build folder of its own: two mutants of one function run the same test at once, and
    # one's file must not pass the other's check (train_for_peak's CSV did). The machine's peak cache is shared.
    build = tempfile.mkdtemp(prefix="mutate-direct-")
    env = dict(_child_env(build), MUTANT_UNDER_TEST=mutant)
    t0 = time.time()
    try:
        rc = subprocess.run(pytest_cmd(tests), cwd=MUTANTS, env=env, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = -24
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return rc, time.time() - t0


def _batch(job: Path) -> None:
    """`--batch FILE`: run many mutants in this one process (pytest.main per mutant; the trampoline reads
    MUTANT_UNDER_TEST at every call), then the tests once more with no mutant. Writes {key: exit code} beside FILE."""
    import contextlib
    import io
    import signal

    import pytest
    spec = json.loads(job.read_text())
    os.chdir(MUTANTS)
    sys.path.insert(0, str(MUTANTS))
    args = pytest_cmd(spec["tests"])[3:]

    def one(key: str) -> int:
        os.environ["MUTANT_UNDER_TEST"] = key
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(key)))
        signal.alarm(int(spec["timeout"]))
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                return int(pytest.main(args))
        except TimeoutError:
            return -24
        finally:
            signal.alarm(0)
    out = {k: one(k) for k in spec["keys"]}
    out["none"] = one("none")                  # the process is still sound: unmutated, the tests pass
    job.with_suffix(".out").write_text(json.dumps(out))


def run_in_process(tests: list[str], keys: list[str], jobs: int, timeout: float) -> dict[str, int] | None:
    """The mutants split over `jobs` processes that each import once. None when a process ends unsound (its tests
    fail with no mutant after its mutants ran): the caller then runs each mutant in a fresh process."""
    with tempfile.TemporaryDirectory(prefix="mutate-direct-") as d:
        files = []
        for i in range(jobs):
            f = Path(d) / f"job{i}.json"
            f.write_text(json.dumps({"tests": tests, "keys": keys[i::jobs], "timeout": timeout}))
            files.append(f)
        procs = [subprocess.Popen([sys.executable, __file__, "--batch", str(f)], env=_child_env(d),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for f in files]
        for pr in procs:
            pr.wait()
        out: dict[str, int] = {}
        for f in files:
            o = f.with_suffix(".out")
            if not o.exists():
                return None
            got = json.loads(o.read_text())
            if got.pop("none") != 0:
                return None
            out.update(got)
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--batch"]:
        _batch(Path(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("source", help="e.g. mshelpers/memory.py")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--rerun", nargs="*", default=[], metavar="N",
                    help="run these mutants again (e.g. x__spec__mutmut_1), whatever their stored result")
    ap.add_argument("--in-process", action="store_true",
                    help="each job imports once and runs its mutants one after another (about 10x faster); "
                         "its survivors are run again in fresh processes, and a job whose unmutated tests then "
                         "fail is run again in fresh processes whole")
    ap.add_argument("--add-tests", nargs="*", default=[], metavar="FILE",
                    help="test files to run beside the mapped tests (new tests the stats do not map yet); "
                         "copy them into mutants/tests first")
    a = ap.parse_args(argv)
    meta_path = MUTANTS / (a.source + ".meta")
    meta = json.loads(meta_path.read_text())
    stats = json.loads((MUTANTS / "mutmut-stats.json").read_text())["tests_by_mangled_function_name"]
    mod = a.source.removesuffix(".py").replace("/", ".")
    rerun = {f"{mod}.{n}" for n in a.rerun}
    unknown = rerun - set(meta["exit_code_by_key"])
    if unknown:
        sys.exit(f"--rerun: {sorted(unknown)} are not mutants of {a.source}; fix: names as `mutmut results` prints")
    pending = [k for k, v in meta["exit_code_by_key"].items() if (k in rerun if rerun else v is None)]
    by_fn: dict[str, list[str]] = {}
    for k in pending:
        by_fn.setdefault(k.split("__mutmut_")[0], []).append(k)
    print(f"{len(pending)} pending mutants in {len(by_fn)} functions", flush=True)
    results: dict[str, int] = {}
    for fn, keys in sorted(by_fn.items()):
        tests = sorted(stats.get(fn, [])) + list(a.add_tests)
        if not tests:
            print(f"{fn}: no tests map to it; its {len(keys)} mutants left pending", flush=True)
            continue
        rc, _ = run(tests, "none", a.timeout)
        if rc != 0:
            print(f"{fn}: its tests fail with no mutant (exit {rc}); its mutants left pending", flush=True)
            continue
        t0 = time.time()
        fresh = keys
        if a.in_process:
            got = run_in_process(tests, keys, a.jobs, a.timeout)
            if got is None:
                print(f"{fn}: an in-process job ended unsound; every mutant in a fresh process", flush=True)
            else:
                results.update(got)
                fresh = [k for k in keys if got[k] == 0]     # a survivor is confirmed alone
        with ThreadPoolExecutor(a.jobs) as pool:
            for key, (rc, _) in zip(fresh, pool.map(lambda k: run(tests, k, a.timeout), fresh)):
                results[key] = rc
        survived = [k.split("__mutmut_")[1] for k in keys if results[k] == 0]
        print(f"{fn}: {len(keys)} run in {time.time() - t0:.0f} s, survived {len(survived)} {survived}", flush=True)
        meta = json.loads(meta_path.read_text())        # store after each function: a killed run keeps what it did
        meta["exit_code_by_key"].update({k: 1 if results[k] == 4 else results[k] for k in keys})
        tmp = meta_path.with_suffix(".meta.tmp")
        tmp.write_text(json.dumps(meta, indent=4))
        os.replace(tmp, meta_path)
    codes = list(results.values())
    print(f"done: {len(codes)} run; killed {sum(c in (1, 4) for c in codes)}, timeout {codes.count(-24)}, "
          f"survived {codes.count(0)}, other {[c for c in codes if c not in (0, 1, 4, -24)]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
