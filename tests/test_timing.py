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


def test_compare_interleaved_passes_the_preload_to_every_run():
    from mshelpers.timing import compare_interleaved
    out = compare_interleaved({"a": (allocate_mb, (1,)), "b": (allocate_mb, (2,))}, rounds=2,
                              forkserver_preload=PRELOAD, progress=False, metrics={"median_step_s": False})
    assert [(r["name"], r["median_step_s"]) for r in out["runs"]] == [("a", 2**20), ("b", 2 * 2**20),
                                                                      ("b", 2 * 2**20), ("a", 2**20)]
