"""The doctor's prices in the planner's terms (mshelpers.parallel, notebook 05): bytes per group and the
activations one micro-batch leaves on a stage. Both are read off the doctor's own model, never recounted:

  traffic_bytes(cfg)          bytes one device of the busiest stage sends per optimizer step, per group (TP, EP,
                              CP, PP point-to-point, DP): the collectives `cost.step_time` prices
                              (`cost.stage_collectives`, `cost.gradient_collectives`), their bytes counted
  stage_activations(cfg, i)   one micro-batch's stored activations on stage i, the recompute working set, the
                              logits, and the in-flight micro-batches `cost.memory_per_stage` multiplies by

  file_config(source, ...)   a mindformers file (path, dict) or a Config, with the CLI's budget rule
  on_degrees(cfg, dp, ...)    the same model and global batch on other degrees, as the doctor's search varies them

A planner that prices a layout through these and through `cost.memory_per_stage` / `cost.step_time` says what
the CLI says for the same file (tests/doctor/test_one_price.py holds every fixture YAML to that).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from . import cost, topology
from .describe import Config


def traffic_bytes(cfg: Config) -> dict[str, float]:
    """Bytes one device sends per optimizer step, by group: tp, ep, cp, pp (point-to-point), dp (the whole
    reduction, hidden part included), total, and stage (the stage counted: the first that sends the most). A ring
    collective over n ranks counts (n - 1)/n of its buffer per pass, as the doctor prices it (an all-reduce is a
    reduce-scatter and an all-gather: 2 passes); activations travel at 16 bits, as the doctor sends them."""
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
    rule when a file names no budget)."""
    if isinstance(source, Config):
        cfg = source if budget is None else dataclasses.replace(source, budget_bytes=int(budget))
    else:
        from .readers import read_config
        cfg = read_config(source, budget=budget, model_config=model_config)
    if cfg.budget_bytes is None and memory_bytes is not None:
        cfg = dataclasses.replace(cfg, budget_bytes=int(memory_bytes))
    return cfg


def on_degrees(cfg: Config, dp: int, tp: int, pp: int, micro: int) -> Config:
    """`cfg` on dp x tp x pp with `micro` micro-batches (pipeline micro-batches with pp > 1, else gradient
    accumulation) and the same global batch, through `readers.with_layout` with the keys the doctor's search
    changes (a new stage count resets the offsets and the interleaving). The file is edited and read again, not
    varied with `variants.layout_variant`: a file at model_parallel 1 keeps use_seq_parallel and the parallel
    optimizer switch, which its parsed Layout cannot carry to tp > 1 or dp > 1."""
    lay = cfg.layout
    if (dp, tp, pp, micro) == (lay.dp, lay.tp, lay.pp, lay.n_micro):
        return cfg
    kw = dict(data_parallel=dp, model_parallel=tp, pipeline_stage=pp, micro_batch_num=micro if pp > 1 else 1,
              gradient_accumulation_steps=1 if pp > 1 else micro,
              batch_size=lay.global_batch // (lay.interleave * dp * micro))
    if pp != lay.pp:
        kw["offset"] = 0
        if lay.vpp > 1:
            kw["pp_interleave_num"] = 1
    from .readers import with_layout
    return with_layout(cfg, **kw)
