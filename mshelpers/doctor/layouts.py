"""Layout rules shared by the reader and the variants: layers per pipeline stage, recompute per stage, the
value checks (counts, sizes, dtypes, switches), and the cross-checks of a layout against its model.

mindformers splits L layers over pp stages (x VPP chunks) in its LayerSetting and counts recompute per stage;
readers.py builds a `Layout` from a file with these functions, variants.py builds another `Layout` from a
parsed one with the same functions, so a variant and its file read again split and check alike.
Errors are one DoctorError line: field, value, fix.
"""
from __future__ import annotations

import math
import re
from typing import Any

from .describe import Config, DoctorError


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v)
                                                                and v.is_integer())   # no float(2**1100) overflow


def _count(v: Any, where: str, *, zero_ok: bool = False, strict: bool = False) -> int:
    """A count, or one DoctorError line. strict: an int, not 2.0, for the keys mindformers type-checks
    (Validator.check_positive_int on the parallel degrees, isinstance(int) on gradient_accumulation_steps)."""
    if not _is_int(v) or v < (0 if zero_ok else 1) or v >= 2**31 or strict and isinstance(v, float):
        raise DoctorError(where, v, f"a {'non-negative' if zero_ok else 'positive'} integer below 2**31"
                          + (" (an int: mindformers checks the type)" if strict and _is_int(v) else ""))
    return int(v)


def parse_size(text: Any) -> int:
    """Bytes in a MindSpore size such as "58GB" (GB = 1024**3, as mshelpers.memory.parse_memory_size).
    Taught in: no notebook; doctor/__init__.py, doctor/readers.py call it."""
    if isinstance(text, (int, float)) and not isinstance(text, bool) and 0 < text < 2**64 and \
            (isinstance(text, int) or math.isfinite(text)):       # (math.isfinite(2**1100) raises OverflowError)
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)\s*", str(text), flags=re.IGNORECASE)
    if not m or not 0 < float(m.group(1)) < 2**64:                # "999...9GB" is float inf
        raise ValueError(text)
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2).upper()])


def _budget(given: Any, ctx: dict, default: Any = None) -> int | None:
    raw = given if given is not None else ctx.get("max_device_memory", default)
    if raw is None:
        return None
    try:
        return parse_size(raw)
    except ValueError:
        where = "--budget" if given is not None else "context.max_device_memory"
        raise DoctorError(where, raw, 'write a size as MindSpore does, e.g. "58GB"') from None


_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "fp16": "float16",
           "bf16": "bfloat16", "fp32": "float32"}


def _dtype(v: Any, default: str, where: str) -> str:
    """A dtype key as mindformers' convert_mstype reads it (models/utils.py: str(v).lower(), one of float16,
    float32, bfloat16 or int8; 2.x configs also write fp16/bf16/fp32). Missing or None: `default`."""
    if v is None:
        return default
    if not isinstance(v, str) or v.lower() not in _DTYPES:
        raise DoctorError(where, v, "float16, bfloat16 or float32 (mindformers' models/utils.py convert_mstype; "
                          "the doctor prices these three)")
    return _DTYPES[v.lower()]


def _flag(section: dict, key: str, default: bool, where: str) -> bool:
    """A switch the doctor prices: True or False, as mindformers' Validator.check_bool takes it (r1.x
    modules/transformer/op_parallel_config.py checks use_seq_parallel so). Missing or None: `default`."""
    v = section.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise DoctorError(f"{where}.{key}", v, "True or False (mindformers checks it with Validator.check_bool)")
    return v


