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

What the figures mean (all per device, per optimizer step). One cost model prices every layout: the config
doctor (`mshelpers.doctor`, notebook 12, `python -m mshelpers.doctor`). The planner writes the mindformers YAML a
layout becomes (`mindformers_yaml`), reads it with `doctor.read_config` and prices it:
- memory: `doctor.memory_per_stage`, the largest pipeline stage's parameters, gradients and optimizer states (the
  mp·pp split, MindSpore's parallel optimizer for ZeRO-1/2) and activations (Korthikanti et al. 2022 through
  `mshelpers.memory.activation_bytes_per_layer`, 1F1B's in-flight micro-batches);
- communication: bytes one device sends, read off the doctor's collectives (`doctor.adapt.traffic_bytes`): the dp
  gradient reduction, Megatron's tp all-reduces (2 forward + 2 backward per layer and micro-batch, 2 more under full
  recompute, each of b·s·h 16-bit values), pp point-to-point (an activation forward, a gradient back);
- step time, under a `Hardware` profile: `doctor.step_time`, with ranks placed on nodes as mindformers places them
  and every group's collectives on the links it crosses;
- bubble: (p-1)/(m+p-1), the idle share of a pipeline step (GPipe and 1F1B alike); (p-1)/(v·m+p-1) for the
  interleaved schedule with v virtual stages (model chunks) per device.
What stays here is what only this module does: the layout rules (`validate_layout`), the schedules played out
(`simulate_pipeline`, `pipeline_in_flight`), collectives measured on this machine and their alpha-beta fit
(`measure_collectives`, `fit_alpha_beta`, `Hardware.from_measurement`), the shard check, and the mindformers YAML.
The model cannot see kernel efficiency beyond its calibration, overlap beyond one fitted factor, or contention:
measure the winner.

Communication measured, not assumed:
    >>> rows = [{"op": "all_reduce", "bytes": b, "seconds": 1e-3 + b / 2e8, "ranks": 2} for b in (4096, 2**20, 2**24)]
    >>> alpha, beta = fit_alpha_beta(rows, "all_reduce")        # also .residuals, .max_ratio, .predict(n)
    >>> round(alpha, 6), round(beta / 1e6)
    (0.001, 200)

Pipeline schedules played out, with the micro-batches each stage holds:
    >>> sim = simulate_pipeline(4, 8, "interleaved", virtual_stages=2)
    >>> bubble = pipeline_bubble_fraction(4, 8, virtual_stages=2)         # (p-1)/(v·m+p-1)
    >>> round(sim["idle_fraction"], 4) == round(bubble, 4), sim["peak_in_flight"]
    (True, [5.5, 4.5, 3.5, 2.5])
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence


def _sibling(module: str, *names: str) -> Any:
    """A sibling cookbook module (or names from it), imported when a function needs it:
    mshelpers.<module> inside the package, plain <module> when the files were copied side by side."""
    import importlib
    mod = importlib.import_module(f"{__package__}.{module}" if __package__ else module)
    got = tuple(getattr(mod, n) for n in names)
    return mod if not names else got[0] if len(names) == 1 else got


# The one cost model the planner prices with is the config doctor (mshelpers/doctor/, copied beside this file as
# its folder): `_sibling("doctor")` inside the functions that price, so the rest of this module copies alone.


