"""mshelpers.memory_probe: a function's peak memory measured in a fresh process (measure_peak, measure_peaks),
the child's body, and the workloads (allocate_bytes, train_for_peak)."""
from __future__ import annotations

import os

import pytest

from mshelpers import memory_probe
from mshelpers.config import RunConfig
from mshelpers.memory_probe import measure_peak


# Named without "measure_peak": `make mutate` deselects those (their RSS figures are mutmut's under it), and
# these run in mutmut's runner too. None of them asserts an RSS size.
def test_a_function_a_fresh_process_cannot_import_is_refused_before_a_process_starts():
    with pytest.raises(ValueError, match="lambda"):
        measure_peak(lambda: 1)

    def local():
        return 1
    with pytest.raises(ValueError, match="closure"):
        measure_peak(local)
    with pytest.raises(ValueError, match="fn=3 is not callable; fix"):
        measure_peak(3)
    with pytest.raises(ValueError, match="__main__"):
        measure_peak(type("F", (), {"__call__": lambda self: 1, "__module__": "__main__"})())



@pytest.mark.parametrize("parallel", [0, -1, True, 1.5, "2"])
def test_peaks_in_parallel_need_a_positive_integer(parallel):
    with pytest.raises(ValueError, match=f"parallel={parallel!r} is invalid; fix: pass a positive integer"):
        memory_probe.measure_peaks(memory_probe.allocate_bytes, [(1,)], parallel=parallel)



def test_peaks_in_parallel_accept_one_at_a_time():
    assert memory_probe.measure_peaks(memory_probe.allocate_bytes, [], parallel=1) == []     # nothing to spawn
    assert memory_probe.measure_peaks(memory_probe.allocate_bytes, []) == []



def test_allocate_bytes_touches_what_it_is_asked_and_holds():
    import time
    t0 = time.perf_counter()
    assert memory_probe.allocate_bytes(0) == 0 and memory_probe.allocate_bytes(10_000) == 10_000
    assert time.perf_counter() - t0 < 0.5                               # no hold by default
    t0 = time.perf_counter()
    assert memory_probe.allocate_bytes(4096, hold_s=0.2) == 4096
    assert time.perf_counter() - t0 >= 0.2
    with pytest.raises(ValueError):
        memory_probe.allocate_bytes(-1)



def test_the_child_body_preloads_then_measures_the_work_alone(tmp_path, monkeypatch):
    import functools
    import sys
    name = f"msh_preload_probe_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert name not in sys.modules
    out = memory_probe._peak_child(memory_probe.allocate_bytes, (64 * 2**20,), {"hold_s": 0.05}, (name,))
    assert name in sys.modules                                      # preloaded before the baseline
    assert set(out) == {"value", "wall_s", "baseline", "peak_rss", "device_peak"}
    assert out["value"] == 64 * 2**20 and 0.05 <= out["wall_s"] < 1.5     # pages touched 4 KiB apart
    assert 0 < out["baseline"] <= out["peak_rss"]
    assert out["device_peak"] == (0 if "mindspore" in sys.modules else None)     # CPU: no device pool
    # the baseline is the current RSS, the peak the high-water mark: after a freed 256 MiB they differ by it
    memory_probe.allocate_bytes(256 * 2**20)
    out = memory_probe._peak_child(memory_probe.allocate_bytes, (2**20,), {}, ())
    assert out["baseline"] < out["peak_rss"] - 200 * 2**20
    monkeypatch.delitem(sys.modules, "mindspore", raising=False)     # a process that never imported MindSpore
    assert memory_probe._peak_child(memory_probe.allocate_bytes, (1,), {}, ())["device_peak"] is None
    with pytest.raises(ModuleNotFoundError):
        memory_probe._peak_child(memory_probe.allocate_bytes, (1,), {}, ("msh_no_such_module_anywhere",))
    # quiet sends the child's stdout and stderr to /dev/null (fds 1 and 2 put back here afterwards)
    where = lambda: (os.readlink("/proc/self/fd/1"), os.readlink("/proc/self/fd/2"))
    assert memory_probe._peak_child(where, (), {}, ())["value"] != (os.devnull, os.devnull)      # not quiet by default
    saved = os.dup(1), os.dup(2)
    try:
        got = memory_probe._peak_child(where, (), {}, (), quiet=True)["value"]
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    assert got == (os.devnull, os.devnull)



def test_a_peak_in_a_fresh_process_reports_every_field():
    import os
    r = memory_probe.measure_peak(memory_probe.allocate_bytes, 128 * 2**20, preload="json", hold_s=0.1)
    assert r.value == 128 * 2**20 and r.wall_s >= 0.1
    assert r.work_rss_bytes >= 0.95 * 128 * 2**20                        # every page touched, so resident
    assert r.source == "rss" and r.device_peak_bytes is None            # no MindSpore in the child
    assert r.peak_bytes == r.peak_rss_bytes >= r.baseline_rss_bytes > 0
    assert r.work_rss_bytes == r.peak_rss_bytes - r.baseline_rss_bytes
    assert memory_probe.measure_peak(os.getenv, "MSH_SPAWN_VAR", env={"MSH_SPAWN_VAR": "v"}).value == "v"
    with pytest.raises(TimeoutError, match="timeout=1.5s"):
        memory_probe.measure_peak(memory_probe.allocate_bytes, 1, hold_s=60, timeout=1.5)
    rs = memory_probe.measure_peaks(os.getenv, [("MSH_SPAWN_VAR",), ("HOME",)], parallel=2, env={"MSH_SPAWN_VAR": "w"})
    assert [x.value for x in rs] == ["w", os.environ.get("HOME")]



