"""One memory model (issue 58): `mshelpers.memory.estimate` for a config and the doctor's `memory_per_stage` give the
same bytes, part by part (params, grads, optimizer states, activations, total), for the same model and layout.

`estimate` reads its config into the doctor's `Model` and `Layout` (`memory.doctor_config`) and takes
`memory_per_stage`, so what is held equal here is the reading, in both directions, and the one model itself:

  every RunConfig preset   estimate(cfg, layout=..., zero_stage=..., ...) against memory_per_stage on a Model and a
                           Layout this test builds from the RunConfig's fields by itself, over dp/tp/pp and
                           micro-batches, ZeRO stages and the parallel optimizer, sequence parallel, recompute,
                           gradient accumulation and flash attention; each stage by `estimate_stage`
  every fixture YAML       read by the doctor (tests/data/mindformers/, 2.1.0/ with its config.json, and
                           tests/data/heldout/), then the same model and layout given to `estimate` as a plain dict and
                           a layout object, as shipped and on a few other layouts (sharding, sequence parallel,
                           recompute, pp); files whose model or layout a dict cannot say (MoE, MLA, MTP, context
                           parallel, VPP, swap, uneven stages, per-stage recompute) are named, and counted
  by hand                  the model on the mini and 7B presets and on a pipeline layout, worked from the formulas
                           written out here (so a factor changed inside the one model fails too)
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mshelpers import doctor as D
from mshelpers import memory
from mshelpers.config import RunConfig

sys.path.insert(0, str(Path(__file__).parent / "doctor"))         # the dialect tests' table of config.json files
from test_dialects import MODEL_FOR as DIALECT_MODEL_FOR  # noqa: E402

PRESETS = ("mini", "tiny", "llama2-7b", "llama2-13b", "llama2-70b")
PARTS = ("params", "grads", "optimizer_states", "activations", "total")
DATA = Path(__file__).parent / "data"
MF = DATA / "mindformers"
YAMLS = sorted([p.relative_to(DATA).as_posix() for p in MF.rglob("*.yaml")] +
               [p.relative_to(DATA).as_posix() for p in (DATA / "heldout").glob("*.yaml")])
MODEL_FOR = {f"mindformers/2.1.0/{name}": path for name, path in DIALECT_MODEL_FOR.items()}
SHARDS = ("none", "zero1", "zero2", "fsdp", "po")


def doctor_side(mem: dict, i: int | None = None) -> dict:
    """The parts of stage i (None: the largest) as memory_per_stage gives them."""
    i = mem["stage"] if i is None else i
    return {**mem["per_stage_breakdown"][i], "total": mem["per_stage_bytes"][i]}


def parts(e: dict) -> dict:
    return {k: e[k] for k in PARTS}


# ---------------------------------------------------------------- the presets, read twice
def preset_config(cfg: RunConfig, dp: int, tp: int, pp: int, micro: int, shard: str, sp: bool, flash: bool) -> D.Config:
    """The doctor's Config for a RunConfig, built here from its fields (not by memory.doctor_config)."""
    h, a = cfg.hidden_size, cfg.num_heads
    model = D.Model(name=cfg.name, layers=cfg.num_layers, hidden=h, heads=a, kv_heads=a, head_dim=h // a,
                    ffn=cfg.ffn_hidden_size, vocab=cfg.vocab_size, seq=cfg.seq_len, attention="mha", flash=flash)
    per = cfg.num_layers // pp
    full = per if cfg.recompute == "full" else 0
    sel = per if cfg.recompute == "selective" else 0
    half = cfg.compute_dtype in ("float16", "bfloat16")
    pb, gb, sb = (2, 2, 12) if half else (4, 4, 8)          # mixed-precision Adam, or fp32 Adam as on this CPU
    lay = D.Layout(dp=dp, tp=tp, pp=pp, micro=micro, batch=cfg.batch_size // (dp * micro), grad_accum=cfg.grad_accum,
                   seq_parallel=sp, optimizer_shard=shard, stage_layers=(per,) * pp, full_recompute=(full,) * pp,
                   select_ops=((("feed_forward.mul", sel),) if sel else (),) * pp, compute_dtype=cfg.compute_dtype,
                   param_bytes=pb, grad_bytes=gb, state_bytes=sb, accum_buffer=cfg.grad_accum > 1)
    return D.Config(model=model, layout=lay, budget_bytes=None, dialect="test")


