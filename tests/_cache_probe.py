"""Run in a fresh process by tests/test_train.py (its compile-cache section): 3 graph steps of the tiny preset, the step
built as an `ms.jit` function ("function"), or by `train.train` ("train": its Cell step with
a dynamic loss scale that overflows at first, so the scale must halve; "train-accum": the same with grad_accum=2,
its accumulation Cells); prints the losses and gradient norms (for "train"/"train-accum": losses and loss scales)."""
import json
import sys

import mindspore as ms
from mindspore import ops

from mshelpers.config import RunConfig
from mshelpers.data import numpy_batches
from mshelpers.device import setup
from mshelpers.model import build_model
from mshelpers.train import make_optimizer

kind = sys.argv[1]
if kind in ("train", "train-accum"):
    from mshelpers.train import train
    cfg = RunConfig.preset("tiny").replace(mode="graph", steps=4, dynamic_loss_scale=True, loss_scale=2.0 ** 127,
                                           warmup_steps=1)
    if kind == "train-accum":           # the same sequences per update, in 2 micro-batches
        cfg = cfg.replace(batch_size=cfg.batch_size // 2, grad_accum=2)
    h = train(cfg, steps=4, csv_path=sys.argv[2], progress=False)
    print("RESULT " + json.dumps([h.column("loss"), h.column("loss_scale")]))
    sys.exit(0)
cfg = RunConfig.preset("tiny").replace(mode="graph", steps=3)
setup(mode="graph", seed=cfg.seed)
net = build_model(cfg)
opt = make_optimizer(net, cfg)
grad_fn = ms.value_and_grad(net, None, opt.parameters)


@ms.jit
def step(input_ids):
    loss, grads = grad_fn(input_ids)
    opt(grads)
    return loss, ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))


batches = numpy_batches(cfg)
out = [[float(t.asnumpy()) for t in step(ms.Tensor(next(batches), ms.int32))] for _ in range(3)]
print("RESULT " + json.dumps(out))
