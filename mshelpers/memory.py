"""Training memory, estimated: parameter counts, ZeRO model states, Korthikanti activations, and the estimate
for a config built from them (the formulas the doctor prices every layer with). memory_probe.py measures the
peak they are checked against, in a fresh process.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers import memory
    >>> cfg = RunConfig.preset("llama2-7b")
    >>> memory.llama_param_count(cfg)
    6738415616
    >>> memory.model_state_bytes(7_000_000_000) / 1e9          # 16 bytes/param, ZeRO paper
    112.0
    >>> memory.model_state_bytes(7_000_000_000, zero_stage=3, dp=8) / 1e9
    14.0
    >>> est = memory.estimate(cfg, n_devices=8, zero_stage=1)
    >>> [round(est[k] / 1e9, 1) for k in ("params", "grads", "optimizer_states", "total")]
    [13.5, 13.5, 10.1, 874.5]
    >>> memory.fits(RunConfig.preset("mini"), 2**30)
    True

Real configs (mindformers' published Llama 2 pre-training YAMLs) are priced by the config doctor, the one
cost model for a model on a layout (mshelpers/doctor/, copied beside this file as its folder):
    >>> e = memory.estimate_from_mindformers_yaml(
    ...     "tests/data/mindformers/pretrain_llama2_7b.yaml")                # doctest: +SKIP
    >>> e["layout"], e["budget"] // 2**30, e["fits"]                         # doctest: +SKIP
    ('dp8-mp1-pp1', 58, True)

All sizes are bytes. Pure Python: nothing here imports MindSpore. The module imports nothing from its
siblings at load time, so it can be copied alone.

What the estimator covers, and where each term is defined:
- `activation_bytes_per_layer`, `output_activation_bytes`: Korthikanti's count, plus flash
  attention, grouped-query attention, mindformers' LLaMA block (SwiGLU, no dropout, its
  select_recompute). The doctor's `memory_per_stage` prices every layer with these two.
- `model_state_breakdown`: ZeRO stages, MindSpore's parallel optimizer, and mindformers'
  FP32StateAdamWeightDecay ("fp32_states": 16-bit weights and grads, fp32 Adam states).
- `estimate_stage`, `estimate`: one device of one pipeline stage for a RunConfig or any object with
  the fields (the cookbook's own models, whose measured peaks `calibrate` fits it to; notebooks 06, 11).
- `estimate_from_mindformers_yaml`: a mindformers file, priced by the doctor (`doctor.memory_per_stage`).

Sources:
- Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", section 3.1 and figure 1 (2 + 2 + 12 bytes per parameter).
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", section 4 and table 2 (activation bytes per layer).
- Megatron-LM `megatron/training/theoretical_memory_usage.py` (18 bytes per parameter
  without the distributed optimizer) and DeepSpeed's
  `estimate_zero3_model_states_mem_needs` (18 bytes per parameter, fp32 gradients).
- Dao et al. 2022, "FlashAttention": the s² attention matrix is never materialised.
- Ainslie et al. 2023, "GQA": num_kv_heads < num_heads shrinks K and V.
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM": 1F1B keeps at most p micro-batches in flight on the first stage.
- MindSpore docs, "Optimizer Parallel" (weights and optimizer states sliced over data
  parallel) and "Gradient Accumulation"; mindformers docs: configuration
  (parallel_config, recompute_config, context.max_device_memory), the Llama 2
  performance-tuning notes (select_recompute of SiLU and Mul; 13B at dp 8 needing full
  recompute), FP32StateAdamWeightDecay, and mindformers/models/llama/llama_layer.py.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from fractions import Fraction
from dataclasses import replace
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
ARCHS = ("gpt", "llama")
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "selective", "full")
_HALF_DTYPES = ("float16", "bfloat16")


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
    1/dp slices and each rank updates its slice; gradients stay whole (they are reduce-scattered
    only at the update). Its parallel_optimizer_threshold (small tensors stay whole) is ignored:
    for LLaMA only the norm weights fall under it. A shard is rounded up to whole bytes.

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
    if isinstance(accounting, tuple) and len(accounting) == 3 and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in accounting):
        p_b, g_b, o_b = accounting
    elif isinstance(accounting, str) and accounting in ACCOUNTINGS:
        p_b, g_b, o_b = ACCOUNTINGS[accounting]
    else:
        raise ValueError(f"{_fn}: accounting={accounting!r} is unknown; "
                         f"fix: use one of {sorted(ACCOUNTINGS)} or a (params, grads, states) "
                         "tuple of bytes per parameter")
    po = bool(parallel_optimizer)

    def shard(total: int, sharded: bool) -> int:
        return -(-total // dp) if sharded else total   # ceil: the biggest rank's shard

    return {"params": shard(p_b * n_params, zero_stage >= 3 or po),
            "grads": shard(g_b * n_params, zero_stage >= 2),
            "optimizer_states": shard(o_b * n_params, zero_stage >= 1 or po)}


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


# --- activations ---
def activation_bytes_per_layer(seq_len: int, batch: int, hidden_size: int, n_heads: int, *, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               bytes_per_value: float = 2, flash_attention: bool = False,
                               num_kv_heads: int | None = None, ffn_hidden_size: int | None = None,
                               arch: str = "gpt") -> int:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al. 2022).

    With s = seq_len, b = micro-batch per device, h = hidden, a = heads, t = tp, and
    16-bit activations (their section 4.1, table 2), for their GPT block (arch="gpt"):
      none, t = 1           s·b·h·(34 + 5·a·s/h)
      tensor parallel t     s·b·h·(10 + 24/t + 5·a·s/(h·t))   (norms, dropouts unsplit)
      tp + sequence par.    s·b·h·(34 + 5·a·s/h) / t
      selective recompute   drops the 5·a·s/h term (softmax, its dropout, QK^T, attention over V)
      full recompute        2·s·b·h: only the layer input is kept (/t with sequence parallel)
    Where the numbers come from, per s·b·h: 10 unsplit = two LayerNorm inputs 4 + QKV input 2 +
    MLP input 2 + two 1-byte dropout masks 2; 24 split = Q 2 + K 2 + V 2 + out-projection input 2
    + MLP 4·r (the 4h-wide fc1 output and GeLU output, r = ffn/h = 4).
    Extensions, each a term of that count:
      flash_attention   the s² scores are never stored (FlashAttention, Dao et al. 2022): the
                        5·a·s/h term is 0. Its O(s) softmax statistics are ignored.
      num_kv_heads      grouped-query attention: K and V are kv/a as wide, so 2 + 2 becomes
                        2·g + 2·g with g = num_kv_heads/n_heads.
      ffn_hidden_size   MLP width f (default 4h for "gpt"; required for "llama"), r = f/h.
      arch="llama"      mindformers' LLaMA block: RMSNorm, no dropout (unsplit 8 = norm inputs 4
                        + QKV input 2 + MLP input 2), a SwiGLU MLP that stores four f-wide tensors
                        (w1 out, w3 out, SiLU out, product: 8·r), and "selective" recompute as
                        mindformers' default select_recompute patterns (feed_forward.mul and
                        feed_forward.w1.activation.silu: drops SiLU out and product, 4·r) in
                        addition to the attention scores.
    So per s·b·h: gpt = 10 + (4 + 4g + 4r + 5as/h)/t, llama = 8 + (4 + 4g + 8r + 5as/h)/t, and
    with sequence parallel the unsplit part is divided by t as well (the all-gathered inputs of
    the column-parallel linears are re-gathered in backward, not stored; in mindformers that is
    select_comm_recompute of the norms). `bytes_per_value` rescales the whole count from 2 bytes
    to another width (4 for fp32 on CPU); the 1-byte masks are scaled too, which is slightly
    pessimistic. The count is exact arithmetic, rounded up once to whole bytes.

        >>> activation_bytes_per_layer(128, 8, 256, 4)            # 128*8*256*(34+10)
        11534336
        >>> activation_bytes_per_layer(128, 8, 256, 4, recompute="full")
        524288
        >>> activation_bytes_per_layer(128, 8, 256, 4, flash_attention=True) == 128 * 8 * 256 * 34
        True

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    s, b, h, a, t = (_pos_arg("activation_bytes_per_layer", n, v) for n, v in
                     (("seq_len", seq_len), ("batch", batch), ("hidden_size", hidden_size),
                      ("n_heads", n_heads), ("tp", tp)))
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"activation_bytes_per_layer: recompute={recompute!r} is invalid; "
                         f"fix: use one of {RECOMPUTE_MODES}")
    if not isinstance(bytes_per_value, numbers.Real) or isinstance(bytes_per_value, bool) or bytes_per_value <= 0:
        raise ValueError(f"activation_bytes_per_layer: bytes_per_value={bytes_per_value!r} is invalid; "
                         "fix: pass the activation width in bytes (2 for fp16/bf16, 4 for fp32)")
    if arch not in ARCHS:
        raise ValueError(f"activation_bytes_per_layer: arch={arch!r} is unknown; fix: use one of {ARCHS}")
    kv = a if num_kv_heads is None else _pos_arg("activation_bytes_per_layer", "num_kv_heads", num_kv_heads)
    if kv > a or a % kv:
        raise ValueError(f"activation_bytes_per_layer: num_kv_heads={kv} must divide n_heads={a}; "
                         "fix: pass a divisor of n_heads (None = multi-head attention)")
    if ffn_hidden_size is None and arch == "llama":
        raise ValueError("activation_bytes_per_layer: ffn_hidden_size=None with arch='llama'; "
                         "fix: pass the SwiGLU width, e.g. 11008 for LLaMA-2 7B")
    f = 4 * h if ffn_hidden_size is None else _pos_arg("activation_bytes_per_layer", "ffn_hidden_size",
                                                         ffn_hidden_size)
    F = Fraction
    g, r = F(kv, a), F(f, h)
    attn = 0 if flash_attention else F(5 * a * s, h)   # the s²-sized attention tensors, per sbh
    if arch == "gpt":
        unsplit, split, selective_drop = F(10), 4 + 4 * g + 4 * r, F(0)
    else:
        unsplit, split, selective_drop = F(8), 4 + 4 * g + 8 * r, 4 * r
    sbh = s * b * h
    if recompute == "full":
        per_sbh = F(2, t if sequence_parallel else 1)
    else:
        split_part = split + (attn if recompute == "none" else -selective_drop)
        per_sbh = (unsplit + split_part) / t if sequence_parallel else unsplit + split_part / t
    return math.ceil(sbh * per_sbh * F(bytes_per_value) / 2)


def output_activation_bytes(seq_len: int, batch: int, vocab_size: int, *, tp: int = 1,
                            bytes_per_value: int = 2) -> int:
    """Logits plus the fp32 softmax of the cross-entropy: 4·s·b·V/t bytes at 16 bits (Korthikanti eq. 4).

        >>> output_activation_bytes(128, 8, 1024)
        4194304

    Taught in notebooks/06_recompute_memory.ipynb (inside estimate).
    """
    s, b, v, t = (_pos_arg("output_activation_bytes", n, x) for n, x in
                  (("seq_len", seq_len), ("batch", batch), ("vocab_size", vocab_size), ("tp", tp)))
    return math.ceil(4 * s * b * v / t * bytes_per_value / 2)


# --- one device ---
def estimate_stage(*, stage_params: int, layers: int, seq_len: int, micro_batch: int, hidden_size: int,
                   num_heads: int, vocab_size: int, num_kv_heads: int | None = None,
                   ffn_hidden_size: int | None = None, arch: str = "gpt", dp: int = 1, tp: int = 1,
                   sequence_parallel: bool = False, flash_attention: bool = False, recompute: str = "none",
                   full_recompute_layers: int | None = None, select_recompute_layers: int | None = None,
                   in_flight_micro_batches: int = 1, accounting: str | tuple[int, int, int] = "mixed",
                   zero_stage: int = 0, parallel_optimizer: bool = False, grad_accum_buffer: bool = False,
                   shard_grad_accum: bool = False, bytes_per_value: float = 2, output_layer: bool = True,
                   offload_optimizer: bool = False, activation_scale: float = 1.0, overhead_bytes: float = 0,
                   n_params: int | None = None) -> dict[str, int]:
    """Peak training memory of one device holding one pipeline stage, as a breakdown dict (bytes).

    The building block of `estimate` (RunConfig); call it directly to price one stage of any layout,
    e.g. from a pipeline simulator. Fields:
      stage_params            parameters on this device before dp sharding (its stage's layers,
                              embedding and/or lm_head, already divided by tp)
      layers                  transformer layers on this stage
      seq_len, micro_batch    s and b: one micro-batch's sequences on this device
      hidden_size, num_heads, vocab_size, num_kv_heads, ffn_hidden_size, arch, flash_attention,
      sequence_parallel, tp   the activation count of `activation_bytes_per_layer`
      recompute               one mode for every layer: "none" | "selective" | "full"
      full_recompute_layers, select_recompute_layers
                              per-stage layer counts instead of `recompute` (mindformers'
                              recompute_config lists): that many layers fully recomputed, that
                              many of the rest selectively, the others not at all (full wins when
                              a layer has both, as in mindformers)
      in_flight_micro_batches micro-batches whose activations this stage holds at its peak. 1F1B
                              (Narayanan et al. 2021) keeps min(pp - i, m) on stage i, so pp on the
                              first stage; GPipe keeps m; no pipeline 1. A simulator can pass its own.
      accounting, zero_stage, parallel_optimizer, dp
                              the model states of `model_state_breakdown`
      grad_accum_buffer       a gradient-sized accumulation buffer (gradient accumulation, and
                              MindSpore's pipeline, which accumulates micro-batch gradients into
                              `accu_grads`); `shard_grad_accum` slices it over dp (mindformers'
                              parallel_optimizer_config.gradient_accumulation_shard)
      bytes_per_value         activation width (2 for fp16/bf16)
      output_layer            this stage computes the logits and the loss (the last stage)
      offload_optimizer, activation_scale, overhead_bytes, n_params  as in `estimate`
    With recompute, backward rematerialises one layer at a time, so the peak adds one layer's
    dropped activations ("recompute_working_set"). Not modelled: the all-gathered full weights
    that MindSpore's parallel optimizer keeps for backward when parallel_optimizer_comm_recompute
    is off, communication buffers, workspace and fragmentation (pass `overhead_bytes`).

    Keys: those of `estimate`, plus layers, in_flight_micro_batches, full_recompute_layers,
    select_recompute_layers.

        >>> e = estimate_stage(stage_params=1000, layers=2, seq_len=8, micro_batch=1, hidden_size=16,
        ...                    num_heads=2, vocab_size=32, flash_attention=True, output_layer=False)
        >>> e["activations"] == 2 * 8 * 16 * 34 and e["total"] == 16_000 + e["activations"]
        True

    Taught in notebooks/06_recompute_memory.ipynb (inside estimate).
    """
    fn = "estimate_stage"
    sp_, ly = _pos_arg(fn, "stage_params", stage_params), _pos_arg(fn, "layers", layers)
    inflight = _pos_arg(fn, "in_flight_micro_batches", in_flight_micro_batches)
    _check_calibration(fn, overhead_bytes, activation_scale)
    if full_recompute_layers is None and select_recompute_layers is None:
        counts = {recompute: ly}
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"{fn}: recompute={recompute!r} is invalid; fix: use one of {RECOMPUTE_MODES}")
    else:
        for name, v in (("full_recompute_layers", full_recompute_layers),
                        ("select_recompute_layers", select_recompute_layers)):
            if v is not None:
                _pos_count(fn, name, v, zero_ok=True)
        full_recompute_layers = None if full_recompute_layers is None else int(full_recompute_layers)
        select_recompute_layers = None if select_recompute_layers is None else int(select_recompute_layers)
        full = min(full_recompute_layers or 0, ly)
        sel = min(select_recompute_layers or 0, ly - full)
        counts = {"full": full, "selective": sel, "none": ly - full - sel}
    states = model_state_breakdown(sp_, zero_stage=zero_stage, dp=dp, accounting=accounting,
                                   parallel_optimizer=parallel_optimizer, _fn=fn)
    common = dict(tp=tp, sequence_parallel=sequence_parallel, bytes_per_value=bytes_per_value,
                  flash_attention=flash_attention, num_kv_heads=num_kv_heads,
                  ffn_hidden_size=ffn_hidden_size, arch=arch)
    per = {mode: activation_bytes_per_layer(seq_len, micro_batch, hidden_size, num_heads, recompute=mode,
                                            **common)
           for mode in RECOMPUTE_MODES if counts.get(mode)}
    stored = sum(per[m] * n for m, n in counts.items() if n) * inflight
    working = 0
    heaviest = "full" if counts.get("full") else "selective" if counts.get("selective") else None
    if heaviest:
        working = activation_bytes_per_layer(seq_len, micro_batch, hidden_size, num_heads, recompute="none",
                                             **common) - per[heaviest]
    # the layers' own mode if uniform, else the most common one (for "activations_per_layer")
    main_mode = max((m for m in RECOMPUTE_MODES if counts.get(m)), key=lambda m: counts[m])
    output = output_activation_bytes(seq_len, micro_batch, vocab_size, tp=tp,
                                     bytes_per_value=bytes_per_value) if output_layer else 0
    if not grad_accum_buffer:
        accum = 0
    elif shard_grad_accum and zero_stage < 2:     # (ZeRO-2/3 have sharded the gradients already)
        accum = -(-states["grads"] // dp)
    else:
        accum = states["grads"]
    bpv = bytes_per_value
    scores = 0 if flash_attention else math.ceil(micro_batch * (num_heads // tp) * seq_len ** 2 * bpv)
    logits = math.ceil(seq_len * micro_batch * -(-vocab_size // tp) * bpv) if output_layer else 0
    host = states["optimizer_states"] if offload_optimizer else 0
    out = {"n_params": n_params if n_params is not None else sp_,
           "params": states["params"], "grads": states["grads"],
           "optimizer_states": states["optimizer_states"] - host,
           "activations": math.ceil((stored + working + output) * activation_scale),
           "activations_per_layer": per[main_mode], "recompute_working_set": working,
           "output_activations": output, "grad_accum_buffer": accum,
           "largest_activation": max(scores, logits), "host_optimizer_states": host,
           "overhead": math.ceil(overhead_bytes), "layers": ly, "in_flight_micro_batches": inflight,
           "full_recompute_layers": counts.get("full", 0), "select_recompute_layers": counts.get("selective", 0)}
    out["total"] = (out["params"] + out["grads"] + out["optimizer_states"] + out["activations"]
                    + accum + out["overhead"])
    return out


# --- whole config ---
def estimate(cfg: Any, *, n_devices: int = 1, layout: Any = None, zero_stage: int = 0,
             accounting: str | tuple[int, int, int] | None = None, bytes_per_value: int | None = None,
             sequence_parallel: bool | None = None, offload_optimizer: bool = False,
             activation_scale: float = 1.0, overhead_bytes: float = 0, flash_attention: bool = False,
             num_kv_heads: int | None = None, arch: str = "gpt", parallel_optimizer: bool = False,
             in_flight_micro_batches: int | None = None, full_recompute_layers: int | None = None,
             select_recompute_layers: int | None = None, grad_accum_buffer: bool | None = None,
             shard_grad_accum: bool = False, n_params: int | None = None, mlp: str | None = None,
             tie_word_embeddings: bool | None = None, bias: bool | None = None,
             norm: str | None = None) -> dict[str, int]:
    """Peak training memory per device for a model and batch, as a breakdown dict (bytes).

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
    All missing required fields are named in one ValueError. `n_params=` skips the count and
    uses yours (e.g. `sum(p.size for p in net.get_parameters())`).

    Parallel degrees come from `layout` (any object with dp, mp (or tp), pp, micro_batches)
    or else from cfg.mp/pp/micro_batches with dp = n_devices/(mp·pp) (cfg.dp when n_devices=1).
    Micro-batch per device = cfg.batch_size / (dp · micro_batches); gradient accumulation
    keeps that micro-batch and adds a gradient-sized accumulation buffer. Under 1F1B pipeline
    the first stage holds min(pp, micro_batches) micro-batches of its L/pp layers.
    With recompute on, the backward of each layer rematerialises what that layer dropped,
    so the peak adds one layer's dropped activations ("recompute_working_set"): Korthikanti's
    table counts only what is stored between forward and backward.
    Defaults follow cfg.compute_dtype: float32 -> accounting "fp32" and 4-byte activations;
    float16/bfloat16 -> "mixed" and 2-byte activations. `offload_optimizer=True` moves the
    optimizer states to host memory (reported as "host_optimizer_states", not in "total").
    `activation_scale` and `overhead_bytes` calibrate the estimate against a measurement
    (see `calibrate`): activations are multiplied by the scale, and the constant (runtime,
    compiled graph, allocator pool) is added to the total.
    What real configs use (see `estimate_stage` for each term):
      flash_attention=True        no s² attention scores
      num_kv_heads                grouped-query attention (default: getattr(cfg, "num_kv_heads"),
                                  else multi-head); it also shrinks the k, v weights
      arch="llama"                mindformers' LLaMA block (SwiGLU of cfg.ffn_hidden_size, no
                                  dropout); the default "gpt" is Korthikanti's count as published
      accounting="fp32_states"    16-bit params and grads, fp32 Adam states (FP32StateAdamWeightDecay)
      parallel_optimizer=True     MindSpore's optimizer parallel: params and states sliced over dp
      grad_accum_buffer           default cfg.grad_accum > 1; shard_grad_accum slices it over dp
      sequence_parallel           (default: layout.sequence_parallel if present)
      full_recompute_layers, select_recompute_layers
                                  per-stage layer counts on the estimated (first) stage
      in_flight_micro_batches     default min(pp, micro_batches): 1F1B on the first stage

    Keys: n_params (count, whole model), params, grads, optimizer_states, activations
    (stored layers + recompute working set + output logits, times activation_scale),
    activations_per_layer, recompute_working_set, output_activations, grad_accum_buffer,
    largest_activation (the biggest single activation tensor: logits or attention scores),
    host_optimizer_states, overhead, total (the per-device sum), and those `estimate_stage` adds.

        >>> from mshelpers.config import RunConfig
        >>> e = estimate(RunConfig.preset("mini"))
        >>> e["params"], e["total"] == e["params"] + e["grads"] + e["optimizer_states"] + e["activations"]
        (14754816, True)

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    cfg = _spec("estimate", cfg)
    n_devices = _pos_count("estimate", "n_devices", n_devices)
    _check_calibration("estimate", overhead_bytes, activation_scale)
    dp, tp, pp, micro = _degrees(cfg, n_devices, layout)
    if cfg.batch_size % (dp * micro):
        raise ValueError(f"estimate: cfg.batch_size={cfg.batch_size} is not divisible by dp*micro_batches = "
                         f"{dp}*{micro}; fix: use a batch_size that is a multiple of {dp * micro}")
    half = cfg.compute_dtype in _HALF_DTYPES
    accounting = accounting or ("mixed" if half else "fp32")
    bpv = bytes_per_value or (2 if half else 4)
    sp = bool(getattr(layout, "sequence_parallel", False)) if sequence_parallel is None else sequence_parallel
    kv = num_kv_heads if num_kv_heads is not None else cfg.num_kv_heads
    if n_params is None:
        n_params = transformer_param_count(cfg, mlp=mlp, tie_word_embeddings=tie_word_embeddings, bias=bias,
                                           norm=norm, num_kv_heads=kv, _fn="estimate")
    else:
        n_params = _pos_count("estimate", "n_params", n_params)
    local_params = -(-n_params // (tp * pp))   # tp and pp split the weights; ZeRO then shards over dp
    return estimate_stage(
        stage_params=local_params, layers=cfg.num_layers // pp, seq_len=cfg.seq_len,
        micro_batch=cfg.batch_size // (dp * micro), hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
        vocab_size=cfg.vocab_size, num_kv_heads=kv,
        ffn_hidden_size=(cfg.ffn_hidden_size or 4 * cfg.hidden_size) if arch == "llama" else None, arch=arch,
        dp=dp, tp=tp,
        sequence_parallel=sp, flash_attention=flash_attention, recompute=cfg.recompute,
        full_recompute_layers=full_recompute_layers, select_recompute_layers=select_recompute_layers,
        in_flight_micro_batches=min(pp, micro) if in_flight_micro_batches is None else in_flight_micro_batches,
        accounting=accounting, zero_stage=zero_stage, parallel_optimizer=parallel_optimizer,
        grad_accum_buffer=cfg.grad_accum > 1 if grad_accum_buffer is None else grad_accum_buffer,
        shard_grad_accum=shard_grad_accum, bytes_per_value=bpv, output_layer=True,
        offload_optimizer=offload_optimizer, activation_scale=activation_scale,
        overhead_bytes=overhead_bytes, n_params=n_params)


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
    return estimate(_spec("fits", cfg), **kw)["total"] <= budget_bytes


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
    cfg = _spec("max_batch_for_budget", cfg)
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


def calibrate(estimates: list[dict], measured_bytes: list[float], *,
              overhead_bytes: float | None = None) -> dict[str, float]:
    """Fit measured ≈ overhead + model states + scale · activations over several runs.

    `estimates` are `estimate(...)` dicts (made with the default scale 1 and no overhead),
    `measured_bytes` the peaks measured for the same configs. Model states are taken as
    exact; a least-squares line through (activations, measured - states) gives the
    activation scale (slope) and the constant overhead (intercept). Pass `overhead_bytes`
    (from an earlier fit) to fit the scale alone, which one run suffices for: e.g. a
    recompute mode whose activations the published count gets wrong. The result is a
    dict of keywords for `estimate`, `fits` and `max_batch_for_budget`.

        >>> es = [{"activations": a, "params": 1, "grads": 1, "optimizer_states": 2,
        ...        "grad_accum_buffer": 0} for a in (10, 20, 40)]
        >>> calibrate(es, [4 + 100 + 2 * a for a in (10, 20, 40)])
        {'activation_scale': 2.0, 'overhead_bytes': 100.0}
        >>> calibrate(es[:1], [4 + 100 + 3 * 10], overhead_bytes=100)
        {'activation_scale': 3.0, 'overhead_bytes': 100}

    Taught in notebooks/06_recompute_memory.ipynb.
    """
    need = 1 if overhead_bytes is not None else 2
    if len(estimates) != len(measured_bytes) or len(estimates) < need:
        raise ValueError(f"calibrate: got {len(estimates)} estimates and {len(measured_bytes)} measurements; "
                         f"fix: pass two equally long lists with at least {need} run(s)"
                         + ("" if need == 1 else " of different sizes, or pass overhead_bytes"))
    xs = [float(e["activations"]) for e in estimates]
    ys = [float(m) - (e["params"] + e["grads"] + e["optimizer_states"] + e.get("grad_accum_buffer", 0))
          for e, m in zip(estimates, measured_bytes)]
    if overhead_bytes is not None:
        if not isinstance(overhead_bytes, numbers.Real) or isinstance(overhead_bytes, bool) or overhead_bytes < 0:
            raise ValueError(f"calibrate: overhead_bytes={overhead_bytes!r} is invalid; fix: pass a number >= 0")
        slope = sum(x * (y - overhead_bytes) for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        if slope <= 0:
            raise ValueError(f"calibrate: the runs sit below overhead_bytes={overhead_bytes!r}; "
                             "fix: pass the overhead fitted on the same kind of runs (same mode and device)")
        return {"activation_scale": round(slope, 4), "overhead_bytes": overhead_bytes}
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("calibrate: all runs have the same activation estimate; "
                         "fix: measure at least two different batch sizes or sequence lengths")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        raise ValueError(f"calibrate: measured peaks do not grow with the activations (slope={slope:.3g}); "
                         "fix: measure over a wider range of batch sizes, each in a fresh process")
    return {"activation_scale": round(slope, 4), "overhead_bytes": round(max(0.0, my - slope * mx), 0)}


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


def _pos_count(fn: str, name: str, v: Any, zero_ok: bool = False) -> int:
    """A count from an int, a numpy integer or a float with an integral value (7e9); else one ValueError."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and (int(v) > 0 or zero_ok and int(v) == 0):
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a {'non-negative' if zero_ok else 'positive'} "
                     "integer" + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))


def _pos_arg(fn: str, name: str, v: Any) -> int:
    return _pos_count(fn, name, v)


def _check_calibration(fn: str, overhead_bytes: Any, activation_scale: Any) -> None:
    if not isinstance(overhead_bytes, numbers.Real) or isinstance(overhead_bytes, bool) or not overhead_bytes >= 0:
        raise ValueError(f"{fn}: overhead_bytes={overhead_bytes!r} is invalid; fix: pass a number >= 0")
    if not isinstance(activation_scale, numbers.Real) or isinstance(activation_scale, bool) \
            or not activation_scale > 0:
        raise ValueError(f"{fn}: activation_scale={activation_scale!r} is invalid; "
                         "fix: pass a positive number (1.0 = the formulas as published)")


# The fields estimate/fits/max_batch_for_budget read, and the other names they are found under.
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


def _check_budget(fn: str, budget: Any) -> None:
    if not isinstance(budget, numbers.Real) or isinstance(budget, bool) or not budget > 0 or math.isinf(budget):
        raise ValueError(f"{fn}: budget_bytes={budget!r} is invalid; fix: pass a positive number of bytes, "
                         "e.g. 16 * 2**30 for 16 GiB")


def _degrees(cfg: Any, n_devices: int, layout: Any) -> tuple[int, int, int, int]:
    """(dp, tp, pp, micro_batches) from a layout object or from the RunConfig and n_devices."""
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
            _pos_arg("estimate", f"layout.{name}", v)
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

