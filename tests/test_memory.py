"""mshelpers.memory: the estimator (the doctor's memory model for a config) on hand-worked cases, its bookkeeping and
errors, one pipeline stage, the budget helpers, and mindformers' published YAMLs. The formulas' own tests:
test_memory_states.py, test_memory_activations.py, test_memory_fit.py; both sides of the one model:
test_memory_one_model.py."""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from _checks import module_doctests
from mshelpers import doctor as D
from mshelpers import memory
from mshelpers.config import RunConfig
from mshelpers.memory import (activation_bytes_per_layer, calibrate, estimate, estimate_from_mindformers_yaml,
                              estimate_stage, fits, llama_param_count, max_batch_for_budget,
                              model_state_bytes, output_activation_bytes)

MINI = RunConfig.preset("mini")
S, B, H, A = 128, 8, 256, 4
SBH = S * B * H            # one 16-bit activation of the layer's width, per layer (Korthikanti et al. 2022)


# ---------------------------------------------------------------- estimate
def test_estimate_mini_fp32_by_hand():
    e = estimate(MINI)
    n = 3_688_704
    assert (e["n_params"], e["params"], e["grads"], e["optimizer_states"]) == (n, 4 * n, 4 * n, 8 * n)
    # mindformers' LLaMA block (the doctor's count), r = 688/256: 8 + 4 + 4 + 8r + 5as/h = 47.5 sbh at 2 bytes
    per_layer = SBH * 95                         # fp32: 4 bytes per value
    assert e["activations_per_layer"] == per_layer
    assert e["output_activations"] == 8 * 128 * 8 * 1024
    assert e["activations"] == 4 * per_layer + 8 * 128 * 8 * 1024
    assert e["total"] == 16 * n + e["activations"] == 167_022_592
    assert e["grad_accum_buffer"] == 0 and e["host_optimizer_states"] == 0
    # attention scores b·a·s²·4 = 2 MiB < logits s·b·V·4 = 4 MiB
    assert e["largest_activation"] == 128 * 8 * 1024 * 4


def test_estimate_half_precision_uses_mixed_adam_and_two_byte_activations():
    e = estimate(MINI.replace(compute_dtype="float16"))
    assert e["params"] == 2 * 3_688_704 and e["optimizer_states"] == 12 * 3_688_704
    assert e["activations_per_layer"] == SBH * 47.5


def test_estimate_data_parallel_splits_the_batch_and_zero_shards_states():
    one = estimate(MINI)
    two = estimate(MINI, n_devices=2, zero_stage=1)
    assert two["activations_per_layer"] * 2 == one["activations_per_layer"]
    assert two["optimizer_states"] * 2 == one["optimizer_states"]
    assert two["params"] == one["params"]


