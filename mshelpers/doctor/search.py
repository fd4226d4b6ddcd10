"""The layout search: variants of a config on the same devices and global batch, under the memory budget,
ranked by predicted tokens/s per device.

It varies the parsed Layout (variants.layout_variant: dataclasses.replace, the reader's own split and checks)
and prices each with cost.py; it never edits or reads a YAML. Only the layouts it returns get their file
(variants.edited_yaml), which --out writes."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from .cost import (expert_shard, head_flops, layer_ops, memory_per_stage, reserve_bytes, stage_memory_bytes,
                   step_time)
from .describe import Config, DoctorError
from .profiles import DoctorHardware
from .variants import edited_yaml, layout_variant


def changed_keys(old: dict, new: dict, prefix: str = "") -> dict:
    """{dotted key: (old value, new value)} for the keys that differ (a key missing on one side is None).
    Taught in notebooks/12_your_config.ipynb."""
    out = {}
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(changed_keys(a, b, f"{prefix}{k}."))
        elif a != b:
            out[f"{prefix}{k}"] = (a, b)
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_name(c: Config) -> str:
    """A layout as one string naming every degree: dp, tp, pp, vpp, cp and, for MoE, ep and the expert shard (the
    ranks one expert's weights are split over, min(ep x tp, dp x tp), cost.expert_shard); then the micro-batch,
    micro-batches, sequence parallel, parallel optimizer, fully recomputed layers, selective recompute, and the
    layers per stage when the stages are uneven.
    Taught in: no notebook; doctor/diagnosis.py calls it."""
    lay = c.layout
    degrees = f"dp{lay.dp}-tp{lay.tp}-pp{lay.pp}-vpp{lay.vpp}-cp{lay.cp}"
    if c.model.moe is not None:
        degrees += f"-ep{lay.ep}-es{expert_shard(c)}"
    return (f"{degrees} b{lay.batch} m{lay.n_micro}" + (" sp" if lay.seq_parallel else "")
            + (" po" if lay.parallel_optimizer else "") + f" rc{sum(lay.full_recompute)}"
            + (" sel" if any(lay.select_ops) else "")
            + (f" L{'/'.join(map(str, lay.stage_layers))}" if len(set(lay.stage_layers)) > 1 else ""))


def _offsets(cfg: Config, pp: int) -> list:
    """Offsets worth pricing for `pp` stages: 0 (mindformers' even split, the remainder said by stage_split) and
    the split that evens the stages' compute, the last stage carrying the LM head (and MTP) as extra layers'
    worth of FLOPs. mindformers' rule: a stage gets layers // pp + its offset, the offsets summing to the
    remainder (model.model_config.offset)."""
    m, L = cfg.model, cfg.model.layers
    if L < pp:
        return []
    per_layer = sum(sum(layer_ops(m, i).values()) for i in range(L)) / L
    extra = [0.0] * pp
    extra[-1] = head_flops(m) / per_layer
    target = (L + sum(extra)) / pp
    want = [max(1.0, target - e) for e in extra]
    layers = [int(w) for w in want]
    order = sorted(range(pp), key=lambda k: want[k] - layers[k], reverse=True)
    k = 0
    while sum(layers) < L:                      # the largest remainders first, then round-robin
        layers[order[k % pp]] += 1
        k += 1
    while sum(layers) > L:
        j = max(range(pp), key=lambda q: layers[q] - want[q])
        layers[j] -= 1
    base = L // pp
    balanced = [n - base for n in layers]
    out = [0]
    if any(balanced) and sum(balanced) == L % pp and balanced != [0] * pp:
        out.append(balanced)
    return out


def _distance(a: Config, b: Config) -> int:
    """How many layout knobs differ between two configs: the degrees, the batch split, sequence parallel, the
    parallel optimizer, recompute (full and selective, each one knob) and the stage split (offset)."""
    x, y = a.layout, b.layout
    knobs = ("dp", "tp", "pp", "vpp", "cp", "ep", "batch", "n_micro", "seq_parallel", "parallel_optimizer",
             "full_recompute", "select_ops", "stage_layers")
    return sum(getattr(x, k) != getattr(y, k) for k in knobs)


def better_layouts(cfg: Config, hw: DoctorHardware, *, devices: int | None = None, top: int = 5,
                   calib: Any = None, global_batch: int | None = None, rank_by: str = "speed") -> list[dict]:
    """The `top` fitting variants by predicted tokens/s/p, same devices and global batch (or the ones given).

    Searched: dp x mp x pp on the devices (mp dividing the heads, pp the layers), the micro-batch size
    (1, 2, 4) with micro_batch_num or gradient accumulation making up the global batch, sequence parallel
    (with mp > 1), the parallel optimizer (static dialects; 2.x always shards with FSDP), and recompute: none,
    select_recompute (SiLU/Mul), full, and per stage the fewest fully recomputed layers (the rest
    SiLU/Mul-selective) that fit the budget.
    Offsets (static dialects, no interleaving): the file's own, 0, and the split that evens the stages' compute
    (`_offsets`); per-stage recompute is searched on each.
    `rank_by`: "speed" (fastest first) or "change" (fewest layout knobs changed first, then fastest: the smallest
    change that fits, for a config that does not).
    Rows: rank, layout, tokens_per_s_per_device, step_s, memory_GiB, fits, changes (dotted YAML keys), knobs
    (layout knobs changed), notes (an expert shard that moves with dp), and config: the variant, whose `raw` is
    its edited file.
    Taught in: no notebook; doctor/__init__.py, doctor/cli.py, doctor/diagnosis.py call it.
    """
    if rank_by not in ("speed", "change"):
        raise DoctorError("rank_by", rank_by, "'speed' or 'change'")
    return _ranked(cfg, _candidates(cfg, hw, devices=devices, calib=calib, global_batch=global_batch), rank_by, top)


def _candidates(cfg: Config, hw: DoctorHardware, *, devices: int | None, calib: Any,
                global_batch: int | None) -> list[dict]:
    """Every searched variant, priced: rows of cfg, kw (the static keys), tokens_per_s_per_device, step_s,
    memory_bytes, fits (better_layouts' docstring says what is searched)."""
    devices = devices or cfg.layout.devices
    B = global_batch or cfg.layout.global_batch // cfg.layout.interleave
    budget = cfg.budget_bytes
    seen, rows = set(), []

    def consider(c: Config, kw: dict):
        x = c.layout
        key = (x.dp, x.tp, x.pp, x.ep, x.micro, x.batch, x.grad_accum, x.seq_parallel, x.parallel_optimizer,
               x.full_recompute, tuple(tuple(sorted(s)) for s in x.select_ops), x.stage_layers)
        if key in seen:
            return
        seen.add(key)
        e = memory_per_stage(c)
        st = step_time(c, hw, calib)
        rows.append({"cfg": c, "kw": kw, "tokens_per_s_per_device": st["tokens_per_s_per_device"],
                     "step_s": st["step_s"], "memory_bytes": e["memory_per_device_bytes"],
                     "fits": bool(e["fits"]) if e["fits"] is not None else True})

    def price(kw: dict, pp: int) -> None:
        """Every recompute choice of one layout: none, selective, full, and per stage the fewest full layers that
        fit (the rest SiLU/Mul-selective)."""
        recomputes = [dict(recompute=False, select_recompute=False), dict(recompute=False, select_recompute=True),
                      dict(recompute=True, select_recompute=False)]
        try:
            variants = [layout_variant(cfg, **kw, **r) for r in recomputes]
        except DoctorError:
            return
        for v, r in zip(variants, recomputes):
            consider(v, dict(kw, **r))
        if budget is None:
            return
        layers = list(variants[0].layout.stage_layers)
        counts: list[int] = []
        for i in range(pp):
            lo, hi = 0, layers[i]
            while lo < hi:
                mid = (lo + hi) // 2
                trial = layout_variant(cfg, **kw, recompute=[layers[j] if j > i else (mid if j == i else counts[j])
                                                            for j in range(pp)], select_recompute=True)
                # the same test as memory_per_stage's "fits", stage by stage: the stage and the reserve within the
                # budget (only stage i is priced: the others do not change the answer)
                fits = stage_memory_bytes(trial, i) + reserve_bytes(trial) <= budget
                lo, hi = (lo, mid) if fits else (mid + 1, hi)
            counts.append(lo)
        if 0 < sum(counts) < sum(layers):
            r = dict(recompute=counts if pp > 1 else counts[0], select_recompute=True)
            consider(layout_variant(cfg, **kw, **r), dict(kw, **r))

    cp, ep = cfg.layout.cp, cfg.layout.ep
    m = cfg.model
    for mp in _divisors(devices // cp):
        if m.heads % mp or (m.kv_heads % mp and mp % m.kv_heads) or m.ffn % mp or mp > 8:
            continue
        for pp in _divisors(devices // (cp * mp)):
            if pp > m.layers or (m.layers % pp and pp > 1 and m.layers // pp < 2):
                continue
            dp = devices // (cp * mp * pp)
            for b in (1, 2, 4):
                if B % (dp * b):
                    continue
                rest = B // (dp * b)
                if pp > 1 and rest < pp:
                    continue
                base = dict(data_parallel=dp, model_parallel=mp, pipeline_stage=pp, batch_size=b,
                            micro_batch_num=rest if pp > 1 else 1,
                            gradient_accumulation_steps=1 if pp > 1 else rest)
                if pp != cfg.layout.pp:
                    base["offset"] = 0
                    if cfg.layout.vpp > 1:
                        base["pp_interleave_num"] = 1
                splits = [{}]           # the file's own stage split, then the offsets that balance the stages
                if pp > 1 and cfg.dialect != "pynative" and (pp != cfg.layout.pp or cfg.layout.vpp == 1):
                    splits = [{}] + [{"offset": o} for o in _offsets(cfg, pp) if o != base.get("offset")]
                if cfg.model.moe is not None and (dp * mp) % ep:
                    base["expert_parallel"] = math.gcd(ep, dp * mp)
                for sp in ([True, False] if mp > 1 else [False]):
                    for po in ((True,) if cfg.dialect == "pynative" else (True, False)):
                        for split in splits:
                            price(dict(base, use_seq_parallel=sp, enable_parallel_optimizer=po, **split), pp)
    return rows


def layout_answers(cfg: Config, hw: DoctorHardware, *, calib: Any = None, top: int = 5,
                   current_tokens_per_s: float | None = None) -> dict[str, list[dict]]:
    """One search, three answers: "fastest" (the top layouts by speed), "smallest" (the fewest knobs changed that
    fit, then fastest) and "smallest_gain" (the fewest knobs changed that predict more than +0.5 % over
    `current_tokens_per_s`, then fastest).
    Taught in: no notebook; doctor/__init__.py, doctor/diagnosis.py call it."""
    rows = _candidates(cfg, hw, devices=cfg.layout.devices, calib=calib, global_batch=None)
    out = {"fastest": _ranked(cfg, rows, "speed", top), "smallest": _ranked(cfg, rows, "change", 1)}
    if current_tokens_per_s:
        faster = [r for r in rows if r["tokens_per_s_per_device"] > 1.005 * current_tokens_per_s]
        out["smallest_gain"] = _ranked(cfg, faster, "change", 1)
    return out


def _ranked(cfg: Config, rows: list[dict], rank_by: str, top: int) -> list[dict]:
    speed = lambda r: (-round(r["tokens_per_s_per_device"]), r["memory_bytes"])     # noqa: E731
    order = speed if rank_by == "speed" else lambda r: (_distance(cfg, r["cfg"]), *speed(r))
    fit = sorted((r for r in rows if r["fits"]), key=order)
    out, names = [], set()
    for r in fit:
        c = r["cfg"]
        name = layout_name(c)
        if name in names:           # the same layout with a recompute variant that costs the same: keep the leaner
            continue
        names.add(name)
        if len(out) == top:
            break
        yaml = edited_yaml(cfg, **r["kw"])          # the file of a returned layout only: its changes, for --out
        out.append({"rank": len(out) + 1, "layout": name,
                    "tokens_per_s_per_device": round(r["tokens_per_s_per_device"]), "step_s": round(r["step_s"], 3),
                    "memory_GiB": round(r["memory_bytes"] / 2**30, 2), "fits": r["fits"],
                    "changes": {k: v[1] for k, v in changed_keys(cfg.raw, yaml).items()
                                if not _noop(cfg.raw, k, v[1])},
                    "knobs": _distance(cfg, c), "notes": _shard_notes(cfg, c),
                    "config": dataclasses.replace(c, raw=yaml)})
    return out


# What mindformers takes for a key the file leaves out (RunnerConfig, TransformerOpParallelConfig,
# TransformerRecomputeConfig and the auto-parallel context's defaults): writing it would change nothing.
_ABSENT_MEANS = {"gradient_accumulation_steps": 1, "micro_batch_num": 1, "expert_parallel": 1, "context_parallel": 1,
                 "use_seq_parallel": False, "select_recompute": False, "recompute": False, "offset": 0,
                 "enable_parallel_optimizer": False, "pp_interleave_num": 1}


def _noop(raw: dict, dotted: str, new: Any) -> bool:
    """A change that only spells out, in a key the file leaves out, the value mindformers already takes."""
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            last = dotted.rsplit(".", 1)[-1]
            return last in _ABSENT_MEANS and new == _ABSENT_MEANS[last]
        node = node[part]
    return False


def _shard_notes(old: Config, new: Config) -> list[str]:
    """What a layout change moves that its keys do not name: the expert shard min(ep x tp, dp x tp)."""
    if old.model.moe is None or expert_shard(old) == expert_shard(new):
        return []
    a, b = old.layout, new.layout
    return [f"expert shard {expert_shard(old)} -> {expert_shard(new)} (min(ep x tp, dp x tp) = min({b.ep} x {b.tp}, "
            f"{b.dp} x {b.tp}), was min({a.ep} x {a.tp}, {a.dp} x {a.tp})): each expert's weights split over "
            f"{expert_shard(new)} ranks instead of {expert_shard(old)}"]


# ---------------------------------------------------------------- a config that cannot fit as shipped
_RULES = {
    "pynative": ("training.global_batch_size", "global_batch_size must be divisible by data_parallel x "
                 "local_batch_size, so it caps the data-parallel ranks (mindformers/pynative/trainer/trainer.py, "
                 "Trainer, mindformers 2.1.0)"),
    "static": ("parallel_config", "data_parallel x model_parallel x context_parallel x pipeline_stage must equal "
               "the device count (mindformers/tools/check_rules.py, _check_parallel)"),
}


def as_shipped_limit(cfg: Config) -> str:
    """Why a config's own file pins its scale, in one line: the key, its value and mindformers' rule.
    Taught in: no notebook; doctor/__init__.py, doctor/diagnosis.py call it."""
    lay = cfg.layout
    if cfg.dialect == "pynative":
        key, rule = _RULES["pynative"]
        return (f"{key}={lay.global_batch} with local_batch_size {lay.batch}: {rule}; at most "
                f"{lay.global_batch // lay.batch} data-parallel ranks")
    key, rule = _RULES["static"]
    return (f"{key}: dp {lay.dp} x mp {lay.tp} x cp {lay.cp} x pp {lay.pp} = {lay.devices} devices: {rule}")


def smallest_fitting_scale(cfg: Config, hw: DoctorHardware, *, calib: Any = None,
                           max_devices: int = 4096) -> dict | None:
    """The fewest devices (whole nodes, doubling from the config's own count), then the smallest global batch (a
    multiple of the config's, doubling), at which the search finds a layout that fits; with that layout's row.
    None when nothing fits up to `max_devices`.
    Taught in: no notebook; doctor/__init__.py, doctor/diagnosis.py call it."""
    if not (isinstance(max_devices, int) and not isinstance(max_devices, bool) and max_devices > 0):
        raise DoctorError("max_devices", max_devices, "a positive integer: the largest device count to try")
    B = cfg.layout.global_batch // cfg.layout.interleave
    n = max(cfg.layout.devices, hw.devices_per_node)
    while n <= max_devices:
        # the largest batch tried first at each scale: dp can then take every rank; then the smallest that fits
        top_b = B * max(1, -(-n // B))
        at_top = better_layouts(cfg, hw, devices=n, calib=calib, global_batch=top_b, top=1)
        if at_top:
            b = B
            while b < top_b:
                rows = better_layouts(cfg, hw, devices=n, calib=calib, global_batch=b, top=1)
                if rows:
                    return {"devices": n, "global_batch": b, "row": rows[0]}
                b *= 2
            return {"devices": n, "global_batch": top_b, "row": at_top[0]}
        n *= 2
    return None
