"""Gradient all-reduce fusion, and how much of the all-reduce hides behind the backward, between msrun ranks
(notebook 04).

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True \
          grad_fusion.py --config run.yaml --rounds 6 --threads 1

One launch, every rank the same calls in the same order. The model of `--config` (the mini LLaMA in notebook 04)
and one AdamW are built once; three graph-mode training steps (`train_step.build_step`, the step of dp_train.py)
share them and differ only in the gradient reducer:

- "backward only": no reducer, no collective (the ranks' weights drift apart; only the time is used);
- "per-tensor": `nn.DistributedGradReducer(params, mean=True, fusion_type=0)`: one AllReduce per parameter;
- "fused": `--fusion context` (default): `nn.DistributedGradReducer(params, mean=True)` compiled after
  `ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": --bucket-mb}})`, MindSpore's
  own fusion pass (in DATA_PARALLEL, MindSpore 2.9 reads the config in units of 262144 bytes,
  `kDefaultThresholdMb2Byte` in its communication_op_fusion.cc, so 32 is an 8 MiB threshold);
  `--fusion bucket`: the gradients flattened into buckets of at most `--bucket-mb` MiB (in parameter order; a
  tensor larger than a bucket is a bucket of its own), one AllReduce per bucket, split back.

The per-tensor graphs (and, counted only, the default `DistributedGradReducer`) compile before the fusion setting,
which applies to every graph compiled after it. "backward only (A/A)" and "per-tensor (A/A)" call the same graphs
a second time in each round: the A/A controls. Beside the steps, the gradient sync alone: the per-tensor and fused
reducers compiled on their own and applied to a fixed tuple of tensors with the gradients' shapes.

Per round, in rotated order, each candidate runs `--block` steps (`--sync-block` sync calls), after one untimed
call per graph before the first round; each call is synchronised with `.asnumpy()` and preceded by a 4-byte
all-reduce barrier; the round's value is the median of its block. Then the all-reduce alone at `--sizes` (one
graph per size, compiled first; `--fit-rounds` sweeps over the sizes, `--fit-repeats` calls per size in each): the
rows an alpha-beta fit (`collectives.fit_alpha_beta`) takes, in the same launch, mode and threads as the steps, each
size's time its fastest sweep as `collectives.measure_collectives` gives it (the sync it is held against is read at
its fastest round too).

With MS_DEV_SAVE_GRAPHS_PATH set (`compiling.ir_dump_env(dir)` in msrun's env), each graph's final actor-set IR
is moved, once compiled, to <that dir>/by_graph/rank_<r>/<name>/ and its AllReduce kernels are counted
(`compiling.count_kernels`): whether a setting changed the number of all-reduces the CPU launches.
`merge_ranks` (launcher side) turns the ranks' results into one record: the slowest rank per round.
Runs in notebooks/04_data_parallel.ipynb.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from pathlib import Path

STEPS = ("backward only", "backward only (A/A)", "per-tensor", "per-tensor (A/A)", "fused")
SYNCS = ("sync per-tensor", "sync fused", "sync per-tensor (A/A)")
FUSIONS = ("bucket", "context")
DEFAULT_FIT_SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


def parse_args(argv=None) -> argparse.Namespace:
    """The worker's command line, checked: a bad value raises one ValueError naming the flag and the fix
    (before MindSpore is imported, so the refusal is immediate)."""
    p = argparse.ArgumentParser(prog="grad_fusion.py")
    p.add_argument("--config", required=True, help="RunConfig YAML (global batch_size, divided among the ranks)")
    p.add_argument("--rounds", type=int, default=6, help="alternated rounds (>= 2: the A/A control pairs rounds)")
    p.add_argument("--block", type=int, default=2, help="steps per step candidate per round (their median counts)")
    p.add_argument("--sync-block", type=int, default=4, help="calls per sync candidate per round")
    p.add_argument("--fusion", default="context", help="how 'fused' fuses: bucket (explicit) or context (comm_fusion)")
    p.add_argument("--bucket-mb", type=float, default=32.0, help="bucket size in MiB (comm_fusion 'size' config)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_FIT_SIZES)), help="all-reduce sizes (bytes) to fit")
    p.add_argument("--fit-repeats", type=int, default=3, help="timed calls per fit size in each sweep")
    p.add_argument("--fit-rounds", type=int, default=3, help="sweeps over the fit sizes (a size's time: its fastest)")
    p.add_argument("--threads", type=int, default=0, help="CPU kernel threads per rank (0: MindSpore's default)")
    p.add_argument("--device", default="CPU", help="CPU (the cookbook's machine) or Ascend (8 devices: HCCL)")
    a = p.parse_args(argv)
    for name, v, low in (("--rounds", a.rounds, 2), ("--block", a.block, 1), ("--sync-block", a.sync_block, 1),
                         ("--fit-repeats", a.fit_repeats, 1), ("--fit-rounds", a.fit_rounds, 1),
                         ("--threads", a.threads, 0)):
        if v < low:
            raise ValueError(f"grad_fusion: {name}={v} is invalid; fix: pass an integer >= {low}")
    if a.device not in ("CPU", "Ascend", "GPU"):
        raise ValueError(f"grad_fusion: --device={a.device!r} is unknown; fix: use CPU, Ascend or GPU")
    if a.fusion not in FUSIONS:
        raise ValueError(f"grad_fusion: --fusion={a.fusion!r} is unknown; fix: use one of {list(FUSIONS)}")
    if not (math.isfinite(a.bucket_mb) and a.bucket_mb > 0):
        raise ValueError(f"grad_fusion: --bucket-mb={a.bucket_mb} is invalid; fix: pass a size in MiB > 0, e.g. 32")
    if a.fusion == "context" and a.bucket_mb != int(a.bucket_mb):
        raise ValueError(f"grad_fusion: --bucket-mb={a.bucket_mb} with --fusion context is invalid; fix: pass a whole "
                         "number (comm_fusion's 'size' config is an integer)")
    try:
        a.sizes = [int(s) for s in str(a.sizes).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"grad_fusion: --sizes={a.sizes!r} is invalid; fix: comma-separated byte counts, "
                         "e.g. 4096,1048576,16777216") from None
    if len(set(a.sizes)) < 2 or min(a.sizes) < 4:
        raise ValueError(f"grad_fusion: --sizes={a.sizes} is invalid; fix: at least 2 distinct sizes of >= 4 bytes "
                         "(an alpha-beta fit needs two)")
    return a


def bucket_plan(nbytes: list[int], bucket_bytes: float) -> list[list[int]]:
    """Tensor indices per bucket: consecutive tensors while the bucket stays within `bucket_bytes`; a tensor
    larger than a bucket gets one of its own.

        >>> bucket_plan([4, 4, 8, 20, 4], 12)
        [[0, 1], [2], [3], [4]]
    """
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_plan: bucket_bytes={bucket_bytes!r} is invalid; fix: pass bytes > 0")
    buckets, cur, used = [], [], 0
    for i, b in enumerate(nbytes):
        if cur and used + b > bucket_bytes:
            buckets.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += b
    if cur:
        buckets.append(cur)
    return buckets


def rotated(names, r: int) -> list:
    """Round r's order: the candidates rotated by r, so each takes every position in turn."""
    names = list(names)
    k = r % len(names)
    return names[k:] + names[:k]


