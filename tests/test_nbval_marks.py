"""Every notebook code cell is either output-checked by nbval or listed, with its reason, as unchecked.

`pytest --nbval-lax` compares only the cells marked `# NBVAL_CHECK_OUTPUT`. tests/README.md's section "Unchecked code
cells" lists, per notebook, each code cell left unmarked (nbval's index: code cells from 0, and its first line) and
why its output is measured or machine-dependent. This fails when a cell is neither marked nor listed (a new cell
nobody decided on), when a listed cell is marked or gone, or when a listed first line no longer starts the cell at
that index (cells moved: the list has rotted). No notebook is executed.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
README = ROOT / "tests" / "README.md"
MARK = "# NBVAL_CHECK_OUTPUT"
SECTION = "## Unchecked code cells"
ROW = re.compile(r"^\| (\d+) \| `([^`]*)` \| (.+?) \|\s*$")
COUNT = re.compile(r"^(?:(\d+) of (\d+)|all (\d+)) code cells checked")


def code_cells(nb_path):
    return ["".join(c["source"]) for c in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]


def marked(src):
    return any(line.strip() == MARK for line in src.splitlines())


def first_line(src):
    return next((l.strip() for l in src.splitlines() if l.strip() and l.strip() != MARK), "")


def listed(readme_text):
    """{notebook stem: {cell index: (first line as listed, reason)}} from the README's section."""
    start = readme_text.find(SECTION)
    assert start >= 0, f"tests/README.md has no section {SECTION!r}"
    end = readme_text.find("\n## ", start + len(SECTION))
    out, nb = {}, None
    for line in readme_text[start:end if end >= 0 else None].splitlines():
        if line.startswith("### "):
            nb = line[4:].strip()
            assert nb not in out, f"{nb} listed twice"
            out[nb] = {}
        elif (m := ROW.match(line)):
            assert nb, f"a row before any notebook heading: {line}"
            i = int(m.group(1))
            assert i not in out[nb], f"{nb} cell {i} listed twice"
            out[nb][i] = (m.group(2), m.group(3).strip())
        elif (m := COUNT.match(line)):
            assert nb, f"a count before any notebook heading: {line}"
            out[nb]["counts"] = (int(m.group(1) or m.group(3)), int(m.group(2) or m.group(3)))
    return out


def problems(notebooks: dict, table: dict) -> list:
    """notebooks: {stem: [code cell sources]}; table: listed(). Every disagreement, as a readable line."""
    bad = [f"{nb}: in the README but no such notebook" for nb in table if nb not in notebooks]
    for nb, cells in notebooks.items():
        rows = dict(table.get(nb, {}))
        if nb not in table:
            bad.append(f"{nb}: no '### {nb}' in the README's section")
        counts = rows.pop("counts", None)
        n_marked = sum(map(marked, cells))
        if counts is not None and counts != (n_marked, len(cells)):
            bad.append(f"{nb}: the README says {counts[0]} of {counts[1]} code cells checked, the notebook has "
                       f"{n_marked} of {len(cells)}")
        for i, src in enumerate(cells):
            if marked(src):
                if i in rows:
                    bad.append(f"{nb} cell {i}: marked {MARK} but listed as unchecked")
                if "\n%%" in "\n" + src.split(MARK, 1)[1]:
                    bad.append(f"{nb} cell {i}: {MARK} above a cell magic (%%...), which must be the cell's first line")
            elif i not in rows:
                bad.append(f"{nb} cell {i} ({first_line(src)[:60]!r}): neither marked {MARK} nor listed as unchecked")
        for i, (shown, reason) in rows.items():
            if i >= len(cells):
                bad.append(f"{nb} cell {i}: listed, but the notebook has {len(cells)} code cells")
                continue
            actual = first_line(cells[i])
            ok = actual.startswith(shown[:-1]) if shown.endswith("…") else actual == shown
            if not ok:
                bad.append(f"{nb} cell {i}: listed as starting {shown!r}, starts {actual!r}")
            if not reason:
                bad.append(f"{nb} cell {i}: no reason given")
    return bad


def test_every_code_cell_is_checked_or_listed_with_its_reason():
    assert NOTEBOOKS
    bad = problems({p.stem: code_cells(p) for p in NOTEBOOKS}, listed(README.read_text(encoding="utf-8")))
    assert not bad, "tests/README.md's 'Unchecked code cells' and the notebooks disagree:\n" + "\n".join(bad)


def test_the_check_can_fail():
    nbs = {"00_x": [MARK + "\nprint(1)", "import time\nt = time.time()", "x = 1"]}
    readme = (f"{SECTION}\n\n### 00_x\n\n| cell | first line | why not checked |\n| --- | --- | --- |\n"
              "| 1 | `import time` | a time |\n| 2 | `x = 1` | none |\n\n## Next\n| 9 | `nope` | outside |\n")
    assert problems(nbs, listed(readme)) == []
    assert listed(readme)["00_x"].keys() == {1, 2}          # the next section's table is not read
    counted = readme.replace("### 00_x\n", "### 00_x\n\n1 of 3 code cells checked; not checked:\n")
    assert problems(nbs, listed(counted)) == []
    assert problems(nbs, listed(counted.replace("1 of 3", "2 of 3"))) == [
        "00_x: the README says 2 of 3 code cells checked, the notebook has 1 of 3"]
    nbs["00_x"][1] = MARK + "\n" + nbs["00_x"][1]          # marked and listed
    nbs["00_x"][2] = nbs["00_x"][2].replace("x = 1", "y = 2")      # the listed first line moved
    nbs["00_x"].append("z = 3")                             # a new cell nobody decided on
    nbs["00_x"][0] = nbs["00_x"][0].replace(MARK + "\n", "")        # a mark removed
    bad = problems(nbs, listed(readme))
    assert sorted(b.split(":")[0] for b in bad) == ["00_x cell 0 ('print(1)')", "00_x cell 1", "00_x cell 2",
                                                    "00_x cell 3 ('z = 3')"]
    assert any("no '### 01_y'" in b for b in problems({"01_y": ["a = 1"]}, listed(readme)))
    with pytest.raises(AssertionError, match="no section"):
        listed("# Tests\n")
    magic = MARK + "\n%%writefile x.py\nprint(1)"
    assert [b.split(": ")[1][:len(MARK) + 6] for b in problems({"00_x": [magic]}, listed(f"{SECTION}\n### 00_x\n"))] == [
        f"{MARK} above"]
    truncated = f"{SECTION}\n### 00_x\n| 0 | `import mindspore…` | a time |\n"
    assert problems({"00_x": ["import mindspore as ms"]}, listed(truncated)) == []
    assert problems({"00_x": ["import numpy as np"]}, listed(truncated))
