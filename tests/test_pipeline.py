"""mshelpers.pipeline: the bubble against schedules played out op by op (GPipe, 1F1B, interleaved), the
micro-batches each stage holds against MindSpore's scheduler and Korthikanti et al., the activations they hold
(a planned layout's as the doctor counts them), and every refusal, exactly.
"""
from __future__ import annotations

import math
from types import SimpleNamespace as _NS

import numpy as np
import pytest

from mshelpers import doctor as D
from mshelpers import parallel, pipeline
from mshelpers.config import RunConfig
from mshelpers.parallel import make_layout
from mshelpers.pipeline import (pipeline_activation_bytes, pipeline_bubble_fraction, pipeline_in_flight,
                                simulate_pipeline, stage_activation_bytes)
from _checks import foreign, module_doctests, positive_count_line, refused

L7 = RunConfig.preset("llama2-7b")
MINI = RunConfig.preset("mini")
MODULE = pipeline


def test_doctests():
    tries, failures = module_doctests(pipeline)
    assert tries >= 12 and failures == 0


# ---------------------------------------------------------------- bubble
@pytest.mark.parametrize("p,m,expected", [(1, 1, 0.0), (2, 2, 1 / 3), (4, 12, 0.2), (8, 8, 7 / 15)])
def test_bubble_formula(p, m, expected):
    assert pipeline_bubble_fraction(p, m) == pytest.approx(expected)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 16), (8, 8), (3, 7)])
def test_simulated_schedule_idles_as_the_formula_says(schedule, p, m):
    sim = simulate_pipeline(p, m, schedule=schedule)
    assert sim["idle_fraction"] == pytest.approx(pipeline_bubble_fraction(p, m), abs=1e-12)
    assert len(sim["ops"]) == 2 * p * m
    # 1F1B never holds more than p micro-batches in flight on stage 0 (why it needs less memory than GPipe)
    if schedule == "1f1b":
        in_flight, worst = 0, 0
        for s, kind, i, start, end in sorted((o for o in sim["ops"] if o[0] == 0), key=lambda o: o[3]):
            in_flight += 1 if kind == "F" else -1
            worst = max(worst, in_flight)
        assert worst <= p


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


def test_backward_compatible_ops_are_five_tuples():
    sim = simulate_pipeline(3, 5, schedule="1f1b", forward_time=1.0, backward_time=2.0)
    assert all(len(o) == 5 for o in sim["ops"]) and {o[1] for o in sim["ops"]} == {"F", "B"}
    assert pipeline_bubble_fraction(4, 12) == 0.2


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


def test_a_schedule_refusal_says_what_to_pass():
    assert refused(pipeline.pipeline_in_flight, 4, 8, "1f1b", 2) == ("pipeline_in_flight: virtual_stages=2 needs schedule='interleaved'; fix: pass "
                            "schedule='interleaved' or virtual_stages=1")


# ---------------------------------------------------------------- micro-batches in flight
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


# ---------------------------------------------------------------- the activations they hold
def test_activation_bytes_follow_the_in_flight_count():
    assert pipeline_activation_bytes(1000, 4, 8, "gpipe") == 8000
    assert pipeline_activation_bytes(1000, 4, 8, "1f1b") == 4000
    assert pipeline_activation_bytes(1000, 4, 8, "1f1b", stage=3) == 1000
    assert pipeline_activation_bytes(1000, 4, 8, "interleaved", 2) == 5500
    with pytest.raises(ValueError, match="stage=4"):
        pipeline_activation_bytes(1000, 4, 8, stage=4)


def test_pipeline_activation_bytes_passes_the_interleaved_order_on():
    assert pipeline.pipeline_activation_bytes(100, 4, 8, "interleaved", 2, interleaved_order="memory") == 400
    assert pipeline.pipeline_activation_bytes(100, 4, 8, "interleaved", 2) == 550


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


