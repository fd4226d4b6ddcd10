"""Hardware profiles: devices and links, each figure with its source (the one Ascend datasheet table the
cookbook's notebooks read), and "cpu", this machine's theoretical peak."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .describe import DoctorError

_MSMODELING = ("Huawei Ascend/msmodeling, tensor_cast/device.py (commit 1e5a50b1), "
               "https://github.com/Ascend/msmodeling/blob/1e5a50b1a025a6658a277aa963c87691dc279f4f/tensor_cast/device.py")
# The Ascend 910B's datasheet peak, the one place it is typed: the Atlas A2 profiles below are built from it and
# peak.DATASHEET_PEAK_FLOPS["Ascend 910B"] is this row (peak.py reads it from here: this folder imports without
# peak.py beside it, so the figure cannot live there).
ASCEND_910B_PEAK: dict = {"float16": 376e12, "bfloat16": 353.9e12,
                          "source": "Huawei Ascend/msmodeling device profile ATLAS_800_A2_376T_64G (tensor_cast/"
                                    "device.py, commit 1e5a50b1; mindformers publishes no constant). The same file "
                                    "lists 313T and 280T bins of the card: check your SKU, and measure with "
                                    "peak_flops() on the NPU"}
_FP16, _BF16 = (f"{ASCEND_910B_PEAK[k] / 1e12:g}e12" for k in ("float16", "bfloat16"))
_A2_SOURCES = {
    "peak": f"ATLAS_800_A2_376T_64G mma_ops: float16 {_FP16}, bfloat16 {_BF16} FLOP/s; {_MSMODELING}. "
            "The 313T and 280T bins of the same profile list give MFU x 376/313 or x 376/280. Consistency check: "
            "MindSpore's performance guide quotes 53% MFU for Llama 2 7B at 4820 tokens/s/p, and "
            f"6N x 4820 / {_FP16} = 52%",
    "hbm": f"memory_bandwidth_bytes_ps 1.6 TiB/s, memory_efficiency 0.6 (msmodeling: 'need to calibrate'); {_MSMODELING}",
    "intra": f"A2_INTERCONNECT full mesh 196e9 B/s per device, latency 0.5 us; {_MSMODELING}. Read as the "
             "per-device bandwidth of a collective over any group inside the node (stored as 7 links of 28e9 B/s); "
             "the n-1-links reading fits the published figures worse (topology._intra_bw)",
    "inter": f"A2_INTERCONNECT CLOS 25e9 B/s per device (200GE RoCE), latency 1.5 us; {_MSMODELING}",
    "node": "8 NPUs per Atlas 800T A2 node (MindCluster docs, https://www.hiascend.com/document/detail/zh/"
            "mindcluster/730/deployer/deployerug/deployer_0025.html)",
}


@dataclass(frozen=True)
class DoctorHardware:
    """One device type and its links, each figure with its source (see `hardware`).
    Taught in: no notebook; doctor/__init__.py, doctor/calibration.py, doctor/cpu_check.py call it."""
    name: str
    peak_flops: dict                     # compute dtype -> FLOP/s (datasheet/theoretical, not achieved)
    hbm_bytes_per_s: float
    intra_link_bytes_per_s: float        # one link of the node's full mesh, per direction
    links_per_device: int                # full-mesh links per device (n-1 of them used by an n-rank group)
    inter_bytes_per_s: float             # per device, between nodes
    devices_per_node: int
    intra_latency_s: float
    inter_latency_s: float
    memory_bytes: float                  # device memory (the budget when the YAML gives none)
    dp_overlap: float = 1.0              # share of the last backward the DP reduction can hide behind (CPU: 0)
    device_pool: bool = True             # MindSpore's device memory pool and HCCL (report.memory_reserve); CPU: no
    sources: dict = field(default_factory=dict, compare=False)

    def peak(self, dtype: str) -> float:
        return self.peak_flops.get(dtype) or self.peak_flops["float16"]


_A2 = dict(peak_flops={"float16": ASCEND_910B_PEAK["float16"], "bfloat16": ASCEND_910B_PEAK["bfloat16"],
                       "float32": 99.5e12},
           hbm_bytes_per_s=0.6 * 1.6 * 2**40, intra_link_bytes_per_s=196e9 / 7, links_per_device=7,
           inter_bytes_per_s=25e9, devices_per_node=8, intra_latency_s=0.5e-6, inter_latency_s=1.5e-6,
           memory_bytes=64 * 2**30)
HARDWARE: dict[str, DoctorHardware] = {
    "atlas-800t-a2": DoctorHardware(name="Atlas 800T A2 (8x Ascend 910B, 376T bin)", sources=_A2_SOURCES, **_A2),
    # Same NPU and node (msmodeling has one A2 interconnect); mindformers publishes its PoDc figures apart
    # (7B: 4100 against 4820 tokens/s/p at r1.1.0), and calibration_table reports the error on them as they are.
    "atlas-900-a2-podc": DoctorHardware(name="Atlas 900 A2 PoDc (Atlas A2 NPUs in a pod, 376T bin)",
                                        sources=dict(_A2_SOURCES, node="8 NPUs per node, as the Atlas 800T A2 "
                                                     "(assumed: same A2 node and interconnect profile)"), **_A2),
}
HARDWARE_NAMES = ("atlas-800t-a2", "atlas-900-a2-podc", "cpu")


def hardware(name: str = "atlas-800t-a2") -> DoctorHardware:
    """The named profile. "cpu" is this machine: theoretical peak = peak.cpu_peak_flops over os.cpu_count() cores
    at the max clock (peak.max_clock_mhz): FLOP/cycle = fp32 lanes per FMA unit (peak.fp32_fma_lanes) x 2 for FMA
    x 2 FMA units, the formula and clock of peak.hardware_peak_flops; memory = MemTotal;
    its links are not modelled (one node).
    Taught in notebooks/04_data_parallel.ipynb."""
    if name in HARDWARE:
        return HARDWARE[name]
    if name != "cpu":
        raise DoctorError("--hardware", name, f"use one of {', '.join(HARDWARE_NAMES)}")
    if "." in __package__:
        from ..peak import cpu_info, cpu_peak_flops, max_clock_mhz
    else:  # the doctor/ folder copied beside its siblings as plain files
        from peak import cpu_info, cpu_peak_flops, max_clock_mhz
    mhz, where = max_clock_mhz()
    info = cpu_info()
    cores = os.cpu_count() or 1
    if not mhz:
        raise DoctorError("--hardware", name, "this machine reports no clock; pass an Ascend profile")
    peak, lanes, isa, per_cycle = cpu_peak_flops(cores, mhz, info)     # lanes: 8 on Zen 4 (256-bit AVX-512 units)
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        mem = 8 * 2**30
    src = (f"theoretical: {cores} cores x {mhz / 1e3:.2f} GHz ({where}) x {per_cycle} FLOP/cycle "
           f"({isa}: {lanes} fp32 lanes x 2 (FMA) x 2 FMA units); {info.get('cpu_model')}")
    return DoctorHardware(name=f"this machine ({info.get('cpu_model')})", peak_flops={"float32": peak,
                          "float16": peak, "bfloat16": peak}, hbm_bytes_per_s=20e9, intra_link_bytes_per_s=1e9,
                          links_per_device=1, inter_bytes_per_s=1e9, devices_per_node=cores,
                          intra_latency_s=1e-3, inter_latency_s=1e-3, memory_bytes=mem, device_pool=False,
                          sources={"peak": src, "hbm": "assumed 20 GB/s (not measured)",
                                   "intra": "assumed (not measured; see parallel.measure_collectives)",
                                   "inter": "one machine", "node": "one machine"})


