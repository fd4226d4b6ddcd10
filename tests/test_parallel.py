"""mshelpers.parallel: layout validity, the planner's prices (the doctor's, for the YAML each layout becomes) and
their physical properties on hand-worked cases, the bubble against a simulated schedule, mindformers' own checks,
and (slow, msrun) the 2-rank tensor-parallel block.
"""
from __future__ import annotations

import dataclasses
import doctest
import math
from types import SimpleNamespace as _NS

import pytest

from mshelpers import doctor as D
from mshelpers import memory, parallel
from mshelpers.config import RunConfig
from mshelpers.parallel import (Hardware, Layout, communication_bytes, estimate_step_time, find_layout,
                                make_layout, pipeline_bubble_fraction, plan_parallel_layout,
                                ring_allreduce_bytes, simulate_pipeline, tp_allreduce_buffer_bytes,
                                validate_layout)

L7 = RunConfig.preset("llama2-7b")
MINI = RunConfig.preset("mini")


def test_doctests():
    # the module's own examples only: under `make mutate` the module also holds mutmut's copy of every function
    # (x_name__mutmut_N), docstrings included, which multiplied the examples ~80x and each mutant's run with them
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for t in finder.find(parallel):
        if "__mutmut_" not in t.name:
            runner.run(t)
    assert runner.tries > 10 and runner.failures == 0


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


# ---------------------------------------------------------------- validity
@pytest.mark.parametrize("args, words", [
    ((8, 4, 2, 2), ["dp*mp*pp", "n_devices=32"]),
    ((8, 3, 1, 1), ["mp=3", "num_heads=32"]),
    ((2, 1, 3, 3), ["dp*mp*pp"]),
    ((1, 1, 32, 32), None),                      # valid
    ((32, 1, 1, 4), ["global_batch=64", "dp*micro_batches"]),
    ((4, 1, 8, 4), ["micro_batches=4 < pp=8"]),
])
def test_validate_layout_names_the_constraint(args, words):
    n = args[0] * args[1] * args[2] if words is None or "dp*mp*pp" not in words else 32
    if words is None:
        validate_layout(L7, *args, n_devices=n, global_batch=64)
        return
    with pytest.raises(ValueError) as e:
        validate_layout(L7, *args, n_devices=n, global_batch=64)
    for w in words:
        assert w in str(e.value)
    assert "fix:" in str(e.value)


def test_validate_layout_ffn_and_layers():
    odd = L7.replace(ffn_hidden_size=11000)          # 11000 = 8 * 1375, not divisible by 16
    with pytest.raises(ValueError, match="ffn_hidden_size=11000"):
        validate_layout(odd, 2, 16, 1, 1, n_devices=32, global_batch=64)
    with pytest.raises(ValueError, match="pp=3 does not divide num_layers=32"):
        validate_layout(L7, 1, 1, 3, 3, n_devices=3, global_batch=9)


def test_validate_layout_rejects_non_integers():
    with pytest.raises(ValueError, match="mp=0"):
        validate_layout(L7, 8, 0, 1, 1, n_devices=32, global_batch=64)


# ---------------------------------------------------------------- communication
def test_dp_allreduce_bytes_for_mini_on_two_ranks():
    c = communication_bytes(MINI, 2, 1, 1, global_batch=8)
    assert c["dp"] == 3_688_704 * 4          # fp32 grads, ring factor 2(n-1)/n = 1
    assert c["tp"] == 0 and c["pp"] == 0


def test_tp_bytes_hand_worked_for_7b_8dp_4mp():
    c = communication_bytes(L7, 8, 4, 1, 1, global_batch=64, seq_len=4096)
    buf = 8 * 4096 * 4096 * 2                # b·s·h at 16 bits per all-reduce
    assert c["tp_buffer_bytes"] == buf == tp_allreduce_buffer_bytes(8, 4096, 4096, 2)
    assert c["tp"] == 128 * buf * 3 // 2     # Megatron's 4 all-reduces a layer x 32, ring factor 2·3/4
    # the gradients of one mp shard: the layers and the lm_head split 4 ways, the embedding whole (vocab_emb_dp),
    # in the YAML's float32 weights
    n, v, h = 6_738_415_616, 32000, 4096
    local = (n - 2 * v * h - h) // 4 + v * h + v * h // 4 + h
    assert c["grad_buffer_bytes"] == 4 * local and c["dp"] == ring_allreduce_bytes(4 * local, 8)


def test_more_mp_moves_more_activation_bytes_at_fixed_devices():
    a = communication_bytes(L7, 8, 4, 1, 1, global_batch=64, seq_len=4096)
    b = communication_bytes(L7, 4, 8, 1, 1, global_batch=64, seq_len=4096)
    assert b["tp"] > a["tp"] and b["dp"] < a["dp"]


def test_pipeline_traffic_and_recompute_allreduces():
    c = communication_bytes(L7, 2, 4, 4, 8, global_batch=64, seq_len=4096)
    assert c["pp"] == 8 * 2 * tp_allreduce_buffer_bytes(4, 4096, 4096, 2)
    full = communication_bytes(L7.replace(recompute="full"), 8, 4, 1, 1, global_batch=64, seq_len=4096)
    assert full["tp_allreduces"] == 6 * 32                   # the recomputed forward runs its 2 again


