"""The peak FLOP/s an MFU divides by: the hardware's peak (clock probe, FMA lanes, datasheets) and the measured
MatMul peak (compiled MatMul chains, a load check, and a cache per machine).

Example:
    >>> from mshelpers.peak import fp32_fma_lanes
    >>> fp32_fma_lanes({"flags": {"avx512f", "fma"}, "vendor": "GenuineIntel", "cpu_family": "6"})
    (16, 'AVX-512')
    >>> fp32_fma_lanes({"flags": {"avx512f"}, "vendor": "AuthenticAMD", "cpu_family": "25"})
    (8, 'AVX-512 on 256-bit units (Zen 4)')

MFU (PaLM appendix B) divides by `hardware_peak_flops()`: the theoretical peak on a CPU (cores x the maximum
clock x FLOP per cycle), the datasheet on an accelerator, so figures compare with published ones. `peak_flops()`
measures what this machine's kernels actually reach, once per machine, and caches it; `metrics.share_of_achievable`
divides by it. A hard-coded A100 figure on other hardware is how MFU above 100% gets reported.
The module imports MindSpore only to measure (`peak_flops` without a usable cache entry).
"""
from __future__ import annotations

import math
import os
import time
import warnings
from pathlib import Path
from typing import Any

# --- datasheet peaks (accelerators) ---
# ------------------------------------------------------------------ the MFU denominator
# Datasheet peaks for dense matrix math (no sparsity), FLOP/s per device. Each entry cites its source. This is the
# cookbook's one datasheet table: hardware.REFERENCE_HARDWARE's NVIDIA profiles read their peaks from it. The
# Ascend 910B row is the doctor's (doctor/profiles.py ASCEND_910B_PEAK, which its Atlas A2 profiles are built
# from when the doctor/ folder is imported, with or without this file beside it), read from there on first use.
_DATASHEET_ROWS: dict[str, dict[str, Any] | None] = {
    "Ascend 910A": {"float16": 256e12, "bfloat16": None,
                    "source": "Huawei, 'DaVinci: A Scalable Architecture for Neural Network Computing', "
                              "Hot Chips 31 (2019): Ascend 910, 32 DaVinci cores, 256 TFLOPS FP16 (no bf16 in "
                              "the 910A's cube unit)"},
    "Ascend 910B": None,               # the doctor's ASCEND_910B_PEAK (376e12 float16, 353.9e12 bfloat16)
    "NVIDIA A100 SXM": {"float16": 312e12, "bfloat16": 312e12, "float32": 19.5e12, "tf32": 156e12,
                        "source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-"
                                  "1758950-r4-web.pdf), dense figures"},
    "NVIDIA H100 SXM": {"float16": 989.4e12, "bfloat16": 989.4e12, "float32": 67e12, "tf32": 494.7e12,
                        "source": "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5; the datasheet's "
                                  "1,979 TFLOPS bf16 is with 2:4 sparsity, half of it is dense"},
}


def _ascend_910b_row() -> dict[str, Any]:
    """The doctor's 910B datasheet row (doctor/profiles.py ASCEND_910B_PEAK): the doctor's folder imports without
    this file, so the figure lives there and this table reads it."""
    if __package__:
        from .doctor.profiles import ASCEND_910B_PEAK
    else:  # copied beside its siblings as plain files (the doctor/ folder beside this one)
        from doctor.profiles import ASCEND_910B_PEAK
    return ASCEND_910B_PEAK


class _Datasheets(dict):
    """DATASHEET_PEAK_FLOPS: a dict of the rows above, in their order, the 910B's read from the doctor on first
    use (so this module imports without the doctor/ folder; only that row needs it)."""

    def _fill(self) -> None:
        if dict.__len__(self) < len(_DATASHEET_ROWS):
            rows = {k: (v if v is not None else _ascend_910b_row()) for k, v in _DATASHEET_ROWS.items()}
            dict.clear(self)
            dict.update(self, rows)

    def __missing__(self, name: str) -> dict[str, Any]:
        if name not in _DATASHEET_ROWS:
            raise KeyError(name)
        self._fill()
        return dict.__getitem__(self, name)

    def __contains__(self, name: object) -> bool:
        return name in _DATASHEET_ROWS

    def __iter__(self):
        return iter(_DATASHEET_ROWS)

    def __len__(self) -> int:
        return len(_DATASHEET_ROWS)

    def keys(self):
        return _DATASHEET_ROWS.keys()

    def values(self):
        self._fill()
        return dict.values(self)

    def items(self):
        self._fill()
        return dict.items(self)

    def get(self, name, default=None):
        return self[name] if name in self else default

    def copy(self) -> dict[str, dict[str, Any]]:
        self._fill()
        return dict(dict.items(self))

    def __repr__(self) -> str:
        self._fill()
        return dict.__repr__(self)

    def __eq__(self, other: object) -> bool:
        self._fill()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]


