"""A planned layout as mindformers and MindSpore take it: the training YAML, its check by mindformers' own
classes, and the settings of MindSpore's AutoParallel (and of the legacy auto-parallel context).

`mindformers_yaml` writes the YAML a layout becomes, in the shape of mindformers' published
`configs/llama2/pretrain_llama2_7b.yaml`; the planner (`mshelpers.parallel.make_layout`) prices the Config the
doctor reads from that file, built directly (`doctor.adapt.planned_config`; tests/doctor/test_one_price.py holds the
two to one price), so it writes the file only when asked. `validate_mindformers_yaml` loads it with mindformers' classes, `validate_with_mindformers`
runs mindformers' own split checks on a layout.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers.parallel import make_layout
    >>> from mshelpers.mindformers_yaml import auto_parallel_plan, mindformers_yaml, yaml_global_batch
    >>> cfg = RunConfig.preset("llama2-7b")
    >>> lay = make_layout(cfg, 8, 4, 1, 2, global_batch=64)          # no pipeline: 2 accumulation steps
    >>> spec = mindformers_yaml(cfg, lay)
    >>> spec["parallel_config"]["model_parallel"], spec["runner_config"]["gradient_accumulation_steps"]
    (4, 2)
    >>> yaml_global_batch(spec), auto_parallel_plan(lay)["wrapper"]
    (64, 'GradAccumulation')

Copied alone it needs the standard library; the validators need mindspore, mindformers and pyyaml at call time.
A layout is the doctor's `Layout` (`mshelpers.doctor.Layout`: dp, tp, pp, micro, grad_accum, batch) or any object
with dp, mp, pp, micro_batches and micro_batch_size (`mshelpers.parallel.PlannedLayout`, a view of the former).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:      # annotations only, never imported at run time: the module still copies alone
    from .parallel import PlannedLayout as Layout


# ---------------------------------------------------------------- the YAML a layout becomes
def mindformers_parallel_config(layout: Layout, *, vocab_emb_dp: bool = True, use_seq_parallel: bool = False) -> dict:
    """The `parallel_config` section of a mindformers YAML (and TransformerOpParallelConfig's kwargs) for `layout`.

    mindformers splits a step into micro-batches two ways: `micro_batch_num` is the pipeline's count (used
    only when pipeline_stage > 1), and `runner_config.gradient_accumulation_steps` accumulates without a
    pipeline. So with pp = 1 the layout's micro-batches go to gradient accumulation (see
    `mindformers_yaml`) and micro_batch_num stays 1.

        >>> from mshelpers.doctor import Layout
        >>> mindformers_parallel_config(Layout(dp=4, tp=8, batch=16))["model_parallel"]
        8

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    layout = _view(layout)
    return {"data_parallel": layout.dp, "model_parallel": layout.mp, "pipeline_stage": layout.pp,
            "micro_batch_num": layout.micro_batches if layout.pp > 1 else 1, "vocab_emb_dp": vocab_emb_dp,
            "use_seq_parallel": use_seq_parallel, "gradient_aggregation_group": 4}


