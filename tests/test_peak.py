"""mshelpers.peak: the CPU's figures, the clock probe, the hardware peak (the MFU denominator), and the
measured MatMul peak with its cache, which knows its load (issue 36, item 5).

In the cache tests the MatMul timing (`_measure_matmul_chain`) is patched, so they need no MindSpore; the load
snapshot is scripted where a test needs a given load, and real (/proc and real busy processes) where the test
is about seeing the load.
"""
from __future__ import annotations

import json
import math
import re
import os
import signal
import subprocess
import sys
import time

import pytest

from mshelpers import peak
from mshelpers.peak import DATASHEET_PEAK_FLOPS, peak_flops, peak_flops_record, theoretical_peak_flops

# --- the peak cache and its load check ---
IDLE = {"load_1min": 0.0, "competing": []}
SPIN = {"load_1min": 0.0, "competing": [{"name": "spin", "pid": 4242, "core_share": 0.9}]}
FIELDS = {"flops", "dtype", "device", "cpu_model", "cpu_family", "threads", "omp_num_threads", "date", "method",
          "repeats", "shapes", "cores", "load_1min_before", "load_1min_after", "competing_before",
          "competing_after", "loaded", "attempts", "measure_s", "clock_mhz"}


@pytest.fixture
def fake_matmul(tmp_path, monkeypatch):
    """A fresh cache path, a fresh process memory, and a fake timing: 10 GFLOP/s x the number of the call."""
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(cache))
    monkeypatch.setattr(peak, "_UNCACHED", {})
    calls = []

    def fake(m, k, n, repeats, dtype):
        calls.append((m, k, n))
        return 10e9 * len(calls)
    monkeypatch.setattr(peak, "_measure_matmul_chain", fake)
    return cache, calls


def script(monkeypatch, *snaps):
    """_load_snapshot returns `snaps` in turn, then the last one forever; returns the list of those handed out."""
    seen = []

    def snapshot():
        seen.append(snaps[min(len(seen), len(snaps) - 1)])
        return seen[-1]
    monkeypatch.setattr(peak, "_load_snapshot", snapshot)
    return seen


def entry(**kw):
    info = peak.cpu_info()
    rec = {"flops": 123e9, "dtype": "float32", "device": "CPU", "cpu_model": info["cpu_model"],
           "cpu_family": info["cpu_family"], "threads": info["threads"], "date": "2026-01-01T00:00:00+00:00",
           "load_1min_before": 0.1, "load_1min_after": 0.3, "competing_before": [], "competing_after": [],
           "loaded": False}
    return rec | kw


KEY = lambda: peak._peak_key("float32")[2]   # noqa: E731


def test_an_idle_measurement_is_cached_with_its_load(fake_matmul, monkeypatch):
    cache, calls = fake_matmul
    busy = {"name": "cron", "pid": 7, "core_share": 0.06}      # listed (> 5 %), below the 20 % rule
    script(monkeypatch, {"load_1min": 0.25, "competing": []}, {"load_1min": 0.5, "competing": [busy]})
    assert peak.peak_flops(shapes=((1, 2, 3),)) == 10e9
    rec = json.loads(cache.read_text())[KEY()]
    assert set(rec) == FIELDS
    assert (rec["load_1min_before"], rec["load_1min_after"], rec["competing_before"], rec["competing_after"],
            rec["loaded"], rec["attempts"], rec["cores"]) == (0.25, 0.5, [], [busy], False, 1, os.cpu_count())
    assert peak.peak_flops() == 10e9 and len(calls) == 1           # read from the cache, not measured
    assert peak.peak_flops_record() == rec


def test_the_load_rule_exactly():
    threads, cores = 2, 2                                             # allowed: 2 (this process) + 0.5 x 2
    assert peak._load_reasons("before", {"load_1min": 3.0, "competing": []}, threads, cores) == []
    assert peak._load_reasons("after", {"load_1min": 3.01, "competing": None}, threads, cores) == [
        "load average after 3.01 > 2 (this process) + 0.5 x 2 cores"]
    four = [{"name": f"p{i}", "pid": i, "core_share": 0.06} for i in range(4)]   # 24 % together
    assert peak._load_reasons("before", {"load_1min": None, "competing": four[:3]}, threads, cores) == []
    assert peak._load_reasons("before", {"load_1min": None, "competing": four}, threads, cores) == [
        "before: p0 (pid 0) at 6% of a core, p1 (pid 1) at 6% of a core, p2 (pid 2) at 6% of a core and 1 more"]


def test_a_loaded_measurement_is_retaken_then_refused_and_not_cached(fake_matmul, monkeypatch):
    cache, calls = fake_matmul
    seen = script(monkeypatch, SPIN)
    with pytest.warns(UserWarning) as w:
        got = peak.peak_flops(shapes=((1, 2, 3),), retries=2, wait_s=0)
    assert got == 30e9 and len(calls) == 3                         # taken 3 times, the last one returned
    assert len(w) == 1 and str(w[0].message) == (
        "peak_flops: 30.0 GFLOP/s was measured under load (before: spin (pid 4242) at 90% of a core; after: spin "
        f"(pid 4242) at 90% of a core) in 3 attempt(s); NOT cached in {cache}; fix: stop the competing processes "
        "and call peak_flops(refresh=True)")
    assert not cache.exists() and len(seen) == 6
    rec = peak.peak_flops_record()                               # what was returned, marked loaded
    assert rec["flops"] == 30e9 and rec["loaded"] is True and rec["competing_before"] == SPIN["competing"]
    # the same process: said again, not measured again; a new process (fresh memory) on an idle machine caches
    with pytest.warns(UserWarning, match="under load"):
        assert peak.peak_flops() == 30e9 and len(calls) == 3
    monkeypatch.setattr(peak, "_UNCACHED", {})
    script(monkeypatch, IDLE)
    assert peak.peak_flops(shapes=((1, 2, 3),)) == 40e9
    assert json.loads(cache.read_text())[KEY()]["loaded"] is False


def test_it_waits_for_the_machine_to_become_idle_and_retakes(fake_matmul, monkeypatch):
    cache, calls = fake_matmul
    # attempt 1: loaded before and after; attempt 2 waits through two loaded snapshots, then it is idle
    seen = script(monkeypatch, SPIN, SPIN, SPIN, SPIN, IDLE, IDLE)
    assert peak.peak_flops(shapes=((1, 2, 3),), wait_s=60) == 20e9 and len(calls) == 2
    rec = json.loads(cache.read_text())[KEY()]
    assert rec["attempts"] == 2 and rec["loaded"] is False and rec["competing_before"] == [] and len(seen) == 6


def test_a_refresh_under_load_keeps_the_idle_entry(fake_matmul, monkeypatch):
    cache, calls = fake_matmul
    cache.write_text(json.dumps({KEY(): entry()}))
    script(monkeypatch, SPIN)
    with pytest.warns(UserWarning, match=r"NOT cached .* \(its idle 123.0 GFLOP/s of 2026-01-01T00:00:00\+00:00 "
                                         r"stays\); fix: "):
        assert peak.peak_flops(refresh=True, shapes=((1, 2, 3),), retries=0) == 10e9
    assert json.loads(cache.read_text()) == {KEY(): entry()}
    assert peak.peak_flops_record() == entry()                   # the cache's idle entry is still the record
    assert peak.peak_flops() == 123e9 and len(calls) == 1


