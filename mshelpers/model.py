"""Build mindformers' LlamaForCausalLM from a RunConfig, with the CPU flags applied only on CPU.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers.model import build_model, count_params
    >>> net = build_model(RunConfig.preset("mini"))
    >>> count_params(net)
    3688704

On CPU three mindformers defaults fail (see the README's platform notes):
flash attention and the fused RmsNorm kernel are Ascend-only, and the default rotary
embedding uses a broadcasting BatchMatMul that the CPU kernel refuses.
"""
from __future__ import annotations

import logging
from typing import Any



HALF = {"float16", "bfloat16"}



def precision_knobs(cfg: RunConfig, device: str = "CPU") -> dict[str, str]:
    """Map an AMP level to mindformers' own precision knobs.

    mindformers' LLaMA does its mixed precision through dtype fields rather than
    `ms.amp.auto_mixed_precision` (whose O1-O3 rewrites fail on it). The mapping:
      O0: everything float32.
      O1: matmuls in the half type; softmax, norms, rotary and params stay float32.
      O2: as O1, plus softmax in the half type (params and norms float32, Apex O2 style).
      O3: everything, parameters included (param_init_type), in the half type.
    The half type is cfg.compute_dtype if that is a half type, else float16. This is the cookbook's mapping onto
    mindformers' fields, not MindSpore's levels: `ms.amp.auto_mixed_precision(net, "O3")` casts every op's inputs
    but leaves the stored parameters float32 (notebook 03 measures both).
    Taught in notebooks/03_mixed_precision.ipynb.
    """
    half = cfg.compute_dtype if cfg.compute_dtype in HALF else "float16"
    f32 = "float32"
    table = {
        "O0": (f32, f32, f32, f32, f32),
        "O1": (half, f32, f32, f32, f32),
        "O2": (half, f32, half, f32, f32),
        "O3": (half, half, half, half, half),
    }
    if cfg.amp_level == "O0" and cfg.compute_dtype in HALF:
        table["O0"] = (half, f32, f32, f32, f32)   # an explicit half compute_dtype means O1-style
    compute, norm, softmax, rotary, param = table[cfg.amp_level]
    return dict(compute_dtype=compute, layernorm_compute_type=norm, softmax_compute_type=softmax,
                rotary_dtype=rotary, param_init_type=param)


def _not_hyper_parallel(record: logging.LogRecord) -> bool:
    return "hyper_parallel" not in record.getMessage()


def quiet_mindformers(level: int | None = logging.ERROR) -> None:
    """Quiet mindformers on the console, two ways.

    1. Drop the lines mindformers 1.9 logs on import for models nobody asked for ('Import PyNative...ForCausalLM
       failed: No module named hyper_parallel'; hyper_parallel is not on PyPI), and nothing else. Its logger is
       named 'mindformers' + $LOG_MF_PATH, so set that variable before importing mindformers (mshelpers does on
       import); without it this part is skipped.
    2. Raise the existing mindformers loggers to `level` (it prints INFO lines for every model built);
       `level=None` leaves levels alone.
    Taught in notebooks/11_your_own_model.ipynb.
    """
    import os
    if os.environ.get("LOG_MF_PATH"):
        lg = logging.getLogger("mindformers" + os.path.expanduser(os.environ["LOG_MF_PATH"]))
        if _not_hyper_parallel not in lg.filters:
            lg.addFilter(_not_hyper_parallel)
    if level is None:
        return
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if name.startswith("mindformers") and isinstance(lg, logging.Logger):
            lg.setLevel(level)


def llama_config(cfg: RunConfig, device: str | None = None, **overrides: Any):
    """A mindformers LlamaConfig for `cfg`. `overrides` go straight to LlamaConfig.
    Taught with the rest of model.py in notebooks/00_environment.ipynb."""
    cfg.validate()
    from mindformers import LlamaConfig
    quiet_mindformers()
    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig
    if device is None:
        if __package__:
            from .device import detect
        else:  # copied beside its siblings as plain files
            from device import detect
        device = detect()
    recompute = TransformerRecomputeConfig(recompute=cfg.recompute == "full",
                                           select_recompute=cfg.recompute == "selective")
    parallel = TransformerOpParallelConfig(data_parallel=cfg.dp, model_parallel=cfg.mp,
                                           pipeline_stage=cfg.pp, micro_batch_num=cfg.micro_batches,
                                           recompute=recompute)
    kw: dict[str, Any] = dict(
        batch_size=max(1, cfg.batch_size // cfg.dp), seq_length=cfg.seq_len, hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, intermediate_size=cfg.ffn_hidden_size,
        vocab_size=cfg.vocab_size, parallel_config=parallel, **precision_knobs(cfg, device))
    if device == "CPU":
        kw.update(use_flash_attention=False,   # the flash-attention kernel is Ascend-only
                  use_rope_slice=True,         # avoids the broadcasting BatchMatMul CPU refuses
                  fused_rms_norm=False)        # fused RmsNorm is Ascend-only
    kw.update(overrides)
    lc = LlamaConfig(**kw)
    # Lazy inline breaks the CPU compile under msrun; harmless to disable elsewhere on CPU.
    if device == "CPU":
        lc.disable_lazy_inline = True
    return lc


def build_model(cfg: RunConfig, device: str | None = None, **overrides: Any):
    """mindformers LlamaForCausalLM for `cfg`, in training mode (a call returns the loss).
    Taught in notebooks/00_environment.ipynb."""
    from mindformers import LlamaForCausalLM
    net = LlamaForCausalLM(config=llama_config(cfg, device, **overrides))  # keyword form: see llama_config
    net.set_train(True)
    return net


def count_params(net) -> int:
    """Number of trainable parameter values in a Cell.
    Taught in notebooks/00_environment.ipynb."""
    return int(sum(p.size for p in net.trainable_params()))
