"""Scripts that msrun launches, one process per rank (msrun needs a real file, not a notebook cell).

Run them with `mshelpers.launch.msrun(path, workers=2, args=[...])`; each writes its
results with `mshelpers.launch.write_rank_result`. `script_path(name)` gives the path.
Runs in notebooks/04_data_parallel.ipynb.
"""
from pathlib import Path


def script_path(name: str) -> Path:
    """Absolute path of the worker script `name` (with or without .py)."""
    p = Path(__file__).resolve().parent / (name if name.endswith(".py") else name + ".py")
    if not p.is_file():
        known = sorted(q.stem for q in p.parent.glob("*.py") if not q.stem.startswith("_"))
        raise ValueError(f"script_path: no worker script {name!r}; fix: use one of {known}")
    return p
