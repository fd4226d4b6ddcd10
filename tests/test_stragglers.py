"""mshelpers.stragglers: straggler_table, the per-rank table and the verdict against the run's own noise."""
import pytest

from mshelpers.stragglers import straggler_table


def test_table_values_and_straggler():
    t = straggler_table({0: [0.10, 0.11, 0.10, 0.12, 0.10, 0.10, 0.10, 0.10, 0.10, 0.30],
                         1: [0.20, 0.21, 0.19, 0.20, 0.22, 0.18, 0.20, 0.20, 0.20, 0.20]})
    r0, r1 = t["rows"]
    assert (r0["rank"], r0["steps"], r0["median_s"], r0["max_s"]) == (0, 10, 0.10, 0.30)
    assert r0["p90_s"] == 0.12            # nearest rank: the 9th of 10 sorted values
    assert r0["iqr_s"] == pytest.approx(0.01)   # nearest-rank quartiles: 3rd (0.10) and 8th (0.11) of 10
    assert r1["median_s"] == 0.20 and r1["p90_s"] == 0.21 and r1["iqr_s"] == pytest.approx(0.0)
    assert t["slowest"] == 1 and t["fastest"] == 0
    assert t["ratio"] == pytest.approx(2.0)
    assert t["noise"] == pytest.approx(0.1)   # rank 0: IQR 0.01 / median 0.10
    assert t["verdict"] == "straggler"


def test_difference_inside_the_noise_is_balanced():
    t = straggler_table({0: [0.9, 1.0, 1.1, 1.2, 0.8], 1: [1.05] * 5})
    # ratio 1.05, but rank 0's typical step wanders by 20 % (IQR 0.9..1.1 around a median of 1.0)
    assert t["rows"][0]["iqr_s"] == pytest.approx(0.2)
    assert t["ratio"] == pytest.approx(1.05) and t["noise"] == pytest.approx(0.2) and t["verdict"] == "balanced"


def test_spikes_do_not_hide_a_straggler():
    # a 5x spike on the fast rank (a busy neighbour) leaves its median and IQR alone
    t = straggler_table({0: [1.0, 1.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0], 1: [2.0] * 8})
    assert t["verdict"] == "straggler" and t["slowest"] == 1 and t["noise"] == 0.02


def test_floor_keeps_identical_times_from_flagging_tiny_gaps():
    t = straggler_table({0: [1.0, 1.0], 1: [1.01, 1.01], 2: [1.0, 1.0]})
    assert t["noise"] == 0.02 and t["verdict"] == "balanced" and t["slowest"] == 1
    assert straggler_table({0: [1.0, 1.0], 1: [1.05, 1.05]})["verdict"] == "straggler"


@pytest.mark.parametrize("bad", [{0: [1.0, 1.0]}, {0: [1.0], 1: [1.0, 1.0]}, {0: [0.0, 1.0], 1: [1.0, 1.0]}, []])
def test_bad_input_is_refused(bad):
    with pytest.raises(ValueError, match="fix:"):
        straggler_table(bad)
