"""A config doctor: point it at a mindformers training YAML, get memory, step time, MFU and a better layout.

    python -m mshelpers.doctor CONFIG.yaml [--hardware NAME] [--devices N] [--budget 58GB] [--out DIR] [--json]

What it does, in order (every figure it prints says where it comes from):
1. `read_config` reads model.model_config, parallel_config, parallel, recompute_config (bools, per-stage
   lists, select_recompute op lists and dicts, select_comm_recompute), runner_config, optimizer,
   context.max_device_memory and micro_batch_interleave_num, in the r1.x layout (hidden_size, num_layers,
   num_heads, n_kv_heads, param_init_type) and the 1.9 layout (num_hidden_layers, num_attention_heads,
   num_key_value_heads, head_dim, params_dtype).
2. Memory per pipeline stage from `mshelpers.memory.estimate_from_mindformers_yaml`, against the budget.
3. `step_time`: the step decomposed into terms that add up to the step, each printed:
     compute    (3 + recompute) x forward FLOPs of the bottleneck stage, per micro-batch, x micro-batches,
                at peak x efficiency (forward FLOPs: the matmuls 2*params + attention 4*s*a*d_head per token
                per layer, PaLM's count; recompute: full layers add one forward, select_recompute op lists add
                the matmuls they name, SiLU/Mul add none)
     tp         TP/SP collectives: 8*(n-1)/n*b*s*h*2 bytes per layer per micro-batch (2 all-reduces or
                all-gather + reduce-scatter pairs forward, 2 backward), +4 more under full recompute
     p2p        pipeline sends: an activation forward and a gradient back per micro-batch
     bubble     1F1B fill and drain: sum over stages of the per-micro-batch time minus the bottleneck's
                (the (p-1)/(m+p-1) share for equal stages)
     dp         the gradient reduction ((n-1)/n*S reduce-scatter + all-gather with the parallel optimizer,
                2(n-1)/n*S all-reduce without), once per step (amortised over the micro-batches and
                gradient accumulation), minus what hides behind the last micro-batch's backward
     optimizer  the AdamW update, memory bound: (4*param bytes + 16) per local parameter over HBM bandwidth
   tokens/s per device = global batch * seq / (step * devices), mindformers' tokens/s/p.
4. MFU in three conventions side by side, against the SKU's datasheet peak at the compute dtype:
   6N (Kaplan), 6N + 12*L*h*s (PaLM appendix B, with attention), and hardware FLOPs (with recompute).
5. `better_layouts`: dp/mp/pp, micro-batches, per-stage full recompute counts, select_recompute, sequence
   parallel and the parallel optimizer searched on the same devices and global batch, under the budget;
   the top 5 by predicted tokens/s/p, each with its memory and what changed.

Calibration, kept honest: the two efficiency constants (matmul share of peak, link share of bandwidth) are
fitted on two published points only, Llama 2 7B and 70B pre-training on Atlas 800T A2 (mindformers r1.2.0,
docs/model_cards/llama2.md); `calibration_table()` reports the error on every other published figure in
PUBLISHED, none of which the fit saw. The peak, bandwidths and HBM figures are not fitted: they come from
Huawei's Ascend/msmodeling device profiles (tensor_cast/device.py), cited in HARDWARE.

Checked on this CPU (notebook 12, section 6): `mini_config` (the cookbook's mini model as a Config),
`cpu_hardware(ranks, alpha_beta=...)` (the measured MatMul peak, split over the ranks sharing the cores; the
all-reduce from a measured alpha-beta fit; no overlap), `fit_cpu_calibration` on CPU_FIT_SET only, `predict_cpu`
for CPU_CHECK_SET, `cpu_check` (the verdict per run, with the run's step spread), and `measure_cpu_steps` (also run per rank as `msrun ... doctor.py --cpu-check-worker`).

What the model leaves out: kernel efficiency that varies with shape, fine_grain_interleave and
micro_batch_interleave_num overlap (not modelled), offsets other than the YAML's, data loading, host
launch overhead, contention. It ranks layouts and says how far off it was on published configs; measure.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field, replace
from typing import Any


def _sibling(module: str, *names: str) -> Any:
    """A sibling cookbook module (or names from it), imported when a function needs it:
    mshelpers.<module> inside the package, plain <module> when the files were copied side by side."""
    import importlib
    mod = importlib.import_module(f"{__package__}.{module}" if __package__ else module)
    got = tuple(getattr(mod, n) for n in names)
    return mod if not names else got[0] if len(names) == 1 else got


class DoctorError(ValueError):
    """Bad input, said in one line: which field, what value, and the fix."""

    def __init__(self, field_name: str, value: Any, fix: str):
        self.field, self.value, self.fix = field_name, value, fix
        super().__init__(f"{field_name}={value!r}; fix: {fix}")


# ---------------------------------------------------------------- hardware
_MSMODELING = ("Huawei Ascend/msmodeling, tensor_cast/device.py (commit 1e5a50b1), "
               "https://github.com/Ascend/msmodeling/blob/1e5a50b1a025a6658a277aa963c87691dc279f4f/tensor_cast/device.py")
_A2_SOURCES = {
    "peak": f"ATLAS_800_A2_376T_64G mma_ops: float16 376e12, bfloat16 353.9e12 FLOP/s; {_MSMODELING}. "
            "The 313T and 280T bins of the same profile list give MFU x 376/313 or x 376/280. Consistency check: "
            "MindSpore's performance guide quotes 53% MFU for Llama 2 7B at 4820 tokens/s/p, and "
            "6N x 4820 / 376e12 = 52%",
    "hbm": f"memory_bandwidth_bytes_ps 1.6 TiB/s, memory_efficiency 0.6 (msmodeling: 'need to calibrate'); {_MSMODELING}",
    "intra": f"A2_INTERCONNECT full mesh 196e9 B/s per device, latency 0.5 us; {_MSMODELING}. Read here as 7 links "
             "of 28e9 B/s (8-NPU full mesh): a collective over n ranks of one node uses n-1 links",
    "inter": f"A2_INTERCONNECT CLOS 25e9 B/s per device (200GE RoCE), latency 1.5 us; {_MSMODELING}",
    "node": "8 NPUs per Atlas 800T A2 node (MindCluster docs, https://www.hiascend.com/document/detail/zh/"
            "mindcluster/730/deployer/deployerug/deployer_0025.html)",
}


@dataclass(frozen=True)
class DoctorHardware:
    """One device type and its links, each figure with its source (see `hardware`)."""
    name: str
    peak_flops: dict                     # compute dtype -> FLOP/s (datasheet/theoretical, not achieved)
    hbm_bytes_per_s: float
    intra_link_bytes_per_s: float        # one link of the node's full mesh, per direction
    links_per_device: int                # full-mesh links per device (n-1 of them used by an n-rank group)
    inter_bytes_per_s: float             # per device, between nodes
    devices_per_node: int
    intra_latency_s: float
    inter_latency_s: float
    memory_bytes: float                  # device memory (the budget when the YAML gives none)
    dp_overlap: float = 1.0              # share of the last backward the DP reduction can hide behind (CPU: 0)
    sources: dict = field(default_factory=dict, compare=False)

    def peak(self, dtype: str) -> float:
        return self.peak_flops.get(dtype) or self.peak_flops["float16"]


_A2 = dict(peak_flops={"float16": 376e12, "bfloat16": 353.9e12, "float32": 99.5e12},
           hbm_bytes_per_s=0.6 * 1.6 * 2**40, intra_link_bytes_per_s=196e9 / 7, links_per_device=7,
           inter_bytes_per_s=25e9, devices_per_node=8, intra_latency_s=0.5e-6, inter_latency_s=1.5e-6,
           memory_bytes=64 * 2**30)
HARDWARE: dict[str, DoctorHardware] = {
    "atlas-800t-a2": DoctorHardware(name="Atlas 800T A2 (8x Ascend 910B, 376T bin)", sources=_A2_SOURCES, **_A2),
    # Same NPU and node (msmodeling has one A2 interconnect); mindformers publishes its PoDc figures apart
    # (7B: 4100 against 4820 tokens/s/p at r1.1.0), and calibration_table reports the error on them as they are.
    "atlas-900-a2-podc": DoctorHardware(name="Atlas 900 A2 PoDc (Atlas A2 NPUs in a pod, 376T bin)",
                                        sources=dict(_A2_SOURCES, node="8 NPUs per node, as the Atlas 800T A2 "
                                                     "(assumed: same A2 node and interconnect profile)"), **_A2),
}
HARDWARE_NAMES = ("atlas-800t-a2", "atlas-900-a2-podc", "cpu")


def hardware(name: str = "atlas-800t-a2") -> DoctorHardware:
    """The named profile. "cpu" is this machine: theoretical peak = cores x max clock x FLOP/cycle
    (vector lanes x 2 for FMA x 2 FMA units), memory = MemTotal; its links are not modelled (one node)."""
    if name in HARDWARE:
        return HARDWARE[name]
    if name != "cpu":
        raise DoctorError("--hardware", name, f"use one of {', '.join(HARDWARE_NAMES)}")
    metrics = _sibling("metrics")
    mhz, where = metrics.max_clock_mhz()
    info = metrics.cpu_info()
    flags = info["flags"]
    lanes = 16 if "avx512f" in flags else 8 if "fma" in flags else 4
    cores = os.cpu_count() or 1
    if not mhz:
        raise DoctorError("--hardware", name, "this machine reports no clock; pass an Ascend profile")
    peak = cores * mhz * 1e6 * lanes * 2 * 2
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        mem = 8 * 2**30
    src = (f"theoretical: {cores} cores x {mhz / 1e3:.2f} GHz ({where}) x {lanes * 4} FLOP/cycle "
           f"({lanes} fp32 lanes x 2 (FMA) x 2 FMA units); {info.get('cpu_model')}")
    return DoctorHardware(name=f"this machine ({info.get('cpu_model')})", peak_flops={"float32": peak,
                          "float16": peak, "bfloat16": peak}, hbm_bytes_per_s=20e9, intra_link_bytes_per_s=1e9,
                          links_per_device=1, inter_bytes_per_s=1e9, devices_per_node=cores,
                          intra_latency_s=1e-3, inter_latency_s=1e-3, memory_bytes=mem,
                          sources={"peak": src, "hbm": "assumed 20 GB/s (not measured)",
                                   "intra": "assumed (not measured; see parallel.measure_collectives)",
                                   "inter": "one machine", "node": "one machine"})


# ---------------------------------------------------------------- calibration (fitted; see fit_calibration)
@dataclass(frozen=True)
class Calibration:
    compute_efficiency: float            # achieved share of the peak on the matmul FLOPs
    comm_time_factor: float              # exposed collective time / (bytes / link bandwidth): < 1 when part
                                         # overlaps compute (fine_grain_interleave), > 1 when links fall short
    fitted_on: tuple = ()

    def row(self) -> dict:
        return {"compute_efficiency": round(self.compute_efficiency, 4), "comm_time_factor": round(self.comm_time_factor, 4),
                "fitted_on": ", ".join(self.fitted_on)}


FIT_POINTS = ("r1.2.0_pretrain_llama2_7b.yaml", "r1.2.0_pretrain_llama2_70b.yaml")
# Values fit_calibration() returns on FIT_POINTS (tests/test_doctor.py re-fits and compares).
CALIBRATION = Calibration(compute_efficiency=0.5992, comm_time_factor=1.2702, fitted_on=FIT_POINTS)

_CARD_R12 = "mindformers r1.2.0 docs/model_cards/llama2.md"
_CARD_R13 = "mindformers r1.3.0 docs/model_cards/llama2.md"
_CARD_R11 = "mindformers r1.1.0 docs/model_cards/llama2.md"
# Every published training throughput used, with where it is printed; `file` is the YAML the figure links,
# copied from the same branch into tests/data/mindformers/ (its header names path and commit).
PUBLISHED: tuple[dict, ...] = (
    dict(file="r1.2.0_pretrain_llama2_7b.yaml", tokens_s_p=4820, hw="atlas-800t-a2", role="fit",
         source=f"{_CARD_R12} line 26 (pretrain, Atlas 800T A2)"),
    dict(file="r1.2.0_pretrain_llama2_70b.yaml", tokens_s_p=407, hw="atlas-800t-a2", role="fit",
         source=f"{_CARD_R12} line 46 (pretrain, Atlas 800T A2)"),
    dict(file="r1.2.0_finetune_llama2_7b.yaml", tokens_s_p=4820, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R12} line 27 (finetune)"),
    dict(file="r1.2.0_finetune_llama2_7b.yaml", tokens_s_p=3484, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R13} line 25 (finetune float16; the same YAML blob as r1.2.0)"),
    dict(file="r1.2.0_pretrain_llama2_13b.yaml", tokens_s_p=1883, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R12} line 36 (pretrain)"),
    dict(file="r1.2.0_finetune_llama2_13b.yaml", tokens_s_p=1883, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R12} line 37 (finetune)"),
    dict(file="r1.2.0_finetune_llama2_70b.yaml", tokens_s_p=414, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R12} line 47 (finetune)"),
    dict(file="r1.3.0_pretrain_llama2_7b_bf16.yaml", tokens_s_p=4160, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R13} line 24 (bfloat16)"),
    dict(file="r1.3.0_finetune_llama2_13b_bf16.yaml", tokens_s_p=1691, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R13} line 26 (bfloat16)"),
    dict(file="r1.3.0_finetune_llama2_70b_bf16_32p.yaml", tokens_s_p=337, hw="atlas-800t-a2", role="check",
         source=f"{_CARD_R13} line 28 (bfloat16, 32 cards)"),
    dict(file="r1.2.0_finetune_llama3_8b_8k_800T_A2_64G.yaml", tokens_s_p=2571, hw="atlas-800t-a2", role="check",
         source="mindformers r1.2.0 research/llama3/llama3.md line 13 (seq 8192)"),
    dict(file="r1.2.0_finetune_llama3_70b.yaml", tokens_s_p=336, hw="atlas-800t-a2", role="check",
         source="mindformers r1.2.0 research/llama3/llama3.md line 19 (seq 8192)"),
    dict(file="r1.2.0_pretrain_llama3_70b.yaml", tokens_s_p=334, hw="atlas-800t-a2", role="check",
         source="mindformers r1.2.0 research/llama3/llama3.md line 20 (seq 8192)"),
    dict(file="r1.3.0_finetune_llama3_1_8b.yaml", tokens_s_p=2703, hw="atlas-900-a2-podc", role="check",
         source="mindformers r1.3.0 research/llama3_1/llama3_1.md line 24; Atlas 900 A2 PoDc per the r1.3.2 "
                "docs model list (https://mindspore.cn/mindformers/docs/en/r1.3.2/start/models.html)"),
    dict(file="r1.3.0_finetune_llama3_1_70b.yaml", tokens_s_p=337, hw="atlas-900-a2-podc", role="check",
         source="mindformers r1.3.0 research/llama3_1/llama3_1.md line 25; Atlas 900 A2 PoDc (ibid.)"),
    dict(file="r1.3.0_finetune_llama2_13b_bf16.yaml", tokens_s_p=1945, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R13} line 37 (Atlas 900 A2 PoDc, bfloat16)"),
    dict(file="r1.2.0_finetune_llama2_13b.yaml", tokens_s_p=1911, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R13} line 38 (Atlas 900 A2 PoDc, float16; the same YAML blob as r1.2.0)"),
    dict(file="r1.3.0_finetune_llama2_70b_bf16_32p.yaml", tokens_s_p=404, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R13} line 39 (Atlas 900 A2 PoDc)"),
    dict(file="r1.3.0_finetune_llama2_70b_bf16_64p.yaml", tokens_s_p=405, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R13} line 40 (Atlas 900 A2 PoDc, 64 cards)"),
    dict(file="r1.2.0_pretrain_llama2_7b.yaml", tokens_s_p=4100, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R12} line 55 (Atlas 900 A2 PoDc)"),
    dict(file="r1.2.0_pretrain_llama2_13b.yaml", tokens_s_p=1658, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R12} line 56 (Atlas 900 A2 PoDc)"),
    dict(file="r1.2.0_pretrain_llama2_70b.yaml", tokens_s_p=406, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R12} line 57 (Atlas 900 A2 PoDc)"),
    dict(file="r1.1.0_pretrain_llama2_7b.yaml", tokens_s_p=4100, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R11} line 55 (Atlas 900 A2 PoDc)"),
    dict(file="r1.1.0_pretrain_llama2_13b.yaml", tokens_s_p=1658, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R11} line 56 (Atlas 900 A2 PoDc)"),
    dict(file="r1.1.0_pretrain_llama2_70b.yaml", tokens_s_p=406, hw="atlas-900-a2-podc", role="check",
         source=f"{_CARD_R11} line 57 (Atlas 900 A2 PoDc)"),
)
# Not used: LoRA figures (frozen weights change the FLOP count; lora_*.yaml), predict (inference) figures.


# ---------------------------------------------------------------- reading the YAML
_HALF = ("float16", "bfloat16", "fp16", "bf16")


@dataclass(frozen=True)
class Config:
    """What the doctor reads from a mindformers training YAML (normalised across layouts)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    seq: int
    batch: int                      # runner_config.batch_size: sequences per micro-batch per dp rank
    grad_accum: int
    dp: int
    mp: int
    pp: int
    micro: int                      # parallel_config.micro_batch_num (pp > 1 only)
    interleave: int                 # micro_batch_interleave_num
    seq_parallel: bool
    vocab_emb_dp: bool
    flash: bool
    compute_dtype: str
    param_bytes: int
    parallel_optimizer: bool
    stage_layers: tuple             # layers per pipeline stage (L/pp + offset)
    full_recompute: tuple           # fully recomputed layers per stage
    select_ops: tuple               # per stage: ((op pattern, layers), ...) of select_recompute
    budget_bytes: int | None
    layout_name: str                # "r1.x" or "1.9"
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def devices(self) -> int:
        return self.dp * self.mp * self.pp

    @property
    def n_micro(self) -> int:
        """Micro-batches per optimizer step and stage: gradient accumulation x pipeline micro-batches."""
        return self.grad_accum * (self.micro if self.pp > 1 else 1)

    @property
    def global_batch(self) -> int:
        return self.batch * self.dp * self.n_micro * self.interleave

    def layout(self) -> dict:
        return {"data_parallel": self.dp, "model_parallel": self.mp, "pipeline_stage": self.pp,
                "micro_batch_num": self.micro, "gradient_accumulation_steps": self.grad_accum,
                "batch_size": self.batch, "use_seq_parallel": self.seq_parallel,
                "enable_parallel_optimizer": self.parallel_optimizer,
                "recompute": list(self.full_recompute),
                "select_recompute": [[list(p) for p in st] for st in self.select_ops]}


