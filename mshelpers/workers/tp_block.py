"""A LLaMA block split by hand over the msrun ranks (Megatron-style tensor parallelism), checked against one device.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True tp_block.py

Every rank builds the same full weights (same seed), keeps its slice, and runs:
- attention: wq, wk, wv split by columns (whole heads per rank), wo split by rows,
  then one AllReduce of the b·s·h partial output;
- MLP (SwiGLU): w1, w3 split by columns, w2 by rows, then one AllReduce;
- output layer: W_out split by columns (vocab), logits put together with AllGather;
- a "naive" MLP for comparison: split w1, w3 by columns, AllGather the b·s·ffn activation,
  then the full w2 — correct too, but it moves the wide ffn activation instead of b·s·h.
It compares the outputs and the weight gradients with the unsplit block on the same
rank, once with plain ops.AllReduce/AllGather and once with Megatron's f/g operators
(identity forward + all-reduce backward, and the reverse), and logs every collective's
bytes. Results go to write_rank_result (see mshelpers.launch).

Under semi_auto_parallel the same split comes from shard strategies, e.g. for x @ W with
x: (b·s, h) and mp = 2: column split `MatMul().shard(((dp, 1), (1, mp)))`, row split
`MatMul().shard(((dp, mp), (mp, 1)))`; MindSpore then inserts the AllReduce itself.
Runs in notebooks/05_semi_auto_parallel.ipynb.
"""
import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--ffn", type=int, default=172)
parser.add_argument("--vocab", type=int, default=256)
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--seq", type=int, default=16)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, nn, ops  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
init()   # the msrun scheduler process runs this file too and stops inside init()
from mshelpers.launch import write_rank_result  # noqa: E402

rank, tp = get_rank(), get_group_size()
h, a, ffn, vocab, b, s = args.hidden, args.heads, args.ffn, args.vocab, args.batch, args.seq
if a % tp or ffn % tp or vocab % tp:
    raise ValueError(f"tp_block: heads={a}, ffn={ffn}, vocab={vocab} must all be divisible by the {tp} ranks")
hd = h // a
COMM_LOG = []   # (op, direction, shape, bytes of the tensor handed to the collective)


def _log(op, direction, t):
    COMM_LOG.append((op, direction, tuple(t.shape), int(t.size) * t.itemsize))


# ---------------------------------------------------------------- weights: same full copy on every rank
rng = np.random.default_rng(args.seed)
full = {"wq": rng.normal(0, 0.02, (h, h)), "wk": rng.normal(0, 0.02, (h, h)), "wv": rng.normal(0, 0.02, (h, h)),
        "wo": rng.normal(0, 0.02, (h, h)), "w1": rng.normal(0, 0.02, (h, ffn)), "w3": rng.normal(0, 0.02, (h, ffn)),
        "w2": rng.normal(0, 0.02, (ffn, h)), "wout": rng.normal(0, 0.02, (h, vocab)),
        "n1": 1 + rng.normal(0, 0.1, h), "n2": 1 + rng.normal(0, 0.1, h), "nf": 1 + rng.normal(0, 0.1, h)}
full = {k: v.astype(np.float32) for k, v in full.items()}
x_np = rng.normal(0, 1, (b, s, h)).astype(np.float32)
probe_np = rng.normal(0, 1, (b, s, vocab)).astype(np.float32)   # loss = mean(logits * probe): a fixed linear read-out


def col(w, parts, i):   # columns of rank i
    n = w.shape[1] // parts
    return w[:, i * n:(i + 1) * n]


def row(w, parts, i):   # rows of rank i
    n = w.shape[0] // parts
    return w[i * n:(i + 1) * n, :]


heads_local = a // tp
local = {"wq": col(full["wq"], tp, rank), "wk": col(full["wk"], tp, rank), "wv": col(full["wv"], tp, rank),
         "wo": row(full["wo"], tp, rank), "w1": col(full["w1"], tp, rank), "w3": col(full["w3"], tp, rank),
         "w2": row(full["w2"], tp, rank), "wout": col(full["wout"], tp, rank),
         "n1": full["n1"], "n2": full["n2"], "nf": full["nf"]}
