"""How long the doctor takes to answer, layout search included: every training config of the mindformers 2.1.0
wheel (tests/data/mindformers/2.1.0/) and the Llama 2 70B search, each in this process, best of `--rounds`.

    python bench/bench_doctor.py [--rounds 3]

Timing belongs here, not in a test (tests/README.md). Prints one row per config: seconds (best, worst), the
layouts searched and the verdict's first words.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mshelpers import doctor as D  # noqa: E402
from mshelpers.peak import cpu_info  # noqa: E402

DATA = ROOT / "tests" / "data" / "mindformers"
MODEL_FOR = {"general/llm_pretrain_dense_template.yaml": "Qwen3-32B", "general/llm_finetune_dense_template.yaml": "Qwen3-32B",
             "general/llm_pretrain_moe_template.yaml": "Qwen3-30B-A3B", "general/llm_finetune_moe_template.yaml": "Qwen3-30B-A3B",
             "qwen3/finetune_qwen3.yaml": "Qwen3-32B", "deepseek3/finetune_deepseek3_671b.yaml": "DeepSeek-V3",
             "deepseek3/finetune_deepseek3_12b_16p_pp16.yaml": "DeepSeek-V3"}


def print_families(rows: list[dict]) -> None:
    """The README's by-family table, twice: every checked figure, then only those whose YAML comes from r1.2.0
    or later (`doctor.release_of`), with the older figures' signed errors."""
    for title, since in (("every checked figure", ()), ("figures from r1.2.0 on", (1, 2))):
        fams = D.family_summary(rows, since)
        off = D.off_families(rows, since)
        print(f"\n## {title}: {sum(f['n'] for f in fams)} figures, {len(off)} families off target")
        print("| family | MoE | checked | median abs error | largest | mean |\n|---|---|---|---|---|---|")
        for f in fams:
            print(f"| {f['family']} | {'yes' if f['moe'] else ''} | {f['n']} | {f['median_abs_error']:.1%} "
                  f"| {f['max_abs_error']:.1%} | {f['mean_error']:+.1%} |")
        print("off target:", ", ".join(sorted(f"{n}{' (MoE)' if moe else ''}" for n, moe in off)) or "none")
    old = sorted((r for r in rows if r["role"] == "check" and () < D.release_of(r) < (1, 2)), key=lambda r: r["error"])
    print(f"\nbefore r1.2.0: {len(old)} figures, signed errors "
          + ", ".join(f"{r['family']} {r['error']:+.0%}" for r in old))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scatter", default=None, help="also write predicted against published as a PNG here")
    ap.add_argument("--families", action="store_true",
                    help="print the by-family error table, on every checked figure and from r1.2.0 on, and stop")
    a = ap.parse_args()
    if a.families:
        print_families(D.calibration_table())
        return 0
    if a.scatter:
        D.published_scatter(D.calibration_table(), a.scatter)
        print(f"wrote {a.scatter}")
    files = [(p.relative_to(DATA / "2.1.0").as_posix(), p) for p in sorted((DATA / "2.1.0").glob("*/*.yaml"))]
    files.append(("Llama 2 70B (r1.2.0 pretrain)", DATA / "r1.2.0_pretrain_llama2_70b.yaml"))
    print(f"# doctor, search included, best of {a.rounds}; {cpu_info().get('cpu_model')}")
    print("| config | best s | worst s | verdict |\n|---|---|---|---|")
    for name, path in files:
        mc = DATA / "hf" / MODEL_FOR[name] if name in MODEL_FOR else None
        times = []
        for _ in range(a.rounds):
            t = time.perf_counter()
            r = D.diagnose(str(path), model_config=mc)
            times.append(time.perf_counter() - t)
        print(f"| {name} | {min(times):.2f} | {max(times):.2f} | {r['verdict'][:60]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