def _int(d: dict, key: str, where: str, default: Any = None, required: bool = True) -> int:
    v = d.get(key, default) if isinstance(d, dict) else default
    if v is None:
        if not required:
            return None
        raise DoctorError(f"{where}.{key}", None, f"set {where}.{key} in the YAML (a positive integer)")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v <= 0:
        raise DoctorError(f"{where}.{key}", v, "a positive integer")
    return int(v)


def _per_stage(value: Any, layers: list[int], where: str) -> list[int]:
    """Per-stage layer counts from a recompute entry: a bool, an int, a list of per-stage counts."""
    pp = len(layers)
    if value is None or value is False:
        return [0] * pp
    if value is True:
        return list(layers)
    if isinstance(value, int):
        return [min(value, n) for n in layers]
    if isinstance(value, (list, tuple)) and len(value) == pp and all(isinstance(v, (bool, int)) for v in value):
        return [n if v is True else 0 if v is False else min(int(v), n) for v, n in zip(value, layers)]
    raise DoctorError(where, value, f"a bool, or a list of {pp} per-stage layer counts")


_DEFAULT_SELECT = ("feed_forward.mul", "feed_forward.w1.activation")   # mindformers' select_recompute: True


def _select_ops(value: Any, layers: list[int], full: list[int], where: str) -> list[tuple]:
    """select_recompute as per stage ((op pattern, layers it covers), ...); full-recompute layers excluded."""
    pp = len(layers)
    rest = [n - f for n, f in zip(layers, full)]
    if value is None or value is False:
        return [()] * pp
    if isinstance(value, dict):
        out = [[] for _ in range(pp)]
        for pat, v in value.items():
            counts = _per_stage(v, layers, f"{where}[{pat!r}]")
            for i in range(pp):
                if min(counts[i], rest[i]):
                    out[i].append((str(pat), min(counts[i], rest[i])))
        return [tuple(o) for o in out]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return [tuple((p, r) for p in value) if r else () for r in rest]
    counts = _per_stage(value, layers, where)
    return [tuple((p, min(c, r)) for p in _DEFAULT_SELECT) if min(c, r) else () for c, r in zip(counts, rest)]


