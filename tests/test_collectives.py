"""mshelpers.collectives: the bytes a ring sends, the alpha-beta fit (exact rows, noise, its least-squares
minimum, its refusals), collective_time on the doctor's links, and measure_collectives' wiring around msrun; the
last test runs a real 2-rank measurement under msrun (~30 s).
"""
from __future__ import annotations


import numpy as np
import pytest

from mshelpers import collectives
from mshelpers.collectives import AlphaBetaFit, collective_time, fit_alpha_beta
from mshelpers.hardware import Hardware
from _checks import module_doctests, positive_count_line, refused

MODULE = collectives


def _rows(alpha, beta, sizes, op="all_reduce", noise=()):
    noise = list(noise) or [1.0] * len(sizes)
    return [{"op": op, "bytes": b, "seconds": (alpha + b / beta) * k, "ranks": 2} for b, k in zip(sizes, noise)]


def test_doctests():
    tries, failures = module_doctests(collectives)
    assert tries >= 13 and failures == 0


# ---------------------------------------------------------------- bytes each rank sends
COUNTS = [
    ("ring_allreduce_bytes", (1000, 2), (None, "group_size")),
    ("ring_allgather_bytes", (1000, 2), (None, "group_size")),
    ("tp_allreduce_buffer_bytes", (2, 16, 8, 4), ("micro_batch", "seq_len", "hidden_size", "bytes_per_value")),
]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "3", float("nan")], ids=repr)
@pytest.mark.parametrize("fn,args,names", COUNTS, ids=[c[0] for c in COUNTS])
def test_every_count_is_refused_by_one_line_naming_the_function_and_the_argument(fn, args, names, bad):
    for i, name in enumerate(names):
        if name is None:
            continue
        got = list(args)
        got[i] = bad
        assert refused(getattr(MODULE, fn), *got) == positive_count_line(fn, name, bad)


def test_counts_accept_integral_floats_and_numpy_integers():
    assert collectives.ring_allreduce_bytes(1000, 4.0) == 1500
    assert collectives.ring_allreduce_bytes(1000, np.int64(4)) == 1500


def test_the_defaults():
    assert collectives.tp_allreduce_buffer_bytes(2, 3, 5) == 60                   # 2 bytes a value


def test_send_factors_and_the_link_a_collective_uses():
    assert (collectives._send_factor("all_reduce", 4), collectives._send_factor("all_gather", 4),
            collectives._send_factor("reduce_scatter", 4), collectives._send_factor("broadcast", 4)) == (1.5, 0.75, 0.75, 1.0)
    hw = Hardware(1e12, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e8, intra_node_latency_s=1e-4,
                  inter_node_latency_s=1e-3)
    assert collective_time("reduce_scatter", 4e6, 4, hw) == pytest.approx(1e-4 + 0.75 * 4e6 / 1e9)
    assert collective_time("reduce_scatter", 4e6, 4, hw, crosses_nodes=True) == pytest.approx(1e-3 + 0.75 * 4e6 / 1e8)
    assert collective_time("broadcast", 4e6, 8, hw) == pytest.approx(1e-4 + 4e6 / 1e9)


# ---------------------------------------------------------------- alpha-beta fit
SIZES = [4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20]


@pytest.mark.parametrize("weighting", ["relative", "absolute"])
def test_fit_recovers_alpha_and_beta_from_exact_rows(weighting):
    fit = fit_alpha_beta(_rows(3e-3, 1.2e8, SIZES), "all_reduce", weighting=weighting)
    alpha, beta = fit                                     # the tuple contract
    assert alpha == pytest.approx(3e-3, rel=1e-9) and beta == pytest.approx(1.2e8, rel=1e-9)
    assert (fit[0], fit[1]) == (alpha, beta) and len(fit) == 2
    assert isinstance(fit, AlphaBetaFit) and fit.n_points == len(SIZES) and fit.ranks == 2
    assert fit.max_ratio == pytest.approx(1.0) and fit.rms_rel_error < 1e-9
    assert [r["bytes"] for r in fit.residuals] == SIZES
    assert fit.predict(32 << 20) == pytest.approx(3e-3 + (32 << 20) / 1.2e8)


