"""mshelpers.train_step: the one training step, every form against an independent numpy reference.

`build_step` makes the step for GRAPH_MODE (a Cell), PyNative (a function) and `ms.jit`, with or without a loss
scaler, gradient accumulation and a DP gradient reducer; `train.make_train_step`, `amp.make_scaled_train_step` and
`workers/dp_train.py` all call it. Here each combination takes one step on a tiny net and must give what plain
numpy gives (float64): the loss, the global gradient norm, and the SGD update, whose size is the clipped
gradient itself (AdamW's first step would hide a wrong factor: it divides the gradient by its own size).

The net holds a float16 parameter whose gradient is 600 (300 after the reducer), so its square overflows float16:
a norm not summed in float32 comes out inf, clips every gradient to zero and fails here. With accumulation the
two micro-batches' gradients differ, so a buffer that keeps only one of them fails too. (Both checked by hand
when this file was written: `.astype(ms.float32)` dropped from the square_sum, and `ops.assign_add` replaced by
`ops.assign` / `a + g / k` by `g / k`.)

The two forms share one update (`train_step._parts`); the last test runs three steps of each (clip, reducer, a
dynamic scale that overflows) and they must agree. Checked by hand when it was written: the clip skipped in the
shared update fails the numpy tests (20 of them); the clip or the scale's counter dropped from the Cell's call
alone fails the three-step test.
"""
import itertools

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops import composite as C

from mshelpers.device import setup
from mshelpers.train_step import build_step

LR, CLIP, C_H, SCALE = 0.01, 60.0, 600.0, 16.0
RNG = np.random.default_rng(0)
W0 = {"w1": RNG.normal(0, 0.5, (4, 8)).astype(np.float32), "b1": RNG.normal(0, 0.1, (8,)).astype(np.float32),
      "w2": RNG.normal(0, 0.5, (8, 1)).astype(np.float32), "b2": np.zeros((1,), np.float32),
      "h": np.zeros((4,), np.float16)}
X = RNG.normal(0, 1, (4, 4)).astype(np.float32)
X[2:] *= 3.0                                     # the second micro-batch's gradients differ from the first's
Y = RNG.normal(0, 1, (4, 1)).astype(np.float32)


class TinyLoss(nn.Cell):
    """mean((tanh(x w1 + b1) w2 + b2 - y)^2) + sum(600 * float32(h)), h a float16 parameter."""

    def __init__(self):
        super().__init__()
        for name, a in W0.items():
            setattr(self, name, Parameter(Tensor(a), name=name))

    def construct(self, x, y):
        a = ops.tanh(ops.matmul(x, self.w1) + self.b1)
        r = ops.matmul(a, self.w2) + self.b2 - y
        return ops.mean(ops.square(r)) + ops.reduce_sum(self.h.astype(ms.float32) * C_H)


_half = C.MultitypeFuncGraph("half")


@_half.register("Tensor")
def _half_g(g):
    return g * 0.5


class HalfMean(nn.Cell):
    """A DP reducer's mean over two ranks whose other rank sent zeros: every gradient halved. (A real
    DistributedGradReducer needs msrun; an identity would not show where the reducer sits.)"""

    def __init__(self):
        super().__init__()
        self.map = C.HyperMap()

    def construct(self, grads):
        return self.map(_half, grads)


def reference(reduce: bool):
    """loss, gradients, global norm and the updated weights, in float64."""
    w = {k: v.astype(np.float64) for k, v in W0.items()}
    x, y = X.astype(np.float64), Y.astype(np.float64)
    a = np.tanh(x @ w["w1"] + w["b1"])
    r = a @ w["w2"] + w["b2"] - y
    loss = float((r ** 2).mean())                  # h is zero: its term adds nothing
    dout = 2 * r / r.size
    da = dout @ w["w2"].T * (1 - a ** 2)
    g = {"w1": x.T @ da, "b1": da.sum(0), "w2": a.T @ dout, "b2": dout.sum(0), "h": np.full(4, C_H)}
    if reduce:
        g = {k: v * 0.5 for k, v in g.items()}
    norm = float(np.sqrt(sum((v ** 2).sum() for v in g.values())))
    factor = min(CLIP / (norm + 1e-6), 1.0)
    return loss, norm, {k: w[k] - LR * factor * g[k] for k in w}


