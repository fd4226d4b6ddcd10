"""Training memory per device for a config: `estimate` (a RunConfig, a dict or any object with the fields),
`fits` and `max_batch_for_budget` on it, and `estimate_from_mindformers_yaml` (a mindformers file). There is one
memory model: `estimate` reads the config into the config doctor's `Model` and `Layout` and takes its
`memory_per_stage` (mshelpers/doctor/cost.py), so a RunConfig and a mindformers file with the same model and
layout cost the same bytes (tests/test_memory_one_model.py). What only a measured CPU run needs is added here:
`activation_scale` and `overhead_bytes` (fitted by `calibrate`), `offload_optimizer`, `largest_activation`.
memory_probe.py measures the peak they are checked against, in a fresh process.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers import memory
    >>> cfg = RunConfig.preset("llama2-7b")
    >>> memory.llama_param_count(cfg)
    6738415616
    >>> est = memory.estimate(cfg, n_devices=8, zero_stage=1)
    >>> [round(est[k] / 1e9, 1) for k in ("params", "grads", "optimizer_states", "total")]
    [13.5, 13.5, 10.1, 889.5]
    >>> memory.fits(RunConfig.preset("mini"), 2**30)
    True

Real configs (mindformers' published Llama 2 pre-training YAMLs) are read by the config doctor:
    >>> e = memory.estimate_from_mindformers_yaml(
    ...     "tests/data/mindformers/pretrain_llama2_7b.yaml")                # doctest: +SKIP
    >>> e["layout"], e["budget"] // 2**30, e["fits"]                         # doctest: +SKIP
    ('dp8-mp1-pp1', 58, True)

All sizes are bytes. Pure Python: nothing here imports MindSpore. The formulas sit in three modules, each of which
can be copied alone: memory_states.py (parameter counts, ZeRO model states, the config reader),
memory_activations.py (Korthikanti's activations per layer, the logits) and memory_fit.py (`calibrate`). Their
names are importable from here too (`from mshelpers.memory import activation_bytes_per_layer`). This module
imports them, and the doctor/ folder, inside its functions: copied alone it imports; `estimate`, `estimate_stage`,
`doctor_config`, `fits` and `max_batch_for_budget` need memory_states.py, memory_activations.py and doctor/ beside it.
Where this CPU and an Ascend run differ, the difference is an input of the one model, not a second formula: the
bytes per parameter (`accounting`: fp32 Adam here, mixed precision there), the activation width (compute_dtype),
and whether accumulation keeps a buffer of its own (`grad_accum_buffer`: the cookbook's loop does, mindformers' does
not).

Sources: those of memory_states.py and memory_activations.py, and Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM" (1F1B keeps at most p - i micro-batches in flight on
stage i), as the doctor's memory_per_stage applies them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import replace
from typing import Any

_HALF_DTYPES = ("float16", "bfloat16")
_ZERO_SHARD = {0: "none", 1: "zero1", 2: "zero2", 3: "fsdp"}    # ZeRO stage -> the doctor's optimizer_shard
_SELECT = ("feed_forward.mul", "feed_forward.w1.activation")   # mindformers' select_recompute: True
# names kept importable from here: the module that defines each
_MOVED = {"memory_states": ("ACCOUNTINGS", "ZERO_STAGES", "RECOMPUTE_MODES", "MLP_KINDS", "NORM_KINDS",
                            "llama_param_count", "transformer_param_count", "model_state_breakdown",
                            "model_state_bytes", "accounting_bytes", "sharded_state_bytes", "SHARDINGS"),
          "memory_activations": ("ARCHS", "activation_bytes_per_layer", "output_activation_bytes"),
          "memory_fit": ("calibrate",)}


def __getattr__(name: str) -> Any:
    """`memory.calibrate`, `from mshelpers.memory import activation_bytes_per_layer`, ...: the moved names."""
    if name in _MOVED["memory_states"]:
        if __package__:
            from . import memory_states as mod
        else:  # copied beside its siblings as plain files
            import memory_states as mod
    elif name in _MOVED["memory_activations"]:
        if __package__:
            from . import memory_activations as mod
        else:
            import memory_activations as mod
    elif name in _MOVED["memory_fit"]:
        if __package__:
            from . import memory_fit as mod
        else:
            import memory_fit as mod
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(mod, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n for names in _MOVED.values() for n in names})


def _siblings() -> tuple[Any, Any]:
    """(memory_states, the doctor package): what estimate reads a config with and prices it by."""
    if __package__:
        from . import doctor as D
        from . import memory_states as S
    else:  # copied beside its siblings as plain files (and the doctor/ folder)
        import doctor as D
        import memory_states as S
    return S, D


def _switch_bool(fn: str, name: str, v: Any, none_ok: bool) -> None:
    """A yes/no keyword is True or False (a numpy bool, or 0 and 1 as a YAML writes them, too); else one line.
    bool('no') is True, so a string or a count is refused rather than read."""
    if (v is None and none_ok) or isinstance(v, bool) or type(v).__name__ == "bool_" or (type(v) is int and v in (0, 1)):
        return
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass True or False" + (" (or None for the default)"
                                                                                  if none_ok else ""))


# --- the doctor's Config for a config and layout ---
def doctor_config(cfg: Any, *, n_devices: int = 1, layout: Any = None, zero_stage: int = 0,
                  accounting: str | tuple[int, int, int] | None = None, sequence_parallel: bool | None = None,
                  flash_attention: bool = False, num_kv_heads: int | None = None, arch: str | None = None,
                  parallel_optimizer: bool = False, full_recompute_layers: int | None = None,
                  select_recompute_layers: int | None = None, grad_accum_buffer: bool | None = None,
                  shard_grad_accum: bool = False, n_params: int | None = None, mlp: str | None = None,
                  tie_word_embeddings: bool | None = None, bias: bool | None = None, norm: str | None = None,
                  qkv_bias: bool = False, vocab_emb_dp: bool = True, _fn: str = "doctor_config") -> Any:
    """The config doctor's `Config` (its `Model` and `Layout`) for a config and a layout: what `estimate` prices.

    cfg and every keyword are those of `estimate`. The model: cfg's sizes (num_kv_heads: grouped-query
    attention), the switches mlp, norm, bias, tie_word_embeddings, learned_positions, and `arch` (the activation
    block: default "gpt" for mlp="gelu", else "llama"); `n_params=` is held as the doctor's extra_params (your
    count minus the structural one, on the first stage); qkv_bias=True: biases on q, k and v only (Qwen, ChatGLM).
    The layout: dp, tp, pp and micro-batches as `estimate`
    reads them, micro-batch = batch_size / (dp · micro_batches), cfg.recompute (or full_recompute_layers and
    select_recompute_layers, per stage) on every stage, zero_stage (1, 2, 3: the doctor's "zero1", "zero2",
    "fsdp") or parallel_optimizer (its "po"), bytes per parameter from `accounting` (default "mixed" for a 16-bit
    compute_dtype, else "fp32"), and `grad_accum_buffer` (default cfg.grad_accum > 1: the cookbook's loop sums
    micro-steps into a buffer of its own; False: MindSpore's in-place accu_grads); vocab_emb_dp=False splits the
    embedding over tp as well (mindformers' parallel_config.vocab_emb_dp; True: whole on every tp rank).

        >>> from mshelpers.config import RunConfig
        >>> c = doctor_config(RunConfig.preset("llama2-7b"), n_devices=8, zero_stage=1)
        >>> c.layout.dp, c.layout.optimizer_shard, c.layout.param_bytes, c.model.block
        (8, 'zero1', 2, 'llama')

    Taught in notebooks/06_recompute_memory.ipynb (inside estimate).
    """
    S, D = _siblings()
    fn = _fn
    cfg = S._spec(fn, cfg)
    n_devices = S._pos_count(fn, "n_devices", n_devices)
    dp, tp, pp, micro = _degrees(cfg, n_devices, layout)
    if cfg.batch_size % (dp * micro):
        raise ValueError(f"{fn}: cfg.batch_size={cfg.batch_size} is not divisible by dp*micro_batches = "
                         f"{dp}*{micro}; fix: use a batch_size that is a multiple of {dp * micro}")
    if zero_stage not in S.ZERO_STAGES:
        raise ValueError(f"{fn}: zero_stage={zero_stage!r} is invalid; fix: use one of {S.ZERO_STAGES}")
    for name, v, none_ok in (("flash_attention", flash_attention, False), ("parallel_optimizer", parallel_optimizer, False),
                             ("shard_grad_accum", shard_grad_accum, False), ("qkv_bias", qkv_bias, False),
                             ("vocab_emb_dp", vocab_emb_dp, False), ("sequence_parallel", sequence_parallel, True),
                             ("grad_accum_buffer", grad_accum_buffer, True)):
        _switch_bool(fn, name, v, none_ok)
    if parallel_optimizer and zero_stage:
        raise ValueError(f"{fn}: parallel_optimizer=True with zero_stage={zero_stage}; fix: pick one (MindSpore's "
                         "parallel optimizer slices params and states, like ZeRO-1 plus the params)")
    half = cfg.compute_dtype in _HALF_DTYPES
    p_b, g_b, o_b = S.accounting_bytes(accounting or ("mixed" if half else "fp32"), _fn=fn)
    kv = num_kv_heads if num_kv_heads is not None else cfg.num_kv_heads
    S.transformer_param_count(cfg, mlp=mlp, tie_word_embeddings=tie_word_embeddings, bias=bias, norm=norm,
                              num_kv_heads=kv, _fn=fn)     # (checks the switches and kv, each in one line)
    kv = cfg.num_heads if kv is None else int(kv)
    if kv > cfg.num_heads or cfg.num_heads % kv:
        raise ValueError(f"{fn}: num_kv_heads={kv} must divide num_heads={cfg.num_heads}; "
                         "fix: pass a divisor of num_heads (None = multi-head attention)")
    mlp_ = S._switch(fn, "mlp", mlp, cfg.mlp, S.MLP_KINDS)
    block = arch if arch is not None else "gpt" if mlp_ == "gelu" else "llama"
    if block not in ("gpt", "llama"):
        raise ValueError(f"{fn}: arch={arch!r} is unknown; fix: use one of ('gpt', 'llama')")
    h, a = cfg.hidden_size, cfg.num_heads
    model = D.Model(name=str(getattr(cfg, "name", None) or "estimate"), layers=cfg.num_layers, hidden=h, heads=a,
                    kv_heads=kv, head_dim=h // a, ffn=cfg.ffn_hidden_size or 4 * h, vocab=cfg.vocab_size,
                    seq=cfg.seq_len, tied=bool(cfg.tie_word_embeddings if tie_word_embeddings is None
                                               else tie_word_embeddings),
                    attention="gqa" if kv < a else "mha", flash=bool(flash_attention), block=block, mlp=mlp_,
                    norm=S._switch(fn, "norm", norm, cfg.norm, S.NORM_KINDS),
                    bias=bool(cfg.bias if bias is None else bias), positions=int(cfg.learned_positions),
                    qkv_bias=bool(qkv_bias))
    if n_params is not None:      # the user's count: what the structural count misses sits on the first stage
        model = replace(model, extra_params=S._pos_count(fn, "n_params", n_params) - D.param_count(model))
    per = cfg.num_layers // pp
    if full_recompute_layers is None and select_recompute_layers is None:
        full, sel = {"full": (per, 0), "selective": (0, per), "none": (0, 0)}[cfg.recompute]
    else:
        for name, v in (("full_recompute_layers", full_recompute_layers),
                        ("select_recompute_layers", select_recompute_layers)):
            if v is not None:
                S._pos_count(fn, name, v, zero_ok=True)
        full = min(int(full_recompute_layers or 0), per)
        sel = min(int(select_recompute_layers or 0), per - full)
    sp = bool(getattr(layout, "sequence_parallel", False)) if sequence_parallel is None else bool(sequence_parallel)
    lay = D.Layout(dp=dp, tp=tp, pp=pp, micro=micro, batch=cfg.batch_size // (dp * micro), grad_accum=cfg.grad_accum,
                   seq_parallel=sp, optimizer_shard="po" if parallel_optimizer else _ZERO_SHARD[zero_stage],
                   shard_accum=bool(shard_grad_accum), vocab_emb_dp=bool(vocab_emb_dp), stage_layers=(per,) * pp,
                   full_recompute=(full,) * pp,
                   select_ops=(tuple((p, sel) for p in _SELECT) if sel else (),) * pp,
                   compute_dtype=cfg.compute_dtype, param_bytes=p_b, grad_bytes=g_b, state_bytes=o_b,
                   accum_buffer=cfg.grad_accum > 1 if grad_accum_buffer is None else bool(grad_accum_buffer))
    return D.Config(model=model, layout=lay, budget_bytes=None, dialect="runconfig")


# --- one device ---
def estimate_stage(cfg: Any, stage: int = 0, *, offload_optimizer: bool = False, activation_scale: float = 1.0,
                   overhead_bytes: float = 0, **kw: Any) -> dict[str, int]:
    """Peak training memory of one device of pipeline stage `stage` (0 = the first), as a breakdown dict (bytes).

    cfg and the keywords are those of `estimate`, which returns the stage with the largest total. The stage's
    params, grads (an accumulation buffer included), optimizer_states and activations are the doctor's
    `memory_per_stage` for `doctor_config(cfg, **kw)`; then `offload_optimizer` moves the states to host memory,
    `activation_scale` multiplies the activations and `overhead_bytes` is added (see `calibrate`). Keys: those of
    `estimate`.

        >>> from mshelpers.config import RunConfig
        >>> c = RunConfig.preset("mini").replace(pp=2, micro_batches=4)
        >>> first, last = estimate_stage(c, 0), estimate_stage(c, 1)
        >>> first["in_flight_micro_batches"], last["in_flight_micro_batches"], last["output_activations"] > 0
        (2, 1, True)

    Taught in notebooks/06_recompute_memory.ipynb (inside estimate).
    """
    return _price(cfg, stage, offload_optimizer, activation_scale, overhead_bytes, "estimate_stage", kw)


def _price(cfg: Any, stage: int | None, offload_optimizer: bool, activation_scale: float, overhead_bytes: float,
           fn: str, kw: dict) -> dict[str, int]:
    S, D = _siblings()
    _check_calibration(fn, overhead_bytes, activation_scale)
    conf = doctor_config(cfg, **kw, _fn=fn)
    m, lay = conf.model, conf.layout
    mem = D.memory_per_stage(conf)
    if stage is None:
        i = mem["stage"]
    elif isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage < lay.pp:
        i = stage
    else:
        raise ValueError(f"{fn}: stage={stage!r} is invalid; fix: pass a stage index, 0 <= stage < pp = {lay.pp}")
    part = mem["per_stage_breakdown"][i]
    act = D.cost.stage_activations(conf, i)
    host = part["optimizer_states"] if offload_optimizer else 0
    bpv = 2 if lay.compute_dtype in _HALF_DTYPES else 4
    s, b = m.seq // lay.cp, lay.batch
    scores = 0 if m.flash else math.ceil(b * (m.heads // lay.tp) * s ** 2 * bpv)
    logits = math.ceil(s * b * -(-m.vocab // lay.tp) * bpv) if i == lay.pp - 1 else 0
    per_layer = act["per_layer"]
    out = {"n_params": D.param_count(conf), "params": part["params"], "grads": part["grads"],
           "optimizer_states": part["optimizer_states"] - host,
           "activations": math.ceil(part["activations"] * activation_scale),
           "activations_per_layer": max(per_layer, key=per_layer.count) if per_layer else 0,
           "recompute_working_set": act["working"], "output_activations": act["output"],
           "grad_accum_buffer": mem["per_stage_grad_accum_buffer_bytes"][i],
           "largest_activation": max(scores, logits), "host_optimizer_states": host,
           "overhead": math.ceil(overhead_bytes), "layers": act["layers"],
           "in_flight_micro_batches": act["in_flight"], "full_recompute_layers": lay.full_recompute[i],
           "select_recompute_layers": max((k for _, k in lay.select_ops[i]), default=0), "stage": i,
           "per_stage_totals": list(mem["per_stage_bytes"]), "dp": lay.dp, "tp": lay.tp, "pp": lay.pp}
    out["total"] = (out["params"] + out["grads"] + out["optimizer_states"] + out["activations"] + out["overhead"])
    return out


# --- whole config ---
def estimate(cfg: Any, *, n_devices: int = 1, layout: Any = None, zero_stage: int = 0,
             accounting: str | tuple[int, int, int] | None = None, sequence_parallel: bool | None = None,
             offload_optimizer: bool = False, activation_scale: float = 1.0, overhead_bytes: float = 0,
             flash_attention: bool = False, num_kv_heads: int | None = None, arch: str | None = None,
             parallel_optimizer: bool = False, full_recompute_layers: int | None = None,
             select_recompute_layers: int | None = None, grad_accum_buffer: bool | None = None,
             shard_grad_accum: bool = False, n_params: int | None = None, mlp: str | None = None,
             tie_word_embeddings: bool | None = None, bias: bool | None = None,
             norm: str | None = None, qkv_bias: bool = False, vocab_emb_dp: bool = True) -> dict[str, int]:
    """Peak training memory per device for a model and batch, as a breakdown dict (bytes): the config doctor's
    `memory_per_stage` for `doctor_config(cfg, ...)`, its largest stage, plus the CPU-side terms below.

    cfg is a RunConfig, a Mapping (e.g. a dict or a Hugging Face config's to_dict()) or any
    object with these fields (Hugging Face names in brackets are read too):
      required   hidden_size (n_embd), num_layers (num_hidden_layers, n_layer), num_heads
                 (num_attention_heads, n_head), vocab_size, seq_len (seq_length), batch_size
      optional   ffn_hidden_size (intermediate_size, n_inner; default 4·hidden_size),
                 num_kv_heads (num_key_value_heads, multi_query_group_num), compute_dtype
                 ("float32"), recompute ("none"), and the parallel fields dp, mp, pp,
                 micro_batches, grad_accum (each 1 when absent)
      switches   mlp, tie_word_embeddings, bias, norm, learned_positions: see
                 `transformer_param_count` (keywords here win over cfg fields)
    All missing required fields are named in one ValueError. `n_params=` overrides the count
    (e.g. `sum(p.size for p in net.get_parameters())`; the difference sits on the first stage).

    Parallel degrees come from `layout` (any object with dp, mp (or tp), pp, micro_batches)
    or else from cfg.mp/pp/micro_batches with dp = n_devices/(mp·pp) (cfg.dp when n_devices=1).
    Micro-batch per device = cfg.batch_size / (dp · micro_batches). The doctor places the
    embedding (whole on every tp rank, vocab_emb_dp) on the first stage and the lm_head and
    the logits on the last; 1F1B keeps min(pp - i, micro_batches) micro-batches in flight on
    stage i; recompute adds one layer's dropped activations while it is rematerialised
    ("recompute_working_set"). Gradient accumulation (cfg.grad_accum > 1) adds a gradient-sized
    buffer, counted in grads and given as "grad_accum_buffer".
    Precision is an input: accounting (bytes per parameter for params, grads, Adam states;
    default "mixed" = 2 + 2 + 12 for a float16/bfloat16 compute_dtype, "fp32" = 4 + 4 + 8 for
    float32, as on this CPU) and the activation width (2 or 4 bytes, from compute_dtype).
    CPU-side terms, added here: `offload_optimizer=True` moves the optimizer states to host
    memory ("host_optimizer_states", not in "total"); `activation_scale` multiplies the
    activations and `overhead_bytes` (runtime, compiled graph, allocator pool) is added, both
    fitted to measured peaks by `calibrate`.
    What real configs use:
      flash_attention=True        no s² attention scores
      num_kv_heads                grouped-query attention (default: cfg's); it also shrinks the k, v weights
      arch                        the activation block: "llama" (mindformers' LLaMA block, SwiGLU of
                                  cfg.ffn_hidden_size, no dropout; the default) or "gpt" (Korthikanti's count
                                  as published; the default with mlp="gelu")
      accounting="fp32_states"    16-bit params and grads, fp32 Adam states (FP32StateAdamWeightDecay)
      zero_stage                  1: states, 2: + grads, 3: + params sliced over dp
      parallel_optimizer=True     MindSpore's optimizer parallel: params and states sliced over dp; without
                                  accumulation each gradient is reduce-scattered as it is produced
      grad_accum_buffer           default cfg.grad_accum > 1; shard_grad_accum slices it over dp
      sequence_parallel           (default: layout.sequence_parallel if present)
      full_recompute_layers, select_recompute_layers
                                  per-stage layer counts instead of cfg.recompute
      qkv_bias, vocab_emb_dp      biases on q, k, v only; the embedding split over tp (see `doctor_config`)

    Keys: n_params (count, whole model), params, grads, optimizer_states, activations (stored layers x in-flight
    micro-batches + recompute working set + output logits, times activation_scale), activations_per_layer,
    recompute_working_set, output_activations, grad_accum_buffer, largest_activation (the biggest single
    activation tensor: logits or attention scores), host_optimizer_states, overhead, total (the per-device sum),
    layers, in_flight_micro_batches, full_recompute_layers, select_recompute_layers, stage (the largest one),
    per_stage_totals, dp, tp, pp.

        >>> from mshelpers.config import RunConfig
        >>> e = estimate(RunConfig.preset("mini"))
        >>> e["params"], e["total"] == e["params"] + e["grads"] + e["optimizer_states"] + e["activations"]
        (14754816, True)

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    kw = dict(n_devices=n_devices, layout=layout, zero_stage=zero_stage, accounting=accounting,
              sequence_parallel=sequence_parallel, flash_attention=flash_attention, num_kv_heads=num_kv_heads,
              arch=arch, parallel_optimizer=parallel_optimizer, full_recompute_layers=full_recompute_layers,
              select_recompute_layers=select_recompute_layers, grad_accum_buffer=grad_accum_buffer,
              shard_grad_accum=shard_grad_accum, n_params=n_params, mlp=mlp,
              tie_word_embeddings=tie_word_embeddings, bias=bias, norm=norm, qkv_bias=qkv_bias,
              vocab_emb_dp=vocab_emb_dp)
    return _price(cfg, None, offload_optimizer, activation_scale, overhead_bytes, "estimate", kw)


# --- mindformers configs: the doctor's price ---
def estimate_from_mindformers_yaml(path: Any, *, budget_bytes: float | None = None, model_config: Any = None,
                                   hardware: str = "atlas-800t-a2") -> dict[str, Any]:
    """Per-device training memory of a mindformers training file against its budget, as the config doctor
    prices it: `doctor.read_config` (every dialect mindformers ships: r1.x, mcore with a config.json, 2.x
    PyNative; dense and MoE) and `doctor.memory_per_stage`, the figures `python -m mshelpers.doctor FILE`
    prints. `path` is a YAML file or its parsed dict; `model_config` a Hugging Face config.json (or its folder)
    for the keys the file leaves to pretrained_model_dir. Budget: `budget_bytes`, else context.max_device_memory,
    else the memory of the doctor's `hardware` profile (the CLI's rule).

    Returns the largest stage's breakdown, params, grads (with the accumulation buffer, which the doctor counts
    as the gradients' one copy), optimizer_states, activations and total, plus: stage (its index), per_stage_totals, n_params (whole model), devices, layout (e.g.
    "dp8-mp1-pp1"), dp, tp, pp, micro_batch_num, micro_batch, grad_accum_steps, parallel_optimizer, budget,
    fits, headroom, source, and config (the doctor's Config: model and layout as read).

        >>> e = estimate_from_mindformers_yaml("tests/data/mindformers/pretrain_llama2_7b.yaml")  # doctest: +SKIP
        >>> e["layout"], e["fits"]                                                                # doctest: +SKIP
        ('dp8-mp1-pp1', True)

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    if __package__:
        from . import doctor as D
    else:  # copied beside its siblings as plain files
        import doctor as D
    cfg = D.read_config(path, budget=budget_bytes, model_config=model_config)
    if cfg.budget_bytes is None:
        cfg = replace(cfg, budget_bytes=int(D.hardware(hardware).memory_bytes))
    cfg = D.with_reserve(cfg, D.hardware(hardware))       # HCCL's buffers kept free, as the doctor keeps them
    mem = D.memory_per_stage(cfg)
    lay, total = cfg.layout, mem["memory_per_device_bytes"]
    out: dict[str, Any] = dict(mem["breakdown"])
    out.update(total=total, stage=mem["stage"], per_stage_totals=list(mem["per_stage_bytes"]),
               n_params=D.param_count(cfg), devices=lay.devices, layout=f"dp{lay.dp}-mp{lay.tp}-pp{lay.pp}",
               dp=lay.dp, tp=lay.tp, pp=lay.pp, micro_batch_num=lay.micro, micro_batch=lay.batch,
               grad_accum_steps=lay.grad_accum, parallel_optimizer=lay.parallel_optimizer,
               budget=mem["budget_bytes"], fits=mem["fits"], headroom=mem["headroom_bytes"],
               reserve=mem["reserve_bytes"],
               source=str(path) if not isinstance(path, dict) else "<dict>", config=cfg)
    return out


# --- budgets and calibration ---
def fits(cfg: Any, budget_bytes: float, **kw: Any) -> bool:
    """True if `estimate(cfg, **kw)["total"]` is within `budget_bytes` per device.

        >>> from mshelpers.config import RunConfig
        >>> fits(RunConfig.preset("llama2-7b"), 64 * 2**30), fits(RunConfig.preset("llama2-7b").replace(
        ...     batch_size=8, recompute="full"), 64 * 2**30, n_devices=8, zero_stage=3)
        (False, True)

    Taught in notebooks/06_recompute_memory.ipynb (max_batch_for_budget's test).
    """
    _check_budget("fits", budget_bytes)
    S, _ = _siblings()
    return estimate(S._spec("fits", cfg), **kw)["total"] <= budget_bytes


def max_batch_for_budget(cfg: Any, budget_bytes: float, *, limit: int = 1 << 20, **kw: Any) -> int:
    """Largest global batch_size (a multiple of dp·micro_batches) whose estimate fits `budget_bytes`.

    Returns 0 when not even the smallest batch fits (the model states alone may not).
    Other keywords go to `estimate` (n_devices, layout, zero_stage, overhead_bytes, ...).
    The search stops at `limit` sequences.

        >>> from mshelpers.config import RunConfig
        >>> mini = RunConfig.preset("mini")
        >>> max_batch_for_budget(mini, 2**30) < max_batch_for_budget(mini.replace(recompute="full"), 2**30)
        True

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    _check_budget("max_batch_for_budget", budget_bytes)
    S, _ = _siblings()
    cfg = S._spec("max_batch_for_budget", cfg)
    estimate(cfg, **kw)              # validates cfg and kw once, before the search
    dp, _, _, micro = _degrees(cfg, kw.get("n_devices", 1), kw.get("layout"))
    unit = dp * micro

    def ok(k: int) -> bool:
        return estimate(cfg.replace(batch_size=k * unit), **kw)["total"] <= budget_bytes

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi * unit <= limit and ok(hi):     # memory grows with batch: double, then bisect
        lo, hi = hi, hi * 2
    hi = min(hi, limit // unit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * unit


# --- small helpers ---
def human_bytes(n: float) -> str:
    """'1.50 GiB' style, binary units.

        >>> human_bytes(3 * 2**29)
        '1.50 GiB'

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _check_calibration(fn: str, overhead_bytes: Any, activation_scale: Any) -> None:
    if not isinstance(overhead_bytes, numbers.Real) or isinstance(overhead_bytes, bool) or not overhead_bytes >= 0:
        raise ValueError(f"{fn}: overhead_bytes={overhead_bytes!r} is invalid; fix: pass a number >= 0")
    if not isinstance(activation_scale, numbers.Real) or isinstance(activation_scale, bool) \
            or not activation_scale > 0:
        raise ValueError(f"{fn}: activation_scale={activation_scale!r} is invalid; "
                         "fix: pass a positive number (1.0 = the formulas as published)")


def _check_budget(fn: str, budget: Any) -> None:
    if not isinstance(budget, numbers.Real) or isinstance(budget, bool) or not budget > 0 or math.isinf(budget):
        raise ValueError(f"{fn}: budget_bytes={budget!r} is invalid; fix: pass a positive number of bytes, "
                         "e.g. 16 * 2**30 for 16 GiB")


def _degrees(cfg: Any, n_devices: int, layout: Any) -> tuple[int, int, int, int]:
    """(dp, tp, pp, micro_batches) from a layout object or from the RunConfig and n_devices."""
    S, _ = _siblings()
    if layout is not None:
        try:
            dp = layout.dp
            mp = getattr(layout, "mp", None)     # mp=0 is a bad mp, not a reason to look for tp
            tp = mp if mp is not None else getattr(layout, "tp")
            pp, micro = layout.pp, layout.micro_batches
        except AttributeError as e:
            raise ValueError(f"estimate: layout={layout!r} lacks {e}; fix: pass an object with "
                             "dp, mp (or tp), pp and micro_batches attributes") from None
        for name, v in (("dp", dp), ("mp", tp), ("pp", pp), ("micro_batches", micro)):
            S._pos_count("estimate", f"layout.{name}", v)
        if n_devices != 1 and n_devices != dp * tp * pp:
            raise ValueError(f"estimate: n_devices={n_devices} does not match layout dp*mp*pp = "
                             f"{dp}*{tp}*{pp} = {dp * tp * pp}; fix: pass n_devices={dp * tp * pp} or omit it")
    else:
        tp, pp, micro = cfg.mp, cfg.pp, cfg.micro_batches
        if n_devices == 1:
            dp = cfg.dp
        elif n_devices % (tp * pp):
            raise ValueError(f"estimate: n_devices={n_devices} is not divisible by cfg.mp*cfg.pp = {tp * pp}; "
                             f"fix: use a multiple of {tp * pp}")
        else:
            dp = n_devices // (tp * pp)
            if cfg.dp not in (1, dp):
                raise ValueError(f"estimate: n_devices={n_devices} gives dp={dp} but cfg.dp={cfg.dp}; "
                                 f"fix: pass n_devices={cfg.dp * tp * pp} or set cfg.dp=1")
    if pp > cfg.num_layers or cfg.num_layers % pp:
        raise ValueError(f"estimate: pp={pp} must divide num_layers={cfg.num_layers}; fix: pick a divisor")
    return dp, tp, pp, micro
