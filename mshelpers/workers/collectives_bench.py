"""Time collectives between the msrun ranks on this machine: one row per (op, message size) and rank.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True collectives_bench.py \
        --sizes 4096,1048576,16777216 --ops all_reduce,all_gather,reduce_scatter,broadcast

Launched by `mshelpers.collectives.measure_collectives`, which merges the ranks' rows. For each op and size:
`--warmup` untimed calls, then `--repeats` timed calls, in each of `--rounds` sweeps over the sizes (each size's
median is over all its calls; `round_medians_s` keeps one per sweep). Before every timed call the ranks meet in an
8-byte AllReduce (not timed, `agree`) that also decides, for all of them at once, whether to make another call, so
they start together and stop together; the timed region is the collective plus
`.asnumpy()` on its output, which waits until the result exists (PyNative launches asynchronously).
An op that fails (e.g. `ops.ReduceScatter` has no CPU kernel) is recorded with its error, not dropped,
and its larger sizes are skipped. That same meeting carries a failure flag, and the ranks meet once more after every
size, so when one rank's call fails (the CPU Broadcast can time out: "CollectiveWait ... failed") all of them
record it and continue in step.

Message size ("bytes") is the full float32 buffer the op is about: the all-reduced tensor, the
gathered output of an all-gather, the input of a reduce-scatter, the broadcast tensor (NCCL-tests'
convention). Each rank reports its own median; the launcher takes the slowest rank's.
Runs in notebooks/04_data_parallel.ipynb.
"""
import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="4096,65536,1048576,16777216", help="message sizes in bytes, comma-separated")
parser.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast")
parser.add_argument("--repeats", type=int, default=7)
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--rounds", type=int, default=1,
                    help="sweep the sizes this many times, --repeats calls per size in each sweep")
parser.add_argument("--max-seconds-per-size", type=float, default=4.0,
                    help="stop repeating a size once its timed calls used this much time (at least 3 repeats)")
parser.add_argument("--threads", type=int, default=0, help="CPU kernel threads per rank (0: MindSpore's default)")
args = parser.parse_args()

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, ops  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
if args.threads:   # ranks sharing one CPU: split the cores instead of oversubscribing them
    from mindspore.device_context.cpu.op_tuning import threads_num
    threads_num(args.threads)
init()   # the msrun scheduler process also runs this file and stops inside init()
from mshelpers.launch import report_progress, write_rank_result  # noqa: E402

rank, world = get_rank(), get_group_size()
sizes = [int(s) for s in args.sizes.split(",") if s]
names = [s for s in args.ops.split(",") if s]
API = {"all_reduce": "ops.AllReduce", "all_gather": "ops.AllGather", "reduce_scatter": "ops.ReduceScatter",
       "broadcast": "ops.Broadcast(root_rank=0)"}
_barrier_op = ops.AllReduce()


class AnotherRankFailed(RuntimeError):
    """Raised on every rank that learns in `agree` that another rank's call failed."""


def agree(go_on, failed=False):
    """The one synchronising collective: a 2-float AllReduce carrying each rank's wish to go on and whether its
    last call failed. Every meeting of the ranks outside the timed calls is this call, so whichever two meet, they
    read the same thing: all ranks stop together on the first rank that has had enough (each times its own calls,
    and alone they stopped at different counts, so the next collective met the wrong one: on CPU, "Memcpy error,
    dest size is 4, src size is 8388608"), and a failure anywhere reaches every rank at its next meeting.
    Returns True when every rank wants another call; raises AnotherRankFailed when some rank failed."""
    flags = np.array([1.0 if go_on else 0.0, 1.0 if failed else 0.0], np.float32)
    total = _barrier_op(Tensor(flags)).asnumpy()
    if total[1] > 0 and not failed:
        raise AnotherRankFailed("another rank failed this size (see its row/log); stopped here to keep the ranks "
                                "in step")
    return bool(total[0] == world)


def barrier():
    agree(True)


