"""The cookbook as a reader sees it: JupyterLab in headless Chromium, notebooks run from the Run menu.

- 05: all cells run through the UI; every plot renders; the planner's sliders drive its layout table.
- the same planner with its sliders left unwired: the check above must catch it (the test can fail).
- 01: opened as committed, its plots render as images.
- a tqdm.auto bar, as train() makes it, renders as a widget that advances and then goes away.
Notebooks are opened as copies under build/e2e/work/, so the committed files are never touched.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil
import pytest

import lab as jl
from lab import REPO, WORK

NB05 = REPO / "notebooks" / "05_semi_auto_parallel.ipynb"
NB01 = REPO / "notebooks" / "01_pynative_baseline.ipynb"
WIRING = '    w.observe(_render, "value")\n'
# notebook 05 builds its sliders only on demand (a headless run leaves no widget state); the browser test calls it
PLANNER_CALL_OFF, PLANNER_CALL_ON = "# interactive_planner()    # uncomment in JupyterLab", "interactive_planner()"


def _with_planner_shown(nb: Path) -> Path:
    d = json.loads(nb.read_text())
    hits = 0
    for c in d["cells"]:
        src = "".join(c["source"])
        if PLANNER_CALL_OFF in src:
            c["source"] = src.replace(PLANNER_CALL_OFF, PLANNER_CALL_ON).splitlines(True)
            hits += 1
    assert hits == 1, "notebook 05's planner call changed: update PLANNER_CALL_OFF in this test"
    nb.write_text(json.dumps(d))
    return nb


def _shooter(page, artifacts: Path, prefix: str):
    def shot(name: str, locator=None):
        path = artifacts / f"{prefix}-{name}.png"
        (locator or page).screenshot(path=str(path), **({} if locator else {"full_page": True}))
        return path
    return shot


def _kernel_pythons(lab) -> list[str]:
    out = []
    for p in psutil.Process(lab.proc.pid).children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if any("ipykernel" in c for c in cmd):
            out.append(cmd[0])
    return out


def test_05_runs_in_the_browser_and_its_planner_widget_drives_the_table(page, lab, budget, artifacts):
    nb = _with_planner_shown(jl.copy_notebook(NB05, WORK / NB05.name, clear_outputs=True))
    shot = _shooter(page, artifacts, "05")
    jl.open_notebook(page, lab, nb, "e2e-05", timeout_s=budget.left(90))
    assert all(p == "[ ]:" for p in jl.prompts(page)["prompts"])          # nothing ran yet: outputs were cleared
    assert _kernel_pythons(lab) and all(Path(p).is_relative_to(REPO / ".venv") for p in _kernel_pythons(lab))

    took = jl.run_all_cells(page, timeout_s=budget.left(240))
    print(f"notebook 05: Run All Cells took {took:.0f} s in the browser")

    images = jl.wait_images(page, None, jl.stored_image_count(NB05), timeout_s=30)
    assert len(images) >= jl.stored_image_count(NB05), images  # every plot the committed copy has, live

    widget = jl.planner(page)
    widget.scroll_into_view_if_needed()
    chart_before = jl.wait_chart(widget, timeout_s=30)
    assert jl.chart_drawn(chart_before), chart_before                          # the chart of the defaults
    states = jl.drive_planner(widget, timeout_s=30, shot=lambda n: shot(f"planner-{n}", widget))
    before, invalid, after = states
    yours = lambda s: next(r for r in s["rows"] if r["which"] == "yours")        # noqa: E731
    best = lambda s: next(r for r in s["rows"] if r["which"] == "planner's best")  # noqa: E731
    assert yours(before)["layout"] == "8dp×4mp×1pp m=8" and yours(before)["mp"] == "4"
    assert "invalid" in invalid["text"] and "8*8*1 = 64" in invalid["text"]
    assert yours(after)["layout"] == "4dp×8mp×1pp m=8" and yours(after)["mp"] == "8" and yours(after)["dp"] == "4"
    assert yours(after)["memory_GiB"] != yours(before)["memory_GiB"]           # the costs were recomputed
    assert best(after) == best(before)                                          # same devices: same best layout
    # the bar chart under the table is drawn again for the new layout: a new image value, decoded and shown
    chart_after = jl.wait_chart(widget, timeout_s=30, not_src=chart_before["src"])
    if not (jl.chart_drawn(chart_after) and chart_after["src"] != chart_before["src"]):
        shot("planner-no-chart", widget)
    assert jl.chart_drawn(chart_after) and chart_after["src"] != chart_before["src"], (chart_before, chart_after)
    shot("planner-after", widget)
    shot("notebook")
    lab.shutdown_kernels()


def _unwired_planner(dst: Path) -> Path:
    """Notebook 05's config, imports and planner cell, with the line that connects the sliders removed."""
    nb = json.loads(NB05.read_text())
    # nbval's marker line, where a cell carries one, is not part of what the cell does
    src = ["".join(c["source"]).removeprefix("# NBVAL_CHECK_OUTPUT\n") for c in nb["cells"]]
    planner = next(s for s in src if "widgets.SelectionSlider" in s and "_render" in s)
    assert WIRING in planner, "notebook 05's planner is wired differently now: update WIRING in this test"
    config = next(s for s in src if s.startswith("# Config"))
    imports = next(s for s in src if "from mshelpers.parallel import" in s)
    cells = [config, imports, "import matplotlib.pyplot as plt", planner.replace(WIRING, "    pass   # e2e: the sliders are left unwired\n")
             .replace(PLANNER_CALL_OFF, PLANNER_CALL_ON)]
    dst.write_text(json.dumps({"cells": [jl.code_cell(s, i) for i, s in enumerate(cells)],
                               "metadata": {"kernelspec": nb["metadata"]["kernelspec"]},
                               "nbformat": 4, "nbformat_minor": 5}))
    return dst


