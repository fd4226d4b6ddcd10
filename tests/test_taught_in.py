"""Every public function and class names the notebook that teaches it (issue 58: rooms that explain themselves).

A docstring says `Taught in notebooks/NN_name.ipynb`, `Taught with the rest of <module> in notebooks/NN_...`, or
`Taught in: no notebook; <who> calls it` for plumbing no notebook calls. The worker scripts under workers/ are
scripts msrun launches, so their module docstring names the notebook that runs them. A named notebook must exist.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mshelpers"
NOTEBOOK = re.compile(r"notebooks/(\d\d_\w+\.ipynb)")
TAUGHT = re.compile(r"Taught (in|with)|Runs in|No notebook")


def _public(tree):
    return [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]


def _untaught():
    out = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(ROOT).as_posix()
        if "/workers/" in rel:
            doc = ast.get_docstring(tree) or ""
            if _public(tree) and not NOTEBOOK.search(doc):
                out.append(f"{rel}: module docstring names no notebook")
            continue
        for n in _public(tree):
            doc = ast.get_docstring(n) or ""
            if not (TAUGHT.search(doc) and (NOTEBOOK.search(doc) or "no notebook" in doc.lower())):
                out.append(f"{rel}:{n.lineno} {n.name}")
    return out


def test_every_public_definition_names_the_notebook_that_teaches_it():
    missing = _untaught()
    assert not missing, f"{len(missing)} public definitions name no notebook:\n" + "\n".join(missing)


def test_every_named_notebook_exists():
    have = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        for m in NOTEBOOK.finditer(path.read_text()):
            if m.group(1) not in have:
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
    assert not wrong, "docstrings name notebooks that do not exist:\n" + "\n".join(wrong)
