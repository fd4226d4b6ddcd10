"""mshelpers.parallel's small contracts, each exactly: every count refused by one line naming the function and
the argument, each fix a layout refusal proposes, the defaults, and communication_bytes' parts (the doctor's traffic)
worked by hand.
(Written for the mutation run's survivors: `tests/README.md`, "Scores".)
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace as _NS

import numpy as np
import pytest

from mshelpers import parallel
from mshelpers.config import RunConfig
from mshelpers.memory import llama_param_count

MINI = RunConfig.preset("mini")
L7 = RunConfig.preset("llama2-7b")


def _refused(f, *args, **kw) -> str:
    """The one line f refuses these arguments with."""
    with pytest.raises(ValueError) as e:
        f(*args, **kw)
    return str(e.value)


def _line(fn, name, v):
    tail = " (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""
    return f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer{tail}"


# (function, its positional arguments that are valid, the argument names in order): each one in turn is made bad
COUNTS = [
    ("pipeline_bubble_fraction", (4, 8, 2), ("pp", "micro_batches", "virtual_stages")),
    ("ring_allreduce_bytes", (1000, 2), (None, "group_size")),
    ("ring_allgather_bytes", (1000, 2), (None, "group_size")),
    ("tp_allreduce_buffer_bytes", (2, 16, 8, 4), ("micro_batch", "seq_len", "hidden_size", "bytes_per_value")),
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
        assert _refused(getattr(parallel, fn), *got) == _line(fn, name, bad)


@pytest.mark.parametrize("i,name", list(enumerate(["dp", "mp", "pp", "micro_batches"])))
def test_validate_layout_names_each_bad_count(i, name):
    args = [2, 2, 2, 2]
    args[i] = 0
    assert _refused(parallel.validate_layout, L7, *args, n_devices=8, global_batch=64) == \
        _line("validate_layout", name, 0)


@pytest.mark.parametrize("kw", ["n_devices", "global_batch"])
def test_validate_layout_names_a_bad_keyword_count(kw):
    assert _refused(parallel.validate_layout, L7, 1, 1, 1, 1, **{"n_devices": 1, "global_batch": 1, kw: 2.5}) == \
        _line("validate_layout", kw, 2.5)


def test_counts_accept_integral_floats_and_numpy_integers():
    assert parallel.ring_allreduce_bytes(1000, 4.0) == 1500
    assert parallel.ring_allreduce_bytes(1000, np.int64(4)) == 1500
    assert parallel.pipeline_bubble_fraction(np.int32(4), 8.0) == 3 / 11


def test_the_defaults():
    # micro_batches=1: a global batch of 1 on one device is valid; with 2 it would not divide
    assert parallel.validate_layout(MINI, 1, 1, 1, n_devices=1, global_batch=1) is None
    one = parallel.communication_bytes(MINI, 1, 1, 1, global_batch=1)
    assert one["tp_buffer_bytes"] == 1 * MINI.seq_len * MINI.hidden_size * 2      # activations sent at 16 bits
    assert parallel.pipeline_bubble_fraction(4, 8) == 3 / 11                      # virtual_stages=1
    assert parallel.tp_allreduce_buffer_bytes(2, 3, 5) == 60                      # 2 bytes a value
    assert parallel.pipeline_in_flight(4, 8) == [4, 3, 2, 1]                      # 1f1b
    # zero_stage=0: no parameter all-gather on top of the gradient all-reduce
    z0 = parallel.communication_bytes(MINI, 2, 1, 1, global_batch=8)
    assert z0["dp"] == parallel.ring_allreduce_bytes(llama_param_count(MINI) * 4, 2)


def test_validate_layout_proposes_a_dp_that_fits_or_a_divisor_rule():
    v = parallel.validate_layout
    assert _refused(v, L7, 3, 2, 2, 4, n_devices=8, global_batch=64) == (
        "validate_layout: dp*mp*pp = 3*2*2 = 12 does not equal n_devices=8; fix: dp=2 makes dp*mp*pp = 8")
    assert _refused(v, L7, 1, 3, 1, 1, n_devices=8, global_batch=64) == (
        "validate_layout: dp*mp*pp = 1*3*1 = 3 does not equal n_devices=8; "
        "fix: choose mp*pp dividing 8 and dp = 8/(mp*pp)")
    # mp*pp = 8 does not divide 12 (though mp/pp would)
    assert _refused(v, L7, 1, 2, 4, 4, n_devices=12, global_batch=64) == (
        "validate_layout: dp*mp*pp = 1*2*4 = 8 does not equal n_devices=12; "
        "fix: choose mp*pp dividing 12 and dp = 12/(mp*pp)")


def test_validate_layout_ffn_refusal_lists_the_mp_that_split_both():
    cfg = _NS(num_heads=8, ffn_hidden_size=12, num_layers=4)     # 12's divisors that also divide 8: 1, 2, 4
    assert _refused(parallel.validate_layout, cfg, 1, 8, 1, 1, n_devices=8, global_batch=8) == (
        "validate_layout: mp=8 does not divide ffn_hidden_size=12 (MLP columns are split evenly); "
        "fix: use mp in [1, 2, 4]")


def test_validate_layout_batch_refusal_lists_micro_batches_or_asks_for_another_batch():
    # 12 / 2 = 6 sequences per dp rank: 4 micro-batches do not split them, the divisors of 6 do
    v = parallel.validate_layout
    assert _refused(v, L7, 2, 1, 1, 4, n_devices=2, global_batch=12) == (
        "validate_layout: dp*micro_batches = 2*4 = 8 does not divide global_batch=12 "
        "(every micro-batch needs whole sequences); fix: use micro_batches in [1, 2, 3, 6]")
    assert _refused(v, L7, 4, 1, 1, 1, n_devices=4, global_batch=6) == (
        "validate_layout: dp*micro_batches = 4*1 = 4 does not divide global_batch=6 "
        "(every micro-batch needs whole sequences); fix: use a global_batch that is a multiple of "
        "dp*micro_batches = 4")


def test_validate_layout_pipeline_rule_applies_only_with_stages():
    assert parallel.validate_layout(L7, 1, 1, 1, 1, n_devices=1, global_batch=1) is None
    assert parallel.validate_layout(L7, 1, 1, 2, 2, n_devices=2, global_batch=2) is None
    assert _refused(parallel.validate_layout, L7, 1, 1, 2, 1, n_devices=2, global_batch=2).startswith(
        "validate_layout: micro_batches=1 < pp=2; ")


@pytest.mark.parametrize("v", [None, 0, -1, True, 2.0, "4"], ids=repr)
def test_a_config_field_that_is_not_a_positive_integer_is_refused(v):
    cfg = _NS(num_heads=v, ffn_hidden_size=64, num_layers=2)
    assert _refused(parallel.validate_layout, cfg, 1, 1, 1, 1, n_devices=1, global_batch=1) == (
        f"cfg.num_heads={v!r} is invalid; fix: pass a RunConfig (RunConfig.preset(...)) with a positive integer there")


def test_a_config_field_of_one_or_a_numpy_integer_is_accepted():
    cfg = _NS(num_heads=1, ffn_hidden_size=np.int64(64), num_layers=1)
    assert parallel.validate_layout(cfg, 1, 1, 1, 1, n_devices=1, global_batch=1) is None
    assert parallel._divisors(6) == [1, 2, 3, 6] and parallel._divisors(1) == [1]


def test_a_schedule_refusal_says_what_to_pass():
    assert _refused(parallel.pipeline_in_flight, 4, 8, "1f1b", 2) == ("pipeline_in_flight: virtual_stages=2 needs schedule='interleaved'; fix: pass "
                            "schedule='interleaved' or virtual_stages=1")


def test_pipeline_activation_bytes_passes_the_interleaved_order_on():
    assert parallel.pipeline_activation_bytes(100, 4, 8, "interleaved", 2, interleaved_order="memory") == 400
    assert parallel.pipeline_activation_bytes(100, 4, 8, "interleaved", 2) == 550


def test_check_shards_exactly():
    assert parallel.check_shards([[0, 2], [1, 3]]) == {
        "ranks": 2, "reads": 4, "unique": 4, "pairwise_overlap": 0, "disjoint": True, "duplicate_share": 0.0,
        "union_is_full": None, "ok": True}
    assert parallel.check_shards([[0, 1]], range(3)) == {
        "ranks": 1, "reads": 2, "unique": 2, "pairwise_overlap": 0, "disjoint": True, "duplicate_share": 0.0,
        "full": 3, "missing": 1, "extra": 0, "union_is_full": False, "ok": False}
    got = parallel.check_shards([[0, 9], [1]], range(2))
    assert (got["extra"], got["missing"], got["union_is_full"], got["ok"]) == (1, 0, False, False)
    assert parallel.check_shards([[5]])["ok"] is True                  # one rank, one sample: a valid shard
    # overlapping but complete: not ok, whatever the union says
    assert parallel.check_shards([[0, 1], [1]], range(2))["ok"] is False
    for bad in ([], [[0], []]):
        assert _refused(parallel.check_shards, bad) == (f"check_shards: per_rank_ids has {len(bad)} ranks, some empty; "
                                "fix: pass one non-empty list of sample ids per rank")


_cb = parallel.communication_bytes


def test_communication_bytes_by_hand_with_tp_and_pp():
    # mini: hidden 256, 4 layers, float32 weights; dp 2, mp 2, pp 2, m 2, global batch 8: 2 sequences a micro-batch
    s, h, v = MINI.seq_len, MINI.hidden_size, MINI.vocab_size
    got = _cb(MINI, 2, 2, 2, 2, global_batch=8)
    buf = 2 * s * h * 2                                  # b·s·h at 16 bits
    per_layer = (llama_param_count(MINI) - 2 * v * h - h) // 4
    local = 2 * per_layer // 2 + v * h                   # stage 0: 2 layers split over mp, the embedding whole
    assert got["grad_buffer_bytes"] == local * 4
    assert got["dp"] == parallel.ring_allreduce_bytes(local * 4, 2)
    assert got["tp_buffer_bytes"] == buf and got["tp_allreduces"] == 2 * 2 * 4       # m x layers x 4
    assert got["tp"] == 16 * parallel.ring_allreduce_bytes(buf, 2)
    assert got["pp"] == 2 * 2 * buf                      # per micro-batch an activation out, a gradient back
    assert got["total"] == got["dp"] + got["tp"] + got["pp"] and got["ep"] == got["cp"] == 0
    assert got["tp"] != got["pp"] and got["dp"] != got["pp"]      # so a wrong sign shows in the total


def test_communication_bytes_without_tp_or_pp_has_none_of_their_traffic():
    got = _cb(MINI, 2, 1, 1, 1, global_batch=8)
    assert (got["tp"], got["pp"], got["tp_allreduces"]) == (0, 0, 0)
    got = _cb(MINI, 1, 2, 1, 1, global_batch=8)
    assert got["pp"] == 0 and got["tp_allreduces"] == 4 * 4 and got["dp"] == 0


def test_communication_bytes_reads_the_config_and_its_widths():
    # a foreign config without compute_dtype or recompute: the YAML writer's bfloat16 and no recompute
    foreign = _foreign(MINI)
    assert not hasattr(foreign, "compute_dtype") and not hasattr(foreign, "recompute")
    got = _cb(foreign, 1, 2, 1, 1, global_batch=8)
    assert got == _cb(MINI.replace(compute_dtype="bfloat16"), 1, 2, 1, 1, global_batch=8)
    assert got["tp_buffer_bytes"] == 8 * MINI.seq_len * MINI.hidden_size * 2
    full = _cb(MINI.replace(recompute="full"), 1, 2, 1, 1, global_batch=8)
    assert full["tp_allreduces"] == 6 * 4
    # the gradients travel in the weights' width: the YAML's float32 weights
    assert _cb(MINI, 2, 1, 1, global_batch=8)["grad_buffer_bytes"] == llama_param_count(MINI) * 4


def test_communication_bytes_results_are_integers():
    got = _cb(L7, 3, 1, 2, 2, global_batch=12, seq_len=4096)
    assert all(type(v) is int for v in got.values()), got
    assert got["dp"] == parallel.ring_allreduce_bytes(got["grad_buffer_bytes"], 3)


def test_collectives_threads_default_to_whole_cores_per_rank(monkeypatch):
    import os
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    args = parallel._collectives_bench_args(2, [1024], ["all_reduce"], 3, 1, 2.0, None)
    assert args[args.index("--threads") + 1] == "2"


def _foreign(cfg):
    """The same model as a plain object without compute_dtype or recompute (a config that is not ours)."""
    return _NS(**{k: getattr(cfg, k) for k in ("num_heads", "ffn_hidden_size", "num_layers", "hidden_size",
                                                "seq_len", "vocab_size")})


def test_stage_activation_bytes_on_a_config_that_is_not_ours():
    lay = parallel.make_layout(_foreign(MINI), 1, 2, 2, 2, global_batch=8)
    ours = parallel.make_layout(MINI.replace(compute_dtype="bfloat16"), 1, 2, 2, 2, global_batch=8)
    assert parallel.stage_activation_bytes(lay) == parallel.stage_activation_bytes(ours)
    fp32 = parallel.stage_activation_bytes(parallel.make_layout(MINI, 1, 2, 2, 2, global_batch=8))
    assert parallel.stage_activation_bytes(lay)["per_layer_bytes"] * 2 == fp32["per_layer_bytes"]


def test_estimate_step_time_on_a_config_that_is_not_ours_counts_every_latency():
    hw = parallel.Hardware(1e12, intra_node_bytes_per_s=1e10, inter_node_bytes_per_s=1e9, devices_per_node=8,
                           intra_node_latency_s=1e-4, inter_node_latency_s=1e-3)
    lay = parallel.make_layout(_foreign(MINI), 1, 2, 2, 2, global_batch=8)
    ours = parallel.estimate_step_time(MINI, lay, hw)
    assert parallel.estimate_step_time(_foreign(MINI), lay, hw) == ours
    n_tp = 2 * 2 * 8                                      # m x (2 layers a stage x 4 all-reduces x 2 passes)
    no_lat = parallel.estimate_step_time(MINI, lay, dataclasses.replace(hw, intra_node_latency_s=0.0))
    assert ours["tp_s"] - no_lat["tp_s"] == pytest.approx(n_tp * 1e-4, rel=1e-9)
    assert no_lat["tp_s"] == pytest.approx(lay.comm_tp_bytes / 1e10, rel=1e-12)     # bytes over the link


def test_neighbouring_stages_are_dp_times_mp_ranks_apart():
    # 2 dp ranks x 2 stages on nodes of 4: the stage pair spans 4 ranks, inside one node
    hw = parallel.Hardware(1e12, intra_node_bytes_per_s=1e10, inter_node_bytes_per_s=1e8, devices_per_node=4,
                           intra_node_latency_s=1e-5, inter_node_latency_s=1e-2)
    lay = parallel.make_layout(MINI, 2, 1, 2, 2, global_batch=8)
    got = parallel.estimate_step_time(MINI, lay, hw)
    assert got["p2p_s"] == pytest.approx(lay.comm_pp_bytes / 1e10 + 2 * 2 * 1e-5, rel=1e-12)
    # on nodes of 2 the same pair crosses a node
    hw2 = dataclasses.replace(hw, devices_per_node=2)
    got2 = parallel.estimate_step_time(MINI, lay, hw2)
    assert got2["p2p_s"] == pytest.approx(lay.comm_pp_bytes / 1e8 + 2 * 2 * 1e-2, rel=1e-12)
