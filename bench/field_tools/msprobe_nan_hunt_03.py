"""Notebook 03's NaN hunt (section 4) under msprobe and under mshelpers.amp.find_first_nonfinite.

SmallLM(init_std=16) cast to AMP O3, one forward of the loss net in PyNative on CPU, as in 03 c26. msprobe's
PrecisionDebugger (task "statistics", level "mix") dumps every cell and API; the script names the first
forward *cell* and the first forward *API* in dump.json whose floating inputs are finite and whose output is
not, and prints find_first_nonfinite's answer on the same net and batch.

msprobe 26.2.0 takes tensor norms with mindspore.mint.norm, which has no CPU kernel in MindSpore 2.9
(LinalgVectorNorm): without `--cpu-norm-workaround` (mint.norm -> ops.norm in this process) the dump is empty.

Run (tools installed outside the project venv, see docs/field_tools.md):
    PYTHONPATH=/tmp/tools-site:. .venv/bin/python bench/field_tools/msprobe_nan_hunt_03.py OUT_DIR [--cpu-norm-workaround]
"""
import glob
import json
import math
import os
import sys
import time

import mshelpers  # noqa: F401  (log level first, as the notebooks do)
import mindspore as ms
from mindspore import ops

from mshelpers.amp import auto_mixed_precision, find_first_nonfinite
from mshelpers.config import RunConfig
from mshelpers.data import numpy_batches
from mshelpers.device import setup
from mshelpers.smalllm import SmallLM, WithNextTokenLoss

out = os.path.abspath([a for a in sys.argv[1:] if not a.startswith("--")][0])
os.makedirs(out, exist_ok=True)
SEED = 0
cfg = RunConfig.preset("mini").replace(seq_len=64, batch_size=8, seed=SEED)
batch = ms.Tensor(next(iter(numpy_batches(cfg))), ms.int32)


def blown_net():
    setup(mode="pynative", seed=SEED)
    return WithNextTokenLoss(auto_mixed_precision(SmallLM(init_std=16.0), "O3"))


t0 = time.perf_counter()
print("find_first_nonfinite:", repr(find_first_nonfinite(blown_net(), batch)),
      f"({time.perf_counter() - t0:.1f} s)")

from msprobe.mindspore import PrecisionDebugger  # noqa: E402

if "--cpu-norm-workaround" in sys.argv:
    ms.mint.norm = ops.norm
    print("workaround on: mindspore.mint.norm -> mindspore.ops.norm")
config = {"task": "statistics", "dump_path": os.path.join(out, "dump"), "rank": [], "step": [], "level": "mix",
          "statistics": {"scope": [], "list": [], "data_mode": ["forward"], "summary_mode": "statistics"}}
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(config, f, indent=1)
net = blown_net()
debugger = PrecisionDebugger(config_path=os.path.join(out, "config.json"))
t0 = time.perf_counter()
debugger.start(model=net)
try:
    print("loss under msprobe:", net(batch).asnumpy())
except Exception as e:   # noqa: BLE001  (RuntimeError from MindSpore, DumpException from msprobe)
    print("msprobe dump FAILED in the forward:", type(e).__name__, str(e).strip().splitlines()[0])
for call in (debugger.stop, debugger.step):
    try:
        call()
    except Exception as e:   # noqa: BLE001
        print(f"msprobe debugger.{call.__name__}() FAILED:", type(e).__name__, str(e).strip().splitlines()[0])
print(f"msprobe dump took {time.perf_counter() - t0:.1f} s")


def stats(entries):
    for e in entries or []:
        if isinstance(e, list):
            yield from stats(e)
        elif isinstance(e, dict) and e.get("type") == "mindspore.Tensor" and "Float" in str(e.get("dtype", "")):
            yield e


def finite(entries):
    return all(math.isfinite(v) for e in entries for k in ("Max", "Min") for v in [e.get(k)]
               if isinstance(v, (int, float)))


dumps = sorted(glob.glob(os.path.join(out, "dump", "step0", "*", "dump.json")))
data = json.load(open(dumps[-1]))["data"] if dumps else {}
first = {"Cell": None, "API": None}
for name, rec in data.items():
    ins, outs = list(stats(rec.get("input_args"))), list(stats(rec.get("output")))
    kind = "Cell" if name.startswith("Cell.") else "API"
    if first[kind] is None and outs and finite(ins) and not finite(outs):
        first[kind] = (name, max(abs(e["Max"]) if isinstance(e.get("Max"), (int, float)) else 0 for e in ins)
                       if ins else None)
print(f"msprobe dump.json: {len(data)} entries")
print("msprobe, first forward cell with finite inputs and a non-finite output:", first["Cell"])
print("msprobe, first forward API with finite inputs and a non-finite output:", first["API"])
