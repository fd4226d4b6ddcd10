"""Timing helpers: a tiny `Benchmark` context manager and `run_isolated` (fresh process).

Example:
    >>> from mshelpers.timing import Benchmark
    >>> with Benchmark("sum") as b:
    ...     _ = sum(range(1000))
    sum: ... ms
    >>> b.elapsed > 0
    True

`run_isolated` is what memory and compile-cache measurements need: a fresh process
has no warm caches and its peak RSS belongs to the measured work alone.
"""
from __future__ import annotations

import multiprocessing as mp
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable


class Benchmark:
    """Time a block: `with Benchmark("graph mode"): ...` prints and keeps `.elapsed` seconds."""

    def __init__(self, name: str = "Done", verbose: bool = True) -> None:
        self.name, self.verbose, self.elapsed = name, verbose, float("nan")

    def __enter__(self) -> "Benchmark":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.elapsed = time.perf_counter() - self._t0
        if self.verbose:
            print(f"{self.name}: {self.elapsed * 1e3:.1f} ms")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    On Linux this reads VmHWM from /proc/self/status: `getrusage().ru_maxrss` survives
    fork+exec, so a fresh child would report its (large) parent's peak instead of its own.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / 2**20 if sys.platform == "darwin" else ru / 1024


@dataclass
class IsolatedResult:
    value: Any          # what fn returned
    wall_s: float       # wall time of the call inside the child (imports in fn included)
    peak_rss_mb: float  # the child's peak RSS


def _child(conn, env, payload) -> None:  # runs in the fresh process
    import os
    import pickle
    # The child's own environment, set before the payload is unpickled: unpickling `fn` imports its
    # module (which may import MindSpore, which reads MS_* variables at import). Changing the parent's
    # os.environ around p.start() instead races when two threads spawn at once.
    os.environ.update(env)
    try:
        fn, args, kwargs = pickle.loads(payload)
        t0 = time.perf_counter()
        value = fn(*args, **kwargs)
        conn.send(("ok", value, time.perf_counter() - t0, peak_rss_mb()))
    except BaseException as e:  # noqa: BLE001 - forwarded to the parent
        conn.send(("err", f"{type(e).__name__}: {e}", traceback.format_exc(), peak_rss_mb()))
    finally:
        conn.close()


def _forkserver(preload: tuple[str, ...]):
    """The forkserver context, its server importing `preload` once. A process has one server, started at
    its first fork with the list set then: a later, different list is not preloaded (a child still imports
    whatever its `fn` needs, only not for free)."""
    ctx = mp.get_context("forkserver")
    global _PRELOADED
    if _PRELOADED is None:
        ctx.set_forkserver_preload(list(preload))
        _PRELOADED = preload
    return ctx


_PRELOADED: tuple[str, ...] | None = None


def run_isolated(fn: Callable, *args: Any, timeout: float = 900, env: dict | None = None,
                 forkserver_preload: Any = None, **kwargs: Any) -> IsolatedResult:
    """Run `fn(*args, **kwargs)` in a fresh spawned process; return value, wall time and peak RSS.

    `fn` must be importable by name (defined in a module, not in a notebook cell), and
    its arguments and result must pickle. `env` adds environment variables for the
    child only (e.g. the compile-cache switches): they are set inside the child, so the
    parent's os.environ is never touched and concurrent calls from threads do not mix.
    `forkserver_preload` (module names, e.g. ("mshelpers", "mindspore", "mindformers"): mshelpers first, so
    its filter of mindformers' import noise is in place) forks the child from a
    server that imported them once, instead of spawning a new interpreter: each run skips those
    imports (about 4 s for MindSpore and mindformers on 2 cores) and still starts from the same clean
    state. Its peak RSS counts only the inherited pages it touches, so it reads lower than a spawned
    child's (tiny preset: 565 against 809 MiB); compare only runs started the same way. The children
    inherit the environment the server started with. Not with `env`: MindSpore reads some MS_*
    variables at import, which the server has done already.
    An exception in the child is re-raised here as RuntimeError carrying the child's traceback.
    """
    if getattr(fn, "__module__", None) == "__main__":
        raise ValueError(f"run_isolated: fn={fn.__name__!r} is defined in __main__ (a notebook or script); "
                         "fix: move it into a module file and import it")
    if forkserver_preload is not None:
        names = forkserver_preload
        if not isinstance(names, (list, tuple)) or not all(isinstance(m, str) and m for m in names):
            raise ValueError(f"run_isolated: forkserver_preload={forkserver_preload!r} is invalid; fix: a list of "
                             "module names, e.g. ['mshelpers', 'mindspore', 'mindformers']")
        if env:
            raise ValueError(f"run_isolated: forkserver_preload={list(forkserver_preload)!r} with env={sorted(env)!r}: "
                             "the server imported MindSpore before the child could set them; fix: pass env without "
                             "forkserver_preload (spawn)")
    import pickle
    ctx = _forkserver(tuple(forkserver_preload)) if forkserver_preload is not None else mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    payload = pickle.dumps((fn, args, kwargs))
    p = ctx.Process(target=_child, args=(child, {k: str(v) for k, v in (env or {}).items()}, payload))
    p.start()
    child.close()
    if not parent.poll(timeout):
        p.kill()
        raise TimeoutError(f"run_isolated: {fn.__name__} did not finish within timeout={timeout}s")
    try:
        msg = parent.recv()
    except EOFError:
        p.join()
        raise RuntimeError(f"run_isolated: child running {fn.__name__} died with exit code {p.exitcode}")
    p.join()
    if msg[0] == "err":
        raise RuntimeError(f"run_isolated: {fn.__name__} failed in the child: {msg[1]}\n{msg[2]}")
    return IsolatedResult(value=msg[1], wall_s=msg[2], peak_rss_mb=msg[3])


