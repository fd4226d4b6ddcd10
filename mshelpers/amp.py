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


def _build_dir(*parts: str) -> Any:
    """config.build_dir(*parts) inside the cookbook; copied alone, $MSHELPERS_BUILD or ./build (created)."""
    import os
    from pathlib import Path
    try:
        if __package__:
            from .config import build_dir
        else:  # copied beside its siblings as plain files
            from config import build_dir
        return build_dir(*parts)
    except ImportError:
        p = Path(os.environ.get("MSHELPERS_BUILD") or Path.cwd() / "build").joinpath(*parts)
        p.mkdir(parents=True, exist_ok=True)
        return p


__all__ = [
    "number_formats",
    "to_bfloat16",
    "auto_mixed_precision",
    "activation_stats",
    "find_first_nonfinite",
    "NonfiniteReport",
    "DtypeReport",
    "dtype_report",
    "make_scaled_train_step",
]

_FLOAT_DTYPES = ("Float16", "Float32", "Float64", "BFloat16")
AMP_LEVELS = ("O0", "O1", "O2", "O3")   # ms.amp levels (config.AMP_LEVELS; repeated so this file copies alone)


# ------------------------------------------------------------ number formats
def to_bfloat16(x: Any) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even) by bit arithmetic; the result is
    a float32 array holding bfloat16 values, so numpy needs no bfloat16 dtype.

    Example:
        >>> to_bfloat16([1.0, 70000.0, 3.0e38]).tolist()
        [1.0, 70144.0, 3.00405527047391e+38]

    Taught in notebooks/03_mixed_precision.ipynb.
    """
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    bits = a.view(np.uint32).astype(np.uint64)
    # bfloat16 is the top 16 bits of float32; add half an ulp (plus the tie-to-even bit) first.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), np.float32("nan"), out)


def _bf16_bits(pattern: int) -> float:
    return float(np.array([pattern << 16], dtype=np.uint32).view(np.float32)[0])


def number_formats() -> list[dict]:
    """float32, float16 and bfloat16 side by side: bit layout, largest finite value, smallest
    normal value and machine epsilon (gap from 1.0 to the next value). float32/float16 come
    from `np.finfo`; bfloat16 from its bit patterns (0x7F7F, 0x0080, 0x3F81 - 0x3F80).
    Taught in notebooks/03_mixed_precision.ipynb.
    """
    rows = []
    for name, dt in (("float32", np.float32), ("float16", np.float16)):
        fi = np.finfo(dt)
        rows.append({"format": name, "sign/exp/mantissa bits": f"1/{fi.nexp}/{fi.nmant}",
                     "max": float(fi.max), "smallest normal": float(fi.tiny), "epsilon": float(fi.eps)})
    rows.append({"format": "bfloat16", "sign/exp/mantissa bits": "1/8/7", "max": _bf16_bits(0x7F7F),
                 "smallest normal": _bf16_bits(0x0080), "epsilon": _bf16_bits(0x3F81) - _bf16_bits(0x3F80)})
    return rows


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


def auto_mixed_precision(net: Any, level: str, workdir: str | None = None) -> Any:
    """`ms.amp.auto_mixed_precision(net, level)`, run inside `workdir` (default build/amp_rewrite).

    Level O1 rewrites the network's source and saves it under ./rewritten_network of the
    current directory, where the graph compiler later reads it; running the rewrite in a build
    folder keeps those files out of the notebook folder.
    Taught in notebooks/03_mixed_precision.ipynb.
    """
    import contextlib
    import os

    import mindspore as ms

    if level not in AMP_LEVELS:
        raise ValueError(f"auto_mixed_precision: level={level!r} is invalid; fix: use one of {AMP_LEVELS}")
    cwd = os.getcwd()
    os.chdir(workdir or str(_build_dir("amp_rewrite")))
    try:
        return ms.amp.auto_mixed_precision(net, level)
    finally:
        with contextlib.suppress(OSError):
            os.chdir(cwd)


# ------------------------------------------------------- activation statistics
def activation_stats(net: Any, *inputs: Any) -> list[dict]:
    """Run `net(*inputs)` once in PyNative mode and return one row per sub-cell call, in the
    order the calls *finished* (so an inner layer comes before the block that contains it).

    Each row: {"cell": dotted name ("" for net itself), "type": class name, "dtype": dtype of
    the first floating output, "max_abs": largest finite |value| over the floating outputs,
    "finite": False if any floating output holds inf or NaN, "inputs_finite": False if any
    floating input already did}.

    Example (an input of 1e38 through all-ones weights: the first Dense sums four of them to inf):
        >>> import numpy as np, mindspore as ms
        >>> from mindspore import nn
        >>> net = nn.SequentialCell(nn.Dense(4, 4, weight_init="ones"), nn.ReLU(),
        ...                         nn.Dense(4, 1, weight_init="ones"))
        >>> x = ms.Tensor(np.full((2, 4), 1e38, np.float32))
        >>> rows = activation_stats(net, x)
        >>> [(r["cell"], r["type"], r["finite"], r["inputs_finite"]) for r in rows]
        [('0', 'Dense', False, True), ('1', 'ReLU', False, False), ('2', 'Dense', False, False), ('', 'SequentialCell', False, True)]
        >>> [r["cell"] for r in rows if not r["finite"]][:1]
        ['0']

    Taught in notebooks/03_mixed_precision.ipynb.
    """
    _check_net_and_inputs("activation_stats", net, inputs)
    names = {id(c): n for n, c in net.cells_and_names()}
    rows: list[dict] = []

    def hook(cell: Any, args: Any, output: Any) -> None:
        floats = [t for t in _tensors_in(output) if _is_float(t)]
        arrays = [_to_numpy_f32(t) for t in floats]
        finite = all(bool(np.isfinite(a).all()) for a in arrays)
        finite_vals = [np.abs(a[np.isfinite(a)]) for a in arrays]
        max_abs = max((float(v.max()) for v in finite_vals if v.size), default=float("nan"))
        inputs_finite = all(bool(np.isfinite(_to_numpy_f32(t)).all()) for t in _tensors_in(args) if _is_float(t))
        rows.append({"cell": names.get(id(cell), "?"), "type": type(cell).__name__,
                     "dtype": _dtype_name(floats[0]) if floats else "-",
                     "max_abs": max_abs, "finite": finite, "inputs_finite": inputs_finite})

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
    """What `find_first_nonfinite(..., grads=True)` found: the sub-cell where the forward pass first
    turned non-finite, and the first parameter (walking back from the loss) whose gradient is
    non-finite. Either is None when everything is finite. When the forward is already non-finite,
    every gradient is downstream of it, so `param` is None and `note` says so.
    Taught with the rest of amp.py in notebooks/03_mixed_precision.ipynb."""
    cell: str | None
    param: str | None
    note: str | None = None


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


def _origin(rows: list[dict]) -> str | None:
    """The cell where the forward turned non-finite: the first (to finish) whose inputs were finite and
    output not. A cell that only passed on a non-finite input is skipped, so an overflow in a parent's own
    construct (e.g. its MatMul) is named as that parent, not as the child it then fed (e.g. its softmax)."""
    bad = [r for r in rows if not r["finite"]]
    if not bad:
        return None
    return next((r["cell"] for r in bad if r.get("inputs_finite", True)), bad[0]["cell"])


def find_first_nonfinite(net: Any, *inputs: Any, grads: bool = False) -> str | NonfiniteReport | None:
    """Name of the sub-cell where the forward output first turned inf or NaN, or None.

    That is the first cell to finish whose floating inputs were all finite and whose output is
    not: an overflow inside a leaf (a Dense) names the leaf; an overflow in a cell's own construct
    code (its children's outputs finite, its own output not) names that cell, even when it then
    passed the inf on to a child such as a softmax. The root network is reported as "" when the
    overflow happened in its own construct. With `grads=True` the network must return a loss
    (or a tensor to differentiate) and the result is a `NonfiniteReport(cell, param, note)`; with
    a non-finite forward, `param` is None and `note` says the forward must be fixed first.

    Example (on mindformers' LlamaForCausalLM the name reads e.g. 'model.layers.2.feed_forward.w2'):
        >>> import numpy as np, mindspore as ms
        >>> from mindspore import nn
        >>> net = nn.SequentialCell(nn.Dense(4, 4, weight_init="ones"), nn.ReLU(),
        ...                         nn.Dense(4, 1, weight_init="ones"))
        >>> big = ms.Tensor(np.full((2, 4), 1e38, np.float32))     # 4 x 1e38 overflows float32
        >>> find_first_nonfinite(net, big)
        '0'
        >>> find_first_nonfinite(net, big, grads=True).note
        "the forward pass is already non-finite at '0': every gradient depends on it, so no parameter is named; fix the forward first"
        >>> find_first_nonfinite(net, ms.Tensor(np.ones((2, 4), np.float32)), grads=True)
        NonfiniteReport(cell=None, param=None, note=None)

    Taught in notebooks/03_mixed_precision.ipynb.
    """
    _check_net_and_inputs("find_first_nonfinite", net, inputs)
    if not isinstance(grads, bool):
        raise ValueError(f"find_first_nonfinite: grads={grads!r} must be True or False")
    first = _origin(activation_stats(net, *inputs))
    if not grads:
        return first
    if first is not None:
        return NonfiniteReport(cell=first, param=None,
                               note=f"the forward pass is already non-finite at {first!r}: every gradient "
                                    "depends on it, so no parameter is named; fix the forward first")
    return NonfiniteReport(cell=None, param=_first_nonfinite_grad(net, inputs))


# ------------------------------------------------------------------- dtypes
def _share(counter: Counter) -> str:
    total = sum(counter.values())
    if not total:
        return "-"
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counter.most_common())


@dataclass
class DtypeReport:
    """Parameter dtypes (weighted by element count) and activation dtypes (one vote per
    sub-cell output). `summary()` gives one table row; `per_cell` the detail.
    Taught with the rest of amp.py in notebooks/03_mixed_precision.ipynb."""
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

    Example (the last Dense computes in float16, its float32 weights cast on the fly):
        >>> import numpy as np, mindspore as ms
        >>> from mindspore import nn
        >>> net = nn.SequentialCell(nn.Dense(4, 4), nn.ReLU(), nn.Dense(4, 1))
        >>> _ = net[2].to_float(ms.float16)
        >>> dtype_report(net, ms.Tensor(np.ones((2, 4), np.float32))).summary()
        {'param dtypes': 'float32 100%', 'activation dtypes': 'float32 67%, float16 33%'}

    Taught in notebooks/03_mixed_precision.ipynb.
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
    """One scaled step: its loss, whether every gradient was finite, the loss scale after it and the gradient norm.
    Taught with the rest of amp.py in notebooks/03_mixed_precision.ipynb."""
    loss: float
    finite: bool
    scale: float
    grad_norm: float


def make_scaled_train_step(loss_net: Any, optimizer: Any, *, init_scale: float = 2.0 ** 16,
                           scale_factor: int = 2, scale_window: int = 1000, grad_clip: float = 0.0,
                           jit: bool = True) -> Callable[[Any], ScaledStepResult]:
    """A train step with `ms.amp.DynamicLossScaler` and `ms.amp.all_finite`, with its knobs exposed.

    `loss_net(*inputs)` must return the scalar loss: mindformers' LlamaForCausalLM called with
    input_ids does, and so does a loss cell such as `nn.WithLossCell(net, loss_fn)` called with
    (data, label). The first call checks the inputs against loss_net.construct's signature and
    raises one ValueError naming the arguments before any gradient is taken. On a step whose
    gradients overflow, the update is skipped and the scale divided by `scale_factor`; after
    `scale_window` finite steps in a row it is multiplied by it. Needs MindSpore and train_step.py (no
    RunConfig): the step is `train_step.build_step`'s, the one `mshelpers.train.make_train_step` builds, here
    with a dynamic scaler (mode "jit" when `jit`, else "pynative").

    Returns `step(*inputs) -> ScaledStepResult(loss, finite, scale, grad_norm)` as Python numbers;
    `scale` is the value after this step's adjustment. `step.scaler` is the scaler.

    Example (a zero-initialised Dense fitting y = 1; an inf input makes one step overflow):
        >>> import numpy as np, mindspore as ms
        >>> from mindspore import nn
        >>> net = nn.WithLossCell(nn.Dense(4, 1, weight_init="zeros", bias_init="zeros"), nn.MSELoss())
        >>> step = make_scaled_train_step(net, nn.SGD(net.trainable_params(), 0.1),
        ...                               init_scale=2**16, scale_window=50)
        >>> x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.ones((2, 1), np.float32))
        >>> r = step(x, y); r.loss, r.finite, r.scale
        (1.0, True, 65536.0)
        >>> r = step(x * np.inf, y); r.finite, r.scale          # update skipped, scale halved
        (False, 32768.0)
        >>> r = step(x, y); round(r.loss, 4), r.finite           # the first step's update is intact
        (0.0, True)

    Taught in notebooks/03_mixed_precision.ipynb.
    """
    import mindspore as ms
    from mindspore import nn

    if not isinstance(loss_net, nn.Cell):
        raise ValueError(f"make_scaled_train_step: loss_net={type(loss_net).__name__} is not an nn.Cell; "
                         f"fix: pass a Cell whose construct(x) returns the loss")
    if not isinstance(optimizer, nn.Optimizer):
        raise ValueError(f"make_scaled_train_step: optimizer={type(optimizer).__name__} is not an "
                         f"nn.Optimizer; fix: e.g. nn.AdamWeightDecay(net.trainable_params(), 1e-3)")
    import numbers

    if not (isinstance(init_scale, numbers.Real) and not isinstance(init_scale, bool) and init_scale >= 1):
        raise ValueError(f"make_scaled_train_step: init_scale={init_scale!r} must be a number >= 1, e.g. 2**16")
    if isinstance(scale_factor, numbers.Real) and not isinstance(scale_factor, bool) \
            and float(scale_factor).is_integer():
        scale_factor = int(scale_factor)     # numpy ints and 2.0 are fine; DynamicLossScaler wants an int
    if not (isinstance(scale_factor, int) and scale_factor >= 2):
        raise ValueError(f"make_scaled_train_step: scale_factor={scale_factor!r} must be an int >= 2 "
                         f"(DynamicLossScaler only accepts integers), e.g. 2")
    if isinstance(scale_window, numbers.Integral) and not isinstance(scale_window, bool):
        scale_window = int(scale_window)
    if not (isinstance(scale_window, int) and scale_window >= 1):
        raise ValueError(f"make_scaled_train_step: scale_window={scale_window!r} must be an int >= 1, e.g. 1000")
    if not (isinstance(grad_clip, numbers.Real) and not isinstance(grad_clip, bool) and grad_clip >= 0):
        raise ValueError(f"make_scaled_train_step: grad_clip={grad_clip!r} must be >= 0 (0 disables clipping)")

    scaler = ms.amp.DynamicLossScaler(scale_value=float(init_scale), scale_factor=scale_factor,
                                      scale_window=scale_window)
    if __package__:
        from .train_step import build_step
    else:  # copied beside its siblings as plain files
        from train_step import build_step
    inner = build_step(loss_net, optimizer, mode="jit" if jit else "pynative", scaler=scaler, clip=grad_clip)
    checked: list[int] = []

    def step(*xs: Any) -> ScaledStepResult:
        if len(xs) not in checked:           # before the first gradient: do the inputs fit construct?
            _check_call(loss_net, xs)
            checked.append(len(xs))
        loss, grad_norm, finite = inner(*xs)
        if not hasattr(loss, "shape") or int(np.prod(loss.shape)) != 1:
            raise ValueError(f"make_scaled_train_step: loss_net returned shape {getattr(loss, 'shape', '?')}, "
                             "not a scalar loss; fix: end construct with a reduction (e.g. .mean())")
        return ScaledStepResult(float(loss.asnumpy().reshape(())), bool(finite.asnumpy()),
                                float(scaler.scale_value.asnumpy()), float(grad_norm.asnumpy()))

    step.scaler = scaler
    return step


def _check_call(net: Any, xs: tuple) -> None:
    """ValueError unless net.construct accepts these positional inputs (checked before any gradient)."""
    import inspect

    try:
        sig = inspect.signature(net.construct)
    except (TypeError, ValueError):
        return                               # a construct without a readable signature: let MindSpore say
    try:
        sig.bind(*xs)
    except TypeError as e:
        params = [p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p.name for p in sig.parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        raise ValueError(f"make_scaled_train_step: {type(net).__name__}.construct{sig} got {len(xs)} input(s) "
                         f"({e}); fix: call step({', '.join(required) or '...'}) with one tensor per required "
                         f"argument ({len(required)} required, {len(params)} accepted)") from None


# ------------------------------------------------ one AMP level, for run_isolated
def amp_level_run(level: str, preset: str = "mini", steps: int = 4, seed: int = 0,
                  peak_flops: float | None = None, compile_cache: str | None = None) -> dict:
    """Train `preset` in GRAPH_MODE at AMP `level` through mindformers' own precision knobs
    (`mshelpers.model.precision_knobs`) and return one table row: the knobs, first and median
    step time, loss at the last step, overflow steps, and the parameter/activation dtypes.

    Meant for `mshelpers.timing.run_isolated`, which adds the process's peak RSS: each level
    in a fresh process, so memory and compile caches do not leak between levels. `compile_cache`: a folder
    for MindSpore's compile cache (`train.compile_cache`), so that a second process of the same level loads
    its graph instead of compiling it.

    Example (the level is checked before any MindSpore work):
        >>> from mshelpers.timing import run_isolated
        >>> amp_level_run("O4")
        Traceback (most recent call last):
        ValueError: amp_level_run: level='O4' is invalid; fix: use one of ('O0', 'O1', 'O2', 'O3')
        >>> r = run_isolated(amp_level_run, "O2", steps=4)  # spawns a process that compiles and trains mini  # doctest: +SKIP
        >>> r.value["median step (ms)"], r.peak_rss_mb      # needs r from the skipped line above  # doctest: +SKIP

    Taught in notebooks/03_mixed_precision.ipynb.
    """
    if __package__:
        from .config import AMP_LEVELS, RunConfig, build_dir
        from .data import numpy_batches
        from .device import setup
        from .model import build_model, precision_knobs
        from .train import compile_cache as cached, train
    else:  # copied beside its siblings as plain files
        from config import AMP_LEVELS, RunConfig, build_dir
        from data import numpy_batches
        from device import setup
        from model import build_model, precision_knobs
        from train import compile_cache as cached, train

    if level not in AMP_LEVELS:
        raise ValueError(f"amp_level_run: level={level!r} is invalid; fix: use one of {AMP_LEVELS}")
    import mindspore as ms

    cfg = RunConfig.preset(preset).replace(mode="graph", amp_level=level, steps=steps, seed=seed).validate()
    device = setup(mode="graph", seed=seed)
    net = build_model(cfg, device)
    with cached(cfg, compile_cache):   # None: compile as usual
        hist = train(cfg, net=net, progress=False, peak_flops=peak_flops or 1.0,
                     csv_path=build_dir("runs") / f"amp-{preset}-{level}.csv")
    s = hist.summary()
    x = ms.Tensor(next(numpy_batches(cfg)), ms.int32)
    dtypes = dtype_report(net, x).summary()
    knobs = precision_knobs(cfg, device)
    return {"level": level, "compute": knobs["compute_dtype"], "softmax": knobs["softmax_compute_type"],
            "norm": knobs["layernorm_compute_type"], **dtypes,
            "first step (s)": s["compile_time_s"], "median step (ms)": 1e3 * s["median_step_s"],
            f"loss at step {steps}": s["final_loss"], "overflow steps": s["overflow_steps"]}