DATASHEET_PEAK_FLOPS: dict[str, dict[str, Any]] = _Datasheets(
    {k: v for k, v in _DATASHEET_ROWS.items() if v is not None})


# --- what the CPU says about itself ---


def cpu_info() -> dict[str, Any]:
    """What this machine says about itself: CPU model, family, usable threads, vector flags.

    Taught in notebooks/00_environment.ipynb.
    """
    info: dict[str, Any] = {"cpu_model": platform_processor(), "cpu_family": None, "threads": _threads(),
                            "flags": set(), "mhz": None, "vendor": None}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "model name" and "cpu_model_seen" not in info:
                    info["cpu_model"], info["cpu_model_seen"] = val, True
                elif key == "vendor_id" and info["vendor"] is None:
                    info["vendor"] = val
                elif key == "cpu family" and info["cpu_family"] is None:
                    info["cpu_family"] = val
                elif key == "cpu MHz" and info["mhz"] is None:
                    info["mhz"] = float(val)
                elif key == "flags" and not info["flags"]:
                    info["flags"] = set(val.split())
    except OSError:
        pass
    info.pop("cpu_model_seen", None)
    return info


def platform_processor() -> str:
    """The processor's name as the platform module gives it, else "unknown". No notebook: cpu_info's fallback."""
    import platform
    return platform.processor() or platform.machine() or "unknown"


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def fp32_fma_lanes(info: dict[str, Any]) -> tuple[int, str]:
    """fp32 lanes one FMA unit of this CPU computes per cycle, and the name of its vector ISA: 16 with AVX-512, 8
    with AVX2+FMA, 4 with SSE. AMD Zen 4 (vendor AuthenticAMD, family 25, with AVX-512) runs AVX-512 on 256-bit
    units, two cycles per 512-bit FMA (AMD's Zen 4 software optimisation guide, 57647), so 8 there.

    Taught in notebooks/00_environment.ipynb.
    """
    flags = info.get("flags") or set()
    if "avx512f" in flags:
        if info.get("vendor") == "AuthenticAMD" and str(info.get("cpu_family")) == "25":
            return 8, "AVX-512 on 256-bit units (Zen 4)"
        return 16, "AVX-512"
    return (8, "AVX2+FMA") if "fma" in flags else (4, "SSE")


def cpu_peak_flops(cores: int, mhz: float, info: dict[str, Any], fma_units: int = 2) -> tuple[float, int, str, int]:
    """The CPU's float32 peak, the one formula every CPU peak here uses: cores x clock x FLOP/cycle, with
    FLOP/cycle = fp32 lanes per FMA unit (`fp32_fma_lanes(info)`) x 2 (an FMA is a multiply and an add) x
    `fma_units`. Returns (FLOP/s, lanes, vector ISA, FLOP/cycle); `mhz` is the caller's clock (nominal in
    `theoretical_peak_flops`, the maximum in `hardware_peak_flops` and the doctor's "cpu" profile).

    Example:
        >>> cpu_peak_flops(2, 1000.0, {"flags": {"fma"}})
        (64000000000.0, 8, 'AVX2+FMA', 32)

    No notebook: the formula behind hardware_peak_flops (taught in notebooks/00_environment.ipynb).
    """
    lanes, isa = fp32_fma_lanes(info)
    per_cycle = lanes * 2 * fma_units
    return cores * mhz * 1e6 * per_cycle, lanes, isa, per_cycle


