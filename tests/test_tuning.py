"""mshelpers.tuning: MindIR round trip, AOE command/switches, and the autotune loop."""
from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest

from mshelpers import tuning as T


# ----------------------------------------------------------------------------- MindIR
def test_mindir_roundtrip_of_tiny_llama_is_bitwise_identical(tmp_path):
    import mindspore as ms

    from mshelpers.config import RunConfig
    from mshelpers.device import setup
    from mshelpers.model import build_model

    cfg = RunConfig.preset("tiny").replace(mode="graph")
    setup(mode="graph", device="CPU", seed=0)
    net = build_model(cfg)
    net.set_train(False)                               # inference graph: input_ids -> logits
    x = ms.Tensor(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, cfg.seq_len)).astype(np.int32))
    r = T.mindir_roundtrip(net, x, tmp_path / "tiny")
    assert r["identical"] and r["max_abs_diff"] == 0.0
    assert r["output_shape"] == (1, cfg.seq_len, cfg.vocab_size)
    assert r["file"].endswith("tiny.mindir") and os.path.getsize(r["file"]) > 0
    # The parameters dominate the file: 4 bytes per float32 parameter, within 20%.
    n_params = sum(p.size for p in net.get_parameters())
    assert 0.8 < r["file_mb"] * 2**20 / (4 * n_params) < 1.2
    cell, load_s = T.load_mindir(r["file"])
    assert load_s >= 0 and np.array_equal(cell(x)[0].asnumpy(), net(x)[0].asnumpy())


def test_mindir_helpers_reject_bad_input(tmp_path):
    with pytest.raises(ValueError, match="load_mindir"):
        T.load_mindir(tmp_path / "missing.mindir")
    with pytest.raises(ValueError, match="inputs"):
        T.export_mindir(object(), [np.zeros(3)], tmp_path / "x")


# ----------------------------------------------------------------------------- AOE
def test_aoe_command_for_air_model(tmp_path):
    cmd = T.aoe_command("build/mini.air", 2, tmp_path)
    assert cmd == ["aoe", "--model=build/mini.air", "--framework=1", "--job_type=2",
                   f"--output={tmp_path / 'mini_aoe'}"]
    assert T.aoe_command("m.onnx", "1", tmp_path)[2:4] == ["--framework=5", "--job_type=1"]
    assert T.aoe_env(tmp_path)["TUNE_BANK_PATH"].endswith("tune_bank")


@pytest.mark.parametrize("args, match", [
    (("mini.mindir", 2, "out"), "MindIR"),
    (("mini.txt", 2, "out"), "suffix"),
    (("mini.air", 3, "out"), "job_type=3"),
    (("mini.air", True, "out"), "job_type=True"),
    (("mini.air", 1, ""), "output_dir"),
])
def test_aoe_command_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        T.aoe_command(*args)


def test_aoe_available_follows_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert T.aoe_available() is False
    fake = tmp_path / "aoe"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert T.aoe_available() is True


def test_online_tuning_switch_matches_installed_mindspore():
    import mindspore as ms
    api = T.online_tuning_api()
    has_new = hasattr(ms, "device_context") and hasattr(ms.device_context.ascend.op_tuning, "aoe_tune_mode")
    assert api == ("mindspore.device_context.ascend.op_tuning" if has_new else "mindspore.set_context")
    code = T.online_tuning_code(1)
    assert ('aoe_job_type("1")' in code) if has_new else ('"job_type": "1"' in code)
    compile(code, "<online_tuning_code>", "exec")          # the printed lines are valid Python


def test_enable_online_tuning_refuses_cpu():
    from mshelpers.device import DeviceUnavailable, setup
    setup(mode="graph", device="CPU")
    with pytest.raises(DeviceUnavailable, match="aoe_tune_mode"):
        T.enable_online_tuning(2)


# ----------------------------------------------------------------------------- autotune
def test_autotune_picks_lowest_median_round_robin_and_saves(tmp_path):
    cost = {1: [0.30, 0.31, 0.90], 2: [0.20, 0.50, 0.21], 4: [0.25, 0.26, 0.24]}
    calls = []

    def measure(cfg):
        k = cfg["grad_accum"]
        calls.append(k)
        return cost[k][sum(1 for c in calls if c == k) - 1]

    cands = [{"grad_accum": 1}, {"grad_accum": 2}, {"grad_accum": 4}]
    res = T.autotune(cands, measure, repeats=3, save_to=tmp_path / "t.json", baseline={"grad_accum": 1},
                     progress=False)
    assert calls == [1, 2, 4, 2, 4, 1, 4, 1, 2]                     # interleaved in rotated order, not blocked
    assert res.best == {"grad_accum": 2}                             # median 0.21 < 0.25 < 0.31
    assert [r["config"]["grad_accum"] for r in res.rows] == [2, 4, 1]
    assert res.rows[0]["median_s"] == pytest.approx(0.21)
    assert res.speedup == pytest.approx(0.31 / 0.21)
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["best"] == {"grad_accum": 2} and len(saved["results"]) == 3
    assert T.load_best(tmp_path / "t.json") == {"grad_accum": 2}


def test_autotune_accepts_all_repeats_from_one_call():
    calls = []

    def measure(cfg):
        calls.append(cfg["t"])
        return [cfg["t"]] * 3

    res = T.autotune([{"t": 2.0}, {"t": 1.0}], measure, repeats=3, progress=False)
    assert calls == [2.0, 1.0] and res.best == {"t": 1.0}


