"""Seeded mutations of every fixture YAML (tests/data/mindformers/, all dialects) through the doctor's CLI, in one
process: each mutation replaces one value anywhere in the file (or deletes it) with something no mindformers
config holds, and the run is sorted into

- answered: exit 0 (fits) or 1 (does not fit), stdout one JSON object;
- refused: exit 2 with one stderr line `doctor: error: <field>=<value>; fix: <how>`;
- a defect: a traceback, any other exit, read_config's last-resort net (it names no field), or an invalid value
  (nan, inf, '', '58GBB', [], {}) taken without a word and priced differently from the file as published.

A fifth of the mutations misspell a key instead (one letter dropped): where the key sits in a section the doctor
reads (doctor/keys.py), the answer must flag it by its dotted name, or it is a defect.

The unit tests (tests/doctor/test_hostile.py) sweep the keys the reader reads on six seeds; this covers every
file and every key path, 20 % of the runs with the layout search on.

    python bench/doctor_hostile_sweep.py [N=1000] [SEED=20261205]
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mshelpers.doctor import dialect_of, main  # noqa: E402
from mshelpers.doctor.keys import SECTIONS  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "mindformers"
DELETE = "<deleted>"
INVALID = [None, -1, 0, 1.5, "", [], {}, float("nan"), float("inf"), "58GBB", DELETE, -0.0, 2**40, "0-99999999999",
           True]


def key_paths(node, prefix=()) -> list[tuple]:
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += key_paths(v, prefix + (k,))
    return out


def run(argv: list[str]) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except BaseException:                                   # noqa: BLE001 - SystemExit counts as a defect too
            return "raised", traceback.format_exc(), ""
    return code, err.getvalue(), out.getvalue()


def invalid(v) -> bool:
    return v in ("", "58GBB", [], {}) or isinstance(v, float) and (math.isnan(v) or math.isinf(v))


def sweep(n: int = 1000, seed: int = 20261205) -> dict:
    files = {}
    for f in sorted(DATA.rglob("*.yaml")):
        d = yaml.safe_load(f.read_text())
        if isinstance(d, dict):
            files[f] = d
    rng = random.Random(seed)
    counts, defects, published = {"answered": 0, "refused": 0, "typos flagged": 0}, [], {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        for _ in range(n):
            f = rng.choice(list(files))
            d = copy.deepcopy(files[f])
            where = rng.choice(key_paths(d))
            value = rng.choice(INVALID)
            node = d
            for k in where[:-1]:
                node = node[k]
            typo = None
            if rng.random() < 0.2 and isinstance(node, dict) and isinstance(where[-1], str) and len(where[-1]) > 3:
                cut = rng.randrange(1, len(where[-1]) - 1)
                typo = where[-1][:cut] + where[-1][cut + 1:]
                if typo in node:
                    typo = None
                else:
                    node[typo] = node.pop(where[-1])
                    value = f"<misspelt as {typo}>"
            if typo is None and value == DELETE:
                del node[where[-1]]
            elif typo is None:
                node[where[-1]] = value
            path.write_text(yaml.safe_dump(d, sort_keys=False))
            search = rng.random() < 0.2
            code, err, out = run([str(path), "--json"] + ([] if search else ["--no-search"]))
            case = f"{f.relative_to(DATA)}: {'.'.join(map(str, where))} = {value!r}" + (" (search on)" if search else "")
            if code in (0, 1) and "Traceback" not in err:
                counts["answered"] += 1
                now = json.loads(out)
                if typo is not None:
                    dotted = ".".join(map(str, where[:-1] + (typo,)))
                    fam = "pynative" if dialect_of(files[f]) == "pynative" else "static"
                    checked = ".".join(map(str, where[:-1])) in {sect for sect, _ in SECTIONS[fam]}
                    if checked and dotted not in {fl["key"] for fl in now["key_flags"]}:
                        defects.append(f"a misspelt key not flagged: {case}")
                    counts["typos flagged"] += checked and dotted in {fl["key"] for fl in now["key_flags"]}
                    continue
                if search or not invalid(value):
                    continue
                if f not in published:
                    c0, _, o0 = run([str(f), "--json", "--no-search"])
                    published[f] = json.loads(o0) if c0 in (0, 1) else None
                was = published[f]
                if was and (now["step_s"], now["memory_per_device_bytes"]) != (was["step_s"], was["memory_per_device_bytes"]):
                    defects.append(f"taken and priced differently: {case} (step {was['step_s']:.4g} -> {now['step_s']:.4g} s)")
            elif code == 2 and len(err.splitlines()) == 1 and err.startswith("doctor: error: ") and "fix:" in err:
                counts["refused"] += 1
                if err.startswith("doctor: error: CONFIG="):
                    defects.append(f"caught by the net, no field named: {case}: {err.strip()}")
            else:
                defects.append(f"contract broken: {case}: exit {code!r}: {err[-400:]}")
    return {"files": len(files), "mutations": n, **counts, "defects": defects,
            "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    r = sweep(*args)
    print(f"{r['mutations']} mutations of {r['files']} files: {r['answered']} answered, {r['refused']} refused in "
          f"one line, {r['typos flagged']} misspelt keys flagged, {len(r['defects'])} to look at ({r['seconds']:.0f} s)")
    for line in r["defects"]:
        print(" -", line)
