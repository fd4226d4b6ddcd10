"""mshelpers.summary: scalars written with SummaryRecord come back through MindInsight's REST API."""
from __future__ import annotations

import pytest

from mshelpers import summary as S


def test_mindinsight_lists_the_run_and_serves_its_scalars(tmp_path):
    base = tmp_path / "summary"
    rows = [{"step": s, "loss": 6.0 / s, "lr": 1e-3 * s, "grad_norm": 0.5, "tokens_per_s": 1.0} for s in (1, 2, 3)]
    rows.append({"step": 4, "loss": float("nan"), "lr": 4e-3, "grad_norm": float("inf")})
    with S.ScalarSummary(base / "run_a") as log:
        for r in rows:
            log(r)
    assert log.records == 4 and log.skipped == 2          # NaN loss and inf grad norm are not written

    with S.MindInsight(base) as mi:
        port = mi.port
        jobs = mi.train_jobs()
        assert [j["train_id"] for j in jobs] == ["./run_a"]
        assert sorted(jobs[0]["plugins"]["scalar"]) == ["grad_norm/scalar", "loss/scalar", "lr/scalar"]
        loss = mi.scalars("./run_a", "loss/scalar")
        assert [s for s, _ in loss] == [1, 2, 3]
        assert [v for _, v in loss] == pytest.approx([6.0, 3.0, 2.0])
        assert [s for s, _ in mi.scalars("./run_a", "lr/scalar")] == [1, 2, 3, 4]
    assert not mi.started
    with pytest.raises(OSError):                           # the service is gone after the with-block
        S.MindInsight(base, port=port).get("datavisual/train-jobs")


def test_commands_and_bad_input(tmp_path):
    assert S.mindinsight_command("build/summary", 8080) == [
        "mindinsight", "start", "--port", "8080", "--summary-base-dir", "build/summary"]
    with pytest.raises(ValueError, match="port=0"):
        S.mindinsight_command("x", 0)
    with pytest.raises(ValueError, match="summary_base_dir"):
        S.MindInsight(tmp_path / "missing")
    with pytest.raises(RuntimeError, match="with ScalarSummary"):
        S.ScalarSummary(tmp_path / "r").log(1, loss=1.0)
    assert 0 < S.free_port() < 65536
