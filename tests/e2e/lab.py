"""JupyterLab driven through its UI: start a server, open a notebook, run it, read widgets and outputs."""
from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import procs

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "build" / "e2e"
WORK = ARTIFACTS / "work"            # notebook copies, and what their kernels write (MSHELPERS_BUILD points here)

# User settings for a fresh JupyterLab: every cell stays in the DOM (no windowing), no news or update checks
# (the network is closed), no autosave (the opened notebooks are scratch copies anyway).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    proc: object
    log: Path

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=20) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        for k in self.api("kernels"):
            try:
                self.api(f"kernels/{k['id']}", method="DELETE")
            except OSError:
                pass


def start_lab(root: Path, state_dir: Path, log: Path, extra_env: dict | None = None,
              timeout_s: float = 60) -> Lab:
    """`jupyter lab` on a free loopback port with a token, serving `root`, with fresh settings/state dirs."""
    for rel, data in LAB_SETTINGS.items():
        f = state_dir / "settings" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(data))
    for d in ("workspaces", "runtime", "config", "ipython", "data"):
        (state_dir / d).mkdir(parents=True, exist_ok=True)
    port, token = procs.free_port(), secrets.token_hex(16)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               JUPYTERLAB_SETTINGS_DIR=str(state_dir / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(state_dir / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(state_dir / "runtime"), JUPYTER_CONFIG_DIR=str(state_dir / "config"),
               JUPYTER_DATA_DIR=str(state_dir / "data"), IPYTHONDIR=str(state_dir / "ipython"),
               **(extra_env or {}))
    env.pop("JUPYTER_PATH", None)
    cmd = [str(BIN / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
           "--allow-root", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--ServerApp.terminals_enabled=False",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--MappingKernelManager.default_kernel_name=python3"]
    proc = procs.start(cmd, log, env=env, cwd=root)
    lab = Lab(url=f"http://127.0.0.1:{port}", token=token, root=root.resolve(), proc=proc, log=log)
    try:
        procs.wait_http(f"{lab.url}/api/status?token={token}", timeout_s, proc=proc, log=log)
        procs.wait_http(f"{lab.url}/lab?token={token}", timeout_s, proc=proc, log=log)
    except BaseException:
        procs.stop(proc)
        raise
    return lab


# ---------------------------------------------------------------- notebooks on disk

def copy_notebook(src: Path, dst: Path, clear_outputs: bool) -> Path:
    """Copy a notebook; with clear_outputs, drop outputs, execution counts and saved widget state, so every
    output the test then sees was produced in this browser session."""
    nb = json.loads(src.read_text())
    if clear_outputs:
        for c in nb["cells"]:
            if c["cell_type"] == "code":
                c["outputs"], c["execution_count"] = [], None
                c.get("metadata", {}).pop("execution", None)
        nb["metadata"].pop("widgets", None)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(nb, indent=1, ensure_ascii=False))
    return dst


def stored_image_count(nb_path: Path) -> int:
    """image/png outputs stored in a notebook file (top-level cell outputs)."""
    nb = json.loads(nb_path.read_text())
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] if c["cell_type"] == "code"
               for o in c.get("outputs", []))


def code_cell(source: str, idx: int) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": f"e2e-{idx}", "metadata": {}, "outputs": [],
            "source": source}


# ---------------------------------------------------------------- the JupyterLab UI

def open_notebook(page, lab: Lab, nb: Path, workspace: str, timeout_s: float) -> None:
    """Open `nb` in a fresh named workspace (no tabs restored from earlier tests) and wait for an idle kernel."""
    rel = nb.resolve().relative_to(lab.root).as_posix()
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{rel}?token={lab.token}")
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_s * 1000)
    # The indicator says "idle" before a kernel is attached ("No Kernel"); Run All then pops a kernel dialog.
    page.wait_for_function(
        """() => { const p = document.querySelector('.jp-NotebookPanel');
                   const name = p && p.querySelector('.jp-Toolbar-kernelName');
                   const ind = p && p.querySelector('.jp-Notebook-ExecutionIndicator');
                   return name && ind && name.textContent.includes('Python 3')
                          && ind.getAttribute('data-status') === 'idle'; }""",
        timeout=timeout_s * 1000, polling=250)
    sessions = [s for s in lab.api("sessions") if s["path"] == rel]
    assert sessions and sessions[0]["kernel"]["name"] == "python3", sessions