# ---------------------------------------------------------------- small formulas
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
    """
    pp = _pos("pipeline_bubble_fraction", "pp", pp)
    micro_batches = _pos("pipeline_bubble_fraction", "micro_batches", micro_batches)
    virtual_stages = _pos("pipeline_bubble_fraction", "virtual_stages", virtual_stages)
    return (pp - 1) / (virtual_stages * micro_batches + pp - 1)


def ring_allreduce_bytes(buffer_bytes: int, group_size: int) -> int:
    """Bytes each rank sends in a ring all-reduce of `buffer_bytes`: 2(n-1)/n·S (0 for n = 1).

        >>> ring_allreduce_bytes(1000, 2), ring_allreduce_bytes(1000, 8)
        (1000, 1750)
    """
    group_size = _pos("ring_allreduce_bytes", "group_size", group_size)
    return round(2 * (group_size - 1) * buffer_bytes / group_size)


def ring_allgather_bytes(output_bytes: int, group_size: int) -> int:
    """Bytes each rank sends in a ring all-gather whose gathered output is `output_bytes`: (n-1)/n·S.

        >>> ring_allgather_bytes(1000, 2)
        500
    """
    group_size = _pos("ring_allgather_bytes", "group_size", group_size)
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
class Layout:
    """One dp × mp × pp layout with micro_batches, and its per-device costs per step, as the doctor prices them."""
    dp: int
    mp: int
    pp: int
    micro_batches: int
    micro_batch_size: int                 # sequences per micro-batch per dp rank
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
    schedule: str = "1f1b"                # pipeline schedule the bubble and activation memory assume
    virtual_stages: int = 1               # model chunks per device (interleaved schedule)
    interleaved_order: str = "standard"
    cp: int = 1
    ep: int = 1
    comm_ep_bytes: int = 0
    comm_cp_bytes: int = 0
    config: Any = field(default=None, compare=False, repr=False)  # the doctor Config priced (model + layout)

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


@dataclass(frozen=True)
class Hardware:
    """Device and links for the planner, each figure with where it comes from; priced as a doctor profile.

    Bandwidths are per device and per direction. `intra_node_bytes_per_s` is all of a device's links inside a
    node, `links_per_device` how many links it is split over (Ascend HCCS: a full mesh of 7); which of them a
    group uses, and where a group that spans nodes runs at `inter_node_bytes_per_s`, is the doctor's rule
    (`doctor.topology`). Latencies (alpha) add once per pass of a collective (an all-reduce is a reduce-scatter
    and an all-gather: 2 passes).
    `to_doctor()` turns the profile into the doctor's `DoctorHardware` and `Calibration`, which price every step
    (`doctor.cost.step_time`); `compute_efficiency` is the calibration's matmul share of peak. The Ascend profile
    is the doctor's own ("atlas-800t-a2", with its fitted calibration); build one with `Hardware.from_doctor`,
    `Hardware.from_measurement` (this machine), `Hardware.reference(name)` or by hand.
    """
    peak_flops_per_device: float          # FLOP/s at 16-bit (a doctor profile keeps its other dtypes' ratios)
    intra_node_bytes_per_s: float         # per device, per direction, all its links inside a node
    inter_node_bytes_per_s: float         # per device, per direction, between nodes
    devices_per_node: int = 8
    compute_efficiency: float = 0.5       # share of peak the matmuls reach (kernel MFU)
    intra_node_latency_s: float = 0.0     # alpha of one pass inside a node
    inter_node_latency_s: float = 0.0     # alpha of one pass that crosses nodes
    name: str = "assumed"
    sources: tuple = field(default=(), compare=False)   # ((field, provenance), ...)
    links_per_device: int = 1             # full-mesh links per device (1: a switch, any group gets the whole figure)
    hbm_bytes_per_s: float = 1e12         # the optimizer update's memory traffic
    memory_bytes: float = 64 * 2**30      # device memory: the budget when a mindformers file gives none
    dp_overlap: float = 1.0               # share of the last backward the gradient reduction can hide behind
    calibration: Any = field(default=None, compare=False)      # a doctor Calibration; None: (efficiency, 1.0)
    doctor_profile: Any = field(default=None, compare=False)   # the DoctorHardware this view was made from

    def source(self, field_name: str) -> str:
        """Where `field_name`'s figure comes from ("assumed" if nobody said)."""
        return dict(self.sources).get(field_name, "assumed")

    def table(self) -> list[dict]:
        """One row per figure with its source, for a notebook table."""
        keys = ("peak_flops_per_device", "intra_node_bytes_per_s", "links_per_device", "inter_node_bytes_per_s",
                "devices_per_node", "intra_node_latency_s", "inter_node_latency_s", "compute_efficiency",
                "hbm_bytes_per_s", "memory_bytes")
        return [{"hardware": self.name, "figure": k, "value": getattr(self, k), "source": self.source(k)}
                for k in keys]

    @classmethod
    def reference(cls, name: str) -> "Hardware":
        """A cited profile from REFERENCE_HARDWARE ("ascend-910b", "a100-sxm", "h100-sxm")."""
        if name not in REFERENCE_HARDWARE:
            raise ValueError(f"Hardware.reference: name={name!r} is unknown; fix: use one of "
                             f"{sorted(REFERENCE_HARDWARE)}")
        return REFERENCE_HARDWARE[name]

    @classmethod
    def from_doctor(cls, profile: Any, calibration: Any = None, *, name: str | None = None) -> "Hardware":
        """The planner's view of a doctor profile (`doctor.hardware(name)`), priced with `calibration` (a doctor
        Calibration, e.g. doctor.CALIBRATION; None: compute_efficiency 1, no other constant)."""
        src = getattr(profile, "sources", {}) or {}
        node = src.get("node", "assumed")
        return cls(peak_flops_per_device=profile.peak("float16"),
                   intra_node_bytes_per_s=profile.intra_link_bytes_per_s * profile.links_per_device,
                   inter_node_bytes_per_s=profile.inter_bytes_per_s, devices_per_node=profile.devices_per_node,
                   compute_efficiency=calibration.compute_efficiency if calibration is not None else 1.0,
                   intra_node_latency_s=profile.intra_latency_s, inter_node_latency_s=profile.inter_latency_s,
                   name=name or profile.name, links_per_device=profile.links_per_device,
                   hbm_bytes_per_s=profile.hbm_bytes_per_s, memory_bytes=profile.memory_bytes,
                   dp_overlap=profile.dp_overlap, calibration=calibration, doctor_profile=profile,
                   sources=(("peak_flops_per_device", src.get("peak", "assumed")),
                            ("intra_node_bytes_per_s", src.get("intra", "assumed")),
                            ("links_per_device", src.get("intra", "assumed")),
                            ("inter_node_bytes_per_s", src.get("inter", "assumed")),
                            ("intra_node_latency_s", src.get("intra", "assumed")),
                            ("inter_node_latency_s", src.get("inter", "assumed")),
                            ("devices_per_node", node), ("hbm_bytes_per_s", src.get("hbm", "assumed")),
                            ("memory_bytes", node),
                            ("compute_efficiency", "fitted: the doctor's calibration (" + ", ".join(
                                getattr(calibration, "fitted_on", ())) + ")" if calibration is not None
                             else "1.0: no calibration given")))

    def to_doctor(self) -> tuple[Any, Any]:
        """(DoctorHardware, Calibration) that `doctor.cost.step_time` prices with. A view made by `from_doctor`
        gives back its profile, with any figure changed since (`dataclasses.replace`) changed in it too."""
        D = _sibling("doctor")
        mine = self._doctor_fields()
        if self.doctor_profile is not None:
            was = Hardware.from_doctor(self.doctor_profile, self.calibration)._doctor_fields()
            changed = {k: v for k, v in mine.items() if v != was[k]}
            if "peak_flops" in changed:            # the other dtypes keep their ratio to the 16-bit peak
                scale = self.peak_flops_per_device / self.doctor_profile.peak("float16")
                changed["peak_flops"] = {k: v * scale for k, v in self.doctor_profile.peak_flops.items()}
            hw = replace(self.doctor_profile, **changed) if changed else self.doctor_profile
        else:
            hw = D.DoctorHardware(name=self.name, sources=dict(self.sources), **mine)
        cal = self.calibration
        if cal is None:
            cal = D.Calibration(compute_efficiency=self.compute_efficiency, comm_time_factor=1.0)
        elif cal.compute_efficiency != self.compute_efficiency:
            cal = replace(cal, compute_efficiency=self.compute_efficiency)
        return hw, cal

    def _doctor_fields(self) -> dict:
        p = self.peak_flops_per_device
        return {"peak_flops": {"float16": p, "bfloat16": p, "float32": p}, "hbm_bytes_per_s": self.hbm_bytes_per_s,
                "intra_link_bytes_per_s": self.intra_node_bytes_per_s / self.links_per_device,
                "links_per_device": self.links_per_device, "inter_bytes_per_s": self.inter_node_bytes_per_s,
                "devices_per_node": self.devices_per_node, "intra_latency_s": self.intra_node_latency_s,
                "inter_latency_s": self.inter_node_latency_s, "memory_bytes": self.memory_bytes,
                "dp_overlap": self.dp_overlap}

    @classmethod
    def from_measurement(cls, rows_or_fit: Any, *, peak_flops_per_device: float, op: str = "all_reduce",
                         group_size: int | None = None, compute_efficiency: float = 1.0,
                         name: str = "this machine (measured)", peak_source: str = "measured") -> "Hardware":
        """'This machine' from `measure_collectives` rows (or an `AlphaBetaFit`) and a measured peak: the doctor's
        CPU profile (`doctor.cpu_hardware`) for a measured collective of any kind.

        The alpha-beta fit of `op` gives the latency alpha and the op's bandwidth beta (message bytes per second);
        the link is beta times the bytes each rank sends per message byte (ring all-reduce 2(n-1)/n,
        all-gather/reduce-scatter (n-1)/n, broadcast 1) and alpha is split over the op's passes, so that
        `collective_time(op, S, n, hw)` gives back alpha + S/beta. All ranks run on one machine: devices_per_node
        = n, the inter-node figures repeat the intra-node ones (no second node was measured; the sources say so),
        no overlap of the gradient reduction (dp_overlap 0: a CPU reduces after the backward), memory = MemTotal.
        `peak_flops_per_device` should be a measured matmul rate per rank (e.g. `mshelpers.peak.peak_flops()`
        / n when the ranks share the cores), hence compute_efficiency = 1.0 by default.
        """
        fit = rows_or_fit if isinstance(rows_or_fit, AlphaBetaFit) else fit_alpha_beta(rows_or_fit, op)
        n = group_size or fit.ranks
        if not n or n < 2:
            raise ValueError(f"Hardware.from_measurement: group_size={n!r}; fix: pass group_size (the ranks measured)")
        if not (isinstance(peak_flops_per_device, numbers.Real) and not isinstance(peak_flops_per_device, bool)
                and peak_flops_per_device > 0):
            raise ValueError(f"Hardware.from_measurement: peak_flops_per_device={peak_flops_per_device!r}; "
                             "fix: pass a measured FLOP/s, e.g. mshelpers.peak.peak_flops()")
        bus = fit.beta_bytes_per_s * _send_factor(fit.op, n)
        lat = fit.alpha_s / _passes(fit.op)
        how = (f"measured: {fit.op} on {n} ranks, alpha-beta fit over {fit.n_points} sizes "
               f"(max pred/meas ratio {fit.max_ratio:.2f}); beta x {_send_factor(fit.op, n):.3g} bytes sent per byte, "
               f"alpha / {_passes(fit.op)} per pass")
        same = "not measured: all ranks on one machine; set equal to the intra-node figure"
        try:
            with open("/proc/meminfo") as f:
                mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
        except (OSError, StopIteration, ValueError):
            mem = 8 * 2**30
        return cls(peak_flops_per_device=float(peak_flops_per_device), intra_node_bytes_per_s=bus,
                   inter_node_bytes_per_s=bus, devices_per_node=n, compute_efficiency=compute_efficiency,
                   intra_node_latency_s=lat, inter_node_latency_s=lat, name=name, hbm_bytes_per_s=20e9,
                   memory_bytes=mem, dp_overlap=0.0,
                   sources=(("peak_flops_per_device", peak_source), ("intra_node_bytes_per_s", how),
                            ("intra_node_latency_s", how), ("inter_node_bytes_per_s", same),
                            ("inter_node_latency_s", same), ("devices_per_node", f"ranks measured: {n}"),
                            ("compute_efficiency", "1.0: the peak is already a measured matmul rate"),
                            ("hbm_bytes_per_s", "assumed 20 GB/s (the optimizer term only; not measured)"),
                            ("memory_bytes", "MemTotal of /proc/meminfo")))


