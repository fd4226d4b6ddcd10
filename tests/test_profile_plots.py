"""mshelpers.profile_plots: both pictures drawn from profiler output this test produces itself, and drawn exactly
from rows and a trace written by hand."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from mshelpers import profile_plots, profiling


@pytest.fixture(scope="module")
def slow_data_run(tmp_path_factory):
    """Three profiled steps of a small GRAPH_MODE training step, each behind a data loader far slower than it."""
    import mindspore as ms
    from mindspore import nn

    from mshelpers.device import setup
    setup(mode="graph", device="CPU", seed=0)
    net = nn.SequentialCell(nn.Dense(256, 512), nn.ReLU(), nn.Dense(512, 10))
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    step = nn.TrainOneStepCell(loss, nn.Adam(net.trainable_params()))
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((64, 256)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, 64).astype(np.int32))
    step(x, y).asnumpy()                          # compile outside the profiled window

    def slow_batch():
        time.sleep(0.2)
        return None
    return profiling.profile_steps(lambda batch: step(x, y).asnumpy(), wait=0, warmup=1, active=3,
                                   data_fn=slow_batch, output_dir=tmp_path_factory.mktemp("slow"))


def test_plots_draw(slow_data_run):
    import matplotlib
    matplotlib.use("Agg")
    ax = profile_plots.plot_op_breakdown(profiling.op_type_table(slow_data_run), top=3)
    assert len(ax.patches) == 4                                   # 3 types + "other"
    ax = profile_plots.plot_step_timeline(slow_data_run, step=1)
    assert ax.get_yticklabels()[-1].get_text() == "data_fn"       # data fetch drawn on top


def test_op_breakdown_by_hand():
    import matplotlib
    matplotlib.use("Agg")
    rows = [{"op_type": t, "total_ms": ms} for t, ms in (("Add", 1.0), ("MatMul", 6.0), ("Mul", 2.0), ("ReLU", 1.0))]
    ax = profile_plots.plot_op_breakdown(rows, top=2, title="t")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["other", "Mul", "MatMul"]      # largest on top
    assert [p.get_width() for p in ax.patches] == [2.0, 2.0, 6.0] and ax.get_title() == "t"
    assert [t.get_text() for t in ax.texts] == [" 20%", " 20%", " 60%"]
    assert len(profile_plots.plot_op_breakdown(rows).patches) == 4 and \
        profile_plots.plot_op_breakdown(rows).get_title() == "Op-type breakdown"         # top 12: no "other"
    with pytest.raises(ValueError, match="rows is empty"):
        profile_plots.plot_op_breakdown([])


def test_step_timeline_by_hand(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    out = tmp_path / "x_ascend_ms" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "CPU OP"}},
              {"ph": "X", "name": "Default/MatMul-op1", "pid": 1, "tid": 1, "ts": 1030.0, "dur": 40.0},
              {"ph": "X", "name": "Default/MatMul-op2", "pid": 1, "tid": 1, "ts": 1075.0, "dur": 10.0},
              {"ph": "X", "name": "Default/AllReduce-op3", "pid": 1, "tid": 1, "ts": 1090.0, "dur": 5.0},
              {"ph": "X", "name": "Default/Add-op4", "pid": 1, "tid": 1, "ts": 2000.0, "dur": 5.0}]   # another step
    (out / "trace_view.json").write_text(json.dumps(events))
    run = profiling.ProfileRun(out.parent, [1e-4], [2e-5], [0], step_windows_us=[(1000.0, 1100.0)],
                               data_windows_us=[(1000.0, 1020.0)])
    ax = profile_plots.plot_step_timeline(run)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["AllReduce", "MatMul", "data_fn"]
    assert len(ax.collections) == 3 and ax.get_xlim() == (0.0, 0.1)
    # drawn from the bottom row up: AllReduce, MatMul (the larger total), data_fn on top; ms since the step began
    spans = [[(round(v[:, 0].min(), 6), round(v[:, 0].max(), 6)) for v in (p.vertices for p in c.get_paths())]
             for c in ax.collections]
    assert spans == [[(0.09, 0.095)], [(0.03, 0.07), (0.075, 0.085)], [(0.0, 0.02)]]
    import matplotlib.colors as mc
    colors = [tuple(c.get_facecolor()[0][:3]) for c in ax.collections]
    assert colors == [mc.to_rgb("tab:red"), mc.to_rgb("tab:blue"), mc.to_rgb("tab:orange")]   # comm, compute, data
    with pytest.raises(ValueError, match="out of range"):
        profile_plots.plot_step_timeline(run, step=1)
    with pytest.raises(ValueError, match="ProfileRun"):
        profile_plots.plot_step_timeline(str(out.parent))
