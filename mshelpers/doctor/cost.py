"""The cost model: what a `Model` costs on a `Layout` and a device. It never sees a YAML.

  flops     forward FLOPs per token of each layer's ops, PaLM's count (2 per multiply-add of every matmul,
            attention 2*s*(q + v) per token): GQA/MHA projections; MLA's low-rank projections (DeepSeek-V2/V3:
            q_a/q_b, kv_a/kv_b, o); the SwiGLU FFN; a MoE layer's router, its top_k routed experts and its
            shared experts (a token's FLOPs are those of its active experts); the LM head; MTP modules.
  capacity  r1.x MoE with a capacity factor pads every expert to its capacity and computes, sends and stores
            every slot: min(cf x top_k, experts) slots per token instead of top_k (MoE.slots();
            mindformers modules/transformer/moe.py, MoEV2 and calculate_expert_capacity_v2). Hardware FLOPs,
            not model FLOPs: MFU (6N, PaLM) is unchanged, the step and the hardware-FLOPs MFU carry it.
  params    total and active (a MoE token sees top_k routed experts) parameters; MTP modules apart, as the
            models' own cards count them (DeepSeek-V3: 671B total, 37B active, MTP excluded).
  step      compute of the bottleneck stage (3 + recompute forwards), TP/SP collectives, MoE all-to-all
            (dispatch + combine, forward and backward, over EP ranks), context parallel (ring: K/V passed
            cp - 1 times; Ulysses: 4 all-to-alls of q, k, v, o), pipeline sends (x VPP chunks), the 1F1B
            bubble (/ VPP), the exposed DP reduction (or FSDP gathers), the optimizer update.
  memory    per stage: params, grads and optimizer states (memory_states.sharded_state_bytes; experts sharded
            over max(ep, tp)), activations (Korthikanti et al. 2022, memory_activations.activation_bytes_per_layer;
            a MoE layer stores one per slot) x the schedule's in-flight micro-batches (in_flight), logits last.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

from . import topology
from .describe import CALIBRATION, Config, DoctorError, Model


# ---------------------------------------------------------------- FLOPs and parameters
def attention_params(m: Model) -> int:
    """One layer's attention parameters: GQA/MHA projections, or MLA's low-rank ones.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    h = m.hidden
    if m.attention == "mla":
        q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * m.q_width) if m.q_lora_rank else h * m.q_width
        kv = h * (m.kv_lora_rank + m.qk_rope_dim) + m.kv_lora_rank + \
            m.kv_lora_rank * m.heads * (m.qk_nope_dim + m.v_head_dim)
        return q + kv + m.v_width * h
    q, kvw = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return h * q + 2 * h * kvw + q * h + ((q + 2 * kvw) if m.qkv_bias or m.bias else 0) + (h if m.bias else 0)


def ffn_params(m: Model, i: int, active: bool = False) -> int:
    """FFN parameters of layer i (dense SwiGLU, or router + routed experts + shared experts).
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    h = m.hidden
    if m.moe is None or not m.moe.is_moe_layer(i):
        mats = 2 if m.mlp == "gelu" else 3          # fc1, fc2 or w1, w2, w3 (and their biases: (mats - 1) x ffn + h)
        return mats * h * m.ffn + (((mats - 1) * m.ffn + h) if m.bias else 0)
    e = m.moe
    routed = e.top_k if active else e.routed
    return h * e.routed + routed * 3 * h * e.expert_ffn + 3 * h * e.shared_ffn


def expert_params(m: Model, i: int) -> int:
    """Routed-expert parameters of layer i (those EP shards).
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    if m.moe is None or not m.moe.is_moe_layer(i):
        return 0
    return m.moe.routed * 3 * m.hidden * m.moe.expert_ffn


def norm_params(m: Model) -> int:
    """One norm's parameters: h weights for RMSNorm, and h biases more for LayerNorm.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    return 2 * m.hidden if m.norm == "layer" else m.hidden      # RMSNorm: h weights; LayerNorm: + h biases


def layer_params(m: Model, i: int, active: bool = False) -> int:
    """Layer i's parameters: attention, FFN (dense or MoE; active experts only with `active`) and its two norms.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    return attention_params(m) + ffn_params(m, i, active) + 2 * norm_params(m)


def param_count(cfg_or_model: Any, active: bool = False) -> int:
    """Whole-model parameters (active=True: with top_k of the routed experts): embedding, lm_head (unless
    tied), layers, final norm. MTP modules are not counted (see `mtp_params`).
    Taught in: no notebook; doctor/__init__.py, doctor/diagnosis.py, memory.py call it."""
    m = cfg_or_model.model if isinstance(cfg_or_model, Config) else cfg_or_model
    return _param_count(m, active)


# a search prices thousands of layouts of one model: its per-model sums are kept, not summed again per layout
@functools.lru_cache(maxsize=1024)
def _param_count(m: Model, active: bool) -> int:
    emb = m.vocab * m.hidden * (1 if m.tied else 2) + m.positions * m.hidden + m.extra_params
    return emb + sum(layer_params(m, i, active) for i in range(m.layers)) + norm_params(m)


def mtp_params(m: Model) -> int:
    """Parameters of the MTP modules: per depth one layer (MoE like the last), eh_proj (2h x h) and norms.
    Taught in: no notebook; doctor/__init__.py, doctor/diagnosis.py call it."""
    return m.mtp * (layer_params(m, m.layers - 1) + 2 * m.hidden * m.hidden + 3 * m.hidden)


def layer_ops(m: Model, i: int) -> dict[str, float]:
    """Forward FLOPs per token of layer i's ops before any split (names select_recompute patterns match).
    Taught in: no notebook; doctor/__init__.py, doctor/search.py call it."""
    return dict(_layer_ops(m, m.moe is not None and m.moe.is_moe_layer(i)))


@functools.lru_cache(maxsize=4096)
def _layer_ops(m: Model, moe_layer: bool) -> tuple:
    h, s = m.hidden, m.seq
    if m.attention == "mla":
        wq = 2 * (h * m.q_lora_rank + m.q_lora_rank * m.q_width) if m.q_lora_rank else 2 * h * m.q_width
        ops = {"wq": wq, "wk": 2 * h * (m.kv_lora_rank + m.qk_rope_dim),
               "wv": 2 * m.kv_lora_rank * m.heads * (m.qk_nope_dim + m.v_head_dim), "wo": 2 * m.v_width * h}
    else:
        q, kvw = m.heads * m.head_dim, m.kv_heads * m.head_dim
        ops = {"wq": 2 * h * q, "wk": 2 * h * kvw, "wv": 2 * h * kvw, "wo": 2 * q * h}
    ops["attention"] = 2 * s * (m.q_width + m.v_width)          # QK^T and attention x V (PaLM: 4*s*q for MHA)
    if moe_layer:
        e = m.moe
        width = e.top_k * e.expert_ffn + e.shared_ffn
        ops.update(router=2 * h * e.routed, w1=2 * h * width, w3=2 * h * width, w2=2 * width * h)
    else:
        ops.update(w1=2 * h * m.ffn, w3=2 * h * m.ffn, w2=2 * m.ffn * h)
    return tuple(ops.items())