def _spinner(seconds: float) -> str:
    return f"import time\nt = time.time() + {seconds}\nwhile time.time() < t:\n    pass\n"


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_a_real_busy_process_is_listed_and_refuses_the_measurement_but_our_own_child_is_not(fake_matmul):
    cache, calls = fake_matmul
    # a stranger: started through a shell that exits at once, so it is re-parented and is not our descendant
    out = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', _spinner(20)],
                         capture_output=True, text=True, timeout=30)
    stranger = int(out.stdout.strip())
    child = subprocess.Popen([sys.executable, "-c", _spinner(20)])     # our own child: excluded
    try:
        assert _ppid(stranger) != os.getpid()
        time.sleep(0.2)
        rows = peak.competing_processes()
        by_pid = {r["pid"]: r for r in rows}
        assert stranger in by_pid and by_pid[stranger]["core_share"] > 0.2 and by_pid[stranger]["name"] == \
            os.path.basename(sys.executable)[:15], rows
        assert child.pid not in by_pid and os.getpid() not in by_pid, rows
        with pytest.warns(UserWarning, match=r"measured under load \(before: .* of a core"):
            peak.peak_flops(shapes=((1, 2, 3),), retries=1, wait_s=0)
        assert len(calls) == 2 and not cache.exists()
        rec = peak.peak_flops_record()
        assert stranger in [r["pid"] for r in rec["competing_before"]] and rec["loaded"] is True
    finally:
        for pid in (stranger, child.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.wait()


def test_an_entry_from_another_cpu_model_or_core_count_is_never_used(fake_matmul, monkeypatch):
    cache, calls = fake_matmul
    script(monkeypatch, IDLE)
    other_key = "Other CPU|family 6|64 threads|CPU|float32"
    cache.write_text(json.dumps({other_key: entry(cpu_model="Other CPU", threads=64, flops=999e9)}))
    assert peak.peak_flops(shapes=((1, 2, 3),)) == 10e9 and len(calls) == 1   # its own key: measured
    stored = json.loads(cache.read_text())
    assert stored[other_key]["flops"] == 999e9 and stored[KEY()]["flops"] == 10e9   # the other one is kept
    # an entry under this machine's key that says it came from elsewhere (a copied file) is not used either
    here = peak.cpu_info()
    for bad in (dict(cpu_model="Other CPU"), dict(threads=here["threads"] + 1)):
        rec = entry(**bad)
        cache.write_text(json.dumps({KEY(): rec}))
        why = (f"it was measured on {rec['cpu_model']!r} with {rec['threads']} threads, "
               f"this machine is {here['cpu_model']!r} with {here['threads']}")
        with pytest.warns(UserWarning, match=re.escape(f"is not used: {why}; measuring again")):
            assert peak.peak_flops(shapes=((1, 2, 3),)) == 10e9 * len(calls)
    assert len(calls) == 3


def test_an_old_entry_without_load_fields_or_recorded_loaded_is_measured_again_when_idle(fake_matmul, monkeypatch):
    cache, calls = fake_matmul
    old = {k: v for k, v in entry().items() if k not in peak.PEAK_LOAD_FIELDS}
    cache.write_text(json.dumps({KEY(): old}))
    assert peak.peak_flops_record() == old                      # as stored
    # measured again but still loaded: not cached, the old entry is left for an idle machine to replace
    script(monkeypatch, SPIN)
    with pytest.warns(UserWarning) as w:
        peak.peak_flops(shapes=((1, 2, 3),), retries=0)
    assert len(w) == 2 and str(w[0].message) == (
        f"peak_flops: the cached float32 peak in {cache} is not used: it was recorded without its load "
        "(load_1min_before, load_1min_after, competing_before, competing_after, loaded missing); measuring again")
    assert str(w[1].message).startswith("peak_flops: 10.0 GFLOP/s was measured under load (before: spin")
    assert json.loads(cache.read_text()) == {KEY(): old}
    # a later process on an idle machine replaces it
    monkeypatch.setattr(peak, "_UNCACHED", {})
    script(monkeypatch, IDLE)
    with pytest.warns(UserWarning, match="recorded without its load"):
        assert peak.peak_flops(shapes=((1, 2, 3),)) == 20e9
    assert json.loads(cache.read_text())[KEY()]["loaded"] is False
    # an entry recorded as loaded (kept by hand, or by an older rule) is measured again too
    cache.write_text(json.dumps({KEY(): entry(loaded=True)}))
    with pytest.warns(UserWarning, match=r"recorded under load \(loaded=True\); measuring again"):
        assert peak.peak_flops(shapes=((1, 2, 3),)) == 30e9
    assert len(calls) == 3


@pytest.mark.parametrize("text", ["{torn", "", "[1, 2]", json.dumps({"k": {"flops": 1.0}})[:-7]])
def test_a_corrupt_cache_is_ignored_with_one_line_and_rewritten(fake_matmul, monkeypatch, text):
    cache, calls = fake_matmul
    script(monkeypatch, IDLE)
    cache.write_text(text)
    assert peak.peak_flops_record() is None
    with pytest.warns(UserWarning) as w:
        assert peak.peak_flops(shapes=((1, 2, 3),)) == 10e9
    msg = str(w[0].message)
    assert len(w) == 1 and "\n" not in msg and msg.startswith(f"peak_flops: cache {cache} is unreadable (")
    assert msg.endswith("); ignored, measuring again")
    try:                                               # the reader's own reason, on one line, word for word
        why = "a JSON list, not an object" if text == "[1, 2]" else None
        json.loads(text)
    except ValueError as e:
        why = " ".join(str(e).split())
    assert msg == f"peak_flops: cache {cache} is unreadable ({why}); ignored, measuring again"
    assert list(json.loads(cache.read_text())) == [KEY()] and os.listdir(cache.parent) == ["peak.json"]


def test_two_writers_at_once_leave_one_valid_file(tmp_path):
    cache = tmp_path / "peak.json"
    code = f"""
import sys, time, warnings
from mshelpers import peak
peak._measure_matmul_chain = lambda m, k, n, repeats, dtype: 1e9 * (1 + int(sys.argv[1]))
peak._load_snapshot = lambda: {{"load_1min": 0.0, "competing": []}}
warnings.simplefilter("error")
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))      # both start writing at the same moment
for _ in range(40):
    peak.peak_flops(refresh=True, dtype=sys.argv[3], shapes=((1, 1, 1),))
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
    info = peak.cpu_info()
    for key, rec in stored.items():
        assert peak._peak_entry_problem(rec, info) is None and rec["flops"] in (1e9, 2e9), key


def test_bad_arguments_name_field_value_and_fix(fake_matmul):
    with pytest.raises(ValueError) as e:
        peak.peak_flops(retries=-1)
    assert str(e.value) == "peak_flops: retries=-1 is invalid; fix: pass an integer >= 0"
    with pytest.raises(ValueError) as e:
        peak.peak_flops(wait_s=float("nan"))
    assert str(e.value) == "peak_flops: wait_s=nan is invalid; fix: pass seconds >= 0"
    # a bool is no count of retries or of seconds, and an endless wait is no budget
    for kw, line in ((dict(retries=True), "retries=True is invalid; fix: pass an integer >= 0"),
                     (dict(retries=1.0), "retries=1.0 is invalid; fix: pass an integer >= 0"),
                     (dict(wait_s=True), "wait_s=True is invalid; fix: pass seconds >= 0"),
                     (dict(wait_s=math.inf), "wait_s=inf is invalid; fix: pass seconds >= 0")):
        with pytest.raises(ValueError) as e:
            peak.peak_flops(**kw)
        assert str(e.value) == f"peak_flops: {line}", kw
    with pytest.raises(ValueError) as e:
        peak.competing_processes(interval=-0.5)
    assert str(e.value) == "competing_processes: interval=-0.5 is invalid; fix: pass a number >= 0"


# --- the CPU's figures, the clock, the hardware peak, the MatMul chain ---
def test_peak_flops_is_cached_per_machine_and_shared_by_fresh_processes(tmp_path, monkeypatch):
    import json
    import subprocess
    import sys
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(cache))
    monkeypatch.setattr(peak, "_UNCACHED", {})
    # the load check itself is tested above; here the machine counts as idle so the real
    # measurement is cached (a shared test machine would otherwise refuse it)
    monkeypatch.setattr(peak, "_load_snapshot", lambda: {"load_1min": 0.0, "competing": []})
    small = ((256, 256, 256), (512, 512, 512))
    first = peak_flops(refresh=True, repeats=2, shapes=small)
    rec = peak_flops_record()
    # provenance: the figure is the best shape's, and the record says where it came from
    assert first == max(s["gflops"] for s in rec["shapes"]) * 1e9 and first == rec["flops"]
    assert rec["threads"] >= 1 and rec["cpu_model"] and rec["date"] and "MatMul" in rec["method"]
    assert len(rec["shapes"]) == 2
    # two fresh processes read the same value, without measuring again
    code = "from mshelpers.peak import peak_flops; print(repr(peak_flops()))"
    env = {**os.environ, "MSHELPERS_PEAK_CACHE": str(cache)}
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=120).stdout.strip().splitlines()[-1] for _ in range(2)]
    assert [float(o) for o in outs] == [first, first]
    # a corrupt cache is measured again and rewritten, never trusted
    cache.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable .*; ignored, measuring again"):
        again = peak_flops(repeats=1, shapes=((256, 256, 256),))
    assert again > 0 and json.loads(cache.read_text())


def test_theoretical_peak_and_datasheet_table(capsys):
    t = theoretical_peak_flops()
    out = capsys.readouterr().out
    assert "FLOP/cycle" in out and "assumes" in out and t > 1e9
    for dev in ("Ascend 910A", "Ascend 910B", "NVIDIA A100 SXM", "NVIDIA H100 SXM"):
        assert DATASHEET_PEAK_FLOPS[dev]["source"]
    assert DATASHEET_PEAK_FLOPS["NVIDIA A100 SXM"]["bfloat16"] == 312e12
    assert DATASHEET_PEAK_FLOPS["NVIDIA H100 SXM"]["bfloat16"] == 989.4e12


def test_hardware_peak_is_cores_times_max_clock_times_flop_per_cycle(tmp_path, monkeypatch, capsys):
    import json
    from mshelpers.metrics import share_of_achievable
    from mshelpers.peak import _peak_key, cpu_info, hardware_peak_flops, max_clock_mhz
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(tmp_path / "peak.json"))   # no measured peak yet
    info, (mhz, _) = cpu_info(), max_clock_mhz()
    zen4 = info["vendor"] == "AuthenticAMD" and info["cpu_family"] == "25"    # AVX-512 on 256-bit units
    lanes = (8 if zen4 else 16) if "avx512f" in info["flags"] else 8 if "fma" in info["flags"] else 4
    want = info["threads"] * mhz * 1e6 * lanes * 2 * 2          # cores x clock x lanes x FMA(2) x 2 units
    assert hardware_peak_flops(verbose=True) == pytest.approx(want)
    out = capsys.readouterr().out
    assert "MFU denominator (hardware peak)" in out and "assumes" in out
    # a measured MatMul peak above the theory (turbo) replaces it, so MFU <= 1 by construction
    (tmp_path / "peak.json").write_text(json.dumps({_peak_key("float32")[2]: {"flops": want * 1.5}}))
    assert hardware_peak_flops() == pytest.approx(want * 1.5)
    idle = {"cpu_model": info["cpu_model"], "threads": info["threads"], "load_1min_before": 0.1,
            "load_1min_after": 0.2, "competing_before": [], "competing_after": [], "loaded": False}
    (tmp_path / "peak.json").write_text(json.dumps({_peak_key("float32")[2]: {"flops": want * 0.7, **idle}}))
    assert hardware_peak_flops() == pytest.approx(want)
    # share of achievable: the same achieved FLOP/s over the measured peak
    assert share_of_achievable(1000, want * 0.7 / 2000) == pytest.approx(0.5)
    # accelerators: the datasheet figure; bad names get one line with the fix
    assert hardware_peak_flops("bfloat16", device="NVIDIA A100 SXM") == 312e12
    with pytest.raises(ValueError, match="device='TPU' is unknown"):
        hardware_peak_flops(device="TPU")
    with pytest.raises(ValueError, match="has no float32 figure"):
        hardware_peak_flops("float32", device="Ascend 910B")


@pytest.mark.parametrize("flags, lanes, isa", [({"avx512f", "fma", "avx2"}, 16, "AVX-512"), ({"fma", "avx2"}, 8, "AVX2+FMA"),
                                               ({"sse2"}, 4, "SSE")])
def test_theoretical_peak_is_cores_x_clock_x_lanes_x_2_x_fma_units(monkeypatch, capsys, flags, lanes, isa):
    monkeypatch.setattr(peak, "cpu_info", lambda: {"threads": 2, "mhz": 2300.0, "flags": flags, "cpu_model": "x"})
    want = 2 * 2300e6 * lanes * 2 * 2                       # 2 cores x 2.3 GHz x lanes x 2 (FMA) x 2 units
    assert theoretical_peak_flops() == want
    assert capsys.readouterr().out == (
        f"theoretical fp32 peak = 2 cores x 2.30 GHz x {lanes * 4} FLOP/cycle ({isa}: {lanes} lanes x 2 for FMA x 2 "
        f"FMA units) = {want / 1e9:.0f} GFLOP/s\n  assumes: each logical CPU is a full core (no SMT sharing), the "
        f"nominal clock holds under {isa}, 2 FMA units per core\n")
    assert theoretical_peak_flops(verbose=False, fma_units=1) == want / 2 and capsys.readouterr().out == ""


def test_theoretical_peak_without_a_clock_is_one_line(monkeypatch):
    monkeypatch.setattr(peak, "cpu_info", lambda: {"threads": 2, "mhz": None, "flags": {"fma"}, "cpu_model": "x"})
    with pytest.raises(ValueError) as e:
        theoretical_peak_flops()
    assert str(e.value) == ("theoretical_peak_flops: no clock in /proc/cpuinfo; fix: use peak_flops() (measured) "
                            "or a DATASHEET_PEAK_FLOPS entry")


class _FakePath:
    """Stands in for peak.Path in max_clock_mhz: read_text() gives `text`, or raises it."""
    def __init__(self, text):
        self.text = text

    def __call__(self, path):
        assert path == "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
        return self

    def read_text(self):
        if isinstance(self.text, Exception):
            raise self.text
        return self.text


def test_max_clock_prefers_cpufreq_then_the_largest_cpu_mhz(monkeypatch):
    import io
    cpuinfo = "processor\t: 0\ncpu MHz\t\t: 2300.000\nprocessor\t: 1\ncpu MHz\t\t: 3100.500\ncpu MHz\t\t: 2900\nflags\t: fma\n"
    monkeypatch.setattr(peak, "open", lambda p, *a, **k: io.StringIO(cpuinfo), raising=False)
    monkeypatch.setattr(peak, "measured_clock_mhz", lambda: (9000.0, "measured"))
    monkeypatch.setattr(peak, "_cached_clock_mhz", lambda: None)
    monkeypatch.setattr(peak, "Path", _FakePath("3500000\n"))
    assert peak.max_clock_mhz() == (3500.0, "cpufreq cpuinfo_max_freq")      # cpufreq wins, even over a probe
    monkeypatch.setattr(peak, "measured_clock_mhz", lambda: (None, "no C compiler"))
    for bad in ("0\n", OSError("no cpufreq"), "n/a"):
        monkeypatch.setattr(peak, "Path", _FakePath(bad))
        assert peak.max_clock_mhz() == (3100.5, "/proc/cpuinfo cpu MHz")
    # no cpufreq: the measured clock when it is above the listed one (a VM's nominal clock), else the listed one
    monkeypatch.setattr(peak, "measured_clock_mhz", lambda: (3650.0, "measured: a dependent-add chain, best of 5"))
    assert peak.max_clock_mhz() == (3650.0, "measured: a dependent-add chain, best of 5")
    monkeypatch.setattr(peak, "measured_clock_mhz", lambda: (2000.0, "measured: a dependent-add chain, best of 5"))
    assert peak.max_clock_mhz() == (3100.5, "/proc/cpuinfo cpu MHz")
    monkeypatch.setattr(peak, "measured_clock_mhz", lambda: (None, "no C compiler"))
    monkeypatch.setattr(peak, "_cached_clock_mhz", lambda: 3300.0)      # the clock cached with the MatMul peak
    assert peak.max_clock_mhz() == (3300.0, "measured: a dependent-add chain, best of 5")
    monkeypatch.setattr(peak, "_cached_clock_mhz", lambda: None)

    def no_proc(*a, **k):
        raise OSError("no /proc")
    monkeypatch.setattr(peak, "open", no_proc, raising=False)
    assert peak.max_clock_mhz() == (None, "/proc/cpuinfo cpu MHz")


@pytest.mark.parametrize("flags, lanes, isa", [({"avx512f", "fma"}, 16, "AVX-512"), ({"fma"}, 8, "AVX2+FMA"), (set(), 4, "SSE")])
def test_hardware_peak_per_isa_its_printout_and_the_measured_peak_above_it(monkeypatch, capsys, flags, lanes, isa):
    monkeypatch.setattr(peak, "cpu_info", lambda: {"threads": 2, "mhz": 2000.0, "flags": flags, "cpu_model": "x"})
    monkeypatch.setattr(peak, "max_clock_mhz", lambda: (2500.0, "cpufreq cpuinfo_max_freq"))
    monkeypatch.setattr(peak, "peak_flops_record", lambda dtype="float32": None)
    theory = 2 * 2500e6 * lanes * 2 * 2                     # the maximum clock, not the nominal 2000 MHz
    assert peak.hardware_peak_flops(verbose=True) == theory
    assert capsys.readouterr().out == (
        f"MFU denominator (hardware peak): 2 cores x 2.50 GHz (cpufreq cpuinfo_max_freq) x {lanes * 4} FLOP/cycle "
        f"({isa}: {lanes} fp32 lanes x 2 for FMA x 2 FMA units) = {theory / 1e9:.0f} GFLOP/s\n"
        f"  assumes: each logical CPU is a full core (no SMT sharing), that clock holds under {isa}, 2 FMA units "
        "per core\n")
    monkeypatch.setattr(peak, "peak_flops_record", lambda dtype="float32": {"flops": theory * 0.75})
    assert peak.hardware_peak_flops(verbose=True, fma_units=1) == theory * 0.75      # above theory / 2
    assert capsys.readouterr().out.endswith(
        f"  the measured MatMul peak {theory * 0.75 / 1e9:.0f} GFLOP/s is higher (turbo): it is used instead\n")
    assert peak.hardware_peak_flops() == theory and capsys.readouterr().out == ""     # below: the theory
    monkeypatch.setattr(peak, "peak_flops_record", lambda dtype="float32": {"flops": "fast"})
    assert peak.hardware_peak_flops(fma_units=1, device="CPU") == theory / 2


def test_hardware_peak_refusals_and_the_datasheet_line(monkeypatch, capsys):
    with pytest.raises(ValueError) as e:
        peak.hardware_peak_flops(device="TPU")
    assert str(e.value) == f"hardware_peak_flops: device='TPU' is unknown; fix: use CPU or one of {list(DATASHEET_PEAK_FLOPS)}"
    with pytest.raises(ValueError) as e:
        peak.hardware_peak_flops("float64", device="NVIDIA A100 SXM")
    figures = [k for k, x in DATASHEET_PEAK_FLOPS["NVIDIA A100 SXM"].items() if isinstance(x, float)]
    assert str(e.value) == f"hardware_peak_flops: NVIDIA A100 SXM has no float64 figure; fix: use one of {figures}"
    with pytest.raises(ValueError) as e:
        peak.hardware_peak_flops("bfloat16")
    assert str(e.value) == "hardware_peak_flops: dtype='bfloat16' on CPU is not modelled; fix: use float32"
    monkeypatch.setattr(peak, "max_clock_mhz", lambda: (None, "/proc/cpuinfo cpu MHz"))
    with pytest.raises(ValueError) as e:
        peak.hardware_peak_flops()
    assert str(e.value) == "hardware_peak_flops: the CPU reports no clock; fix: pass device= with a datasheet entry"
    assert peak.hardware_peak_flops("bfloat16", device="NVIDIA A100 SXM", verbose=True) == 312e12
    assert capsys.readouterr().out == (f"MFU denominator: NVIDIA A100 SXM datasheet bfloat16 peak 312.0 TFLOP/s "
                                       f"({DATASHEET_PEAK_FLOPS['NVIDIA A100 SXM']['source']})\n")


def test_peak_flops_record_and_cache_rules_exactly(tmp_path, monkeypatch, capsys):
    """The measurement is patched (figures per shape fixed), so every field and cache rule is exact."""
    import json
    cache = tmp_path / "sub" / "peak.json"            # a folder that does not exist yet is created
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(cache))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(peak, "cpu_info", lambda: {"cpu_model": "Test CPU", "cpu_family": "6", "threads": 2})
    monkeypatch.setattr(peak, "_UNCACHED", {})
    monkeypatch.setattr(peak, "_load_snapshot", lambda: {"load_1min": 0.5, "competing": []})
    calls = []

    def fake(m, k, n, repeats, dtype):
        calls.append((m, k, n, repeats, dtype))
        return {(8, 8, 8): 12.344e9, (16, 16, 16): 50.126e9, (4, 4, 4): 7.0e9}[(m, k, n)]
    monkeypatch.setattr(peak, "_measure_matmul_chain", fake)
    monkeypatch.setattr(peak, "measured_clock_mhz", lambda: (3210.5, "measured: a dependent-add chain, best of 5"))
    shapes = ((8, 8, 8), (16, 16, 16), (4, 4, 4))
    got = peak.peak_flops(repeats=3, shapes=shapes, verbose=True)
    assert got == 50.13e9                               # the best shape, rounded to 0.01 GFLOP/s
    assert calls == [(8, 8, 8, 3, "float32"), (16, 16, 16, 3, "float32"), (4, 4, 4, 3, "float32")]
    assert capsys.readouterr().out == ("  MatMul (8x8)@(8x8) compiled: 12.3 GFLOP/s\n"
                                       "  MatMul (16x16)@(16x16) compiled: 50.1 GFLOP/s\n"
                                       "  MatMul (4x4)@(4x4) compiled: 7.0 GFLOP/s\n")
    key = "Test CPU|family 6|2 threads|CPU|float32"
    stored = json.loads(cache.read_text())
    assert list(stored) == [key]
    rec = stored[key]
    assert rec.pop("date")[:2] == "20" and 0 <= rec.pop("measure_s") < 5
    assert rec == {"flops": 50.13e9, "dtype": "float32", "device": "CPU", "cpu_model": "Test CPU", "cpu_family": "6",
                   "threads": 2, "omp_num_threads": "3", "method": peak.PEAK_METHOD, "repeats": 3,
                   "shapes": [{"m": 8, "k": 8, "n": 8, "gflops": 12.34}, {"m": 16, "k": 16, "n": 16, "gflops": 50.13},
                              {"m": 4, "k": 4, "n": 4, "gflops": 7.0}],
                   "cores": os.cpu_count(), "load_1min_before": 0.5, "load_1min_after": 0.5, "competing_before": [],
                   "competing_after": [], "loaded": False, "attempts": 1, "clock_mhz": 3210.5}
    assert peak.peak_flops_record()["flops"] == 50.13e9 and peak.peak_flops_record("float16") is None
    assert peak._cached_clock_mhz() == 3210.5           # every later process reads this clock
    assert [p.name for p in cache.parent.iterdir()] == ["peak.json"]        # no temp file left
    # cached: no measurement, whatever shapes are asked for; refresh measures again
    calls.clear()
    assert peak.peak_flops(shapes=((4, 4, 4),)) == 50.13e9 and calls == []
    assert peak.peak_flops(refresh=True, repeats=1, shapes=((4, 4, 4),)) == 7.0e9
    assert calls == [(4, 4, 4, 1, "float32")] and capsys.readouterr().out == ""
    # another dtype is its own record beside the first; a record without a usable figure is measured again
    assert peak.peak_flops(dtype="float16", shapes=((8, 8, 8),)) == 12.34e9
    stored = json.loads(cache.read_text())
    assert sorted(stored) == [key.replace("float32", "float16"), key] and stored[key]["flops"] == 7.0e9
    for bad in (0, -1.0, "50e9", None, math.inf):            # (json writes inf as Infinity and reads it back)
        stored[key]["flops"] = bad
        cache.write_text(json.dumps(stored))
        calls.clear()
        with pytest.warns(UserWarning, match=f"is not used: flops={bad!r} is not a measured figure"):
            assert peak.peak_flops(shapes=((16, 16, 16),)) == 50.13e9 and len(calls) == 1, bad
        stored = json.loads(cache.read_text())
    # unreadable cache: measured and rewritten; the record reader says None
    cache.write_text("{torn")
    assert peak.peak_flops_record() is None
    with pytest.warns(UserWarning, match="unreadable"):
        assert peak.peak_flops(shapes=((8, 8, 8),)) == 12.34e9 and list(json.loads(cache.read_text())) == [key]
    with pytest.raises(ValueError) as e:
        peak.peak_flops(dtype="int8")
    assert str(e.value) == "peak_flops: dtype='int8' is invalid; fix: float32, float16 or bfloat16"


def test_peak_key_reads_the_device_from_mindspore_only_when_it_is_imported(monkeypatch):
    import sys
    import types
    monkeypatch.setattr(peak, "cpu_info", lambda: {"cpu_model": "M", "cpu_family": "25", "threads": 4})
    fake = types.SimpleNamespace(get_context=lambda k: {"device_target": "Ascend"}[k])
    monkeypatch.setitem(sys.modules, "mindspore", fake)
    assert peak._peak_key("float16") == ({"cpu_model": "M", "cpu_family": "25", "threads": 4}, "Ascend",
                                            "M|family 25|4 threads|Ascend|float16")
    fake.get_context = lambda k: None                 # no target set: CPU
    assert peak._peak_key("float32")[1:] == ("CPU", "M|family 25|4 threads|CPU|float32")

    def broken(k):
        raise RuntimeError("no context")
    fake.get_context = broken                        # a context that cannot answer: the cache still can
    assert peak._peak_key("float32")[1] == "CPU"
    monkeypatch.delitem(sys.modules, "mindspore")
    assert peak._peak_key("bfloat16")[1:] == ("CPU", "M|family 25|4 threads|CPU|bfloat16")


def test_theoretical_peak_prints_the_clock_in_ghz_to_two_decimals(monkeypatch, capsys):
    monkeypatch.setattr(peak, "cpu_info", lambda: {"threads": 1, "mhz": 2996.0, "flags": {"sse2"}, "cpu_model": "x"})
    assert theoretical_peak_flops() == 2996e6 * 4 * 2 * 2            # 1 core x 2.996 GHz x 4 lanes x 2 x 2 units
    assert capsys.readouterr().out.startswith("theoretical fp32 peak = 1 cores x 3.00 GHz x 16 FLOP/cycle "
                                              "(SSE: 4 lanes x 2 for FMA x 2 FMA units) = 48 GFLOP/s\n")


@pytest.mark.parametrize("shape, pairs", [((256, 256, 256), 8),      # 4 * 256^3 = 67.1 MFLOP a pair: capped at 8
                                          ((1024, 512, 1000), 8),    # 2.097 GFLOP: 2e10 // that = 9, capped at 8
                                          ((1024, 1024, 1024), 4),   # 4.295 GFLOP: 4 pairs
                                          ((2048, 2048, 1024), 1),   # 17.2 GFLOP: 1
                                          ((4096, 4096, 4096), 1)])  # 275 GFLOP: still 1, never 0
def test_the_matmul_chain_plan_counts_two_matmuls_a_pair_at_about_20_gflop(shape, pairs):
    from mshelpers.peak import _matmul_chain_plan
    m, k, n = shape
    assert _matmul_chain_plan(m, k, n) == (pairs, 4 * m * k * n)


def test_the_matmul_chain_inputs_are_scaled_by_fan_in_in_the_asked_dtype():
    import mindspore as ms
    import numpy as np
    from mshelpers.peak import _matmul_chain_inputs
    x, b, c = _matmul_chain_inputs(64, 400, 100, "float16")
    assert [t.shape for t in (x, b, c)] == [(64, 400), (400, 100), (100, 400)]
    assert all(t.dtype == ms.float16 for t in (x, b, c))
    stds = [float(np.std(t.asnumpy().astype(np.float64))) for t in (x, b, c)]
    assert stds[0] == pytest.approx(1.0, rel=0.05)
    assert stds[1] == pytest.approx(1 / 20, rel=0.05) and stds[2] == pytest.approx(1 / 10, rel=0.05)   # 1/sqrt(k), 1/sqrt(n)


def test_peak_flops_defaults_rounding_date_folders_and_file_layout(tmp_path, monkeypatch, capsys):
    import json
    cache = tmp_path / "a" / "b" / "peak.json"           # two missing folders
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(cache))
    monkeypatch.setattr(peak, "cpu_info", lambda: {"cpu_model": "C", "cpu_family": "6", "threads": 1})
    monkeypatch.setattr(peak, "_load_snapshot", lambda: {"load_1min": 0.0, "competing": []})   # idle
    monkeypatch.setattr(peak, "_UNCACHED", {})
    calls = []

    def fake(m, k, n, repeats, dtype):
        calls.append((repeats, dtype))
        # a hair above x.xx5 and x.x5: rounding by 1e9 and by 1e9 + 1 would differ
        return {(1, 1, 1): 12.345000005e9, (2, 2, 2): 12.350000005e9}[(m, k, n)]
    monkeypatch.setattr(peak, "_measure_matmul_chain", fake)
    got = peak.peak_flops(shapes=((1, 1, 1), (2, 2, 2)), verbose=True, dtype="bfloat16")
    assert calls == [(5, "bfloat16"), (5, "bfloat16")]                  # 5 repeats by default; bfloat16 accepted
    assert got == 12.35e9 and capsys.readouterr().out == ("  MatMul (1x1)@(1x1) compiled: 12.3 GFLOP/s\n"
                                                           "  MatMul (2x2)@(2x2) compiled: 12.4 GFLOP/s\n")
    text = cache.read_text()
    stored = json.loads(text)
    assert text == json.dumps(stored, indent=1)                         # the layout people read and diff
    rec = stored["C|family 6|1 threads|CPU|bfloat16"]
    assert [s["gflops"] for s in rec["shapes"]] == [12.35, 12.35] and rec["date"].endswith("+00:00")   # UTC
    rec["flops"] = 0.5                                                  # tiny but positive: a figure, kept
    cache.write_text(json.dumps(stored))
    calls.clear()
    assert peak.peak_flops(dtype="bfloat16") == 0.5 and calls == []


def test_hardware_peak_at_a_measured_peak_equal_to_the_theory_and_an_odd_clock(monkeypatch, capsys):
    monkeypatch.setattr(peak, "cpu_info", lambda: {"threads": 1, "mhz": 2000.0, "flags": set(), "cpu_model": "x"})
    monkeypatch.setattr(peak, "max_clock_mhz", lambda: (2996.0, "/proc/cpuinfo cpu MHz"))
    theory = 2996e6 * 4 * 2 * 2
    monkeypatch.setattr(peak, "peak_flops_record", lambda dtype="float32": {"flops": theory})
    assert peak.hardware_peak_flops(verbose=True) == theory
    out = capsys.readouterr().out
    assert "1 cores x 3.00 GHz (/proc/cpuinfo cpu MHz)" in out and "turbo" not in out   # equal is not higher


def test_zen4_runs_avx512_on_256_bit_units_and_others_do_not():
    from mshelpers.peak import fp32_fma_lanes
    zen4 = {"flags": {"avx512f", "fma"}, "vendor": "AuthenticAMD", "cpu_family": "25"}
    assert fp32_fma_lanes(zen4) == (8, "AVX-512 on 256-bit units (Zen 4)")
    assert fp32_fma_lanes({**zen4, "cpu_family": "26"}) == (16, "AVX-512")               # Zen 5: full width
    assert fp32_fma_lanes({**zen4, "vendor": "GenuineIntel", "cpu_family": "6"}) == (16, "AVX-512")
    assert fp32_fma_lanes({"flags": {"fma"}, "vendor": "AuthenticAMD", "cpu_family": "25"}) == (8, "AVX2+FMA")
    assert fp32_fma_lanes({}) == (4, "SSE") and fp32_fma_lanes({"flags": None, "cpu_family": 25}) == (4, "SSE")


def test_the_hardware_peak_of_a_zen4_counts_32_flop_per_cycle(monkeypatch, capsys):
    monkeypatch.setattr(peak, "cpu_info", lambda: {"threads": 2, "mhz": 2600.0, "flags": {"avx512f", "fma"},
                                                       "cpu_model": "AMD EPYC", "vendor": "AuthenticAMD",
                                                       "cpu_family": "25"})
    monkeypatch.setattr(peak, "max_clock_mhz", lambda: (3650.0, "measured: a dependent-add chain, best of 5"))
    monkeypatch.setattr(peak, "peak_flops_record", lambda dtype="float32": {"flops": 217e9})
    assert peak.hardware_peak_flops(verbose=True) == 2 * 3650e6 * 32      # 233.6 GFLOP/s, above the 217 measured
    assert "x 32 FLOP/cycle (AVX-512 on 256-bit units (Zen 4): 8 fp32 lanes" in capsys.readouterr().out


def _fake_cc(tmp_path, body):
    """A stand-in C compiler: ignores its input and writes, at its -o path, a shell script with `body`."""
    cc = tmp_path / "fakecc"
    cc.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && out=$2; shift; done\ncat >/dev/null\n"
                  f"printf '#!/bin/sh\\n%s\\n' '{body}' > \"$out\" && chmod +x \"$out\"\n")
    cc.chmod(0o755)
    return str(cc)


def test_the_clock_probe_finds_cc_or_gcc_builds_at_O1_keeps_the_compilers_words_and_takes_100_to_10000_mhz(
        tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("CC", raising=False)
    for name, out in (("cc", "100"), ("gcc", "10000"), ("cc", "99.99"), ("gcc", "10000.01")):
        d = tmp_path / f"{name}-{out}"
        d.mkdir()
        # a compiler on a PATH that holds nothing else: it notes its arguments, warns on stderr (as compilers do),
        # and writes at its -o path a probe that prints `out`
        (d / name).write_text("#!/bin/sh\necho \"$@\" > \"${0%/*}/args\"\necho 'warning: a warning' >&2\n"
                              "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && o=$2; shift; done\n/bin/cat >/dev/null\n"
                              f"printf '#!/bin/sh\\necho {out}\\n' > \"$o\" && /bin/chmod +x \"$o\"\n")
        (d / name).chmod(0o755)
        monkeypatch.setenv("PATH", str(d))
        monkeypatch.setattr(peak, "_CLOCK_PROBE", {})
        got = peak.measured_clock_mhz()
        mhz = float(out)
        assert got == ((mhz, "measured: a dependent-add chain, best of 5") if 100 <= mhz <= 10_000 else
                       (None, f"the clock probe read {mhz:.0f} MHz, outside 100 MHz - 10 GHz")), (name, out)
        assert (d / "args").read_text().split()[:4] == ["-O1", "-x", "c", "-"]    # the chain needs the optimizer
        assert capfd.readouterr() == ("", "")                                       # its words stay in the probe


def test_the_measured_clock_is_a_real_compiled_probe_on_this_cpu(monkeypatch):
    monkeypatch.setattr(peak, "_CLOCK_PROBE", {})
    mhz, where = peak.measured_clock_mhz()
    assert where == "measured: a dependent-add chain, best of 5"
    listed = peak._cpuinfo_max_mhz()
    assert 100 <= mhz <= 10_000 and (listed is None or mhz >= 0.5 * listed), (mhz, listed)
    assert peak.measured_clock_mhz() == (mhz, where)                     # once per process


def test_the_clock_probe_fails_in_one_line_and_is_never_a_number(tmp_path, monkeypatch):
    import tempfile

    def probe(**env):
        monkeypatch.setattr(peak, "_CLOCK_PROBE", {})
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return peak.measured_clock_mhz()
    empty, path = tmp_path / "empty", os.environ["PATH"]
    empty.mkdir()
    monkeypatch.delenv("CC", raising=False)
    assert probe(PATH=str(empty)) == (None, "no C compiler (cc, gcc or $CC) to build the clock probe")
    monkeypatch.setenv("PATH", path)
    assert probe(CC="false") == (None, "the clock probe failed (CalledProcessError)")       # the compiler fails
    assert probe(CC=_fake_cc(tmp_path, "echo fast")) == (None, "the clock probe failed (ValueError)")
    assert probe(CC=_fake_cc(tmp_path, "echo")) == (None, "the clock probe failed (IndexError)")       # no output
    assert probe(CC=_fake_cc(tmp_path, "echo 99999.0")) == (None, "the clock probe read 99999 MHz, outside 100 MHz - 10 GHz")
    assert probe(CC=_fake_cc(tmp_path, "kill -9 $$")) == (None, "the clock probe failed (CalledProcessError)")  # killed
    assert probe(CC=_fake_cc(tmp_path, "echo 3000.5")) == (3000.5, "measured: a dependent-add chain, best of 5")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))        # no room for the probe (a full disk)
    assert probe() == (None, "the clock probe failed (FileNotFoundError)")


@pytest.mark.parametrize("clock, want", [(3333.3, 3333.3), (4000, 4000.0), ("fast", None), (True, None),
                                         (1e9, None), (float("nan"), None), (None, None), ("absent", None)])
def test_the_cached_clock_is_used_only_when_plausible_and_from_this_machine(tmp_path, monkeypatch, clock, want):
    import json
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(tmp_path / "peak.json"))
    info, _, key = peak._peak_key("float32")
    rec = {"flops": 2e11, "cpu_model": info["cpu_model"], "threads": info["threads"], "load_1min_before": 0.1,
           "load_1min_after": 0.1, "competing_before": [], "competing_after": [], "loaded": False}
    if clock != "absent":
        rec["clock_mhz"] = clock
    (tmp_path / "peak.json").write_text(json.dumps({key: rec}))
    assert peak._cached_clock_mhz() == want
    (tmp_path / "peak.json").write_text(json.dumps({key: {**rec, "loaded": True}}))     # taken under load
    assert peak._cached_clock_mhz() is None
    (tmp_path / "peak.json").write_text(json.dumps({key: {**rec, "cpu_model": "another CPU"}}))
    assert peak._cached_clock_mhz() is None
    (tmp_path / "peak.json").write_text("{trunc")                                     # a corrupt cache
    assert peak._cached_clock_mhz() is None


def test_two_processes_measure_the_clock_at_once_on_a_busy_machine(tmp_path):
    """Two probes at once while a busy loop holds each core: timed in CPU time, each reads the clock, not the share
    of a core it got (timed in wall time, one read 1,804 MHz against 3,663 in a CI run with 2 test workers)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "from mshelpers.peak import measured_clock_mhz as m; print(m()[0])"
    alone = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                                 timeout=120).stdout)
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
                 for _ in range(2)]
        got = [float(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for b in burn:
            b.kill()
            b.wait()
    assert 100 <= alone <= 10_000 and all(0.8 * alone <= g <= 1.25 * alone for g in got), (alone, got)


def test_max_clock_takes_a_cpufreq_of_one_khz_as_it_is(monkeypatch):
    import io
    monkeypatch.setattr(peak, "open", lambda p, *a, **k: io.StringIO("cpu MHz\t\t: 2300.000\n"), raising=False)
    monkeypatch.setattr(peak, "Path", _FakePath("1\n"))
    assert peak.max_clock_mhz() == (0.001, "cpufreq cpuinfo_max_freq")


def test_the_matmul_chain_measures_flop_per_second_not_flop_seconds():
    """A real compiled chain of small MatMuls on this CPU: FLOPs over the best time lands between 0.1 GFLOP/s
    (far below any CPU that runs MindSpore) and 10 TFLOP/s (far above a laptop's peak); FLOPs times the
    time, or the time over FLOPs, lands nowhere near."""
    from mshelpers.peak import _measure_matmul_chain
    flops = _measure_matmul_chain(128, 128, 128, 3, "float32")
    assert 1e8 < flops < 1e13, flops


def test_the_peak_cache_path_env_then_repo_then_copied_alone_then_cwd(monkeypatch, tmp_path):
    from mshelpers.peak import _peak_cache_path
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(tmp_path / "mine.json"))
    monkeypatch.setenv("MSHELPERS_BUILD", str(tmp_path / "b"))
    assert _peak_cache_path() == tmp_path / "mine.json"
    monkeypatch.delenv("MSHELPERS_PEAK_CACHE")
    assert _peak_cache_path() == tmp_path / "b" / "peak_flops.json"
    monkeypatch.delenv("MSHELPERS_BUILD")
    repo, alone, elsewhere = tmp_path / "repo", tmp_path / "alone", tmp_path / "cwd"
    for d in (repo / "mshelpers", alone, elsewhere):
        d.mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    (alone / "pyproject.toml").write_text("")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(peak, "__file__", str(repo / "mshelpers" / "peak.py"))     # inside the cookbook
    assert _peak_cache_path() == repo / "build" / "peak_flops.json"
    monkeypatch.setattr(peak, "__file__", str(alone / "peak.py"))                  # copied into a project
    assert _peak_cache_path() == alone / "build" / "peak_flops.json"
    (alone / "pyproject.toml").unlink()
    assert _peak_cache_path() == elsewhere / "build" / "peak_flops.json"                  # nothing: ./build


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R): Gold 6000 @ 2.30GHz
cpu MHz\t\t: 2300.000
flags\t\t: fpu sse avx2 avx512f