def elements(nbytes):
    """float32 elements for a message of `nbytes`, rounded down to a multiple of the ranks (at least one each)."""
    return max(world, (nbytes // 4) // world * world)


def make(op, nbytes):
    """(callable, input) for one op at `nbytes` (see elements())."""
    n = elements(nbytes)
    if op == "all_reduce":
        return ops.AllReduce(), Tensor(np.ones((n,), np.float32))
    if op == "all_gather":
        return ops.AllGather(), Tensor(np.ones((n // world,), np.float32))
    if op == "reduce_scatter":
        return ops.ReduceScatter(), Tensor(np.ones((n,), np.float32))
    if op == "broadcast":
        bc = ops.Broadcast(0)
        return (lambda x: bc((x,))[0]), Tensor(np.full((n,), rank, np.float32))
    raise ValueError(f"collectives_bench: op={op!r} is unknown; fix: use all_reduce, all_gather, reduce_scatter, "
                     "broadcast")


def first_line(e):
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("-")]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:400]


# Run order: broadcast first, ops that fail on this backend last. On CPU (MindSpore 2.9) a Broadcast
# timed after large AllReduce/AllGather calls failed at random sizes ("CollectiveWait ... failed"),
# while Broadcast alone, or first, ran at every size. Rows come back in the requested order.
RUN_ORDER = {"broadcast": 0, "all_reduce": 1, "all_gather": 2, "reduce_scatter": 3}
rows, done, total = [], 0, len(names) * len(sizes) * args.rounds
for op in sorted(names, key=lambda o: RUN_ORDER.get(o, 9)):
    error = None
    op_rows = [{"op": op, "requested_bytes": nbytes, "bytes": elements(nbytes) * 4, "api": API.get(op, op),
                "rank": rank, "world": world, "times_s": [], "round_medians_s": []} for nbytes in sizes]
    fns = {}
    budget = args.max_seconds_per_size / args.rounds        # each round's share of a size's time
    for rnd in range(args.rounds):
        # every round sweeps all sizes once: a spell of contention (a busy neighbour, a scheduler hiccup) lands on
        # a round of every size instead of on all the calls of one size
        for row in op_rows:
            nbytes = row["requested_bytes"]
            if error is None:
                try:
                    if nbytes not in fns:
                        fns[nbytes] = make(op, nbytes)
                        for _ in range(args.warmup):
                            barrier()
                            fns[nbytes][0](fns[nbytes][1]).asnumpy()
                    fn, x = fns[nbytes]
                    times, used = [], 0.0
                    need = -(-3 // args.rounds)                # at least 3 calls per size in all
                    while agree(len(times) < args.repeats and (len(times) < need or used < budget)):
                        t0 = time.perf_counter()
                        fn(x).asnumpy()
                        dt = time.perf_counter() - t0
                        times.append(dt)
                        used += dt
                    row["times_s"] += times
                    row["round_medians_s"].append(float(np.median(times)))
                except AnotherRankFailed as e:
                    error = str(e)
                except Exception as e:   # noqa: BLE001  (an unsupported op is a result here, not a crash)
                    error = first_line(e)
            # After every size, a meeting that carries failure: a rank whose call failed (e.g. a CollectiveWait
            # timeout) tells the others, so all ranks record it and move on together instead of waiting in
            # mismatched collectives; it is the same 2-float call as the others, so it pairs with any of them.
            try:
                agree(False, failed=error is not None)
            except AnotherRankFailed as e:
                error = str(e)
            done += 1
            report_progress(done, total)
    for row in op_rows:
        if error is not None and len(row["round_medians_s"]) < args.rounds:
            row["error"] = error
        elif row["times_s"]:
            row["median_s"] = float(np.median(row["times_s"]))
        rows.append(row)
    print(f"rank {rank}: {op}: " + (f"error {error}" if error else
          ", ".join(f"{r['bytes']}B {r['median_s'] * 1e3:.2f}ms" for r in rows if r["op"] == op)), flush=True)

rows.sort(key=lambda r: (names.index(r["op"]), sizes.index(r["requested_bytes"])))
write_rank_result({"rank": rank, "world": world, "rows": rows, "pid": os.getpid()})
