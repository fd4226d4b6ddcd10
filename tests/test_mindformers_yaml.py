"""mshelpers.mindformers_yaml: the planner's mindformers YAML, loaded by mindformers' own classes (MindFormerConfig, TransformerOpParallelConfig,
TransformerRecomputeConfig, LlamaConfig, the registry), must train the planned global batch with the planned
micro-batches and the ZeRO stage the memory plan assumed."""

import pytest

from mshelpers import mindformers_yaml as Y
from mshelpers import parallel as P
from mshelpers.config import RunConfig
from mshelpers.doctor import Layout
from mshelpers.parallel import PlannedLayout, make_layout
from _checks import module_doctests

CFG = RunConfig.preset("llama2-7b")
PLANS = P.plan_parallel_layout(CFG, 32, global_batch=64, seq_len=4096, zero_stage=1)


@pytest.mark.parametrize("dp, mp, pp", [(8, 4, 1), (2, 4, 4)])
def test_yaml_round_trips_through_mindformers(dp, mp, pp, tmp_path):
    lay = P.find_layout(PLANS, dp, mp, pp)
    spec = Y.mindformers_yaml(CFG, lay, seq_len=4096, zero_stage=1)
    r = Y.validate_mindformers_yaml(spec, tmp_path / "t.yaml")
    assert r["global_batch"] == 64
    assert r["parallel_config"].data_parallel == dp and r["parallel_config"].model_parallel == mp
    assert r["parallel_config"].pipeline_stage == pp
    if pp > 1:      # pipeline micro-batches
        assert r["parallel_config"].micro_batch_num == lay.micro_batches
        assert r["config"].runner_config.gradient_accumulation_steps == 1
    else:           # no pipeline: the micro-batches are gradient accumulation
        assert r["parallel_config"].micro_batch_num == 1
        assert r["config"].runner_config.gradient_accumulation_steps == lay.micro_batches
    assert r["config"].runner_config.batch_size == lay.micro_batch_size == r["llama_config"].batch_size
    assert r["config"].parallel.enable_parallel_optimizer is True       # the plan's ZeRO-1
    assert r["llama_config"].seq_length == 4096 and r["llama_config"].num_layers == 32


def test_zero_stage_reaches_both_forms():
    lay = P.find_layout(PLANS, 8, 4, 1)
    assert Y.mindformers_yaml(CFG, lay, seq_len=4096, zero_stage=0)["parallel"]["enable_parallel_optimizer"] is False
    assert Y.auto_parallel_context(lay, zero_stage=1)["enable_parallel_optimizer"] is True
    assert Y.auto_parallel_plan(lay, zero_stage=1)["hsdp"]["optimizer_level"] == "level1"
    assert Y.auto_parallel_plan(lay, zero_stage=0)["hsdp"] is None
    assert Y.auto_parallel_plan(lay)["wrapper"] == ("GradAccumulation" if lay.micro_batches > 1 else None)
    assert Y.auto_parallel_plan(P.find_layout(PLANS, 2, 4, 4))["wrapper"] == "Pipeline"


@pytest.mark.parametrize("section, key", [("optimizer", "betaz"), ("optimizer", "type"), ("parallel_config", "data_paralel")])
def test_a_wrong_key_is_refused_by_mindformers(section, key, tmp_path):
    spec = Y.mindformers_yaml(CFG, P.find_layout(PLANS, 8, 4, 1), seq_len=4096)
    spec[section][key] = "NoSuchOptimizer" if key == "type" else 1
    with pytest.raises((ValueError, TypeError, KeyError)):
        Y.validate_mindformers_yaml(spec, tmp_path / "t.yaml")


def test_the_yaml_and_the_legacy_context_agree_on_gradients_mean():
    """Notebook 05 printed gradients_mean True in the context beside false in the YAML it emitted."""
    lay = P.find_layout(PLANS, 8, 4, 1)
    spec = Y.mindformers_yaml(CFG, lay, seq_len=4096)
    assert Y.auto_parallel_context(lay)["gradients_mean"] is spec["parallel"]["gradients_mean"] is False


