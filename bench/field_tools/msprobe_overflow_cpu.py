"""msprobe (mindstudio-probe 26.2.0) beside mshelpers.amp.find_first_nonfinite on one PyNative CPU net.

A float16 multiply in the sub-cell "1" (`Scale`) overflows (4 * 60000 > 65504); the rest of the net is float32.
1. msprobe's PrecisionDebugger (task "statistics", level "mix": cells and APIs) dumps the net in PyNative on CPU;
   the script names the first forward entry of dump.json whose inputs are finite and whose output is not.
2. `msprobe overflow_check` on that dump (msprobe's own first-overflow search).
3. `msprobe compare` of that dump against a golden dump of the same net with the multiply in float32
   (made by this script in a child process: PrecisionDebugger is one per process).
4. The cookbook's `find_first_nonfinite` on the same net.

As shipped, msprobe's statistics fail on CPU: it takes each tensor's norm with `mindspore.mint.norm`, whose kernel
(LinalgVectorNorm) MindSpore 2.9 does not register on CPU. `--cpu-norm-workaround` points `mint.norm` at
`ops.norm` (which has a CPU kernel) in this process and its child, so the rest of msprobe's path can be seen.

Run (tools installed outside the project venv, see docs/field_tools.md):
    PYTHONPATH=/tmp/tools-site:. .venv/bin/python bench/field_tools/msprobe_overflow_cpu.py OUT_DIR [--cpu-norm-workaround]
"""
import glob
import json
import math
import os
import subprocess
import sys

import numpy as np
import mindspore as ms
from mindspore import nn, ops

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
args = [a for a in sys.argv[1:] if not a.startswith("--")]
WORKAROUND = "--cpu-norm-workaround" in sys.argv
GOLDEN = "--golden" in sys.argv          # internal: the child process that makes the float32 dump
out = os.path.abspath(args[0])
os.makedirs(out, exist_ok=True)
MSPROBE = [sys.executable, "-c", "import sys; sys.argv[0] = 'msprobe'; from msprobe.msprobe import main; main()"]


class Scale(nn.Cell):
    """Multiplies in `dtype` and returns float32: the overflow happens inside this cell's own construct."""
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def construct(self, x):
        return ops.mul(x.astype(self.dtype), ms.Tensor(60000, self.dtype)).astype(ms.float32)


def make_net(dtype=ms.float16):
    return nn.SequentialCell(nn.Dense(4, 4, weight_init="ones", bias_init="zeros"), Scale(dtype), nn.ReLU(),
                             nn.Dense(4, 1, weight_init="ones", bias_init="zeros"))


x = ms.Tensor(np.ones((2, 4), np.float32))   # Dense(ones) -> 4.0; 4.0 * 60000 = 240000 > 65504 (float16 max)


