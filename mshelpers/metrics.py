"""Throughput and utilisation: FLOPs per token, MFU, measured peak FLOP/s, a per-step logger.

Example:
    >>> from mshelpers.metrics import flops_per_token, mfu
    >>> fpt = flops_per_token(3_688_704, n_layers=4, hidden_size=256, seq_len=128)
    >>> fpt
    23705088
    >>> round(mfu(tokens_per_s=6000, flops_per_token=fpt, n_devices=1, peak_flops_per_device=185e9), 3)
    0.769

MFU (model FLOPs utilisation, PaLM appendix B) counts only the FLOPs the model needs,
never recomputation, so recompute lowers MFU even though the hardware works as hard.
The denominator is the hardware's peak (`hardware_peak_flops()`: the theoretical peak on a CPU,
the datasheet on an accelerator), as PaLM defines it, so figures compare with published ones; the
measured MatMul peak (`peak_flops()`) is shown beside it as "share of achievable". A hard-coded
A100 figure on other hardware is how MFU above 100% gets reported.
"""
from __future__ import annotations

import csv
import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

def flops_per_token(n_params: int, n_layers: int, hidden_size: int, seq_len: int, *,
                    attention: bool = True) -> int:
    """Training FLOPs per token: 6*N + 12*L*H*T (PaLM, Chowdhery et al. 2022, appendix B).

    6N covers the forward (2N) and backward (4N) matmuls over all N parameters;
    12*L*H*T adds the attention score and value matmuls (H = heads * head_dim =
    hidden_size, T = sequence length). `attention=False` returns 6N only.
    """
    n_params, n_layers, hidden_size, seq_len = (
        _count("flops_per_token", name, v) for name, v in (("n_params", n_params), ("n_layers", n_layers),
                                                            ("hidden_size", hidden_size), ("seq_len", seq_len)))
    return 6 * n_params + (12 * n_layers * hidden_size * seq_len if attention else 0)


