"""Training memory, model states: parameter counts (LLaMA and GPT-style decoders) and the bytes of parameters,
gradients and Adam states per device under ZeRO and MindSpore's parallel optimizer; and the reader of a config's
fields that `memory.estimate` shares.

    >>> model_state_bytes(7_000_000_000) / 1e9          # 16 bytes/param, ZeRO paper
    112.0
    >>> model_state_bytes(7_000_000_000, zero_stage=3, dp=8) / 1e9
    14.0

All sizes are bytes. Pure Python, no sibling imports: the module can be copied alone.

Sources:
- Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", section 3.1 and figure 1 (2 + 2 + 12 bytes per parameter).
- Megatron-LM `megatron/training/theoretical_memory_usage.py` (18 bytes per parameter
  without the distributed optimizer) and DeepSpeed's
  `estimate_zero3_model_states_mem_needs` (18 bytes per parameter, fp32 gradients).
- MindSpore docs, "Optimizer Parallel" (weights and optimizer states sliced over data
  parallel); mindformers' FP32StateAdamWeightDecay.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from fractions import Fraction
from types import SimpleNamespace
from typing import Any


# Bytes per parameter for (parameters, gradients, optimizer states) under Adam.
ACCOUNTINGS: dict[str, tuple[int, int, int]] = {
    # ZeRO paper: fp16/bf16 params and grads, fp32 master copy + momentum + variance (4+4+4).
    "mixed": (2, 2, 12),
    # Plain fp32 training (what this CPU runs): fp32 params and grads, fp32 momentum + variance.
    "fp32": (4, 4, 8),
    # Megatron-LM and DeepSpeed code: 16-bit params, fp32 gradient buffer, fp32 master + moments.
    "fp32_grads": (2, 4, 12),
    # mindformers' FP32StateAdamWeightDecay: 16-bit params and grads, fp32 momentum + variance, no
    # fp32 master copy (the 16-bit weights are updated in place).
    "fp32_states": (2, 2, 8),
}
ZERO_STAGES = (0, 1, 2, 3)
SHARDINGS = ("none", "zero1", "zero2", "fsdp", "po")     # ZeRO stages 0-3 by index, then MindSpore's parallel optimizer
RECOMPUTE_MODES = ("none", "selective", "full")   # a config's recompute field (memory_activations' modes)


# --- parameter count ---
def llama_param_count(cfg: Any) -> int:
    """Parameters of mindformers' LlamaForCausalLM for `cfg` (no MindSpore needed).

    Embedding V·h, an untied lm_head V·h, and per layer 2·h² (q, o) + 2·h·(kv·d) (k, v; kv =
    cfg.num_kv_heads if the object has it, else num_heads; d = h/num_heads: grouped-query
    attention) + 3·h·ffn (SwiGLU w1, w2, w3) + 2·h (two RMSNorm weights), then a final h norm.
    `transformer_param_count(cfg)` with its defaults; cfg is a RunConfig, a Mapping or any object.

        >>> from mshelpers.config import RunConfig
        >>> llama_param_count(RunConfig.preset("mini"))
        3688704

    Taught in notebooks/04_data_parallel.ipynb.
    """
    return transformer_param_count(cfg, mlp="swiglu", tie_word_embeddings=False, bias=False,
                                   norm="rms", learned_positions=0, _fn="llama_param_count")


MLP_KINDS = ("swiglu", "gelu")
NORM_KINDS = ("rms", "layer")


def transformer_param_count(cfg: Any, *, mlp: str | None = None, tie_word_embeddings: bool | None = None,
                            bias: bool | None = None, norm: str | None = None, num_kv_heads: int | None = None,
                            learned_positions: int | None = None, _fn: str = "transformer_param_count") -> int:
    """Parameters of a decoder-only transformer, LLaMA-style by default, GPT-style by switches.

    cfg gives hidden_size, num_layers, vocab_size, num_heads and ffn_hidden_size (default 4·h)
    as attributes or Mapping keys (Hugging Face names such as n_embd, num_hidden_layers,
    num_attention_heads, intermediate_size are accepted too). Each switch is a keyword, else
    the cfg field of the same name, else the LLaMA default:
      mlp="swiglu" | "gelu"      3 matrices h·ffn (w1, w2, w3) or 2 (fc1, fc2)
      tie_word_embeddings=False  True: the lm_head reuses the embedding (V·h counted once)
      num_kv_heads=None          grouped-query attention: k and v are kv·(h/heads) wide
      bias=False                 True: every Linear has a bias and LayerNorms have a beta
      norm="rms" | "layer"       RMSNorm (h weights) or LayerNorm (h weights + h biases)
      learned_positions=0        rows of a learned position table (GPT-2: 1024)

    GPT-2 XL (h 1600, 48 layers, V 50257, 1024 positions, GELU, tied, biases, LayerNorm):
        >>> transformer_param_count(dict(hidden_size=1600, num_layers=48, num_heads=25, vocab_size=50257),
        ...     mlp="gelu", tie_word_embeddings=True, bias=True, norm="layer", learned_positions=1024)
        1557611200

    Taught in notebooks/11_your_own_model.ipynb.
    """
    spec = _spec(_fn, cfg, need=("hidden_size", "num_layers", "vocab_size"))
    h, L, v = spec.hidden_size, spec.num_layers, spec.vocab_size
    mlp = _switch(_fn, "mlp", mlp, spec.mlp, MLP_KINDS)
    norm = _switch(_fn, "norm", norm, spec.norm, NORM_KINDS)
    tied = bool(spec.tie_word_embeddings if tie_word_embeddings is None else tie_word_embeddings)
    bias = bool(spec.bias if bias is None else bias)
    ffn = spec.ffn_hidden_size or 4 * h
    kv = num_kv_heads if num_kv_heads is not None else spec.num_kv_heads
    kv_dim = h
    if kv is not None:
        a = spec.num_heads
        if a is None:
            raise ValueError(f"{_fn}: num_kv_heads={kv} needs cfg.num_heads; fix: add num_heads to cfg")
        kv = _pos_count(_fn, "num_kv_heads", kv)
        kv_dim = kv * (h // a)
    pos = _pos_count(_fn, "learned_positions", spec.learned_positions if learned_positions is None
                     else learned_positions, zero_ok=True)
    n_mats = 3 if mlp == "swiglu" else 2
    per_norm = 2 * h if norm == "layer" else h
    per_layer = 2 * h * h + 2 * h * kv_dim + n_mats * h * ffn + 2 * per_norm
    if bias:    # q, o, k, v biases; fc biases: (n_mats - 1)·ffn + h
        per_layer += 2 * h + 2 * kv_dim + (n_mats - 1) * ffn + h
    return (1 if tied else 2) * v * h + pos * h + L * per_layer + per_norm


# --- model states ---
def model_state_breakdown(n_params: int, *, zero_stage: int = 0, dp: int = 1,
                          accounting: str | tuple[int, int, int] = "mixed",
                          parallel_optimizer: bool = False, _fn: str = "model_state_breakdown") -> dict[str, int]:
    """Bytes per device for parameters, gradients and optimizer states under Adam.

    `accounting` picks the bytes per parameter (params, grads, optimizer states):
      "mixed"      2 + 2 + 12 = 16: the ZeRO paper's mixed-precision Adam (Rajbhandari et al. 2020,
                   sec. 3.1): fp16 params and grads, fp32 master weights, momentum and variance.
      "fp32"       4 + 4 + 8 = 16: fp32 training, as on this CPU (no master copy needed).
      "fp32_grads" 2 + 4 + 12 = 18: what Megatron-LM's theoretical_memory_usage.py and DeepSpeed's
                   ZeRO estimators count, because both keep gradients in fp32.
      "fp32_states" 2 + 2 + 8 = 12: mindformers' FP32StateAdamWeightDecay with 16-bit weights
                   (param_init_type float16/bfloat16): fp32 momentum and variance, no fp32 master
                   copy. (MindSpore's plain AdamWeightDecay clones its states from the parameters,
                   so with 16-bit weights they are 16-bit too: pass the tuple (2, 2, 4).)
      a tuple (p, g, o) of bytes per parameter, for anything else.
    ZeRO shards over `dp` ranks, in order: stage 1 the optimizer states, stage 2 also the
    gradients, stage 3 also the parameters (so mixed Adam gives 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N).
    `parallel_optimizer=True` is MindSpore's optimizer parallel ("enable_parallel_optimizer"
    in mindformers' `parallel` section): the weights and the optimizer states are stored as
    1/dp slices and each rank updates its slice; gradients stay whole, as in a run that
    accumulates them in place (without accumulation the graph slices them as they are produced:
    `sharded_state_bytes`, the rule this sums, and `memory.estimate`). Its
    parallel_optimizer_threshold (small tensors stay whole) is ignored: for LLaMA only the norm
    weights fall under it. A shard is rounded up to whole bytes.

        >>> model_state_breakdown(1000, dp=4, accounting="fp32_states", parallel_optimizer=True)
        {'params': 500, 'grads': 2000, 'optimizer_states': 2000}

        >>> model_state_breakdown(1000, zero_stage=2, dp=4)
        {'params': 2000, 'grads': 500, 'optimizer_states': 3000}

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    n_params = _pos_count(_fn, "n_params", n_params)
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"{_fn}: zero_stage={zero_stage!r} is invalid; fix: use one of {ZERO_STAGES}")
    dp = _pos_count(_fn, "dp", dp)
    kind = ("fsdp" if zero_stage >= 2 else "po") if parallel_optimizer else SHARDINGS[zero_stage]
    # exact arithmetic (Fractions), then the biggest rank's shard in whole bytes; gradients as an accumulating run
    # keeps them (whole under the parallel optimizer: see sharded_state_bytes)
    p, g, o, _ = sharded_state_bytes(Fraction(n_params), Fraction(0), ranks=dp, sharding=kind,
                                     bytes_per_param=accounting_bytes(accounting, _fn=_fn), accumulating=True)
    return {"params": math.ceil(p), "grads": math.ceil(g), "optimizer_states": math.ceil(o)}