def test_a_planner_whose_sliders_do_not_update_the_table_fails_the_check(page, lab, budget, artifacts):
    nb = _unwired_planner(WORK / "05_planner_unwired.ipynb")
    jl.open_notebook(page, lab, nb, "e2e-unwired", timeout_s=budget.left(60))
    jl.run_all_cells(page, timeout_s=budget.left(90))
    widget = jl.planner(page)
    with pytest.raises(jl.TableDidNotUpdate, match="still shows"):
        jl.drive_planner(widget, timeout_s=5)
    assert jl.readouts(widget)["mp"] == 8                                   # the slider did move ...
    assert "8dp×4mp×1pp m=8" in jl.planner_output(widget)["text"]            # ... the table did not follow
    widget.screenshot(path=str(artifacts / "05-unwired-planner-stale.png"))
    lab.shutdown_kernels()


def test_01_opened_in_the_browser_shows_its_plots_as_images(page, lab, budget, artifacts):
    nb = jl.copy_notebook(NB01, WORK / NB01.name, clear_outputs=False)
    jl.open_notebook(page, lab, nb, "e2e-01", timeout_s=budget.left(60))
    expected = jl.stored_image_count(NB01)
    assert expected >= 1
    assert len(jl.wait_images(page, None, expected, timeout_s=30)) == expected
    plot_cell = page.locator(".jp-NotebookPanel .jp-CodeCell").filter(has_text="plot_loss(").first
    plot_cell.scroll_into_view_if_needed()
    assert jl.rendered_images(page, plot_cell.element_handle())
    plot_cell.screenshot(path=str(artifacts / "01-baseline-plots.png"))
    page.screenshot(path=str(artifacts / "01-notebook.png"), full_page=True)
    lab.shutdown_kernels()


def test_progress_bars_render_and_advance_in_the_browser(page, lab, budget, artifacts):
    """The cookbook's progress bars are tqdm.auto bars (train(), msrun(), autotune()): ipywidgets in JupyterLab.
    Same call as mshelpers.train: a bar that advances, then goes away (leave=False)."""
    src = ("import time\nfrom tqdm.auto import tqdm\n"
           "for _ in tqdm(range(1, 41), desc='tiny graph', leave=False):\n    time.sleep(0.2)\nprint('done')")
    nb = WORK / "progress_bar.ipynb"
    nb.write_text(json.dumps({"cells": [jl.code_cell(src, 0)], "metadata": {"kernelspec": json.loads(
        NB05.read_text())["metadata"]["kernelspec"]}, "nbformat": 4, "nbformat_minor": 5}))
    jl.open_notebook(page, lab, nb, "e2e-progress", timeout_s=budget.left(60))
    jl.start_run_all(page)
    bar = page.locator(".jp-NotebookPanel .jp-OutputArea-output .widget-hbox").filter(
        has=page.locator(".widget-hprogress")).first
    bar.wait_for(timeout=20_000)
    counts = []
    for _ in range(40):
        text = bar.inner_text().replace("\u2007", " ") if bar.count() else ""     # tqdm pads with figure spaces
        m = re.search(r"(\d+)/40", text)
        if m:
            counts.append(int(m.group(1)))
            if len(set(counts)) >= 3:
                break
        time.sleep(0.25)
    assert "tiny graph" in text and len(set(counts)) >= 3 and counts == sorted(counts), (counts, text)
    width = bar.locator(".progress-bar").first.evaluate("e => parseFloat(getComputedStyle(e).width)")
    assert width > 0
    bar.screenshot(path=str(artifacts / "progress-bar.png"))
    page.locator(".jp-NotebookPanel .jp-OutputArea-output", has_text="done").wait_for(timeout=30_000)
    assert page.locator(".jp-NotebookPanel .widget-hprogress").count() == 0       # leave=False: it is gone
    lab.shutdown_kernels()
