"""The report: the verdict, the tables, the pictures, and the improved YAML."""
from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import replace
from typing import Any

from .calibration import CALIBRATION, Calibration
from .cost import TERMS, expert_shard, memory_per_stage, memory_reserve, mtp_params, param_count, step_time, with_reserve
from .describe import EXPECTED_ERROR, DoctorError
from .profiles import hardware
from .readers import read_config
from .yamledit import YamlEditError, edit_yaml_text, follow_derived, load_text
from .search import as_shipped_limit, better_layouts, layout_answers, layout_name, smallest_fitting_scale

def diagnose(path_or_dict: Any, hardware_name: str = "atlas-800t-a2", devices: int | None = None,
             budget: Any = None, calib: Calibration = CALIBRATION, search: bool = True,
             model_config: Any = None, release: Any = None, moe_imbalance: Any = None,
             mc2: bool = False, doc_len: Any = None) -> dict[str, Any]:
    """Everything the CLI prints, as a dict: config, memory, step terms, MFU, layouts, verdict. `mc2`: TP's
    collectives fused into their matmuls (MC2) though the file cannot say so (a static-graph file has no key; a
    2.x file's parallelism.enable_mc2 already does). `doc_len`: the packed documents' mean length in tokens,
    when the file confines attention to them (use_eod_attn_mask_compression or the dataset's
    create_compressed_eod_mask; without it, one document per sequence is priced). `release`: the
    mindformers release the file runs on (read_config's), None for the newest. `devices` other than the file's
    own count: the file's layout cannot run there, so the figures are the fastest layout that fits on `devices`
    (same model and global batch), and the verdict says so.
    Taught in notebooks/06_recompute_memory.ipynb."""
    hw = hardware(hardware_name)
    if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool) or devices <= 0):
        raise DoctorError("--devices", devices, "a positive integer")
    cfg = read_config(path_or_dict, budget=budget, model_config=model_config, devices=devices, release=release)
    if moe_imbalance is not None:
        if isinstance(moe_imbalance, bool) or not isinstance(moe_imbalance, (int, float)) \
                or not math.isfinite(moe_imbalance) or not 0 <= moe_imbalance <= 100:
            raise DoctorError("--moe-imbalance", moe_imbalance, "a number from 0 (as balanced as chance) up, e.g. 0.3")
        if cfg.model.moe is None:
            raise DoctorError("--moe-imbalance", moe_imbalance, "leave it out: the model has no MoE layers")
        cfg = replace(cfg, model=replace(cfg.model, moe=replace(cfg.model.moe, imbalance=float(moe_imbalance))))
    m = cfg.model
    if doc_len is not None:
        if isinstance(doc_len, bool) or not isinstance(doc_len, int) or not 1 <= doc_len <= m.seq:
            raise DoctorError("--doc-len", doc_len, f"a whole number of tokens from 1 to the sequence length {m.seq}")
        if not m.eod:
            raise DoctorError("--doc-len", doc_len, "leave it out: the file does not confine attention to documents "
                              "(use_eod_attn_mask_compression and the dataset's create_compressed_eod_mask are off)")
        cfg = replace(cfg, model=replace(m, doc_len=doc_len))
    if m.eod and m.flash and cfg.layout.ring:
        cfg = replace(cfg, notes=cfg.notes + ("attention is confined to packed documents (EOD masks), but mindformers "
                                              "drops them under ring attention: priced causal over the whole sequence",))
    elif m.eod and m.flash and doc_len is None:
        cfg = replace(cfg, notes=cfg.notes + ("attention is confined to packed documents (EOD masks): priced as one "
                                              "document per sequence, the most pairs; --doc-len gives their mean "
                                              "length",))
    if not isinstance(mc2, bool):          # 1 == True: a membership test would let 1 and 0 through
        raise DoctorError("--mc2", mc2, "True or False")
    if mc2 and not cfg.mc2:                 # a 2.x file that says enable_mc2 has its own note from the reader
        cfg = replace(cfg, mc2=True)
        if not (cfg.layout.seq_parallel and cfg.layout.tp > 1):
            cfg = replace(cfg, notes=cfg.notes + (
                f"--mc2: MC2 fuses the sequence-parallel all-gather and reduce-scatter, and this layout has none "
                f"(tensor parallel {cfg.layout.tp}, sequence parallel {'on' if cfg.layout.seq_parallel else 'off'}): "
                "TP priced unfused",))
    if cfg.budget_bytes is None:
        cfg = replace(cfg, budget_bytes=int(hw.memory_bytes))
    cfg = with_reserve(cfg, hw)
    moved = None
    if devices is not None and devices != cfg.layout.devices:
        # the file's own layout needs cfg.devices: search the layouts of the same model and batch on `devices`
        rows = better_layouts(cfg, hw, devices=devices, calib=calib)
        if not rows:
            lay = cfg.layout
            raise DoctorError("--devices", devices, f"a device count with a layout that fits: the file's "
                              f"dp*tp*pp*cp = {lay.dp}*{lay.tp}*{lay.pp}*{lay.cp} = {lay.devices}, and no layout "
                              f"of global batch {lay.global_batch} fits on {devices} (tp*pp*cp is "
                              f"{lay.tp * lay.pp * lay.cp} in the file)")
        moved = {"from_devices": cfg.layout.devices, "from_layout": layout_name(cfg), "changes": rows[0]["changes"],
                 "layout": rows[0]["layout"]}
        cfg = replace(rows[0]["config"], key_flags=cfg.key_flags, notes=cfg.notes)
    mem = memory_per_stage(cfg)
    st = step_time(cfg, hw, calib)
    reserve = memory_reserve(cfg, hw)
    fits = bool(mem["fits"])
    answers = layout_answers(cfg, hw, calib=calib, current_tokens_per_s=st["tokens_per_s_per_device"]) \
        if search else {}
    layouts = answers.get("fastest", [])
    smallest = answers.get("smallest", []) if not fits else []
    best = layouts[0] if layouts else None
    gain = best["tokens_per_s_per_device"] / st["tokens_per_s_per_device"] - 1 if best else 0.0
    small_gain = answers.get("smallest_gain", []) if fits else []
    G = 2**30
    band = expected_error(cfg, hw)
    verdict = (f"{'FITS' if fits else 'DOES NOT FIT'}: largest stage {mem['memory_per_device_bytes'] / G:.1f} GiB "
               f"against {mem['budget_bytes'] / G:.1f} GiB (headroom {mem['headroom_bytes'] / G:+.1f} GiB); "
               f"predicted {st['tokens_per_s_per_device']:.0f} tokens/s/p{band['text']}, MFU {st['mfu_6n']:.1%} (6N) "
               f"on {hw.name}")
    both = release_pair(path_or_dict, cfg, hw, calib, budget, model_config, release) if devices is None else None
    if both:
        verdict += f"; {both['text']}"
    if moved:
        verdict = (f"ON {devices} DEVICES (the file's layout {moved['from_layout']} needs {moved['from_devices']}), "
                   f"the fastest layout that fits, {moved['layout']} ({_short(moved['changes'])}): " + verdict)
    if not fits:
        term, size = dominant_term(mem)
        verdict += f"; the largest term is {term}, {size / G:.1f} GiB"
    if not search:
        verdict += "; layout search skipped"
    elif smallest:
        sm = smallest[0]
        verdict += (f"; smallest change that fits: {sm['layout']} ({_short(sm['changes'])}) predicted "
                    f"{sm['tokens_per_s_per_device']} tokens/s/p")
        if best and best["layout"] != sm["layout"]:
            verdict += (f"; fastest that fits: {best['layout']} ({_short(best['changes'])}) predicted "
                        f"{best['tokens_per_s_per_device']} tokens/s/p")
    elif best and gain > 0.005:
        verdict += f"; best change: {best['layout']} ({_short(best['changes'])}) predicted {gain:+.1%}"
        sg = small_gain[0] if small_gain else None
        if sg and sg["layout"] != best["layout"] and sg["knobs"] < best["knobs"]:
            g = sg["tokens_per_s_per_device"] / st["tokens_per_s_per_device"] - 1
            verdict += f"; smallest change that gains: {_short(sg['changes'])} ({sg['knobs']} knob(s)) predicted {g:+.1%}"
    elif best:
        verdict += "; no searched change predicts more than +0.5%"
    else:
        verdict += "; no searched layout fits"
    if cfg.key_flags:
        verdict = (f"CHECK THE FILE FIRST: {len(cfg.key_flags)} key(s) the doctor could not use "
                   f"({'; '.join(f['text'] for f in cfg.key_flags[:2])}{'; ...' if len(cfg.key_flags) > 2 else ''}). "
                   + verdict)
    scale = None
    if search and not fits and not layouts:
        # nothing fits on the file's own devices and batch: say which key pins them, and the smallest scale that fits
        scale = smallest_fitting_scale(cfg, hw, calib=calib)
        limit = as_shipped_limit(cfg)
        if scale is None:
            verdict += f". As shipped: {limit}; nothing fits up to 4096 devices"
        else:
            row = scale["row"]
            st2 = step_time(row["config"], hw, calib)
            verdict += (f". As shipped: {limit}. It fits from {scale['devices']} devices at global batch "
                        f"{scale['global_batch']}: {row['layout']}, predicted {row['tokens_per_s_per_device']} "
                        f"tokens/s/p, MFU {st2['mfu_6n']:.1%} (6N)")
    ctx_mem = (cfg.raw.get("context") or {}).get("max_device_memory") if isinstance(cfg.raw.get("context"), dict) \
        else None
    given = budget if budget is not None else ctx_mem
    if given is None:
        budget_source = f"the device memory of {hw.name}"
    else:
        where = "--budget" if budget is not None else "context.max_device_memory"
        budget_source = f"{where} {given!r}" + (", read as GiB (MindSpore counts its GB as 2^30 bytes: "
                                                 "mindspore/context.py, max_device_memory)"
                                                 if isinstance(given, str) and "gb" in given.lower() else "")
    return {"config": cfg, "hardware": hw, "memory": mem, "step": st, "layouts": layouts, "verdict": verdict,
            "fits": fits, "best_gain": gain, "calibration": calib, "scale": scale, "smallest": smallest,
            "smallest_gain": small_gain, "reserve": reserve,
            "moved": moved, "budget_source": budget_source, "expected_error": band, "release_pair": both}


