"""Variants of a read config: the same model on another layout, and, for the one that is written out, its file.

`layout_variant` builds the new `Layout` from the parsed one with dataclasses.replace, splitting and checking
it with the reader's own rules (layouts.py); it never edits or reads a YAML, so the search prices thousands of
them cheaply. `edited_yaml` writes a variant's keys into a copy of the parsed file in the file's own dialect,
once per layout the search returns (the changes it lists, and the YAML --out writes). readers.with_layout
reads that file again: tests/doctor/test_search.py checks that a variant prices exactly like it.
Keys are mindformers' static names (parallel_config's, runner_config's, recompute_config's), any dialect.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from .describe import Config, DoctorError
from .layouts import (_count, _per_stage, _select_ops, checked, full_counts_2x, layer_ranges, pynative_chunks,
                      pynative_recompute, select_module_2x, stage_split)


def _per_chunk(value: Any) -> bool:
    """A recompute value given per VPP chunk (a list of per-stage lists), or a select mapping holding one."""
    if isinstance(value, dict):
        return any(_per_chunk(v) for v in value.values())
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, (list, tuple)) for v in value)


def layout_variant(cfg: Config, **changes) -> Config:
    """`cfg` on another layout: the keys of `changes` (the names `with_layout` takes) applied to the parsed
    Layout as mindformers' reader would apply them to the file. Changing the stage split (pipeline_stage,
    pp_interleave_num, offset) re-splits the layers with the reader's stage_split, and the file's recompute
    entries (`Config.asked`) with it unless recompute= is given; recompute and select_recompute go together. A
    switch the parsed Layout cannot show (use_seq_parallel at model_parallel 1, the parallel optimizer at dp x
    cp = 1) is the file's own, from `Config.asked`. The result's `raw` is {}: a variant has no file until
    edited_yaml writes one.
    Taught in: no notebook; doctor/__init__.py, doctor/adapt.py, doctor/describe.py call it."""
    unknown = sorted(set(changes) - set(_STATIC_KEYS))
    if unknown:
        raise DoctorError(unknown[0], changes[unknown[0]], f"one of {', '.join(_STATIC_KEYS)}")
    lay, m, pyn = cfg.layout, cfg.model, cfg.dialect == "pynative"

    def count(key: str, default: int) -> int:
        return _count(changes[key], key, strict=True) if key in changes else default

    dp, tp, pp, ep, batch = (count(k, v) for k, v in (("data_parallel", lay.dp), ("model_parallel", lay.tp),
                                                      ("pipeline_stage", lay.pp), ("expert_parallel", lay.ep),
                                                      ("batch_size", lay.batch)))
    vpp = count("pp_interleave_num", lay.vpp)
    if not pyn and vpp > 1 and lay.vpp == 1:
        raise DoctorError("pp_interleave_num", vpp, "1, or vary it on a file that sets parallel.pipeline_config."
                          "pipeline_interleave: True (without it mindformers uses 1; the parsed Layout cannot tell)")
    if pyn:                 # 2.x has one count: global_batch_size / (local x dp), micro-batches when pp > 1
        n = count("micro_batch_num", lay.micro) if pp > 1 else count("gradient_accumulation_steps", lay.grad_accum)
        micro, ga = (n, 1) if pp > 1 else (1, n)
        if pp > 1 and n < pp:
            raise DoctorError("micro_batch_num", n, f"at least pipeline_stage={pp} (one micro-batch per stage)")
    else:
        micro, ga = count("micro_batch_num", lay.micro), count("gradient_accumulation_steps", lay.grad_accum)
    notes: list[str] = []
    resplit = (pp, vpp) != (lay.pp, lay.vpp) or ("offset" in changes and not pyn)
    if resplit and pyn:     # a new split drops the file's intervals (edited_yaml writes "auto")
        chunks = stage_split(m.layers, pp, vpp, 0, "parallelism.pipeline_parallel_layers_per_stage", notes)
    elif resplit:
        if "offset" not in changes:
            raise DoctorError("offset", None, "give offset= (e.g. 0) with a new pipeline_stage or pp_interleave_num: "
                              "the file's offsets were for its own stages")
        chunks = stage_split(m.layers, pp, vpp, changes["offset"], "model.model_config.offset", notes)
    else:                   # the parsed split; per-stage totals are all recompute counts need (not per chunk)
        chunks = [list(lay.stage_layers)] + [[0] * pp for _ in range(vpp - 1)]
    stage = [sum(c[s] for c in chunks) for s in range(pp)]
    asked = cfg.asked
    if ("recompute" in changes) != ("select_recompute" in changes) or resplit and "recompute" not in changes \
            and "recompute" not in asked:
        raise DoctorError("select_recompute" if "recompute" in changes else "recompute", None,
                          "give recompute= and select_recompute= together, and with any new stage split")
    if resplit and "recompute" not in changes:     # the file's recompute entries on the new split, as its reader
        if pyn:
            full, ops = pynative_recompute(asked["recompute"], m.layers, chunks)
        else:
            full = _per_stage(asked["recompute"], chunks, "recompute_config.recompute")
            ops = _select_ops(asked["select_recompute"], chunks, full, "recompute_config.select_recompute")
    elif "recompute" in changes:
        rc, sel = changes["recompute"], changes["select_recompute"]
        if not resplit and vpp > 1 and (_per_chunk(rc) or _per_chunk(sel)):
            raise DoctorError("recompute", rc, "per-stage counts: per-chunk lists need the file's chunks "
                              "(readers.with_layout reads them)")
        if pyn:             # one mode: full recompute wins, else select (RecomputeConfig.mode)
            full = full_counts_2x(rc, stage, "recompute")
            module = select_module_2x(sel, "select_recompute") if sel and not sum(full) else {}
            if any(v not in (True, None) for v in module.values()):
                raise DoctorError("select_recompute", sel, "True, module patterns, or patterns -> True (layer "
                                  "ranges need the file: readers.with_layout)")
            ops = [tuple((p, n) for p in module) if n else () for n in stage]
        else:
            full = _per_stage(rc, chunks, "recompute_config.recompute")
            ops = _select_ops(sel, chunks, full, "recompute_config.select_recompute")
    else:
        full, ops = list(lay.full_recompute), list(lay.select_ops)
    # a switch the file sets but the layout cannot show (sequence parallel at tp 1, the parallel optimizer at
    # dp x cp 1) is the file's own (Config.asked); a Config made without a file falls back on what its layout shows
    want_sp = changes.get("use_seq_parallel", asked.get("use_seq_parallel", lay.seq_parallel if lay.tp > 1 else None))
    if want_sp is None and tp > 1:
        raise DoctorError("use_seq_parallel", None, f"give it with model_parallel={tp}: at model_parallel 1 the "
                          "parsed Layout keeps no sequence-parallel flag, and this Config has no file's")
    sp = bool(want_sp) and tp > 1
    shard = dp * lay.cp > 1             # the parallel optimizer and FSDP shard over dp x cp
    if pyn:
        if not changes.get("enable_parallel_optimizer", True):
            raise DoctorError("enable_parallel_optimizer", changes["enable_parallel_optimizer"], "True: a 2.x PyNative "
                              "run shards with FSDP over dp x cp (mindformers 2.1.0 reads no switch for it)")
        opt = "fsdp" if shard else "none"
    else:
        want_po = changes.get("enable_parallel_optimizer", asked.get(
            "enable_parallel_optimizer", lay.optimizer_shard != "none" if lay.dp * lay.cp > 1 else None))
        if want_po is None and shard:
            raise DoctorError("enable_parallel_optimizer", None, f"give it with data_parallel={dp}: at dp x cp = 1 "
                              "the parsed Layout keeps no parallel-optimizer flag, and this Config has no file's")
        opt = "po" if want_po and shard else "none"
    # a file's schedule is interleaved exactly when pp_interleave_num > 1 (the reader's rule); kept otherwise
    sched = lay.schedule if vpp == lay.vpp else "interleaved" if vpp > 1 else "1f1b"
    new = dataclasses.replace(lay, dp=dp, tp=tp, pp=pp, ep=ep, vpp=vpp, micro=micro, batch=batch, grad_accum=ga,
                              schedule=sched,
                              seq_parallel=sp, optimizer_shard=opt, stage_layers=tuple(stage),
                              full_recompute=tuple(full), select_ops=tuple(ops))
    kept = {k: changes[k] for k in ("use_seq_parallel", "enable_parallel_optimizer", "recompute", "select_recompute")
            if k in changes and not (pyn and k in ("recompute", "select_recompute"))}
    if pyn and "recompute" in changes:  # a 2.x file's recompute section is rewritten (edited_yaml): not kept here
        asked = {k: v for k, v in asked.items() if k != "recompute"}
    return checked(dataclasses.replace(cfg, layout=new, raw={}, asked={**asked, **kept}, notes=cfg.notes + tuple(
        n for n in notes if n not in cfg.notes)))


# ---------------------------------------------------------------- a variant's file (written once, for --out)
_STATIC_KEYS = {"data_parallel": ("parallel_config",), "model_parallel": ("parallel_config",),
                "pipeline_stage": ("parallel_config",), "micro_batch_num": ("parallel_config",),
                "use_seq_parallel": ("parallel_config",), "expert_parallel": ("parallel_config",),
                "batch_size": ("runner_config",), "gradient_accumulation_steps": ("runner_config",),
                "recompute": ("recompute_config",), "select_recompute": ("recompute_config",),
                "enable_parallel_optimizer": ("parallel",), "offset": ("model", "model_config"),
                "pp_interleave_num": ("model", "model_config")}
_PYNATIVE_KEYS = {"model_parallel": "tensor_parallel", "pipeline_stage": "pipeline_parallel",
                  "use_seq_parallel": "sequence_parallel", "expert_parallel": "expert_parallel",
                  "pp_interleave_num": "pipeline_parallel_interleave_num"}


def _node(parent: dict, key: str) -> dict:
    """parent[key] as a mapping to write into: a section that is absent or null in the file becomes {}."""
    if not isinstance(parent.get(key), dict):
        parent[key] = {}
    return parent[key]


def edited_yaml(cfg: Config, **kw) -> dict:
    """A variant's file: `cfg.raw` with the keys of `kw` (mindformers' static names, the keys of _STATIC_KEYS)
    written in the file's own dialect; `cfg.raw` is left as it was. For writing a file and for `with_layout`:
    the search varies the Layout (variants.layout_variant) and calls this once per row it returns.
    Taught in: no notebook; doctor/__init__.py, doctor/readers.py, doctor/search.py call it."""
    unknown = sorted(set(kw) - set(_STATIC_KEYS))
    if unknown:
        raise DoctorError(unknown[0], kw[unknown[0]], f"one of {', '.join(_STATIC_KEYS)} (mindformers' static names)")
    # copy only the sections a variant may edit (the dataset and callbacks sections are shared, read-only)
    d = dict(cfg.raw)
    for sect in ("parallel_config", "runner_config", "recompute_config", "parallel", "model", "parallelism",
                 "training", "recompute"):
        if sect in d:
            d[sect] = copy.deepcopy(d[sect])
    if cfg.dialect == "pynative":
        _edit_pynative(d, cfg, kw)
        return d
    for k, v in kw.items():
        node = d
        for p in _STATIC_KEYS[k]:
            node = _node(node, p)
        node[k] = v
    return d


def _edit_pynative(d: dict, cfg: Config, kw: dict) -> None:
    """The static names of `kw` onto a 2.x file's parallelism / training / recompute sections."""
    if not kw.get("enable_parallel_optimizer", True):
        raise DoctorError("enable_parallel_optimizer", kw["enable_parallel_optimizer"], "True: a 2.x PyNative run "
                          "shards with FSDP over dp x cp (mindformers 2.1.0 reads no switch for it)")
    par, tr, lay = _node(d, "parallelism"), _node(d, "training"), cfg.layout
    for k, name in _PYNATIVE_KEYS.items():
        if k in kw:
            par[name] = kw[k]
    dp, pp, vpp, b = (_count(kw.get(k, v), k, strict=True) for k, v in (
        ("data_parallel", lay.dp), ("pipeline_stage", lay.pp), ("pp_interleave_num", lay.vpp),
        ("batch_size", lay.batch)))
    n_key = "micro_batch_num" if pp > 1 else "gradient_accumulation_steps"
    n = _count(kw.get(n_key, lay.micro if pp > 1 else lay.grad_accum), n_key, strict=True)
    if (pp, vpp) != (lay.pp, lay.vpp):
        par["pipeline_parallel_layers_per_stage"] = "auto"        # its intervals were the old stages'
    par["data_parallel_shard"] = dp
    tr["local_batch_size"] = b
    tr["global_batch_size"] = b * dp * n
    if "recompute" not in kw and "select_recompute" not in kw:
        return
    rc = _node(d, "recompute")
    mode = rc.get("mode")
    chunks = pynative_chunks(par, cfg.model.layers, pp, vpp, [])
    if "recompute" in kw:
        counts = full_counts_2x(kw["recompute"], [sum(c[s] for c in chunks) for s in range(pp)], "recompute")
        full = True if kw["recompute"] is True else layer_ranges(counts, chunks) if sum(counts) else None
    else:
        kept = rc.get("full_recompute_layer")
        full = None if mode != "full" else True if kept is None else kept
    sel = kw["select_recompute"] if "select_recompute" in kw else rc.get("select_module") if mode == "select" else None
    rc.pop("full_recompute_layer", None)
    rc.pop("select_module", None)
    if full:                # 2.x recomputes one way: RecomputeConfig.mode is 'full' or 'select', not both
        rc.update(mode="full", full_recompute_layer=full)
    elif sel:
        rc.update(mode="select", select_module=select_module_2x(sel, "select_recompute"))
    else:
        rc["mode"] = "None"