CASES = [c for c in itertools.product(("graph", "pynative", "jit"), (False, True), (1, 2), (False, True))
         if not (c[0] == "jit" and c[2] > 1)]      # jit builds the k = 1 step only (refused below)


@pytest.mark.parametrize("mode,scaled,accum,reduce", CASES,
                         ids=[f"{m}-{'scaled' if s else 'plain'}-k{k}-{'reducer' if r else 'noreducer'}"
                              for m, s, k, r in CASES])
def test_each_form_matches_the_numpy_reference(mode, scaled, accum, reduce):
    setup(mode="graph" if mode == "graph" else "pynative", seed=0)
    net = TinyLoss()
    scaler = ms.amp.DynamicLossScaler(scale_value=SCALE, scale_factor=2, scale_window=1) if scaled else None
    step = build_step(net, nn.SGD(net.trainable_params(), learning_rate=LR), mode=mode, scaler=scaler,
                      clip=CLIP, accum=accum, reducer=HalfMean() if reduce else None)
    loss, grad_norm, finite = step(Tensor(X), Tensor(Y))
    want_loss, want_norm, want_w = reference(reduce)
    assert want_norm > 256 and CLIP / want_norm < 0.2      # float16 squares overflow; the clip is active
    assert bool(finite.asnumpy())
    assert float(loss.asnumpy()) == pytest.approx(want_loss, rel=1e-5)
    assert str(grad_norm.dtype) == "Float32" and float(grad_norm.asnumpy()) == pytest.approx(want_norm, rel=1e-5)
    for p in net.trainable_params():
        got, want, w0 = p.asnumpy().astype(np.float64), want_w[p.name], W0[p.name].astype(np.float64)
        moved = np.abs(want - w0).max()
        assert moved > 0                                            # every weight took the step
        tol = (2e-3 if p.name == "h" else 1e-4) * moved + 1e-7     # float16's and float32's rounding
        assert np.abs(got - want).max() < tol, (p.name, got, want)
    if scaled:                                  # a finite step with scale_window 1: the scale doubled
        assert float(scaler.scale_value.asnumpy()) == 2 * SCALE and step.scaler is scaler


def test_an_overflowed_step_skips_the_update_and_halves_the_scale():
    for mode in ("graph", "pynative"):
        setup(mode=mode, seed=0)
        net = TinyLoss()
        scaler = ms.amp.DynamicLossScaler(scale_value=SCALE, scale_factor=2, scale_window=1)
        step = build_step(net, nn.SGD(net.trainable_params(), learning_rate=LR), mode=mode, scaler=scaler, clip=CLIP)
        _, _, finite = step(Tensor(X * np.inf), Tensor(Y))
        assert not bool(finite.asnumpy()) and float(scaler.scale_value.asnumpy()) == SCALE / 2
        assert all(np.array_equal(p.asnumpy(), W0[p.name]) for p in net.trainable_params())


@pytest.mark.parametrize("kw,needle", [({"mode": "eager"}, "mode='eager' is invalid"),
                                       ({"accum": 0}, "accum=0 is invalid"),
                                       ({"mode": "jit", "accum": 2}, "mode='jit' with accum > 1")])
def test_bad_settings_are_one_line_with_the_fix(kw, needle):
    with pytest.raises(ValueError, match="fix:") as e:
        build_step(None, None, **kw)
    assert needle in str(e.value)


