"""Ranks placed on nodes (mshelpers.doctor.topology) and collectives priced on the links they cross: the EP group
of an r1.x MoE layout is tp ranks apart and crosses nodes, mcore's and 2.x's is consecutive; one comm factor
multiplies every collective."""
import dataclasses
from pathlib import Path

import pytest

from mshelpers import doctor as D
from mshelpers.doctor import topology as T
from mshelpers.doctor.describe import Layout

DATA = Path(__file__).parents[1] / "data" / "mindformers"
A2 = D.hardware("atlas-800t-a2")


def test_tp_is_innermost_and_stages_are_contiguous_blocks():
    lay = Layout(dp=2, tp=4, pp=2, cp=1)
    g = T.groups(lay, "r1.x")
    assert g["TP"] == [0, 1, 2, 3] and g["DP"] == [0, 4] and g["PP"] == [0, 8]
    rows = T.rank_map(lay, "r1.x", 8)
    assert [(r["node"], r["pp"], r["dp"], r["tp"]) for r in rows[:9:4]] == [(0, 0, 0, 0), (0, 0, 1, 0), (1, 1, 0, 0)]


def test_context_parallel_sits_between_tp_and_dp_and_joins_the_gradient_group():
    lay = Layout(dp=2, tp=2, cp=2)
    g = T.groups(lay, "mcore")
    assert g["CP"] == [0, 2] and g["DP"] == [0, 2, 4, 6]


@pytest.mark.parametrize("dialect, ep_group", [("r1.x", [0, 8, 16, 24]), ("mcore", [0, 1, 2, 3]),
                                               ("pynative", [0, 1, 2, 3])])
def test_the_ep_group_is_carved_where_each_dialect_carves_it(dialect, ep_group):
    lay = Layout(dp=4, tp=8, pp=2, ep=4)                      # DeepSeek-V2's r1.3.0 layout
    assert T.groups(lay, dialect)["EP"] == ep_group
    sp = T.span(ep_group, 8)
    assert sp["nodes"] == (4 if dialect == "r1.x" else 1)


def test_an_all_to_all_over_nodes_costs_the_inter_node_link():
    inside, across = T.span([0, 1, 2, 3], 8), T.span([0, 8, 16, 24], 8)
    b = 1e9
    assert T.all_to_all_time(A2, inside, b) == pytest.approx(0.75 * b / (A2.intra_link_bytes_per_s * 7))
    assert T.all_to_all_time(A2, across, b) == pytest.approx(0.75 * b / A2.inter_bytes_per_s)
    mixed = T.span([0, 4, 8, 12], 8)                          # 2 ranks per node on 2 nodes: the inter part binds
    assert mixed["link"] == "intra+inter"
    assert T.all_to_all_time(A2, mixed, b) == pytest.approx(0.5 * b / A2.inter_bytes_per_s)
    bw, _ = T.ring_link(A2, mixed)
    assert bw == min(A2.inter_bytes_per_s, A2.intra_link_bytes_per_s * 7)


def test_deepseek_v2s_ep_time_follows_the_nodes_its_group_crosses():
    cfg = D.read_config(DATA / "r1.3.0_finetune_deepseek2_236B.yaml")
    st = D.step_time(cfg, A2)
    ep = next(g for g in st["groups"] if g["group"] == "EP")
    assert (ep["size"], ep["nodes"], ep["link"]) == (4, 4, "inter-node")
    same = dataclasses.replace(cfg, dialect="mcore")          # the same layout placed as mcore places it
    st2 = D.step_time(same, A2)
    assert next(g for g in st2["groups"] if g["group"] == "EP")["nodes"] == 1
    assert st["ep_s"] > 5 * st2["ep_s"] and st2["ep_s"] > 0


def test_one_comm_factor_multiplies_every_collective():
    for name in ("r1.3.0_finetune_deepseek2_236B.yaml", "r1.2.0_pretrain_llama2_70b.yaml"):
        cfg = D.read_config(DATA / name)
        lo = D.step_time(cfg, A2, dataclasses.replace(D.CALIBRATION, comm_time_factor=1.0))
        hi = D.step_time(cfg, A2, dataclasses.replace(D.CALIBRATION, comm_time_factor=2.0))
        for k in ("tp_s", "ep_s", "p2p_s", "dp_total_s"):
            if lo[k] > 0:
                assert hi[k] > 1.5 * lo[k], (name, k)
        assert hi["compute_s"] == lo["compute_s"]


def test_without_flash_attention_the_scores_cross_hbm():
    cfg = D.read_config(DATA / "r1.2.0_pretrain_llama2_7b.yaml")
    noflash = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, flash=False))
    assert D.step_time(cfg, A2)["attn_hbm_s"] == 0
    a = D.step_time(noflash, A2)["attn_hbm_s"]
    lay, m = cfg.layout, cfg.model
    scores = lay.batch * m.heads * m.seq * m.seq * 2 * lay.n_micro
    assert a == pytest.approx(scores * (12 * m.layers + 4 * lay.full_recompute[0]) / A2.hbm_bytes_per_s)