def test_fit_reports_residuals_of_noisy_rows_and_relative_weighting_respects_small_messages():
    noise = [1.3, 0.8, 1.2, 0.9, 1.1, 0.95, 1.02]
    rows = _rows(5e-3, 1e8, SIZES, noise=noise)
    rel = fit_alpha_beta(rows, "all_reduce")
    for r, k in zip(rel.residuals, noise):
        assert r["residual_s"] == pytest.approx(r["measured_s"] - r["predicted_s"])
        assert r["ratio"] == pytest.approx(r["predicted_s"] / r["measured_s"])
    assert 1.1 < rel.max_ratio < 1.6 and 0.05 < rel.rms_rel_error < 0.4
    assert rel.alpha_s == pytest.approx(5e-3, rel=0.3) and rel.beta_bytes_per_s == pytest.approx(1e8, rel=0.1)
    ab = fit_alpha_beta(rows, "all_reduce", weighting="absolute")
    # the absolute fit is driven by the big messages: its worst small-message ratio is worse
    assert max(r["ratio"] for r in ab.residuals[:3]) >= max(r["ratio"] for r in rel.residuals[:3]) - 1e-12


@pytest.mark.parametrize("weighting", ["relative", "absolute"])
def test_fit_is_the_least_squares_minimum_of_its_weighting(weighting):
    noise = [1.5, 0.7, 1.3, 0.8, 1.1, 0.9, 1.2]
    rows = _rows(5e-3, 1e8, SIZES, noise=noise)
    fit = fit_alpha_beta(rows, "all_reduce", weighting=weighting)

    def loss(a, inv_b):
        return sum(((r["seconds"] - a - r["bytes"] * inv_b) / (r["seconds"] if weighting == "relative" else 1)) ** 2
                   for r in rows)
    a0, s0 = fit.alpha_s, 1 / fit.beta_bytes_per_s
    assert a0 > 0
    for da, ds in ((1e-4, 0), (-1e-4, 0), (0, s0 * 1e-3), (0, -s0 * 1e-3), (1e-4, -s0 * 1e-3)):
        assert loss(a0 + da, s0 + ds) > loss(a0, s0)
    other = fit_alpha_beta(rows, "all_reduce", weighting="absolute" if weighting == "relative" else "relative")
    assert (other.alpha_s, other.beta_bytes_per_s) != pytest.approx((a0, fit.beta_bytes_per_s), rel=1e-3)


def test_fit_pins_negative_latency_at_zero_and_skips_errors_and_held_out_sizes():
    rows = [{"op": "all_gather", "bytes": b, "seconds": b / 1e8 - 1e-4} for b in (1 << 20, 4 << 20, 16 << 20)]
    rows += [{"op": "all_gather", "bytes": 64 << 20, "seconds": None, "error": "RuntimeError: x"},
             {"op": "all_gather", "bytes": 32 << 20, "seconds": 50.0, "error": "partial: rank 1 timed out"},
             {"op": "all_reduce", "bytes": 1 << 20, "seconds": 99.0}]
    fit = fit_alpha_beta(rows, "all_gather")
    assert fit.alpha_s == 0.0 and fit.n_points == 3 and fit.beta_bytes_per_s == pytest.approx(1e8, rel=0.01)
    held = fit_alpha_beta(_rows(1e-3, 1e8, SIZES), "all_reduce", exclude_bytes=[16 << 20])
    assert held.n_points == len(SIZES) - 1
    assert held.predict(16 << 20) == pytest.approx(1e-3 + (16 << 20) / 1e8)


