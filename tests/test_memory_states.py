"""mshelpers.memory_states: parameter counts, the bytes of params, grads and Adam states per device (ZeRO, MindSpore's
parallel optimizer, the accountings), worked by hand. The same rule prices every stage in the doctor's memory model
(tests/test_memory_one_model.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from _checks import module_doctests
from mshelpers import memory_states
from mshelpers.config import RunConfig
from mshelpers.memory_states import llama_param_count, model_state_breakdown, model_state_bytes

MINI = RunConfig.preset("mini")


def test_param_count_presets():
    assert llama_param_count(MINI) == 3_688_704
    # tiny: 2·256·64 + 2·(4·64² + 3·64·172 + 2·64) + 64
    assert llama_param_count(RunConfig.preset("tiny")) == 32_768 + 2 * (16_384 + 33_024 + 128) + 64
    # LLaMA-2 7B as released: 6,738,415,616 parameters
    assert llama_param_count(RunConfig.preset("llama2-7b")) == 6_738_415_616


@pytest.mark.parametrize("stage,expected", [
    (0, 16_000),                 # 16Ψ
    (1, 4_000 + 12_000 // 4),    # 4Ψ + 12Ψ/N
    (2, 2_000 + 14_000 // 4),    # 2Ψ + 14Ψ/N
    (3, 16_000 // 4),            # 16Ψ/N
])
def test_zero_stages_mixed_adam(stage, expected):
    assert model_state_bytes(1000, zero_stage=stage, dp=4) == expected


def test_zero_shards_in_order_optimizer_then_grads_then_params():
    assert model_state_breakdown(1000, zero_stage=1, dp=4) == {"params": 2000, "grads": 2000, "optimizer_states": 3000}
    assert model_state_breakdown(1000, zero_stage=2, dp=4) == {"params": 2000, "grads": 500, "optimizer_states": 3000}
    assert model_state_breakdown(1000, zero_stage=3, dp=4) == {"params": 500, "grads": 500, "optimizer_states": 3000}


def test_other_accountings():
    assert model_state_bytes(1000, accounting="fp32") == 16_000
    assert model_state_breakdown(1000, accounting="fp32", zero_stage=1, dp=4)["optimizer_states"] == 2000
    assert model_state_bytes(1000, accounting="fp32_grads") == 18_000
    # Megatron's distributed optimizer: 6 + 12/dp bytes per parameter
    assert model_state_bytes(1000, accounting="fp32_grads", zero_stage=1, dp=4) == 6000 + 3000


def test_seven_b_is_112_gb_and_dp_one_means_no_sharding():
    assert model_state_bytes(7 * 10**9) == 112 * 10**9
    assert model_state_bytes(1000, zero_stage=3, dp=1) == model_state_bytes(1000)


def test_shards_round_up_to_whole_bytes():
    # Ψ=10 over 3 ranks: ceil(20/3)=7, ceil(20/3)=7, ceil(120/3)=40
    assert model_state_bytes(10, zero_stage=3, dp=3) == 54


def test_model_state_bytes_defaults_and_the_parallel_optimizer():
    assert memory_states.model_state_bytes(1000) == 16_000
    assert memory_states.model_state_bytes(1000, dp=4) == 16_000                 # no ZeRO by default: nothing sliced
    assert memory_states.model_state_breakdown(1000, dp=4) == {"params": 2000, "grads": 2000, "optimizer_states": 12000}
    assert memory_states.model_state_bytes(1000, zero_stage=1) == 16_000          # dp 1 by default: nothing to slice over
    assert memory_states.model_state_bytes(1000, zero_stage=1, dp=4) == sum(
        memory_states.model_state_breakdown(1000, zero_stage=1, dp=4).values()) < 16_000
    po = memory_states.model_state_bytes(1000, dp=4, parallel_optimizer=True)
    assert po == sum(memory_states.model_state_breakdown(1000, dp=4, parallel_optimizer=True).values()) < 16_000


def test_llama_param_count_names_itself_in_its_refusal():
    with pytest.raises(ValueError) as err:
        llama_param_count({"hidden_size": 64})
    assert str(err.value).startswith("llama_param_count: cfg lacks ")


def test_an_accounting_tuple_may_hold_zero_bytes():
    # weights only (no gradients, no optimizer: a frozen model): 2 bytes a parameter
    assert model_state_breakdown(1000, accounting=(2, 0, 0)) == {"params": 2000, "grads": 0, "optimizer_states": 0}


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


def test_doctests():
    tries, failures = module_doctests(memory_states)
    assert tries >= 2 and failures == 0
