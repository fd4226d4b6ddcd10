"""The training step's arithmetic against an independent reference, in both modes.

`train.make_train_step` unscales, takes the global gradient norm, clips and updates through HyperMap (one mapped
graph instead of one call per parameter, for a shorter compile). Here a reference written with plain numpy does
the same step: value_and_grad of the unscaled loss, the global norm in float64, the clip factor
min(clip / (norm + 1e-6), 1), and plain SGD, whose update is the clipped gradient itself (AdamW's first
step would hide a wrong factor: it divides the gradient by its own size). A wrong map (a factor not applied, a norm of the wrong
tensors, a loss scale not undone) moves the weights or the norm far beyond float32 rounding.
"""
import numpy as np
import pytest

from mshelpers.config import RunConfig
from mshelpers.data import numpy_batches
from mshelpers.device import setup
from mshelpers.model import build_model
from mshelpers.train import make_train_step

LR = 0.5


def weights(net):
    return [p.asnumpy().copy() for p in net.trainable_params()]


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_one_step_unscales_clips_and_updates_like_a_numpy_reference(mode):
    import mindspore as ms
    # clip far below the first step's gradient norm (about 5), so the clip factor matters; a loss scale to undo
    cfg = RunConfig.preset("tiny").replace(mode=mode, seed=0, steps=2, warmup_steps=0, grad_clip=0.05,
                                           loss_scale=1024.0, num_layers=1)
    x = ms.Tensor(next(numpy_batches(cfg)), ms.int32)

    setup(mode="pynative", seed=0)                   # the reference: op by op, numpy for the norm and clip
    ref = build_model(cfg)
    w0 = weights(ref)
    loss_ref, grads = ms.value_and_grad(ref, None, ref.trainable_params())(x)
    g = [t.asnumpy().astype(np.float64) for t in grads]
    norm = float(np.sqrt(sum((a * a).sum() for a in g)))
    factor = min(cfg.grad_clip / (norm + 1e-6), 1.0)
    assert factor < 0.1                              # the clip is active: this test would not see it otherwise
    w_ref = [w - LR * factor * a for w, a in zip(w0, g)]

    setup(mode=mode, seed=0)                         # the step under test, from the same initial weights
    net = build_model(cfg)
    assert all(np.array_equal(a, b) for a, b in zip(w0, weights(net)))
    from mindspore import nn
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=LR), cfg)
    loss, grad_norm, finite, scale = step(x)
    assert bool(finite.asnumpy()) and float(scale.asnumpy()) == 1024.0
    assert abs(float(loss.asnumpy()) - float(loss_ref.asnumpy())) < 1e-5      # the scale undone on the loss
    assert abs(float(grad_norm.asnumpy()) - norm) < 1e-5 * norm                # and on the norm
    moved = [np.abs(b - a).max() for a, b in zip(w0, w_ref)]
    assert min(moved) > 0                                                       # every weight took the step
    for a, b, m in zip(weights(net), w_ref, moved):
        assert np.abs(a - b).max() < 1e-3 * m + 1e-7                            # the same step, to rounding
