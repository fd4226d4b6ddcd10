import os

import pytest

from mshelpers.timing import Benchmark, run_isolated


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