def capacity_padding_flops(m: Model, i: int) -> float:
    """Forward FLOPs per token that layer i's routed experts spend on padded capacity slots (MoE.slots() - top_k
    slots of the three expert matmuls): hardware work, not model FLOPs. 0 for dense layers and dropless MoE.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    if m.moe is None or not m.moe.is_moe_layer(i):
        return 0.0
    return (m.moe.slots() - m.moe.top_k) * 3 * 2 * m.hidden * m.moe.expert_ffn


def head_flops(m: Model) -> float:
    """Forward FLOPs per token of the LM head, and of the MTP modules (each: a layer, eh_proj and a head).
    Taught in: no notebook; doctor/search.py calls it."""
    one = 2 * m.vocab * m.hidden
    mtp = m.mtp * (sum(layer_ops(m, m.layers - 1).values()) + 2 * 2 * m.hidden * m.hidden + one)
    return one + mtp


def flops_per_token(m: Model) -> dict[str, float]:
    """Model FLOPs per token, fwd + bwd: 6N (N active, Kaplan), 6N + attention (PaLM appendix B), and the
    count the cost model uses (3 x its forward, MTP included).
    Taught in notebooks/04_data_parallel.ipynb."""
    return dict(_flops_per_token(m))


@functools.lru_cache(maxsize=1024)
def _flops_per_token(m: Model) -> tuple:
    n = param_count(m, active=True)
    attn = 3 * sum(layer_ops(m, i)["attention"] for i in range(m.layers))
    fwd = sum(sum(layer_ops(m, i).values()) for i in range(m.layers)) + head_flops(m)
    return tuple({"6n": 6 * n, "palm": 6 * n + attn, "model": 3 * fwd}.items())


_OP_NAMES = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")
_MCORE = {"linear_q": "wq", "linear_qkv": "wq wk wv", "linear_kv": "wk wv", "linear_proj": "wo", "linear_fc1": "w1 w3",
          "linear_fc2": "w2", "q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo", "gate_proj": "w1",
          "up_proj": "w3", "down_proj": "w2"}


def pattern_ops(pattern: str) -> list[str]:
    """The matmul ops a select_recompute pattern names (elementwise ops cost no matmul FLOPs).
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    p = pattern.lower().replace("\\", "")
    if "flash" in p or "core_attention" in p:
        return ["attention"]
    found = [op for mc, ops in _MCORE.items() if mc in p for op in ops.split()]
    if found:
        return sorted(set(found))
    if "matmul" not in p:
        return []
    return [op for op in _OP_NAMES if re.search(rf"\b{op}", p)]


# ---------------------------------------------------------------- the layout's pieces
def stage_layer_ids(cfg: Config) -> list[list[int]]:
    """Layer ids per stage (consecutive; VPP chunks keep their per-stage totals).
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    return [list(r) for r in _stage_ranges(tuple(cfg.layout.stage_layers))]


@functools.lru_cache(maxsize=4096)
def _stage_ranges(stage_layers: tuple) -> tuple:
    out, start = [], 0
    for n in stage_layers:
        out.append(range(start, start + n))
        start += n
    return tuple(out)


def expert_shard(cfg: Config) -> int:
    """Ranks one layer's routed experts are split over: EP ranks (over the experts) times TP ranks (over each
    expert's FFN width), at most the dp x tp ranks EP is carved out of (layouts.checked: mindformers' rule).
    Taught in: no notebook; doctor/diagnosis.py, doctor/search.py call it."""
    return _expert_shard(cfg.layout)


def _expert_shard(lay: Any) -> int:
    return min(lay.ep * lay.tp, lay.dp * lay.tp)


def expert_replicas(lay: Any) -> int:
    """Ranks that hold the same routed-expert shard (topology's EDP group): dp x cp x tp over the expert shard. The
    parallel optimizer splits an expert's states and update over these, not over dp x cp (Megatron-core's
    expert-data-parallel group; mindformers shards expert weights over ep first). Taught in: no notebook."""
    return max(1, lay.dp * lay.cp * lay.tp // _expert_shard(lay))


def stage_params(cfg: Config, i: int) -> tuple[float, float]:
    """(dense, expert) parameters on one device of stage i.
    Taught in: no notebook; parallel.py calls it."""
    lay = cfg.layout
    # keyed on what the sums read, not the whole Layout: the search's recompute variants share them
    return _stage_params(cfg.model, tuple(lay.stage_layers), lay.tp, lay.pp, lay.vocab_emb_dp, _expert_shard(lay), i)


@functools.lru_cache(maxsize=65536)
def _stage_params(m: Model, stage_layers: tuple, tp: int, pp: int, vocab_emb_dp: bool, shard: int,
                  i: int) -> tuple[float, float]:
    start = sum(stage_layers[:i])
    ids = range(start, start + stage_layers[i])
    expert = sum(expert_params(m, j) for j in ids)
    dense = sum(layer_params(m, j) for j in ids) - expert
    dense = dense / tp
    if i == 0:
        dense += m.vocab * m.hidden / (1 if vocab_emb_dp else tp) + m.positions * m.hidden + m.extra_params
    if i == pp - 1:
        dense += (0 if m.tied and pp == 1 else m.vocab * m.hidden / tp) + norm_params(m)
        if m.mtp:
            mtp_expert = m.mtp * expert_params(m, m.layers - 1)
            expert += mtp_expert
            dense += (mtp_params(m) - mtp_expert) / tp
    return dense, expert / shard


def _rate(peak: float, calib: Any, width: float) -> float:
    """FLOP/s of matmuls whose per-device width is `width`: compute_efficiency x w / (w + half_width) of the peak
    (narrow shards feed the cube units worse; half_width has no fit point and is 0 as shipped)."""
    return peak * calib.compute_efficiency * width / (width + calib.half_width)


REFERENCE_HEAD_DIM = 128     # the head dim of every fit row but one: attention_efficiency is the rate there


def head_dim_factor(m: Model, calib: Any) -> float:
    """The attention kernels' rate at the model's head dim relative to their rate at 128: d / (d + k) over
    128 / (128 + k), k = head_dim_half, d the contraction of QK^T (MLA: nope + rope). 1 at d = 128 or k = 0.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    d = m.q_width / m.heads
    k = calib.head_dim_half
    return (d / (d + k)) / (REFERENCE_HEAD_DIM / (REFERENCE_HEAD_DIM + k))


