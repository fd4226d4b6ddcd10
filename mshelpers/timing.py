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
    """Time a block: `with Benchmark("graph mode"): ...` prints and keeps `.elapsed` seconds.
    Taught in notebooks/02_graph_mode.ipynb."""

    def __init__(self, name: str = "Done", verbose: bool = True) -> None:
        self.name, self.verbose, self.elapsed = name, verbose, float("nan")

    def __enter__(self) -> "Benchmark":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.elapsed = time.perf_counter() - self._t0
        if self.verbose:
            print(f"{self.name}: {self.elapsed * 1e3:.1f} ms")


# --- this process's resident set: the one VmHWM reader (metrics.peak_memory_mb inlines its few lines) ---
def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB. Taught in notebooks/02_graph_mode.ipynb.

    On Linux this reads VmHWM from /proc/self/status: `getrusage().ru_maxrss` survives
    fork+exec, so a fresh child would report its (large) parent's peak instead of its own.
    """
    return _rss_mb("VmHWM")


def _rss_mb(field: str = "VmRSS") -> float:
    """`field` of /proc/self/status in MiB: VmRSS (resident now) or VmHWM (the peak so far); where /proc has
    no such line, the peak from getrusage (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / 2**20 if sys.platform == "darwin" else ru / 1024


# --- fresh processes: the one spawn-a-child helper (run_isolated here, memory_probe.measure_peak) ---


@dataclass
class IsolatedResult:
    """What a call run in a fresh child process returned, its wall time there and the child's peak RSS.
    Taught with the rest of timing.py in notebooks/02_graph_mode.ipynb."""
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

    Taught in notebooks/02_graph_mode.ipynb.
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
    ctx = _forkserver(tuple(forkserver_preload)) if forkserver_preload is not None else mp.get_context("spawn")
    value, wall_s, peak = _run_child(fn, args, kwargs, timeout=timeout, env=env, ctx=ctx, who="run_isolated")
    return IsolatedResult(value=value, wall_s=wall_s, peak_rss_mb=peak)


def _run_child(fn: Callable, args: tuple, kwargs: dict, *, timeout: float, env: dict | None, who: str,
               name: str | None = None, ctx: Any = None) -> tuple[Any, float, float]:
    """(value, wall seconds, peak RSS MiB) of fn(*args, **kwargs) in a fresh process of `ctx` (default: spawn).

    `env` is set inside the child only, so concurrent calls from threads each get their own. A failure, a
    timeout or a dead child raises one error naming `who` (the public caller) and `name` (default fn's name)."""
    import pickle
    name = name or getattr(fn, "__name__", repr(fn))
    ctx = ctx or mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    payload = pickle.dumps((fn, args, kwargs))
    p = ctx.Process(target=_child, args=(child, {k: str(v) for k, v in (env or {}).items()}, payload))
    p.start()
    child.close()
    if not parent.poll(timeout):
        p.kill()
        raise TimeoutError(f"{who}: {name} did not finish within timeout={timeout}s")
    try:
        msg = parent.recv()
    except EOFError:
        p.join()
        raise RuntimeError(f"{who}: the child running {name} died with exit code {p.exitcode}") from None
    p.join()
    if msg[0] == "err":
        raise RuntimeError(f"{who}: {name} failed in the child: {msg[1]}\n{msg[2]}")
    return msg[1], msg[2], msg[3]


# ------------------------------------------------------------------ verdicts: win, regression, within noise, too noisy
TIGHT_BAND = 0.15   # "within noise" says a change is smaller than this: the measured effect and its band together
# must lie inside ±15 %. An effect of -13 % against a band of ±15 % is consistent with a 28 % regression and with none;
# calling it "within noise" would contradict a real regression on no evidence, so it is "too noisy"
# Standard errors of the median ratio that a change must clear, and the rounds allowed to disagree on its direction
# (one in six). bench/sim_verdicts.py chose them (20,000 trials, 3 % run noise, 10 % drift between rounds): a no-op
# is called a change in 2.1 % of 3-round runs, 0.8 % of 4-round and 1.1 % of 6-round ones, where 2 standard errors
# without the direction rule called 6.7 %, 3.9 % and 3.5 %.
BAND_SE = 2.5


def _median_spread(vals: list[float]) -> tuple[float, float, float]:
    import statistics
    return statistics.median(vals), min(vals), max(vals)


def verdict(base: list[float], cand: list[float], higher_is_better: bool = True, rel_floor: float = 0.02) -> str:
    """'win', 'regression', 'within noise' or 'too noisy' for one change against its baseline, with no A/A control.

    A change counts only when it clears the noise: the difference of the medians must exceed the larger of the
    two round-to-round ranges (max - min) and `rel_floor` (2 %) of the baseline's median, so that a metric that
    repeats exactly (peak memory of identical runs) does not call a 0.1 % difference a regression. A change that
    does not clear it is 'within noise' only when the difference and the noise together stay under TIGHT_BAND
    (15 %) of the baseline: then any real change is smaller than that. Otherwise the noise could hide a change of
    that size, so the machine could not tell: 'too noisy'.

        >>> verdict([100, 101, 102], [80, 81, 82], higher_is_better=False)
        'win'
        >>> verdict([100, 101, 102], [100, 102, 103], higher_is_better=False)
        'within noise'
        >>> verdict([100, 130, 160], [90, 120, 150], higher_is_better=False)
        'too noisy'
        >>> verdict([100, 105, 110], [108, 111, 114], higher_is_better=False)   # 6 % slower, noise 10 %: cannot tell
        'too noisy'

    Taught in notebooks/02_graph_mode.ipynb.
    """
    if not base or not cand:
        raise ValueError("verdict: base and cand need at least one value each; fix: run more rounds")
    bm, blo, bhi = _median_spread(base)
    cm, clo, chi = _median_spread(cand)
    noise = max(bhi - blo, chi - clo, rel_floor * abs(bm))
    delta = (cm - bm) if higher_is_better else (bm - cm)
    if abs(delta) > noise:
        return "win" if delta > 0 else "regression"
    return "within noise" if abs(delta) + noise < TIGHT_BAND * abs(bm) else "too noisy"


def _log_ratios(base: list[float], cand: list[float], aa: list[float], where: str) -> tuple[list, list]:
    import math
    if not (len(base) == len(cand) == len(aa)) or len(base) < 2:
        raise ValueError(f"{where}: base, cand and aa have {len(base)}, {len(cand)} and {len(aa)} values; "
                         "fix: pass one value per round, at least 2 rounds, in the same order")
    if min(map(float, (*base, *cand, *aa))) <= 0:
        raise ValueError(f"{where}: every value must be > 0 (times, rates, bytes); fix: pass positive metrics")
    return ([math.log(float(c) / float(b)) for b, c in zip(base, cand)],
            [math.log(float(a) / float(b)) for b, a in zip(base, aa)])


def aa_band(base: list[float], aa: list[float], rel_floor: float = 0.02) -> float:
    """The A/A noise band of a paired comparison, as a relative change (0.1 = ±10 %).

    Per round r the A/A log-ratio a_r = log(aa_r / base_r) is pure noise: the same thing run twice. One round's
    noise sigma is estimated robustly, 1.4826 x median |a_r| (one outlier round does not move it, where the
    largest |a_r| would be that outlier). The verdict compares a median of R per-round ratios, whose standard
    error is about 1.2533 sigma / sqrt(R); the band is BAND_SE (2.5) of those, and at least `rel_floor`. So
    the band narrows as rounds are added, as the uncertainty of a median does.

        >>> round(aa_band([100, 100, 100], [102, 99, 101]), 4)      # median |a_r| = 1 %: 2.7 %
        0.0273
        >>> round(aa_band([100, 100, 100, 100, 100], [102, 99, 101, 140, 101]), 4)   # an outlier round changes nothing
        0.0211

    Taught in notebooks/09_evaluation_report.ipynb.
    """
    import math
    _, a = _log_ratios(base, aa, aa, "aa_band")
    return math.exp(_band_log(a, [], rel_floor)) - 1


def _band_log(a: list[float], resid: list[float], rel_floor: float) -> float:
    import math
    import statistics
    sigma = 1.4826 * max(statistics.median(abs(x) for x in a), statistics.median(abs(x) for x in resid) if resid else 0)
    return max(BAND_SE * 1.2533 * sigma / math.sqrt(len(a)), math.log(1 + rel_floor))


def decide(base: list[float], cand: list[float], aa: list[float], higher_is_better: bool = True,
           rel_floor: float = 0.02) -> tuple[str, float]:
    """A change's verdict against an A/A control run in the same rounds (lists aligned by round), and its band.

    Per round r: d_r = log(cand_r / base_r) and a_r = log(aa_r / base_r). The band is `aa_band`'s, from the A/A
    ratios, or from the candidate's own spread around its median (1.4826 x median |d_r - median d|) where that is
    wider: a candidate that scatters more than its A/A copy is not decided on the copy's calm. Then:
    'win' ('regression') when the median d_r clears the band in the good (bad) direction and every round but one in
    six agrees on that direction, whatever the A/A pair did; otherwise 'within noise' when the median effect and
    the band together stay under TIGHT_BAND (15 %), so that any real change is smaller than that; else 'too noisy'
    (this machine could not tell: that is not a contradiction of anything, and callers must not fail on it).
    Returns (verdict, band as a relative change).

        >>> decide([10, 11, 12], [8, 8.9, 9.5], [10.2, 10.9, 12.1], higher_is_better=False)[0]
        'win'
        >>> decide([10, 11, 12], [9.9, 11.1, 12.0], [10.2, 10.9, 12.1], higher_is_better=False)[0]
        'within noise'
        >>> decide([10, 11, 12], [30, 33, 36], [13, 14, 16], higher_is_better=False)[0]   # A/A differs, effect 3x
        'regression'
        >>> decide([10, 11, 12], [5, 5.5, 6], [13, 14, 16], higher_is_better=False)[0]   # ... effect 2x: cannot tell
        'too noisy'
        >>> decide([10, 11, 12], [5, 5.5, 6], [10.5, 11.2, 12.3], higher_is_better=False)[0]
        'win'
        >>> decide([10, 10, 10], [11, 9, 10.5], [13, 8, 11], higher_is_better=False)[0]
        'too noisy'
        >>> decide([10] * 4, [9.0, 9.2, 8.8, 9.1], [9.5, 10.5, 10.5, 9.5])   # -9 % inside a ±12 % band: could be -20 %
        ('too noisy', 0.123...)

    Taught in: no notebook; report.py (claim_timing) calls it.
    """
    import math
    import statistics
    d, a = _log_ratios(base, cand, aa, "decide")
    d = [x if higher_is_better else -x for x in d]
    md = statistics.median(d)
    band = _band_log(a, [x - md for x in d], rel_floor)
    rel = math.exp(band) - 1
    if abs(md) > band and sum((x > 0) != (md > 0) for x in d) <= len(d) // 6:
        return ("win" if md > 0 else "regression"), rel
    return ("within noise" if abs(md) + band < math.log(1 + TIGHT_BAND) else "too noisy"), rel


def paired_verdict(base: list[float], cand: list[float], aa: list[float], higher_is_better: bool = True,
                   rel_floor: float = 0.02) -> str:
    """`decide`'s verdict alone: 'win', 'regression', 'within noise' or 'too noisy'.

        >>> paired_verdict([10, 11, 12], [8, 8.9, 9.5], [10.2, 10.9, 12.1], higher_is_better=False)
        'win'

    Taught with the rest of timing.py in notebooks/02_graph_mode.ipynb.
    """
    return decide(base, cand, aa, higher_is_better, rel_floor)[0]


# ------------------------------------------------------------------ interleaved comparisons
def compare_interleaved(candidates: dict[str, Any], rounds: int = 3, *, baseline: str | None = None,
                        seeds: Any = None, isolate: bool = True, metrics: dict[str, bool] | None = None,
                        timeout: float = 900, progress: bool = True, forkserver_preload: Any = None,
                        aa_control: bool | dict = False, warmup: bool | dict = False,
                        budget_s: float = 0.0, max_rounds: int = 12, decide_on: Any = None,
                        narrow_to: float | None = None) -> dict[str, Any]:
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
        Verdicts are then `decide`'s: per-round ratios to the baseline against the band the A/A pair shows in
        the same run ('win', 'regression', 'within noise' when effect and band stay under ±15 %, else 'too noisy'). An effect that
        clears the band is decided even when the A/A copies differ a little. `band[metric]` is the A/A band
        (`aa_band`, a relative change, at least 2 %); `too_noisy[metric]` is True when some candidate's verdict on
        it is 'too noisy': this machine could not tell, which is no result and no failure. A dict instead of True
        turns the
        control on and overrides those keyword arguments in the copy only (e.g. {"resume_seed": None}: the copy
        times the baseline and skips the baseline's extra check).
    warmup: before round 1, call every candidate once, untimed (the A/A copy shares its baseline's call), the same
        way as the rounds (isolated or not). With a compile cache in its kwargs, that first call compiles each
        graph and every timed call then starts alike, from the cache: no round carries the compiles. A dict
        instead of True overrides those keyword arguments in the untimed calls only (e.g. {"steps": 2}, when the
        graph does not depend on them). Their results are returned as `warmup` {name: value}.
    budget_s: with aa_control, after `rounds` keep adding whole rounds while some candidate's verdict on a metric
        of `decide_on` (default: the first of `metrics`) is 'too noisy', the next round fits in `budget_s` seconds counted from the first timed round, and
        fewer than `max_rounds` ran: the band narrows as rounds are added (a busy neighbour costs time, not a
        verdict). 0 (the default) runs exactly `rounds`. With `seeds`, each added round takes the next seed after
        the largest one so far (the result's `seeds` lists every round's).
    narrow_to: with budget_s, keep adding rounds also while a watched candidate's band is this wide or wider (e.g.
        0.15: a verdict whose band is under ±15 % says more than one decided at ±40 %), within the same budget.
    Taught in notebooks/02_graph_mode.ipynb.
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
    if not isinstance(max_rounds, int) or max_rounds < rounds:
        raise ValueError(f"compare_interleaved: max_rounds={max_rounds!r} is below rounds={rounds}; fix: max_rounds >= rounds")
    watched = [next(iter(metrics))] if decide_on is None else list(decide_on)
    unknown = [m for m in watched if m not in metrics]
    if unknown:
        raise ValueError(f"compare_interleaved: decide_on={unknown!r} are not in metrics; fix: one of {list(metrics)}")
    runs: list[dict] = []

    def run_round(r: int, items: Any) -> None:
        for name in items:
            kwargs = specs[name][2]
            value, extra = call(name, dict(kwargs, seed=seeds[r]) if seeds is not None else kwargs)
            row = dict(value) if isinstance(value, dict) else {"median_step_s": float(value)}
            row.update({k: v for k, v in extra.items() if k not in row})
            row.update(name=name, round=r, seed=None if seeds is None else seeds[r])
            runs.append(row)

    def by_round(name: str, m: str) -> list[float] | None:
        got = {x["round"]: float(x[m]) for x in runs if x["name"] == name and x.get(m) is not None}
        return [got[r] for r in range(rounds)] if len(got) == rounds else None

    def paired(name: str, m: str) -> tuple[str, float] | None:
        b, c, a = by_round(baseline, m), by_round(name, m), by_round(aa_name, m) if aa_control else None
        return decide(b, c, a, metrics[m]) if a and b and c and min(b + c + a) > 0 else None

    t0 = time.perf_counter()
    order = [(r, names[(i + r) % len(names)]) for r in range(rounds) for i in range(len(names))]
    for r, name in bar(order, "interleaved runs"):
        run_round(r, [name])
    while aa_control and budget_s and rounds < max_rounds:
        undecided = [f"{n} ({m})" for m in watched for n in names if n not in (baseline, aa_name)
                     and ((got := paired(n, m)) is not None
                          and (got[0] == "too noisy" or (narrow_to is not None and got[1] >= narrow_to)))]
        per_round = (time.perf_counter() - t0) / rounds
        if not undecided or time.perf_counter() - t0 + per_round > budget_s:
            break
        if progress:
            print(f"round {rounds + 1}: {', '.join(undecided)} still too noisy or too wide; one more round "
                  f"(~{per_round:.0f} s of a {budget_s:.0f} s budget)", flush=True)
        if seeds is not None:
            seeds.append(max(seeds) + 1)            # a new round is a new seed: another init and data order
        run_round(rounds, [names[(i + rounds) % len(names)] for i in range(len(names))])
        rounds += 1

    too_noisy, band = {}, {}
    if aa_control:
        for m in metrics:
            b, a = by_round(baseline, m), by_round(aa_name, m)
            if b and a and min(b + a) > 0:
                band[m] = aa_band(b, a)
                too_noisy[m] = any((paired(n, m) or ("",))[0] == "too noisy" for n in names
                                   if n not in (baseline, aa_name))
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
                got = paired(name, m)
                row[f"{m} verdict"] = got[0] if got else verdict(bvals, vals, hib)
                if got:
                    row[f"{m} band"] = got[1]
        table.append(row)
    return {"runs": runs, "table": table, "baseline": baseline, "rounds": rounds, "aa": aa_name,
            "too_noisy": too_noisy, "band": band, "warmup": warm, "seeds": seeds}
