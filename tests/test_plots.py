"""mshelpers.plots: the loss, throughput and comparison pictures, drawn with the Agg backend and read back from the
artists (line data, labels, titles, bar heights and colours) and from the rendered figure."""
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from mshelpers.plots import plot_comparison, plot_loss, plot_throughput  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _rows(n, loss0=3.0, slope=0.25):
    # step s: loss 3 - 0.25 s (exact in binary), tokens/s 1000 + 10 s, MFU 0.25 / 0.5 alternating
    return [{"step": s, "loss": loss0 - slope * s, "tokens_per_s": 1000.0 + 10 * s, "mfu": 0.25 if s % 2 else 0.5}
            for s in range(n)]


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# --- plot_loss ------------------------------------------------------------------------------------------------------

def test_plot_loss_draws_one_line_per_run_and_the_floor():
    ax = plot_loss({"pynative": _rows(4), "graph": _rows(3, loss0=2.0, slope=0.5)}, floor=1.71)
    a, b, floor = ax.get_lines()
    assert a.get_label() == "pynative" and list(a.get_xdata()) == [0, 1, 2, 3]
    assert list(a.get_ydata()) == [3.0, 2.75, 2.5, 2.25]
    assert b.get_label() == "graph" and list(b.get_ydata()) == [2.0, 1.5, 1.0]
    # the floor: a dashed black horizontal line across the axes, labelled to 3 decimals
    assert floor.get_label() == "entropy floor 1.710"
    assert list(floor.get_ydata()) == [1.71, 1.71] and list(floor.get_xdata()) == [0, 1]
    assert floor.get_linestyle() == "--" and to_rgba(floor.get_color()) == to_rgba("k") and floor.get_linewidth() == 1
    assert _legend(ax) == ["pynative", "graph", "entropy floor 1.710"]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "step", "loss (nats/token)", "Health: loss vs the floor")


def test_plot_loss_without_a_floor_draws_the_runs_only():
    ax = plot_loss({"only": _rows(2)})
    assert [l.get_label() for l in ax.get_lines()] == ["only"]
    assert _legend(ax) == ["only"]


def test_plot_loss_draws_into_the_axes_it_is_given_and_renders():
    fig, given = plt.subplots()
    ax = plot_loss({"run": _rows(5)}, floor=0.5, ax=given)
    assert ax is given and len(fig.axes) == 1 and len(plt.get_fignums()) == 1   # no second figure was opened
    png = _png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # the rendered legend holds the floor's label as drawn text
    fig.canvas.draw()
    assert "entropy floor 0.500" in [t.get_text() for t in ax.get_legend().get_texts() if t.get_visible()]


def test_plot_loss_opens_a_figure_of_its_own_size():
    ax = plot_loss({"run": _rows(2)})
    assert tuple(ax.figure.get_size_inches()) == (6.0, 3.5)


# --- plot_throughput ------------------------------------------------------------------------------------------------

def test_plot_throughput_skips_the_compile_step_and_shows_mfu_in_percent():
    axes = plot_throughput({"a": _rows(4), "b": _rows(3)})
    assert len(axes) == 2 and tuple(axes[0].figure.get_size_inches()) == (10.0, 3.5)
    tok_a, tok_b = axes[0].get_lines()
    mfu_a, mfu_b = axes[1].get_lines()
    # step 0 is dropped (skip_first=1): steps 1..3 for a, 1..2 for b
    assert list(tok_a.get_xdata()) == [1, 2, 3] and list(tok_a.get_ydata()) == [1010.0, 1020.0, 1030.0]
    assert list(tok_b.get_xdata()) == [1, 2] and list(tok_b.get_ydata()) == [1010.0, 1020.0]
    # MFU 0.25 / 0.5 is drawn as 25 / 50 %
    assert list(mfu_a.get_xdata()) == [1, 2, 3] and list(mfu_a.get_ydata()) == [25.0, 50.0, 25.0]
    assert list(mfu_b.get_ydata()) == [25.0, 50.0]
    assert [l.get_label() for l in axes[0].get_lines()] == ["a", "b"] == _legend(axes[0]) == _legend(axes[1])
    assert (axes[0].get_xlabel(), axes[0].get_ylabel(), axes[0].get_title()) == (
        "step", "tokens/s", "Efficiency: throughput")
    assert (axes[1].get_xlabel(), axes[1].get_ylabel(), axes[1].get_title()) == ("step", "MFU (%)", "Efficiency: MFU")


