"""Every key in a section the doctor reads: priced, known to mindformers but not affecting the price, or unknown.

A misspelled key (`model_paralel: 4`) is otherwise read as absent, so the layout takes mindformers' default and
the verdict and its fix are about a file the user did not write. `key_flags` names each unknown key with the
nearest known one, and each section a dialect needs that the file leaves out.

Where the vocabulary comes from, per section (the "known, not priced" keys):
  parallel_config, recompute_config   mindformers 1.9 TransformerOpParallelConfig / TransformerRecomputeConfig
                                      signatures (modules/transformer/op_parallel_config.py, transformer.py)
  moe_config                          mindformers 1.9 MoEConfig's signature (modules/transformer/moe.py)
  runner_config, parallel, context    the keys mindformers' shipped r1.x-2.1.0 configs set, and the keywords of
                                      mindspore.set_auto_parallel_context / set_context they are passed to
  training, parallelism, recompute,   mindformers 2.1.0 pynative/config/config.py dataclasses (TrainingConfig,
  swap                                ParallelismConfig, RecomputeConfig, SwapConfig), which refuse unknown keys
                                      themselves (BaseConfig.allow_extra = False)
  model.model_config, model           the keys the shipped configs set (model classes take **kwargs, so
                                      mindformers never refuses one)
"""
from __future__ import annotations

import difflib
from typing import Any

# section -> keys the doctor's readers read (priced). Model keys come from readers.ALIASES (passed in).
PRICED: dict[str, frozenset] = {
    "parallel_config": frozenset({"data_parallel", "model_parallel", "pipeline_stage", "micro_batch_num",
                                  "expert_parallel", "context_parallel", "context_parallel_algo", "pp_interleave_num",
                                  "use_seq_parallel", "vocab_emb_dp"}),
    "recompute_config": frozenset({"recompute", "select_recompute"}),
    "runner_config": frozenset({"batch_size", "gradient_accumulation_steps"}),
    "parallel": frozenset({"enable_parallel_optimizer", "parallel_optimizer_config", "pipeline_config"}),
    "context": frozenset({"max_device_memory", "swap"}),
    "swap_config": frozenset({"swap"}),
    "optimizer": frozenset({"type"}),
    "training": frozenset({"local_batch_size", "global_batch_size"}),
    "parallelism": frozenset({"tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel",
                              "pipeline_parallel_interleave_num", "data_parallel_shard", "data_parallel_shard_strategy",
                              "sequence_parallel", "context_parallel_method", "pipeline_parallel_layers_per_stage",
                              "enable_mc2"}),
    "recompute": frozenset({"mode", "full_recompute_layer", "select_module"}),
    "swap": frozenset({"enable"}),
}

NOT_PRICED: dict[str, frozenset] = {
    "parallel_config": frozenset({"optimizer_shard", "gradient_aggregation_group", "seq_split_num", "recompute",
                                  "ulysses_degree_in_cp", "mem_coeff", "swap"}),
    "recompute_config": frozenset({"parallel_optimizer_comm_recompute", "select_comm_recompute", "mp_comm_recompute",
                                   "recompute_slice_activation", "select_recompute_exclude",
                                   "select_comm_recompute_exclude"}),
    "runner_config": frozenset({"epochs", "sink_mode", "sink_size", "stop_step", "initial_epoch", "initial_step"}),
    "parallel": frozenset({"parallel_mode", "gradients_mean", "enable_alltoall", "full_batch", "dataset_strategy",
                           "search_mode", "strategy_ckpt_config", "strategy_ckpt_save_file", "strategy_ckpt_load_file",
                           "loss_repeated_mean", "device_num", "global_rank", "gradient_fp32_sync",
                           "auto_parallel_search_mode", "pipeline_stages", "all_reduce_fusion_config",
                           "comm_fusion", "auto_pipeline", "dump_local_norm", "dump_device_local_norm"}),
    "context": frozenset({"mode", "device_target", "device_id", "jit_config", "ascend_config", "memory_optimize_level",
                          "mempool_block_size", "max_call_depth", "save_graphs", "save_graphs_path",
                          "enable_graph_kernel", "graph_kernel_flags", "runtime_num_threads", "affinity_cpu_list",
                          "deterministic", "pynative_synchronize", "enable_compile_cache", "compile_cache_path",
                          "variable_memory_max_size", "recompute_comm_overlap", "train_precision_sync",
                          "device_memory_capacity", "max_size"}),
    "swap_config": frozenset({"default_prefetch", "layer_swap", "op_swap"}),
    "optimizer": frozenset({"betas", "eps", "weight_decay", "learning_rate", "beta1", "beta2", "momentum",
                            "use_fused", "use_nesterov", "loss_scale", "amsgrad", "maximize", "swap"}),
    "moe_config": frozenset({"aux_loss_factor", "expert_group_size", "group_wise_a2a", "comp_comm_parallel",
                             "comp_comm_parallel_degree", "save_token_distribution", "cur_layer",
                             "enable_cold_hot_expert", "update_step", "hot_expert_num", "cold_token_percent",
                             "moe_module_name", "routing_policy", "norm_topk_prob", "enable_sdrop",
                             "use_fused_ops_topkrouter", "router_dense_type", "use_shared_expert_gating",
                             "max_router_load", "topk_method", "topk_group", "n_group", "enable_deredundency",
                             "npu_nums_per_device", "routed_scaling_factor", "aux_loss_types", "aux_loss_factors",
                             "z_loss_factor", "balance_via_topk_bias", "topk_bias_update_rate",
                             "moe_shared_expert_overlap", "expert_model_parallel",
                             "use_gating_sigmoid", "use_gmm", "enable_gmm_safe_tokens", "use_fused_ops_permute",
                             "callback_moe_droprate", "dispatch_global_max_bs", "ep_extend_tp"}),
    "training": frozenset({"steps", "max_norm", "use_skip_step_on_nan", "max_consecutive_skipped_steps", "seed",
                           "deterministic", "rampup_batch_size"}),
    "parallelism": frozenset({"reshard_after_forward_policy", "cpu_offload", "disable_gradient_division",
                              "dense_fsdp_shard_size", "context_parallel_async", "ulysses_degree_in_cp",
                              "context_parallel_mask_type", "pipeline_parallel_schedule",
                              "pipeline_parallel_microbatch_size", "pipeline_parallel_overlap_p2p",
                              "pipeline_parallel_overlap_b_f", "pipeline_parallel_enable_dxdw_split",
                              "pipeline_parallel_p2p_transport", "enable_loss_parallel",
                              "npu_nums_per_device", "moe_token_dispatcher_type", "expert_parallel_async_d2h",
                              "expert_parallel_use_safe_tokens"}),
    "recompute": frozenset({"exclude_op"}),
    "swap": frozenset({"default_prefetch", "layer_swap", "op_swap"}),
}