CAUSAL = Tensor(np.triu(np.full((s, s), -1e9, np.float32), k=1))


# ---------------------------------------------------------------- the block, written once for any head count
def rmsnorm(x, w):
    return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + 1e-6) * w


def attention_heads(x, wq, wk, wv, n_heads):
    q = ops.matmul(x, wq).reshape(b, s, n_heads, hd).transpose(0, 2, 1, 3)
    k = ops.matmul(x, wk).reshape(b, s, n_heads, hd).transpose(0, 2, 1, 3)
    v = ops.matmul(x, wv).reshape(b, s, n_heads, hd).transpose(0, 2, 1, 3)
    p = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) / float(np.sqrt(hd)) + CAUSAL, -1)
    return ops.matmul(p, v).transpose(0, 2, 1, 3).reshape(b, s, n_heads * hd)


class Plain(nn.Cell):
    """Collectives with MindSpore's own backward: AllReduce's gradient is another AllReduce."""
    def __init__(self):
        super().__init__()
        self.all_reduce, self.all_gather = ops.AllReduce(), ops.AllGather()

    def copy_in(self, x):
        return x

    def reduce_out(self, x):
        _log("AllReduce", "forward", x)
        return self.all_reduce(x)


class CopyToTP(nn.Cell):
    """Megatron's f: identity forward; backward sums the input gradient over the tp ranks."""
    def __init__(self):
        super().__init__()
        self.all_reduce = ops.AllReduce()

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        _log("AllReduce", "backward", dout)
        return (self.all_reduce(dout),)


class ReduceFromTP(nn.Cell):
    """Megatron's g: all-reduce forward; identity backward (the loss is the same on every rank)."""
    def __init__(self):
        super().__init__()
        self.all_reduce = ops.AllReduce()

    def construct(self, x):
        _log("AllReduce", "forward", x)
        return self.all_reduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class GatherVocab(nn.Cell):
    """AllGather of column-split logits (concatenates along axis 0, hence the transposes); backward keeps own slice."""
    def __init__(self, megatron):
        super().__init__()
        self.all_gather, self.all_reduce, self.megatron = ops.AllGather(), ops.AllReduce(), megatron

    def construct(self, x):   # x: (b·s, V/tp) -> (b·s, V)
        _log("AllGather", "forward", x)
        return self.all_gather(x.T).reshape(tp * x.shape[1], x.shape[0]).T

    def bprop(self, x, out, dout):
        n = x.shape[1]
        if not self.megatron:
            # AllGather's own gradient is a ReduceScatter (sum over ranks), which CPU lacks:
            # the same sum-then-slice, done as AllReduce plus a slice
            dout = self.all_reduce(dout)
        return (dout[:, rank * n:(rank + 1) * n],)