def test_estimate_layout_object_tp_and_pipeline():
    lay = SimpleNamespace(dp=1, mp=2, pp=2, micro_batches=4)
    first, last = estimate_stage(MINI, 0, layout=lay), estimate_stage(MINI, 1, layout=lay)
    layer = 4 * 256 ** 2 + 3 * 256 * 688 + 2 * 256           # q, k, v, o; w1, w2, w3; two RMSNorms
    # the doctor's placement: two layers / tp on each stage, the embedding whole (vocab_emb_dp) on the first,
    # the lm_head / tp and the final norm on the last
    assert first["params"] == 4 * (2 * layer // 2 + 1024 * 256)
    assert last["params"] == 4 * (2 * layer // 2 + 1024 * 256 // 2 + 256)
    b = MINI.batch_size // 4                               # micro-batch 2
    per_layer = activation_bytes_per_layer(128, b, 256, 4, tp=2, bytes_per_value=4, arch="llama",
                                           ffn_hidden_size=688)
    assert first["activations_per_layer"] == per_layer
    # 1F1B: min(pp - i, m) micro-batches in flight on stage i; the logits on the last stage only
    assert first["activations"] == per_layer * 2 * 2 and first["output_activations"] == 0
    assert last["activations"] == per_layer * 2 + output_activation_bytes(128, b, 1024, tp=2, bytes_per_value=4)
    e = estimate(MINI, layout=lay)
    assert e == max(first, last, key=lambda x: x["total"]) and e["per_stage_totals"] == [first["total"], last["total"]]
    # a layout spelled with tp instead of mp works too
    assert estimate(MINI, layout=SimpleNamespace(dp=1, tp=2, pp=2, micro_batches=4)) == e


def test_estimate_grad_accum_offload_and_overhead():
    acc = estimate(MINI.replace(grad_accum=2))
    # the cookbook's loop sums micro-steps into a buffer of its own: a second gradient-sized copy, in grads
    assert acc["grad_accum_buffer"] == acc["grads"] // 2 == 4 * 3_688_704
    assert estimate(MINI.replace(grad_accum=2), grad_accum_buffer=False)["grads"] == acc["grads"] // 2
    off = estimate(MINI, offload_optimizer=True)
    assert off["optimizer_states"] == 0 and off["host_optimizer_states"] == 8 * 3_688_704
    assert estimate(MINI)["total"] - off["total"] == 8 * 3_688_704
    assert estimate(MINI, overhead_bytes=10**6)["total"] == estimate(MINI)["total"] + 10**6


def test_recompute_adds_one_layer_working_set():
    full = estimate(MINI.replace(recompute="full"))
    one_layer = SBH * 95                         # the llama layer, fp32
    assert full["activations_per_layer"] == SBH * 2 * 2
    assert full["recompute_working_set"] == one_layer - SBH * 4
    assert full["activations"] == 4 * SBH * 4 + (one_layer - SBH * 4) + full["output_activations"]
    assert estimate(MINI)["recompute_working_set"] == 0


def test_activation_scale_and_calibrate_round_trip():
    cfgs = [MINI.replace(batch_size=b, seq_len=s) for b, s in ((2, 128), (4, 128), (8, 64), (4, 256))]
    ests = [estimate(c) for c in cfgs]
    states = lambda e: e["params"] + e["grads"] + e["optimizer_states"]
    measured = [700e6 + states(e) + 2.5 * e["activations"] for e in ests]
    cal = calibrate(ests, measured)
    assert cal["activation_scale"] == pytest.approx(2.5) and cal["overhead_bytes"] == pytest.approx(700e6, abs=2)
    e = estimate(cfgs[0], **cal)
    assert e["total"] == pytest.approx(measured[0], abs=8)
    assert e["activations"] == pytest.approx(2.5 * ests[0]["activations"], abs=1)
    # with the overhead known, one run fixes the scale
    one = calibrate(ests[:1], measured[:1], overhead_bytes=700e6)
    assert one == {"activation_scale": pytest.approx(2.5), "overhead_bytes": 700e6}


def test_recompute_order():
    totals = [estimate(MINI.replace(recompute=r))["total"] for r in ("none", "selective", "full")]
    assert totals[0] > totals[1] > totals[2]


# ---------------------------------------------------------------- budget
def test_fits_and_max_batch_at_exact_budget():
    budget = estimate(MINI)["total"]
    assert fits(MINI, budget) and not fits(MINI, budget - 1)
    assert max_batch_for_budget(MINI, budget) == 8
    assert max_batch_for_budget(MINI, budget - 1) == 7
    # dp=2: batches come in multiples of 2
    b2 = estimate(MINI, n_devices=2)["total"]
    assert max_batch_for_budget(MINI, b2, n_devices=2) == 8
    assert max_batch_for_budget(MINI, b2 - 1, n_devices=2) == 6


def test_max_batch_zero_when_states_do_not_fit_and_recompute_helps():
    assert max_batch_for_budget(MINI, 1000) == 0
    gib = 2**30
    assert max_batch_for_budget(MINI.replace(recompute="full"), gib) > max_batch_for_budget(MINI, gib) > 8
    assert max_batch_for_budget(MINI, gib, overhead_bytes=gib // 2) < max_batch_for_budget(MINI, gib)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("call,field", [
    (lambda: model_state_bytes(-1), "n_params=-1"),
    (lambda: model_state_bytes(10, zero_stage=4), "zero_stage=4"),
    (lambda: model_state_bytes(10, dp=0), "dp=0"),
    (lambda: model_state_bytes(10, accounting="bf16"), "accounting='bf16'"),
    (lambda: activation_bytes_per_layer(0, 1, 8, 2), "seq_len=0"),
    (lambda: activation_bytes_per_layer(8, 1, 8, 2, recompute="some"), "recompute='some'"),
    (lambda: activation_bytes_per_layer(8, 1, 8, 2, bytes_per_value=0), "bytes_per_value=0"),
    (lambda: estimate({"hidden_size": 8}), "cfg lacks num_layers, num_heads, vocab_size, seq_len, batch_size"),
    (lambda: estimate(MINI.replace(batch_size=0)), "batch_size=0"),
    (lambda: estimate(MINI, n_devices=3), "batch_size=8"),
    (lambda: estimate(MINI.replace(mp=2), n_devices=3), "n_devices=3"),
    (lambda: estimate(MINI.replace(dp=2), n_devices=4), "cfg.dp=2"),
    (lambda: estimate(MINI, layout=SimpleNamespace(dp=2)), "layout="),
    (lambda: estimate(MINI, layout=SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=1), n_devices=4), "n_devices=4"),
    (lambda: estimate(MINI, overhead_bytes=-5), "overhead_bytes=-5"),
    (lambda: estimate(MINI, activation_scale=0), "activation_scale=0"),
    # a bool is not a byte count or a scale, and a string is refused in one line, not compared into a TypeError
    (lambda: estimate(MINI, overhead_bytes=True), "overhead_bytes=True"),
    (lambda: estimate(MINI, overhead_bytes="1"), "overhead_bytes='1'"),
    (lambda: estimate(MINI, activation_scale=True), "activation_scale=True"),
    (lambda: estimate(MINI, activation_scale="2"), "activation_scale='2'"),
    (lambda: calibrate([estimate(MINI)], [1e9]), "1 estimates"),
    (lambda: calibrate([estimate(MINI)], [1e6], overhead_bytes=1e9), "overhead_bytes=1000000000.0"),
    (lambda: calibrate([estimate(MINI)] * 2, [1e9, 2e9]), "same activation"),
    (lambda: fits(MINI, -1), "budget_bytes=-1"),
    (lambda: max_batch_for_budget(MINI, "16GB"), "budget_bytes='16GB'"),
    (lambda: llama_param_count(SimpleNamespace(hidden_size=0)), "hidden_size=0"),
])
def test_bad_input_raises_one_clear_value_error(call, field):
    with pytest.raises(ValueError) as err:
        call()
    msg = str(err.value)
    assert field in msg and "fix" in msg.lower() or "RunConfig." in msg and field in msg


def test_doctests():
    tries, failures = module_doctests(memory)
    assert tries > 10 and failures == 0


# ---------------------------------------------------------------- exact values (mutation survivors)
def test_human_bytes_at_every_unit_and_edge():
    cases = {0: "0 B", 1023: "1023 B", 1024: "1.00 KiB", 1536: "1.50 KiB", 1024**2 - 1: "1024.00 KiB",
             1536 * 1024: "1.50 MiB", 3 * 2**29: "1.50 GiB", 2**40: "1.00 TiB", 2**50: "1024.00 TiB",
             -2048: "-2.00 KiB", 2.5 * 2**40: "2.50 TiB"}
    assert {n: memory.human_bytes(n) for n in cases} == cases


