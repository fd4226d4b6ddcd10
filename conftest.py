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