_PROMPTS_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel');
  const ind = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {status: ind ? ind.getAttribute('data-status') : null,
          prompts: [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]
                     .map(e => e.textContent.trim())};
}"""


def prompts(page) -> dict:
    return page.evaluate(_PROMPTS_JS)


def start_run_all(page) -> None:
    """Click Run → Run All Cells in the menu bar."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator('li.lm-Menu-item[data-command="runmenu:run-all"]').click()


def run_all_cells(page, timeout_s: float) -> float:
    """Run → Run All Cells from the menu bar; wait until the kernel is idle with no cell queued.
    Fails, naming the cell, when a cell raised (JupyterLab then leaves the cells after it unexecuted)."""
    t0 = time.monotonic()
    start_run_all(page)
    page.wait_for_function(
        """() => { const ind = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
                   const ps = [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]
                                .map(e => e.textContent.trim());
                   return ind && ind.getAttribute('data-status') === 'idle' && ps.length > 0
                          && !ps.some(p => p.includes('*')) && !ps.every(p => p === '[ ]:'); }""",
        timeout=timeout_s * 1000, polling=500)
    state = prompts(page)
    not_run = [i for i, p in enumerate(state["prompts"]) if not re.fullmatch(r"\[\d+\]:", p)]
    errors = error_outputs(page)
    if not_run or errors:
        raise AssertionError(f"Run All: code cells {not_run} were not executed; "
                             f"error output: {errors[-1][-1500:] if errors else '(none shown)'}")
    return time.monotonic() - t0


_ERROR_LINE = re.compile(r"^Traceback \(most recent call last\)|^(\w+\.)*\w*(Error|Exception)(:|$)", re.M)