def expected_error(cfg: Any, hw: Any) -> dict:
    """The error band a prediction carries: leave-one-family-out on mindformers' cards (describe.EXPECTED_ERROR),
    dense or MoE as the model is. None on hardware the cards were not published on (the CPU: its own check).
    Taught with the rest of doctor/diagnosis.py in notebooks/12_your_config.ipynb."""
    if not getattr(hw, "device_pool", True):
        return {"kind": None, "text": ""}
    kind = "moe" if cfg.model.moe is not None else "dense"
    e = EXPECTED_ERROR[kind]
    return dict(e, kind=kind, text=f" (expected error +/-{e['median_abs_error']:.0%} typical, 4 in 5 within "
                                   f"+/-{e['p80_abs_error']:.0%}: leave-one-family-out on {e['rows']} {kind} rows)")


# The mindformers releases whose code prices some files differently (readers._at_release): r1.x MoE before
# r1.5.0 routes every tp rank's whole slice. A file priced without --release gets both figures when they differ.
RELEASE_SPLIT = ((1, 4, 0), (1, 5, 0))


def release_pair(path_or_dict: Any, cfg: Any, hw: Any, calib: Any, budget: Any, model_config: Any,
                 release: Any) -> dict | None:
    """The file's price on each side of a release split, when the user gave no release and the two differ.
    Taught with the rest of doctor/diagnosis.py in notebooks/12_your_config.ipynb."""
    if release not in (None, "", ()) or cfg.release or cfg.dialect != "r1.x" or cfg.model.moe is None:
        return None
    old = read_config(path_or_dict, budget=budget, model_config=model_config, release=RELEASE_SPLIT[0])
    if old.model == cfg.model and old.layout == cfg.layout:
        return None
    if old.budget_bytes is None:
        old = replace(old, budget_bytes=int(hw.memory_bytes))
    a = step_time(with_reserve(old, hw), hw, calib)["tokens_per_s_per_device"]
    b = step_time(cfg, hw, calib)["tokens_per_s_per_device"]
    if abs(a / b - 1) < 0.005:
        return None
    split = "r" + ".".join(map(str, RELEASE_SPLIT[1]))
    return {"before": a, "from": b, "split": split,
            "text": f"the price depends on the mindformers release: {a:.0f} tokens/s/p before {split}, {b:.0f} "
                    f"from {split} on (MoE dispatch under sequence parallel; pass --release to choose)"}


