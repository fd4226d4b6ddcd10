"""mshelpers.timing: Benchmark, run_isolated (a fresh process: value, wall time, peak RSS) and interleaved
comparisons (rotation, spreads, and verdicts that only count changes clearing the noise)."""
import os
import time

import pytest

from mshelpers.timing import Benchmark, compare_interleaved, run_isolated, verdict


def allocate_mb(mb: int) -> int:
    block = bytearray(mb * 2**20)
    return len(block)


def env_value(name: str) -> str | None:
    return os.environ.get(name)


def test_benchmark_records_elapsed(capsys):
    with Benchmark("work") as b:
        sum(range(10_000))
    assert b.elapsed > 0 and "work:" in capsys.readouterr().out


def test_run_isolated_measures_the_childs_peak():
    small = run_isolated(allocate_mb, 1)
    big = run_isolated(allocate_mb, 300)
    assert big.value == 300 * 2**20
    assert big.peak_rss_mb - small.peak_rss_mb > 250   # the child's own peak, not the parent's


def test_run_isolated_env_is_for_the_child_only():
    assert run_isolated(env_value, "MSH_TEST_VAR", env={"MSH_TEST_VAR": "on"}).value == "on"
    assert "MSH_TEST_VAR" not in os.environ


def test_run_isolated_reraises_child_errors():
    with pytest.raises(RuntimeError, match="ValueError: negative count"):
        run_isolated(allocate_mb, -1)


def test_concurrent_run_isolated_calls_each_see_their_own_env():
    # Two threads at once with different values (notebook 06 does this): each child must see its own
    # value, and the parent's environment must be untouched afterwards. The old code mutated the
    # parent's os.environ around p.start(); 12 of 12 rounds mixed the values up.
    from concurrent.futures import ThreadPoolExecutor
    for _ in range(4):
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda v: run_isolated(env_value, "MSH_TEST_VAR", env={"MSH_TEST_VAR": v}).value,
                                ["a", "b"]))
        assert got == ["a", "b"]
        assert "MSH_TEST_VAR" not in os.environ


def where_am_i() -> tuple[int, int, bool]:
    import sys
    return os.getpid(), os.getppid(), "wave" in sys.modules     # wave: a stdlib module nothing here imports


PRELOAD = ("wave",)   # one list for every test: a process has one fork server, started with the first list


def test_forkserver_preload_forks_every_run_from_one_server_that_imported_them():
    spawned = run_isolated(where_am_i).value
    assert spawned[1] == os.getpid() and not spawned[2]           # spawn: our child, a new interpreter
    first, second = (run_isolated(where_am_i, forkserver_preload=PRELOAD).value for _ in range(2))
    assert first[2] and second[2]                                 # imported before the child began
    assert first[1] == second[1] != os.getpid()                   # both forked by the same server
    assert first[0] != second[0]                                  # each run a fresh process


def test_forkserver_runs_keep_their_own_peak_and_errors():
    small = run_isolated(allocate_mb, 1, forkserver_preload=PRELOAD)
    big = run_isolated(allocate_mb, 300, forkserver_preload=PRELOAD)
    assert big.value == 300 * 2**20 and big.peak_rss_mb - small.peak_rss_mb > 250
    with pytest.raises(RuntimeError, match="ValueError: negative count"):
        run_isolated(allocate_mb, -1, forkserver_preload=PRELOAD)


@pytest.mark.parametrize("bad", ["mindspore", [""], [1], None.__class__])
def test_a_bad_forkserver_preload_is_one_line(bad):
    with pytest.raises(ValueError, match=r"^run_isolated: forkserver_preload=.* is invalid; fix: a list of module "
                                         r"names, e.g. \['mshelpers', 'mindspore', 'mindformers'\]$"):
        run_isolated(allocate_mb, 1, forkserver_preload=bad)


def test_forkserver_preload_with_env_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^run_isolated: forkserver_preload=\['wave'\] with env=\['MSH_TEST_VAR'\]: the "
                                         r"server imported MindSpore before the child could set them; fix: pass env "
                                         r"without forkserver_preload \(spawn\)$"):
        run_isolated(env_value, "MSH_TEST_VAR", env={"MSH_TEST_VAR": "on"}, forkserver_preload=PRELOAD)
    from mshelpers.timing import compare_interleaved
    with pytest.raises(ValueError, match=r"^compare_interleaved: candidate 'b' has env=\['X'\] and forkserver_preload is "
                                         r"set: forked runs cannot take MS_\* variables that MindSpore reads at import; "
                                         r"fix: drop forkserver_preload, so every candidate is spawned alike$"):
        compare_interleaved({"a": (allocate_mb, (1,)), "b": (allocate_mb, (1,), {}, {"X": "1"})},
                            forkserver_preload=PRELOAD, progress=False)