def test_fit_refuses_what_it_cannot_fit_and_says_why():
    err = [{"op": "reduce_scatter", "bytes": b, "seconds": None,
            "error": "RuntimeError: Unsupported op [ReduceScatter] on CPU"} for b in SIZES]
    with pytest.raises(ValueError, match="Unsupported op"):
        fit_alpha_beta(err, "reduce_scatter")
    with pytest.raises(ValueError, match="at least 2 sizes"):
        fit_alpha_beta(_rows(1e-3, 1e8, [4096]), "all_reduce")
    with pytest.raises(ValueError, match="does not grow"):
        fit_alpha_beta([{"op": "broadcast", "bytes": b, "seconds": 0.01 - b * 1e-10} for b in SIZES], "broadcast")
    with pytest.raises(ValueError, match="weighting"):
        fit_alpha_beta(_rows(1e-3, 1e8, SIZES), "all_reduce", weighting="huber")


# ---------------------------------------------------------------- measure_collectives: its arguments, its command line, its rows
def test_measure_collectives_rejects_bad_arguments():
    with pytest.raises(ValueError, match="ranks=1"):
        collectives.measure_collectives(1)
    with pytest.raises(ValueError, match="all_to_all"):
        collectives.measure_collectives(2, ops=["all_to_all"])
    with pytest.raises(ValueError, match="sizes"):
        collectives.measure_collectives(2, sizes=[])


@pytest.mark.parametrize("kw, line", [
    (dict(ranks=1), "measure_collectives: ranks=1 measures nothing; fix: use ranks >= 2"),
    (dict(ranks=2.5), "measure_collectives: ranks=2.5 is invalid; fix: pass a positive integer"),
    (dict(sizes=[]), "measure_collectives: sizes is empty; fix: pass message sizes in bytes, or None for the default"),
    (dict(sizes=[4096, 0]), "measure_collectives: sizes[i]=0 is invalid; fix: pass a positive integer"),
    (dict(ops=[]), "measure_collectives: ops=[] has unknown []; fix: choose from ('all_reduce', 'all_gather', "
                   "'reduce_scatter', 'broadcast')"),
    (dict(ops="all_to_all"), "measure_collectives: ops=['all_to_all'] has unknown ['all_to_all']; fix"),
    (dict(ops=("broadcast", "gather")), "ops=['broadcast', 'gather'] has unknown ['gather']"),
    (dict(repeats=0), "measure_collectives: repeats=0 is invalid; fix: pass a positive integer"),
])
def test_measure_collectives_refusal_lines(kw, line):
    with pytest.raises(ValueError) as e:
        collectives.measure_collectives(**({"ranks": 2} | kw))
    assert line in str(e.value)