@pytest.mark.parametrize("fn", ["fits", "max_batch_for_budget"])
def test_budget_helpers_name_themselves_in_their_refusals(fn):
    f = getattr(memory, fn)
    mini = RunConfig.preset("mini")
    with pytest.raises(ValueError) as err:
        f(mini, -1)
    assert str(err.value).startswith(f"{fn}: budget_bytes=-1 is invalid; fix: pass a positive number of bytes")
    with pytest.raises(ValueError) as err:
        f(None, 2**30)
    assert str(err.value).startswith(f"{fn}: cfg=None is not a config; fix:")
    with pytest.raises(ValueError) as err:
        f({"hidden_size": 64}, 2**30)
    assert str(err.value).startswith(f"{fn}: cfg lacks ")


def _brute_max_batch(cfg, budget, unit, limit, **kw):
    best, k = 0, 1
    while k * unit <= limit and estimate(cfg.replace(batch_size=k * unit), **kw)["total"] <= budget:
        best, k = k * unit, k + 1
    return best


def test_max_batch_for_budget_matches_a_linear_scan_and_respects_the_unit_and_limit():
    mini = RunConfig.preset("mini")
    one = estimate(mini.replace(batch_size=1))["total"]
    per_seq = estimate(mini.replace(batch_size=2))["total"] - one
    for budget in (one, one + per_seq - 1, one + per_seq, one + 37.5 * per_seq, one + 100 * per_seq):
        r = max_batch_for_budget(mini, budget)
        assert r == _brute_max_batch(mini, budget, 1, 1 << 20) and type(r) is int, budget
    assert max_batch_for_budget(mini, one - 1) == 0
    assert max_batch_for_budget(mini, one) == 1
    # a layout object sets the unit dp * micro_batches (here 2 * 2 = 4)
    lay = SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=2)
    budget = estimate(mini.replace(batch_size=4 * 9), layout=lay)["total"]
    r = max_batch_for_budget(mini, budget, layout=lay)
    assert r == _brute_max_batch(mini, budget, 4, 1 << 20, layout=lay) == 36 and type(r) is int
    # the limit, in sequences, with unit 1 and unit 4
    assert max_batch_for_budget(mini, 2**60, limit=64) == 64
    assert max_batch_for_budget(mini, 2**60, limit=102, layout=lay) == 100
    with pytest.raises(ValueError, match="zero_stage"):
        max_batch_for_budget(mini, 2**30, zero_stage=7)


def test_a_budget_must_be_a_positive_finite_number():
    mini = RunConfig.preset("mini")
    assert memory.fits(mini, 0.5) is False                         # tiny, but a budget
    for bad in (0, -1, float("inf"), True, "16GB"):
        with pytest.raises(ValueError) as err:
            memory.fits(mini, bad)
        assert str(err.value) == (f"fits: budget_bytes={bad!r} is invalid; fix: pass a positive number of bytes, "
                                  "e.g. 16 * 2**30 for 16 GiB")


def test_layout_and_device_degrees_and_their_refusals():
    N = SimpleNamespace
    mini = RunConfig.preset("mini")

    def msg(cfg=mini, **kw):
        with pytest.raises(ValueError) as err:
            estimate(cfg, **kw)
        return str(err.value)
    lay = lambda **kw: N(**{"dp": 1, "mp": 1, "pp": 1, "micro_batches": 1, **kw})
    # mp, or tp when the object calls it that
    tp2 = estimate(mini, layout=N(dp=1, tp=2, pp=1, micro_batches=1))
    assert tp2 == estimate(mini, layout=lay(mp=2)) != estimate(mini, layout=lay())
    assert estimate(mini, layout=lay(dp=2, mp=2, pp=2, micro_batches=2), n_devices=8) == \
        estimate(mini, layout=lay(dp=2, mp=2, pp=2, micro_batches=2))
    assert msg(layout=N(dp=1, mp=1, pp=1)) == (
        "estimate: layout=namespace(dp=1, mp=1, pp=1) lacks 'types.SimpleNamespace' object has no attribute "
        "'micro_batches'; fix: pass an object with dp, mp (or tp), pp and micro_batches attributes")
    for name in ("dp", "mp", "pp", "micro_batches"):
        assert msg(layout=lay(**{name: 0})).startswith(f"estimate: layout.{name}=0 is invalid; fix: pass a positive")
    assert msg(layout=lay(dp=2, mp=1, pp=2), n_devices=5) == (
        "estimate: n_devices=5 does not match layout dp*mp*pp = 2*1*2 = 4; fix: pass n_devices=4 or omit it")
    # from the config: dp = n_devices / (mp * pp)
    c = mini.replace(mp=2, pp=2)
    assert estimate(c, n_devices=8) == estimate(c, layout=lay(dp=2, mp=2, pp=2))
    assert msg(c, n_devices=6) == ("estimate: n_devices=6 is not divisible by cfg.mp*cfg.pp = 4; "
                                   "fix: use a multiple of 4")
    assert msg(mini.replace(dp=3, mp=2, pp=2, batch_size=6), n_devices=8) == (
        "estimate: n_devices=8 gives dp=2 but cfg.dp=3; fix: pass n_devices=12 or set cfg.dp=1")
    assert estimate(mini, layout=lay(pp=4))["layers"] == 1                 # pp = num_layers is allowed
    for pp in (3, 8):
        assert msg(layout=lay(pp=pp)) == f"estimate: pp={pp} must divide num_layers=4; fix: pick a divisor"


