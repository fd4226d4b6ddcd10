"""Readers: a mindformers training file, in any of its three dialects, into one `Model` and one `Layout`.

Dialects (`dialect_of` tells them apart):
  r1.x      legacy: `model.model_config` with r1.x names (num_layers, num_heads, n_kv_heads; ChatGLM's
            multi_query_group_num, ffn_hidden_size, padded_vocab_size; a top-level `moe_config` for Mixtral,
            Qwen2-MoE and DeepSeek-V2), `parallel_config`, `recompute_config`, `runner_config`; activation
            swap as r1.5+ spells it, `swap_config: {swap: True}`, or as a top-level `swap:`.
  mcore     1.x static graphs with `use_legacy: False`: Hugging Face names in `model.model_config`, resolved by
            mindformers' alias table (mindformers 2.1.0 parallel_core/transformer_config_utils.py, the mapping
            of YAML/HF keys to TransformerConfig fields); `pretrained_model_dir/config.json` (or `--model-config`)
            is merged under the YAML's own keys.
  pynative  2.x: top-level `training:`, `parallelism:`, `recompute:`, `swap:` and a flat `model:` (mindformers
            2.1.0 mindformers/pynative/config/config.py: TrainingConfig, ParallelismConfig, RecomputeConfig,
            SwapConfig).
Where a reader cannot go on it raises DoctorError naming the dialect, the key it looked for and the fix; a
value mindformers would refuse (a batch of '', nan or -0.0, a degree of None) is refused the same way. A key
the file leaves out or sets to None that the reader takes from elsewhere (config.json, a model class's
defaults, mindformers' own default) is said in `Config.notes` ("Assumed by the reader").
The stage split, the recompute counts and the layout's checks are layouts.py's, shared with variants.py, whose
`edited_yaml` writes a variant's file; `with_layout` reads that file again.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import replace
from typing import Any

from .describe import Config, DoctorError, Layout, MoE, Model
from .keys import key_flags
from .layouts import (_budget, _count, _dtype, _flag, _is_int, _per_stage, _select_ops, checked, parse_size,
                      pynative_chunks, pynative_recompute, stage_split)
from .variants import edited_yaml
from .yamledit import load_text

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


def _section(d: dict, key: str, where: str | None = None) -> dict:
    """A mapping section of the file ({} when absent or null); anything else is refused in one line."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise DoctorError(where or key, v, f"a mapping (the {key} section of a mindformers YAML)")
    return v


