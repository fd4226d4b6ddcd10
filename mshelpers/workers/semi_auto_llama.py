"""LLaMA under semi_auto_parallel with a planner-chosen layout: the Ascend path of notebook 05.

    msrun --worker_num=32 --local_worker_num=8 --master_addr=<node0> --master_port=8118 --node_rank=<k> \
          --log_dir=msrun_log --join=True semi_auto_llama.py --layout layout.yaml --steps 20

`layout.yaml` holds a `model` section (RunConfig fields) and a `parallel_config` section
(data_parallel, model_parallel, pipeline_stage, micro_batch_num, ...) as written by
notebook 05 from `mshelpers.parallel.mindformers_parallel_config`. MindSpore refuses
semi_auto_parallel on CPU ("only support Ascend/GPU backend"), so this script exits with
that reason on a CPU-only machine; it was not run here.
"""
import argparse
import time

import yaml

parser = argparse.ArgumentParser()
parser.add_argument("--layout", required=True, help="YAML with model: and parallel_config: sections")
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
spec = yaml.safe_load(open(args.layout))

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402

from mshelpers.config import RunConfig  # noqa: E402
from mshelpers.device import DeviceUnavailable, require  # noqa: E402

try:
    target = require("Ascend")
except DeviceUnavailable:
    target = require("GPU")   # raises with the reason if neither exists
ms.set_device(target)
ms.set_context(mode=ms.GRAPH_MODE)
pc_dict = spec["parallel_config"]
world_expected = pc_dict["data_parallel"] * pc_dict["model_parallel"] * pc_dict["pipeline_stage"]
ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=world_expected, full_batch=True,
                             gradients_mean=True, pipeline_stages=pc_dict["pipeline_stage"])
init()
rank, world = get_rank(), get_group_size()
if world != world_expected:
    raise SystemExit(f"semi_auto_llama: the layout needs dp*mp*pp = {world_expected} ranks, msrun started {world}")

from mindformers.models.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402
from mindformers.modules.transformer import TransformerOpParallelConfig  # noqa: E402

cfg = RunConfig.from_dict(spec["model"])
parallel_config = TransformerOpParallelConfig(**pc_dict)
llama_cfg = LlamaConfig(batch_size=cfg.batch_size // pc_dict["micro_batch_num"], seq_length=cfg.seq_len,
                        hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                        intermediate_size=cfg.ffn_hidden_size, vocab_size=cfg.vocab_size,
                        compute_dtype=cfg.compute_dtype, param_init_type="float32",
                        parallel_config=parallel_config)
net = LlamaForCausalLM(config=llama_cfg)   # keyword form: mindformers' decorator reads keywords only
if pc_dict["pipeline_stage"] > 1:
    net = nn.PipelineCell(net, pc_dict["micro_batch_num"])
opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=cfg.lr)
step = nn.TrainOneStepCell(net, opt)
step.set_train()

# full_batch=True: every rank feeds the whole global batch; the strategies pick each rank's slice.
rng = np.random.default_rng(cfg.seed)
times = []
for i in range(args.steps):
    ids = ms.Tensor(rng.integers(0, cfg.vocab_size, (cfg.batch_size, cfg.seq_len + 1)), ms.int32)
    t0 = time.perf_counter()
    loss = step(ids)
    loss.asnumpy()
    times.append(time.perf_counter() - t0)
    if rank == 0:
        print(f"step {i + 1}/{args.steps} loss {float(loss.asnumpy()):.4f} {times[-1] * 1e3:.0f} ms", flush=True)
if rank == 0:
    med = float(np.median(times[1:] or times))
    print(f"median step {med * 1e3:.0f} ms, {cfg.batch_size * cfg.seq_len / med:.0f} tokens/s on {world} devices")