_MEMORY_TERMS = (("params", "parameters"), ("grads", "gradients"), ("optimizer_states", "optimizer states"),
                 ("activations", "activations"))


def dominant_term(mem: dict) -> tuple[str, int]:
    """The largest memory term of the largest stage, as (name, bytes): what an OOM is mostly made of.
    Taught in notebooks/12_your_config.ipynb."""
    i = max(range(len(mem["per_stage_bytes"])), key=lambda k: mem["per_stage_bytes"][k])
    part = mem["per_stage_breakdown"][i]
    key, name = max(_MEMORY_TERMS, key=lambda t: part.get(t[0], 0))
    return f"{name} (stage {i})", int(part.get(key, 0))


def _short(changes: dict, n: int = 4) -> str:
    items = [f"{k.split('.')[-1]}={v}" for k, v in changes.items()]
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def summary_json(r: dict) -> dict:
    """The --json object: the figures, the layout, the step terms, and (with --log) the measured run.
    Taught in: no notebook; doctor/__init__.py, doctor/cli.py call it."""
    st, mem, cfg = r["step"], r["memory"], r["config"]
    out = {"tokens_per_s_per_device": st["tokens_per_s_per_device"], "step_s": st["step_s"],
           "mfu": st["mfu_6n"], "mfu_attention": st["mfu_attention"], "mfu_hardware": st["mfu_hardware"],
           "mfu_computed": st["mfu_computed"], "attention_s": st["attention_s"],
           "n_params": st["n_params"], "n_active_params": st["n_active_params"],
           "memory_per_device_bytes": mem["memory_per_device_bytes"], "per_stage_bytes": mem["per_stage_bytes"],
           "budget_bytes": mem["budget_bytes"], "fits": r["fits"], "dialect": cfg.dialect,
           "layout": {k: v for k, v in cfg.layout_dict().items() if k != "select_recompute"},
           "hardware": r["hardware"].name, "terms_s": {k: st[k] for k, _ in TERMS},
           "best_layout": r["layouts"][0]["layout"] if r["layouts"] else None, "best_gain": r["best_gain"],
           "verdict": r["verdict"], "notes": list(cfg.notes), "groups": comm_groups(st),
           "fits_from": None if not r.get("scale") else {
               "devices": r["scale"]["devices"], "global_batch": r["scale"]["global_batch"],
               "layout": r["scale"]["row"]["layout"],
               "tokens_per_s_per_device": r["scale"]["row"]["tokens_per_s_per_device"]}}
    m = cfg.model
    out.update({
        "layout_name": layout_name(cfg), "expert_shard": expert_shard(cfg) if m.moe is not None else None,
        "layers_per_stage": list(cfg.layout.stage_layers), "full_recompute_per_stage": list(cfg.layout.full_recompute),
        "per_stage_s": list(st["per_stage_s"]), "per_stage_p2p_s": list(st.get("per_stage_p2p_s", [])),
        "bottleneck_stage": st["bottleneck_stage"],
        "per_stage_breakdown_bytes": [dict(p) for p in mem["per_stage_breakdown"]],
        "headroom_bytes": mem["headroom_bytes"], "budget_source": r.get("budget_source"),
        "reserve": r.get("reserve"),
        "dominant_term": None if r["fits"] else dict(zip(("term", "bytes"), dominant_term(mem))),
        "model": {"name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                  "head_dim": m.head_dim, "ffn": m.ffn, "vocab": m.vocab, "seq": m.seq, "attention": m.attention,
                  "moe": None if m.moe is None else {"routed": m.moe.routed, "top_k": m.moe.top_k,
                                                     "expert_ffn": m.moe.expert_ffn, "shared": m.moe.shared,
                                                     "first_dense": m.moe.first_dense},
                  "mtp": m.mtp, "flash_attention": m.flash, "window": m.window, "eod": m.eod, "doc_len": m.doc_len},
        "layouts": [_row_json(x) for x in r["layouts"]],
        "smallest_change": _row_json(r["smallest"][0]) if r.get("smallest") else None,
        "smallest_change_that_gains": _row_json(r["smallest_gain"][0]) if r.get("smallest_gain") else None,
        "moved_to_devices": r.get("moved"),
        "key_flags": [dict(f) for f in cfg.key_flags],
        "peak_flops": st["peak_flops"], "mfu_6n": st["mfu_6n"],
        "moe_imbalance": st.get("moe_imbalance") if m.moe is not None else None,
        "expected_error": {k: v for k, v in r["expected_error"].items() if k != "text"}
        if (r.get("expected_error") or {}).get("kind") else None,
        "release_pair": {k: v for k, v in r["release_pair"].items() if k != "text"} if r.get("release_pair") else None})
    if r.get("log"):
        skip = ("records", "refit_layouts", "refit_calibration")      # objects; the refit's figures are in "refit"
        out["log"] = {k: v for k, v in r["log"].items() if k not in skip}
    return out


