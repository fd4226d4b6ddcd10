"""MindInsight shows a real run: a short training run writes loss scalars with SummaryRecord
(mshelpers.summary.ScalarSummary), `mindinsight start` serves them, and Chromium draws the loss chart."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse

import pytest

import procs
from lab import ARTIFACTS, BIN, REPO, WORK

RUN = "e2e-tiny-graph"
STEPS = 40
# The tiny LLaMA in graph mode: ~10 s to compile, then a few ms a step. MFU is not looked at here, so the
# peak FLOP/s is given rather than measured.
TRAIN = """
import json, sys
from mshelpers.config import RunConfig
from mshelpers.summary import ScalarSummary
from mshelpers.train import train
cfg = RunConfig.preset("tiny").replace(mode="graph", steps=int(sys.argv[2]))
with ScalarSummary(sys.argv[1]) as log:
    hist = train(cfg, callbacks=[log], progress=False, peak_flops=1e12, csv_path=sys.argv[3])
print("LOSSES " + json.dumps([[r["step"], r["loss"]] for r in hist.rows]))
"""

_PAINTED_JS = """(card) => {
  const c = card.querySelector('canvas');
  if (!c || !c.width || !c.height) return -1;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;                       // saturated pixels: the series line, not the grey axes and grid
  for (let i = 0; i < d.length; i += 4)
    if (d[i + 3] > 128 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 80) n++;
  return n;
}"""


def wait_painted(card, min_pixels: int = 100, timeout_s: float = 20) -> None:
    """Wait until the card's chart canvas shows a series line and has stopped changing (echarts animates
    the line in)."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        painted = card.evaluate(_PAINTED_JS)
        if painted >= min_pixels and painted == last:
            break
        last = painted
        time.sleep(0.5)
    assert painted >= min_pixels, f"the chart's canvas shows no series line ({painted} coloured pixels)"


@pytest.fixture(scope="module")
def summary_run(budget):
    base = ARTIFACTS / "summary"
    env = dict(os.environ, MSHELPERS_BUILD=str(WORK / "build"), PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", TRAIN, str(base / RUN), str(STEPS), str(WORK / f"{RUN}.csv")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=budget.left(150))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    losses = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("LOSSES "))[7:])
    print(f"summary run: {len(losses)} steps in {time.monotonic() - t0:.0f} s")
    return base, losses


@pytest.fixture(scope="module")
def mindinsight(summary_run, budget):
    """`mindinsight start` on a free port in its own process group (gunicorn daemonizes but stays in it);
    `mindinsight stop` and a kill of that group afterwards, even when the test failed."""
    from mshelpers.summary import MindInsight
    base, _ = summary_run
    port, workspace, log = procs.free_port(), ARTIFACTS / "mindinsight-workspace", ARTIFACTS / "logs" / "mindinsight.log"
    exe = str(BIN / "mindinsight")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")   # it starts `gunicorn` by name
    proc = procs.start([exe, "start", "--port", str(port), "--summary-base-dir", str(base),
                        "--workspace", str(workspace)], log, env=env, cwd=REPO)
    try:
        rc = proc.wait(timeout=budget.left(90))
        assert rc == 0, procs.tail(log)
        mi = MindInsight(base, port=port)
        deadline = time.monotonic() + budget.left(60)
        while True:                      # it answers before it has scanned the summary folder
            try:
                if mi.get("datavisual/train-jobs").get("load_status") == "loaded" and mi.train_jobs():
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"MindInsight on {port} never listed the run\n{procs.tail(log)}"
            time.sleep(0.5)
        yield mi
    finally:
        subprocess.run([exe, "stop", "--port", str(port)], capture_output=True, env=env, timeout=60)
        members = procs.group_members(proc.pid)
        procs.stop(proc, grace_s=5, extra_pgids={proc.pid})
        for p in members:
            try:
                p.kill()
            except Exception:  # noqa: BLE001  (already gone)
                pass
        deadline = time.monotonic() + 15
        while procs.listeners(port) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not procs.listeners(port), f"MindInsight still listens on {port} after stop"


def test_mindinsight_scalar_dashboard_draws_the_loss_of_a_real_run(mindinsight, summary_run, page, artifacts):
    _, losses = summary_run
    train_id = f"./{RUN}"
    jobs = {j["train_id"]: j for j in mindinsight.train_jobs()}
    assert "loss/scalar" in jobs[train_id]["plugins"]["scalar"], jobs
    served = mindinsight.scalars(train_id, "loss/scalar")
    assert [s for s, _ in served] == [s for s, _ in losses]
    assert [v for _, v in served] == pytest.approx([v for _, v in losses], rel=1e-5)

    server_errors = []
    page.on("response", lambda r: server_errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    q = urllib.parse.quote(train_id, safe="")

    # The training dashboard: its scalar card draws the run's curves.
    page.goto(f"{mindinsight.url}/#/train-manage/training-dashboard?id={q}")
    card = page.locator(".cl-dashboard-con-up").filter(
        has=page.locator(".cl-dashboard-title", has_text="Training Scalar Information")).first
    card.locator("canvas").wait_for(timeout=30_000)
    wait_painted(card)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(artifacts / "mindinsight-dashboard.png"))

    # The scalar page: one chart per tag; the loss chart must be drawn.
    page.goto(f"{mindinsight.url}/#/train-manage/scalar?train_id={q}")
    loss_card = page.locator(".sample-content").filter(
        has=page.locator(".tag-name", has_text="loss/scalar")).first
    loss_card.locator("canvas").wait_for(timeout=30_000)
    wait_painted(loss_card)
    page.wait_for_load_state("networkidle")
    loss_card.screenshot(path=str(artifacts / "mindinsight-loss-chart.png"))
    page.screenshot(path=str(artifacts / "mindinsight-scalars.png"))
    assert not server_errors, f"MindInsight answered with server errors: {server_errors}"
