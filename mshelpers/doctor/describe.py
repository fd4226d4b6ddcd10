"""The doctor's vocabulary: one model description, one layout description, and the error it raises.

Every reader (r1.x legacy, 1.x mcore static, 2.x PyNative) maps a file into a `Model` and a `Layout`;
the cost model, the search and the report read only these, never a YAML. `Config` carries the two
with the budget, the dialect and the parsed file (kept so an improved YAML changes only the keys it must).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .published import PUBLISHED


class DoctorError(ValueError):
    """Bad input, said in one line: which field, what value, and the fix.
    Taught in: no notebook; doctor/__init__.py, doctor/cli.py, doctor/cost.py call it."""

    def __init__(self, field_name: str, value: Any, fix: str):
        self.field, self.value, self.fix = field_name, value, fix
        text = repr(value)
        if len(text) > 120:
            text = text[:117] + "..."
        super().__init__(f"{field_name}={text}; fix: {fix}")


@dataclass(frozen=True)
class MoE:
    """Mixture of experts: routed experts (top_k of them per token), shared experts, dense first layers.
    Taught in: no notebook; doctor/__init__.py, doctor/readers.py call it."""
    routed: int                     # routed experts per MoE layer
    top_k: int                      # experts each token is sent to
    expert_ffn: int                 # SwiGLU width of one routed expert
    shared: int = 0                 # shared experts (every token goes through them)
    shared_ffn: int = 0             # total SwiGLU width of the shared experts
    first_dense: int = 0            # the first k layers are dense (DeepSeek's first_k_dense_replace)
    every: int = 1                  # one MoE layer every `every` layers after the dense ones (moe_layer_freq)
    capacity_factor: float = 0.0    # r1.x moe_config.capacity_factor; <= 0: dropless (mcore's default, None)
    dispatcher: str = "alltoall"    # how tokens reach their experts: "alltoall" (each slot sent to its expert's rank)
                                    # or "allgather" (every rank gathers the EP group's tokens, reduce-scatters back)
    imbalance: float = 0.0          # the busiest EP rank's load over the mean, minus 1 (0: as balanced as chance,
                                    # cost.routing_imbalance; --moe-imbalance)
    sp_dispatch: bool = True        # under sequence parallel each tp rank routes and sends only its own sequence
                                    # shard (r1.x MoEV2 from r1.5.0 on: _ffn_forward_sq, router over dp x mp).
                                    # False: r1.2.0-r1.3.x MoEV2 routes the whole dp slice on every tp rank and
                                    # each of them sends all of it (read_config(release=...) sets it)

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_dense and (i - self.first_dense) % self.every == 0

    def slots(self) -> float:
        """Expert slots computed per token. With a capacity factor, mindformers' r1.x MoE (MoEV2) pads every
        expert to capacity = ceil(capacity_factor * top_k * tokens / experts) slots, at most the tokens, and its
        expert FFNs, all-to-alls and activations run on all of them, filled or not: min(cf * top_k, experts)
        per token. Dropless: top_k."""
        if self.capacity_factor <= 0:
            return float(self.top_k)
        return min(self.capacity_factor * self.top_k, float(self.routed))


@dataclass(frozen=True)
class Model:
    """What the model is, in the terms the cost model needs (Hugging Face names in comments).
    Taught in: no notebook; doctor/__init__.py, doctor/adapt.py, doctor/cost.py call it."""
    name: str                       # model_type / architecture, as the file names it
    layers: int                     # num_hidden_layers / num_layers
    hidden: int                     # hidden_size
    heads: int                      # num_attention_heads
    kv_heads: int                   # num_key_value_heads (GQA; = heads for MHA)
    head_dim: int                   # head_dim (h / heads unless given)
    ffn: int                        # dense SwiGLU width (intermediate_size / ffn_hidden_size)
    vocab: int
    seq: int
    tied: bool = False              # tie_word_embeddings: one matrix for embedding and lm_head
    attention: str = "gqa"          # "mha" | "gqa" | "mla"
    q_lora_rank: int = 0            # MLA (DeepSeek-V2/V3): 0 = a full-rank query projection
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    moe: MoE | None = None
    mtp: int = 0                    # multi-token-prediction depth (num_nextn_predict_layers / mtp_num_layers)
    flash: bool = True
    qkv_bias: bool = False
    window: int = 0                 # sliding-window attention: each token attends to the last `window` (0: all)
    eod: bool = False               # attention confined to each packed document (use_eod_attn_mask_compression, or
                                    # the dataset's create_compressed_eod_mask); not under ring attention
    doc_len: int = 0                # the documents' mean length in tokens (--doc-len; 0: not given, priced as one
                                    # document per sequence, the most pairs)
    # the GPT-style switches (mshelpers.memory.estimate prices a RunConfig or any model through this Model; the
    # readers leave them at LLaMA's values)
    block: str = "llama"            # the activation count: "llama" (mindformers' LLaMA block) or "gpt" (Korthikanti's
                                    # GPT block: LayerNorm, dropout masks, a 2-matrix MLP)
    mlp: str = "swiglu"             # "swiglu" (w1, w2, w3) or "gelu" (fc1, fc2)
    norm: str = "rms"               # "rms" (h weights) or "layer" (h weights + h biases)
    bias: bool = False              # every Linear has a bias (q, k, v, o, the MLP's)
    positions: int = 0              # rows of a learned position table (GPT-2: 1024), on the first stage
    extra_params: int = 0           # parameters the structural count does not see (the user's own count minus it,
                                    # memory.estimate's n_params=), held whole on the first stage

    @property
    def q_width(self) -> int:
        """Query width over all heads (MLA: nope + rope per head)."""
        return self.heads * (self.qk_nope_dim + self.qk_rope_dim if self.attention == "mla" else self.head_dim)

    @property
    def v_width(self) -> int:
        return self.heads * (self.v_head_dim if self.attention == "mla" else self.head_dim)


@dataclass(frozen=True)
class Layout:
    """How the model is laid out and trained: parallel degrees, batches, recompute, precision.
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    dp: int = 1
    tp: int = 1                     # model_parallel / tensor_parallel
    pp: int = 1
    ep: int = 1                     # expert parallel, carved out of dp x tp (mindformers)
    cp: int = 1                     # context parallel
    cp_kind: str = "ring"           # "ring" (P2P of K/V) or "ulysses" (all-to-all of heads)
    vpp: int = 1                    # virtual pipeline chunks per stage (pp_interleave_num)
    micro: int = 1                  # pipeline micro-batches per step (pp > 1)
    batch: int = 1                  # sequences per micro-batch per dp rank
    grad_accum: int = 1
    interleave: int = 1             # micro_batch_interleave_num
    seq_parallel: bool = False
    optimizer_shard: str = "none"   # "none" | "po" (MindSpore's parallel optimizer) | "fsdp" (params, grads, states);
                                    # "zero1" (states) | "zero2" (states, grads): ZeRO's stages 1 and 2
    vocab_emb_dp: bool = True
    shard_accum: bool = False       # parallel_optimizer_config.gradient_accumulation_shard
    stage_layers: tuple = (1,)      # layers per pipeline stage (over its VPP chunks)
    full_recompute: tuple = (0,)    # fully recomputed layers per stage
    select_ops: tuple = ((),)       # per stage: ((op pattern, layers), ...)
    swap: bool = False              # activations offloaded to host (swap / layer_swap)
    compute_dtype: str = "float16"
    param_bytes: int = 2
    state_bytes: int = 8            # optimizer bytes per parameter (Adam: two fp32 moments)
    schedule: str = "1f1b"          # pipeline schedule (pp > 1): "1f1b" (mindformers' default), "gpipe", or
                                    # "interleaved" (vpp chunks per stage; a file's pp_interleave_num > 1)
    interleaved_order: str = "standard"   # MindSpore's InterleavedScheduler order: "standard" or "memory"
    grad_bytes: int | None = None   # gradient bytes per parameter (None: param_bytes; Megatron/DeepSpeed's fp32 grads: 4)
    accum_buffer: bool = False      # accumulation keeps a second, gradient-sized buffer beside the gradients (a loop
                                    # that sums each micro-step's gradients into its own buffer, as the cookbook's
                                    # train_step does). False: MindSpore's accu_grads, the one copy the backward adds into

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def ring(self) -> bool:
        """Context parallel by ring attention (P2P of K/V blocks), where mindformers drops packed documents' masks."""
        return self.cp > 1 and self.cp_kind == "ring"

    @property
    def n_micro(self) -> int:
        """Micro-batches per optimizer step and stage: gradient accumulation x pipeline micro-batches."""
        return self.grad_accum * (self.micro if self.pp > 1 else 1)

    @property
    def global_batch(self) -> int:
        return self.batch * self.dp * self.n_micro * self.interleave

    @property
    def parallel_optimizer(self) -> bool:
        """MindSpore's parallel optimizer shards over every rank that holds the same parameters: dp x cp."""
        return self.optimizer_shard != "none" and self.dp * self.cp > 1

    @property
    def shard_ranks(self) -> int:
        """Ranks the parallel optimizer (or FSDP) splits states over: data and context parallel ranks."""
        return self.dp * self.cp


