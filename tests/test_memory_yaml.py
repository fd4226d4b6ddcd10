"""mshelpers.memory against what real configs use: the terms the config doctor prices every layer with, worked
by hand, and mindformers' published Llama 2 pre-training YAMLs (tests/data/mindformers/, each with a header naming
its repository, path and commit) priced by `estimate_from_mindformers_yaml`, the doctor's price (one reader, one
cost model: tests/doctor/test_one_price.py), against their max_device_memory.

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
from mshelpers import doctor as D
from mshelpers.memory import (activation_bytes_per_layer, estimate, estimate_from_mindformers_yaml,
                              estimate_stage, llama_param_count, model_state_breakdown, model_state_bytes,
                              output_activation_bytes)

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



# ---------------------------------------------------------------- the published configs, priced by the doctor
PUBLISHED = [  # (fixture, cards, layout, budget in GiB)
    (CFG_7B, 8, "dp8-mp1-pp1", 58),
    (CFG_13B, 8, "dp8-mp1-pp1", 58),
    (CFG_70B, 32, "dp1-mp4-pp8", 53),
]
PARTS = ("params", "grads", "optimizer_states", "activations", "grad_accum_buffer")


@pytest.mark.parametrize("path,cards,layout,budget_gib", PUBLISHED, ids=["7b", "13b", "70b"])
def test_published_configs_fit_their_max_device_memory(path, cards, layout, budget_gib):
    text = path.read_text()
    assert "github.com/mindspore-lab/mindformers" in text and "commit:" in text    # cited fixture
    e = estimate_from_mindformers_yaml(path)
    assert (e["devices"], e["layout"], e["budget"]) == (cards, layout, budget_gib * GIB)
    assert e["fits"] is True and e["total"] <= e["budget"] and e["headroom"] == e["budget"] - e["total"]
    assert e["total"] == sum(e[k] for k in PARTS) == max(e["per_stage_totals"])
    # the doctor's price, part by part, for the largest stage
    m = D.memory_per_stage(D.read_config(path))
    assert {k: e[k] for k in PARTS} == m["breakdown"] and e["per_stage_totals"] == m["per_stage_bytes"]
    # not implausibly small: the weights, gradients and optimizer states must be resident whatever the activations
    # do, and mindformers' own tuning notes say these configs are memory-bound (a third of the card at least)
    assert e["total"] >= e["params"] + e["grads"] + e["optimizer_states"] and e["total"] > e["budget"] / 3


def test_the_7b_model_states_are_sliced_as_the_parallel_optimizer_slices_them():
    # pretrain_llama2_7b: dp 8, fp16 weights, FP32StateAdamWeightDecay, parallel optimizer: weights and fp32
    # moments stored as 1/8 slices; flash attention, batch 1, no recompute
    e = estimate_from_mindformers_yaml(CFG_7B)
    n = 6_738_415_616                                    # mindformers' LlamaForCausalLM 7B
    assert e["n_params"] == n == llama_param_count(RunConfig.preset("llama2-7b"))
    assert (e["params"], e["optimizer_states"]) == pytest.approx((2 * n / 8, 8 * n / 8), abs=8)
    # the activations are at least the 32 layers' stored tensors (mindformers' LLaMA block, flash) and the logits
    per_layer = activation_bytes_per_layer(4096, 1, 4096, 32, arch="llama", ffn_hidden_size=11008,
                                           flash_attention=True)
    assert e["activations"] >= 32 * per_layer + output_activation_bytes(4096, 1, 32000)


@pytest.mark.parametrize("label, path, edit, part", [
    ("7B without the parallel optimizer", CFG_7B, lambda d: d["parallel"].update(enable_parallel_optimizer=False),
     "params"),
    ("7B without flash attention", CFG_7B, lambda d: d["model"]["model_config"].update(use_flash_attention=False),
     "activations"),
    ("13B with SiLU/Mul select recompute instead of full", CFG_13B,
     lambda d: d["recompute_config"].update(recompute=False, select_recompute=True), "activations"),
    ("70B without its per-stage select_recompute", CFG_70B,
     lambda d: d["recompute_config"].update(select_recompute=False), "activations")])
def test_each_memory_choice_of_the_published_configs_saves_memory(label, path, edit, part):
    """Turning off one of the file's own memory choices raises the per-device total, through the term it acts on;
    mindformers' tuning notes name each as needed (13B at dp 8: full recompute; 7B: the parallel optimizer)."""
    d = yaml.safe_load(path.read_text())
    edit(d)
    off, on = estimate_from_mindformers_yaml(d), estimate_from_mindformers_yaml(path)
    assert off["total"] > on["total"] and off[part] > on[part], label
    assert off["source"] == "<dict>" and on["source"] == str(path)
    if "parallel optimizer" in label or "13B" in label:
        assert off["fits"] is False