def test_expert_matmuls_run_at_their_own_shard_width():
    """DeepSeek-V2's experts are 1536/8 = 192 wide per device, its dense matmuls 5120/8 = 640: with a width term,
    the step slows by more than the dense width alone would make it."""
    cfg = D.read_config(DATA / "r1.3.0_finetune_deepseek2_236B.yaml")
    half = 500.0
    slow = D.step_time(cfg, A2, dataclasses.replace(D.CALIBRATION, half_width=half))["compute_s"]
    fast = D.step_time(cfg, A2, dataclasses.replace(D.CALIBRATION, half_width=0.0))["compute_s"]
    w = cfg.model.hidden / cfg.layout.tp
    assert slow / fast > 1.1 * (w + half) / w


def test_parallel_optimizer_shards_over_dp_times_cp():
    lay = Layout(dp=1, cp=4, optimizer_shard="po")
    assert lay.parallel_optimizer and lay.shard_ranks == 4
    assert not Layout(dp=1, cp=1, optimizer_shard="po").parallel_optimizer


@pytest.mark.parametrize("call, field", [
    (lambda: T.span([], 8), "ranks"), (lambda: T.span([0, -1], 8), "ranks"), (lambda: T.span([0, 1], 0), "devices_per_node"),
    (lambda: T.rank_map(Layout(dp=2), "r1.x", 8, limit=0), "limit"),
    (lambda: T.rank_map(Layout(dp=2), "r1.x", True), "devices_per_node")])
def test_bad_input_is_one_line_naming_the_field(call, field):
    with pytest.raises(D.DoctorError) as e:
        call()
    assert e.value.field == field and "fix:" in str(e.value)


def test_smallest_fitting_scale_refuses_a_bad_limit():
    cfg = D.read_config(DATA / "r1.2.0_pretrain_llama2_7b.yaml")
    with pytest.raises(D.DoctorError) as e:
        D.smallest_fitting_scale(cfg, A2, max_devices=0)
    assert e.value.field == "max_devices"


def test_attention_slows_with_a_smaller_head_dim_as_the_fit_says():
    """head_dim_factor: 1 at head dim 128 or with no head-dim term; at 64, (64 / (64 + k)) / (128 / (128 + k));
    MLA by its QK^T contraction (nope + rope = 192 for DeepSeek-V2)."""
    k = D.CALIBRATION.head_dim_half
    assert k > 0
    f = D.cost.head_dim_factor
    llama = D.read_config(DATA / "r1.2.0_pretrain_llama2_7b.yaml").model
    small = D.read_config(DATA / "r1.3.0_finetune_qwen2_0.5b_32k.yaml").model
    mla = D.read_config(DATA / "r1.3.0_finetune_deepseek2_236B.yaml").model
    assert f(llama, D.CALIBRATION) == pytest.approx(1.0, abs=1e-12)
    assert f(small, dataclasses.replace(D.CALIBRATION, head_dim_half=0.0)) == 1.0
    assert f(small, D.CALIBRATION) == pytest.approx((64 / (64 + k)) / (128 / (128 + k)))
    assert f(mla, D.CALIBRATION) == pytest.approx((192 / (192 + k)) / (128 / (128 + k)))
    cfg = D.read_config(DATA / "r1.3.0_finetune_qwen2_0.5b_32k.yaml")
    with_term = D.step_time(cfg, A2)["compute_s"]
    without = D.step_time(cfg, A2, dataclasses.replace(D.CALIBRATION, head_dim_half=0.0))["compute_s"]
    assert with_term > 1.3 * without                    # seq 32768: attention is most of this model's FLOPs


@pytest.mark.parametrize("name", ["r1.2.0_finetune_mixtral-8x7b.yaml", "r1.3.0_finetune_qwen2_57b.yaml",
                                  "r1.6.0_finetune_telechat_39b_a12b.yaml"])
def test_the_optimizer_updates_the_parameters_whose_states_the_device_holds(name):
    """The update's traffic covers what the parallel optimizer left on this device: the states memory_per_stage
    counts on the binding stage. A routed expert at dp = ep has one replica, so nothing splits its update (stop 65:
    step_time divided it by dp x cp too, 8x too little on the Mixtral card)."""
    cfg = D.read_config(DATA / name)
    lay = cfg.layout
    st, mem = D.step_time(cfg, A2, D.CALIBRATION), D.memory_per_stage(cfg)
    updated = st["optimizer_s"] * A2.hbm_bytes_per_s / (4 * lay.param_bytes + 16)
    held = [b["optimizer_states"] / lay.state_bytes for b in mem["per_stage_breakdown"]]
    assert lay.parallel_optimizer and any(abs(updated - h) <= 1e-6 * h for h in held), (updated, held)


@pytest.mark.parametrize("path, kind", [(DATA.parent / "heldout" / "deepseek2_lite_16b_8k.yaml", "all_gather"),
                                        (DATA / "r1.2.0_finetune_mixtral-8x7b.yaml", "all_to_all")])
def test_routing_imbalance_slows_the_all_to_all_but_not_the_all_gather(path, kind):
    """The all-gather dispatcher moves every token of the EP group whatever the routing; an all-to-all's busiest
    rank receives its experts' share, which a skewed router inflates (stop 65: the all-gather was scaled too)."""
    cfg = D.read_config(path)
    assert D.cost.stage_collectives(cfg, 0)["EP"][2] == kind
    skewed = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, moe=dataclasses.replace(cfg.model.moe, imbalance=1.0)))
    even, busy = (D.step_time(c, A2, D.CALIBRATION)["ep_s"] for c in (cfg, skewed))
    assert busy == pytest.approx(even) if kind == "all_gather" else busy > 1.5 * even