def _row_json(row: dict) -> dict:
    """A layout row without its Config object: every figure the report's table shows, and the changes."""
    return {k: v for k, v in row.items() if k != "config"}


def comm_groups(st: dict) -> list[dict]:
    """The step's communication groups of more than one rank (cost.step_time's "groups": group, size, span,
    nodes, link, time_s); [] when the cost model does not place ranks.
    Taught with the rest of doctor/diagnosis.py in notebooks/12_your_config.ipynb."""
    return [dict(g) for g in st.get("groups", []) if g.get("size", 0) > 1]


def _span(g: dict) -> str:
    """A group's span as printed: its own text, else its device ids (first and last few when many)."""
    if g.get("span"):
        return str(g["span"])
    devs = list(g.get("devices", []))
    if not devs:
        return "?"
    shown = ", ".join(map(str, devs)) if len(devs) <= 8 else \
        ", ".join(map(str, devs[:4])) + ", ..., " + ", ".join(map(str, devs[-2:]))
    return f"devices {shown}"


def _model_line(cfg: Any) -> str:
    m = cfg.model
    n, act = param_count(m), param_count(m, active=True)
    att = {"mla": f"MLA (q_lora {m.q_lora_rank}, kv_lora {m.kv_lora_rank}, rope {m.qk_rope_dim})",
           "gqa": f"GQA ({m.kv_heads} kv heads)", "mha": "MHA"}[m.attention]
    s = (f"{m.name}: {m.layers} layers, hidden {m.hidden}, {m.heads} heads, {att}, vocab {m.vocab}, seq {m.seq}; "
         f"{n / 1e9:.2f}B parameters")
    if m.moe:
        e = m.moe
        s += (f", {act / 1e9:.2f}B active (MoE: {e.routed} routed experts, top {e.top_k}, {e.shared} shared, "
              f"expert FFN {e.expert_ffn}, first {e.first_dense} layers dense)")
    if m.mtp:
        s += f"; MTP depth {m.mtp} (+{mtp_params(m) / 1e9:.2f}B, not counted above)"
    return s


