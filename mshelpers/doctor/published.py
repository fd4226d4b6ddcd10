"""The published figures the doctor is fitted on and checked against: mindformers' own tokens/s/p, each with
the YAML it links (copied from the same branch into tests/data/mindformers/, its header naming path and
commit) and where the figure is printed. `role` "fit" marks the (at most 4) points the constants are fitted on."""
from __future__ import annotations

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