# Cited reference profiles. Bandwidths are per device and per direction (see Hardware); a vendor's
# "900 GB/s NVLink" is the bidirectional total, so it enters as 450e9. Peaks are dense 16-bit tensor
# FLOP/s (vendors also print 2x "with sparsity" figures). These are datasheet (theoretical) figures:
# NCCL-tests bus bandwidths reach roughly 70-90 % of them, and latencies are left at 0 because the
# datasheets give none. The Ascend profile is the doctor's (mshelpers/doctor/hardware.py), made on first use.
_A100_DS = "NVIDIA A100 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100_DS = "NVIDIA H100 datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_NVIDIA = {
    "a100-sxm": Hardware(
        peak_flops_per_device=312e12, intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9,
        devices_per_node=8, compute_efficiency=0.5, name="NVIDIA A100 SXM4 80GB (DGX A100: NVLink 3 + HDR InfiniBand)",
        hbm_bytes_per_s=2039e9, memory_bytes=80e9,
        sources=(("peak_flops_per_device", "datasheet: BF16 Tensor Core 312 TFLOPS dense (624 with sparsity); "
                  + _A100_DS),
                 ("intra_node_bytes_per_s", "datasheet: NVLink 600 GB/s bidirectional = 300 GB/s per direction "
                                            "(12 links x 50 GB/s, through NVSwitch: links_per_device 1); " + _A100_DS),
                 ("inter_node_bytes_per_s", "datasheet: DGX A100 has one 200 Gb/s HDR InfiniBand ConnectX-6 port per "
                                            "GPU = 25 GB/s; NVIDIA DGX A100 datasheet, https://www.nvidia.com/content/"
                                            "dam/en-zz/Solutions/Data-Center/nvidia-dgx-a100-datasheet.pdf (not "
                                            "re-checked here)"),
                 ("devices_per_node", "DGX/HGX A100: 8 GPUs"),
                 ("hbm_bytes_per_s", "datasheet: A100 80GB SXM HBM2e 2,039 GB/s; " + _A100_DS),
                 ("memory_bytes", "datasheet: 80 GB HBM2e; " + _A100_DS),
                 ("compute_efficiency", "assumed"))),
    "h100-sxm": Hardware(
        peak_flops_per_device=989.5e12, intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
        devices_per_node=8, compute_efficiency=0.5, name="NVIDIA H100 SXM5 (DGX H100: NVLink 4 + NDR InfiniBand)",
        hbm_bytes_per_s=3.35e12, memory_bytes=80e9,
        sources=(("peak_flops_per_device", "datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity = 989.5 dense; "
                  + _H100_DS),
                 ("intra_node_bytes_per_s", "datasheet: NVLink 900 GB/s bidirectional = 450 GB/s per direction "
                                            "(18 links x 50 GB/s, through NVSwitch: links_per_device 1); " + _H100_DS),
                 ("inter_node_bytes_per_s", "DGX H100 user guide: one ConnectX-7 per GPU (8 OSFP ports), 400 Gb/s NDR "
                                            "= 50 GB/s; https://docs.nvidia.com/dgx/dgxh100-user-guide/"),
                 ("devices_per_node", "DGX/HGX H100: 8 GPUs"),
                 ("hbm_bytes_per_s", "datasheet: H100 SXM HBM3 3.35 TB/s; " + _H100_DS),
                 ("memory_bytes", "datasheet: 80 GB HBM3; " + _H100_DS),
                 ("compute_efficiency", "assumed"))),
}


class _Profiles(dict):
    """REFERENCE_HARDWARE: the NVIDIA profiles above and "ascend-910b", the doctor's "atlas-800t-a2" profile with
    the doctor's fitted calibration, made on first use (so this module imports without the doctor folder)."""

    def __missing__(self, name: str) -> Hardware:
        if name != "ascend-910b":
            raise KeyError(name)
        D = _sibling("doctor")
        hw = Hardware.from_doctor(D.hardware("atlas-800t-a2"), D.CALIBRATION,
                                  name="Huawei Ascend 910B (Atlas 800T A2, 376T bin: HCCS full mesh + RoCE)")
        self[name] = hw
        return hw

    def __contains__(self, name: object) -> bool:
        return name == "ascend-910b" or dict.__contains__(self, name)

    def __iter__(self):
        return iter(self.keys())

    def keys(self):
        return [*dict.keys(self), *(["ascend-910b"] if not dict.__contains__(self, "ascend-910b") else [])]

    def __len__(self) -> int:
        return len(self.keys())


REFERENCE_HARDWARE: dict[str, Hardware] = _Profiles(_NVIDIA)


