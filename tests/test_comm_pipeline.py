"""mshelpers.parallel, issue 18: collectives measured (alpha-beta fit, Hardware profiles with sources) and
pipeline schedules simulated with the micro-batches each stage holds (GPipe, 1F1B, interleaved).
The last test runs a real 2-rank measurement under msrun (~30 s).
"""
from __future__ import annotations

import math

import pytest

from mshelpers import parallel
from mshelpers.config import RunConfig
from mshelpers.parallel import (REFERENCE_HARDWARE, AlphaBetaFit, Hardware, collective_time, estimate_step_time,
                                fit_alpha_beta, make_layout, pipeline_activation_bytes, pipeline_bubble_fraction,
                                pipeline_in_flight, simulate_pipeline, stage_activation_bytes)

L7 = RunConfig.preset("llama2-7b")


def _rows(alpha, beta, sizes, op="all_reduce", noise=()):
    noise = list(noise) or [1.0] * len(sizes)
    return [{"op": op, "bytes": b, "seconds": (alpha + b / beta) * k, "ranks": 2} for b, k in zip(sizes, noise)]


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


# ---------------------------------------------------------------- Hardware: measured and cited
def test_hardware_from_measurement_gives_back_the_measured_time():
    rows = _rows(4e-3, 9e7, SIZES)
    hw = Hardware.from_measurement(rows, peak_flops_per_device=2e11)
    assert hw.name == "this machine (measured)" and hw.devices_per_node == 2
    assert hw.intra_node_latency_s == pytest.approx(4e-3 / 2)          # alpha over the all-reduce's 2 passes
    # 2 ranks: a ring all-reduce sends 2(n-1)/n = 1 byte per buffer byte, so the link bandwidth is beta
    assert hw.intra_node_bytes_per_s == pytest.approx(9e7)
    for b in SIZES:
        assert collective_time("all_reduce", b, 2, hw) == pytest.approx(4e-3 + b / 9e7)
    assert "measured" in hw.source("intra_node_bytes_per_s") and "not measured" in hw.source("inter_node_bytes_per_s")
    assert {r["figure"] for r in hw.table()} >= {"peak_flops_per_device", "intra_node_bytes_per_s"}
    # 4 ranks: all-gather's (n-1)/n
    hw4 = Hardware.from_measurement(fit_alpha_beta(_rows(1e-3, 1e8, SIZES, op="all_gather"), "all_gather"),
                                    peak_flops_per_device=1e11, group_size=4)
    assert hw4.intra_node_bytes_per_s == pytest.approx(0.75e8)
    assert collective_time("all_gather", 1 << 20, 4, hw4) == pytest.approx(1e-3 + (1 << 20) / 1e8)
    with pytest.raises(ValueError, match="peak_flops_per_device"):
        Hardware.from_measurement(rows, peak_flops_per_device=0)


@pytest.mark.parametrize("name", ["ascend-910b", "a100-sxm", "h100-sxm"])
def test_reference_profiles_cite_every_figure(name):
    hw = Hardware.reference(name)
    assert hw is REFERENCE_HARDWARE[name]
    for f in ("peak_flops_per_device", "intra_node_bytes_per_s", "inter_node_bytes_per_s", "devices_per_node"):
        src = hw.source(f)
        assert src != "assumed", f
        if f != "devices_per_node":
            assert "http" in src or "Hot Chips" in src, (f, src)
    assert hw.intra_node_bytes_per_s > hw.inter_node_bytes_per_s > 0
    with pytest.raises(ValueError, match="h100-sxm"):
        Hardware.reference("tpu")


def test_nvidia_figures_are_per_direction_datasheet_values():
    a, h = Hardware.reference("a100-sxm"), Hardware.reference("h100-sxm")
    assert (a.peak_flops_per_device, a.intra_node_bytes_per_s, a.inter_node_bytes_per_s) == (312e12, 300e9, 25e9)
    assert (h.peak_flops_per_device, h.intra_node_bytes_per_s, h.inter_node_bytes_per_s) == (989.5e12, 450e9, 50e9)
    assert "datasheet" in a.source("peak_flops_per_device") and "msmodeling" in \
        Hardware.reference("ascend-910b").source("peak_flops_per_device")


