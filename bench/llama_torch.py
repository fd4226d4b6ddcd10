"""The mini LLaMA in PyTorch, the same dims and parameter count as the cookbook's mindformers model.

Example:
    >>> from bench.llama_torch import TorchLlama
    >>> net = TorchLlama(vocab=1024, dim=256, layers=4, heads=4, ffn=688)
    >>> sum(p.numel() for p in net.parameters())
    3688704

Written the way a PyTorch user would (nanoGPT style): RMSNorm, rotary embedding, causal
`scaled_dot_product_attention`, SwiGLU MLP, untied output head, no biases.
Only the benchmark imports torch; mshelpers never does.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(seq_len: int, head_dim: int, theta: float = 10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    ang = torch.outer(torch.arange(seq_len).float(), inv)
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (w(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TorchLlama(nn.Module):
    """input_ids (batch, T+1) -> mean next-token cross-entropy, like mindformers' LlamaForCausalLM."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, ffn: int, seq_len: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary_tables(seq_len, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids):
        x, y = input_ids[:, :-1], input_ids[:, 1:]
        t = x.shape[1]
        h = self.embed(x)
        for blk in self.blocks:
            h = blk(h, self.cos[:t], self.sin[:t])
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