# ---------------------------------------------------------------- the planner: layouts priced by the doctor
def make_layout(cfg: Any, dp: int | None = None, mp: int | None = None, pp: int | None = None,
                micro_batches: int | None = None, *, global_batch: int | None = None, seq_len: int | None = None,
                zero_stage: int = 0, sequence_parallel: bool = False, memory_budget_bytes: float | None = None,
                hardware: Hardware | None = None, schedule: str = "1f1b", virtual_stages: int = 1,
                interleaved_order: str = "standard", flash_attention: bool = False,
                model_config: Any = None) -> Layout:
    """Price one layout (validated first) with the doctor; `plan_parallel_layout` calls this for every candidate.

    `cfg` is a RunConfig (then dp, mp, pp and global_batch are required): the layout becomes the mindformers YAML
    `mindformers_yaml` writes for it (use_flash_attention = `flash_attention`, use_seq_parallel =
    `sequence_parallel`, the parallel optimizer for zero_stage >= 1 and gradient_accumulation_shard for 2,
    pp_interleave_num = `virtual_stages` for the interleaved schedule), and that YAML is read by
    `doctor.read_config` and priced by `doctor.memory_per_stage` (and `doctor.step_time` with `hardware`), so the
    figures are the doctor's for the file the planner emits. `cfg` may instead be a mindformers YAML (path or
    dict) or a doctor Config: without degrees it is priced as it is (what `python -m mshelpers.doctor FILE` says),
    with degrees on the same global batch, via `doctor.with_layout`; every other setting is the file's.

    Memory: the largest stage's total; a file without max_device_memory is held against the hardware's memory
    (the Atlas 800T A2's 64 GiB by default), as the CLI does. With pp > 1, "gpipe" and the interleaved schedule's
    "memory" order (which the doctor does not price) add to each stage the micro-batches `pipeline_in_flight`
    holds beyond the doctor's 1F1B count, times one micro-batch's stage activations (`doctor.adapt`).
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
        _check_schedule(fn, pp, micro_batches, schedule, virtual_stages, interleaved_order)
        layers = _cfg_int(cfg, "num_layers")
        if schedule == "interleaved" and (pp == 1 or layers % (pp * virtual_stages)):
            raise ValueError(f"{fn}: interleaved with pp={pp}, virtual_stages={virtual_stages} needs pp > 1 and "
                             f"pp*virtual_stages dividing num_layers={layers}; fix: use a virtual_stages "
                             f"dividing {layers // pp} with pp > 1")
        if zero_stage not in (0, 1, 2):
            raise ValueError(f"{fn}: zero_stage={zero_stage!r} is not priced; fix: 0, 1 (MindSpore's parallel "
                             "optimizer) or 2 (and gradient_accumulation_shard); a mindformers YAML has no ZeRO-3")
        skeleton = Layout(dp, mp, pp, micro_batches, global_batch // (dp * micro_batches), 0, 0, 0.0)
        spec = mindformers_yaml(cfg, skeleton, seq_len=s, zero_stage=zero_stage, use_flash_attention=flash_attention,
                                sequence_parallel=sequence_parallel,
                                virtual_stages=virtual_stages if schedule == "interleaved" else 1)
        priced = _sibling("doctor").read_config(spec, budget=memory_budget_bytes)
        return _priced(priced, hardware, schedule, virtual_stages, interleaved_order, memory_budget_bytes is not None)
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
    vpp = base.layout.vpp
    return _priced(base, hardware, "interleaved" if vpp > 1 else "1f1b", vpp, interleaved_order, True)


def plan_parallel_layout(cfg: Any, n_devices: int | None = None, *, global_batch: int | None = None,
                         seq_len: int | None = None, micro_batches: Iterable[int] | None = None,
                         max_micro_batches: int = 32, zero_stage: int = 0, sequence_parallel: bool = False,
                         memory_budget_bytes: float | None = None, hardware: Hardware | None = None,
                         schedule: str = "1f1b", virtual_stages: int = 1,
                         interleaved_order: str = "standard", flash_attention: bool = False,
                         model_config: Any = None) -> list[Layout]:
    """Every valid (dp, mp, pp, micro_batches) on `n_devices`, priced by `make_layout` and sorted best first.

    `cfg`: a RunConfig (global_batch and n_devices required), or a mindformers YAML / doctor Config (its devices
    and global batch unless given; its other settings kept). `schedule`/`virtual_stages`/`interleaved_order`
    apply to the layouts with pp > 1 (see `make_layout`); with "interleaved", pp values that pp·virtual_stages
    does not fit in the layers are skipped, and layouts with pp = 1 keep the plain costs.

    `micro_batches` restricts the micro-batch counts tried (default: every count up to `max_micro_batches` that
    divides the per-dp batch; with pp = 1 it is gradient accumulation, which trades activation memory for
    smaller steps). Ranking: layouts that fit the budget first; then, with `hardware`, the shortest step
    (`doctor.step_time`); without it, the smallest bubble, then the fewest bytes sent, then the least memory.
    Raises ValueError if no layout is valid.
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


def estimate_step_time(cfg: Any, layout: Layout, hardware: Hardware, *, global_batch: int | None = None,
                       seq_len: int | None = None) -> dict[str, float]:
    """`doctor.step_time` of the layout's doctor Config on `hardware` (its terms: compute_s, tp_s, ep_s, cp_s,
    p2p_s, bubble_s, dp_s, optimizer_s, step_s, ...), plus comm_share: the communication terms' share of the step.

    A layout from `make_layout` carries its Config; any other object with dp, mp, pp and micro_batches is priced
    as `make_layout(cfg, dp, mp, pp, micro_batches, global_batch=..., seq_len=...)` would price it."""
    dcfg = getattr(layout, "config", None)
    if dcfg is None:
        dcfg = make_layout(cfg, layout.dp, layout.mp, layout.pp, layout.micro_batches, global_batch=global_batch,
                           seq_len=seq_len).config
    if not isinstance(hardware, Hardware):
        raise ValueError(f"estimate_step_time: hardware={type(hardware).__name__}; fix: pass a parallel.Hardware "
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
    """
    lay = make_layout(cfg, dp, mp, pp, micro_batches, global_batch=global_batch, seq_len=seq_len,
                      zero_stage=zero_stage, sequence_parallel=sequence_parallel, flash_attention=flash_attention)
    D, adapt = _sibling("doctor"), _sibling("doctor.adapt")
    t = adapt.traffic_bytes(lay.config)
    d, model = lay.config.layout, lay.config.model
    grad = sum(D.stage_params(lay.config, t["stage"])) * d.param_bytes
    buf = tp_allreduce_buffer_bytes(d.batch * d.interleave, model.seq // d.cp, model.hidden, 2)
    out = {k: round(t[k]) for k in ("dp", "tp", "pp", "ep", "cp", "total")}
    out.update(grad_buffer_bytes=round(grad), tp_buffer_bytes=buf,
               tp_allreduces=round(t["tp"] / ring_allreduce_bytes(buf, mp)) if mp > 1 else 0)
    return out


def _file_config(fn: str, cfg: Any, budget: Any, model_config: Any, hardware: Any) -> Any:
    """A doctor Config for a mindformers file (path, parsed dict) or a doctor Config; None for a RunConfig."""
    is_cfg = all(hasattr(cfg, a) for a in ("model", "layout", "dialect", "budget_bytes"))
    if not (is_cfg or isinstance(cfg, (str, os.PathLike)) or (isinstance(cfg, dict) and (
            "model" in cfg or "training" in cfg))):
        return None
    memory = (hardware or Hardware.reference("ascend-910b")).memory_bytes
    return _sibling("doctor.adapt").file_config(cfg, budget=budget, model_config=model_config, memory_bytes=memory)


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
    return _sibling("doctor.adapt").on_degrees(base, dp, mp, pp, m)


def _priced(dcfg: Any, hardware: Any, schedule: str, v: int, order: str, fits_known: bool) -> Layout:
    """The planner's Layout for a doctor Config: memory and traffic from the doctor, step time on `hardware`."""
    D, adapt = _sibling("doctor"), _sibling("doctor.adapt")
    lay = dcfg.layout
    mem = D.memory_per_stage(dcfg)
    totals, parts = list(mem["per_stage_bytes"]), [dict(p) for p in mem["per_stage_breakdown"]]
    if lay.pp > 1 and (schedule == "gpipe" or (schedule == "interleaved" and order == "memory")):
        held = pipeline_in_flight(lay.pp, lay.micro, schedule, v, interleaved_order=order)
        for i in range(lay.pp):
            act = adapt.stage_activations(dcfg, i)
            extra = math.ceil((held[i] - act["in_flight"]) * act["per_micro_batch"])
            totals[i] += extra
            parts[i]["activations"] += extra
    stage = max(range(lay.pp), key=lambda k: totals[k])
    part, total = parts[stage], totals[stage]
    t = adapt.traffic_bytes(dcfg)
    return Layout(dp=lay.dp, mp=lay.tp, pp=lay.pp, micro_batches=lay.n_micro, micro_batch_size=lay.batch,
                  memory_per_device_bytes=total, comm_bytes_per_step=round(t["total"]),
                  bubble_fraction=pipeline_bubble_fraction(lay.pp, lay.n_micro, v if lay.pp > 1 else 1),
                  comm_dp_bytes=round(t["dp"]), comm_tp_bytes=round(t["tp"]), comm_pp_bytes=round(t["pp"]),
                  model_state_bytes=part["params"] + part["grads"] + part["optimizer_states"]
                  + part["grad_accum_buffer"], activation_bytes=part["activations"],
                  fits=(total <= dcfg.budget_bytes) if fits_known else None,
                  step_time=_step(dcfg, hardware) if hardware is not None else None,
                  schedule=schedule if lay.pp > 1 else "1f1b", virtual_stages=v if lay.pp > 1 else 1,
                  interleaved_order=order, cp=lay.cp, ep=lay.ep, comm_ep_bytes=round(t["ep"]),
                  comm_cp_bytes=round(t["cp"]), config=dcfg)


def _step(dcfg: Any, hardware: Hardware) -> dict:
    hw, cal = hardware.to_doctor()
    st = dict(_sibling("doctor").step_time(dcfg, hw, cal))
    comm = sum(st.get(k, 0.0) for k in ("tp_s", "ep_s", "cp_s", "p2p_s", "dp_s"))
    st["comm_share"] = comm / st["step_s"] if st["step_s"] else 0.0
    return st


def _dims(cfg: Any) -> tuple[int, int, int]:
    """(heads, FFN width, layers) of a RunConfig-like object or a doctor Config."""
    m = getattr(cfg, "model", None)
    if m is not None and all(hasattr(m, a) for a in ("heads", "ffn", "layers")):
        return m.heads, m.ffn, m.layers
    return tuple(_cfg_int(cfg, k) for k in ("num_heads", "ffn_hidden_size", "num_layers"))


# ---------------------------------------------------------------- collectives measured on this machine
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# 4 KiB .. 16 MiB. Larger messages are not linear here: on a 2-core Xeon a 32 MiB AllReduce took
# 3.7x the 16 MiB one (0.75 s against 0.20 s), so an alpha-beta line through them misleads; pass
# `sizes` to look at them.
DEFAULT_COLLECTIVE_SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)