def error_outputs(page) -> list[str]:
    """Texts of the outputs that are exceptions (JupyterLab draws them, like stderr, as vnd.jupyter.stderr)."""
    texts = page.locator('.jp-NotebookPanel .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    return [t for t in texts.all_inner_texts() if _ERROR_LINE.search(t)]


_IMAGES_JS = """(root) => [...(root || document).querySelectorAll('.jp-RenderedImage img')].map(i => ({
    src: i.getAttribute('src').slice(0, 22), complete: i.complete, w: i.naturalWidth, h: i.naturalHeight}))"""


def rendered_images(page, root=None) -> list[dict]:
    """The decoded PNG images JupyterLab shows (in `root`, an element handle, or the whole page)."""
    imgs = root.evaluate(_IMAGES_JS) if root is not None else page.evaluate(_IMAGES_JS, None)
    return [i for i in imgs if i["src"].startswith("data:image/png") and i["complete"] and i["w"] > 50]


def wait_images(page, locator, n: int, timeout_s: float) -> list[dict]:
    """Wait until `locator` (or the page, for None) shows at least `n` decoded PNG images."""
    deadline = time.monotonic() + timeout_s
    while True:
        imgs = rendered_images(page, locator.element_handle() if locator is not None else None)
        if len(imgs) >= n or time.monotonic() > deadline:
            return imgs
        time.sleep(0.25)


# ---------------------------------------------------------------- the planner widget of notebook 05

class TableDidNotUpdate(AssertionError):
    """The widget's output does not match the sliders within the time allowed."""


_OUTPUT_JS = """(out) => {
  const rows = [];
  const table = out.querySelector('table');
  if (table) {
    const head = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    for (const tr of table.querySelectorAll('tbody tr')) {
      const cells = [...tr.querySelectorAll('td')].map(td => td.textContent.trim());
      rows.push(Object.fromEntries(head.map((h, i) => [h, cells[i]])));
    }
  }
  return {rows: rows, text: out.innerText};
}"""


def planner(page):
    """The planner widget: the VBox holding the sliders, the HTML the table is drawn in and the chart's Image."""
    return page.locator(".jp-NotebookPanel .widget-vbox").filter(has=page.locator(".widget-html")).filter(
        has=page.locator(".widget-slider")).first


def slider(widget, label: str):
    return widget.locator(".widget-slider").filter(
        has=widget.page.locator("label.widget-label", has_text=re.compile(rf"^{re.escape(label)}$")))


def readouts(widget) -> dict[str, int]:
    vals = {}
    for s in widget.locator(".widget-slider").all():
        vals[s.locator("label.widget-label").inner_text().strip()] = int(s.locator(".widget-readout").inner_text())
    return vals


def planner_output(widget) -> dict:
    return widget.locator(".widget-html").first.evaluate(_OUTPUT_JS)


_CHART_JS = """(img) => ({src: img.getAttribute('src') || '', complete: img.complete, w: img.naturalWidth,
  h: img.naturalHeight, shown: img.offsetParent !== null})"""


def planner_chart(widget) -> dict:
    """The planner's chart: an ipywidgets Image (its src is a blob: URL, new for every value), decoded and shown?"""
    return widget.locator("img.widget-image").first.evaluate(_CHART_JS)


def chart_drawn(c: dict) -> bool:
    return bool(c["src"]) and c["complete"] and c["w"] > 50 and c["shown"]


def move_slider(widget, label: str, key: str, expect: int, timeout_s: float = 10) -> None:
    """Focus the slider's handle and press an arrow key, as a keyboard user would; wait for its readout."""
    handle = slider(widget, label).locator(".noUi-handle")
    handle.focus()
    handle.press(key)
    readout = slider(widget, label).locator(".widget-readout")
    deadline = time.monotonic() + timeout_s
    while readout.inner_text().strip() != str(expect):
        if time.monotonic() > deadline:
            raise AssertionError(f"slider {label!r} shows {readout.inner_text()!r} after {key}, expected {expect}")
        time.sleep(0.1)


def table_matches(state: dict, r: dict[str, int]) -> bool:
    """Does the widget output show what the sliders say: the "yours" row for a valid layout, or the
    validate_layout message naming the product for dp*mp*pp != devices."""
    dp, mp, pp, m, n = r["dp"], r["mp"], r["pp"], r["micro-batches"], r["devices"]
    if dp * mp * pp != n:
        return f"dp*mp*pp = {dp}*{mp}*{pp} = {dp * mp * pp}" in state["text"] and not state["rows"]
    yours = next((row for row in state["rows"] if row.get("which") == "yours"), None)
    return bool(yours) and yours.get("layout") == f"{dp}dp×{mp}mp×{pp}pp m={m}" and \
        (yours.get("dp"), yours.get("mp"), yours.get("pp"), yours.get("m")) == (str(dp), str(mp), str(pp), str(m))


def wait_table_matches(widget, timeout_s: float) -> dict:
    r = readouts(widget)
    deadline = time.monotonic() + timeout_s
    while True:
        state = planner_output(widget)
        if table_matches(state, r):
            return state
        if time.monotonic() > deadline:
            raise TableDidNotUpdate(f"sliders say {r}, but after {timeout_s:.0f} s the planner output still "
                                    f"shows:\n{state['text'][:800]}")
        time.sleep(0.25)


def drive_planner(widget, timeout_s: float, shot=None) -> list[dict]:
    """Move mp 4 → 8 (32 devices: 8×8×1 is invalid, the output must say so), then dp 8 → 4 (4×8×1 is valid:
    the "yours" row must become 4dp×8mp×1pp). Returns the output state after each step."""
    states = [wait_table_matches(widget, timeout_s)]
    if shot:
        shot("before")
    move_slider(widget, "mp", "ArrowRight", 8)
    states.append(wait_table_matches(widget, timeout_s))
    move_slider(widget, "dp", "ArrowLeft", 4)
    states.append(wait_table_matches(widget, timeout_s))
    return states


def wait_chart(widget, timeout_s: float, not_src: str = "") -> dict:
    """Wait until the planner's chart is decoded and shown, from a value other than `not_src`."""
    deadline = time.monotonic() + timeout_s
    while True:
        c = planner_chart(widget)
        if (chart_drawn(c) and c["src"] != not_src) or time.monotonic() > deadline:
            return c
        time.sleep(0.25)
