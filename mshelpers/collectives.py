"""Collectives: the bytes a ring sends, times measured on this machine, their alpha-beta fit, and the price
of one collective on the links the doctor puts a group on.

Ring algorithms: an all-reduce sends 2(n-1)/n of its buffer from each rank, an all-gather or reduce-scatter
(n-1)/n, a broadcast the buffer once. `measure_collectives` times MindSpore's collectives between msrun processes;
`fit_alpha_beta` fits t = alpha + bytes/beta to them; `collective_time` prices one collective under a
`mshelpers.hardware.Hardware` profile (which `Hardware.from_measurement` builds from such a fit).

Communication measured, not assumed:
    >>> from mshelpers.collectives import fit_alpha_beta, ring_allreduce_bytes
    >>> rows = [{"op": "all_reduce", "bytes": b, "seconds": 1e-3 + b / 2e8, "ranks": 2} for b in (4096, 2**20, 2**24)]
    >>> alpha, beta = fit_alpha_beta(rows, "all_reduce")        # also .residuals, .max_ratio, .predict(n)
    >>> round(alpha, 6), round(beta / 1e6)
    (0.001, 200)
    >>> ring_allreduce_bytes(1000, 4)
    1500

Copied alone it needs the standard library; `collective_time` needs the `doctor/` folder (its link rule),
`measure_collectives` needs `launch.py` and the `workers/` folder (and msrun).
"""
from __future__ import annotations

import math
import numbers
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:      # annotations only, never imported at run time: the module still copies alone
    from .hardware import Hardware


# ---------------------------------------------------------------- bytes each rank sends (ring algorithms)
def ring_allreduce_bytes(buffer_bytes: int, group_size: int) -> int:
    """Bytes each rank sends in a ring all-reduce of `buffer_bytes`: 2(n-1)/n·S (0 for n = 1).

        >>> ring_allreduce_bytes(1000, 2), ring_allreduce_bytes(1000, 8)
        (1000, 1750)

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    group_size = _pos("ring_allreduce_bytes", "group_size", group_size)
    return round(2 * (group_size - 1) * buffer_bytes / group_size)


def ring_allgather_bytes(output_bytes: int, group_size: int) -> int:
    """Bytes each rank sends in a ring all-gather whose gathered output is `output_bytes`: (n-1)/n·S.

        >>> ring_allgather_bytes(1000, 2)
        500

    Taught beside ring_allreduce_bytes in notebooks/05_semi_auto_parallel.ipynb.
    Taught with the rest of collectives.py in notebooks/04_data_parallel.ipynb.
    """
    group_size = _pos("ring_allgather_bytes", "group_size", group_size)
    return round((group_size - 1) * output_bytes / group_size)


def tp_allreduce_buffer_bytes(micro_batch: int, seq_len: int, hidden_size: int, bytes_per_value: int = 2) -> int:
    """Size of one tensor-parallel activation all-reduce: the b·s·h block output, in bytes.

        >>> tp_allreduce_buffer_bytes(8, 4096, 4096)        # 8 sequences of LLaMA-2-7B in bf16
        268435456

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    for n, v in (("micro_batch", micro_batch), ("seq_len", seq_len), ("hidden_size", hidden_size),
                 ("bytes_per_value", bytes_per_value)):
        _pos("tp_allreduce_buffer_bytes", n, v)
    return micro_batch * seq_len * hidden_size * bytes_per_value


def _send_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of the op's buffer, for ring algorithms on n ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def _passes(op: str) -> int:
    """Ring passes of a collective, each paying the latency once (the doctor's reduce-scatter + all-gather)."""
    return 2 if op == "all_reduce" else 1


# ---------------------------------------------------------------- collectives measured on this machine
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# 4 KiB .. 16 MiB. Larger messages are not linear here: on a 2-core Xeon a 32 MiB AllReduce took
# 3.7x the 16 MiB one (0.75 s against 0.20 s), so an alpha-beta line through them misleads; pass
# `sizes` to look at them.
DEFAULT_COLLECTIVE_SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


