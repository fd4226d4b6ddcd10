"""Runs as rows of named metrics: print them as a Markdown table, append them to a CSV.

Example:
    >>> from mshelpers.table import markdown_table
    >>> print(markdown_table([{"run": "pynative", "step_ms": 1312.0}, {"run": "graph", "step_ms": 201.5}]))
    | run      | step_ms |
    |----------|---------|
    | pynative | 1,312   |
    | graph    | 201.5   |
"""
from __future__ import annotations

import csv
import html
import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence


def _fmt(v: Any, digits: int) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if abs(v) >= 1000:
            return f"{v:,.0f}"        # 2,093 not 2092.9431: big values are read by magnitude
        return f"{v:.{digits}g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    return str(v)


def _columns(fn: str, rows: Sequence[dict], columns: Sequence[str] | None) -> list:
    """The columns asked for, or the union of the rows' keys in first-seen order."""
    if not rows:
        raise ValueError(f"{fn}: rows is empty; fix: pass at least one dict")
    if columns is not None:
        return list(columns)
    out: list = []
    for r in rows:
        out += [k for k in r if k not in out]
    return out


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None, digits: int = 4) -> str:
    """Format a list of dicts (one per run) as a GitHub Markdown table.

    Columns default to the union of keys in first-seen order. Floats get `digits`
    significant digits (or decimals for values >= 1).
    Taught in notebooks/00_environment.ipynb.
    """
    columns = _columns("markdown_table", rows, columns)
    cells = [[_fmt(r.get(c), digits) for c in columns] for r in rows]
    widths = [max(len(str(c)), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    out = [line([str(c) for c in columns]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def html_table(rows: Sequence[dict], columns: Sequence[str] | None = None, digits: int = 4) -> str:
    """The same table as markdown_table, as an HTML <table> (for an ipywidgets.HTML or a report page).

    Cells are escaped, so a value such as "a<b" shows as text.

    >>> html_table([{"run": "graph", "step_ms": 201.5}])
    '<table><thead><tr><th>run</th><th>step_ms</th></tr></thead><tbody><tr><td>graph</td><td>201.5</td></tr></tbody></table>'

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    columns = _columns("html_table", rows, columns)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c), digits))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def append_csv(row: dict, path: str | os.PathLike) -> Path:
    """Append one row to a CSV, writing the header when the file is new.

    New keys that the existing header lacks raise a ValueError rather than silently
    shifting columns.
    Taught in notebooks/06_recompute_memory.ipynb.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open(newline="") as f:
            header = next(csv.reader(f))
        extra = [k for k in row if k not in header]
        if extra:
            raise ValueError(f"append_csv: key {extra[0]!r} is not a column of {path}; "
                             f"fix: write to a new file or use the columns {header}")
        with path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=header).writerow(row)
    else:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            w.writeheader()
            w.writerow(row)
    return path


def parse_cell(v: str) -> Any:
    """One CSV cell back to what was written: True/False, int, float, else the string.
    Taught in: no notebook; metrics.py calls it."""
    if v in ("True", "False"):
        return v == "True"
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def read_csv(path: str | os.PathLike) -> list[dict]:
    """Read a CSV written by `append_csv`/`StepLogger`, turning numeric strings back into numbers.
    Taught in notebooks/03_mixed_precision.ipynb."""
    with Path(path).open(newline="") as f:
        return [{k: parse_cell(v) for k, v in r.items()} for r in csv.DictReader(f)]