processor\t: 1
cpu family\t: 7
model name\t: Other
cpu MHz\t\t: 1200.000
flags\t\t: fpu
"""


def test_cpu_info_takes_the_first_processors_fields_from_cpuinfo(monkeypatch):
    import builtins
    import io
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(CPUINFO)
                        if str(path) == "/proc/cpuinfo" else real_open(path, *a, **k))
    assert peak.cpu_info() == {"cpu_model": "Intel(R) Xeon(R): Gold 6000 @ 2.30GHz", "cpu_family": "6",
                                  "threads": peak._threads(), "flags": {"fpu", "sse", "avx2", "avx512f"},
                                  "mhz": 2300.0, "vendor": "GenuineIntel"}


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0c

processor\t: 1
BogoMIPS\t: 50.00
"""


def test_an_arm_cpuinfo_names_no_vendor_family_or_flags(monkeypatch):
    """aarch64's /proc/cpuinfo (a Neoverse N1's, cut) has no vendor_id, cpu family, model name or flags lines."""
    import builtins
    import io
    import platform
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO(ARM_CPUINFO)
                        if str(path) == "/proc/cpuinfo" else real_open(path, *a, **k))
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert peak.cpu_info() == {"cpu_model": "aarch64", "cpu_family": None, "threads": peak._threads(),
                               "flags": set(), "mhz": None, "vendor": None}