def _count(fn: str, name: str, v: Any) -> int:
    """A positive count from any integral number: int, numpy ints, or a float with an integral value (7e9)."""
    import numbers
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{fn}: {name}={v!r} is not a number; fix: pass a positive integer")
    if isinstance(v, numbers.Integral) or (math.isfinite(float(v)) and float(v).is_integer()):
        if int(v) > 0:
            return int(v)
    raise ValueError(f"{fn}: {name}={v!r} is invalid; fix: pass a positive integer"
                     + (" (a count has no fraction)" if isinstance(v, numbers.Real) and math.isfinite(float(v))
                        and int(v) > 0 else ""))


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation as a fraction: achieved model FLOP/s over the devices' peak.

    tokens_per_s is global (all devices). Warns when the result exceeds 1.0, which
    cannot happen: the peak is too low or the token rate is wrong.
    """
    import numbers
    for name, v in (("tokens_per_s", tokens_per_s), ("flops_per_token", flops_per_token),
                    ("peak_flops_per_device", peak_flops_per_device)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(float(v)) or float(v) < 0:
            raise ValueError(f"mfu: {name}={v!r} is invalid; fix: pass a number >= 0")
    tokens_per_s, flops_per_token, peak_flops_per_device = (float(tokens_per_s), float(flops_per_token),
                                                            float(peak_flops_per_device))
    if peak_flops_per_device == 0:
        raise ValueError("mfu: peak_flops_per_device=0 is invalid; fix: measure it with "
                         "peak_flops() or use the device's datasheet figure")
    n_devices = _count("mfu", "n_devices", n_devices)
    value = tokens_per_s * flops_per_token / (n_devices * peak_flops_per_device)
    if value > 1.0:
        warnings.warn(f"MFU = {value:.2f} > 1 is impossible: {tokens_per_s:.4g} tokens/s x "
                      f"{flops_per_token:.4g} FLOPs/token exceeds {n_devices} x {peak_flops_per_device:.4g} FLOP/s; "
                      "the peak is too low or the token rate is wrong", UserWarning, stacklevel=2)
    return value


# ------------------------------------------------------------------ the MFU denominator
# Datasheet peaks for dense matrix math (no sparsity), FLOP/s per device. Each entry cites its source.
DATASHEET_PEAK_FLOPS: dict[str, dict[str, Any]] = {
    "Ascend 910A": {"float16": 256e12, "bfloat16": None,
                    "source": "Huawei, 'DaVinci: A Scalable Architecture for Neural Network Computing', "
                              "Hot Chips 31 (2019): Ascend 910, 32 DaVinci cores, 256 TFLOPS FP16 (no bf16 in "
                              "the 910A's cube unit)"},
    "Ascend 910B": {"float16": 376e12, "bfloat16": 353.9e12,
                    "source": "Huawei Ascend/msmodeling device profile ATLAS_800_A2_376T_64G (tensor_cast/device.py, "
                              "commit 1e5a50b1; mindformers publishes no constant). The same file lists 313T and "
                              "280T bins of the card: check your SKU, and measure with peak_flops() on the NPU"},
    "NVIDIA A100 SXM": {"float16": 312e12, "bfloat16": 312e12, "float32": 19.5e12, "tf32": 156e12,
                        "source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-"
                                  "1758950-r4-web.pdf), dense figures"},
    "NVIDIA H100 SXM": {"float16": 989.4e12, "bfloat16": 989.4e12, "float32": 67e12, "tf32": 494.7e12,
                        "source": "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM5; the datasheet's "
                                  "1,979 TFLOPS bf16 is with 2:4 sparsity, half of it is dense"},
}

PEAK_METHOD = ("graph-mode (ms.jit) float32 MatMul chains, best of repeats per shape, max over shapes; "
               "shapes = the mini LLaMA's projections at 1024 tokens plus a 2048 square")
# (m, k, n): rows x inner x cols. The first four are the mini model's projections at batch 8 x seq 128.
PEAK_SHAPES: tuple[tuple[int, int, int], ...] = ((1024, 256, 256), (1024, 256, 688), (1024, 688, 256),
                                                 (1024, 256, 1024), (2048, 2048, 2048))


def cpu_info() -> dict[str, Any]:
    """What this machine says about itself: CPU model, family, usable threads, vector flags."""
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
    units, two cycles per 512-bit FMA (AMD's Zen 4 software optimisation guide, 57647), so 8 there."""
    flags = info.get("flags") or set()
    if "avx512f" in flags:
        if info.get("vendor") == "AuthenticAMD" and str(info.get("cpu_family")) == "25":
            return 8, "AVX-512 on 256-bit units (Zen 4)"
        return 16, "AVX-512"
    return (8, "AVX2+FMA") if "fma" in flags else (4, "SSE")


def theoretical_peak_flops(verbose: bool = True, fma_units: int = 2) -> float:
    """cores x clock x FLOP/cycle for float32, from what the CPU reports; prints its assumptions.

    FLOP/cycle = fp32 lanes per FMA unit (`fp32_fma_lanes`: 16 with AVX-512, 8 with AVX2 and on Zen 4's 256-bit
    units, 4 with SSE) x 2 (an FMA is a multiply and an add) x `fma_units` (2 on server Xeons and on Zen 4/5;
    some client parts have 1). The clock is the nominal one /proc/cpuinfo shows: turbo can beat it, thermal
    limits and AVX-512 down-clocking fall short (`hardware_peak_flops` uses the maximum clock instead).
    """
    info = cpu_info()
    mhz = info["mhz"]
    lanes, isa = fp32_fma_lanes(info)
    if not mhz:
        raise ValueError("theoretical_peak_flops: no clock in /proc/cpuinfo; fix: use peak_flops() (measured) "
                         "or a DATASHEET_PEAK_FLOPS entry")
    per_cycle = lanes * 2 * fma_units
    value = info["threads"] * mhz * 1e6 * per_cycle
    if verbose:
        print(f"theoretical fp32 peak = {info['threads']} cores x {mhz / 1e3:.2f} GHz x {per_cycle} FLOP/cycle "
              f"({isa}: {lanes} lanes x 2 for FMA x {fma_units} FMA units) = {value / 1e9:.0f} GFLOP/s\n"
              f"  assumes: each logical CPU is a full core (no SMT sharing), the nominal clock holds under "
              f"{isa}, {fma_units} FMA units per core")
    return value


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
    compiler, no chain for this architecture, the probe fails, or it reads outside 100 MHz - 10 GHz."""
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
    nominal clock there, below the turbo its cores run at)."""
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


