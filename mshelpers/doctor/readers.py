"""Readers: a mindformers training file, in any of its three dialects, into one `Model` and one `Layout`.

Dialects (`dialect_of` tells them apart):
  r1.x      legacy: `model.model_config` with r1.x names (num_layers, num_heads, n_kv_heads; ChatGLM's
            multi_query_group_num, ffn_hidden_size, padded_vocab_size; a top-level `moe_config` for Mixtral,
            Qwen2-MoE and DeepSeek-V2), `parallel_config`, `recompute_config`, `runner_config`.
  mcore     1.x static graphs with `use_legacy: False`: Hugging Face names in `model.model_config`, resolved by
            mindformers' alias table (mindformers 2.1.0 parallel_core/transformer_config_utils.py, the mapping
            of YAML/HF keys to TransformerConfig fields); `pretrained_model_dir/config.json` (or `--model-config`)
            is merged under the YAML's own keys.
  pynative  2.x: top-level `training:`, `parallelism:`, `recompute:`, `swap:` and a flat `model:` (mindformers
            2.1.0 mindformers/pynative/config/config.py: TrainingConfig, ParallelismConfig, RecomputeConfig,
            SwapConfig).
Where a reader cannot go on it raises DoctorError naming the dialect, the key it looked for and the fix.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
from typing import Any

from .describe import Config, DoctorError, Layout, MoE, Model

_HALF = ("float16", "bfloat16", "fp16", "bf16")

# Canonical field -> the keys that give it, first match wins (mindformers' alias table, plus r1.x and ChatGLM).
ALIASES: dict[str, tuple[str, ...]] = {
    "layers": ("num_layers", "num_hidden_layers", "n_layer"),
    "hidden": ("hidden_size",),
    "heads": ("num_heads", "num_attention_heads", "n_head"),
    "kv_heads": ("n_kv_heads", "num_key_value_heads", "num_query_groups", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("head_dim", "kv_channels"),
    "ffn": ("intermediate_size", "ffn_hidden_size"),
    "vocab": ("padded_vocab_size", "vocab_size"),
    "seq": ("seq_length",),
    "experts": ("expert_num", "n_routed_experts", "num_experts", "num_moe_experts", "num_local_experts"),
    "top_k": ("num_experts_chosen", "num_experts_per_tok", "moe_router_topk"),
    "expert_ffn": ("moe_intermediate_size", "moe_ffn_hidden_size"),
    "shared": ("n_shared_experts", "shared_expert_num"),
    "shared_ffn": ("moe_shared_expert_intermediate_size", "shared_expert_intermediate_size"),
    "first_dense": ("first_k_dense_replace",),
    "moe_every": ("moe_layer_freq",),
    "capacity": ("capacity_factor", "moe_expert_capacity_factor"),
    "mtp": ("mtp_depth", "num_nextn_predict_layers", "mtp_num_layers"),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_dim": ("qk_nope_head_dim", "qk_head_dim"),
    "qk_rope_dim": ("qk_rope_head_dim", "qk_pos_emb_head_dim"),
    "v_head_dim": ("v_head_dim",),
    "qkv_bias": ("qkv_has_bias", "attention_bias", "add_qkv_bias"),
}
# What mindformers' own model classes default to when neither the YAML nor a config.json gives a key
# (mindformers 2.1.0 models/deepseek3/configuration_deepseek_v3.py, DeepseekV3Config.__init__).
MODEL_DEFAULTS: dict[str, dict] = {
    "deepseek_v3": dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                        num_hidden_layers=61, num_nextn_predict_layers=1, num_attention_heads=128,
                        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256, kv_lora_rank=512,
                        q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                        num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=3,
                        tie_word_embeddings=False),
}
_OPTIONAL = {"kv_heads", "head_dim", "ffn", "experts", "top_k", "expert_ffn", "shared", "shared_ffn", "first_dense",
             "moe_every", "mtp", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim", "seq"}


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v)
                                                                and v.is_integer())   # no float(2**1100) overflow


def _count(v: Any, where: str, *, zero_ok: bool = False) -> int:
    if not _is_int(v) or v < (0 if zero_ok else 1) or v >= 2**31:
        raise DoctorError(where, v, f"a {'non-negative' if zero_ok else 'positive'} integer below 2**31")
    return int(v)


def _section(d: dict, key: str, where: str | None = None) -> dict:
    """A mapping section of the file ({} when absent or null); anything else is refused in one line."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise DoctorError(where or key, v, f"a mapping (the {key} section of a mindformers YAML)")
    return v


def _pick(mc: dict, name: str, where: str, dialect: str, required: bool = True) -> Any:
    for k in ALIASES[name]:
        if mc.get(k) is not None:
            return k, mc[k]
    if required:
        keys = " or ".join(f"{where}.{k}" for k in ALIASES[name][:2])
        raise DoctorError(f"{where}.{ALIASES[name][0]}", None,
                          f"{dialect} dialect: set {keys} (or give the model's config.json: pretrained_model_dir "
                          "or --model-config PATH)")
    return None, None