def render_text(r: dict) -> str:
    """The human report (Markdown): verdict first, then memory, step terms, MFU, layouts, sources.
    Taught in notebooks/12_your_config.ipynb."""
    cfg, st, mem, hw, cal = r["config"], r["step"], r["memory"], r["hardware"], r["calibration"]
    lay = cfg.layout
    G = 2**30
    es = f", expert shard {expert_shard(cfg)} (min(ep x tp, dp x tp))" if cfg.model.moe is not None else ""
    L = ["# Config doctor", "", f"**{r['verdict']}**", "",
         f"Model: {_model_line(cfg)}.", "",
         f"Layout: {layout_name(cfg)}: dp {lay.dp} x tp {lay.tp} x pp {lay.pp} x cp {lay.cp} = {lay.devices} devices, "
         f"vpp {lay.vpp}{', ep ' + str(lay.ep) if cfg.model.moe is not None else ''}{es}; micro-batch {lay.batch} x "
         f"{lay.n_micro} micro-batches x dp -> global batch {lay.global_batch} of seq {cfg.model.seq}; "
         f"{lay.compute_dtype}; optimizer sharding {lay.optimizer_shard}; file dialect {cfg.dialect}.", "",
         f"Layers per pipeline stage: {list(lay.stage_layers)}; fully recomputed per stage: "
         f"{list(lay.full_recompute)}.", ""]
    if r.get("moved"):
        mv = r["moved"]
        L += [f"On the --devices asked for, the file's own layout ({mv['from_layout']}, {mv['from_devices']} devices) "
              f"cannot run; every figure below is for {mv['layout']}, the file with: "
              f"{', '.join(f'{k}: {v}' for k, v in mv['changes'].items()) or 'no key changed'}.", ""]
    if cfg.key_flags:
        L += ["Keys the doctor could not use (each read as absent):", ""] + [f"- {f['text']}" for f in cfg.key_flags] + [""]
    if cfg.notes:
        L += ["Assumed by the reader:", ""] + [f"- {n}" for n in cfg.notes] + [""]
    L += ["## Memory per pipeline stage", "",
          "| stage | params GiB | grads GiB | optimizer GiB | activations GiB | total GiB | budget GiB | headroom "
          "GiB (after the reserve) |",
          "|---|---|---|---|---|---|---|---|"]
    budget = mem["budget_bytes"] or 0
    for i, (b, part) in enumerate(zip(mem["per_stage_bytes"], mem["per_stage_breakdown"])):
        L.append(f"| {i} | {part['params'] / G:.2f} | {part['grads'] / G:.2f} | "
                 f"{part['optimizer_states'] / G:.2f} | {part['activations'] / G:.2f} | {b / G:.2f} | {budget / G:.2f} | "
                 f"{(budget - mem.get('reserve_bytes', 0) - b) / G:+.2f} |")
    rs = r.get("reserve") or {}
    if rs.get("bytes"):
        L.append(f"| reserve | | | | | {rs['bytes'] / G:.2f} | | HCCL buffers: 2 x HCCL_BUFFSIZE (200 MB) x "
                 f"{rs['domains']} communication domains ({', '.join(rs['groups'])}) |")
    L += ["", f"Budget: {budget / G:.2f} GiB from {r.get('budget_source', 'the file')}; headroom after the reserve "
          f"{(mem['headroom_bytes'] or 0) / G:+.2f} GiB. The reserve: {rs.get('source', 'none')}.", ""]
    if not r["fits"]:
        term, size = dominant_term(mem)
        L += [f"Does not fit: the largest term is {term}, {size / G:.2f} GiB of {mem['memory_per_device_bytes'] / G:.2f}.",
              ""]
    if lay.pp > 1:          # the balance: the slowest stage sets every micro-batch's pace, the others idle
        per = st["per_stage_s"]
        L += ["## Pipeline stages (time per micro-batch; the slowest stage binds)", "",
              "| stage | layers | fully recomputed | s per micro-batch | of which point-to-point | vs slowest |",
              "|---|---|---|---|---|---|"]
        for i, t in enumerate(per):
            L.append(f"| {i} | {lay.stage_layers[i]} | {lay.full_recompute[i]} | {t:.4f} | "
                     f"{st['per_stage_p2p_s'][i]:.4f} | {t / max(per) - 1:+.1%} |")
        L.append("")
    L += ["## Step time, decomposed (seconds per optimizer step)", "", "| term | s | share |", "|---|---|---|"]
    zero = [label for k, label in TERMS if k != "compute_s" and st[k] == 0]
    for k, label in TERMS:
        if k != "compute_s" and st[k] == 0:
            continue                # a term this layout does not have (listed under the table)
        if k == "compute_s":
            if st.get("moe_capacity_padding", 1.0) > 1.0:   # recompute_factor = hardware / model FLOPs: both in it
                label = (f"compute (bottleneck stage {st['bottleneck_stage']}, hardware / model FLOPs "
                         f"{st['recompute_factor']:.2f}: recompute, and routed experts padded to capacity "
                         f"x{st['moe_capacity_padding']:.2f})")
            else:
                label = f"compute (bottleneck stage {st['bottleneck_stage']}, recompute factor {st['recompute_factor']:.2f})"
        elif k == "dp_s":
            label = (f"DP gradient reduction, exposed ({st['dp_total_s']:.3f} s total, {st['dp_hidden_s']:.3f} s "
                     "hidden behind compute)")
        elif k == "tp_s" and st.get("mc2"):
            label = (f"TP/SP collectives, exposed under MC2 (fused into their matmuls; {st['tp_unfused_s']:.3f} s "
                     "unfused)")
        elif k == "bubble_s":
            label = f"pipeline bubble (1F1B fill/drain{', / VPP ' + str(lay.vpp) if lay.vpp > 1 else ''})"
        L.append(f"| {label} | {st[k]:.3f} | {st[k] / st['step_s']:.1%} |")
    L += [f"| **step** | **{st['step_s']:.3f}** | 100% |", ""]
    if zero:
        L += [f"Zero on this layout: {', '.join(zero)}.", ""]
    if cfg.model.moe is not None:
        given = cfg.model.moe.imbalance > 0
        L += [f"MoE routing: the busiest EP rank carries x{st['moe_imbalance']:.3f} the mean load "
              + ("(--moe-imbalance, as given)" if given else "(assumed: as balanced as chance, the largest of the EP "
                 "ranks' counts; a trained router is less even: --moe-imbalance)")
              + f"; expert GEMMs priced at their roofline ({cfg.model.moe.dispatcher} dispatcher).", ""]
    groups = comm_groups(st)
    if groups:      # where each collective runs: a group that leaves its node is priced on the slower link
        L += ["Communication groups (each group of more than one rank, the links its collective crosses):", "",
              "| group | size | span | nodes | link | s |", "|---|---|---|---|---|---|"]
        for g in groups:
            t = g.get("time_s")
            L.append(f"| {g.get('group', '?')} | {g['size']} | {_span(g)} | {g.get('nodes', '?')} | "
                     f"{g.get('link', '?')} | {'' if t is None else f'{t:.3f}'} |")
        L.append("")
    L += [f"tokens/s per device: **{st['tokens_per_s_per_device']:.0f}**", "",
          f"## MFU against {st['peak_flops'] / 1e12:.1f} TFLOPS ({lay.compute_dtype} peak of {hw.name})", "",
          "| convention | MFU % |", "|---|---|",
          f"| 6N (Kaplan; N = active parameters) | {st['mfu_6n']:.1%} |",
          f"| 6N + attention (PaLM appendix B) | {st['mfu_attention']:.1%} |",
          f"| hardware FLOPs (with recompute) | {st['mfu_hardware']:.1%} |", ""]
    if r.get("log"):
        L += _log_section(r["log"])
    if r.get("smallest"):
        sm = r["smallest"][0]
        L += ["## Smallest change that fits (fewest layout knobs changed, then fastest)", "",
              f"{sm['layout']}: {sm['knobs']} knob(s), {sm['tokens_per_s_per_device']} tokens/s/p, "
              f"{sm['memory_GiB']} GiB; changes: {_short(sm['changes'], 8)}"
              + "".join(f"; {n}" for n in sm.get("notes", [])) + ".", ""]
    if r.get("smallest_gain") and r["layouts"] and r["smallest_gain"][0]["layout"] != r["layouts"][0]["layout"]:
        sg = r["smallest_gain"][0]
        L += ["## Smallest change that gains (fewest layout knobs changed for more than +0.5 %, then fastest)", "",
              f"{sg['layout']}: {sg['knobs']} knob(s), {sg['tokens_per_s_per_device']} tokens/s/p "
              f"({sg['tokens_per_s_per_device'] / st['tokens_per_s_per_device'] - 1:+.1%}), {sg['memory_GiB']} GiB; "
              f"changes: {_short(sg['changes'], 8)}" + "".join(f"; {n}" for n in sg.get("notes", [])) + ".", ""]
    if r["layouts"]:
        L += ["## Better layouts (top 5 under the budget, same devices and global batch)", "",
              "| rank | layout | tokens/s/p | step s | memory GiB | changes |", "|---|---|---|---|---|---|"]
        for row in r["layouts"]:
            notes = "".join(f"; {n}" for n in row.get("notes", []))
            L.append(f"| {row['rank']} | {row['layout']} | {row['tokens_per_s_per_device']} | {row['step_s']} | "
                     f"{row['memory_GiB']} | {_short(row['changes'], 8)}{notes} |")
        L.append("")
    L += ["## Where the figures come from", "",
          f"- calibration: compute efficiency {cal.compute_efficiency:.4f} of peak"
          + (f", halved at a per-device width h/tp of {cal.half_width:.0f}" if cal.half_width else "") + "; attention at "
          f"{cal.attention_efficiency:.2f} of the matmul rate on the score pairs flash attention computes (causal: "
          f"half of s^2) at head dim 128, scaled by d / (d + "
          f"{cal.head_dim_half:.0f}) relative to 128 (the kernels' vector work per score is the same at any head dim "
          f"d); comm time "
          f"factor {cal.comm_time_factor:.3f} (exposed collective time / datasheet link time); "
          f"fitted on {', '.join(cal.fitted_on) or 'nothing'} only (see `calibration_table`)"]
    L += [f"- {k}: {v}" for k, v in hw.sources.items()]
    return "\n".join(L) + "\n"


