"""Tidy executed notebooks before committing them: python tests/tidy_outputs.py notebooks/*.ipynb

nbconvert stores a cell's stdout as many chunks, one per flush. A progress bar's first chunk ("0/8") is then an
output of its own, and a viewer that renders chunks one by one (GitHub, nbviewer) shows a bar frozen at 0 %.
This joins each cell's adjacent chunks of one stream and applies carriage returns line by line, so what is
stored is what a terminal shows at the end. Cells marked # NBVAL_CHECK_OUTPUT are left byte-identical (nbval
compares them). `make outputs` runs it after executing the notebooks; tests/test_notebook_outputs.py fails on
an output that, taken alone, shows a bar short of its total.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def visible(text: str) -> str:
    """Per line, what follows the last carriage return (a line that ends in \\r keeps what it overwrote)."""
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        parts = [p for p in line.split("\r") if p]
        out.append(parts[-1] if parts else "")
    return "\n".join(out)


def tidy_cell(cell: dict) -> bool:
    if cell.get("cell_type") != "code" or "".join(cell.get("source", "")).lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
        return False
    merged: list[dict] = []
    for o in cell.get("outputs", []):
        prev = merged[-1] if merged else None
        if (o.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream"
                and prev.get("name") == o.get("name")):
            prev["text"] = "".join(prev["text"]) + "".join(o.get("text", ""))
        else:
            merged.append(dict(o))
    for o in merged:
        if o.get("output_type") == "stream":
            o["text"] = visible("".join(o["text"])).splitlines(keepends=True)
    changed = merged != cell.get("outputs", [])
    cell["outputs"] = merged
    return changed


def tidy(path: str | Path) -> int:
    p = Path(path)
    nb = json.loads(p.read_text())
    n = sum(tidy_cell(c) for c in nb["cells"])
    if n:
        p.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return n


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(f"{f}: {tidy(f)} cells tidied")