def _ffn_size(h: int, multiple_of: int, mult: Any, given: Any) -> int:
    """SwiGLU width as mindformers' LlamaFeedForward computes it (as mshelpers.memory.mindformers_ffn_size)."""
    if given:
        return int(given)
    f = 4 * h
    if mult is not None:
        f = int((mult + 0.01) * f)
    f = int(2 * f / 3)
    return multiple_of * ((f + multiple_of - 1) // multiple_of)


def _parse_size(text: Any) -> int:
    """Bytes in a MindSpore size such as "58GB" (GB = 1024**3, as mshelpers.memory.parse_memory_size)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and text > 0:
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)\s*", str(text), flags=re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(text)
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()])


def read_config(path_or_dict: Any, budget: Any = None) -> Config:
    """Read a mindformers training YAML (path or parsed dict) into a `Config`; DoctorError names the bad field."""
    if isinstance(path_or_dict, dict):
        d = path_or_dict
    else:
        import yaml
        try:
            with open(path_or_dict) as f:
                d = yaml.safe_load(f)
        except FileNotFoundError:
            raise DoctorError("CONFIG", str(path_or_dict), "pass the path of an existing mindformers YAML") from None
        except yaml.YAMLError as e:
            raise DoctorError("CONFIG", str(path_or_dict), f"the file is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict) or not isinstance((d.get("model") or {}).get("model_config") if isinstance(d.get("model"), dict) else None, dict):
        raise DoctorError("model.model_config", None, "pass a mindformers training YAML (it has model.model_config)")
    if str(d.get("run_mode", "train")) not in ("train", "finetune"):
        raise DoctorError("run_mode", d.get("run_mode"), "pass a training config (run_mode: 'train' or 'finetune')")
    mc = d["model"]["model_config"]
    new = "num_hidden_layers" in mc or "num_attention_heads" in mc
    w = "model.model_config"
    h = _int(mc, "hidden_size", w)
    L = _int(mc, "num_hidden_layers" if new else "num_layers", w)
    a = _int(mc, "num_attention_heads" if new else "num_heads", w)
    kv = _int(mc, "num_key_value_heads" if new else "n_kv_heads", w, required=False) or \
        _int(mc, "num_kv_heads", w, required=False) or a
    s = _int(mc, "seq_length", w)
    V = _int(mc, "vocab_size", w)
    hd = _int(mc, "head_dim", w, required=False) or h // a
    ffn = _ffn_size(h, mc.get("multiple_of") or 256, mc.get("ffn_dim_multiplier"),
                    mc.get("intermediate_size") or mc.get("ffn_hidden_size"))
    pc = d.get("parallel_config") or {}
    if not isinstance(pc, dict):
        raise DoctorError("parallel_config", pc, "a mapping with data_parallel, model_parallel, pipeline_stage")
    dp, mp = _int(pc, "data_parallel", "parallel_config", 1), _int(pc, "model_parallel", "parallel_config", 1)
    pp, m = _int(pc, "pipeline_stage", "parallel_config", 1), _int(pc, "micro_batch_num", "parallel_config", 1)
    rn = d.get("runner_config") or {}
    b = _int(rn, "batch_size", "runner_config", 1)
    ga = _int(rn, "gradient_accumulation_steps", "runner_config", 1) if rn.get("gradient_accumulation_steps") else 1
    mbi = _int(d, "micro_batch_interleave_num", "(top level)", 1) if d.get("micro_batch_interleave_num") else 1
    if a % mp or kv % mp and mp % kv:
        ok = [x for x in range(1, a + 1) if a % x == 0 and (kv % x == 0 or x % kv == 0)]
        raise DoctorError("parallel_config.model_parallel", mp, f"use a model_parallel dividing num_heads={a} "
                          f"(and kv heads={kv}): one of {ok}")
    if ffn % mp:
        raise DoctorError("parallel_config.model_parallel", mp, f"use a model_parallel dividing the ffn width {ffn}")
    offset = mc.get("offset", 0) or 0
    if isinstance(offset, (list, tuple)) and offset and isinstance(offset[0], (list, tuple)):
        raise DoctorError(f"{w}.offset", offset, "pipeline-interleave offsets (lists of lists) are not modelled; "
                          "give one list of per-stage offsets")
    offs = list(offset) if isinstance(offset, (list, tuple)) else [0] * pp
    if isinstance(offset, int) and offset and pp > 1:
        raise DoctorError(f"{w}.offset", offset, f"a list of {pp} per-stage offsets")
    if (L % pp and not any(offs)) or len(offs) != pp or sum(L // pp + o for o in offs) != L:
        raise DoctorError("parallel_config.pipeline_stage", pp, f"num_layers={L} must split into {pp} stages: use a "
                          f"pipeline_stage dividing {L}, or set {w}.offset (a list of {pp} offsets summing to "
                          f"{L - pp * (L // pp)})")
    layers = [L // pp + o for o in offs]
    if min(layers) <= 0:
        raise DoctorError(f"{w}.offset", offset, "every stage needs at least one layer")
    if pp > 1 and m < pp:
        raise DoctorError("parallel_config.micro_batch_num", m, f"micro_batch_num >= pipeline_stage={pp}")
    rc = d.get("recompute_config") or {}
    full = _per_stage(rc.get("recompute", False), layers, "recompute_config.recompute")
    sel = _select_ops(rc.get("select_recompute", False), layers, full, "recompute_config.select_recompute")
    par = d.get("parallel") or {}
    ctx = d.get("context") or {}
    raw_budget = budget if budget is not None else ctx.get("max_device_memory")
    budget_bytes = None
    if raw_budget is not None:
        try:
            budget_bytes = _parse_size(raw_budget)
        except ValueError:
            where = "--budget" if budget is not None else "context.max_device_memory"
            raise DoctorError(where, raw_budget, 'write a size as MindSpore does, e.g. "58GB"') from None
    pdt = str(mc.get("params_dtype" if new else "param_init_type", "float32"))
    cdt = str(mc.get("compute_dtype", "float16"))
    cdt = {"fp16": "float16", "bf16": "bfloat16"}.get(cdt, cdt)
    return Config(hidden=h, layers=L, heads=a, kv_heads=kv, head_dim=hd, ffn=ffn, vocab=V, seq=s, batch=b,
                  grad_accum=ga, dp=dp, mp=mp, pp=pp, micro=m, interleave=mbi,
                  seq_parallel=bool(pc.get("use_seq_parallel", False)) and mp > 1,
                  vocab_emb_dp=bool(pc.get("vocab_emb_dp", True)), flash=bool(mc.get("use_flash_attention", False)),
                  compute_dtype=cdt, param_bytes=2 if pdt in _HALF else 4,
                  parallel_optimizer=bool(par.get("enable_parallel_optimizer", False)) and dp > 1,
                  stage_layers=tuple(layers), full_recompute=tuple(full), select_ops=tuple(sel),
                  budget_bytes=budget_bytes, layout_name="1.9" if new else "r1.x", raw=d)


def legacy_dict(cfg: Config) -> dict:
    """The YAML as a dict in the r1.x names `memory.estimate_from_mindformers_yaml` reads (1.9 keys mapped)."""
    d = copy.deepcopy(cfg.raw)
    mc = d["model"]["model_config"]
    for new, old in (("num_hidden_layers", "num_layers"), ("num_attention_heads", "num_heads"),
                     ("num_key_value_heads", "n_kv_heads"), ("params_dtype", "param_init_type")):
        if new in mc and old not in mc:
            mc[old] = mc[new]
    mc["intermediate_size"] = cfg.ffn
    return d


# ---------------------------------------------------------------- the step-time model
def _op_flops(cfg: Config) -> dict[str, float]:
    """Forward FLOPs per token of one layer's ops, on one device before the mp split (PaLM's count)."""
    h, q, kvw, f = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn
    return {"wq": 2 * h * q, "wk": 2 * h * kvw, "wv": 2 * h * kvw, "wo": 2 * q * h,
            "attention": 4 * cfg.seq * q,     # QK^T and attention x V (12*L*h*s over fwd + bwd, PaLM app. B)
            "w1": 2 * h * f, "w3": 2 * h * f, "w2": 2 * f * h}


def _pattern_ops(pattern: str) -> list[str]:
    """The matmul ops a select_recompute pattern names (elementwise ops cost no matmul FLOPs)."""
    p = pattern.lower().replace("\\", "")
    if "flash" in p:
        return ["attention"]
    if "matmul" not in p:
        return []
    return [op for op in ("wq", "wk", "wv", "wo", "w1", "w3", "w2") if re.search(rf"\b{op}", p)]


def param_count(cfg: Config) -> int:
    """Whole-model parameters: embedding + lm_head (untied) + layers (attention, SwiGLU, two norms) + final norm."""
    h, q, kvw, f = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn
    per_layer = h * q + 2 * h * kvw + q * h + 3 * h * f + 2 * h
    return 2 * cfg.vocab * h + cfg.layers * per_layer + h


def _stage_params(cfg: Config, i: int) -> int:
    h, q, kvw, f = cfg.hidden, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.ffn
    p = cfg.stage_layers[i] * (h * q + 2 * h * kvw + q * h + 3 * h * f + 2 * h) / cfg.mp
    if i == 0:
        p += cfg.vocab * h / (1 if cfg.vocab_emb_dp else cfg.mp)
    if i == cfg.pp - 1:
        p += cfg.vocab * h / cfg.mp + h
    return int(p)


def _group_bw(hw: DoctorHardware, span: int, n: int) -> tuple[float, float]:
    """Per-device bandwidth and latency of a collective over n ranks spread over `span` consecutive ranks."""
    if span <= hw.devices_per_node:
        return hw.intra_link_bytes_per_s * min(max(n - 1, 1), hw.links_per_device), hw.intra_latency_s
    return hw.inter_bytes_per_s, hw.inter_latency_s


def step_time(cfg: Config, hw: DoctorHardware, calib: Calibration = CALIBRATION) -> dict[str, Any]:
    """The step decomposed (seconds, per optimizer step, on the bottleneck device) and what follows from it.

    Keys: compute_s, tp_s, p2p_s, bubble_s, dp_s (exposed), dp_total_s, dp_hidden_s, optimizer_s, step_s
    (their sum), tokens_per_s_per_device, mfu_6n, mfu_attention, mfu_hardware, peak_flops, per_stage
    (per micro-batch seconds of each stage), bottleneck_stage, recompute_factor (hardware / model FLOPs).
    """
    ops = _op_flops(cfg)
    layer_fwd = sum(ops.values())
    tokens_micro = cfg.batch * cfg.interleave * cfg.seq              # tokens of one micro-batch per dp rank
    peak = hw.peak(cfg.compute_dtype)
    rate = peak * calib.compute_efficiency
    act_bytes = tokens_micro * cfg.hidden * 2
    tp_bw, tp_lat = _group_bw(hw, cfg.mp, cfg.mp)
    per_stage, comp, tps, p2ps, hw_flops_total = [], [], [], [], 0.0
    for i in range(cfg.pp):
        n = cfg.stage_layers[i]
        fwd = n * layer_fwd + (2 * cfg.vocab * cfg.hidden if i == cfg.pp - 1 else 0)
        rec = cfg.full_recompute[i] * layer_fwd + sum(
            k * sum(ops[o] for o in _pattern_ops(p)) for p, k in cfg.select_ops[i])
        flops = tokens_micro * (3 * fwd + rec) / cfg.mp
        hw_flops_total += flops * cfg.mp * cfg.dp
        c = flops / rate
        t = 0.0
        if cfg.mp > 1:
            n_coll = 8 * n + 4 * cfg.full_recompute[i] + (2 if i == 0 and not cfg.vocab_emb_dp else 0)
            t = n_coll * ((cfg.mp - 1) / cfg.mp * act_bytes / (tp_bw * calib.comm_time_factor) + tp_lat)
        p = 0.0
        if cfg.pp > 1:
            span = 2 * cfg.dp * cfg.mp                                   # neighbouring stages are dp*mp ranks apart
            bw, lat = (hw.intra_link_bytes_per_s, hw.intra_latency_s) if span <= hw.devices_per_node else \
                (hw.inter_bytes_per_s, hw.inter_latency_s)
            sent = act_bytes / (cfg.mp if cfg.seq_parallel else 1)
            p = 2 * (sent / (bw * calib.comm_time_factor) + lat)
        comp.append(c), tps.append(t), p2ps.append(p), per_stage.append(c + t + p)
    b = max(range(cfg.pp), key=lambda i: per_stage[i])
    nm = cfg.n_micro
    compute_s, tp_s, p2p_s = nm * comp[b], nm * tps[b], nm * p2ps[b]
    bubble_s = sum(per_stage) - per_stage[b]                             # 1F1B fill + drain
    # data parallel: one reduction per step of this device's gradients (and the parameter all-gather of the
    # parallel optimizer), hidden behind the backward of the last micro-batch where it can be
    local = _stage_params(cfg, b)
    dp_total = dp_exposed_part = 0.0
    fwd_share = 1.0 / (3 + cfg.full_recompute[b] / max(cfg.stage_layers[b], 1))
    window = comp[b] * (1 - fwd_share) * hw.dp_overlap                  # the last micro-batch's backward
    if cfg.dp > 1:
        bw, lat = _group_bw(hw, cfg.dp * cfg.mp, cfg.dp)
        one = (cfg.dp - 1) / cfg.dp * local * cfg.param_bytes / bw * calib.comm_time_factor + lat
        dp_total = 2 * one          # reduce-scatter + all-gather (parallel optimizer), or one all-reduce
        # the gradient reduction overlaps the backward; the parallel optimizer's parameter all-gather
        # comes after the update and before the next forward, so it is exposed
        dp_exposed_part = one if cfg.parallel_optimizer else 0.0
    dp_s = dp_exposed_part + max(0.0, dp_total - dp_exposed_part - window)
    sharded = local / (cfg.dp if cfg.parallel_optimizer else 1)
    optimizer_s = sharded * (4 * cfg.param_bytes + 16) / hw.hbm_bytes_per_s
    step = compute_s + tp_s + p2p_s + bubble_s + dp_s + optimizer_s
    tokens = cfg.global_batch * cfg.seq
    tps_dev = tokens / (step * cfg.devices)
    n = param_count(cfg)
    model_6n = 6 * n
    attn = 12 * cfg.layers * cfg.heads * cfg.head_dim * cfg.seq
    hw_per_token = hw_flops_total * nm / tokens
    return {"compute_s": compute_s, "tp_s": tp_s, "p2p_s": p2p_s, "bubble_s": bubble_s, "dp_s": dp_s,
            "dp_total_s": dp_total, "dp_hidden_s": dp_total - dp_s, "optimizer_s": optimizer_s, "step_s": step,
            "tokens_per_s_per_device": tps_dev, "n_params": n,
            "mfu_6n": model_6n * tps_dev / peak, "mfu_attention": (model_6n + attn) * tps_dev / peak,
            "mfu_hardware": hw_per_token * tps_dev / peak, "peak_flops": peak,
            "per_stage_s": per_stage, "bottleneck_stage": b, "recompute_factor": hw_per_token / (model_6n + attn),
            "global_batch": cfg.global_batch, "micro_batches": nm}


# ---------------------------------------------------------------- memory
def memory_per_stage(cfg: Config) -> dict[str, Any]:
    """`mshelpers.memory.estimate_from_mindformers_yaml` on the config (its largest stage, all stage totals)."""
    est = _sibling("memory", "estimate_from_mindformers_yaml")
    e = est(legacy_dict(cfg), budget_bytes=cfg.budget_bytes)
    return {"per_stage_bytes": e["per_stage_totals"], "memory_per_device_bytes": e["total"], "stage": e["stage"],
            "budget_bytes": e["budget"], "fits": e["fits"], "headroom_bytes": e["headroom"], "breakdown": {
                k: e[k] for k in ("params", "grads", "optimizer_states", "activations", "grad_accum_buffer")}}


# ---------------------------------------------------------------- calibration
def _fixture_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "tests", "data", "mindformers")


def fit_calibration(data_dir: str | None = None) -> Calibration:
    """Fit (compute_efficiency, comm_time_factor) so that FIT_POINTS come out at their published tokens/s/p.

    Two points, two constants: the 7B run (dp 8, no tensor parallel) sets the compute efficiency, the
    70B run (mp 4 with sequence parallel, pp 8) the share of link bandwidth its collectives get.
    Solved by nested bisection; nothing else is looked at.
    """
    data_dir = data_dir or _fixture_dir()
    pts = [p for p in PUBLISHED if p["role"] == "fit"]
    cfgs = [read_config(os.path.join(data_dir, p["file"])) for p in pts]
    hws = [hardware(p["hw"]) for p in pts]

    def eta_c_for(comm: float) -> float:
        lo, hi = 0.05, 1.5
        for _ in range(60):
            mid = (lo + hi) / 2
            pred = step_time(cfgs[0], hws[0], Calibration(mid, comm))["tokens_per_s_per_device"]
            lo, hi = (mid, hi) if pred < pts[0]["tokens_s_p"] else (lo, mid)
        return (lo + hi) / 2

    lo, hi = 0.02, 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        c = Calibration(eta_c_for(mid), mid)
        pred = step_time(cfgs[1], hws[1], c)["tokens_per_s_per_device"]
        lo, hi = (mid, hi) if pred < pts[1]["tokens_s_p"] else (lo, mid)
    comm = (lo + hi) / 2
    return Calibration(eta_c_for(comm), comm, fitted_on=tuple(p["file"] for p in pts))


def calibration_table(data_dir: str | None = None, calib: Calibration = CALIBRATION) -> list[dict]:
    """Predicted against published tokens/s/p for every PUBLISHED figure, with the error and the source."""
    data_dir = data_dir or _fixture_dir()
    rows = []
    for p in PUBLISHED:
        cfg = read_config(os.path.join(data_dir, p["file"]))
        st = step_time(cfg, hardware(p["hw"]), calib)
        mem = memory_per_stage(cfg)
        pred = st["tokens_per_s_per_device"]
        rows.append({"config": p["file"], "hardware": p["hw"], "role": p["role"], "published": p["tokens_s_p"],
                     "predicted": round(pred), "error": pred / p["tokens_s_p"] - 1, "fits": mem["fits"],
                     "memory_GiB": round(mem["memory_per_device_bytes"] / 2**30, 1),
                     "budget_GiB": round(mem["budget_bytes"] / 2**30, 1), "source": p["source"]})
    return rows


def calibration_summary(rows: list[dict]) -> dict:
    """Median and largest |error| over the rows not used for fitting, and whether every config fits."""
    errs = [abs(r["error"]) for r in rows if r["role"] != "fit"]
    return {"n_checked": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
            "all_fit": all(r["fits"] for r in rows)}


# ---------------------------------------------------------------- better layouts
def _with(cfg: Config, **kw) -> Config:
    """A variant: the YAML dict edited, read again (so memory and time see the same config)."""
    d = copy.deepcopy(cfg.raw)
    pc = d.setdefault("parallel_config", {})
    rn = d.setdefault("runner_config", {})
    rc = d.setdefault("recompute_config", {})
    par = d.setdefault("parallel", {})
    for k, v in kw.items():
        if k in ("data_parallel", "model_parallel", "pipeline_stage", "micro_batch_num", "use_seq_parallel"):
            pc[k] = v
        elif k in ("batch_size", "gradient_accumulation_steps"):
            rn[k] = v
        elif k in ("recompute", "select_recompute"):
            rc[k] = v
        elif k == "enable_parallel_optimizer":
            par[k] = v
        elif k == "offset":
            d["model"]["model_config"]["offset"] = v
        else:
            raise KeyError(k)
    return read_config(d, budget=None if cfg.budget_bytes is None else cfg.budget_bytes)


def changed_keys(old: dict, new: dict, prefix: str = "") -> dict:
    """{dotted key: (old value, new value)} for the keys that differ (a key missing on one side is None)."""
    out = {}
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(changed_keys(a, b, f"{prefix}{k}."))
        elif a != b:
            out[f"{prefix}{k}"] = (a, b)
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def better_layouts(cfg: Config, hw: DoctorHardware, *, devices: int | None = None, top: int = 5,
                   calib: Calibration = CALIBRATION) -> list[dict]:
    """The `top` fitting variants by predicted tokens/s/p, same devices and global batch.

    Searched: dp x mp x pp on the devices (mp dividing the heads, pp the layers), the micro-batch size
    (1, 2, 4) with micro_batch_num or gradient accumulation making up the global batch, sequence parallel
    (with mp > 1), the parallel optimizer, and recompute: none, select_recompute (SiLU/Mul), full, and per
    stage the fewest fully recomputed layers (the rest SiLU/Mul-selective) that fit the budget.
    Offsets other than the YAML's are not searched (the YAML's are kept when the stage count is).
    Rows: rank, layout, tokens_per_s_per_device, step_s, memory_GiB, fits, changes (dotted YAML keys).
    """
    devices = devices or cfg.devices
    B = cfg.global_batch // cfg.interleave
    budget = cfg.budget_bytes
    mem = _sibling("memory", "estimate_from_mindformers_yaml")
    seen, rows = set(), []

    def consider(c: Config):
        key = (c.dp, c.mp, c.pp, c.micro, c.batch, c.grad_accum, c.seq_parallel, c.parallel_optimizer,
               c.full_recompute, tuple(tuple(sorted(s)) for s in c.select_ops))
        if key in seen:
            return None
        seen.add(key)
        e = mem(legacy_dict(c), budget_bytes=budget)
        st = step_time(c, hw, calib)
        r = {"cfg": c, "tokens_per_s_per_device": st["tokens_per_s_per_device"], "step_s": st["step_s"],
             "memory_bytes": e["total"], "fits": bool(e["fits"]) if e["fits"] is not None else True}
        rows.append(r)
        return r

    for mp in _divisors(devices):
        if cfg.heads % mp or (cfg.kv_heads % mp and mp % cfg.kv_heads) or cfg.ffn % mp or mp > 8:
            continue
        for pp in _divisors(devices // mp):
            if cfg.layers % pp:
                continue
            dp = devices // (mp * pp)
            for b in (1, 2, 4):
                if B % (dp * b):
                    continue
                rest = B // (dp * b)
                if pp > 1 and rest < pp:
                    continue
                base = dict(data_parallel=dp, model_parallel=mp, pipeline_stage=pp, batch_size=b,
                            micro_batch_num=rest if pp > 1 else 1,
                            gradient_accumulation_steps=1 if pp > 1 else rest)
                if pp != cfg.pp:
                    base["offset"] = 0
                for sp in ([True, False] if mp > 1 else [False]):
                    for po in (True, False):
                        kw = dict(base, use_seq_parallel=sp, enable_parallel_optimizer=po)
                        try:
                            variants = [_with(cfg, **kw, recompute=False, select_recompute=False),
                                        _with(cfg, **kw, recompute=False, select_recompute=True),
                                        _with(cfg, **kw, recompute=True, select_recompute=False)]
                        except DoctorError:
                            continue
                        for v in variants:
                            consider(v)
                        # per stage: the fewest full-recompute layers that fit, the rest SiLU/Mul-selective
                        if budget is not None:
                            layers = list(variants[0].stage_layers)
                            counts = []
                            for i in range(pp):
                                lo, hi = 0, layers[i]
                                while lo < hi:
                                    mid = (lo + hi) // 2
                                    trial = [layers[j] if j > i else (mid if j == i else counts[j]) for j in range(pp)]
                                    e = mem(legacy_dict(_with(cfg, **kw, recompute=trial, select_recompute=True)),
                                            budget_bytes=budget)
                                    lo, hi = (lo, mid) if e["per_stage_totals"][i] <= budget else (mid + 1, hi)
                                counts.append(lo)
                            if 0 < sum(counts) < sum(layers):
                                consider(_with(cfg, **kw, recompute=counts if pp > 1 else counts[0],
                                               select_recompute=True))
    fit = sorted((r for r in rows if r["fits"]), key=lambda r: (-round(r["tokens_per_s_per_device"]), r["memory_bytes"]))
    out, names = [], set()
    for r in fit:
        c = r["cfg"]
        name = (f"dp{c.dp}-mp{c.mp}-pp{c.pp} b{c.batch} m{c.n_micro}" + (" sp" if c.seq_parallel else "")
                + (" po" if c.parallel_optimizer else "") + f" rc{sum(c.full_recompute)}")
        if name in names:           # the same layout with a recompute variant that costs the same: keep the leaner
            continue
        names.add(name)
        if len(out) == top:
            break
        out.append({"rank": len(out) + 1, "layout": name,
                    "tokens_per_s_per_device": round(r["tokens_per_s_per_device"]), "step_s": round(r["step_s"], 3),
                    "memory_GiB": round(r["memory_bytes"] / 2**30, 2), "fits": r["fits"],
                    "changes": {k: v[1] for k, v in changed_keys(cfg.raw, c.raw).items()}, "config": c})
    return out


# ---------------------------------------------------------------- the 13B tuning case of MindSpore's guide
GUIDE_SOURCE = ("MindSpore Transformers 'Large Model Performance Optimization Guide', section 'Llama2-13B Extreme "
                "Performance Optimization' (mindspore-ai/docs, docs/mindformers/docs/source_en/perf_optimize/"
                "perf_optimize.md, commit 0802b2b0; https://www.mindspore.cn/mindformers/docs/en/r1.3.0/"
                "perf_optimize/perf_optimize.html)")
_FINE = ['feed_forward\\.mul', 'feed_forward\\.w1\\.activation', 'feed_forward\\.w1\\.reshape',
         'feed_forward\\.w1\\.matmul', 'feed_forward\\.w3\\.matmul', 'feed_forward\\.W3\\.reshape',
         'feed_forward\\.w2\\.matmul', 'feed_forward\\.w2\\.reshape', 'ffn_norm\\.norm', 'ffn_norm\\.rcast',
         'attention_norm\\.norm', 'attention_norm\\.rcast', 'attention\\.wq\\.reshape', 'attention\\.wk\\.reshape',
         'attention\\.wv\\.reshape', 'attention\\.wo\\.matmul', 'attention\\.wo\\.reshape',
         'attention\\.merger_head_transpose', 'add', 'attention\\.flash attention']
_SILU_MUL = ['feed_forward\\.mul', 'feed_forward\\.w1\\.activation', 'feed_forward\\.w1\\.reshape',
             'feed_forward\\.w2\\.reshape']
_STAGED = {p: ([20, 8] if p in ('feed_forward\\.mul', 'feed_forward\\.w1\\.activation',
                                'feed_forward\\.w1\\.reshape') else [20, 0]) for p in _FINE}


def guide_13b_steps(base: Any) -> list[dict]:
    """The guide's Llama 2 13B steps as YAML dicts built from `base` (r1.2.0 pretrain_llama2_13b.yaml), with
    the published tokens/s/p of each. The PP steps run on 2 nodes (16 cards) with micro_batch_num 128; the
    guide gives no batch size for them, so batch_size 1 is assumed, and its max_device_memory 57.2GB is used."""
    cfg = read_config(base)
    pp2 = dict(pipeline_stage=2, micro_batch_num=128, batch_size=1, gradient_accumulation_steps=1)
    steps = [("dp8 mp1 pp1, full recompute (8 cards)", 1860, {}),
             ("dp8 mp1 pp2 micro 128, full recompute (16 cards)", 2136, dict(pp2, recompute=True, select_recompute=False)),
             ("pp2, select_recompute of a fine op list instead of full", 2189, dict(pp2, recompute=False, select_recompute=_FINE)),
             ("pp2, per-stage select_recompute counts ([20, 8] / [20, 0])", 2210, dict(pp2, recompute=False, select_recompute=_STAGED)),
             ("pp2, full recompute [13, 5] + SiLU/Mul select", 2353, dict(pp2, recompute=[13, 5], select_recompute=_SILU_MUL)),
             ("pp2, full recompute [4, 0] + SiLU/Mul select", 2562, dict(pp2, recompute=[4, 0], select_recompute=_SILU_MUL))]
    out = []
    for name, pub, kw in steps:
        c = _with(cfg, **kw) if kw else cfg
        d = copy.deepcopy(c.raw)
        if kw:
            d.setdefault("context", {})["max_device_memory"] = "57.2GB"
        out.append({"step": name, "published": pub, "yaml": d})
    return out


def guide_13b_ranking(base: Any, hw: DoctorHardware | None = None, calib: Calibration = CALIBRATION) -> list[dict]:
    """Predicted tokens/s/p of each guide step, in the guide's order, with the published figure and memory."""
    hw = hw or hardware("atlas-800t-a2")
    rows = []
    for s in guide_13b_steps(base):
        c = read_config(s["yaml"])
        st = step_time(c, hw, calib)
        m = memory_per_stage(c)
        rows.append({"step": s["step"], "published": s["published"], "predicted": round(st["tokens_per_s_per_device"]),
                     "error": st["tokens_per_s_per_device"] / s["published"] - 1,
                     "memory_GiB": round(m["memory_per_device_bytes"] / 2**30, 1), "fits": m["fits"]})
    return rows