def merge_ranks(results: list[dict]) -> dict:
    """One record from every rank's result: per candidate and round the slowest rank's value (a synchronised
    step ends when the last rank ends); the fit rows as `measure_collectives` gives them (`collectives.merge_rank_rows`:
    per sweep the slowest rank's median, the fastest sweep as `seconds`, min and max over all calls); kernels, tensors
    and buckets from rank 0 (the same graph on every rank)."""
    from mshelpers.collectives import merge_rank_rows

    results = [r for r in results if r]
    if not results:
        raise ValueError("merge_ranks: no rank wrote a result; fix: read the workers' logs")
    r0 = results[0]
    times = {name: [max(r["times"][name][i] for r in results) for i in range(len(r0["times"][name]))]
             for name in r0["times"]}
    api = "ops.AllReduce (graph mode, one per graph)"
    fit_rows = merge_rank_rows([[{"op": "all_reduce", "api": api, **row} for row in r["fit_rows"]] for r in results])
    keep = ("phases_s", "first_call_s", "world", "n_tensors", "grad_bytes", "tensor_bytes", "buckets", "fusion",
            "bucket_mb", "rounds", "block", "sync_block", "kernels", "ir_files", "losses", "threads")
    return {**{k: r0.get(k) for k in keep}, "times": times, "fit_rows": fit_rows,
            "ranks": len(results), "orders": r0["orders"]}