def theoretical_peak_flops(verbose: bool = True, fma_units: int = 2) -> float:
    """cores x clock x FLOP/cycle for float32, from what the CPU reports; prints its assumptions.

    FLOP/cycle = fp32 lanes per FMA unit (`fp32_fma_lanes`: 16 with AVX-512, 8 with AVX2 and on Zen 4's 256-bit
    units, 4 with SSE) x 2 (an FMA is a multiply and an add) x `fma_units` (2 on server Xeons and on Zen 4/5;
    some client parts have 1). The clock is the nominal one /proc/cpuinfo shows: turbo can beat it, thermal
    limits and AVX-512 down-clocking fall short (`hardware_peak_flops` uses the maximum clock instead).

    Taught in notebooks/00_environment.ipynb (as hardware_peak_flops' formula).
    """
    info = cpu_info()
    mhz = info["mhz"]
    if not mhz:
        raise ValueError("theoretical_peak_flops: no clock in /proc/cpuinfo; fix: use peak_flops() (measured) "
                         "or a DATASHEET_PEAK_FLOPS entry")
    value, lanes, isa, per_cycle = cpu_peak_flops(info["threads"], mhz, info, fma_units)
    if verbose:
        print(f"theoretical fp32 peak = {info['threads']} cores x {mhz / 1e3:.2f} GHz x {per_cycle} FLOP/cycle "
              f"({isa}: {lanes} lanes x 2 for FMA x {fma_units} FMA units) = {value / 1e9:.0f} GFLOP/s\n"
              f"  assumes: each logical CPU is a full core (no SMT sharing), the nominal clock holds under "
              f"{isa}, {fma_units} FMA units per core")
    return value


# --- the clock ---
# A chain of dependent register adds: each waits for the one before, and an integer add takes one cycle on every
# x86-64 and AArch64 core, so adds per second is the clock the core runs at. Ten per loop iteration hide the loop's
# own counter, which runs alongside. Timed in this thread's CPU time, not wall time, so the seconds another process
# holds the core do not count (two probes sharing one core each read the full clock); best of 5 rounds.
_CLOCK_PROBE_C = r"""
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#if defined(__x86_64__)
#define ADD "add %0, %0\n\t"
#elif defined(__aarch64__)
#define ADD "add %0, %0, %0\n\t"
#else
#error "no dependent-add chain written for this architecture"
#endif
int main(void) {
    const long n = 10000000L;
    uint64_t x = 1;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long i = 0; i < n; i++)
            __asm__ volatile(ADD ADD ADD ADD ADD ADD ADD ADD ADD ADD : "+r"(x));
        double hz = 10.0 * n / (now() - t0);
        if (hz > best) best = hz;
    }
    printf("%.1f\n", best / 1e6 + (double)(x & 0));
    return 0;
}
"""
_CLOCK_PROBE: dict[str, tuple[float | None, str]] = {}


def measured_clock_mhz() -> tuple[float | None, str]:
    """The core clock, measured: `_CLOCK_PROBE_C` built with the system C compiler ($CC, else cc or gcc) into a
    temporary folder and run once per process (about 0.2 s). For a VM that hides its clock (no cpufreq, only
    the nominal 'cpu MHz'), this is the turbo clock the MatMuls actually ran at. (None, why) when there is no
    compiler, no chain for this architecture, the probe fails, or it reads outside 100 MHz - 10 GHz.

    Taught in notebooks/00_environment.ipynb.
    """
    if "result" in _CLOCK_PROBE:
        return _CLOCK_PROBE["result"]
    import shutil
    import subprocess
    import tempfile
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc") if c and shutil.which(c)), None)
    result: tuple[float | None, str]
    if cc is None:
        result = (None, "no C compiler (cc, gcc or $CC) to build the clock probe")
    else:
        try:
            with tempfile.TemporaryDirectory(prefix="mshelpers-clock-") as d:
                exe = os.path.join(d, "clock")       # the source goes in on stdin: nothing else is written
                subprocess.run([cc, "-O1", "-x", "c", "-", "-o", exe], input=_CLOCK_PROBE_C, text=True, check=True,
                               capture_output=True, timeout=120)
                out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=120).stdout
            mhz = float(out.strip().splitlines()[-1])
            result = ((mhz, "measured: a dependent-add chain, best of 5") if 100 <= mhz <= 10_000 else
                      (None, f"the clock probe read {mhz:.0f} MHz, outside 100 MHz - 10 GHz"))
        except (OSError, ValueError, IndexError, subprocess.SubprocessError) as e:
            result = (None, f"the clock probe failed ({type(e).__name__})")
    _CLOCK_PROBE["result"] = result
    return result