# ---------------------------------------------------------------- the diagnosis
def diagnose(path_or_dict: Any, hardware_name: str = "atlas-800t-a2", devices: int | None = None,
             budget: Any = None, calib: Calibration = CALIBRATION, search: bool = True) -> dict[str, Any]:
    """Everything the CLI prints, as a dict: config, memory, step terms, MFU, layouts, verdict."""
    hw = hardware(hardware_name)
    cfg = read_config(path_or_dict, budget=budget)
    if devices is not None:
        if not isinstance(devices, int) or devices <= 0:
            raise DoctorError("--devices", devices, "a positive integer")
        if devices != cfg.devices:
            mpp = cfg.mp * cfg.pp
            fix = (f"set parallel_config.data_parallel: {devices // mpp} (dp*mp*pp = {devices})" if devices % mpp == 0
                   else f"use a device count that model_parallel*pipeline_stage = {mpp} divides")
            raise DoctorError("parallel_config", f"dp*mp*pp = {cfg.dp}*{cfg.mp}*{cfg.pp} = {cfg.devices} "
                              f"on --devices {devices}", fix)
    if cfg.budget_bytes is None:
        cfg = replace(cfg, budget_bytes=int(hw.memory_bytes))
    mem = memory_per_stage(cfg)
    st = step_time(cfg, hw, calib)
    layouts = better_layouts(cfg, hw, calib=calib) if search else []
    best = layouts[0] if layouts else None
    gain = best["tokens_per_s_per_device"] / st["tokens_per_s_per_device"] - 1 if best else 0.0
    fits = bool(mem["fits"])
    verdict = (f"{'FITS' if fits else 'DOES NOT FIT'}: largest stage {mem['memory_per_device_bytes'] / 2**30:.1f} GiB "
               f"against {mem['budget_bytes'] / 2**30:.1f} GiB (headroom {mem['headroom_bytes'] / 2**30:+.1f} GiB); "
               f"predicted {st['tokens_per_s_per_device']:.0f} tokens/s/p, MFU {st['mfu_6n']:.1%} (6N) on {hw.name}")
    if not search:
        verdict += "; layout search skipped"
    elif best and not fits:
        verdict += (f"; best change that fits: {best['layout']} ({_short(best['changes'])}) predicted "
                    f"{best['tokens_per_s_per_device']} tokens/s/p")
    elif best and gain > 0.005:
        verdict += f"; best change: {best['layout']} ({_short(best['changes'])}) predicted {gain:+.1%}"
    elif best:
        verdict += "; no searched change predicts more than +0.5%"
    else:
        verdict += "; no searched layout fits"
    return {"config": cfg, "hardware": hw, "memory": mem, "step": st, "layouts": layouts, "verdict": verdict,
            "fits": fits, "best_gain": gain, "calibration": calib}