def hardware_peak_flops(dtype: str = "float32", *, device: str | None = None, verbose: bool = False,
                        fma_units: int = 2) -> float:
    """THE MFU denominator (PaLM's definition): the hardware's peak, not what a benchmark reached.

    On CPU: cores x the maximum clock (`max_clock_mhz`: cpufreq, else measured) x FLOP/cycle
    (`theoretical_peak_flops`'s assumptions, printed with verbose=True). If the cached measured MatMul peak (`peak_flops()`) is
    higher, the clock assumption was low (turbo), and the measured figure is used, so MFU <= 1 by
    construction. On Ascend/GPU: the datasheet figure of DATASHEET_PEAK_FLOPS for `device` (a key
    of that table) at `dtype`. The measured peak stays beside it as "share of achievable"
    (`share_of_achievable`).
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
    lanes, isa = fp32_fma_lanes(info)
    per_cycle = lanes * 2 * fma_units
    theory = info["threads"] * mhz * 1e6 * per_cycle
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


def share_of_achievable(tokens_per_s: float, flops_per_token: float, n_devices: int = 1,
                        measured_peak_flops: float | None = None) -> float:
    """Achieved model FLOP/s over the measured MatMul peak (`peak_flops()`, cached): how much of what
    this machine's kernels actually reach. Shown beside MFU, never instead of it."""
    peak = measured_peak_flops if measured_peak_flops is not None else peak_flops()
    return float(tokens_per_s) * float(flops_per_token) / (_count("share_of_achievable", "n_devices", n_devices)
                                                           * float(peak))


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


# ------------------------------------------------------------------ is the machine idle enough to measure?
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
    None where there is no /proc (macOS)."""
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
    loaded and so not cached, that measurement (with "loaded": True and its "load_reasons")."""
    info, _, key = _peak_key(dtype)
    if key in _UNCACHED and _peak_entry_problem(_read_peak_cache(_peak_cache_path(), note=False).get(key),
                                                info) is not None:
        return dict(_UNCACHED[key])
    return _read_peak_cache(_peak_cache_path(), note=False).get(key)


def peak_memory_mb() -> float:
    """Peak memory of this process in MiB: device peak on Ascend/GPU, peak RSS on CPU.

    On CPU `ms.runtime.max_memory_allocated()` returns 0, so the process peak RSS
    (which only grows) is the figure; compare runs in fresh processes.
    """
    import sys
    ms = sys.modules.get("mindspore")   # a process that has not imported MindSpore has no device memory
    if ms is not None:
        try:
            dev = ms.runtime.max_memory_allocated()
            if dev:
                return dev / 2**20
        except Exception:  # noqa: BLE001
            pass
    try:   # VmHWM: this process's own peak (ru_maxrss survives fork+exec and would show a parent's)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru / 2**20 if sys.platform == "darwin" else ru / 1024


COLUMNS = ("step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu",
           "peak_mem_mb", "overflow", "loss_scale", "spike")

# What a train cell returns, and how StepLogger reads it (the `outputs=` contract).
OUTPUT_FORMATS = ("loss", "loss_overflow_scale")

_CALLBACK_CLASSES: dict[type, type] = {}