# --- this process's RSS and the spawn helper (one copy each, used by memory_probe.measure_peak too) ---
def _proc_status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":"))


def _touch(n_bytes):
    buf = bytearray(n_bytes)
    buf[::4096] = b"\1" * len(range(0, n_bytes, 4096))     # every page written, so resident; freed on return
    return len(buf)


def test_rss_is_read_from_proc_and_falls_back_to_getrusage():
    import resource
    from mshelpers import timing
    assert 10 < timing._rss_mb() <= timing._rss_mb("VmHWM")                 # MiB, not KiB
    _touch(256 * 2**20)                  # freed on return: the peak stays, the current RSS falls back
    assert timing._rss_mb() < timing._rss_mb("VmHWM") - 200
    assert abs(timing._rss_mb() - _proc_status_kib("VmRSS") / 1024) < 16
    for read in (lambda: timing._rss_mb("VmHWM"), timing.peak_rss_mb):
        lo, got, hi = _proc_status_kib("VmHWM"), read(), _proc_status_kib("VmHWM")
        assert lo / 1024 <= got <= hi / 1024         # the peak only grows: bracketed, exact in KiB / 1024
        assert got * 2**20 == int(got * 2**20) and int(got * 2**20) % 1024 == 0     # whole KiB, back to bytes exactly
    ru = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # Linux: KiB
    lo, got, hi = ru(), timing._rss_mb("NoSuchField"), ru()
    assert lo <= got <= hi


def test_a_spawned_child_returns_raises_times_out_or_dies_with_one_clear_error():
    import time
    from mshelpers.timing import _run_child

    def run(fn, args, timeout=120, env=None):
        return _run_child(fn, args, {}, timeout=timeout, env=env, who="measure_peak")
    value, wall_s, peak_mb = run(os.getenv, ("MSH_SPAWN_VAR",), env={"MSH_SPAWN_VAR": 7})
    assert value == "7" and 0 <= wall_s < 60 and peak_mb > 1
    assert "MSH_SPAWN_VAR" not in os.environ
    assert run(os.getenv, ("MSH_SPAWN_VAR",))[0] is None
    with pytest.raises(RuntimeError, match=r"measure_peak: int failed in the child: ValueError: invalid literal"):
        run(int, ("x",))
    with pytest.raises(RuntimeError, match=r"measure_peak: the child running _exit died with exit code 3"):
        run(os._exit, (3,))
    with pytest.raises(TimeoutError, match=r"measure_peak: sleep did not finish within timeout=1.5s"):
        run(time.sleep, (60,), timeout=1.5)
    with pytest.raises(RuntimeError, match=r"run_isolated: the child running _exit died with exit code 4"):
        run_isolated(os._exit, 4)
    with pytest.raises(TimeoutError, match=r"who: nap did not finish within timeout=1.5s"):
        _run_child(time.sleep, (60,), {}, timeout=1.5, env=None, who="who", name="nap")


def test_compare_interleaved_passes_the_preload_to_every_run():
    from mshelpers.timing import compare_interleaved
    out = compare_interleaved({"a": (allocate_mb, (1,)), "b": (allocate_mb, (2,))}, rounds=2,
                              forkserver_preload=PRELOAD, progress=False, metrics={"median_step_s": False})
    assert [(r["name"], r["median_step_s"]) for r in out["runs"]] == [("a", 2**20), ("b", 2 * 2**20),
                                                                      ("b", 2 * 2**20), ("a", 2**20)]


# ---------------------------------------------------------------- the A/A control
def _steps(values):
    """A callable returning the next value of `values` at each call (in this process: isolate=False)."""
    it = iter(values)
    return lambda: next(it)


