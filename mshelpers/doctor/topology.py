"""Ranks placed on nodes: which (node, device) each rank of a layout lands on, in the order mindformers assigns
its parallel dimensions, and the links each communication group crosses.

Every dialect puts tensor parallel innermost (consecutive ranks), then context parallel, then data parallel,
with pipeline stages outermost (contiguous blocks of world / pp ranks). They differ in where the expert-parallel
group is carved out:

  r1.x (legacy)   experts split over (dp * cp // ep, ep, mp): the EP ranks are data-parallel ranks, so they are
                  mp ranks apart and an EP group spans ep * tp consecutive ranks.
                  mindformers/modules/transformer/moe.py, MoE.__init__: dp = data_parallel * context_parallel,
                  dp_moe = dp // ep, shards such as ((dp_moe, 1, ep, 1, 1),) and ((dp_moe, ep, 1, mp, 1),).
  mcore (static)  dense layout (dp, cp, tp); MoE layout (dp * tp * cp // ep, ep): ep innermost, so an EP group
                  is ep consecutive ranks.
                  mindformers/parallel_core/training_graph/device_matrix.py, init_dp_cp_tp_layout and
                  init_dp_cp_tp_ep_layout.
  pynative (2.x)  world mesh ("pp", "batch", "cp", "tp") for dense, ("pp", "dp_replicate", "efsdp", "ep") for
                  experts: ep innermost, an EP group is ep consecutive ranks.
                  mindformers/pynative/distributed/parallel_dims.py (2.1.0), ParallelDims.build_mesh.

A group's collective is priced on the links it crosses: the node's mesh (its per-device bandwidth) when it stays
in one node, the inter-node link per device when it has one rank per node, and when it has several ranks in each
of several nodes, the slower of the two binds (a ring passes every byte over both).
"""
from __future__ import annotations

from typing import Any

from .describe import DoctorError


def _family(dialect: str) -> str:
    """The placement family of a reader's dialect ("1.9" files are r1.x legacy with Hugging Face names)."""
    return "r1.x" if dialect in ("r1.x", "1.9", "") else "pynative" if dialect == "pynative" else "mcore"


