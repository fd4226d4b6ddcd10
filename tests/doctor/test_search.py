"""The layout search varies the parsed Layout, never a YAML (issue 49): nothing reads a file while it runs, the
config's parsed file is left as it was, and every variant it prices is priced exactly like that variant's file
(`with_layout`: the YAML edited in its own dialect and read again). That equivalence keeps the two paths
honest: `variants.layout_variant` re-implements what the reader does to an edited file, and this file fails
the day they part."""
from __future__ import annotations

import copy
import dataclasses
import functools
import sys
from pathlib import Path

import pytest
import yaml

from mshelpers import doctor as D
from mshelpers.doctor import search, variants

DATA = Path(__file__).parents[1] / "data" / "mindformers"
HW = D.hardware("atlas-800t-a2")
CONFIGS = {                                             # what each one brings to the search's variants
    "dense r1.x, full recompute": "r1.2.0_pretrain_llama2_13b.yaml",
    "dense r1.x, pp 8, offsets": "r1.2.0_pretrain_llama2_70b.yaml",
    "MoE r1.x (moe_config, capacity)": "r1.2.0_finetune_mixtral-8x7b.yaml",
    "MoE mcore": "2.1.0/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml",
    "mcore, VPP 2, per-chunk recompute": "2.1.0/telechat3/pretrain_telechat3_36b.yaml",
    "mcore, dp 1 x cp 2": "spellings/qwen3_32b_dp1_cp2_parallel_optimizer.yaml",
    "2.x PyNative": "2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml",
    "2.x PyNative MoE": "2.1.0/deepseek4/pretrain_deepseek4_flash.yaml",
}


def _read(name: str) -> D.Config:
    return D.read_config(DATA / CONFIGS[name])


def _search_calls(cfg: D.Config, monkeypatch) -> tuple[list[dict], list[dict]]:
    """better_layouts' rows, and every set of keys it asked layout_variant for (in order, without repeats)."""
    calls: list[dict] = []
    real = search.layout_variant

    def recording(c, **kw):
        calls.append(kw)
        return real(c, **kw)
    monkeypatch.setattr(search, "layout_variant", recording)
    rows = search.better_layouts(cfg, HW)
    monkeypatch.setattr(search, "layout_variant", real)
    return rows, list({repr(sorted(kw.items(), key=str)): kw for kw in calls}.values())


@functools.lru_cache(maxsize=None)
def _tried(name: str) -> tuple[D.Config, list[dict]]:
    """The config and the keys the search tries on it (searched once per module)."""
    cfg = _read(name)
    with pytest.MonkeyPatch.context() as mp:
        return cfg, _search_calls(cfg, mp)[1]