def test_autotune_aa_control_times_the_baseline_twice_per_repeat_and_never_picks_the_copy(tmp_path):
    calls = []
    seq = {1: iter([0.30, 0.32, 0.31, 0.29, 0.33, 0.30]), 2: iter([0.20, 0.21, 0.22])}

    def measure(cfg):
        calls.append(cfg["k"])
        return next(seq[cfg["k"]])

    res = T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, baseline={"k": 1}, aa_control=True,
                     progress=False, save_to=tmp_path / "t.json")
    # slots (k1, k2, k1's copy) in rotated order: 0 1 2, then 1 2 0, then 2 0 1; the copy is first in the last repeat
    assert calls == [1, 2, 1, 2, 1, 1, 1, 1, 2]
    base = next(r for r in res.rows if r["config"] == {"k": 1})
    assert base["samples_s"] == [0.30, 0.29, 0.30] and base["aa_samples_s"] == [0.32, 0.31, 0.33]
    assert len(res.rows) == 2 and res.best == {"k": 2} and "aa_samples_s" not in res.rows[0]
    assert json.loads((tmp_path / "t.json").read_text())["aa_control"] is True
    with pytest.raises(ValueError, match="aa_control=True needs a baseline"):
        T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, aa_control=True, progress=False)
    with pytest.raises(ValueError, match="repeats >= 2"):
        T.autotune([{"k": 1}, {"k": 2}], measure, repeats=1, baseline={"k": 1}, aa_control=True, progress=False)


def _noisy_measure(sigma, cand_factor=1.0, seed=0):
    """seconds per call: baseline (and its A/A copy) 1.0, the candidate `cand_factor`, each times lognormal noise"""
    import numpy as np
    rng, calls = np.random.default_rng(seed), []

    def measure(cfg):
        calls.append(cfg["k"])
        return float((cand_factor if cfg["k"] == 2 else 1.0) * np.exp(sigma * rng.standard_normal()))
    return measure, calls


def test_autotune_budget_adds_repeats_only_while_a_verdict_cannot_tell():
    # a clear regression decides at `repeats`: nothing added
    measure, calls = _noisy_measure(0.01, cand_factor=2.0)
    res = T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, baseline={"k": 1}, aa_control=True,
                     budget_s=60, max_repeats=8, progress=False)
    assert res.meta["repeats"] == 3 and len(calls) == 9
    # a no-op on a machine this noisy stays 'too noisy': repeats are added, whole (3 slots each), up to max_repeats
    measure, calls = _noisy_measure(0.3)
    res = T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, baseline={"k": 1}, aa_control=True,
                     budget_s=60, max_repeats=6, progress=False)
    base = next(r for r in res.rows if r["config"] == {"k": 1})
    assert res.meta["repeats"] == 6 and len(calls) == 18 and len(base["samples_s"]) == len(base["aa_samples_s"]) == 6
    assert calls[9:12] == [1, 2, 1]                                  # the rotation goes on: repeat 4 starts at slot 0
    # the same noise with no budget: exactly `repeats`
    measure, calls = _noisy_measure(0.3)
    assert T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, baseline={"k": 1}, aa_control=True,
                      progress=False).meta["repeats"] == 3
    # a budget the next repeat does not fit in: stops at `repeats`
    import time

    def slow(cfg, inner=_noisy_measure(0.3)[0]):
        time.sleep(0.02)
        return inner(cfg)
    assert T.autotune([{"k": 1}, {"k": 2}], slow, repeats=3, baseline={"k": 1}, aa_control=True, budget_s=0.2,
                      max_repeats=9, progress=False).meta["repeats"] == 3
    # a decided 'within noise' whose band is wider than narrow_to: repeats are added for narrow_to alone
    measure, calls = _noisy_measure(0.02)
    assert T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, baseline={"k": 1}, aa_control=True, budget_s=60,
                      max_repeats=5, progress=False).meta["repeats"] == 3
    measure, calls = _noisy_measure(0.02)
    assert T.autotune([{"k": 1}, {"k": 2}], measure, repeats=3, baseline={"k": 1}, aa_control=True, budget_s=60,
                      max_repeats=5, narrow_to=0.001, progress=False).meta["repeats"] == 5


@pytest.mark.parametrize("kw, match", [
    (dict(budget_s=-1), "budget_s=-1"),
    (dict(budget_s=True), "budget_s=True"),
    (dict(budget_s=10, aa_control=False), "aa_control=True with it"),
    (dict(budget_s=10, max_repeats=2), "max_repeats=2 is below repeats=3"),
    (dict(budget_s=10, narrow_to=1.5), "narrow_to=1.5"),
])
def test_autotune_rejects_a_bad_budget(kw, match):
    args = dict(repeats=3, baseline={"k": 1}, aa_control=True, progress=False) | kw
    with pytest.raises(ValueError, match=match):
        T.autotune([{"k": 1}, {"k": 2}], lambda c: 1.0, **args)


@pytest.mark.parametrize("cands, repeats, match", [
    ([], 3, "candidates"),
    ({"a": 1}, 3, "candidates"),
    ([{"a": 1}, {"a": 1}], 3, "duplicates"),
    ([{"a": 1}], 0, "repeats=0"),
])
def test_autotune_rejects_bad_input(cands, repeats, match):
    with pytest.raises(ValueError, match=match):
        T.autotune(cands, lambda c: 1.0, repeats=repeats, progress=False)


def test_autotune_rejects_non_finite_measurements_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="finite"):
        T.autotune([{"a": 1}], lambda c: float("nan"), repeats=1, progress=False)
    with pytest.raises(ValueError, match="load_best"):
        T.load_best(tmp_path / "none.json")


def test_cpu_knob_helpers_validate():
    with pytest.raises(ValueError, match="n=0"):
        T.set_cpu_op_threads(0)
    from mshelpers.config import RunConfig
    with pytest.raises(ValueError, match="steps=0"):
        T.TrainStepTimer(RunConfig.preset("tiny"), steps=0)
