"""Pipeline schedules played out: the bubble, the micro-batches each stage holds, and their activations.

GPipe runs every forward, then every backward; 1F1B (MindSpore's default scheduler) alternates after a warm-up;
the interleaved schedule gives each device v model chunks. `simulate_pipeline` plays a schedule op by op,
`pipeline_bubble_fraction` and `pipeline_in_flight` are the closed forms it agrees with, and
`pipeline_activation_bytes` / `stage_activation_bytes` turn the micro-batches held into bytes. The planner
(`mshelpers.parallel`) prices a layout's bubble and its schedule's activations with these.

Example:
    >>> from mshelpers.pipeline import pipeline_bubble_fraction, pipeline_in_flight, simulate_pipeline
    >>> sim = simulate_pipeline(4, 8, "interleaved", virtual_stages=2)
    >>> bubble = pipeline_bubble_fraction(4, 8, virtual_stages=2)         # (p-1)/(v·m+p-1)
    >>> round(sim["idle_fraction"], 4) == round(bubble, 4), sim["peak_in_flight"]
    (True, [5.5, 4.5, 3.5, 2.5])
    >>> pipeline_in_flight(4, 8, "1f1b")                                  # 1F1B holds p-s on stage s
    [4, 3, 2, 1]

Copied alone it needs nothing but the standard library; `stage_activation_bytes` reads a planned layout's doctor
Config, so it needs the `doctor/` folder beside it (and a PlannedLayout from `mshelpers.parallel.make_layout`).
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:      # annotations only, never imported at run time: the module still copies alone
    from .parallel import PlannedLayout


# ---------------------------------------------------------------- the bubble
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")
INTERLEAVED_ORDERS = ("standard", "memory")


def pipeline_bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle share of a pipeline step: (p-1)/(m+p-1) (GPipe, Huang et al. 2019; 1F1B has the same bubble).

    With the interleaved schedule and v virtual stages (model chunks) per device it is
    (p-1)/(v·m+p-1): the fill and drain last (p-1) chunk-steps of 1/v the time (Narayanan et
    al. 2021, sec. 2.2.2; mindformers' `pp_interleave_num` is v). This is the share of *total*
    time; Megatron's (p-1)/m and (p-1)/(v·m) are relative to the ideal time.

        >>> pipeline_bubble_fraction(1, 1), pipeline_bubble_fraction(4, 4), pipeline_bubble_fraction(8, 32)
        (0.0, 0.42857142857142855, 0.1794871794871795)
        >>> pipeline_bubble_fraction(4, 8, virtual_stages=2)          # 3 / 19
        0.15789473684210525

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    pp = _pos("pipeline_bubble_fraction", "pp", pp)
    micro_batches = _pos("pipeline_bubble_fraction", "micro_batches", micro_batches)
    virtual_stages = _pos("pipeline_bubble_fraction", "virtual_stages", virtual_stages)
    return (pp - 1) / (virtual_stages * micro_batches + pp - 1)


# ---------------------------------------------------------------- schedules played out, op by op
def simulate_pipeline(pp: int, micro_batches: int, schedule: str = "1f1b", virtual_stages: int = 1, *,
                      forward_time: float = 1.0, backward_time: float = 2.0,
                      interleaved_order: str = "standard") -> dict[str, Any]:
    """Play a GPipe, 1F1B or interleaved schedule op by op; measure its idle share and what each stage holds.

    Each stage runs its own op order; an op starts when its stage is free and its input is
    ready (forward from the previous virtual stage, backward from the next). Communication
    takes no time. Orders:
    - gpipe: all forwards, then all backwards (Huang et al. 2019);
    - 1f1b: p-s-1 warm-up forwards on stage s, then one forward / one backward (Narayanan et
      al. 2021, PipeDream-Flush; MindSpore's default pipeline scheduler);
    - interleaved: each device holds v = `virtual_stages` model chunks (chunk c of stage s is
      virtual stage c·p+s, each 1/v of the stage's layers, so 1/v of the time). Forwards run
      in groups of p micro-batches (the first group p + m mod p) chunk by chunk, backwards
      the same with chunks reversed; stage s does `bias` warm-up forwards, then forward k with
      backward k-bias. As in MindSpore's InterleavedScheduler (mindspore/ccsrc/frontend/
      parallel/pipeline_transformer/pipeline_scheduler.cc) and Megatron-LM:
      "standard" bias = (p + m mod p)(v-1) + 2(p-s-1) (Reorder, also Megatron-LM's warm-up);
      "memory" bias = (p + m mod p)(v-1) + (p-s-1) (MemoryOptimizedReorder, which MindSpore
      uses under jit_level O0/O1: "some forwards moved later" in its docs' figure 5).

    Returns ops as (stage, kind, micro_batch, start, end) plus `chunks` (each op's model chunk),
    the makespan, the measured idle fraction, and per stage `peak_in_flight` (micro-batches
    whose activations are held at the peak, in whole-stage units: a chunk counts 1/v) and
    `peak_in_flight_chunks` (the integer count of held chunk activations).

        >>> round(simulate_pipeline(4, 8)["idle_fraction"], 6) == round(pipeline_bubble_fraction(4, 8), 6)
        True
        >>> simulate_pipeline(4, 8, "gpipe")["peak_in_flight"], simulate_pipeline(4, 8, "1f1b")["peak_in_flight"]
        ([8, 8, 8, 8], [4, 3, 2, 1])

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    fn = "simulate_pipeline"
    pp = _pos(fn, "pp", pp)
    micro_batches = _pos(fn, "micro_batches", micro_batches)
    virtual_stages = _pos(fn, "virtual_stages", virtual_stages)
    _check_schedule(fn, pp, micro_batches, schedule, virtual_stages, interleaved_order)
    m, v = micro_batches, virtual_stages
    orders = [_stage_order(pp, m, schedule, v, s, interleaved_order) for s in range(pp)]
    last_vs = pp * v - 1
    end: dict[tuple, float] = {}
    free = [0.0] * pp
    pos = [0] * pp
    ops, chunks = [], []
    remaining = sum(len(o) for o in orders)
    f_t, b_t = forward_time / v, backward_time / v
    while remaining:
        progressed = False
        for s in range(pp):
            if pos[s] == len(orders[s]):
                continue
            kind, i, c = orders[s][pos[s]]
            vs = c * pp + s                       # virtual stage: chunk c of device s
            if kind == "F":
                dep = ("F", vs - 1, i) if vs > 0 else None
            else:
                dep = ("B", vs + 1, i) if vs < last_vs else ("F", vs, i)
            if dep is not None and dep not in end:
                continue
            start = max(free[s], end[dep] if dep else 0.0)
            dur = f_t if kind == "F" else b_t
            end[(kind, vs, i)] = start + dur
            free[s] = start + dur
            ops.append((s, kind, i, start, start + dur))
            chunks.append(c)
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:   # cannot happen for these schedules; guards against an endless loop
            raise RuntimeError("simulate_pipeline: schedule deadlocked")
    makespan = max(free)
    busy = m * (forward_time + backward_time) * pp
    held = []
    for s in range(pp):
        cur = peak = 0
        for op in sorted((o for o in ops if o[0] == s), key=lambda o: o[3]):
            cur += 1 if op[1] == "F" else -1
            peak = max(peak, cur)
        held.append(peak)
    return {"ops": ops, "chunks": chunks, "makespan": makespan, "idle_fraction": 1 - busy / (pp * makespan),
            "schedule": schedule, "virtual_stages": v,
            "peak_in_flight": [h if v == 1 else h / v for h in held], "peak_in_flight_chunks": held}


def _check_schedule(fn: str, pp: int, m: int, schedule: str, v: int, order: str) -> None:
    if schedule not in PIPELINE_SCHEDULES:
        raise ValueError(f"{fn}: schedule={schedule!r} is unknown; fix: use one of {PIPELINE_SCHEDULES}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"{fn}: virtual_stages={v} needs schedule='interleaved'; fix: pass "
                         "schedule='interleaved' or virtual_stages=1")
    if schedule == "interleaved":
        if order not in INTERLEAVED_ORDERS:
            raise ValueError(f"{fn}: interleaved_order={order!r} is unknown; fix: use one of {INTERLEAVED_ORDERS}")
        if m < pp:
            raise ValueError(f"{fn}: micro_batches={m} < pp={pp}; MindSpore's interleaved scheduler needs "
                             f"micro_batch_num >= pipeline stages; fix: use micro_batches >= {pp}")


def _interleaved_bias(pp: int, m: int, v: int, s: int, order: str) -> int:
    """Warm-up forwards of stage s (MindSpore InterleavedScheduler: bias_ in Reorder / MemoryOptimizedReorder)."""
    return (pp + m % pp) * (v - 1) + (2 if order == "standard" else 1) * (pp - s - 1)


def _stage_order(pp: int, m: int, schedule: str, v: int, s: int, order: str) -> list[tuple[str, int, int]]:
    """Stage s's op order as (kind, micro_batch, chunk)."""
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b":
        warm = min(pp - s - 1, m)
        out = [("F", i, 0) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                out.append(("F", f, 0))
                f += 1
            out.append(("B", b, 0))
            b += 1
        return out
    first = pp + m % pp                          # MindSpore's first group carries the m mod p extra micro-batches
    groups = [range(0, first)] + [range(k, k + pp) for k in range(first, m, pp)]
    fwd = [("F", i, c) for g in groups for c in range(v) for i in g]
    bwd = [("B", i, c) for g in groups for c in reversed(range(v)) for i in g]
    bias = min(_interleaved_bias(pp, m, v, s, order), m * v)
    out = fwd[:bias]
    for k in range(bias, m * v):
        out += [fwd[k], bwd[k - bias]]
    return out + bwd[m * v - bias:]


# ---------------------------------------------------------------- micro-batches in flight and their activations
def pipeline_in_flight(pp: int, micro_batches: int, schedule: str = "1f1b", virtual_stages: int = 1, *,
                       interleaved_order: str = "standard") -> list[float]:
    """Per stage, the most micro-batches whose activations are held at once (closed form; `simulate_pipeline` agrees).

    gpipe: m on every stage. 1f1b: min(p-s, m) on stage s. interleaved: min(bias_s + 1, v·m)
    chunk activations, each 1/v of a stage, so min(bias_s + 1, v·m)/v stage-equivalents, with
    bias_s from `simulate_pipeline`'s docstring. For m a multiple of p with m > p the first stage
    holds p + (p-1)/v ("standard": Korthikanti et al. 2022 sec. 4.2.3's p·(1 + (p-1)/(p·v))) or p
    ("memory", like 1F1B); never more than m (at m = p it holds m).

        >>> pipeline_in_flight(4, 8, "1f1b"), pipeline_in_flight(4, 8, "interleaved", 2)
        ([4, 3, 2, 1], [5.5, 4.5, 3.5, 2.5])
        >>> pipeline_in_flight(4, 8, "interleaved", 2, interleaved_order="memory")
        [4.0, 3.5, 3.0, 2.5]

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    fn = "pipeline_in_flight"
    pp = _pos(fn, "pp", pp)
    micro_batches = _pos(fn, "micro_batches", micro_batches)
    virtual_stages = _pos(fn, "virtual_stages", virtual_stages)
    _check_schedule(fn, pp, micro_batches, schedule, virtual_stages, interleaved_order)
    m, v = micro_batches, virtual_stages
    if schedule == "gpipe":
        return [m] * pp
    if schedule == "1f1b":
        return [min(pp - s, m) for s in range(pp)]
    return [min(_interleaved_bias(pp, m, v, s, interleaved_order) + 1, v * m) / v for s in range(pp)]


def pipeline_activation_bytes(stage_bytes_per_micro_batch: float, pp: int, micro_batches: int,
                              schedule: str = "1f1b", virtual_stages: int = 1, *, stage: int = 0,
                              interleaved_order: str = "standard") -> int:
    """Activation bytes a pipeline stage holds at its peak: in-flight micro-batches × one micro-batch's stage bytes.

    `stage_bytes_per_micro_batch` is what one micro-batch leaves on one stage for backward:
    layers per stage × `mshelpers.memory_activations.activation_bytes_per_layer(...)` (Korthikanti et al.
    2022; `stage_activation_bytes` computes it for a RunConfig and planned layout). The first stage
    (stage=0) holds the most. `mshelpers.memory.estimate` (the doctor's memory_per_stage) assumes 1F1B's min(p - i, m).

        >>> pipeline_activation_bytes(100, 4, 8, "gpipe"), pipeline_activation_bytes(100, 4, 8, "1f1b")
        (800, 400)
        >>> pipeline_activation_bytes(100, 4, 8, "interleaved", 2)
        550

    Taught in notebooks/05_semi_auto_parallel.ipynb, which takes the same product for a planned layout
    (`stage_activation_bytes`).
    """
    if not (isinstance(stage_bytes_per_micro_batch, numbers.Real) and stage_bytes_per_micro_batch >= 0):
        raise ValueError(f"pipeline_activation_bytes: stage_bytes_per_micro_batch={stage_bytes_per_micro_batch!r}; "
                         "fix: pass the bytes one micro-batch leaves on one stage (>= 0)")
    held = pipeline_in_flight(pp, micro_batches, schedule, virtual_stages, interleaved_order=interleaved_order)
    if not (isinstance(stage, int) and 0 <= stage < pp):
        raise ValueError(f"pipeline_activation_bytes: stage={stage!r}; fix: use 0 <= stage < pp={pp}")
    return math.ceil(held[stage] * stage_bytes_per_micro_batch)


def stage_activation_bytes(layout: PlannedLayout, schedule: str = "1f1b", virtual_stages: int = 1, *, stage: int = 0,
                           interleaved_order: str = "standard") -> dict:
    """A planned layout's activations on one pipeline stage under a schedule (first stage by default): one
    micro-batch's stored activations on that stage as the doctor counts them (`doctor.adapt.stage_activations`
    of `layout.config`: mindformers' LLaMA block per layer, each in its recompute mode) times the micro-batches
    `pipeline_in_flight` holds. Excludes the logits and the recompute working set. Keys: in_flight,
    layers_per_stage, per_layer_bytes (the stage's mean), micro_batch_bytes (one micro-batch on the stage), bytes.

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    fn = "stage_activation_bytes"
    dcfg = getattr(layout, "config", None)
    if dcfg is None:
        raise ValueError(f"{fn}: layout={type(layout).__name__} has no doctor config; fix: pass a PlannedLayout from "
                         "make_layout or plan_parallel_layout")
    virtual_stages = _pos(fn, "virtual_stages", virtual_stages)
    layers = dcfg.model.layers
    if layers % (layout.pp * virtual_stages):
        raise ValueError(f"{fn}: num_layers={layers} is not divisible by pp*virtual_stages = "
                         f"{layout.pp}*{virtual_stages}; fix: choose virtual_stages dividing {layers // layout.pp}")
    if not (isinstance(stage, int) and 0 <= stage < layout.pp):
        raise ValueError(f"{fn}: stage={stage!r} is invalid; fix: use 0 <= stage < pp={layout.pp}")
    if __package__:
        from .doctor.adapt import stage_activations
    else:  # copied beside its siblings as plain files
        from doctor.adapt import stage_activations
    act = stage_activations(dcfg, stage)
    held = pipeline_in_flight(layout.pp, dcfg.layout.micro if layout.pp > 1 else 1, schedule, virtual_stages,
                              interleaved_order=interleaved_order)[stage]
    per_mb = act["per_micro_batch"]
    return {"in_flight": held, "layers_per_stage": act["layers"], "per_layer_bytes": per_mb / max(act["layers"], 1),
            "micro_batch_bytes": per_mb, "bytes": math.ceil(held * per_mb)}


# ---------------------------------------------------------------- internals
def _pos(fn: str, name: str, v: Any) -> int:
    """A positive count from an int, a numpy integer or an integral float (4.0); else one ValueError.
    (The same lines as parallel._pos and collectives._pos, inlined so that each module copies alone.)"""
    import numbers
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and int(v) > 0:
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer"
                     + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))