MINIMAL = {"model": {"model_config": {"hidden_size": 64, "num_layers": 4, "num_heads": 4, "vocab_size": 1000,
                                      "seq_length": 32}}}


def _est(mc=None, options=None, **sections):
    """estimate_from_mindformers_yaml of MINIMAL with model_config fields `mc` added and whole YAML sections set."""
    d = copy.deepcopy(MINIMAL)
    d["model"]["model_config"].update(mc or {})
    d.update({k: dict(v) for k, v in sections.items()})
    return estimate_from_mindformers_yaml(d, **(options or {}))


def test_each_setting_moves_the_price_the_physical_way():
    base = _est()
    assert base["budget"] == 64 * GIB and base["fits"] is True    # no max_device_memory: the A2 card, as the CLI
    assert _est(mc={"n_kv_heads": 2})["n_params"] < base["n_params"]
    for dt in ("float16", "bfloat16"):
        assert _est(mc={"param_init_type": dt})["params"] * 2 == base["params"]
    assert _est(mc={"compute_dtype": "float32"})["activations"] > _est(mc={"compute_dtype": "float16"})["activations"]
    assert _est(mc={"use_flash_attention": True})["activations"] < base["activations"]
    assert _est(optimizer={"type": "SGD"})["optimizer_states"] * 2 == base["optimizer_states"]
    assert _est(runner_config={"batch_size": 3})["activations"] > base["activations"]
    assert _est(runner_config={"gradient_accumulation_steps": 4})["grad_accum_steps"] == 4
    dp = _est(parallel_config={"data_parallel": 2}, parallel={"enable_parallel_optimizer": True})
    assert dp["parallel_optimizer"] is True and dp["params"] * 2 == base["params"] and dp["devices"] == 2
    tp = _est(parallel_config={"model_parallel": 2})
    assert tp["tp"] == 2 and tp["params"] < base["params"] and tp["activations"] < base["activations"]
    assert _est(parallel_config={"model_parallel": 2, "use_seq_parallel": True})["activations"] < tp["activations"]
    pp = _est(parallel_config={"pipeline_stage": 2, "micro_batch_num": 4})
    assert len(pp["per_stage_totals"]) == 2 and pp["total"] == max(pp["per_stage_totals"]) < base["total"] * 2
    rec, sel = _est(recompute_config={"recompute": True}), _est(recompute_config={"select_recompute": True})
    assert base["activations"] > sel["activations"] > rec["activations"]
    t = base["total"]
    assert _est(options={"budget_bytes": t})["fits"] is True and _est(options={"budget_bytes": t})["headroom"] == 0
    assert _est(options={"budget_bytes": t - 1})["fits"] is False
    assert _est(context={"max_device_memory": "1GB"})["budget"] == GIB


@pytest.mark.parametrize("key", ["hidden_size", "num_layers", "num_heads", "vocab_size"])
def test_a_missing_model_field_is_refused_in_one_line_naming_it(key):
    d = copy.deepcopy(MINIMAL)
    del d["model"]["model_config"][key]
    with pytest.raises(ValueError) as err:
        estimate_from_mindformers_yaml(d)
    text = str(err.value)
    assert "\n" not in text and key in text and "fix:" in text
