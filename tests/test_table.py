"""mshelpers.table: Markdown and HTML tables of run rows, and the CSV they are appended to and read back from.

Every expected string is written out by hand below (widths, separators, number formats), not produced by the code.
"""
import math

import pytest

from mshelpers.table import append_csv, html_table, markdown_table, parse_cell, read_csv


# --- markdown_table -------------------------------------------------------------------------------------------------

def test_markdown_table_pads_every_column_to_its_widest_cell():
    rows = [{"run": "a", "ms": 2092.9431}, {"run": "graph", "ms": 0.5, "ok": True}]
    # columns: run, ms, ok (first seen). Cells: a | 2,093 | (none)   and   graph | 0.5 | True.
    # widths: run max(3, 1, 5) = 5, ms max(2, 5, 3) = 5, ok max(2, 0, 4) = 4; the rule is width + 2 dashes.
    assert markdown_table(rows).splitlines() == [
        "| run   | ms    | ok   |",
        "|-------|-------|------|",
        "| a     | 2,093 |      |",
        "| graph | 0.5   | True |",
    ]


def test_markdown_table_module_example():
    assert markdown_table([{"run": "pynative", "step_ms": 1312.0}, {"run": "graph", "step_ms": 201.5}]) == (
        "| run      | step_ms |\n"
        "|----------|---------|\n"
        "| pynative | 1,312   |\n"
        "| graph    | 201.5   |")


@pytest.mark.parametrize("value, digits, cell", [
    (2092.9431, 4, "2,093"),          # >= 1000: no decimals, thousands separated
    (-1500.7, 4, "-1,501"),           # the magnitude decides, not the sign
    (1000.0, 4, "1,000"),             # the boundary itself is "big"
    (999.94, 4, "999.9"),             # just below it: 4 significant digits
    (0.123456, 4, "0.1235"),
    (0.123456, 2, "0.12"),
    (3.14159, 3, "3.14"),
    (1e-5, 4, "1e-05"),               # %g switches to exponent form for small values
    (float("nan"), 4, "nan"),
    (float("inf"), 4, "inf"),
    (float("-inf"), 4, "-inf"),
    (9999, 4, "9999"),                # ints below 10,000 unseparated (years, step counts)
    (10000, 4, "10,000"),
    (-12345, 4, "-12,345"),
    (True, 4, "True"),                # a bool is not formatted as the int 1
    (False, 4, "False"),
    (None, 4, ""),
    ("1e-3", 4, "1e-3"),              # strings pass through untouched
])
def test_markdown_table_formats_each_value_type(value, digits, cell):
    t = markdown_table([{"v": value}], digits=digits)
    assert t.splitlines()[2].split("|")[1].strip() == cell


def test_markdown_table_columns_pick_and_order_and_may_name_a_missing_key():
    rows = [{"a": 1, "b": 2}, {"a": 3, "c": 4}]
    assert markdown_table(rows).splitlines()[0] == "| a | b | c |"
    assert markdown_table(rows, columns=["c", "a"]).splitlines() == [
        "| c | a |",
        "|---|---|",
        "|   | 1 |",
        "| 4 | 3 |",
    ]
    # a column no row has is an empty column, not an error
    assert markdown_table(rows, columns=["zz"]).splitlines() == ["| zz |", "|----|", "|    |", "|    |"]


def test_markdown_table_refuses_no_rows_in_one_line():
    with pytest.raises(ValueError) as e:
        markdown_table([])
    assert str(e.value) == "markdown_table: rows is empty; fix: pass at least one dict"


# --- html_table -----------------------------------------------------------------------------------------------------

def test_html_table_exactly():
    rows = [{"run": "a<b", "ms": 1312.0}, {"run": 'say "hi"', "ms": 0.5, "x": False}]
    assert html_table(rows) == (
        "<table><thead><tr><th>run</th><th>ms</th><th>x</th></tr></thead><tbody>"
        "<tr><td>a&lt;b</td><td>1,312</td><td></td></tr>"
        "<tr><td>say &quot;hi&quot;</td><td>0.5</td><td>False</td></tr>"
        "</tbody></table>")


def test_html_table_escapes_the_header_and_takes_columns_and_digits():
    t = html_table([{"p&l": 0.98765, "n": 12}], columns=["n", "p&l"], digits=2)
    assert t == ("<table><thead><tr><th>n</th><th>p&amp;l</th></tr></thead><tbody>"
                 "<tr><td>12</td><td>0.99</td></tr></tbody></table>")


def test_html_table_refuses_no_rows_in_one_line():
    with pytest.raises(ValueError) as e:
        html_table([])
    assert str(e.value) == "html_table: rows is empty; fix: pass at least one dict"