# ---------------------------------------------------------------- planner
def test_planner_returns_only_valid_layouts_best_first():
    plans = plan_parallel_layout(L7, 32, global_batch=64, seq_len=4096)
    assert plans and all(isinstance(p, Layout) for p in plans)
    for p in plans:
        validate_layout(L7, p.dp, p.mp, p.pp, p.micro_batches, n_devices=32, global_batch=64)
        assert p.n_devices == 32
        assert p.bubble_fraction == pipeline_bubble_fraction(p.pp, p.micro_batches)
    keys = [(p.bubble_fraction, p.comm_bytes_per_step) for p in plans]
    assert keys == sorted(keys)
    find_layout(plans, 8, 4)
    find_layout(plans, 4, 8)
    with pytest.raises(ValueError, match="dp=5"):
        find_layout(plans, 5, 4)


def test_planner_memory_is_the_doctors_for_the_yaml_it_emits():
    lay = make_layout(L7, 4, 8, 1, 16, global_batch=64, seq_len=4096, zero_stage=1)
    spec = parallel.mindformers_yaml(L7, lay, seq_len=4096, zero_stage=1, use_flash_attention=False)
    mem = D.memory_per_stage(D.read_config(spec))
    assert lay.memory_per_device_bytes == mem["memory_per_device_bytes"] and lay.fits is None   # no budget asked
    part = mem["breakdown"]
    assert lay.model_state_bytes == part["params"] + part["grads"] + part["optimizer_states"] + part[
        "grad_accum_buffer"] and lay.activation_bytes == part["activations"]
    assert lay.memory_per_device_bytes == lay.model_state_bytes + lay.activation_bytes


def test_memory_budget_and_hardware_ranking():
    budget = 40 * 2**30
    plans = plan_parallel_layout(L7, 32, global_batch=64, seq_len=4096, memory_budget_bytes=budget)
    fits = [p.fits for p in plans]
    assert fits == sorted(fits, reverse=True) and any(fits) and not all(fits)
    hw = Hardware(peak_flops_per_device=1e14, intra_node_bytes_per_s=1e11, inter_node_bytes_per_s=1e10)
    timed = plan_parallel_layout(L7, 32, global_batch=64, seq_len=4096, hardware=hw, micro_batches=[8])
    steps = [p.step_time["step_s"] for p in timed]
    assert steps == sorted(steps)


def test_step_time_uses_inter_node_bandwidth_only_for_groups_that_cross_nodes():
    lay = make_layout(L7, 8, 4, 1, 1, global_batch=64, seq_len=4096)
    slow = Hardware(1e14, intra_node_bytes_per_s=1e11, inter_node_bytes_per_s=1e10, devices_per_node=8)
    fast = Hardware(1e14, intra_node_bytes_per_s=1e11, inter_node_bytes_per_s=2e10, devices_per_node=8)
    a = estimate_step_time(L7, lay, slow, global_batch=64, seq_len=4096)
    b = estimate_step_time(L7, lay, fast, global_batch=64, seq_len=4096)
    assert a["tp_s"] == b["tp_s"] > 0                        # 4-way tp stays inside an 8-device node
    assert a["dp_total_s"] == pytest.approx(2 * b["dp_total_s"])   # the dp group (8 ranks, 4 apart) crosses nodes
    assert 0 < a["comm_share"] < 1 and a["step_s"] == pytest.approx(sum(a[k] for k, _ in D.TERMS))


def test_planner_bad_input():
    with pytest.raises(ValueError, match="n_devices=0"):
        plan_parallel_layout(L7, 0, global_batch=64)
    with pytest.raises(ValueError, match="no valid layout"):
        plan_parallel_layout(L7, 3, global_batch=1)


# ---------------------------------------------------------------- the gradient reduction under each ZeRO stage
@pytest.mark.parametrize("dp", [2, 4])
def test_every_zero_stage_reduces_the_gradients_once(dp):
    # mini: 3,688,704 float32 parameters, S = 14,754,816 bytes of gradients. Without sharding one ring all-reduce,
    # 2(n-1)/n*S; MindSpore's parallel optimizer reduce-scatters the gradients and all-gathers the updated
    # weights, (n-1)/n*S each: the same bytes
    for stage in (0, 1, 2):
        c = communication_bytes(MINI, dp, 1, 1, global_batch=8, zero_stage=stage)
        assert c["dp"] == ring_allreduce_bytes(14_754_816, dp) == c["total"] and c["grad_buffer_bytes"] == 14_754_816
    assert communication_bytes(MINI, 1, 1, 1, global_batch=8, zero_stage=1)["dp"] == 0    # nothing to reduce
    with pytest.raises(ValueError) as e:
        communication_bytes(MINI, dp, 1, 1, global_batch=8, zero_stage=3)
    assert str(e.value) == ("make_layout: zero_stage=3 is not priced; fix: 0, 1 (MindSpore's parallel optimizer) or 2 "
                            "(and gradient_accumulation_shard); a mindformers YAML has no ZeRO-3")