def _refuse(*_a, **_k):
    raise AssertionError("the search read a YAML")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_search_reads_and_edits_no_yaml(name, monkeypatch):
    cfg = _read(name)
    raw = copy.deepcopy(cfg.raw)
    for mod in [m for n, m in sys.modules.items() if n.startswith("mshelpers.doctor") and m is not None]:
        for fn in ("read_config", "load_yaml", "with_layout"):
            if hasattr(mod, fn):
                monkeypatch.setattr(mod, fn, _refuse)
    files: list[dict] = []                   # edited_yaml: once per row returned, for its changes and --out
    real = search.edited_yaml
    monkeypatch.setattr(search, "edited_yaml", lambda c, **kw: files.append(kw) or real(c, **kw))
    rows, tried = _search_calls(cfg, monkeypatch)
    assert len(tried) > 100 and len(files) == len(rows) <= 5
    assert rows or name == "2.x PyNative MoE"                # DeepSeek-V4 Flash fits no layout of its 8 ranks
    assert cfg.raw == raw                                    # the parsed file is as it was read


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_variant_prices_as_its_file_read_again(name):
    cfg, calls = _tried(name)
    assert len(calls) > 100
    checked = refused = 0
    for kw in calls[::max(1, len(calls) // 400)]:           # some 400 of them, spread over every loop of the search
        try:
            slow = D.with_layout(cfg, **kw)
        except D.DoctorError as e:
            with pytest.raises(D.DoctorError):               # a file the reader refuses is a refused variant
                variants.layout_variant(cfg, **kw)
            refused += 1
            continue
        fast = variants.layout_variant(cfg, **kw)
        assert (fast.model, fast.layout, fast.budget_bytes, fast.dialect) == \
            (slow.model, slow.layout, slow.budget_bytes, slow.dialect), kw
        assert D.memory_per_stage(fast) == D.memory_per_stage(slow), kw
        assert D.step_time(fast, HW) == D.step_time(slow, HW), kw
        checked += 1
    assert checked > 30, (checked, refused)


# Keys the search does not try but layout_variant takes: per-stage recompute on splits with a remainder, select
# patterns, stage splits with offsets, VPP dropped, a PyNative pipeline (its layer ranges numbered chunk-major).
EXTRA = [
    ("dense r1.x, pp 8, offsets", dict(pipeline_stage=3, micro_batch_num=6, data_parallel=2, model_parallel=8,
                                       offset=[1, 1, 0], recompute=[3, 0, 27], select_recompute=True)),
    ("dense r1.x, pp 8, offsets", dict(pipeline_stage=8, micro_batch_num=128, offset=[0, 1, 1, 0, 0, -1, 0, -1],
                                       recompute=False, select_recompute=["feed_forward\\.w1\\.matmul"])),
    ("dense r1.x, full recompute", dict(recompute=2, select_recompute={"feed_forward.mul": [4]})),
    ("dense r1.x, full recompute", dict(use_seq_parallel=True)),                       # no sequence parallel at mp 1
    ("dense r1.x, pp 8, offsets", dict(pipeline_stage=4, micro_batch_num=128, offset=0)),   # the file's recompute
    ("dense r1.x, full recompute", dict(model_parallel=2, data_parallel=4)),          # the file's switches at mp 2
    ("mcore, VPP 2, per-chunk recompute", dict(pipeline_stage=4, micro_batch_num=8, data_parallel=4, offset=0,
                                               pp_interleave_num=1, enable_parallel_optimizer=True,
                                               recompute=[4, 3, 2, 1], select_recompute=True)),
    ("mcore, VPP 2, per-chunk recompute", dict(use_seq_parallel=False, enable_parallel_optimizer=False)),
    ("2.x PyNative", dict(pipeline_stage=3, micro_batch_num=3, data_parallel=1, recompute=[1, 2, 0],
                          select_recompute=False)),
    ("2.x PyNative", dict(pipeline_stage=2, pp_interleave_num=3, micro_batch_num=4, data_parallel=1,
                          recompute=[2, 5], select_recompute=True)),
    ("2.x PyNative", dict(pipeline_stage=2, micro_batch_num=2, data_parallel=4, recompute=[0, 0],
                          select_recompute=["mlp", "attention"])),
    ("2.x PyNative MoE", dict(recompute=3, select_recompute=False, expert_parallel=4)),
]


@pytest.mark.parametrize("name, kw", EXTRA, ids=[f"{n}:{i}" for i, (n, _) in enumerate(EXTRA)])
def test_a_variant_off_the_search_path_prices_as_its_file(name, kw):
    cfg = _read(name)
    slow, fast = D.with_layout(cfg, **kw), variants.layout_variant(cfg, **kw)
    assert fast.layout == slow.layout and fast.model == slow.model
    assert D.memory_per_stage(fast) == D.memory_per_stage(slow)
    assert D.step_time(fast, HW) == D.step_time(slow, HW)


@pytest.mark.parametrize("name, kw, field", [
    ("dense r1.x, full recompute", dict(recompute=False), "select_recompute"),          # one without the other
    ("dense r1.x, pp 8, offsets", dict(pipeline_stage=4, micro_batch_num=128, recompute=True,
                                       select_recompute=False), "offset"),           # the file's offsets were pp 8's
    ("mcore, VPP 2, per-chunk recompute", dict(recompute=[[1, 1], [1, 1]], select_recompute=False), "recompute"),
    ("2.x PyNative", dict(enable_parallel_optimizer=False), "enable_parallel_optimizer"),
    ("dense r1.x, full recompute", dict(data_parallel=0), "data_parallel"),
    ("dense r1.x, full recompute", dict(tensor_parallel=2), "tensor_parallel"),         # not one of its keys
    ("MoE r1.x (moe_config, capacity)", dict(expert_parallel=3), "expert_parallel"),
])
def test_what_a_layout_cannot_tell_is_refused_in_one_line(name, kw, field):
    with pytest.raises(D.DoctorError) as e:
        variants.layout_variant(_read(name), **kw)
    assert e.value.field.endswith(field) and "\n" not in str(e.value) and "fix:" in str(e.value)


def test_a_config_without_its_files_switches_refuses_what_its_layout_cannot_tell():
    """The file's own switches and recompute entries travel in Config.asked; a Config that lost them (built by
    hand) cannot tell them, and says so in one line rather than guess."""
    cases = [("dense r1.x, pp 8, offsets", dict(pipeline_stage=4, micro_batch_num=128, offset=0), "recompute"),
             ("dense r1.x, full recompute", dict(model_parallel=2, data_parallel=4), "use_seq_parallel")]
    for name, kw, field in cases:
        cfg = _read(name)
        assert cfg.asked and variants.layout_variant(cfg, **kw)
        with pytest.raises(D.DoctorError) as e:
            variants.layout_variant(dataclasses.replace(cfg, asked={}), **kw)
        assert e.value.field.endswith(field) and "\n" not in str(e.value) and "fix:" in str(e.value)


def test_a_row_carries_its_file_and_the_file_reads_back_as_the_row():
    cfg = D.read_config(DATA / CONFIGS["dense r1.x, full recompute"], budget="40GB")
    rows = D.better_layouts(cfg, HW)
    assert rows
    for row in rows:
        c = row["config"]
        again = D.read_config(c.raw, budget=cfg.budget_bytes)
        assert again.layout == c.layout and again.model == cfg.model
        every = {k: v[1] for k, v in D.changed_keys(cfg.raw, c.raw).items()}
        # a key the file leaves out, written with the value mindformers takes for it anyway, is not a change
        assert row["changes"] == {k: v for k, v in every.items() if not D.search._noop(cfg.raw, k, v)}
        assert all(v == D.search._ABSENT_MEANS[k.rsplit(".", 1)[-1]] for k, v in every.items() if k not in row["changes"])
        assert all(k.split(".")[0] in ("parallel_config", "runner_config", "recompute_config", "parallel", "model")
                   for k in row["changes"])


@pytest.mark.parametrize("section, devices", [("training", 1), ("parallelism", 8), ("recompute", 8)])
def test_a_null_section_of_a_2x_file_is_written_as_a_mapping(section, devices):
    """edited_yaml on a file whose section is null (the search wrote into None: TypeError, issue 49)."""
    d = yaml.safe_load((DATA / CONFIGS["2.x PyNative"]).read_text())
    d[section] = None
    cfg = D.read_config(d, devices=devices)
    kw = dict(data_parallel=4, pipeline_stage=2, micro_batch_num=2, recompute=[1, 1], select_recompute=False)
    new = variants.edited_yaml(cfg, **kw)
    assert d[section] is None and isinstance(new[section], dict)
    assert D.read_config(new).layout == variants.layout_variant(cfg, **kw).layout


def test_layout_variant_replaces_the_layout_and_keeps_the_rest():
    cfg = _read("dense r1.x, full recompute")
    v = variants.layout_variant(cfg, data_parallel=4, model_parallel=2, batch_size=2, gradient_accumulation_steps=2,
                                use_seq_parallel=True, recompute=False, select_recompute=True)
    assert v.model is cfg.model and v.raw == {} and v.notes == cfg.notes and v.budget_bytes == cfg.budget_bytes
    assert dataclasses.replace(v.layout, dp=cfg.layout.dp, tp=cfg.layout.tp, batch=cfg.layout.batch,
                               grad_accum=cfg.layout.grad_accum, seq_parallel=cfg.layout.seq_parallel,
                               full_recompute=cfg.layout.full_recompute, select_ops=cfg.layout.select_ops) == cfg.layout
    assert v.layout.global_batch == cfg.layout.global_batch and v.layout.full_recompute == (0,)