def _as_callback_class(cls: type) -> type:
    """cls with mindspore.train.Callback mixed in (MindSpore's Model.train checks isinstance(cb, Callback))."""
    if cls not in _CALLBACK_CLASSES:
        from mindspore.train import Callback
        _CALLBACK_CLASSES[cls] = cls if issubclass(cls, Callback) else type(cls.__name__, (cls, Callback),
                                                                            {"__module__": cls.__module__})
    return _CALLBACK_CLASSES[cls]


def _scalar(what: str, v: Any) -> float:
    """A Python float from a number, a 0-d or one-element array, or a MindSpore Tensor; else one ValueError."""
    import numbers
    if hasattr(v, "asnumpy"):
        v = v.asnumpy()
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    size = getattr(v, "size", None)
    if size == 1 and hasattr(v, "reshape"):
        return float(v.reshape(()))
    shape = getattr(v, "shape", None)
    raise ValueError(f"StepLogger: {what}={v!r:.80} is not a scalar"
                     + (f" (shape {tuple(shape)})" if shape is not None else f" (type {type(v).__name__})")
                     + f"; fix: reduce it to one number (e.g. .mean()) in the network, or pass "
                       f"outputs=<function returning {{'loss': float, ...}}>")


class StepLogger:
    """One CSV row per step: loss, lr, grad norm, time, tokens/s, MFU, peak memory, overflow, scale.

    From a plain loop:
        log = StepLogger("build/runs/x.csv", tokens_per_step=1024, flops_per_token=fpt,
                         peak_flops_per_device=185e9)
        log.log_step(step=1, loss=6.9, step_time_s=0.2)
    As a MindSpore Callback (`model.train(..., callbacks=[log])`) it times each step and reads
    the network's output by an explicit contract, `outputs=`:
        "loss"                 (default) the train cell returns one scalar loss; anything else is a ValueError
        "loss_overflow_scale"  it returns (loss, overflow, loss_scale), as TrainOneStepWithLossScaleCell does
        a function             f(net_outputs) -> dict with "loss" and any of "overflow", "loss_scale",
                               "grad_norm", "lr" (e.g. for a cell returning (loss, acc, n_tokens))
    lr and grad_norm come from `lr_fn(step) -> float` and `grad_norm_fn(step) -> float` when given (a
    train cell can keep its last grad norm in a Parameter for grad_norm_fn to read); otherwise lr is the
    optimizer's learning rate when it is a fixed number, and grad_norm is NaN.
    The logger is a `mindspore.train.Callback` when MindSpore is already imported at construction;
    `log.as_callback()` makes it one explicitly. The module itself never imports MindSpore.

    An existing non-empty CSV is never truncated silently: pass `append=True` to continue it (a resumed
    run) or `overwrite=True` to start it over; with neither, the constructor raises ValueError.
    tokens_per_step and n_devices are global, so tokens/s is the job's, not one rank's.
    """

    def __init__(self, csv_path: str | os.PathLike | None, tokens_per_step: int, flops_per_token: float,
                 peak_flops_per_device: float, n_devices: int = 1, lr_fn: Any = None, *,
                 grad_norm_fn: Any = None, outputs: Any = "loss", append: bool = False,
                 overwrite: bool = False) -> None:
        import numbers
        import sys
        if isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, numbers.Real) \
                or not tokens_per_step > 0:
            raise ValueError(f"StepLogger: tokens_per_step={tokens_per_step!r} is invalid; fix: pass batch*seq_len > 0")
        if isinstance(n_devices, bool) or not isinstance(n_devices, numbers.Real) or not n_devices >= 1:
            raise ValueError(f"StepLogger: n_devices={n_devices!r} is invalid; fix: pass >= 1")
        tokens_per_step = _count("StepLogger", "tokens_per_step", tokens_per_step)
        n_devices = _count("StepLogger", "n_devices", n_devices)
        for name, v in (("flops_per_token", flops_per_token), ("peak_flops_per_device", peak_flops_per_device)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not float(v) > 0:
                raise ValueError(f"StepLogger: {name}={v!r} is invalid; fix: pass a number > 0")
        if not (outputs in OUTPUT_FORMATS or callable(outputs)):
            raise ValueError(f"StepLogger: outputs={outputs!r} is invalid; fix: one of {OUTPUT_FORMATS} or a "
                             "function net_outputs -> {'loss': ..., 'overflow': ..., 'loss_scale': ...}")
        for name, fn in (("lr_fn", lr_fn), ("grad_norm_fn", grad_norm_fn)):
            if fn is not None and not callable(fn):
                raise ValueError(f"StepLogger: {name}={fn!r} is not callable; fix: pass a function step -> float")
        if append and overwrite:
            raise ValueError("StepLogger: append=True and overwrite=True contradict; fix: pick one")
        if "mindspore" in sys.modules and type(self) is not _as_callback_class(type(self)):
            self.__class__ = _as_callback_class(type(self))
            super(StepLogger, self).__init__()          # Callback.__init__, if it has one
        self.csv_path = Path(csv_path) if csv_path else None
        self.tokens_per_step, self.flops_per_token = tokens_per_step, float(flops_per_token)
        self.peak_flops_per_device, self.n_devices = float(peak_flops_per_device), n_devices
        self.lr_fn, self.grad_norm_fn, self.outputs = lr_fn, grad_norm_fn, outputs
        self.rows: list[dict] = []
        if self.csv_path:
            exists = self.csv_path.exists() and self.csv_path.stat().st_size > 0
            if exists and not (append or overwrite):
                raise ValueError(f"StepLogger: csv_path={str(self.csv_path)!r} already exists and is not empty; "
                                 "fix: append=True to continue it (a resumed run) or overwrite=True to start over")
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            if exists and append:
                with self.csv_path.open(newline="") as f:
                    header = next(csv.reader(f), [])
                if tuple(header) != COLUMNS:
                    raise ValueError(f"StepLogger: csv_path={str(self.csv_path)!r} has columns {header}, not "
                                     f"{list(COLUMNS)}; fix: append only to a StepLogger CSV, or overwrite=True")
            else:
                with self.csv_path.open("w", newline="") as f:
                    csv.writer(f).writerow(COLUMNS)

    def as_callback(self) -> "StepLogger":
        """This logger as a `mindspore.train.Callback` (imports MindSpore); returns self."""
        if type(self) is not _as_callback_class(type(self)):
            self.__class__ = _as_callback_class(type(self))
        return self

    def log_step(self, step: int, loss: float, step_time_s: float, *, lr: float = float("nan"),
                 grad_norm: float = float("nan"), overflow: bool = False, loss_scale: float = 1.0,
                 peak_mem_mb: float | None = None, spike: bool = False) -> dict:
        """Log one step; `spike=True` marks a step redone after a spike rollback (mshelpers.stability).

        loss, lr, grad_norm, step_time_s may be Python or numpy numbers, 0-d arrays or MindSpore Tensors;
        a loss with more than one element is a ValueError (reduce it first).
        """
        loss, step_time_s = _scalar("loss", loss), _scalar("step_time_s", step_time_s)
        lr, grad_norm = _scalar("lr", lr), _scalar("grad_norm", grad_norm)
        tps = self.tokens_per_step / step_time_s if step_time_s > 0 else float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a compile step can look odd; MFU > 1 is checked on summaries
            u = mfu(tps, self.flops_per_token, self.n_devices, self.peak_flops_per_device) if tps == tps else tps
        row = dict(step=int(step), loss=loss, lr=lr, grad_norm=grad_norm,
                   step_time_s=step_time_s, tokens_per_s=tps, mfu=u,
                   peak_mem_mb=peak_memory_mb() if peak_mem_mb is None else float(peak_mem_mb),
                   overflow=bool(overflow), loss_scale=_scalar("loss_scale", loss_scale), spike=bool(spike))
        self.rows.append(row)
        if self.csv_path:
            with self.csv_path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=COLUMNS).writerow(row)
        return row

    def read_outputs(self, net_outputs: Any) -> dict:
        """The `outputs=` contract applied to what the train cell returned: a dict with at least "loss"."""
        if callable(self.outputs):
            got = self.outputs(net_outputs)
            if not isinstance(got, dict) or "loss" not in got:
                raise ValueError(f"StepLogger: outputs function returned {got!r:.80}; fix: return a dict with "
                                 "'loss' and optionally 'overflow', 'loss_scale', 'grad_norm', 'lr'")
            return dict(got)
        if self.outputs == "loss_overflow_scale":
            if not isinstance(net_outputs, (tuple, list)) or len(net_outputs) != 3:
                raise ValueError(f"StepLogger: outputs='loss_overflow_scale' but the network returned "
                                 f"{_describe(net_outputs)}; fix: outputs='loss' for a single loss, or a function")
            loss, overflow, scale = net_outputs
            # a Python bool is the natural overflow flag (a scalar for the flag, though not for a loss)
            flag = overflow if isinstance(overflow, bool) else bool(_scalar("overflow", overflow))
            return {"loss": loss, "overflow": flag,
                    "loss_scale": _scalar("loss_scale", scale)}
        if isinstance(net_outputs, (tuple, list)):
            raise ValueError(f"StepLogger: outputs='loss' but the network returned {_describe(net_outputs)}; "
                             "fix: outputs='loss_overflow_scale' for TrainOneStepWithLossScaleCell, or "
                             "outputs=lambda out: {'loss': out[0]} to pick the loss yourself")
        return {"loss": net_outputs}

    # ---- MindSpore Callback hooks
    def on_train_step_begin(self, run_context) -> None:
        self._t0 = time.perf_counter()

    def on_train_step_end(self, run_context) -> None:
        cb = run_context.original_args()
        dt = time.perf_counter() - self._t0
        got = self.read_outputs(cb.net_outputs)
        step = cb.cur_step_num
        optimizer = getattr(cb, "optimizer", None) or getattr(getattr(cb, "train_network", None), "optimizer", None)
        lr = got.get("lr", self.lr_fn(step) if self.lr_fn else _fixed_lr(optimizer))
        grad_norm = got.get("grad_norm", self.grad_norm_fn(step) if self.grad_norm_fn else float("nan"))
        self.log_step(step, got["loss"], dt, lr=lr, grad_norm=grad_norm,
                      overflow=bool(got.get("overflow", False)), loss_scale=got.get("loss_scale", 1.0))