def test_the_planner_prices_sequence_parallel_and_interleaving_through_the_yaml():
    kw = dict(global_batch=64, seq_len=4096, zero_stage=1)
    tp = P.make_layout(CFG, 8, 4, 1, 8, **kw)
    sp = P.make_layout(CFG, 8, 4, 1, 8, **kw, sequence_parallel=True)
    assert sp.config.layout.seq_parallel and not tp.config.layout.seq_parallel
    assert sp.activation_bytes < tp.activation_bytes and sp.model_state_bytes == tp.model_state_bytes
    spec = Y.mindformers_yaml(CFG, sp, seq_len=4096, sequence_parallel=True)
    assert spec["parallel_config"]["use_seq_parallel"] is True
    assert Y.mindformers_yaml(CFG, P.make_layout(CFG, 32, 1, 1, 2, **kw), sequence_parallel=True)[
        "parallel_config"]["use_seq_parallel"] is False                          # mp 1: nothing to split
    v2 = Y.mindformers_yaml(CFG, P.make_layout(CFG, 2, 4, 4, 8, **kw), virtual_stages=2)
    assert v2["model"]["model_config"]["pp_interleave_num"] == 2
    assert v2["parallel"]["pipeline_config"] == {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}


# ---------------------------------------------------------------- the emitted YAML, every key (mindformers' published
# configs/llama2/pretrain_llama2_7b.yaml shape): a change to any of them must be made here too, on purpose
LAY_841 = P.make_layout(CFG, 8, 4, 1, 8, global_batch=64, seq_len=4096)
MODEL_7B = {"type": "LlamaConfig", "batch_size": 1, "seq_length": 4096, "hidden_size": 4096, "num_layers": 32,
            "num_heads": 32, "vocab_size": 32000, "intermediate_size": 11008, "rms_norm_eps": 1e-05,
            "compute_dtype": "bfloat16", "layernorm_compute_type": "float32", "softmax_compute_type": "float32",
            "rotary_dtype": "float32", "param_init_type": "float32", "use_past": False, "use_flash_attention": True,
            "offset": 0}
YAML_7B_841 = {
    "seed": 0, "output_dir": "./output", "run_mode": "train",
    "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": "llama2"},
    "runner_config": {"epochs": 1, "batch_size": 1, "sink_mode": True, "sink_size": 1, "gradient_accumulation_steps": 8},
    "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-08, "learning_rate": 0.003},
    "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": 0.003, "lr_end": 0.0, "warmup_ratio": 0.03,
                    "total_steps": -1},
    "train_dataset": {"data_loader": {"type": "MindDataset", "dataset_dir": "", "shuffle": True},
                      "input_columns": ["input_ids"], "drop_remainder": True, "batch_size": 1, "repeat": 1,
                      "num_parallel_workers": 8},
    "train_dataset_task": {"type": "CausalLanguageModelDataset"},
    "use_parallel": True,
    "parallel": {"parallel_mode": 1, "gradients_mean": False, "full_batch": True, "search_mode": "sharding_propagation",
                 "enable_parallel_optimizer": True, "strategy_ckpt_save_file": "./ckpt_strategy.ckpt",
                 "parallel_optimizer_config": {"gradient_accumulation_shard": False, "parallel_optimizer_threshold": 64}},
    "parallel_config": {"data_parallel": 8, "model_parallel": 4, "pipeline_stage": 1, "micro_batch_num": 1,
                        "vocab_emb_dp": True, "use_seq_parallel": False, "gradient_aggregation_group": 4},
    "micro_batch_interleave_num": 1,
    "recompute_config": {"recompute": False, "select_recompute": False, "parallel_optimizer_comm_recompute": False,
                         "mp_comm_recompute": True, "recompute_slice_activation": True},
    "context": {"mode": 0, "device_target": "Ascend", "max_call_depth": 10000, "max_device_memory": "58GB",
                "device_id": 0},
    "model": {"model_config": MODEL_7B, "arch": {"type": "LlamaForCausalLM"}},
    "runner_wrapper": {"type": "MFTrainOneStepCell", "use_clip_grad": True},
    "callbacks": [{"type": "MFLossMonitor"}],
}


