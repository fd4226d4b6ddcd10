"""The bytes the planner reports (`adapt.traffic_bytes`) are the bytes `cost.step_time` prices: both read the same
collectives (`cost.stage_collectives`, `cost.gradient_collectives`). Held here on every fixture with a group that
sends: priced on links of 1 byte/s with no latency, all in one node, with comm_time_factor 1, each of step_time's
communication terms is its byte count, and must equal the count.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mshelpers import doctor as D
from mshelpers.doctor import adapt, cost

DATA = Path(__file__).resolve().parents[1] / "data" / "mindformers"

# 1 byte/s links, no latency, every rank in one node; peak and HBM so large that compute and the optimizer round
# to 0, so the bottleneck stage is the one that sends the most
UNIT = D.DoctorHardware(name="1 byte/s links", peak_flops={"float16": 1e300, "bfloat16": 1e300, "float32": 1e300},
                        hbm_bytes_per_s=1e300, intra_link_bytes_per_s=1.0, links_per_device=1, inter_bytes_per_s=1.0,
                        devices_per_node=1 << 40, intra_latency_s=0.0, inter_latency_s=0.0, memory_bytes=1.0,
                        dp_overlap=0.0)
NO_FACTOR = D.Calibration(compute_efficiency=1.0, comm_time_factor=1.0)


def _configs():
    out = []
    for p in sorted(DATA.glob("*.yaml")) + sorted((DATA / "2.1.0").glob("*/*.yaml")):
        try:
            out.append((p.name, D.read_config(str(p))))
        except D.DoctorError:
            continue
    d = yaml.safe_load((DATA.parent / "heldout" / "deepseek2_lite_16b_8k.yaml").read_text())
    out.append(("deepseek2_lite_allgather", D.read_config(d)))             # the all-gather dispatcher
    d = yaml.safe_load((DATA / "2.1.0" / "qwen3" / "pretrain_qwen3_32b_4k.yaml").read_text())
    for algo in ("colossalai_cp", "ulysses_cp"):        # context parallel, both kinds
        d["parallel_config"].update(context_parallel=2, context_parallel_algo=algo)
        out.append((f"qwen3_32b_{algo}", D.read_config(yaml.safe_load(yaml.safe_dump(d)))))
    return out


CONFIGS = _configs()


@pytest.mark.parametrize("name,cfg", CONFIGS, ids=[n for n, _ in CONFIGS])
def test_traffic_bytes_are_what_step_time_prices(name, cfg):
    st = cost.step_time(cfg, UNIT, NO_FACTOR)
    t = adapt.traffic_bytes(cfg)
    assert t["stage"] == st["bottleneck_stage"]
    for k, term in (("tp", "tp_s"), ("ep", "ep_s"), ("cp", "cp_s"), ("pp", "p2p_s"), ("dp", "dp_total_s")):
        # the busiest EP rank binds an all-to-all: the time carries its load over the mean (cost.routing_imbalance),
        # the bytes counted are the mean rank's; an all-gather dispatcher moves every token whatever the routing
        ep_kind = cost.stage_collectives(cfg, st["bottleneck_stage"]).get("EP", (0, 0, None))[2]
        factor = st["moe_imbalance"] if k == "ep" and ep_kind == "all_to_all" else 1.0
        assert t[k] * factor == pytest.approx(st[term], rel=1e-12, abs=1e-9), k


def test_the_check_covers_every_group():
    sends = {k for _, c in CONFIGS for k, v in adapt.traffic_bytes(c).items() if k != "stage" and v > 0}
    assert sends == {"tp", "ep", "cp", "pp", "dp", "total"}


def test_stage_collectives_counts_by_hand():
    """Llama 2 70B (r1.x, tp 4, pp 8, 10 layers a stage, full recompute off): per micro-batch, 8 TP all-reduces a
    layer of the b·s·h activations at 16 bits, and two pipeline sends of them."""
    c = D.read_config(str(DATA / "pretrain_llama2_70b_bf16_32p.yaml"))
    lay, m = c.layout, c.model
    i = 1                                           # a middle stage: no embedding, no head
    got = cost.stage_collectives(c, i)
    act = lay.batch * lay.interleave * m.seq * m.hidden * 2
    n = lay.stage_layers[i]
    assert got["TP"] == (8 * n + 4 * lay.full_recompute[i], act, "ring")
    assert got["PP"] == (2 * lay.vpp, act / (lay.tp if lay.seq_parallel else 1), "p2p")
    assert set(got) == {"TP", "PP"}
    dense, _ = cost.stage_params(c, i)
    assert cost.gradient_collectives(c, i)["DP"] == (2, dense * lay.param_bytes, "ring")