def test_collectives_bench_args_match_the_workers_flags():
    import os
    import re
    from mshelpers.workers import script_path
    args = collectives._collectives_bench_args(2, [4096, 65536.0], ["all_reduce", "broadcast"], 5, 1, 2.5, 3, 4)
    assert args == ["--sizes", "4096,65536", "--ops", "all_reduce,broadcast", "--repeats", "5", "--warmup", "1",
                    "--max-seconds-per-size", "2.5", "--rounds", "4", "--threads", "3"]
    declared = set(re.findall(r'add_argument\("(--[a-z-]+)"', open(script_path("collectives_bench")).read()))
    assert {a for a in args if a.startswith("--")} == declared          # every flag the worker has, and no other
    cores = os.cpu_count() or 1
    assert collectives._collectives_bench_args(2, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == str(max(1, cores // 2))
    assert collectives._collectives_bench_args(4 * cores, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == "1"
    assert collectives._collectives_bench_args(2, [8], ["all_reduce"], 3, 2, 4.0, 0)[-1] == "0"


def test_collectives_threads_default_to_whole_cores_per_rank(monkeypatch):
    import os
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    args = collectives._collectives_bench_args(2, [1024], ["all_reduce"], 3, 1, 2.0, None)
    assert args[args.index("--threads") + 1] == "2"


def test_merge_rank_rows_takes_the_slowest_rank_and_keeps_errors():
    r0 = [{"op": "all_reduce", "bytes": 4096.0, "api": "ops.AllReduce", "median_s": 0.002, "times_s": [0.001, 0.002, 0.004]},
          {"op": "reduce_scatter", "bytes": 8, "api": "ops.ReduceScatter", "error": "Unsupported op [ReduceScatter] on CPU"}]
    r1 = [{"op": "all_reduce", "bytes": 4096, "api": "ops.AllReduce", "median_s": 0.003, "times_s": [0.0025, 0.003]},
          {"op": "reduce_scatter", "bytes": 8, "api": "ops.ReduceScatter", "error": ""}]
    assert collectives.merge_rank_rows([r0, r1]) == [
        {"op": "all_reduce", "bytes": 4096, "seconds": 0.003, "ranks": 2, "api": "ops.AllReduce", "repeats": 2,
         "rank_medians_s": [0.002, 0.003], "min_s": 0.001, "max_s": 0.004, "round_medians_s": [0.003]},
        {"op": "reduce_scatter", "bytes": 8, "seconds": None, "ranks": 2, "api": "ops.ReduceScatter",
         "error": "Unsupported op [ReduceScatter] on CPU"}]
    r1[1]["error"], r0[1]["error"] = "another rank failed", ""
    assert collectives.merge_rank_rows([r0, r1])[1]["error"] == "another rank failed"
    assert type(collectives.merge_rank_rows([r0, r1])[0]["bytes"]) is int
    assert collectives.merge_rank_rows([[{"op": "broadcast", "bytes": 4, "median_s": 1.0, "times_s": [1.0]}]])[0]["api"] is None


def test_measure_collectives_documented_defaults(monkeypatch):
    import inspect
    import os
    p = inspect.signature(collectives.measure_collectives).parameters
    assert {k: p[k].default for k in ("ranks", "sizes", "repeats", "warmup", "max_seconds_per_size", "threads",
                                      "timeout", "log_dir", "rounds")} == dict(ranks=2, sizes=None, repeats=7, warmup=2,
                                                                               max_seconds_per_size=4.0, threads=None,
                                                                               timeout=300, log_dir=None, rounds=1)
    assert collectives.DEFAULT_COLLECTIVE_SIZES == (4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)
    # threads None: the cores divided among the ranks, at least 1; an unknown core count counts as 1
    assert collectives._collectives_bench_args(1, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == str(os.cpu_count() or 1)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert collectives._collectives_bench_args(1, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == "1"
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert collectives._collectives_bench_args(2, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == "3"


class _RecordedLaunch:
    """What measure_collectives asked msrun for, and the ranks' results it is handed back (the real launch is
    test_two_rank_measurement_gives_a_time_or_a_reason_for_every_op; this checks the wiring around it)."""

    def __init__(self, results):
        self.calls, self._results, self.log_dir = [], results, "/logs/of/this/launch"

    def __call__(self, script, workers, log_dir=None, timeout=None, args=None):
        self.calls.append(dict(script=script, workers=workers, log_dir=log_dir, timeout=timeout, args=args))
        return self

    def results(self):
        return self._results


def _rank_rows(median):
    return {"rows": [{"op": "all_reduce", "bytes": 4096, "api": "ops.AllReduce", "median_s": median,
                      "times_s": [median, 2 * median]}]}


def test_measure_collectives_launches_the_bench_worker_with_its_defaults(monkeypatch):
    import os
    from mshelpers import launch
    from mshelpers.workers import script_path
    rec = _RecordedLaunch([_rank_rows(0.001), _rank_rows(0.003)])
    monkeypatch.setattr(launch, "msrun", rec)
    rows = collectives.measure_collectives()
    assert rec.calls == [dict(script=script_path("collectives_bench"), workers=2, log_dir=None, timeout=300, args=[
        "--sizes", "4096,16384,65536,262144,1048576,4194304,16777216",
        "--ops", "all_reduce,all_gather,reduce_scatter,broadcast", "--repeats", "7", "--warmup", "2",
        "--max-seconds-per-size", "4.0", "--rounds", "1", "--threads", str(max(1, (os.cpu_count() or 1) // 2))])]
    assert rows == [{"op": "all_reduce", "bytes": 4096, "seconds": 0.003, "ranks": 2, "api": "ops.AllReduce",
                     "repeats": 2, "rank_medians_s": [0.001, 0.003], "min_s": 0.001, "max_s": 0.006,
                     "round_medians_s": [0.003]}]


def test_measure_collectives_passes_every_setting_and_refuses_a_rank_without_results(monkeypatch, tmp_path):
    from mshelpers import launch
    rec = _RecordedLaunch([_rank_rows(0.001), _rank_rows(0.002), _rank_rows(0.004)])
    monkeypatch.setattr(launch, "msrun", rec)
    rows = collectives.measure_collectives(3, sizes=[96.0], ops="broadcast", repeats=4.0, warmup=1,
                                        max_seconds_per_size=0.5, threads=2, timeout=12, log_dir=tmp_path, rounds=3.0)
    (call,) = rec.calls
    assert (call["workers"], call["log_dir"], call["timeout"]) == (3, tmp_path, 12)
    assert call["args"] == ["--sizes", "96", "--ops", "broadcast", "--repeats", "4", "--warmup", "1",
                            "--max-seconds-per-size", "0.5", "--rounds", "3", "--threads", "2"]   # not cores // ranks
    assert rows[0]["seconds"] == 0.004 and rows[0]["ranks"] == 3
    rec._results = [_rank_rows(0.001), None]                        # rank 1 died before writing
    with pytest.raises(RuntimeError) as e:
        collectives.measure_collectives(2, sizes=[4096], ops=["all_reduce"])
    assert str(e.value) == "measure_collectives: 1 of 2 ranks wrote results; see the logs in /logs/of/this/launch"


# ---------------------------------------------------------------- refusals, exactly
_HW = Hardware.reference("a100-sxm")
_REFUSALS = {
    'ct op': (lambda: collectives.collective_time("all_to_all", 100, 2, _HW),
           "collective_time: op='all_to_all' is unknown; fix: use one of ('all_reduce', 'all_gather', 'reduce_scatter', 'broadcast')"),
    'ct g': (lambda: collectives.collective_time("all_reduce", 100, 0, _HW),
           'collective_time: group_size=0 is invalid; fix: pass a positive integer'),
    'ag g': (lambda: collectives.ring_allgather_bytes(100, 0),
           'ring_allgather_bytes: group_size=0 is invalid; fix: pass a positive integer'),
    'fit one': (lambda: collectives.fit_alpha_beta([{"op": "all_reduce", "bytes": 4096, "seconds": 1e-3}], "all_reduce"),
           "fit_alpha_beta: op='all_reduce' has 1 usable rows at 1 distinct sizes; fix: measure at least 2 sizes that ran, e.g. measure_collectives(ops=['all_reduce'])"),
    'fit flat': (lambda: collectives.fit_alpha_beta([{"op": "all_reduce", "bytes": b, "seconds": t} for b, t in ((4096, 2e-3), (1 << 20, 1e-3))], "all_reduce"),
           "fit_alpha_beta: op='all_reduce': time does not grow with size over [4096.0, 1048576.0] (the fitted 1/beta is not positive); fix: measure sizes spanning at least 100x, up to 16 MiB or more, with more repeats"),
    'fit err': (lambda: collectives.fit_alpha_beta([{"op": "all_reduce", "bytes": 4096, "seconds": None, "error": "boom"}], "all_reduce"),
           "fit_alpha_beta: op='all_reduce' has 0 usable rows at 0 distinct sizes (its rows carry errors: boom); fix: measure at least 2 sizes that ran, e.g. measure_collectives(ops=['all_reduce'])"),
}


@pytest.mark.parametrize("case", sorted(_REFUSALS))
def test_every_refusal_is_one_exact_line(case):
    call, line = _REFUSALS[case]
    assert refused(call) == line


def test_the_edges_the_refusals_leave_open():
    assert collectives.ring_allgather_bytes(100, 1) == 0 and collectives.collective_time("all_reduce", 100, 1, _HW) == 0.0


# ---------------------------------------------------------------- a real 2-rank measurement (msrun, ~30 s)
def test_two_rank_measurement_gives_a_time_or_a_reason_for_every_op(tmp_path):
    # up to 16 MiB: a 1 MiB all-reduce takes ~5 ms here, and a 4 KiB one once took 36 ms while another test
    # ran beside it (stop 29's CI), so sizes up to 1 MiB left the fit below without growth; 16 MiB takes ~100 ms
    sizes = [4096, 65536, 1 << 20, 16 << 20]
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    # in 3 rounds, with a time budget about one 16 MiB call long per round: each rank times its own calls, and
    # when they stopped on their own they stopped at different counts, so the next collective met the wrong one
    # ("Memcpy error, dest size is 4, src size is 8388608"); they decide together now
    rows = collectives.measure_collectives(2, sizes=sizes, ops=ops, repeats=3, rounds=3, max_seconds_per_size=0.3,
                                           log_dir=tmp_path)
    assert [(r["op"], r["bytes"]) for r in rows] == [(o, b) for o in ops for b in sizes]
    for r in rows:
        assert r["ranks"] == 2 and r["api"].startswith("ops.")
        if r.get("error"):
            assert r["seconds"] is None and len(r["error"]) > 10
        else:
            assert r["seconds"] > 0 and r["repeats"] >= 3 and len(r["rank_medians_s"]) == 2
            assert r["min_s"] <= r["seconds"] <= r["max_s"] and len(r["round_medians_s"]) == 3
            assert r["min_s"] <= min(r["round_medians_s"]) and max(r["round_medians_s"]) <= r["max_s"]
    ok = {r["op"] for r in rows if not r.get("error")}
    assert {"all_reduce", "all_gather"} <= ok          # these run on CPU (platform notes)
    rs = [r for r in rows if r["op"] == "reduce_scatter"]
    if any(r.get("error") for r in rs):                 # on CPU: "Unsupported op [ReduceScatter] on CPU"
        assert all("ReduceScatter" in r["error"] or "another rank" in r["error"] for r in rs)
    alpha, beta = fit_alpha_beta(rows, "all_reduce")
    assert alpha >= 0 and beta > 0


def test_merged_rows_keep_the_slowest_rank_of_every_round():
    r0 = [{"op": "all_reduce", "bytes": 8, "median_s": 2.5, "times_s": [1.0, 2.5, 3.0], "round_medians_s": [1.0, 3.0]}]
    r1 = [{"op": "all_reduce", "bytes": 8, "median_s": 2.0, "times_s": [2.0, 2.0], "round_medians_s": [2.0, 2.0]}]
    merged = collectives.merge_rank_rows([r0, r1])[0]
    assert merged["round_medians_s"] == [2.0, 3.0]
    assert merged["seconds"] == 2.0                    # the fastest round, whichever it was
    r0[0]["round_medians_s"] = [3.0, 1.0]
    assert collectives.merge_rank_rows([r0, r1])[0]["seconds"] == 2.0 == min([3.0, 2.0])


def test_within_factor_takes_numpy_numbers():
    import numpy as np
    v = collectives.within_factor(np.float32(1.0), np.array([1.0, 1.1, 0.9]), np.int64(2))
    assert v["verdict"] == "within" and type(v["predicted_s"]) is float


# ---------------------------------------------------------------- within a factor, or too noisy to tell
def test_within_factor_decides_only_what_the_rounds_can_tell():
    wf = collectives.within_factor
    steady = [1.0, 1.02, 0.98, 1.01, 0.99]
    assert wf(1.0, steady)["verdict"] == "within"
    assert wf(1.9, steady)["verdict"] == "within" and wf(0.55, steady)["verdict"] == "within"
    assert wf(2.2, steady)["verdict"] == "outside" and wf(0.4, steady)["verdict"] == "outside"
    scattered = [0.3, 9.0, 1.0, 0.2, 4.0]                  # a busy neighbour: rounds 45x apart
    v = wf(0.05, scattered)                                 # 4x under the fastest round, 20x under the median
    assert v["verdict"] == "too noisy" and v["band"] > 5 and v["rounds"] == 5
    assert v["measured_s"] == 0.2 and v["median_s"] == 1.0  # the fastest round is the measured figure
    assert wf(0.3, scattered)["verdict"] == "within"       # inside the factor is a hit, whatever the noise
    assert wf(1e-4, scattered)["verdict"] == "outside"     # a miss wider than the noise is still a miss
    one = wf(0.1, [1.0])                                    # one round, no fit: no band, a miss is a miss
    assert one["verdict"] == "outside" and one["band"] == 1.0
    # upper_only asks "at most factor x the prediction": faster than predicted is never a miss
    assert wf(10.0, steady, upper_only=True)["verdict"] == "within"
    assert wf(0.3, steady, upper_only=True)["verdict"] == "outside"
    assert wf(0.6, steady, upper_only=True)["verdict"] == "within"


def test_within_factor_reads_the_fastest_round_so_a_descheduled_majority_does_not_miss():
    # 05's naive-MLP all-gather beside a busy loop (stop 64): three of five sweeps descheduled for a scheduler
    # slice each. Their median (7.8 ms) is 8.5x the line's 0.92 ms; the fastest sweep is 1.7x under it
    busy = [7.8e-3, 8.0e-3, 0.68e-3, 0.54e-3, 11.3e-3]
    v = collectives.within_factor(0.92e-3, busy)
    assert v["verdict"] == "within" and v["measured_s"] == 0.54e-3 and v["median_s"] == 7.8e-3
    # and a call that really is 5x slower in every sweep still misses
    assert collectives.within_factor(0.92e-3 / 5, [t * 1.0 for t in (0.55e-3, 0.6e-3, 0.58e-3)])["verdict"] == "outside"


def test_within_factor_counts_the_lines_own_scatter():
    rows = [{"op": "all_reduce", "bytes": b, "seconds": (1e-3 + b / 1e8) * k}
            for b, k in ((1e3, 1.0), (1e4, 3.0), (1e5, 0.3), (1e6, 2.5), (1e7, 0.4))]
    fit = fit_alpha_beta(rows, "all_reduce")
    steady = [1.0, 1.02, 0.98, 1.01, 0.99]
    alone, with_fit = collectives.within_factor(0.4, steady), collectives.within_factor(0.4, steady, fit=fit)
    assert alone["verdict"] == "outside" and with_fit["verdict"] == "too noisy" and with_fit["band"] > alone["band"]


@pytest.mark.parametrize("args, line", [
    ((1.0, []), "within_factor: measured_s=[] needs one positive time per round; fix: pass the rounds' times (a row's round_medians_s)"),
    ((1.0, [1.0, -1.0]), "within_factor: measured_s=[1.0, -1.0] needs one positive time per round; fix: pass the rounds' times (a row's round_medians_s)"),
    ((1.0, [float("nan")]), "within_factor: measured_s=[nan] needs one positive time per round; fix: pass the rounds' times (a row's round_medians_s)"),
    ((0.0, [1.0]), "within_factor: predicted_s=0.0 is invalid; fix: pass a positive time in seconds"),
    (("1", [1.0]), "within_factor: predicted_s='1' is invalid; fix: pass a positive time in seconds"),
    ((1.0, [1.0], 1.0), "within_factor: factor=1.0 is invalid; fix: pass a factor above 1, e.g. 2"),
    ((1.0, [1.0], "2"), "within_factor: factor='2' is invalid; fix: pass a factor above 1, e.g. 2"),
    ((True, [1.0]), "within_factor: predicted_s=True is invalid; fix: pass a positive time in seconds"),
    ((1.0, None), "within_factor: measured_s=None needs one positive time per round; fix: pass the rounds' times (a row's round_medians_s)"),
    ((1.0, ["a"]), "within_factor: measured_s=['a'] needs one positive time per round; fix: pass the rounds' times (a row's round_medians_s)"),
])
def test_within_factor_refuses_in_one_line(args, line):
    with pytest.raises(ValueError) as e:
        collectives.within_factor(*args)
    assert str(e.value) == line