def stage_split(L: int, pp: int, vpp: int, offset: Any, where: str, notes: list) -> list[list[int]]:
    """Layers per (VPP chunk, stage) as mindformers' LayerSetting builds them: L // (pp * vpp) + offset
    (mindformers 2.1.0 parallel_core/training_graph/transformer/utils.py, LayerSetting._check_inputs: an
    int, a per-stage list, or a per-chunk list of per-stage lists, summing to L % (pp * vpp)).
    Taught in: no notebook; doctor/__init__.py, doctor/readers.py, doctor/variants.py call it."""
    n = pp * vpp
    if n > L:                                       # also keeps the per-stage lists below from growing with pp
        raise DoctorError("parallelism.pipeline_parallel" if where.startswith("parallelism") else
                          "parallel_config.pipeline_stage", pp, f"at most one pipeline stage (x {vpp} interleave "
                          f"chunks) per layer: {L} layers")
    base = L // n
    off = offset if offset is not None else 0
    if isinstance(off, bool) or not (_is_int(off) or isinstance(off, (list, tuple))):
        raise DoctorError(where, offset, f"an int, a list of {pp} per-stage offsets, or {vpp} such lists")
    if _is_int(off):
        grid = [[int(off)] * pp for _ in range(vpp)] if n > 1 else [[0]]
    elif off and all(isinstance(r, (list, tuple)) for r in off):
        if len(off) != vpp or any(len(r) != pp or not all(_is_int(x) for x in r) for r in off):
            raise DoctorError(where, offset, f"{vpp} lists (one per VPP chunk) of {pp} integer offsets")
        grid = [[int(x) for x in r] for r in off]
    elif all(_is_int(x) for x in off) and len(off) == pp:
        grid = [[int(x) for x in off] for _ in range(vpp)]
    else:
        raise DoctorError(where, offset, f"a list of {pp} integer per-stage offsets (one per pipeline stage)")
    if n == 1:
        return [[L]]
    total = sum(map(sum, grid))
    if total != L % n:
        if total == 0:
            # mindformers itself requires the offsets to sum to the remainder; spread it over the middle
            # stages (the first and last carry the embedding and the head) and say so
            rest = L % n
            order = sorted(range(n), key=lambda i: (i in (0, n - 1), abs(i - (n - 1) / 2)))
            flat = [0] * n
            for i in order[:rest]:
                flat[i] += 1
            grid = [flat[v * pp:(v + 1) * pp] for v in range(vpp)]
            notes.append(f"{where}={offset!r} does not split {L} layers into {pp} x {vpp} stages (mindformers wants "
                         f"offsets summing to the remainder of {L} layers divided by {n} chunks, {rest}); assumed {grid}")
        else:
            raise DoctorError(where, offset, f"offsets summing to {L % n}, the remainder of {L} layers divided by {pp} x {vpp} "
                              f"chunks (they sum to {total})")
    layers = [[base + x for x in r] for r in grid]
    if min(min(r) for r in layers) < 0 or sum(map(sum, layers)) != L:
        raise DoctorError(where, offset, "every stage needs at least zero layers; make the offsets smaller")
    return layers


def _per_stage(value: Any, chunks: list[list[int]], where: str) -> list[int]:
    """Fully recomputed layers per stage from a recompute entry: a bool, an int (per stage), a list of
    per-stage counts, or (VPP) a list of such lists per chunk."""
    stage = [sum(c[s] for c in chunks) for s in range(len(chunks[0]))]
    pp = len(stage)
    if value is None or value is False:
        return [0] * pp
    if value is True:
        return stage
    if _is_int(value) and value >= 0:
        return [min(int(value) * len(chunks), n) for n in stage]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        if len(value) == len(chunks) and all(len(v) == pp and all(_is_int(x) or isinstance(x, bool) for x in v)
                                             for v in value):
            return [sum(min(c[s] if x is True else 0 if x is False else int(x), c[s]) for c, x in
                        zip(chunks, (v[s] for v in value))) for s in range(pp)]
    elif isinstance(value, (list, tuple)) and len(value) == pp and all(_is_int(v) or isinstance(v, bool) for v in value):
        return [n if v is True else 0 if v is False else min(max(int(v), 0), n) for v, n in zip(value, stage)]
    raise DoctorError(where, value, f"a bool, a list of {pp} per-stage layer counts, or {len(chunks)} such lists "
                      "(one per VPP chunk)")


_DEFAULT_SELECT = ("feed_forward.mul", "feed_forward.w1.activation")   # mindformers' select_recompute: True


def _select_ops(value: Any, chunks: list[list[int]], full: list[int], where: str) -> list[tuple]:
    """select_recompute as per stage ((op pattern, layers it covers), ...); full-recompute layers excluded."""
    stage = [sum(c[s] for c in chunks) for s in range(len(chunks[0]))]
    rest = [n - f for n, f in zip(stage, full)]
    pp = len(stage)
    if value is None or value is False:
        return [()] * pp
    if isinstance(value, dict):
        out = [[] for _ in range(pp)]
        for pat, v in value.items():
            counts = _per_stage(v, chunks, f"{where}[{pat!r}]")
            for i in range(pp):
                if min(counts[i], rest[i]):
                    out[i].append((str(pat), min(counts[i], rest[i])))
        return [tuple(o) for o in out]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return [tuple((p, r) for p in value) if r else () for r in rest]
    counts = _per_stage(value, chunks, where)
    return [tuple((p, min(c, r)) for p in _DEFAULT_SELECT) if min(c, r) else () for c, r in zip(counts, rest)]


