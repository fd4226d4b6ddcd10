"""The training step, built once: loss scaling, gradients (accumulated over micro-batches), a DP gradient
reducer, all_finite, the global gradient norm in float32, clipping, the update (skipped on overflow) and the
dynamic scale's adjustment.

Example (a Dense fitting y = 1 with plain SGD; the step returns Tensors):
    >>> import numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> from mshelpers.train_step import build_step
    >>> net = nn.WithLossCell(nn.Dense(4, 1, weight_init="zeros", bias_init="zeros"), nn.MSELoss())
    >>> step = build_step(net, nn.SGD(net.trainable_params(), 0.1), mode="pynative", clip=1.0)
    >>> loss, grad_norm, finite = step(ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.ones((2, 1), np.float32)))
    >>> float(loss.asnumpy()), round(float(grad_norm.asnumpy()), 4), bool(finite.asnumpy())
    (1.0, 4.4721, True)

Every caller builds its step here: `train.make_train_step` (notebooks 01, 02 and the CLI), `amp.make_scaled_train_step`
(notebook 03), the msrun DP worker `workers/dp_train.py` (notebook 04 and the doctor's CPU check) and the CPU check
of `workers/semi_auto_llama.py` (notebook 05: data parallel with accumulation). Three forms:
- mode="graph": an nn.Cell, compiled when the context is GRAPH_MODE. Its Parameters (the model's, the scaler's, the
  accumulation buffer) are graph inputs, so MindSpore 2.9's compile cache brings them back intact (an `ms.jit`
  function reaching them through a closure reads zeros from a warm cache: tests/test_train.py);
- mode="pynative": a Python function, op by op;
- mode="jit": that function under `ms.jit` (compiled in any context; notebook 03's step).
The forms share their parts (`_parts`: the unscale by 1 / (scale * k), the reducer, all_finite, the norm, the clip,
the update skipped on overflow, the dynamic scale's adjustment) and their gradients (`_loss_and_grads`); they differ
only in where the sum over micro-batches lives (a buffer of Parameters for the Cells, a tuple for the function).
Copy this file alone: it needs MindSpore only, imported when a step is built.
"""
from __future__ import annotations

from typing import Any, Callable

MODES = ("graph", "pynative", "jit")


