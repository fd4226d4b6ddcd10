"""`make nbval`'s paired stage pins each xdist worker to a core of its own (conftest.py, NBVAL_PIN_CORES=1).

Driven for real: a pytest run with two xdist workers and the repository's conftest.py as a plugin, whose two tests
each report their own affinity and that of a child process (a notebook's kernel is one). The peak cache is a
temporary file that already holds a valid one-thread entry, so the controller's pinned peak_flops() reads it
instead of timing MatMuls beside the other tests.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mshelpers.peak import PEAK_METHOD, cpu_info

ROOT = Path(__file__).resolve().parent.parent
TWO_CORES = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2

PROBE = '''
import json, os, subprocess, sys, time
def _report(tag):
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    time.sleep(1.0)                      # both workers busy at once, so neither takes both tests
    out = os.path.join(os.environ["PIN_PROBE_DIR"], tag + ".json")
    with open(out, "w") as f:
        json.dump({"worker": os.environ.get("PYTEST_XDIST_WORKER"), "self": sorted(os.sched_getaffinity(0)),
                   "child": json.loads(child)}, f)
def test_a():
    _report("a")
def test_b():
    _report("b")
'''


def _one_thread_entry() -> dict:
    info = cpu_info()
    key = f"{info['cpu_model']}|family {info['cpu_family']}|1 threads|CPU|float32"
    return {key: {"flops": 1e11, "dtype": "float32", "device": "CPU", "cpu_model": info["cpu_model"],
                  "cpu_family": info["cpu_family"], "threads": 1, "date": "2026-12-04T00:00:00+00:00",
                  "method": PEAK_METHOD, "load_1min_before": 0.0, "load_1min_after": 0.0, "competing_before": [],
                  "competing_after": [], "loaded": False}}


def _run(tmp_path: Path, pin: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    probe_dir = tmp_path / f"out_{pin}"
    probe_dir.mkdir()
    (tmp_path / "test_probe.py").write_text(PROBE)
    cache = tmp_path / "peak_flops.json"
    cache.write_text(json.dumps(_one_thread_entry()))
    before = cache.read_text()
    env = {**os.environ, "NBVAL_PIN_CORES": pin, "PIN_PROBE_DIR": str(probe_dir), "MSHELPERS_PEAK_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        "-n", "2", "--dist", "load", "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert cache.read_text() == before          # read, never re-measured
    return r, [json.loads((probe_dir / f"{t}.json").read_text()) for t in ("a", "b") if (probe_dir / f"{t}.json").exists()]


@pytest.mark.skipif(not TWO_CORES, reason="pinning two workers apart needs two cores")
def test_pinned_workers_and_their_children_keep_to_one_core_each(tmp_path):
    start = time.monotonic()
    r, reports = _run(tmp_path, "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(reports) == 2
    assert {rep["worker"] for rep in reports} == {"gw0", "gw1"}, reports
    for rep in reports:
        assert len(rep["self"]) == 1 and rep["child"] == rep["self"], rep
    assert reports[0]["self"] != reports[1]["self"], reports
    assert time.monotonic() - start < 120


@pytest.mark.skipif(not TWO_CORES, reason="pinning two workers apart needs two cores")
def test_without_the_flag_nothing_is_pinned(tmp_path):
    r, reports = _run(tmp_path, "0")
    assert r.returncode == 0, r.stdout + r.stderr
    every = sorted(os.sched_getaffinity(0))
    assert len(reports) == 2 and all(rep["self"] == every and rep["child"] == every for rep in reports), reports
