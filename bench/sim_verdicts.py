"""False calls and power of the two verdict rules, by simulation: timing.paired_verdict with an A/A control against
timing.verdict (difference of medians against the widest range).

    python bench/sim_verdicts.py [--trials 20000]

Every simulated run drifts with its round (sigma 10 % between rounds: a machine that slows down) and has its own
log-normal noise. Prints, per number of rounds, the share of no-ops called a change (should be 0) and the share of
real changes (10 % and 20 % faster) found. tests/README.md ("The A/A control") quotes its output.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mshelpers.timing import paired_verdict, verdict  # noqa: E402


def trial(rounds: int, noise: float, effect: float, rng: random.Random) -> tuple[str, str]:
    drift = [1 + rng.gauss(0, 0.1) for _ in range(rounds)]
    run = lambda d, f=1.0: d * f * math.exp(rng.gauss(0, noise))  # noqa: E731
    b, a, c = [run(d) for d in drift], [run(d) for d in drift], [run(d, 1 - effect) for d in drift]
    return paired_verdict(b, c, a, higher_is_better=False), verdict(b, c, higher_is_better=False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20000)
    n = ap.parse_args().trials
    rng = random.Random(0)
    print("| rounds | run noise | no-op called a change: paired + A/A | old rule |\n|---|---|---|---|")
    for rounds in (2, 3, 4, 6):
        for noise in (0.03, 0.10):
            got = [trial(rounds, noise, 0.0, rng) for _ in range(n)]
            print(f"| {rounds} | {noise:.0%} | {sum(p != 'within noise' for p, _ in got) / n:.1%} | "
                  f"{sum(o != 'within noise' for _, o in got) / n:.1%} |")
    rng = random.Random(1)
    print("\n| rounds | change | found: paired + A/A | old rule |\n|---|---|---|---|")
    for rounds in (2, 3, 4):
        for effect in (0.10, 0.20):
            got = [trial(rounds, 0.05, effect, rng) for _ in range(n)]
            print(f"| {rounds} | {effect:.0%} faster | {sum(p == 'win' for p, _ in got) / n:.1%} | "
                  f"{sum(o == 'win' for _, o in got) / n:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