def rank_of(lay: Any, *, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
    """The global rank of the device at these coordinates (tp innermost, then cp, dp, and stages outermost).
    Taught with the rest of doctor/topology.py in notebooks/12_your_config.ipynb."""
    return ((pp * lay.dp + dp) * lay.cp + cp) * lay.tp + tp


def node_of(rank: int, devices_per_node: int) -> tuple[int, int]:
    """(node, device) of a rank: ranks fill nodes in order (msrun / the rank table number them so).
    Taught with the rest of doctor/topology.py in notebooks/12_your_config.ipynb."""
    return divmod(rank, devices_per_node)


def groups(lay: Any, dialect: str = "r1.x") -> dict[str, list[int]]:
    """The group each parallel dimension forms around rank 0, as global ranks: TP, CP, DP (the dense gradient
    reduction: data and context ranks hold the same parameters), EP (the all-to-all), EDP (the routed experts'
    gradient reduction: the ranks that hold the same expert shard) and PP (rank 0 and its next stage).

    Every group of a kind has the same shape in these regular meshes, so rank 0's group stands for all.
    Taught in notebooks/12_your_config.ipynb."""
    fam = _family(dialect)
    stage = lay.dp * lay.cp * lay.tp                            # ranks per pipeline stage
    out = {"TP": [rank_of(lay, tp=t) for t in range(lay.tp)],
           "CP": [rank_of(lay, cp=c) for c in range(lay.cp)],
           "DP": sorted(rank_of(lay, dp=d, cp=c) for d in range(lay.dp) for c in range(lay.cp)),
           "PP": [0, stage] if lay.pp > 1 else [0]}
    ep = max(1, min(lay.ep, lay.dp * lay.cp * (lay.tp if fam != "r1.x" else 1)))
    if fam == "r1.x":
        # EP over consecutive (dp, cp) indices, tp ranks apart; an expert shard is held by tp ranks of one EP
        # index, replicated over the (dp * cp) // ep blocks
        out["EP"] = [e * lay.tp for e in range(ep)]
        out["EDP"] = [b * ep * lay.tp for b in range(max(1, lay.dp * lay.cp // ep))]
    else:
        # ep innermost over the stage's dp x cp x tp ranks; replicas ep ranks apart
        out["EP"] = list(range(ep))
        out["EDP"] = [b * ep for b in range(max(1, stage // ep // lay.tp))]
    return out


def _check(ranks: Any, devices_per_node: Any) -> None:
    if not (isinstance(devices_per_node, int) and not isinstance(devices_per_node, bool) and devices_per_node > 0):
        raise DoctorError("devices_per_node", devices_per_node, "a positive integer (8 on an Atlas 800T A2 node)")
    if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
        raise DoctorError("ranks", ranks, "a non-empty list of global ranks (integers >= 0), e.g. groups(...)['TP']")


def span(ranks: list[int], devices_per_node: int) -> dict[str, Any]:
    """How a group lies on the nodes: size, nodes crossed, most ranks on one node, and a short description.
    Taught in: no notebook; collectives.py, doctor/__init__.py, doctor/cost.py call it."""
    _check(ranks, devices_per_node)
    nodes: dict[int, int] = {}
    for r in ranks:
        nodes[r // devices_per_node] = nodes.get(r // devices_per_node, 0) + 1
    stride = ranks[1] - ranks[0] if len(ranks) > 1 else 0
    text = (f"ranks {ranks[0]}-{ranks[-1]}" if stride == 1 else f"ranks {ranks[0]}..{ranks[-1]} stride {stride}"
            if len(ranks) > 1 else f"rank {ranks[0]}")
    return {"size": len(ranks), "nodes": len(nodes), "per_node": max(nodes.values()), "span": text,
            "link": "none" if len(ranks) < 2 else "intra-node" if len(nodes) == 1 else
            "inter-node" if max(nodes.values()) == 1 else "intra+inter"}


def _intra_bw(hw: Any, per_node: int) -> float:
    """Per-device bandwidth inside a node, whatever the group size: msmodeling's 196e9 B/s per device of the
    A2 full mesh. The other reading (7 links of 28e9, n - 1 of them for an n-rank group) was priced against the
    published figures too (bench/doctor_fit_sets.py): its best fit sets miss as many families at a higher
    median error, and all of them invert CodeLlama 34B's published 16 -> 32 card order (README, Config doctor)."""
    return hw.intra_link_bytes_per_s * hw.links_per_device


def ring_link(hw: Any, sp: dict) -> tuple[float, float]:
    """(bytes/s per device, latency) of a ring collective (all-reduce, all-gather, reduce-scatter, P2P ring)
    over a group laid out as `sp`: the slower of the links it crosses binds.
    Taught in: no notebook; collectives.py, doctor/cost.py call it."""
    if sp["nodes"] == 1:
        return _intra_bw(hw, sp["per_node"]), hw.intra_latency_s
    if sp["per_node"] == 1:
        return hw.inter_bytes_per_s, hw.inter_latency_s
    return min(_intra_bw(hw, sp["per_node"]), hw.inter_bytes_per_s), hw.inter_latency_s


def all_to_all_time(hw: Any, sp: dict, buffer_bytes: float) -> float:
    """Seconds (datasheet rates, no latency) of one all-to-all of `buffer_bytes` per rank: each rank keeps
    1/n, sends (per_node - 1)/n over the node's mesh and the rest over its inter-node link, both at once.
    Taught in: no notebook; doctor/cost.py calls it."""
    n, r = sp["size"], sp["per_node"]
    if n < 2:
        return 0.0
    intra = (r - 1) / n * buffer_bytes / _intra_bw(hw, r) if r > 1 else 0.0
    inter = (n - r) / n * buffer_bytes / hw.inter_bytes_per_s if sp["nodes"] > 1 else 0.0
    return max(intra, inter)


def placement(lay: Any, dialect: str, devices_per_node: int) -> list[dict]:
    """Every group of the layout with its span, for the report: rows of group, size, span, nodes, link.
    Taught with the rest of doctor/topology.py in notebooks/12_your_config.ipynb."""
    out = []
    for name, ranks in groups(lay, dialect).items():
        sp = span(ranks, devices_per_node)
        out.append({"group": name, **sp, "ranks": ranks})
    return out


def rank_map(lay: Any, dialect: str, devices_per_node: int, limit: int = 64) -> list[dict]:
    """Rank -> (node, device, pp, dp, cp, tp, ep index) for the first `limit` ranks (notebook 12's table).
    Taught in notebooks/12_your_config.ipynb."""
    _check([0], devices_per_node)
    if not (isinstance(limit, int) and not isinstance(limit, bool) and limit > 0):
        raise DoctorError("limit", limit, "a positive integer: how many ranks to list")
    fam = _family(dialect)
    rows = []
    for r in range(min(limit, lay.devices)):
        node, dev = node_of(r, devices_per_node)
        t = r % lay.tp
        c = (r // lay.tp) % lay.cp
        d = (r // (lay.tp * lay.cp)) % lay.dp
        p = r // (lay.tp * lay.cp * lay.dp)
        ep = max(1, lay.ep)
        e = ((d * lay.cp + c) % ep) if fam == "r1.x" else (r % (lay.dp * lay.cp * lay.tp)) % ep
        rows.append({"rank": r, "node": node, "device": dev, "pp": p, "dp": d, "cp": c, "tp": t, "ep_index": e})
    return rows