def _log_section(lg: dict) -> list[str]:
    slow = f", {lg['n_slow']} slower than 3x the median" if lg.get("n_slow") else ""
    L = ["## Your run (--log)", "",
         f"Read {lg['n_steps']} steps from {lg['path']} ({lg['format']}); steady steps used: {lg['n_used']} "
         f"(left out: the first {lg.get('n_warmup', lg['n_skipped'])} as warm-up{slow}).", "",
         "| | tokens/s/p | MFU 6N | MFU with attention | MFU hardware |", "|---|---|---|---|---|",
         f"| measured (median of steady steps) | {lg['measured_tokens_per_s_per_device']:.0f} | {lg['mfu_6n']:.1%} | "
         f"{lg['mfu_attention']:.1%} | {lg['mfu_hardware']:.1%} |",
         f"| doctor's prediction{' (before the refit)' if lg.get('refit') else ''} | "
         f"{lg['predicted_tokens_per_s_per_device']:.0f} | | | |", "",
         f"Prediction error: **{lg['error']:+.1%}** (predicted / measured - 1), measured quartiles "
         f"{lg['measured_q1']:.0f}-{lg['measured_q3']:.0f} tokens/s/p; MFU against {lg['peak_flops'] / 1e12:.1f} "
         f"TFLOPS ({lg['peak_source']}).", ""]
    if lg.get("notes"):     # every note --json carries: a wrong batch or a short log must not warn in JSON only
        L += ["Notes on the log:", ""] + [f"- {n}" for n in lg["notes"]] + [""]
    if lg.get("refit"):
        rf = lg["refit"]
        c = rf.get("calibration", {})
        kept = (f"; kept: comm time factor {c['comm_time_factor']}, half width {c['half_width']}, head-dim half "
                f"point {c['head_dim_half']}, attention {c['attention_efficiency']}" if c else "")
        L += [f"Re-fitted on this run (the fit set: {lg['path']}): compute efficiency {rf['compute_efficiency']:.4f} "
              f"(was {rf['was']:.4f}){kept}. The refitted model predicts "
              f"{rf['predicted_tokens_per_s_per_device']:.0f} tokens/s/p for this run ({rf['error']:+.2%}). "
              f"The verdict, every table above and below and the sources use the refitted calibration. Assumed: "
              f"{rf.get('assumption', 'the whole error is put on the compute efficiency')}. "
              "Top layouts before and after:", "",
              "| rank | before | after |", "|---|---|---|"]
        for i in range(max(len(rf["before"]), len(rf["after"]))):
            b = rf["before"][i] if i < len(rf["before"]) else ""
            a = rf["after"][i] if i < len(rf["after"]) else ""
            L.append(f"| {i + 1} | {b} | {a} |")
        L.append("")
    return L