def _short(changes: dict, n: int = 4) -> str:
    items = [f"{k.split('.')[-1]}={v}" for k, v in changes.items()]
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def summary_json(r: dict) -> dict:
    """The --json object: the fields the issue asks for, plus the step terms."""
    st, mem, cfg = r["step"], r["memory"], r["config"]
    return {"tokens_per_s_per_device": st["tokens_per_s_per_device"], "step_s": st["step_s"],
            "mfu": st["mfu_6n"], "mfu_attention": st["mfu_attention"], "mfu_hardware": st["mfu_hardware"],
            "memory_per_device_bytes": mem["memory_per_device_bytes"], "per_stage_bytes": mem["per_stage_bytes"],
            "budget_bytes": mem["budget_bytes"], "fits": r["fits"],
            "layout": {k: v for k, v in cfg.layout().items() if k != "select_recompute"},
            "hardware": r["hardware"].name, "terms_s": {k: st[k] for k in (
                "compute_s", "tp_s", "p2p_s", "bubble_s", "dp_s", "optimizer_s")},
            "best_layout": r["layouts"][0]["layout"] if r["layouts"] else None, "best_gain": r["best_gain"],
            "verdict": r["verdict"]}


def render_text(r: dict) -> str:
    """The human report (Markdown): verdict first, then memory, step terms, MFU, layouts, sources."""
    cfg, st, mem, hw, cal = r["config"], r["step"], r["memory"], r["hardware"], r["calibration"]
    G = 2**30
    L = [f"# Config doctor", "", f"**{r['verdict']}**", "",
         f"Layout: dp {cfg.dp} x mp {cfg.mp} x pp {cfg.pp} = {cfg.devices} devices, micro-batch {cfg.batch} x "
         f"{cfg.n_micro} micro-batches x dp -> global batch {cfg.global_batch} of seq {cfg.seq}; "
         f"{cfg.compute_dtype}, {param_count(cfg) / 1e9:.2f}B parameters; YAML layout {cfg.layout_name}.", "",
         "## Memory per pipeline stage (mshelpers.memory.estimate_from_mindformers_yaml)", "",
         "| stage | GiB | budget GiB | headroom GiB |", "|---|---|---|---|"]
    for i, b in enumerate(mem["per_stage_bytes"]):
        L.append(f"| {i} | {b / G:.2f} | {mem['budget_bytes'] / G:.2f} | {(mem['budget_bytes'] - b) / G:+.2f} |")
    L += ["", "## Step time, decomposed (seconds per optimizer step)", "", "| term | s | share |", "|---|---|---|"]
    for k, label in (("compute_s", f"compute (bottleneck stage {st['bottleneck_stage']}, recompute factor "
                                   f"{st['recompute_factor']:.2f})"),
                     ("tp_s", "TP/SP collectives"), ("p2p_s", "pipeline point-to-point"),
                     ("bubble_s", "pipeline bubble (1F1B fill/drain)"),
                     ("dp_s", f"DP gradient reduction, exposed ({st['dp_total_s']:.3f} s total, "
                              f"{st['dp_hidden_s']:.3f} s hidden behind backward)"),
                     ("optimizer_s", "optimizer update")):
        L.append(f"| {label} | {st[k]:.3f} | {st[k] / st['step_s']:.1%} |")
    L += [f"| **step** | **{st['step_s']:.3f}** | 100% |", "",
          f"tokens/s per device: **{st['tokens_per_s_per_device']:.0f}**", "",
          f"## MFU against {st['peak_flops'] / 1e12:.1f} TFLOPS ({cfg.compute_dtype} peak of {hw.name})", "",
          "| convention | MFU % |", "|---|---|",
          f"| 6N (Kaplan) | {st['mfu_6n']:.1%} |", f"| 6N + 12·L·h·s (PaLM, with attention) | {st['mfu_attention']:.1%} |",
          f"| hardware FLOPs (with recompute) | {st['mfu_hardware']:.1%} |", ""]
    if r["layouts"]:
        L += ["## Better layouts (top 5 under the budget, same devices and global batch)", "",
              "| rank | layout | tokens/s/p | step s | memory GiB | changes |", "|---|---|---|---|---|---|"]
        for row in r["layouts"]:
            L.append(f"| {row['rank']} | {row['layout']} | {row['tokens_per_s_per_device']} | {row['step_s']} | "
                     f"{row['memory_GiB']} | {_short(row['changes'], 8)} |")
        L.append("")
    L += ["## Where the figures come from", "",
          f"- calibration: compute efficiency {cal.compute_efficiency:.4f} of peak, comm time factor {cal.comm_time_factor:.4f} "
          f"(exposed collective time / datasheet link time), "
          f"fitted on {', '.join(cal.fitted_on) or 'nothing'} only (see `calibration_table`)"]
    L += [f"- {k}: {v}" for k, v in hw.sources.items()]
    return "\n".join(L) + "\n"


