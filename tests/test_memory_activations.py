"""mshelpers.memory_activations: Korthikanti et al.'s activation count per layer (tensor and sequence parallel,
recompute, flash attention, GQA, mindformers' LLaMA block) and the logits, worked by hand."""
from __future__ import annotations

from fractions import Fraction

import pytest

from _checks import module_doctests
from mshelpers import memory_activations
from mshelpers.memory_activations import activation_bytes_per_layer, output_activation_bytes

S, B, H, A = 128, 8, 256, 4
SBH = S * B * H            # 262,144; 5·a·s/h = 10


@pytest.mark.parametrize("kw,expected", [
    ({}, SBH * 44),                                                   # sbh(34 + 5as/h)
    ({"recompute": "selective"}, SBH * 34),                           # drops 5as/h
    ({"recompute": "full"}, SBH * 2),                                 # layer input only
    ({"tp": 2}, SBH * (10 + 12 + 5)),                                 # sbh(10 + 24/t + 5as/(ht))
    ({"tp": 2, "recompute": "selective"}, SBH * 22),
    ({"tp": 2, "sequence_parallel": True}, SBH * 44 // 2),            # sbh(34 + 5as/h)/t
    ({"tp": 2, "sequence_parallel": True, "recompute": "selective"}, SBH * 34 // 2),
    ({"tp": 2, "sequence_parallel": True, "recompute": "full"}, SBH),
    ({"bytes_per_value": 4}, SBH * 88),                               # fp32 doubles everything
])
def test_activation_cases(kw, expected):
    assert activation_bytes_per_layer(S, B, H, A, **kw) == expected


def test_activations_are_linear_in_batch_and_quadratic_term_in_seq():
    one = activation_bytes_per_layer(S, 1, H, A)
    assert activation_bytes_per_layer(S, 8, H, A) == 8 * one
    # doubling s doubles the 34 term and quadruples the attention term
    assert activation_bytes_per_layer(2 * S, 1, H, A) == 2 * S * H * 34 + 4 * S * H * 10


def test_output_activations():
    assert output_activation_bytes(128, 8, 1024) == 4 * 128 * 8 * 1024
    assert output_activation_bytes(128, 8, 1024, tp=2, bytes_per_value=4) == 4 * 128 * 8 * 1024


def test_full_recompute_keeps_the_whole_layer_input_unless_sequence_parallel_splits_it_and_fp8_is_a_width():
    # full recompute keeps only the layer input, 2·s·b·h bytes = 2 * 128 * 8 * 256; tensor parallelism alone does
    # not split it (each tp rank holds the whole input), sequence parallelism does (/t)
    assert activation_bytes_per_layer(128, 8, 256, 4, tp=2, recompute="full") == 2 * 128 * 8 * 256
    assert activation_bytes_per_layer(128, 8, 256, 4, tp=2, recompute="full", sequence_parallel=True) == 128 * 8 * 256
    # 1-byte activations (fp8) are a width like any other: half of the 2-byte count, 128*8*256*(34+10)/2
    assert activation_bytes_per_layer(128, 8, 256, 4, bytes_per_value=1) == 128 * 8 * 256 * 44 // 2


def test_a_fractional_count_is_told_that_a_count_has_no_fraction():
    def msg(v):
        with pytest.raises(ValueError) as err:
            activation_bytes_per_layer(v, 1, 8, 2)
        return str(err.value)
    head = "activation_bytes_per_layer: seq_len={} is invalid; fix: pass a positive integer"
    assert msg(8.5) == head.format("8.5") + " (a count has no fraction)"
    # not said where the value is no finite number or no float at all
    assert msg(float("nan")) == head.format("nan")
    assert msg(float("inf")) == head.format("inf")
    assert msg("8") == head.format("'8'")


def test_activation_sequence_parallel_divides_by_tp_only_when_on():
    off = memory_activations.activation_bytes_per_layer(128, 8, 256, 4, tp=2)
    on = memory_activations.activation_bytes_per_layer(128, 8, 256, 4, tp=2, sequence_parallel=True)
    assert on < off and memory_activations.activation_bytes_per_layer(128, 8, 256, 4, tp=1, sequence_parallel=True) == \
        memory_activations.activation_bytes_per_layer(128, 8, 256, 4)


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


def test_doctests():
    tries, failures = module_doctests(memory_activations)
    assert tries >= 2 and failures == 0
