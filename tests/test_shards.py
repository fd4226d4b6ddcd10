"""mshelpers.shards: the shard check exactly, on MindSpore's own dataset shards, and (slow, msrun) 2 data-parallel
ranks that read disjoint shards and train as one process with twice the batch.
"""
from __future__ import annotations


import pytest

from mshelpers import shards
from mshelpers.shards import check_shards
from mshelpers.config import RunConfig
from _checks import module_doctests, refused


def test_doctests():
    tries, failures = module_doctests(shards)
    assert tries >= 5 and failures == 0


def test_check_shards():
    good = check_shards([[0, 2, 4], [1, 3, 5]], range(6))
    assert good["ok"] and good["disjoint"] and good["union_is_full"] and good["duplicate_share"] == 0
    bug = check_shards([[0, 1, 2], [0, 1, 2]], range(6))
    assert not bug["ok"] and bug["pairwise_overlap"] == 3 and bug["missing"] == 3 and bug["duplicate_share"] == 0.5
    with pytest.raises(ValueError, match="per_rank_ids"):
        check_shards([[1], []])


def test_check_shards_exactly():
    assert check_shards([[0, 2], [1, 3]]) == {
        "ranks": 2, "reads": 4, "unique": 4, "pairwise_overlap": 0, "disjoint": True, "duplicate_share": 0.0,
        "union_is_full": None, "ok": True}
    assert check_shards([[0, 1]], range(3)) == {
        "ranks": 1, "reads": 2, "unique": 2, "pairwise_overlap": 0, "disjoint": True, "duplicate_share": 0.0,
        "full": 3, "missing": 1, "extra": 0, "union_is_full": False, "ok": False}
    got = check_shards([[0, 9], [1]], range(2))
    assert (got["extra"], got["missing"], got["union_is_full"], got["ok"]) == (1, 0, False, False)
    assert check_shards([[5]])["ok"] is True                  # one rank, one sample: a valid shard
    # overlapping but complete: not ok, whatever the union says
    assert check_shards([[0, 1], [1]], range(2))["ok"] is False
    for bad in ([], [[0], []]):
        assert refused(shards.check_shards, bad) == (f"check_shards: per_rank_ids has {len(bad)} ranks, some empty; "
                                "fix: pass one non-empty list of sample ids per rank")


def test_mindspore_dataset_shards_are_disjoint_and_complete():
    from mshelpers.data import make_dataset
    from mshelpers.workers.dp_train import window_id
    cfg = RunConfig.preset("tiny")

    def ids(d):
        return [window_id(r) for b in d.create_tuple_iterator(output_numpy=True) for r in b[0]]
    full = ids(make_dataset(cfg, 1, 0, n_windows=32))
    shards = [ids(make_dataset(cfg, 2, r, n_windows=32)) for r in range(2)]
    assert check_shards(shards, full)["ok"]
    half = cfg.replace(batch_size=cfg.batch_size // 2)
    same = [ids(make_dataset(half, 1, 0, n_windows=32)) for _ in range(2)]
    assert not check_shards(same, full)["disjoint"]


def test_two_rank_data_parallel_matches_one_process_with_twice_the_batch(tmp_path):
    """2 ranks x b under msrun with gradients_mean=True follow 1 process x 2b (tiny model, 6 steps)."""
    import subprocess
    import sys
    import numpy as np
    from mshelpers.launch import msrun
    from mshelpers.workers import script_path
    steps = 6
    cfg = RunConfig.preset("tiny").replace(mode="graph", steps=steps, batch_size=8)
    yaml_path = tmp_path / "run.yaml"
    cfg.to_yaml(yaml_path)
    run = msrun(script_path("dp_train"), workers=2, log_dir=tmp_path / "dp", timeout=400,
                args=["--config", str(yaml_path), "--steps", str(steps), "--runs", "sharded", "--threads", "1"])
    r0, r1 = (r["runs"]["sharded"] for r in run.results())
    # the ranks trained on disjoint windows whose union is what one process reads
    from mshelpers.data import numpy_batches
    from mshelpers.workers.dp_train import window_id
    it = numpy_batches(cfg)
    full = [window_id(row) for _ in range(steps) for row in next(it)]
    assert check_shards([r0["window_ids"], r1["window_ids"]], full)["ok"]
    # identical parameters on both ranks
    p0, p1 = (np.load(r.out_dir / "params_sharded.npy") for r in run.ranks)
    assert np.array_equal(p0, p1)
    # the single-process run, in a fresh interpreter (graph compile needs a clean MindSpore context)
    out = tmp_path / "single.npy"
    code = ("import sys, numpy as np\n"
            "from mshelpers.config import RunConfig\nfrom mshelpers.device import setup\n"
            "from mshelpers.workers.dp_train import train_dp\n"
            f"cfg = RunConfig.from_yaml({str(yaml_path)!r})\nsetup(mode='graph', seed=cfg.seed)\n"
            f"np.save({str(out)!r}, np.array(train_dp(cfg, {steps})['losses']))\n")
    script = tmp_path / "single.py"
    script.write_text(code)
    subprocess.run([sys.executable, str(script)], check=True, timeout=400, capture_output=True)
    single = np.load(out)
    dp = (np.array(r0["losses"]) + np.array(r1["losses"])) / 2
    assert abs(dp[0] - single[0]) < 1e-4                  # same weights, same data: rounding only
    assert np.abs(dp - single).max() < 0.02               # the tolerance notebook 04 states
    assert dp[-1] < dp[0]                                 # and it trained