# ---------------------------------------------------------------- every refusal, by its exact line
_POS = "is invalid; fix: pass a positive integer"
_CFG = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 100, "seq_len": 8, "batch_size": 2}
_REFUSALS = [
    *[(memory.activation_bytes_per_layer, (*[0 if i == j else v for j, v in enumerate((128, 8, 256, 4))],), {},
       f"activation_bytes_per_layer: {n}=0 {_POS}") for i, n in enumerate(("seq_len", "batch", "hidden_size",
                                                                             "n_heads"))],
    (memory.activation_bytes_per_layer, (128, 8, 256, 4), {"tp": 0}, f"activation_bytes_per_layer: tp=0 {_POS}"),
    *[(memory.activation_bytes_per_layer, (128, 8, 256, 4), {"bytes_per_value": b},
       f"activation_bytes_per_layer: bytes_per_value={b!r} is invalid; fix: pass the activation width in bytes "
       "(2 for fp16/bf16, 4 for fp32)") for b in (0, -2, True, "2")],
    (memory.activation_bytes_per_layer, (128, 8, 256, 4), {"num_kv_heads": 0},
     f"activation_bytes_per_layer: num_kv_heads=0 {_POS}"),
    (memory.activation_bytes_per_layer, (128, 8, 256, 4), {"num_kv_heads": 3},
     "activation_bytes_per_layer: num_kv_heads=3 must divide n_heads=4; fix: pass a divisor of n_heads "
     "(None = multi-head attention)"),
    (memory.activation_bytes_per_layer, (128, 8, 256, 4), {"arch": "llama"},
     "activation_bytes_per_layer: ffn_hidden_size=None with arch='llama'; fix: pass the SwiGLU width, "
     "e.g. 11008 for LLaMA-2 7B"),
    (memory.activation_bytes_per_layer, (128, 8, 256, 4), {"ffn_hidden_size": 0},
     f"activation_bytes_per_layer: ffn_hidden_size=0 {_POS}"),
    (memory.estimate_stage, (_CFG, 1), {}, "estimate_stage: stage=1 is invalid; fix: pass a stage index, "
                                          "0 <= stage < pp = 1"),
    *[(memory.estimate_stage, (_CFG,), {n: -1}, f"estimate_stage: {n}=-1 is invalid; fix: pass a non-negative "
       "integer") for n in ("full_recompute_layers", "select_recompute_layers")],
    (memory.estimate_stage, (_CFG,), {"overhead_bytes": -1},
     "estimate_stage: overhead_bytes=-1 is invalid; fix: pass a number >= 0"),
    (memory.estimate, (_CFG,), {"zero_stage": 1, "parallel_optimizer": True},
     "estimate: parallel_optimizer=True with zero_stage=1; fix: pick one (MindSpore's parallel optimizer slices "
     "params and states, like ZeRO-1 plus the params)"),
    (memory.estimate, (_CFG,), {"arch": "t5"}, "estimate: arch='t5' is unknown; fix: use one of ('gpt', 'llama')"),
    (memory.estimate, (_CFG,), {"num_kv_heads": 3},
     "estimate: num_kv_heads=3 must divide num_heads=4; fix: pass a divisor of num_heads (None = multi-head "
     "attention)"),
    (memory.estimate, (_CFG,), {"overhead_bytes": -1}, "estimate: overhead_bytes=-1 is invalid; fix: pass a number >= 0"),
    (memory.estimate, (_CFG,), {"activation_scale": 0},
     "estimate: activation_scale=0 is invalid; fix: pass a positive number (1.0 = the formulas as published)"),
    (memory.estimate, (_CFG,), {"n_devices": 0}, f"estimate: n_devices=0 {_POS}"),
    (memory.estimate, (_CFG,), {"n_params": 0}, f"estimate: n_params=0 {_POS}"),
    (memory.estimate, ({**_CFG, "batch_size": 6},), {"layout": SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=2)},
     "estimate: cfg.batch_size=6 is not divisible by dp*micro_batches = 2*2; fix: use a batch_size that is a "
     "multiple of 4"),
    (memory.estimate, ("x",), {}, "estimate: cfg='x' is not a config; fix: pass a RunConfig, a dict or an object "
                                  "with fields hidden_size, num_layers, num_heads, vocab_size, seq_len, batch_size"),
    (memory.estimate, ({"hidden_size": 64, "num_layers": 2},), {},
     "estimate: cfg lacks num_heads, vocab_size, seq_len, batch_size; fix: give them as attributes or dict keys "
     "(parallel fields dp, mp, pp, micro_batches, grad_accum default to 1)"),
    (memory.estimate, ({k: v for k, v in _CFG.items() if k != "batch_size"},), {},
     "estimate: cfg lacks batch_size; fix: give it as attributes or dict keys (parallel fields dp, mp, pp, "
     "micro_batches, grad_accum default to 1)"),
    (memory.estimate, ({**_CFG, "recompute": "x"},), {},
     "estimate: cfg.recompute='x' is invalid; fix: one of ('none', 'selective', 'full')"),
    (memory.estimate, ({**_CFG, "hidden_size": 0},), {}, f"estimate: cfg.hidden_size=0 {_POS}"),
    (memory.estimate, (SimpleNamespace(**{**_CFG, "dp": 0}),), {}, f"estimate: cfg.dp=0 {_POS}"),
]
_TPC = "transformer_param_count"
_REFUSALS += [
    (memory.transformer_param_count, ({"hidden_size": 64},), {},
     f"{_TPC}: cfg lacks num_layers, vocab_size; fix: give them as attributes or dict keys (parallel fields dp, mp, "
     "pp, micro_batches, grad_accum default to 1)"),
    (memory.transformer_param_count, (_CFG,), {"mlp": "x"}, f"{_TPC}: mlp='x' is invalid; fix: one of ('swiglu', 'gelu')"),
    (memory.transformer_param_count, (_CFG,), {"norm": "x"}, f"{_TPC}: norm='x' is invalid; fix: one of ('rms', 'layer')"),
    (memory.transformer_param_count, (_CFG,), {"learned_positions": -1},
     f"{_TPC}: learned_positions=-1 is invalid; fix: pass a non-negative integer"),
    (memory.transformer_param_count, (_CFG,), {"num_kv_heads": 0}, f"{_TPC}: num_kv_heads=0 {_POS}"),
    (memory.transformer_param_count, ({"hidden_size": 64, "num_layers": 2, "vocab_size": 100},), {"num_kv_heads": 2},
     f"{_TPC}: num_kv_heads=2 needs cfg.num_heads; fix: add num_heads to cfg"),
    (memory.estimate, (_CFG,), {"mlp": "x"}, "estimate: mlp='x' is invalid; fix: one of ('swiglu', 'gelu')"),
    (memory.estimate, (_CFG,), {"num_kv_heads": 0}, f"estimate: num_kv_heads=0 {_POS}"),
    # a yes/no keyword: bool('yes') and bool(3) are True, so anything but a bool (or 0/1) is refused, not read
    (memory.estimate, (_CFG,), {"qkv_bias": "yes"}, "estimate: qkv_bias='yes' is invalid; fix: pass True or False"),
    (memory.estimate, (_CFG,), {"vocab_emb_dp": 3}, "estimate: vocab_emb_dp=3 is invalid; fix: pass True or False"),
    (memory.estimate, (_CFG,), {"flash_attention": "no"},
     "estimate: flash_attention='no' is invalid; fix: pass True or False"),
    (memory.estimate, (_CFG,), {"parallel_optimizer": None},
     "estimate: parallel_optimizer=None is invalid; fix: pass True or False"),
    (memory.estimate_stage, (_CFG,), {"shard_grad_accum": 2.0},
     "estimate_stage: shard_grad_accum=2.0 is invalid; fix: pass True or False"),
    (memory.estimate, (_CFG,), {"grad_accum_buffer": "x"},
     "estimate: grad_accum_buffer='x' is invalid; fix: pass True or False (or None for the default)"),
    (memory.doctor_config, (_CFG,), {"sequence_parallel": 2},
     "doctor_config: sequence_parallel=2 is invalid; fix: pass True or False (or None for the default)"),
    # each refusal names the function the user called (model_state_bytes sums model_state_breakdown)
    (memory.model_state_breakdown, (0,), {}, f"model_state_breakdown: n_params=0 {_POS}"),
    (memory.model_state_bytes, (10,), {"dp": 0}, f"model_state_bytes: dp=0 {_POS}"),
    (memory.model_state_breakdown, (10,), {"zero_stage": 4},
     "model_state_breakdown: zero_stage=4 is invalid; fix: use one of (0, 1, 2, 3)"),
    (memory.estimate_stage, (_CFG,), {"zero_stage": 9}, "estimate_stage: zero_stage=9 is invalid; fix: use one of "
                                                        "(0, 1, 2, 3)"),
    # a tuple of bytes per parameter: whole numbers >= 0, not a float, a bool or a negative
    *[(memory.model_state_breakdown, (10,), {"accounting": acc}, f"model_state_breakdown: accounting={acc!r} is "
       "unknown; fix: use one of ['fp32', 'fp32_grads', 'fp32_states', 'mixed'] or a (params, grads, states) tuple "
       "of bytes per parameter") for acc in ((2, 2, 4.5), (2, 2, True), (2, 2, -1))],
    *[(memory.output_activation_bytes, (), {**dict(seq_len=8, batch=1, vocab_size=50, tp=1), n: 0},
       f"output_activation_bytes: {n}=0 {_POS}") for n in ("seq_len", "batch", "vocab_size", "tp")],
]