def _html(md: str) -> str:
    """A minimal Markdown-to-HTML for the report (headings, bold, tables, paragraphs, lists)."""
    import html as H
    out, table = [], False
    for line in md.splitlines():
        esc = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", H.escape(line))
        if line.startswith("|"):
            cells = [c.strip() for c in esc.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            if not table:
                out.append("<table border='1' cellspacing='0' cellpadding='3'>")
                table = True
            out.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            continue
        if table:
            out.append("</table>")
            table = False
        if line.startswith("#"):
            n = len(line) - len(line.lstrip("#"))
            out.append(f"<h{n}>{esc[n:].strip()}</h{n}>")
        elif line.startswith("- "):
            out.append(f"<li>{esc[2:]}</li>")
        elif re.fullmatch(r"!\[[^]]*\]\([^)]+\)", line.strip()):
            alt, src = re.fullmatch(r"!\[([^]]*)\]\(([^)]+)\)", line.strip()).groups()
            out.append(f"<img alt='{H.escape(alt)}' src='{H.escape(src)}'>")
        elif line.strip():
            out.append(f"<p>{esc}</p>")
    if table:
        out.append("</table>")
    return "<!doctype html><html><head><meta charset='utf-8'><title>Config doctor</title></head><body>\n" + \
        "\n".join(out) + "\n</body></html>\n"


def figures(r: dict, out_dir: str) -> dict[str, str]:
    """PNG pictures of the report: memory per stage stacked against the budget, the step-time waterfall,
    and (with --log) predicted against measured tokens/s/p. Returns {name: path}; {} without matplotlib.
    Taught in notebooks/12_your_config.ipynb."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    G = 2**30
    paths = {}
    mem, st = r["memory"], r["step"]
    parts = mem["per_stage_breakdown"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    bottom = [0.0] * len(parts)
    for key, label in (("params", "params"), ("grads", "grads"), ("optimizer_states", "optimizer"),
                       ("activations", "activations")):
        vals = [p[key] / G for p in parts]
        ax.bar(range(len(parts)), vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if mem["budget_bytes"]:
        ax.axhline(mem["budget_bytes"] / G, color="k", ls="--", lw=1, label="budget")
    ax.set_xlabel("pipeline stage"), ax.set_ylabel("GiB per device"), ax.set_title("Memory per stage")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    paths["memory"] = os.path.join(out_dir, "memory.png")
    fig.savefig(paths["memory"], dpi=110), plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    start = 0.0
    labels = []
    for i, (k, label) in enumerate(TERMS):
        ax.bar(i, st[k], bottom=start)
        start += st[k]
        labels.append(label.replace(" ", "\n", 1))
    ax.bar(len(TERMS), st["step_s"], color="k")
    ax.set_xticks(range(len(TERMS) + 1), labels + ["step"], fontsize=6)
    ax.set_ylabel("seconds per step"), ax.set_title("Step time, term by term")
    fig.tight_layout()
    paths["waterfall"] = os.path.join(out_dir, "waterfall.png")
    fig.savefig(paths["waterfall"], dpi=110), plt.close(fig)
    lg = r.get("log")
    if lg:
        fig, ax = plt.subplots(figsize=(4, 3.2))
        ax.bar([0, 1], [lg["measured_tokens_per_s_per_device"], lg["predicted_tokens_per_s_per_device"]],
               yerr=[[lg["measured_tokens_per_s_per_device"] - lg["measured_q1"], 0],
                     [lg["measured_q3"] - lg["measured_tokens_per_s_per_device"], 0]], color=["C0", "C1"])
        ax.set_xticks([0, 1], ["measured", "predicted"]), ax.set_ylabel("tokens/s per device")
        ax.set_title(f"Your run: error {lg['error']:+.1%}")
        fig.tight_layout()
        paths["log"] = os.path.join(out_dir, "predicted_vs_measured.png")
        fig.savefig(paths["log"], dpi=110), plt.close(fig)
    return paths


def published_scatter(rows: list[dict], path: str | None = None) -> Any:
    """Predicted against published tokens/s/p of `calibration_table` rows, coloured by family (fit points ringed,
    excluded rows left out), log axes, the ±35 % band dotted. Saves to `path` when given; returns the figure.
    Taught in notebooks/12_your_config.ipynb."""
    import matplotlib
    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for i, fam in enumerate(sorted({r["family"] for r in rows})):
        pts = [(r["published"], r["predicted"]) for r in rows if r["family"] == fam and r["role"] != "excluded"]
        if pts:                         # 10 colours x 3 markers: every family its own pair
            ax.scatter(*zip(*pts), s=20, label=fam, color=f"C{i % 10}", marker="o^s"[i // 10 % 3])
    fit = [(r["published"], r["predicted"]) for r in rows if r["role"] == "fit"]
    ax.scatter(*zip(*fit), s=90, facecolors="none", edgecolors="k", label="fit points")
    pub = [r["published"] for r in rows if r["role"] != "excluded"]
    lim = [min(pub) / 1.5, max(pub) * 1.5]
    ax.plot(lim, lim, "k-", lw=0.8)
    ax.plot(lim, [1.35 * x for x in lim], "k:", lw=0.6)
    ax.plot(lim, [x / 1.35 for x in lim], "k:", lw=0.6)
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("published tokens/s/p"), ax.set_ylabel("predicted tokens/s/p")
    ax.set_title("The doctor against mindformers' published figures (dotted: ±35 %)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def write_outputs(r: dict, out_dir: str, source_path: str | None = None) -> dict[str, str]:
    """Write improved.yaml (the user's YAML with only the best layout's keys changed; the original if no
    change helps), report.md and report.html (with the pictures of `figures`) into `out_dir`.
    Taught in: no notebook; doctor/cli.py calls it."""
    import yaml
    os.makedirs(out_dir, exist_ok=True)
    d = copy.deepcopy(r["config"].raw)
    best = r["layouts"][0] if r["layouts"] and (r["best_gain"] > 0.005 or not r["fits"]) else None
    # against the source file: the move to --devices (already in config.raw) and then the best layout's keys
    moved = (r.get("moved") or {}).get("changes", {})
    changes = follow_derived(d, best["changes"]) if best else {}
    text_changes = {**moved, **changes}
    for k, v in changes.items():
        node = d
        *parents, last = k.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    paths = {"yaml": os.path.join(out_dir, "improved.yaml"), "md": os.path.join(out_dir, "report.md"),
             "html": os.path.join(out_dir, "report.html")}
    head = (f"# Written by mshelpers.doctor from {source_path or 'a config'}; changed keys: "
            f"{', '.join(text_changes) or 'none'}\n")
    body, how = yaml.safe_dump(d, sort_keys=False), "dumped whole (no source text)"
    if source_path and os.path.isfile(str(source_path)):
        try:
            with open(source_path) as f:
                text = f.read()
            body, how = edit_yaml_text(text, follow_derived(load_text(text), text_changes)), "edited in place"
        except (OSError, UnicodeDecodeError, YamlEditError) as e:
            how = f"dumped whole: the source could not be edited in place ({e}); its comments are not kept"
    head += f"# {how}\n"
    r["yaml_written"] = how
    pics = figures(r, out_dir)
    md = render_text(r) + "".join(f"\n![{k}]({os.path.basename(v)})\n" for k, v in pics.items())
    for path, text in ((paths["yaml"], head + body), (paths["md"], md),
                       (paths["html"], _html(md))):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:           # written whole, then renamed: a full disk leaves the old file
            f.write(text)
        os.replace(tmp, path)
    paths.update(pics)
    return paths


def load_with_mindformers(path: str) -> dict:
    """Load a YAML with mindformers' own MindFormerConfig and build its config classes from it:
    TransformerOpParallelConfig (parallel_config), TransformerRecomputeConfig (recompute_config), and
    LlamaConfig (model.model_config, r1.x layout). mindformers' errors propagate.
    Taught in notebooks/12_your_config.ipynb."""
    import inspect
    import logging
    import mindspore  # noqa: F401  (mindformers expects it imported first)
    from mindformers.tools.register import MindFormerConfig
    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig
    quiet = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("mindformers")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    try:
        mf = MindFormerConfig(path)
    finally:
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
    out = {"config": mf}
    for klass, sect in ((TransformerOpParallelConfig, "parallel_config"), (TransformerRecomputeConfig, "recompute_config")):
        known = inspect.signature(klass).parameters
        kw = {k: v for k, v in (mf.get(sect) or {}).items() if k in known}
        out[sect] = klass(**kw)
    mc = {k: v for k, v in mf.model.model_config.items() if k != "type"}
    if "num_layers" in mc:
        from mindformers.models.llama import LlamaConfig
        out["model_config"] = LlamaConfig(**mc, parallel_config=out["parallel_config"])
    return out