# --- train.make_train_step on the real model (was tests/test_step_reference.py) ---
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_one_llama_step_unscales_clips_and_updates_like_a_numpy_reference(mode):
    """make_train_step's step on mindformers' model: value_and_grad of the unscaled loss (MindSpore, op by op),
    then the global norm in float64, the clip factor min(clip / (norm + 1e-6), 1) and plain SGD in numpy."""
    from mshelpers.config import RunConfig
    from mshelpers.data import numpy_batches
    from mshelpers.model import build_model
    from mshelpers.train import make_train_step

    def weights(net):
        return [p.asnumpy().copy() for p in net.trainable_params()]

    lr = 0.5
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
    w_ref = [w - lr * factor * a for w, a in zip(w0, g)]

    setup(mode=mode, seed=0)                         # the step under test, from the same initial weights
    net = build_model(cfg)
    assert all(np.array_equal(a, b) for a, b in zip(w0, weights(net)))
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=lr), cfg)
    loss, grad_norm, finite, scale = step(x)
    assert bool(finite.asnumpy()) and float(scale.asnumpy()) == 1024.0
    assert abs(float(loss.asnumpy()) - float(loss_ref.asnumpy())) < 1e-5      # the scale undone on the loss
    assert abs(float(grad_norm.asnumpy()) - norm) < 1e-5 * norm                # and on the norm
    moved = [np.abs(b - a).max() for a, b in zip(w0, w_ref)]
    assert min(moved) > 0                                                       # every weight took the step
    for a, b, m in zip(weights(net), w_ref, moved):
        assert np.abs(a - b).max() < 1e-3 * m + 1e-7                            # the same step, to rounding


# --- the Cell and the function share one update: they must not diverge ---
FORMS = {1: ("graph", "pynative", "jit"), 2: ("graph", "pynative")}


def three_steps(mode: str, accum: int):
    """Three steps of one form with clip, the reducer and a dynamic scaler that starts too high: h's scaled
    gradient 600 x 128 = 76800 overflows float16 (65504); at 64 it fits (k = 2 sums two micro-batches' scaled
    gradients in float16, so 64 overflows too and 32 fits). scale_window 3 leaves the counter mid-window."""
    setup(mode="graph" if mode == "graph" else "pynative", seed=0)
    net = TinyLoss()
    scaler = ms.amp.DynamicLossScaler(scale_value=128.0, scale_factor=2, scale_window=3)
    step = build_step(net, nn.SGD(net.trainable_params(), learning_rate=LR), mode=mode, scaler=scaler,
                      clip=CLIP, accum=accum, reducer=HalfMean())
    out = [step(Tensor(X + i), Tensor(Y)) for i in range(3)]
    return ([(float(l.asnumpy()), float(n.asnumpy()), bool(f.asnumpy())) for l, n, f in out],
            {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()},
            float(scaler.scale_value.asnumpy()), int(scaler.counter.asnumpy()))


@pytest.mark.parametrize("accum", [1, 2])
def test_the_cell_and_the_function_forms_take_the_same_three_steps(accum):
    runs = {mode: three_steps(mode, accum) for mode in FORMS[accum]}
    steps, params, scale, counter = runs["graph"]
    # worked by hand: k = 1 overflows once (128 -> 64), then two finite steps count 2 of the window of 3;
    # k = 2 overflows twice (128 -> 64 -> 32), then one finite step counts 1
    want_finite, want_scale, want_counter = ([False, True, True], 64.0, 2) if accum == 1 else \
        ([False, False, True], 32.0, 1)
    assert [f for _, _, f in steps] == want_finite and (scale, counter) == (want_scale, want_counter)
    moved = {k: np.abs(v - W0[k]).max() for k, v in params.items()}
    assert min(moved.values()) > 0                                  # the finite steps updated every weight
    for mode, (s, p, sc, c) in runs.items():
        assert (sc, c) == (scale, counter), mode
        assert [f for _, _, f in s] == want_finite, mode
        for (l0, n0, f0), (l1, n1, _) in zip(steps, s):
            assert l1 == pytest.approx(l0, rel=1e-5) and (n1 == pytest.approx(n0, rel=1e-5) if f0 else True), mode
        for k in params:
            tol = (2e-3 if k == "h" else 1e-4) * moved[k] + 1e-7    # float16's and float32's rounding
            assert np.abs(p[k] - params[k]).max() < tol, (mode, k, p[k], params[k])
