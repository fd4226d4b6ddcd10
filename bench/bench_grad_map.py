"""What mapping the per-gradient ops saves in the graph compile: the training step's unscale, global norm and
clip written as tuple comprehensions (one call per parameter and op, how `train_step._step_cell` was written
before) against `train.make_train_step` as it is (HyperMap over a MultitypeFuncGraph).

    python -m bench.bench_grad_map [--rounds 3] [--preset mini]

Each run is a fresh process (a graph compiles once per process), the two alternate in rotated order, and every
run trains 4 steps of the preset in graph mode from seed 0. Prints the first step (the compile) and the steady
step of each, with their ranges, and whether the losses and gradient norms of the two are bitwise equal.
README.md ("Map per-gradient ops") quotes its output.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def comprehension_step(net, optimizer, clip: float):
    """The k = 1 graph step with the per-gradient ops unrolled, as `train_step._step_cell` was before HyperMap
    (a frozen copy on purpose: it is the baseline; no dynamic scale, as in the mini preset)."""
    import mindspore as ms
    from mindspore import amp, nn, ops

    class Step(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.optimizer, self.clip = optimizer, clip
            self.scale_value = ms.Parameter(ms.Tensor(1.0, ms.float32), name="scale", requires_grad=False)
            self.grad_fn = ms.value_and_grad(Scaled(net, self.scale_value), None, optimizer.parameters)

        def construct(self, input_ids):
            loss, grads = self.grad_fn(input_ids)
            inv = ops.reciprocal(self.scale_value)
            loss = loss * inv.astype(loss.dtype)
            grads = tuple(g * inv.astype(g.dtype) for g in grads)
            finite = amp.all_finite(grads)
            grad_norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g.astype(ms.float32))) for g in grads]))
            if self.clip > 0:
                factor = ops.minimum(self.clip / (grad_norm + 1e-6), 1.0)
                grads = tuple(g * factor.astype(g.dtype) for g in grads)
            if finite:
                self.optimizer(grads)
            return loss, grad_norm, finite

    class Scaled(nn.Cell):
        def __init__(self, net, scale_value):
            super().__init__(auto_prefix=False)
            self.net, self.scale_value = net, scale_value

        def construct(self, input_ids):
            loss = self.net(input_ids)
            return loss * self.scale_value.astype(loss.dtype)

    return Step()


def one_run(kind: str, preset: str) -> dict:
    from mshelpers.config import RunConfig
    from mshelpers.data import numpy_batches
    from mshelpers.device import setup
    from mshelpers.model import build_model
    from mshelpers.train import make_optimizer, make_train_step
    import mindspore as ms

    cfg = RunConfig.preset(preset).replace(mode="graph", seed=0, steps=4)
    setup(mode="graph", seed=0)
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    step = comprehension_step(net, opt, float(cfg.grad_clip)) if kind == "comprehension" else \
        make_train_step(net, opt, cfg)
    batches = numpy_batches(cfg)
    times, losses, norms = [], [], []
    for _ in range(cfg.steps):
        x = ms.Tensor(next(batches), ms.int32)
        t = time.perf_counter()
        out = step(x)
        loss = float(out[0].asnumpy())
        times.append(time.perf_counter() - t)
        losses.append(loss)
        norms.append(float(out[1].asnumpy()))
    return {"first_s": times[0], "steady_s": statistics.median(times[1:]), "losses": losses, "norms": norms}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="mini")
    a = ap.parse_args()
    from mshelpers.peak import cpu_info
    from mshelpers.timing import run_isolated
    from bench.bench_grad_map import one_run      # by its module name: run_isolated pickles it for the child
    kinds = ["comprehension", "HyperMap"]
    runs = {k: [] for k in kinds}
    for r in range(a.rounds):
        for k in kinds[r % 2:] + kinds[:r % 2]:          # rotated order
            runs[k].append(run_isolated(one_run, k, a.preset).value)
            print(f"round {r + 1}: {k:13s} first step {runs[k][-1]['first_s']:.2f} s", flush=True)
    info = cpu_info()
    print(f"\n{info['cpu_model']} (family {info['cpu_family']}), {a.preset}, {a.rounds} rounds, fresh process each\n")
    print("| step written with | first step (s): median (range) | steady step (ms): median (range) |\n|---|---|---|")
    for k in kinds:
        f = [x["first_s"] for x in runs[k]]
        s = [1e3 * x["steady_s"] for x in runs[k]]
        print(f"| {k} | {statistics.median(f):.2f} ({min(f):.2f}-{max(f):.2f}) | "
              f"{statistics.median(s):.0f} ({min(s):.0f}-{max(s):.0f}) |")
    same = all(x["losses"] == y["losses"] and x["norms"] == y["norms"]
               for x in runs["comprehension"] for y in runs["HyperMap"])
    print(f"\nlosses and gradient norms bitwise equal across every run of both: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
