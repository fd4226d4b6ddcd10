"""A lean LLaMA `Cell` for MindSpore: the mindformers mini model's maths, none of its parallel plumbing.

The TUNED keywords switch the CPU optimizations that won in bench/README.md; all are on by default, which
is the benchmark's MindSpore recipe. Every setting computes the same function (tests/test_bench_models.py
checks the recipe and PLAIN against mindformers' LlamaForCausalLM, and each switch's gradients).

Example:
    >>> from bench.lean_llama_ms import LeanLlama, PLAIN
    >>> net = LeanLlama(vocab=1024, dim=256, layers=4, heads=4, ffn=688)
    >>> sum(p.size for p in net.trainable_params())
    3688704
    >>> plain = LeanLlama(vocab=1024, dim=256, layers=4, heads=4, ffn=688, **PLAIN)   # none of them
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor
from mindspore.common.initializer import Normal, initializer

# The optimizations that won (bench/README.md), all on by default; PLAIN turns them all off. Both keep the
# activations 2-D, (batch * seq, dim), between blocks. norm_by_matmul is a tried candidate, off by default.
TUNED = dict(primitive_matmul=True, fused_cross_entropy=True, softmax_bprop=True, rope_by_matmul=True)
PLAIN = {k: False for k in TUNED}
MATMULS = ("ms", "numpy", "blas")


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


def _matmuls(matmul: str, primitive: bool) -> tuple:
    """(2-D a @ b, batched a @ b, batched a @ b^T) for a LeanLlama `matmul` setting."""
    if matmul not in MATMULS:
        raise ValueError(f"matmul={matmul!r} is not one of {MATMULS}; fix: pick one of them")
    if matmul == "blas":
        from bench.blas_matmul import blas_matmul, blas_matmul_nt
        return blas_matmul, blas_matmul, blas_matmul_nt
    scores = ops.BatchMatMul(transpose_b=True)   # q @ k^T without a Transpose op
    # ops.matmul is MatMulExt: its gradient transposes operands with explicit Transpose ops. The MatMul
    # primitives' gradients set transpose flags on the next MatMul instead, so no Transpose runs.
    mm2d, bmm = (ops.MatMul(), ops.BatchMatMul()) if primitive else (ops.matmul, ops.matmul)
    return (numpy_matmul if matmul == "numpy" else mm2d), bmm, scores


def _w(shape, std=0.02):
    return Parameter(initializer(Normal(std), shape, ms.float32))


class RMSNorm(nn.Cell):
    """x (N, d) -> x / rms(x) * weight. by_matmul computes the row mean as a MatMul with a 1/d column
    (a candidate that did not win: on 2-D input MindSpore's CPU ReduceMean is already cheap)."""

    def __init__(self, dim, eps=1e-5, by_matmul=False):   # mindformers rms_norm_eps
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(dim, np.float32)))
        self.eps, self.by_matmul = eps, by_matmul
        self.avg = Tensor(np.full((dim, 1), 1.0 / dim, np.float32))
        self.mm = ops.MatMul()

    def construct(self, x):
        sq = x * x
        mean_sq = self.mm(sq, self.avg) if self.by_matmul else ops.mean(sq, -1, keep_dims=True)
        return x * ops.rsqrt(mean_sq + self.eps) * self.weight


class Softmax(nn.Cell):
    """Softmax over the last axis; with row_sum_by_matmul its gradient's row sum is a MatMul with ones.
    Without it the row sum is a ReduceSum over the last axis, as in MindSpore's own softmax gradient
    (`_SoftmaxBackward` expands to the same Mul, ReduceSum, Sub); that ReduceSum took ~3 ms per call here."""

    def __init__(self, n, row_sum_by_matmul=True):
        super().__init__()
        self.ones = Tensor(np.ones((n, 1), np.float32))
        self.custom = row_sum_by_matmul

    def construct(self, s):
        return ops.softmax(s, -1)

    def bprop(self, s, out, dout):   # d softmax: y * (dy - sum(dy * y))
        dy = dout * out
        row_sum = ops.matmul(dy, self.ones) if self.custom else dy.sum(-1, keepdims=True)
        return (dy - out * row_sum,)


def _rotate_half_matrix(hd: int) -> np.ndarray:
    """R with x @ R == concat(-x[..., hd/2:], x[..., :hd/2]): rotate-half as one small MatMul."""
    half = hd // 2
    r = np.zeros((hd, hd), np.float32)
    r[half:, :half] = -np.eye(half, dtype=np.float32)
    r[:half, half:] = np.eye(half, dtype=np.float32)
    return r