def test_the_emitted_yaml_key_by_key():
    assert Y.mindformers_yaml(CFG, LAY_841, seq_len=4096) == YAML_7B_841
    assert Y.mindformers_yaml(CFG, LAY_841) == YAML_7B_841                     # seq_len None: the config's 4096
    pp = Y.mindformers_yaml(CFG, P.make_layout(CFG, 2, 4, 4, 8, global_batch=64, seq_len=4096))
    assert pp["parallel_config"] == {"data_parallel": 2, "model_parallel": 4, "pipeline_stage": 4, "micro_batch_num": 8,
                                     "vocab_emb_dp": True, "use_seq_parallel": False, "gradient_aggregation_group": 4}
    assert pp["runner_config"]["gradient_accumulation_steps"] == 1 and pp["runner_config"]["batch_size"] == 4


def test_the_yaml_follows_the_config_and_the_options():
    from dataclasses import asdict
    from types import SimpleNamespace
    # grouped-query attention: a config that has num_kv_heads (RunConfig has none)
    cfg = SimpleNamespace(**asdict(CFG.replace(seed=7, lr=1e-4, compute_dtype="float16", recompute="full", seq_len=2048)),
                          num_kv_heads=8)
    y = Y.mindformers_yaml(cfg, LAY_841, zero_stage=2, max_device_memory_gb=30, use_flash_attention=False)
    assert (y["seed"], y["optimizer"]["learning_rate"], y["lr_schedule"]["learning_rate"]) == (7, 1e-4, 1e-4)
    assert type(y["optimizer"]["learning_rate"]) is float and type(y["seed"]) is int
    assert y["model"]["model_config"] == {**MODEL_7B, "seq_length": 2048, "compute_dtype": "float16",
                                          "use_flash_attention": False, "n_kv_heads": 8}
    assert y["parallel"]["parallel_optimizer_config"]["gradient_accumulation_shard"] is True
    assert y["parallel"]["enable_parallel_optimizer"] is True and y["context"]["max_device_memory"] == "30GB"
    assert (y["recompute_config"]["recompute"], y["recompute_config"]["select_recompute"]) == (True, False)
    sel = Y.mindformers_yaml(CFG.replace(recompute="selective"), LAY_841)["recompute_config"]
    assert (sel["recompute"], sel["select_recompute"]) == (False, True)
    forced = Y.mindformers_yaml(CFG.replace(recompute="full"), LAY_841, recompute=False, select_recompute=True)
    assert (forced["recompute_config"]["recompute"], forced["recompute_config"]["select_recompute"]) == (False, True)
    # kv heads equal to the heads: plain multi-head attention, no n_kv_heads key
    assert "n_kv_heads" not in Y.mindformers_yaml(SimpleNamespace(**asdict(CFG), num_kv_heads=32),
                                                  LAY_841)["model"]["model_config"]
    z0 = Y.mindformers_yaml(CFG, LAY_841, zero_stage=0)["parallel"]
    assert z0["enable_parallel_optimizer"] is False and z0["parallel_optimizer_config"]["gradient_accumulation_shard"] is False


def test_a_config_that_is_not_ours_takes_the_documented_defaults():
    from types import SimpleNamespace
    plain = SimpleNamespace(seq_len=4096, hidden_size=4096, num_layers=32, num_heads=32, vocab_size=32000,
                            ffn_hidden_size=11008)
    y = Y.mindformers_yaml(plain, LAY_841)
    assert (y["seed"], y["optimizer"]["learning_rate"], y["model"]["model_config"]["compute_dtype"]) == (0, 3e-4, "bfloat16")
    assert y["lr_schedule"]["learning_rate"] == 3e-4          # the schedule's peak is the optimizer's
    assert (y["recompute_config"]["recompute"], y["recompute_config"]["select_recompute"]) == (False, False)
    assert y["model"]["model_config"] == {**MODEL_7B}


@pytest.mark.parametrize("zero", [4, -1, "1", None])
def test_a_bad_zero_stage_is_one_line(zero):
    with pytest.raises(ValueError) as e:
        Y.mindformers_yaml(CFG, LAY_841, zero_stage=zero)
    assert str(e.value) == f"mindformers_yaml: zero_stage={zero!r} is invalid; fix: 0, 1, 2 or 3"