def test_train_for_peak_runs_the_config_and_returns_its_summary(capsys):
    from mshelpers.config import build_dir
    from mshelpers.table import read_csv
    cfg = RunConfig.preset("tiny").replace(mode="pynative", name="tfp")
    csv = build_dir("memory") / f"tfp-pynative-b{cfg.batch_size}-s{cfg.seq_len}-none-acc1.csv"
    csv.unlink(missing_ok=True)                                     # a file left by an earlier run proves nothing
    s = memory_probe.train_for_peak(cfg, peak_flops=1.0)             # 5 steps by default
    assert s["steps"] == 5 and s["run"] == "tfp" and s["mode"] == "pynative" and s["final_loss"] > 0
    assert s["mfu"] > 1e3                                           # measured against the given 1 FLOP/s
    assert [r["step"] for r in read_csv(csv)] == [1, 2, 3, 4, 5]
    assert "tfp pynative" not in capsys.readouterr().out            # no progress bar



def test_measure_peak_forwards_a_child_failure():
    with pytest.raises(RuntimeError, match="ValueError"):
        measure_peak(memory_probe.allocate_bytes, -1)          # bytearray(-1) raises in the child



def test_measure_peak_sees_an_allocation_in_a_fresh_process():
    n = 200 * 2**20
    r = measure_peak(memory_probe.allocate_bytes, n)
    assert r.value == n
    assert r.source == "rss" and r.device_peak_bytes is None    # no MindSpore touched
    assert r.work_rss_bytes >= n * 0.95
    assert r.peak_bytes == r.peak_rss_bytes >= r.baseline_rss_bytes + n * 0.95
    small = measure_peak(memory_probe.allocate_bytes, 1 * 2**20)
    assert small.work_rss_bytes < n / 2                          # a fresh process: no leftover peak



def test_measure_peaks_keeps_order_in_parallel():
    rs = memory_probe.measure_peaks(memory_probe.allocate_bytes, [(150 * 2**20,), (2**20,)], parallel=2)
    assert [r.value for r in rs] == [150 * 2**20, 2**20]
    assert rs[0].work_rss_bytes > rs[1].work_rss_bytes + 100 * 2**20
    with pytest.raises(ValueError, match="parallel=0"):
        memory_probe.measure_peaks(memory_probe.allocate_bytes, [(1,)], parallel=0)



def test_concurrent_measure_peaks_each_child_sees_its_own_env():
    # measure_peaks(parallel=2) spawns from two threads; each child must get its own env (notebook 06's
    # graph runs lost MS_DEV_SAVE_GRAPHS this way), and the parent's os.environ must stay untouched.
    import os
    for _ in range(3):
        rs = memory_probe.measure_peaks(os.getenv, [("MSH_TEST_VAR",)], parallel=1, env={"MSH_TEST_VAR": "solo"})
        assert rs[0].value == "solo"
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda v: measure_peak(os.getenv, "MSH_TEST_VAR", env={"MSH_TEST_VAR": v}).value,
                                ["a", "b"]))
        assert got == ["a", "b"]
        assert "MSH_TEST_VAR" not in os.environ



def test_pool_peak_reads_the_pool_a_fresh_mindspore_process_logged_and_it_grows_with_the_batch(tmp_path):
    peaks = {}
    for b in (2, 16):
        cfg = RunConfig.preset("tiny").replace(mode="pynative", batch_size=b, seq_len=128, name=f"pool{b}")
        r = measure_peak(memory_probe.train_for_peak, cfg, 1, preload=("mindspore",),
                         env=memory_probe.pool_log_env(tmp_path / f"b{b}"))
        peaks[b] = memory_probe.pool_peak(tmp_path / f"b{b}")
        assert 0 < peaks[b]["peak_used"] <= peaks[b]["actual_peak"] <= peaks[b]["allocated"]
        assert peaks[b]["actual_peak"] <= r.peak_rss_bytes          # the pool's touched part is inside the RSS
    assert peaks[16]["peak_used"] > 2 * peaks[2]["peak_used"]      # activations: 8x the batch
    with pytest.raises(FileNotFoundError, match="pool_log_env"):
        memory_probe.pool_peak(tmp_path / "empty")