class Block(nn.Cell):
    def __init__(self, dim, heads, ffn, seq_len, fused=False, matmul="ms", primitive_matmul=True, norm_by_matmul=False,
                 softmax_bprop=True, rope_by_matmul=True):
        super().__init__()
        self.heads, self.hd, self.fused, self.seq_len = heads, dim // heads, fused, seq_len
        self.attn_norm, self.mlp_norm = RMSNorm(dim, by_matmul=norm_by_matmul), RMSNorm(dim, by_matmul=norm_by_matmul)
        if fused:   # one matmul for q, k, v and one for gate+up: same parameter count, fewer kernels
            self.wqkv, self.w13 = _w((dim, 3 * dim)), _w((dim, 2 * ffn))
        else:
            self.wq, self.wk, self.wv = _w((dim, dim)), _w((dim, dim)), _w((dim, dim))
            self.w1, self.w3 = _w((dim, ffn)), _w((dim, ffn))
        self.wo, self.w2 = _w((dim, dim)), _w((ffn, dim))
        self.mm, self.bmm, self.scores = _matmuls(matmul, primitive_matmul)
        self.softmax = Softmax(seq_len, row_sum_by_matmul=softmax_bprop)
        self.rope_by_matmul = rope_by_matmul
        self.rot = Tensor(_rotate_half_matrix(self.hd))
        self.scale = 1.0 / float(np.sqrt(self.hd))

    def rope(self, x, cos, sin):
        if self.rope_by_matmul:
            return x * cos + self.mm(x.reshape(-1, self.hd), self.rot).reshape(x.shape) * sin
        half = self.hd // 2
        return x * cos + ops.concat((-x[..., half:], x[..., :half]), -1) * sin

    def construct(self, x, cos, sin, cos_q, sin_q, mask):
        n, d = x.shape   # x is (batch * seq, dim) throughout: no reshapes around the 2-D MatMuls
        b, t = n // self.seq_len, self.seq_len
        h = self.attn_norm(x)
        if self.fused:
            q, k, v = ops.split(self.mm(h, self.wqkv), d, -1)
        else:
            q, k, v = self.mm(h, self.wq), self.mm(h, self.wk), self.mm(h, self.wv)
        q = q.reshape(b, t, self.heads, self.hd).transpose(0, 2, 1, 3)
        k = k.reshape(b, t, self.heads, self.hd).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, self.heads, self.hd).transpose(0, 2, 1, 3)
        # cos_q/sin_q carry the 1/sqrt(head_dim) score scale when rope_by_matmul (see LeanLlama)
        q, k = self.rope(q, cos_q, sin_q), self.rope(k, cos, sin)
        s = self.scores(q, k)
        if not self.rope_by_matmul:
            s = s * self.scale
        s = s + mask
        a = self.bmm(self.softmax(s), v).transpose(0, 2, 1, 3).reshape(n, d)
        x = x + self.mm(a, self.wo)
        h = self.mlp_norm(x)
        if self.fused:
            g, u = ops.split(self.mm(h, self.w13), self.w2.shape[0], -1)
        else:
            g, u = self.mm(h, self.w1), self.mm(h, self.w3)
        return x + self.mm(ops.silu(g) * u, self.w2)


class LeanLlama(nn.Cell):
    """input_ids (batch, T+1) int32 -> mean next-token cross-entropy (mindformers' calling convention).

    Keywords: fused (one q/k/v and one gate/up MatMul), matmul ("ms" MindSpore's kernel, "numpy" a pyfunc
    Custom op, "blas" an AOT Custom op calling OpenBLAS), norm_by_matmul, and the TUNED switches:
    primitive_matmul, fused_cross_entropy, softmax_bprop, rope_by_matmul (each explained where it is used).
    """

    def __init__(self, vocab, dim, layers, heads, ffn, seq_len=128, fused=False, matmul="ms", norm_by_matmul=False,
                 **tuned):
        super().__init__()
        unknown = set(tuned) - set(TUNED)
        if unknown:
            raise TypeError(f"unknown LeanLlama option(s) {sorted(unknown)}; fix: use fused, matmul, norm_by_matmul "
                            f"or {sorted(TUNED)}")
        opts = {**TUNED, **tuned, "norm_by_matmul": norm_by_matmul}
        self.embed = _w((vocab, dim))
        block_opts = {k: v for k, v in opts.items() if k != "fused_cross_entropy"}
        self.blocks = nn.CellList([Block(dim, heads, ffn, seq_len, fused, matmul, **block_opts) for _ in range(layers)])
        self.norm = RMSNorm(dim, by_matmul=opts["norm_by_matmul"])
        self.head = _w((dim, vocab))
        self.mm = _matmuls(matmul, opts["primitive_matmul"])[0]
        hd = dim // heads
        inv = 1.0 / 10000.0 ** (np.arange(0, hd, 2, dtype=np.float32) / hd)
        ang = np.outer(np.arange(seq_len, dtype=np.float32), inv)
        ang = np.concatenate([ang, ang], -1)
        cos, sin = np.cos(ang), np.sin(ang)
        self.cos, self.sin = Tensor(cos), Tensor(sin)
        # Folding the 1/sqrt(head_dim) score scale into q's rotary tables saves a Mul over the
        # (batch, heads, T, T) scores and its gradient: rope is linear, so rope(q) * c == rope_c(q).
        scale = 1.0 / np.sqrt(hd) if opts["rope_by_matmul"] else 1.0
        self.cos_q, self.sin_q = Tensor(cos * scale), Tensor(sin * scale)
        self.mask = Tensor(np.triu(np.full((seq_len, seq_len), -1e9, np.float32), 1))
        self.fused_ce = opts["fused_cross_entropy"]
        # one fused kernel for softmax + NLL and its gradient, instead of ReduceMax, Sub, Exp, Log, ... each way
        self.sce = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, input_ids):
        x, y = input_ids[:, :-1], input_ids[:, 1:]
        b, t = x.shape
        h = ops.gather(self.embed, x, 0).reshape(b * t, -1)
        for blk in self.blocks:
            h = blk(h, self.cos, self.sin, self.cos_q, self.sin_q, self.mask)
        logits = self.mm(self.norm(h), self.head)
        if self.fused_ce:
            return self.sce(logits, y.reshape(-1))
        return ops.cross_entropy(logits, y.reshape(-1))