def mindformers_yaml(cfg: Any, layout: Layout, *, seq_len: int | None = None, zero_stage: int = 1,
                     max_device_memory_gb: int = 58, use_flash_attention: bool = True,
                     recompute: bool | None = None, select_recompute: bool | None = None,
                     sequence_parallel: bool = False, virtual_stages: int = 1) -> dict:
    """A complete mindformers training YAML (as a dict) for `layout`, in the shape of mindformers' published
    `configs/llama2/pretrain_llama2_7b.yaml`; `validate_mindformers_yaml` loads it with mindformers' classes.

    Batch bookkeeping (mindformers, full_batch=True): global batch = runner_config.batch_size × data_parallel
    × micro_batch_num × gradient_accumulation_steps, with batch_size = sequences per micro-batch per dp rank.
    With pp = 1 the layout's micro-batches become gradient_accumulation_steps; with pp > 1, micro_batch_num.
    zero_stage ≥ 1 turns on MindSpore's parallel optimizer (optimizer states sharded over dp), the
    assumption `plan_parallel_layout(..., zero_stage=1)` prices. `sequence_parallel` sets use_seq_parallel (with
    mp > 1); `virtual_stages` > 1 sets pp_interleave_num and parallel.pipeline_config.pipeline_interleave. The
    planner prices what `doctor.read_config` reads from this file (`make_layout` builds that Config directly).

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"mindformers_yaml: zero_stage={zero_stage!r} is invalid; fix: 0, 1, 2 or 3")
    layout = _view(layout)
    seq = seq_len or _cfg_int(cfg, "seq_len")
    dtype = getattr(cfg, "compute_dtype", "bfloat16")
    rc = getattr(cfg, "recompute", "none")
    accum = layout.micro_batches if layout.pp == 1 else 1
    model_config = {
        "type": "LlamaConfig", "batch_size": layout.micro_batch_size, "seq_length": seq,
        "hidden_size": _cfg_int(cfg, "hidden_size"), "num_layers": _cfg_int(cfg, "num_layers"),
        "num_heads": _cfg_int(cfg, "num_heads"), "vocab_size": _cfg_int(cfg, "vocab_size"),
        "intermediate_size": _cfg_int(cfg, "ffn_hidden_size"), "rms_norm_eps": 1.0e-5,
        "compute_dtype": dtype, "layernorm_compute_type": "float32", "softmax_compute_type": "float32",
        "rotary_dtype": "float32", "param_init_type": "float32", "use_past": False,
        "use_flash_attention": use_flash_attention, "offset": 0}
    kv = getattr(cfg, "num_kv_heads", None)
    if kv and kv != model_config["num_heads"]:
        model_config["n_kv_heads"] = kv
    parallel = {"parallel_mode": 1, "gradients_mean": False, "full_batch": True,
                "search_mode": "sharding_propagation", "enable_parallel_optimizer": zero_stage >= 1,
                "strategy_ckpt_save_file": "./ckpt_strategy.ckpt",
                "parallel_optimizer_config": {"gradient_accumulation_shard": zero_stage >= 2,
                                              "parallel_optimizer_threshold": 64}}
    if virtual_stages > 1:
        model_config["pp_interleave_num"] = virtual_stages
        parallel["pipeline_config"] = {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}
    return {
        "seed": int(getattr(cfg, "seed", 0)), "output_dir": "./output", "run_mode": "train",
        "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": "llama2"},
        "runner_config": {"epochs": 1, "batch_size": layout.micro_batch_size, "sink_mode": True, "sink_size": 1,
                          "gradient_accumulation_steps": accum},
        "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8,
                      "learning_rate": float(getattr(cfg, "lr", 3e-4))},
        "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": float(getattr(cfg, "lr", 3e-4)),
                        "lr_end": 0.0, "warmup_ratio": 0.03, "total_steps": -1},
        "train_dataset": {"data_loader": {"type": "MindDataset", "dataset_dir": "", "shuffle": True},
                          "input_columns": ["input_ids"], "drop_remainder": True,
                          "batch_size": layout.micro_batch_size, "repeat": 1, "num_parallel_workers": 8},
        "train_dataset_task": {"type": "CausalLanguageModelDataset"},
        "use_parallel": True,
        "parallel": parallel,
        "parallel_config": mindformers_parallel_config(layout, use_seq_parallel=sequence_parallel and layout.mp > 1),
        "micro_batch_interleave_num": 1,
        "recompute_config": {"recompute": (rc == "full") if recompute is None else recompute,
                             "select_recompute": (rc == "selective") if select_recompute is None else select_recompute,
                             "parallel_optimizer_comm_recompute": False, "mp_comm_recompute": True,
                             "recompute_slice_activation": True},
        "context": {"mode": 0, "device_target": "Ascend", "max_call_depth": 10000,
                    "max_device_memory": f"{max_device_memory_gb}GB", "device_id": 0},
        "model": {"model_config": model_config, "arch": {"type": "LlamaForCausalLM"}},
        "runner_wrapper": {"type": "MFTrainOneStepCell", "use_clip_grad": True},
        "callbacks": [{"type": "MFLossMonitor"}],
    }


def yaml_global_batch(spec: dict) -> int:
    """The global batch a mindformers YAML trains on: batch_size × dp × micro_batch_num (pp > 1 only) × accumulation.
    Taught in notebooks/05_semi_auto_parallel.ipynb, as validate_mindformers_yaml's global_batch."""
    pc, rc = spec["parallel_config"], spec["runner_config"]
    mbn = pc.get("micro_batch_num", 1) if pc.get("pipeline_stage", 1) > 1 else 1
    return rc["batch_size"] * pc["data_parallel"] * mbn * rc.get("gradient_accumulation_steps", 1) \
        * spec.get("micro_batch_interleave_num", 1)


