"""mshelpers.memory against what real configs use: the new terms worked by hand, and
mindformers' published Llama 2 pre-training YAMLs (tests/data/mindformers/, each with a
header naming its repository, path and commit) checked against their max_device_memory.

Units: s·b·h ("sbh") is one 16-bit activation of the layer's width counted at 2 bytes per
value, as in Korthikanti et al. 2022; all counts below are per layer, in multiples of sbh.
"""
from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from mshelpers.config import RunConfig
from mshelpers.memory import (activation_bytes_per_layer, estimate, estimate_from_mindformers_yaml,
                              estimate_stage, llama_param_count, mindformers_ffn_size, model_state_breakdown,
                              model_state_bytes, output_activation_bytes, parse_memory_size)

DATA = Path(__file__).parent / "data" / "mindformers"
CFG_7B = DATA / "pretrain_llama2_7b.yaml"
CFG_13B = DATA / "pretrain_llama2_13b.yaml"
CFG_70B = DATA / "pretrain_llama2_70b_bf16_32p.yaml"
GIB = 2**30

S, B, H, A = 128, 8, 256, 4
SBH = S * B * H            # 262,144; Korthikanti's 5·a·s/h = 10 here
MINI = RunConfig.preset("mini")


def load(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------- activation terms
@pytest.mark.parametrize("kw,per_sbh", [
    # flash attention: the 5as/h term (10 here) is gone, 34 is left
    ({"flash_attention": True}, 34),
    # with tp=2: 10 unsplit + 24/2, no attention term
    ({"flash_attention": True, "tp": 2}, 22),
    # tp=4 + sequence parallel: 34/4
    ({"flash_attention": True, "tp": 4, "sequence_parallel": True}, Fraction(34, 4)),
    # flash makes Korthikanti's selective recompute a no-op: it drops only the s² term
    ({"flash_attention": True, "recompute": "selective"}, 34),
    # GQA, 1 KV head of 4 (g = 1/4): K and V 2+2 -> 0.5+0.5, so 34 - 3 = 31, plus 10
    ({"num_kv_heads": 1}, 41),
    # GQA with tp=2: 10 + (2 + 0.5 + 0.5 + 2 + 16 + 10)/2 = 10 + 15.5
    ({"num_kv_heads": 1, "tp": 2}, Fraction(51, 2)),
    # GQA changes nothing under full recompute: only the layer input 2 is kept
    ({"num_kv_heads": 1, "recompute": "full"}, 2),
    # a GeLU MLP of width 2h instead of 4h: 4r = 8 instead of 16
    ({"ffn_hidden_size": 2 * H}, 36),
])
def test_new_activation_terms_by_hand(kw, per_sbh):
    assert activation_bytes_per_layer(S, B, H, A, **kw) == SBH * per_sbh


def test_llama_block_by_hand():
    # r = f/h = 688/256 = 2.6875. llama: 8 unsplit (two RMSNorm inputs 4, QKV input 2, MLP input 2)
    # + Q 2 + K 2 + V 2 + out-proj input 2 + SwiGLU 8r (w1 out, w3 out, SiLU out, product) = 37.5 with flash
    kw = dict(arch="llama", ffn_hidden_size=688, flash_attention=True)
    assert activation_bytes_per_layer(S, B, H, A, **kw) == SBH * 37.5
    # mindformers' default select_recompute (SiLU and Mul) drops 4r = 10.75
    assert activation_bytes_per_layer(S, B, H, A, recompute="selective", **kw) == SBH * 26.75
    # GQA with 2 KV heads of 4: K and V 2 + 2 -> 1 + 1
    assert activation_bytes_per_layer(S, B, H, A, num_kv_heads=2, **kw) == SBH * 35.5
    # without flash the s² term comes back: + 5as/h = 10
    assert activation_bytes_per_layer(S, B, H, A, arch="llama", ffn_hidden_size=688) == SBH * 47.5
    # tp=2 with sequence parallel: everything /2
    assert activation_bytes_per_layer(S, B, H, A, tp=2, sequence_parallel=True, **kw) == SBH * 37.5 / 2
    # fp32 activations double it
    assert activation_bytes_per_layer(S, B, H, A, bytes_per_value=4, **kw) == SBH * 75


def test_new_activation_arguments_reject_bad_values():
    with pytest.raises(ValueError, match="num_kv_heads=3"):
        activation_bytes_per_layer(S, B, H, A, num_kv_heads=3)
    with pytest.raises(ValueError, match="arch='t5'"):
        activation_bytes_per_layer(S, B, H, A, arch="t5")
    with pytest.raises(ValueError, match="ffn_hidden_size=None"):
        activation_bytes_per_layer(S, B, H, A, arch="llama")


# ---------------------------------------------------------------- model-state terms
def test_fp32_states_accounting_is_12_bytes_per_param():
    # FP32StateAdamWeightDecay: 2 (16-bit weights) + 2 (16-bit grads) + 4 + 4 (fp32 m, v), no master copy
    assert model_state_breakdown(1000, accounting="fp32_states") == {
        "params": 2000, "grads": 2000, "optimizer_states": 8000}
    assert model_state_bytes(1000, accounting=(2, 2, 4)) == 8000      # 16-bit states, as a tuple
    with pytest.raises(ValueError, match="accounting"):
        model_state_bytes(1000, accounting=(2, 2))


def test_parallel_optimizer_slices_weights_and_states_over_dp_not_grads():
    e = model_state_breakdown(1000, dp=4, accounting="fp32_states", parallel_optimizer=True)
    assert e == {"params": 2000 // 4, "grads": 2000, "optimizer_states": 8000 // 4}
    # the states alone are ZeRO-1's; the weights are sliced too
    z1 = model_state_breakdown(1000, dp=4, zero_stage=1, accounting="fp32_states")
    assert e["optimizer_states"] == z1["optimizer_states"] and e["params"] * 4 == z1["params"]
    # dp=1: nothing to slice
    assert model_state_breakdown(1000, accounting="fp32_states", parallel_optimizer=True)["params"] == 2000


def test_param_count_with_grouped_query_attention():
    cfg = SimpleNamespace(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=1, ffn_hidden_size=688,
                          vocab_size=1024)
    # k and v shrink from h·h to h·(1·64) each: 2·(256·256 - 256·64) = 98,304 fewer per layer
    assert llama_param_count(cfg) == 3_688_704 - 4 * 98_304
    assert mindformers_ffn_size(4096) == 11008 and mindformers_ffn_size(8192, 256, 1.3) == 28672
    assert mindformers_ffn_size(4096, intermediate_size=1000) == 1000


# ---------------------------------------------------------------- one stage
def stage(**kw):
    base = dict(stage_params=1000, layers=4, seq_len=S, micro_batch=B, hidden_size=H, num_heads=A,
                vocab_size=1024, flash_attention=True, output_layer=False)
    base.update(kw)
    return estimate_stage(**base)


def test_stage_grad_accum_buffer_is_gradient_sized_and_can_be_sliced():
    assert stage()["grad_accum_buffer"] == 0
    e = stage(grad_accum_buffer=True, accounting="fp32_states")
    assert e["grad_accum_buffer"] == e["grads"] == 2000
    assert e["total"] == 2000 + 2000 + 8000 + 2000 + e["activations"]
    # mindformers' gradient_accumulation_shard: the buffer is sliced over dp
    assert stage(grad_accum_buffer=True, shard_grad_accum=True, dp=4)["grad_accum_buffer"] == 2000 // 4


def test_stage_in_flight_micro_batches_multiply_stored_layers():
    one = stage()["activations"]
    assert one == 4 * SBH * 34
    assert stage(in_flight_micro_batches=8)["activations"] == 8 * one


def test_stage_per_stage_recompute_counts_by_hand():
    # 4 layers: 1 full (2), 1 selective (34: flash, gpt), 2 none (34); in flight 2
    e = stage(full_recompute_layers=1, select_recompute_layers=1, in_flight_micro_batches=2)
    stored = (2 + 34 + 2 * 34) * 2
    working = 34 - 2                       # backward rematerialises one fully recomputed layer
    assert e["activations"] == SBH * (stored + working)
    assert (e["full_recompute_layers"], e["select_recompute_layers"]) == (1, 1)
    # counts above the stage's layers are clipped; full wins over selective
    e = stage(full_recompute_layers=9, select_recompute_layers=9)
    assert (e["full_recompute_layers"], e["select_recompute_layers"]) == (4, 0)
    assert e["activations"] == SBH * (4 * 2 + 32)


def test_stage_llama_selective_counts_by_hand():
    # llama, flash, f = 688: none 37.5, selective 26.75; 3 selective + 1 none, in flight 1
    e = stage(arch="llama", ffn_hidden_size=688, select_recompute_layers=3)
    assert e["activations"] == SBH * (3 * 26.75 + 37.5 + (37.5 - 26.75))


def test_stage_output_layer_and_largest_activation():
    e = stage(output_layer=True)
    assert e["output_activations"] == output_activation_bytes(S, B, 1024)
    assert e["largest_activation"] == S * B * 1024 * 2          # logits; flash stores no scores
    assert stage(flash_attention=False)["largest_activation"] == B * A * S * S * 2


def test_estimate_passes_the_new_terms_through():
    base = estimate(MINI)
    fl = estimate(MINI, flash_attention=True)
    assert base["activations_per_layer"] - fl["activations_per_layer"] == SBH * 10 * 2     # fp32: x2
    gqa = estimate(MINI, num_kv_heads=2)
    assert gqa["n_params"] == 3_688_704 - 4 * 2 * (256 * 256 - 256 * 128)
    po = estimate(MINI, n_devices=2, parallel_optimizer=True)
    assert po["params"] * 2 == base["params"] and po["optimizer_states"] * 2 == base["optimizer_states"]
    assert po["grads"] == base["grads"]
    lay = SimpleNamespace(dp=1, mp=1, pp=2, micro_batches=4)
    assert estimate(MINI, layout=lay)["in_flight_micro_batches"] == 2                # min(pp, m)
    assert estimate(MINI, layout=lay, in_flight_micro_batches=4)["activations"] > estimate(MINI, layout=lay)[
        "activations"]
    assert estimate(MINI, grad_accum_buffer=True)["grad_accum_buffer"] == base["grads"]
    sel = estimate(MINI, arch="llama", select_recompute_layers=2)
    assert sel["select_recompute_layers"] == 2 and sel["total"] < estimate(MINI, arch="llama")["total"]


# ---------------------------------------------------------------- budget parsing
def test_parse_memory_size():
    assert parse_memory_size("58GB") == 58 * GIB           # MindSpore's GB is 1024³ bytes
    assert parse_memory_size("53GB") == 53 * GIB
    assert parse_memory_size("512MB") == 512 * 2**20 and parse_memory_size("1.5GiB") == 3 * 2**29
    assert parse_memory_size(1000) == 1000
    for bad in ("58", "lots", "-1GB", "0GB"):
        with pytest.raises(ValueError, match="memory size"):
            parse_memory_size(bad)


# ---------------------------------------------------------------- the published configs
PUBLISHED = [  # (fixture, cards, layout, budget in GiB)
    (CFG_7B, 8, "dp8-mp1-pp1", 58),
    (CFG_13B, 8, "dp8-mp1-pp1", 58),
    (CFG_70B, 32, "dp1-mp4-pp8", 53),
]


@pytest.mark.parametrize("path,cards,layout,budget_gib", PUBLISHED, ids=["7b", "13b", "70b"])
def test_published_configs_fit_their_max_device_memory(path, cards, layout, budget_gib):
    text = path.read_text()
    assert "github.com/mindspore-lab/mindformers" in text and "commit:" in text    # cited fixture
    e = estimate_from_mindformers_yaml(path)
    assert (e["devices"], e["layout"], e["budget"]) == (cards, layout, budget_gib * GIB)
    assert e["fits"] is True and e["total"] <= e["budget"] and e["headroom"] == e["budget"] - e["total"]
    # Not implausibly small. The floor: weights, gradients and optimizer states must be resident
    # whatever the activations do, so the total is at least the model states (checked by hand
    # below). Above that, > 40% of the budget: mindformers' own tuning notes say these configs
    # are memory-bound (13B at dp 8 does not fit with SiLU/Mul select recompute and needs full
    # recompute; 70B needs per-stage select recompute), so a total far below the budget would
    # contradict the people who ran them.
    assert e["total"] >= e["params"] + e["grads"] + e["optimizer_states"]
    assert e["total"] > 0.4 * e["budget"]
    assert e["total"] == sum(e[k] for k in ("params", "grads", "optimizer_states", "activations",
                                             "grad_accum_buffer", "overhead"))


def test_7b_breakdown_by_hand():
    # pretrain_llama2_7b: dp 8, fp16 weights, FP32StateAdamWeightDecay, parallel optimizer, 8 gradient
    # accumulation steps (not sliced: gradient_accumulation_shard False), batch 1, flash, no recompute
    e = estimate_from_mindformers_yaml(CFG_7B)
    n = 6_738_415_616
    assert e["n_params"] == n
    assert (e["params"], e["grads"], e["grad_accum_buffer"], e["optimizer_states"]) == (
        2 * n // 8, 2 * n, 2 * n, 8 * n // 8)
    sbh = 4096 * 1 * 4096
    per_layer = sbh * Fraction(75, 2)            # llama, flash: 8 + 4 + 4 + 8·11008/4096 = 37.5
    logits = 4 * 4096 * 1 * 32000                # Korthikanti eq. 4 at 16 bits
    assert e["activations"] == 32 * per_layer + logits
    assert e["in_flight_micro_batches"] == 1 and e["recompute_working_set"] == 0
    # states floor 3.25 bytes/param = 20.4 GiB, 35% of 58 GiB; the accumulation buffer and activations
    # bring it to about 52 GiB
    assert 52 * GIB < e["total"] < 52.5 * GIB


def test_13b_needs_its_full_recompute():
    e = estimate_from_mindformers_yaml(CFG_13B)
    assert e["n_params"] == 13_015_864_320
    assert (e["full_recompute_layers"], e["layers"]) == (40, 40)
    sbh = 4096 * 2 * 5120
    assert e["activations_per_layer"] == 2 * sbh
    none = sbh * (8 + 4 + 4 + 8 * Fraction(13824, 5120))
    assert e["recompute_working_set"] == none - 2 * sbh
    # mindformers' tuning notes: at dp 8 without mp, select recompute of SiLU and Mul is not enough,
    # full recompute is needed. The estimator agrees, by a wide margin.
    d = load(CFG_13B)
    d["recompute_config"].update(recompute=False, select_recompute=True)
    sel = estimate_from_mindformers_yaml(d)
    assert sel["select_recompute_layers"] == 40 and sel["fits"] is False and sel["total"] > 75 * GIB


def test_70b_stage_zero_by_hand():
    # pretrain_llama2_70b_bf16_32p: dp 1, mp 4, pp 8, 256 micro-batches, sequence parallel, GQA 8 of 64,
    # ffn 28672, bf16 weights, FP32StateAdamWeightDecay, select_recompute [8,4,4,1,1,1,1,1], flash
    e = estimate_from_mindformers_yaml(CFG_70B)
    assert e["n_params"] == 68_976_648_192
    assert e["stage"] == 0 and len(e["per_stage_totals"]) == 8
    per_layer_params = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    stage0 = 10 * per_layer_params // 4 + 32000 * 8192 // 4      # vocab_emb_dp False: embedding split by mp
    assert (e["params"], e["grads"], e["grad_accum_buffer"], e["optimizer_states"]) == (
        2 * stage0, 2 * stage0, 2 * stage0, 8 * stage0)
    sbh = 4096 * 1 * 8192
    none = Fraction(8 + 4 + 4 * Fraction(1, 8) + 8 * Fraction(28672, 8192), 4)     # 10.125, all /mp (SP)
    sel = none - Fraction(4 * Fraction(28672, 8192), 4)                           # 6.625
    assert (e["select_recompute_layers"], e["layers"], e["in_flight_micro_batches"]) == (8, 10, 8)
    assert e["activations"] == sbh * ((8 * sel + 2 * none) * 8 + (none - sel))
    assert e["output_activations"] == 0                          # the logits live on the last stage
    # the per-stage select counts matter: without them stage 0 holds 10 full layers x 8 micro-batches
    d = load(CFG_70B)
    d["recompute_config"]["select_recompute"] = False
    assert estimate_from_mindformers_yaml(d)["total"] - e["total"] == sbh * (8 * (none - sel) * 8 - (none - sel))


def test_in_flight_override_and_budget_override():
    e = estimate_from_mindformers_yaml(CFG_70B, in_flight_micro_batches=1)
    assert e["in_flight_micro_batches"] == 1
    assert e["total"] < estimate_from_mindformers_yaml(CFG_70B)["total"]
    gpipe = estimate_from_mindformers_yaml(CFG_70B, in_flight_micro_batches=[256] * 8)
    assert gpipe["fits"] is False                                 # GPipe would hold all 256
    small = estimate_from_mindformers_yaml(CFG_7B, budget_bytes=40 * GIB)
    assert small["budget"] == 40 * GIB and small["fits"] is False
    assert estimate_from_mindformers_yaml(CFG_7B, overhead_bytes=GIB)["total"] == \
        estimate_from_mindformers_yaml(CFG_7B)["total"] + GIB


def test_parallel_optimizer_flag_is_what_makes_7b_fit():
    d = load(CFG_7B)
    d["parallel"]["enable_parallel_optimizer"] = False
    e = estimate_from_mindformers_yaml(d)
    n = 6_738_415_616
    assert e["params"] == 2 * n and e["optimizer_states"] == 8 * n and e["fits"] is False


def test_yaml_without_budget_and_bad_yaml():
    d = load(CFG_7B)
    del d["context"]["max_device_memory"]
    e = estimate_from_mindformers_yaml(d)
    assert e["budget"] is None and e["fits"] is None and e["source"] == "<dict>"
    with pytest.raises(ValueError, match="model.model_config"):
        estimate_from_mindformers_yaml({"parallel_config": {}})
    bad = copy.deepcopy(load(CFG_70B))
    bad["recompute_config"]["select_recompute"] = [1, 2, 3]
    with pytest.raises(ValueError, match="select_recompute"):
        estimate_from_mindformers_yaml(bad)
    with pytest.raises(ValueError, match="in_flight_micro_batches"):
        estimate_from_mindformers_yaml(CFG_70B, in_flight_micro_batches=[1, 2])


def test_recompute_config_forms():
    # op-pattern lists and dicts, as mindformers accepts them
    d = load(CFG_7B)
    d["recompute_config"]["select_recompute"] = [r"feed_forward\.mul", r"feed_forward\.w1\.activation\.silu"]
    assert estimate_from_mindformers_yaml(d)["select_recompute_layers"] == 32
    d = load(CFG_70B)
    d["recompute_config"]["select_recompute"] = {r"feed_forward\.mul": [2, 0, 0, 0, 0, 0, 0, 0],
                                                 r"feed_forward\.w1\.activation\.silu": True}
    every = load(CFG_70B)
    every["recompute_config"]["select_recompute"] = True
    # a layer counts if any of its ops is recomputed: True for one pattern means every layer
    assert estimate_from_mindformers_yaml(d)["per_stage_totals"] == \
        estimate_from_mindformers_yaml(every)["per_stage_totals"]
    # per-stage full recompute counts change only their own stage
    d["recompute_config"] = {"recompute": [2, 0, 0, 0, 0, 0, 0, 0], "select_recompute": False}
    plain = load(CFG_70B)
    plain["recompute_config"] = {}
    got, ref = (estimate_from_mindformers_yaml(x)["per_stage_totals"] for x in (d, plain))
    assert got[0] < ref[0] and got[1:] == ref[1:]


# ---------------------------------------------------------------- every default and every message, exactly
MINIMAL = {"model": {"model_config": {"hidden_size": 64, "num_layers": 4, "num_heads": 4, "vocab_size": 1000,
                                      "seq_length": 32}}}


def _est(mc=None, options=None, **sections):
    """estimate_from_mindformers_yaml of MINIMAL with model_config fields `mc` added and whole YAML sections set
    (parallel_config={...}, runner_config={...}); `options` are the function's own keywords."""
    d = copy.deepcopy(MINIMAL)
    d["model"]["model_config"].update(mc or {})
    d.update({k: dict(v) for k, v in sections.items()})
    return estimate_from_mindformers_yaml(d, **(options or {}))


def test_a_minimal_yaml_takes_every_documented_default():
    e = estimate_from_mindformers_yaml(copy.deepcopy(MINIMAL))
    ffn = mindformers_ffn_size(64, 256, None, None)
    per_layer = 2 * 64 * 64 + 2 * 64 * 4 * 16 + 3 * 64 * ffn + 2 * 64
    n = 2 * 1000 * 64 + 4 * per_layer + 64
    # one stage holding everything: the embedding (not split: vocab_emb_dp), the layers, lm_head and the norm
    want = estimate_stage(stage_params=4 * per_layer + 1000 * 64 + 1000 * 64 + 64, layers=4, seq_len=32,
                          micro_batch=1, hidden_size=64, num_heads=4, vocab_size=1000, num_kv_heads=4,
                          ffn_hidden_size=ffn, arch="llama", dp=1, tp=1, sequence_parallel=False,
                          flash_attention=False, full_recompute_layers=0, select_recompute_layers=0,
                          in_flight_micro_batches=1, accounting=(4, 4, 8), parallel_optimizer=False,
                          grad_accum_buffer=False, shard_grad_accum=False, bytes_per_value=2, output_layer=True,
                          overhead_bytes=0, n_params=n)
    assert {k: e[k] for k in want} == want and e["n_params"] == n
    assert {k: v for k, v in e.items() if k not in want} == dict(
        stage=0, per_stage_totals=[want["total"]], devices=1, layout="dp1-mp1-pp1", dp=1, tp=1, pp=1,
        micro_batch_num=1, micro_batch=1, grad_accum_steps=1, optimizer="AdamWeightDecay", parallel_optimizer=False,
        budget=None, fits=None, headroom=None, source="<dict>")


def test_each_field_read_changes_the_estimate_the_documented_way():
    base = _est()
    assert _est(mc={"n_kv_heads": 2})["n_params"] == _est(mc={"num_kv_heads": 2})["n_params"] < base["n_params"]
    assert _est(mc={"intermediate_size": 100})["n_params"] == base["n_params"] - 4 * 3 * 64 * (
        mindformers_ffn_size(64, 256, None, None) - 100)
    assert _est(mc={"multiple_of": 32})["n_params"] != base["n_params"]
    assert _est(mc={"ffn_dim_multiplier": 3.0})["n_params"] != base["n_params"]
    for dt in ("float16", "bfloat16", "fp16", "bf16"):
        assert _est(mc={"param_init_type": dt})["params"] * 2 == base["params"]
        assert _est(mc={"compute_dtype": dt})["activations"] == base["activations"]
    assert _est(mc={"compute_dtype": "float32"})["activations"] > base["activations"]
    assert _est(mc={"use_flash_attention": True})["activations"] < base["activations"]
    sgd, mom = _est(optimizer={"type": "SGD"}), _est(optimizer={"type": "Momentum"})
    assert sgd["optimizer"] == "SGD" and sgd["optimizer_states"] * 2 == base["optimizer_states"] == \
        mom["optimizer_states"] * 2
    assert _est(runner_config={"batch_size": 3})["micro_batch"] == 3
    acc = _est(runner_config={"gradient_accumulation_steps": 4})
    assert acc["grad_accum_steps"] == 4 and acc["total"] > base["total"]
    assert _est(runner_config={"gradient_accumulation_steps": 0})["grad_accum_steps"] == 1
    dp = _est(parallel_config={"data_parallel": 2}, parallel={"enable_parallel_optimizer": True})
    assert dp["parallel_optimizer"] is True and dp["layout"] == "dp2-mp1-pp1" and dp["devices"] == 2
    assert _est(parallel={"enable_parallel_optimizer": True})["parallel_optimizer"] is False     # dp 1: nothing to slice
    shard = dict(parallel_config={"data_parallel": 2}, runner_config={"gradient_accumulation_steps": 2})
    assert _est(**shard, parallel={"enable_parallel_optimizer": True, "parallel_optimizer_config":
                                  {"gradient_accumulation_shard": True}})["total"] < \
        _est(**shard, parallel={"enable_parallel_optimizer": True})["total"]
    tp = _est(parallel_config={"model_parallel": 2})
    assert tp["tp"] == 2 and tp["params"] < base["params"]
    assert _est(parallel_config={"model_parallel": 2, "use_seq_parallel": True})["activations"] < tp["activations"]
    assert _est(parallel_config={"use_seq_parallel": True})["activations"] == base["activations"]   # tp 1: no-op
    assert _est(parallel_config={"model_parallel": 2, "vocab_emb_dp": False})["params"] < tp["params"]
    pp = _est(parallel_config={"pipeline_stage": 2, "micro_batch_num": 4})
    assert pp["pp"] == 2 and pp["micro_batch_num"] == 4 and len(pp["per_stage_totals"]) == 2
    assert pp["total"] == max(pp["per_stage_totals"]) and pp["stage"] == pp["per_stage_totals"].index(pp["total"])
    off = _est(parallel_config={"pipeline_stage": 2}, mc={"offset": [1, -1]})
    assert off["per_stage_totals"] != pp["per_stage_totals"]
    rec = _est(recompute_config={"recompute": True})
    assert rec["activations"] < base["activations"]
    assert base["activations"] > _est(recompute_config={"select_recompute": True})["activations"] > rec["activations"]
    fit = _est(context={"max_device_memory": "1GB"})
    assert fit["budget"] == 2**30 and fit["fits"] is True and fit["headroom"] == 2**30 - fit["total"]
    tight = _est(options={"budget_bytes": base["total"] - 1})
    assert tight["fits"] is False and tight["headroom"] == -1 and tight["budget"] == base["total"] - 1
    assert _est(options={"overhead_bytes": 1000})["total"] == base["total"] + 1000
    assert _est(options={"in_flight_micro_batches": 2})["activations"] > \
        base["activations"]


def test_the_source_is_the_path_or_dict(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text(yaml.safe_dump(MINIMAL))
    assert estimate_from_mindformers_yaml(p)["source"] == str(p)
    assert estimate_from_mindformers_yaml(str(p))["source"] == str(p)
    assert estimate_from_mindformers_yaml(copy.deepcopy(MINIMAL))["source"] == "<dict>"


F = "estimate_from_mindformers_yaml: "


@pytest.mark.parametrize("key", ["hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length"])
def test_a_missing_model_field_is_named_with_its_section_and_source(tmp_path, key):
    d = copy.deepcopy(MINIMAL)
    del d["model"]["model_config"][key]
    with pytest.raises(ValueError) as err:
        estimate_from_mindformers_yaml(d)
    assert str(err.value) == f"{F}model.model_config.{key} is missing in <dict>; fix: set it in the YAML"
    d["model"]["model_config"][key] = None
    p = tmp_path / "y.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(ValueError) as err:
        estimate_from_mindformers_yaml(p)
    assert str(err.value) == f"{F}model.model_config.{key} is missing in {p}; fix: set it in the YAML"


def test_every_refusal_is_one_exact_line(tmp_path):
    def msg(d, **kw):
        with pytest.raises(ValueError) as err:
            estimate_from_mindformers_yaml(d, **kw)
        return str(err.value)
    assert msg({"parallel_config": {}}) == f"{F}<dict> has no model.model_config; fix: pass a mindformers training YAML"
    p = tmp_path / "empty.yaml"
    p.write_text("")
    assert msg(p) == f"{F}{p} has no model.model_config; fix: pass a mindformers training YAML"
    for name in ("data_parallel", "model_parallel", "pipeline_stage", "micro_batch_num"):
        d = copy.deepcopy(MINIMAL)
        d["parallel_config"] = {name: 0}
        assert msg(d).startswith(f"{F}parallel_config.{name}=0 is invalid; fix: pass a positive integer")
    d = copy.deepcopy(MINIMAL)
    d["parallel_config"], d["model"]["model_config"]["offset"] = {"pipeline_stage": 2}, 1
    assert msg(d) == (f"{F}model_config.offset=1 (a single nonzero int) is not supported; "
                      "fix: give a list of 2 per-stage offsets")
    d["model"]["model_config"]["offset"] = [3, 0]
    assert msg(d) == (f"{F}num_layers=4, pipeline_stage=2 and offset=[3, 0] do not give 2 positive stage sizes "
                      "summing to 4; fix: make L divisible by pp or set offset")
    d["model"]["model_config"]["offset"] = [2, -2]
    assert "do not give 2 positive stage sizes" in msg(d)
    d["parallel_config"] = {"pipeline_stage": 3}
    d["model"]["model_config"]["offset"] = 0
    assert "pipeline_stage=3 and offset=0 do not give 3 positive stage sizes summing to 4" in msg(d)
    assert msg(copy.deepcopy(MINIMAL), in_flight_micro_batches=[1, 2]) == (
        f"{F}in_flight_micro_batches has 2 entries for 1 stages; fix: pass one number per stage")


def test_recompute_counts_per_stage_in_every_form():
    from mshelpers.memory import _stage_counts
    L = [4, 2]
    assert _stage_counts(None, L, "recompute") == _stage_counts(False, L, "recompute") == [0, 0]
    assert _stage_counts(True, L, "recompute") == [4, 2] and _stage_counts(3, L, "recompute") == [3, 2]
    assert _stage_counts([True, False], L, "recompute") == [4, 0]
    assert _stage_counts([False, True], L, "recompute") == [0, 2]
    assert _stage_counts([1, 5], L, "recompute") == [1, 2] and _stage_counts([True, 1], L, "recompute") == [4, 1]
    assert _stage_counts(["feed_forward"], L, "recompute") == [4, 2] and _stage_counts([], L, "recompute") == [0, 0]
    assert _stage_counts({}, L, "recompute") == [0, 0]
    assert _stage_counts({"a": [1, 0], "b": [0, 2]}, L, "select_recompute") == [1, 2]
    assert _stage_counts({"a": True, "b": [1, 0]}, L, "select_recompute") == [4, 2]
    for bad, shown in (({"w\\.mul": 1.5}, "1.5"), ([[1, 2], [0, 1]], "[[1, 2], [0, 1]]"), ([1, 2, 3], "[1, 2, 3]")):
        with pytest.raises(ValueError) as err:
            _stage_counts(bad, L, "select_recompute")
        assert str(err.value) == (
            f"estimate_from_mindformers_yaml: recompute_config.select_recompute={shown} is not understood; "
            "fix: use a bool, a list of 2 per-stage layer counts, op patterns, or a dict of those "
            "(pipeline interleave lists of lists are not supported)")


def test_integer_arithmetic_where_heads_or_the_vocabulary_do_not_divide():
    ffn = mindformers_ffn_size(64, 256, None, None)
    # 64 / 3 heads: d_head is 21 (floor), as mindformers' integer head size
    e = _est({"num_heads": 3, "n_kv_heads": 3})
    per_layer = 2 * 64 * 64 + 2 * 64 * 3 * 21 + 3 * 64 * ffn + 2 * 64
    assert e["n_params"] == 2 * 1000 * 64 + 4 * per_layer + 64 and type(e["n_params"]) is int
    # V*h = 64,064 over tp 3: the shards round up, in whole parameters
    e = _est({"vocab_size": 1001}, parallel_config={"model_parallel": 3})
    per_layer = 2 * 64 * 64 + 2 * 64 * 4 * 16 + 3 * 64 * ffn + 2 * 64
    stage = -(-4 * per_layer // 3) + 1001 * 64 + -(-1001 * 64 // 3) + 64
    assert e["params"] == 4 * stage and all(type(e[k]) is int for k in ("params", "grads", "total"))
    e = _est({"vocab_size": 1001}, parallel_config={"model_parallel": 3, "vocab_emb_dp": False})
    assert e["params"] == 4 * (stage - 1001 * 64 + -(-1001 * 64 // 3)) and type(e["total"]) is int


def test_pipeline_details_offsets_buffers_and_the_budget_edge():
    # offset [1, -1] puts 3 layers on stage 0 and 1 on stage 1; [-1, 1] the other way
    more, fewer = _est({"offset": [1, -1]}, parallel_config={"pipeline_stage": 2}), _est({"offset": [-1, 1]}, parallel_config={"pipeline_stage": 2})
    assert more["per_stage_totals"][0] > fewer["per_stage_totals"][0]
    assert more["per_stage_totals"][1] < fewer["per_stage_totals"][1]
    # a gradient accumulation buffer: with accumulation, or a pipeline of more than one micro-batch
    e11 = _est(parallel_config={"pipeline_stage": 2, "micro_batch_num": 1})
    e22 = _est(parallel_config={"pipeline_stage": 2, "micro_batch_num": 2})
    e12 = _est(parallel_config={"pipeline_stage": 1, "micro_batch_num": 2})
    assert e22["total"] - e22["activations"] > e11["total"] - e11["activations"]     # the buffer, per stage
    assert e12["total"] == _est()["total"]                    # micro-batches without a pipeline: nothing
    assert _est(runner_config={"gradient_accumulation_steps": 2})["total"] > _est()["total"]
    # 1F1B: stage i holds min(pp - i, m) micro-batches
    e = _est(parallel_config={"pipeline_stage": 2, "micro_batch_num": 4})
    same = _est(parallel_config={"pipeline_stage": 2, "micro_batch_num": 4}, options={"in_flight_micro_batches": [2, 1]})
    assert e["per_stage_totals"] == same["per_stage_totals"]
    # fits is total <= budget: the exact total fits
    t = _est()["total"]
    assert _est(options={"budget_bytes": t})["fits"] is True and _est(options={"budget_bytes": t})["headroom"] == 0


@pytest.mark.parametrize("key", ["recompute", "select_recompute"])
def test_a_recompute_entry_not_understood_is_named_by_its_key(key):
    with pytest.raises(ValueError) as err:
        _est(recompute_config={key: 2.5})
    assert str(err.value).startswith(f"estimate_from_mindformers_yaml: recompute_config.{key}=2.5 is not understood")


def test_widths_defaults_and_uneven_tensor_parallel_shards():
    base = _est()
    assert _est({"compute_dtype": "float32"})["activations"] == 2 * base["activations"]     # 4 bytes, not 2
    assert _est(parallel_config={"data_parallel": 2})["parallel_optimizer"] is False           # off unless the YAML turns it on
    # 4 layers of 65,664 parameters over tp 5 do not divide: the shard rounds up to whole parameters
    per_layer = 2 * 64 * 64 + 2 * 64 * 4 * 16 + 3 * 64 * mindformers_ffn_size(64) + 2 * 64
    e = _est(parallel_config={"model_parallel": 5})
    assert e["params"] == 4 * (-(-4 * per_layer // 5) + 1000 * 64 + 1000 * 64 // 5 + 64) and type(e["params"]) is int
