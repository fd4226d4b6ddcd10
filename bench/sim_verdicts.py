"""False calls, power and "too noisy" of the verdict rules, by simulation: timing.decide with an A/A control against
timing.verdict (difference of medians against the widest range).

    python bench/sim_verdicts.py [--trials 20000]

Every simulated run drifts with its round (sigma 10 % between rounds: a machine that slows down) and has its own
log-normal noise. Prints, per number of rounds and run noise: the share of no-ops called a change (a false 'win'
or 'regression', should be near 0), the share left 'too noisy' (no verdict, no failure), and the share of real
changes (10 % and 20 % faster) found. Notebook 09's introduction quotes its output; docs/measurements.md holds it in a
block `python bench/doctor_tables.py --write` rewrites from `render()` (tests/test_timing.py holds the two equal).
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mshelpers.timing import decide, verdict  # noqa: E402  (BAND_SE, the direction rule: timing.decide)


def trial(rounds: int, noise: float, effect: float, rng: random.Random) -> tuple[str, str]:
    drift = [1 + rng.gauss(0, 0.1) for _ in range(rounds)]
    run = lambda d, f=1.0: d * f * math.exp(rng.gauss(0, noise))  # noqa: E731
    b, a, c = [run(d) for d in drift], [run(d) for d in drift], [run(d, 1 - effect) for d in drift]
    return decide(b, c, a, higher_is_better=False)[0], verdict(b, c, higher_is_better=False)


def share(got: list, which: int, *verdicts: str) -> str:
    return f"{sum(g[which] in verdicts for g in got) / len(got):.1%}"


def render(n: int = 20000) -> str:
    """The two tables (no-ops, real changes), seeded: the same text on any machine and every run."""
    rng = random.Random(0)
    L = ["| rounds | run noise | no-op called a change: paired + A/A | too noisy | no control: called | too noisy |",
         "|---|---|---|---|---|---|"]
    for rounds in (2, 3, 4, 6):
        for noise in (0.03, 0.10):
            got = [trial(rounds, noise, 0.0, rng) for _ in range(n)]
            L.append(f"| {rounds} | {noise:.0%} | {share(got, 0, 'win', 'regression')} | "
                     f"{share(got, 0, 'too noisy')} | {share(got, 1, 'win', 'regression')} | {share(got, 1, 'too noisy')} |")
    rng = random.Random(1)
    L += ["", "| rounds | change | found: paired + A/A | too noisy | no control: found |", "|---|---|---|---|---|"]
    for rounds in (2, 3, 4, 6):
        for effect in (0.10, 0.20):
            got = [trial(rounds, 0.05, effect, rng) for _ in range(n)]
            L.append(f"| {rounds} | {effect:.0%} faster | {share(got, 0, 'win')} | {share(got, 0, 'too noisy')} | "
                     f"{share(got, 1, 'win')} |")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20000)
    print(render(ap.parse_args().trials))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