def expert_matmul_flops(m: Model, i: int) -> float:
    """Forward FLOPs per token of layer i's routed-expert matmuls (top_k experts, capacity padding apart).
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    if m.moe is None or not m.moe.is_moe_layer(i):
        return 0.0
    return m.moe.top_k * 3 * 2 * m.hidden * m.moe.expert_ffn


def attention_work(m: Model, ring: bool = False) -> float:
    """The attention kernels' work relative to the FLOP count (every query against every key: s^2 pairs, PaLM's
    count, which every MFU convention here keeps). Flash attention told the mask is causal skips the blocks
    above the diagonal: about half the pairs (Ascend FlashAttentionScore: sparse_mode 2/3, or sparse_mode 0 with
    next_tokens 0 and pre_tokens >= Sq, "a causal sparse scenario"; mindformers passes next_tokens=0 in 1.9's
    llama_transformer.py and 2.1.0's parallel_core flash_attention.py, MindSpeed sparse_mode 3/4). With a sliding
    window w each query sees at most w keys: s*w - w^2/2 pairs (Mistral 7B, Jiang et al. 2023, section 2).
    Packed documents with EOD masks (Model.eod, flash attention's TND layout; mindformers drops them under ring
    attention, so the caller passes ring=True there) attend within each document: documents of doc_len tokens give
    s / doc_len blocks of doc_len^2 / 2 pairs, s * doc_len / 2 in all (with no doc_len, one document per sequence).
    Without flash attention the scores are two batched matmuls over every pair, masked after: 1. Time only: MFU
    columns count as their sources count.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    if not m.flash:
        return 1.0
    span = m.seq                                        # the stretch of tokens a query can see into
    if m.eod and m.doc_len and not ring:
        span = min(m.doc_len, m.seq)
    w = m.window if m.window and m.window < span else span
    # per span: span*w - w^2/2 pairs (w = span: span^2/2), s / span spans, against s^2
    return (span * w - w * w / 2) / (span * m.seq)


def expert_rows(m: Model, lay: Any, tokens_micro: float) -> float:
    """Rows of one routed expert's GEMMs per micro-batch (the GEMM's M): the EP group's ep dp-slices of
    tokens_micro tokens, each sending slots() copies, spread over the routed experts (balanced).
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    return lay.ep * tokens_micro * m.moe.slots() / m.moe.routed


def gemm_intensity(rows: float, k: float, n: float, nbytes: int = 2) -> float:
    """FLOPs per byte of HBM traffic of an M x K by K x N matmul that reads its operands and writes its result once
    (2MKN FLOPs over (MK + KN + MN) x nbytes): the roofline's operational intensity (Williams, Waterman and
    Patterson 2009). A narrow expert fed few rows is bound by reading its weights.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    return 2 * rows * k * n / ((rows * k + k * n + rows * n) * nbytes)


