"""Interleaved comparisons: rotation, spreads, and verdicts that only count changes clearing the noise."""
import time

import pytest

from mshelpers.timing import compare_interleaved, verdict


def test_verdict_needs_the_change_to_clear_the_spread():
    base = [100.0, 104.0, 102.0]                      # range 4
    assert verdict(base, [110.0, 111.0, 112.0]) == "win"           # +9 > 4
    assert verdict(base, [103.0, 105.0, 101.0]) == "within noise"  # +1 < 4
    assert verdict(base, [90.0, 91.0, 92.0]) == "regression"
    # the candidate's own spread counts as well: a range of 40 (39 % of the baseline) hides a +8 median; a noise
    # that wide could hide a real change too, so the verdict is "too noisy", not "within noise"
    assert verdict(base, [90.0, 110.0, 130.0]) == "too noisy"
    # lower is better (step time, memory)
    assert verdict([1.0, 1.1], [0.5, 0.55], higher_is_better=False) == "win"
    assert verdict([1.0, 1.1], [2.0, 2.1], higher_is_better=False) == "regression"
    with pytest.raises(ValueError, match="at least one value"):
        verdict([], [1.0])


ORDER = []


def sleeper(seconds, seed=None):
    ORDER.append((seconds, seed))
    t0 = time.perf_counter()
    time.sleep(seconds)
    return {"median_step_s": time.perf_counter() - t0, "tokens_per_s": 1.0 / seconds}


def test_in_process_rotation_medians_and_verdicts():
    ORDER.clear()
    res = compare_interleaved({"slow": (sleeper, (0.05,)), "fast": (sleeper, (0.01,)), "same": (sleeper, (0.05,))},
                              seeds=[0, 1, 2], isolate=False, progress=False,
                              metrics={"median_step_s": False, "tokens_per_s": True})
    # rotated order: round r starts with candidate r
    assert [s for s, _ in ORDER] == [0.05, 0.01, 0.05, 0.01, 0.05, 0.05, 0.05, 0.05, 0.01]
    assert [seed for _, seed in ORDER] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    t = {r["name"]: r for r in res["table"]}
    assert t["fast"]["median_step_s verdict"] == "win" and t["fast"]["tokens_per_s verdict"] == "win"
    assert t["same"]["tokens_per_s verdict"] == "within noise"
    assert t["fast"]["tokens_per_s vs base"] == pytest.approx(5.0)
    assert t["slow"]["median_step_s min"] <= t["slow"]["median_step_s"] <= t["slow"]["median_step_s max"]
    assert len(res["runs"]) == 9 and res["baseline"] == "slow"


def allocate(mb, seed=None):
    block = bytearray(mb * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return {"median_step_s": 0.001, "tokens_per_s": 1.0}


def test_fresh_processes_give_each_run_its_own_peak_memory():
    res = compare_interleaved({"small": (allocate, (10,)), "big": (allocate, (300,))}, rounds=2, progress=False)
    t = {r["name"]: r for r in res["table"]}
    assert t["big"]["peak_rss_mb"] - t["small"]["peak_rss_mb"] > 250     # each process's own peak
    assert t["big"]["peak_rss_mb verdict"] == "regression"


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="rounds=1"):
        compare_interleaved({"a": sleeper}, rounds=1)
    with pytest.raises(ValueError, match="baseline='x'"):
        compare_interleaved({"a": sleeper}, rounds=2, baseline="x")
    with pytest.raises(ValueError, match="not callable"):
        compare_interleaved({"a": (1, ())}, rounds=2)
    with pytest.raises(ValueError, match="empty"):
        compare_interleaved({}, rounds=2)


def test_a_metric_that_repeats_exactly_needs_a_two_percent_change():
    assert verdict([1688.0, 1688.0], [1711.0, 1712.0], higher_is_better=False) == "within noise"   # +1.4 %
    assert verdict([1688.0, 1688.0], [1750.0, 1751.0], higher_is_better=False) == "regression"     # +3.7 %
    assert verdict([1688.0, 1688.0], [1711.0, 1712.0], higher_is_better=False, rel_floor=0) == "regression"