@pytest.mark.parametrize("fn, args, kw, line", _REFUSALS, ids=lambda x: getattr(x, "__name__", None))
def test_each_refusal_is_its_exact_line(fn, args, kw, line):
    with pytest.raises(ValueError) as err:
        fn(*args, **kw)
    assert str(err.value) == line


def test_yes_no_keywords_take_bools_numpy_bools_and_yaml_zero_one():
    import numpy as np
    base = memory.estimate(_CFG, qkv_bias=True, vocab_emb_dp=False)
    assert memory.estimate(_CFG, qkv_bias=np.bool_(True), vocab_emb_dp=0) == base
    assert memory.estimate(_CFG, qkv_bias=1, vocab_emb_dp=np.False_) == base
    assert memory.estimate(_CFG, grad_accum_buffer=None) == memory.estimate(_CFG)


def test_estimate_stage_edges_its_defaults_and_sums_leave_out():
    c = {**_CFG, "num_layers": 4}
    # ZeRO is off by default: over dp = 2 the optimizer states stay whole
    assert memory.estimate_stage(c, n_devices=2) == memory.estimate_stage(c, n_devices=2, zero_stage=0)
    # full recompute named alone leaves no layer selective
    assert memory.estimate_stage(c, full_recompute_layers=1)["select_recompute_layers"] == 0
    # one selective layer of four: the per-layer figure is the most common mode's (none), not the last-named one's
    one_sel = memory.estimate_stage(c, select_recompute_layers=1)
    assert one_sel["activations_per_layer"] == activation_bytes_per_layer(8, 2, 64, 4, recompute="none", arch="llama",
                                                                          ffn_hidden_size=256, bytes_per_value=4)
    # with flash attention and off the last stage nothing s²- or vocabulary-sized is ever held
    assert memory.estimate_stage(c, flash_attention=True, layout=SimpleNamespace(dp=1, mp=1, pp=2, micro_batches=1))[
        "largest_activation"] == 0
    # the logits of a vocabulary that tp does not divide: each rank holds ceil(101 / 2) = 51 columns, 8 * 2 * 51 * 4
    assert memory.estimate_stage({**c, "vocab_size": 101}, flash_attention=True, layout=SimpleNamespace(
        dp=1, mp=2, pp=1, micro_batches=1))["largest_activation"] == 8 * 2 * 51 * 4


