"""mshelpers.model: the mindformers LLaMA the cookbook builds (was in tests/test_model_train.py)."""
from mshelpers.config import RunConfig
from mshelpers.model import build_model, count_params, llama_config, precision_knobs


def test_mini_parameter_count_matches_mindformers():
    assert count_params(build_model(RunConfig.preset("mini"))) == 3_688_704


def test_cpu_flags_only_on_cpu():
    cfg = RunConfig.preset("tiny")
    cpu = llama_config(cfg, device="CPU")
    assert cpu.use_flash_attention is False and cpu.use_rope_slice is True and cpu.fused_rms_norm is False
    assert cpu.disable_lazy_inline is True
    asc = llama_config(cfg, device="Ascend")
    assert not getattr(asc, "disable_lazy_inline", False) and asc.use_rope_slice is False


def test_precision_knobs_per_amp_level():
    cfg = RunConfig.preset("tiny")
    assert set(precision_knobs(cfg).values()) == {"float32"}
    o2 = precision_knobs(cfg.replace(amp_level="O2"))
    assert o2["compute_dtype"] == "float16" and o2["param_init_type"] == "float32"
    assert set(precision_knobs(cfg.replace(amp_level="O3", compute_dtype="bfloat16")).values()) == {"bfloat16"}
