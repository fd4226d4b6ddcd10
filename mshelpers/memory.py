"""Training memory: estimate it from a RunConfig, check it against a measured peak.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers import memory
    >>> cfg = RunConfig.preset("llama2-7b")
    >>> memory.llama_param_count(cfg)
    6738415616
    >>> memory.model_state_bytes(7_000_000_000) / 1e9          # 16 bytes/param, ZeRO paper
    112.0
    >>> memory.model_state_bytes(7_000_000_000, zero_stage=3, dp=8) / 1e9
    14.0
    >>> est = memory.estimate(cfg, n_devices=8, zero_stage=1)
    >>> [round(est[k] / 1e9, 1) for k in ("params", "grads", "optimizer_states", "total")]
    [13.5, 13.5, 10.1, 874.5]
    >>> memory.fits(RunConfig.preset("mini"), 2**30)
    True

All sizes are bytes. Pure Python: nothing here imports MindSpore except
`measure_peak`, which runs a function in a fresh process and reads its peak.

Sources:
- Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", section 3.1 and figure 1 (2 + 2 + 12 bytes per parameter).
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", section 4 and table 2 (activation bytes per layer).
- Megatron-LM `megatron/training/theoretical_memory_usage.py` (18 bytes per parameter
  without the distributed optimizer) and DeepSpeed's
  `estimate_zero3_model_states_mem_needs` (18 bytes per parameter, fp32 gradients).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable

# Bytes per parameter for (parameters, gradients, optimizer states) under Adam.
ACCOUNTINGS: dict[str, tuple[int, int, int]] = {
    # ZeRO paper: fp16/bf16 params and grads, fp32 master copy + momentum + variance (4+4+4).
    "mixed": (2, 2, 12),
    # Plain fp32 training (what this CPU runs): fp32 params and grads, fp32 momentum + variance.
    "fp32": (4, 4, 8),
    # Megatron-LM and DeepSpeed code: 16-bit params, fp32 gradient buffer, fp32 master + moments.
    "fp32_grads": (2, 4, 12),
}
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE_MODES = ("none", "selective", "full")
_HALF_DTYPES = ("float16", "bfloat16")


# ---------------------------------------------------------------- parameter count
def llama_param_count(cfg: Any) -> int:
    """Parameters of mindformers' LlamaForCausalLM for `cfg` (no MindSpore needed).

    Embedding V·h, an untied lm_head V·h, and per layer 4·h² (q, k, v, o without bias)
    + 3·h·ffn (SwiGLU w1, w2, w3) + 2·h (two RMSNorm weights), then a final h norm.

        >>> from mshelpers.config import RunConfig
        >>> llama_param_count(RunConfig.preset("mini"))
        3688704
    """
    h, L, ffn, v = _pos_int(cfg, "hidden_size"), _pos_int(cfg, "num_layers"), \
        _pos_int(cfg, "ffn_hidden_size"), _pos_int(cfg, "vocab_size")
    per_layer = 4 * h * h + 3 * h * ffn + 2 * h
    return 2 * v * h + L * per_layer + h


# ---------------------------------------------------------------- model states
def model_state_breakdown(n_params: int, *, zero_stage: int = 0, dp: int = 1,
                          accounting: str = "mixed") -> dict[str, int]:
    """Bytes per device for parameters, gradients and optimizer states under Adam.

    `accounting` picks the bytes per parameter (params, grads, optimizer states):
      "mixed"      2 + 2 + 12 = 16: the ZeRO paper's mixed-precision Adam (Rajbhandari et al. 2020,
                   sec. 3.1): fp16 params and grads, fp32 master weights, momentum and variance.
      "fp32"       4 + 4 + 8 = 16: fp32 training, as on this CPU (no master copy needed).
      "fp32_grads" 2 + 4 + 12 = 18: what Megatron-LM's theoretical_memory_usage.py and DeepSpeed's
                   ZeRO estimators count, because both keep gradients in fp32.
    ZeRO shards over `dp` ranks, in order: stage 1 the optimizer states, stage 2 also the
    gradients, stage 3 also the parameters (so mixed Adam gives 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N).
    A shard is rounded up to whole bytes.

        >>> model_state_breakdown(1000, zero_stage=2, dp=4)
        {'params': 2000, 'grads': 500, 'optimizer_states': 3000}
    """
    if not isinstance(n_params, int) or isinstance(n_params, bool) or n_params <= 0:
        raise ValueError(f"model_state_bytes: n_params={n_params!r} is invalid; "
                         "fix: pass a positive integer parameter count, e.g. llama_param_count(cfg)")
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"model_state_bytes: zero_stage={zero_stage!r} is invalid; fix: use one of {ZERO_STAGES}")
    if not isinstance(dp, int) or isinstance(dp, bool) or dp <= 0:
        raise ValueError(f"model_state_bytes: dp={dp!r} is invalid; fix: pass the data-parallel "
                         "degree as a positive integer (1 = no sharding)")
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"model_state_bytes: accounting={accounting!r} is unknown; "
                         f"fix: use one of {sorted(ACCOUNTINGS)}")
    p_b, g_b, o_b = ACCOUNTINGS[accounting]

    def shard(total: int, sharded: bool) -> int:
        return -(-total // dp) if sharded else total   # ceil: the biggest rank's shard

    return {"params": shard(p_b * n_params, zero_stage >= 3),
            "grads": shard(g_b * n_params, zero_stage >= 2),
            "optimizer_states": shard(o_b * n_params, zero_stage >= 1)}


def model_state_bytes(n_params: int, *, zero_stage: int = 0, dp: int = 1, accounting: str = "mixed") -> int:
    """Total bytes per device for params + grads + Adam states (see `model_state_breakdown`).

        >>> model_state_bytes(10**9) / 1e9, model_state_bytes(10**9, zero_stage=1, dp=8) / 1e9
        (16.0, 5.5)
        >>> model_state_bytes(10**9, accounting="fp32_grads") / 1e9
        18.0
    """
    return sum(model_state_breakdown(n_params, zero_stage=zero_stage, dp=dp, accounting=accounting).values())


# ---------------------------------------------------------------- activations
def activation_bytes_per_layer(seq_len: int, batch: int, hidden_size: int, n_heads: int, *, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               bytes_per_value: int = 2) -> int:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al. 2022).

    With s = seq_len, b = micro-batch per device, h = hidden, a = heads, t = tp, and
    16-bit activations (their section 4.1, table 2):
      none, t = 1           s·b·h·(34 + 5·a·s/h)
      tensor parallel t     s·b·h·(10 + 24/t + 5·a·s/(h·t))   (norms, dropouts unsplit)
      tp + sequence par.    s·b·h·(34 + 5·a·s/h) / t
      selective recompute   drops the 5·a·s/h term (softmax, its dropout, QK^T, attention over V)
      full recompute        2·s·b·h: only the layer input is kept (/t with sequence parallel)
    The 34 counts a GPT block (LayerNorm, GeLU MLP of 4h, dropout masks at 1 byte). LLaMA has
    no dropout but a wider SwiGLU MLP, so treat the result as an estimate to check against a
    measurement. `bytes_per_value` rescales the whole count from 2 bytes to another width
    (4 for fp32 on CPU); the 1-byte masks are scaled too, which is slightly pessimistic.

        >>> activation_bytes_per_layer(128, 8, 256, 4)            # 128*8*256*(34+10)
        11534336
        >>> activation_bytes_per_layer(128, 8, 256, 4, recompute="full")
        524288
    """
    s, b, h, a, t = (_pos_arg("activation_bytes_per_layer", n, v) for n, v in
                     (("seq_len", seq_len), ("batch", batch), ("hidden_size", hidden_size),
                      ("n_heads", n_heads), ("tp", tp)))
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"activation_bytes_per_layer: recompute={recompute!r} is invalid; "
                         f"fix: use one of {RECOMPUTE_MODES}")
    if not isinstance(bytes_per_value, (int, float)) or isinstance(bytes_per_value, bool) or bytes_per_value <= 0:
        raise ValueError(f"activation_bytes_per_layer: bytes_per_value={bytes_per_value!r} is invalid; "
                         "fix: pass the activation width in bytes (2 for fp16/bf16, 4 for fp32)")
    sbh = s * b * h
    attn = 5 * a * s / h             # the s²-sized attention tensors, per sbh
    if recompute == "full":
        per_layer = 2 * sbh / (t if sequence_parallel else 1)
    elif sequence_parallel:
        per_layer = sbh * (34 + (0 if recompute == "selective" else attn)) / t
    else:
        per_layer = sbh * (10 + 24 / t + (0 if recompute == "selective" else attn / t))
    return math.ceil(per_layer * bytes_per_value / 2)