def test_estimate_stage_defaults_and_what_each_switch_changes():
    base = memory.estimate_stage(_CFG)
    assert base == memory.estimate(_CFG) == memory.estimate_stage(_CFG, 0, offload_optimizer=False,
                                                                  activation_scale=1.0, overhead_bytes=0)
    explicit = memory.estimate_stage(_CFG, arch="llama", sequence_parallel=False, flash_attention=False,
                                     accounting="fp32", zero_stage=0, parallel_optimizer=False,
                                     grad_accum_buffer=False, shard_grad_accum=False)
    assert base == explicit
    assert base["full_recompute_layers"] == 0 and base["select_recompute_layers"] == 0
    two = SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=1)
    assert memory.estimate_stage(_CFG, layout=two, zero_stage=1)["optimizer_states"] * 2 == base["optimizer_states"]
    tp2 = SimpleNamespace(dp=1, mp=2, pp=1, micro_batches=1)
    assert memory.estimate_stage(_CFG, layout=tp2, sequence_parallel=True)["activations"] < \
        memory.estimate_stage(_CFG, layout=tp2)["activations"]
    assert memory.estimate_stage(_CFG, flash_attention=True)["activations"] < base["activations"]
    assert memory.estimate_stage(_CFG, layout=two, parallel_optimizer=True)["total"] < \
        memory.estimate_stage(_CFG, layout=two)["total"]
    acc = {**_CFG, "grad_accum": 2}
    po = dict(layout=SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=1), parallel_optimizer=True)
    g = 4 * memory.transformer_param_count(_CFG)
    assert memory.estimate_stage(acc, **po, shard_grad_accum=True)["grad_accum_buffer"] == g // 2
    assert memory.estimate_stage(acc, **po)["grad_accum_buffer"] == g
    # ZeRO-2 has sharded the gradients already: the buffer is sliced as they are, not a second time
    z2 = dict(layout=SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=1), zero_stage=2)
    assert memory.estimate_stage(acc, **z2, shard_grad_accum=True)["grad_accum_buffer"] == \
        memory.estimate_stage(acc, **z2)["grad_accum_buffer"] == g // 2
    # whole bytes where heads or the vocabulary do not divide over tp
    odd = dict(_CFG, num_heads=3, hidden_size=15, vocab_size=51, batch_size=3, grad_accum=2)
    e = memory.estimate_stage(odd, layout=SimpleNamespace(dp=3, mp=2, pp=1, micro_batches=1), parallel_optimizer=True,
                              shard_grad_accum=True)
    assert all(type(v) is int for k, v in e.items() if k != "per_stage_totals"), e


def test_estimate_reads_every_field_and_passes_every_switch():
    base = estimate(_CFG)
    assert estimate({**_CFG, "num_kv_heads": 2})["n_params"] < base["n_params"]
    assert estimate(_CFG, num_kv_heads=2) == estimate({**_CFG, "num_kv_heads": 2})
    for kw in ({"mlp": "gelu"}, {"tie_word_embeddings": True}, {"bias": True}, {"norm": "layer"}):
        assert estimate(_CFG, **kw)["n_params"] != base["n_params"], kw
    assert estimate(_CFG, n_params=10**6)["n_params"] == 10**6 and estimate(_CFG, n_params=10**6)["params"] == 4 * 10**6   # float32 by default
    lay = SimpleNamespace(dp=1, mp=2, pp=1, micro_batches=1, sequence_parallel=True)
    assert estimate(_CFG, layout=lay)["activations"] < estimate(_CFG, layout=SimpleNamespace(**{
        **lay.__dict__, "sequence_parallel": False}))["activations"]
    assert estimate(_CFG, layout=lay, sequence_parallel=False)["activations"] > estimate(_CFG, layout=lay)["activations"]
    assert estimate(_CFG, full_recompute_layers=1)["full_recompute_layers"] == 1
    assert estimate(_CFG, select_recompute_layers=2)["select_recompute_layers"] == 2
    acc = {**_CFG, "batch_size": 4, "grad_accum": 2}
    assert estimate(acc, n_devices=2, zero_stage=1, shard_grad_accum=True)["grad_accum_buffer"] < \
        estimate(acc, n_devices=2, zero_stage=1)["grad_accum_buffer"]
    assert estimate(_CFG, arch="llama")["activations"] == estimate({**_CFG, "ffn_hidden_size": 256}, arch="llama")[
        "activations"]                                                          # llama without ffn: 4h
    # at the same width a llama layer keeps more than a gpt one: 8 + (4 + 4g + 8r)/t against 10 + (4 + 4g + 4r)/t
    assert estimate(_CFG, arch="llama")["activations"] > estimate(_CFG, arch="gpt")["activations"]
    odd = {**_CFG, "num_heads": 3, "hidden_size": 63, "vocab_size": 101, "num_layers": 3}
    e = estimate(odd, layout=SimpleNamespace(dp=1, mp=2, pp=3, micro_batches=1))
    assert e["layers"] == 1 and all(type(e[k]) is int for k in ("params", "grads", "activations", "total"))
    assert estimate({**_CFG, "batch_size": 4}, n_devices=2)["activations"] == estimate({**_CFG, "batch_size": 2})[
        "activations"]                                                          # 2 sequences per dp rank