def _ranges(value: Any, n_layers: int, where: str) -> list[int]:
    """Layer ids from PyNative's range lists: [0-42], ["0-3", 7], "0-42", True (all), None."""
    if value is None or value is False:
        return []
    if value is True:
        return list(range(n_layers))
    items = value if isinstance(value, (list, tuple)) else [value]
    ids = set()
    for it in items:
        if _is_int(it) and 0 <= it:
            ids.add(int(it))
            continue
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", str(it)) if isinstance(it, str) else None
        if not m:
            raise DoctorError(where, value, 'layer ids or ranges, e.g. [0-42] or ["0-3", 7]')
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        ids.update(range(lo, min(hi, n_layers - 1) + 1))     # "0-99999999999" must not build that set
    return sorted(i for i in ids if i < n_layers)


# ---------------------------------------------------------------- 2.x recompute of a variant (mode full or select)
def full_counts_2x(value: Any, stage: list[int], where: str) -> list[int]:
    """Fully recomputed layers per stage of a 2.x variant: True (all), False / None / 0 (none), a count (the first
    that many layers of every stage), or one count or bool per stage.
    Taught in: no notebook; doctor/variants.py calls it."""
    pp = len(stage)
    if value is True:
        return list(stage)
    if value is None or value is False:
        return [0] * pp
    if _is_int(value) and value >= 0:
        return [min(int(value), n) for n in stage]
    if isinstance(value, (list, tuple)) and len(value) == pp and all(
            isinstance(v, bool) or _is_int(v) and v >= 0 for v in value):
        return [n if v is True else 0 if v is False else min(int(v), n) for v, n in zip(value, stage)]
    raise DoctorError(where, value, f"True, False, a layer count, or {pp} per-stage counts (2.x PyNative)")


def select_module_2x(value: Any, where: str) -> dict:
    """A 2.x recompute.select_module for a select_recompute value: True is the MLP, a list its module patterns.
    Taught in: no notebook; doctor/variants.py calls it."""
    if value is True:
        return {"mlp": True}
    if isinstance(value, (list, tuple)) and value and all(isinstance(p, str) for p in value):
        return {p: True for p in value}
    if isinstance(value, dict) and value:
        return dict(value)
    raise DoctorError(where, value, "True, a list of module patterns, or a mapping pattern -> layers (2.x PyNative)")


def layer_ranges(counts: list[int], chunks: list[list[int]]) -> list[str]:
    """2.x full_recompute_layer ranges ("lo-hi") for per-stage counts: the first `count` layers of each stage,
    layer ids numbered chunk by chunk, stage by stage, as the reader numbers them.
    Taught in: no notebook; doctor/variants.py calls it."""
    pp = len(chunks[0])
    ids: list[list[int]] = [[] for _ in range(pp)]
    i = 0
    for row in chunks:
        for s, n in enumerate(row):
            ids[s].extend(range(i, i + n))
            i += n
    out = []
    for s, c in enumerate(counts):
        run = ids[s][:c]
        start = 0
        for j in range(1, len(run) + 1):
            if j == len(run) or run[j] != run[j - 1] + 1:
                out.append(f"{run[start]}-{run[j - 1]}")
                start = j
    return out


_LPS = "parallelism.pipeline_parallel_layers_per_stage"


def pynative_chunks(par: dict, layers: int, pp: int, vpp: int, notes: list) -> list[list[int]]:
    """Layers per (VPP chunk, stage) of a 2.x file: its pipeline_parallel_layers_per_stage intervals
    [[start, end), ...] when they cover the layers, else the equal split (with the remainder in the middle).
    Taught in: no notebook; doctor/readers.py, doctor/variants.py call it."""
    chunks = stage_split(layers, pp, vpp, 0, _LPS, notes)
    lps = par.get("pipeline_parallel_layers_per_stage")
    if isinstance(lps, (list, tuple)) and lps and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in lps):
        if not all(_is_int(x) for r in lps for x in r):
            raise DoctorError(_LPS, lps, "layer intervals [[start, end), ...] of integers, one per stage and chunk")
        sizes = [int(hi) - int(lo) for lo, hi in lps]
        if len(sizes) == pp * vpp and sum(sizes) == layers and min(sizes) >= 0:
            return [sizes[v * pp:(v + 1) * pp] for v in range(vpp)]
    if lps not in (None, "auto"):
        notes.append(f"{_LPS}={lps!r} is not {pp * vpp} intervals covering the {layers} layers: the equal split "
                     f"{[sum(c[s] for c in chunks) for s in range(pp)]} assumed")
    return chunks


