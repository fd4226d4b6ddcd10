"""Plan a dp × mp × pp layout: which layouts are valid, and what each costs in memory, traffic, bubble and time.

Example:
    >>> from mshelpers.config import RunConfig
    >>> from mshelpers.parallel import plan_parallel_layout, validate_layout
    >>> cfg = RunConfig.preset("llama2-7b")
    >>> plans = plan_parallel_layout(cfg, 32, global_batch=64, seq_len=4096)
    >>> best = plans[0]
    >>> (best.dp, best.mp, best.pp) in {(p.dp, p.mp, p.pp) for p in plans}, best.n_devices
    (True, 32)
    >>> validate_layout(cfg, 8, 3, 1, 1, n_devices=24, global_batch=64)
    Traceback (most recent call last):
    ...
    ValueError: validate_layout: mp=3 does not divide num_heads=32 (attention heads are split whole across mp ranks); fix: use mp in [1, 2, 4, 8, 16, 32]

What the figures mean (all per device, per optimizer step). One cost model prices every layout: the config
doctor (`mshelpers.doctor`, notebook 12, `python -m mshelpers.doctor`), and one `Layout`, the doctor's. The planner
builds the doctor Config of a layout directly (`doctor.adapt.planned_config`: the Config of the mindformers YAML
`mshelpers.mindformers_yaml` writes for it, which it never writes), varies a file's Layout with
dataclasses.replace (`doctor.adapt.on_degrees`), and prices it:
- memory: `doctor.memory_per_stage`, the largest pipeline stage's parameters, gradients and optimizer states (the
  mp·pp split, MindSpore's parallel optimizer for ZeRO-1/2) and activations (Korthikanti et al. 2022 through
  `mshelpers.memory.activation_bytes_per_layer`, times the micro-batches the Layout's schedule holds in flight,
  `pipeline.pipeline_in_flight`, the one rule);
- communication: bytes one device sends, read off the doctor's collectives (`doctor.adapt.traffic_bytes`): the dp
  gradient reduction, Megatron's tp all-reduces (2 forward + 2 backward per layer and micro-batch, 2 more under full
  recompute, each of b·s·h 16-bit values), pp point-to-point (an activation forward, a gradient back);
- step time, under a `mshelpers.hardware.Hardware` profile: `doctor.step_time`, with ranks placed on nodes as
  mindformers places them and every group's collectives on the links it crosses;
- bubble: (p-1)/(m+p-1), the idle share of a pipeline step (GPipe and 1F1B alike); (p-1)/(v·m+p-1) for the
  interleaved schedule with v virtual stages (model chunks) per device (`mshelpers.pipeline`).
What stays here is what only the planner does: the layout rules (`validate_layout`), the `PlannedLayout` (a
doctor Layout and its costs), and the search over layouts. Its neighbours, one concern each: `pipeline` (the schedules played out),
`collectives` (ring bytes, collectives measured on this machine, their alpha-beta fit), `hardware` (the profiles
priced), `mindformers_yaml` (the YAML a layout becomes) and `shards` (the data-parallel shard check).
The model cannot see kernel efficiency beyond its calibration, overlap beyond one fitted factor, or contention:
measure the winner.

Copied alone, `validate_layout`, `find_layout` and `PlannedLayout` need the standard library; the functions that
price need the `doctor/` folder and `memory.py`, `hardware.py` and `pipeline.py` beside it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:      # annotations only, never imported at run time: the module still copies alone
    from .hardware import Hardware


# The one cost model the planner prices with is the config doctor (mshelpers/doctor/, copied beside this file as
# its folder): imported inside the functions that price, so the rest of this module copies alone.


# ---------------------------------------------------------------- layout rules
def validate_layout(cfg: Any, dp: int, mp: int, pp: int, micro_batches: int = 1, *, n_devices: int,
                    global_batch: int) -> None:
    """Raise one ValueError naming the first constraint the layout breaks; return None if valid.

    Constraints: dp·mp·pp = n_devices; mp divides num_heads and ffn_hidden_size (heads and
    MLP columns are split whole); pp divides num_layers (equal stages); dp·micro_batches
    divides global_batch (each micro-batch holds whole sequences); and with pp > 1,
    micro_batches >= pp (MindSpore's pipeline rule, see mindformers' TransformerOpParallelConfig).

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    fn = "validate_layout"
    for n, v in (("dp", dp), ("mp", mp), ("pp", pp), ("micro_batches", micro_batches),
                 ("n_devices", n_devices), ("global_batch", global_batch)):
        _pos(fn, n, v)
    heads, ffn, layers = _dims(cfg)
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
class PlannedLayout:
    """One layout priced: the doctor's `Layout` (`mshelpers.doctor.Layout`: degrees, micro-batches, schedule) and
    its per-device costs per step, as the doctor prices them. dp, mp, pp, micro_batches, micro_batch_size, cp, ep,
    schedule, virtual_stages and interleaved_order are read off the Layout.
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    layout: Any                           # the doctor's Layout (any object with its dp, tp, pp, ... fields)
    memory_per_device_bytes: int          # the largest stage's total (doctor.memory_per_stage)
    comm_bytes_per_step: int              # bytes one device sends per step, every group (doctor.adapt.traffic_bytes)
    bubble_fraction: float                # (p-1)/(v·m+p-1) of the schedule
    comm_dp_bytes: int = 0
    comm_tp_bytes: int = 0
    comm_pp_bytes: int = 0
    model_state_bytes: int = 0            # params + grads + optimizer states of that stage
    activation_bytes: int = 0
    fits: bool | None = None              # within the budget, if one was given (a mindformers file always has one)
    step_time: dict | None = field(default=None, compare=False)   # doctor.step_time's terms if hardware given
    comm_ep_bytes: int = 0
    comm_cp_bytes: int = 0
    config: Any = field(default=None, compare=False, repr=False)  # the doctor Config priced (model + layout)

    dp = property(lambda self: self.layout.dp)
    mp = property(lambda self: self.layout.tp)
    pp = property(lambda self: self.layout.pp)
    cp = property(lambda self: self.layout.cp)
    ep = property(lambda self: self.layout.ep)
    micro_batches = property(lambda self: self.layout.n_micro)          # pipeline micro-batches or accumulation
    micro_batch_size = property(lambda self: self.layout.batch)         # sequences per micro-batch per dp rank
    schedule = property(lambda self: self.layout.schedule if self.pp > 1 else "1f1b")
    virtual_stages = property(lambda self: self.layout.vpp if self.pp > 1 else 1)   # model chunks per device
    interleaved_order = property(lambda self: self.layout.interleaved_order)

    @property
    def n_devices(self) -> int:
        return self.dp * self.mp * self.pp * self.cp

    @property
    def name(self) -> str:
        extra = "" if (self.schedule, self.virtual_stages) == ("1f1b", 1) else \
            f" {self.schedule}" + (f" v={self.virtual_stages}" if self.virtual_stages > 1 else "")
        return f"{self.dp}dp×{self.mp}mp×{self.pp}pp m={self.micro_batches}{extra}"

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


# ---------------------------------------------------------------- the planner: layouts priced by the doctor
def make_layout(cfg: Any, dp: int | None = None, mp: int | None = None, pp: int | None = None,
                micro_batches: int | None = None, *, global_batch: int | None = None, seq_len: int | None = None,
                zero_stage: int = 0, sequence_parallel: bool = False, memory_budget_bytes: float | None = None,
                hardware: Hardware | None = None, schedule: str = "1f1b", virtual_stages: int = 1,
                interleaved_order: str = "standard", flash_attention: bool = False,
                model_config: Any = None) -> PlannedLayout:
    """Price one layout (validated first) with the doctor; `plan_parallel_layout` calls this for every candidate.

    `cfg` is a RunConfig (then dp, mp, pp and global_batch are required): its doctor Config is built directly
    (`doctor.adapt.planned_config`), the Config `doctor.read_config` reads from the mindformers YAML
    `mindformers_yaml` writes for the layout (use_flash_attention = `flash_attention`, use_seq_parallel =
    `sequence_parallel`, the parallel optimizer for zero_stage >= 1 and gradient_accumulation_shard for 2,
    pp_interleave_num = `virtual_stages` for the interleaved schedule; tests/doctor/test_one_price.py holds the two
    to one price), with the schedule asked for, and priced by `doctor.memory_per_stage` (and `doctor.step_time`
    with `hardware`). `cfg` may instead be a mindformers YAML (path or dict) or a doctor Config: without degrees it
    is priced as it is (what `python -m mshelpers.doctor FILE` says), with degrees on the same global batch, its
    Layout varied by `doctor.adapt.on_degrees` (dataclasses.replace; the file's own switches kept); every other
    setting is the file's.

    Memory: the largest stage's total; a file without max_device_memory is held against the hardware's memory
    (the Atlas 800T A2's 64 GiB by default), as the CLI does. With pp > 1 each stage holds the micro-batches its
    schedule keeps in flight ("gpipe", "1f1b", "interleaved" in its `interleaved_order`): the doctor's count,
    `pipeline_in_flight`.

    Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    fn = "make_layout"
    virtual_stages = _pos(fn, "virtual_stages", virtual_stages)
    base = _file_config(fn, cfg, memory_budget_bytes, model_config, hardware)
    if base is None:
        for n, v in (("dp", dp), ("mp", mp), ("pp", pp), ("global_batch", global_batch)):
            if v is None:
                raise ValueError(f"{fn}: {n}=None with a RunConfig; fix: pass dp, mp, pp and global_batch (or a "
                                 "mindformers YAML to price its own layout)")
        micro_batches = 1 if micro_batches is None else micro_batches
        s = seq_len or _cfg_int(cfg, "seq_len")
        validate_layout(cfg, dp, mp, pp, micro_batches, n_devices=dp * mp * pp, global_batch=global_batch)
        if __package__:
            from .doctor.adapt import planned_config
            from .pipeline import _check_schedule
        else:  # copied beside its siblings as plain files
            from doctor.adapt import planned_config
            from pipeline import _check_schedule
        _check_schedule(fn, pp, micro_batches, schedule, virtual_stages, interleaved_order)
        layers = _cfg_int(cfg, "num_layers")
        if schedule == "interleaved" and (pp == 1 or layers % (pp * virtual_stages)):
            raise ValueError(f"{fn}: interleaved with pp={pp}, virtual_stages={virtual_stages} needs pp > 1 and "
                             f"pp*virtual_stages dividing num_layers={layers}; fix: use a virtual_stages "
                             f"dividing {layers // pp} with pp > 1")
        if zero_stage not in (0, 1, 2):
            raise ValueError(f"{fn}: zero_stage={zero_stage!r} is not priced; fix: 0, 1 (MindSpore's parallel "
                             "optimizer) or 2 (and gradient_accumulation_shard); a mindformers YAML has no ZeRO-3")
        priced = planned_config(cfg, dp, mp, pp, micro_batches, global_batch=global_batch, seq_len=s,
                                zero_stage=zero_stage, sequence_parallel=sequence_parallel,
                                flash_attention=flash_attention, schedule=schedule, virtual_stages=virtual_stages,
                                interleaved_order=interleaved_order, budget=memory_budget_bytes)
        return _priced(priced, hardware, memory_budget_bytes is not None)
    _file_keeps_its_settings(fn, zero_stage=zero_stage, sequence_parallel=sequence_parallel,
                             flash_attention=flash_attention, seq_len=seq_len, schedule=schedule,
                             virtual_stages=virtual_stages)
    lay = base.layout
    if global_batch is not None and global_batch != lay.global_batch:
        raise ValueError(f"{fn}: global_batch={global_batch} but the file trains on {lay.global_batch}; "
                         "fix: omit global_batch (the file's is kept)")
    if (dp, mp, pp, micro_batches) != (None,) * 4:
        dp, mp, pp = dp or lay.dp, mp or lay.tp, pp or lay.pp
        micro_batches = micro_batches or (lay.n_micro if (dp, mp, pp) == (lay.dp, lay.tp, lay.pp) else pp)
        base = _vary(fn, base, dp, mp, pp, micro_batches)
    return _priced(base, hardware, True)


def plan_parallel_layout(cfg: Any, n_devices: int | None = None, *, global_batch: int | None = None,
                         seq_len: int | None = None, micro_batches: Iterable[int] | None = None,
                         max_micro_batches: int = 32, zero_stage: int = 0, sequence_parallel: bool = False,
                         memory_budget_bytes: float | None = None, hardware: Hardware | None = None,
                         schedule: str = "1f1b", virtual_stages: int = 1,
                         interleaved_order: str = "standard", flash_attention: bool = False,
                         model_config: Any = None) -> list[PlannedLayout]:
    """Every valid (dp, mp, pp, micro_batches) on `n_devices`, priced by `make_layout` and sorted best first.

    `cfg`: a RunConfig (global_batch and n_devices required), or a mindformers YAML / doctor Config (its devices
    and global batch unless given; its other settings kept). `schedule`/`virtual_stages`/`interleaved_order`
    apply to the layouts with pp > 1 (see `make_layout`); with "interleaved", pp values that pp·virtual_stages
    does not fit in the layers are skipped, and layouts with pp = 1 keep the plain costs.

    `micro_batches` restricts the micro-batch counts tried (default: every count up to `max_micro_batches` that
    divides the per-dp batch; with pp = 1 it is gradient accumulation, which trades activation memory for
    smaller steps). Ranking: layouts that fit the budget first; then, with `hardware`, the shortest step
    (`doctor.step_time`); without it, the smallest bubble, then the fewest bytes sent, then the least memory.
    Raises ValueError if no layout is valid. Taught in notebooks/05_semi_auto_parallel.ipynb.
    """
    fn = "plan_parallel_layout"
    if n_devices is not None:
        n_devices = _pos(fn, "n_devices", n_devices)
    if global_batch is not None:
        global_batch = _pos(fn, "global_batch", global_batch)
    if seq_len is not None:
        seq_len = _pos(fn, "seq_len", seq_len)
    if memory_budget_bytes is not None and not memory_budget_bytes > 0:
        raise ValueError(f"{fn}: memory_budget_bytes={memory_budget_bytes!r} is invalid; fix: a positive byte count")
    wanted = None if micro_batches is None else sorted(set(micro_batches))
    for m in wanted or ():
        _pos(fn, "micro_batches", m)
    base = _file_config(fn, cfg, memory_budget_bytes, model_config, hardware)
    if base is None:
        if getattr(cfg, "replace", None) is None:
            raise ValueError(f"{fn}: cfg={type(cfg).__name__} is not a RunConfig; fix: pass RunConfig.preset(...) "
                             "or a mindformers YAML path")
        for n, v in (("n_devices", n_devices), ("global_batch", global_batch)):
            if v is None:
                raise ValueError(f"{fn}: {n}=None with a RunConfig; fix: pass {n}")
        cp, batch = 1, global_batch
        kw = dict(global_batch=global_batch, seq_len=seq_len, zero_stage=zero_stage,
                  sequence_parallel=sequence_parallel, memory_budget_bytes=memory_budget_bytes,
                  hardware=hardware, flash_attention=flash_attention)
    else:
        _file_keeps_its_settings(fn, zero_stage=zero_stage, sequence_parallel=sequence_parallel,
                                 flash_attention=flash_attention, seq_len=seq_len, schedule=schedule,
                                 virtual_stages=virtual_stages)
        lay = base.layout
        cp, n_devices = lay.cp, n_devices or lay.devices
        if global_batch is not None and global_batch != lay.global_batch:
            raise ValueError(f"{fn}: global_batch={global_batch} but the file trains on {lay.global_batch}; "
                             "fix: omit global_batch (the file's is kept)")
        batch = lay.global_batch // lay.interleave
        kw = dict(hardware=hardware)
        cfg = base
    heads, ffn, layers = _dims(cfg)
    out = []
    for mp in _divisors(n_devices // cp) if n_devices % cp == 0 else []:
        for pp in _divisors(n_devices // (cp * mp)):
            dp = n_devices // (cp * mp * pp)
            if batch % dp:
                continue
            for m in [m for m in (wanted or range(1, max_micro_batches + 1)) if (batch // dp) % m == 0]:
                if heads % mp or ffn % mp or layers % pp or (pp > 1 and m < pp):
                    continue                      # validate_layout's rules, which make_layout enforces
                sched = dict(schedule=schedule, virtual_stages=virtual_stages,
                             interleaved_order=interleaved_order) if pp > 1 and base is None else {}
                if sched and schedule == "interleaved" and layers % (pp * virtual_stages):
                    continue
                try:
                    out.append(make_layout(cfg, dp, mp, pp, m, **kw, **sched))
                except ValueError:                # a file's layout the doctor refuses (offsets, expert parallel)
                    if base is None:
                        raise
    if not out:
        raise ValueError(f"{fn}: no valid layout for n_devices={n_devices}, global_batch={batch} with "
                         f"num_heads={heads}, ffn_hidden_size={ffn}, num_layers={layers}; fix: use a "
                         "global_batch divisible by a factor of n_devices (e.g. a multiple of n_devices)")

    def key(l: PlannedLayout):
        unfit = l.fits is False
        if l.step_time is not None:
            return (unfit, l.step_time["step_s"], l.memory_per_device_bytes)
        return (unfit, l.bubble_fraction, l.comm_bytes_per_step, l.memory_per_device_bytes)
    return sorted(out, key=key)


def find_layout(plans: Sequence[PlannedLayout], dp: int, mp: int, pp: int = 1,
                micro_batches: int | None = None) -> PlannedLayout:
    """The first layout in `plans` with these degrees (the best-ranked micro_batches if not given).
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    for l in plans:
        if (l.dp, l.mp, l.pp) == (dp, mp, pp) and (micro_batches is None or l.micro_batches == micro_batches):
            return l
    raise ValueError(f"find_layout: no planned layout with dp={dp}, mp={mp}, pp={pp}, "
                     f"micro_batches={micro_batches}; fix: check validate_layout(...) for why it is invalid")


def estimate_step_time(cfg: Any, layout: PlannedLayout, hardware: Hardware, *, global_batch: int | None = None,
                       seq_len: int | None = None) -> dict[str, float]:
    """`doctor.step_time` of the layout's doctor Config on `hardware` (its terms: compute_s, tp_s, ep_s, cp_s,
    p2p_s, bubble_s, dp_s, optimizer_s, step_s, ...), plus comm_share: the communication terms' share of the step.

    A layout from `make_layout` carries its Config; any other object with dp, mp, pp and micro_batches is priced
    as `make_layout(cfg, dp, mp, pp, micro_batches, global_batch=..., seq_len=...)` would price it.
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    dcfg = getattr(layout, "config", None)
    if dcfg is None:
        dcfg = make_layout(cfg, layout.dp, layout.mp, layout.pp, layout.micro_batches, global_batch=global_batch,
                           seq_len=seq_len).config
    if __package__:
        from .hardware import Hardware
    else:  # copied beside its siblings as plain files
        from hardware import Hardware
    if not isinstance(hardware, Hardware):
        raise ValueError(f"estimate_step_time: hardware={type(hardware).__name__}; fix: pass a hardware.Hardware "
                         "(Hardware.reference('ascend-910b'), Hardware.from_measurement(...))")
    return _step(dcfg, hardware)


def communication_bytes(cfg: Any, dp: int, mp: int, pp: int, micro_batches: int = 1, *, global_batch: int,
                        seq_len: int | None = None, zero_stage: int = 0, sequence_parallel: bool = False,
                        flash_attention: bool = False) -> dict[str, int]:
    """Bytes one device sends per optimizer step, by group, as the doctor prices them (`doctor.adapt.traffic_bytes`:
    each group's collectives on the links of `make_layout`'s Config, with (n-1)/n of the buffer per ring pass).

    Keys: dp (the gradient reduction: reduce-scatter + all-gather = one ring all-reduce of the stage's gradients),
    tp (per layer and micro-batch 4 all-reduces of the b·s·h 16-bit activations, 6 under full recompute),
    pp (per micro-batch one activation forward and one gradient back), ep, cp, total, and the pieces they come
    from: grad_buffer_bytes (the stage's gradients), tp_buffer_bytes (one b·s·h all-reduce at 16 bits, as the
    doctor sends activations), tp_allreduces. The stage counted is the first that sends the most.

        >>> from mshelpers.config import RunConfig
        >>> c = communication_bytes(RunConfig.preset("mini"), 2, 1, 1, global_batch=8)
        >>> c["dp"] == 3_688_704 * 4, c["tp"], c["pp"]       # 2 ranks: one fp32 gradient copy each way
        (True, 0, 0)

    Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
    """
    lay = make_layout(cfg, dp, mp, pp, micro_batches, global_batch=global_batch, seq_len=seq_len,
                      zero_stage=zero_stage, sequence_parallel=sequence_parallel, flash_attention=flash_attention)
    if __package__:
        from . import collectives as C, doctor as D
        from .doctor import adapt
    else:  # copied beside its siblings as plain files
        import collectives as C
        import doctor as D
        from doctor import adapt
    t = adapt.traffic_bytes(lay.config)
    d, model = lay.config.layout, lay.config.model
    grad = sum(D.stage_params(lay.config, t["stage"])) * d.param_bytes
    buf = C.tp_allreduce_buffer_bytes(d.batch * d.interleave, model.seq // d.cp, model.hidden, 2)
    out = {k: round(t[k]) for k in ("dp", "tp", "pp", "ep", "cp", "total")}
    out.update(grad_buffer_bytes=round(grad), tp_buffer_bytes=buf,
               tp_allreduces=round(t["tp"] / C.ring_allreduce_bytes(buf, mp)) if mp > 1 else 0)
    return out


def _file_config(fn: str, cfg: Any, budget: Any, model_config: Any, hardware: Any) -> Any:
    """A doctor Config for a mindformers file (path, parsed dict) or a doctor Config; None for a RunConfig."""
    is_cfg = all(hasattr(cfg, a) for a in ("model", "layout", "dialect", "budget_bytes"))
    if not (is_cfg or isinstance(cfg, (str, os.PathLike)) or (isinstance(cfg, dict) and (
            "model" in cfg or "training" in cfg))):
        return None
    if __package__:
        from .doctor.adapt import file_config
        from .hardware import Hardware
    else:  # copied beside its siblings as plain files
        from doctor.adapt import file_config
        from hardware import Hardware
    memory = (hardware or Hardware.reference("ascend-910b")).memory_bytes
    return file_config(cfg, budget=budget, model_config=model_config, memory_bytes=memory)


_PLANNER_DEFAULTS = {"zero_stage": 0, "sequence_parallel": False, "flash_attention": False, "seq_len": None,
                     "schedule": "1f1b", "virtual_stages": 1}


def _file_keeps_its_settings(fn: str, **given: Any) -> None:
    """A mindformers file says these itself: a planner keyword other than its default is refused, not ignored."""
    for n, v in given.items():
        if v != _PLANNER_DEFAULTS[n]:
            raise ValueError(f"{fn}: {n}={v!r} with a mindformers config; fix: set it in the file (the planner "
                             "varies only dp, mp, pp and the micro-batches of a file)")


def _vary(fn: str, base: Any, dp: int, mp: int, pp: int, m: int) -> Any:
    """`base` on dp x mp x pp with m micro-batches, the same global batch (`doctor.adapt.on_degrees`)."""
    lay = base.layout
    for n, v in (("dp", dp), ("mp", mp), ("pp", pp), ("micro_batches", m)):
        _pos(fn, n, v)
    validate_layout(base, dp, mp, pp, m, n_devices=dp * mp * pp, global_batch=lay.global_batch // lay.interleave)
    if __package__:
        from .doctor.adapt import on_degrees
    else:  # copied beside its siblings as plain files
        from doctor.adapt import on_degrees
    return on_degrees(base, dp, mp, pp, m)


def _priced(dcfg: Any, hardware: Any, fits_known: bool) -> PlannedLayout:
    """A doctor Config priced by the doctor: memory (its schedule's in-flight micro-batches included) and traffic,
    step time on `hardware`."""
    if __package__:
        from . import doctor as D, pipeline as P
        from .doctor import adapt
    else:  # copied beside its siblings as plain files
        import doctor as D
        import pipeline as P
        from doctor import adapt
    lay = dcfg.layout
    if hardware is not None:        # HCCL's buffers kept free on a device with a pool, as the doctor keeps them
        dcfg = D.with_reserve(dcfg, hardware.to_doctor()[0])
    mem = D.memory_per_stage(dcfg)
    part, total = mem["breakdown"], mem["memory_per_device_bytes"]
    t = adapt.traffic_bytes(dcfg)
    return PlannedLayout(layout=lay, memory_per_device_bytes=total, comm_bytes_per_step=round(t["total"]),
                         bubble_fraction=P.pipeline_bubble_fraction(lay.pp, lay.n_micro, lay.vpp if lay.pp > 1 else 1),
                         comm_dp_bytes=round(t["dp"]), comm_tp_bytes=round(t["tp"]), comm_pp_bytes=round(t["pp"]),
                         model_state_bytes=part["params"] + part["grads"] + part["optimizer_states"],
                         activation_bytes=part["activations"], fits=mem["fits"] if fits_known else None,
                         step_time=_step(dcfg, hardware) if hardware is not None else None,
                         comm_ep_bytes=round(t["ep"]), comm_cp_bytes=round(t["cp"]), config=dcfg)


def _step(dcfg: Any, hardware: Hardware) -> dict:
    hw, cal = hardware.to_doctor()
    if __package__:
        from .doctor import step_time
    else:  # copied beside its siblings as plain files
        from doctor import step_time
    st = dict(step_time(dcfg, hw, cal))
    comm = sum(st.get(k, 0.0) for k in ("tp_s", "ep_s", "cp_s", "p2p_s", "dp_s"))
    st["comm_share"] = comm / st["step_s"] if st["step_s"] else 0.0
    return st


def _dims(cfg: Any) -> tuple[int, int, int]:
    """(heads, FFN width, layers) of a RunConfig-like object or a doctor Config."""
    m = getattr(cfg, "model", None)
    if m is not None and all(hasattr(m, a) for a in ("heads", "ffn", "layers")):
        return m.heads, m.ffn, m.layers
    return tuple(_cfg_int(cfg, k) for k in ("num_heads", "ffn_hidden_size", "num_layers"))


# ---------------------------------------------------------------- internals
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pos(fn: str, name: str, v: Any) -> int:
    """A positive count from an int, a numpy integer or an integral float (4.0); else one ValueError.
    (The same lines as pipeline._pos and collectives._pos, inlined so that each module copies alone.)"""
    import numbers
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and int(v) > 0:
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer"
                     + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))


def _cfg_int(cfg: Any, name: str) -> int:
    """A positive integer field of the config (as mindformers_yaml._cfg_int, inlined: the module copies alone)."""
    v = getattr(cfg, name, None)
    import numbers
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0:
        return int(v)
    raise ValueError(f"cfg.{name}={v!r} is invalid; fix: pass a RunConfig (RunConfig.preset(...)) "
                     "with a positive integer there")
