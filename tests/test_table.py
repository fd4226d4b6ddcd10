"""mshelpers.table: Markdown and HTML tables, CSV rows."""
import pytest

from mshelpers.table import append_csv, html_table, markdown_table, read_csv


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

