"""requirements.txt is the one source of exact versions; environment.yml must mirror it."""
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def pins_from_requirements():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {l.split("==")[0].lower(): l.split("==")[1].strip() for l in lines
            if l.strip() and not l.startswith("#")}


def test_every_requirement_is_pinned_exactly():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.\-]*", line.strip()), line


def test_environment_yml_mirrors_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    env_pins = {p.split("==")[0].lower(): p.split("==")[1] for p in pip_section if "==" in p}
    assert env_pins == pins_from_requirements()


def test_the_stack_the_platform_notes_require():
    pins = pins_from_requirements()
    assert pins["mindspore"] == "2.9.0" and pins["mindformers"] == "1.9.0"
    assert pins["numpy"].startswith("1.") and pins["protobuf"] == "3.20.1"


def test_installed_versions_match_the_pins():
    from importlib.metadata import version
    for name, v in pins_from_requirements().items():
        assert version(name) == v, f"{name}: installed {version(name)}, pinned {v}"


# ---------------------------------------------------------------- no import-skip of a pinned package
# A test that skips when a pinned package fails to import turns a broken install green (tests/conftest.py).
# Import names that differ from the distribution's, for when the distribution is not installed to ask it.
_IMPORT_NAMES = {"pyyaml": "yaml", "protobuf": "google.protobuf", "pytest-xdist": "xdist"}


def pinned_import_names() -> dict[str, str]:
    """Top-level import name -> pinned distribution, from requirements.txt and the installed metadata."""
    from importlib.metadata import packages_distributions
    pins = set(pins_from_requirements())
    names = {_IMPORT_NAMES.get(p, p.replace("-", "_")).split(".")[0]: p for p in pins}
    for top, dists in packages_distributions().items():
        for d in dists:
            if d.lower().replace("_", "-") in pins:
                names.setdefault(top, d.lower().replace("_", "-"))
    return names


def import_skips(source: str, where: str, pinned: dict[str, str]) -> list[str]:
    """Each import-skip of a pinned package in `source`: pytest.importorskip("x"), a try that imports x with an
    `except ImportError/ModuleNotFoundError` (or bare except) that skips, and a skipif on find_spec("x")."""
    import ast
    tree = ast.parse(source)
    found = []

    def pinned_of(module: str | None) -> str | None:
        return pinned.get((module or "").split(".")[0])

    def is_skip(node: ast.AST) -> bool:
        return any((isinstance(n, ast.Attribute) and n.attr in ("skip", "xfail"))
                   or (isinstance(n, ast.Name) and n.id in ("skip", "xfail")) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            arg = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            if name == "importorskip" and isinstance(arg, str) and pinned_of(arg):
                found.append(f"{where}:{node.lineno}: importorskip({arg!r}) skips pinned {pinned_of(arg)}")
            if name == "skipif":
                for n in ast.walk(node):
                    if (isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "find_spec"
                            and n.args and isinstance(n.args[0], ast.Constant) and pinned_of(n.args[0].value)):
                        found.append(f"{where}:{node.lineno}: skipif on find_spec({n.args[0].value!r}) skips "
                                     f"pinned {pinned_of(n.args[0].value)}")
        if isinstance(node, ast.Try):
            imported = [a.name for n in node.body for s in ast.walk(n) if isinstance(s, ast.Import) for a in s.names]
            imported += [s.module for n in node.body for s in ast.walk(n) if isinstance(s, ast.ImportFrom)
                         and s.module and not s.level]
            imported += [s.args[0].value for n in node.body for s in ast.walk(n) if isinstance(s, ast.Call)
                         and getattr(s.func, "attr", getattr(s.func, "id", "")) == "import_module"
                         and s.args and isinstance(s.args[0], ast.Constant)]
            hits = [m for m in imported if pinned_of(m)]
            for h in node.handlers:
                t = h.type
                caught = {e.id if isinstance(e, ast.Name) else getattr(e, "attr", "")
                          for e in ((t.elts if isinstance(t, ast.Tuple) else [t]) if t is not None else [])}
                if hits and (t is None or caught & {"ImportError", "ModuleNotFoundError", "Exception"}) and is_skip(h):
                    found.append(f"{where}:{h.lineno}: except {sorted(caught) or 'everything'} skips when pinned "
                                 f"{pinned_of(hits[0])} fails to import")
    return found


def test_no_test_import_skips_a_pinned_package():
    pinned = pinned_import_names()
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        found += import_skips(path.read_text(), str(path.relative_to(ROOT)), pinned)
    assert found == [], ("a pinned package must import or the run fails (tests/conftest.py); "
                         "fix: import it plainly:\n" + "\n".join(found))


def test_the_import_skip_scanner_sees_each_form():
    pinned = pinned_import_names()
    assert pinned["mindspore"] == "mindspore" and pinned["yaml"] == "pyyaml" and pinned["numpy"] == "numpy"
    planted = '''
import pytest, importlib.util
ms = pytest.importorskip("mindspore")
from pytest import importorskip
yaml = importorskip("yaml.loader")
try:
    import numpy as np
except ImportError:
    pytest.skip("no numpy", allow_module_level=True)
try:
    from mindformers import models
except (ModuleNotFoundError, OSError) as e:
    raise pytest.skip.Exception("x")
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no mpl")
def test_x(): pass
'''
    lines = [f.split(": ")[0] for f in import_skips(planted, "t.py", pinned)]
    assert sorted(lines) == ["t.py:12", "t.py:14", "t.py:3", "t.py:5", "t.py:8"], lines
    # skips of what is not pinned (a platform, an optional tool) stay allowed
    allowed = '''
import pytest, shutil
torch = pytest.importorskip("torch")
try:
    import mindspore
except ImportError:
    raise
if shutil.which("g++") is None:
    pytest.skip("g++ is missing")
'''
    assert import_skips(allowed, "t.py", pinned) == []