def _describe(out: Any) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    return f"one {type(out).__name__}" + (f" of shape {tuple(out.shape)}" if hasattr(out, "shape") else "")


def _fixed_lr(optimizer: Any) -> float:
    """The optimizer's learning rate when it is one number (a Parameter); NaN for schedules or no optimizer."""
    lr = getattr(optimizer, "learning_rate", None)
    try:
        if lr is not None and hasattr(lr, "asnumpy") and lr.asnumpy().size == 1:
            return float(lr.asnumpy().reshape(()))
    except Exception:  # noqa: BLE001 - a schedule cell has no single value
        pass
    return float("nan")


def summarize(rows: list[dict], skip_first: int = 1) -> dict[str, Any]:
    """Compile time (first step), medians over the steady steps, final loss and counts."""
    if not rows:
        raise ValueError("summarize: rows is empty; fix: log at least one step")
    steady = rows[skip_first:] or rows
    med = lambda k: statistics.median(r[k] for r in steady)
    return dict(steps=len(rows), compile_time_s=rows[0]["step_time_s"], median_step_s=med("step_time_s"),
                tokens_per_s=med("tokens_per_s"), mfu=med("mfu"), final_loss=rows[-1]["loss"],
                peak_mem_mb=max(r["peak_mem_mb"] for r in rows),
                overflow_steps=sum(bool(r["overflow"]) for r in rows),
                spike_steps=sum(bool(r.get("spike", False)) for r in rows),
                nonfinite_losses=sum(not math.isfinite(r["loss"]) for r in rows))
