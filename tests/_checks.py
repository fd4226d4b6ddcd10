"""Checks several test files make the same way (a helper, not a test): the one line a function refuses
arguments with, the exact line of a positive-count refusal, a config that is not ours, and a module's own
docstring examples.
"""
from __future__ import annotations

import doctest
import math
from types import SimpleNamespace

import pytest


def refused(f, *args, **kw) -> str:
    """The one line f refuses these arguments with (a ValueError)."""
    with pytest.raises(ValueError) as e:
        f(*args, **kw)
    return str(e.value)


def positive_count_line(fn: str, name: str, v) -> str:
    """The line every helper refuses a count that is not a positive integer with."""
    tail = " (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""
    return f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer{tail}"


def foreign(cfg) -> SimpleNamespace:
    """The same model as a plain object without compute_dtype or recompute (a config that is not ours)."""
    return SimpleNamespace(**{k: getattr(cfg, k) for k in ("num_heads", "ffn_hidden_size", "num_layers",
                                                           "hidden_size", "seq_len", "vocab_size")})


def module_doctests(module) -> tuple[int, int]:
    """(examples tried, failures) of the module's own docstring examples. Only its own: under `make mutate` the
    module also holds mutmut's copy of every function (x_name__mutmut_N), docstrings included, which multiplied
    the examples ~80x and each mutant's run with them."""
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for t in finder.find(module):
        if "__mutmut_" not in t.name:
            runner.run(t)
    return runner.tries, runner.failures