def test_one_ascend_table_serves_every_module():
    """parallel's 910B profile, peak's datasheet table and the doctor's Atlas 800T A2 profile are one table."""
    from mshelpers import doctor
    from mshelpers.peak import DATASHEET_PEAK_FLOPS
    p, d = Hardware.reference("ascend-910b"), doctor.hardware("atlas-800t-a2")
    assert p.peak_flops_per_device == d.peak("float16") == DATASHEET_PEAK_FLOPS["Ascend 910B"]["float16"]
    assert d.peak("bfloat16") == DATASHEET_PEAK_FLOPS["Ascend 910B"]["bfloat16"]
    assert p.intra_node_bytes_per_s == d.intra_link_bytes_per_s * d.links_per_device
    assert p.inter_node_bytes_per_s == d.inter_bytes_per_s and p.devices_per_node == d.devices_per_node
    assert p.compute_efficiency == pytest.approx(doctor.CALIBRATION.compute_efficiency, abs=1e-4)


def test_latency_enters_the_step_time_only_when_given():
    lay = make_layout(L7, 2, 4, 4, 8, global_batch=64, seq_len=4096)
    base = Hardware(1e14, intra_node_bytes_per_s=1e11, inter_node_bytes_per_s=1e10)
    slow = Hardware(1e14, intra_node_bytes_per_s=1e11, inter_node_bytes_per_s=1e10, intra_node_latency_s=1e-3,
                    inter_node_latency_s=1e-2)
    a = estimate_step_time(L7, lay, base)
    b = estimate_step_time(L7, lay, slow)
    n_tp = 8 * 8 * 8                     # micro-batches x layers a stage x (4 all-reduces of 2 passes)
    assert b["tp_s"] - a["tp_s"] == pytest.approx(n_tp * 1e-3)                 # 4-way tp inside a node
    assert b["dp_total_s"] - a["dp_total_s"] == pytest.approx(2 * 1e-3)         # dp ranks 4 apart: inside, 2 passes
    assert b["p2p_s"] - a["p2p_s"] == pytest.approx(2 * 8 * 1e-2)              # stages 8 ranks apart: across


# ---------------------------------------------------------------- pipeline: bubble
PM = [(2, 2), (2, 6), (4, 4), (4, 8), (4, 16), (8, 8), (8, 32), (3, 7)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", PM)
def test_gpipe_and_1f1b_bubble(schedule, p, m):
    sim = simulate_pipeline(p, m, schedule)
    assert sim["idle_fraction"] == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert sim["makespan"] == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("order", ["standard", "memory"])
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4), (4, 16, 2), (8, 16, 2), (8, 8, 4),
                                   (4, 12, 3), (3, 6, 2)])
def test_interleaved_bubble_when_m_is_a_multiple_of_p(order, p, m, v):
    sim = simulate_pipeline(p, m, "interleaved", virtual_stages=v, interleaved_order=order)
    expect = (p - 1) / (v * m + p - 1)
    assert sim["idle_fraction"] == pytest.approx(expect, abs=1e-12)
    assert pipeline_bubble_fraction(p, m, virtual_stages=v) == pytest.approx(expect)
    assert len(sim["ops"]) == 2 * p * m * v and len(sim["chunks"]) == len(sim["ops"])
    assert sorted(set(sim["chunks"])) == list(range(v))
    # each (stage, kind, micro-batch, chunk) runs exactly once
    assert len({(o[0], o[1], o[2], c) for o, c in zip(sim["ops"], sim["chunks"])}) == len(sim["ops"])


def test_interleaved_with_one_chunk_is_a_pipeline_with_the_plain_bubble():
    sim = simulate_pipeline(4, 8, "interleaved", virtual_stages=1)
    assert sim["idle_fraction"] == pytest.approx(pipeline_bubble_fraction(4, 8))


def test_interleaving_shrinks_the_bubble_by_v():
    b1 = simulate_pipeline(4, 8, "1f1b")["makespan"] - 8 * 3.0
    b2 = simulate_pipeline(4, 8, "interleaved", 2)["makespan"] - 8 * 3.0
    assert b2 == pytest.approx(b1 / 2)


