"""A small hand-written LLaMA-style language model (no attention) for mixed-precision experiments.

Example:
    >>> import numpy as np, mindspore as ms
    >>> from mshelpers.smalllm import SmallLM, WithNextTokenLoss
    >>> net = WithNextTokenLoss(SmallLM(init_std=0.02))        # vocab 1024
    >>> input_ids = ms.Tensor(np.random.default_rng(0).integers(0, 1024, (2, 17)), ms.int32)
    >>> loss = net(input_ids)          # input_ids: int32 (batch, T+1), like mindformers' LlamaForCausalLM
    >>> loss.shape, abs(float(loss) - np.log(1024)) < 0.5   # untrained: about ln(vocab) nats per token
    ((), True)

Why a module and not notebook cells: `ms.amp.auto_mixed_precision(..., "O1")` rewrites a network
from its class source, which `inspect` cannot read for classes typed into a notebook.
Embedding, RMSNorm (statistics in float32) and MLP blocks with residuals: enough of a LLaMA to show
where float16 overflows, small enough to train in seconds op by op.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.common.initializer import Normal


class RMSNorm(nn.Cell):
    """Root-mean-square layer norm with a learned scale (the small model's norm).
    Taught in notebooks/03_mixed_precision.ipynb."""
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(dim, np.float32)), name="weight")
        self.eps = eps
        self.square, self.mean, self.rsqrt = ops.Square(), ops.ReduceMean(keep_dims=True), ops.Rsqrt()

    def construct(self, x):
        # statistics in float32: the mean of squares is where float16 overflows first. In PyNative a cell cast
        # with to_float(float16) (AMP O2/O3) casts every op's inputs back to float16, this astype included:
        # keep the cell itself in float32 (to_float(ms.float32)) there. Graph mode honours the astype.
        x32 = x.astype(ms.float32)
        y = x32 * self.rsqrt(self.mean(self.square(x32), -1) + self.eps) * self.weight
        return y.astype(x.dtype)


class Block(nn.Cell):
    """One pre-norm MLP block with a residual: the small model's layer.
    Taught in notebooks/03_mixed_precision.ipynb."""
    def __init__(self, dim, ffn, init_std):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.up = nn.Dense(dim, ffn, weight_init=Normal(init_std), has_bias=False)
        self.act = nn.SiLU()
        self.down = nn.Dense(ffn, dim, weight_init=Normal(init_std), has_bias=False)

    def construct(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class SmallBody(nn.Cell):
    """Hidden states (batch, T, dim) -> logits (batch, T, vocab): the blocks, final norm and head.
    Taught with the rest of smalllm.py in notebooks/03_mixed_precision.ipynb."""
    def __init__(self, vocab, dim, ffn, layers, init_std):
        super().__init__()
        self.blocks = nn.CellList([Block(dim, ffn, init_std) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.head = nn.Dense(dim, vocab, weight_init=Normal(init_std), has_bias=False)

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class SmallLM(nn.Cell):
    """Token ids (batch, T) -> logits (batch, T, vocab).
    Taught in notebooks/03_mixed_precision.ipynb."""
    def __init__(self, vocab=1024, dim=128, ffn=344, layers=3, init_std=0.02):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, embedding_table=Normal(init_std))
        self.body = SmallBody(vocab, dim, ffn, layers, init_std)

    def construct(self, tokens):
        return self.body(self.embed(tokens))


class NextTokenLoss(nn.Cell):
    """Cross-entropy in float32, kept outside the AMP-cast network (as Model does with loss_fn).
    Taught in notebooks/03_mixed_precision.ipynb."""
    def __init__(self):
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def construct(self, logits, labels):
        return self.ce(logits.astype(ms.float32).reshape(-1, logits.shape[-1]), labels.reshape(-1))


class WithNextTokenLoss(nn.Cell):
    """input_ids (batch, T+1) -> loss, the calling convention of mindformers' LlamaForCausalLM.
    Taught in notebooks/03_mixed_precision.ipynb."""
    def __init__(self, backbone):
        super().__init__()
        self.backbone, self.loss = backbone, NextTokenLoss()

    def construct(self, input_ids):
        return self.loss(self.backbone(input_ids[:, :-1]), input_ids[:, 1:])
