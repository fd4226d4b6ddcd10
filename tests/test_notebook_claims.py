"""Every claim a notebook makes can fail: read each code cell's `claim(...)` calls (ast) and flag
  - a `holds` that is a constant (`claim(text, True)`),
  - a `holds` that repeats the test of an enclosing `if` (`if k1 == k0: claim(..., k1 == k0)`),
  - a claim whose numbers (its keyword arguments) are all constants: nothing measured enters it;
  - a `claim_timing` without `expect` (the verdict expected beforehand, or "undecided"),
  - a `claim_timing` without `control`: every timing comparison carries its A/A copy (the baseline timed a
    second time in the same rounds), whose distance from the baseline is the noise a verdict must clear.
A claim must depend on a number of its run compared with an expectation stated beforehand.
"""
import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def claim_problems(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:                      # cell magics and the like: not Python, no claim to read
        return []
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        name = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
        if name == "claim_timing" and not any(k.arg == "expect" for k in node.keywords):
            out.append(f"claim_timing without the verdict expected beforehand: {ast.unparse(node)[:100]}")
        if name == "claim_timing" and not any(k.arg == "control" for k in node.keywords):
            out.append(f"claim_timing without an A/A control: {ast.unparse(node)[:100]}")
        if name != "claim":
            continue
        holds = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "holds"), None)
        tests, p = [], node
        while p in parents:
            p = parents[p]
            if isinstance(p, ast.If):
                tests.append(ast.unparse(p.test))
        text = ast.unparse(node)[:100]
        if isinstance(holds, ast.Constant):
            out.append(f"holds is the constant {holds.value!r}: {text}")
        elif holds is not None and ast.unparse(holds) in tests:
            out.append(f"holds repeats the enclosing if ({ast.unparse(holds)}): {text}")
        numbers = [k.value for k in node.keywords if k.arg is not None and k.arg != "holds"]
        if numbers and all(isinstance(v, ast.Constant) for v in numbers):
            out.append(f"every number is a constant: {text}")
    return out


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_claim_can_fail(nb):
    problems = []
    for i, c in enumerate(json.loads(nb.read_text())["cells"]):
        if c["cell_type"] == "code":
            problems += [f"cell {i}: {p}" for p in claim_problems("".join(c["source"]))]
    assert not problems, f"{nb.name}:\n" + "\n".join(problems)


def test_the_claim_check_fails_on_each_loophole():
    assert claim_problems('claim("it fits", True, gib=g)')
    assert claim_problems('if k1 == k0:\n    claim("same kernels", k1 == k0, k=k1)')
    assert claim_problems('claim("the sum is {s}", s == 1, s=1)')
    assert claim_problems('claim("ok", holds=True, n=n)')
    assert claim_problems('claim_timing("a", a, "b", b, expect="win")')                    # no A/A control
    assert not claim_problems('claim_timing("a", a, "b", b, expect="win", control=aa)')
    assert claim_problems('claim_timing("a", a, "b", b)')
    assert not claim_problems('claim_timing("a", a, "b", b, expect="undecided", control=aa)')
    assert not claim_problems('claim("fits in {b}", used <= b, b=b)')
    assert not claim_problems('if lvl == "O3":\n    claim("overflowed", ov >= n, ov=ov, n=n)')