def measure_collectives(ranks: int = 2, sizes: Sequence[int] | None = None,
                        ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast"), *,
                        repeats: int = 7, warmup: int = 2, max_seconds_per_size: float = 4.0,
                        rounds: int = 1, threads: int | None = None, timeout: float = 300, log_dir: Any = None) -> list[dict]:
    """Time collectives between `ranks` msrun processes on this machine; one row per (op, size).

    Launches `mshelpers/workers/collectives_bench.py` under msrun (`mshelpers.launch.msrun`).
    For every op and message size (default 4 KiB to 16 MiB, 7 sizes): `warmup` untimed calls,
    then `repeats` timed ones (fewer past `max_seconds_per_size`, at least 3), each
    synchronised with `.asnumpy()` and started together after a tiny barrier all-reduce.
    With `rounds` > 1 the sizes are swept `rounds` times, `repeats` calls each time, so a spell of
    contention on a shared machine falls on one round of every size rather than on every call of
    one size (the same reason timing.compare_interleaved alternates its candidates).
    Rows: {op, bytes, seconds, ranks} plus api (the MindSpore call), repeats, rank_medians_s, min_s and max_s
    (over all ranks' calls), and round_medians_s (per round, the slowest rank's median); seconds is the
    fastest of those rounds (with one round, the slowest rank's median), as within_factor reads them.
    `bytes` is the full float32 buffer the op is about (all-reduced tensor, gathered output,
    reduce-scatter input, broadcast tensor), rounded to a multiple of 4·ranks. An op that fails
    on this backend keeps its rows, with seconds None and `error` quoting MindSpore (on CPU
    `ops.ReduceScatter` has no kernel). `threads` sets each rank's CPU kernel threads (default:
    the cores divided among the ranks; 0 keeps MindSpore's default). The default call takes
    about 40 s on 2 cores, 25 s of it msrun and MindSpore start-up. Ops run broadcast first and
    the rows come back in the order asked (see the worker for why).

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    fn = "measure_collectives"
    ranks = _pos(fn, "ranks", ranks)
    if ranks < 2:
        raise ValueError(f"{fn}: ranks={ranks} measures nothing; fix: use ranks >= 2")
    sizes = list(DEFAULT_COLLECTIVE_SIZES if sizes is None else sizes)
    if not sizes:
        raise ValueError(f"{fn}: sizes is empty; fix: pass message sizes in bytes, or None for the default")
    for b in sizes:
        _pos(fn, "sizes[i]", b)
    ops = [ops] if isinstance(ops, str) else list(ops)
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad or not ops:
        raise ValueError(f"{fn}: ops={ops!r} has unknown {bad}; fix: choose from {COLLECTIVES}")
    repeats = _pos(fn, "repeats", repeats)
    rounds = _pos(fn, "rounds", rounds)
    if __package__:                                     # imported here: the planner above runs without MindSpore
        from .launch import msrun
        from .workers import script_path
    else:  # copied beside its siblings as plain files
        from launch import msrun
        from workers import script_path
    run = msrun(script_path("collectives_bench"), workers=ranks, log_dir=log_dir, timeout=timeout,
                args=_collectives_bench_args(ranks, sizes, ops, repeats, warmup, max_seconds_per_size, threads, rounds))
    per_rank = [r["rows"] for r in run.results() if r]
    if len(per_rank) != ranks:
        raise RuntimeError(f"{fn}: {len(per_rank)} of {ranks} ranks wrote results; see the logs in {run.log_dir}")
    return merge_rank_rows(per_rank)


def _collectives_bench_args(ranks: int, sizes: Sequence[int], ops: Sequence[str], repeats: int, warmup: int,
                            max_seconds_per_size: float, threads: int | None, rounds: int = 1) -> list[str]:
    """The command line of workers/collectives_bench.py; threads None: the cores divided among the ranks."""
    if threads is None:
        import os
        threads = max(1, (os.cpu_count() or 1) // ranks)
    return ["--sizes", ",".join(str(int(b)) for b in sizes), "--ops", ",".join(ops), "--repeats", str(repeats),
            "--warmup", str(warmup), "--max-seconds-per-size", str(max_seconds_per_size), "--rounds", str(int(rounds)),
            "--threads", str(int(threads))]


def merge_rank_rows(per_rank: Sequence[Sequence[dict]]) -> list[dict]:
    """One row per (op, size) from every rank's rows (same order on every rank): per round the slowest rank's
    median, and as `seconds` the fastest of those rounds. Each rank's row: op, bytes, times_s, median_s and
    round_medians_s (or an error); workers/grad_fusion.py's fit rows are merged by it too.
    Taught in notebooks/04_data_parallel.ipynb (section 2's sweeps and section 5's fit sizes).

        >>> r0 = {"op": "all_reduce", "bytes": 8, "times_s": [1.0, 3.0], "median_s": 2.0, "round_medians_s": [1.0, 3.0]}
        >>> r1 = {"op": "all_reduce", "bytes": 8, "times_s": [2.0, 2.0], "median_s": 2.0, "round_medians_s": [2.0, 2.0]}
        >>> merge_rank_rows([[r0], [r1]])[0]["seconds"]      # rounds end at 2.0 and 3.0: the fastest
        2.0
    """
    ranks, rows = len(per_rank), []
    for i, r0 in enumerate(per_rank[0]):
        mine = [rr[i] for rr in per_rank]
        row = {"op": r0["op"], "bytes": int(r0["bytes"]), "seconds": None, "ranks": ranks, "api": r0.get("api")}
        errors = [m["error"] for m in mine if m.get("error")]
        if errors:
            row["error"] = errors[0]
        else:
            times = [t for m in mine for t in m["times_s"]]
            per_round = [m.get("round_medians_s") or [m["median_s"]] for m in mine]
            rounds = [max(r) for r in zip(*per_round)]          # a round ends when its slowest rank ends
            # the fastest round: a neighbour only adds time (within_factor says why); one round: the slowest median
            row.update(seconds=min(rounds), repeats=min(len(m["times_s"]) for m in mine),
                       rank_medians_s=[m["median_s"] for m in mine], min_s=min(times), max_s=max(times),
                       round_medians_s=rounds)
        rows.append(row)
    return rows


# ---------------------------------------------------------------- the alpha-beta fit
@dataclass(frozen=True)
class AlphaBetaFit:
    """A least-squares fit of t(S) = alpha + S/beta to measured (bytes, seconds) of one collective.

    Unpacks as the pair `alpha_s, beta_bytes_per_s = fit` (iteration and indexing give those two
    numbers only); the rest says how good the fit is: `residuals` (one dict per size: bytes,
    measured_s, predicted_s, residual_s, ratio = predicted/measured), `rms_rel_error` and
    `max_ratio` (the worst of predicted/measured and measured/predicted, >= 1).

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    op: str
    alpha_s: float
    beta_bytes_per_s: float
    n_points: int
    ranks: int | None
    weighting: str
    residuals: tuple
    rms_rel_error: float
    max_ratio: float

    def __iter__(self):
        return iter((self.alpha_s, self.beta_bytes_per_s))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> float:
        return (self.alpha_s, self.beta_bytes_per_s)[i]

    def predict(self, nbytes: float) -> float:
        """Seconds the fitted model gives for a message of `nbytes`."""
        return self.alpha_s + nbytes / self.beta_bytes_per_s


