"""Plan a dp × mp × pp layout: which layouts are valid, and what each costs in memory, traffic and bubble.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers.parallel import plan_parallel_layout, validate_layout, pipeline_bubble_fraction
    >>> cfg = RunConfig.preset("llama2-7b")
    >>> plans = plan_parallel_layout(cfg, 32, global_batch=64, seq_len=4096)
    >>> best = plans[0]
    >>> (best.dp, best.mp, best.pp) in {(p.dp, p.mp, p.pp) for p in plans}, best.n_devices
    (True, 32)
    >>> pipeline_bubble_fraction(4, 12)
    0.2
    >>> validate_layout(cfg, 8, 3, 1, 1, n_devices=24, global_batch=64)
    Traceback (most recent call last):
    ...
    ValueError: validate_layout: mp=3 does not divide num_heads=32 (attention heads are split whole across mp ranks); fix: use mp in [1, 2, 4, 8, 16, 32]

What the figures mean (all per device, per optimizer step):
- memory: model states (params, grads, Adam) after the mp·pp split and optional ZeRO,
  plus the activations kept for backward, from `mshelpers.memory.estimate`, which is
  built on `model_state_bytes` and `activation_bytes_per_layer` (Korthikanti et al. 2022).
- communication: bytes one device sends, with ring collectives (an all-reduce of S bytes
  over n ranks sends 2(n-1)/n·S per rank):
  dp: one all-reduce of the local gradients (ZeRO-3 adds a parameter all-gather: 3(n-1)/n·S);
  mp: Megatron-style tensor parallel, per layer and micro-batch 2 activation all-reduces in
      forward (after attention and after the MLP) and 2 in backward, each of b·s·h values,
      plus 2 more forward ones under full recompute, plus the vocab embedding/output pair;
  pp: per micro-batch one activation sent forward and one gradient sent back (b·s·h each).
- bubble: (p-1)/(m+p-1), the idle share of a pipeline step (GPipe and 1F1B alike).
The planner cannot see overlap of communication with compute, link topology (which
group crosses nodes), kernel efficiency at each shard size, or contention: it ranks
by bytes, or by time under a `Hardware` assumption you state. Measure the winner.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any, Iterable, Sequence

_HALF = ("float16", "bfloat16")


# ---------------------------------------------------------------- small formulas
def pipeline_bubble_fraction(pp: int, micro_batches: int) -> float:
    """Idle share of a pipeline step: (p-1)/(m+p-1) (GPipe, Huang et al. 2019; 1F1B has the same bubble).

    This is the share of *total* time; Megatron's (p-1)/m is relative to the ideal time.

        >>> pipeline_bubble_fraction(1, 1), pipeline_bubble_fraction(4, 4), pipeline_bubble_fraction(8, 32)
        (0.0, 0.42857142857142855, 0.1794871794871795)
    """
    _pos("pipeline_bubble_fraction", "pp", pp)
    _pos("pipeline_bubble_fraction", "micro_batches", micro_batches)
    return (pp - 1) / (micro_batches + pp - 1)


def ring_allreduce_bytes(buffer_bytes: int, group_size: int) -> int:
    """Bytes each rank sends in a ring all-reduce of `buffer_bytes`: 2(n-1)/n·S (0 for n = 1).

        >>> ring_allreduce_bytes(1000, 2), ring_allreduce_bytes(1000, 8)
        (1000, 1750)
    """
    _pos("ring_allreduce_bytes", "group_size", group_size)
    return round(2 * (group_size - 1) * buffer_bytes / group_size)


def ring_allgather_bytes(output_bytes: int, group_size: int) -> int:
    """Bytes each rank sends in a ring all-gather whose gathered output is `output_bytes`: (n-1)/n·S.

        >>> ring_allgather_bytes(1000, 2)
        500
    """
    _pos("ring_allgather_bytes", "group_size", group_size)
    return round((group_size - 1) * output_bytes / group_size)


def tp_allreduce_buffer_bytes(micro_batch: int, seq_len: int, hidden_size: int, bytes_per_value: int = 2) -> int:
    """Size of one tensor-parallel activation all-reduce: the b·s·h block output, in bytes.

        >>> tp_allreduce_buffer_bytes(8, 4096, 4096)        # 8 sequences of LLaMA-2-7B in bf16
        268435456
    """
    for n, v in (("micro_batch", micro_batch), ("seq_len", seq_len), ("hidden_size", hidden_size),
                 ("bytes_per_value", bytes_per_value)):
        _pos("tp_allreduce_buffer_bytes", n, v)
    return micro_batch * seq_len * hidden_size * bytes_per_value


def tp_allreduces_per_micro_batch(layers: int, *, recompute: str = "none", embedding: bool = True) -> int:
    """Activation all-reduces one tensor-parallel rank runs per micro-batch (forward + backward).

    Per layer: 2 forward (attention output, MLP output) + 2 backward (the gradients of the
    attention and MLP inputs), + 2 forward again under full recompute. `embedding` adds the
    vocab-parallel embedding's forward all-reduce and the output layer's backward one.

        >>> tp_allreduces_per_micro_batch(32), tp_allreduces_per_micro_batch(32, recompute="full")
        (130, 194)
    """
    _pos("tp_allreduces_per_micro_batch", "layers", layers)
    per_layer = 4 + (2 if recompute == "full" else 0)
    return per_layer * layers + (2 if embedding else 0)


# ---------------------------------------------------------------- validation
def validate_layout(cfg: Any, dp: int, mp: int, pp: int, micro_batches: int = 1, *, n_devices: int,
                    global_batch: int) -> None:
    """Raise one ValueError naming the first constraint the layout breaks; return None if valid.

    Constraints: dp·mp·pp = n_devices; mp divides num_heads and ffn_hidden_size (heads and
    MLP columns are split whole); pp divides num_layers (equal stages); dp·micro_batches
    divides global_batch (each micro-batch holds whole sequences); and with pp > 1,
    micro_batches >= pp (MindSpore's pipeline rule, see mindformers' TransformerOpParallelConfig).
    """
    fn = "validate_layout"
    for n, v in (("dp", dp), ("mp", mp), ("pp", pp), ("micro_batches", micro_batches),
                 ("n_devices", n_devices), ("global_batch", global_batch)):
        _pos(fn, n, v)
    heads, ffn, layers = (_cfg_int(cfg, k) for k in ("num_heads", "ffn_hidden_size", "num_layers"))
    if dp * mp * pp != n_devices:
        fix = (f"dp={n_devices // (mp * pp)} makes dp*mp*pp = {n_devices}" if n_devices % (mp * pp) == 0 else
               f"choose mp*pp dividing {n_devices} and dp = {n_devices}/(mp*pp)")
        raise ValueError(f"{fn}: dp*mp*pp = {dp}*{mp}*{pp} = {dp * mp * pp} does not equal n_devices={n_devices}; "
                         f"fix: {fix}")
    if heads % mp:
        raise ValueError(f"{fn}: mp={mp} does not divide num_heads={heads} (attention heads are split whole "
                         f"across mp ranks); fix: use mp in {_divisors(heads)}")
    if ffn % mp:
        raise ValueError(f"{fn}: mp={mp} does not divide ffn_hidden_size={ffn} (MLP columns are split evenly); "
                         f"fix: use mp in {[d for d in _divisors(ffn) if heads % d == 0]}")
    if layers % pp:
        raise ValueError(f"{fn}: pp={pp} does not divide num_layers={layers} (stages get equal layer counts); "
                         f"fix: use pp in {_divisors(layers)}")
    if global_batch % (dp * micro_batches):
        ok = [m for m in _divisors(global_batch // dp)] if global_batch % dp == 0 else []
        fix = (f"use micro_batches in {ok}" if ok else
               f"use a global_batch that is a multiple of dp*micro_batches = {dp * micro_batches}")
        raise ValueError(f"{fn}: dp*micro_batches = {dp}*{micro_batches} = {dp * micro_batches} does not divide "
                         f"global_batch={global_batch} (every micro-batch needs whole sequences); fix: {fix}")
    if pp > 1 and micro_batches < pp:
        raise ValueError(f"{fn}: micro_batches={micro_batches} < pp={pp}; MindSpore's pipeline needs "
                         f"micro_batch_num >= pipeline_stage; fix: use micro_batches >= {pp} "
                         f"(the bubble (p-1)/(m+p-1) shrinks as m grows)")


# ---------------------------------------------------------------- the layout and its costs
@dataclass(frozen=True)
class Layout:
    """One dp × mp × pp layout with micro_batches, and its per-device costs per step (bytes)."""
    dp: int
    mp: int
    pp: int
    micro_batches: int
    micro_batch_size: int                 # sequences per micro-batch per dp rank
    memory_per_device_bytes: int          # model states + activations (+ ZeRO effect), from mshelpers.memory
    comm_bytes_per_step: int              # bytes one device sends per step: dp + tp + pp
    bubble_fraction: float                # (p-1)/(m+p-1)
    comm_dp_bytes: int = 0
    comm_tp_bytes: int = 0
    comm_pp_bytes: int = 0
    model_state_bytes: int = 0
    activation_bytes: int = 0
    fits: bool | None = None              # within memory_budget_bytes, if one was given
    step_time: dict | None = field(default=None, compare=False)   # estimate_step_time(...) if hardware given

    @property
    def n_devices(self) -> int:
        return self.dp * self.mp * self.pp

    @property
    def name(self) -> str:
        return f"{self.dp}dp×{self.mp}mp×{self.pp}pp m={self.micro_batches}"

    def row(self, unit: float = 2**30) -> dict:
        """A table row; sizes in GiB by default."""
        r = {"layout": self.name, "dp": self.dp, "mp": self.mp, "pp": self.pp, "m": self.micro_batches,
             "b_micro": self.micro_batch_size,
             "memory_GiB": round(self.memory_per_device_bytes / unit, 2),
             "comm_GiB": round(self.comm_bytes_per_step / unit, 2),
             "dp_GiB": round(self.comm_dp_bytes / unit, 2), "tp_GiB": round(self.comm_tp_bytes / unit, 2),
             "pp_GiB": round(self.comm_pp_bytes / unit, 2), "bubble": round(self.bubble_fraction, 3)}
        if self.fits is not None:
            r["fits"] = self.fits
        if self.step_time is not None:
            r["step_s"] = round(self.step_time["step_s"], 3)
            r["comm_share"] = round(self.step_time["comm_share"], 3)
        return r


def communication_bytes(cfg: Any, dp: int, mp: int, pp: int, micro_batches: int = 1, *, global_batch: int,
                        seq_len: int | None = None, zero_stage: int = 0, bytes_per_value: int | None = None,
                        grad_bytes_per_value: int | None = None) -> dict[str, int]:
    """Bytes one device sends per optimizer step, split into dp, tp and pp traffic (see module docstring).

    Values default to 2 bytes for float16/bfloat16 configs and 4 for float32; gradients
    are all-reduced in the same width unless `grad_bytes_per_value` says otherwise.

        >>> from mshelpers.config import RunConfig
        >>> c = communication_bytes(RunConfig.preset("mini"), 2, 1, 1, global_batch=8)
        >>> c["dp"] == 3_688_704 * 4, c["tp"], c["pp"]       # 2 ranks: one gradient copy each way
        (True, 0, 0)
    """
    s = seq_len or _cfg_int(cfg, "seq_len")
    validate_layout(cfg, dp, mp, pp, micro_batches, n_devices=dp * mp * pp, global_batch=global_batch)
    half = getattr(cfg, "compute_dtype", "float32") in _HALF
    bpv = bytes_per_value or (2 if half else 4)
    gbpv = grad_bytes_per_value or bpv
    h, layers = _cfg_int(cfg, "hidden_size"), _cfg_int(cfg, "num_layers")
    from .memory import llama_param_count   # pure Python
    local_params = -(-llama_param_count(cfg) // (mp * pp))
    grad_buffer = local_params * gbpv
    dp_bytes = ring_allreduce_bytes(grad_buffer, dp)
    if zero_stage == 3 and dp > 1:   # parameters gathered for forward and again for backward
        dp_bytes += 2 * ring_allgather_bytes(local_params * bpv, dp)
    b = global_batch // (dp * micro_batches)
    buf = tp_allreduce_buffer_bytes(b, s, h, bpv)
    n_ar = tp_allreduces_per_micro_batch(layers // pp, recompute=getattr(cfg, "recompute", "none"),
                                         embedding=True) - (1 if pp > 1 else 0)  # a stage holds one end only
    tp_bytes = micro_batches * n_ar * ring_allreduce_bytes(buf, mp) if mp > 1 else 0
    pp_bytes = micro_batches * 2 * buf if pp > 1 else 0   # interior stage: activation out, gradient back
    return {"dp": dp_bytes, "tp": tp_bytes, "pp": pp_bytes, "total": dp_bytes + tp_bytes + pp_bytes,
            "tp_buffer_bytes": buf, "tp_allreduces": n_ar * micro_batches if mp > 1 else 0,
            "grad_buffer_bytes": grad_buffer}


@dataclass(frozen=True)
class Hardware:
    """Assumed device and links for `estimate_step_time`. Every figure is an input you choose, not a fact."""
    peak_flops_per_device: float          # FLOP/s at the training dtype
    intra_node_bytes_per_s: float         # per-device bandwidth inside a node
    inter_node_bytes_per_s: float         # per-device bandwidth between nodes
    devices_per_node: int = 8
    compute_efficiency: float = 0.5       # share of peak the matmuls reach (kernel MFU)


def estimate_step_time(cfg: Any, layout: Layout, hardware: Hardware, *, global_batch: int,
                       seq_len: int | None = None) -> dict[str, float]:
    """A no-overlap step time: compute, tp/dp/pp communication and bubble, in seconds, plus comm_share.

    Rank placement follows MindSpore's device matrix: mp innermost (consecutive ranks), then
    dp, then pipeline stages. A group whose span exceeds devices_per_node uses the inter-node
    bandwidth. Compute FLOPs are PaLM's 6N + 12·L·h·s per token, split evenly over devices.
    This is a model to rank layouts under stated assumptions; it ignores overlap and contention.
    """
    s = seq_len or _cfg_int(cfg, "seq_len")
    from .memory import llama_param_count
    n = llama_param_count(cfg)
    flops = (6 * n + 12 * _cfg_int(cfg, "num_layers") * _cfg_int(cfg, "hidden_size") * s) * global_batch * s
    compute = flops / layout.n_devices / (hardware.peak_flops_per_device * hardware.compute_efficiency)
    node = hardware.devices_per_node
    bw = lambda span: hardware.intra_node_bytes_per_s if span <= node else hardware.inter_node_bytes_per_s
    tp_s = layout.comm_tp_bytes / bw(layout.mp)
    dp_s = layout.comm_dp_bytes / bw(layout.mp * layout.dp)
    pp_s = layout.comm_pp_bytes / bw(layout.mp * layout.dp * 2)   # neighbouring stages are dp*mp ranks apart
    busy = compute + tp_s + pp_s
    bubble_s = busy * layout.bubble_fraction / (1 - layout.bubble_fraction)
    step = busy + bubble_s + dp_s
    return {"compute_s": compute, "tp_comm_s": tp_s, "dp_comm_s": dp_s, "pp_comm_s": pp_s,
            "bubble_s": bubble_s, "step_s": step, "comm_share": (tp_s + dp_s + pp_s) / step}


def make_layout(cfg: Any, dp: int, mp: int, pp: int, micro_batches: int = 1, *, global_batch: int,
                seq_len: int | None = None, zero_stage: int = 0, sequence_parallel: bool = False,
                memory_budget_bytes: float | None = None, hardware: Hardware | None = None) -> Layout:
    """Cost one layout (validated first). `plan_parallel_layout` calls this for every candidate."""
    s = seq_len or _cfg_int(cfg, "seq_len")
    validate_layout(cfg, dp, mp, pp, micro_batches, n_devices=dp * mp * pp, global_batch=global_batch)
    from . import memory
    run = cfg.replace(batch_size=global_batch, seq_len=s, dp=1, mp=1, pp=1, micro_batches=1)
    ns = SimpleNamespace(dp=dp, mp=mp, pp=pp, micro_batches=micro_batches)
    est = memory.estimate(run, n_devices=dp * mp * pp, layout=ns, zero_stage=zero_stage,
                          sequence_parallel=sequence_parallel)
    comm = communication_bytes(cfg, dp, mp, pp, micro_batches, global_batch=global_batch, seq_len=s,
                               zero_stage=zero_stage)
    lay = Layout(dp=dp, mp=mp, pp=pp, micro_batches=micro_batches,
                 micro_batch_size=global_batch // (dp * micro_batches),
                 memory_per_device_bytes=est["total"], comm_bytes_per_step=comm["total"],
                 bubble_fraction=pipeline_bubble_fraction(pp, micro_batches),
                 comm_dp_bytes=comm["dp"], comm_tp_bytes=comm["tp"], comm_pp_bytes=comm["pp"],
                 model_state_bytes=est["params"] + est["grads"] + est["optimizer_states"],
                 activation_bytes=est["activations"],
                 fits=None if memory_budget_bytes is None else est["total"] <= memory_budget_bytes)
    if hardware is not None:
        lay = _with_time(lay, cfg, hardware, global_batch, s)
    return lay


def plan_parallel_layout(cfg: Any, n_devices: int, *, global_batch: int, seq_len: int | None = None,
                         micro_batches: Iterable[int] | None = None, max_micro_batches: int = 32,
                         zero_stage: int = 0, sequence_parallel: bool = False,
                         memory_budget_bytes: float | None = None, hardware: Hardware | None = None) -> list[Layout]:
    """Every valid (dp, mp, pp, micro_batches) on `n_devices`, costed and sorted best first.

    `micro_batches` restricts the micro-batch counts tried (default: every count up to
    `max_micro_batches` that divides the per-dp batch; with pp = 1 it is gradient
    accumulation, which only trades activation memory). Ranking: layouts that fit
    `memory_budget_bytes` first (if given); then, with `hardware`, the shortest
    `estimate_step_time`; without it, the smallest bubble, then the fewest bytes sent,
    then the least memory. Raises ValueError if no layout is valid.
    """
    fn = "plan_parallel_layout"
    _pos(fn, "n_devices", n_devices)
    _pos(fn, "global_batch", global_batch)
    if seq_len is not None:
        _pos(fn, "seq_len", seq_len)
    if getattr(cfg, "replace", None) is None:
        raise ValueError(f"{fn}: cfg={type(cfg).__name__} is not a RunConfig; fix: pass RunConfig.preset(...)")
    if memory_budget_bytes is not None and not memory_budget_bytes > 0:
        raise ValueError(f"{fn}: memory_budget_bytes={memory_budget_bytes!r} is invalid; fix: a positive byte count")
    wanted = None if micro_batches is None else sorted(set(micro_batches))
    if wanted is not None:
        for m in wanted:
            _pos(fn, "micro_batches", m)
    out = []
    for mp in _divisors(n_devices):
        for pp in _divisors(n_devices // mp):
            dp = n_devices // (mp * pp)
            if global_batch % dp:
                continue
            ms = [m for m in (wanted or range(1, max_micro_batches + 1)) if (global_batch // dp) % m == 0]
            for m in ms:
                try:
                    validate_layout(cfg, dp, mp, pp, m, n_devices=n_devices, global_batch=global_batch)
                except ValueError:
                    continue
                out.append(make_layout(cfg, dp, mp, pp, m, global_batch=global_batch, seq_len=seq_len,
                                       zero_stage=zero_stage, sequence_parallel=sequence_parallel,
                                       memory_budget_bytes=memory_budget_bytes, hardware=hardware))
    if not out:
        raise ValueError(f"{fn}: no valid layout for n_devices={n_devices}, global_batch={global_batch} with "
                         f"num_heads={cfg.num_heads}, ffn_hidden_size={cfg.ffn_hidden_size}, "
                         f"num_layers={cfg.num_layers}; fix: use a global_batch divisible by a factor of n_devices "
                         "(e.g. a multiple of n_devices)")

    def key(l: Layout):
        unfit = l.fits is False
        if l.step_time is not None:
            return (unfit, l.step_time["step_s"], l.memory_per_device_bytes)
        return (unfit, l.bubble_fraction, l.comm_bytes_per_step, l.memory_per_device_bytes)
    return sorted(out, key=key)


def find_layout(plans: Sequence[Layout], dp: int, mp: int, pp: int = 1, micro_batches: int | None = None) -> Layout:
    """The first layout in `plans` with these degrees (the best-ranked micro_batches if not given)."""
    for l in plans:
        if (l.dp, l.mp, l.pp) == (dp, mp, pp) and (micro_batches is None or l.micro_batches == micro_batches):
            return l
    raise ValueError(f"find_layout: no planned layout with dp={dp}, mp={mp}, pp={pp}, "
                     f"micro_batches={micro_batches}; fix: check validate_layout(...) for why it is invalid")


# ---------------------------------------------------------------- data-parallel shard check
def check_shards(per_rank_ids: Sequence[Iterable[Any]], full_ids: Iterable[Any] | None = None) -> dict[str, Any]:
    """Did the ranks read disjoint samples that together make up the full set? (the seeds' shard_id bug)

    `per_rank_ids[r]` lists the ids of the samples rank r read (any hashable: window hashes,
    row indices); `full_ids` the samples one process would read for the same steps.
    Returns counts plus `disjoint`, `union_is_full` and `ok` (both true), and
    `duplicate_share`: the share of all reads that repeat a sample another read already had.

        >>> check_shards([[0, 2, 4], [1, 3, 5]], range(6))["ok"]
        True
        >>> r = check_shards([[0, 1, 2], [0, 1, 2]], range(6))
        >>> r["disjoint"], r["union_is_full"], r["duplicate_share"], r["missing"]
        (False, False, 0.5, 3)
    """
    ranks = [list(ids) for ids in per_rank_ids]
    if len(ranks) < 1 or any(len(r) == 0 for r in ranks):
        raise ValueError(f"check_shards: per_rank_ids has {len(ranks)} ranks, some empty; "
                         "fix: pass one non-empty list of sample ids per rank")
    sets = [set(r) for r in ranks]
    union = set().union(*sets)
    reads = sum(len(r) for r in ranks)
    overlap = sum(len(sets[i] & sets[j]) for i in range(len(sets)) for j in range(i + 1, len(sets)))
    out = {"ranks": len(ranks), "reads": reads, "unique": len(union), "pairwise_overlap": overlap,
           "disjoint": overlap == 0, "duplicate_share": 1 - len(union) / reads}
    if full_ids is not None:
        full = set(full_ids)
        out.update(full=len(full), missing=len(full - union), extra=len(union - full),
                   union_is_full=union == full)
    else:
        out["union_is_full"] = None
    out["ok"] = bool(out["disjoint"] and out["union_is_full"] is not False)
    return out


# ---------------------------------------------------------------- a pipeline schedule, to check the bubble
def simulate_pipeline(pp: int, micro_batches: int, *, schedule: str = "1f1b", forward_time: float = 1.0,
                      backward_time: float = 2.0) -> dict[str, Any]:
    """Play a GPipe or 1F1B schedule step by step and measure its idle share (checks the bubble formula).

    Each stage runs its own op order; an op starts when its stage is free and its input is
    ready (forward from the previous stage, backward from the next). Returns the ops as
    (stage, kind, micro_batch, start, end), the makespan and the measured idle fraction.

        >>> round(simulate_pipeline(4, 8)["idle_fraction"], 6) == round(pipeline_bubble_fraction(4, 8), 6)
        True
    """
    _pos("simulate_pipeline", "pp", pp)
    _pos("simulate_pipeline", "micro_batches", micro_batches)
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"simulate_pipeline: schedule={schedule!r} is unknown; fix: use 'gpipe' or '1f1b'")
    orders = []
    for s in range(pp):
        if schedule == "gpipe":
            order = [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
        else:
            warm = min(pp - s - 1, micro_batches)
            order = [("F", i) for i in range(warm)]
            f, b = warm, 0
            while b < micro_batches:
                if f < micro_batches:
                    order.append(("F", f))
                    f += 1
                order.append(("B", b))
                b += 1
        orders.append(order)
    end: dict[tuple, float] = {}
    free = [0.0] * pp
    pos = [0] * pp
    ops = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = (s - 1, "F", i) if kind == "F" and s > 0 else (
                (s + 1, "B", i) if kind == "B" and s < pp - 1 else (s, "F", i) if kind == "B" else None)
            if dep is not None and dep not in end:
                continue
            start = max(free[s], end[dep] if dep else 0.0)
            dur = forward_time if kind == "F" else backward_time
            end[(s, kind, i)] = start + dur
            free[s] = start + dur
            ops.append((s, kind, i, start, start + dur))
            pos[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:   # cannot happen for these schedules; guards against an endless loop
            raise RuntimeError("simulate_pipeline: schedule deadlocked")
    makespan = max(free)
    busy = micro_batches * (forward_time + backward_time) * pp
    return {"ops": ops, "makespan": makespan, "idle_fraction": 1 - busy / (pp * makespan)}


# ---------------------------------------------------------------- mindformers / MindSpore config for a layout
def mindformers_parallel_config(layout: Layout, *, vocab_emb_dp: bool = True, use_seq_parallel: bool = False) -> dict:
    """The `parallel_config` section of a mindformers YAML (and TransformerOpParallelConfig's kwargs) for `layout`.

        >>> mindformers_parallel_config(Layout(4, 8, 1, 1, 16, 0, 0, 0.0))["model_parallel"]
        8
    """
    return {"data_parallel": layout.dp, "model_parallel": layout.mp, "pipeline_stage": layout.pp,
            "micro_batch_num": layout.micro_batches, "vocab_emb_dp": vocab_emb_dp,
            "use_seq_parallel": use_seq_parallel, "gradient_aggregation_group": 4}


def validate_with_mindformers(cfg: Any, layout: Layout) -> Any:
    """Check `layout` against mindformers' own classes and return its TransformerOpParallelConfig.

    Builds TransformerOpParallelConfig from `mindformers_parallel_config(layout)`, then runs
    the split checks of mindformers' LLamaAttention (num_heads vs model_parallel) and
    LlamaFeedForward.shard (ffn width vs model_parallel) with cfg's head count and ffn width.
    The other sizes are shrunk so no real weights are allocated; works on CPU, no
    parallel context needed. mindformers' ValueError propagates unchanged.
    """
    import mindspore as ms   # noqa: F401  (mindformers expects it imported first)
    from mindformers.models.llama.llama_layer import LlamaFeedForward
    from mindformers.models.llama.llama_transformer import LLamaAttention
    from mindformers.modules.transformer import TransformerOpParallelConfig
    pc = TransformerOpParallelConfig(**mindformers_parallel_config(layout))
    heads, ffn = _cfg_int(cfg, "num_heads"), _cfg_int(cfg, "ffn_hidden_size")
    LLamaAttention(seq_length=8, dim=heads * 2, n_heads=heads, n_kv_heads=None, parallel_config=pc,
                   use_flash_attention=False)
    # dim = a multiple of mp keeps the FFN's own dim check quiet; hidden_dim is the real width
    LlamaFeedForward(dim=layout.mp * 2, intermediate_size=ffn, hidden_dim=ffn, parallel_config=pc).shard(pc)
    return pc


def auto_parallel_context(layout: Layout) -> dict:
    """Keyword arguments for `mindspore.set_auto_parallel_context` under semi_auto_parallel for `layout`."""
    ctx = {"parallel_mode": "semi_auto_parallel", "device_num": layout.n_devices, "gradients_mean": True,
           "full_batch": True, "enable_parallel_optimizer": False}
    if layout.pp > 1:
        ctx["pipeline_stages"] = layout.pp
    return ctx


# ---------------------------------------------------------------- internals
def _with_time(lay: Layout, cfg: Any, hw: Hardware, global_batch: int, seq_len: int) -> Layout:
    d = asdict(lay)
    d["step_time"] = estimate_step_time(cfg, lay, hw, global_batch=global_batch, seq_len=seq_len)
    return Layout(**d)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pos(fn: str, name: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer")
    return v


def _cfg_int(cfg: Any, name: str) -> int:
    v = getattr(cfg, name, None)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"cfg.{name}={v!r} is invalid; fix: pass a RunConfig (RunConfig.preset(...)) "
                         "with a positive integer there")
    return v
