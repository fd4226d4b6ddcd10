"""straggler_table: the per-rank table and the verdict against the run's own noise."""
import pytest

from mshelpers.profiling import straggler_table


def test_table_values_and_straggler():
    t = straggler_table({0: [0.10, 0.11, 0.10, 0.12, 0.10, 0.10, 0.10, 0.10, 0.10, 0.30],
                         1: [0.20, 0.21, 0.20, 0.20, 0.22, 0.20, 0.20, 0.20, 0.20, 0.20]})
    r0, r1 = t["rows"]
    assert (r0["rank"], r0["steps"], r0["median_s"], r0["max_s"]) == (0, 10, 0.10, 0.30)
    assert r0["p90_s"] == 0.12            # nearest rank: the 9th of 10 sorted values
    assert r1["median_s"] == 0.20 and r1["p90_s"] == 0.21
    assert t["slowest"] == 1 and t["fastest"] == 0
    assert t["ratio"] == pytest.approx(2.0)
    assert t["noise"] == pytest.approx(0.2)   # rank 0's tail: 0.12 / 0.10 - 1
    assert t["verdict"] == "straggler"


def test_difference_inside_the_noise_is_balanced():
    t = straggler_table({0: [1.0, 1.0, 1.3, 1.0], 1: [1.1, 1.1, 1.1, 1.1]})
    # ratio 1.1, but rank 0's own p90 is 30 % above its median
    assert t["ratio"] == pytest.approx(1.1) and t["verdict"] == "balanced"


def test_floor_keeps_identical_times_from_flagging_tiny_gaps():
    t = straggler_table({0: [1.0, 1.0], 1: [1.01, 1.01], 2: [1.0, 1.0]})
    assert t["noise"] == 0.02 and t["verdict"] == "balanced" and t["slowest"] == 1
    assert straggler_table({0: [1.0, 1.0], 1: [1.05, 1.05]})["verdict"] == "straggler"


@pytest.mark.parametrize("bad", [{0: [1.0, 1.0]}, {0: [1.0], 1: [1.0, 1.0]}, {0: [0.0, 1.0], 1: [1.0, 1.0]}, []])
def test_bad_input_is_refused(bad):
    with pytest.raises(ValueError, match="fix:"):
        straggler_table(bad)
