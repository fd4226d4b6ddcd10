"""The cookbook's fastest MindSpore CPU recipe against PyTorch on the identical mini LLaMA.

    python -m bench.compare_pytorch [--repeats 3] [--steps 20] [--warmup 4] [--no-compile]
    python -m bench.compare_pytorch --candidates        # the MindSpore-side search behind bench/README.md

Every side trains the 3,688,704-parameter mini LLaMA (hidden 256, 4 layers, 4 heads, ffn 688,
vocab 1024) at batch 8 x seq 128 with AdamW at a constant learning rate, each run in a fresh
process. The sides alternate (their order rotates every repeat), so a load spike hits all of
them; the figure per side is the median over every steady step of every repeat. MFU uses
mshelpers.peak.peak_flops(), the cached per-machine peak. The last line printed is
`ratio mindspore/pytorch_eager tokens/s: X.XX`. Rows go to build/bench/compare_pytorch.csv.
PyTorch is a benchmark-only extra: pip install -r bench/requirements.txt.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mshelpers.config import build_dir  # noqa: E402
from mshelpers.table import append_csv, markdown_table  # noqa: E402
from mshelpers.timing import run_isolated  # noqa: E402

DIMS = dict(vocab=1024, dim=256, layers=4, heads=4, ffn=688)
BATCH, SEQ, LR, EPS = 8, 128, 3e-4, 1e-8
N_PARAMS = 3_688_704

# The recipe the comparison uses: the winner of `--candidates` (see bench/README.md).
BEST_MS = dict(model="lean", step="cell", jit_level=None, threads=None, lean=None)


def _batch(seed: int = 0):
    import numpy as np
    return np.random.default_rng(seed).integers(0, DIMS["vocab"], (BATCH, SEQ + 1)).astype(np.int32)


def _timed(step, steps: int, warmup: int) -> dict:
    """Run warmup + steps calls of step() -> float loss; per-step wall and CPU times."""
    first = None
    times, cpu, losses = [], [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        first = dt if first is None else first
        if i >= warmup:
            times.append(dt)
            cpu.append(dc)
            losses.append(loss)
    return dict(first_step_s=first, step_s=times, cpu_s=cpu, final_loss=losses[-1])


def ms_optimizer(params, kind: str = "adam"):
    """AdamW at weight decay 0 with PyTorch's bias correction ("adam"), or nn.AdamWeightDecay.

    nn.AdamWeightDecay (the cookbook runner's optimizer) skips Adam's bias correction, so its first
    updates are ~3x larger than torch.optim.AdamW's; nn.Adam at weight_decay=0 is the same update
    as torch.optim.AdamW at weight_decay=0 (see equivalence()).
    """
    from mindspore import nn
    if kind == "adam":
        return nn.Adam(params, learning_rate=LR, eps=EPS, weight_decay=0.0)
    return nn.AdamWeightDecay(params, learning_rate=LR, eps=EPS, weight_decay=0.0)


def ms_side(steps: int, warmup: int, model: str = "lean", step: str = "cell", jit_level: str | None = None,
            threads: int | None = None, log: bool = False, optimizer: str = "adam", lean: dict | None = None) -> dict:
    """One MindSpore run in this (fresh) process. See --candidates for what each option means.

    model "lean" is bench.lean_llama_ms.LeanLlama(**lean) (all its CPU optimizations on unless `lean` turns
    some off); "mindformers" is the notebooks' LlamaForCausalLM.
    """
    import mshelpers  # noqa: F401  (quiets MindSpore's logs before it loads)
    import mindspore as ms
    from mindspore import nn
    from mshelpers.device import setup
    setup("graph", seed=0)
    if jit_level:
        ms.set_context(jit_config={"jit_level": jit_level})
    if threads:
        ms.set_context(runtime_num_threads=threads)
    if model == "mindformers":
        from mshelpers.config import RunConfig
        from mshelpers.model import build_model
        net = build_model(RunConfig.preset("mini"))
    else:
        from bench.lean_llama_ms import LeanLlama
        net = LeanLlama(**DIMS, seq_len=SEQ, **(lean or {}))
    n = int(sum(p.size for p in net.trainable_params()))
    assert n == N_PARAMS, f"{model}: {n} parameters, expected {N_PARAMS}"
    opt = ms_optimizer(net.trainable_params(), optimizer)
    x = ms.Tensor(_batch())
    if step == "cell":
        train_step = nn.TrainOneStepCell(net, opt)
        train_step.set_train()
        run = lambda: float(train_step(x).asnumpy())
    else:   # the cookbook runner's step: clipping, grad norm and overflow check included
        from mshelpers.config import RunConfig
        from mshelpers.train import make_train_step
        fn = make_train_step(net, opt, RunConfig.preset("mini").replace(mode="graph"))
        run = lambda: float(fn(x)[0].asnumpy())
    if log:   # the runner's per-step logger, as train() calls it
        from mshelpers.metrics import StepLogger
        logger = StepLogger(build_dir("bench") / "logger_probe.csv", BATCH * SEQ, 6 * N_PARAMS, 1.8e11,
                           overwrite=True)   # a probe file, rewritten each run
        plain, log_s = run, []

        def run():
            t0 = time.perf_counter()
            loss = plain()
            t1 = time.perf_counter()
            logger.log_step(len(logger.rows) + 1, loss, t1 - t0)
            log_s.append(time.perf_counter() - t1)
            return loss
        out = _timed(run, steps, warmup)
        out["log_s"] = log_s[warmup:]   # the logger's own time inside each timed step
        return out
    return _timed(run, steps, warmup)


def torch_side(steps: int, warmup: int, compile: bool = False) -> dict:
    """One PyTorch run (eager, or torch.compile of the model) in this (fresh) process."""
    import torch
    from bench.llama_torch import TorchLlama
    torch.manual_seed(0)
    net = TorchLlama(**DIMS, seq_len=SEQ)
    assert sum(p.numel() for p in net.parameters()) == N_PARAMS
    opt = torch.optim.AdamW(net.parameters(), lr=LR, eps=EPS, weight_decay=0.0)
    f = torch.compile(net) if compile else net
    x = torch.from_numpy(_batch()).long()

    def run():
        loss = f(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.item())
    out = _timed(run, steps, warmup)
    out["threads"] = torch.get_num_threads()
    return out


def equivalence(steps: int = 3) -> dict:
    """Copy the lean MindSpore model's weights into the PyTorch one; train both; compare the losses.

    Run in PyNative mode in one process: this checks that the two sides compute the same function
    and the same AdamW update, so the timing comparison is like for like.
    """
    import numpy as np
    import mshelpers  # noqa: F401
    import mindspore as ms
    import torch
    from mindspore import nn
    from mshelpers.device import setup
    from bench.lean_llama_ms import LeanLlama
    from bench.llama_torch import TorchLlama
    setup("pynative", seed=0)
    net, tnet = LeanLlama(**DIMS, seq_len=SEQ), TorchLlama(**DIMS, seq_len=SEQ)
    tparams = dict(tnet.named_parameters())
    with torch.no_grad():
        for p in net.trainable_params():
            name = p.name if p.name.endswith("weight") else p.name + ".weight"
            w = p.asnumpy()
            tparams[name].copy_(torch.from_numpy(w if w.ndim == 1 or name == "embed.weight" else w.T.copy()))
    step = nn.TrainOneStepCell(net, ms_optimizer(net.trainable_params()))
    topt = torch.optim.AdamW(tnet.parameters(), lr=LR, eps=EPS, weight_decay=0.0)
    x = _batch()
    ms_losses, pt_losses = [], []
    for _ in range(steps):
        ms_losses.append(float(step(ms.Tensor(x)).asnumpy()))
        loss = tnet(torch.from_numpy(x).long())
        topt.zero_grad()
        loss.backward()
        topt.step()
        pt_losses.append(float(loss.item()))
    return dict(ms=ms_losses, pt=pt_losses, max_abs_diff=float(np.max(np.abs(np.subtract(ms_losses, pt_losses)))))


def ms_peak_flops() -> float:
    from mshelpers.peak import peak_flops
    return peak_flops()     # the cookbook's one denominator: measured once per machine, cached


def torch_peak_flops(n: int = 2048, repeats: int = 8) -> float:
    """A timed n x n float32 matmul through PyTorch's kernel, to set beside peak_flops()."""
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


# Importing mindspore sets OMP_NUM_THREADS=1 in the process's C environment (os.environ does not show it),
# and every process started afterwards inherits it: a PyTorch child then runs its ops on one thread.
# So a PyTorch run gets the thread count a clean shell would give it; a MindSpore run sets its own.
TORCH_ENV = {"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}


def alternate(sides: dict[str, tuple], repeats: int, steps: int, warmup: int) -> dict[str, dict]:
    """Run every side `repeats` times in fresh processes, rotating the order; pool the steady steps."""
    pooled = {name: dict(step_s=[], cpu_s=[], first_step_s=[], final_loss=[], log_s=[], round_median_s=[])
              for name in sides}
    names = list(sides)
    try:
        from tqdm import tqdm
        bar = tqdm(total=repeats * len(names), desc="runs", file=sys.stderr)
    except ImportError:
        bar = None
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, kw, env = sides[name]
            res = run_isolated(fn, steps, warmup, timeout=1800, env=env, **kw).value
            p = pooled[name]
            p["step_s"] += res["step_s"]
            p["cpu_s"] += res["cpu_s"]
            p["log_s"] += res.get("log_s", [])
            p["first_step_s"].append(res["first_step_s"])
            p["round_median_s"].append(statistics.median(res["step_s"]))
            p["final_loss"].append(res["final_loss"])
            if bar:
                bar.update(1)
                bar.set_postfix(last=f"{name} {statistics.median(res['step_s']) * 1e3:.0f} ms")
    if bar:
        bar.close()
    return pooled


def rows_for(pooled: dict[str, dict], peak: float, fpt: int, best_peak: float | None = None) -> list[dict]:
    from mshelpers.metrics import mfu
    rows = []
    best_peak = best_peak or peak
    for name, p in pooled.items():
        med = statistics.median(p["step_s"])
        tps = BATCH * SEQ / med
        rows.append(dict(side=name, median_step_ms=med * 1e3, tokens_per_s=tps, mfu=mfu(tps, fpt, 1, peak),
                         mfu_vs_fastest_matmul=mfu(tps, fpt, 1, best_peak),
                         cpu_ms_per_step=statistics.median(p["cpu_s"]) * 1e3,
                         first_step_s=statistics.median(p["first_step_s"]),
                         final_loss=statistics.median(p["final_loss"]), steady_steps=len(p["step_s"])))
    return rows


def _without(option: str) -> dict:
    return dict(model="lean", step="cell", lean={option: False})


def candidates() -> dict[str, dict]:
    """The MindSpore-side candidates of --candidates, by name (imports mindspore, so built on demand)."""
    from bench.lean_llama_ms import PLAIN, TUNED
    return {
        "mindformers + TrainOneStepCell": dict(model="mindformers", step="cell"),
        "mindformers + cookbook step (clip, norm, overflow)": dict(model="mindformers", step="cookbook"),
        "lean, all four rewrites off (PLAIN)": dict(model="lean", step="cell", lean=PLAIN),
        "lean recipe (all four rewrites) + TrainOneStepCell": dict(model="lean", step="cell"),
        **{f"recipe without {opt}": _without(opt) for opt in TUNED},
        "recipe + RMSNorm mean as a MatMul": dict(model="lean", step="cell", lean=dict(norm_by_matmul=True)),
        "recipe, fused qkv and gate/up": dict(model="lean", step="cell", lean=dict(fused=True)),
        "recipe, jit_level O1": dict(model="lean", step="cell", jit_level="O1"),
        "recipe, runtime_num_threads=1": dict(model="lean", step="cell", threads=1),
        "recipe, runtime_num_threads=4": dict(model="lean", step="cell", threads=4),
        "recipe, OMP_NUM_THREADS=2 set by the user": dict(model="lean", step="cell", env={"OMP_NUM_THREADS": "2"}),
        "recipe + per-step StepLogger": dict(model="lean", step="cell", log=True),
        "recipe + cookbook step (clip, norm, overflow)": dict(model="lean", step="cookbook"),
        "recipe, AdamWeightDecay (no bias correction)": dict(model="lean", step="cell", optimizer="adamweightdecay"),
        "recipe, MatMul through NumPy (pyfunc Custom op)": dict(model="lean", step="cell", lean=dict(matmul="numpy")),
        "recipe, MatMul through OpenBLAS (AOT Custom op)": dict(model="lean", step="cell", lean=dict(matmul="blas")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare_pytorch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=4, help="untimed steps per run (compile included)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its first step takes ~1 min)")
    ap.add_argument("--candidates", action="store_true", help="measure the MindSpore-side candidates instead")
    ap.add_argument("--only", nargs="*", help="with --candidates: run only these candidate names")
    a = ap.parse_args(argv)
    for name in ("repeats", "steps", "warmup"):
        if getattr(a, name) < (0 if name == "warmup" else 1):
            ap.error(f"--{name} {getattr(a, name)} is invalid; fix: pass a positive integer")
    if not a.candidates:
        try:
            import torch  # noqa: F401
        except ImportError:
            ap.error("torch is not installed; fix: pip install -r bench/requirements.txt (torch==2.13.0, CPU)")

    from mshelpers.metrics import flops_per_token
    fpt = flops_per_token(N_PARAMS, DIMS["layers"], DIMS["dim"], SEQ)
    peak_before = run_isolated(ms_peak_flops).value
    if a.candidates:
        chosen = {k: v for k, v in candidates().items() if not a.only or k in a.only}
        sides = {name: (ms_side, {k: v for k, v in kw.items() if k != "env"}, kw.get("env"))
                 for name, kw in chosen.items()}
    else:
        sides = {"mindspore (cookbook recipe)": (ms_side, BEST_MS, None),
                 "pytorch eager": (torch_side, {}, TORCH_ENV)}
        if not a.no_compile:
            sides["pytorch torch.compile"] = (torch_side, dict(compile=True), TORCH_ENV)
    if not a.candidates:   # like for like first: same weights, same 3 AdamW steps, same losses
        eq = run_isolated(equivalence).value
        print(f"equivalence (lean MindSpore vs PyTorch, same weights, 3 steps): max |loss diff| {eq['max_abs_diff']:.2e}")
    pooled = alternate(sides, a.repeats, a.steps, a.warmup)
    peak = max(peak_before, run_isolated(ms_peak_flops).value)   # best of two probes, before and after
    # MindSpore's and PyTorch's CPU matmul kernels differ on this machine, so the hardware's practical
    # peak is the faster of the two; mfu uses peak_flops() (MindSpore's, cached), as the notebooks do.
    torch_peak = 0.0 if a.candidates else run_isolated(torch_peak_flops, env=TORCH_ENV).value
    rows = rows_for(pooled, peak, fpt, max(peak, torch_peak))
    when = time.strftime("%Y-%m-%d %H:%M")
    csv = build_dir("bench") / ("ms_candidates.csv" if a.candidates else "compare_pytorch.csv")
    print(f"mini LLaMA, {N_PARAMS:,} parameters, batch {BATCH} x seq {SEQ}; {a.repeats} repeats x {a.steps} "
          f"steady steps per side; peak {peak / 1e9:.0f} GFLOP/s (peak_flops(), compiled MindSpore MatMuls, cached)"
          + (f", {torch_peak / 1e9:.0f} GFLOP/s (the same matmul in PyTorch); " if torch_peak else "; ")
          + f"{fpt / 1e6:.2f} MFLOP/token")
    print(markdown_table(rows, digits=4))
    try:
        for r in rows:
            append_csv({"when": when, **r, "peak_gflops": peak / 1e9, "torch_peak_gflops": torch_peak / 1e9}, csv)
    except ValueError:   # an older file with other columns: start a new one rather than lose the run
        csv = csv.with_name(f"{csv.stem}-{time.strftime('%Y%m%d-%H%M%S')}.csv")
        for r in rows:
            append_csv({"when": when, **r, "peak_gflops": peak / 1e9, "torch_peak_gflops": torch_peak / 1e9}, csv)
    print(f"rows appended to {csv}")
    by = {r["side"]: r for r in rows}
    if a.candidates:
        logged = pooled.get("recipe + per-step StepLogger")
        if logged and logged["log_s"]:
            log_ms, step_ms = statistics.median(logged["log_s"]) * 1e3, statistics.median(logged["step_s"]) * 1e3
            print(f"StepLogger.log_step: median {log_ms:.3f} ms per step = {100 * log_ms / step_ms:.2f}% of "
                  f"the {step_ms:.0f} ms step (target < 1%)")
        return 0
    # Runs of one round are seconds apart, so their ratio is the least noisy comparison on a shared machine.
    ms_rounds = pooled["mindspore (cookbook recipe)"]["round_median_s"]
    for other in [n for n in pooled if n.startswith("pytorch")]:
        ratios = [o / m for o, m in zip(pooled[other]["round_median_s"], ms_rounds)]
        print(f"per-round tokens/s ratio mindspore/{other.split()[1]}: "
              + ", ".join(f"{r:.2f}" for r in ratios) + f" (median {statistics.median(ratios):.2f})")
    ms_tps, pt = by["mindspore (cookbook recipe)"]["tokens_per_s"], by["pytorch eager"]["tokens_per_s"]
    if "pytorch torch.compile" in by:
        print(f"ratio mindspore/torch.compile tokens/s: {ms_tps / by['pytorch torch.compile']['tokens_per_s']:.2f}")
    print(f"ratio mindspore/pytorch_eager tokens/s: {ms_tps / pt:.2f}")
    return 0


if __name__ == "__main__":
    # Re-import under the package name: the spawned runs must find the side functions by module name.
    from bench import compare_pytorch
    raise SystemExit(compare_pytorch.main())
