"""Per-rank step times of a 2-rank data-parallel run, clean and with one rank slowed (notebook 08).

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True \
          straggler_steps.py --preset tiny --steps 12 --slow-rank 1 --slow-factor 2

Each step is timed in two parts on every rank, both synchronised with `.asnumpy()`:
  compute_s  forward + backward of this rank's shard (`train_step.build_grads`, jitted): the rank's own work;
  compute_cpu_s  the same span in CPU seconds of this process (`time.process_time`, all its threads): the
             rank's own work without the time the OS gave to other processes, which on a shared CPU host
             (2 ranks and everything else on 2 cores) moves a short step's wall time by tens of percent;
  sync_s     gradient all-reduce (`nn.DistributedGradReducer`, averaged) + AdamW update: it ends
             when the slowest rank has sent its gradients, so a fast rank waits here for a slow one.
step_s = compute_s + sync_s. In synchronous data parallelism every rank's step_s follows the
slowest rank, so step_s alone cannot say which rank is slow; compute_s can.
Two phases share one launch: "clean", then "slowed", where `--slow-rank` runs its forward and
backward `--slow-factor` times per step (a device that is that many times slower; only the last
gradients are used, so training is unchanged). The first `--warmup` steps of each phase (compile)
are left out of the result.
Runs in notebooks/08_profiling.ipynb.
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=12, help="timed steps per phase")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per phase (compile)")
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-factor", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    args = p.parse_args()

    import mindspore as ms
    from mindspore import nn
    from mindspore.device_context.cpu.op_tuning import threads_num
    threads_num(args.threads)
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    init()   # the msrun scheduler process runs this file too and stops inside init()

    from mshelpers.config import RunConfig
    from mshelpers.data import numpy_batches
    from mshelpers.launch import report_progress, write_rank_result
    from mshelpers.model import build_model
    from mshelpers.train import make_optimizer
    from mshelpers.train_step import build_grads

    rank, world = get_rank(), get_group_size()
    cfg = RunConfig.preset(args.preset).replace(mode="graph", steps=2 * (args.steps + args.warmup))
    ms.set_seed(cfg.seed)
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    params = opt.parameters
    reducer = nn.DistributedGradReducer(params, mean=True)
    compute = ms.jit(build_grads(net, params))     # the step's gradients, timed apart from its all-reduce

    @ms.jit
    def sync(grads):                               # not build_step's update: its norm and overflow check would
        opt(reducer(grads))                        # be timed as communication
        return grads[0].sum()

    batches = numpy_batches(cfg, num_shards=world, shard_id=rank)
    total = 2 * (args.steps + args.warmup)
    out = {"rank": rank, "world": world, "preset": args.preset, "slow_rank": args.slow_rank,
           "slow_factor": args.slow_factor, "phases": {}}
    done = 0
    for phase in ("clean", "slowed"):
        repeat = args.slow_factor if phase == "slowed" and rank == args.slow_rank else 1
        rows = {"compute_s": [], "compute_cpu_s": [], "sync_s": [], "step_s": [], "loss": []}
        for i in range(args.warmup + args.steps):
            x = ms.Tensor(next(batches), ms.int32)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(repeat):
                loss, grads = compute(x)
                loss.asnumpy()
            t1, c1 = time.perf_counter(), time.process_time()
            sync(grads).asnumpy()
            ms.runtime.synchronize()   # the update too: its value is not what .asnumpy() waited for, and an update
            t2 = time.perf_counter()   # still running would be counted in the next step's compute
            if i >= args.warmup:
                rows["compute_s"].append(t1 - t0)
                rows["compute_cpu_s"].append(c1 - c0)
                rows["sync_s"].append(t2 - t1)
                rows["step_s"].append(t2 - t0)
                rows["loss"].append(float(loss.asnumpy()))
            done += 1
            report_progress(done, total)
        out["phases"][phase] = rows
    write_rank_result(out)


if __name__ == "__main__":
    main()