# ---------------------------------------------------------------- mindformers' own checks (imports mindformers, ~8 s)
def test_mindformers_accepts_the_planned_layout_and_rejects_a_bad_split():
    lay = find_layout(plan_parallel_layout(L7, 32, global_batch=64, seq_len=4096), 4, 8)
    pc = parallel.validate_with_mindformers(L7, lay)
    assert (pc.data_parallel, pc.model_parallel, pc.pipeline_stage) == (4, 8, 1)
    bad = Layout(dp=1, mp=3, pp=1, micro_batches=1, micro_batch_size=1, memory_per_device_bytes=0,
                 comm_bytes_per_step=0, bubble_fraction=0.0)
    with pytest.raises(ValueError, match="n_head"):
        parallel.validate_with_mindformers(L7, bad)
    bad_ffn = L7.replace(num_heads=48, hidden_size=4608)  # 48 heads split 3 ways, but 11008 is not
    with pytest.raises(ValueError, match="hidden_dim"):
        parallel.validate_with_mindformers(bad_ffn, bad)


# ---------------------------------------------------------------- the real 2-rank tensor-parallel block (msrun, ~25 s)
def test_two_rank_tensor_parallel_block_matches_one_device(tmp_path):
    from mshelpers.launch import msrun
    from mshelpers.workers import script_path
    run = msrun(script_path("tp_block"), workers=2, log_dir=tmp_path, timeout=300)
    for res in run.results():
        dims = res["dims"]
        good, plain = res["megatron_f_g"], res["plain_ops"]
        # forward: split weights + AllReduce/AllGather reproduce the unsplit block
        assert good["max_abs_err_block_out"] < 1e-5 and good["max_abs_err_logits"] < 1e-5
        assert plain["max_abs_err_block_out"] < 1e-5
        # backward: Megatron's f/g give the unsplit gradients; plain ops.AllReduce doubles them on 2 ranks
        assert max(good["max_rel_err_grad"].values()) < 1e-4
        assert plain["grad_ratio_wq"] == pytest.approx(2.0, rel=1e-4)
        # every activation all-reduce moved one b·s·h block, as the planner's formula says
        buf = tp_allreduce_buffer_bytes(dims["batch"], dims["seq"], dims["hidden"], 4)
        ars = [c for c in good["collectives_one_forward"] if c[0] == "AllReduce"]
        assert [c[3] for c in ars] == [buf, buf]
        assert good["backward_allreduces"] == [buf] * 3   # 2 per layer + the output layer's input
        # the planner (the doctor): 4 per layer and micro-batch; the output layer's backward one it does not count
        per_layer = communication_bytes(L7, 1, 2, 1, 1, global_batch=1, seq_len=512)["tp_allreduces"] // 32
        assert len(ars) + len(good["backward_allreduces"]) == per_layer + 1
        # the naive MLP all-gathers the b·s·ffn/tp activation instead of all-reducing b·s·h
        gathers = [c for c in res["naive_mlp"]["collectives_one_forward"] if c[0] == "AllGather"]
        assert gathers[0][3] == dims["batch"] * dims["seq"] * dims["ffn"] // 2 * 4


# ---------------------------------------------------------------- data parallel: shard check and DP == single process
def test_check_shards():
    good = parallel.check_shards([[0, 2, 4], [1, 3, 5]], range(6))
    assert good["ok"] and good["disjoint"] and good["union_is_full"] and good["duplicate_share"] == 0
    bug = parallel.check_shards([[0, 1, 2], [0, 1, 2]], range(6))
    assert not bug["ok"] and bug["pairwise_overlap"] == 3 and bug["missing"] == 3 and bug["duplicate_share"] == 0.5
    with pytest.raises(ValueError, match="per_rank_ids"):
        parallel.check_shards([[1], []])


