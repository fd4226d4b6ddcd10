"""msprobe's kernel-level (L2) dump in GRAPH mode on CPU, and the first kernel whose output turns inf/NaN.

Level "L2" makes msprobe write a MindSpore dump config (kernel_kbyk_dump.json) and switch MindSpore's own
kernel-by-kernel dump on; it needs no msprobe statistics code, so it runs on CPU as shipped. Two findings:
task "statistics" is refused by MindSpore on CPU ("storing statistic dump is only supported on GPU and Ascend"),
task "tensor" writes one .npy per kernel input and output. msprobe has no MindSpore analysis of that dump (its
overflow_check is PyTorch-only), so this script reads the .npy files in execution order and names the first
kernel whose floating inputs are finite and whose output is not.

NET: "tiny" (Dense -> float16 multiply that overflows -> ReLU) or "smalllm03" (notebook 03's NaN hunt:
SmallLM(init_std=16) at AMP O3, the loss net's forward). One net per process: the dump is configured at start.

Run (tools installed outside the project venv, see docs/field_tools.md):
    PYTHONPATH=/tmp/tools-site:. .venv/bin/python bench/field_tools/msprobe_kernel_dump_graph.py OUT_DIR {tiny,smalllm03}
"""
import glob
import json
import os
import re
import sys
from collections import defaultdict

import numpy as np

import mshelpers  # noqa: F401  (log level first, as the notebooks do)
import mindspore as ms
from mindspore import nn, ops

out, which = os.path.abspath(sys.argv[1]), sys.argv[2]
os.makedirs(out, exist_ok=True)
ms.set_context(mode=ms.GRAPH_MODE, jit_config={"jit_level": "O0"})   # O0: kernel by kernel, what L2 dumps
ms.set_device("CPU")

from msprobe.mindspore import PrecisionDebugger  # noqa: E402


class Scale(nn.Cell):
    def construct(self, x):
        return ops.mul(x.astype(ms.float16), ms.Tensor(60000, ms.float16)).astype(ms.float32)


if which == "tiny":
    net = nn.SequentialCell(nn.Dense(4, 4, weight_init="ones", bias_init="zeros"), Scale(), nn.ReLU())
    batch = ms.Tensor(np.ones((2, 4), np.float32))
else:
    from mshelpers.amp import auto_mixed_precision
    from mshelpers.config import RunConfig
    from mshelpers.data import numpy_batches
    from mshelpers.device import setup
    from mshelpers.smalllm import SmallLM, WithNextTokenLoss
    setup(mode="graph", seed=0)
    ms.set_context(jit_config={"jit_level": "O0"})
    net = WithNextTokenLoss(auto_mixed_precision(SmallLM(init_std=16.0), "O3"))
    cfg = RunConfig.preset("mini").replace(seq_len=64, batch_size=8, seed=0)
    batch = ms.Tensor(next(iter(numpy_batches(cfg))), ms.int32)

dump_path = os.path.join(out, "dump")
config = {"task": "tensor", "dump_path": dump_path, "rank": [], "step": [], "level": "L2",
          "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
debugger = PrecisionDebugger(config_path=os.path.join(out, "config.json"))
debugger.start()
print("output:", net(batch).asnumpy().ravel()[:4])
debugger.stop()
debugger.step()

# <Type>.<scope_name>.<task>.<stream>.<timestamp>.<input|output>.<i>.<format>.<dtype>.npy
pat = re.compile(r"^(?P<kernel>.+?)\.\d+\.\d+\.(?P<ts>\d+)\.(?P<io>input|output)\.(?P<i>\d+)\.")
kernels = defaultdict(lambda: {"ts": None, "input": [], "output": []})
files = glob.glob(os.path.join(dump_path, "rank_0", "*", "*", "0", "*.npy"))
for path in files:
    m = pat.match(os.path.basename(path))
    if not m or m["kernel"].startswith("Parameter."):
        continue
    k = kernels[m["kernel"]]
    ts = int(m["ts"])
    k["ts"] = ts if k["ts"] is None else min(k["ts"], ts)
    k[m["io"]].append((int(m["i"]), np.load(path)))
for k in kernels.values():     # inputs and outputs in index order
    k["input"], k["output"] = ([a for _, a in sorted(k[io], key=lambda t: t[0])] for io in ("input", "output"))


def finite(arrays):
    return all(np.isfinite(a).all() for a in arrays if np.issubdtype(a.dtype, np.floating))


print(f"{len(files)} .npy files, {len(kernels)} kernels (execution order: "
      f"{len(glob.glob(os.path.join(dump_path, 'rank_0', 'execution_order', '*.csv')))} csv)")
first = None
for name, k in sorted(kernels.items(), key=lambda kv: kv[1]["ts"]):
    if finite(k["input"]) and not finite(k["output"]):
        first = name
        break
if first is None:
    print("no kernel with finite inputs and a non-finite output")
    sys.exit(0)
k = kernels[first]
fin = [a for a in k["input"] if np.issubdtype(a.dtype, np.floating)]
print("first kernel with finite inputs and a non-finite output:", first)
print("  input dtypes", [str(a.dtype) for a in k["input"]], "max |input|",
      max(float(np.abs(a).max()) for a in fin), "output dtypes", [str(a.dtype) for a in k["output"]],
      "non-finite outputs", [int((~np.isfinite(a)).sum()) for a in k["output"]])
# Check the flagged kernel against numpy where that is easy (MatMul: inputs a, b, transpose_a, transpose_b).
if first.startswith("MatMul.") and len(fin) == 2 and len(k["input"]) == 4:
    a, b = (x.astype(np.float64) for x in fin)
    ta, tb = (bool(x) for x in k["input"][2:4])
    ref = (a.T if ta else a) @ (b.T if tb else b)
    o = k["output"][0]
    print(f"  numpy float64 reference: max |out| {np.abs(ref).max():.4g}, entries above 65504: "
          f"{int((np.abs(ref) > 65504).sum())}")
    if o.dtype == np.float16:
        as32 = o.view(np.float32).ravel()
        ok = np.allclose(as32, ref.ravel()[:as32.size], rtol=1e-3, atol=1e-3)
        print(f"  the dumped float16 output's bytes read as float32 match the first half of the reference: {ok}"
              + (" -> a dump artifact: the kernel wrote float32, the dump labelled it Float16" if ok else ""))