def _status_bytes():
    """VmRSS and VmHWM of this process in bytes, read from /proc as the child body reads them."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                got[line.split(":")[0]] = int(line.split()[1]) * 1024
    return got


def test_the_child_body_reads_the_baseline_and_the_peak_in_bytes_and_passes_keyword_arguments():
    out = memory_probe._peak_child(_status_bytes, (), {}, ())
    seen = out["value"]                                   # read by fn, right after the baseline and before the peak
    assert abs(out["baseline"] - seen["VmRSS"]) < 16 * 2**20          # the same reading, KiB -> bytes exactly
    assert seen["VmHWM"] <= out["peak_rss"] < seen["VmHWM"] + 16 * 2**20
    assert out["baseline"] % 1024 == 0 and out["peak_rss"] % 1024 == 0
    assert memory_probe._peak_child(dict, (), {"a": 1, "b": 2}, ())["value"] == {"a": 1, "b": 2}


@pytest.mark.parametrize("device, peak, source", [(123, 123, "device"), (0, 500, "rss"), (None, 500, "rss")])
def test_the_headline_is_the_device_pools_peak_where_the_child_read_one(device, peak, source):
    """Ascend/GPU: the pool's peak; CPU (0, the API's answer there) or no MindSpore (None): peak RSS."""
    out = {"value": "v", "wall_s": 0.5, "baseline": 100, "peak_rss": 500, "device_peak": device}
    assert memory_probe._as_peak_memory(out) == memory_probe.PeakMemory(
        value="v", peak_bytes=peak, source=source, peak_rss_bytes=500, baseline_rss_bytes=100,
        device_peak_bytes=device, wall_s=0.5)


@pytest.mark.parametrize("target, want", [("Ascend", 123), ("GPU", 123), ("CPU", 0)])
def test_the_child_body_reads_the_device_pool_only_on_ascend_or_gpu(monkeypatch, target, want):
    """On this CPU machine the target is CPU; the Ascend/GPU branch is checked with the target it would report."""
    import mindspore as ms
    monkeypatch.setattr(ms, "get_context", lambda key: {"device_target": target}[key])
    monkeypatch.setattr(ms.runtime, "max_memory_allocated", lambda: 123.0)
    assert memory_probe._peak_child(int, (), {}, ())["device_peak"] == want


def test_pool_peak_reads_the_last_pool_line_of_any_log_file_whatever_its_bytes(tmp_path):
    line = "[INFO] PRE_ACT DumpDynamicMemPoolStateInfo] total allocated mem:{}M, peak used mem:{}M, " \
           "in used mem:0M, actual peak used mem:{}M"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "log.1").write_bytes(line.format(1, 1, 1).encode() + b"\n\xff\xfe not utf-8\n")
    (tmp_path / "a" / "log.2").write_bytes(b"\xff" + line.format(2, 2, 2).encode() + b"\n"
                                           + line.format(64, 10, 12).encode() + b"\nother\n")
    assert memory_probe.pool_peak(tmp_path) == {"allocated": 64 * 2**20, "peak_used": 10 * 2**20,
                                               "actual_peak": 12 * 2**20}          # the last line logged
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as e:
        memory_probe.pool_peak(tmp_path / "empty")
    assert str(e.value) == (f"pool_peak: no DumpDynamicMemPoolStateInfo line under {tmp_path / 'empty'}; fix: run "
                            "the process with env=pool_log_env(log_dir) and let it exit")
    assert memory_probe.pool_log_env(tmp_path) == {"GLOG_v": "1", "GLOG_logtostderr": "0", "GLOG_log_dir": str(tmp_path)}


_TOP_LAMBDA = lambda: 1   # noqa: E731 - a lambda at module level: no "<locals>" in its name, still refused


def test_a_lambda_or_a_main_callable_is_refused_with_the_exact_fix():
    fix = ("cannot be imported by a fresh process (defined in a notebook, a script's __main__, a lambda or a "
           "closure); fix: define it at the top level of a .py module and import it")
    with pytest.raises(ValueError) as e:
        measure_peak(_TOP_LAMBDA)
    assert str(e.value) == f"measure_peak: fn='<lambda>' {fix}"
    main = type("F", (), {"__call__": lambda self: 1, "__module__": "__main__", "__repr__": lambda self: "F()"})()
    with pytest.raises(ValueError) as e:
        measure_peak(main)                                          # no __qualname__: its repr names it
    assert str(e.value) == f"measure_peak: fn=F() {fix}"


def test_a_callable_without_a_qualname_runs_and_the_child_is_quiet_by_default(capfd):
    import functools
    r = memory_probe.measure_peak(functools.partial(print, "said-in-the-child"))
    assert r.value is None and "said-in-the-child" not in capfd.readouterr().out


def test_a_failed_child_names_the_caller_and_the_function():
    import functools
    with pytest.raises(RuntimeError) as e:
        memory_probe.measure_peak(memory_probe.allocate_bytes, -1)       # bytearray(-1) raises in the child
    assert str(e.value).startswith("measure_peak: allocate_bytes failed in the child: ")
    no_name = functools.partial(memory_probe.allocate_bytes, -1)           # no __name__: its repr names it
    with pytest.raises(RuntimeError) as e:
        memory_probe.measure_peak(no_name)
    assert str(e.value).startswith(f"measure_peak: {no_name!r} failed in the child: ")
