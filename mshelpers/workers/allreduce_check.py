"""The smallest msrun job: every rank all-reduces (rank + 1) and reports what it got.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True allreduce_check.py

`--fail-rank R` makes rank R exit with an error before joining the cluster, to show how
mshelpers.launch.msrun reports a failed rank.
Runs in notebooks/04_data_parallel.ipynb.
"""
import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
args = parser.parse_args()
# msrun sets RANK_ID before the script starts; failing here happens before any MindSpore import.
if int(os.environ.get("RANK_ID", "-1")) == args.fail_rank and os.environ.get("MS_ROLE") == "MS_WORKER":
    sys.exit(f"ValueError: rank {args.fail_rank} was told to fail (--fail-rank {args.fail_rank})")

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, ops  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

ms.set_device("CPU")
init()   # the scheduler process also runs this script and stops inside init(); code above runs there too
from mshelpers.launch import write_rank_result  # noqa: E402

rank, world = get_rank(), get_group_size()
summed = ops.AllReduce()(Tensor(np.full((4,), rank + 1, np.float32))).asnumpy()
print(f"rank {rank}/{world}: all-reduce of rank+1 = {summed[0]}", flush=True)
write_rank_result({"rank": rank, "world": world, "allreduce_sum": float(summed[0]), "pid": os.getpid(),
                   "retry_interval_s": [os.environ.get(k) for k in ("MS_RETRY_INTERVAL_LOWER", "MS_RETRY_INTERVAL_UPPER")]})