# --- the parts of the step, each written once: both forms call them ---
def _parts():
    """(grad_map, plus, unscale, update): the step's parts, written once and called by both forms, the Cell's
    `construct` (compiled in GRAPH_MODE: graph ops only, and every Parameter passed in as the Cell's own
    attribute, never reached through another object) and the Python function (op by op, or under `ms.jit`).

    unscale(loss, grads, scale_value, k) -> (loss, grads): loss and gradients summed over k micro-batches and
        scaled by scale_value (None: not scaled), made the mean's and unscaled: both times 1 / (scale * k);
    update(grads, reducer, clip, optimizer, scale_value, counter, scale_factor, scale_window) ->
        (grad_norm, finite): the reducer, all_finite, the global norm in float32, the clip, the optimizer's
        update skipped on overflow, and (counter not None) the dynamic scale's adjustment.

    The per-gradient ops are mapped over the gradient tuple with HyperMap, as MindSpore's own loss-scale cells
    write them. The kernels are those of a tuple comprehension and the numbers bitwise the same (checked:
    losses, gradient norms and loss scales of mini and tiny runs), but the graph compiler gets one mapped graph
    instead of one unrolled call per parameter and op. Measured on an AMD EPYC (family 25 model 17): mini's
    first graph step (the compile) about 12 s with comprehensions, about 7 s mapped. The squares are summed in
    float32 whatever the gradient's dtype (a float16 square overflows above 256)."""
    import mindspore as ms
    from mindspore import amp, ops
    from mindspore.ops import composite as C

    grad_map = C.HyperMap()
    times = C.MultitypeFuncGraph("times")

    @times.register("Tensor", "Tensor")
    def _times(factor, g):      # a def, not a lambda: the graph parser reads the registered function's source
        return g * factor.astype(g.dtype)

    square_sum = C.MultitypeFuncGraph("square_sum")

    @square_sum.register("Tensor")
    def _square_sum(g):
        return ops.reduce_sum(ops.square(g.astype(ms.float32)))

    plus = C.MultitypeFuncGraph("plus")

    @plus.register("Tensor", "Tensor")
    def _plus(a, g):
        return a + g

    def unscale(loss, grads, scale_value, k):
        if scale_value is None:
            if k == 1:
                return loss, grads
            inv = ops.ones((), ms.float32) / k
        else:
            inv = ops.reciprocal(scale_value)          # DynamicLossScaler.unscale's factor
            if k > 1:
                inv = inv / k
        return loss * inv.astype(loss.dtype), grad_map(ops.partial(times, inv), grads)

    def adjust_scale(scale_value, counter, finite, scale_factor, scale_window):
        """DynamicLossScaler.adjust (MindSpore 2.9), on the Parameters given."""
        one = ops.ones((), scale_value.dtype)
        up = scale_value * scale_factor
        new = ops.select(finite,
                         ops.select(counter == (scale_window - 1),
                                    ops.select(ops.isfinite(up), up, scale_value), scale_value),
                         ops.maximum(one, scale_value / scale_factor))
        ops.assign(scale_value, new)
        return ops.assign(counter, ((counter + 1) % scale_window) * finite)

    def update(grads, reducer, clip, optimizer, scale_value, counter, scale_factor, scale_window):
        if reducer is not None:
            grads = reducer(grads)        # e.g. all-reduce, then divide by the world (mean=True)
        finite = amp.all_finite(grads)
        grad_norm = ops.sqrt(ops.addn(grad_map(square_sum, grads)))
        if clip > 0:
            factor = ops.minimum(clip / (grad_norm + 1e-6), 1.0)   # reuse the norm instead of recomputing it
            grads = grad_map(ops.partial(times, factor), grads)
        if finite:
            optimizer(grads)
        if counter is not None:
            adjust_scale(scale_value, counter, finite, scale_factor, scale_window)
        return grad_norm, finite

    return grad_map, plus, unscale, update