def test_a_config_is_read_by_every_name_it_goes_by():
    hf = {"n_embd": 64, "n_layer": 2, "n_head": 4, "padded_vocab_size": 100, "n_positions": 8, "batch_size": 2,
          "n_inner": 256, "num_key_value_heads": 4}
    assert estimate(hf) == estimate({**_CFG, "ffn_hidden_size": 256, "num_kv_heads": 4})
    obj = SimpleNamespace(d_model=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100, seq_length=8,
                          batch_size=2)
    assert estimate(obj) == estimate(_CFG)
    # a Hugging Face GPT-style config names its MLP by the activation; an explicit mlp wins
    assert estimate({**_CFG, "hidden_act": "gelu_new"}) == estimate({**_CFG, "mlp": "gelu"}) != estimate(_CFG)
    assert estimate({**_CFG, "hidden_act": "gelu", "mlp": "swiglu"}) == estimate(_CFG)
    assert estimate({**_CFG, "hidden_act": "silu"}) == estimate(_CFG)
    # a RunConfig checks itself first: its own message, not ours
    with pytest.raises(ValueError, match="RunConfig"):
        estimate(RunConfig.preset("mini").replace(batch_size=0))


def test_param_counts_take_the_config_unless_told_otherwise_and_estimate_keeps_the_whole_model():
    tpc = memory.transformer_param_count
    assert tpc({**_CFG, "tie_word_embeddings": True}) < tpc(_CFG)
    assert tpc({**_CFG, "tie_word_embeddings": True}, tie_word_embeddings=False) == tpc(_CFG)
    assert tpc({**_CFG, "bias": True}) > tpc(_CFG) and tpc({**_CFG, "bias": True}, bias=False) == tpc(_CFG)
    odd = {**_CFG, "hidden_size": 63, "num_heads": 4, "num_kv_heads": 2}        # head size 15 (floor)
    assert tpc(odd) == 2 * 100 * 63 + 2 * (2 * 63 * 63 + 2 * 63 * 30 + 3 * 63 * 252 + 2 * 63) + 63
    assert type(tpc(odd)) is int
    assert estimate(_CFG, n_devices=2) == estimate(_CFG, n_devices=2, zero_stage=0)   # no ZeRO unless asked
    assert estimate(_CFG, n_devices=2, zero_stage=1)["optimizer_states"] < estimate(_CFG, n_devices=2)[
        "optimizer_states"]
    # the whole model's count, even where tp and pp split it
    lay = SimpleNamespace(dp=1, mp=2, pp=2, micro_batches=1)
    assert estimate(_CFG, layout=lay)["n_params"] == estimate(_CFG)["n_params"] == llama_param_count(_CFG)
    assert estimate(_CFG, layout=lay, n_params=10**6)["n_params"] == 10**6
    e = estimate({**_CFG, "batch_size": 4}, layout=lay)
    assert type(e["layers"]) is int and e["layers"] == 1 and all(type(e[k]) is int for k in e if k != "per_stage_totals")
    # GQA shrinks the llama activations too (k and v at kv heads)
    assert estimate(_CFG, arch="llama", num_kv_heads=2)["activations"] < estimate(_CFG, arch="llama")["activations"]
    for act in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        assert estimate({**_CFG, "hidden_act": act}) == estimate({**_CFG, "mlp": "gelu"}), act


# ---------------------------------------------------------------- the doctor's pricing terms and mindformers' published YAMLs
# mshelpers.memory against what real configs use: the terms the config doctor prices every layer with, worked
# by hand, and mindformers' published Llama 2 pre-training YAMLs (tests/data/mindformers/, each with a header naming
# its repository, path and commit) priced by `estimate_from_mindformers_yaml`, the doctor's price (one reader, one
# cost model: tests/doctor/test_one_price.py), against their max_device_memory.
#
# Units: s·b·h ("sbh") is one 16-bit activation of the layer's width counted at 2 bytes per
# value, as in Korthikanti et al. 2022; all counts below are per layer, in multiples of sbh.
DATA = Path(__file__).parent / "data" / "mindformers"
CFG_7B = DATA / "pretrain_llama2_7b.yaml"
CFG_13B = DATA / "pretrain_llama2_13b.yaml"
CFG_70B = DATA / "pretrain_llama2_70b_bf16_32p.yaml"
GIB = 2**30