# ------------------------------------------------------------------ interleaved comparisons
def _median_spread(vals: list[float]) -> tuple[float, float, float]:
    import statistics
    return statistics.median(vals), min(vals), max(vals)


def verdict(base: list[float], cand: list[float], higher_is_better: bool = True, rel_floor: float = 0.02) -> str:
    """'win', 'within noise' or 'regression' for one change against its baseline.

    A change counts only when it clears the noise: the difference of the medians must exceed
    the larger of the two round-to-round ranges (max - min), in the good or the bad direction,
    and `rel_floor` (2 %) of the baseline's median, so that a metric that repeats exactly (peak
    memory of identical runs) does not call a 0.1 % difference a regression.
    """
    if not base or not cand:
        raise ValueError("verdict: base and cand need at least one value each; fix: run more rounds")
    bm, blo, bhi = _median_spread(base)
    cm, clo, chi = _median_spread(cand)
    noise = max(bhi - blo, chi - clo, rel_floor * abs(bm))
    delta = (cm - bm) if higher_is_better else (bm - cm)
    return "win" if delta > noise else "regression" if -delta > noise else "within noise"


def _aa_log_band(base: list[float], aa: list[float], rel_floor: float = 0.02) -> float:
    """The A/A noise band as a log-ratio: the largest |log(aa_r / base_r)| over the rounds, at least log(1 + rel_floor)."""
    import math
    return max([abs(math.log(a / b)) for b, a in zip(base, aa)] + [math.log(1 + rel_floor)])


def paired_verdict(base: list[float], cand: list[float], aa: list[float], higher_is_better: bool = True,
                   rel_floor: float = 0.02) -> str:
    """A change's verdict against an A/A control run in the same rounds (lists aligned by round).

    Per round r the paired log-ratios are log(cand_r / base_r) and log(aa_r / base_r). The A/A pair sets the
    noise band: its largest |log-ratio| over the rounds (at least log(1 + rel_floor)). A change is a 'win'
    ('regression') only when its median log-ratio clears the band in the good (bad) direction and every round
    agrees on the direction; otherwise 'within noise'.

        >>> paired_verdict([10, 11, 12], [8, 8.9, 9.5], [10.2, 10.9, 12.1], higher_is_better=False)
        'win'
        >>> paired_verdict([10, 11, 12], [9.9, 11.1, 12.0], [10.2, 10.9, 12.1], higher_is_better=False)
        'within noise'
    """
    import math
    import statistics
    if not (len(base) == len(cand) == len(aa)) or len(base) < 2:
        raise ValueError(f"paired_verdict: base, cand and aa have {len(base)}, {len(cand)} and {len(aa)} values; "
                         "fix: pass one value per round, at least 2 rounds, in the same order")
    if min(map(float, (*base, *cand, *aa))) <= 0:
        raise ValueError("paired_verdict: every value must be > 0 (times, rates, bytes); fix: pass positive metrics")
    sign = 1 if higher_is_better else -1
    d = [sign * math.log(c / b) for b, c in zip(base, cand)]
    band = _aa_log_band(base, aa, rel_floor)
    med = statistics.median(d)
    if med > band and min(d) > 0:
        return "win"
    if med < -band and max(d) < 0:
        return "regression"
    return "within noise"