def test_without_proc_the_platform_answers(monkeypatch):
    import builtins
    import platform
    real_open = builtins.open

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc"):
            raise OSError("no /proc here")
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert peak.cpu_info() == {"cpu_model": "arm64", "cpu_family": None, "threads": peak._threads(),
                                  "flags": set(), "mhz": None, "vendor": None}
    monkeypatch.setattr(platform, "machine", lambda: "")
    assert peak.platform_processor() == "unknown"
    monkeypatch.delattr(os, "sched_getaffinity")                   # macOS has no affinity call
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert peak._threads() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert peak._threads() == 1



def test_competing_processes_shares_exactly_from_two_scripted_reads(monkeypatch):
    """Two /proc reads scripted: a tick of 1/3 s, 0.5 s apart, so a process's share of a core is its new ticks
    / 3 / 0.5. This process, its two children and their descendants (one new) are left out; the rest are listed
    above min_share, busiest first, ties by pid."""
    from types import SimpleNamespace
    me, b = os.getpid(), 4_000_000           # pids above any real one here (pid_max is 4,194,304)
    first = {me: ("python", 1, 1000), b + 50: ("kid", me, 0), b + 52: ("kid2", me, 0), b + 51: ("grandkid", b + 50, 0),
             b + 60: ("busy", 1, 100), b + 61: ("light", 1, 5), b + 62: ("edge", 1, 7), b + 63: ("tie", 1, 10)}
    second = {me: ("python", 1, 1009), b + 50: ("kid", me, 9), b + 52: ("kid2", me, 9), b + 51: ("grandkid", b + 50, 9),
              b + 60: ("busy", 1, 106), b + 61: ("light", 1, 5), b + 62: ("edge", 1, 10), b + 63: ("tie", 1, 14),
              b + 70: ("new", 1, 4), b + 71: ("newkid", b + 51, 9)}
    reads, clock = iter([first, second]), iter([100.0, 100.5])
    monkeypatch.setattr(peak, "_proc_cpu", lambda: next(reads))
    monkeypatch.setattr(peak, "time", SimpleNamespace(monotonic=lambda: next(clock), sleep=lambda s: None))
    monkeypatch.setattr(peak.os, "sysconf", lambda name: 3 if name == "SC_CLK_TCK" else os.sysconf(name))
    rows = peak.competing_processes(interval=0.5, min_share=2.0)
    # busy 6 ticks: 6 / 3 / 0.5 = 4.0; tie and new (all 4 of its ticks are new) 4 / 3 / 0.5 = 2.67; edge 3 ticks
    # = 2.0, not above 2.0; light 0; the kids, the grandkid and its new child 6.0 each, but they are ours
    assert rows == [{"name": "busy", "pid": b + 60, "core_share": 4.0},
                    {"name": "tie", "pid": b + 63, "core_share": 2.67},
                    {"name": "new", "pid": b + 70, "core_share": 2.67}]