@dataclass(frozen=True)
class Calibration:
    """The fitted constants, each with one meaning, applied in one direction everywhere (see cost.step_time).
    Taught in notebooks/04_data_parallel.ipynb."""
    compute_efficiency: float            # achieved share of the datasheet peak on the matmul FLOPs
    comm_time_factor: float              # exposed collective time / datasheet time (bytes / link rate on the
                                         # links the group crosses): multiplies every collective, TP, CP, EP,
                                         # P2P and DP alike; < 1 when part overlaps compute
    fitted_on: tuple = ()
    half_width: float = 0.0              # per-device matmul width at which matmuls reach half their rate; no fit
                                         # point (README: the two rows that would set it pull it apart): 0, no effect
    attention_efficiency: float = 1.0    # flash attention's rate on the pairs it computes (causal: half of s^2,
                                         # cost.attention_work) relative to the matmuls', at head dim 128
    head_dim_half: float = 0.0           # the attention kernels' rate falls with the head dim d (the contraction of
                                         # QK^T) as d / (d + head_dim_half), taken relative to d = 128: their vector
                                         # work per score (max, exp, sum) is the same at any d. 0: no effect

    def row(self) -> dict:
        return {"compute_efficiency": round(self.compute_efficiency, 4),
                "comm_time_factor": round(self.comm_time_factor, 4), "half_width": round(self.half_width, 1),
                "attention_efficiency": round(self.attention_efficiency, 4),
                "head_dim_half": round(self.head_dim_half, 1), "fitted_on": ", ".join(self.fitted_on)}