def test_plot_throughput_skip_first_and_given_axes():
    fig, given = plt.subplots(2, 1)
    axes = plot_throughput({"a": _rows(4)}, skip_first=0, axes=given)
    assert axes is given and len(plt.get_fignums()) == 1
    assert list(given[0].get_lines()[0].get_xdata()) == [0, 1, 2, 3]
    axes = plot_throughput({"a": _rows(4)}, skip_first=3)
    assert list(axes[1].get_lines()[0].get_ydata()) == [25.0]                 # only step 3 is left
    assert _png(fig)[:4] == b"\x89PNG"


# --- plot_comparison ------------------------------------------------------------------------------------------------

RUNS = [{"run": "pynative", "step_ms": 1312.0, "mfu": 0.01},
        {"run": "graph", "step_ms": 201.5, "mfu": 0.07},
        {"run": "graph+O2", "step_ms": 150.0, "mfu": 0.09}]


def test_plot_comparison_draws_one_panel_per_metric_one_bar_per_run():
    axes = plot_comparison(RUNS, ["step_ms", "mfu"])
    assert len(axes) == 2 and tuple(axes[0].figure.get_size_inches()) == pytest.approx((6.4, 3.2))
    for ax, metric, heights in zip(axes, ["step_ms", "mfu"], [[1312.0, 201.5, 150.0], [0.01, 0.07, 0.09]]):
        bars = ax.patches
        assert ax.get_title() == metric
        assert [b.get_height() for b in bars] == heights
        # one colour per run, the same run the same colour in every panel
        assert [b.get_facecolor() for b in bars] == [to_rgba("C0"), to_rgba("C1"), to_rgba("C2")]
    fig = axes[0].figure
    fig.canvas.draw()
    for ax in axes:
        labels = ax.get_xticklabels()
        assert [t.get_text() for t in labels] == ["pynative", "graph", "graph+O2"]
        assert {t.get_rotation() for t in labels} == {30.0}


def test_plot_comparison_one_metric_still_returns_indexable_axes_and_label_picks_the_name():
    rows = [{"id": 7, "tok_s": 10.0}, {"id": 8, "tok_s": 30.0}]
    axes = plot_comparison(rows, ["tok_s"], label="id")
    assert len(axes) == 1 and axes[0].get_title() == "tok_s"
    axes[0].figure.canvas.draw()
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["7", "8"]          # ints shown as their str
    assert [b.get_height() for b in axes[0].patches] == [10.0, 30.0]


def test_plot_comparison_uses_the_axes_it_is_given():
    fig, given = plt.subplots(1, 2)
    axes = plot_comparison(RUNS, ["mfu", "step_ms"], axes=given)
    assert axes is given and len(plt.get_fignums()) == 1
    assert [b.get_height() for b in given[1].patches] == [1312.0, 201.5, 150.0]
    assert len(_png(fig)) > 1000


@pytest.mark.parametrize("rows, metrics", [([], ["mfu"]), (RUNS, [])])
def test_plot_comparison_refuses_nothing_to_draw(rows, metrics):
    with pytest.raises(ValueError) as e:
        plot_comparison(rows, metrics)
    assert str(e.value) == "plot_comparison: rows and metrics must be non-empty; fix: pass run rows and metric names"
    assert plt.get_fignums() == []                                              # refused before drawing anything


def test_plot_comparison_refuses_a_metric_the_rows_lack_and_lists_those_they_have():
    with pytest.raises(ValueError) as e:
        plot_comparison(RUNS, ["step_ms", "tokens_per_s", "loss"])
    assert str(e.value) == ("plot_comparison: metric 'tokens_per_s' is not in the rows; "
                            "fix: use one of ['run', 'step_ms', 'mfu']")
    assert plt.get_fignums() == []


def test_the_rendered_bars_have_the_heights_asked_for():
    """Read the heights off the rendered pixels: bar 2 is twice bar 1, so its top is twice as far from the baseline."""
    fig, ax = plt.subplots(figsize=(2, 2), dpi=100)
    plot_comparison([{"run": "a", "v": 1.0}, {"run": "b", "v": 2.0}], ["v"], axes=[ax])
    ax.set_ylim(0, 2)
    ax.set_axis_off()
    fig.subplots_adjust(0, 0, 1, 1)
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[:, :, :3].astype(int)
    c0, c1 = [(np.array(to_rgba(c)[:3]) * 255).round().astype(int) for c in ("C0", "C1")]
    rows0 = np.where((np.abs(img - c0).sum(axis=2) < 10).any(axis=1))[0]
    rows1 = np.where((np.abs(img - c1).sum(axis=2) < 10).any(axis=1))[0]
    # 200 px tall axes from 0 to 2: bar "a" fills the bottom 100 px, bar "b" all 200
    assert abs(len(rows0) - 100) <= 2 and abs(len(rows1) - 200) <= 2