def test_stage_activation_bytes_by_hand():
    from mshelpers.memory import activation_bytes_per_layer
    cfg = L7.replace(recompute="selective", compute_dtype="bfloat16")
    lay = make_layout(cfg, 2, 4, 4, 8, global_batch=64, seq_len=2048, sequence_parallel=True, flash_attention=True)
    # mindformers' LLaMA block, SiLU/Mul selective recompute on every layer, sequence parallel over mp 4
    per = activation_bytes_per_layer(2048, lay.micro_batch_size, 4096, 32, tp=4, sequence_parallel=True,
                                     recompute="selective", bytes_per_value=2, flash_attention=True,
                                     num_kv_heads=32, ffn_hidden_size=11008, arch="llama")
    got = pipeline.stage_activation_bytes(lay, "interleaved", 2, interleaved_order="memory", stage=1)
    assert got == {"in_flight": 3.5, "layers_per_stage": 8, "per_layer_bytes": per, "micro_batch_bytes": per * 8,
                   "bytes": math.ceil(3.5 * per * 8)}
    # 1F1B's count is the doctor's: with the working set and the logits it is the stage's activations
    one = pipeline.stage_activation_bytes(lay, stage=3)
    act = D.memory_per_stage(lay.config)["per_stage_breakdown"][3]["activations"]
    from mshelpers.doctor import adapt
    extra = adapt.stage_activations(lay.config, 3)
    assert one["in_flight"] == 1 and one["bytes"] + extra["working"] + extra["output"] == act
    with pytest.raises(ValueError) as e:
        pipeline.stage_activation_bytes(lay, "interleaved", 3)
    assert str(e.value) == ("stage_activation_bytes: num_layers=32 is not divisible by pp*virtual_stages = 4*3; "
                            "fix: choose virtual_stages dividing 8")
    with pytest.raises(ValueError, match="has no doctor config"):
        pipeline.stage_activation_bytes(_NS(pp=2, mp=1, micro_batches=4))
    # each refusal word for word: a layout object of the user's own, a virtual-stage count, a stage out of range
    fn = "stage_activation_bytes"
    for call, line in (
            (lambda: pipeline.stage_activation_bytes(_NS(pp=2, mp=1, micro_batches=4)),
             f"{fn}: layout=SimpleNamespace has no doctor config; fix: pass a PlannedLayout from make_layout or "
             "plan_parallel_layout"),
            (lambda: pipeline.stage_activation_bytes(lay, "interleaved", 0),
             f"{fn}: virtual_stages=0 is invalid; fix: pass a positive integer"),
            (lambda: pipeline.stage_activation_bytes(lay, stage=4), f"{fn}: stage=4 is invalid; fix: use 0 <= stage < pp=4"),
            (lambda: pipeline.stage_activation_bytes(lay, stage=-1), f"{fn}: stage=-1 is invalid; fix: use 0 <= stage < pp=4"),
            (lambda: pipeline.stage_activation_bytes(lay, stage=1.0), f"{fn}: stage=1.0 is invalid; fix: use 0 <= stage < pp=4")):
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == line


def test_stage_activation_bytes_on_a_config_that_is_not_ours():
    lay = parallel.make_layout(foreign(MINI), 1, 2, 2, 2, global_batch=8)
    ours = parallel.make_layout(MINI.replace(compute_dtype="bfloat16"), 1, 2, 2, 2, global_batch=8)
    assert pipeline.stage_activation_bytes(lay) == pipeline.stage_activation_bytes(ours)
    fp32 = pipeline.stage_activation_bytes(parallel.make_layout(MINI, 1, 2, 2, 2, global_batch=8))
    assert pipeline.stage_activation_bytes(lay)["per_layer_bytes"] * 2 == fp32["per_layer_bytes"]


# ---------------------------------------------------------------- counts, defaults and refusals, exactly
COUNTS = [
    ("pipeline_bubble_fraction", (4, 8, 2), ("pp", "micro_batches", "virtual_stages")),
    ("pipeline_in_flight", (4, 8, "interleaved", 2), ("pp", "micro_batches", None, "virtual_stages")),
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
    assert pipeline.pipeline_bubble_fraction(np.int32(4), 8.0) == 3 / 11


def test_the_defaults():
    assert pipeline.pipeline_bubble_fraction(4, 8) == 3 / 11                      # virtual_stages=1
    assert pipeline.pipeline_in_flight(4, 8) == [4, 3, 2, 1]                      # 1f1b


_REFUSALS = {
    'sim pp': (lambda: pipeline.simulate_pipeline(0, 4),
           'simulate_pipeline: pp=0 is invalid; fix: pass a positive integer'),
    'sim m': (lambda: pipeline.simulate_pipeline(2, 0),
           'simulate_pipeline: micro_batches=0 is invalid; fix: pass a positive integer'),
    'sim v': (lambda: pipeline.simulate_pipeline(2, 4, virtual_stages=0),
           'simulate_pipeline: virtual_stages=0 is invalid; fix: pass a positive integer'),
    'sim sched': (lambda: pipeline.simulate_pipeline(2, 4, "zb"),
           "simulate_pipeline: schedule='zb' is unknown; fix: use one of ('gpipe', '1f1b', 'interleaved')"),
    'fl pp': (lambda: pipeline.pipeline_in_flight(0, 4),
           'pipeline_in_flight: pp=0 is invalid; fix: pass a positive integer'),
    'fl m': (lambda: pipeline.pipeline_in_flight(2, 0),
           'pipeline_in_flight: micro_batches=0 is invalid; fix: pass a positive integer'),
    'fl v': (lambda: pipeline.pipeline_in_flight(2, 4, virtual_stages=0),
           'pipeline_in_flight: virtual_stages=0 is invalid; fix: pass a positive integer'),
    'fl sched': (lambda: pipeline.pipeline_in_flight(2, 4, "zb"),
           "pipeline_in_flight: schedule='zb' is unknown; fix: use one of ('gpipe', '1f1b', 'interleaved')"),
    'pab neg': (lambda: pipeline.pipeline_activation_bytes(-1, 2, 4),
           'pipeline_activation_bytes: stage_bytes_per_micro_batch=-1; fix: pass the bytes one micro-batch leaves on one stage (>= 0)'),
    'pab str': (lambda: pipeline.pipeline_activation_bytes("1", 2, 4),
           "pipeline_activation_bytes: stage_bytes_per_micro_batch='1'; fix: pass the bytes one micro-batch leaves on one stage (>= 0)"),
}


@pytest.mark.parametrize("case", sorted(_REFUSALS))
def test_every_refusal_is_one_exact_line(case):
    call, line = _REFUSALS[case]
    assert refused(call) == line


def test_the_edges_the_refusals_leave_open():
    assert pipeline.pipeline_activation_bytes(0, 2, 4) == 0