def measure_collectives(ranks: int = 2, sizes: Sequence[int] | None = None,
                        ops: Sequence[str] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast"), *,
                        repeats: int = 7, warmup: int = 2, max_seconds_per_size: float = 4.0,
                        threads: int | None = None, timeout: float = 300, log_dir: Any = None) -> list[dict]:
    """Time collectives between `ranks` msrun processes on this machine; one row per (op, size).

    Launches `mshelpers/workers/collectives_bench.py` under msrun (`mshelpers.launch.msrun`).
    For every op and message size (default 4 KiB to 16 MiB, 7 sizes): `warmup` untimed calls,
    then `repeats` timed ones (fewer past `max_seconds_per_size`, at least 3), each
    synchronised with `.asnumpy()` and started together after a tiny barrier all-reduce.
    Rows: {op, bytes, seconds, ranks} where seconds is the slowest rank's median, plus api
    (the MindSpore call), repeats, rank_medians_s, min_s and max_s (over all ranks' calls).
    `bytes` is the full float32 buffer the op is about (all-reduced tensor, gathered output,
    reduce-scatter input, broadcast tensor), rounded to a multiple of 4·ranks. An op that fails
    on this backend keeps its rows, with seconds None and `error` quoting MindSpore (on CPU
    `ops.ReduceScatter` has no kernel). `threads` sets each rank's CPU kernel threads (default:
    the cores divided among the ranks; 0 keeps MindSpore's default). The default call takes
    about 40 s on 2 cores, 25 s of it msrun and MindSpore start-up. Ops run broadcast first and
    the rows come back in the order asked (see the worker for why).
    """
    fn = "measure_collectives"
    ranks = _pos(fn, "ranks", ranks)
    if ranks < 2:
        raise ValueError(f"{fn}: ranks={ranks} measures nothing; fix: use ranks >= 2")
    sizes = list(DEFAULT_COLLECTIVE_SIZES if sizes is None else sizes)
    if not sizes:
        raise ValueError(f"{fn}: sizes is empty; fix: pass message sizes in bytes, or None for the default")
    for b in sizes:
        _pos(fn, "sizes[i]", b)
    ops = [ops] if isinstance(ops, str) else list(ops)
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad or not ops:
        raise ValueError(f"{fn}: ops={ops!r} has unknown {bad}; fix: choose from {COLLECTIVES}")
    repeats = _pos(fn, "repeats", repeats)
    msrun = _sibling("launch", "msrun")                 # imported here: the planner above runs without MindSpore
    script_path = _sibling("workers", "script_path")
    run = msrun(script_path("collectives_bench"), workers=ranks, log_dir=log_dir, timeout=timeout,
                args=_collectives_bench_args(ranks, sizes, ops, repeats, warmup, max_seconds_per_size, threads))
    per_rank = [r["rows"] for r in run.results() if r]
    if len(per_rank) != ranks:
        raise RuntimeError(f"{fn}: {len(per_rank)} of {ranks} ranks wrote results; see the logs in {run.log_dir}")
    return _merge_rank_rows(per_rank)