def pynative_recompute(rc: dict, layers: int, chunks: list[list[int]]) -> tuple[list[int], list[tuple]]:
    """A 2.x `recompute:` section (RecomputeConfig: mode 'None', 'full' with full_recompute_layer, or 'select'
    with select_module {pattern: layer ranges}) as per-stage full counts and select ops, its layer numbers
    placed on the stages of `chunks` (VPP chunk-major, as mindformers numbers them).
    Taught in: no notebook; doctor/readers.py, doctor/variants.py call it."""
    vpp, pp = len(chunks), len(chunks[0])
    mode = str(rc.get("mode", "None"))
    stage_of = [s for v in range(vpp) for s in range(pp) for _ in range(chunks[v][s])]
    full = [0] * pp
    sel: list[tuple] = [()] * pp
    if mode == "full":
        ids = _ranges(rc.get("full_recompute_layer", True) if rc.get("full_recompute_layer") is not None else True,
                      layers, "recompute.full_recompute_layer")
        for i in ids:
            full[stage_of[i]] += 1
    elif mode == "select":
        sm = rc.get("select_module") or {}
        if isinstance(sm, dict):
            out = [[] for _ in range(pp)]
            for pat, rng in sm.items():
                per = [0] * pp
                for i in _ranges(rng if rng is not None else True, layers, f"recompute.select_module[{pat!r}]"):
                    per[stage_of[i]] += 1
                for s in range(pp):
                    if per[s]:
                        out[s].append((str(pat), per[s]))
            sel = [tuple(o) for o in out]
    elif mode != "None":
        raise DoctorError("recompute.mode", mode, "'None', 'full' or 'select' (mindformers' RecomputeConfig)")
    return full, sel


def checked(cfg: Config) -> Config:
    """`cfg`, once its layout passes the cross-checks against its model (tp dividing the heads and the FFN, ep
    carved out of dp x tp, micro-batches per stage, cp dividing the sequence); else one DoctorError line.
    Taught in notebooks/05_semi_auto_parallel.ipynb."""
    m, lay = cfg.model, cfg.layout
    tp_key = "parallelism.tensor_parallel" if cfg.dialect == "pynative" else "parallel_config.model_parallel"
    if m.heads % lay.tp or (m.kv_heads % lay.tp and lay.tp % m.kv_heads):
        ok = [x for x in range(1, m.heads + 1) if m.heads % x == 0 and (m.kv_heads % x == 0 or x % m.kv_heads == 0)]
        raise DoctorError(tp_key, lay.tp, f"use a model_parallel dividing num_heads={m.heads} (and kv heads="
                          f"{m.kv_heads}): one of {ok}")
    if m.ffn % lay.tp:
        raise DoctorError(tp_key, lay.tp, f"use a model_parallel dividing the ffn width {m.ffn}")
    if m.moe and (lay.dp * lay.tp) % lay.ep:
        key = "parallelism.expert_parallel" if cfg.dialect == "pynative" else "parallel_config.expert_parallel"
        raise DoctorError(key, lay.ep, f"an expert_parallel dividing dp x tp = {lay.dp * lay.tp} (mindformers carves "
                          "EP out of them)")
    if m.moe and m.moe.routed % lay.ep:
        raise DoctorError("expert_parallel", lay.ep, f"a divisor of the routed experts ({m.moe.routed})")
    if lay.schedule not in ("1f1b", "gpipe", "interleaved") or (lay.vpp > 1 and lay.schedule != "interleaved"):
        raise DoctorError("schedule", lay.schedule, "'1f1b', 'gpipe' or 'interleaved' (the only one with "
                          "pp_interleave_num > 1)")
    if lay.interleaved_order not in ("standard", "memory"):
        raise DoctorError("interleaved_order", lay.interleaved_order, "'standard' or 'memory'")
    if lay.pp > 1 and lay.micro < lay.pp:
        raise DoctorError("parallel_config.micro_batch_num", lay.micro, f"micro_batch_num >= pipeline_stage={lay.pp}")
    if m.seq % lay.cp:
        raise DoctorError("context_parallel", lay.cp, f"a divisor of seq_length={m.seq}")
    return cfg
