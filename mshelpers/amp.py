"""Mixed-precision debugging: find where a forward pass first overflows, report dtypes,
and build a train step with dynamic loss scaling.

Example:
    >>> import numpy as np, mindspore as ms
    >>> from mindspore import nn
    >>> from mshelpers.amp import find_first_nonfinite, dtype_report
    >>> net = nn.SequentialCell(nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 1))
    >>> x = ms.Tensor(np.ones((2, 4), np.float32))
    >>> find_first_nonfinite(net, x) is None
    True
    >>> dtype_report(net, x).summary()["param dtypes"]
    'float32 100%'

`find_first_nonfinite` and the activation half of `dtype_report` run the network once in
PyNative mode with forward hooks on every sub-cell (hooks do not fire inside a compiled
graph, so the helpers switch to PyNative for the probe and switch back afterwards).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

__all__ = [
    "activation_stats",
    "find_first_nonfinite",
    "NonfiniteReport",
    "DtypeReport",
    "dtype_report",
    "make_scaled_train_step",
]

_FLOAT_DTYPES = ("Float16", "Float32", "Float64", "BFloat16")


# ------------------------------------------------------------------ helpers
def _check_net_and_inputs(fn_name: str, net: Any, inputs: tuple) -> None:
    from mindspore import nn

    if not isinstance(net, nn.Cell):
        raise ValueError(f"{fn_name}: net={type(net).__name__} is not a mindspore.nn.Cell; "
                         f"fix: pass the network object (e.g. the LlamaForCausalLM), not its output")
    if not inputs:
        raise ValueError(f"{fn_name}: no inputs given; fix: call {fn_name}(net, *inputs) with the "
                         f"tensors you would pass to net(...)")


def _tensors_in(obj: Any) -> list:
    """Every Tensor inside a (possibly nested) tuple/list/dict output."""
    from mindspore import Tensor

    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors_in(o)]
    return []


def _is_float(t: Any) -> bool:
    return str(t.dtype) in _FLOAT_DTYPES


def _to_numpy_f32(t: Any) -> np.ndarray:
    import mindspore as ms

    # bfloat16 has no numpy dtype; go through float32 on the device side.
    return (t.astype(ms.float32) if str(t.dtype) == "BFloat16" else t).asnumpy().astype(np.float32)


def _dtype_name(t: Any) -> str:
    return str(t.dtype).lower()


class _PyNative:
    """Context manager: run the body in PyNative mode (hooks need it), then restore the mode."""

    def __enter__(self) -> "_PyNative":
        import mindspore as ms

        self._mode = ms.get_context("mode")
        if self._mode != ms.PYNATIVE_MODE:
            ms.set_context(mode=ms.PYNATIVE_MODE)
        return self

    def __exit__(self, *exc: Any) -> None:
        import mindspore as ms

        if self._mode != ms.PYNATIVE_MODE:
            ms.set_context(mode=self._mode)


# ------------------------------------------------------- activation statistics
def activation_stats(net: Any, *inputs: Any) -> list[dict]:
    """Run `net(*inputs)` once in PyNative mode and return one row per sub-cell call, in the
    order the calls *finished* (so an inner layer comes before the block that contains it).

    Each row: {"cell": dotted name ("" for net itself), "type": class name, "dtype": dtype of
    the first floating output, "max_abs": largest finite |value| over the floating outputs,
    "finite": False if any floating output holds inf or NaN}.

    Example:
        >>> rows = activation_stats(net, x)
        >>> [r["cell"] for r in rows if not r["finite"]][:1]
    """
    _check_net_and_inputs("activation_stats", net, inputs)
    names = {id(c): n for n, c in net.cells_and_names()}
    rows: list[dict] = []

    def hook(cell: Any, _args: Any, output: Any) -> None:
        floats = [t for t in _tensors_in(output) if _is_float(t)]
        arrays = [_to_numpy_f32(t) for t in floats]
        finite = all(bool(np.isfinite(a).all()) for a in arrays)
        finite_vals = [np.abs(a[np.isfinite(a)]) for a in arrays]
        max_abs = max((float(v.max()) for v in finite_vals if v.size), default=float("nan"))
        rows.append({"cell": names.get(id(cell), "?"), "type": type(cell).__name__,
                     "dtype": _dtype_name(floats[0]) if floats else "-",
                     "max_abs": max_abs, "finite": finite})

    handles = []
    with _PyNative():
        try:
            for _, cell in net.cells_and_names():
                handles.append(cell.register_forward_hook(hook))
            net(*inputs)
        finally:
            for h in handles:
                h.remove()
    return rows


class NonfiniteReport(NamedTuple):
    """What `find_first_nonfinite(..., grads=True)` found: the first sub-cell whose forward
    output is non-finite and the first parameter (walking back from the loss) whose gradient is
    non-finite. Either is None when everything is finite."""
    cell: str | None
    param: str | None


def _first_nonfinite_grad(net: Any, inputs: tuple) -> str | None:
    import mindspore as ms

    params = net.trainable_params()
    if not params:
        return None
    with _PyNative():
        _, grads = ms.value_and_grad(net, grad_position=None, weights=params)(*inputs)
    # Back-propagation visits parameters roughly in reverse creation order; the first
    # non-finite one met on that walk is where the backward pass broke.
    for p, g in reversed(list(zip(params, grads))):
        if not np.isfinite(_to_numpy_f32(g)).all():
            return p.name
    return None


def find_first_nonfinite(net: Any, *inputs: Any, grads: bool = False) -> str | NonfiniteReport | None:
    """Name of the first sub-cell whose forward output contains inf or NaN, or None.

    "First" means first to finish, so the innermost layer that produced the overflow is named,
    not the block around it. The root network is reported as "" only if no sub-cell overflowed
    (the overflow happened in its own construct). With `grads=True` the network must return a
    loss (or a tensor to differentiate) and the result is a `NonfiniteReport(cell, param)`.

    Example:
        >>> find_first_nonfinite(net, input_ids)                 # e.g. 'model.layers.2.feed_forward.w2'
        >>> find_first_nonfinite(net, input_ids, grads=True)     # NonfiniteReport(cell=..., param=...)
    """
    _check_net_and_inputs("find_first_nonfinite", net, inputs)
    if not isinstance(grads, bool):
        raise ValueError(f"find_first_nonfinite: grads={grads!r} must be True or False")
    first = next((r["cell"] for r in activation_stats(net, *inputs) if not r["finite"]), None)
    if not grads:
        return first
    return NonfiniteReport(cell=first, param=_first_nonfinite_grad(net, inputs))


# ------------------------------------------------------------------- dtypes
def _share(counter: Counter) -> str:
    total = sum(counter.values())
    if not total:
        return "-"
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counter.most_common())


@dataclass
class DtypeReport:
    """Parameter dtypes (weighted by element count) and activation dtypes (one vote per
    sub-cell output). `summary()` gives one table row; `per_cell` the detail."""
    param_elements: Counter = field(default_factory=Counter)
    activation_outputs: Counter = field(default_factory=Counter)
    per_cell: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {"param dtypes": _share(self.param_elements),
                "activation dtypes": _share(self.activation_outputs) if self.per_cell else "(no inputs given)"}


def dtype_report(net: Any, *inputs: Any) -> DtypeReport:
    """Which dtypes a network actually holds and computes in.

    Parameters are read directly. Activations need one forward pass, so pass the inputs
    (`dtype_report(net, x)`); without inputs only parameter dtypes are reported.

    Example:
        >>> dtype_report(net, x).summary()
        {'param dtypes': 'float32 100%', 'activation dtypes': 'float16 80%, float32 20%'}
    """
    from mindspore import nn

    if not isinstance(net, nn.Cell):
        raise ValueError(f"dtype_report: net={type(net).__name__} is not a mindspore.nn.Cell; "
                         f"fix: pass the network object")
    rep = DtypeReport()
    for p in net.get_parameters():
        rep.param_elements[_dtype_name(p)] += int(np.prod(p.shape)) if p.shape else 1
    if inputs:
        rep.per_cell = activation_stats(net, *inputs)
        # the root's output is the loss/logits; count only the sub-cells' activations
        rep.activation_outputs.update(r["dtype"] for r in rep.per_cell if r["cell"] and r["dtype"] != "-")
    return rep


# -------------------------------------------------- loss-scaled train step
class ScaledStepResult(NamedTuple):
    loss: float
    finite: bool
    scale: float
    grad_norm: float


def make_scaled_train_step(loss_net: Any, optimizer: Any, *, init_scale: float = 2.0 ** 16,
                           scale_factor: int = 2, scale_window: int = 1000, grad_clip: float = 0.0,
                           jit: bool = True) -> Callable[[Any], ScaledStepResult]:
    """A train step with `ms.amp.DynamicLossScaler` and `ms.amp.all_finite`, with its knobs exposed.

    `loss_net(x)` must take one tensor and return the scalar loss: mindformers'
    LlamaForCausalLM called with input_ids does, and so does a hand-written LM whose
    construct(input_ids) returns the loss. On a step whose gradients overflow, the update is
    skipped and the scale divided by `scale_factor`; after `scale_window` finite steps in a row
    it is multiplied by it. The step itself is `mshelpers.train.make_train_step` (one
    implementation for the whole cookbook); this function only builds the scaler.

    Returns `step(x) -> ScaledStepResult(loss, finite, scale, grad_norm)` as Python numbers;
    `scale` is the value after this step's adjustment. `step.scaler` is the scaler.

    Example:
        >>> step = make_scaled_train_step(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3),
        ...                               init_scale=2**16, scale_window=50)
        >>> r = step(input_ids); r.loss, r.finite, r.scale
    """
    import mindspore as ms
    from mindspore import nn

    if not isinstance(loss_net, nn.Cell):
        raise ValueError(f"make_scaled_train_step: loss_net={type(loss_net).__name__} is not an nn.Cell; "
                         f"fix: pass a Cell whose construct(x) returns the loss")
    if not isinstance(optimizer, nn.Optimizer):
        raise ValueError(f"make_scaled_train_step: optimizer={type(optimizer).__name__} is not an "
                         f"nn.Optimizer; fix: e.g. nn.AdamWeightDecay(net.trainable_params(), 1e-3)")
    if not (isinstance(init_scale, (int, float)) and init_scale >= 1):
        raise ValueError(f"make_scaled_train_step: init_scale={init_scale!r} must be a number >= 1, e.g. 2**16")
    if not (isinstance(scale_factor, int) and scale_factor >= 2):
        raise ValueError(f"make_scaled_train_step: scale_factor={scale_factor!r} must be an int >= 2 "
                         f"(DynamicLossScaler only accepts integers), e.g. 2")
    if not (isinstance(scale_window, int) and scale_window >= 1):
        raise ValueError(f"make_scaled_train_step: scale_window={scale_window!r} must be an int >= 1, e.g. 1000")
    if not (isinstance(grad_clip, (int, float)) and grad_clip >= 0):
        raise ValueError(f"make_scaled_train_step: grad_clip={grad_clip!r} must be >= 0 (0 disables clipping)")

    from .config import RunConfig
    from .train import make_train_step

    scaler = ms.amp.DynamicLossScaler(scale_value=float(init_scale), scale_factor=scale_factor,
                                      scale_window=scale_window)
    # make_train_step reads only mode, grad_clip, grad_accum and dynamic_loss_scale from the config
    cfg = RunConfig().replace(mode="graph" if jit else "pynative", grad_clip=float(grad_clip),
                              dynamic_loss_scale=True, loss_scale=float(init_scale))
    inner = make_train_step(loss_net, optimizer, cfg, loss_scaler=scaler)

    def step(x: Any) -> ScaledStepResult:
        loss, grad_norm, finite, scale = inner(x)
        return ScaledStepResult(float(loss.asnumpy()), bool(finite.asnumpy()), float(scale.asnumpy()),
                                float(grad_norm.asnumpy()))

    step.scaler = scaler
    return step
