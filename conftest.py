"""Doctest collection for `pytest --doctest-modules mshelpers` (see `make unit`).

Every module example runs and must pass, except the whole examples skipped here, each with its reason
(it would train for a minute, start a server, or write into build/). No example is expected to fail:
an example defines what it uses and shows the output it gets, so a user can paste it as it stands.
A single line that cannot run here (an Ascend-only call, a long training run) is marked
`# <reason>  # doctest: +SKIP` where it stands, in the module's docstring.
"""
from __future__ import annotations

import pytest

# mshelpers/workers/*.py are msrun scripts: importing one runs it
collect_ignore = ["mshelpers/workers"]

DOCTEST_SKIP = {
    "mshelpers.train": "trains mini for 20 graph steps (about 40 s on 2 cores), and its last line shows no output",
    "mshelpers.compiling": "runs first_steps in a fresh process (about 20 s), and its timing line shows no output",
    "mshelpers.summary": "writes build/summary/run1 under the working directory and starts a MindInsight server",
}


def pytest_collection_modifyitems(config, items):
    from _pytest.doctest import DoctestItem
    for item in items:
        if not isinstance(item, DoctestItem):
            continue
        if item.name in DOCTEST_SKIP:
            item.add_marker(pytest.mark.skip(reason=DOCTEST_SKIP[item.name]))


# `make nbval` runs its paired notebooks on two xdist workers with NBVAL_PIN_CORES=1: each worker (and the kernels
# and processes it starts, which inherit it) keeps to one core of its own. Unpinned, the two kernels' thread pools
# share both cores and trade them back and forth; pinned, a mini graph step ran 0.375 s on each of two cores at
# once against 0.40-0.54 s unpinned (AMD EPYC Zen 4, 2 cores, 2026-12-04), and a notebook's rounds no longer
# see its neighbour's phases. A pinned process sees one thread, so the peak cache needs its one-thread entry:
# the controller measures it first, pinned, on the idle machine (peak.peak_flops keys entries by threads).
def _pin_cores() -> bool:
    import os
    return os.environ.get("NBVAL_PIN_CORES") == "1" and hasattr(os, "sched_setaffinity")


def pytest_configure(config):
    import os
    if not _pin_cores():
        return
    cores = sorted(os.sched_getaffinity(0))
    # xdist gives a worker its id in config.workerinput; not the PYTEST_XDIST_WORKER variable, which a pytest run
    # started from inside a worker (tests/test_pin_cores.py under `make unit`) inherits while it is a controller
    worker = getattr(config, "workerinput", {}).get("workerid")      # "gw0", "gw1", ...; None in the controller
    if worker is not None:
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})
    elif len(cores) > 1:
        os.sched_setaffinity(0, {cores[0]})
        try:
            from mshelpers.peak import peak_flops
            peak_flops()
        finally:
            os.sched_setaffinity(0, set(cores))
