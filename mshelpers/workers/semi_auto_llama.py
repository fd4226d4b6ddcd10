"""LLaMA under semi-auto parallel with a planner-chosen layout: the Ascend path of notebook 05.

    msrun --worker_num=32 --local_worker_num=8 --master_addr=<node0> --master_port=8118 --node_rank=<k> \
          --log_dir=msrun_log --join=True semi_auto_llama.py --layout train.yaml --steps 20

`train.yaml` is the mindformers training YAML written by `mshelpers.mindformers_yaml.mindformers_yaml` (and
checked by `validate_mindformers_yaml`): `parallel_config` (data_parallel, model_parallel,
pipeline_stage, micro_batch_num), `runner_config` (batch_size = sequences per micro-batch per dp
rank, gradient_accumulation_steps), `parallel` (enable_parallel_optimizer) and `model.model_config`.

Batch bookkeeping, the same as mindformers': m micro-batches per step, `micro_batch_num` when
pipeline_stage > 1 and `gradient_accumulation_steps` otherwise; global batch = batch_size × dp × m.
With full_batch every rank feeds the whole global batch (global_batch, seq+1); the micro-batch wrapper
(`mindspore.parallel.nn.Pipeline` for pp > 1, `GradAccumulation` for pp = 1 and m > 1) cuts it into m
micro-batches of global_batch/m rows, and the shard strategies give each dp rank batch_size of them.

On Ascend/GPU (the primary form, MindSpore >= 2.5): the train cell goes through
`mindspore.parallel.auto_parallel.AutoParallel(net, parallel_mode="semi_auto")`, with `.pipeline(...)`
for pp > 1 and `.hsdp(...)` (the parallel optimizer: optimizer_level "level1" shards the optimizer
states over dp, ZeRO-1) when the YAML enables it. The legacy equivalent,
`mindspore.set_auto_parallel_context(parallel_mode="semi_auto_parallel", enable_parallel_optimizer=...,
pipeline_stages=...)`, is what `mshelpers.mindformers_yaml.auto_parallel_context` returns; MindSpore 2.9's
docstring says that function will be removed.

On CPU (`--cpu-check`), MindSpore refuses semi-auto parallel. The worker then shows that refusal
(AutoParallel on the same train cell) and runs what CPU can run of the same layout: data parallel
(legacy DATA_PARALLEL context, since AutoParallel has no data-parallel mode) with the YAML's
micro-batches accumulated by `mshelpers.train_step` (the step every notebook trains with, op by op here),
checks the accumulated gradient against one pass over the rank's whole slice, takes `--steps` steps on one
global batch (so its loss must fall) and writes per-rank results (shapes, losses, weights checksum).
Runs in notebooks/05_semi_auto_parallel.ipynb.
"""
import argparse
import time

import yaml

parser = argparse.ArgumentParser()
parser.add_argument("--layout", required=True, help="mindformers YAML from mshelpers.mindformers_yaml.mindformers_yaml")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--cpu-check", action="store_true", help="CPU: show the semi_auto refusal, then data parallel")
args = parser.parse_args()
spec = yaml.safe_load(open(args.layout))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

from mshelpers.device import DeviceUnavailable, require  # noqa: E402

pc_dict, rc = spec["parallel_config"], spec["runner_config"]
mc = {k: v for k, v in spec["model"]["model_config"].items() if k != "type"}
dp, mp, pp = pc_dict["data_parallel"], pc_dict["model_parallel"], pc_dict["pipeline_stage"]
m = pc_dict["micro_batch_num"] if pp > 1 else rc.get("gradient_accumulation_steps", 1)
b = rc["batch_size"]                       # sequences per micro-batch per dp rank
global_batch = b * dp * m
seq = mc["seq_length"]
parallel_optimizer = bool(spec.get("parallel", {}).get("enable_parallel_optimizer", False))
zero_level = "level2" if spec.get("parallel", {}).get("parallel_optimizer_config", {}).get(
    "gradient_accumulation_shard") else "level1"

if args.cpu_check:
    target = "CPU"
else:
    try:
        target = require("Ascend")
    except DeviceUnavailable:
        target = require("GPU")   # raises with the reason if neither exists
ms.set_device(target)
ms.set_context(mode=ms.PYNATIVE_MODE if args.cpu_check else ms.GRAPH_MODE)
if args.cpu_check:
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
init()   # the msrun scheduler process runs this file too and stops inside init()
rank, world = get_rank(), get_group_size()

from mindformers.models.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402
from mindformers.modules.transformer import TransformerOpParallelConfig  # noqa: E402
from mindspore.parallel.auto_parallel import AutoParallel  # noqa: E402
from mindspore.parallel.nn import GradAccumulation, Pipeline  # noqa: E402


def build(batch_rows: int):
    cfg = LlamaConfig(**{**mc, "batch_size": batch_rows}, parallel_config=TransformerOpParallelConfig(**pc_dict))
    if target == "CPU":   # the kernels CPU has (see the platform notes)
        cfg.use_flash_attention, cfg.use_rope_slice, cfg.fused_rms_norm = False, True, False
        cfg.disable_lazy_inline = True
    net = LlamaForCausalLM(config=cfg)    # keyword form: mindformers' decorator reads keywords only
    net.set_train()                       # training mode: input_ids of seq+1 tokens give inputs and labels
    return net