def _collectives_bench_args(ranks: int, sizes: Sequence[int], ops: Sequence[str], repeats: int, warmup: int,
                            max_seconds_per_size: float, threads: int | None) -> list[str]:
    """The command line of workers/collectives_bench.py; threads None: the cores divided among the ranks."""
    if threads is None:
        import os
        threads = max(1, (os.cpu_count() or 1) // ranks)
    return ["--sizes", ",".join(str(int(b)) for b in sizes), "--ops", ",".join(ops), "--repeats", str(repeats),
            "--warmup", str(warmup), "--max-seconds-per-size", str(max_seconds_per_size),
            "--threads", str(int(threads))]


def _merge_rank_rows(per_rank: Sequence[Sequence[dict]]) -> list[dict]:
    """One row per (op, size) from every rank's rows (same order on every rank): the slowest rank's median."""
    ranks, rows = len(per_rank), []
    for i, r0 in enumerate(per_rank[0]):
        mine = [rr[i] for rr in per_rank]
        row = {"op": r0["op"], "bytes": int(r0["bytes"]), "seconds": None, "ranks": ranks, "api": r0.get("api")}
        errors = [m["error"] for m in mine if m.get("error")]
        if errors:
            row["error"] = errors[0]
        else:
            times = [t for m in mine for t in m["times_s"]]
            row.update(seconds=max(m["median_s"] for m in mine), repeats=min(len(m["times_s"]) for m in mine),
                       rank_medians_s=[m["median_s"] for m in mine], min_s=min(times), max_s=max(times))
        rows.append(row)
    return rows


@dataclass(frozen=True)
class AlphaBetaFit:
    """A least-squares fit of t(S) = alpha + S/beta to measured (bytes, seconds) of one collective.

    Unpacks as the pair `alpha_s, beta_bytes_per_s = fit` (iteration and indexing give those two
    numbers only); the rest says how good the fit is: `residuals` (one dict per size: bytes,
    measured_s, predicted_s, residual_s, ratio = predicted/measured), `rms_rel_error` and
    `max_ratio` (the worst of predicted/measured and measured/predicted, >= 1).
    """
    op: str
    alpha_s: float
    beta_bytes_per_s: float
    n_points: int
    ranks: int | None
    weighting: str
    residuals: tuple
    rms_rel_error: float
    max_ratio: float

    def __iter__(self):
        return iter((self.alpha_s, self.beta_bytes_per_s))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> float:
        return (self.alpha_s, self.beta_bytes_per_s)[i]

    def predict(self, nbytes: float) -> float:
        """Seconds the fitted model gives for a message of `nbytes`."""
        return self.alpha_s + nbytes / self.beta_bytes_per_s


def fit_alpha_beta(rows: Iterable[dict], op: str, *, weighting: str = "relative",
                   exclude_bytes: Iterable[int] = ()) -> AlphaBetaFit:
    """Fit the latency-bandwidth model t = alpha + bytes/beta to the rows of `op`; return an AlphaBetaFit.

    `alpha_s, beta_bytes_per_s = fit_alpha_beta(rows, op)` is the (alpha, beta) pair. Rows are
    `measure_collectives` rows (or any dicts with op, bytes, seconds); rows with an error, no
    time, or a size in `exclude_bytes` (to hold one out and predict it) are skipped.
    weighting="relative" (default) minimises the squared *relative* residuals, weights 1/t²,
    so the millisecond-scale small messages and the 0.1 s large ones count alike;
    "absolute" minimises squared seconds (then the largest messages dominate). If the
    unconstrained fit gives alpha < 0, alpha is pinned at 0 and beta refitted.

        >>> rows = [{"op": "all_reduce", "bytes": b, "seconds": 2e-3 + b / 1.5e8} for b in (1e4, 1e6, 1.6e7)]
        >>> f = fit_alpha_beta(rows, "all_reduce")
        >>> round(f.alpha_s, 6), round(f.beta_bytes_per_s / 1e6, 3), f.max_ratio < 1 + 1e-9
        (0.002, 150.0, True)
    """
    fn = "fit_alpha_beta"
    if weighting not in ("relative", "absolute"):
        raise ValueError(f"{fn}: weighting={weighting!r} is invalid; fix: use 'relative' or 'absolute'")
    rows = list(rows)
    skip = set(int(b) for b in exclude_bytes)
    pts = [(float(r["bytes"]), float(r["seconds"])) for r in rows
           if r.get("op") == op and not r.get("error") and r.get("seconds") and int(r["bytes"]) not in skip]
    pts = [(x, t) for x, t in pts if x > 0 and t > 0]
    if len({x for x, _ in pts}) < 2:
        errs = sorted({r["error"] for r in rows if r.get("op") == op and r.get("error")})
        why = f" (its rows carry errors: {errs[0]})" if errs else ""
        raise ValueError(f"{fn}: op={op!r} has {len(pts)} usable rows at {len({x for x, _ in pts})} distinct sizes"
                         f"{why}; fix: measure at least 2 sizes that ran, e.g. measure_collectives(ops=[{op!r}])")
    w = [1 / t ** 2 if weighting == "relative" else 1.0 for _, t in pts]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, pts))
    st = sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    sxt = sum(wi * x * t for wi, (x, t) in zip(w, pts))
    det = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / det
    alpha = (st - slope * sx) / sw
    if alpha < 0:                               # a negative latency is not physical: pin it at 0
        alpha, slope = 0.0, sxt / sxx
    if not slope > 0:
        raise ValueError(f"{fn}: op={op!r}: time does not grow with size over {sorted({x for x, _ in pts})} "
                         "(the fitted 1/beta is not positive); fix: measure sizes spanning at least 100x, "
                         "up to 16 MiB or more, with more repeats")
    beta = 1 / slope
    res, rel = [], []
    for x, t in sorted(pts):
        pred = alpha + x / beta
        res.append({"bytes": int(x), "measured_s": t, "predicted_s": pred, "residual_s": t - pred,
                    "ratio": pred / t})
        rel.append((t - pred) / t)
    ranks = next((r.get("ranks") for r in rows if r.get("op") == op and r.get("ranks")), None)
    return AlphaBetaFit(op=op, alpha_s=alpha, beta_bytes_per_s=beta, n_points=len(pts), ranks=ranks,
                        weighting=weighting, residuals=tuple(res),
                        rms_rel_error=math.sqrt(sum(e * e for e in rel) / len(rel)),
                        max_ratio=max(max(r["ratio"], 1 / r["ratio"]) for r in res))


def collective_time(op: str, nbytes: float, group_size: int, hardware: Hardware, *,
                    crosses_nodes: bool = False) -> float:
    """Seconds one collective of `nbytes` (the full buffer, as in measure_collectives) takes under `hardware`,
    on the links the doctor prices a group's collective on (`doctor.topology.ring_link`; no fitted factor).

    Per pass: latency + (n-1)/n·S / bandwidth; an all-reduce is 2 passes (reduce-scatter + all-gather), an
    all-gather or reduce-scatter 1, a broadcast sends S once. The group is n consecutive ranks of one node, or
    with `crosses_nodes` one rank on each of n nodes. tests/test_one_price.py holds this equal to the gradient
    reduction of the doctor's data-parallel step.

        >>> hw = Hardware(1e12, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e8, intra_node_latency_s=1e-4)
        >>> round(collective_time("all_reduce", 1e6, 2, hw), 6), round(collective_time("all_gather", 1e6, 4, hw), 6)
        (0.0012, 0.00085)
    """
    if op not in COLLECTIVES:
        raise ValueError(f"collective_time: op={op!r} is unknown; fix: use one of {COLLECTIVES}")
    group_size = _pos("collective_time", "group_size", group_size)
    if group_size == 1:
        return 0.0
    topology = _sibling("doctor.topology")
    dh = hardware.to_doctor()[0]
    node = dh.devices_per_node
    ranks = [k * node for k in range(group_size)] if crosses_nodes else list(range(group_size))
    bw, lat = topology.ring_link(dh, topology.span(ranks, node if crosses_nodes else max(node, group_size)))
    return _passes(op) * lat + _send_factor(op, group_size) * nbytes / bw


def _send_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of the op's buffer, for ring algorithms on n ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def _passes(op: str) -> int:
    """Ring passes of a collective, each paying the latency once (the doctor's reduce-scatter + all-gather)."""
    return 2 if op == "all_reduce" else 1


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