# The values calibration.fit_calibration() returns on the published "fit" rows (tests/doctor/test_api.py re-fits and
# compares). Kept here, in the vocabulary every room imports, so cost.py needs no import of calibration.py.
FIT_FILES = tuple(p["file"] for p in PUBLISHED if p["role"] == "fit")
CALIBRATION = Calibration(compute_efficiency=0.6252, comm_time_factor=2.5241, fitted_on=FIT_FILES,
                          half_width=0.0, attention_efficiency=0.4078, head_dim_half=734.5)
# The error a user should expect, dense and MoE apart: calibration.lofo_summary(leave_one_family_out()) on
# mindformers' cards, r1.2.0 on (each family predicted by a fit that never saw it; tests/doctor/test_api.py
# recomputes it). median: over every held-out row; p80: 4 in 5 rows within it.
EXPECTED_ERROR = {"dense": {"median_abs_error": 0.083, "p80_abs_error": 0.201, "rows": 74, "families": 17},
                  "moe": {"median_abs_error": 0.064, "p80_abs_error": 0.139, "rows": 4, "families": 4}}


@dataclass(frozen=True)
class Config:
    """A read file: the model, the layout, the memory budget, the dialect, and the parsed file itself.
    Taught in: no notebook; doctor/__init__.py, doctor/adapt.py, doctor/cost.py call it."""
    model: Model
    layout: Layout
    budget_bytes: int | None
    dialect: str                    # "r1.x", "mcore", "pynative"
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    notes: tuple = ()               # what the reader assumed (a derived dp, a merged config.json, ...)
    model_config: Any = field(default=None, compare=False, repr=False)   # the config.json merged, if any
    release: tuple = ()             # the mindformers release the file runs on, when given (read_config(release=))
    key_flags: tuple = field(default=(), compare=False)   # unknown keys and missing sections (keys.key_flags)
    hccl_reserve: bool = False      # keep HCCL's buffers free inside the budget (cost.memory_reserve; Ascend only)
    mc2: bool = False               # parallelism.enable_mc2 (2.x): TP's collectives fused into their matmuls (cost.mc2_exposed)
    # The file's own switches, as it sets them, where the Layout shows only their effect: use_seq_parallel (on
    # only with tp > 1), enable_parallel_optimizer (on only with dp x cp > 1), and the recompute entries
    # (recompute, select_recompute; a 2.x file's recompute section) its stage split resolved. variants.layout_variant
    # reads them, so a variant to tp > 1, dp > 1 or another stage split turns them on as the file would.
    asked: dict = field(default_factory=dict, compare=False, repr=False)

    def layout_dict(self) -> dict:
        """The layout as mindformers' r1.x names (for the report, --json and the search's change lists)."""
        lay = self.layout
        return {"data_parallel": lay.dp, "model_parallel": lay.tp, "pipeline_stage": lay.pp,
                "expert_parallel": lay.ep, "context_parallel": lay.cp, "pp_interleave_num": lay.vpp,
                "micro_batch_num": lay.micro, "gradient_accumulation_steps": lay.grad_accum,
                "batch_size": lay.batch, "use_seq_parallel": lay.seq_parallel,
                "optimizer_shard": lay.optimizer_shard, "recompute": list(lay.full_recompute),
                "select_recompute": [[list(p) for p in st] for st in lay.select_ops]}