def mc2_exposed(comm_s: float, matmul_s: float, tiles: int) -> float:
    """Exposed time of one TP collective fused with its matmul (MC2): both split into `tiles` pieces and
    pipelined, each piece's communication under another piece's matmul (CANN's MC2 operators, "Matrix Computation
    & Communication": the data is tiled so computing and communication run in parallel, Ascend C guide,
    MC2 basics; MindSpeed docs/features/mc2.md: AllGather + MatMul and MatMul + ReduceScatter under sequence
    parallel). A two-stage pipeline of n equal pieces takes max(c, m) + min(c, m) / n; what the matmul alone
    would take is not exposed. `tiles`: the TP group's shards (one rank's shard per step), an assumption: the
    operators' tile count is not published.
    Taught in: no notebook; doctor/cost.py's step_time calls it (notebook 12 names it).

        >>> mc2_exposed(1.0, 4.0, 4)      # communication shorter than the matmul: one piece of it shows
        0.25
        >>> mc2_exposed(4.0, 1.0, 4)      # longer: what outlasts the matmul, plus one piece of the matmul
        3.25
    """
    for name, v in (("comm_s", comm_s), ("matmul_s", matmul_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"mc2_exposed: {name}={v!r} is invalid; fix: a finite number of seconds, 0 or more")
    if isinstance(tiles, bool) or not isinstance(tiles, int) or tiles < 1:
        raise ValueError(f"mc2_exposed: tiles={tiles!r} is invalid; fix: a whole number of pieces, 1 or more "
                         "(the TP group's size)")
    if comm_s == 0:
        return 0.0
    n = tiles
    return max(comm_s, matmul_s) + min(comm_s, matmul_s) / n - matmul_s


def routing_imbalance(m: Model, lay: Any, tokens_micro: float) -> float:
    """Load of the busiest EP rank over the mean, when the router is as balanced as chance: each of the EP group's
    slots lands on a rank with probability 1/ep, and the largest of ep such counts is about mean + sigma x
    sqrt(2 ln ep) (the expected maximum of ep Gaussians). MoE.imbalance, when given, replaces it: a trained
    router is less even than chance.
    Taught in: no notebook; doctor/describe.py calls it."""
    if m.moe.imbalance > 0:
        return 1.0 + m.moe.imbalance
    n = lay.ep
    if n < 2:
        return 1.0
    per_rank = tokens_micro * m.moe.slots()
    return 1.0 + (2 * math.log(n)) ** 0.5 * ((1 - 1 / n) / per_rank) ** 0.5


def permute_bytes(m: Model, local_tokens: float) -> float:
    """HBM bytes one MoE layer's forward moves outside the matmuls, for local_tokens tokens: the permutation reads
    each token and writes its slots() copies in expert order, the unpermutation reads the copies and writes the
    weighted sum (16-bit hidden vectors); the router's fp32 logits over the routed experts are written, read by
    the softmax and top-k and the auxiliary loss (4 passes). Megatron-core moe_utils.permute / unpermute.
    Taught with the rest of doctor/cost.py in notebooks/12_your_config.ipynb."""
    e = m.moe
    return local_tokens * (2 * m.hidden * (2 + 2 * e.slots()) + 4 * 4 * e.routed)


SCORE_PASSES = 12       # without flash attention, the s x s scores cross HBM: forward writes QK^T, softmax reads it
                        # and writes the probabilities, PV reads them (4); the backward about twice that (8)


# ---------------------------------------------------------------- step time
def step_time(cfg: Config, hw: Any, calib: Any = None) -> dict[str, Any]:
    """The step decomposed (seconds per optimizer step on the bottleneck device) and what follows from it.

    Keys: compute_s (attention_s and expert_s: the attention kernels' and routed experts' parts of it), attn_hbm_s (the score matrix through HBM without flash attention), tp_s (tp_unfused_s: the same
    without MC2; mc2: whether it was fused, Config.mc2 with sequence parallel), ep_s (MoE
    all-to-all), cp_s (context parallel), p2p_s, bubble_s, dp_s (exposed), dp_total_s, dp_hidden_s,
    optimizer_s, step_s (their sum), tokens_per_s_per_device, n_params, n_active_params, mfu_6n, mfu_attention,
    mfu_hardware, mfu_computed (the FLOPs the kernels compute: hardware FLOPs with attention at the pairs flash
    attention computes, attention_work; never above the matmul rate), peak_flops, per_stage_s, bottleneck_stage, recompute_factor (hardware / model FLOPs: recompute
    and MoE capacity padding), global_batch, micro_batches, moe_capacity_padding (MoE.slots() / top_k; 1.0 for
    dense and dropless models), groups (each communication group: size, span, nodes, link, time_s).

    Every collective is priced on the links its group crosses (topology.py: ranks placed on nodes in the
    dialect's order) at datasheet rates, times comm_time_factor: one constant, one direction.
    Taught in notebooks/04_data_parallel.ipynb.
    """
    calib = calib or CALIBRATION
    m, lay = cfg.model, cfg.layout
    tokens_micro = lay.batch * lay.interleave * m.seq / lay.cp     # tokens of one micro-batch on one device
    peak = hw.peak(lay.compute_dtype)
    rate = _rate(peak, calib, m.hidden / lay.tp)
    # a head dim wider than 128 raises the kernels' rate (head_dim_factor > 1), but no kernel outruns the matmul rate
    # it is a share of, on the pairs it computes (attention_work: causal skips half): at MLA's 512 (DeepSeek-V4
    # Flash) the fitted curve would reach 1.13x it
    # without flash attention QK^T and PV are plain batched matmuls at the matmuls' rate (their HBM traffic apart)
    rate_attn = rate * min(1.0, calib.attention_efficiency * head_dim_factor(m, calib)) if m.flash else rate
    rate_expert = _rate(peak, calib, m.moe.expert_ffn / lay.tp) if m.moe is not None else rate
    imbalance = 1.0
    if m.moe is not None:
        # the roofline: an expert's GEMM runs no faster than its intensity x HBM bandwidth; the busiest rank binds
        rows = expert_rows(m, lay, tokens_micro)
        rate_expert = min(rate_expert, gemm_intensity(rows, m.hidden, m.moe.expert_ffn / lay.tp) * hw.hbm_bytes_per_s)
        imbalance = routing_imbalance(m, lay, tokens_micro)
    work_attn = attention_work(m, ring=lay.ring)
    fuse_tp = bool(cfg.mc2 and lay.seq_parallel)      # MC2 pipelines the sequence-parallel pair (mc2_exposed)
    f_comm = calib.comm_time_factor
    spans = {k: topology.span(v, hw.devices_per_node) for k, v in topology.groups(lay, cfg.dialect).items()}
    tp_bw, tp_lat = topology.ring_link(hw, spans["TP"])
    cp_bw, cp_lat = topology.ring_link(hw, spans["CP"])
    stage_ranks = lay.dp * lay.cp * lay.tp                         # ranks per pipeline stage (stages outermost)
    ep_lat = topology.ring_link(hw, spans["EP"])[1]
    ids = _stage_ranges(tuple(lay.stage_layers))
    per_stage, comp, hbm, tps, eps, cps, p2ps = [], [], [], [], [], [], []
    tps_unfused = []                    # TP as if nothing were fused (MC2 off), per stage
    comp_attn, comp_expert = [], []     # the attention kernels' and routed experts' shares of each stage's compute
    perms = []                          # MoE token permutation and router traffic (memory-bound), per stage
    extra_flops_total = 0.0             # what the hardware does beyond the model's FLOPs: recompute, padded slots
    extra_attn_total = 0.0              # of which recomputed attention (counted as every pair; computed: attention_work)
    for i in range(lay.pp):
        ops = [layer_ops(m, j) for j in ids[i]]
        pads = [capacity_padding_flops(m, j) for j in ids[i]]
        experts = [expert_matmul_flops(m, j) + pads[k] for k, j in enumerate(ids[i])]
        fwd = sum(sum(o.values()) for o in ops) + sum(pads) + (head_flops(m) if i == lay.pp - 1 else 0)
        attn = sum(o["attention"] for o in ops) + (m.mtp * ops[-1]["attention"] if i == lay.pp - 1 and ops else 0)
        n_full = lay.full_recompute[i]
        rec = sum(sum(o.values()) for o in ops[:n_full]) + sum(pads[:n_full])
        rec_attn = sum(o["attention"] for o in ops[:n_full])
        rec_expert = sum(experts[:n_full])
        attn_layers_recomputed = n_full
        for pat, k in lay.select_ops[i]:
            names = pattern_ops(pat)
            chosen = ops[n_full:n_full + k]
            rec += sum(sum(o.get(n, 0) for n in names) for o in chosen)
            if "attention" in names:
                rec_attn += sum(o["attention"] for o in chosen)
                attn_layers_recomputed += len(chosen)
            if m.moe is not None and {"w1", "w2", "w3"} & set(names):
                share = len({"w1", "w2", "w3"} & set(names)) / 3
                rec_expert += share * sum(experts[n_full:n_full + k])
        flops = tokens_micro * (3 * fwd + rec) / lay.tp
        flops_attn = tokens_micro * (3 * attn + rec_attn) / lay.tp
        flops_expert = tokens_micro * (3 * sum(experts) + rec_expert) / lay.tp
        extra_flops_total += tokens_micro * rec * lay.dp * lay.cp + tokens_micro * 3 * sum(pads) * lay.dp * lay.cp
        extra_attn_total += tokens_micro * rec_attn * lay.dp * lay.cp
        comp_attn.append(flops_attn * work_attn / rate_attn)
        comp_expert.append(flops_expert * imbalance / rate_expert)
        c = (flops - flops_attn - flops_expert) / rate + comp_attn[-1] + comp_expert[-1]
        n = len(ids[i])
        a = 0.0
        if not m.flash and n:
            # the local scores: batch x heads/tp x (s/cp) x s, 2 bytes each, SCORE_PASSES crossings per layer,
            # 4 more for each layer whose attention is recomputed
            scores = lay.batch * lay.interleave * (m.heads / lay.tp) * (m.seq / lay.cp) * m.seq * 2
            a = scores * (SCORE_PASSES * n + 4 * attn_layers_recomputed) / hw.hbm_bytes_per_s
        # each group's collectives (stage_collectives: how many, how many bytes) on the links the group crosses
        coll = stage_collectives(cfg, i)
        t = e = x = p = t_unfused = 0.0
        if "TP" in coll:
            k, nbytes, _ = coll["TP"]
            one = (lay.tp - 1) / lay.tp * nbytes / tp_bw * f_comm + tp_lat
            t = t_unfused = k * one
            if fuse_tp and n:
                # MC2 sets each layer pass's all-gather / reduce-scatter beside a matmul: per layer 2 beside the
                # attention's linears and 2 beside the MLP's, forward, backward and recompute alike; the 2 embedding
                # passes stay apart. The forward fuses all-gather + matmul and matmul + reduce-scatter; the backward
                # fuses the all-gather into the input-gradient matmul and runs the reduce-scatter under the weight
                # gradient's (MindSpeed-LLM 1ea3922 modellink/core/tensor_parallel/ascend_turbo/
                # mc2_linears_seq_parallel.py), each as long as a forward matmul. Each pass is set beside an equal
                # share of its linears' forward time. A MoE model fuses its attention's only (MindSpeed-LLM
                # docs/en/pytorch/features/mcore/mc2.md: under mcore the MLP of a MoE model does not use MC2).
                lin_attn = sum(o["wq"] + o["wk"] + o["wv"] + o["wo"] for o in ops)
                lin_mlp = sum(o["w1"] + o["w2"] + o["w3"] for o in ops)
                fused = [(lin_attn, 4 * n + 2 * n_full)]       # forward and backward 2 per layer, 2 per recomputed one
                if m.moe is None:
                    fused.append((lin_mlp, 4 * n + 2 * n_full))
                passes_fused = sum(c for _, c in fused)
                t = (k - passes_fused) * one
                for lin, count in fused:
                    mm = tokens_micro * lin / lay.tp / rate / (2 * n)     # one pass's share of the forward linears
                    t += count * mc2_exposed(one, mm, lay.tp)
        if "EP" in coll and spans["EP"]["size"] > 1:
            k, nbytes, kind = coll["EP"]
            if kind == "all_gather":
                # every rank gathers the EP group's tokens and reduce-scatters the outputs back: a ring pass over
                # the group forwards n - 1 of the ranks' shares (Megatron-core MoEAllGatherTokenDispatcher); the
                # volume is every token whatever the routing, so imbalance does not scale it
                one = (spans["EP"]["size"] - 1) * nbytes / topology.ring_link(hw, spans["EP"])[0]
            else:
                # the busiest EP rank receives its experts' share of the tokens: imbalance scales what it receives
                one = topology.all_to_all_time(hw, spans["EP"], nbytes) * imbalance
            e = k * (one * f_comm + ep_lat)
        moe_layers = [j for j in ids[i] if m.moe is not None and m.moe.is_moe_layer(j)]
        if moe_layers:
            local = tokens_micro / (lay.tp if lay.seq_parallel and m.moe.sp_dispatch else 1)
            n_perm = 3 * len(moe_layers) + sum(1 for j in moe_layers if j - ids[i][0] < n_full)
            perms.append(n_perm * permute_bytes(m, local) / hw.hbm_bytes_per_s)
        else:
            perms.append(0.0)
        if "CP" in coll:
            k, nbytes, kind = coll["CP"]
            if kind == "all_to_all":
                x = k * (topology.all_to_all_time(hw, spans["CP"], nbytes) * f_comm + cp_lat)
            else:
                # each of the cp - 1 ring steps sends the next K/V block while computing attention on the one it
                # holds (Liu, Zaharia and Abbeel 2023, Ring Attention, section 3): only the part of the send
                # that outlasts one block's attention is exposed (the backward: both twice)
                block = comp_attn[-1] / max(3 * n + attn_layers_recomputed, 1) / lay.cp
                x = k * max(0.0, nbytes / cp_bw * f_comm + cp_lat - block)
        if "PP" in coll:
            # each hop on the link it crosses: stages that share a node talk over its mesh, a hop between nodes
            # over the NIC (interleaved: the last stage's next is stage 0)
            k, nbytes, _ = coll["PP"]
            nxt, prev = (i + 1) % lay.pp, (i - 1) % lay.pp
            if lay.vpp == 1:                    # no wrap-around: the end stages have one neighbour, both ways
                nxt, prev = (prev if i == lay.pp - 1 else nxt), (nxt if i == 0 else prev)
            for j in (nxt, prev):
                bw, lat = topology.ring_link(hw, topology.span(sorted({i * stage_ranks, j * stage_ranks}),
                                                               hw.devices_per_node))
                p += k / 2 * (nbytes / bw * f_comm + lat)
        comp.append(c), hbm.append(a), tps.append(t), eps.append(e), cps.append(x), p2ps.append(p)
        tps_unfused.append(t_unfused)
        per_stage.append(c + a + t + e + x + p + perms[-1])
    b = max(range(lay.pp), key=lambda k: per_stage[k])
    nm = lay.n_micro
    compute_s, attn_hbm_s = nm * comp[b], nm * hbm[b]
    tp_s, ep_s, cp_s, p2p_s, perm_s = nm * tps[b], nm * eps[b], nm * cps[b], nm * p2ps[b], nm * perms[b]
    bubble_s = (sum(per_stage) - per_stage[b]) / lay.vpp                # 1F1B fill + drain; interleaved: / v
    dense, expert = stage_params(cfg, b)
    local = dense + expert
    dp_total = dp_exposed_part = 0.0
    fwd_share = 1.0 / (3 + lay.full_recompute[b] / max(lay.stage_layers[b], 1))
    window = comp[b] * (1 - fwd_share) * hw.dp_overlap                  # the last micro-batch's backward
    dp_sp, edp_sp = spans["DP"], spans["EDP"]
    dp_bw, dp_lat = topology.ring_link(hw, dp_sp)
    edp_bw, edp_lat = topology.ring_link(hw, edp_sp)

    def reduce_one(nbytes: float, sp: dict, bw: float, lat: float) -> float:
        """One pass (reduce-scatter or all-gather) of `nbytes` over group `sp`, exposed-time scaled."""
        n = sp["size"]
        return 0.0 if n < 2 or nbytes <= 0 else (n - 1) / n * nbytes / bw * f_comm + lat

    grads = gradient_collectives(cfg, b)
    passes = grads["DP"][0]
    one_dense = reduce_one(grads["DP"][1], dp_sp, dp_bw, dp_lat)
    one_expert = reduce_one(grads["EDP"][1], edp_sp, edp_bw, edp_lat)     # routed experts: over their replicas only
    one = one_dense + one_expert
    if one > 0:
        dp_total = passes * one
        if lay.optimizer_shard == "fsdp":
            # parameters gathered before forward and backward of every micro-batch's layers, gradients
            # reduce-scattered once: prefetched behind the compute of the layer before
            window = (compute_s + tp_s) * hw.dp_overlap
        else:
            # the parallel optimizer's parameter all-gather comes after the update, before the next forward
            dp_exposed_part = one if lay.optimizer_shard == "po" else 0.0
    dp_s = dp_exposed_part + max(0.0, dp_total - dp_exposed_part - window)
    # the parallel optimizer splits each parameter's update over its replicas, as memory_per_stage splits its states:
    # dense over dp x cp, a routed expert shard over its EDP replicas only (dp x cp x tp / (ep x tp): 1 at dp = ep)
    sharded = dense / lay.shard_ranks + expert / expert_replicas(lay) if lay.parallel_optimizer else local
    optimizer_s = sharded * (4 * lay.param_bytes + 16) / hw.hbm_bytes_per_s
    step = compute_s + attn_hbm_s + perm_s + tp_s + ep_s + cp_s + p2p_s + bubble_s + dp_s + optimizer_s
    tokens = lay.global_batch * m.seq
    tps_dev = tokens / (step * lay.devices)
    f = flops_per_token(m)
    # hardware FLOPs = the model's (PaLM's count) + the work recompute and capacity padding add, as the step
    # above charges it: never below the model FLOPs, and equal to them with neither
    hw_per_token = f["palm"] + extra_flops_total * nm / tokens
    # what the kernels compute: the same, with attention at the pairs flash attention computes (attention_work)
    attn_counted = f["palm"] - f["6n"] + extra_attn_total * nm / tokens
    computed_per_token = hw_per_token - (1 - work_attn) * attn_counted
    times = {"TP": tp_s, "CP": cp_s, "EP": ep_s, "PP": p2p_s, "DP": 2 * one_dense, "EDP": 2 * one_expert}
    group_rows = [{"group": k, "size": sp["size"], "span": sp["span"], "nodes": sp["nodes"], "link": sp["link"],
                   "time_s": times[k]} for k, sp in spans.items() if m.moe is not None or k not in ("EP", "EDP")]
    return {"compute_s": compute_s, "attention_s": nm * comp_attn[b], "expert_s": nm * comp_expert[b],
            "attn_hbm_s": attn_hbm_s, "moe_permute_s": perm_s, "moe_imbalance": imbalance, "tp_s": tp_s,
            "tp_unfused_s": nm * tps_unfused[b], "mc2": fuse_tp, "ep_s": ep_s, "cp_s": cp_s,
            "p2p_s": p2p_s, "bubble_s": bubble_s, "dp_s": dp_s, "dp_total_s": dp_total,
            "dp_hidden_s": dp_total - dp_s, "optimizer_s": optimizer_s,
            "step_s": step, "tokens_per_s_per_device": tps_dev, "n_params": param_count(m),
            "n_active_params": param_count(m, active=True),
            "mfu_6n": f["6n"] * tps_dev / peak, "mfu_attention": f["palm"] * tps_dev / peak,
            "mfu_hardware": hw_per_token * tps_dev / peak, "mfu_computed": computed_per_token * tps_dev / peak,
            "peak_flops": peak,
            "per_stage_s": per_stage, "per_stage_p2p_s": p2ps, "bottleneck_stage": b, "recompute_factor": hw_per_token / f["palm"],
            "global_batch": lay.global_batch, "micro_batches": nm,
            "moe_capacity_padding": m.moe.slots() / m.moe.top_k if m.moe is not None else 1.0,
            "groups": group_rows}


TERMS = (("compute_s", "compute"), ("attn_hbm_s", "attention scores through HBM (no flash attention)"),
         ("moe_permute_s", "MoE token permutation and router (memory-bound)"),
         ("tp_s", "TP/SP collectives"), ("ep_s", "MoE all-to-all (EP)"),
         ("cp_s", "context parallel"), ("p2p_s", "pipeline point-to-point"), ("bubble_s", "pipeline bubble"),
         ("dp_s", "DP reduction, exposed"), ("optimizer_s", "optimizer update"))


def stage_collectives(cfg: Config, i: int) -> dict[str, tuple[float, float, str]]:
    """The collectives one device of stage i runs per micro-batch, by group, as (count, bytes each, kind); a
    group that sends nothing is left out. kind "ring" or "all_to_all": each rank sends (n - 1)/n of the bytes
    over a group of n; "all_gather": each rank's share, forwarded to the n - 1 others; "p2p": all of them. `step_time` prices each on the links its group crosses;
    `adapt.traffic_bytes` counts the bytes sent.

      TP  ring all-reduces of the b·s·h activations at 16 bits: 8 per layer, 4 more per fully recomputed layer,
          2 on stage 0 for a vocabulary embedding split over tp
      EP  all-to-alls of every routed slot, filled or not: 4 per MoE layer, 2 more per recomputed one (the
          all-gather dispatcher: each rank's tokens gathered, and the outputs reduce-scattered back, as often)
      CP  Ulysses: all-to-alls of the activations of the rank's own heads, hidden / tp wide (as TP's count);
          ring: the local K and V of the rank's own KV heads (kv_heads / tp, at least one) passed cp - 1 times
          for the forward, twice for the backward and once per recomputed layer
      PP  the activations on to the next stage and their gradients back to the one before, per chunk
    Taught in: no notebook; doctor/adapt.py calls it.
    """
    m, lay = cfg.model, cfg.layout
    first = sum(lay.stage_layers[:i])
    ids = range(first, first + lay.stage_layers[i])           # stage_layer_ids(cfg)[i]
    n, n_full = len(ids), lay.full_recompute[i]
    tokens_micro = lay.batch * lay.interleave * m.seq / lay.cp     # tokens of one micro-batch on one device
    act_bytes = tokens_micro * m.hidden * 2
    out: dict[str, tuple[float, float, str]] = {}
    if lay.tp > 1:
        out["TP"] = (8 * n + 4 * n_full + (2 if i == 0 and not lay.vocab_emb_dp else 0), act_bytes, "ring")
    moe_layers = [j for j in ids if m.moe is not None and m.moe.is_moe_layer(j)]
    if moe_layers:
        # under sequence parallel, r1.5.0+ MoEV2 routes each tp rank's own sequence shard (r1.5.0
        # modules/transformer/moe.py l.696 router over dp x mp, l.755 _ffn_forward_sq); r1.2.0-r1.3.x MoEV2
        # reshapes to (data_parallel, -1, h) and gathers over dp only (r1.3.0 moe.py l.647, l.751,
        # TopkRouterV2.dispatch_gather l.1152 shard ((dp, 1, 1), (dp, 1, 1))): every tp rank sends the whole slice
        local = tokens_micro / (lay.tp if lay.seq_parallel and m.moe.sp_dispatch else 1)
        count = 4 * len(moe_layers) + 2 * sum(1 for j in moe_layers if j - ids[0] < n_full)
        if m.moe.dispatcher == "allgather":     # each rank's own tokens, once, to every other rank of the group
            out["EP"] = (count, local * m.hidden * 2, "all_gather")
        else:                                   # every routed slot, filled or not
            out["EP"] = (count, local * m.moe.slots() * m.hidden * 2, "all_to_all")
    if lay.cp > 1:
        if lay.cp_kind == "ulysses":     # each tensor-parallel rank swaps the hidden / tp columns of its own heads
            out["CP"] = (8 * n + 4 * n_full, act_bytes / lay.tp, "all_to_all")
        else:
            # each tensor-parallel rank runs its own ring over the KV heads it holds: kv_heads / tp of them, at least
            # one (Megatron-core splits the query groups over TP, num_query_groups_per_partition, and copies a group
            # to several ranks when there are fewer groups than ranks; mindformers shards the heads over
            # model_parallel). MLA's latent is not split by head: every rank passes all of it
            kv = tokens_micro * (max(m.kv_heads / lay.tp, 1) * m.head_dim if m.attention != "mla"
                                 else m.kv_lora_rank + m.qk_rope_dim)
            out["CP"] = ((lay.cp - 1) * (3 * n + n_full), 2 * kv * 2, "p2p")     # K and V of the local chunk, 16-bit
    if lay.pp > 1:
        out["PP"] = (2 * lay.vpp, act_bytes / (lay.tp if lay.seq_parallel else 1), "p2p")
    return out


def gradient_collectives(cfg: Config, i: int) -> dict[str, tuple[float, float, str]]:
    """Stage i's gradient reduction per optimizer step, as stage_collectives gives the rest: DP passes over its
    dense parameters' bytes, EDP passes over its routed experts' (over their replicas only). Two ring passes
    (reduce-scatter + all-gather under the parallel optimizer, or one all-reduce); FSDP gathers the parameters
    before the forward and the backward of every micro-batch too: 2 x micro-batches + 1.
    Taught in: no notebook; doctor/adapt.py calls it."""
    lay = cfg.layout
    dense, expert = stage_params(cfg, i)
    passes = 2 * lay.n_micro + 1 if lay.optimizer_shard == "fsdp" else 2
    return {"DP": (passes, dense * lay.param_bytes, "ring"), "EDP": (passes, expert * lay.param_bytes, "ring")}


# ---------------------------------------------------------------- memory
HCCL_BUFFSIZE_BYTES = 200 * 2**20      # CANN's default HCCL_BUFFSIZE: 200 MB (envvar reference, HCCL_BUFFSIZE)
RESERVE_SOURCE = ("HCCL's send and receive buffers, 2 x HCCL_BUFFSIZE (200 MB by default) for every communication "
                  "domain a rank joins, exclusive to HCCL and not shared with other memory (CANN environment "
                  "variable reference, HCCL_BUFFSIZE); counted against the budget whichever allocator holds them. "
                  "Workspace and fragmentation have no published figure for MindSpore's pool and are not in it")


def memory_reserve(cfg: Config, hw: Any) -> dict[str, Any]:
    """Device memory a rank needs besides its tensors: HCCL's buffers, 2 x HCCL_BUFFSIZE per communication domain
    (each of the rank's groups of more than one rank, and the world). None on hardware without a device pool (the
    CPU). Returns bytes, domains, groups (their names) and source.
    Taught in: no notebook; doctor/__init__.py, doctor/describe.py, doctor/diagnosis.py call it."""
    if not getattr(hw, "device_pool", True):
        return {"bytes": 0, "domains": 0, "groups": [], "source": "none on this hardware (no HCCL)"}
    names = _domains(cfg)
    return {"bytes": 2 * HCCL_BUFFSIZE_BYTES * len(names), "domains": len(names), "groups": names,
            "source": RESERVE_SOURCE}


def _domains(cfg: Config) -> list[str]:
    names = [k for k, ranks in topology.groups(cfg.layout, cfg.dialect).items() if len(ranks) > 1
             and (cfg.model.moe is not None or k not in ("EP", "EDP"))]
    return names + (["world"] if cfg.layout.devices > 1 else [])


def with_reserve(cfg: Config, hw: Any) -> Config:
    """`cfg` priced with the reserve on `hw` (none on the CPU): what every entry point prices a file with. The
    bytes follow the layout (memory_per_stage counts the domains of the layout it prices).
    Taught in: no notebook; doctor/diagnosis.py, doctor/heldout.py, memory.py call it."""
    return dataclasses.replace(cfg, hccl_reserve=bool(getattr(hw, "device_pool", True)))


def memory_per_stage(cfg: Config) -> dict[str, Any]:
    """Peak bytes per device of each pipeline stage against the budget, and the largest stage's breakdown (params,
    grads (with any accumulation buffer, also given as grad_accum_buffer_bytes), optimizer_states, activations): the
    one memory model (mshelpers.memory.estimate prices a RunConfig by it). Layout.optimizer_shard slices over dp x cp
    (experts over their replicas): "po" params and states, "zero1" states, "zero2" states and grads, "fsdp" all.
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    lay = cfg.layout
    totals, parts, buffers = [], [], []
    for i in range(lay.pp):
        part, buffer = _stage_part(cfg, i)
        totals.append(sum(part.values()))           # the parts, each in whole bytes, sum to the total
        buffers.append(buffer)
        parts.append(part)
    peak = max(range(lay.pp), key=lambda k: totals[k])
    budget = cfg.budget_bytes
    reserve = reserve_bytes(cfg)
    return {"per_stage_bytes": totals, "memory_per_device_bytes": totals[peak], "stage": peak,
            "budget_bytes": budget, "reserve_bytes": reserve,
            "fits": None if budget is None else totals[peak] + reserve <= budget,
            "headroom_bytes": None if budget is None else budget - reserve - totals[peak], "breakdown": parts[peak],
            "per_stage_breakdown": parts, "grad_accum_buffer_bytes": buffers[peak],
            "per_stage_grad_accum_buffer_bytes": buffers}


def stage_memory_bytes(cfg: Config, i: int) -> int:
    """Stage i's bytes per device, memory_per_stage's per_stage_bytes[i], without pricing the other stages: the
    search bisects the full-recompute layers of one stage at a time.
    Taught in: no notebook; doctor/search.py calls it."""
    return sum(_stage_part(cfg, i)[0].values())


def reserve_bytes(cfg: Config) -> int:
    """memory_per_stage's reserve_bytes: HCCL's buffers of the layout's domains when `cfg` counts them (with_reserve).
    Taught in: no notebook; doctor/search.py calls it."""
    return 2 * HCCL_BUFFSIZE_BYTES * len(_domains(cfg)) if cfg.hccl_reserve else 0


def _stage_part(cfg: Config, i: int) -> tuple[dict, int]:
    """Stage i's params, grads, optimizer_states and activations in whole bytes, and its accumulation buffer."""
    m, lay = cfg.model, cfg.layout
    ids = _stage_ranges(tuple(lay.stage_layers))[i]
    accum = lay.grad_accum > 1 or (lay.pp > 1 and lay.micro > 1)
    dense, expert = stage_params(cfg, i)
    first = layer_params(m, ids[0]) / lay.tp if ids else 0
    # an expert shard's replicas (topology's EDP group): the parallel optimizer shards their states over all of them
    *states, buffer = _stage_states(lay, dense, expert, first, expert_replicas(lay), accum)
    part = dict(zip(("params", "grads", "optimizer_states", "activations"),
                    map(int, (*states, stage_activations(cfg, i)["bytes"]))))
    return part, int(buffer)


def _stage_states(lay: Any, dense: float, expert: float, first_layer: float, replicas: int, accum: bool) -> tuple:
    """(params, grads, states, the separate accumulation buffer in grads): memory_states.sharded_state_bytes."""
    if "." in __package__:
        from .. import memory_states as S
    else:  # the doctor/ folder copied beside its siblings as plain files
        import memory_states as S
    gb = lay.param_bytes if lay.grad_bytes is None else lay.grad_bytes
    return S.sharded_state_bytes(dense, expert, ranks=lay.shard_ranks, expert_ranks=replicas,
                                 sharding=lay.optimizer_shard, bytes_per_param=(lay.param_bytes, gb, lay.state_bytes),
                                 accumulating=accum, accum_buffer=lay.accum_buffer, shard_accum=lay.shard_accum,
                                 layer_params=first_layer)


def stage_activations(cfg: Config, i: int = 0) -> dict[str, Any]:
    """Stage i's activations: per_layer (each layer in its recompute mode), per_micro_batch (their sum; swap: the
    two largest stay on device), working (one layer rematerialised under recompute), output (logits on the last
    stage), in_flight (micro-batches held at the peak under the layout's schedule, `in_flight`) and
    bytes = per_micro_batch x in_flight + working + output, the term memory_per_stage adds.
    Taught in: no notebook; doctor/adapt.py, memory.py call it."""
    m, lay = cfg.model, cfg.layout
    if not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < lay.pp):
        raise DoctorError("stage", i, f"0 <= stage < pp = {lay.pp}")
    # kept per what it reads (not the whole Layout, whose other fields the search varies); a fresh dict per call
    d = _stage_activations(m, tuple(lay.stage_layers), lay.pp, i, lay.compute_dtype, lay.cp, lay.full_recompute[i],
                           tuple(lay.select_ops[i]), lay.swap, lay.batch, lay.tp, lay.seq_parallel,
                           in_flight(lay)[i])
    return dict(d, per_layer=list(d["per_layer"]))


