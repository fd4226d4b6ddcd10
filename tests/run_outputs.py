"""Execute notebooks in place, in order, in one session, and stamp each with the run's manifest.

    python tests/run_outputs.py [--keep-going] notebooks/00_environment.ipynb notebooks/01_...ipynb ...   (make outputs)

Every committed notebook then says which run its outputs come from, in its metadata under "cookbook_run":
the run id (shared by every notebook of the run), the commit, the CPU model, the date, the peak-cache entry the
notebooks read (build/peak_flops.json after the run), the 1-minute load average at the run's start and end, and
this notebook's own start and end load and seconds, and every timing verdict its claims printed (claim_timing
appends each, with its band, to $MSHELPERS_VERDICT_LOG, which this script points at a file per notebook).
tests/test_notebook_outputs.py fails when the committed
notebooks come from different runs, or from a run that left some out: `make outputs NB=...` for one notebook is
for iterating, and the run to commit is `make outputs` of all of them, on an otherwise idle machine.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _cpu() -> dict:
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k in ("model name", "cpu family", "model") and k not in info:
                info[k] = v
    except OSError:
        pass
    return {"cpu_model": info.get("model name", "?"), "cpu_family": info.get("cpu family", "?"),
            "cpu_model_number": info.get("model", "?"), "cores": os.cpu_count()}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "mshelpers", "tests", "bench", "Makefile"],
                               cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        return out.stdout.strip() + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def _peak_cache() -> dict | None:
    path = Path(os.environ.get("MSHELPERS_PEAK_CACHE") or Path(os.environ.get("MSHELPERS_BUILD", ROOT / "build"))
                / "peak_flops.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _too_noisy_lines(nb: Path) -> list[str]:
    """The lines an executed notebook printed starting 'TOO NOISY to decide' (claim_timing, claim_within and 08's
    straggler check print them): test_notebook_outputs.py refuses a run with any."""
    try:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return []
    texts = ("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))
    return [line for t in texts for line in t.splitlines() if line.startswith("TOO NOISY to decide")]


def _verdicts(log: Path) -> list[dict]:
    """The timing verdicts one notebook recorded (JSON lines); a line that does not parse is kept as its text."""
    out = []
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"unparsed": line})
    return out


def main(argv: list[str]) -> int:
    # a notebook that printed a TOO NOISY line makes the run one test_notebook_outputs.py refuses: stop there (the
    # minutes the rest would take buy nothing committable) unless --keep-going asks for the rest's figures anyway
    keep_going = "--keep-going" in argv
    notebooks = [Path(a) for a in argv if a != "--keep-going"]
    if not notebooks:
        print("run_outputs: no notebooks given; fix: pass notebooks/NN_*.ipynb", file=sys.stderr)
        return 2
    missing = [str(p) for p in notebooks if not p.is_file()]
    if missing:
        print(f"run_outputs: notebooks={missing} do not exist; fix: pass existing notebook paths", file=sys.stderr)
        return 2
    start = dt.datetime.now(dt.timezone.utc)
    run = {"run_id": start.strftime("%Y%m%dT%H%M%SZ"), "commit": _commit(), **_cpu(),
           "date": start.isoformat(timespec="seconds"), "load_start": _load(),
           "notebooks_in_run": [p.name for p in notebooks]}
    per = {}
    jupyter = Path(sys.executable).with_name("jupyter")
    logs = Path(os.environ.get("MSHELPERS_BUILD", ROOT / "build")) / "verdicts" / run["run_id"]
    logs.mkdir(parents=True, exist_ok=True)
    for nb in notebooks:
        l0, t0 = _load(), time.time()
        cmd = [str(jupyter), "nbconvert", "--to", "notebook", "--execute", "--inplace",
               "--ExecutePreprocessor.timeout=900", str(nb)]
        log = logs / f"{nb.stem}.jsonl"
        log.unlink(missing_ok=True)
        if subprocess.run(cmd, env={**os.environ, "MSHELPERS_VERDICT_LOG": str(log)}).returncode != 0:
            print(f"run_outputs: {nb} failed; the run stops here (its stamp is not written)", file=sys.stderr)
            return 1
        per[nb] = {"load_start": l0, "load_end": _load(), "seconds": round(time.time() - t0, 1),
                   "timing_verdicts": _verdicts(log)}
        noisy = _too_noisy_lines(nb)   # every check that could not tell, claim_timing's or another's
        print(f"{nb}: {per[nb]['seconds']:.0f} s (load {l0} -> {per[nb]['load_end']}), "
              f"{len(per[nb]['timing_verdicts'])} timing verdicts, {len(noisy)} too noisy"
              + "".join(f"\n    {line[:160]}" for line in noisy), flush=True)
        if noisy and not keep_going:
            print(f"run_outputs: {nb} could not tell {len(noisy)} time(s), so this run cannot be committed "
                  "(tests/test_notebook_outputs.py refuses it); the run stops here (its stamp is not written). "
                  "Fix: re-run on an idle machine, or pass --keep-going (make outputs OUTPUTS_ARGS=--keep-going) "
                  "for the other notebooks' figures", file=sys.stderr)
            return 1
    run["load_end"] = _load()
    run["peak_cache"] = _peak_cache()
    for nb, own in per.items():
        d = json.loads(nb.read_text())
        d.setdefault("metadata", {})["cookbook_run"] = dict(run, notebook=own)
        tmp = nb.with_suffix(".ipynb.tmp")
        tmp.write_text(json.dumps(d, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, nb)
    # README's and docs/field_tools.md's generated figures come from this run (the blocks of the notebooks run)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_figures
    readme_figures.write_for([nb.name for nb in per])
    print(f"run {run['run_id']}: {len(per)} notebooks, load {run['load_start']} -> {run['load_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