def compare_interleaved(candidates: dict[str, Any], rounds: int = 3, *, baseline: str | None = None,
                        seeds: Any = None, isolate: bool = True, metrics: dict[str, bool] | None = None,
                        timeout: float = 900, progress: bool = True, forkserver_preload: Any = None,
                        aa_control: bool | dict = False, warmup: bool | dict = False) -> dict[str, Any]:
    """Run N candidates alternately over R rounds, rotating their order; medians, spreads and verdicts.

    candidates: {name: fn | (fn, args) | (fn, args, kwargs) | (fn, args, kwargs, env)}. Each call returns a
        float (seconds per step) or a dict of metrics (e.g. a train summary with `median_step_s` and
        `tokens_per_s`). `env` (isolate=True only) adds environment variables for that candidate's processes,
        e.g. a compile cache per candidate.
    rounds: R. Round r runs every candidate once, in the order rotated by r, so no candidate always
        runs first (cold caches) or last (a machine that heats up or gets busy).
    seeds: optional list, one per round; round r passes `seed=seeds[r]` (then R = len(seeds)).
    isolate: each call in a fresh process (`run_isolated`): memory is each run's own and
        `peak_rss_mb` is recorded. False runs the callables here, alternated all the same.
    metrics: {metric: higher_is_better} to summarise (default step time, tokens/s, peak memory).
    forkserver_preload: module names for `run_isolated(forkserver_preload=...)`: every run forks from one
        server that imported them, so no run pays those imports. All candidates start the same way (no `env`).
    Returns {"runs": [per-call dicts with name, round, seed], "table": [one row per candidate:
        median, min, max of each metric, ratio to the baseline and a verdict per metric]}.
    Verdicts (`verdict()`): 'win', 'within noise' or 'regression' against `baseline` (default: the first).
    aa_control: also run the baseline a second time, as the candidate "<baseline> (A/A)", in the same rotation.
        Verdicts are then `paired_verdict`s: per-round ratios to the baseline against the band the A/A pair
        shows in the same run. If the A/A pair itself is not 'within noise' by `verdict()`, the machine was
        too noisy to decide: `too_noisy[metric]` is True and every verdict of that metric reads
        'undecided (too noisy)', which no caller may claim as a result. `band[metric]` is the noise band the
        verdicts used, as a relative change (0.1 = the A/A pair differed by up to 10 % in some round; at
        least 2 %). A dict instead of True turns the
        control on and overrides those keyword arguments in the copy only (e.g. {"resume_seed": None}: the copy
        times the baseline and skips the baseline's extra check).
    warmup: before round 1, call every candidate once, untimed (the A/A copy shares its baseline's call), the same
        way as the rounds (isolated or not). With a compile cache in its kwargs, that first call compiles each
        graph and every timed call then starts alike, from the cache: no round carries the compiles. A dict
        instead of True overrides those keyword arguments in the untimed calls only (e.g. {"steps": 2}, when the
        graph does not depend on them). Their results are returned as `warmup` {name: value}.
    """
    if not candidates:
        raise ValueError("compare_interleaved: candidates is empty; fix: pass {name: fn or (fn, args, kwargs)}")
    if seeds is not None:
        seeds = list(seeds)
        rounds = len(seeds)
    if not isinstance(rounds, int) or rounds < 2:
        raise ValueError(f"compare_interleaved: rounds={rounds!r} is invalid; fix: at least 2 rounds give a spread")
    names = list(candidates)
    baseline = names[0] if baseline is None else baseline
    if baseline not in candidates:
        raise ValueError(f"compare_interleaved: baseline={baseline!r} is not a candidate; fix: one of {names}")
    aa_name = f"{baseline} (A/A)" if aa_control else None
    if aa_control:
        if aa_name in candidates:
            raise ValueError(f"compare_interleaved: a candidate is already named {aa_name!r}; fix: rename it")
        candidates = dict(candidates)
        candidates[aa_name] = candidates[baseline]
        if isinstance(aa_control, dict):
            spec = candidates[baseline]
            fn, args, kwargs, env = (spec, (), {}, None) if callable(spec) else (tuple(spec) + ((), {}, None))[:4]
            candidates[aa_name] = (fn, args, {**dict(kwargs), **aa_control}, env)
        names.insert(names.index(baseline) + 1, aa_name)
    specs = {}
    for n, spec in candidates.items():
        fn, args, kwargs, env = (spec, (), {}, None) if callable(spec) else (tuple(spec) + ((), {}, None))[:4]
        if not callable(fn):
            raise ValueError(f"compare_interleaved: candidate {n!r} is not callable; fix: pass fn or (fn, args, kwargs)")
        specs[n] = (fn, tuple(args), dict(kwargs), env)
        if forkserver_preload is not None and env:
            raise ValueError(f"compare_interleaved: candidate {n!r} has env={sorted(env)!r} and forkserver_preload "
                             "is set: forked runs cannot take MS_* variables that MindSpore reads at import; fix: drop "
                             "forkserver_preload, so every candidate is spawned alike")
    metrics = metrics or {"median_step_s": False, "tokens_per_s": True, "peak_rss_mb": False}

    def bar(items: list, desc: str) -> Any:
        try:
            from tqdm.std import tqdm   # a text bar: renders in nbconvert and JupyterLab, no widget state to go stale
            return tqdm(items, desc=desc, disable=not progress, file=sys.stdout, mininterval=0.5)
        except ImportError:
            return items

    def call(name: str, kw: dict) -> tuple[Any, dict]:
        """One run of candidate `name`, isolated or here: its value and what the harness measured around it."""
        fn, args, _, env = specs[name]
        if isolate:
            res = run_isolated(fn, *args, timeout=timeout, env=env, forkserver_preload=forkserver_preload, **kw)
            return res.value, {"peak_rss_mb": res.peak_rss_mb, "wall_s": res.wall_s}
        t0 = time.perf_counter()
        value = fn(*args, **kw)
        return value, {"wall_s": time.perf_counter() - t0}

    warm: dict[str, Any] = {}
    if warmup:
        extra_kw = dict(warmup) if isinstance(warmup, dict) else {}
        for name in bar([n for n in names if n != aa_name], "untimed first call of each"):
            warm[name] = call(name, {**specs[name][2], **extra_kw})[0]
    runs = []
    for r, name in bar([(r, names[(i + r) % len(names)]) for r in range(rounds) for i in range(len(names))],
                       "interleaved runs"):
        kwargs = specs[name][2]
        value, extra = call(name, dict(kwargs, seed=seeds[r]) if seeds is not None else kwargs)
        row = dict(value) if isinstance(value, dict) else {"median_step_s": float(value)}
        row.update({k: v for k, v in extra.items() if k not in row})
        row.update(name=name, round=r, seed=None if seeds is None else seeds[r])
        runs.append(row)

    def by_round(name: str, m: str) -> list[float] | None:
        got = {x["round"]: float(x[m]) for x in runs if x["name"] == name and x.get(m) is not None}
        return [got[r] for r in range(rounds)] if len(got) == rounds else None

    too_noisy, band = {}, {}
    if aa_control:
        import math
        for m in metrics:
            b, a = by_round(baseline, m), by_round(aa_name, m)
            if b and a:
                too_noisy[m] = verdict(b, a, metrics[m]) != "within noise"
                if min(b + a) > 0:   # paired_verdict's band, as a relative change
                    band[m] = math.exp(_aa_log_band(b, a)) - 1
    table = []
    for name in names:
        row: dict[str, Any] = {"name": name, "rounds": rounds}
        for m, hib in metrics.items():
            vals = [float(x[m]) for x in runs if x["name"] == name and x.get(m) is not None]
            bvals = [float(x[m]) for x in runs if x["name"] == baseline and x.get(m) is not None]
            if not vals:
                continue
            med, lo, hi = _median_spread(vals)
            row[m], row[f"{m} min"], row[f"{m} max"] = med, lo, hi
            if name != baseline and bvals:
                bmed = _median_spread(bvals)[0]
                row[f"{m} vs base"] = med / bmed if bmed else float("nan")
                b, c, a = by_round(baseline, m), by_round(name, m), by_round(aa_name, m) if aa_control else None
                if too_noisy.get(m):
                    row[f"{m} verdict"] = "undecided (too noisy)"
                elif a and b and c and min(b + c + a) > 0:
                    row[f"{m} verdict"] = paired_verdict(b, c, a, hib)
                else:
                    row[f"{m} verdict"] = verdict(bvals, vals, hib)
        table.append(row)
    return {"runs": runs, "table": table, "baseline": baseline, "rounds": rounds, "aa": aa_name,
            "too_noisy": too_noisy, "band": band, "warmup": warm}
