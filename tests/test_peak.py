"""metrics.peak_flops' cache knows its load (issue 36, item 5).

The MatMul timing (`_measure_matmul_chain`) is patched everywhere here, so no test needs MindSpore; the load
snapshot is scripted where a test needs a given load, and real (/proc and real busy processes) where the test
is about seeing the load.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mshelpers import metrics

IDLE = {"load_1min": 0.0, "competing": []}
SPIN = {"load_1min": 0.0, "competing": [{"name": "spin", "pid": 4242, "core_share": 0.9}]}
FIELDS = {"flops", "dtype", "device", "cpu_model", "cpu_family", "threads", "omp_num_threads", "date", "method",
          "repeats", "shapes", "cores", "load_1min_before", "load_1min_after", "competing_before",
          "competing_after", "loaded", "attempts", "measure_s", "clock_mhz"}


@pytest.fixture
def peak(tmp_path, monkeypatch):
    """A fresh cache path, a fresh process memory, and a fake timing: 10 GFLOP/s x the number of the call."""
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(cache))
    monkeypatch.setattr(metrics, "_UNCACHED", {})
    calls = []

    def fake(m, k, n, repeats, dtype):
        calls.append((m, k, n))
        return 10e9 * len(calls)
    monkeypatch.setattr(metrics, "_measure_matmul_chain", fake)
    return cache, calls


def script(monkeypatch, *snaps):
    """_load_snapshot returns `snaps` in turn, then the last one forever; returns the list of those handed out."""
    seen = []

    def snapshot():
        seen.append(snaps[min(len(seen), len(snaps) - 1)])
        return seen[-1]
    monkeypatch.setattr(metrics, "_load_snapshot", snapshot)
    return seen


def entry(**kw):
    info = metrics.cpu_info()
    rec = {"flops": 123e9, "dtype": "float32", "device": "CPU", "cpu_model": info["cpu_model"],
           "cpu_family": info["cpu_family"], "threads": info["threads"], "date": "2026-01-01T00:00:00+00:00",
           "load_1min_before": 0.1, "load_1min_after": 0.3, "competing_before": [], "competing_after": [],
           "loaded": False}
    return rec | kw


KEY = lambda: metrics._peak_key("float32")[2]   # noqa: E731


def test_an_idle_measurement_is_cached_with_its_load(peak, monkeypatch):
    cache, calls = peak
    busy = {"name": "cron", "pid": 7, "core_share": 0.06}      # listed (> 5 %), below the 20 % rule
    script(monkeypatch, {"load_1min": 0.25, "competing": []}, {"load_1min": 0.5, "competing": [busy]})
    assert metrics.peak_flops(shapes=((1, 2, 3),)) == 10e9
    rec = json.loads(cache.read_text())[KEY()]
    assert set(rec) == FIELDS
    assert (rec["load_1min_before"], rec["load_1min_after"], rec["competing_before"], rec["competing_after"],
            rec["loaded"], rec["attempts"], rec["cores"]) == (0.25, 0.5, [], [busy], False, 1, os.cpu_count())
    assert metrics.peak_flops() == 10e9 and len(calls) == 1           # read from the cache, not measured
    assert metrics.peak_flops_record() == rec


def test_the_load_rule_exactly():
    threads, cores = 2, 2                                             # allowed: 2 (this process) + 0.5 x 2
    assert metrics._load_reasons("before", {"load_1min": 3.0, "competing": []}, threads, cores) == []
    assert metrics._load_reasons("after", {"load_1min": 3.01, "competing": None}, threads, cores) == [
        "load average after 3.01 > 2 (this process) + 0.5 x 2 cores"]
    four = [{"name": f"p{i}", "pid": i, "core_share": 0.06} for i in range(4)]   # 24 % together
    assert metrics._load_reasons("before", {"load_1min": None, "competing": four[:3]}, threads, cores) == []
    assert metrics._load_reasons("before", {"load_1min": None, "competing": four}, threads, cores) == [
        "before: p0 (pid 0) at 6% of a core, p1 (pid 1) at 6% of a core, p2 (pid 2) at 6% of a core and 1 more"]


def test_a_loaded_measurement_is_retaken_then_refused_and_not_cached(peak, monkeypatch):
    cache, calls = peak
    seen = script(monkeypatch, SPIN)
    with pytest.warns(UserWarning) as w:
        got = metrics.peak_flops(shapes=((1, 2, 3),), retries=2, wait_s=0)
    assert got == 30e9 and len(calls) == 3                         # taken 3 times, the last one returned
    assert len(w) == 1 and str(w[0].message) == (
        "peak_flops: 30.0 GFLOP/s was measured under load (before: spin (pid 4242) at 90% of a core; after: spin "
        f"(pid 4242) at 90% of a core) in 3 attempt(s); NOT cached in {cache}; fix: stop the competing processes "
        "and call peak_flops(refresh=True)")
    assert not cache.exists() and len(seen) == 6
    rec = metrics.peak_flops_record()                               # what was returned, marked loaded
    assert rec["flops"] == 30e9 and rec["loaded"] is True and rec["competing_before"] == SPIN["competing"]
    # the same process: said again, not measured again; a new process (fresh memory) on an idle machine caches
    with pytest.warns(UserWarning, match="under load"):
        assert metrics.peak_flops() == 30e9 and len(calls) == 3
    monkeypatch.setattr(metrics, "_UNCACHED", {})
    script(monkeypatch, IDLE)
    assert metrics.peak_flops(shapes=((1, 2, 3),)) == 40e9
    assert json.loads(cache.read_text())[KEY()]["loaded"] is False


def test_it_waits_for_the_machine_to_become_idle_and_retakes(peak, monkeypatch):
    cache, calls = peak
    # attempt 1: loaded before and after; attempt 2 waits through two loaded snapshots, then it is idle
    seen = script(monkeypatch, SPIN, SPIN, SPIN, SPIN, IDLE, IDLE)
    assert metrics.peak_flops(shapes=((1, 2, 3),), wait_s=60) == 20e9 and len(calls) == 2
    rec = json.loads(cache.read_text())[KEY()]
    assert rec["attempts"] == 2 and rec["loaded"] is False and rec["competing_before"] == [] and len(seen) == 6


def test_a_refresh_under_load_keeps_the_idle_entry(peak, monkeypatch):
    cache, calls = peak
    cache.write_text(json.dumps({KEY(): entry()}))
    script(monkeypatch, SPIN)
    with pytest.warns(UserWarning, match=r"NOT cached .* \(its idle 123.0 GFLOP/s of 2026-01-01T00:00:00\+00:00 "
                                         r"stays\); fix: "):
        assert metrics.peak_flops(refresh=True, shapes=((1, 2, 3),), retries=0) == 10e9
    assert json.loads(cache.read_text()) == {KEY(): entry()}
    assert metrics.peak_flops_record() == entry()                   # the cache's idle entry is still the record
    assert metrics.peak_flops() == 123e9 and len(calls) == 1


def _spinner(seconds: float) -> str:
    return f"import time\nt = time.time() + {seconds}\nwhile time.time() < t:\n    pass\n"


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_a_real_busy_process_is_listed_and_refuses_the_measurement_but_our_own_child_is_not(peak):
    cache, calls = peak
    # a stranger: started through a shell that exits at once, so it is re-parented and is not our descendant
    out = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', _spinner(20)],
                         capture_output=True, text=True, timeout=30)
    stranger = int(out.stdout.strip())
    child = subprocess.Popen([sys.executable, "-c", _spinner(20)])     # our own child: excluded
    try:
        assert _ppid(stranger) != os.getpid()
        time.sleep(0.2)
        rows = metrics.competing_processes()
        by_pid = {r["pid"]: r for r in rows}
        assert stranger in by_pid and by_pid[stranger]["core_share"] > 0.2 and by_pid[stranger]["name"] == \
            os.path.basename(sys.executable)[:15], rows
        assert child.pid not in by_pid and os.getpid() not in by_pid, rows
        with pytest.warns(UserWarning, match=r"measured under load \(before: .* of a core"):
            metrics.peak_flops(shapes=((1, 2, 3),), retries=1, wait_s=0)
        assert len(calls) == 2 and not cache.exists()
        rec = metrics.peak_flops_record()
        assert stranger in [r["pid"] for r in rec["competing_before"]] and rec["loaded"] is True
    finally:
        for pid in (stranger, child.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.wait()


def test_an_entry_from_another_cpu_model_or_core_count_is_never_used(peak, monkeypatch):
    cache, calls = peak
    script(monkeypatch, IDLE)
    other_key = "Other CPU|family 6|64 threads|CPU|float32"
    cache.write_text(json.dumps({other_key: entry(cpu_model="Other CPU", threads=64, flops=999e9)}))
    assert metrics.peak_flops(shapes=((1, 2, 3),)) == 10e9 and len(calls) == 1   # its own key: measured
    stored = json.loads(cache.read_text())
    assert stored[other_key]["flops"] == 999e9 and stored[KEY()]["flops"] == 10e9   # the other one is kept
    # an entry under this machine's key that says it came from elsewhere (a copied file) is not used either
    for bad in (dict(cpu_model="Other CPU"), dict(threads=metrics.cpu_info()["threads"] + 1)):
        cache.write_text(json.dumps({KEY(): entry(**bad)}))
        with pytest.warns(UserWarning, match=r"is not used: it was measured on .* threads, this machine is"):
            assert metrics.peak_flops(shapes=((1, 2, 3),)) == 10e9 * len(calls)
    assert len(calls) == 3


def test_an_old_entry_without_load_fields_or_recorded_loaded_is_measured_again_when_idle(peak, monkeypatch):
    cache, calls = peak
    old = {k: v for k, v in entry().items() if k not in metrics.PEAK_LOAD_FIELDS}
    cache.write_text(json.dumps({KEY(): old}))
    assert metrics.peak_flops_record() == old                      # as stored
    # measured again but still loaded: not cached, the old entry is left for an idle machine to replace
    script(monkeypatch, SPIN)
    with pytest.warns(UserWarning) as w:
        metrics.peak_flops(shapes=((1, 2, 3),), retries=0)
    assert len(w) == 2 and str(w[0].message) == (
        f"peak_flops: the cached float32 peak in {cache} is not used: it was recorded without its load "
        "(load_1min_before, load_1min_after, competing_before, competing_after, loaded missing); measuring again")
    assert str(w[1].message).startswith("peak_flops: 10.0 GFLOP/s was measured under load (before: spin")
    assert json.loads(cache.read_text()) == {KEY(): old}
    # a later process on an idle machine replaces it
    monkeypatch.setattr(metrics, "_UNCACHED", {})
    script(monkeypatch, IDLE)
    with pytest.warns(UserWarning, match="recorded without its load"):
        assert metrics.peak_flops(shapes=((1, 2, 3),)) == 20e9
    assert json.loads(cache.read_text())[KEY()]["loaded"] is False
    # an entry recorded as loaded (kept by hand, or by an older rule) is measured again too
    cache.write_text(json.dumps({KEY(): entry(loaded=True)}))
    with pytest.warns(UserWarning, match=r"recorded under load \(loaded=True\); measuring again"):
        assert metrics.peak_flops(shapes=((1, 2, 3),)) == 30e9
    assert len(calls) == 3


@pytest.mark.parametrize("text", ["{torn", "", "[1, 2]", json.dumps({"k": {"flops": 1.0}})[:-7]])
def test_a_corrupt_cache_is_ignored_with_one_line_and_rewritten(peak, monkeypatch, text):
    cache, calls = peak
    script(monkeypatch, IDLE)
    cache.write_text(text)
    assert metrics.peak_flops_record() is None
    with pytest.warns(UserWarning) as w:
        assert metrics.peak_flops(shapes=((1, 2, 3),)) == 10e9
    msg = str(w[0].message)
    assert len(w) == 1 and "\n" not in msg and msg.startswith(f"peak_flops: cache {cache} is unreadable (")
    assert msg.endswith("); ignored, measuring again")
    assert list(json.loads(cache.read_text())) == [KEY()] and os.listdir(cache.parent) == ["peak.json"]


def test_two_writers_at_once_leave_one_valid_file(tmp_path):
    cache = tmp_path / "peak.json"
    code = f"""