def test_an_a_a_control_runs_the_baseline_twice_in_the_rotation():
    from mshelpers.timing import compare_interleaved
    calls = []
    fns = {n: (lambda n=n: calls.append(n) or 0.1) for n in ("base", "change")}
    out = compare_interleaved(fns, rounds=3, isolate=False, progress=False, aa_control=True)
    assert out["aa"] == "base (A/A)" and [r["name"] for r in out["table"]] == ["base", "base (A/A)", "change"]
    assert calls.count("base") == 6 and calls.count("change") == 3          # the A/A runs are the baseline's code
    firsts = [next(r["name"] for r in out["runs"] if r["round"] == k) for k in range(3)]
    assert len(set(firsts)) == 3                                            # rotated: none always runs first



def test_an_a_a_control_given_as_a_dict_overrides_those_arguments_in_the_copy_only():
    from mshelpers.timing import compare_interleaved
    calls = []
    fns = {"base": (lambda extra: calls.append(extra) or 0.1, (), {"extra": "check"}), "change": lambda: 0.1}
    compare_interleaved(fns, rounds=2, isolate=False, progress=False, aa_control={"extra": None})
    assert sorted(calls, key=str) == [None, None, "check", "check"]   # 2 baseline runs with it, 2 A/A runs without

# With aa_control the baseline's callable serves both the baseline and the A/A runs. In the rotation
# [base, A/A, change] -> [A/A, change, base] -> [change, base, A/A], its calls 0..5 are, per round:
# base, A/A | A/A, base | base, A/A.
BASE_CALLS = ("base", "aa", "aa", "base", "base", "aa")
ROUND_OF_CALL = (0, 0, 1, 1, 2, 2)


def _baseline_callable(base_vals, aa_vals):
    k = iter(range(6))

    def call():
        i = next(k)
        return (base_vals if BASE_CALLS[i] == "base" else aa_vals)[ROUND_OF_CALL[i]]
    return call


def test_a_no_op_is_within_noise_and_a_real_change_wins_against_the_a_a_band():
    from mshelpers.timing import compare_interleaved, verdict
    drift = [0.10, 0.115, 0.13]               # the machine drifts round by round, and every candidate with it
    aa = [d * f for d, f in zip(drift, (1.02, 0.99, 1.01))]
    noop = iter(d * f for d, f in zip(drift, (0.99, 1.02, 1.00)))
    faster = iter(d * 0.80 for d in drift)
    out = compare_interleaved({"base": _baseline_callable(drift, aa), "noop": lambda: next(noop),
                               "faster": lambda: next(faster)}, rounds=3, isolate=False, progress=False,
                              aa_control=True)
    v = {r["name"]: r.get("median_step_s verdict") for r in out["table"]}
    assert out["too_noisy"] == {"median_step_s": False}
    assert v["noop"] == "within noise" and v["faster"] == "win", v
    # A/A log-ratios log 1.02, log 0.99, log 1.01: median |.| = 0.01005; sigma = 1.4826 x 0.01005 = 0.0149;
    # band = 2.5 x 1.2533 x 0.0149 / sqrt(3) = 0.02696 as a log-ratio, exp(.) - 1 = 0.0273
    assert out["band"]["median_step_s"] == pytest.approx(0.0273, abs=2e-4)
    # the rule without the control, differences of medians against the widest range, calls the 20 % change noise
    # the rule without the control, differences of medians against the widest range (26 % of the baseline here),
    # cannot tell a 20 % change: too noisy, not "within noise"
    assert verdict(drift, [d * 0.8 for d in drift], higher_is_better=False) == "too noisy"


def test_an_a_a_pair_that_differs_leaves_a_small_effect_too_noisy_and_a_large_one_decided():
    from mshelpers.timing import compare_interleaved
    out = compare_interleaved({"base": _baseline_callable([0.10] * 3, [0.20] * 3), "change": lambda: 0.05},
                              rounds=3, isolate=False, progress=False, aa_control=True)
    assert out["too_noisy"] == {"median_step_s": True}
    # the copy ran at twice the baseline: |a_r| = log 2 each round; band = 2.5 x 1.2533 x 1.4826 x 0.693 / sqrt(3)
    # = 1.859 as a log-ratio, exp(1.859) - 1 = 5.42; the change's log 2 = 0.693 does not clear it
    assert out["band"]["median_step_s"] == pytest.approx(5.42, abs=0.01)
    assert {r["name"]: r.get("median_step_s verdict") for r in out["table"]}["change"] == "too noisy"
    # 02 c12's case: the A/A copies differ by 1.19x, the effect is 3.5x: decided, not vetoed by the copy
    out = compare_interleaved({"base": _baseline_callable([1.57, 1.50, 1.60], [1.32, 1.55, 1.60]),
                               "cold": iter([5.48, 5.30, 5.60]).__next__}, rounds=3, isolate=False, progress=False,
                              aa_control=True)
    assert {r["name"]: r.get("median_step_s verdict") for r in out["table"]}["cold"] == "regression"
    assert out["too_noisy"] == {"median_step_s": False}