def _ffn_size(h: int, multiple_of: Any, mult: Any, given: Any) -> int:
    """SwiGLU width as mindformers' LlamaFeedForward computes it when intermediate_size is not given."""
    if given:
        return int(given)
    if _is_int(mult) and mult >= 64:
        return int(mult)                # TeleChat's r1.x YAMLs give the FFN width itself as ffn_dim_multiplier
    f = 4 * h
    if mult is not None and isinstance(mult, (int, float)) and not isinstance(mult, bool) and mult > 0:
        f = int((mult + 0.01) * f)
    f = int(2 * f / 3)
    m = multiple_of if _is_int(multiple_of) and multiple_of > 0 else 256
    return int(m * ((f + m - 1) // m))


def parse_size(text: Any) -> int:
    """Bytes in a MindSpore size such as "58GB" (GB = 1024**3, as mshelpers.memory.parse_memory_size)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and 0 < text < 2**64 and \
            (isinstance(text, int) or math.isfinite(text)):       # (math.isfinite(2**1100) raises OverflowError)
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)\s*", str(text), flags=re.IGNORECASE)
    if not m or not 0 < float(m.group(1)) < 2**64:                # "999...9GB" is float inf
        raise ValueError(text)
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()])


def _budget(given: Any, ctx: dict, default: Any = None) -> int | None:
    raw = given if given is not None else ctx.get("max_device_memory", default)
    if raw is None:
        return None
    try:
        return parse_size(raw)
    except ValueError:
        where = "--budget" if given is not None else "context.max_device_memory"
        raise DoctorError(where, raw, 'write a size as MindSpore does, e.g. "58GB"') from None


def _dtype(v: Any, default: str) -> str:
    s = str(v if isinstance(v, str) and v else default)
    return {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(s, s)


# ---------------------------------------------------------------- the model (shared by every dialect)
def read_model(mc: dict, *, where: str, dialect: str, seq: Any = None, name: str = "") -> Model:
    """A `Model` from a flat dict of model keys (any dialect's names; see ALIASES)."""
    def get(n: str, required: bool = True, zero_ok: bool = False) -> int | None:
        k, v = _pick(mc, n, where, dialect, required=required and n not in _OPTIONAL)
        if k is None:
            return None
        return _count(v, f"{where}.{k}", zero_ok=zero_ok)

    h, L, a, V = get("hidden"), get("layers"), get("heads"), get("vocab")
    if L > 100_000:                                 # the cost model walks the layers: keep a hostile count quick
        raise DoctorError(f"{where}.{_pick(mc, 'layers', where, dialect)[0]}", L, "a model's layer count (<= 100000)")
    s = get("seq", required=False) or (None if seq is None else _count(seq, "seq_length"))
    if s is None:
        raise DoctorError(f"{where}.seq_length", None, f"{dialect} dialect: set {where}.seq_length (or the "
                          "dataset's seq_length)")
    kv = get("kv_heads", zero_ok=True) or a
    if mc.get("multi_query_attention") is False and "multi_query_group_num" in mc and not mc.get("n_kv_heads"):
        kv = a                                                  # ChatGLM with MQA switched off
    mla = bool(mc.get("multi_latent_attention")) or _is_int(mc.get("kv_lora_rank")) and mc["kv_lora_rank"] > 0
    hd = get("head_dim") or h // a
    if a > h or h % a and not mc.get("head_dim") and not mc.get("kv_channels"):
        raise DoctorError(f"{where}.{_pick(mc, 'heads', where, dialect)[0]}", a,
                          f"a head count dividing hidden_size={h} (or set head_dim)")
    if mla:
        kv = a                                                  # MLA: every head has its own (latent) K and V
    if kv > a or a % kv:
        raise DoctorError(f"{where}.{_pick(mc, 'kv_heads', where, dialect)[0]}", kv,
                          f"a kv-head count dividing the head count {a}")
    if isinstance(mc.get("ffn_dim_multiplier"), float) and not math.isfinite(mc["ffn_dim_multiplier"]):
        raise DoctorError(f"{where}.ffn_dim_multiplier", mc["ffn_dim_multiplier"], "a finite FFN width multiplier "
                          "(e.g. 1.3), or leave it out")
    ffn = _ffn_size(h, mc.get("multiple_of"), mc.get("ffn_dim_multiplier"),
                    get("ffn") if _pick(mc, "ffn", where, dialect, required=False)[0] else None)
    moe = None
    experts = get("experts", zero_ok=True)
    if experts and experts > 1:
        top_k = get("top_k") or 2
        expert_ffn = get("expert_ffn") or ffn
        shared = get("shared", zero_ok=True) or 0
        shared_ffn = get("shared_ffn", zero_ok=True)
        if shared_ffn is None:
            shared_ffn = shared * expert_ffn
        elif shared and "shared_expert_intermediate_size" in mc and "moe_shared_expert_intermediate_size" not in mc:
            shared = max(shared, 1)                             # Qwen2-MoE: one shared expert of that width
        if shared_ffn and not shared:
            shared = 1
        if top_k > experts:
            raise DoctorError(f"{where}.{_pick(mc, 'top_k', where, dialect)[0]}", top_k,
                              f"at most the number of routed experts ({experts})")
        every = mc.get("moe_layer_freq")
        every = int(every) if _is_int(every) and every > 0 else 1
        ck, cf = _pick(mc, "capacity", where, dialect, required=False)
        if ck is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not math.isfinite(cf)):
            raise DoctorError(f"{where}.{ck}", cf, "a number, e.g. 1.1 (each expert computes capacity_factor x top_k x "
                              "tokens / experts slots); 0 or less, or none, for dropless")
        moe = MoE(routed=experts, top_k=top_k, expert_ffn=expert_ffn, shared=shared, shared_ffn=shared_ffn,
                  first_dense=min(get("first_dense", zero_ok=True) or 0, L), every=every,
                  capacity_factor=max(0.0, float(cf)) if ck is not None else 0.0)
    kw = {}
    if mla:
        kw = dict(attention="mla", q_lora_rank=get("q_lora_rank", zero_ok=True) or 0,
                  kv_lora_rank=get("kv_lora_rank", zero_ok=True) or 512,
                  qk_nope_dim=get("qk_nope_dim", zero_ok=True) or 128,
                  qk_rope_dim=get("qk_rope_dim", zero_ok=True) or 64, v_head_dim=get("v_head_dim") or 128)
        kv = a
    tied = bool(mc.get("tie_word_embeddings", False))
    if "untie_embeddings_and_output_weights" in mc:
        tied = not bool(mc["untie_embeddings_and_output_weights"])
    qkv_bias = any(bool(mc.get(k)) for k in ALIASES["qkv_bias"])
    return Model(name=name or str(mc.get("model_type") or mc.get("type") or mc.get("architectures") or "?"),
                 layers=L, hidden=h, heads=a, kv_heads=kv, head_dim=hd, ffn=ffn, vocab=V, seq=s, tied=tied,
                 attention=kw.pop("attention", "mha" if kv == a else "gqa"), moe=moe,
                 mtp=get("mtp", zero_ok=True) or 0, flash=bool(mc.get("use_flash_attention", dialect != "r1.x")),
                 qkv_bias=qkv_bias, **kw)


# ---------------------------------------------------------------- stage splits and recompute
def stage_split(L: int, pp: int, vpp: int, offset: Any, where: str, notes: list) -> list[list[int]]:
    """Layers per (VPP chunk, stage) as mindformers' LayerSetting builds them: L // (pp * vpp) + offset
    (mindformers 2.1.0 parallel_core/training_graph/transformer/utils.py, LayerSetting._check_inputs: an
    int, a per-stage list, or a per-chunk list of per-stage lists, summing to L % (pp * vpp))."""
    n = pp * vpp
    if n > L:                                       # also keeps the per-stage lists below from growing with pp
        raise DoctorError("parallelism.pipeline_parallel" if where.startswith("parallelism") else
                          "parallel_config.pipeline_stage", pp, f"at most one pipeline stage (x {vpp} interleave "
                          f"chunks) per layer: {L} layers")
    base = L // n
    off = offset if offset is not None else 0
    if isinstance(off, bool) or not (_is_int(off) or isinstance(off, (list, tuple))):
        raise DoctorError(where, offset, f"an int, a list of {pp} per-stage offsets, or {vpp} such lists")
    if _is_int(off):
        grid = [[int(off)] * pp for _ in range(vpp)] if n > 1 else [[0]]
    elif off and all(isinstance(r, (list, tuple)) for r in off):
        if len(off) != vpp or any(len(r) != pp or not all(_is_int(x) for x in r) for r in off):
            raise DoctorError(where, offset, f"{vpp} lists (one per VPP chunk) of {pp} integer offsets")
        grid = [[int(x) for x in r] for r in off]
    elif all(_is_int(x) for x in off) and len(off) == pp:
        grid = [[int(x) for x in off] for _ in range(vpp)]
    else:
        raise DoctorError(where, offset, f"a list of {pp} integer per-stage offsets (one per pipeline stage)")
    if n == 1:
        return [[L]]
    total = sum(map(sum, grid))
    if total != L % n:
        if total == 0:
            # mindformers itself requires the offsets to sum to the remainder; spread it over the middle
            # stages (the first and last carry the embedding and the head) and say so
            rest = L % n
            order = sorted(range(n), key=lambda i: (i in (0, n - 1), abs(i - (n - 1) / 2)))
            flat = [0] * n
            for i in order[:rest]:
                flat[i] += 1
            grid = [flat[v * pp:(v + 1) * pp] for v in range(vpp)]
            notes.append(f"{where}={offset!r} does not split {L} layers into {pp} x {vpp} stages (mindformers wants "
                         f"offsets summing to {L} % {n} = {rest}); assumed {grid}")
        else:
            raise DoctorError(where, offset, f"offsets summing to {L} % ({pp} x {vpp}) = {L % n} (they sum to {total})")
    layers = [[base + x for x in r] for r in grid]
    if min(min(r) for r in layers) < 0 or sum(map(sum, layers)) != L:
        raise DoctorError(where, offset, "every stage needs at least zero layers; make the offsets smaller")
    return layers


def _per_stage(value: Any, chunks: list[list[int]], where: str) -> list[int]:
    """Fully recomputed layers per stage from a recompute entry: a bool, an int (per stage), a list of
    per-stage counts, or (VPP) a list of such lists per chunk."""
    stage = [sum(c[s] for c in chunks) for s in range(len(chunks[0]))]
    pp = len(stage)
    if value is None or value is False:
        return [0] * pp
    if value is True:
        return stage
    if _is_int(value) and value >= 0:
        return [min(int(value) * len(chunks), n) for n in stage]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        if len(value) == len(chunks) and all(len(v) == pp and all(_is_int(x) or isinstance(x, bool) for x in v)
                                             for v in value):
            return [sum(min(c[s] if x is True else 0 if x is False else int(x), c[s]) for c, x in
                        zip(chunks, (v[s] for v in value))) for s in range(pp)]
    elif isinstance(value, (list, tuple)) and len(value) == pp and all(_is_int(v) or isinstance(v, bool) for v in value):
        return [n if v is True else 0 if v is False else min(max(int(v), 0), n) for v, n in zip(value, stage)]
    raise DoctorError(where, value, f"a bool, a list of {pp} per-stage layer counts, or {len(chunks)} such lists "
                      "(one per VPP chunk)")


_DEFAULT_SELECT = ("feed_forward.mul", "feed_forward.w1.activation")   # mindformers' select_recompute: True


def _select_ops(value: Any, chunks: list[list[int]], full: list[int], where: str) -> list[tuple]:
    """select_recompute as per stage ((op pattern, layers it covers), ...); full-recompute layers excluded."""
    stage = [sum(c[s] for c in chunks) for s in range(len(chunks[0]))]
    rest = [n - f for n, f in zip(stage, full)]
    pp = len(stage)
    if value is None or value is False:
        return [()] * pp
    if isinstance(value, dict):
        out = [[] for _ in range(pp)]
        for pat, v in value.items():
            counts = _per_stage(v, chunks, f"{where}[{pat!r}]")
            for i in range(pp):
                if min(counts[i], rest[i]):
                    out[i].append((str(pat), min(counts[i], rest[i])))
        return [tuple(o) for o in out]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return [tuple((p, r) for p in value) if r else () for r in rest]
    counts = _per_stage(value, chunks, where)
    return [tuple((p, min(c, r)) for p in _DEFAULT_SELECT) if min(c, r) else () for c, r in zip(counts, rest)]


def _ranges(value: Any, n_layers: int, where: str) -> list[int]:
    """Layer ids from PyNative's range lists: [0-42], ["0-3", 7], "0-42", True (all), None."""
    if value is None or value is False:
        return []
    if value is True:
        return list(range(n_layers))
    items = value if isinstance(value, (list, tuple)) else [value]
    ids = set()
    for it in items:
        if _is_int(it) and 0 <= it:
            ids.add(int(it))
            continue
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", str(it)) if isinstance(it, str) else None
        if not m:
            raise DoctorError(where, value, 'layer ids or ranges, e.g. [0-42] or ["0-3", 7]')
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        ids.update(range(lo, min(hi, n_layers - 1) + 1))     # "0-99999999999" must not build that set
    return sorted(i for i in ids if i < n_layers)


# ---------------------------------------------------------------- dialects
def dialect_of(d: dict) -> str:
    if any(k in d for k in ("training", "parallelism")) or (isinstance(d.get("recompute"), dict)
                                                            and "mode" in d["recompute"]):
        return "pynative"
    if d.get("use_legacy") is False:
        return "mcore"
    return "r1.x"


def _hf_config(d: dict, model_config: Any, notes: list) -> dict:
    """The Hugging Face config.json to merge under the YAML's model keys: --model-config, else
    pretrained_model_dir/config.json when that directory exists."""
    path = None
    if model_config:
        path = str(model_config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise DoctorError("--model-config", model_config, "the path of a Hugging Face config.json (or its folder)")
    else:
        pmd = d.get("pretrained_model_dir")
        if isinstance(pmd, str) and os.path.isfile(os.path.join(pmd, "config.json")):
            path = os.path.join(pmd, "config.json")
    if not path:
        return {}
    try:
        with open(path) as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        raise DoctorError("--model-config" if model_config else "pretrained_model_dir", path,
                          f"a readable JSON config.json ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(hf, dict):
        raise DoctorError("--model-config", path, "a config.json holding one JSON object")
    notes.append(f"model keys from {path}, under the YAML's own")
    return hf


def _dataset_seq(d: dict) -> Any:
    """The training dataset's seq_length, wherever its loader or handlers put it."""
    def find(node: Any, depth: int = 0) -> Any:
        if depth > 6:
            return None
        if isinstance(node, dict):
            if _is_int(node.get("seq_length")) and node["seq_length"] > 0:
                return node["seq_length"]
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            return None
        for c in children:
            got = find(c, depth + 1)
            if got is not None:
                return got
        return None
    return find(d.get("train_dataset")) or find(d.get("train_dataset_task"))


def _static(d: dict, dialect: str, budget: Any, model_config: Any) -> Config:
    """r1.x legacy and mcore static: model.model_config, parallel_config, recompute_config, runner_config."""
    notes: list[str] = []
    model = _section(d, "model")
    mc = model.get("model_config")
    if not isinstance(mc, dict):
        raise DoctorError("model.model_config", mc, f"{dialect} dialect: a mapping of model keys (a mindformers "
                          "training YAML has model.model_config)")
    w = "model.model_config"
    merged = dict(_hf_config(d, model_config, notes))
    defaults = MODEL_DEFAULTS.get(str(mc.get("model_type", "")))
    if defaults and not merged:
        missing = sorted(k for k in defaults if k not in mc)
        if missing:
            merged.update({k: defaults[k] for k in missing})
            notes.append(f"no config.json: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''} from "
                         f"mindformers' {mc.get('model_type')} config class defaults (as mindformers does)")
    moe_cfg = d.get("moe_config")
    if isinstance(moe_cfg, dict):                                 # r1.x Mixtral / Qwen2-MoE / DeepSeek-V2
        merged.update({k: v for k, v in moe_cfg.items() if v is not None})
    elif moe_cfg is not None:
        raise DoctorError("moe_config", moe_cfg, "a mapping (expert_num, num_experts_chosen, ...)")
    merged.update({k: v for k, v in mc.items() if v is not None})
    if dialect == "r1.x" and "num_layers" not in merged and "num_hidden_layers" in merged:
        dialect = "1.9"                                           # 1.9's r1.x files with Hugging Face names
    seq = _dataset_seq(d)
    if seq is None and dialect == "mcore" and not any(merged.get(k) for k in ALIASES["seq"]):
        seq = 4096
        notes.append("no seq_length in the model or the dataset: mindformers' TransformerConfig default 4096 assumed")
    m = read_model(merged, where=w, dialect=dialect, seq=seq)
    pc = _section(d, "parallel_config")
    dp = _count(pc.get("data_parallel", 1), "parallel_config.data_parallel")
    tp = _count(pc.get("model_parallel", 1), "parallel_config.model_parallel")
    pp = _count(pc.get("pipeline_stage", 1), "parallel_config.pipeline_stage")
    micro = _count(pc.get("micro_batch_num", 1), "parallel_config.micro_batch_num")
    ep = _count(pc.get("expert_parallel", 1) or 1, "parallel_config.expert_parallel")
    cp = _count(pc.get("context_parallel", 1) or 1, "parallel_config.context_parallel")
    cp_algo = str(pc.get("context_parallel_algo") or merged.get("context_parallel_algo") or "colossalai_cp")
    vpp_raw = mc.get("pp_interleave_num", pc.get("pp_interleave_num", 1))
    vpp = _count(vpp_raw if vpp_raw is not None else 1, f"{w}.pp_interleave_num")
    pipe_cfg = _section(d, "parallel").get("pipeline_config")
    if vpp > 1 and not (isinstance(pipe_cfg, dict) and pipe_cfg.get("pipeline_interleave")):
        notes.append(f"{w}.pp_interleave_num={vpp} without parallel.pipeline_config.pipeline_interleave: True; "
                     "mindformers then uses 1 (LayerSetting), and so does the doctor")
        vpp = 1
    rn = _section(d, "runner_config")
    batch = _count(rn.get("batch_size", 1) if rn.get("batch_size") is not None else 1, "runner_config.batch_size")
    ga = _count(rn.get("gradient_accumulation_steps") or 1, "runner_config.gradient_accumulation_steps")
    mbi = _count(d.get("micro_batch_interleave_num") or 1, "micro_batch_interleave_num")
    chunks = stage_split(m.layers, pp, vpp, mc.get("offset", 0), f"{w}.offset", notes)
    rc = _section(d, "recompute_config")
    full = _per_stage(rc.get("recompute", False), chunks, "recompute_config.recompute")
    sel = _select_ops(rc.get("select_recompute", False), chunks, full, "recompute_config.select_recompute")
    par = _section(d, "parallel")
    ctx = _section(d, "context")
    pdt = _dtype(merged.get("params_dtype", merged.get("param_init_type")), "float32")
    cdt = _dtype(merged.get("compute_dtype"), "float16")
    opt = str((_section(d, "optimizer").get("type")) or "AdamW")
    swap = _section(d, "swap") if isinstance(d.get("swap"), dict) else {}
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, cp_kind="ulysses" if "ulysses" in cp_algo else "ring",
                    vpp=vpp, micro=micro, batch=batch, grad_accum=ga, interleave=mbi,
                    seq_parallel=bool(pc.get("use_seq_parallel", False)) and tp > 1,
                    optimizer_shard="po" if par.get("enable_parallel_optimizer") and dp > 1 else "none",
                    vocab_emb_dp=bool(pc.get("vocab_emb_dp", True)),
                    shard_accum=bool((_section(par, "parallel_optimizer_config", "parallel.parallel_optimizer_config")
                                      ).get("gradient_accumulation_shard", False)),
                    stage_layers=tuple(sum(c[s] for c in chunks) for s in range(pp)),
                    full_recompute=tuple(full), select_ops=tuple(sel),
                    swap=bool(swap.get("swap") or d.get("swap") is True or _section(d, "context").get("swap") is True),
                    compute_dtype=cdt, param_bytes=2 if pdt in _HALF else 4,
                    state_bytes=4 if any(k in opt.lower() for k in ("sgd", "momentum")) else 8)
    return _checked(Config(model=m, layout=layout, budget_bytes=_budget(budget, ctx), dialect=dialect, raw=d,
                           notes=tuple(notes), model_config=model_config))


def _pynative(d: dict, budget: Any, model_config: Any, devices: int | None) -> Config:
    """2.x PyNative: training / parallelism / recompute / swap sections and a flat model section."""
    notes: list[str] = []
    model = _section(d, "model")
    merged = dict(_hf_config(d, model_config, notes))
    merged.update({k: v for k, v in model.items() if v is not None})
    m = read_model(merged, where="model", dialect="pynative", seq=_dataset_seq(d))
    par = _section(d, "parallelism")
    tr = _section(d, "training")
    tp = _count(par.get("tensor_parallel", 1) or 1, "parallelism.tensor_parallel")
    pp = _count(par.get("pipeline_parallel", 1) or 1, "parallelism.pipeline_parallel")
    cp = _count(par.get("context_parallel", 1) or 1, "parallelism.context_parallel")
    ep = _count(par.get("expert_parallel", 1) or 1, "parallelism.expert_parallel")
    vpp = _count(par.get("pipeline_parallel_interleave_num", 1) or 1, "parallelism.pipeline_parallel_interleave_num")
    local = _count(tr.get("local_batch_size", 1) or 1, "training.local_batch_size")
    gbs = _count(tr.get("global_batch_size", local) or local, "training.global_batch_size")
    dps = par.get("data_parallel_shard", -1)
    if devices is not None:
        if devices % (tp * pp * cp):
            raise DoctorError("--devices", devices, f"a multiple of tensor x pipeline x context parallel = {tp * pp * cp}")
        dp = devices // (tp * pp * cp)
        notes.append(f"data_parallel_shard={dps!r}: dp = --devices {devices} / (tp {tp} x pp {pp} x cp {cp}) = {dp}")
    elif _is_int(dps) and dps > 0:
        dp = int(dps)
    elif dps in (-1, None):
        dp = max(1, gbs // local) if pp == 1 else 1
        notes.append(f"parallelism.data_parallel_shard=-1 takes every remaining card; with no --devices the doctor "
                     f"assumes dp = {dp} (global_batch_size {gbs} / local_batch_size {local}"
                     f"{'' if pp == 1 else ', one dp rank per pipeline'})")
    else:
        raise DoctorError("parallelism.data_parallel_shard", dps, "a positive integer, or -1 for every remaining card")
    if gbs % (local * dp):
        raise DoctorError("training.global_batch_size", gbs, f"a multiple of local_batch_size x dp = {local * dp}")
    n_micro = gbs // (local * dp)
    if pp > 1 and n_micro < pp:
        raise DoctorError("training.global_batch_size", gbs, f"at least pipeline_parallel x local_batch_size x dp = "
                          f"{pp * local * dp} (one micro-batch per stage)")
    lps = par.get("pipeline_parallel_layers_per_stage")
    chunks = stage_split(m.layers, pp, vpp, 0, "parallelism.pipeline_parallel_layers_per_stage", notes)
    if isinstance(lps, (list, tuple)) and lps and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in lps):
        sizes = [int(hi) - int(lo) for lo, hi in lps]
        if len(sizes) == pp * vpp and sum(sizes) == m.layers:
            chunks = [sizes[v * pp:(v + 1) * pp] for v in range(vpp)]
    rc = _section(d, "recompute")
    mode = str(rc.get("mode", "None"))
    stage_of = [s for v in range(vpp) for s in range(pp) for _ in range(chunks[v][s])]
    full = [0] * pp
    sel: list[tuple] = [()] * pp
    if mode == "full":
        ids = _ranges(rc.get("full_recompute_layer", True) if rc.get("full_recompute_layer") is not None else True,
                      m.layers, "recompute.full_recompute_layer")
        for i in ids:
            full[stage_of[i]] += 1
    elif mode == "select":
        sm = rc.get("select_module") or {}
        if isinstance(sm, dict):
            out = [[] for _ in range(pp)]
            for pat, rng in sm.items():
                per = [0] * pp
                for i in _ranges(rng if rng is not None else True, m.layers, f"recompute.select_module[{pat!r}]"):
                    per[stage_of[i]] += 1
                for s in range(pp):
                    if per[s]:
                        out[s].append((str(pat), per[s]))
            sel = [tuple(o) for o in out]
    elif mode != "None":
        raise DoctorError("recompute.mode", mode, "'None', 'full' or 'select' (mindformers' RecomputeConfig)")
    swap = _section(d, "swap")
    method = str(par.get("context_parallel_method", "colossal"))
    strategy = str(par.get("data_parallel_shard_strategy", "optim_grads_params"))
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, cp_kind="ulysses" if method in ("ulysses", "hybrid") else "ring",
                    vpp=vpp, micro=n_micro if pp > 1 else 1, batch=local, grad_accum=1 if pp > 1 else n_micro,
                    seq_parallel=bool(par.get("sequence_parallel", False)) and tp > 1,
                    optimizer_shard="fsdp" if "params" in strategy and dp > 1 else "po" if dp > 1 else "none",
                    stage_layers=tuple(sum(c[s] for c in chunks) for s in range(pp)), full_recompute=tuple(full),
                    select_ops=tuple(sel), swap=bool(swap.get("enable", False)),
                    compute_dtype=_dtype(merged.get("compute_dtype"), "bfloat16"),
                    param_bytes=2 if _dtype(merged.get("params_dtype"), "float32") in _HALF else 4,
                    state_bytes=8)
    ctx = _section(d, "context")
    return _checked(Config(model=m, layout=layout, budget_bytes=_budget(budget, ctx, "59GB"), dialect="pynative",
                           raw=d, notes=tuple(notes), model_config=model_config))


def _checked(cfg: Config) -> Config:
    """Cross-checks of the layout against the model, one line each."""
    m, lay = cfg.model, cfg.layout
    tp_key = "parallelism.tensor_parallel" if cfg.dialect == "pynative" else "parallel_config.model_parallel"
    if m.heads % lay.tp or (m.kv_heads % lay.tp and lay.tp % m.kv_heads):
        ok = [x for x in range(1, m.heads + 1) if m.heads % x == 0 and (m.kv_heads % x == 0 or x % m.kv_heads == 0)]
        raise DoctorError(tp_key, lay.tp, f"use a model_parallel dividing num_heads={m.heads} (and kv heads="
                          f"{m.kv_heads}): one of {ok}")
    if m.ffn % lay.tp:
        raise DoctorError(tp_key, lay.tp, f"use a model_parallel dividing the ffn width {m.ffn}")
    if m.moe and (lay.dp * lay.tp) % lay.ep:
        key = "parallelism.expert_parallel" if cfg.dialect == "pynative" else "parallel_config.expert_parallel"
        raise DoctorError(key, lay.ep, f"an expert_parallel dividing dp x tp = {lay.dp * lay.tp} (mindformers carves "
                          "EP out of them)")
    if m.moe and m.moe.routed % lay.ep:
        raise DoctorError("expert_parallel", lay.ep, f"a divisor of the routed experts ({m.moe.routed})")
    if lay.pp > 1 and lay.micro < lay.pp:
        raise DoctorError("parallel_config.micro_batch_num", lay.micro, f"micro_batch_num >= pipeline_stage={lay.pp}")
    if m.seq % lay.cp:
        raise DoctorError("context_parallel", lay.cp, f"a divisor of seq_length={m.seq}")
    return cfg


def load_yaml(path_or_dict: Any) -> dict:
    """The parsed file, or DoctorError in one line (missing file, not YAML, not a mapping)."""
    if isinstance(path_or_dict, dict):
        return path_or_dict
    import yaml
    try:
        with open(path_or_dict, "rb") as f:
            data = f.read()
        d = yaml.safe_load(data.decode("utf-8"))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise DoctorError("CONFIG", str(path_or_dict), "pass the path of an existing mindformers YAML") from None
    except UnicodeDecodeError:
        raise DoctorError("CONFIG", str(path_or_dict), "a UTF-8 text YAML file (this one is binary)") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as e:
        raise DoctorError("CONFIG", str(path_or_dict),
                          f"the file is not valid YAML ({(str(e).splitlines() or ['?'])[0][:80]})") from None
    except OSError as e:
        raise DoctorError("CONFIG", str(path_or_dict), f"a readable file ({e.strerror})") from None
    if not isinstance(d, dict):
        raise DoctorError("CONFIG", str(path_or_dict), "a mindformers training YAML (a mapping at the top level)")
    return d


def read_config(path_or_dict: Any, budget: Any = None, *, model_config: Any = None,
                devices: int | None = None) -> Config:
    """Read a mindformers training file (path or parsed dict) in any dialect into a `Config`."""
    d = load_yaml(path_or_dict)
    if str(d.get("run_mode", "train")) not in ("train", "finetune"):
        raise DoctorError("run_mode", d.get("run_mode"), "pass a training config (run_mode: 'train' or 'finetune')")
    dialect = dialect_of(d)
    try:
        if dialect == "pynative":
            return _pynative(d, budget, model_config, devices)
        if not isinstance(d.get("model"), dict) and "model" in d:
            raise DoctorError("model", d.get("model"), f"{dialect} dialect: a mapping with model_config")
        if "model" not in d:
            raise DoctorError("model.model_config", None, "pass a mindformers training YAML (it has model.model_config, "
                              "or training: and parallelism: sections for 2.x PyNative)")
        return _static(d, dialect, budget, model_config)
    except DoctorError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, ZeroDivisionError) as e:
        # a value of a shape no reader expects: one line rather than a traceback
        raise DoctorError("CONFIG", type(e).__name__, f"{dialect} dialect: a key holds a value of the wrong type "
                          f"({str(e)[:100]}); check the YAML against mindformers' own config") from None


# ---------------------------------------------------------------- a variant of a config (the search's move)
_STATIC_KEYS = {"data_parallel": ("parallel_config",), "model_parallel": ("parallel_config",),
                "pipeline_stage": ("parallel_config",), "micro_batch_num": ("parallel_config",),
                "use_seq_parallel": ("parallel_config",), "expert_parallel": ("parallel_config",),
                "batch_size": ("runner_config",), "gradient_accumulation_steps": ("runner_config",),
                "recompute": ("recompute_config",), "select_recompute": ("recompute_config",),
                "enable_parallel_optimizer": ("parallel",), "offset": ("model", "model_config"),
                "pp_interleave_num": ("model", "model_config")}


def with_layout(cfg: Config, **kw) -> Config:
    """A variant: the file edited in its own dialect, read again (so memory and time see the same config).
    Keys are mindformers' static names; a PyNative file gets them mapped onto its own sections."""
    # copy only the sections a variant may edit (the dataset and callbacks sections are shared, read-only)
    d = dict(cfg.raw)
    for sect in ("parallel_config", "runner_config", "recompute_config", "parallel", "model", "parallelism",
                 "training", "recompute"):
        if sect in d:
            d[sect] = copy.deepcopy(d[sect])
    if cfg.dialect == "pynative":
        par, tr = d.setdefault("parallelism", {}), d.setdefault("training", {})
        lay = cfg.layout
        dp, pp = kw.get("data_parallel", lay.dp), kw.get("pipeline_stage", lay.pp)
        b = kw.get("batch_size", lay.batch)
        n = (kw.get("micro_batch_num", lay.micro) if pp > 1 else kw.get("gradient_accumulation_steps", lay.grad_accum))
        for k, v in kw.items():
            if k in ("data_parallel", "batch_size", "micro_batch_num", "gradient_accumulation_steps"):
                continue
            if k == "model_parallel":
                par["tensor_parallel"] = v
            elif k == "pipeline_stage":
                par["pipeline_parallel"] = v
            elif k == "use_seq_parallel":
                par["sequence_parallel"] = v
            elif k == "expert_parallel":
                par["expert_parallel"] = v
            elif k == "enable_parallel_optimizer":
                par["data_parallel_shard_strategy"] = "optim_grads_params" if v else "no_shard"
            elif k == "recompute":
                rc = d.setdefault("recompute", {})
                if v is False or v == 0:
                    rc.update(mode=rc.get("mode") if rc.get("mode") == "select" else "None")
                    rc.pop("full_recompute_layer", None)
                else:
                    rc.update(mode="full", full_recompute_layer=True if v is True else _layer_ranges(v, cfg, pp))
            elif k == "select_recompute":
                rc = d.setdefault("recompute", {})
                if v and rc.get("mode") != "full":
                    rc.update(mode="select", select_module={"mlp": True} if v is True else v)
            elif k in ("offset", "pp_interleave_num"):
                continue
            else:
                raise KeyError(k)
        par["data_parallel_shard"] = dp
        tr["local_batch_size"] = b
        tr["global_batch_size"] = b * dp * n
        return read_config(d, budget=cfg.budget_bytes, model_config=cfg.model_config)
    for k, v in kw.items():
        if k not in _STATIC_KEYS:
            raise KeyError(k)
        node = d
        for p in _STATIC_KEYS[k]:
            node = node.setdefault(p, {})
        node[k] = v
    return read_config(d, budget=cfg.budget_bytes, model_config=cfg.model_config)


def _layer_ranges(counts: Any, cfg: Config, pp: int) -> list[str]:
    """PyNative full_recompute_layer ranges for per-stage counts (the first `count` layers of each stage)."""
    counts = [counts] * pp if _is_int(counts) else list(counts)
    per = cfg.model.layers // pp
    return [f"{s * per}-{s * per + c - 1}" for s, c in enumerate(counts) if c]