def sharded_state_bytes(dense: float, expert: float = 0, *, ranks: int = 1, expert_ranks: int = 1,
                        sharding: str = "none", bytes_per_param: tuple[int, int, int] = (2, 2, 12),
                        accumulating: bool = False, accum_buffer: bool = False, shard_accum: bool = False,
                        layer_params: float = 0) -> tuple[float, float, float, float]:
    """(params, grads, optimizer states, the accumulation buffer counted in those grads) bytes on one device that
    holds `dense` parameters, sliced over `ranks`, and routed-expert parameters (`expert`, over `expert_ranks`):
    the one rule `model_state_breakdown` and the config doctor's `memory_per_stage` (so `memory.estimate`) use.

    sharding, over more than one rank (SHARDINGS): "zero1" slices the optimizer states, "zero2" also the gradients,
    "fsdp" (ZeRO-3) also the parameters (Rajbhandari et al. 2020); "po", MindSpore's parallel optimizer, the
    parameters and the states, and the gradients too when not accumulating in place: its graph reduce-scatters each
    gradient as the backward produces it and keeps its slice, one layer's whole gradients (`layer_params`) alive.
    accumulating (gradient accumulation, or pipeline micro-batches): MindSpore adds each micro-batch's gradients into
    accu_grads, the gradients' one copy (sliced over the ranks with `shard_accum`, mindformers'
    gradient_accumulation_shard); `accum_buffer`: a loop that sums them into a buffer of its own keeps a second copy,
    sliced as the gradients are (or with shard_accum). Plain arithmetic: pass Fractions for exact bytes.

        >>> sharded_state_bytes(1000, ranks=4, sharding="zero2", bytes_per_param=(2, 2, 12))
        (2000, 500.0, 3000.0, 0.0)

    Taught in notebooks/06_recompute_memory.ipynb (inside model_state_breakdown and estimate).
    """
    pb, gb, sb = bytes_per_param
    sharded = sharding != "none" and ranks > 1
    whole = dense + expert
    sliced = dense / ranks + expert / expert_ranks if sharded else whole
    in_place = accumulating and not accum_buffer
    params = pb * (sliced if sharding in ("po", "fsdp") else whole)
    grads = gb * (sliced if sharded and sharding in ("zero2", "fsdp") else
                  sliced + layer_params if sharded and sharding == "po" and not in_place else whole)
    if in_place and shard_accum and sharded:
        grads = grads / ranks
    buffer = (accumulating and accum_buffer) * gb * (
        sliced if sharded and (sharding in ("zero2", "fsdp") or shard_accum) else whole)
    return params, grads + buffer, sb * sliced, buffer