import sys, time, warnings
from mshelpers import metrics
metrics._measure_matmul_chain = lambda m, k, n, repeats, dtype: 1e9 * (1 + int(sys.argv[1]))
metrics._load_snapshot = lambda: {{"load_1min": 0.0, "competing": []}}
warnings.simplefilter("error")
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))      # both start writing at the same moment
for _ in range(40):
    metrics.peak_flops(refresh=True, dtype=sys.argv[3], shapes=((1, 1, 1),))
print("ok")
"""
    env = {**os.environ, "MSHELPERS_PEAK_CACHE": str(cache)}
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(start), dt], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, dt in enumerate(("float32", "float16"))]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and [o[0].strip() for o in outs] == ["ok", "ok"], outs
    stored = json.loads(cache.read_text())                         # one valid file, no temp file left
    assert os.listdir(tmp_path) == ["peak.json"] and stored
    info = metrics.cpu_info()
    for key, rec in stored.items():
        assert metrics._peak_entry_problem(rec, info) is None and rec["flops"] in (1e9, 2e9), key


def test_bad_arguments_name_field_value_and_fix(peak):
    with pytest.raises(ValueError) as e:
        metrics.peak_flops(retries=-1)
    assert str(e.value) == "peak_flops: retries=-1 is invalid; fix: pass an integer >= 0"
    with pytest.raises(ValueError) as e:
        metrics.peak_flops(wait_s=float("nan"))
    assert str(e.value) == "peak_flops: wait_s=nan is invalid; fix: pass seconds >= 0"
    with pytest.raises(ValueError) as e:
        metrics.competing_processes(interval=-0.5)
    assert str(e.value) == "competing_processes: interval=-0.5 is invalid; fix: pass a number >= 0"