@pytest.mark.parametrize("field", ["seq_len", "hidden_size", "num_layers", "num_heads", "vocab_size", "ffn_hidden_size"])
def test_a_missing_model_field_is_named(field):
    from types import SimpleNamespace
    plain = SimpleNamespace(seq_len=4096, hidden_size=4096, num_layers=32, num_heads=32, vocab_size=32000,
                            ffn_hidden_size=11008)
    delattr(plain, field)
    with pytest.raises(ValueError, match=f"^cfg.{field}=None is invalid"):
        Y.mindformers_yaml(plain, LAY_841)


def test_validation_writes_the_yaml_in_order_and_returns_what_mindformers_built(capfd):
    import yaml
    Y.validate_mindformers_yaml(YAML_7B_841)          # mindformers imported (MindSpore warns of deprecations then)
    capfd.readouterr()
    r = Y.validate_mindformers_yaml(YAML_7B_841)
    out = capfd.readouterr()
    # mindformers' templates log a WARNING per optional section left empty; validation keeps them quiet
    assert "WARNING" not in out.out + out.err, (out.out + out.err)[-2000:]
    assert r["path"].name == "train.yaml" and r["path"].parent.name.startswith("mf_yaml_")
    assert r["path"].read_text() == yaml.safe_dump(YAML_7B_841, sort_keys=False)     # the spec's key order
    assert r["path"].read_text().startswith("seed: 0\noutput_dir: ./output\n")
    rc = r["recompute_config"]
    assert type(rc).__name__ == "TransformerRecomputeConfig"
    assert (rc.recompute, rc.select_recompute, rc.mp_comm_recompute) == (False, False, True)
    pc = r["llama_config"].parallel_config                                            # the planned one, not a default
    assert (pc.data_parallel, pc.model_parallel) == (8, 4) and r["parallel_config"] is pc
    assert r["global_batch"] == 64


@pytest.mark.parametrize("where, value, line", [
    (("model", "arch", "type"), "GPT2LMHeadModel", "validate_mindformers_yaml: arch 'GPT2LMHeadModel' is not LlamaForCausalLM"),
    (("trainer", "type"), "NoSuchTrainer", "validate_mindformers_yaml: 'NoSuchTrainer' is not a registered mindformers trainer"),
    (("optimizer", "betaz"), 1, "validate_mindformers_yaml: AdamW takes no ['betaz']"),
])
def test_what_mindformers_would_accept_silently_is_one_line(where, value, line, tmp_path):
    import copy
    spec = copy.deepcopy(YAML_7B_841)
    d = spec
    for k in where[:-1]:
        d = d[k]
    d[where[-1]] = value
    with pytest.raises(ValueError) as e:
        Y.validate_mindformers_yaml(spec, tmp_path / "t.yaml")
    assert str(e.value) == line


def test_doctests():
    tries, failures = module_doctests(Y)
    assert tries >= 9 and failures == 0


# ---------------------------------------------------------------- mindformers' own split checks (imports mindformers, ~8 s)
def test_mindformers_accepts_the_planned_layout_and_rejects_a_bad_split():
    lay = P.find_layout(P.plan_parallel_layout(CFG, 32, global_batch=64, seq_len=4096), 4, 8)
    pc = Y.validate_with_mindformers(CFG, lay)
    assert (pc.data_parallel, pc.model_parallel, pc.pipeline_stage) == (4, 8, 1)
    bad = Layout(dp=1, tp=3)                  # the doctor's Layout: one class for every layout
    with pytest.raises(ValueError, match="n_head"):
        Y.validate_with_mindformers(CFG, bad)
    bad_ffn = CFG.replace(num_heads=48, hidden_size=4608)  # 48 heads split 3 ways, but 11008 is not
    with pytest.raises(ValueError, match="hidden_dim"):
        Y.validate_with_mindformers(bad_ffn, bad)