def _html(md: str) -> str:
    """A minimal Markdown-to-HTML for the report (headings, bold, tables, paragraphs, lists)."""
    import html as H
    out, table = [], False
    for line in md.splitlines():
        esc = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", H.escape(line))
        if line.startswith("|"):
            cells = [c.strip() for c in esc.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            if not table:
                out.append("<table border='1' cellspacing='0' cellpadding='3'>")
                table = True
            out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            continue
        if table:
            out.append("</table>")
            table = False
        if line.startswith("#"):
            n = len(line) - len(line.lstrip("#"))
            out.append(f"<h{n}>{esc[n:].strip()}</h{n}>")
        elif line.startswith("- "):
            out.append(f"<li>{esc[2:]}</li>")
        elif line.strip():
            out.append(f"<p>{esc}</p>")
    if table:
        out.append("</table>")
    return "<!doctype html><html><head><meta charset='utf-8'><title>Config doctor</title></head><body>\n" + \
        "\n".join(out) + "\n</body></html>\n"


def write_outputs(r: dict, out_dir: str, source_path: str | None = None) -> dict[str, str]:
    """Write improved.yaml (the user's YAML with only the best layout's keys changed; the original if no
    change helps), report.md and report.html into `out_dir`. Returns their paths."""
    import yaml
    os.makedirs(out_dir, exist_ok=True)
    d = copy.deepcopy(r["config"].raw)
    best = r["layouts"][0] if r["layouts"] and (r["best_gain"] > 0.005 or not r["fits"]) else None
    if best:
        for k, v in best["changes"].items():
            node = d
            *parents, last = k.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = v
    paths = {"yaml": os.path.join(out_dir, "improved.yaml"), "md": os.path.join(out_dir, "report.md"),
             "html": os.path.join(out_dir, "report.html")}
    head = (f"# Written by mshelpers.doctor from {source_path or 'a config'}; changed keys: "
            f"{', '.join(best['changes']) if best else 'none'}\n")
    with open(paths["yaml"], "w") as f:
        f.write(head + yaml.safe_dump(d, sort_keys=False))
    md = render_text(r)
    with open(paths["md"], "w") as f:
        f.write(md)
    with open(paths["html"], "w") as f:
        f.write(_html(md))
    return paths


def load_with_mindformers(path: str) -> dict:
    """Load a YAML with mindformers' own MindFormerConfig and build its config classes from it:
    TransformerOpParallelConfig (parallel_config), TransformerRecomputeConfig (recompute_config), and
    LlamaConfig (model.model_config, r1.x layout). mindformers' errors propagate."""
    import inspect
    import logging
    import mindspore  # noqa: F401  (mindformers expects it imported first)
    from mindformers.tools.register import MindFormerConfig
    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig
    quiet = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("mindformers")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    try:
        mf = MindFormerConfig(path)
    finally:
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
    out = {"config": mf}
    for klass, sect in ((TransformerOpParallelConfig, "parallel_config"), (TransformerRecomputeConfig, "recompute_config")):
        known = inspect.signature(klass).parameters
        kw = {k: v for k, v in (mf.get(sect) or {}).items() if k in known}
        out[sect] = klass(**kw)
    mc = {k: v for k, v in mf.model.model_config.items() if k != "type"}
    if "num_layers" in mc:
        from mindformers.models.llama import LlamaConfig
        out["model_config"] = LlamaConfig(**mc, parallel_config=out["parallel_config"])
    return out


# ---------------------------------------------------------------- checked on this CPU (issue 25, item 7)
# The doctor's step model on the mini LLaMA, on this CPU, against measured graph-mode steps. The efficiency is
# fitted on CPU_FIT_SET only and checked on CPU_CHECK_SET (notebook 12, section 6).
CPU_FIT_SET = (("single", "none"),)
CPU_CHECK_SET = (("single", "full"), ("2 ranks", "none"), ("2 ranks", "full"))
CPU_ALLREDUCE_SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)