def test_four_verdicts_and_the_band_narrows_as_rounds_are_added():
    from mshelpers.timing import TIGHT_BAND, aa_band, decide
    base = [100.0] * 9
    aa = [100 * f for f in (1.06, 0.95, 1.04, 0.97, 1.05, 0.96, 1.03, 0.94, 1.06)]
    # 3 rounds: |a_r| = .0583, .0513, .0392, median .0513, sigma .0761, band 2.5 x 1.2533 x .0761 / sqrt 3 = .1377,
    # exp - 1 = 14.8 %; 9 rounds: median |a_r| .0488, sigma .0723, band .0755, 7.8 %
    assert aa_band(base[:3], aa[:3]) == pytest.approx(0.1475, abs=1e-3)
    assert aa_band(base, aa) == pytest.approx(0.0784, abs=1e-3)
    slower = [110.0] * 9                                                                          # log 1.1 = .0953
    # 10 % slower inside a ±14.8 % band: the truth could be a 25 % regression or none. Not 'within noise', which
    # says any change is under ±15 % (effect and band together); stop 72's CI failed in 09 on exactly this
    assert decide(base[:3], slower[:3], aa[:3], higher_is_better=False)[0] == "too noisy"
    assert decide(base, slower, aa, higher_is_better=False)[0] == "regression"                 # clears 7.8 %
    # 'within noise' needs effect + band < log 1.15 = .1398: 5 % slower inside 7.8 % passes, 7 % does not
    assert decide(base, [105.0] * 9, aa, higher_is_better=False)[0] == "within noise"          # .0488 + .0755
    assert decide(base, [107.0] * 9, aa, higher_is_better=False)[0] == "too noisy"             # .0677 + .0755
    wide = [100 * f for f in (1.3, 0.75, 1.25)]
    v, band = decide(base[:3], slower[:3], wide, higher_is_better=False)
    assert v == "too noisy" and band > TIGHT_BAND
    # a candidate scattering far more than its A/A copy is not decided on the copy's calm
    assert decide(base[:3], [70.0, 104.0, 150.0], aa[:3], higher_is_better=False)[0] == "too noisy"