# Model keys mindformers' shipped configs set that the cost model does not read (tokenizer ids, dropout, rope
# scaling, fusion switches, inference knobs): the union over the r1.0-2.1.0 configs, model.model_config and 2.x model.
MODEL_NOT_PRICED = frozenset("""
activation_func_clamp_value add_bias_linear apply_dsa_kernel_fusion apply_query_key_layer_scaling
apply_residual_connection_post_layernorm apply_rope_fusion arch architectures attention_dropout attention_dropout_prob
attention_dropout_rate attention_softmax_in_fp32 auto_map auto_register beta_fast beta_slow bias_dropout_fusion
bias_swiglu_fusion block_size bos_token_id checkpoint_name_or_path compress_ratios compress_rope_theta compute_in_2d
csa_dense_mode csa_window_size do_sample dsa_indexer_loss_coeff dsa_indexer_use_sparse_loss emb_dropout_prob
embed_dropout_prob embedding_init_type enable_hyper_connections eos_token_id expand_ratio
experimental_attention_variant extend_method fine_grain_interleave fp32_residual_connection fused_rms_norm
gated_linear_unit has_bias hidden_act hidden_dropout hidden_dropout_prob hidden_dropout_rate ignore_token_id
index_head_dim index_n_heads index_topk initializer_range input_sliced_sig is_dynamic layernorm_compute_dtype
layernorm_compute_type layernorm_epsilon mask_type max_decode_length max_length max_position_embedding
max_position_embeddings mean mhc_init_gating_factor mhc_sinkhorn_iterations mla_qkv_concat mlp_concat model_name
moe_aux_loss_coeff moe_grouped_gemm moe_router_bias_update_rate moe_router_dtype moe_router_enable_expert_bias
moe_router_force_expert_balance moe_router_fusion moe_router_group_topk moe_router_load_balancing_type
moe_router_pre_softmax moe_router_score_function moe_token_drop_policy moe_z_loss_coeff
mscale mscale_all_dim mtp_loss_factor mtp_loss_scaling_factor mup_scale_factor n_group net_name no_recompute_layers
norm_topk_prob npu_nums_per_device num_block num_blocks num_hash_layers num_residual_streams o_groups o_lora_rank
output_mult pad_token_id parallel_optimizer position_embedding_type post_layer_norm pre_seq_len prefix_projection
pretrain_seqlen qk_layernorm qkv_concat quantization_bit repetition_penalty res_dtype rms_norm_eps rmsnorm rope_ratio
rope_theta rope_scaling rotary_dtype rotary_emb_base rotary_pct rotary_scaling_factor routed_scaling_factor
router_aux_loss_coef router_dense_type scaling_factor scoring_func sigma softmax_compute_dtype softmax_compute_type
temperature theta top_k top_p topk_group torch_dtype transformers_version use_attn_mask_compression use_cache
use_contiguous_weight_layout_attention use_fused_mla use_fused_ops_topkrouter use_mup use_pad_tokens use_past
use_past_shard use_prompt_flash_attention max_window_layers wo_has_bias
""".split())
# Model keys the readers read besides readers.ALIASES' (read_model, _static, _pynative)
MODEL_PRICED_EXTRA = frozenset({"tie_word_embeddings", "multiple_of", "ffn_dim_multiplier", "use_flash_attention",
                                "compute_dtype", "params_dtype", "param_init_type", "offset", "pp_interleave_num",
                                "multi_latent_attention", "multi_query_attention", "untie_embeddings_and_output_weights",
                                "batch_size", "type", "model_type", "context_parallel_algo",
                                "moe_token_dispatcher_type", "use_sliding_window", "sliding_window",
                                "use_eod_attn_mask_compression"})