def fit_alpha_beta(rows: Iterable[dict], op: str, *, weighting: str = "relative",
                   exclude_bytes: Iterable[int] = ()) -> AlphaBetaFit:
    """Fit the latency-bandwidth model t = alpha + bytes/beta to the rows of `op`; return an AlphaBetaFit.

    `alpha_s, beta_bytes_per_s = fit_alpha_beta(rows, op)` is the (alpha, beta) pair. Rows are
    `measure_collectives` rows (or any dicts with op, bytes, seconds); rows with an error, no
    time, or a size in `exclude_bytes` (to hold one out and predict it) are skipped.
    weighting="relative" (default) minimises the squared *relative* residuals, weights 1/t²,
    so the millisecond-scale small messages and the 0.1 s large ones count alike;
    "absolute" minimises squared seconds (then the largest messages dominate). If the
    unconstrained fit gives alpha < 0, alpha is pinned at 0 and beta refitted.

        >>> rows = [{"op": "all_reduce", "bytes": b, "seconds": 2e-3 + b / 1.5e8} for b in (1e4, 1e6, 1.6e7)]
        >>> f = fit_alpha_beta(rows, "all_reduce")
        >>> round(f.alpha_s, 6), round(f.beta_bytes_per_s / 1e6, 3), f.max_ratio < 1 + 1e-9
        (0.002, 150.0, True)

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb (used in 12_your_config.ipynb).
    """
    fn = "fit_alpha_beta"
    if weighting not in ("relative", "absolute"):
        raise ValueError(f"{fn}: weighting={weighting!r} is invalid; fix: use 'relative' or 'absolute'")
    rows = list(rows)
    skip = set(int(b) for b in exclude_bytes)
    pts = [(float(r["bytes"]), float(r["seconds"])) for r in rows
           if r.get("op") == op and not r.get("error") and r.get("seconds") and int(r["bytes"]) not in skip]
    pts = [(x, t) for x, t in pts if x > 0 and t > 0]
    if len({x for x, _ in pts}) < 2:
        errs = sorted({r["error"] for r in rows if r.get("op") == op and r.get("error")})
        why = f" (its rows carry errors: {errs[0]})" if errs else ""
        raise ValueError(f"{fn}: op={op!r} has {len(pts)} usable rows at {len({x for x, _ in pts})} distinct sizes"
                         f"{why}; fix: measure at least 2 sizes that ran, e.g. measure_collectives(ops=[{op!r}])")
    w = [1 / t ** 2 if weighting == "relative" else 1.0 for _, t in pts]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, pts))
    st = sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    sxt = sum(wi * x * t for wi, (x, t) in zip(w, pts))
    det = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / det
    alpha = (st - slope * sx) / sw
    if alpha < 0:                               # a negative latency is not physical: pin it at 0
        alpha, slope = 0.0, sxt / sxx
    if not slope > 0:
        raise ValueError(f"{fn}: op={op!r}: time does not grow with size over {sorted({x for x, _ in pts})} "
                         "(the fitted 1/beta is not positive); fix: measure sizes spanning at least 100x, "
                         "up to 16 MiB or more, with more repeats")
    beta = 1 / slope
    res, rel = [], []
    for x, t in sorted(pts):
        pred = alpha + x / beta
        res.append({"bytes": int(x), "measured_s": t, "predicted_s": pred, "residual_s": t - pred,
                    "ratio": pred / t})
        rel.append((t - pred) / t)
    ranks = next((r.get("ranks") for r in rows if r.get("op") == op and r.get("ranks")), None)
    return AlphaBetaFit(op=op, alpha_s=alpha, beta_bytes_per_s=beta, n_points=len(pts), ranks=ranks,
                        weighting=weighting, residuals=tuple(res),
                        rms_rel_error=math.sqrt(sum(e * e for e in rel) / len(rel)),
                        max_ratio=max(max(r["ratio"], 1 / r["ratio"]) for r in res))