def _pick(mc: dict, name: str, where: str, dialect: str, required: bool = True, nulls: Any = ()) -> Any:
    """(key, value) of the first alias of `name` that `mc` sets; a required one missing is refused in one line,
    named as the file names it when the file sets it to None (`nulls`)."""
    for k in ALIASES[name]:
        if mc.get(k) is not None:
            return k, mc[k]
    if required:
        keys = " or ".join(f"{where}.{k}" for k in ALIASES[name][:2])
        named = next((k for k in ALIASES[name] if k in nulls), ALIASES[name][0])
        raise DoctorError(f"{where}.{named}", None,
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


# ---------------------------------------------------------------- the model (shared by every dialect)
def read_model(mc: dict, *, where: str, dialect: str, seq: Any = None, name: str = "", nulls: Any = ()) -> Model:
    """A `Model` from a flat dict of model keys (any dialect's names; see ALIASES). `nulls`: the keys the file
    sets to None (left out of `mc`), to name a missing one as the file does.
    Taught in: no notebook; doctor/__init__.py calls it."""
    def get(n: str, required: bool = True, zero_ok: bool = False) -> int | None:
        k, v = _pick(mc, n, where, dialect, required=required and n not in _OPTIONAL, nulls=nulls)
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
    mla = _flag(mc, "multi_latent_attention", False, where) or _is_int(mc.get("kv_lora_rank")) and mc["kv_lora_rank"] > 0
    hd = get("head_dim") or h // a
    if a > h or h % a and not mc.get("head_dim") and not mc.get("kv_channels"):
        raise DoctorError(f"{where}.{_pick(mc, 'heads', where, dialect)[0]}", a,
                          f"a head count dividing hidden_size={h} (or set head_dim)")
    if mla:
        kv = a                                                  # MLA: every head has its own (latent) K and V
    if kv > a or a % kv:
        raise DoctorError(f"{where}.{_pick(mc, 'kv_heads', where, dialect)[0]}", kv,
                          f"a kv-head count dividing the head count {a}")
    fdm = mc.get("ffn_dim_multiplier")
    if fdm is not None and (isinstance(fdm, bool) or not isinstance(fdm, (int, float)) or fdm <= 0):
        raise DoctorError(f"{where}.ffn_dim_multiplier", fdm, "a positive number (LlamaConfig multiplies 4 x hidden "
                          "by it; TeleChat gives the FFN width itself), or leave it out")
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
        disp = str(mc.get("moe_token_dispatcher_type") or "").lower()
        allgather = disp == "allgather" or mc.get("use_allgather_dispatcher") is True
        moe = MoE(routed=experts, top_k=top_k, expert_ffn=expert_ffn, shared=shared, shared_ffn=shared_ffn,
                  first_dense=min(get("first_dense", zero_ok=True) or 0, L), every=every,
                  dispatcher="allgather" if allgather else "alltoall",
                  capacity_factor=max(0.0, float(cf)) if ck is not None else 0.0)
    kw = {}
    if mla:
        kw = dict(attention="mla", q_lora_rank=get("q_lora_rank", zero_ok=True) or 0,
                  kv_lora_rank=get("kv_lora_rank", zero_ok=True) or 512,
                  qk_nope_dim=get("qk_nope_dim", zero_ok=True) or 128,
                  qk_rope_dim=get("qk_rope_dim", zero_ok=True) or 64, v_head_dim=get("v_head_dim") or 128)
        kv = a
    tied = _flag(mc, "tie_word_embeddings", False, where)
    if mc.get("untie_embeddings_and_output_weights") is not None:
        tied = not _flag(mc, "untie_embeddings_and_output_weights", True, where)
    qkv_bias = any(_flag(mc, k, False, where) for k in ALIASES["qkv_bias"])
    win = mc.get("sliding_window")
    window = int(win) if _is_int(win) and 0 < win < s and _flag(mc, "use_sliding_window", True, where) else 0
    eod = _flag(mc, "use_eod_attn_mask_compression", False, where)
    return Model(name=name or str(mc.get("model_type") or mc.get("type") or mc.get("architectures") or "?"),
                 layers=L, hidden=h, heads=a, kv_heads=kv, head_dim=hd, ffn=ffn, vocab=V, seq=s, tied=tied,
                 attention=kw.pop("attention", "mha" if kv == a else "gqa"), moe=moe,
                 mtp=get("mtp", zero_ok=True) or 0, flash=_flag(mc, "use_flash_attention", dialect != "r1.x", where),
                 qkv_bias=qkv_bias, window=window, eod=eod, **kw)


# ---------------------------------------------------------------- dialects
def dialect_of(d: dict) -> str:
    """A parsed file's dialect: 'pynative' (2.x training/parallelism sections), 'mcore' (use_legacy: false) or 'r1.x'.
    Taught in: no notebook; doctor/__init__.py calls it."""
    if any(k in d for k in ("training", "parallelism")) or (isinstance(d.get("recompute"), dict)
                                                            and "mode" in d["recompute"]):
        return "pynative"
    if d.get("use_legacy") is False:
        return "mcore"
    return "r1.x"


def _hf_config(d: dict, model_config: Any, notes: list) -> tuple[dict, str]:
    """The Hugging Face config.json to merge under the YAML's model keys (--model-config, else
    pretrained_model_dir/config.json when that directory exists), and its path."""
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
        return {}, ""
    try:
        with open(path) as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        raise DoctorError("--model-config" if model_config else "pretrained_model_dir", path,
                          f"a readable JSON config.json ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(hf, dict):
        raise DoctorError("--model-config", path, "a config.json holding one JSON object")
    notes.append(f"model keys from {path}, under the YAML's own")
    return hf, path


def _in_dataset(d: dict, pick: Any) -> Any:
    """The first value `pick(node)` gives (not None) for a mapping under the training dataset, wherever its loader or
    handlers nest it (six levels at most)."""
    def find(node: Any, depth: int = 0) -> Any:
        if depth > 6:
            return None
        if isinstance(node, dict):
            got = pick(node)
            if got is not None:
                return got
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


def _dataset_seq(d: dict) -> Any:
    """The training dataset's seq_length, wherever its loader or handlers put it."""
    return _in_dataset(d, lambda n: n["seq_length"] if _is_int(n.get("seq_length")) and n["seq_length"] > 0 else None)


def _dataset_eod(d: dict) -> bool:
    """Whether the training dataset builds compressed EOD masks (create_compressed_eod_mask: True anywhere under it):
    mindformers then sets model_config.use_eod_attn_mask_compression itself (1.9 and 2.1.0
    trainer/base_trainer.py, _process_megatron_dataset and _get_columns_with_strategy)."""
    return bool(_in_dataset(d, lambda n: True if n.get("create_compressed_eod_mask") is True else None))


def _setting(sect: dict, key: str, where: str, default: int = 1) -> int:
    """A layout count: `default` (mindformers' own) when the key is absent, else a positive int. None, '', 0,
    -0.0, nan, [] and 2.0 are refused in one line, as mindformers refuses them (Validator.check_positive_int on
    the parallel degrees; 2.x TrainingConfig.__post_init__; None stops its batch arithmetic)."""
    return default if key not in sect else _count(sect[key], where, strict=True)


# Model keys the cost model prices besides the alias table's, for the notes on where a value came from.
_PRICED_KEYS = ("tie_word_embeddings", "multiple_of", "ffn_dim_multiplier", "use_flash_attention")


_MODEL_PRICED = frozenset(k for names in ALIASES.values() for k in names) | frozenset(_PRICED_KEYS)


def _model_keys(own: dict, sources: list, where: str, notes: list) -> dict:
    """The model keys the reader uses: each (label, keys) source in `sources` (lowest precedence first), then
    the file's own non-None keys. A priced key the file leaves out or sets to None and a labelled source gives
    is named in `notes`; a source labelled None is the file's own (r1.x's moe_config section)."""
    merged: dict = {}
    for _, keys in sources:
        merged.update({k: v for k, v in keys.items() if v is not None})
    merged.update({k: v for k, v in own.items() if v is not None})
    taken: dict[str, list[str]] = {}
    for names in [*ALIASES.values(), *((k,) for k in _PRICED_KEYS)]:
        k = next((k for k in names if merged.get(k) is not None), None)
        if k is None or own.get(k) is not None:
            continue
        label = next(lbl for lbl, keys in reversed(sources) if keys.get(k) is not None)
        if label is None:
            continue
        none = next((n for n in names if n in own), None)      # the file names the key but holds None
        if none is not None:
            notes.append(f"{where}.{none} is None: {k}={merged[k]!r} from {label}")
        else:
            taken.setdefault(label, []).append(f"{k}={merged[k]!r}")
    for label, kv in taken.items():
        notes.append(f"not in {where}: {', '.join(kv)} from {label}")
    return merged


def _static_batch(rn: dict, mc: dict, notes: list) -> tuple[int, int]:
    """runner_config.batch_size and gradient_accumulation_steps, refused where mindformers refuses them; the
    model's own batch_size is checked too, though training builds the model with the runner's."""
    if "batch_size" not in rn:
        notes.append("runner_config.batch_size not set: 1 (mindformers' RunnerConfig default)")
    batch = _setting(rn, "batch_size", "runner_config.batch_size")
    ga = rn.get("gradient_accumulation_steps")
    if ga is None and "gradient_accumulation_steps" in rn:
        notes.append("runner_config.gradient_accumulation_steps is None: 1, as mindformers' trainer sets it "
                     "(trainer/base_trainer.py, _check_grad_accumulation_steps)")
    ga = 1 if ga is None else _count(ga, "runner_config.gradient_accumulation_steps", strict=True)
    if "batch_size" in mc:
        mb = mc["batch_size"]
        if mb is None:
            notes.append(f"model.model_config.batch_size is None: the model is built with runner_config.batch_size="
                         f"{batch}, as mindformers' trainer does (create_network's default_args override it)")
        elif not _is_int(mb) or isinstance(mb, float) or not 0 < mb < 2**31:
            raise DoctorError("model.model_config.batch_size", mb, "a positive integer, or leave it out (training "
                              "builds the model with runner_config.batch_size; the model classes take it as an int)")
    return batch, ga


def _swap(d: dict) -> bool:
    """Activation swap in either spelling: mindformers r1.5+ `swap_config: {swap: True, layer_swap: ...}`
    (tools/register/template.py SwapConfig, TransformerSwapConfig), or a top-level `swap:` / `context.swap`."""
    sc = _section(d, "swap_config")
    if "swap" in sc and not isinstance(sc["swap"], bool):
        raise DoctorError("swap_config.swap", sc["swap"], "True or False (mindformers' check_rules._check_swap and "
                          "TransformerSwapConfig take a bool)")
    old = _section(d, "swap") if isinstance(d.get("swap"), dict) else {}
    return bool(sc.get("swap") or old.get("swap") or d.get("swap") is True
                or _section(d, "context").get("swap") is True)


def _static(d: dict, dialect: str, budget: Any, model_config: Any) -> Config:
    """r1.x legacy and mcore static: model.model_config, parallel_config, recompute_config, runner_config."""
    notes: list[str] = []
    model = _section(d, "model")
    mc = model.get("model_config")
    if not isinstance(mc, dict):
        raise DoctorError("model.model_config", mc, f"{dialect} dialect: a mapping of model keys (a mindformers "
                          "training YAML has model.model_config)")
    w = "model.model_config"
    hf, hf_path = _hf_config(d, model_config, notes)
    sources = [(hf_path, hf)]
    defaults = MODEL_DEFAULTS.get(str(mc.get("model_type", "")))
    if defaults and not hf:             # as mindformers' config class does: its defaults for the keys not given
        sources.append((f"mindformers' {mc.get('model_type')} config class defaults (no config.json)",
                        {k: v for k, v in defaults.items() if k not in mc}))
    moe_cfg = d.get("moe_config")
    if isinstance(moe_cfg, dict):                                 # r1.x Mixtral / Qwen2-MoE / DeepSeek-V2
        sources.append((None, moe_cfg))
    elif moe_cfg is not None:
        raise DoctorError("moe_config", moe_cfg, "a mapping (expert_num, num_experts_chosen, ...)")
    merged = _model_keys(mc, sources, w, notes)
    if dialect == "r1.x" and "num_layers" not in merged and "num_hidden_layers" in merged:
        dialect = "1.9"                                           # 1.9's r1.x files with Hugging Face names
    seq = _dataset_seq(d)
    if seq is None and dialect == "mcore" and not any(merged.get(k) for k in ALIASES["seq"]):
        seq = 4096
        notes.append("no seq_length in the model or the dataset: mindformers' TransformerConfig default 4096 assumed")
    kv_channels = None
    if dialect != "mcore" and "glm" not in str(mc.get("type", "")).lower() and "kv_channels" in merged:
        # in r1.x only ChatGLM2Config reads kv_channels as the head dim (r1.3.0 models/glm2/glm2_transformer.py
        # l.46); LlamaAttention takes hidden_size // num_heads (llama/llama_transformer.py l.114)
        kv_channels = merged.pop("kv_channels")
    m = read_model(merged, where=w, dialect=dialect, seq=seq, nulls={k for k, v in mc.items() if v is None})
    if kv_channels is not None and kv_channels != m.head_dim:
        notes.append(f"{w}.kv_channels={kv_channels} is not read by {mc.get('type', 'this config class')} (in r1.x "
                     f"only ChatGLM2Config reads it): head dim hidden_size / heads = {m.head_dim}")
    pc = _section(d, "parallel_config")
    dp, tp, pp, micro, ep, cp = (_setting(pc, k, f"parallel_config.{k}") for k in (
        "data_parallel", "model_parallel", "pipeline_stage", "micro_batch_num", "expert_parallel", "context_parallel"))
    cp_algo = str(pc.get("context_parallel_algo") or merged.get("context_parallel_algo") or "colossalai_cp")
    vpp_raw = mc.get("pp_interleave_num", pc.get("pp_interleave_num", 1))
    vpp = _count(vpp_raw if vpp_raw is not None else 1, f"{w}.pp_interleave_num")
    pipe_cfg = _section(d, "parallel").get("pipeline_config")
    if vpp > 1 and not (isinstance(pipe_cfg, dict) and pipe_cfg.get("pipeline_interleave")):
        notes.append(f"{w}.pp_interleave_num={vpp} without parallel.pipeline_config.pipeline_interleave: True; "
                     "mindformers then uses 1 (LayerSetting), and so does the doctor")
        vpp = 1
    batch, ga = _static_batch(_section(d, "runner_config"), mc, notes)
    if pp > 1 and ga > 1:     # semi-auto pipelines accumulate over micro_batch_num alone
        notes.append(f"runner_config.gradient_accumulation_steps={ga} with pipeline_stage={pp}: 1, as mindformers "
                     "resets it (trainer/base_trainer.py, _check_grad_accumulation_steps: it does not take effect "
                     "in pipeline parallel)")
        ga = 1
    mbi = _setting(d, "micro_batch_interleave_num", "micro_batch_interleave_num")
    chunks = stage_split(m.layers, pp, vpp, mc.get("offset", 0), f"{w}.offset", notes)
    rc = _section(d, "recompute_config")
    full = _per_stage(rc.get("recompute", False), chunks, "recompute_config.recompute")
    sel = _select_ops(rc.get("select_recompute", False), chunks, full, "recompute_config.select_recompute")
    par = _section(d, "parallel")
    ctx = _section(d, "context")
    pkey = "params_dtype" if merged.get("params_dtype") is not None else "param_init_type"
    pdt = _dtype(merged.get(pkey), "float32", f"{w}.{pkey}")
    cdt = _dtype(merged.get("compute_dtype"), "float16", f"{w}.compute_dtype")
    opt = str((_section(d, "optimizer").get("type")) or "AdamW")
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, cp_kind="ulysses" if "ulysses" in cp_algo else "ring",
                    vpp=vpp, micro=micro, batch=batch, grad_accum=ga, interleave=mbi,
                    seq_parallel=_flag(pc, "use_seq_parallel", False, "parallel_config") and tp > 1,
                    # MindSpore's parallel optimizer shards over every rank holding the same parameters: dp x cp
                    optimizer_shard="po" if par.get("enable_parallel_optimizer") and dp * cp > 1 else "none",
                    vocab_emb_dp=_flag(pc, "vocab_emb_dp", True, "parallel_config"),
                    shard_accum=_flag(_section(par, "parallel_optimizer_config", "parallel.parallel_optimizer_config"),
                                      "gradient_accumulation_shard", False, "parallel.parallel_optimizer_config"),
                    stage_layers=tuple(sum(c[s] for c in chunks) for s in range(pp)),
                    full_recompute=tuple(full), select_ops=tuple(sel), swap=_swap(d),
                    compute_dtype=cdt, param_bytes=2 if pdt in _HALF else 4,
                    state_bytes=4 if any(k in opt.lower() for k in ("sgd", "momentum")) else 8,
                    schedule="interleaved" if vpp > 1 else "1f1b")
    asked = {"use_seq_parallel": _flag(pc, "use_seq_parallel", False, "parallel_config"),
             "enable_parallel_optimizer": bool(par.get("enable_parallel_optimizer")),
             "recompute": rc.get("recompute", False), "select_recompute": rc.get("select_recompute", False)}
    return checked(Config(model=m, layout=layout, budget_bytes=_budget(budget, ctx), dialect=dialect, raw=d,
                           notes=tuple(notes), model_config=model_config, asked=asked))


def _pynative_dp(par: dict, devices: int | None, tp: int, pp: int, cp: int, gbs: int, local: int, notes: list) -> int:
    dps = par.get("data_parallel_shard", -1)
    if devices is not None:
        if devices % (tp * pp * cp):
            raise DoctorError("--devices", devices, f"a multiple of tensor x pipeline x context parallel = {tp * pp * cp}")
        said = "" if "data_parallel_shard" in par else " (not set: ParallelismConfig's default)"
        notes.append(f"parallelism.data_parallel_shard={dps!r}{said}: dp = --devices {devices} / (tp {tp} x pp {pp} x cp {cp}) = "
                     f"{devices // (tp * pp * cp)}")
        return devices // (tp * pp * cp)
    if _is_int(dps) and dps > 0:
        return _count(dps, "parallelism.data_parallel_shard")
    if dps in (-1, None):
        dp = max(1, gbs // local) if pp == 1 else 1
        said = "" if "data_parallel_shard" in par else " (not set: ParallelismConfig's default)"
        notes.append(f"parallelism.data_parallel_shard=-1{said} takes every remaining card; with no --devices the doctor "
                     f"assumes dp = {dp} (global_batch_size {gbs} / local_batch_size {local}"
                     f"{'' if pp == 1 else ', one dp rank per pipeline'})")
        return dp
    raise DoctorError("parallelism.data_parallel_shard", dps, "a positive integer, or -1 for every remaining card")


def _pynative(d: dict, budget: Any, model_config: Any, devices: int | None) -> Config:
    """2.x PyNative: training / parallelism / recompute / swap sections and a flat model section."""
    notes: list[str] = []
    model = _section(d, "model")
    hf, hf_path = _hf_config(d, model_config, notes)
    merged = _model_keys(model, [(hf_path, hf)], "model", notes)
    m = read_model(merged, where="model", dialect="pynative", seq=_dataset_seq(d),
                   nulls={k for k, v in model.items() if v is None})
    par = _section(d, "parallelism")
    tr = _section(d, "training")
    tp, pp, cp, ep, vpp = (_setting(par, k, f"parallelism.{k}") for k in (
        "tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel",
        "pipeline_parallel_interleave_num"))
    for k in ("local_batch_size", "global_batch_size"):           # mindformers' TrainingConfig defaults: 1 and 1
        if k not in tr:
            notes.append(f"training.{k} not set: 1 (mindformers' TrainingConfig default)")
    local = _setting(tr, "local_batch_size", "training.local_batch_size")
    gbs = _setting(tr, "global_batch_size", "training.global_batch_size")
    dp = _pynative_dp(par, devices, tp, pp, cp, gbs, local, notes)
    if gbs % (local * dp):
        raise DoctorError("training.global_batch_size", gbs, f"a multiple of local_batch_size x dp = {local * dp}")
    n_micro = gbs // (local * dp)
    if pp > 1 and n_micro < pp:
        raise DoctorError("training.global_batch_size", gbs, f"at least pipeline_parallel x local_batch_size x dp = "
                          f"{pp * local * dp} (one micro-batch per stage)")
    chunks = pynative_chunks(par, m.layers, pp, vpp, notes)
    rc = _section(d, "recompute")
    full, sel = pynative_recompute(rc, m.layers, chunks)
    swap = _section(d, "swap")
    method = str(par.get("context_parallel_method", "colossal"))
    strategy = par.get("data_parallel_shard_strategy", "optim_grads_params")
    if strategy != "optim_grads_params":
        notes.append(f"parallelism.data_parallel_shard_strategy={strategy!r} is read by nothing in mindformers 2.1.0 "
                     "(ParallelismConfig declares it; the trainer shards with FSDP over dp x cp): FSDP assumed")
    layout = Layout(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, cp_kind="ulysses" if method in ("ulysses", "hybrid") else "ring",
                    vpp=vpp, micro=n_micro if pp > 1 else 1, batch=local, grad_accum=1 if pp > 1 else n_micro,
                    seq_parallel=_flag(par, "sequence_parallel", False, "parallelism") and tp > 1,
                    # FSDP over the fsdp domain dp x cp (ParallelismConfig.dense_fsdp_shard_size's docstring)
                    optimizer_shard="fsdp" if dp * cp > 1 else "none",
                    stage_layers=tuple(sum(c[s] for c in chunks) for s in range(pp)), full_recompute=tuple(full),
                    select_ops=tuple(sel), swap=_flag(swap, "enable", False, "swap"),
                    compute_dtype=_dtype(merged.get("compute_dtype"), "bfloat16", "model.compute_dtype"),
                    param_bytes=2 if _dtype(merged.get("params_dtype"), "float32", "model.params_dtype") in _HALF else 4,
                    state_bytes=8, schedule="interleaved" if vpp > 1 else "1f1b")
    ctx = _section(d, "context")
    asked = {"use_seq_parallel": _flag(par, "sequence_parallel", False, "parallelism"), "recompute": rc}
    # MC2 (TP's all-gather / reduce-scatter fused into their matmuls) pipelines the sequence-parallel pair: priced
    # with tp > 1 and sequence parallel on (cost.mc2_exposed); a static-graph file has no key for it
    mc2 = _flag(par, "enable_mc2", False, "parallelism")
    if mc2 and not layout.seq_parallel:
        notes.append("parallelism.enable_mc2 is on, but MC2 fuses the sequence-parallel all-gather and reduce-scatter "
                     "and this layout has none (tensor_parallel 1 or sequence_parallel off): TP priced unfused")
    return checked(Config(model=m, layout=layout, budget_bytes=_budget(budget, ctx, "59GB"), dialect="pynative",
                           raw=d, notes=tuple(notes), model_config=model_config, asked=asked, mc2=mc2))


def load_yaml(path_or_dict: Any) -> dict:
    """The parsed file, or DoctorError in one line (missing file, not YAML, not a mapping).
    Taught in: no notebook; doctor/__init__.py calls it."""
    if isinstance(path_or_dict, dict):
        return path_or_dict
    import yaml
    try:
        with open(path_or_dict, "rb") as f:
            data = f.read()
        d = load_text(data.decode("utf-8"))
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


def parse_release(release: Any) -> tuple:
    """A mindformers release as a tuple of ints: "r1.3.0", "1.3.0", (1, 3, 0); None or "" -> ().
    Taught with the rest of doctor/readers.py in notebooks/12_your_config.ipynb."""
    if release is None or release == "" or release == ():
        return ()
    if isinstance(release, tuple) and release and all(_is_int(v) and not isinstance(v, bool) and 0 <= v < 1000
                                                      for v in release):
        return tuple(int(v) for v in release)
    text = str(release).strip()
    text = text[1:] if text[:1] in ("r", "v") else text
    if isinstance(release, str) and re.fullmatch(r"\d{1,3}(\.\d{1,3}){0,3}", text):
        return tuple(int(v) for v in text.split("."))
    raise DoctorError("--release", release, "a mindformers release such as r1.3.0 (the branch the file runs on)")


def _at_release(cfg: Config, release: tuple) -> Config:
    """The file priced as the given mindformers release runs it. r1.x MoEV2 before r1.5.0 has no sequence-parallel
    dispatch (mindformers r1.3.0 modules/transformer/moe.py: MoEV2.construct reshapes to (data_parallel, -1, h),
    TopkRouterV2.dispatch_gather is sharded ((dp, 1, 1), (dp, 1, 1)); _ffn_forward_sq arrives with r1.5.0), so
    every tp rank routes and sends its whole dp slice."""
    if not release:
        return cfg
    cfg = replace(cfg, release=release)
    moe = cfg.model.moe
    if cfg.dialect == "r1.x" and moe is not None and release < (1, 5):
        notes = cfg.notes
        if cfg.layout.seq_parallel and cfg.layout.tp > 1:
            notes += (f"mindformers r{'.'.join(map(str, release))}: MoEV2 routes the whole dp slice on each of the "
                      f"{cfg.layout.tp} tp ranks (no sequence-parallel dispatch before r1.5.0, "
                      "modules/transformer/moe.py), so each sends all of it in the all-to-all",)
        cfg = replace(cfg, model=replace(cfg.model, moe=replace(moe, sp_dispatch=False)), notes=notes)
    return cfg


def read_config(path_or_dict: Any, budget: Any = None, *, model_config: Any = None,
                devices: int | None = None, release: Any = None) -> Config:
    """Read a mindformers training file (path or parsed dict) in any dialect into a `Config`. `release`
    ("r1.3.0"): the mindformers release the file runs on, where its code prices the file differently (r1.x MoE
    before r1.5.0: see `_at_release`); None prices it as the newest release does.
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    rel = parse_release(release)
    return _at_release(_read_config(path_or_dict, budget, model_config, devices), rel)


def _read_config(path_or_dict: Any, budget: Any, model_config: Any, devices: int | None) -> Config:
    d = load_yaml(path_or_dict)
    if str(d.get("run_mode", "train")) not in ("train", "finetune"):
        raise DoctorError("run_mode", d.get("run_mode"), "pass a training config (run_mode: 'train' or 'finetune')")
    dialect = dialect_of(d)
    try:
        if dialect == "pynative":
            cfg = _pynative(d, budget, model_config, devices)
        else:
            if not isinstance(d.get("model"), dict) and "model" in d:
                raise DoctorError("model", d.get("model"), f"{dialect} dialect: a mapping with model_config")
            if "model" not in d:
                raise DoctorError("model.model_config", None, "pass a mindformers training YAML (it has "
                                  "model.model_config, or training: and parallelism: sections for 2.x PyNative)")
            cfg = _static(d, dialect, budget, model_config)
        if _dataset_eod(d) and not cfg.model.eod:      # mindformers turns the dataset's switch into the model's
            cfg = replace(cfg, model=replace(cfg.model, eod=True))
        if cfg.model.eod and not cfg.model.flash:      # 1.9's llama.py and parallel_core's TransformerConfig refuse it
            raise DoctorError("use_eod_attn_mask_compression", True, "packed documents' masks need flash attention, "
                              "and mindformers refuses them without it: set use_flash_attention: True, or turn off "
                              "use_eod_attn_mask_compression and the dataset's create_compressed_eod_mask")
        return replace(cfg, key_flags=tuple(key_flags(d, cfg.dialect, _MODEL_PRICED)))
    except DoctorError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, ZeroDivisionError) as e:
        # a value of a shape no reader expects: one line rather than a traceback
        raise DoctorError("CONFIG", type(e).__name__, f"{dialect} dialect: a key holds a value of the wrong type "
                          f"({str(e)[:100]}); check the YAML against mindformers' own config") from None


# ---------------------------------------------------------------- a variant read again (the slow way)
def with_layout(cfg: Config, **kw) -> Config:
    """A variant the slow way: the file edited in its own dialect (edited_yaml) and read again. The search and the
    planner (adapt.on_degrees) use variants.layout_variant instead, which tests/doctor/test_search.py and
    tests/doctor/test_one_price.py check prices exactly like this.
    Taught in: no notebook; doctor/__init__.py, doctor/adapt.py, doctor/calibration.py call it."""
    return read_config(edited_yaml(cfg, **kw), budget=cfg.budget_bytes, model_config=cfg.model_config,
                       release=cfg.release)