def output_activation_bytes(seq_len: int, batch: int, vocab_size: int, *, tp: int = 1,
                            bytes_per_value: int = 2) -> int:
    """Logits plus the fp32 softmax of the cross-entropy: 4·s·b·V/t bytes at 16 bits (Korthikanti eq. 4).

        >>> output_activation_bytes(128, 8, 1024)
        4194304
    """
    s, b, v, t = (_pos_arg("output_activation_bytes", n, x) for n, x in
                  (("seq_len", seq_len), ("batch", batch), ("vocab_size", vocab_size), ("tp", tp)))
    return math.ceil(4 * s * b * v / t * bytes_per_value / 2)


# ---------------------------------------------------------------- whole config
def estimate(cfg: Any, *, n_devices: int = 1, layout: Any = None, zero_stage: int = 0,
             accounting: str | None = None, bytes_per_value: int | None = None,
             sequence_parallel: bool | None = None, offload_optimizer: bool = False,
             activation_scale: float = 1.0, overhead_bytes: float = 0) -> dict[str, int]:
    """Peak training memory per device for a RunConfig, as a breakdown dict (bytes).

    Parallel degrees come from `layout` (any object with dp, mp (or tp), pp, micro_batches)
    or else from cfg.mp/pp/micro_batches with dp = n_devices/(mp·pp) (cfg.dp when n_devices=1).
    Micro-batch per device = cfg.batch_size / (dp · micro_batches); gradient accumulation
    keeps that micro-batch and adds a gradient-sized accumulation buffer. Under 1F1B pipeline
    the first stage holds min(pp, micro_batches) micro-batches of its L/pp layers.
    With recompute on, the backward of each layer rematerialises what that layer dropped,
    so the peak adds one layer's dropped activations ("recompute_working_set"): Korthikanti's
    table counts only what is stored between forward and backward.
    Defaults follow cfg.compute_dtype: float32 -> accounting "fp32" and 4-byte activations;
    float16/bfloat16 -> "mixed" and 2-byte activations. `offload_optimizer=True` moves the
    optimizer states to host memory (reported as "host_optimizer_states", not in "total").
    `activation_scale` and `overhead_bytes` calibrate the estimate against a measurement
    (see `calibrate`): activations are multiplied by the scale, and the constant (runtime,
    compiled graph, allocator pool) is added to the total.

    Keys: n_params (count, whole model), params, grads, optimizer_states, activations
    (stored layers + recompute working set + output logits, times activation_scale),
    activations_per_layer, recompute_working_set, output_activations, grad_accum_buffer,
    largest_activation (the biggest single activation tensor: logits or attention scores),
    host_optimizer_states, overhead, total (the per-device sum).

        >>> from mshelpers.config import RunConfig
        >>> e = estimate(RunConfig.preset("mini"))
        >>> e["params"], e["total"] == e["params"] + e["grads"] + e["optimizer_states"] + e["activations"]
        (14754816, True)
    """
    if getattr(cfg, "validate", None) is None:
        raise ValueError(f"estimate: cfg={type(cfg).__name__} is not a RunConfig; "
                         "fix: pass mshelpers.config.RunConfig.preset(...) or a .replace() of one")
    cfg.validate()
    if not isinstance(n_devices, int) or isinstance(n_devices, bool) or n_devices <= 0:
        raise ValueError(f"estimate: n_devices={n_devices!r} is invalid; fix: pass a positive integer")
    if not isinstance(overhead_bytes, (int, float)) or isinstance(overhead_bytes, bool) or not overhead_bytes >= 0:
        raise ValueError(f"estimate: overhead_bytes={overhead_bytes!r} is invalid; fix: pass a number >= 0")
    if not isinstance(activation_scale, (int, float)) or isinstance(activation_scale, bool) \
            or not activation_scale > 0:
        raise ValueError(f"estimate: activation_scale={activation_scale!r} is invalid; "
                         "fix: pass a positive number (1.0 = the formulas as published)")
    dp, tp, pp, micro = _degrees(cfg, n_devices, layout)
    if cfg.batch_size % (dp * micro):
        raise ValueError(f"estimate: cfg.batch_size={cfg.batch_size} is not divisible by dp*micro_batches = "
                         f"{dp}*{micro}; fix: use a batch_size that is a multiple of {dp * micro}")
    half = cfg.compute_dtype in _HALF_DTYPES
    accounting = accounting or ("mixed" if half else "fp32")
    bpv = bytes_per_value or (2 if half else 4)
    sp = bool(getattr(layout, "sequence_parallel", False)) if sequence_parallel is None else sequence_parallel

    n_params = llama_param_count(cfg)
    local_params = -(-n_params // (tp * pp))   # tp and pp split the weights; ZeRO then shards over dp
    states = model_state_breakdown(local_params, zero_stage=zero_stage, dp=dp, accounting=accounting)
    b = cfg.batch_size // (dp * micro)
    per_layer = activation_bytes_per_layer(cfg.seq_len, b, cfg.hidden_size, cfg.num_heads, tp=tp,
                                           sequence_parallel=sp, recompute=cfg.recompute, bytes_per_value=bpv)
    in_flight = min(pp, micro)
    layers = per_layer * (cfg.num_layers // pp) * in_flight
    working = 0
    if cfg.recompute != "none":
        working = activation_bytes_per_layer(cfg.seq_len, b, cfg.hidden_size, cfg.num_heads, tp=tp,
                                             sequence_parallel=sp, recompute="none",
                                             bytes_per_value=bpv) - per_layer
    output = output_activation_bytes(cfg.seq_len, b, cfg.vocab_size, tp=tp, bytes_per_value=bpv)
    # Accumulated gradients live next to the per-micro-step ones; sharded like them under ZeRO-2/3.
    accum = states["grads"] if cfg.grad_accum > 1 else 0
    scores = b * (cfg.num_heads // tp) * cfg.seq_len ** 2 * bpv
    logits = cfg.seq_len * b * -(-cfg.vocab_size // tp) * bpv
    host = states["optimizer_states"] if offload_optimizer else 0
    out = {"n_params": n_params, "params": states["params"], "grads": states["grads"],
           "optimizer_states": states["optimizer_states"] - host,
           "activations": math.ceil((layers + working + output) * activation_scale),
           "activations_per_layer": per_layer, "recompute_working_set": working,
           "output_activations": output, "grad_accum_buffer": accum,
           "largest_activation": max(scores, logits), "host_optimizer_states": host,
           "overhead": math.ceil(overhead_bytes)}
    out["total"] = (out["params"] + out["grads"] + out["optimizer_states"] + out["activations"]
                    + accum + out["overhead"])
    return out


def fits(cfg: Any, budget_bytes: float, **kw: Any) -> bool:
    """True if `estimate(cfg, **kw)["total"]` is within `budget_bytes` per device.

        >>> from mshelpers.config import RunConfig
        >>> fits(RunConfig.preset("llama2-7b"), 64 * 2**30), fits(RunConfig.preset("llama2-7b").replace(
        ...     batch_size=8, recompute="full"), 64 * 2**30, n_devices=8, zero_stage=3)
        (False, True)
    """
    _check_budget("fits", budget_bytes)
    return estimate(cfg, **kw)["total"] <= budget_bytes


def max_batch_for_budget(cfg: Any, budget_bytes: float, *, limit: int = 1 << 20, **kw: Any) -> int:
    """Largest global batch_size (a multiple of dp·micro_batches) whose estimate fits `budget_bytes`.

    Returns 0 when not even the smallest batch fits (the model states alone may not).
    Other keywords go to `estimate` (n_devices, layout, zero_stage, overhead_bytes, ...).
    The search stops at `limit` sequences.

        >>> from mshelpers.config import RunConfig
        >>> mini = RunConfig.preset("mini")
        >>> max_batch_for_budget(mini, 2**30) < max_batch_for_budget(mini.replace(recompute="full"), 2**30)
        True
    """
    _check_budget("max_batch_for_budget", budget_bytes)
    estimate(cfg, **kw)              # validates cfg and kw once, before the search
    dp, _, _, micro = _degrees(cfg, kw.get("n_devices", 1), kw.get("layout"))
    unit = dp * micro

    def ok(k: int) -> bool:
        return estimate(cfg.replace(batch_size=k * unit), **kw)["total"] <= budget_bytes

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi * unit <= limit and ok(hi):     # memory grows with batch: double, then bisect
        lo, hi = hi, hi * 2
    hi = min(hi, limit // unit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo * unit


def calibrate(estimates: list[dict], measured_bytes: list[float], *,
              overhead_bytes: float | None = None) -> dict[str, float]:
    """Fit measured ≈ overhead + model states + scale · activations over several runs.

    `estimates` are `estimate(...)` dicts (made with the default scale 1 and no overhead),
    `measured_bytes` the peaks measured for the same configs. Model states are taken as
    exact; a least-squares line through (activations, measured - states) gives the
    activation scale (slope) and the constant overhead (intercept). Pass `overhead_bytes`
    (from an earlier fit) to fit the scale alone, which one run suffices for: e.g. a
    recompute mode whose activations the published count gets wrong. The result is a
    dict of keywords for `estimate`, `fits` and `max_batch_for_budget`.

        >>> es = [{"activations": a, "params": 1, "grads": 1, "optimizer_states": 2,
        ...        "grad_accum_buffer": 0} for a in (10, 20, 40)]
        >>> calibrate(es, [4 + 100 + 2 * a for a in (10, 20, 40)])
        {'activation_scale': 2.0, 'overhead_bytes': 100.0}
        >>> calibrate(es[:1], [4 + 100 + 3 * 10], overhead_bytes=100)
        {'activation_scale': 3.0, 'overhead_bytes': 100}
    """
    need = 1 if overhead_bytes is not None else 2
    if len(estimates) != len(measured_bytes) or len(estimates) < need:
        raise ValueError(f"calibrate: got {len(estimates)} estimates and {len(measured_bytes)} measurements; "
                         f"fix: pass two equally long lists with at least {need} run(s)"
                         + ("" if need == 1 else " of different sizes, or pass overhead_bytes"))
    xs = [float(e["activations"]) for e in estimates]
    ys = [float(m) - (e["params"] + e["grads"] + e["optimizer_states"] + e.get("grad_accum_buffer", 0))
          for e, m in zip(estimates, measured_bytes)]
    if overhead_bytes is not None:
        if not isinstance(overhead_bytes, (int, float)) or overhead_bytes < 0:
            raise ValueError(f"calibrate: overhead_bytes={overhead_bytes!r} is invalid; fix: pass a number >= 0")
        slope = sum(x * (y - overhead_bytes) for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        if slope <= 0:
            raise ValueError(f"calibrate: the runs sit below overhead_bytes={overhead_bytes!r}; "
                             "fix: pass the overhead fitted on the same kind of runs (same mode and device)")
        return {"activation_scale": round(slope, 4), "overhead_bytes": overhead_bytes}
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("calibrate: all runs have the same activation estimate; "
                         "fix: measure at least two different batch sizes or sequence lengths")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        raise ValueError(f"calibrate: measured peaks do not grow with the activations (slope={slope:.3g}); "
                         "fix: measure over a wider range of batch sizes, each in a fresh process")
    return {"activation_scale": round(slope, 4), "overhead_bytes": round(max(0.0, my - slope * mx), 0)}


# ---------------------------------------------------------------- measurement
@dataclass
class PeakMemory:
    """What `measure_peak` saw in the fresh process (bytes)."""
    value: Any                     # fn's return value
    peak_bytes: int                # the headline figure: device peak on Ascend/GPU, else peak RSS
    source: str                    # "device" (ms.runtime.max_memory_allocated) or "rss"
    peak_rss_bytes: int            # the child's peak resident set size
    baseline_rss_bytes: int        # RSS just before fn ran (interpreter + preloaded modules)
    device_peak_bytes: int | None  # ms.runtime.max_memory_allocated(), None if MindSpore unused
    wall_s: float                  # fn's wall time in the child

    @property
    def work_rss_bytes(self) -> int:
        """Peak RSS above the baseline: what fn itself added."""
        return self.peak_rss_bytes - self.baseline_rss_bytes

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20


def _rss_bytes(field: str = "VmRSS") -> int:
    """Current (VmRSS) or peak (VmHWM) resident set size from /proc, else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


def _peak_child(fn: Callable, args: tuple, kwargs: dict, preload: tuple[str, ...], quiet: bool = False) -> dict:
    """Runs inside the spawned process: preload, baseline, run, read the peaks."""
    import importlib
    import sys
    import time
    if quiet:   # the child shares the notebook's stdout/stderr; its import chatter is not the result
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    for name in preload:
        importlib.import_module(name)
    baseline = _rss_bytes("VmRSS")
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    wall = time.perf_counter() - t0
    device_peak = None
    if "mindspore" in sys.modules:
        ms = sys.modules["mindspore"]
        target = ms.get_context("device_target")
        device_peak = int(ms.runtime.max_memory_allocated()) if target in ("Ascend", "GPU") else 0
    return {"value": value, "wall_s": wall, "baseline": baseline, "peak_rss": _rss_bytes("VmHWM"),
            "device_peak": device_peak}


def measure_peak(fn: Callable, *args: Any, preload: tuple[str, ...] = (), quiet: bool = True,
                 timeout: float = 900, env: dict | None = None, **kwargs: Any) -> PeakMemory:
    """Run `fn(*args, **kwargs)` in a fresh spawned process and return its peak memory.

    On Ascend/GPU the headline is `ms.runtime.max_memory_allocated()` (the memory pool's
    peak); on CPU that call returns 0, so the headline is the process's peak RSS.
    `preload` names modules to import before the baseline RSS is read (e.g.
    ("mindspore", "mindformers")), so `work_rss_bytes` excludes their import cost.
    `quiet` sends the child's stdout/stderr to /dev/null (a failure still raises here,
    with the child's traceback).
    `fn` must be importable from a module file (not defined in a notebook cell); its
    arguments and return value must pickle. Uses `mshelpers.timing.run_isolated`.

        >>> from mshelpers.memory import measure_peak
        >>> r = measure_peak(allocate_bytes, 200 * 2**20)        # doctest: +SKIP
        >>> r.work_rss_bytes >= 200 * 2**20                      # doctest: +SKIP
        True
    """
    if not callable(fn):
        raise ValueError(f"measure_peak: fn={fn!r} is not callable; fix: pass a function defined in a module")
    qual = getattr(fn, "__qualname__", "")
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in qual or "<lambda>" in qual:
        raise ValueError(f"measure_peak: fn={qual or fn!r} cannot be imported by a fresh process "
                         "(defined in a notebook, a script's __main__, a lambda or a closure); "
                         "fix: define it at the top level of a .py module and import it")
    if isinstance(preload, str):
        preload = (preload,)
    from .timing import run_isolated
    res = run_isolated(_peak_child, fn, args, kwargs, tuple(preload), quiet, timeout=timeout, env=env)
    out = res.value
    device = out["device_peak"]
    return PeakMemory(value=out["value"], peak_bytes=device if device else out["peak_rss"],
                      source="device" if device else "rss", peak_rss_bytes=out["peak_rss"],
                      baseline_rss_bytes=out["baseline"], device_peak_bytes=device, wall_s=out["wall_s"])


def measure_peaks(fn: Callable, arg_tuples: list[tuple], *, parallel: int = 1, **kwargs: Any) -> list[PeakMemory]:
    """`measure_peak(fn, *args, **kwargs)` for each args tuple, `parallel` fresh processes at a time.

    Peak RSS is per process, so running two at once does not change it; their step times
    do change, so only run memory-only measurements with parallel > 1.

        >>> rs = measure_peaks(allocate_bytes, [(2**20,), (2**21,)], parallel=2)   # doctest: +SKIP
    """
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise ValueError(f"measure_peaks: parallel={parallel!r} is invalid; fix: pass a positive integer")
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(parallel) as pool:   # threads only wait on their child processes
        return list(pool.map(lambda args: measure_peak(fn, *args, **kwargs), arg_tuples))


def allocate_bytes(n_bytes: int, hold_s: float = 0.0) -> int:
    """Touch `n_bytes` of fresh memory and return how many were touched (a measure_peak self-check)."""
    import time
    buf = bytearray(n_bytes)
    for i in range(0, n_bytes, 4096):   # write each page so it becomes resident
        buf[i] = 1
    if hold_s:
        time.sleep(hold_s)
    return len(buf)


def train_for_peak(cfg: Any, steps: int = 5, peak_flops: float | None = None,
                   set_memory: dict | None = None) -> dict:
    """Train `cfg` for `steps` steps with `mshelpers.train.train`; return its summary dict.

    A ready-made `measure_peak` workload: `measure_peak(train_for_peak, cfg, 5)` gives the
    peak memory of a short run of `cfg` in a fresh process, and the summary its step time.
    `set_memory` goes to `ms.runtime.set_memory(**set_memory)` first (e.g.
    {"max_size": "28GB", "optimize_level": "O1"}); it must precede the first op, which a
    fresh process guarantees. The per-step CSV goes to build/memory/.
    """
    from .config import build_dir
    from .train import train
    if set_memory:
        import mindspore as ms
        ms.runtime.set_memory(**set_memory)
    name = (f"{cfg.name}-{cfg.mode}-b{cfg.batch_size}-s{cfg.seq_len}-{cfg.recompute}"
            f"-acc{cfg.grad_accum}.csv")
    hist = train(cfg, steps, progress=False, peak_flops=peak_flops, csv_path=build_dir("memory") / name)
    return hist.summary()


# ---------------------------------------------------------------- small helpers
def human_bytes(n: float) -> str:
    """'1.50 GiB' style, binary units.

        >>> human_bytes(3 * 2**29)
        '1.50 GiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _pos_int(cfg: Any, name: str) -> int:
    v = getattr(cfg, name, None)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"llama_param_count: cfg.{name}={v!r} is invalid; fix: a positive integer "
                         "(pass a RunConfig)")
    return v


def _pos_arg(fn: str, name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer")
    return v


def _check_budget(fn: str, budget: Any) -> None:
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0 or math.isinf(budget):
        raise ValueError(f"{fn}: budget_bytes={budget!r} is invalid; fix: pass a positive number of bytes, "
                         "e.g. 16 * 2**30 for 16 GiB")


def _degrees(cfg: Any, n_devices: int, layout: Any) -> tuple[int, int, int, int]:
    """(dp, tp, pp, micro_batches) from a layout object or from the RunConfig and n_devices."""
    if layout is not None:
        try:
            dp = layout.dp
            tp = getattr(layout, "mp", None) or getattr(layout, "tp")
            pp, micro = layout.pp, layout.micro_batches
        except AttributeError as e:
            raise ValueError(f"estimate: layout={layout!r} lacks {e}; fix: pass an object with "
                             "dp, mp (or tp), pp and micro_batches attributes") from None
        for name, v in (("dp", dp), ("mp", tp), ("pp", pp), ("micro_batches", micro)):
            _pos_arg("estimate", f"layout.{name}", v)
        if n_devices != 1 and n_devices != dp * tp * pp:
            raise ValueError(f"estimate: n_devices={n_devices} does not match layout dp*mp*pp = "
                             f"{dp}*{tp}*{pp} = {dp * tp * pp}; fix: pass n_devices={dp * tp * pp} or omit it")
    else:
        tp, pp, micro = cfg.mp, cfg.pp, cfg.micro_batches
        if n_devices == 1:
            dp = cfg.dp
        elif n_devices % (tp * pp):
            raise ValueError(f"estimate: n_devices={n_devices} is not divisible by cfg.mp*cfg.pp = {tp * pp}; "
                             f"fix: use a multiple of {tp * pp}")
        else:
            dp = n_devices // (tp * pp)
            if cfg.dp not in (1, dp):
                raise ValueError(f"estimate: n_devices={n_devices} gives dp={dp} but cfg.dp={cfg.dp}; "
                                 f"fix: pass n_devices={cfg.dp * tp * pp} or set cfg.dp=1")
    if pp > cfg.num_layers or cfg.num_layers % pp:
        raise ValueError(f"estimate: pp={pp} must divide num_layers={cfg.num_layers}; fix: pick a divisor")
    return dp, tp, pp, micro