# ---------------------------------------------------------------- pipeline schedules: bubble, micro-batches in flight
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")
INTERLEAVED_ORDERS = ("standard", "memory")


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
    layers per stage × `mshelpers.memory.activation_bytes_per_layer(...)` (Korthikanti et al.
    2022; `stage_activation_bytes` computes it for a RunConfig and Layout). The first stage
    (stage=0) holds the most. `mshelpers.memory.estimate` assumes 1F1B's min(p, m).

        >>> pipeline_activation_bytes(100, 4, 8, "gpipe"), pipeline_activation_bytes(100, 4, 8, "1f1b")
        (800, 400)
        >>> pipeline_activation_bytes(100, 4, 8, "interleaved", 2)
        550
    """
    if not (isinstance(stage_bytes_per_micro_batch, numbers.Real) and stage_bytes_per_micro_batch >= 0):
        raise ValueError(f"pipeline_activation_bytes: stage_bytes_per_micro_batch={stage_bytes_per_micro_batch!r}; "
                         "fix: pass the bytes one micro-batch leaves on one stage (>= 0)")
    held = pipeline_in_flight(pp, micro_batches, schedule, virtual_stages, interleaved_order=interleaved_order)
    if not (isinstance(stage, int) and 0 <= stage < pp):
        raise ValueError(f"pipeline_activation_bytes: stage={stage!r}; fix: use 0 <= stage < pp={pp}")
    return math.ceil(held[stage] * stage_bytes_per_micro_batch)


def stage_activation_bytes(layout: Layout, schedule: str = "1f1b", virtual_stages: int = 1, *, stage: int = 0,
                           interleaved_order: str = "standard") -> dict:
    """A planned layout's activations on one pipeline stage under a schedule (first stage by default): one
    micro-batch's stored activations on that stage as the doctor counts them (`doctor.adapt.stage_activations`
    of `layout.config`: mindformers' LLaMA block per layer, each in its recompute mode) times the micro-batches
    `pipeline_in_flight` holds. Excludes the logits and the recompute working set. Keys: in_flight,
    layers_per_stage, per_layer_bytes (the stage's mean), micro_batch_bytes (one micro-batch on the stage), bytes.
    """
    fn = "stage_activation_bytes"
    dcfg = getattr(layout, "config", None)
    if dcfg is None:
        raise ValueError(f"{fn}: layout={type(layout).__name__} has no doctor config; fix: pass a Layout from "
                         "make_layout or plan_parallel_layout")
    virtual_stages = _pos(fn, "virtual_stages", virtual_stages)
    layers = dcfg.model.layers
    if layers % (layout.pp * virtual_stages):
        raise ValueError(f"{fn}: num_layers={layers} is not divisible by pp*virtual_stages = "
                         f"{layout.pp}*{virtual_stages}; fix: choose virtual_stages dividing {layers // layout.pp}")
    if not (isinstance(stage, int) and 0 <= stage < layout.pp):
        raise ValueError(f"{fn}: stage={stage!r} is invalid; fix: use 0 <= stage < pp={layout.pp}")
    act = _sibling("doctor.adapt").stage_activations(dcfg, stage)
    held = pipeline_in_flight(layout.pp, dcfg.layout.micro if layout.pp > 1 else 1, schedule, virtual_stages,
                              interleaved_order=interleaved_order)[stage]
    per_mb = act["per_micro_batch"]
    return {"in_flight": held, "layers_per_stage": act["layers"], "per_layer_bytes": per_mb / max(act["layers"], 1),
            "micro_batch_bytes": per_mb, "bytes": math.ceil(held * per_mb)}


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


# ---------------------------------------------------------------- mindformers / MindSpore config for a layout
def mindformers_parallel_config(layout: Layout, *, vocab_emb_dp: bool = True, use_seq_parallel: bool = False) -> dict:
    """The `parallel_config` section of a mindformers YAML (and TransformerOpParallelConfig's kwargs) for `layout`.

    mindformers splits a step into micro-batches two ways: `micro_batch_num` is the pipeline's count (used
    only when pipeline_stage > 1), and `runner_config.gradient_accumulation_steps` accumulates without a
    pipeline. So with pp = 1 the layout's micro-batches go to gradient accumulation (see
    `mindformers_yaml`) and micro_batch_num stays 1.

        >>> mindformers_parallel_config(Layout(4, 8, 1, 1, 16, 0, 0, 0.0))["model_parallel"]
        8
    """
    return {"data_parallel": layout.dp, "model_parallel": layout.mp, "pipeline_stage": layout.pp,
            "micro_batch_num": layout.micro_batches if layout.pp > 1 else 1, "vocab_emb_dp": vocab_emb_dp,
            "use_seq_parallel": use_seq_parallel, "gradient_aggregation_group": 4}


def mindformers_yaml(cfg: Any, layout: Layout, *, seq_len: int | None = None, zero_stage: int = 1,
                     max_device_memory_gb: int = 58, use_flash_attention: bool = True,
                     recompute: bool | None = None, select_recompute: bool | None = None,
                     sequence_parallel: bool = False, virtual_stages: int = 1) -> dict:
    """A complete mindformers training YAML (as a dict) for `layout`, in the shape of mindformers' published
    `configs/llama2/pretrain_llama2_7b.yaml`; `validate_mindformers_yaml` loads it with mindformers' classes.

    Batch bookkeeping (mindformers, full_batch=True): global batch = runner_config.batch_size × data_parallel
    × micro_batch_num × gradient_accumulation_steps, with batch_size = sequences per micro-batch per dp rank.
    With pp = 1 the layout's micro-batches become gradient_accumulation_steps; with pp > 1, micro_batch_num.
    zero_stage ≥ 1 turns on MindSpore's parallel optimizer (optimizer states sharded over dp), the
    assumption `plan_parallel_layout(..., zero_stage=1)` prices. `sequence_parallel` sets use_seq_parallel (with
    mp > 1); `virtual_stages` > 1 sets pp_interleave_num and parallel.pipeline_config.pipeline_interleave. The
    planner prices exactly this file (`make_layout` reads it with `doctor.read_config`).
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"mindformers_yaml: zero_stage={zero_stage!r} is invalid; fix: 0, 1, 2 or 3")
    seq = seq_len or _cfg_int(cfg, "seq_len")
    dtype = getattr(cfg, "compute_dtype", "bfloat16")
    rc = getattr(cfg, "recompute", "none")
    accum = layout.micro_batches if layout.pp == 1 else 1
    model_config = {
        "type": "LlamaConfig", "batch_size": layout.micro_batch_size, "seq_length": seq,
        "hidden_size": _cfg_int(cfg, "hidden_size"), "num_layers": _cfg_int(cfg, "num_layers"),
        "num_heads": _cfg_int(cfg, "num_heads"), "vocab_size": _cfg_int(cfg, "vocab_size"),
        "intermediate_size": _cfg_int(cfg, "ffn_hidden_size"), "rms_norm_eps": 1.0e-5,
        "compute_dtype": dtype, "layernorm_compute_type": "float32", "softmax_compute_type": "float32",
        "rotary_dtype": "float32", "param_init_type": "float32", "use_past": False,
        "use_flash_attention": use_flash_attention, "offset": 0}
    kv = getattr(cfg, "num_kv_heads", None)
    if kv and kv != model_config["num_heads"]:
        model_config["n_kv_heads"] = kv
    parallel = {"parallel_mode": 1, "gradients_mean": False, "full_batch": True,
                "search_mode": "sharding_propagation", "enable_parallel_optimizer": zero_stage >= 1,
                "strategy_ckpt_save_file": "./ckpt_strategy.ckpt",
                "parallel_optimizer_config": {"gradient_accumulation_shard": zero_stage >= 2,
                                              "parallel_optimizer_threshold": 64}}
    if virtual_stages > 1:
        model_config["pp_interleave_num"] = virtual_stages
        parallel["pipeline_config"] = {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}
    return {
        "seed": int(getattr(cfg, "seed", 0)), "output_dir": "./output", "run_mode": "train",
        "trainer": {"type": "CausalLanguageModelingTrainer", "model_name": "llama2"},
        "runner_config": {"epochs": 1, "batch_size": layout.micro_batch_size, "sink_mode": True, "sink_size": 1,
                          "gradient_accumulation_steps": accum},
        "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8,
                      "learning_rate": float(getattr(cfg, "lr", 3e-4))},
        "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": float(getattr(cfg, "lr", 3e-4)),
                        "lr_end": 0.0, "warmup_ratio": 0.03, "total_steps": -1},
        "train_dataset": {"data_loader": {"type": "MindDataset", "dataset_dir": "", "shuffle": True},
                          "input_columns": ["input_ids"], "drop_remainder": True,
                          "batch_size": layout.micro_batch_size, "repeat": 1, "num_parallel_workers": 8},
        "train_dataset_task": {"type": "CausalLanguageModelDataset"},
        "use_parallel": True,
        "parallel": parallel,
        "parallel_config": mindformers_parallel_config(layout, use_seq_parallel=sequence_parallel and layout.mp > 1),
        "micro_batch_interleave_num": 1,
        "recompute_config": {"recompute": (rc == "full") if recompute is None else recompute,
                             "select_recompute": (rc == "selective") if select_recompute is None else select_recompute,
                             "parallel_optimizer_comm_recompute": False, "mp_comm_recompute": True,
                             "recompute_slice_activation": True},
        "context": {"mode": 0, "device_target": "Ascend", "max_call_depth": 10000,
                    "max_device_memory": f"{max_device_memory_gb}GB", "device_id": 0},
        "model": {"model_config": model_config, "arch": {"type": "LlamaForCausalLM"}},
        "runner_wrapper": {"type": "MFTrainOneStepCell", "use_clip_grad": True},
        "callbacks": [{"type": "MFLossMonitor"}],
    }


