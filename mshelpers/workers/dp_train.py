"""Data-parallel training of the mini LLaMA, one process per rank (notebook 04).

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True \
          dp_train.py --config run.yaml --runs sharded,unsharded

Each run builds the model with the same seed on every rank (identical initial weights),
reads its data shard (`numpy_batches(cfg, num_shards=world, shard_id=rank)`; the
"unsharded" run reproduces the seeds' bug: every rank reads the same rows), averages the
gradients over ranks with `nn.DistributedGradReducer` (gradients_mean=True), clips by
the global norm of the averaged gradients and steps AdamW. Several runs share one msrun
launch to pay the startup once. `train_dp` also runs in a plain process (world = 1): the
single-process baseline with the same step code.
Runs in notebooks/04_data_parallel.ipynb.
"""
from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np


def window_id(row: np.ndarray) -> str:
    """A short stable id of one training window (its token bytes), for shard checks."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.int32).tobytes(), digest_size=8).hexdigest()


def make_dp_step(net, opt, reducer, clip: float):
    """The DP worker's step: `train_step.build_step` as a Cell (value_and_grad, the reducer's all-reduce mean,
    the norm in float32, clip by global norm, AdamW), the step train() builds, without loss scaling.
    step(input_ids) -> (loss, grad_norm, finite). Taught in notebooks/04_data_parallel.ipynb."""
    from mshelpers.train_step import build_step
    return build_step(net, opt, mode="graph", reducer=reducer, clip=clip)


def train_dp(cfg, steps: int, *, world: int = 1, rank: int = 0, shard: bool = True, eval_windows: int = 16,
             progress=None) -> dict:
    """Train cfg for `steps` steps on this rank; return losses, step times, window ids, eval loss, and the
    flat parameters before step 1 ("init_params") and after the last step ("params")."""
    import mindspore as ms
    from mindspore import nn

    from mshelpers.data import numpy_batches, windows
    from mshelpers.model import build_model
    from mshelpers.train import make_optimizer

    cfg = cfg.replace(steps=max(cfg.steps, steps))
    ms.set_seed(cfg.seed)                      # same seed on every rank: identical initial weights
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    params = opt.parameters
    reducer = nn.DistributedGradReducer(params, mean=True) if world > 1 else None
    # The step is a Cell, not an `ms.jit` function: with MindSpore 2.9's compile cache
    # (MS_COMPILER_CACHE_ENABLE=1), a warm start of a jitted *function* lost its parameters (they read
    # as zeros: step-1 loss exactly ln(vocab), gradient norm 0, NaN from step 2 under DATA_PARALLEL),
    # while a Cell, whose parameters are graph inputs, trained identically cold and warm
    # (tests/test_train.py measures both).
    step = make_dp_step(net, opt, reducer, float(cfg.grad_clip))

    init_flat = np.concatenate([p.asnumpy().ravel() for p in params])   # the weights before step 1
    init_sum = float(np.abs(init_flat).sum())

    if shard:
        batches = numpy_batches(cfg, num_shards=world, shard_id=rank)
    else:   # the bug: no num_shards/shard_id, so every rank reads the same first rows
        batches = numpy_batches(cfg.replace(batch_size=cfg.batch_size // world), num_shards=1, shard_id=0)
    losses, norms, times, seen = [], [], [], []
    for i in range(steps):
        batch = next(batches)
        seen += [window_id(r) for r in batch]
        t0 = time.perf_counter()
        loss, norm, _ = step(ms.Tensor(batch, ms.int32))
        losses.append(float(loss.asnumpy()))
        times.append(time.perf_counter() - t0)
        norms.append(float(norm.asnumpy()))
        if progress is not None:
            progress(i + 1, steps)
    # held-out windows: the end of the shuffled corpus, never reached by the training steps above
    held = windows(cfg)[-eval_windows:]
    eval_loss = float(np.mean([float(net(ms.Tensor(held[k:k + 4], ms.int32)).asnumpy())
                               for k in range(0, eval_windows, 4)]))
    flat = np.concatenate([p.asnumpy().ravel() for p in params])
    return {"losses": losses, "grad_norms": norms, "step_times": times, "window_ids": seen,
            "eval_loss": eval_loss, "init_abs_sum": init_sum, "init_params": init_flat, "params": flat}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, help="RunConfig YAML (global batch_size)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", default="sharded", help="comma list of: sharded, unsharded")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: MindSpore's default)")
    args = parser.parse_args()

    import mindspore as ms
    if args.threads:   # ranks sharing one CPU: split the cores instead of oversubscribing them
        from mindspore.device_context.cpu.op_tuning import threads_num
        threads_num(args.threads)
    from mindspore import ops
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    init()   # the msrun scheduler process runs this file too and stops inside init()

    from mshelpers.config import RunConfig
    from mshelpers.launch import rank_output_dir, report_progress, write_rank_result

    cfg = RunConfig.from_yaml(args.config)
    rank, world = get_rank(), get_group_size()
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    total = len(runs) * args.steps
    summary = {"rank": rank, "world": world, "runs": {}}
    for k, run in enumerate(runs):
        if run not in ("sharded", "unsharded"):
            raise ValueError(f"dp_train: run {run!r} is unknown; fix: use sharded or unsharded")
        out = train_dp(cfg, args.steps, world=world, rank=rank, shard=run == "sharded",
                       progress=lambda i, n, k=k: report_progress(k * n + i, total))
        np.save(rank_output_dir() / f"params_{run}.npy", out.pop("params"))
        out.pop("init_params")                 # the same on every rank and in one process (same seed)
        summary["runs"][run] = out

    # Seeds per rank: the same global seed gives every rank the same random stream (right for
    # initial weights), so dropout masks or augmentation that should differ need a rank offset.
    ms.set_seed(cfg.seed)
    same = ops.uniform((4,), ms.Tensor(0.0), ms.Tensor(1.0), seed=cfg.seed).asnumpy().tolist()
    ms.set_seed(cfg.seed + 1000 * (rank + 1))
    offset = ops.uniform((4,), ms.Tensor(0.0), ms.Tensor(1.0), seed=cfg.seed + 1000 * (rank + 1)).asnumpy().tolist()
    summary["random_draws"] = {"same_seed": same, "rank_offset_seed": offset}
    write_rank_result(summary)


if __name__ == "__main__":
    main()