# --- append_csv, parse_cell, read_csv -------------------------------------------------------------------------------

def test_append_csv_writes_the_header_once_and_appends_by_column_name(tmp_path):
    path = tmp_path / "runs" / "deep" / "r.csv"               # parents are made
    got = append_csv({"run": "a", "ms": 1.5}, path)
    assert got == path
    append_csv({"ms": 2, "run": "b"}, str(path))              # another key order, a str path
    append_csv({"run": "c"}, path)                            # a missing key: an empty cell
    # the csv module ends lines with \r\n
    assert path.read_bytes() == b"run,ms\r\na,1.5\r\nb,2\r\nc,\r\n"


def test_append_csv_refuses_a_new_key_and_leaves_the_file_alone(tmp_path):
    path = append_csv({"a": 1, "b": 2}, tmp_path / "r.csv")
    before = path.read_bytes()
    with pytest.raises(ValueError) as e:
        append_csv({"a": 3, "z": 4}, path)
    assert str(e.value) == (f"append_csv: key 'z' is not a column of {path}; "
                            "fix: write to a new file or use the columns ['a', 'b']")
    assert path.read_bytes() == before


def test_append_csv_treats_an_empty_file_as_new(tmp_path):
    path = tmp_path / "r.csv"
    path.write_bytes(b"")
    append_csv({"a": 1}, path)
    assert path.read_bytes() == b"a\r\n1\r\n"


@pytest.mark.parametrize("text, value", [
    ("True", True), ("False", False),
    ("true", "true"),                 # only Python's own spelling is a bool
    ("3", 3), ("-3", -3),
    ("3.5", 3.5), ("1e3", 1000.0), ("-0.25", -0.25),
    ("1,312", "1,312"),               # a formatted table cell is not a number
    ("", ""), ("graph", "graph"),
])
def test_parse_cell(text, value):
    got = parse_cell(text)
    assert got == value and type(got) is type(value)


def test_parse_cell_reads_nan_and_inf_back_as_floats():
    assert math.isnan(parse_cell("nan")) and parse_cell("inf") == math.inf and parse_cell("-inf") == -math.inf


def test_read_csv_gives_back_what_append_csv_wrote(tmp_path):
    path = tmp_path / "r.csv"
    rows = [{"run": "graph", "step": 3, "loss": 0.1, "overflow": False},
            {"run": "pynative", "step": 10, "loss": 2.5e-07, "overflow": True}]
    for r in rows:
        append_csv(r, path)
    got = read_csv(path)
    assert got == rows
    assert [type(v) for v in got[0].values()] == [str, int, float, bool]
    append_csv({"run": "x"}, path)                            # missing cells read back as ""
    assert read_csv(path)[-1] == {"run": "x", "step": "", "loss": "", "overflow": ""}


# --- moved from test_metrics.py (issue 47) ---------------------------------------------------------------------------
def test_markdown_table_and_csv(tmp_path):
    t = markdown_table([{"run": "a", "ms": 1312.0}, {"run": "b", "ms": 201.5, "x": 1}])
    lines = t.splitlines()
    assert lines[0].split("|")[1].strip() == "run" and "x" in lines[0] and "201.5" in lines[3]
    p = append_csv({"a": 1, "b": 2.5}, tmp_path / "r.csv")
    append_csv({"a": 3, "b": 4.0}, p)
    assert read_csv(p) == [{"a": 1, "b": 2.5}, {"a": 3, "b": 4.0}]
    with pytest.raises(ValueError, match="key 'c' is not a column"):
        append_csv({"a": 1, "c": 2}, p)
    with pytest.raises(ValueError, match="rows is empty"):
        markdown_table([])


def test_html_table_has_the_markdown_tables_cells_escaped():
    rows = [{"run": "a<b", "ms": 1312.0}, {"run": "c&d", "ms": 201.5, "x": True}]
    t = html_table(rows)
    assert t.startswith("<table><thead><tr><th>run</th><th>ms</th><th>x</th></tr></thead><tbody>")
    assert "<tr><td>a&lt;b</td><td>1,312</td><td></td></tr>" in t            # same formatting as markdown_table
    assert "<tr><td>c&amp;d</td><td>201.5</td><td>True</td></tr></tbody></table>" in t
    assert html_table(rows, columns=["ms"]).count("<td>") == 2
    assert html_table([{"v": 0.123456}], digits=2).endswith("<td>0.12</td></tr></tbody></table>")
    with pytest.raises(ValueError, match="html_table: rows is empty"):
        html_table([])