# ---------------------------------------------------------------- one collective on the doctor's links
def within_factor(predicted_s: float, measured_s: Sequence[float], factor: float = 2.0, *,
                  fit: AlphaBetaFit | None = None, upper_only: bool = False) -> dict[str, Any]:
    """Is a measured time within `factor` of its prediction, and could this machine tell?

    `measured_s` holds one time per round (a row's `round_medians_s`, or per-round timings); the measured figure
    is the fastest round's, since a neighbour on a shared machine only ever adds time to a call (timeit's rule: on
    a busy machine the rounds come out two-moded, a few descheduled for a whole scheduler slice, and their median
    sits in the slow mode). The verdict is "within" when predicted/measured lies in [1/factor, factor] (with
    `upper_only`, only measured <= factor x predicted is asked), "outside" when it misses by more than the noise
    band, and "too noisy" when it misses by less than that: the miss cannot be told from the machine's own scatter.
    The band, on a log scale, is 2.5 standard errors of the median, as report.claim_timing's: one round's noise is
    1.4826 x the median |log(round / median)|, over sqrt(rounds); with `fit`, the line's own scatter about the
    sizes it was fitted on (1.4826 x the median |log ratio| over sqrt(points)) is added in quadrature, since a
    line fitted through noisy points predicts no better than they were measured. One round and no fit: no band.

        >>> within_factor(1.0, [1.1, 0.9, 1.0, 1.05, 0.95])["verdict"]
        'within'
        >>> within_factor(0.1, [1.1, 0.9, 1.0, 1.05, 0.95])["verdict"]
        'outside'
        >>> within_factor(0.05, [0.3, 9.0, 1.0, 0.2, 4.0])["verdict"]
        'too noisy'

    Returns {verdict, predicted_s, measured_s (the fastest round), median_s (over rounds), ratio (predicted /
    measured), band (the factor the noise spans, >= 1), rounds}.
    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    fn = "within_factor"
    try:
        vals = [float(v) for v in measured_s]
    except (TypeError, ValueError):
        vals = []
    if not vals or min(vals) <= 0 or not all(math.isfinite(v) for v in vals):
        raise ValueError(f"{fn}: measured_s={measured_s!r} needs one positive time per round; fix: pass the "
                         "rounds' times (a row's round_medians_s)")
    for name, v, need in (("predicted_s", predicted_s, "a positive time in seconds"),
                          ("factor", factor, "a factor above 1, e.g. 2")):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
                or not (v > 1 if name == "factor" else v > 0):
            raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass {need}")
    predicted_s = float(predicted_s)
    fastest, med, n = min(vals), statistics.median(vals), len(vals)

    def sigma(logs: list[float]) -> float:                  # the median |log| of a sample, robustly as sigma
        return 1.4826 * statistics.median(abs(x) for x in logs)
    var = sigma([math.log(v / med) for v in vals]) ** 2 / n if n > 1 else 0.0
    if fit is not None and fit.residuals:
        var += sigma([math.log(r["ratio"]) for r in fit.residuals]) ** 2 / len(fit.residuals)
    band_log = 2.5 * 1.2533 * math.sqrt(var)
    miss = math.log(fastest / predicted_s) if upper_only else abs(math.log(predicted_s / fastest))
    verdict = "within" if miss <= math.log(factor) else "outside" if miss - math.log(factor) > band_log \
        else "too noisy"
    return {"verdict": verdict, "predicted_s": predicted_s, "measured_s": fastest, "median_s": med,
            "ratio": predicted_s / fastest, "band": math.exp(band_log), "rounds": n}


def collective_time(op: str, nbytes: float, group_size: int, hardware: Hardware, *,
                    crosses_nodes: bool = False) -> float:
    """Seconds one collective of `nbytes` (the full buffer, as in measure_collectives) takes under `hardware`,
    on the links the doctor prices a group's collective on (`doctor.topology.ring_link`; no fitted factor).

    Per pass: latency + (n-1)/n·S / bandwidth; an all-reduce is 2 passes (reduce-scatter + all-gather), an
    all-gather or reduce-scatter 1, a broadcast sends S once. The group is n consecutive ranks of one node, or
    with `crosses_nodes` one rank on each of n nodes. tests/doctor/test_one_price.py holds this equal to the gradient
    reduction of the doctor's data-parallel step.

        >>> from mshelpers.hardware import Hardware
        >>> hw = Hardware(1e12, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e8, intra_node_latency_s=1e-4)
        >>> round(collective_time("all_reduce", 1e6, 2, hw), 6), round(collective_time("all_gather", 1e6, 4, hw), 6)
        (0.0012, 0.00085)

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    if op not in COLLECTIVES:
        raise ValueError(f"collective_time: op={op!r} is unknown; fix: use one of {COLLECTIVES}")
    group_size = _pos("collective_time", "group_size", group_size)
    if group_size == 1:
        return 0.0
    if __package__:
        from .doctor import topology
    else:  # copied beside its siblings as plain files
        from doctor import topology
    dh = hardware.to_doctor()[0]
    node = dh.devices_per_node
    ranks = [k * node for k in range(group_size)] if crosses_nodes else list(range(group_size))
    bw, lat = topology.ring_link(dh, topology.span(ranks, node if crosses_nodes else max(node, group_size)))
    return _passes(op) * lat + _send_factor(op, group_size) * nbytes / bw


# ---------------------------------------------------------------- internals
def _pos(fn: str, name: str, v: Any) -> int:
    """A positive count from an int, a numpy integer or an integral float (4.0); else one ValueError.
    (The same lines as parallel._pos and pipeline._pos, inlined so that each module copies alone.)"""
    import numbers
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and int(v) > 0:
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer"
                     + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))
