"""Run a command beside a busy neighbour, and compare its timing verdicts with the committed run's.

    python tests/busy_neighbour.py make test          (issue 48: `make test` passes with a busy loop on one core)

The command runs in the checkout this file belongs to (the folder above tests/), whatever the current directory: to
test a fresh clone, run the clone's own copy, `python CLONE/tests/busy_neighbour.py bash .ci/run`.

A child process spins on the last core (`os.sched_setaffinity`) for as long as the command runs. Every timing
verdict the notebooks print is appended to a JSON-lines log ($MSHELPERS_VERDICT_LOG, which `report.claim_timing`
writes), and at the end each is matched, by its two names, with the verdict the committed notebooks' manifest holds
for the same comparison. Printed: how many gave the committed verdict, how many said `too noisy` (allowed: the
machine could not tell), and how many decided otherwise (a decided verdict against the stated expectation already
fails its cell; one that differs from the committed verdict of an open question is listed). Exit code: the command's.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    x = 0
    while True:                      # pure Python busy work: one core at 100 %
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def committed_verdicts(notebooks: Path = ROOT / "notebooks") -> dict[tuple[str, str], str]:
    out = {}
    for nb in sorted(notebooks.glob("*.ipynb")):
        meta = json.loads(nb.read_text(encoding="utf-8")).get("metadata", {}).get("cookbook_run", {})
        for v in meta.get("notebook", {}).get("timing_verdicts", []) or []:
            if "base" in v and "cand" in v:
                out[v["base"], v["cand"]] = v.get("verdict", "?")
    return out


def compare(log: list[dict], committed: dict[tuple[str, str], str]) -> dict:
    same, noisy, other, unknown = [], [], [], []
    for v in log:
        key, got = (v.get("base"), v.get("cand")), v.get("verdict")
        if got == "too noisy":
            noisy.append((key, v.get("band"), v.get("load")))
        elif key not in committed:
            unknown.append((key, got))
        elif committed[key] == got:
            same.append(key)
        else:
            other.append((key, committed[key], got, v.get("expected")))
    return {"verdicts": len(log), "as committed": len(same), "too noisy": len(noisy), "too noisy (which, band, load)": noisy,
            "decided otherwise": other,
            "not in the committed run": unknown}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cores = sorted(os.sched_getaffinity(0))
    log = Path(tempfile.mkdtemp(prefix="busy-")) / "verdicts.jsonl"
    spinner = mp.get_context("spawn").Process(target=_spin, args=(cores[-1],), daemon=True)
    spinner.start()
    t0 = time.time()
    try:
        rc = subprocess.call(argv, cwd=ROOT, env={**os.environ, "MSHELPERS_VERDICT_LOG": str(log)})
    finally:
        spinner.terminate()
        spinner.join()
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    res = compare([json.loads(x) for x in lines if x.strip()], committed_verdicts())
    print(f"beside a busy loop on core {cores[-1]} of {len(cores)}: `{' '.join(argv)}` exited {rc} after "
          f"{time.time() - t0:.0f} s; load average {os.getloadavg()[0]:.2f}")
    print(json.dumps(res, indent=1, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
