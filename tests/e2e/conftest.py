"""Fixtures of the browser suite: headless Debian Chromium under Playwright, JupyterLab, the artifacts folder.

Run with `make e2e` (installs chromium with apt-get when it is missing). Screenshots go to build/e2e/;
on a failure the page's screenshot and text are saved there too.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

import lab as jl
import procs
from lab import ARTIFACTS, REPO, WORK
CHROMIUM = os.environ.get("E2E_CHROMIUM", "/usr/bin/chromium")
# The network is closed here: without these flags Chromium keeps retrying connections to Google services.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BUDGET_S = float(os.environ.get("E2E_BUDGET_S", "300"))   # the whole suite, servers and browser included
_T0: float | None = None


class Budget:
    """Seconds left of the suite's budget: every long wait is capped by it, so an overrun fails, not hangs."""

    def left(self, cap: float | None = None) -> float:
        left = max(5.0, BUDGET_S - (time.monotonic() - (_T0 or time.monotonic())))
        return min(left, cap) if cap else left


@pytest.fixture(scope="session", autouse=True)
def _fresh_artifacts():
    """Start the budget clock; build/e2e/ holds this run's screenshots and copies only."""
    global _T0
    _T0 = time.monotonic()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    WORK.mkdir(parents=True)
    yield


def pytest_sessionfinish(session, exitstatus):
    if _T0 is None:                                   # no e2e test ran (collect-only, deselected, ...)
        return
    took = time.monotonic() - _T0
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr:
        tr.write_line(f"e2e suite: {took:.0f} s of its {BUDGET_S:.0f} s budget; screenshots in {ARTIFACTS}")
    if took > BUDGET_S and session.exitstatus == 0:
        if tr:
            tr.write_line(f"FAILED: the e2e suite took {took:.0f} s, over its {BUDGET_S:.0f} s budget", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def budget() -> Budget:
    return Budget()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """One headless Chromium (Debian's) with a fresh profile, for the whole suite."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make e2e` (it installs Debian's chromium and chromium-driver "
                    "with apt-get) or `apt-get install chromium chromium-driver`")
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    ctx = None
    try:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
        ctx.set_default_timeout(30_000)
        yield ctx
    finally:
        try:
            if ctx is not None:
                ctx.close()
        finally:
            pw.stop()


@pytest.fixture
def page(browser, request, artifacts):
    """A new tab; on a failure its screenshot and text are saved to build/e2e/FAILED-<test>.*"""
    pg = browser.new_page()
    console = []
    pg.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    try:
        yield pg
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is None or rep.failed:
            stem = artifacts / f"FAILED-{request.node.name}"
            try:
                pg.screenshot(path=str(stem.with_suffix(".png")), full_page=True, timeout=15_000)
                stem.with_suffix(".txt").write_text(pg.url + "\n\n" + pg.inner_text("body", timeout=5_000)
                                                    + "\n\n--- console ---\n" + "\n".join(console[-200:]))
            except Exception as e:           # noqa: BLE001  (the page may be gone; the failure itself matters)
                print(f"could not save the failure screenshot: {e!r}")
        pg.close()


@pytest.fixture(scope="session")
def lab(tmp_path_factory, artifacts):
    """`jupyter lab` on a free loopback port with a token and the venv's python3 kernel, serving the repo.
    Stopped, with its kernels and everything they started, even when a test fails."""
    server = None
    try:
        server = jl.start_lab(REPO, tmp_path_factory.mktemp("jupyter-state"), artifacts / "logs" / "jupyterlab.log",
                              extra_env={"MSHELPERS_BUILD": str(WORK / "build")})
        assert server.api("kernelspecs")["default"] == "python3"
        yield server
    finally:
        if server is not None:
            try:
                server.shutdown_kernels()
            except OSError:
                pass
            procs.stop(server.proc)
