"""Device and link profiles for the planner, each figure with its source; the doctor prices every one of them.

`Hardware` is the planner's view of a doctor profile (`mshelpers.doctor.profiles`): a peak, the links inside and
between nodes, their latencies, and where each figure comes from. `REFERENCE_HARDWARE` holds cited profiles
(NVIDIA datasheets, and the doctor's Atlas 800T A2 as "ascend-910b"); `Hardware.from_measurement` makes one of
this machine from measured collectives (`mshelpers.collectives`); `to_doctor()` gives the doctor's
`DoctorHardware` and `Calibration` that `mshelpers.parallel.estimate_step_time` and
`mshelpers.collectives.collective_time` price with.

Example:
    >>> from mshelpers.hardware import Hardware, REFERENCE_HARDWARE
    >>> a100 = Hardware.reference("a100-sxm")
    >>> a100.intra_node_bytes_per_s / 1e9, a100.source("devices_per_node"), "ascend-910b" in REFERENCE_HARDWARE
    (300.0, 'DGX/HGX A100: 8 GPUs', True)

Copied alone it needs the standard library; `to_doctor` and the "ascend-910b" profile need the `doctor/` folder
beside it, `from_measurement` needs `collectives.py`.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from typing import Any


# ---------------------------------------------------------------- a profile and the source of each figure
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

    Taught in notebooks/05_semi_auto_parallel.ipynb (and measured in 04_data_parallel.ipynb).
    """
    peak_flops_per_device: float          # FLOP/s at `peak_dtype` (a doctor profile keeps its other dtypes' ratios)
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
    peak_dtype: str = "bfloat16"          # the dtype `peak_flops_per_device` is the peak of (the models here train in it)

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
        """A cited profile from REFERENCE_HARDWARE ("ascend-910b", "a100-sxm", "h100-sxm").
        Taught in notebooks/05_semi_auto_parallel.ipynb."""
        if name not in REFERENCE_HARDWARE:
            raise ValueError(f"Hardware.reference: name={name!r} is unknown; fix: use one of "
                             f"{sorted(REFERENCE_HARDWARE)}")
        return REFERENCE_HARDWARE[name]

    @classmethod
    def from_doctor(cls, profile: Any, calibration: Any = None, *, name: str | None = None,
                    dtype: str = "bfloat16") -> "Hardware":
        """The planner's view of a doctor profile (`doctor.hardware(name)`), priced with `calibration` (a doctor
        Calibration, e.g. doctor.CALIBRATION; None: compute_efficiency 1, no other constant). The view's
        `peak_flops_per_device` is the profile's `dtype` peak (bfloat16: the 910B's 353.9 TFLOPS, not float16's 376);
        the doctor prices each model at its own dtype's peak from the same profile either way.
        Taught in notebooks/05_semi_auto_parallel.ipynb (its "ascend-910b" profile is one)."""
        src = getattr(profile, "sources", {}) or {}
        node = src.get("node", "assumed")
        return cls(peak_flops_per_device=profile.peak(dtype), peak_dtype=dtype,
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
        gives back its profile, with any figure changed since (`dataclasses.replace`) changed in it too.
        Taught in notebooks/05_semi_auto_parallel.ipynb."""
        if __package__:
            from . import doctor as D
        else:  # copied beside its siblings as plain files
            import doctor as D
        mine = self._doctor_fields()
        if self.doctor_profile is not None:
            was = Hardware.from_doctor(self.doctor_profile, self.calibration, dtype=self.peak_dtype)._doctor_fields()
            changed = {k: v for k, v in mine.items() if v != was[k]}
            if "peak_flops" in changed:            # the other dtypes keep their ratio to the view's dtype's peak
                scale = self.peak_flops_per_device / self.doctor_profile.peak(self.peak_dtype)
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

        Taught in notebooks/04_data_parallel.ipynb and 05_semi_auto_parallel.ipynb.
        """
        if __package__:                           # the fit, and the bytes and passes of each collective
            from . import collectives as C
        else:  # copied beside its siblings as plain files
            import collectives as C
        fit = rows_or_fit if isinstance(rows_or_fit, C.AlphaBetaFit) else C.fit_alpha_beta(rows_or_fit, op)
        n = group_size or fit.ranks
        if not n or n < 2:
            raise ValueError(f"Hardware.from_measurement: group_size={n!r}; fix: pass group_size (the ranks measured)")
        if not (isinstance(peak_flops_per_device, numbers.Real) and not isinstance(peak_flops_per_device, bool)
                and peak_flops_per_device > 0):
            raise ValueError(f"Hardware.from_measurement: peak_flops_per_device={peak_flops_per_device!r}; "
                             "fix: pass a measured FLOP/s, e.g. mshelpers.peak.peak_flops()")
        bus = fit.beta_bytes_per_s * C._send_factor(fit.op, n)
        lat = fit.alpha_s / C._passes(fit.op)
        how = (f"measured: {fit.op} on {n} ranks, alpha-beta fit over {fit.n_points} sizes "
               f"(max pred/meas ratio {fit.max_ratio:.2f}); beta x {C._send_factor(fit.op, n):.3g} bytes sent per "
               f"byte, alpha / {C._passes(fit.op)} per pass")
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


# ---------------------------------------------------------------- cited reference profiles
# Bandwidths are per device and per direction (see Hardware); a vendor's
# "900 GB/s NVLink" is the bidirectional total, so it enters as 450e9. Peaks are dense 16-bit tensor
# FLOP/s (vendors also print 2x "with sparsity" figures). These are datasheet (theoretical) figures:
# NCCL-tests bus bandwidths reach roughly 70-90 % of them, and latencies are left at 0 because the
# datasheets give none. The Ascend profile is the doctor's (mshelpers/doctor/profiles.py), made on first use.
_A100_DS = "NVIDIA A100 datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100_DS = "NVIDIA H100 datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"


def _nvidia(name: str) -> Hardware:
    """The NVIDIA profile `name`, its peak the bfloat16 figure of peak.DATASHEET_PEAK_FLOPS (the one datasheet
    table: each figure typed once, there)."""
    if __package__:
        from .peak import DATASHEET_PEAK_FLOPS
    else:  # copied beside its siblings as plain files
        from peak import DATASHEET_PEAK_FLOPS
    if name == "a100-sxm":
        bf16 = DATASHEET_PEAK_FLOPS["NVIDIA A100 SXM"]["bfloat16"]
        return Hardware(
            peak_flops_per_device=bf16, intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9,
            devices_per_node=8, compute_efficiency=0.5, name="NVIDIA A100 SXM4 80GB (DGX A100: NVLink 3 + HDR InfiniBand)",
            hbm_bytes_per_s=2039e9, memory_bytes=80e9,
            sources=(("peak_flops_per_device", f"datasheet: BF16 Tensor Core {bf16 / 1e12:g} TFLOPS dense "
                      f"({2 * bf16 / 1e12:g} with sparsity); " + _A100_DS),
                     ("intra_node_bytes_per_s", "datasheet: NVLink 600 GB/s bidirectional = 300 GB/s per direction "
                                                "(12 links x 50 GB/s, through NVSwitch: links_per_device 1); " + _A100_DS),
                     ("inter_node_bytes_per_s", "datasheet: DGX A100 has one 200 Gb/s HDR InfiniBand ConnectX-6 port per "
                                                "GPU = 25 GB/s; NVIDIA DGX A100 datasheet, https://www.nvidia.com/content/"
                                                "dam/en-zz/Solutions/Data-Center/nvidia-dgx-a100-datasheet.pdf (not "
                                                "re-checked here)"),
                     ("devices_per_node", "DGX/HGX A100: 8 GPUs"),
                     ("hbm_bytes_per_s", "datasheet: A100 80GB SXM HBM2e 2,039 GB/s; " + _A100_DS),
                     ("memory_bytes", "datasheet: 80 GB HBM2e; " + _A100_DS),
                     ("compute_efficiency", "assumed")))
    bf16 = DATASHEET_PEAK_FLOPS["NVIDIA H100 SXM"]["bfloat16"]
    return Hardware(
        peak_flops_per_device=bf16, intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
        devices_per_node=8, compute_efficiency=0.5, name="NVIDIA H100 SXM5 (DGX H100: NVLink 4 + NDR InfiniBand)",
        hbm_bytes_per_s=3.35e12, memory_bytes=80e9,
        sources=(("peak_flops_per_device", "datasheet: BF16 Tensor Core 1,979 TFLOPS with 2:4 sparsity, "
                  f"{bf16 / 1e12:g} dense (peak.DATASHEET_PEAK_FLOPS); " + _H100_DS),
                 ("intra_node_bytes_per_s", "datasheet: NVLink 900 GB/s bidirectional = 450 GB/s per direction "
                                            "(18 links x 50 GB/s, through NVSwitch: links_per_device 1); " + _H100_DS),
                 ("inter_node_bytes_per_s", "DGX H100 user guide: one ConnectX-7 per GPU (8 OSFP ports), 400 Gb/s NDR "
                                            "= 50 GB/s; https://docs.nvidia.com/dgx/dgxh100-user-guide/"),
                 ("devices_per_node", "DGX/HGX H100: 8 GPUs"),
                 ("hbm_bytes_per_s", "datasheet: H100 SXM HBM3 3.35 TB/s; " + _H100_DS),
                 ("memory_bytes", "datasheet: 80 GB HBM3; " + _H100_DS),
                 ("compute_efficiency", "assumed")))


_PROFILE_NAMES = ("a100-sxm", "h100-sxm", "ascend-910b")


class _Profiles(dict):
    """REFERENCE_HARDWARE: "a100-sxm" and "h100-sxm" (the NVIDIA profiles above, their peaks read from
    peak.DATASHEET_PEAK_FLOPS) and "ascend-910b", the doctor's "atlas-800t-a2" profile with the doctor's fitted
    calibration; each made on first use (so this module imports without peak.py or the doctor folder)."""

    def __missing__(self, name: str) -> Hardware:
        if name not in _PROFILE_NAMES:
            raise KeyError(name)
        if name != "ascend-910b":
            hw = _nvidia(name)
        else:
            if __package__:
                from . import doctor as D
            else:  # copied beside its siblings as plain files
                import doctor as D
            hw = Hardware.from_doctor(D.hardware("atlas-800t-a2"), D.CALIBRATION,
                                      name="Huawei Ascend 910B (Atlas 800T A2, 376T bin: HCCS full mesh + RoCE)")
        self[name] = hw
        return hw

    def __contains__(self, name: object) -> bool:
        return name in _PROFILE_NAMES

    def __iter__(self):
        return iter(_PROFILE_NAMES)

    def keys(self):
        return list(_PROFILE_NAMES)

    def values(self):
        return [self[n] for n in _PROFILE_NAMES]

    def items(self):
        return [(n, self[n]) for n in _PROFILE_NAMES]

    def __len__(self) -> int:
        return len(_PROFILE_NAMES)


REFERENCE_HARDWARE: dict[str, Hardware] = _Profiles()