def accounting_bytes(accounting: str | tuple[int, int, int], *, _fn: str = "accounting_bytes") -> tuple[int, int, int]:
    """(params, grads, optimizer states) bytes per parameter of an accounting name or tuple (see ACCOUNTINGS).

        >>> accounting_bytes("fp32_states")
        (2, 2, 8)

    Taught in notebooks/06_recompute_memory.ipynb (inside model_state_breakdown and estimate).
    """
    if isinstance(accounting, tuple) and len(accounting) == 3 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in accounting):
        return accounting
    if isinstance(accounting, str) and accounting in ACCOUNTINGS:
        return ACCOUNTINGS[accounting]
    raise ValueError(f"{_fn}: accounting={accounting!r} is unknown; "
                     f"fix: use one of {sorted(ACCOUNTINGS)} or a (params, grads, states) "
                     "tuple of bytes per parameter")


def model_state_bytes(n_params: int, *, zero_stage: int = 0, dp: int = 1,
                      accounting: str | tuple[int, int, int] = "mixed", parallel_optimizer: bool = False) -> int:
    """Total bytes per device for params + grads + Adam states (see `model_state_breakdown`).

        >>> model_state_bytes(10**9) / 1e9, model_state_bytes(10**9, zero_stage=1, dp=8) / 1e9
        (16.0, 5.5)
        >>> model_state_bytes(10**9, accounting="fp32_grads") / 1e9
        18.0

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    return sum(model_state_breakdown(n_params, zero_stage=zero_stage, dp=dp, accounting=accounting,
                                     parallel_optimizer=parallel_optimizer, _fn="model_state_bytes").values())


# --- reading a config's fields ---
_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("n_embd", "d_model"), "num_layers": ("num_hidden_layers", "n_layer"),
    "num_heads": ("num_attention_heads", "n_head"), "vocab_size": ("padded_vocab_size",),
    "seq_len": ("seq_length", "n_positions"), "batch_size": (),
    "ffn_hidden_size": ("intermediate_size", "n_inner"),
    "num_kv_heads": ("num_key_value_heads", "n_kv_heads", "multi_query_group_num"),
}
_REQUIRED = ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_len", "batch_size")
_OPTIONAL = {"ffn_hidden_size": None, "num_kv_heads": None, "compute_dtype": "float32", "recompute": "none",
             "dp": 1, "mp": 1, "pp": 1, "micro_batches": 1, "grad_accum": 1, "mlp": "swiglu", "norm": "rms",
             "tie_word_embeddings": False, "bias": False, "learned_positions": 0}
_INT_FIELDS = ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_len", "batch_size",
               "ffn_hidden_size", "num_kv_heads", "dp", "mp", "pp", "micro_batches", "grad_accum")


class _Spec(SimpleNamespace):
    """The fields of a model/batch config, read once from a RunConfig, a Mapping or any object."""

    def replace(self, **kw: Any) -> "_Spec":
        return _Spec(**{**vars(self), **kw})


def _spec(fn: str, cfg: Any, need: tuple[str, ...] = _REQUIRED) -> _Spec:
    """Read cfg's fields (aliases included); one ValueError names every missing required field."""
    if not isinstance(cfg, _Spec):
        if not isinstance(cfg, Mapping) and callable(getattr(cfg, "validate", None)):
            cfg.validate()                       # a RunConfig checks itself first
        if isinstance(cfg, Mapping):
            get = cfg.get
        elif cfg is None or isinstance(cfg, (str, bytes, numbers.Number)):
            raise ValueError(f"{fn}: cfg={cfg!r} is not a config; fix: pass a RunConfig, a dict or an object "
                             f"with fields {', '.join(_REQUIRED)}")
        else:
            get = lambda k: getattr(cfg, k, None)   # noqa: E731
        vals: dict[str, Any] = {}
        for name in (*_REQUIRED, *_OPTIONAL):
            v = get(name)
            for alias in _FIELD_ALIASES.get(name, ()):
                if v is None:
                    v = get(alias)
            vals[name] = _OPTIONAL.get(name) if v is None else v
        if vals["mlp"] == "swiglu" and get("hidden_act") in ("gelu", "gelu_new", "gelu_pytorch_tanh") \
                and get("mlp") is None:
            vals["mlp"] = "gelu"                 # a Hugging Face GPT-style config says so by its activation
        cfg = _Spec(**vals)
    missing = [k for k in need if getattr(cfg, k) is None]
    for name in _INT_FIELDS:                     # a field that is there but wrong is named first
        v = getattr(cfg, name)
        if v is not None:
            setattr(cfg, name, _pos_count(fn, f"cfg.{name}", v))
    if missing:
        raise ValueError(f"{fn}: cfg lacks {', '.join(missing)}; fix: give {'it' if len(missing) == 1 else 'them'} "
                         f"as attributes or dict keys (parallel fields dp, mp, pp, micro_batches, grad_accum "
                         f"default to 1)")
    if cfg.recompute not in RECOMPUTE_MODES:
        raise ValueError(f"{fn}: cfg.recompute={cfg.recompute!r} is invalid; fix: one of {RECOMPUTE_MODES}")
    return cfg


def _switch(fn: str, name: str, given: Any, from_cfg: Any, allowed: tuple[str, ...]) -> str:
    v = from_cfg if given is None else given
    if v not in allowed:
        raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: one of {allowed}")
    return v


def _pos_count(fn: str, name: str, v: Any, zero_ok: bool = False) -> int:
    """A count from an int, a numpy integer or a float with an integral value (7e9); else one ValueError."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and (int(v) > 0 or zero_ok and int(v) == 0):
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a {'non-negative' if zero_ok else 'positive'} "
                     "integer" + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))


def _pos_arg(fn: str, name: str, v: Any) -> int:
    return _pos_count(fn, name, v)
