"""Suite-wide guard: a missing or broken pinned package fails the run at once, with the fix.

Pinned packages are never import-skipped: a test that skips because MindSpore is broken
would turn a bad install green. Skips are kept for the platform only (an Ascend-only path,
a compiler a bench-only candidate needs) and always say why.
"""
from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIX = "fix: run `make venv` (or `.venv/bin/pip install -r requirements.txt`) and rerun"
# imported here because every MindSpore test needs them; mindformers (8 s to import) is version-checked only
MUST_IMPORT = ("numpy", "mindspore")


def pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, v = line.split("==")
            pins[name.strip().lower()] = v.strip()
    return pins


def pin_problems() -> list[str]:
    problems = []
    for name, want in pinned().items():
        try:
            have = version(name)
        except PackageNotFoundError:
            problems.append(f"{name}=={want} is not installed")
            continue
        if have != want:
            problems.append(f"{name} {have} is installed, {want} is pinned")
    for mod in MUST_IMPORT:
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - a broken install raises anything
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            problems.append(f"`import {mod}` fails: {type(e).__name__}: {first}")
    return problems


def pytest_sessionstart(session):
    problems = pin_problems()
    if problems:
        raise pytest.UsageError("the pinned stack is broken:\n  " + "\n  ".join(problems) + f"\n{FIX}")
