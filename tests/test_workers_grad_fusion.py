"""workers/grad_fusion.py (notebook 04, section 5): its refusals, the bucket plan, the rotation, the merge of the
ranks' results, and a real 2-rank msrun launch on the tiny preset whose IR says how many all-reduces each reducer
launches (~60 s: five graphs compile on each rank)."""
import json

import pytest

from mshelpers.config import RunConfig
from mshelpers.workers import grad_fusion as gf


@pytest.mark.parametrize("argv, line", [
    (["--rounds", "1"], "--rounds=1 is invalid; fix: pass an integer >= 2"),
    (["--block", "0"], "--block=0 is invalid"),
    (["--sync-block", "0"], "--sync-block=0 is invalid"),
    (["--fit-repeats", "0"], "--fit-repeats=0 is invalid"),
    (["--threads", "-1"], "--threads=-1 is invalid"),
    (["--fusion", "magic"], "--fusion='magic' is unknown; fix: use one of ['bucket', 'context']"),
    (["--bucket-mb", "0"], "--bucket-mb=0.0 is invalid"),
    (["--bucket-mb", "nan"], "--bucket-mb=nan is invalid"),
    (["--bucket-mb", "2.5"], "with --fusion context is invalid; fix: pass a whole number"),
    (["--sizes", "4096"], "at least 2 distinct sizes"),
    (["--sizes", "4096,abc"], "--sizes='4096,abc' is invalid"),
    (["--device", "TPU"], "--device='TPU' is unknown"),
])
def test_bad_arguments_are_refused_in_one_line_before_mindspore(argv, line):
    with pytest.raises(ValueError, match="^grad_fusion: ") as e:
        gf.parse_args(["--config", "run.yaml", *argv])
    assert line in str(e.value) and "\n" not in str(e.value)


def test_defaults_and_explicit_buckets_with_a_fraction():
    a = gf.parse_args(["--config", "run.yaml"])
    assert (a.rounds, a.block, a.sync_block, a.fusion, a.bucket_mb, a.device) == (6, 2, 4, "context", 32.0, "CPU")
    assert a.sizes == list(gf.DEFAULT_FIT_SIZES)
    assert gf.parse_args(["--config", "r", "--fusion", "bucket", "--bucket-mb", "2.5"]).bucket_mb == 2.5


def test_bucket_plan_keeps_order_and_gives_a_large_tensor_its_own_bucket():
    assert gf.bucket_plan([4, 4, 8, 20, 4], 12) == [[0, 1], [2], [3], [4]]
    assert gf.bucket_plan([4] * 5, 1e9) == [[0, 1, 2, 3, 4]]
    assert gf.bucket_plan([4] * 3, 4) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        gf.bucket_plan([4], 0)


def test_rotation_puts_every_candidate_in_every_place():
    names = ["a", "b", "c"]
    orders = [gf.rotated(names, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert all(sorted(o[i] for o in orders) == names for i in range(3))


def _rank(rank, scale):
    return {"rank": rank, "world": 2, "n_tensors": 3, "grad_bytes": 48, "tensor_bytes": [16, 16, 16], "buckets": 1,
            "fusion": "context", "bucket_mb": 32, "rounds": 2, "block": 1, "sync_block": 1, "threads": 1,
            "phases_s": {"compile": 1.0}, "first_call_s": {}, "kernels": {"per-tensor": {"all_reduce": 3}},
            "ir_files": {}, "losses": [1.0], "orders": [["x", "y"], ["y", "x"]],
            "times": {"x": [1.0 * scale, 2.0], "y": [3.0, 4.0 * scale]},
            "fit_rows": [{"bytes": 4096, "times_s": [0.1 * scale, 0.3, 0.25], "median_s": 0.25,
                          "round_medians_s": [0.2 * scale, 0.25]}]}


def test_merge_takes_the_slowest_rank_per_round_and_keeps_rank_0s_graph_facts():
    m = gf.merge_ranks([_rank(0, 1.0), _rank(1, 2.0)])
    assert m["times"] == {"x": [2.0, 2.0], "y": [3.0, 8.0]} and m["ranks"] == 2
    (row,) = m["fit_rows"]
    # per sweep the slowest rank (0.4 then 0.25), and the fastest of those sweeps: a slow spell hits one sweep
    assert row["op"] == "all_reduce" and row["bytes"] == 4096 and row["seconds"] == pytest.approx(0.25)
    assert row["round_medians_s"] == pytest.approx([0.4, 0.25]) and row["repeats"] == 3
    assert row["min_s"] == pytest.approx(0.1) and row["max_s"] == pytest.approx(0.3) and row["ranks"] == 2
    assert m["kernels"] == {"per-tensor": {"all_reduce": 3}} and m["n_tensors"] == 3
    with pytest.raises(ValueError, match="no rank wrote a result"):
        gf.merge_ranks([None, None])


# ---------------------------------------------------------------- a real 2-rank launch (msrun)
def test_two_ranks_count_one_all_reduce_per_tensor_and_fewer_with_comm_fusion(tmp_path):
    from mshelpers.compiling import ir_dump_env
    from mshelpers.launch import msrun
    from mshelpers.workers import script_path

    cfg_path = tmp_path / "run.yaml"
    RunConfig.preset("tiny").replace(mode="graph", dp=2).validate().to_yaml(cfg_path)
    # comm_fusion config 1: 262144-byte buckets over the tiny model's 0.5 MiB of gradients
    run = msrun(script_path("grad_fusion"), workers=2, log_dir=tmp_path / "log", timeout=400,
                env=ir_dump_env(tmp_path / "ir"),
                args=["--config", str(cfg_path), "--rounds", "2", "--block", "1", "--sync-block", "1",
                      "--sizes", "4096,262144", "--fit-repeats", "2", "--threads", "1", "--bucket-mb", "1"])
    m = gf.merge_ranks(run.results())
    n = m["n_tensors"]
    k = {name: v["all_reduce"] for name, v in m["kernels"].items()}
    assert n > 2 and m["grad_bytes"] == sum(m["tensor_bytes"])
    assert k["per-tensor"] == k["sync per-tensor"] == k["sync DistributedGradReducer default"] == n
    assert 1 <= k["fused"] == k["sync fused"] < n and k["backward only"] == 0
    assert set(m["times"]) == set(gf.STEPS) | set(gf.SYNCS)
    assert all(len(v) == 2 and min(v) > 0 for v in m["times"].values())
    assert m["orders"][1] == gf.rotated(list(gf.STEPS) + list(gf.SYNCS), 1)
    assert [r["bytes"] for r in m["fit_rows"]] == [4096, 262144]
    # timed, not fitted: whether 2 sizes' times grow with size is a timing, which a unit test under -n 2 does not
    # assert (a CI run's fit came out with a negative slope); notebook 04 fits them on its own, quieter rounds
    assert all(r["op"] == "all_reduce" and r["seconds"] > 0 for r in m["fit_rows"])
    assert all(x == x and abs(x) < 20 for x in m["losses"])        # finite losses
    json.dumps(m)
