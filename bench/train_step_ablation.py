"""Where the cookbook runner's train step loses time against nn.TrainOneStepCell (mindformers mini LLaMA).

    python -m bench.train_step_ablation [--repeats 2] [--steps 15]

Variants, each in a fresh process, alternating (the order reverses every round):
  cell      nn.TrainOneStepCell(net, optimizer)
  cookbook  mshelpers.train.make_train_step (loss scale, all_finite, grad norm, clipping, `if finite:`)
  plain     ms.jit of value_and_grad + `loss = ops.depend(loss, optimizer(grads))`
  finite    ms.jit of value_and_grad + all_finite + `if finite: optimizer(grads)`
  norm      plain + global grad norm and clipping
  depend    plain + all_finite computed but unused
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mshelpers.timing import run_isolated  # noqa: E402

VARIANTS = ("cell", "cookbook", "plain", "finite", "norm", "depend")


def variant(kind: str, steps: int = 15, warmup: int = 3) -> tuple[float, float]:
    """(first step s, median steady step s) of one variant in this (fresh) process."""
    import numpy as np
    import mshelpers  # noqa: F401
    import mindspore as ms
    from mindspore import amp, nn, ops
    from mshelpers.config import RunConfig
    from mshelpers.device import setup
    from mshelpers.model import build_model
    from mshelpers.train import make_optimizer, make_train_step
    setup("graph", seed=0)
    cfg = RunConfig.preset("mini").replace(mode="graph", steps=100)
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    x = ms.Tensor(np.random.default_rng(0).integers(0, 1024, (8, 129)).astype(np.int32))
    if kind == "cell":
        cell = nn.TrainOneStepCell(net, opt)
        cell.set_train()
        run = lambda: cell(x)
    elif kind == "cookbook":
        st = make_train_step(net, opt, cfg)
        run = lambda: st(x)[0]
    else:
        grad_fn = ms.value_and_grad(net, None, opt.parameters)

        def step(ids):
            loss, grads = grad_fn(ids)
            if kind == "norm":
                gn = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
                grads = tuple(g * ops.minimum(1.0 / (gn + 1e-6), 1.0) for g in grads)
            if kind == "finite":
                if amp.all_finite(grads):
                    opt(grads)
            else:
                if kind == "depend":
                    amp.all_finite(grads)
                loss = ops.depend(loss, opt(grads))
            return loss
        jitted = ms.jit(step)
        run = lambda: jitted(x)
    times = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        float(run().asnumpy())
        times.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[warmup:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.train_step_ablation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.steps < 1:
        ap.error(f"--repeats {a.repeats} / --steps {a.steps} invalid; fix: pass positive integers")
    from bench import train_step_ablation as me
    res: dict[str, list[float]] = {k: [] for k in a.variants}
    first: dict[str, list[float]] = {k: [] for k in a.variants}
    for r in range(a.repeats):
        for k in (a.variants if r % 2 == 0 else a.variants[::-1]):
            f, med = run_isolated(me.variant, k, a.steps).value
            res[k].append(med)
            first[k].append(f)
            print(f"round {r + 1}: {k:9s} first step {f:5.1f} s, median step {med * 1e3:4.0f} ms", flush=True)
    base = statistics.median(res["cell"]) if "cell" in res else None
    print("| variant | median step ms | vs TrainOneStepCell | first step s |\n|---|---|---|---|")
    for k in a.variants:
        m = statistics.median(res[k])
        print(f"| {k} | {m * 1e3:.0f} | {m / base:.2f}x | {statistics.median(first[k]):.1f} |" if base else
              f"| {k} | {m * 1e3:.0f} | - | {statistics.median(first[k]):.1f} |")
    return 0


if __name__ == "__main__":
    from bench import train_step_ablation
    raise SystemExit(train_step_ablation.main())
