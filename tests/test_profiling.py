"""mshelpers.profiling: the parsers run on profiler output this test produces itself."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from mshelpers import profiling as P


class _MLP:
    """A small GRAPH_MODE training step; big enough that MatMul dominates op time."""

    def __init__(self):
        import mindspore as ms
        from mindspore import nn

        from mshelpers.device import setup
        setup(mode="graph", device="CPU", seed=0)
        net = nn.SequentialCell(nn.Dense(256, 512), nn.ReLU(), nn.Dense(512, 10))
        loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
        self.step = nn.TrainOneStepCell(loss, nn.Adam(net.trainable_params()))
        rng = np.random.default_rng(0)
        self.x = ms.Tensor(rng.standard_normal((64, 256)).astype(np.float32))
        self.y = ms.Tensor(rng.integers(0, 10, 64).astype(np.int32))
        self.step(self.x, self.y).asnumpy()      # compile outside the profiled window

    def __call__(self, batch=None):
        return self.step(self.x, self.y).asnumpy()


@pytest.fixture(scope="module")
def mlp():
    return _MLP()


@pytest.fixture(scope="module")
def plain_run(mlp, tmp_path_factory):
    return P.profile_steps(mlp, wait=1, warmup=1, active=3, output_dir=tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def slow_data_run(mlp, tmp_path_factory):
    def slow_batch():
        time.sleep(0.2)           # a data loader far slower than the ~1 ms step (50 ms under load)
        return None
    return P.profile_steps(mlp, wait=0, warmup=1, active=3, data_fn=slow_batch,
                           output_dir=tmp_path_factory.mktemp("slow"))


def test_profile_steps_records_only_the_active_window(plain_run):
    assert len(plain_run.step_times_s) == 1 + 1 + 3
    assert plain_run.active_steps == [2, 3, 4]
    assert len(plain_run.step_windows_us) == 3
    assert plain_run.trace_path.exists()
    assert list((plain_run.profile_dir / "FRAMEWORK").glob("cpu_op_type_info_*.csv"))
    # Every op in the trace falls inside one of the three recorded step windows.
    ops = P.op_events(P.load_trace(plain_run))
    assert ops
    assert all(any(lo <= e["ts"] < hi for lo, hi in plain_run.step_windows_us) for e in ops)


def test_op_type_table_matches_the_trace(plain_run):
    rows = P.op_type_table(plain_run)
    types = [r["op_type"] for r in rows]
    assert "MatMul" in types and "Adam" in types
    assert rows == sorted(rows, key=lambda r: -r["total_ms"])
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-9
    # 3 steps x (2 forward + 3 backward MatMuls) = 15 executions.
    assert next(r for r in rows if r["op_type"] == "MatMul")["count"] == 15
    # The CSV's total agrees with the summed durations of the trace's op events (both in ms).
    trace_ms = sum(e["dur"] for e in P.op_events(P.load_trace(plain_run))) / 1e3
    assert sum(r["total_ms"] for r in rows) == pytest.approx(trace_ms, rel=0.05)


def test_top_ops_are_instances_sorted_and_limited(plain_run):
    top = P.top_ops(plain_run, k=3)
    assert len(top) == 3
    assert top[0]["total_ms"] >= top[1]["total_ms"] >= top[2]["total_ms"]
    assert all("/" in r["op_name"] for r in top)          # full scope names, not just types
    with pytest.raises(ValueError, match="k=0"):
        P.top_ops(plain_run, k=0)


def test_breakdown_shares_sum_to_one_and_diagnose_names_data(plain_run, slow_data_run):
    b = P.step_breakdown(slow_data_run)
    shares = b["compute_share"] + b["communication_share"] + b["data_share"] + b["host_share"]
    assert shares == pytest.approx(1.0, abs=1e-6)
    assert b["steps"] == 3 and b["communication_share"] == 0
    assert b["data_share"] > 0.5
    d = P.diagnose(b)
    assert d.bottleneck == "data-bound"
    assert "data_share" in d.rule and "data_share" in str(d)

    fast = P.step_breakdown(plain_run)
    assert fast["data_share"] == 0
    assert P.diagnose(fast).bottleneck in ("compute-bound", "launch/host-bound")


def test_breakdown_on_a_synthetic_trace_with_communication(tmp_path):
    # Two 100 us steps: compute 0-40, AllReduce 30-80 (exposed 40-80), idle 80-100.
    events = [{"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "CPU OP"}}]
    for t0 in (0, 100):
        events += [
            {"ph": "X", "pid": 2, "tid": 0, "name": "Default/MatMul-op0", "ts": str(t0), "dur": "40"},
            {"ph": "X", "pid": 2, "tid": 1, "name": "Default/AllReduce-op0", "ts": str(t0 + 30), "dur": "50"},
        ]
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps(events))
    b = P.step_breakdown(str(path), step_windows_us=[(0, 100), (100, 200)])
    assert b["compute_share"] == pytest.approx(0.4)
    assert b["communication_share"] == pytest.approx(0.4)
    assert b["host_share"] == pytest.approx(0.2)
    assert P.diagnose(b).bottleneck == "communication-bound"


def test_diagnose_threshold_and_bad_input():
    b = {"compute_share": 0.75, "communication_share": 0.1, "data_share": 0.0, "host_share": 0.15}
    assert P.diagnose(b).bottleneck == "compute-bound"
    assert P.diagnose(b, threshold=0.12).bottleneck == "launch/host-bound"
    with pytest.raises(ValueError, match="step_breakdown"):
        P.diagnose({"compute_share": 1.0})
    with pytest.raises(ValueError, match="threshold"):
        P.diagnose(b, threshold=30)


def test_profile_steps_rejects_bad_counts_before_profiling(tmp_path):
    with pytest.raises(ValueError, match="active=0"):
        P.profile_steps(lambda: None, active=0, output_dir=tmp_path)
    with pytest.raises(ValueError, match="step_fn"):
        P.profile_steps("not a function", output_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_overhead_ratio():
    assert P.overhead_ratio([2.0, 2.0, 4.0], [1.0, 1.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        P.overhead_ratio([], [1.0])


def test_find_profile_dirs_oldest_first(tmp_path):
    import os
    old = tmp_path / "a" / "host_1_20260101_ascend_ms"
    new = tmp_path / "b" / "deep" / "host_2_20260102_ascend_ms"
    mid = tmp_path / "c_ascend_ms"
    for d, t in ((old, 1_000_000), (new, 3_000_000), (mid, 2_000_000)):
        d.mkdir(parents=True)
        os.utime(d, (t, t))
    (tmp_path / "b" / "not_ascend_ms_either").mkdir()
    (tmp_path / "x_ascend_ms.txt").write_text("a file, not a run")
    assert P.find_profile_dirs(tmp_path) == [old, mid, new]
    assert P.find_profile_dirs(str(tmp_path / "b")) == [new]
    assert P.find_profile_dirs(new) == [new]                  # a run folder itself
    assert P.find_profile_dirs(tmp_path / "empty") == []


@pytest.mark.parametrize("name, comm", [
    ("BroadcastTo", False), ("Default/BroadcastTo-op3", False), ("Sender", False), ("MatMul", False),
    ("AllReduce", True), ("Default/AllReduce-op12", True), ("AllGather", True), ("ReduceScatter", True),
    ("Broadcast", True), ("Broadcast-op1", True), ("Send", True), ("Recv", True), ("Receive", True),
    ("hcom_allReduce_", True), ("HcomAllGather", True), ("InnerCommIsend", True),
])
def test_comm_pattern_has_word_boundaries(name, comm):
    from mshelpers.profiling import COMM_OP_PATTERN
    assert bool(COMM_OP_PATTERN.search(name)) is comm, name


def test_window_coverage_holds_the_trace_and_drops_when_the_clocks_disagree(plain_run):
    cov = P.window_coverage(plain_run)
    assert cov["windows"] == 3 and cov["trace_op_ms"] > 0
    assert cov["coverage"] >= 0.99
    # The same trace against windows shifted by a second: the two clocks no longer agree.
    shifted = P.ProfileRun(plain_run.profile_dir, plain_run.step_times_s, plain_run.data_times_s,
                           plain_run.active_steps, [(a + 1e6, b + 1e6) for a, b in plain_run.step_windows_us])
    assert P.window_coverage(shifted)["coverage"] < 0.5
    with pytest.raises(ValueError, match="ProfileRun"):
        P.window_coverage(str(plain_run.profile_dir))


def _steps(host_shares):
    return [{"step_ms": 10.0, "compute_ms": 10.0 * (1 - h), "communication_ms": 0.0, "data_ms": 0.0,
             "host_ms": 10.0 * h} for h in host_shares]


def test_diagnosis_margin_decides_only_beyond_the_step_range():
    far = {"compute_share": 0.9, "communication_share": 0.0, "data_share": 0.0, "host_share": 0.1,
           "per_step": _steps([0.09, 0.10, 0.11])}
    m = P.diagnosis_margin(far)
    assert m["decided"] and m["verdict"] == "compute-bound" and m["share_name"] == "host_share"
    assert m["margin"] == pytest.approx(0.2) and m["step_range"] == pytest.approx(0.02)
    near = {**far, "host_share": 0.283, "compute_share": 0.717, "per_step": _steps([0.25, 0.283, 0.31])}
    m = P.diagnosis_margin(near)
    assert not m["decided"] and m["verdict"] == "undecided" and m["bottleneck"] == "compute-bound"
    above = {**far, "host_share": 0.6, "compute_share": 0.4, "per_step": _steps([0.58, 0.6, 0.62])}
    assert P.diagnosis_margin(above)["verdict"] == "launch/host-bound"
    two = {**far, "per_step": _steps([0.1, 0.1])}             # two steps: no range to speak of
    assert P.diagnosis_margin(two)["verdict"] == "undecided"
    assert P.diagnosis_margin(two, min_steps=2)["verdict"] == "compute-bound"
    with pytest.raises(ValueError, match="min_steps"):
        P.diagnosis_margin(far, min_steps=1)