_RUN_KEYS = ("hidden_size", "num_layers", "num_heads", "ffn_hidden_size", "vocab_size", "seq_len", "batch_size",
             "dp", "recompute", "compute_dtype")


def mini_config(run: Any = None, **changes: Any) -> Config:
    """The doctor's `Config` for a cookbook run: a `RunConfig` (default `RunConfig.preset("mini")`) or a dict
    with its field names (hidden_size, num_layers, num_heads, ffn_hidden_size, vocab_size, seq_len, batch_size =
    the global batch, dp, recompute "none"/"selective"/"full", compute_dtype), with `changes` applied. It is
    read through the same `read_config` as a mindformers YAML (runner_config.batch_size = batch_size / dp)."""
    if run is None:
        run = _sibling("config", "RunConfig").preset("mini")
    d = dict(run) if isinstance(run, dict) else run.to_dict() if hasattr(run, "to_dict") else None
    if d is None:
        raise DoctorError("run", type(run).__name__, "pass a RunConfig or a dict of its fields")
    d.update(changes)
    missing = [k for k in _RUN_KEYS[:7] if k not in d]
    if missing:
        raise DoctorError(f"run.{missing[0]}", None, f"give {', '.join(missing)} (RunConfig field names)")
    dp, B, rc = d.get("dp", 1), d["batch_size"], d.get("recompute", "none")
    if rc not in ("none", "selective", "full"):
        raise DoctorError("run.recompute", rc, "one of 'none', 'selective', 'full'")
    if not isinstance(dp, int) or isinstance(dp, bool) or dp <= 0:
        raise DoctorError("run.dp", dp, "a positive integer")
    if not isinstance(B, int) or isinstance(B, bool) or B <= 0 or B % dp:
        raise DoctorError("run.batch_size", B, f"a positive global batch that dp={dp} divides")
    y = {"model": {"model_config": {
            "hidden_size": d["hidden_size"], "num_layers": d["num_layers"], "num_heads": d["num_heads"],
            "intermediate_size": d["ffn_hidden_size"], "vocab_size": d["vocab_size"], "seq_length": d["seq_len"],
            "compute_dtype": d.get("compute_dtype", "float32"), "param_init_type": "float32"}},
         "parallel_config": {"data_parallel": dp, "model_parallel": 1, "pipeline_stage": 1},
         "runner_config": {"batch_size": B // dp},
         "recompute_config": {"recompute": rc == "full", "select_recompute": rc == "selective"}}
    return read_config(y)


def cpu_hardware(ranks: int = 1, *, alpha_beta: Any = None, peak: float | None = None,
                 cores: int | None = None) -> DoctorHardware:
    """This CPU as measured, for `ranks` processes sharing it (the ranks of an msrun on this machine).

    compute: `metrics.peak_flops()` (the cached measured MatMul peak), divided by `ranks`: the ranks split the
      cores (each rank runs cores/ranks kernel threads), so each gets 1/ranks of the peak.
    collectives: an alpha-beta fit of the all-reduce measured on these ranks (`parallel.fit_alpha_beta`, or an
      (alpha_s, beta_bytes_per_s) pair), entered so that `step_time`'s DP term gives back alpha + S/beta for a
      gradient buffer of S bytes: link = beta * 2(n-1)/n, latency alpha/2 on each of its two halves.
    overlap: none (dp_overlap 0): on CPU the gradient all-reduce runs after the backward, not behind it.
    """
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise DoctorError("ranks", ranks, "a positive integer (processes sharing this CPU)")
    metrics = _sibling("metrics")
    cores = cores or os.cpu_count() or 1
    if peak is None:
        peak = metrics.peak_flops()
        rec = metrics.peak_flops_record() or {}
        psrc = (f"measured: {rec.get('method', 'metrics.peak_flops()')}; {rec.get('cpu_model')}, "
                f"{rec.get('threads')} threads, {rec.get('date')} (build/peak_flops.json)")
    else:
        psrc = "given"
    if not (isinstance(peak, (int, float)) and not isinstance(peak, bool) and peak > 0):
        raise DoctorError("peak", peak, "a measured FLOP/s > 0, e.g. mshelpers.metrics.peak_flops()")
    per_rank = peak / ranks
    bw, lat, csrc = 1e9, 1e-3, "not used (one process)"
    if ranks > 1:
        if alpha_beta is None:
            raise DoctorError("alpha_beta", None, f"pass the alpha-beta fit of the all-reduce measured on {ranks} ranks "
                              "(mshelpers.parallel.fit_alpha_beta)")
        try:
            alpha, beta = (float(v) for v in alpha_beta)
        except (TypeError, ValueError):
            raise DoctorError("alpha_beta", alpha_beta, "an AlphaBetaFit or an (alpha_s, beta_bytes_per_s) pair") from None
        if not (alpha >= 0 and beta > 0):
            raise DoctorError("alpha_beta", (alpha, beta), "alpha >= 0 s and beta > 0 bytes/s")
        bw, lat = beta * 2 * (ranks - 1) / ranks, alpha / 2
        csrc = (f"measured: all-reduce on {ranks} msrun ranks, alpha {alpha * 1e3:.2f} ms, beta {beta / 1e6:.0f} MB/s "
                "(alpha-beta fit); link = beta x 2(n-1)/n, latency alpha/2 per half of the all-reduce")
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        mem = 8 * 2**30
    model = metrics.cpu_info().get("cpu_model")
    return DoctorHardware(
        name=f"this CPU, measured ({model}; {ranks} rank{'s' if ranks > 1 else ''} on {cores} cores)",
        peak_flops={"float32": per_rank, "float16": per_rank, "bfloat16": per_rank}, hbm_bytes_per_s=20e9,
        intra_link_bytes_per_s=bw, links_per_device=1, inter_bytes_per_s=bw, devices_per_node=max(ranks, 1),
        intra_latency_s=lat, inter_latency_s=lat, memory_bytes=mem, dp_overlap=0.0,
        sources={"peak": f"{psrc}; per rank 1/{ranks} of it ({ranks} rank(s) share {cores} cores)",
                 "intra": csrc, "hbm": "assumed 20 GB/s (the optimizer term only; not measured)",
                 "overlap": "none: the CPU runs the gradient all-reduce after the backward"})


def fit_cpu_calibration(measured_s: float, cfg: Config, hw: DoctorHardware, fitted_on: tuple = CPU_FIT_SET) -> Calibration:
    """The compute efficiency that makes `step_time(cfg, hw)` equal `measured_s` (one measured step; the other
    terms kept as they are). On the CPU it absorbs what the FLOP count leaves out: elementwise ops, softmax,
    norms, kernel launches."""
    if not (isinstance(measured_s, (int, float)) and not isinstance(measured_s, bool) and measured_s > 0):
        raise DoctorError("measured_s", measured_s, "a measured step time in seconds > 0")
    st = step_time(cfg, hw, Calibration(1.0, 1.0))
    rest = st["step_s"] - st["compute_s"]
    if measured_s <= rest:
        raise DoctorError("measured_s", measured_s, f"more than the non-compute terms ({rest:.4f} s)")
    return Calibration(st["compute_s"] / (measured_s - rest), 1.0,
                       fitted_on=tuple(" ".join(map(str, r)) if isinstance(r, tuple) else str(r) for r in fitted_on))


def predict_cpu(calib: Calibration, hws: dict, run: Any = None) -> list[dict]:
    """Predicted step of the mini model for single / 2 ranks x recompute none / full: one row per run with
    each term. `hws` maps "single" and "2 ranks" to `cpu_hardware(1)` and `cpu_hardware(2, alpha_beta=...)`."""
    rows = []
    for where in ("single", "2 ranks"):
        for rc in ("none", "full"):
            dp = 1 if where == "single" else 2
            st = step_time(mini_config(run, dp=dp, recompute=rc), hws[where], calib)
            rows.append({"run": where, "recompute": rc, "role": "fit" if (where, rc) in CPU_FIT_SET else "check",
                         "predicted_s": st["step_s"], "compute_s": st["compute_s"], "dp_s": st["dp_s"],
                         "optimizer_s": st["optimizer_s"], "recompute_factor": st["recompute_factor"]})
    return rows


def measure_cpu_steps(recomputes: tuple = ("none", "full"), steps: int = 8, *, world: int = 1, rank: int = 0,
                      run: Any = None, progress: Any = None, keep: dict | None = None) -> dict:
    """Graph-mode step times of the mini model on this rank, one model per recompute setting, their steps
    alternated (ABAB, then BABA...) so that load drifts hit both alike. The step is the DP worker's Cell
    (`workers/dp_train.py`: value_and_grad, all-reduce mean over `world` ranks, clip, AdamW) with the same
    data shards; the first step of each model includes its compile. Returns {"times": {recompute: [seconds
    per step]}, "losses": ...}. `keep`: a dict that holds the built steps, so a second call with the same
    dict continues them (no new compile), e.g. to measure before and after another run."""
    import time
    import mindspore as ms
    from mindspore import nn
    RunConfig = _sibling("config", "RunConfig")
    build_model = _sibling("model", "build_model")
    make_optimizer = _sibling("train", "make_optimizer")
    numpy_batches = _sibling("data", "numpy_batches")
    DPStep = _sibling("workers.dp_train", "_dp_step_class")()
    run = run or RunConfig.preset("mini")
    made = keep if keep is not None else {}
    for rc in recomputes:
        if rc in made:
            continue
        cfg = run.replace(mode="graph", dp=world, recompute=rc)
        ms.set_seed(cfg.seed)
        net = build_model(cfg)
        opt = make_optimizer(net, cfg)
        reducer = nn.DistributedGradReducer(opt.parameters, mean=True) if world > 1 else None
        made[rc] = (DPStep(net, opt, reducer, float(cfg.grad_clip)), numpy_batches(cfg, num_shards=world, shard_id=rank))
    times = {rc: [] for rc in recomputes}
    losses = {rc: [] for rc in recomputes}
    done, total = 0, steps * len(recomputes)
    for i in range(steps):
        for rc in (recomputes if i % 2 == 0 else recomputes[::-1]):
            step, batches = made[rc]
            x = ms.Tensor(next(batches), ms.int32)
            t0 = time.perf_counter()
            loss, _ = step(x)
            losses[rc].append(float(loss.asnumpy()))
            times[rc].append(time.perf_counter() - t0)
            done += 1
            if progress is not None:
                progress(done, total)
    return {"times": times, "losses": losses, "world": world, "rank": rank}


def cpu_check(times: dict, hws: dict, tolerance: float = 0.25, run: Any = None) -> list[dict]:
    """The CPU check decided from measured steps, their noise included. `times` maps (run, recompute), for
    run "single" / "2 ranks" and recompute "none" / "full", to the seconds of each measured step (compile step
    left out; for 2 ranks the slower rank's). The efficiency is fitted on CPU_FIT_SET's median step only.

    Each row of `predict_cpu` gets measured_s (median), error (predicted / measured - 1), and error_lo /
    error_hi: the same error with the fit run and this run taken at their quartiles, the way that widens it
    (this run's own step-to-step spread). verdict: "fit" for the fit set; for the check set "within" when
    |error| <= tolerance, "beyond" when all of [error_lo, error_hi] lies outside +-tolerance (the model misses
    by more than the noise), else "undecided" (the medians miss, but the spread reaches the tolerance).

        >>> hw = cpu_hardware(1, peak=60e9, cores=2)
        >>> t = {("single", "none"): [0.50, 0.52, 0.48], ("single", "full"): [0.60, 0.64, 0.62]}
        >>> [(r["recompute"], r["verdict"]) for r in cpu_check(t, {"single": hw, "2 ranks": hw}) if r["run"] == "single"]
        [('none', 'fit'), ('full', 'within')]
    """
    import numpy as np
    if not (isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and 0 < tolerance < 10):
        raise DoctorError("tolerance", tolerance, "a relative error > 0, e.g. 0.25")
    q = {}
    for key, ts in times.items():
        try:
            a = np.asarray(ts, dtype=float).ravel()
        except (TypeError, ValueError):
            a = np.asarray([np.nan])
        if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise DoctorError(f"times[{key!r}]", ts, "measured step seconds, > 0 and finite, at least one")
        q[tuple(key)] = tuple(float(v) for v in np.percentile(a, (25, 50, 75)))
    fit_key = CPU_FIT_SET[0]
    if fit_key not in q:
        raise DoctorError("times", sorted(q), f"include the fit run {fit_key!r}")
    cfg = mini_config(run)
    preds = [predict_cpu(fit_cpu_calibration(v, cfg, hws["single"]), hws, run) for v in q[fit_key]]
    rows = []
    for i, r in enumerate(preds[1]):
        key = (r["run"], r["recompute"])
        if key not in q:
            continue
        lo_m, med_m, hi_m = q[key]
        r = dict(r, measured_s=med_m, error=r["predicted_s"] / med_m - 1,
                 error_lo=preds[0][i]["predicted_s"] / hi_m - 1, error_hi=preds[2][i]["predicted_s"] / lo_m - 1)
        if r["role"] == "fit":
            r["verdict"] = "fit"
        elif abs(r["error"]) <= tolerance:
            r["verdict"] = "within"
        elif r["error_lo"] > tolerance or r["error_hi"] < -tolerance:
            r["verdict"] = "beyond"
        else:
            r["verdict"] = "undecided"
        rows.append(r)
    return rows


def _time_allreduce(sizes: tuple, repeats: int = 5) -> list[dict]:
    """Median seconds of ops.AllReduce at each size on this rank (PyNative, .asnumpy() synchronises; the ranks
    meet in a 4-byte all-reduce before each timed call)."""
    import time
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ar, one = ops.AllReduce(), ms.Tensor(np.ones((1,), np.float32))
    rows = []
    for nbytes in sizes:
        x = ms.Tensor(np.ones((max(2, nbytes // 4),), np.float32))
        ar(x).asnumpy()                                   # warm-up
        ts = []
        for _ in range(repeats):
            ar(one).asnumpy()
            t0 = time.perf_counter()
            ar(x).asnumpy()
            ts.append(time.perf_counter() - t0)
        rows.append({"op": "all_reduce", "bytes": int(x.size * 4), "median_s": statistics.median(ts), "times_s": ts})
    return rows


def _cpu_check_worker(argv: list[str]) -> int:
    """One msrun rank of the CPU check: the steps of `measure_cpu_steps`, then the all-reduce timed at
    CPU_ALLREDUCE_SIZES (for the alpha-beta fit). Run as: msrun ... doctor.py --cpu-check-worker --steps N."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-check-worker", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--recompute", default="none,full")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    import mindspore as ms
    if a.threads:
        from mindspore.device_context.cpu.op_tuning import threads_num
        threads_num(a.threads)
    from mindspore.communication import get_group_size, get_rank, init
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    init()                 # the msrun scheduler process runs this file too and stops inside init()
    report_progress, write_rank_result = _sibling("launch", "report_progress", "write_rank_result")
    rank, world = get_rank(), get_group_size()
    rcs = tuple(r for r in a.recompute.split(",") if r)
    total = a.steps * len(rcs) + 1
    out = measure_cpu_steps(rcs, a.steps, world=world, rank=rank, progress=lambda i, n: report_progress(i, total))
    out["allreduce"] = _time_allreduce(CPU_ALLREDUCE_SIZES)
    report_progress(total, total)
    write_rank_result(out)
    return 0


# ---------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """The CLI; returns the exit code (0 ok, 2 bad input)."""
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message):
            raise DoctorError("arguments", " ".join(argv or sys.argv[1:]), message)

    ap = _Parser(prog="python -m mshelpers.doctor", description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--hardware", default="atlas-800t-a2")
    ap.add_argument("--devices", type=int, default=None)
    ap.add_argument("--budget", default=None, help='per-device memory budget, e.g. "58GB" (default: max_device_memory)')
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-search", action="store_true")
    try:
        a = ap.parse_args(argv)
        r = diagnose(a.config, a.hardware, a.devices, a.budget, search=not a.no_search)
    except DoctorError as e:
        print(f"doctor: error: {e}", file=sys.stderr)
        return 2
    print(render_text(r))
    if a.out:
        paths = write_outputs(r, a.out, a.config)
        print(f"wrote {paths['yaml']}, {paths['md']}, {paths['html']}")
    if a.json:
        print(json.dumps(summary_json(r), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(_cpu_check_worker(sys.argv[1:]) if "--cpu-check-worker" in sys.argv else main())