def yaml_global_batch(spec: dict) -> int:
    """The global batch a mindformers YAML trains on: batch_size × dp × micro_batch_num (pp > 1 only) × accumulation."""
    pc, rc = spec["parallel_config"], spec["runner_config"]
    mbn = pc.get("micro_batch_num", 1) if pc.get("pipeline_stage", 1) > 1 else 1
    return rc["batch_size"] * pc["data_parallel"] * mbn * rc.get("gradient_accumulation_steps", 1) \
        * spec.get("micro_batch_interleave_num", 1)


def validate_mindformers_yaml(spec: dict, path: Any = None) -> dict:
    """Load `spec` with mindformers' own classes and check it; return what they built.

    Writes the YAML to `path` (a temporary file if None), loads it with
    `mindformers.tools.register.MindFormerConfig`, builds `TransformerOpParallelConfig` from its
    parallel_config, `TransformerRecomputeConfig` from recompute_config and `LlamaConfig` from
    model.model_config (with that parallel config), and checks that the keys this function relies on
    survived the round trip. mindformers' own errors propagate.
    """
    import tempfile
    from pathlib import Path

    import yaml

    import mindspore  # noqa: F401  (mindformers expects it imported first)
    from mindformers.models.llama import LlamaConfig
    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig
    from mindformers.tools.register import MindFormerConfig
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="mf_yaml_")) / "train.yaml"
    path = Path(path)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    import logging
    quiet = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("mindformers")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:      # its templates log a WARNING per optional section left empty (moe_config, swap_config, ...)
        lg.setLevel(logging.ERROR)
    try:
        mf = MindFormerConfig(str(path))
    finally:
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
    import inspect
    for klass, sect in ((TransformerOpParallelConfig, "parallel_config"), (TransformerRecomputeConfig, "recompute_config")):
        known = inspect.signature(klass).parameters
        unknown = [k for k in mf[sect] if k not in known]
        if unknown:     # these classes swallow unknown keywords silently; a typo would be lost
            raise ValueError(f"validate_mindformers_yaml: {klass.__name__} takes no {unknown} ({sect})")
    pc = TransformerOpParallelConfig(**mf.parallel_config)
    rcfg = TransformerRecomputeConfig(**mf.recompute_config)
    mc = {k: v for k, v in mf.model.model_config.items() if k != "type"}
    llama = LlamaConfig(**mc, parallel_config=pc)
    for key in ("runner_config", "parallel", "parallel_config", "context", "model", "optimizer", "train_dataset"):
        if key not in mf:
            raise ValueError(f"validate_mindformers_yaml: MindFormerConfig lost section {key!r}")
    if mf.model.arch.type != "LlamaForCausalLM":
        raise ValueError(f"validate_mindformers_yaml: arch {mf.model.arch.type!r} is not LlamaForCausalLM")
    from mindformers.tools.register import MindFormerModuleType as T, MindFormerRegister
    for mt, sect in ((T.TRAINER, mf.trainer), (T.OPTIMIZER, mf.optimizer), (T.LR, mf.lr_schedule),
                     (T.DATASET, mf.train_dataset_task), (T.DATASET_LOADER, mf.train_dataset.data_loader),
                     (T.WRAPPER, mf.runner_wrapper), (T.MODELS, mf.model.arch), (T.CONFIG, mf.model.model_config)):
        if not MindFormerRegister.is_exist(mt, sect.type):
            raise ValueError(f"validate_mindformers_yaml: {sect.type!r} is not a registered mindformers {mt}")
    for mt, sect in ((T.OPTIMIZER, mf.optimizer), (T.LR, mf.lr_schedule)):
        sig = inspect.signature(MindFormerRegister.get_cls(mt, sect.type))
        unknown = [k for k in sect if k != "type" and k not in sig.parameters]
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            raise ValueError(f"validate_mindformers_yaml: {sect.type} takes no {unknown}")
    return {"path": path, "config": mf, "parallel_config": pc, "recompute_config": rcfg, "llama_config": llama,
            "global_batch": yaml_global_batch(spec)}


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


def auto_parallel_context(layout: Layout, zero_stage: int = 1) -> dict:
    """Keyword arguments for the legacy `mindspore.set_auto_parallel_context` under semi_auto_parallel.

    MindSpore 2.9's docstring says this function will be removed; `auto_parallel_plan` gives the same
    settings for `mindspore.parallel.auto_parallel.AutoParallel`, the primary form. `gradients_mean` is
    False, as in `mindformers_yaml`'s `parallel` section and mindformers' published llama2 configs
    (full_batch=True: the loss is already the global batch's mean, so the gradient all-reduce sums).
    """
    ctx = {"parallel_mode": "semi_auto_parallel", "device_num": layout.n_devices, "gradients_mean": False,
           "full_batch": True, "enable_parallel_optimizer": zero_stage >= 1}
    if zero_stage >= 1:
        ctx["parallel_optimizer_config"] = {"optimizer_level": f"level{zero_stage}"}
    if layout.pp > 1:
        ctx["pipeline_stages"] = layout.pp
    return ctx


def auto_parallel_plan(layout: Layout, zero_stage: int = 1) -> dict:
    """How to build `layout` with `mindspore.parallel.auto_parallel.AutoParallel` (MindSpore ≥ 2.5):
    the micro-batch wrapper (`mindspore.parallel.nn.Pipeline` for pp > 1, `GradAccumulation` for pp = 1
    with m > 1), AutoParallel's mode, and the keyword arguments of its `pipeline(...)` and `hsdp(...)`
    calls (hsdp = the parallel optimizer: optimizer_level "level1" shards optimizer states = ZeRO-1)."""
    m = layout.micro_batches
    wrapper = "Pipeline" if layout.pp > 1 else ("GradAccumulation" if m > 1 else None)
    return {"wrapper": wrapper, "micro_size": m, "parallel_mode": "semi_auto",
            "pipeline": {"stages": layout.pp, "scheduler": "1f1b"} if layout.pp > 1 else None,
            "hsdp": {"shard_size": -1, "threshold": 64, "optimizer_level": f"level{zero_stage}"}
            if zero_stage >= 1 else None}


# ---------------------------------------------------------------- internals
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pos(fn: str, name: str, v: Any) -> int:
    """A positive count from an int, a numpy integer or an integral float (4.0); else one ValueError."""
    import numbers
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) \
            and float(v).is_integer() and int(v) > 0:
        return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer"
                     + (" (a count has no fraction)" if isinstance(v, float) and math.isfinite(v) else ""))


def _cfg_int(cfg: Any, name: str) -> int:
    v = getattr(cfg, name, None)
    import numbers
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0:
        return int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"cfg.{name}={v!r} is invalid; fix: pass a RunConfig (RunConfig.preset(...)) "
                         "with a positive integer there")
    return v