# ---------------------------------------------------------------- checked by mindformers' own classes
def validate_mindformers_yaml(spec: dict, path: Any = None) -> dict:
    """Load `spec` with mindformers' own classes and check it; return what they built.

    Writes the YAML to `path` (a temporary file if None), loads it with
    `mindformers.tools.register.MindFormerConfig`, builds `TransformerOpParallelConfig` from its
    parallel_config, `TransformerRecomputeConfig` from recompute_config and `LlamaConfig` from
    model.model_config (with that parallel config), and checks that the keys this function relies on
    survived the round trip. mindformers' own errors propagate. Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    import tempfile
    from pathlib import Path

    import yaml

    import mindspore  # noqa: F401  (mindformers expects it imported first)
    from mindformers.models.llama import LlamaConfig
    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig
    from mindformers.tools.register import MindFormerConfig
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="mf_yaml_")) / "train.yaml"
    path = Path(path)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    import logging
    quiet = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("mindformers")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:      # its templates log a WARNING per optional section left empty (moe_config, swap_config, ...)
        lg.setLevel(logging.ERROR)
    try:
        mf = MindFormerConfig(str(path))
    finally:
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
    import inspect
    for klass, sect in ((TransformerOpParallelConfig, "parallel_config"), (TransformerRecomputeConfig, "recompute_config")):
        known = inspect.signature(klass).parameters
        unknown = [k for k in mf[sect] if k not in known]
        if unknown:     # these classes swallow unknown keywords silently; a typo would be lost
            raise ValueError(f"validate_mindformers_yaml: {klass.__name__} takes no {unknown} ({sect})")
    pc = TransformerOpParallelConfig(**mf.parallel_config)
    rcfg = TransformerRecomputeConfig(**mf.recompute_config)
    mc = {k: v for k, v in mf.model.model_config.items() if k != "type"}
    llama = LlamaConfig(**mc, parallel_config=pc)
    for key in ("runner_config", "parallel", "parallel_config", "context", "model", "optimizer", "train_dataset"):
        if key not in mf:
            raise ValueError(f"validate_mindformers_yaml: MindFormerConfig lost section {key!r}")
    if mf.model.arch.type != "LlamaForCausalLM":
        raise ValueError(f"validate_mindformers_yaml: arch {mf.model.arch.type!r} is not LlamaForCausalLM")
    from mindformers.tools.register import MindFormerModuleType as T, MindFormerRegister
    for mt, sect in ((T.TRAINER, mf.trainer), (T.OPTIMIZER, mf.optimizer), (T.LR, mf.lr_schedule),
                     (T.DATASET, mf.train_dataset_task), (T.DATASET_LOADER, mf.train_dataset.data_loader),
                     (T.WRAPPER, mf.runner_wrapper), (T.MODELS, mf.model.arch), (T.CONFIG, mf.model.model_config)):
        if not MindFormerRegister.is_exist(mt, sect.type):
            raise ValueError(f"validate_mindformers_yaml: {sect.type!r} is not a registered mindformers {mt}")
    for mt, sect in ((T.OPTIMIZER, mf.optimizer), (T.LR, mf.lr_schedule)):
        sig = inspect.signature(MindFormerRegister.get_cls(mt, sect.type))
        unknown = [k for k in sect if k != "type" and k not in sig.parameters]
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            raise ValueError(f"validate_mindformers_yaml: {sect.type} takes no {unknown}")
    return {"path": path, "config": mf, "parallel_config": pc, "recompute_config": rcfg, "llama_config": llama,
            "global_batch": yaml_global_batch(spec)}


def validate_with_mindformers(cfg: Any, layout: Layout) -> Any:
    """Check `layout` against mindformers' own classes and return its TransformerOpParallelConfig.

    Builds TransformerOpParallelConfig from `mindformers_parallel_config(layout)`, then runs
    the split checks of mindformers' LLamaAttention (num_heads vs model_parallel) and
    LlamaFeedForward.shard (ffn width vs model_parallel) with cfg's head count and ffn width.
    The other sizes are shrunk so no real weights are allocated; works on CPU, no
    parallel context needed. mindformers' ValueError propagates unchanged.

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    import mindspore as ms   # noqa: F401  (mindformers expects it imported first)
    from mindformers.models.llama.llama_layer import LlamaFeedForward
    from mindformers.models.llama.llama_transformer import LLamaAttention
    from mindformers.modules.transformer import TransformerOpParallelConfig
    layout = _view(layout)
    pc = TransformerOpParallelConfig(**mindformers_parallel_config(layout))
    heads, ffn = _cfg_int(cfg, "num_heads"), _cfg_int(cfg, "ffn_hidden_size")
    LLamaAttention(seq_length=8, dim=heads * 2, n_heads=heads, n_kv_heads=None, parallel_config=pc,
                   use_flash_attention=False)
    # dim = a multiple of mp keeps the FFN's own dim check quiet; hidden_dim is the real width
    LlamaFeedForward(dim=layout.mp * 2, intermediate_size=ffn, hidden_dim=ffn, parallel_config=pc).shard(pc)
    return pc