class TPBlock(nn.Cell):
    def __init__(self, weights, parts, megatron, naive_mlp=False):
        super().__init__()
        self.p = {k: ms.Parameter(Tensor(v), name=k) for k, v in weights.items()}
        for k, v in self.p.items():
            setattr(self, "w_" + k, v)
        self.parts, self.megatron, self.naive_mlp = parts, megatron, naive_mlp
        self.f1, self.f2, self.f3 = CopyToTP(), CopyToTP(), CopyToTP()
        self.g1, self.g2 = ReduceFromTP(), ReduceFromTP()
        self.plain = Plain()
        self.gather = GatherVocab(megatron)
        self.mlp_gather = ops.AllGather()

    def _in(self, f, x):
        return f(x) if (self.parts > 1 and self.megatron) else x

    def _out(self, g, x):
        if self.parts == 1:
            return x
        return g(x) if self.megatron else self.plain.reduce_out(x)

    def construct(self, x):
        p = self.p
        n1 = self._in(self.f1, rmsnorm(x, p["n1"]))
        attn = attention_heads(n1, p["wq"], p["wk"], p["wv"], a // self.parts)
        x = x + self._out(self.g1, ops.matmul(attn, p["wo"]))
        n2 = self._in(self.f2, rmsnorm(x, p["n2"]))
        act = ops.silu(ops.matmul(n2, p["w1"])) * ops.matmul(n2, p["w3"])
        if self.naive_mlp and self.parts > 1:   # gather the b·s·ffn activation, then multiply by the full w2
            flat = act.reshape(b * s, -1)
            _log("AllGather", "forward", flat)
            act = self.mlp_gather(flat.T).reshape(ffn, b * s).T.reshape(b, s, ffn)
            x = x + ops.matmul(act, Tensor(full["w2"]))
        else:
            x = x + self._out(self.g2, ops.matmul(act, p["w2"]))
        nf = self._in(self.f3, rmsnorm(x, p["nf"])).reshape(b * s, h)
        logits = ops.matmul(nf, p["wout"])
        if self.parts > 1:
            logits = self.gather(logits)
        return x, logits.reshape(b, s, vocab)


x = Tensor(x_np)
probe = Tensor(probe_np)


def run(block, with_grads=True):
    out, logits = block(x)
    if not with_grads:
        return out.asnumpy(), logits.asnumpy(), {}
    loss_fn = lambda xx: ops.mean(block(xx)[1] * probe)
    grads = ms.grad(loss_fn, grad_position=None, weights=block.trainable_params())(x)
    return out.asnumpy(), logits.asnumpy(), {p.name: g.asnumpy() for p, g in zip(block.trainable_params(), grads)}


def shard_of(name, g_full):
    if name in ("wq", "wk", "wv", "w1", "w3", "wout"):
        return col(g_full, tp, rank)
    if name in ("wo", "w2"):
        return row(g_full, tp, rank)
    return g_full   # norms are replicated


t0 = time.perf_counter()
ref_out, ref_logits, ref_grads = run(TPBlock(full, 1, megatron=True))
t_ref = time.perf_counter() - t0
results = {"rank": rank, "tp": tp, "dims": dict(hidden=h, heads=a, ffn=ffn, vocab=vocab, batch=b, seq=s),
           "single_device_s": t_ref}
for label, megatron in (("plain_ops", False), ("megatron_f_g", True)):
    COMM_LOG.clear()
    t0 = time.perf_counter()
    out, logits, grads = run(TPBlock(local, tp, megatron=megatron))
    results[label] = {
        "wall_s": time.perf_counter() - t0,
        "max_abs_err_block_out": float(np.abs(out - ref_out).max()),
        "max_abs_err_logits": float(np.abs(logits - ref_logits).max()),
        "max_rel_err_grad": {k: float(np.abs(g - shard_of(k, ref_grads[k])).max()
                                      / (np.abs(shard_of(k, ref_grads[k])).max() + 1e-30)) for k, g in grads.items()},
        "grad_ratio_wq": float(np.abs(grads["wq"]).sum() / np.abs(shard_of("wq", ref_grads["wq"])).sum()),
    }
    # the first forward pass alone (run() also re-runs it inside ms.grad)
    fwd = [c for c in COMM_LOG if c[1] == "forward"]
    n_fwd = len(fwd) // 2
    results[label]["collectives_one_forward"] = [list(map(str, c[:2])) + [list(c[2]), c[3]] for c in fwd[:n_fwd]]
    results[label]["backward_allreduces"] = [c[3] for c in COMM_LOG if c[1] == "backward"]

COMM_LOG.clear()
out_naive, logits_naive, _ = run(TPBlock(local, tp, megatron=True, naive_mlp=True), with_grads=False)
results["naive_mlp"] = {"max_abs_err_block_out": float(np.abs(out_naive - ref_out).max()),
                        "collectives_one_forward": [list(map(str, c[:2])) + [list(c[2]), c[3]] for c in COMM_LOG]}
results["pid"] = os.getpid()
print({k: results[k] for k in ("rank", "tp")}, "errors:",
      results["megatron_f_g"]["max_abs_err_block_out"], results["megatron_f_g"]["max_abs_err_logits"], flush=True)
write_rank_result(results)