def _build(cfg, fusion: str, bucket_mb: float, world: int):
    """The model, its optimizer, the reducers and the Cells timed (see the module docstring)."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn, ops

    from mshelpers.model import build_model
    from mshelpers.train import make_optimizer
    from mshelpers.train_step import build_step

    ms.set_seed(cfg.seed)
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    params = opt.parameters
    shapes = [tuple(p.shape) for p in params]
    sizes = [int(np.prod(s)) if s else 1 for s in shapes]
    nbytes = [n * 4 for n in sizes]                                  # float32 gradients (the reducer casts to fp32)
    plan = bucket_plan(nbytes, bucket_mb * 2**20)

    class BucketReducer(nn.Cell):
        """Flatten-and-one-AllReduce per bucket, then the mean, split back into the gradients' shapes."""
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.allreduce = ops.AllReduce()                  # no fusion attribute: the pass leaves it alone
            self.inv = ms.Tensor(1.0 / world, ms.float32)
            self.plan = tuple(tuple(b) for b in plan)
            self.shapes, self.sizes = tuple(shapes), tuple(sizes)

        def construct(self, grads):
            out = ()
            for bucket in self.plan:
                flat = ()
                for i in bucket:
                    flat = flat + (ops.reshape(grads[i].astype(ms.float32), (-1,)),)
                red = self.allreduce(ops.concat(flat)) * self.inv
                off = 0
                for i in bucket:
                    out = out + (ops.reshape(red[off:off + self.sizes[i]], self.shapes[i]).astype(grads[i].dtype),)
                    off = off + self.sizes[i]
            return out

    def per_tensor():
        return nn.DistributedGradReducer(params, mean=True, fusion_type=0)

    def fused():
        if fusion == "bucket":
            return BucketReducer()
        return nn.DistributedGradReducer(params, mean=True)         # every AllReduce marked fusion 1

    return net, opt, params, shapes, nbytes, plan, per_tensor, fused, build_step


class _IR:
    """After each graph's first call, move its final actor-set IR to <dump>/by_graph/rank_<r>/<name>/ and count its
    kernels (MindSpore writes <dump>/rank_<r>/actor_set/ under msrun)."""
    def __init__(self, rank: int):
        root = os.environ.get("MS_DEV_SAVE_GRAPHS_PATH")
        self.root = Path(root) if root and os.environ.get("MS_DEV_SAVE_GRAPHS") else None
        self.rank, self.kernels, self.files = rank, {}, {}
        if self.root is not None:
            self.out = self.root / "by_graph" / f"rank_{rank}"
            shutil.rmtree(self.out, ignore_errors=True)
            for d in (self.root / f"rank_{rank}" / "actor_set", self.root / "actor_set"):   # an earlier run's
                shutil.rmtree(d, ignore_errors=True)

    def take(self, name: str) -> None:
        if self.root is None:
            return
        from mshelpers.compiling import count_kernels
        found = [p for d in (self.root / f"rank_{self.rank}" / "actor_set", self.root / "actor_set") if d.is_dir()
                 for p in d.glob("final_actor_set_kernel_graph_*.ir")]
        dest = self.out / "".join(c if c.isalnum() else "_" for c in name) / "actor_set"
        dest.mkdir(parents=True, exist_ok=True)
        for p in found:
            shutil.move(str(p), dest / p.name)
        if found:
            c = count_kernels(dest.parent)
            self.kernels[name] = {"all_reduce": sum(n for t, n in c["by_type"].items() if "AllReduce" in t),
                                  "kernels": c["kernels"]}
            self.files[name] = [p.name for p in found]
        else:
            self.kernels[name] = None