# ---------------------------------------------------------------- MindSpore's AutoParallel settings
def auto_parallel_context(layout: Layout, zero_stage: int = 1) -> dict:
    """Keyword arguments for the legacy `mindspore.set_auto_parallel_context` under semi_auto_parallel.

    MindSpore 2.9's docstring says this function will be removed; `auto_parallel_plan` gives the same
    settings for `mindspore.parallel.auto_parallel.AutoParallel`, the primary form. `gradients_mean` is
    False, as in `mindformers_yaml`'s `parallel` section and mindformers' published llama2 configs
    (full_batch=True: the loss is already the global batch's mean, so the gradient all-reduce sums).

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    layout = _view(layout)
    ctx = {"parallel_mode": "semi_auto_parallel", "device_num": layout.n_devices, "gradients_mean": False,
           "full_batch": True, "enable_parallel_optimizer": zero_stage >= 1}
    if zero_stage >= 1:
        ctx["parallel_optimizer_config"] = {"optimizer_level": f"level{zero_stage}"}
    if layout.pp > 1:
        ctx["pipeline_stages"] = layout.pp
    return ctx


def auto_parallel_plan(layout: Layout, zero_stage: int = 1) -> dict:
    """How to build `layout` with `mindspore.parallel.auto_parallel.AutoParallel` (MindSpore ≥ 2.5):
    the micro-batch wrapper (`mindspore.parallel.nn.Pipeline` for pp > 1, `GradAccumulation` for pp = 1
    with m > 1), AutoParallel's mode, and the keyword arguments of its `pipeline(...)` and `hsdp(...)`
    calls (hsdp = the parallel optimizer: optimizer_level "level1" shards optimizer states = ZeRO-1).
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    layout = _view(layout)
    m = layout.micro_batches
    wrapper = "Pipeline" if layout.pp > 1 else ("GradAccumulation" if m > 1 else None)
    return {"wrapper": wrapper, "micro_size": m, "parallel_mode": "semi_auto",
            "pipeline": {"stages": layout.pp, "scheduler": "1f1b"} if layout.pp > 1 else None,
            "hsdp": {"shard_size": -1, "threshold": 64, "optimizer_level": f"level{zero_stage}"}
            if zero_stage >= 1 else None}


# ---------------------------------------------------------------- internals
def _view(layout: Any) -> Any:
    """The planner's names for a layout: the doctor's Layout (tp, n_micro, batch, devices) read as dp, mp, pp,
    micro_batches, micro_batch_size, n_devices; any other object as it is."""
    if hasattr(layout, "mp") or not hasattr(layout, "tp"):
        return layout
    from types import SimpleNamespace
    return SimpleNamespace(dp=layout.dp, mp=layout.tp, pp=layout.pp, micro_batches=layout.n_micro,
                           micro_batch_size=layout.batch, n_devices=layout.devices)


def _cfg_int(cfg: Any, name: str) -> int:
    """A positive integer field of the config (as parallel._cfg_int, inlined: the module copies alone)."""
    v = getattr(cfg, name, None)
    import numbers
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0:
        return int(v)
    raise ValueError(f"cfg.{name}={v!r} is invalid; fix: pass a RunConfig (RunConfig.preset(...)) "
                     "with a positive integer there")
