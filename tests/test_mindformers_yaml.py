"""The planner's mindformers YAML, loaded by mindformers' own classes (MindFormerConfig, TransformerOpParallelConfig,
TransformerRecomputeConfig, LlamaConfig, the registry), must train the planned global batch with the planned
micro-batches and the ZeRO stage the memory plan assumed."""
import pytest

from mshelpers import parallel as P
from mshelpers.config import RunConfig

CFG = RunConfig.preset("llama2-7b")
PLANS = P.plan_parallel_layout(CFG, 32, global_batch=64, seq_len=4096, zero_stage=1)


@pytest.mark.parametrize("dp, mp, pp", [(8, 4, 1), (2, 4, 4)])
def test_yaml_round_trips_through_mindformers(dp, mp, pp, tmp_path):
    lay = P.find_layout(PLANS, dp, mp, pp)
    spec = P.mindformers_yaml(CFG, lay, seq_len=4096, zero_stage=1)
    r = P.validate_mindformers_yaml(spec, tmp_path / "t.yaml")
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
    assert P.mindformers_yaml(CFG, lay, seq_len=4096, zero_stage=0)["parallel"]["enable_parallel_optimizer"] is False
    assert P.auto_parallel_context(lay, zero_stage=1)["enable_parallel_optimizer"] is True
    assert P.auto_parallel_plan(lay, zero_stage=1)["hsdp"]["optimizer_level"] == "level1"
    assert P.auto_parallel_plan(lay, zero_stage=0)["hsdp"] is None
    assert P.auto_parallel_plan(lay)["wrapper"] == ("GradAccumulation" if lay.micro_batches > 1 else None)
    assert P.auto_parallel_plan(P.find_layout(PLANS, 2, 4, 4))["wrapper"] == "Pipeline"


@pytest.mark.parametrize("section, key", [("optimizer", "betaz"), ("optimizer", "type"), ("parallel_config", "data_paralel")])
def test_a_wrong_key_is_refused_by_mindformers(section, key, tmp_path):
    spec = P.mindformers_yaml(CFG, P.find_layout(PLANS, 8, 4, 1), seq_len=4096)
    spec[section][key] = "NoSuchOptimizer" if key == "type" else 1
    with pytest.raises((ValueError, TypeError, KeyError)):
        P.validate_mindformers_yaml(spec, tmp_path / "t.yaml")


def test_the_yaml_and_the_legacy_context_agree_on_gradients_mean():
    """Notebook 05 printed gradients_mean True in the context beside false in the YAML it emitted."""
    lay = P.find_layout(PLANS, 8, 4, 1)
    spec = P.mindformers_yaml(CFG, lay, seq_len=4096)
    assert P.auto_parallel_context(lay)["gradients_mean"] is spec["parallel"]["gradients_mean"] is False


def test_the_planner_prices_flash_attention_when_asked():
    """The emitted YAML sets use_flash_attention: True; pricing it without flash keeps the s² scores."""
    kw = dict(global_batch=64, seq_len=4096, zero_stage=1)
    plain = P.make_layout(CFG, 8, 4, 1, 8, **kw)
    flash = P.make_layout(CFG, 8, 4, 1, 8, **kw, flash_attention=True)
    assert flash.activation_bytes < plain.activation_bytes and flash.model_state_bytes == plain.model_state_bytes
    plans = P.plan_parallel_layout(CFG, 32, **kw, flash_attention=True)
    assert P.find_layout(plans, 8, 4, 1, 8).memory_per_device_bytes == flash.memory_per_device_bytes
    pp_lay = P.make_layout(CFG.replace(recompute="none"), 2, 4, 4, 8, **kw)
    assert (P.stage_activation_bytes(CFG.replace(recompute="none"), pp_lay, seq_len=4096, flash_attention=True)["bytes"]
            < P.stage_activation_bytes(CFG.replace(recompute="none"), pp_lay, seq_len=4096)["bytes"])