def test_competing_processes_refuses_a_bad_share_or_interval_in_one_line():
    for kw, shown in (({"min_share": -0.1}, "min_share=-0.1"), ({"interval": float("inf")}, "interval=inf"),
                      ({"min_share": True}, "min_share=True"), ({"interval": "1"}, "interval='1'")):
        with pytest.raises(ValueError) as e:
            peak.competing_processes(**kw)
        assert str(e.value) == f"competing_processes: {shown} is invalid; fix: pass a number >= 0"
    assert isinstance(peak.competing_processes(interval=0, min_share=0), list)      # zero is a valid share and wait


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_proc_cpu_reads_a_name_with_parentheses_the_parent_and_user_plus_system_ticks(monkeypatch):
    # a child names itself "a) b (c" (its /proc comm), so the name must be taken from the first "(" to the last ")"
    child = subprocess.Popen([sys.executable, "-c", "open('/proc/self/comm', 'w').write('a) b (c'); "
                              "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and (peak._proc_cpu().get(child.pid, ("",))[0] != "a) b (c"):
            time.sleep(0.05)
        # a pid that ended between the listing and the read is skipped, and the rest still read
        real = os.listdir
        monkeypatch.setattr(peak.os, "listdir", lambda p: ["4194000", *real(p)] if p == "/proc" else real(p))
        got = peak._proc_cpu()
        assert got[child.pid][:2] == ("a) b (c", os.getpid())
        tick = os.sysconf("SC_CLK_TCK")
        while os.times().system * tick <= 6 and time.time() < deadline + 20:     # system time (a forked test
            real("/proc")                                                       # process starts at zero)
        before = os.times()
        got = peak._proc_cpu()
        after = os.times()
        assert before.system * tick > 6, "this process spent too little system time to tell user+system from user-system"
        # utime + stime in clock ticks, read between the two os.times() (a tick of rounding either side)
        assert (before.user + before.system) * tick - 1 <= got[os.getpid()][2] <= (after.user + after.system) * tick + 1
    finally:
        child.kill()
        child.wait()


def test_load_snapshot_rounds_the_1_minute_load_and_gives_none_without_one(monkeypatch):
    monkeypatch.setattr(peak, "competing_processes", lambda: [])
    monkeypatch.setattr(peak.os, "getloadavg", lambda: (1.23456, 5.0, 6.0))
    assert peak._load_snapshot() == {"load_1min": 1.23, "competing": []}

    def no_load():
        raise OSError("no load average here")
    monkeypatch.setattr(peak.os, "getloadavg", no_load)
    assert peak._load_snapshot() == {"load_1min": None, "competing": []}


@pytest.mark.parametrize("clock, got", [(100, 100.0), (10_000, 10_000.0), (99.99, None), (10_000.01, None),
                                        (True, None), ("4000", None)])
def test_a_cached_clock_is_used_only_between_100_and_10000_mhz(monkeypatch, clock, got):
    class AnyKey(dict):
        def get(self, key, default=None):
            return {"clock_mhz": clock}
    monkeypatch.setattr(peak, "_read_peak_cache", lambda path, note=False: AnyKey())
    monkeypatch.setattr(peak, "_peak_entry_problem", lambda rec, info: None)
    assert peak._cached_clock_mhz() == got


@pytest.mark.skipif(not os.path.isfile("/proc/cpuinfo"), reason="reads /proc/cpuinfo (Linux)")
def test_cpuinfo_max_mhz_is_the_highest_cpu_mhz_line():
    import re
    listed = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([0-9.]+)\s*$", open("/proc/cpuinfo").read(), re.M)]
    assert peak._cpuinfo_max_mhz() == (max(listed) if listed else None)


def test_the_peak_cache_is_written_readable_by_all_and_a_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    import stat
    path = tmp_path / "cache" / "peak.json"
    peak._write_peak_cache(path, "a", {"flops": 1.0})
    peak._write_peak_cache(path, "b", {"flops": 2.0})                 # the other entries kept
    assert json.loads(path.read_text()) == {"a": {"flops": 1.0}, "b": {"flops": 2.0}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644                 # a shared cache: others on the machine read it
    assert sorted(p.name for p in path.parent.iterdir()) == ["peak.json"]

    def full(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(peak.os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        peak._write_peak_cache(path, "c", {"flops": 3.0})
    assert sorted(p.name for p in path.parent.iterdir()) == ["peak.json"]     # the temp file removed, nothing lost
    assert json.loads(path.read_text()) == {"a": {"flops": 1.0}, "b": {"flops": 2.0}}


def test_the_load_rule_at_its_edges():
    """Exactly 20 % of a core together is not loaded ("more than"); exactly three busy processes are all named,
    with no "and 0 more"."""
    at_edge = [{"name": "a", "pid": 1, "core_share": 0.1}, {"name": "b", "pid": 2, "core_share": 0.1}]
    assert sum(r["core_share"] for r in at_edge) == peak.PEAK_BUSY_SHARE
    assert peak._load_reasons("before", {"load_1min": None, "competing": at_edge}, 2, 2) == []
    three = [{"name": f"p{i}", "pid": i, "core_share": 0.1} for i in range(3)]
    assert peak._load_reasons("after", {"load_1min": None, "competing": three}, 2, 2) == [
        "after: p0 (pid 0) at 10% of a core, p1 (pid 1) at 10% of a core, p2 (pid 2) at 10% of a core"]


def test_max_clock_takes_the_listed_clock_when_the_measured_one_only_equals_it(monkeypatch):
    import io
    monkeypatch.setattr(peak, "open", lambda p, *a, **k: io.StringIO("cpu MHz\t\t: 3100.0\n"), raising=False)
    monkeypatch.setattr(peak, "Path", _FakePath(OSError("no cpufreq")))
    monkeypatch.setattr(peak, "_cached_clock_mhz", lambda: 3100.0)
    assert peak.max_clock_mhz() == (3100.0, "/proc/cpuinfo cpu MHz")


def test_reading_the_cache_for_a_clock_or_a_record_says_nothing_about_a_damaged_file(tmp_path, monkeypatch):
    """Only peak_flops(), which measures again, names an unreadable cache; the readers beside it stay quiet
    (they are called from max_clock_mhz and every MFU)."""
    import warnings
    cache = tmp_path / "peak.json"
    cache.write_text("{not json")
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(cache))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert peak._cached_clock_mhz() is None
        assert peak.peak_flops_record() is None
    assert [str(w.message) for w in caught] == []


def test_the_cache_is_written_through_a_temp_file_beside_it_not_in_the_system_temp_folder(tmp_path, monkeypatch):
    """A rename is atomic only within one file system: the temp file goes next to the cache."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))
    path = tmp_path / "cache" / "peak.json"
    peak._write_peak_cache(path, "a", {"flops": 1.0})
    assert json.loads(path.read_text()) == {"a": {"flops": 1.0}}