def _loss_and_grads(net, scale_value, params):
    """value_and_grad of net's loss (times scale_value when given) with respect to params: both forms' gradients."""
    import mindspore as ms
    from mindspore import nn

    class Scaled(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.net, self.scale_value = net, scale_value

        def construct(self, *xs):
            loss = self.net(*xs)
            return loss * self.scale_value.astype(loss.dtype)

    return ms.value_and_grad(net if scale_value is None else Scaled(), None, params)


def _split(xs: tuple, k: int, i: int) -> tuple:
    """Micro-batch i of k: rows [i * b / k, (i + 1) * b / k) of every input."""
    micro = xs[0].shape[0] // k
    return tuple(x[i * micro:(i + 1) * micro] for x in xs)


def _summed(micro_step, xs: tuple, k: int, add):
    """micro_step's outputs over the k micro-batches of xs, summed with add (both forms' accumulation loop)."""
    total = micro_step(*_split(xs, k, 0))
    for i in range(1, k):
        total = add(total, micro_step(*_split(xs, k, i)))
    return total


def _scaler_state(scaler, dynamic: bool) -> tuple:
    """(scale_value, counter, scale_factor, scale_window): the scaler's Parameters and settings for update."""
    return (scaler.scale_value if scaler is not None else None, scaler.counter if dynamic else None,
            float(scaler.scale_factor) if dynamic else 2.0, int(scaler.scale_window) if dynamic else 1)


# --- the builder ---
def build_step(net: Any, optimizer: Any, *, mode: str = "graph", scaler: Any = None, dynamic: bool | None = None,
               clip: float = 0.0, accum: int = 1, reducer: Any = None) -> Callable[..., tuple]:
    """Return step(*inputs) -> (loss, grad_norm, finite), Tensors; `net(*inputs)` returns the scalar loss.

    scaler: a MindSpore LossScaler (None: no scaling); `dynamic` (default: it is a DynamicLossScaler) adjusts its
    scale after each step. accum = k > 1 splits the batch (every input's first axis) into k micro-batches whose
    gradients are averaged before one update. reducer: a Cell applied to the unscaled gradients before the norm
    (e.g. `nn.DistributedGradReducer(params, mean=True)`). The norm is the global L2 norm of the gradients,
    each squared and summed in float32; clip > 0 scales them by min(clip / (norm + 1e-6), 1); a step whose
    gradients hold inf or NaN skips the update. `step.scaler` is the scaler.

    Taught in notebooks/02_graph_mode.ipynb (through `train.make_train_step`), notebooks/03_mixed_precision.ipynb
    (loss scaling) and notebooks/04_data_parallel.ipynb (the DP reducer).
    """
    if mode not in MODES:
        raise ValueError(f"build_step: mode={mode!r} is invalid; fix: use one of {MODES}")
    if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
        raise ValueError(f"build_step: accum={accum!r} is invalid; fix: pass an integer >= 1")
    if mode == "jit" and accum > 1:
        raise ValueError("build_step: mode='jit' with accum > 1 is not built; fix: use mode='graph' (one graph per "
                         "micro-batch and one for the update)")
    from mindspore import amp
    if dynamic is None:
        dynamic = isinstance(scaler, amp.DynamicLossScaler)
    clip = float(clip)
    if mode == "graph":
        inner = _step_cell(net, optimizer, scaler, clip, bool(dynamic), accum, reducer)
    else:
        inner = _step_function(net, optimizer, scaler, clip, bool(dynamic), accum, reducer, jit=mode == "jit")

    def step(*xs):
        return inner(*xs)
    step.scaler = scaler
    return step


# --- PyNative (and ms.jit): a Python function ---
def build_grads(net: Any, params: Any, *, scaler: Any = None, accum: int = 1) -> Callable[..., tuple]:
    """Return grads(*inputs) -> (loss, gradients) of `net(*inputs)` (the scalar loss) with respect to params:
    with accum = k > 1 over k micro-batches of the batch (every input's first axis), summed, then times 1 / k;
    with a scaler, the loss scaled before the gradient and both unscaled after. A Python function, op by op (or
    inside `ms.jit`): the first half of build_step's function form, whose update follows. The DP worker
    `workers/semi_auto_llama.py` (notebook 05) checks accumulation against one pass with it.
    Taught in: no notebook; workers/semi_auto_llama.py and workers/straggler_steps.py call it."""
    grad_map, plus, unscale, _ = _parts()
    scale_value = scaler.scale_value if scaler is not None else None
    grad_fn = _loss_and_grads(net, scale_value, params)

    if accum == 1:
        def grads(*xs):
            loss, g = grad_fn(*xs)
            return unscale(loss, g, scale_value, 1)
        return grads

    def add(a, b):                      # (loss, gradients) of two micro-batches
        return a[0] + b[0], grad_map(plus, a[1], b[1])

    def accum_grads(*xs):               # each micro-batch's gradients added to the tuple, then one unscale
        loss, g = _summed(grad_fn, xs, accum, add)
        return unscale(loss, g, scale_value, accum)
    return accum_grads


def _step_function(net, optimizer, scaler, clip: float, dynamic: bool, k: int, reducer, jit: bool = False):
    """The step as a Python function: build_grads, then the update; op by op, or compiled whole under `ms.jit`."""
    import mindspore as ms

    *_, update = _parts()
    grads_of = build_grads(net, optimizer.parameters, scaler=scaler, accum=k)
    scale_value, counter, scale_factor, scale_window = _scaler_state(scaler, dynamic)

    def fused_step(*xs):
        loss, grads = grads_of(*xs)
        grad_norm, finite = update(grads, reducer, clip, optimizer, scale_value, counter, scale_factor, scale_window)
        return loss, grad_norm, finite
    return ms.jit(fused_step) if jit else fused_step


# --- GRAPH_MODE: Cells ---
def _step_cell(net, optimizer, scaler, clip: float, dynamic: bool, k: int = 1, reducer=None):
    """The GRAPH_MODE step as an nn.Cell: loss scaling, gradients (summed over k micro-batches of the batch, then
    divided by k), the reducer, all_finite, global-norm clip, the update (skipped on overflow) and the dynamic
    scale's adjustment, with the scaler's state as the Cell's own Parameters. With k > 1 it returns a function
    over two Cells: one graph, called once per micro-batch, adds that micro-batch's gradients to a
    gradient-sized buffer of Parameters; the other applies the update from the buffer and zeroes it. The buffer
    stays on the device, so no gradient tuple crosses into Python between the graphs; and the one gradient
    graph serves every micro-batch, so one micro-batch's working memory is live at a time. (Peak RSS, 2 x 16
    sequences of 256 on the tiny preset in GRAPH_MODE: 1350 MiB, against 1995 for 1 x 32; a separate graph per
    micro-batch, or one graph unrolling all k, held 1879-1889 MiB. Tuples passed between jitted functions
    instead, with host round trips: tiny preset, 2 micro-batches, 6 alternated rounds on an AMD EPYC family 25
    model 17, 47.6 ms per update against 20.4 this way; the plain step 11.9 ms.) A warm compile cache (MindSpore
    2.9) drops Parameters the graph reaches through another object: a step that called `scaler.adjust` kept
    its scale at 2**127 through overflows. So the scale and counter are attributes here (the scaler's own
    Parameter objects: checkpoints still save them through it), passed explicitly to `_parts`' update, whose
    adjust_scale writes out `DynamicLossScaler.adjust`'s update on them."""
    import mindspore as ms
    from mindspore import nn, ops

    grad_map, _, unscale, update = _parts()

    class FusedStep(nn.Cell):
        """k = 1: construct(*inputs), the whole step. accu given: construct(loss_sum), the update from the
        accumulation buffer (the sum of k micro-batches' scaled gradients), which it then zeroes."""
        def __init__(self, accu=None):
            super().__init__(auto_prefix=False)
            self.optimizer, self.clip, self.k, self.reducer = optimizer, clip, k, reducer
            self.scale_value, self.counter, self.scale_factor, self.scale_window = _scaler_state(scaler, dynamic)
            self.from_buffer, self.accu = accu is not None, accu
            if accu is None:
                self.grad_fn = _loss_and_grads(net, self.scale_value, optimizer.parameters)
            self.map = grad_map

        def construct(self, *xs):
            if self.from_buffer:
                loss, grads = xs[0], self.accu
            else:
                loss, grads = self.grad_fn(*xs)
            loss, grads = unscale(loss, grads, self.scale_value, self.k)
            grad_norm, finite = update(grads, self.reducer, self.clip, self.optimizer, self.scale_value,
                                       self.counter, self.scale_factor, self.scale_window)
            if self.from_buffer:
                grad_norm = ops.depend(grad_norm, self.map(ops.assign, self.accu, self.map(ops.zeros_like, self.accu)))
            return loss, grad_norm, finite

    if k == 1:
        return FusedStep()

    class AccumGrads(nn.Cell):
        """One micro-batch: its (scaled) gradients added to the buffer."""
        def __init__(self, accu):
            super().__init__(auto_prefix=False)
            self.accu, self.map = accu, grad_map
            self.grad_fn = _loss_and_grads(net, scaler.scale_value if scaler is not None else None,
                                           optimizer.parameters)

        def construct(self, *xs):
            loss, grads = self.grad_fn(*xs)
            return ops.depend(loss, self.map(ops.assign_add, self.accu, grads))

    # the accumulation buffer: one gradient-sized Parameter per trainable parameter (mindformers' accu_grads),
    # kept on the device between the graphs; each Cell holds it (and the scaler's Parameters) itself
    accu = ms.ParameterTuple(ms.Parameter(ops.zeros_like(p), name=f"accu_grads.{p.name}", requires_grad=False)
                             for p in optimizer.parameters)
    micro_step, apply = AccumGrads(accu), FusedStep(accu)

    def accum_step(*xs):
        return apply(_summed(micro_step, xs, k, lambda a, b: a + b))
    return accum_step