@functools.lru_cache(maxsize=65536)
def _stage_activations(m: Model, stage_layers: tuple, pp: int, i: int, compute_dtype: str, cp: int, full: int,
                       select_ops: tuple, swap: bool, batch: int, tp: int, seq_parallel: bool,
                       inflight: int) -> dict[str, Any]:
    if "." in __package__:
        from .. import memory_activations as mem
    else:  # the doctor/ folder copied beside its siblings as plain files
        import memory_activations as mem
    ids = _stage_ranges(stage_layers)[i]
    bpv = 2 if compute_dtype in ("float16", "bfloat16") else 4
    seq = m.seq // cp
    sel = max((k for _, k in select_ops), default=0)
    memo: dict = {}     # a layer's bytes depend on it only through (MoE or dense, recompute mode)

    def layer(j: int, mode: str) -> int:
        key = (m.moe is not None and m.moe.is_moe_layer(j), mode)
        if key not in memo:
            memo[key] = _activation(mem, m, batch, tp, seq_parallel, key[0], seq, mode, bpv)
        return memo[key]
    per_layer = tuple(layer(j, "full" if k < full else "selective" if k < full + sel else "none")
                      for k, j in enumerate(ids))
    working = 0
    if (full or sel) and ids:
        working = layer(ids[0], "none") - min(per_layer)
    stored = sum(sorted(per_layer, reverse=True)[:2]) if swap and ids else sum(per_layer)
    output = 0
    if i == pp - 1:
        output = mem.output_activation_bytes(seq, batch, m.vocab, tp=tp, bytes_per_value=bpv) * (1 + m.mtp)
    return {"layers": len(ids), "per_layer": per_layer, "per_micro_batch": stored, "working": working,
            "output": output, "in_flight": inflight, "bytes": stored * inflight + working + output}