def msprobe_dump(dump_path, dtype):
    """One forward of make_net(dtype) under msprobe's PrecisionDebugger; returns dump.json's path or None."""
    from msprobe.mindspore import PrecisionDebugger
    cfg = {"task": "statistics", "dump_path": dump_path, "rank": [], "step": [], "level": "mix",
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    cfg_path = dump_path + ".config.json"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    if WORKAROUND:
        ms.mint.norm = ops.norm   # LinalgVectorNorm has no CPU kernel in MindSpore 2.9; ops.norm has one
        print("workaround on: mindspore.mint.norm -> mindspore.ops.norm")
    net = make_net(dtype)
    debugger = PrecisionDebugger(config_path=cfg_path)
    debugger.start(model=net)
    try:
        print("net output:", net(x).asnumpy().ravel().tolist())
    except Exception as e:   # noqa: BLE001  (RuntimeError from MindSpore, DumpException from msprobe)
        print("msprobe dump FAILED in the forward:", type(e).__name__, str(e).strip().splitlines()[0])
    for call in (debugger.stop, debugger.step):
        try:
            call()
        except Exception as e:   # noqa: BLE001  stop() writes dump.json and takes the buffered statistics' values there
            print(f"msprobe debugger.{call.__name__}() FAILED:", str(e).strip().splitlines()[0])
    found = sorted(glob.glob(os.path.join(dump_path, "step0", "*", "dump.json")))
    return found[-1] if found else None


if GOLDEN:
    msprobe_dump(os.path.join(out, "dump_fp32"), ms.float32)
    sys.exit(0)


def finite(stats):
    vals = [s.get(k) for s in stats for k in ("Max", "Min", "Mean", "Norm")]
    return all(math.isfinite(v) for v in vals if isinstance(v, (int, float)))


def flat(entries):
    for e in entries or []:
        if isinstance(e, list):
            yield from flat(e)
        elif isinstance(e, dict):
            yield e


def run(cmd, label):
    print(f"\n$ msprobe {' '.join(cmd)}")
    r = subprocess.run(MSPROBE + cmd, capture_output=True, text=True)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip() and "CANN environment" not in ln]
    keep = [ln for ln in lines if "ERROR" in ln or "Error" in ln or "error" in ln or "INFO" in ln]
    print(f"exit code {r.returncode}; {label}:")
    print("\n".join("  " + ln[:170] for ln in (keep or lines)[-8:]))


# ---- 1. msprobe statistics dump of the float16 net
dump_json = msprobe_dump(os.path.join(out, "dump"), ms.float16)
first = None
data = json.load(open(dump_json))["data"] if dump_json else {}
print(f"dump.json: {dump_json}, {len(data)} entries")
for name, rec in data.items():
    ins, outs = list(flat(rec.get("input_args", []))), list(flat(rec.get("output", [])))
    print(f"  {name:42s} inputs finite={finite(ins)!s:5s} output finite={finite(outs)!s:5s} "
          f"output Max={[o.get('Max') for o in outs]}")
    if first is None and "forward" in name and finite(ins) and not finite(outs):
        first = name
print("msprobe dump: first forward entry with finite inputs and a non-finite output:", first)

# ---- 2. msprobe's own overflow analysis of that dump
run(["overflow_check", "-i", os.path.join(out, "dump", "step0"), "-o", os.path.join(out, "overflow_out")],
    "overflow_check")

# ---- 3. msprobe compare against a float32 golden dump
subprocess.run([sys.executable, __file__, out, "--golden"] + (["--cpu-norm-workaround"] if WORKAROUND else []),
               capture_output=True, text=True)
golden = sorted(glob.glob(os.path.join(out, "dump_fp32", "step0", "*", "dump.json")))
if dump_json and golden:   # compare takes the step folders (each holds exactly one proc*/ folder)
    run(["compare", "-tp", os.path.join(out, "dump", "step0"), "-gp", os.path.join(out, "dump_fp32", "step0"),
         "-o", os.path.join(out, "compare_out")],
        "compare")
    import csv
    for csv_path in sorted(glob.glob(os.path.join(out, "compare_out", "*.csv"))):
        rows = list(csv.DictReader(open(csv_path)))
        bad = [r for r in rows if "nan/inf" in r.get("Err_message", "")]
        print(f"  {os.path.relpath(csv_path, out)}: {len(rows)} rows, {sum(r['Result'] == 'error' for r in rows)} "
              f"'error'; first row with nan/inf: {bad[0]['NPU Name'] if bad else None} "
              f"(max {bad[0]['NPU max'].strip() if bad else '-'} against golden {bad[0]['Bench max'] if bad else '-'})")
else:
    print("\nmsprobe compare: skipped, a dump is missing (target:", dump_json, ", golden:", golden, ")")

# ---- 4. the cookbook's helper on a fresh copy of the same net
from mshelpers.amp import find_first_nonfinite  # noqa: E402
print("\nfind_first_nonfinite:", repr(find_first_nonfinite(make_net(), x)))