# Sections per dialect: (section, required). A required section the file leaves out is named as missing.
SECTIONS: dict[str, tuple] = {
    "static": (("parallel_config", True), ("runner_config", True), ("recompute_config", False),
               ("parallel", False), ("context", False), ("swap_config", False), ("optimizer", False),
               ("moe_config", False), ("model.model_config", True)),
    "pynative": (("parallelism", True), ("training", True), ("recompute", False), ("swap", False),
                 ("context", False), ("model", True)),
}
_MISSING = {
    "parallel_config": "every degree read as mindformers' default 1 (data, model, pipeline, context, expert)",
    "runner_config": "batch_size read as 1 and gradient_accumulation_steps as 1 (mindformers' RunnerConfig defaults)",
    "parallelism": "every degree read as mindformers' ParallelismConfig default 1, and data_parallel_shard as -1 "
                   "(every remaining card)",
    "training": "local_batch_size and global_batch_size read as 1 (mindformers' TrainingConfig defaults)",
}
_REFUSES = {"training", "parallelism", "recompute", "swap"}     # mindformers 2.1.0 refuses unknown keys here


def _known(section: str, model_priced: frozenset) -> tuple[frozenset, frozenset]:
    if section in ("model.model_config", "model"):
        return model_priced | MODEL_PRICED_EXTRA, MODEL_NOT_PRICED | {"model_config"}
    if section == "moe_config":             # r1.x merges moe_config into the model keys (readers._static)
        return model_priced | {"use_allgather_dispatcher"}, NOT_PRICED["moe_config"]
    return PRICED.get(section, frozenset()), NOT_PRICED.get(section, frozenset())



def _get(d: dict, dotted: str) -> Any:
    node: Any = d
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def key_flags(d: dict, dialect: str, model_priced: frozenset = frozenset()) -> list[dict]:
    """Unknown keys and missing sections of a parsed file `d` in `dialect` ("r1.x", "mcore", "1.9" or "pynative").

    Each flag: {"key": dotted key, "kind": "unknown" | "missing section", "suggestion": nearest known key or None,
    "text": one line}. A key unknown in its section but known in another says where it belongs.
    Taught in: no notebook; doctor/describe.py, doctor/readers.py, doctor/diagnosis.py call it."""
    fam = "pynative" if dialect == "pynative" else "static"
    sections = SECTIONS[fam]
    vocab = {s: _known(s, model_priced) for s, _ in sections}
    out: list[dict] = []
    for section, required in sections:
        node = _get(d, section)
        if node is None:
            if required and section in _MISSING:
                near = difflib.get_close_matches(section.split(".")[-1], [str(k) for k in d], n=1, cutoff=0.8)
                hint = f"; the file has `{near[0]}`: did you mean `{section}`?" if near else ""
                out.append({"key": section, "kind": "missing section", "suggestion": section if near else None,
                            "text": f"`{section}`: missing section ({fam} dialect): {_MISSING[section]}{hint}"})
            continue
        if not isinstance(node, dict):
            continue            # the readers refuse a non-mapping section in one line
        priced, not_priced = vocab[section]
        known = priced | not_priced
        for k in node:
            if k in known:
                continue
            key = f"{section}.{k}"
            near = difflib.get_close_matches(str(k), sorted(known), n=1, cutoff=0.75)
            home = next((s for s, (p, n) in vocab.items() if s != section and k in (p | n)), None)
            if near:
                text = f"`{key}`: unknown key; did you mean `{near[0]}`?"
                if near[0] in priced:
                    text += f" (the doctor reads `{section}.{near[0]}`; this value is not used)"
            elif home:
                text = f"`{key}`: unknown in `{section}`; it belongs in `{home}`"
            else:
                text = f"`{key}`: unknown key (not read by the doctor, not in mindformers' config classes)"
            if section in _REFUSES:
                text += "; mindformers 2.1.0 refuses unknown keys in this section (BaseConfig.allow_extra = False)"
            out.append({"key": key, "kind": "unknown", "suggestion": near[0] if near else home, "text": text})
    return out