def semi_auto_train_cell(net):
    """The primary form: micro-batch wrapper, optimizer, AutoParallel with pipeline and parallel optimizer."""
    wrapped = Pipeline(net, m) if pp > 1 else (GradAccumulation(net, m) if m > 1 else net)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-4)
    train = nn.TrainOneStepCell(wrapped, opt)
    train.set_train()
    parallel = AutoParallel(train, parallel_mode="semi_auto")
    parallel.dataset_strategy("full_batch")
    if pp > 1:
        parallel.pipeline(stages=pp, scheduler="1f1b")
    if parallel_optimizer:
        parallel.hsdp(shard_size=-1, threshold=64, optimizer_level=zero_level)
    return parallel


def ids_batch(rng, rows):
    # token ids from 1 up: id 0 is the pad token, whose positions the loss masks, so a micro-batch with more
    # pads would weigh its tokens differently from the one-pass mean
    return rng.integers(1, mc["vocab_size"], (rows, seq + 1)).astype(np.int32)


result = {"rank": rank, "world": world, "target": target, "dp": dp, "mp": mp, "pp": pp, "micro_batches": m,
          "micro_batch_size": b, "global_batch": global_batch, "parallel_optimizer": parallel_optimizer}

if not args.cpu_check:
    if world != dp * mp * pp:
        raise SystemExit(f"semi_auto_llama: the layout needs dp*mp*pp = {dp * mp * pp} ranks, msrun started {world}")
    # full_batch: every rank feeds (global_batch, seq+1); the wrapper cuts m micro-batches of global_batch/m rows
    step = semi_auto_train_cell(build(global_batch // m))
    rng = np.random.default_rng(spec.get("seed", 0))
    times = []
    for i in range(args.steps):
        ids = ms.Tensor(ids_batch(rng, global_batch), ms.int32)
        t0 = time.perf_counter()
        loss = step(ids)
        loss = float(loss.asnumpy())
        times.append(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {i + 1}/{args.steps} loss {loss:.4f} {times[-1] * 1e3:.0f} ms", flush=True)
    if rank == 0:
        med = float(np.median(times[1:] or times))
        print(f"median step {med * 1e3:.0f} ms, {global_batch * seq / med:.0f} tokens/s on {world} devices")
    raise SystemExit(0)

# ------------------------------------------------------------------ CPU: what runs of this layout
from mshelpers.launch import write_rank_result  # noqa: E402

if world != dp:
    raise SystemExit(f"semi_auto_llama --cpu-check: data parallel needs world = data_parallel = {dp}, got {world}")
ms.set_seed(spec.get("seed", 0))            # same seed on every rank: identical initial weights
net = build(b)
try:                                         # 1. the primary form, as on Ascend: CPU refuses it at compile
    AutoParallel(nn.TrainOneStepCell(GradAccumulation(net, m) if m > 1 else net,
                                     nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-4)),
                 parallel_mode="semi_auto").compile(ms.Tensor(ids_batch(np.random.default_rng(0), global_batch), ms.int32))
    result["semi_auto_on_cpu"] = "compiled"
except Exception as e:  # noqa: BLE001 - the message is the result
    result["semi_auto_on_cpu"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)

# 2. data parallel with the YAML's micro-batches: rank r reads rows [r*b*m, (r+1)*b*m) of the global batch.
# build_step splits them into m micro-batches of b rows, sums their gradients, divides by m (what GradAccumulation
# computes), all-reduces the mean over dp and takes one AdamW update; build_grads is that step's gradient half.
from mshelpers.train_step import build_grads, build_step  # noqa: E402

params = net.trainable_params()
opt = nn.AdamWeightDecay(params, learning_rate=1e-3)
step = build_step(net, opt, mode="pynative", accum=m, reducer=nn.DistributedGradReducer(params, mean=True))

rng = np.random.default_rng(spec.get("seed", 0))
first = ids_batch(rng, global_batch)
mine = ms.Tensor(first[rank * b * m:(rank + 1) * b * m], ms.int32)
_, g_acc = build_grads(net, params, accum=m)(mine)   # m micro-batches of b rows, averaged
_, g_full = build_grads(net, params)(mine)           # one pass over the rank's b*m rows
rel = max(float(np.abs(a.asnumpy() - f.asnumpy()).max() / (np.abs(f.asnumpy()).max() + 1e-12))
          for a, f in zip(g_acc, g_full))
result.update(rank_rows=int(mine.shape[0]), micro_batch_shape=[b, seq + 1], full_batch_shape=[global_batch, seq + 1],
              accumulated_vs_one_pass_max_rel_err=rel)
losses, times = [], []
batch = first
for i in range(args.steps):
    rows = ms.Tensor(batch[rank * b * m:(rank + 1) * b * m], ms.int32)
    t0 = time.perf_counter()
    loss, _, _ = step(rows)
    losses.append(float(loss.asnumpy()))
    times.append(time.perf_counter() - t0)
    # the same global batch every step: uniform random tokens hold nothing to learn across batches (the loss of a
    # fresh batch stays at ln(vocab)), while fitting one batch must lower its loss, so the run can show it trained
flat = np.concatenate([p.asnumpy().ravel() for p in params])
result.update(losses=losses, step_times=times, params_checksum=float(np.abs(flat).sum()),
              params_head=flat[:8].tolist())
write_rank_result(result)
