"""Where a training step's time goes: MindSpore's CPU profiler on the lean LLaMA, rewrites off (PLAIN) and on.

    python -m bench.profile_recipe [--active 3] [--rounds 2]

Each variant runs in a fresh process (graph mode, nn.TrainOneStepCell, batch 8 x seq 128) and is profiled
for `--active` steps with mshelpers.profiling.profile_steps, `--rounds` times, alternating. Printed: per op
type, milliseconds per step for both variants (the smallest over the rounds: a neighbour's load on a shared
machine only ever adds time), and the GFLOP/s the model's MatMuls reach inside the graph (the model's matmul FLOPs divided
by the MatMul time). Profiles go to build/bench/profile/<variant>/.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mshelpers.config import build_dir  # noqa: E402
from mshelpers.table import markdown_table  # noqa: E402
from mshelpers.timing import run_isolated  # noqa: E402


def model_matmul_flops(vocab: int, dim: int, layers: int, ffn: int, tokens: int) -> float:
    """Forward + backward FLOPs of the dense projections (q, k, v, o, w1, w2, w3, head): 3 x 2 x tokens x weights."""
    weights = layers * (4 * dim * dim + 3 * dim * ffn) + dim * vocab
    return 3 * 2 * tokens * weights


def profile_variant(variant: str, active: int) -> list[dict]:
    """Profile `active` steps of the lean LLaMA ("recipe" or "plain") in this process; op types per step."""
    import mshelpers  # noqa: F401
    import mindspore as ms
    from mindspore import nn
    from mshelpers.device import setup
    from mshelpers.profiling import op_type_table, profile_steps
    from bench.compare_pytorch import DIMS, SEQ, _batch, ms_optimizer
    from bench.lean_llama_ms import PLAIN, LeanLlama
    setup("graph", seed=0)
    net = LeanLlama(**DIMS, seq_len=SEQ, **(PLAIN if variant == "plain" else {}))
    step = nn.TrainOneStepCell(net, ms_optimizer(net.trainable_params()))
    x = ms.Tensor(_batch())
    step(x).asnumpy()   # compile outside the window
    run = profile_steps(lambda: step(x).asnumpy(), wait=1, warmup=1, active=active,
                        output_dir=build_dir("bench", "profile", variant))
    return [dict(op_type=r["op_type"], calls=int(r["count"]) // active, ms_per_step=float(r["total_ms"]) / active)
            for r in op_type_table(run)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_recipe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--active", type=int, default=3, help="profiled steps per variant")
    ap.add_argument("--rounds", type=int, default=2, help="profiles per variant, alternating")
    a = ap.parse_args(argv)
    for name in ("active", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} {getattr(a, name)} is invalid; fix: pass a positive integer")
    from bench.compare_pytorch import BATCH, DIMS, SEQ
    runs: dict[str, list[list[dict]]] = {"plain": [], "recipe": []}
    for r in range(a.rounds):
        for v in (("plain", "recipe") if r % 2 == 0 else ("recipe", "plain")):
            runs[v].append(run_isolated(profile_variant, v, a.active).value)
    tables = {}
    for v, rounds in runs.items():
        best: dict[str, dict] = {}
        for rows in rounds:
            for row in rows:
                if row["op_type"] not in best or row["ms_per_step"] < best[row["op_type"]]["ms_per_step"]:
                    best[row["op_type"]] = row
        tables[v] = list(best.values())
    by = {v: {r["op_type"]: r for r in rows} for v, rows in tables.items()}
    order = sorted(set(by["plain"]) | set(by["recipe"]),
                   key=lambda t: -max(by["plain"].get(t, {}).get("ms_per_step", 0),
                                      by["recipe"].get(t, {}).get("ms_per_step", 0)))
    rows = [dict(op_type=t,
                 plain_calls=by["plain"].get(t, {}).get("calls", 0),
                 plain_ms=by["plain"].get(t, {}).get("ms_per_step", 0.0),
                 recipe_calls=by["recipe"].get(t, {}).get("calls", 0),
                 recipe_ms=by["recipe"].get(t, {}).get("ms_per_step", 0.0)) for t in order]
    total = {v: sum(r["ms_per_step"] for r in tables[v]) for v in tables}
    rows.append(dict(op_type="all ops", plain_calls=sum(r["plain_calls"] for r in rows), plain_ms=total["plain"],
                     recipe_calls=sum(r["recipe_calls"] for r in rows), recipe_ms=total["recipe"]))
    print(f"op time per training step: {a.active} profiled steps per variant, smallest of {a.rounds} rounds "
          "(build/bench/profile/)")
    print(markdown_table(rows, digits=3))
    flops = model_matmul_flops(DIMS["vocab"], DIMS["dim"], DIMS["layers"], DIMS["ffn"], BATCH * SEQ)
    for v in tables:
        mm = by[v].get("MatMul", {}).get("ms_per_step", 0.0)
        others = total[v] - mm - by[v].get("BatchMatMul", {}).get("ms_per_step", 0.0)
        print(f"{v}: MatMul {mm:.0f} ms/step -> {flops / (mm / 1e3) / 1e9:.0f} GFLOP/s on the model's "
              f"{flops / 1e9:.1f} GFLOP of projections; ops other than (Batch)MatMul {others:.0f} ms/step")
    return 0


if __name__ == "__main__":
    from bench import profile_recipe
    raise SystemExit(profile_recipe.main())