def test_mindspore_dataset_shards_are_disjoint_and_complete():
    from mshelpers.data import make_dataset
    from mshelpers.workers.dp_train import window_id
    cfg = RunConfig.preset("tiny")

    def ids(d):
        return [window_id(r) for b in d.create_tuple_iterator(output_numpy=True) for r in b[0]]
    full = ids(make_dataset(cfg, 1, 0, n_windows=32))
    shards = [ids(make_dataset(cfg, 2, r, n_windows=32)) for r in range(2)]
    assert parallel.check_shards(shards, full)["ok"]
    half = cfg.replace(batch_size=cfg.batch_size // 2)
    same = [ids(make_dataset(half, 1, 0, n_windows=32)) for _ in range(2)]
    assert not parallel.check_shards(same, full)["disjoint"]


def test_two_rank_data_parallel_matches_one_process_with_twice_the_batch(tmp_path):
    """2 ranks x b under msrun with gradients_mean=True follow 1 process x 2b (tiny model, 6 steps)."""
    import subprocess
    import sys
    import numpy as np
    from mshelpers.launch import msrun
    from mshelpers.workers import script_path
    steps = 6
    cfg = RunConfig.preset("tiny").replace(mode="graph", steps=steps, batch_size=8)
    yaml_path = tmp_path / "run.yaml"
    cfg.to_yaml(yaml_path)
    run = msrun(script_path("dp_train"), workers=2, log_dir=tmp_path / "dp", timeout=400,
                args=["--config", str(yaml_path), "--steps", str(steps), "--runs", "sharded", "--threads", "1"])
    r0, r1 = (r["runs"]["sharded"] for r in run.results())
    # the ranks trained on disjoint windows whose union is what one process reads
    from mshelpers.data import numpy_batches
    from mshelpers.workers.dp_train import window_id
    it = numpy_batches(cfg)
    full = [window_id(row) for _ in range(steps) for row in next(it)]
    assert parallel.check_shards([r0["window_ids"], r1["window_ids"]], full)["ok"]
    # identical parameters on both ranks
    p0, p1 = (np.load(r.out_dir / "params_sharded.npy") for r in run.ranks)
    assert np.array_equal(p0, p1)
    # the single-process run, in a fresh interpreter (graph compile needs a clean MindSpore context)
    out = tmp_path / "single.npy"
    code = ("import sys, numpy as np\n"
            "from mshelpers.config import RunConfig\nfrom mshelpers.device import setup\n"
            "from mshelpers.workers.dp_train import train_dp\n"
            f"cfg = RunConfig.from_yaml({str(yaml_path)!r})\nsetup(mode='graph', seed=cfg.seed)\n"
            f"np.save({str(out)!r}, np.array(train_dp(cfg, {steps})['losses']))\n")
    script = tmp_path / "single.py"
    script.write_text(code)
    subprocess.run([sys.executable, str(script)], check=True, timeout=400, capture_output=True)
    single = np.load(out)
    dp = (np.array(r0["losses"]) + np.array(r1["losses"])) / 2
    assert abs(dp[0] - single[0]) < 1e-4                  # same weights, same data: rounding only
    assert np.abs(dp - single).max() < 0.02               # the tolerance notebook 04 states
    assert dp[-1] < dp[0]                                 # and it trained


def test_a_layout_row_names_and_rounds_every_field():
    from mshelpers.parallel import Layout
    G = 2**30
    lay = Layout(dp=2, mp=4, pp=3, micro_batches=6, micro_batch_size=1, memory_per_device_bytes=int(1.234567 * G),
                 comm_bytes_per_step=int(7.891 * G), bubble_fraction=2 / 7, comm_dp_bytes=int(0.5049 * G),
                 comm_tp_bytes=int(0.256 * G), comm_pp_bytes=int(0.125 * G))
    assert lay.n_devices == 24 and lay.name == "2dp×4mp×3pp m=6"
    assert lay.row() == {"layout": "2dp×4mp×3pp m=6", "dp": 2, "mp": 4, "pp": 3, "m": 6, "b_micro": 1,
                         "memory_GiB": 1.23, "comm_GiB": 7.89, "dp_GiB": 0.5, "tp_GiB": 0.26, "pp_GiB": 0.12,
                         "bubble": 0.286}
    assert lay.row(unit=2**20)["memory_GiB"] == round(int(1.234567 * G) / 2**20, 2)
    fit = Layout(**{**lay.__dict__, "fits": False, "step_time": {"step_s": 1.23456, "comm_share": 0.45678}})
    assert fit.row() == {**lay.row(), "fits": False, "step_s": 1.235, "comm_share": 0.457}
    assert Layout(**{**lay.__dict__, "fits": True}).row()["fits"] is True
    assert Layout(**{**lay.__dict__, "schedule": "interleaved", "virtual_stages": 2}).name == \
        "2dp×4mp×3pp m=6 interleaved v=2"
    assert Layout(**{**lay.__dict__, "schedule": "gpipe"}).name == "2dp×4mp×3pp m=6 gpipe"


def test_the_global_batch_of_a_mindformers_yaml():
    from mshelpers.parallel import yaml_global_batch
    spec = lambda pc, rc, **top: {"parallel_config": pc, "runner_config": rc, **top}
    assert yaml_global_batch(spec({"data_parallel": 8}, {"batch_size": 2})) == 16
    # micro-batches count only with a pipeline
    assert yaml_global_batch(spec({"data_parallel": 2, "micro_batch_num": 4}, {"batch_size": 3})) == 6
    assert yaml_global_batch(spec({"data_parallel": 2, "pipeline_stage": 2, "micro_batch_num": 4},
                                  {"batch_size": 3})) == 24
    assert yaml_global_batch(spec({"data_parallel": 2, "pipeline_stage": 2}, {"batch_size": 3})) == 6
    assert yaml_global_batch(spec({"data_parallel": 2}, {"batch_size": 3, "gradient_accumulation_steps": 5})) == 30
    assert yaml_global_batch(spec({"data_parallel": 2}, {"batch_size": 3}, micro_batch_interleave_num=2)) == 12


# ---------------------------------------------------------------- the AutoParallel / legacy-context settings, exactly
def _lay(dp, mp, pp, m):
    return make_layout(L7, dp, mp, pp, m, global_batch=64, seq_len=4096)


def test_auto_parallel_context_exact():
    assert parallel.auto_parallel_context(_lay(8, 4, 1, 1), zero_stage=0) == {
        "parallel_mode": "semi_auto_parallel", "device_num": 32, "gradients_mean": False, "full_batch": True,
        "enable_parallel_optimizer": False}
    assert parallel.auto_parallel_context(_lay(4, 2, 4, 8)) == {
        "parallel_mode": "semi_auto_parallel", "device_num": 32, "gradients_mean": False, "full_batch": True,
        "enable_parallel_optimizer": True, "parallel_optimizer_config": {"optimizer_level": "level1"},
        "pipeline_stages": 4}
    assert parallel.auto_parallel_context(_lay(8, 4, 1, 8), zero_stage=2)["parallel_optimizer_config"] == \
        {"optimizer_level": "level2"}
    assert "pipeline_stages" not in parallel.auto_parallel_context(_lay(8, 4, 1, 8))
    assert parallel.auto_parallel_context(_lay(4, 4, 2, 8))["pipeline_stages"] == 2


def test_auto_parallel_plan_exact():
    assert parallel.auto_parallel_plan(_lay(8, 4, 1, 1), zero_stage=0) == {
        "wrapper": None, "micro_size": 1, "parallel_mode": "semi_auto", "pipeline": None, "hsdp": None}
    assert parallel.auto_parallel_plan(_lay(8, 4, 1, 8)) == {
        "wrapper": "GradAccumulation", "micro_size": 8, "parallel_mode": "semi_auto", "pipeline": None,
        "hsdp": {"shard_size": -1, "threshold": 64, "optimizer_level": "level1"}}
    assert parallel.auto_parallel_plan(_lay(4, 2, 4, 8), zero_stage=3) == {
        "wrapper": "Pipeline", "micro_size": 8, "parallel_mode": "semi_auto",
        "pipeline": {"stages": 4, "scheduler": "1f1b"},
        "hsdp": {"shard_size": -1, "threshold": 64, "optimizer_level": "level3"}}
    two = parallel.auto_parallel_plan(_lay(4, 4, 2, 8))
    assert (two["wrapper"], two["pipeline"]) == ("Pipeline", {"stages": 2, "scheduler": "1f1b"})
    assert parallel.auto_parallel_plan(_lay(8, 4, 1, 2))["wrapper"] == "GradAccumulation"


def test_the_planners_step_time_uses_the_sequence_asked_for():
    hw = Hardware.reference("ascend-910b")
    best = plan_parallel_layout(L7, 8, global_batch=16, seq_len=1024, hardware=hw)[0]
    assert L7.seq_len != 1024 and best.config.model.seq == 1024
    assert best.step_time == estimate_step_time(L7, best, hw)                    # the layout's own config
    bare = Layout(best.dp, best.mp, best.pp, best.micro_batches, best.micro_batch_size, 0, 0, 0.0)
    assert best.step_time == estimate_step_time(L7, bare, hw, global_batch=16, seq_len=1024)
    assert best.step_time != estimate_step_time(L7, bare, hw, global_batch=16, seq_len=L7.seq_len)


# ---------------------------------------------------------------- estimate_step_time and stage_activation_bytes
HW_HAND = Hardware(peak_flops_per_device=1e15, intra_node_bytes_per_s=100e9, inter_node_bytes_per_s=10e9,
                   devices_per_node=8, compute_efficiency=0.5, intra_node_latency_s=1e-5, inter_node_latency_s=1e-4)


def test_estimate_step_time_is_the_doctors_step_on_the_same_profile():
    lay = make_layout(L7.replace(recompute="full"), 2, 4, 2, 4, global_batch=16, seq_len=2048)
    got = estimate_step_time(L7, lay, HW_HAND)
    hw, cal = HW_HAND.to_doctor()
    want = D.step_time(lay.config, hw, cal)
    assert {k: got[k] for k in want} == want
    comm = sum(want[k] for k in ("tp_s", "ep_s", "cp_s", "p2p_s", "dp_s"))
    assert got["comm_share"] == pytest.approx(comm / want["step_s"], rel=1e-12)
    # a hand-built profile has no fitted constants: its efficiency, the datasheet links
    assert (cal.compute_efficiency, cal.comm_time_factor) == (0.5, 1.0) and hw.peak("bfloat16") == 1e15


def test_estimate_step_time_pays_latency_once_per_pass_of_each_collective_that_exists():
    cfg = L7.replace(recompute="none")
    one = estimate_step_time(cfg, make_layout(cfg, 1, 1, 1, 1, global_batch=1, seq_len=128), HW_HAND)
    assert (one["tp_s"], one["dp_total_s"], one["p2p_s"], one["bubble_s"]) == (0.0, 0.0, 0.0, 0.0)
    assert one["comm_share"] == 0.0
    # mp 2 and 3 micro-batches: 4 all-reduces of 2 passes per layer, 32 layers, 3 micro-batches, each pass pays
    # the latency once (the bandwidth term is the same with and without it)
    two = make_layout(cfg, 1, 2, 1, 3, global_batch=3, seq_len=128)
    lat = estimate_step_time(cfg, two, HW_HAND)["tp_s"]
    no_lat = estimate_step_time(cfg, two, dataclasses.replace(HW_HAND, intra_node_latency_s=0.0))["tp_s"]
    assert lat - no_lat == pytest.approx(3 * 32 * 8 * 1e-5, rel=1e-9)


def test_stage_activation_bytes_by_hand():
    from mshelpers.memory import activation_bytes_per_layer
    cfg = L7.replace(recompute="selective", compute_dtype="bfloat16")
    lay = make_layout(cfg, 2, 4, 4, 8, global_batch=64, seq_len=2048, sequence_parallel=True, flash_attention=True)
    # mindformers' LLaMA block, SiLU/Mul selective recompute on every layer, sequence parallel over mp 4
    per = activation_bytes_per_layer(2048, lay.micro_batch_size, 4096, 32, tp=4, sequence_parallel=True,
                                     recompute="selective", bytes_per_value=2, flash_attention=True,
                                     num_kv_heads=32, ffn_hidden_size=11008, arch="llama")
    got = parallel.stage_activation_bytes(lay, "interleaved", 2, interleaved_order="memory", stage=1)
    assert got == {"in_flight": 3.5, "layers_per_stage": 8, "per_layer_bytes": per, "micro_batch_bytes": per * 8,
                   "bytes": math.ceil(3.5 * per * 8)}
    # 1F1B's count is the doctor's: with the working set and the logits it is the stage's activations
    one = parallel.stage_activation_bytes(lay, stage=3)
    act = D.memory_per_stage(lay.config)["per_stage_breakdown"][3]["activations"]
    from mshelpers.doctor import adapt
    extra = adapt.stage_activations(lay.config, 3)
    assert one["in_flight"] == 1 and one["bytes"] + extra["working"] + extra["output"] == act
    with pytest.raises(ValueError) as e:
        parallel.stage_activation_bytes(lay, "interleaved", 3)
    assert str(e.value) == ("stage_activation_bytes: num_layers=32 is not divisible by pp*virtual_stages = 4*3; "
                            "fix: choose virtual_stages dividing 8")
    with pytest.raises(ValueError, match="has no doctor config"):
        parallel.stage_activation_bytes(_NS(pp=2, mp=1, micro_batches=4))


# ---------------------------------------------------------------- every refusal of the planner's functions, exactly
_HW = Hardware.reference("a100-sxm")
_REFUSALS = {
    'plan n_devices': (lambda: parallel.plan_parallel_layout(L7, 0, global_batch=8),
           'plan_parallel_layout: n_devices=0 is invalid; fix: pass a positive integer'),
    'plan global_batch': (lambda: parallel.plan_parallel_layout(L7, 8, global_batch=0),
           'plan_parallel_layout: global_batch=0 is invalid; fix: pass a positive integer'),
    'plan seq_len': (lambda: parallel.plan_parallel_layout(L7, 8, global_batch=8, seq_len=-1),
           'plan_parallel_layout: seq_len=-1 is invalid; fix: pass a positive integer'),
    'plan cfg': (lambda: parallel.plan_parallel_layout(_NS(), 8, global_batch=8),
           'plan_parallel_layout: cfg=SimpleNamespace is not a RunConfig; fix: pass RunConfig.preset(...) or a mindformers YAML path'),
    'make degrees': (lambda: parallel.make_layout(L7, 8, 4, global_batch=64),
           'make_layout: pp=None with a RunConfig; fix: pass dp, mp, pp and global_batch (or a mindformers YAML to price its own layout)'),
    'make file knob': (lambda: parallel.make_layout(str(DATA7), zero_stage=1),
           'make_layout: zero_stage=1 with a mindformers config; fix: set it in the file (the planner varies only dp, mp, pp and the micro-batches of a file)'),
    'plan file knob': (lambda: parallel.plan_parallel_layout(str(DATA7), flash_attention=True),
           'plan_parallel_layout: flash_attention=True with a mindformers config; fix: set it in the file (the planner varies only dp, mp, pp and the micro-batches of a file)'),
    'make file batch': (lambda: parallel.make_layout(str(DATA7), 4, 1, 1, global_batch=8),
           'make_layout: global_batch=8 but the file trains on 64; fix: omit global_batch (the file\'s is kept)'),
    'plan budget': (lambda: parallel.plan_parallel_layout(L7, 8, global_batch=8, memory_budget_bytes=0),
           'plan_parallel_layout: memory_budget_bytes=0 is invalid; fix: a positive byte count'),
    'plan m': (lambda: parallel.plan_parallel_layout(L7, 8, global_batch=8, micro_batches=[0]),
           'plan_parallel_layout: micro_batches=0 is invalid; fix: pass a positive integer'),
    'make v': (lambda: parallel.make_layout(L7, 8, 4, 1, 8, global_batch=64, virtual_stages=0),
           'make_layout: virtual_stages=0 is invalid; fix: pass a positive integer'),
    'make sched': (lambda: parallel.make_layout(L7, 8, 4, 1, 8, global_batch=64, schedule="zb"),
           "make_layout: schedule='zb' is unknown; fix: use one of ('gpipe', '1f1b', 'interleaved')"),
    'make inter': (lambda: parallel.make_layout(L7, 8, 4, 1, 8, global_batch=64, schedule="interleaved", virtual_stages=2),
           'make_layout: interleaved with pp=1, virtual_stages=2 needs pp > 1 and pp*virtual_stages dividing num_layers=32; fix: use a virtual_stages dividing 32 with pp > 1'),
    'make inter2': (lambda: parallel.make_layout(L7, 2, 4, 4, 8, global_batch=64, schedule="interleaved", virtual_stages=3),
           'make_layout: interleaved with pp=4, virtual_stages=3 needs pp > 1 and pp*virtual_stages dividing num_layers=32; fix: use a virtual_stages dividing 8 with pp > 1'),
    'sim pp': (lambda: parallel.simulate_pipeline(0, 4),
           'simulate_pipeline: pp=0 is invalid; fix: pass a positive integer'),
    'sim m': (lambda: parallel.simulate_pipeline(2, 0),
           'simulate_pipeline: micro_batches=0 is invalid; fix: pass a positive integer'),
    'sim v': (lambda: parallel.simulate_pipeline(2, 4, virtual_stages=0),
           'simulate_pipeline: virtual_stages=0 is invalid; fix: pass a positive integer'),
    'sim sched': (lambda: parallel.simulate_pipeline(2, 4, "zb"),
           "simulate_pipeline: schedule='zb' is unknown; fix: use one of ('gpipe', '1f1b', 'interleaved')"),
    'fl pp': (lambda: parallel.pipeline_in_flight(0, 4),
           'pipeline_in_flight: pp=0 is invalid; fix: pass a positive integer'),
    'fl m': (lambda: parallel.pipeline_in_flight(2, 0),
           'pipeline_in_flight: micro_batches=0 is invalid; fix: pass a positive integer'),
    'fl v': (lambda: parallel.pipeline_in_flight(2, 4, virtual_stages=0),
           'pipeline_in_flight: virtual_stages=0 is invalid; fix: pass a positive integer'),
    'fl sched': (lambda: parallel.pipeline_in_flight(2, 4, "zb"),
           "pipeline_in_flight: schedule='zb' is unknown; fix: use one of ('gpipe', '1f1b', 'interleaved')"),
    'ct op': (lambda: parallel.collective_time("all_to_all", 100, 2, _HW),
           "collective_time: op='all_to_all' is unknown; fix: use one of ('all_reduce', 'all_gather', 'reduce_scatter', 'broadcast')"),
    'ct g': (lambda: parallel.collective_time("all_reduce", 100, 0, _HW),
           'collective_time: group_size=0 is invalid; fix: pass a positive integer'),
    'ag g': (lambda: parallel.ring_allgather_bytes(100, 0),
           'ring_allgather_bytes: group_size=0 is invalid; fix: pass a positive integer'),
    'pab neg': (lambda: parallel.pipeline_activation_bytes(-1, 2, 4),
           'pipeline_activation_bytes: stage_bytes_per_micro_batch=-1; fix: pass the bytes one micro-batch leaves on one stage (>= 0)'),
    'pab str': (lambda: parallel.pipeline_activation_bytes("1", 2, 4),
           "pipeline_activation_bytes: stage_bytes_per_micro_batch='1'; fix: pass the bytes one micro-batch leaves on one stage (>= 0)"),
    'fit one': (lambda: parallel.fit_alpha_beta([{"op": "all_reduce", "bytes": 4096, "seconds": 1e-3}], "all_reduce"),
           "fit_alpha_beta: op='all_reduce' has 1 usable rows at 1 distinct sizes; fix: measure at least 2 sizes that ran, e.g. measure_collectives(ops=['all_reduce'])"),
    'fit flat': (lambda: parallel.fit_alpha_beta([{"op": "all_reduce", "bytes": b, "seconds": t} for b, t in ((4096, 2e-3), (1 << 20, 1e-3))], "all_reduce"),
           "fit_alpha_beta: op='all_reduce': time does not grow with size over [4096.0, 1048576.0] (the fitted 1/beta is not positive); fix: measure sizes spanning at least 100x, up to 16 MiB or more, with more repeats"),
    'fit err': (lambda: parallel.fit_alpha_beta([{"op": "all_reduce", "bytes": 4096, "seconds": None, "error": "boom"}], "all_reduce"),
           "fit_alpha_beta: op='all_reduce' has 0 usable rows at 0 distinct sizes (its rows carry errors: boom); fix: measure at least 2 sizes that ran, e.g. measure_collectives(ops=['all_reduce'])"),
}


@pytest.mark.parametrize("case", sorted(_REFUSALS))
def test_every_planner_refusal_is_one_exact_line(case):
    call, line = _REFUSALS[case]
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == line


def test_the_edges_the_refusals_leave_open():
    assert parallel.ring_allgather_bytes(100, 1) == 0 and parallel.collective_time("all_reduce", 100, 1, _HW) == 0.0
    assert parallel.pipeline_activation_bytes(0, 2, 4) == 0
    assert parallel.plan_parallel_layout(L7, 8, global_batch=8, memory_budget_bytes=1)    # nothing fits, still ranked


def test_the_planner_lists_exactly_the_valid_layouts_with_make_layouts_costs():
    kw = dict(global_batch=64, seq_len=1024)
    plans = plan_parallel_layout(L7, 16, **kw, zero_stage=1, sequence_parallel=True)
    want = set()
    for mp in (1, 2, 4, 8, 16):
        for pp in (1, 2, 4, 8, 16):
            if 16 % (mp * pp) or 64 % (16 // (mp * pp)):
                continue
            for m in range(1, 33):
                try:
                    validate_layout(L7, 16 // (mp * pp), mp, pp, m, n_devices=16, global_batch=64)
                except ValueError:
                    continue
                want.add((16 // (mp * pp), mp, pp, m))
    assert {(l.dp, l.mp, l.pp, l.micro_batches) for l in plans} == want and len(plans) == len(want)
    for lay in plans:
        assert lay == make_layout(L7, lay.dp, lay.mp, lay.pp, lay.micro_batches, **kw, zero_stage=1,
                                  sequence_parallel=True)
    # defaults: max_micro_batches 32, ZeRO 0, no flash attention, no sequence parallelism
    base = plan_parallel_layout(L7, 8, **kw)
    assert base == plan_parallel_layout(L7, 8, **kw, max_micro_batches=32, zero_stage=0, flash_attention=False,
                                        sequence_parallel=False)
    assert base != plan_parallel_layout(L7, 8, **kw, zero_stage=1)
    assert base != plan_parallel_layout(L7, 8, **kw, flash_attention=True)
    ms = {l.micro_batches for l in plan_parallel_layout(L7, 2, global_batch=66, seq_len=512)}
    assert ms == {1, 2, 3, 6, 11, 22}                         # divisors of 66 (dp 1) and 33 (dp 2) up to 32
    inter = plan_parallel_layout(L7, 8, global_batch=64, seq_len=512, schedule="interleaved", virtual_stages=8)
    assert {l.pp for l in inter} == {1, 2, 4}                 # pp 8 x v 8 does not divide 32 layers: left out
    assert all(l.schedule == "interleaved" for l in inter if l.pp > 1)
    assert all(l.schedule == "1f1b" and l.virtual_stages == 1 for l in inter if l.pp == 1)


def test_no_valid_layout_is_one_line():
    with pytest.raises(ValueError) as e:
        plan_parallel_layout(L7, 7, global_batch=1)
    assert str(e.value) == ("plan_parallel_layout: no valid layout for n_devices=7, global_batch=1 with num_heads=32, "
                            "ffn_hidden_size=11008, num_layers=32; fix: use a global_batch divisible by a factor of "
                            "n_devices (e.g. a multiple of n_devices)")


def test_make_layout_defaults_and_the_run_it_prices():
    one = make_layout(L7, 8, 1, 1, global_batch=8)
    assert one == make_layout(L7, 8, 1, 1, 1, global_batch=8, seq_len=L7.seq_len, zero_stage=0)
    assert one.micro_batches == 1 and one != make_layout(L7, 8, 1, 1, 1, global_batch=8, zero_stage=1)
    # the run it prices: the global batch at this seq_len, split by the layout into 4 accumulation steps of 2
    lay = make_layout(L7, 2, 4, 1, 4, global_batch=16, seq_len=1024)
    c = lay.config
    assert (c.model.seq, c.layout.dp, c.layout.tp, c.layout.pp, c.layout.grad_accum, c.layout.batch) == \
        (1024, 2, 4, 1, 4, 2) and c.layout.global_batch == 16 and c.model.flash is False
    assert c.model.ffn == L7.ffn_hidden_size and D.param_count(c) == memory.llama_param_count(L7)


DATA7 = __import__("pathlib").Path(__file__).parent / "data" / "mindformers" / "pretrain_llama2_7b.yaml"


def test_the_planner_on_a_mindformers_file_keeps_its_settings_and_varies_the_degrees():
    hw = Hardware.reference("ascend-910b")
    own = make_layout(str(DATA7), hardware=hw)
    r = D.diagnose(str(DATA7), search=False)
    assert (own.dp, own.mp, own.pp, own.micro_batches) == (8, 1, 1, 8) and own.fits is r["fits"] is True
    assert (own.memory_per_device_bytes, own.step_time["step_s"]) == (
        r["memory"]["memory_per_device_bytes"], r["step"]["step_s"])
    assert make_layout(r["config"], hardware=hw) == own                          # a doctor Config alike
    other = make_layout(str(DATA7), 4, 2, 1, hardware=hw)                       # 4 x 2, the file's batch of 64
    assert (other.config.layout.global_batch, other.config.layout.tp, other.config.model) == (64, 2, own.config.model)
    assert other.memory_per_device_bytes != own.memory_per_device_bytes
    plans = plan_parallel_layout(str(DATA7), hardware=hw, micro_batches=[1, 2, 8])
    assert {(p.dp * p.mp * p.pp) for p in plans} == {8} and find_layout(plans, 8, 1, 1, 8) == own
    assert [p.step_time["step_s"] for p in plans if p.fits] == sorted(p.step_time["step_s"] for p in plans if p.fits)