# ---------------------------------------------------------------- pipeline: micro-batches in flight
@pytest.mark.parametrize("p,m", PM)
def test_in_flight_gpipe_holds_all_and_1f1b_holds_p_minus_stage(p, m):
    g = simulate_pipeline(p, m, "gpipe")
    assert g["peak_in_flight"][0] == m and g["peak_in_flight"] == [m] * p
    f = simulate_pipeline(p, m, "1f1b")
    assert f["peak_in_flight"] == [min(p - s, m) for s in range(p)]
    assert pipeline_in_flight(p, m, "gpipe") == g["peak_in_flight"]
    assert pipeline_in_flight(p, m, "1f1b") == f["peak_in_flight"]


@pytest.mark.parametrize("order", ["standard", "memory"])
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 4), (4, 10, 2), (8, 16, 2), (4, 12, 3)])
def test_in_flight_interleaved_matches_mindspore_warmup(order, p, m, v):
    """MindSpore's InterleavedScheduler: bias = (p + m%p)(v-1) + k(p-s-1) warm-up forwards (k = 2 standard,
    1 memory-optimised), then one forward / one backward: a stage holds bias+1 chunks at its peak."""
    sim = simulate_pipeline(p, m, "interleaved", v, interleaved_order=order)
    k = 2 if order == "standard" else 1
    chunks = [min((p + m % p) * (v - 1) + k * (p - s - 1) + 1, m * v) for s in range(p)]
    assert sim["peak_in_flight_chunks"] == chunks
    assert sim["peak_in_flight"] == pytest.approx([c / v for c in chunks])
    assert pipeline_in_flight(p, m, "interleaved", v, interleaved_order=order) == pytest.approx(sim["peak_in_flight"])


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (8, 32, 2), (8, 16, 4)])
def test_first_stage_in_flight_matches_korthikanti_for_interleaving(p, m, v):
    # Korthikanti et al. 2022, sec. 4.2.3: interleaving makes the first stage hold p·(1 + (p-1)/(p·v)) micro-batches
    assert pipeline_in_flight(p, m, "interleaved", v)[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert pipeline_in_flight(p, m, "interleaved", v, interleaved_order="memory")[0] == pytest.approx(p)


def test_activation_bytes_follow_the_in_flight_count():
    assert pipeline_activation_bytes(1000, 4, 8, "gpipe") == 8000
    assert pipeline_activation_bytes(1000, 4, 8, "1f1b") == 4000
    assert pipeline_activation_bytes(1000, 4, 8, "1f1b", stage=3) == 1000
    assert pipeline_activation_bytes(1000, 4, 8, "interleaved", 2) == 5500
    with pytest.raises(ValueError, match="stage=4"):
        pipeline_activation_bytes(1000, 4, 8, stage=4)


def test_stage_activation_bytes_agrees_with_the_doctors_memory_for_1f1b():
    from mshelpers import doctor
    from mshelpers.doctor import adapt
    lay = make_layout(L7, 2, 4, 4, 8, global_batch=64, seq_len=4096)
    one = stage_activation_bytes(lay, "1f1b")
    mem = doctor.memory_per_stage(lay.config)["per_stage_breakdown"][0]
    act = adapt.stage_activations(lay.config, 0)
    assert one["in_flight"] == act["in_flight"] == 4 and act["output"] == 0          # the logits live on stage 3
    assert one["bytes"] == mem["activations"] - act["working"]
    gp = stage_activation_bytes(lay, "gpipe")
    il = stage_activation_bytes(lay, "interleaved", 2)
    assert gp["bytes"] == 2 * one["bytes"] and il["bytes"] == math.ceil(one["micro_batch_bytes"] * 5.5)
    with pytest.raises(ValueError, match="virtual_stages"):
        stage_activation_bytes(lay, "interleaved", 3)


def test_the_planner_costs_a_layout_under_its_schedule():
    from mshelpers import doctor
    from mshelpers.parallel import plan_parallel_layout
    kw = dict(global_batch=64, seq_len=4096)
    base = make_layout(L7, 2, 4, 4, 8, **kw)
    assert make_layout(L7, 2, 4, 4, 8, schedule="1f1b", **kw) == base           # the default is 1F1B
    stage = stage_activation_bytes(base, "1f1b")["micro_batch_bytes"]
    got = {}
    for sched, v, order, held in (("gpipe", 1, "standard", 8), ("interleaved", 2, "standard", 5.5),
                                  ("interleaved", 4, "standard", 4.75), ("interleaved", 2, "memory", 4)):
        lay = make_layout(L7, 2, 4, 4, 8, schedule=sched, virtual_stages=v, interleaved_order=order, **kw)
        got[sched, v, order] = lay
        assert lay.bubble_fraction == pytest.approx(pipeline_bubble_fraction(4, 8, v))
        assert (lay.schedule, lay.virtual_stages) == (sched, v) and sched in lay.name
        assert lay.config.layout.vpp == v                                   # the YAML's pp_interleave_num
        if order == "standard" and sched == "interleaved":                  # the doctor prices it as it is
            assert lay.memory_per_device_bytes == doctor.memory_per_stage(lay.config)["memory_per_device_bytes"]
        else:                     # the doctor counts 1F1B's (or Megatron's) micro-batches; the schedule holds more/fewer
            assert lay.memory_per_device_bytes >= base.memory_per_device_bytes + math.ceil(
                (held - 4) * stage) if sched == "gpipe" else lay.memory_per_device_bytes < doctor.memory_per_stage(
                lay.config)["memory_per_device_bytes"]
    # what the schedules hold, in the order of the micro-batches they keep on the first stage
    assert got["gpipe", 1, "standard"].memory_per_device_bytes > got["interleaved", 2, "standard"]. \
        memory_per_device_bytes > got["interleaved", 4, "standard"].memory_per_device_bytes > base.memory_per_device_bytes
    plans = plan_parallel_layout(L7, 32, micro_batches=[8], schedule="interleaved", virtual_stages=4, **kw)
    for p in plans:
        if p.pp > 1:
            assert p.virtual_stages == 4 and 32 % (p.pp * 4) == 0
            assert p.bubble_fraction == pytest.approx(pipeline_bubble_fraction(p.pp, 8, 4))
        else:
            assert (p.schedule, p.virtual_stages) == ("1f1b", 1)
    assert {p.pp for p in plans} <= {1, 2, 4, 8}
    with pytest.raises(ValueError, match="pp > 1"):
        make_layout(L7, 8, 4, 1, 1, schedule="interleaved", virtual_stages=2, **kw)
    with pytest.raises(ValueError, match="virtual_stages"):
        make_layout(L7, 2, 4, 4, 8, schedule="interleaved", virtual_stages=3, **kw)


@pytest.mark.parametrize("kwargs, words", [
    (dict(schedule="zb"), "schedule='zb'"),
    (dict(schedule="1f1b", virtual_stages=2), "needs schedule='interleaved'"),
    (dict(schedule="interleaved", virtual_stages=2, interleaved_order="vpp"), "interleaved_order"),
])
def test_schedule_arguments_are_checked(kwargs, words):
    with pytest.raises(ValueError, match=words):
        simulate_pipeline(4, 8, **kwargs)
    with pytest.raises(ValueError, match="micro_batches=2 < pp=4"):
        simulate_pipeline(4, 2, "interleaved", 2)


def test_backward_compatible_ops_are_five_tuples():
    sim = simulate_pipeline(3, 5, schedule="1f1b", forward_time=1.0, backward_time=2.0)
    assert all(len(o) == 5 for o in sim["ops"]) and {o[1] for o in sim["ops"]} == {"F", "B"}
    assert pipeline_bubble_fraction(4, 12) == 0.2


# ---------------------------------------------------------------- a real 2-rank measurement (msrun, ~30 s)
def test_two_rank_measurement_gives_a_time_or_a_reason_for_every_op(tmp_path):
    # up to 16 MiB: a 1 MiB all-reduce takes ~5 ms here, and a 4 KiB one once took 36 ms while another test
    # ran beside it (stop 29's CI), so sizes up to 1 MiB left the fit below without growth; 16 MiB takes ~100 ms
    sizes = [4096, 65536, 1 << 20, 16 << 20]
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    rows = parallel.measure_collectives(2, sizes=sizes, ops=ops, repeats=3, log_dir=tmp_path)
    assert [(r["op"], r["bytes"]) for r in rows] == [(o, b) for o in ops for b in sizes]
    for r in rows:
        assert r["ranks"] == 2 and r["api"].startswith("ops.")
        if r.get("error"):
            assert r["seconds"] is None and len(r["error"]) > 10
        else:
            assert r["seconds"] > 0 and r["repeats"] >= 3 and len(r["rank_medians_s"]) == 2
            assert r["min_s"] <= r["seconds"] <= r["max_s"]
    ok = {r["op"] for r in rows if not r.get("error")}
    assert {"all_reduce", "all_gather"} <= ok          # these run on CPU (platform notes)
    rs = [r for r in rows if r["op"] == "reduce_scatter"]
    if any(r.get("error") for r in rs):                 # on CPU: "Unsupported op [ReduceScatter] on CPU"
        assert all("ReduceScatter" in r["error"] or "another rank" in r["error"] for r in rs)
    alpha, beta = fit_alpha_beta(rows, "all_reduce")
    assert alpha >= 0 and beta > 0


def test_measure_collectives_rejects_bad_arguments():
    with pytest.raises(ValueError, match="ranks=1"):
        parallel.measure_collectives(1)
    with pytest.raises(ValueError, match="all_to_all"):
        parallel.measure_collectives(2, ops=["all_to_all"])
    with pytest.raises(ValueError, match="sizes"):
        parallel.measure_collectives(2, sizes=[])


# ---------------------------------------------------------------- exact values (each field and default)
def _fit(op="all_reduce", ranks=2):
    return AlphaBetaFit(op=op, alpha_s=1e-4, beta_bytes_per_s=1e9, n_points=5, ranks=ranks, weighting="relative",
                        residuals=(), rms_rel_error=0.01, max_ratio=1.234)


def test_hardware_from_measurement_sets_every_field_and_source_exactly():
    import dataclasses
    hw = Hardware.from_measurement(_fit(), peak_flops_per_device=2 * 10**11)
    assert hw == Hardware(peak_flops_per_device=2e11, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e9,
                          devices_per_node=2, compute_efficiency=1.0, intra_node_latency_s=5e-5,
                          inter_node_latency_s=5e-5, name="this machine (measured)", hbm_bytes_per_s=20e9,
                          memory_bytes=hw.memory_bytes, dp_overlap=0.0)
    assert type(hw.peak_flops_per_device) is float and hw.memory_bytes > 2**28 and hw.links_per_device == 1
    how = ("measured: all_reduce on 2 ranks, alpha-beta fit over 5 sizes (max pred/meas ratio 1.23); "
           "beta x 1 bytes sent per byte, alpha / 2 per pass")
    same = "not measured: all ranks on one machine; set equal to the intra-node figure"
    assert hw.sources == (("peak_flops_per_device", "measured"), ("intra_node_bytes_per_s", how),
                          ("intra_node_latency_s", how), ("inter_node_bytes_per_s", same),
                          ("inter_node_latency_s", same), ("devices_per_node", "ranks measured: 2"),
                          ("compute_efficiency", "1.0: the peak is already a measured matmul rate"),
                          ("hbm_bytes_per_s", "assumed 20 GB/s (the optimizer term only; not measured)"),
                          ("memory_bytes", "MemTotal of /proc/meminfo"))
    # the fit's ranks yield to group_size; 4-rank reduce-scatter sends 3/4 of a byte per buffer byte, in 1 pass
    hw4 = Hardware.from_measurement(_fit("reduce_scatter", ranks=None), peak_flops_per_device=1e11, group_size=4,
                                    compute_efficiency=0.5, name="box", peak_source="datasheet")
    assert (hw4.intra_node_bytes_per_s, hw4.devices_per_node, hw4.compute_efficiency, hw4.name) == (0.75e9, 4, 0.5, "box")
    assert hw4.intra_node_latency_s == 1e-4 and hw4.source("peak_flops_per_device") == "datasheet"
    assert hw4.source("intra_node_bytes_per_s").endswith("beta x 0.75 bytes sent per byte, alpha / 1 per pass")
    assert Hardware.from_measurement(_fit("broadcast", 8), peak_flops_per_device=1e11).intra_node_bytes_per_s == 1e9
    assert Hardware.from_measurement(_fit("all_reduce", 4), peak_flops_per_device=1e11).intra_node_bytes_per_s == 1.5e9
    # rows are fitted with the op asked for
    rows = _rows(4e-3, 9e7, SIZES, op="all_gather") + _rows(1e-3, 5e8, SIZES)
    assert Hardware.from_measurement(rows, peak_flops_per_device=1e11, op="all_gather").intra_node_latency_s == \
        pytest.approx(4e-3)
    assert Hardware.from_measurement(rows, peak_flops_per_device=1e11).intra_node_latency_s == pytest.approx(1e-3 / 2)
    # priced by the doctor as its profile of this CPU (2 ranks sharing the measured 4e11 FLOP/s)
    from mshelpers import doctor
    dh = doctor.cpu_hardware(2, alpha_beta=_fit(), peak=4e11)
    assert dataclasses.replace(hw.to_doctor()[0], name=dh.name, sources=dh.sources) == dh


@pytest.mark.parametrize("kw, line", [
    (dict(group_size=1), "Hardware.from_measurement: group_size=1; fix: pass group_size (the ranks measured)"),
    (dict(fit=_fit(ranks=None)), "Hardware.from_measurement: group_size=None; fix: pass group_size"),
    (dict(peak_flops_per_device=True), "Hardware.from_measurement: peak_flops_per_device=True; fix: pass a "
                                       "measured FLOP/s, e.g. mshelpers.peak.peak_flops()"),
    (dict(peak_flops_per_device="2e11"), "peak_flops_per_device='2e11'; fix"),
    (dict(peak_flops_per_device=-1.0), "peak_flops_per_device=-1.0; fix"),
])
def test_hardware_from_measurement_refusals(kw, line):
    fit = kw.pop("fit", _fit())
    with pytest.raises(ValueError) as e:
        Hardware.from_measurement(fit, **({"peak_flops_per_device": 1e11} | kw))
    assert line in str(e.value)


def test_hardware_table_and_source_defaults():
    hw = Hardware(peak_flops_per_device=1.0, intra_node_bytes_per_s=2.0, inter_node_bytes_per_s=3.0,
                  sources=(("intra_node_bytes_per_s", "read off a cable"),))
    assert (hw.devices_per_node, hw.compute_efficiency, hw.intra_node_latency_s, hw.inter_node_latency_s, hw.name,
            hw.links_per_device, hw.hbm_bytes_per_s, hw.memory_bytes, hw.dp_overlap) == \
        (8, 0.5, 0.0, 0.0, "assumed", 1, 1e12, 64 * 2**30, 1.0)
    assert hw.source("intra_node_bytes_per_s") == "read off a cable" and hw.source("anything") == "assumed"
    row = lambda f, v, src="assumed": {"hardware": "assumed", "figure": f, "value": v, "source": src}
    assert hw.table() == [
        row("peak_flops_per_device", 1.0), row("intra_node_bytes_per_s", 2.0, "read off a cable"),
        row("links_per_device", 1), row("inter_node_bytes_per_s", 3.0), row("devices_per_node", 8),
        row("intra_node_latency_s", 0.0), row("inter_node_latency_s", 0.0), row("compute_efficiency", 0.5),
        row("hbm_bytes_per_s", 1e12), row("memory_bytes", 64 * 2**30)]
    # a hand-made profile is priced at its own figures: one peak for every dtype, no fitted constant but efficiency
    dh, cal = hw.to_doctor()
    assert (dh.peak("bfloat16"), dh.intra_link_bytes_per_s, dh.inter_bytes_per_s, dh.devices_per_node) == (1.0, 2.0, 3.0, 8)
    assert (cal.compute_efficiency, cal.comm_time_factor) == (0.5, 1.0)


def test_collectives_bench_args_match_the_workers_flags():
    import os
    import re
    from mshelpers.workers import script_path
    args = parallel._collectives_bench_args(2, [4096, 65536.0], ["all_reduce", "broadcast"], 5, 1, 2.5, 3)
    assert args == ["--sizes", "4096,65536", "--ops", "all_reduce,broadcast", "--repeats", "5", "--warmup", "1",
                    "--max-seconds-per-size", "2.5", "--threads", "3"]
    declared = set(re.findall(r'add_argument\("(--[a-z-]+)"', open(script_path("collectives_bench")).read()))
    assert {a for a in args if a.startswith("--")} == declared          # every flag the worker has, and no other
    cores = os.cpu_count() or 1
    assert parallel._collectives_bench_args(2, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == str(max(1, cores // 2))
    assert parallel._collectives_bench_args(4 * cores, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == "1"
    assert parallel._collectives_bench_args(2, [8], ["all_reduce"], 3, 2, 4.0, 0)[-1] == "0"


def test_merge_rank_rows_takes_the_slowest_rank_and_keeps_errors():
    r0 = [{"op": "all_reduce", "bytes": 4096.0, "api": "ops.AllReduce", "median_s": 0.002, "times_s": [0.001, 0.002, 0.004]},
          {"op": "reduce_scatter", "bytes": 8, "api": "ops.ReduceScatter", "error": "Unsupported op [ReduceScatter] on CPU"}]
    r1 = [{"op": "all_reduce", "bytes": 4096, "api": "ops.AllReduce", "median_s": 0.003, "times_s": [0.0025, 0.003]},
          {"op": "reduce_scatter", "bytes": 8, "api": "ops.ReduceScatter", "error": ""}]
    assert parallel._merge_rank_rows([r0, r1]) == [
        {"op": "all_reduce", "bytes": 4096, "seconds": 0.003, "ranks": 2, "api": "ops.AllReduce", "repeats": 2,
         "rank_medians_s": [0.002, 0.003], "min_s": 0.001, "max_s": 0.004},
        {"op": "reduce_scatter", "bytes": 8, "seconds": None, "ranks": 2, "api": "ops.ReduceScatter",
         "error": "Unsupported op [ReduceScatter] on CPU"}]
    r1[1]["error"], r0[1]["error"] = "another rank failed", ""
    assert parallel._merge_rank_rows([r0, r1])[1]["error"] == "another rank failed"
    assert type(parallel._merge_rank_rows([r0, r1])[0]["bytes"]) is int
    assert parallel._merge_rank_rows([[{"op": "broadcast", "bytes": 4, "median_s": 1.0, "times_s": [1.0]}]])[0]["api"] is None


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
        parallel.measure_collectives(**({"ranks": 2} | kw))
    assert line in str(e.value)


def test_a_two_stage_1f1b_played_out_by_hand():
    # stage 0: F0 F1 B0 B1 (one warm-up forward), stage 1: F0 B0 F1 B1; forward 1 s, backward 3 s
    r = simulate_pipeline(2, 2, "1f1b", forward_time=1.0, backward_time=3.0)
    assert r["ops"] == [(0, "F", 0, 0.0, 1.0), (1, "F", 0, 1.0, 2.0), (0, "F", 1, 1.0, 2.0), (1, "B", 0, 2.0, 5.0),
                        (0, "B", 0, 5.0, 8.0), (1, "F", 1, 5.0, 6.0), (1, "B", 1, 6.0, 9.0), (0, "B", 1, 9.0, 12.0)]
    assert r["chunks"] == [0] * 8 and r["makespan"] == 12.0
    assert r["idle_fraction"] == pytest.approx(1 - 2 * 2 * (1 + 3) / (2 * 12.0))       # 16 busy of 24 stage-seconds
    assert (r["schedule"], r["virtual_stages"], r["peak_in_flight"], r["peak_in_flight_chunks"]) == \
        ("1f1b", 1, [2, 1], [2, 1])
    # interleaved, 2 chunks: stage s warms up (p + m mod p)(v-1) + 2(p-s-1) forwards, so holds 5 and 3 chunks
    iv = simulate_pipeline(2, 4, "interleaved", 2, forward_time=1.0, backward_time=3.0)
    assert (iv["peak_in_flight_chunks"], iv["peak_in_flight"], iv["makespan"]) == ([5, 3], [2.5, 1.5], 18.0)
    assert iv["chunks"][:8] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_send_factors_and_the_link_a_collective_uses():
    assert (parallel._send_factor("all_reduce", 4), parallel._send_factor("all_gather", 4),
            parallel._send_factor("reduce_scatter", 4), parallel._send_factor("broadcast", 4)) == (1.5, 0.75, 0.75, 1.0)
    hw = Hardware(1e12, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e8, intra_node_latency_s=1e-4,
                  inter_node_latency_s=1e-3)
    assert collective_time("reduce_scatter", 4e6, 4, hw) == pytest.approx(1e-4 + 0.75 * 4e6 / 1e9)
    assert collective_time("reduce_scatter", 4e6, 4, hw, crosses_nodes=True) == pytest.approx(1e-3 + 0.75 * 4e6 / 1e8)
    assert collective_time("broadcast", 4e6, 8, hw) == pytest.approx(1e-4 + 4e6 / 1e9)


def test_mindformers_parallel_config_micro_batches_only_with_a_pipeline():
    two = make_layout(L7, 4, 4, 2, 8, global_batch=64, seq_len=4096)
    assert parallel.mindformers_parallel_config(two) == {
        "data_parallel": 4, "model_parallel": 4, "pipeline_stage": 2, "micro_batch_num": 8, "vocab_emb_dp": True,
        "use_seq_parallel": False, "gradient_aggregation_group": 4}
    assert parallel.mindformers_parallel_config(two, vocab_emb_dp=False, use_seq_parallel=True)["vocab_emb_dp"] is False
    assert parallel.mindformers_parallel_config(make_layout(L7, 8, 4, 1, 8, global_batch=64))["micro_batch_num"] == 1


def test_measure_collectives_documented_defaults(monkeypatch):
    import inspect
    import os
    p = inspect.signature(parallel.measure_collectives).parameters
    assert {k: p[k].default for k in ("ranks", "sizes", "repeats", "warmup", "max_seconds_per_size", "threads",
                                      "timeout", "log_dir")} == dict(ranks=2, sizes=None, repeats=7, warmup=2,
                                                                     max_seconds_per_size=4.0, threads=None,
                                                                     timeout=300, log_dir=None)
    assert parallel.DEFAULT_COLLECTIVE_SIZES == (4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20)
    # threads None: the cores divided among the ranks, at least 1; an unknown core count counts as 1
    assert parallel._collectives_bench_args(1, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == str(os.cpu_count() or 1)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert parallel._collectives_bench_args(1, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == "1"
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert parallel._collectives_bench_args(2, [8], ["all_reduce"], 3, 2, 4.0, None)[-1] == "3"


def test_a_sub_unit_peak_is_still_a_peak():
    assert Hardware.from_measurement(_fit(), peak_flops_per_device=0.5).peak_flops_per_device == 0.5


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
    rows = parallel.measure_collectives()
    assert rec.calls == [dict(script=script_path("collectives_bench"), workers=2, log_dir=None, timeout=300, args=[
        "--sizes", "4096,16384,65536,262144,1048576,4194304,16777216",
        "--ops", "all_reduce,all_gather,reduce_scatter,broadcast", "--repeats", "7", "--warmup", "2",
        "--max-seconds-per-size", "4.0", "--threads", str(max(1, (os.cpu_count() or 1) // 2))])]
    assert rows == [{"op": "all_reduce", "bytes": 4096, "seconds": 0.003, "ranks": 2, "api": "ops.AllReduce",
                     "repeats": 2, "rank_medians_s": [0.001, 0.003], "min_s": 0.001, "max_s": 0.006}]


def test_measure_collectives_passes_every_setting_and_refuses_a_rank_without_results(monkeypatch, tmp_path):
    from mshelpers import launch
    rec = _RecordedLaunch([_rank_rows(0.001), _rank_rows(0.002), _rank_rows(0.004)])
    monkeypatch.setattr(launch, "msrun", rec)
    rows = parallel.measure_collectives(3, sizes=[96.0], ops="broadcast", repeats=4.0, warmup=1,
                                        max_seconds_per_size=0.5, threads=2, timeout=12, log_dir=tmp_path)
    (call,) = rec.calls
    assert (call["workers"], call["log_dir"], call["timeout"]) == (3, tmp_path, 12)
    assert call["args"] == ["--sizes", "96", "--ops", "broadcast", "--repeats", "4", "--warmup", "1",
                            "--max-seconds-per-size", "0.5", "--threads", "2"]   # not cores // ranks
    assert rows[0]["seconds"] == 0.004 and rows[0]["ranks"] == 3
    rec._results = [_rank_rows(0.001), None]                        # rank 1 died before writing
    with pytest.raises(RuntimeError) as e:
        parallel.measure_collectives(2, sizes=[4096], ops=["all_reduce"])
    assert str(e.value) == "measure_collectives: 1 of 2 ranks wrote results; see the logs in /logs/of/this/launch"