def preset_cases(name: str):
    base = RunConfig.preset(name)
    for (dp, tp, pp, micro), shard, sp, rc, ga, flash in itertools.product(
            [(1, 1, 1, 1), (2, 1, 1, 1), (2, 2, 1, 1), (1, 2, 2, 4), (2, 1, 2, 2), (1, 1, 4, 4)], SHARDS,
            (False, True), ("none", "selective", "full"), (1, 2), (False, True)):
        if base.num_layers % pp or base.batch_size % (dp * micro) or (sp and tp == 1):
            continue
        yield base.replace(recompute=rc, grad_accum=ga), dp, tp, pp, micro, shard, sp, flash


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_costs_the_same_bytes_on_both_sides(name):
    n = 0
    for cfg, dp, tp, pp, micro, shard, sp, flash in preset_cases(name):
        kw = dict(layout=SimpleNamespace(dp=dp, mp=tp, pp=pp, micro_batches=micro), sequence_parallel=sp,
                  flash_attention=flash, parallel_optimizer=shard == "po",
                  zero_stage={"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3, "po": 0}[shard])
        mem = D.memory_per_stage(preset_config(cfg, dp, tp, pp, micro, shard, sp, flash))
        case = (cfg.recompute, cfg.grad_accum, dp, tp, pp, micro, shard, sp, flash)
        assert parts(memory.estimate(cfg, **kw)) == doctor_side(mem), case
        for i in range(pp):
            assert parts(memory.estimate_stage(cfg, i, **kw)) == doctor_side(mem, i), (case, i)
        n += 1
    assert n >= 100, n


# ---------------------------------------------------------------- every fixture YAML, read twice
def expressible(c: D.Config) -> str:
    """Why a dict and a layout object cannot say this model and layout to `estimate` ("" when they can)."""
    m, lay = c.model, c.layout
    why = [w for w, bad in (("MoE", m.moe is not None), ("MLA", m.attention == "mla"), ("MTP", m.mtp > 0),
                            ("head_dim != hidden / heads", m.head_dim * m.heads != m.hidden),
                            ("context parallel", lay.cp > 1), ("VPP", lay.vpp > 1), ("swap", lay.swap),
                            ("expert parallel", lay.ep > 1),
                            ("uneven stages", len(set(lay.stage_layers)) > 1),
                            ("per-stage recompute", len(set(lay.full_recompute)) > 1 or
                             len({max((k for _, k in st), default=0) for st in lay.select_ops}) > 1)) if bad]
    return ", ".join(why)


def yaml_variants(c: D.Config):
    """The file's own layout, then the same model on a few others (each applied to the doctor's Layout)."""
    lay, L = c.layout, c.model.layers
    yield "as shipped", c
    for shard in SHARDS:
        if shard != lay.optimizer_shard:
            yield f"optimizer_shard={shard}", dataclasses.replace(c, layout=dataclasses.replace(lay, optimizer_shard=shard))
    if lay.tp > 1:
        yield "seq_parallel flipped", dataclasses.replace(c, layout=dataclasses.replace(lay, seq_parallel=not lay.seq_parallel))
    for rc in ("none", "full"):
        per = lay.stage_layers[0]
        yield f"recompute {rc}", dataclasses.replace(c, layout=dataclasses.replace(
            lay, full_recompute=(per if rc == "full" else 0,) * lay.pp, select_ops=((),) * lay.pp))
    if lay.pp > 1:
        yield "pp 1", dataclasses.replace(c, layout=dataclasses.replace(
            lay, pp=1, vpp=1, micro=1, stage_layers=(L,), full_recompute=(min(lay.full_recompute[0] * lay.pp, L),),
            select_ops=(lay.select_ops[0],)))
    elif L % 2 == 0:
        yield "pp 2, 4 micro-batches", dataclasses.replace(c, layout=dataclasses.replace(
            lay, pp=2, micro=4, stage_layers=(L // 2,) * 2, full_recompute=(min(lay.full_recompute[0], L // 2),) * 2,
            select_ops=(lay.select_ops[0],) * 2))


def estimate_of(c: D.Config, stage: int | None = None) -> dict:
    """`estimate` (or `estimate_stage`) given the model and layout as a user would write them: a dict, a layout."""
    m, lay = c.model, c.layout
    cfg = {"hidden_size": m.hidden, "num_layers": m.layers, "num_heads": m.heads, "num_kv_heads": m.kv_heads,
           "ffn_hidden_size": m.ffn, "vocab_size": m.vocab, "seq_len": m.seq, "batch_size": lay.batch * lay.dp * lay.micro,
           "compute_dtype": lay.compute_dtype, "grad_accum": lay.grad_accum, "tie_word_embeddings": m.tied}
    sel = max((k for _, k in lay.select_ops[0]), default=0)
    kw = dict(layout=SimpleNamespace(dp=lay.dp, mp=lay.tp, pp=lay.pp, micro_batches=lay.micro,
                                     sequence_parallel=lay.seq_parallel),
              flash_attention=m.flash, accounting=(lay.param_bytes, lay.param_bytes if lay.grad_bytes is None
                                                   else lay.grad_bytes, lay.state_bytes),
              parallel_optimizer=lay.optimizer_shard == "po",
              zero_stage={"none": 0, "zero1": 1, "zero2": 2, "fsdp": 3, "po": 0}[lay.optimizer_shard],
              full_recompute_layers=lay.full_recompute[0], select_recompute_layers=sel,
              grad_accum_buffer=lay.accum_buffer, shard_grad_accum=lay.shard_accum, qkv_bias=m.qkv_bias,
              vocab_emb_dp=lay.vocab_emb_dp)
    return memory.estimate(cfg, **kw) if stage is None else memory.estimate_stage(cfg, stage, **kw)


def test_every_fixture_yaml_costs_the_same_bytes_on_both_sides():
    priced, left, files = 0, {}, set()
    for name in YAMLS:
        c = D.read_config(DATA / name, model_config=MODEL_FOR.get(name))
        for label, v in yaml_variants(c):
            why = expressible(v)
            if why:                      # the model (every variant), or this layout (e.g. uneven stages as shipped)
                left[(name, label)] = why
                continue
            mem = D.memory_per_stage(v)
            assert parts(estimate_of(v)) == doctor_side(mem), (name, label)
            for i in range(v.layout.pp):
                assert parts(estimate_of(v, i)) == doctor_side(mem, i), (name, label, i)
            priced += 1
            files.add(name)
        # the doctor's own entry point for the file says the same as its Config
        if "heldout" not in name:
            e = memory.estimate_from_mindformers_yaml(DATA / name, model_config=MODEL_FOR.get(name), budget_bytes=2**40)
            assert e["total"] == D.memory_per_stage(c)["memory_per_device_bytes"], name
    assert len(YAMLS) >= 140 and priced >= 500 and len(files) >= 100, (len(YAMLS), priced, len(files))
    # what a dict cannot say is the doctor's alone (MoE, MLA, MTP, context parallel, VPP, swap, ...): every Llama 2
    # file is priced on some layout
    assert not [n for n in YAMLS if "llama2" in n and n not in files], left


# ---------------------------------------------------------------- the one model, by hand
def sbh_llama(s: int, b: int, h: int, a: int, f: int, flash: bool = False, tp: int = 1) -> float:
    """Korthikanti's count for mindformers' LLaMA block, per s·b·h at 2 bytes: 8 unsplit + (4 + 4 + 8 f/h + 5 a s/h)/t."""
    return 8 + (4 + 4 + 8 * f / h + (0 if flash else 5 * a * s / h)) / tp


def test_mini_on_this_cpu_by_hand():
    """fp32 Adam (4 + 4 + 8 bytes), 4-byte activations, one device: every part from the formulas."""
    c = RunConfig.preset("mini")
    n = 2 * 1024 * 256 + 4 * (4 * 256 ** 2 + 3 * 256 * 688 + 2 * 256) + 256
    acts = 4 * 128 * 8 * 256 * sbh_llama(128, 8, 256, 4, 688) * 2 + 4 * 128 * 8 * 1024 * 2   # layers + logits, x2 bytes
    want = {"params": 4 * n, "grads": 4 * n, "optimizer_states": 8 * n, "activations": acts, "total": 16 * n + acts}
    assert parts(memory.estimate(c)) == want
    mem = D.memory_per_stage(preset_config(c, 1, 1, 1, 1, "none", False, False))
    assert doctor_side(mem) == want


def test_llama2_7b_on_eight_devices_with_zero1_by_hand():
    """bf16 mixed Adam (2 + 2 + 12), ZeRO-1 over 8: states / 8; flash attention; micro-batch 8 per device."""
    c = RunConfig.preset("llama2-7b")
    n = 6_738_415_616
    s, b, h = 4096, 64 // 8, 4096
    acts = 32 * s * b * h * sbh_llama(s, b, h, 32, 11008, flash=True) + 4 * s * b * 32000
    want = {"params": 2 * n, "grads": 2 * n, "optimizer_states": 12 * n // 8, "activations": int(acts)}
    want["total"] = sum(want.values())
    assert parts(memory.estimate(c, n_devices=8, zero_stage=1, flash_attention=True)) == want
    mem = D.memory_per_stage(preset_config(c, 8, 1, 1, 1, "zero1", False, True))
    assert doctor_side(mem) == want


def test_a_pipeline_stage_by_hand():
    """mini on tp 2, pp 2, 4 micro-batches, full recompute: the first stage holds the embedding and 2 micro-batches of
    2 layers' inputs, plus one layer being recomputed; the last the lm_head, 1 micro-batch and the logits."""
    c = RunConfig.preset("mini").replace(recompute="full")
    lay = SimpleNamespace(dp=1, mp=2, pp=2, micro_batches=4)
    layer = 4 * 256 ** 2 + 3 * 256 * 688 + 2 * 256
    s, b, h = 128, 2, 256
    kept = s * b * h * 2 * 2                                # full recompute: the layer input, fp32
    working = s * b * h * sbh_llama(s, b, h, 4, 688, tp=2) * 2 - kept
    first, last = memory.estimate_stage(c, 0, layout=lay), memory.estimate_stage(c, 1, layout=lay)
    assert first["params"] == 4 * (layer + 1024 * 256) and last["params"] == 4 * (layer + 1024 * 256 // 2 + 256)
    assert first["activations"] == math.ceil(2 * 2 * kept + working)
    assert last["activations"] == math.ceil(2 * kept + working + 4 * s * b * 1024 / 2 * 2)
    mem = D.memory_per_stage(preset_config(c, 1, 2, 2, 4, "none", False, False))
    assert [parts(first), parts(last)] == [doctor_side(mem, 0), doctor_side(mem, 1)]


# ---------------------------------------------------------------- the GPT-style switches, the counts and the states rule
SWITCHES = [{}, {"mlp": "gelu"}, {"tie_word_embeddings": True}, {"bias": True}, {"norm": "layer"},
            {"mlp": "gelu", "tie_word_embeddings": True, "bias": True, "norm": "layer"}, {"num_kv_heads": 2}]


@pytest.mark.parametrize("name", PRESETS)
def test_the_switches_cost_the_same_on_both_sides_and_the_two_counts_agree(name):
    """memory_states.transformer_param_count (the count a user copies alone) and the doctor's param_count (what the
    model is priced with) are two counters of one structure: held equal here, for every switch."""
    cfg = RunConfig.preset(name)
    for sw in SWITCHES:
        gpt = sw.get("mlp") == "gelu"
        kv = sw.get("num_kv_heads", cfg.num_heads)
        model = dataclasses.replace(
            preset_config(cfg, 1, 1, 1, 1, "none", False, False).model, kv_heads=kv,
            attention="gqa" if kv < cfg.num_heads else "mha", tied=sw.get("tie_word_embeddings", False),
            block="gpt" if gpt else "llama", mlp=sw.get("mlp", "swiglu"), norm=sw.get("norm", "rms"),
            bias=sw.get("bias", False))
        assert D.param_count(model) == memory.transformer_param_count(cfg, **sw), sw
        for lay in (SimpleNamespace(dp=2, mp=1, pp=1, micro_batches=1), SimpleNamespace(dp=1, mp=2, pp=2, micro_batches=4)):
            c = preset_config(cfg, lay.dp, lay.mp, lay.pp, lay.micro_batches, "zero1", False, False)
            mem = D.memory_per_stage(dataclasses.replace(c, model=model))
            assert parts(memory.estimate(cfg, layout=lay, zero_stage=1, **sw)) == doctor_side(mem), (sw, lay)


@pytest.mark.parametrize("name", PRESETS)
def test_model_state_breakdown_is_the_estimates_states_on_one_stage(name):
    """The ZeRO paper's per-parameter formula (model_state_breakdown, notebook 06) and the estimate's states share
    memory_states.sharded_state_bytes: on one stage (tp = pp = 1) they agree for every ZeRO stage."""
    cfg = RunConfig.preset(name)
    n = memory.llama_param_count(cfg)
    for zero, dp in itertools.product(range(4), (1, 2, 8)):
        if cfg.batch_size % dp:
            continue
        e = memory.estimate(cfg, n_devices=dp, zero_stage=zero)
        want = memory.model_state_breakdown(n, zero_stage=zero, dp=dp, accounting=(
            "mixed" if cfg.compute_dtype != "float32" else "fp32"))
        # whole bytes: the breakdown rounds a shard up, the doctor down; they differ only where dp does not divide
        assert all(abs(e[k] - want[k]) <= 1 for k in want), (zero, dp, e, want)
        if n * 16 % dp == 0:
            assert {k: e[k] for k in want} == want, (zero, dp)