def test_budget_adds_rounds_until_the_verdict_decides():
    from mshelpers.timing import compare_interleaved
    names = ["base", "base (A/A)", "slower"]          # compare_interleaved's order; round r starts at names[r % 3]
    aa_ratio = [1.12, 0.89] * 6
    k = {"calls": 0}

    def who() -> tuple[str, int]:
        r, i = divmod(k["calls"], 3)
        k["calls"] += 1
        return names[(i + r) % 3], r

    def base():
        name, r = who()
        return 0.10 * (aa_ratio[r] if name == "base (A/A)" else 1.0)

    def slower():
        who()
        return 0.120                                  # 20 % slower every round: log 1.2 = 0.182
    # 3 rounds: median |a_r| = 0.115 -> band 2.5 x 1.2533 x 1.4826 x 0.115 / sqrt 3 = 0.308, 36 %: 20 % is too noisy
    fixed = compare_interleaved({"base": base, "slower": slower}, rounds=3, isolate=False, progress=False,
                                aa_control=True)
    assert {r["name"]: r.get("median_step_s verdict") for r in fixed["table"]}["slower"] == "too noisy"
    k["calls"] = 0
    grown = compare_interleaved({"base": base, "slower": slower}, rounds=3, isolate=False, progress=False,
                                aa_control=True, budget_s=600, max_rounds=12)
    # each added round narrows the band (0.534 / sqrt(R)): 0.189 at 8 rounds, 0.178 at 9, which 0.182 clears
    assert {r["name"]: r.get("median_step_s verdict") for r in grown["table"]}["slower"] == "regression"
    assert grown["rounds"] == 9 and len(grown["runs"]) == 3 * 9
    k["calls"] = 0
    capped = compare_interleaved({"base": base, "slower": slower}, rounds=3, isolate=False, progress=False,
                                 aa_control=True, budget_s=600, max_rounds=4)
    assert capped["rounds"] == 4                      # max_rounds caps it, and the verdict stays open
    k["calls"] = 0
    # narrow_to: rounds go on past the decision while the band is still wider than asked (0.178 at 9 rounds; 0.1398,
    # 15 %, needs 0.534 / sqrt(R) < 0.1398: R >= 15), here up to max_rounds 12
    narrowed = compare_interleaved({"base": base, "slower": slower}, rounds=3, isolate=False, progress=False,
                                   aa_control=True, budget_s=600, max_rounds=12, narrow_to=0.15)
    assert narrowed["rounds"] == 12
    k["calls"] = 0
    seen = []

    def base_seeded(seed):
        seen.append(seed)
        return base()

    def slower_seeded(seed):
        seen.append(seed)
        return slower()
    # with seeds, every added round is a new seed, after the largest so far; the same 9 rounds decide
    seeded = compare_interleaved({"base": base_seeded, "slower": slower_seeded}, seeds=[5, 9, 2], isolate=False,
                                 progress=False, aa_control=True, budget_s=600, max_rounds=12)
    assert seeded["rounds"] == 9 and seeded["seeds"] == [5, 9, 2, 10, 11, 12, 13, 14, 15]
    assert seen == [r["seed"] for r in seeded["runs"]] == [s for s in seeded["seeds"] for _ in range(3)]
    assert {r["name"]: r.get("median_step_s verdict") for r in seeded["table"]}["slower"] == "regression"
    with pytest.raises(ValueError, match="max_rounds"):
        compare_interleaved({"base": base}, rounds=3, isolate=False, progress=False, aa_control=True, max_rounds=2)
    k["calls"] = 0
    with pytest.raises(ValueError, match="decide_on"):
        compare_interleaved({"base": base}, rounds=3, isolate=False, progress=False, aa_control=True, budget_s=5,
                            decide_on=["tokens"])
    assert k["calls"] == 0                            # refused before any round ran


def test_paired_verdict_refuses_misaligned_or_non_positive_rounds():
    from mshelpers.timing import paired_verdict
    with pytest.raises(ValueError, match="one value per round"):
        paired_verdict([1, 2], [1], [1, 2])
    with pytest.raises(ValueError, match="> 0"):
        paired_verdict([1, 0], [1, 1], [1, 1])
    assert paired_verdict([10, 10], [12, 8], [10, 10], higher_is_better=False) == "too noisy"   # rounds disagree by 40 %


def test_warmup_calls_each_candidate_once_untimed_before_the_rounds_with_its_overrides():
    from mshelpers.timing import compare_interleaved
    calls = []

    def run(tag, steps=10):
        calls.append((tag, steps))
        return {"median_step_s": 1.0 + 0.01 * len(calls)}

    out = compare_interleaved({"a": (run, ("a",)), "b": (run, ("b",))}, rounds=2, isolate=False, progress=False,
                              aa_control=True, warmup={"steps": 2}, metrics={"median_step_s": False})
    assert calls[:2] == [("a", 2), ("b", 2)]                        # one untimed call each, the A/A copy shares a's
    assert sorted(calls[2:]) == [("a", 10)] * 4 + [("b", 10)] * 2   # then the rounds: a, its A/A copy, b, twice
    assert set(out["warmup"]) == {"a", "b"} and len(out["runs"]) == 6
    assert compare_interleaved({"a": (run, ("a",))}, rounds=2, isolate=False, progress=False)["warmup"] == {}


# ---------------------------------------------------------------- interleaved comparisons (compare_interleaved, verdict)
# Interleaved comparisons: rotation, spreads, and verdicts that only count changes clearing the noise.
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


def test_measurements_simulation_block_is_what_the_code_gives(tmp_path):
    """docs/measurements.md's A/A simulation tables are generated (bench/sim_verdicts.py, seeded), never typed:
    `python bench/doctor_tables.py --write` rewrites them."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import sim_verdicts as S
    block = S.current()
    assert block is not None, "docs/measurements.md lost its simulated-verdicts block (bench/sim_verdicts.py markers)"
    assert block == S.render_block(), "run: python bench/doctor_tables.py --write"
    # the check can fail: a typed figure inside the block differs from the code's
    typed = tmp_path / "m.md"
    typed.write_text("intro\n" + block.replace("| 2 | 3% | ", "| 2 | 3% | 9", 1) + "\nend\n")
    assert S.current(typed) != block
