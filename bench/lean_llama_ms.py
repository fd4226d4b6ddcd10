"""A lean LLaMA `Cell` for MindSpore: the mindformers mini model's maths, none of its parallel plumbing.

Example:
    >>> from bench.lean_llama_ms import LeanLlama
    >>> net = LeanLlama(vocab=1024, dim=256, layers=4, heads=4, ffn=688)
    >>> sum(p.size for p in net.trainable_params())
    3688704
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor
from mindspore.common.initializer import Normal, initializer


def _np_mm(a, b):
    return np.matmul(a, b)


def _np_mm_tb(a, b):
    return np.matmul(a, b.T)


def _np_mm_ta(a, b):
    return np.matmul(a.T, b)


_same = lambda a, b: a   # noqa: E731  (output dtype = first input's)
_mm_tb = ops.Custom(_np_mm_tb, out_shape=lambda a, b: [a[0], b[0]], out_dtype=_same, func_type="pyfunc")
_mm_ta = ops.Custom(_np_mm_ta, out_shape=lambda a, b: [a[1], b[1]], out_dtype=_same, func_type="pyfunc")


def _np_mm_bprop(a, b, out, dout):
    return _mm_tb(dout, b), _mm_ta(a, dout)


# A 2-D matmul run by NumPy's BLAS (OpenBLAS in the numpy wheel) as a MindSpore pyfunc Custom op,
# with its backward as two more such ops. A benchmark candidate, not a recommendation: see bench/README.md.
numpy_matmul = ops.Custom(_np_mm, out_shape=lambda a, b: [a[0], b[1]], out_dtype=_same, func_type="pyfunc",
                          bprop=_np_mm_bprop)


def _w(shape, std=0.02):
    return Parameter(initializer(Normal(std), shape, ms.float32))


class RMSNorm(nn.Cell):
    def __init__(self, dim, eps=1e-5):   # mindformers rms_norm_eps
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)))
        self.eps = eps

    def construct(self, x):
        return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps) * self.weight


class Block(nn.Cell):
    def __init__(self, dim, heads, ffn, fused, np_mm=False):
        super().__init__()
        self.heads, self.hd, self.fused, self.np_mm = heads, dim // heads, fused, np_mm
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        if fused:   # one matmul for q, k, v and one for gate+up: same parameter count, fewer kernels
            self.wqkv, self.w13 = _w((dim, 3 * dim)), _w((dim, 2 * ffn))
        else:
            self.wq, self.wk, self.wv = _w((dim, dim)), _w((dim, dim)), _w((dim, dim))
            self.w1, self.w3 = _w((dim, ffn)), _w((dim, ffn))
        self.wo, self.w2 = _w((dim, dim)), _w((ffn, dim))
        self.scale = 1.0 / float(np.sqrt(self.hd))
        self.scores = ops.BatchMatMul(transpose_b=True)   # q @ k^T without a Transpose op (and its grad)

    def mm(self, a, b):
        if self.np_mm:
            return numpy_matmul(a, b)
        return ops.matmul(a, b)

    def rope(self, x, cos, sin):
        half = self.hd // 2
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + ops.concat((-x2, x1), -1) * sin

    def construct(self, x, cos, sin, mask):
        b, t, d = x.shape
        h = self.attn_norm(x).reshape(b * t, d)
        if self.fused:
            q, k, v = ops.split(self.mm(h, self.wqkv), d, -1)
        else:
            q, k, v = self.mm(h, self.wq), self.mm(h, self.wk), self.mm(h, self.wv)
        q = q.reshape(b, t, self.heads, self.hd).transpose(0, 2, 1, 3)
        k = k.reshape(b, t, self.heads, self.hd).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, self.heads, self.hd).transpose(0, 2, 1, 3)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        s = self.scores(q, k) * self.scale + mask
        a = ops.matmul(ops.softmax(s, -1), v).transpose(0, 2, 1, 3).reshape(b * t, d)
        x = x + self.mm(a, self.wo).reshape(b, t, d)
        h = self.mlp_norm(x).reshape(b * t, d)
        if self.fused:
            g, u = ops.split(self.mm(h, self.w13), self.w2.shape[0], -1)
        else:
            g, u = self.mm(h, self.w1), self.mm(h, self.w3)
        return x + self.mm(ops.silu(g) * u, self.w2).reshape(b, t, d)


class LeanLlama(nn.Cell):
    """input_ids (batch, T+1) int32 -> mean next-token cross-entropy (mindformers' calling convention)."""

    def __init__(self, vocab, dim, layers, heads, ffn, seq_len=128, fused=False, np_mm=False):
        super().__init__()
        self.embed = _w((vocab, dim))
        self.blocks = nn.CellList([Block(dim, heads, ffn, fused, np_mm) for _ in range(layers)])
        self.np_mm = np_mm
        self.norm = RMSNorm(dim)
        self.head = _w((dim, vocab))
        hd = dim // heads
        inv = 1.0 / 10000.0 ** (np.arange(0, hd, 2, dtype=np.float32) / hd)
        ang = np.outer(np.arange(seq_len, dtype=np.float32), inv)
        ang = np.concatenate([ang, ang], -1)
        self.cos, self.sin = Tensor(np.cos(ang)), Tensor(np.sin(ang))
        self.mask = Tensor(np.triu(np.full((seq_len, seq_len), -1e9, np.float32), 1))
        self.vocab = vocab

    def construct(self, input_ids):
        x, y = input_ids[:, :-1], input_ids[:, 1:]
        b, t = x.shape
        h = ops.gather(self.embed, x, 0)
        for blk in self.blocks:
            h = blk(h, self.cos, self.sin, self.mask)
        hn = self.norm(h).reshape(b * t, -1)
        logits = numpy_matmul(hn, self.head) if self.np_mm else ops.matmul(hn, self.head)
        return ops.cross_entropy(logits, y.reshape(-1))