def in_flight(lay: Any) -> list:
    """Micro-batches each stage holds at its peak under the layout's schedule (and interleaved order), 1 without a
    pipeline: `pipeline.pipeline_in_flight`, the one rule. Taught in notebooks/05_semi_auto_parallel.ipynb."""
    if lay.pp == 1:
        return [1]
    if "." in __package__:
        from ..pipeline import pipeline_in_flight
    else:  # the doctor/ folder copied beside its siblings as plain files
        from pipeline import pipeline_in_flight
    return pipeline_in_flight(lay.pp, lay.micro, lay.schedule, lay.vpp, interleaved_order=lay.interleaved_order)


@functools.lru_cache(maxsize=8192)
def _activation(mem: Any, m: Model, batch: int, tp: int, sp: bool, moe_layer: bool, seq: int, mode: str,
                bpv: int) -> int:
    """Activation bytes one layer keeps (Korthikanti's count, mindformers' LLaMA block; a MoE layer as a
    SwiGLU of width top_k * expert_ffn + shared_ffn, plus its top_k copies of the expert inputs)."""
    ffn = m.ffn
    if moe_layer:
        e = m.moe
        k = e.slots()                   # padded capacity slots are stored like filled ones
        ffn = int(k * e.expert_ffn) + e.shared_ffn + int(k * m.hidden) // 4
    kv = m.heads if m.attention == "mla" else m.kv_heads
    return mem.activation_bytes_per_layer(seq, batch, m.hidden, m.heads, tp=tp,
                                          sequence_parallel=sp, recompute=mode, bytes_per_value=bpv,
                                          flash_attention=m.flash, num_kv_heads=kv, ffn_hidden_size=ffn, arch=m.block)