def max_clock_mhz() -> tuple[float | None, str]:
    """The highest clock this CPU runs at, and where it was read: cpufreq's cpuinfo_max_freq when the
    kernel exposes it; else the higher of the measured clock (the one `peak_flops()` cached with this machine's
    MatMul peak, else `measured_clock_mhz()` now) and the largest 'cpu MHz' in /proc/cpuinfo (a VM shows its
    nominal clock there, below the turbo its cores run at).

    Taught in notebooks/00_environment.ipynb.
    """
    try:
        khz = float(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
        if khz > 0:
            return khz / 1e3, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    measured = _cached_clock_mhz()          # one clock for every process: the one measured with the MatMul peak
    if measured is None:
        measured, _ = measured_clock_mhz()
    listed = _cpuinfo_max_mhz()
    if measured and (listed is None or measured > listed):
        return measured, "measured: a dependent-add chain, best of 5"
    return listed, "/proc/cpuinfo cpu MHz"


def _cached_clock_mhz() -> float | None:
    """The clock `peak_flops()` measured beside this machine's cached float32 MatMul peak (a usable entry: this
    CPU model and thread count, taken idle), if it holds a plausible one."""
    info, _, key = _peak_key("float32")
    rec = _read_peak_cache(_peak_cache_path(), note=False).get(key)
    if _peak_entry_problem(rec, info) is not None:
        return None
    v = rec.get("clock_mhz")
    return float(v) if not isinstance(v, bool) and isinstance(v, (int, float)) and 100 <= v <= 10_000 else None


def _cpuinfo_max_mhz() -> float | None:
    best = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    v = float(line.partition(":")[2])
                    best = v if best is None else max(best, v)
    except (OSError, ValueError):
        pass
    return best


# --- the MFU denominator: the hardware peak ---
def hardware_peak_flops(dtype: str = "float32", *, device: str | None = None, verbose: bool = False,
                        fma_units: int = 2) -> float:
    """THE MFU denominator (PaLM's definition): the hardware's peak, not what a benchmark reached.

    On CPU: cores x the maximum clock (`max_clock_mhz`: cpufreq, else measured) x FLOP/cycle
    (`theoretical_peak_flops`'s assumptions, printed with verbose=True). If the cached measured MatMul peak (`peak_flops()`) is
    higher, the clock assumption was low (turbo), and the measured figure is used, so MFU <= 1 by
    construction. On Ascend/GPU: the datasheet figure of DATASHEET_PEAK_FLOPS for `device` (a key
    of that table) at `dtype`. The measured peak stays beside it as "share of achievable"
    (`share_of_achievable`).

    Taught in notebooks/00_environment.ipynb.
    """
    if device is not None and device != "CPU":
        if device not in DATASHEET_PEAK_FLOPS:
            raise ValueError(f"hardware_peak_flops: device={device!r} is unknown; fix: use CPU or one of "
                             f"{list(DATASHEET_PEAK_FLOPS)}")
        v = DATASHEET_PEAK_FLOPS[device].get(dtype)
        if not v:
            raise ValueError(f"hardware_peak_flops: {device} has no {dtype} figure; fix: use one of "
                             f"{[k for k, x in DATASHEET_PEAK_FLOPS[device].items() if isinstance(x, float)]}")
        if verbose:
            print(f"MFU denominator: {device} datasheet {dtype} peak {v / 1e12:.1f} TFLOP/s "
                  f"({DATASHEET_PEAK_FLOPS[device]['source']})")
        return float(v)
    if dtype != "float32":
        raise ValueError(f"hardware_peak_flops: dtype={dtype!r} on CPU is not modelled; fix: use float32")
    info = cpu_info()
    mhz, where = max_clock_mhz()
    if not mhz:
        raise ValueError("hardware_peak_flops: the CPU reports no clock; fix: pass device= with a datasheet entry")
    theory, lanes, isa, per_cycle = cpu_peak_flops(info["threads"], mhz, info, fma_units)
    rec = peak_flops_record(dtype)
    measured = float(rec["flops"]) if rec and isinstance(rec.get("flops"), (int, float)) else None
    value = max(theory, measured or 0.0)
    if verbose:
        print(f"MFU denominator (hardware peak): {info['threads']} cores x {mhz / 1e3:.2f} GHz ({where}) x "
              f"{per_cycle} FLOP/cycle ({isa}: {lanes} fp32 lanes x 2 for FMA x {fma_units} FMA units) = "
              f"{theory / 1e9:.0f} GFLOP/s")
        print("  assumes: each logical CPU is a full core (no SMT sharing), that clock holds under "
              f"{isa}, {fma_units} FMA units per core")
        if measured and measured > theory:
            print(f"  the measured MatMul peak {measured / 1e9:.0f} GFLOP/s is higher (turbo): it is used instead")
    return value


# --- the measured peak: compiled MatMul chains ---
PEAK_METHOD = ("graph-mode (ms.jit) float32 MatMul chains, best of repeats per shape, max over shapes; "
               "shapes = the mini LLaMA's projections at 1024 tokens plus a 2048 square")
# (m, k, n): rows x inner x cols. The first four are the mini model's projections at batch 8 x seq 128.
PEAK_SHAPES: tuple[tuple[int, int, int], ...] = ((1024, 256, 256), (1024, 256, 688), (1024, 688, 256),
                                                 (1024, 256, 1024), (2048, 2048, 2048))


def _matmul_chain_plan(m: int, k: int, n: int) -> tuple[int, int]:
    """(pairs, FLOPs per pair) of the timed chain: a pair is (m,k)@(k,n) then (m,n)@(n,k), 2*m*k*n FLOPs each;
    as many pairs (1 to 8) as make about 20 GFLOP per call: long enough to time, short enough to repeat."""
    flops_pair = 2 * 2 * m * k * n
    return max(1, min(8, int(2e10 // flops_pair))), flops_pair


def _matmul_chain_inputs(m: int, k: int, n: int, dtype: str) -> tuple:
    """x (m,k), b (k,n), c (n,k) as `dtype` tensors, b and c scaled by 1/sqrt(fan-in) so the chain neither
    overflows nor decays into denormals (which are slow on x86)."""
    import mindspore as ms
    import numpy as np
    rng = np.random.default_rng(0)
    dt = getattr(ms, dtype)
    return (ms.Tensor(rng.standard_normal((m, k)), dt), ms.Tensor(rng.standard_normal((k, n)) / np.sqrt(k), dt),
            ms.Tensor(rng.standard_normal((n, k)) / np.sqrt(n), dt))


def _measure_matmul_chain(m: int, k: int, n: int, repeats: int, dtype: str) -> float:
    """FLOP/s of a compiled chain of (m,k)@(k,n) and (m,n)@(n,k) MatMuls (best of repeats)."""
    import mindspore as ms
    from mindspore import ops
    pairs, flops_pair = _matmul_chain_plan(m, k, n)
    matmul = ops.MatMul()                             # the primitive the compiled model's projections use

    @ms.jit
    def chain(x, b, c):
        for _ in range(pairs):                        # unrolled at compile time
            x = matmul(matmul(x, b), c)
        return x

    x, b, c = _matmul_chain_inputs(m, k, n, dtype)
    chain(x, b, c).asnumpy()                          # compile and warm up
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        chain(x, b, c).asnumpy()
        best = min(best, time.perf_counter() - t0)
    return pairs * flops_pair / best


# --- is the machine idle enough to measure? ---
PEAK_SAMPLE_S = 0.5        # a load snapshot reads /proc/<pid>/stat twice, this far apart
PEAK_LIST_SHARE = 0.05     # a process that used more than 5 % of a core in the snapshot is listed as competing
PEAK_BUSY_SHARE = 0.20     # loaded: the listed processes together used more than 20 % of a core, or ...
PEAK_LOAD_SHARE = 0.5      # ... the 1-minute load average beyond this process's threads exceeds half the cores
# fields a cache entry must carry to be used: an entry without them predates the load check
PEAK_LOAD_FIELDS = ("load_1min_before", "load_1min_after", "competing_before", "competing_after", "loaded")


def _proc_cpu() -> dict[int, tuple[str, int, int]] | None:
    """pid -> (name, parent pid, CPU clock ticks used so far) for every process /proc shows; None without /proc."""
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    out: dict[int, tuple[str, int, int]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, _, tail = f.read().rpartition(")")      # the name may hold spaces and parentheses
            fields = tail.split()                             # state ppid ... utime(11) stime(12)
            out[pid] = (head.partition("(")[2], int(fields[1]), int(fields[11]) + int(fields[12]))
        except (OSError, IndexError, ValueError):             # ended between the listing and the read
            continue
    return out


def competing_processes(interval: float = PEAK_SAMPLE_S, min_share: float = PEAK_LIST_SHARE) -> list[dict] | None:
    """The processes other than this one and its descendants that used more than `min_share` of a core over
    `interval` seconds (two reads of /proc/<pid>/stat): [{"name", "pid", "core_share"}], busiest first.
    None where there is no /proc (macOS).

    Taught in notebooks/00_environment.ipynb (the load peak_flops records).
    """
    for name, v in (("interval", interval), ("min_share", min_share)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise ValueError(f"competing_processes: {name}={v!r} is invalid; fix: pass a number >= 0")
    first = _proc_cpu()
    if first is None:
        return None
    t0 = time.monotonic()
    time.sleep(interval)
    second = _proc_cpu() or {}
    dt = max(time.monotonic() - t0, 1e-3)
    tick = os.sysconf("SC_CLK_TCK")
    kids: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in {**first, **second}.items():
        kids.setdefault(ppid, []).append(pid)
    mine, todo = set(), [os.getpid()]
    while todo:                                               # this process and all its descendants
        pid = todo.pop()
        if pid not in mine:
            mine.add(pid)
            todo += kids.get(pid, [])
    rows = []
    for pid, (name, _, ticks) in second.items():
        share = (ticks - first.get(pid, (name, 0, 0))[2]) / tick / dt    # a new process: all its ticks are new
        if pid not in mine and share > min_share:
            rows.append({"name": name, "pid": pid, "core_share": round(share, 2)})
    return sorted(rows, key=lambda r: (-r["core_share"], r["pid"]))


def _load_snapshot() -> dict:
    """The 1-minute load average now, and the competing processes over the next PEAK_SAMPLE_S seconds."""
    try:
        load = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    return {"load_1min": load, "competing": competing_processes()}


def _load_reasons(when: str, snap: dict, threads: int, cores: int) -> list[str]:
    """Why the snapshot `snap` counts as loaded (the rule in peak_flops' docstring); [] when it is idle."""
    out = []
    busy = snap.get("competing") or []
    if sum(r["core_share"] for r in busy) > PEAK_BUSY_SHARE:
        out.append(f"{when}: " + ", ".join(f"{r['name']} (pid {r['pid']}) at {r['core_share']:.0%} of a core"
                                           for r in busy[:3]) + (f" and {len(busy) - 3} more" if len(busy) > 3 else ""))
    load = snap.get("load_1min")
    if load is not None and load - threads > PEAK_LOAD_SHARE * cores:
        out.append(f"load average {when} {load:.2f} > {threads} (this process) + {PEAK_LOAD_SHARE:g} x {cores} cores")
    return out


# --- the peak cache ---
def _peak_cache_path() -> Path:
    """MSHELPERS_PEAK_CACHE, else <MSHELPERS_BUILD>/peak_flops.json, else <repo>/build/, else ./build/."""
    if os.environ.get("MSHELPERS_PEAK_CACHE"):
        return Path(os.environ["MSHELPERS_PEAK_CACHE"])
    if os.environ.get("MSHELPERS_BUILD"):
        return Path(os.environ["MSHELPERS_BUILD"]) / "peak_flops.json"
    here = Path(__file__).resolve().parent
    for root in (here.parent, here):       # inside the cookbook: <repo>/build; copied alone: next to it
        if (root / "pyproject.toml").exists():
            return root / "build" / "peak_flops.json"
    return Path.cwd() / "build" / "peak_flops.json"


def _peak_key(dtype: str) -> tuple[dict, str, str]:
    """(cpu info, device, cache key): one record per CPU model, family, thread count, device and dtype."""
    import sys
    device = "CPU"
    if "mindspore" in sys.modules:     # a process that uses MindSpore reads its target; else no import for it
        try:
            device = sys.modules["mindspore"].get_context("device_target") or "CPU"
        except Exception:  # noqa: BLE001 - the cache can still answer
            pass
    info = cpu_info()
    return info, device, f"{info['cpu_model']}|family {info['cpu_family']}|{info['threads']} threads|{device}|{dtype}"


def _peak_entry_problem(rec: Any, info: dict) -> str | None:
    """None when a cache entry may be used on this machine, else why not (one phrase)."""
    if not isinstance(rec, dict):
        return "no entry"
    f = rec.get("flops")
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < math.inf:
        return f"flops={f!r} is not a measured figure"
    if rec.get("cpu_model") != info["cpu_model"] or rec.get("threads") != info["threads"]:
        return (f"it was measured on {rec.get('cpu_model')!r} with {rec.get('threads')} threads, "
                f"this machine is {info['cpu_model']!r} with {info['threads']}")
    missing = [k for k in PEAK_LOAD_FIELDS if k not in rec]
    if missing:
        return f"it was recorded without its load ({', '.join(missing)} missing)"
    if rec["loaded"] is not False:
        return f"it was recorded under load (loaded={rec['loaded']!r})"
    return None


def _read_peak_cache(path: Path, note: bool) -> dict:
    """The cache file as a dict; {} when absent, and {} with a one-line warning (`note`) when unreadable."""
    import json
    if not path.exists():
        return {}
    try:
        cache = json.loads(path.read_text())
        if not isinstance(cache, dict):
            raise ValueError(f"a JSON {type(cache).__name__}, not an object")
    except (OSError, ValueError) as e:
        if note:
            warnings.warn(f"peak_flops: cache {path} is unreadable ({' '.join(str(e).split())}); "
                          "ignored, measuring again", UserWarning, stacklevel=3)
        return {}
    return cache


def _write_peak_cache(path: Path, key: str, rec: dict) -> None:
    """Put `rec` under `key`, keeping the other entries as the file holds them now; atomic (temp + rename),
    so two writers at once leave one valid file (the last rename wins)."""
    import json
    import tempfile
    path.parent.mkdir(parents=True, exist_ok=True)
    cache = _read_peak_cache(path, note=False)
    cache[key] = rec
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(cache, indent=1))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# key -> this process's last measurement, refused as taken under load and so not cached: later calls in the
# same process return it (and say so) instead of measuring again; refresh=True measures again.
_UNCACHED: dict[str, dict] = {}


# --- the measured peak ---
def peak_flops(refresh: bool = False, *, dtype: str = "float32", repeats: int = 5,
               shapes: tuple[tuple[int, int, int], ...] = PEAK_SHAPES, verbose: bool = False,
               retries: int = 2, wait_s: float = 20.0) -> float:
    """This machine's achievable dense peak FLOP/s: the "share of achievable" denominator.

    Not the MFU denominator: MFU divides by `hardware_peak_flops()` (PaLM's definition).

    Measured once per machine the way the model's kernels run (compiled float32 MatMuls over the mini
    model's projection shapes and a large square, best of `repeats`, all threads), then cached in
    build/peak_flops.json (or $MSHELPERS_PEAK_CACHE) with the CPU model, thread count, date, method, each
    shape's figure, and the machine's load: the 1-minute load average before and after the timing, and the
    competing processes (name, pid, share of a core) seen in a 0.5 s sample just before and just after it.
    Every later call, in any process, reads the cache; `refresh=True` measures again. On CPU the record also
    holds the core clock measured right after the MatMuls (`measured_clock_mhz`, "clock_mhz"), so that
    `max_clock_mhz()`, and with it the MFU denominator, is the same in every process that reads the cache.
    The cache is keyed by CPU model, family, thread count and device, and an entry whose own CPU model or thread count is not this
    machine's is never used, so a different machine measures its own.

    Under load, a measurement is refused. The rule: the timing counts as loaded when, in the sample just
    before it or just after it, the other processes (not this one nor its descendants; each listed when it
    used more than 5 % of a core) together used more than 20 % of a core, or the 1-minute load average less
    this process's threads (the most it can add itself) exceeded half the cores (os.cpu_count()). A loaded
    measurement is re-taken up to `retries` times, each after waiting up to `wait_s` seconds for the machine
    to become idle; if it is still loaded it is NOT cached: the figure is returned with a one-line
    UserWarning naming the competitors, kept for this process only, and the next process measures again.
    A cache entry without the load fields (written before this rule) or recorded as loaded is measured
    again; a corrupt cache file is ignored (one-line warning) and rewritten.
    On Ascend, pass dtype="float16" (or "bfloat16") to measure the cube unit's peak.

    Taught in notebooks/00_environment.ipynb.
    """
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"peak_flops: dtype={dtype!r} is invalid; fix: float32, float16 or bfloat16")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"peak_flops: retries={retries!r} is invalid; fix: pass an integer >= 0")
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s < math.inf:
        raise ValueError(f"peak_flops: wait_s={wait_s!r} is invalid; fix: pass seconds >= 0")
    info, device, key = _peak_key(dtype)
    path = _peak_cache_path()
    cache = _read_peak_cache(path, note=True)
    rec = cache.get(key)
    problem = _peak_entry_problem(rec, info)
    if not refresh:
        if problem is None:
            return float(rec["flops"])
        if key in _UNCACHED:
            _warn_loaded(_UNCACHED[key], path)
            return float(_UNCACHED[key]["flops"])
        if problem != "no entry":
            warnings.warn(f"peak_flops: the cached {dtype} peak in {path} is not used: {problem}; measuring again",
                          UserWarning, stacklevel=2)
    threads, cores = info["threads"], os.cpu_count() or info["threads"]
    for attempt in range(retries + 1):
        before = _load_snapshot()
        if attempt:                                     # wait for the machine to become idle, then re-take
            deadline = time.monotonic() + wait_s
            while _load_reasons("before", before, threads, cores) and time.monotonic() < deadline:
                before = _load_snapshot()
        t0 = time.monotonic()
        per_shape = []
        for (m, k, n) in shapes:
            f = _measure_matmul_chain(m, k, n, repeats, dtype)
            per_shape.append({"m": m, "k": k, "n": n, "gflops": round(f / 1e9, 2)})
            if verbose:
                print(f"  MatMul ({m}x{k})@({k}x{n}) compiled: {f / 1e9:.1f} GFLOP/s")
        measure_s = time.monotonic() - t0
        _CLOCK_PROBE.clear()                            # the clock, measured afresh under the same load check
        clock_mhz = measured_clock_mhz()[0] if device == "CPU" else None
        after = _load_snapshot()
        reasons = _load_reasons("before", before, threads, cores) + _load_reasons("after", after, threads, cores)
        if not reasons:
            break
    best = max(p["gflops"] for p in per_shape) * 1e9
    import datetime
    new = {"flops": best, "dtype": dtype, "device": device, "cpu_model": info["cpu_model"],
           "cpu_family": info["cpu_family"], "threads": info["threads"],
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "method": PEAK_METHOD, "repeats": repeats, "shapes": per_shape,
           "cores": cores, "load_1min_before": before["load_1min"], "load_1min_after": after["load_1min"],
           "competing_before": before["competing"], "competing_after": after["competing"],
           "loaded": bool(reasons), "attempts": attempt + 1, "measure_s": round(measure_s, 2),
           "clock_mhz": clock_mhz}
    if reasons:
        new["load_reasons"] = reasons
        _UNCACHED[key] = new
        _warn_loaded(new, path, kept=rec if problem is None else None)
        return best
    _UNCACHED.pop(key, None)
    _write_peak_cache(path, key, new)
    return best


def _warn_loaded(rec: dict, path: Path, kept: dict | None = None) -> None:
    warnings.warn(f"peak_flops: {rec['flops'] / 1e9:.1f} GFLOP/s was measured under load "
                  f"({'; '.join(rec['load_reasons'])}) in {rec['attempts']} attempt(s); NOT cached in {path}"
                  + (f" (its idle {kept['flops'] / 1e9:.1f} GFLOP/s of {kept.get('date')} stays)" if kept else "")
                  + "; fix: stop the competing processes and call peak_flops(refresh=True)", UserWarning, stacklevel=3)


def peak_flops_record(dtype: str = "float32") -> dict | None:
    """The record behind peak_flops() on this machine: the cached entry as stored (None before the first
    measurement or when the file is unreadable), or, when this process's measurement was refused as
    loaded and so not cached, that measurement (with "loaded": True and its "load_reasons").

    Taught in notebooks/00_environment.ipynb.
    """
    info, _, key = _peak_key(dtype)
    if key in _UNCACHED and _peak_entry_problem(_read_peak_cache(_peak_cache_path(), note=False).get(key),
                                                info) is not None:
        return dict(_UNCACHED[key])
    return _read_peak_cache(_peak_cache_path(), note=False).get(key)