def main(argv=None) -> None:
    args = parse_args(argv)

    import mindspore as ms
    if args.threads and args.device == "CPU":   # ranks sharing one CPU: split the cores instead of oversubscribing them
        from mindspore.device_context.cpu.op_tuning import threads_num
        threads_num(args.threads)
    import numpy as np
    from mindspore import nn, ops
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_device(args.device)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    init()   # the msrun scheduler process runs this file too and stops inside init()

    from mshelpers.config import RunConfig
    from mshelpers.data import numpy_batches
    from mshelpers.launch import report_progress, write_rank_result

    cfg = RunConfig.from_yaml(args.config)
    # the optimizer's learning-rate table and the batches cover every step called (3 warm-up + the rounds')
    cfg = cfg.replace(steps=max(cfg.steps, 3 + args.rounds * args.block * len(STEPS)))
    rank, world = get_rank(), get_group_size()
    net, opt, params, shapes, nbytes, plan, per_tensor, fused, build_step = _build(cfg, args.fusion,
                                                                                  args.bucket_mb, world)
    ir = _IR(rank)

    class Barrier(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ar = ops.AllReduce()

        def construct(self, x):
            return self.ar(x)

    barrier_cell, one = Barrier(), ms.Tensor(np.ones((1,), np.float32))

    def barrier():
        barrier_cell(one).asnumpy()

    barrier()
    ir.take("barrier")

    clip = float(cfg.grad_clip)

    class Sync(nn.Cell):
        def __init__(self, reducer):
            super().__init__(auto_prefix=False)
            self.reducer = reducer

        def construct(self, *grads):
            return self.reducer(grads)

    grads = [ms.Tensor(np.full(s, 1e-3, np.float32)) for s in shapes]
    steps = {"backward only": build_step(net, opt, mode="graph", reducer=None, clip=clip),
             "per-tensor": build_step(net, opt, mode="graph", reducer=per_tensor(), clip=clip)}
    steps["backward only (A/A)"] = steps["backward only"]    # the same graphs, timed a second time each round:
    steps["per-tensor (A/A)"] = steps["per-tensor"]          # the A/A controls
    syncs = {"sync per-tensor": Sync(per_tensor())}
    syncs["sync per-tensor (A/A)"] = syncs["sync per-tensor"]
    default_sync = Sync(nn.DistributedGradReducer(params, mean=True))   # dp_train's reducer: every AllReduce fusion 1
    batches = numpy_batches(cfg, num_shards=world, shard_id=rank)
    losses = []

    def call(name):
        if name in steps:
            loss, _, _ = steps[name](ms.Tensor(next(batches), ms.int32))
            v = float(loss.asnumpy())
            losses.append(v)
        else:
            out = syncs[name](*grads)
            out[-1].asnumpy()
            out[0].asnumpy()

    names = list(STEPS) + list(SYNCS)
    # one untimed call per graph (its compile), the IR of each taken as it is compiled; the per-tensor graphs
    # and the default reducer's before any fusion setting (a context setting applies to every later compile)
    first_call_s = {}
    t_start = time.perf_counter()

    def first(name):
        barrier()
        t0 = time.perf_counter()
        call(name)
        first_call_s[name] = time.perf_counter() - t0
        ir.take(name)

    for name in ("backward only", "per-tensor", "sync per-tensor"):
        first(name)
    barrier()
    out = default_sync(*grads)
    out[0].asnumpy()
    ir.take("sync DistributedGradReducer default")
    if args.fusion == "context":       # MindSpore's own fusion: buckets by size, read when a graph compiles
        ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": int(args.bucket_mb)}})
    steps["fused"] = build_step(net, opt, mode="graph", reducer=fused(), clip=clip)
    syncs["sync fused"] = Sync(fused())
    for name in ("fused", "sync fused"):
        first(name)
    t_rounds = time.perf_counter()
    total = args.rounds * len(names) + args.fit_rounds * len(args.sizes)
    done = 0
    times = {n: [] for n in names}
    orders = []
    for r in range(args.rounds):
        order = rotated(names, r)
        orders.append(order)
        for name in order:
            block = []
            for _ in range(args.block if name in STEPS else args.sync_block):
                barrier()
                t0 = time.perf_counter()
                call(name)
                block.append(time.perf_counter() - t0)
            times[name].append(float(np.median(block)))
            done += 1
            report_progress(done, total)

    # the all-reduce alone at each size, one graph per size (same mode, threads and launch as the steps)
    class One(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ar = ops.AllReduce()

        def construct(self, x):
            return self.ar(x)

    fit_rows = []
    t_fit = time.perf_counter()
    fit_cells = []
    for nbytes_i in args.sizes:
        n = max(world, (nbytes_i // 4) // world * world)
        x, cell = ms.Tensor(np.ones((n,), np.float32)), One()
        barrier()
        cell(x).asnumpy()                                  # compile + warm-up, untimed
        fit_cells.append((n * 4, x, cell))
    sweeps = [[] for _ in fit_cells]                       # per size, one median per sweep
    for _ in range(args.fit_rounds):                       # sweeps over all sizes: a slow spell hits one sweep
        for k, (_, x, cell) in enumerate(fit_cells):
            ts = []
            for _ in range(args.fit_repeats):
                barrier()
                t0 = time.perf_counter()
                cell(x).asnumpy()
                ts.append(time.perf_counter() - t0)
            sweeps[k].append(ts)
            done += 1
            report_progress(done, total)
    for (nbytes_k, _, _), per in zip(fit_cells, sweeps):
        calls = [t for ts in per for t in ts]
        fit_rows.append({"bytes": nbytes_k, "times_s": calls, "median_s": float(np.median(calls)),
                         "round_medians_s": [float(np.median(ts)) for ts in per]})

    t_end = time.perf_counter()
    # "buckets": the explicit plan's count; with --fusion context the pass decides: read "kernels" (the IR)
    write_rank_result({
        "rank": rank, "world": world, "n_tensors": len(shapes), "grad_bytes": int(sum(nbytes)), "tensor_bytes": nbytes,
        "buckets": len(plan) if args.fusion == "bucket" else None, "fusion": args.fusion, "bucket_mb": args.bucket_mb,
        "rounds": args.rounds, "block": args.block, "sync_block": args.sync_block, "threads": args.threads,
        "times": times, "orders": orders, "fit_rows": fit_rows, "kernels": ir.kernels, "ir_files": ir.files,
        "losses": losses, "first_call_s": first_call_s,
        "phases_s": {"compile": t_rounds - t_start, "rounds": t_fit - t_rounds, "fit": t_end - t_fit}})


if __name__ == "__main__":
    main()