# ---------------------------------------------------------------- the global batch of a YAML, the parallel_config section
def test_the_global_batch_of_a_mindformers_yaml():
    from mshelpers.mindformers_yaml import yaml_global_batch
    spec = lambda pc, rc, **top: {"parallel_config": pc, "runner_config": rc, **top}
    assert yaml_global_batch(spec({"data_parallel": 8}, {"batch_size": 2})) == 16
    # micro-batches count only with a pipeline
    assert yaml_global_batch(spec({"data_parallel": 2, "micro_batch_num": 4}, {"batch_size": 3})) == 6
    assert yaml_global_batch(spec({"data_parallel": 2, "pipeline_stage": 2, "micro_batch_num": 4},
                                  {"batch_size": 3})) == 24
    assert yaml_global_batch(spec({"data_parallel": 2, "pipeline_stage": 2}, {"batch_size": 3})) == 6
    assert yaml_global_batch(spec({"data_parallel": 2}, {"batch_size": 3, "gradient_accumulation_steps": 5})) == 30
    assert yaml_global_batch(spec({"data_parallel": 2}, {"batch_size": 3}, micro_batch_interleave_num=2)) == 12


def test_mindformers_parallel_config_micro_batches_only_with_a_pipeline():
    two = make_layout(CFG, 4, 4, 2, 8, global_batch=64, seq_len=4096)
    assert Y.mindformers_parallel_config(two) == {
        "data_parallel": 4, "model_parallel": 4, "pipeline_stage": 2, "micro_batch_num": 8, "vocab_emb_dp": True,
        "use_seq_parallel": False, "gradient_aggregation_group": 4}
    assert Y.mindformers_parallel_config(two, vocab_emb_dp=False, use_seq_parallel=True)["vocab_emb_dp"] is False
    assert Y.mindformers_parallel_config(make_layout(CFG, 8, 4, 1, 8, global_batch=64))["micro_batch_num"] == 1


# ---------------------------------------------------------------- the AutoParallel / legacy-context settings, exactly
def _lay(dp, mp, pp, m):
    return make_layout(CFG, dp, mp, pp, m, global_batch=64, seq_len=4096)


def test_auto_parallel_context_exact():
    assert Y.auto_parallel_context(_lay(8, 4, 1, 1), zero_stage=0) == {
        "parallel_mode": "semi_auto_parallel", "device_num": 32, "gradients_mean": False, "full_batch": True,
        "enable_parallel_optimizer": False}
    assert Y.auto_parallel_context(_lay(4, 2, 4, 8)) == {
        "parallel_mode": "semi_auto_parallel", "device_num": 32, "gradients_mean": False, "full_batch": True,
        "enable_parallel_optimizer": True, "parallel_optimizer_config": {"optimizer_level": "level1"},
        "pipeline_stages": 4}
    assert Y.auto_parallel_context(_lay(8, 4, 1, 8), zero_stage=2)["parallel_optimizer_config"] == \
        {"optimizer_level": "level2"}
    assert "pipeline_stages" not in Y.auto_parallel_context(_lay(8, 4, 1, 8))
    assert Y.auto_parallel_context(_lay(4, 4, 2, 8))["pipeline_stages"] == 2


def test_auto_parallel_plan_exact():
    assert Y.auto_parallel_plan(_lay(8, 4, 1, 1), zero_stage=0) == {
        "wrapper": None, "micro_size": 1, "parallel_mode": "semi_auto", "pipeline": None, "hsdp": None}
    assert Y.auto_parallel_plan(_lay(8, 4, 1, 8)) == {
        "wrapper": "GradAccumulation", "micro_size": 8, "parallel_mode": "semi_auto", "pipeline": None,
        "hsdp": {"shard_size": -1, "threshold": 64, "optimizer_level": "level1"}}
    assert Y.auto_parallel_plan(_lay(4, 2, 4, 8), zero_stage=3) == {
        "wrapper": "Pipeline", "micro_size": 8, "parallel_mode": "semi_auto",
        "pipeline": {"stages": 4, "scheduler": "1f1b"},
        "hsdp": {"shard_size": -1, "threshold": 64, "optimizer_level": "level3"}}
    two = Y.auto_parallel_plan(_lay(4, 4, 2, 8))
    assert (two["wrapper"], two["pipeline"]) == ("Pipeline", {"stages": 2, "scheduler": "1f1b"})
    assert Y.auto_parallel_plan(_lay(8, 4, 1, 2))["wrapper"] == "GradAccumulation"