def load(path: Path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------- activation terms
# ---------------------------------------------------------------- model-state terms
# ---------------------------------------------------------------- one stage
MINI_FLASH = dict(flash_attention=True, layout=SimpleNamespace(dp=1, mp=1, pp=2, micro_batches=1))   # (stage 0: no logits)


def stage(cfg=None, **kw):
    return estimate_stage(cfg or MINI.replace(num_layers=8, compute_dtype="float16"), 0, **{**MINI_FLASH, **kw})


def test_stage_grad_accum_buffer_is_gradient_sized_and_can_be_sliced():
    assert stage()["grad_accum_buffer"] == 0
    c = MINI.replace(num_layers=8, compute_dtype="float16", grad_accum=2)
    e = stage(c, accounting="fp32_states")
    assert e["grad_accum_buffer"] == e["grads"] // 2 == 2 * e["params"] // 2
    assert e["total"] == e["params"] + 2 * e["grad_accum_buffer"] + e["optimizer_states"] + e["activations"]
    # mindformers' gradient_accumulation_shard: the buffer is sliced over dp (with the parallel optimizer)
    lay = SimpleNamespace(dp=4, mp=1, pp=2, micro_batches=1)
    assert stage(c.replace(batch_size=8), layout=lay, parallel_optimizer=True, shard_grad_accum=True)[
        "grad_accum_buffer"] == stage(c, accounting="mixed")["grad_accum_buffer"] // 4


def test_stage_in_flight_micro_batches_multiply_stored_layers():
    one = stage()["activations"]
    assert one == 4 * SBH * 37.5                 # 4 layers, llama with flash (f = 688)
    many = stage(layout=SimpleNamespace(dp=1, mp=1, pp=2, micro_batches=8), cfg=MINI.replace(
        num_layers=8, compute_dtype="float16", batch_size=64))
    assert many["in_flight_micro_batches"] == 2 and many["activations"] == 2 * one


def test_stage_per_stage_recompute_counts_by_hand():
    # 4 layers: 1 full (2), 1 selective (26.75: llama, flash), 2 none (37.5); in flight 2
    lay = SimpleNamespace(dp=1, mp=1, pp=2, micro_batches=2)
    c = MINI.replace(num_layers=8, compute_dtype="float16", batch_size=16)
    e = stage(c, layout=lay, full_recompute_layers=1, select_recompute_layers=1)
    stored = (2 + 26.75 + 2 * 37.5) * 2
    working = 37.5 - 2                     # backward rematerialises one fully recomputed layer
    assert e["activations"] == SBH * (stored + working)
    assert (e["full_recompute_layers"], e["select_recompute_layers"]) == (1, 1)
    # counts above the stage's layers are clipped; full wins over selective
    e = stage(full_recompute_layers=9, select_recompute_layers=9)
    assert (e["full_recompute_layers"], e["select_recompute_layers"]) == (4, 0)
    assert e["activations"] == SBH * (4 * 2 + 35.5)


def test_stage_llama_selective_counts_by_hand():
    # llama, flash, f = 688: none 37.5, selective 26.75; 3 selective + 1 none, in flight 1
    e = stage(select_recompute_layers=3)
    assert e["activations"] == SBH * (3 * 26.75 + 37.5 + (37.5 - 26.75))


def test_stage_output_layer_and_largest_activation():
    c = MINI.replace(num_layers=8, compute_dtype="float16")
    e = estimate_stage(c, 1, **MINI_FLASH)
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
    # without accumulation MindSpore's graph reduce-scatters each gradient as it is produced: a slice, plus the
    # whole gradients of the one layer the backward is in
    layer = 4 * 256 ** 2 + 3 * 256 * 688 + 2 * 256
    assert po["grads"] == base["grads"] // 2 + 4 * layer
    lay = SimpleNamespace(dp=1, mp=1, pp=2, micro_batches=4)
    assert estimate_stage(MINI, 0, layout=lay)["in_flight_micro_batches"] == 2                # min(pp - i, m)
    assert estimate_stage(MINI, 1, layout=lay)["in_flight_micro_batches"] == 1
    assert estimate(MINI.replace(grad_accum=2))["grad_accum_buffer"] == base["grads"]
    sel = estimate(MINI, select_recompute_layers=2)
    assert sel["select_recompute_layers"] == 2 and sel["total"] < estimate(MINI)["total"]


# ---------------------------------------------------------------- the published configs, priced by the doctor
PUBLISHED = [  # (fixture, cards, layout, budget in GiB)
    (CFG_7B, 8, "dp8-mp1-pp1", 58),
    (CFG_13B, 8, "dp8-mp1-pp1", 58),
    (CFG_70B, 32, "dp1-mp4-pp8", 53),
]
PARTS = ("params", "grads", "optimizer_states", "activations")     # the doctor counts an accumulation buffer in grads


@pytest.mark.parametrize("path,cards,layout,budget_gib", PUBLISHED, ids=["7b", "13b", "70b"])
def test_published_configs_fit_their_max_device_memory(path, cards, layout, budget_gib):
    text = path.read_text()
    assert "github.com/mindspore-lab/mindformers" in text and "commit:" in text    # cited fixture
    e = estimate_from_mindformers_yaml(path)
    assert (e["devices"], e["layout"], e["budget"]) == (cards, layout, budget_gib * GIB)
    # HCCL's buffers kept free: 2 x 200 MB for each communication domain of the layout, the world among them
    domains = sum(len(g) > 1 for k, g in D.rank_groups(e["config"].layout, e["config"].dialect).items()
                  if k not in ("EP", "EDP")) + 1
    assert e["reserve"] == domains * 2 * 200 * 2**20
    assert e["fits"] is True and e["total"] + e["reserve"] <= e["budget"]
    assert e["headroom"] == e["budget"] - e["reserve"] - e["total"]
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


def test_estimate_from_a_yaml_returns_the_layout_and_config_the_doctor_read():
    """Every field beside the breakdown, on a pipeline layout (70B on 32 cards: pp > 1, a stage that is not 0)."""
    e = estimate_from_mindformers_yaml(CFG_70B)
    cfg = D.read_config(CFG_70B)
    mem, lay = D.memory_per_stage(cfg), cfg.layout
    assert lay.pp > 1 and e["config"] == D.with_reserve(cfg, D.hardware("atlas-800t-a2"))
    assert (e["stage"], e["per_stage_totals"], e["total"]) == (mem["stage"], list(mem["per_stage_bytes"]),
                                                               mem["memory_per_device_bytes"])
    assert (e["dp"], e["tp"], e["pp"], e["micro_batch_num"], e["micro_batch"], e["grad_accum_steps"],
            e["parallel_optimizer"], e["devices"]) == (lay.dp, lay.tp, lay.pp, lay.micro, lay.batch, lay.grad_accum,
                                                       lay.parallel_optimizer, lay.devices)
    assert e["layout"] == f"dp{lay.dp}-mp{lay.tp}-pp{lay.pp}" and e["source"] == str(CFG_70B)


def test_estimate_from_a_yaml_reads_the_model_config_it_is_given():
    """An mcore file leaves the model's keys to pretrained_model_dir: the config.json passed is the one read."""
    yml = DATA / "2.1.0" / "qwen3" / "pretrain_qwen3_32b_4k.yaml"
    hf = DATA / "hf" / "Qwen3-32B"
    e = estimate_from_mindformers_yaml(yml, model_config=hf)
    want = D.memory_per_stage(D.read_config(yml, model_config=hf))["memory_per_device_bytes"]
    assert e["total"] == want and e["config"].model_config is not None
