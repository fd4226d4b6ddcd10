"""The doctor's prices in the planner's terms (mshelpers.parallel, notebook 05): bytes per group and the
activations one micro-batch leaves on a stage. Both are read off the doctor's own model, never recounted:

  traffic_bytes(cfg)          bytes one device of the busiest stage sends per optimizer step, per group (TP, EP,
                              CP, PP point-to-point, DP): the collectives `cost.step_time` prices
                              (`cost.stage_collectives`, `cost.gradient_collectives`), their bytes counted
  stage_activations(cfg, i)   one micro-batch's stored activations on stage i, the recompute working set, the
                              logits, and the in-flight micro-batches `cost.memory_per_stage` multiplies by

  file_config(source, ...)    a mindformers file (path, dict) or a Config, with the CLI's budget rule
  on_degrees(cfg, dp, ...)    the same model and global batch on other degrees, as the doctor's search varies them
                              (variants.layout_variant: no YAML written or read)
  planned_config(run, ...)    a RunConfig's model on a layout and schedule, built directly (no YAML)

A planner that prices a layout through these and through `cost.memory_per_stage` / `cost.step_time` says what
the CLI says for the same file (tests/doctor/test_one_price.py holds every fixture YAML to that).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from . import cost, topology
from .describe import Config, Layout, Model
from .layouts import _dtype, _per_stage, _select_ops, checked, parse_size, stage_split
from .variants import layout_variant


def traffic_bytes(cfg: Config) -> dict[str, float]:
    """Bytes one device sends per optimizer step, by group: tp, ep, cp, pp (point-to-point), dp (the whole
    reduction, hidden part included), total, and stage (the stage counted: the first that sends the most). A ring
    collective over n ranks counts (n - 1)/n of its buffer per pass, as the doctor prices it (an all-reduce is a
    reduce-scatter and an all-gather: 2 passes); activations travel at 16 bits, as the doctor sends them.
    Taught in: no notebook; doctor/cost.py, parallel.py call it."""
    lay = cfg.layout
    size = {k: len(ranks) for k, ranks in topology.groups(lay, cfg.dialect).items()}

    def sent(group: str, count: float, nbytes: float, kind: str) -> float:
        n = size[group]
        if kind == "all_gather":          # each rank's share forwarded to the n - 1 others
            return count * (n - 1) * nbytes
        return count * (nbytes if kind == "p2p" else (n - 1) / n * nbytes)

    per_stage = [{g: sent(g, *c) for g, c in cost.stage_collectives(cfg, i).items()} for i in range(lay.pp)]
    b = max(range(lay.pp), key=lambda i: sum(per_stage[i].values()))
    out = {k: lay.n_micro * per_stage[b].get(g, 0.0) for k, g in (("tp", "TP"), ("ep", "EP"), ("cp", "CP"),
                                                                     ("pp", "PP"))}
    grads = cost.gradient_collectives(cfg, b)       # the same passes over the dense and the expert bytes
    out["dp"] = grads["DP"][0] * sum(sent(g, 1, nbytes, kind) for g, (_, nbytes, kind) in grads.items())
    out["total"] = sum(out.values())
    out["stage"] = b
    return out


stage_activations = cost.stage_activations     # the count memory_per_stage adds, one micro-batch at a time


def file_config(source: Any, *, budget: Any = None, model_config: Any = None, memory_bytes: float | None = None) -> Config:
    """A Config for a mindformers file (path or parsed dict, read by `readers.read_config`) or a Config, held
    against `budget`, else the file's max_device_memory, else `memory_bytes` (the hardware's memory: the CLI's
    rule when a file names no budget).
    Taught in: no notebook; parallel.py calls it."""
    if isinstance(source, Config):
        cfg = source if budget is None else dataclasses.replace(source, budget_bytes=int(budget))
    else:
        from .readers import read_config
        cfg = read_config(source, budget=budget, model_config=model_config)
    if cfg.budget_bytes is None and memory_bytes is not None:
        cfg = dataclasses.replace(cfg, budget_bytes=int(memory_bytes))
    return cfg


def degree_changes(cfg: Config, dp: int, tp: int, pp: int, micro: int) -> dict:
    """The static keys that put `cfg` on dp x tp x pp with `micro` micro-batches (pipeline micro-batches with
    pp > 1, else gradient accumulation) and the same global batch, as the doctor's search changes them: a new
    stage count resets the offsets and the interleaving. `on_degrees` applies them to the Layout;
    `readers.with_layout` to the file (tests/doctor/test_one_price.py holds the two to one price).
    Taught in notebooks/05_semi_auto_parallel.ipynb (through `parallel.make_layout`)."""
    lay = cfg.layout
    kw = dict(data_parallel=dp, model_parallel=tp, pipeline_stage=pp, micro_batch_num=micro if pp > 1 else 1,
              gradient_accumulation_steps=1 if pp > 1 else micro,
              batch_size=lay.global_batch // (lay.interleave * dp * micro))
    if pp != lay.pp:
        kw["offset"] = 0
        if lay.vpp > 1:
            kw["pp_interleave_num"] = 1
    return kw


def on_degrees(cfg: Config, dp: int, tp: int, pp: int, micro: int) -> Config:
    """`cfg` on dp x tp x pp with `micro` micro-batches and the same global batch: `variants.layout_variant` with
    `degree_changes`' keys (dataclasses.replace on the parsed Layout, no YAML written or read). The file's own
    switches travel in `Config.asked`: a file at model_parallel 1 with use_seq_parallel gets sequence parallel at
    tp > 1, one at dp 1 with the parallel optimizer gets it at dp > 1, and a new stage split re-splits the file's
    recompute entries, as the file edited and read again would.
    Taught in notebooks/05_semi_auto_parallel.ipynb (through `parallel.make_layout`)."""
    lay = cfg.layout
    if (dp, tp, pp, micro) == (lay.dp, lay.tp, lay.pp, lay.n_micro):
        return cfg
    return layout_variant(cfg, **degree_changes(cfg, dp, tp, pp, micro))


def planned_config(run: Any, dp: int, tp: int, pp: int, micro: int, *, global_batch: int, seq_len: int | None = None,
                   zero_stage: int = 0, sequence_parallel: bool = False, flash_attention: bool = False,
                   schedule: str = "1f1b", virtual_stages: int = 1, interleaved_order: str = "standard",
                   budget: Any = None) -> Config:
    """The Config of a RunConfig-like model (hidden_size, num_layers, num_heads, ffn_hidden_size, vocab_size,
    seq_len, optional num_kv_heads, compute_dtype, recompute) on a layout, built directly (Model + Layout): what
    `readers.read_config` reads from the YAML `mshelpers.mindformers_yaml.mindformers_yaml` writes for it
    (tests/doctor/test_one_price.py holds the two to one price), with the pipeline schedule the planner asked for.
    zero_stage >= 1: the parallel optimizer (2: gradient_accumulation_shard); `budget` None: the YAML's 58GB.
    Taught in notebooks/05_semi_auto_parallel.ipynb (through `parallel.make_layout`)."""
    h, L, a = int(run.hidden_size), int(run.num_layers), int(run.num_heads)
    kv = getattr(run, "num_kv_heads", None) or a
    model = Model(name="LlamaConfig", layers=L, hidden=h, heads=a, kv_heads=kv, head_dim=h // a,
                  ffn=int(run.ffn_hidden_size), vocab=int(run.vocab_size), seq=int(seq_len or run.seq_len),
                  attention="mha" if kv == a else "gqa", flash=bool(flash_attention))
    vpp = virtual_stages if schedule == "interleaved" and virtual_stages > 1 else 1
    chunks = stage_split(L, pp, vpp, 0, "model.model_config.offset", [])
    rc = getattr(run, "recompute", "none")
    full = _per_stage(rc == "full", chunks, "recompute_config.recompute")
    sel = _select_ops(rc == "selective", chunks, full, "recompute_config.select_recompute")
    layout = Layout(dp=dp, tp=tp, pp=pp, vpp=vpp, micro=micro if pp > 1 else 1, batch=global_batch // (dp * micro),
                    grad_accum=1 if pp > 1 else micro, seq_parallel=sequence_parallel and tp > 1,
                    optimizer_shard="po" if zero_stage >= 1 and dp > 1 else "none", shard_accum=zero_stage >= 2,
                    stage_layers=tuple(sum(c[s] for c in chunks) for s in range(pp)), full_recompute=tuple(full),
                    select_ops=tuple(sel), compute_dtype=_dtype(getattr(run, "compute_dtype", "bfloat16"), "float16",
                                                                "compute_dtype"),
                    param_bytes=4, state_bytes=8, schedule=schedule if pp > 1 else "1f1b",
                    interleaved_order=interleaved_order)
    asked = {"use_seq_parallel": sequence_parallel and tp > 1, "enable_parallel_optimizer": zero_stage >= 1,
             "recompute": rc == "full", "select_recompute": rc == "selective"}
    return checked(Config(model=model, layout=layout, budget_bytes=parse_size("58GB" if budget is None else budget),
                          dialect="r1.x", asked=asked))
