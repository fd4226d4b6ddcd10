"""msprof-analyze (26.2.0) beside mshelpers.profiling on one MindSpore CPU profile.

Profiles 3 active steps of a small graph-mode train step with `mshelpers.profiling.profile_steps` (a real
`mindspore.profiler.profile` run, output under OUT_DIR/run), answers with the cookbook's op_type_table /
step_breakdown / diagnose, then runs msprof-analyze's cluster, advisor and compare on the same folder
(compare: this run against a second run of the same step) and prints what each says.

Run (tools installed outside the project venv, see docs/field_tools.md):
    PYTHONPATH=/tmp/tools-site:. .venv/bin/python bench/field_tools/msprof_analyze_cpu.py OUT_DIR
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import mindspore as ms
from mindspore import nn

from mshelpers.profiling import diagnose, op_type_table, profile_steps, step_breakdown

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")
out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="msprof_"))

net = nn.SequentialCell(nn.Dense(256, 1024), nn.ReLU(), nn.Dense(1024, 256))
step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 1e-3))
x = ms.Tensor(np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32))
y = ms.Tensor(np.zeros((64, 256), np.float32))
runs = [profile_steps(lambda: step(x, y).asnumpy(), wait=1, warmup=1, active=3,
                      output_dir=os.path.join(out, name)) for name in ("run", "run_again")]
prof = str(runs[0].profile_dir)
print("profile folder:", prof)
print("files:", sorted(os.path.relpath(os.path.join(r, f), prof) for r, _, fs in os.walk(prof) for f in fs))

print("\n== cookbook: op_type_table (top 3)")
for row in op_type_table(prof)[:3]:
    print(f"  {row['op_type']:16s} count={row['count']:4d} total_ms={row['total_ms']:.2f} share={row['share']:.1%}")
parts = step_breakdown(runs[0])
print("== cookbook: step_breakdown", {k: round(parts[k], 3) for k in
                                      ("step_ms", "compute_share", "communication_share", "data_share", "host_share")})
print("== cookbook: diagnose:", diagnose(parts))

CLI = [sys.executable, "-c", "import sys; sys.argv[0] = 'msprof-analyze'; "
       "from msprof_analyze.cli.entrance import msprof_analyze_cli; msprof_analyze_cli()"]
commands = {
    "cluster": ["cluster", "-d", os.path.join(out, "run"), "-o", os.path.join(out, "ma_cluster")],
    "advisor": ["advisor", "all", "-d", prof, "-pt", "mindspore", "-l", "en", "-o", os.path.join(out, "ma_advisor"),
                "--agent"],
    "compare": ["compare", "-d", prof, "-bp", str(runs[1].profile_dir), "-o", os.path.join(out, "ma_compare")],
}
for name, args in commands.items():
    print(f"\n== msprof-analyze {' '.join(args)}")
    r = subprocess.run(CLI + args, capture_output=True, text=True)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines()
             if ln.strip() and "MindStudio" not in ln and "=====" not in ln and "UNLEASH" not in ln
             and "Security Warning" not in ln and "it/s]" not in ln]
    print(f"exit code {r.returncode}; {len(lines)} lines, the ones that answer:")
    keep = [ln for ln in lines if any(w in ln for w in ("ERROR", "Failed", "suggestion", "NPU", "Computing",
                                                         "does not exist", "Can't find", "generated"))]
    print("\n".join("  " + ln[:160] for ln in (keep or lines)[:14]))
    made = [os.path.join(r_, f) for r_, _, fs in os.walk(args[args.index("-o") + 1]) for f in fs]
    print("  files written:", [os.path.relpath(p, out) for p in made])
