"""The stability layer: a spike detector that flags exactly the planted spikes, and a training guard that
rolls back, skips the batch and continues, on real CLI runs over a poisoned and a clean byte-level corpus."""
import random
import subprocess
import sys

import pytest

from mshelpers.stability import SpikeDetector, find_spikes, write_text_corpus
from mshelpers.table import read_csv


def noisy_decay(n=300, seed=0):
    rng = random.Random(seed)
    return [2.0 + 4.0 * 0.98 ** i + rng.gauss(0, 0.05) for i in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_no_false_positive_on_a_noisy_decaying_curve(seed):
    assert find_spikes(noisy_decay(seed=seed)) == []


@pytest.mark.parametrize("seed", range(5))
def test_planted_spikes_are_flagged_exactly(seed):
    curve = noisy_decay(seed=seed)
    planted = [40, 41, 120, 200, 299]
    for i in planted:
        curve[i] += 1.5                      # a jump of 30 noise sigmas
    assert find_spikes(curve) == planted


def test_one_sided_fast_drops_are_not_spikes_and_nonfinite_always_is():
    det = SpikeDetector(window=10, warmup=5)
    for x in [5, 5.1, 4.9, 5.0, 5.05, 4.95, 2.0, 1.0]:   # falling fast is good news, never flagged
        assert det.update(x) is False
    assert det.update(float("nan")) is True and "non-finite" in det.last_reason


def test_grad_norm_alone_does_not_flag_but_with_the_loss_it_does():
    det = SpikeDetector(window=10, warmup=5)
    for i in range(10):
        det.update(3.0 + 0.01 * (i % 3), grad_norm=1.0 + 0.01 * (i % 2))
    assert det.update(3.01, grad_norm=30.0) is False           # heavy-tailed grad norms on clean data
    assert det.update(3.07, grad_norm=30.0) is True and det.last_reason.startswith("grad norm")


def test_state_round_trip_gives_the_same_decisions():
    curve = noisy_decay(seed=1)
    curve[150] += 2
    a = SpikeDetector()
    first = [a.update(x) for x in curve[:100]]
    b = SpikeDetector().load_state_dict(a.state_dict())
    assert [a.update(x) for x in curve[100:]] == [b.update(x) for x in curve[100:]]
    assert first.count(True) == 0


@pytest.mark.parametrize("kw, field", [(dict(window=2), "window"), (dict(threshold=0), "threshold"),
                                       (dict(threshold=float("nan")), "threshold"), (dict(warmup=-1), "warmup")])
def test_bad_settings_are_named(kw, field):
    with pytest.raises(ValueError, match=f"{field}="):
        SpikeDetector(**kw)


# ---------------------------------------------------------------- the guard, through the real CLI
STEPS = 120


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return {"clean": write_text_corpus(d / "clean.txt", 200_000, seed=0)["path"],
            "poisoned": write_text_corpus(d / "poisoned.txt", 200_000, seed=0, poison=0.01)["path"]}


def cli(out, data, *args):
    cmd = [sys.executable, "-m", "mshelpers.train", "--preset", "tiny", "--set", "mode=graph", "--set", f"data={data}",
           "--set", "spike_guard=true", "--quiet", "--out", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout + p.stderr


@pytest.fixture(scope="module")
def poisoned_run(tmp_path_factory, corpora):
    """One straight guarded run over the poisoned corpus (checkpoints every 20 steps), shared by two tests."""
    out = tmp_path_factory.mktemp("poisoned") / "s"
    return out, cli(out, corpora["poisoned"], "--steps", str(STEPS), "--ckpt-every", "20")


def test_guard_rolls_back_on_poison_and_never_on_clean_data(tmp_path, corpora, poisoned_run):
    out, poisoned = poisoned_run
    clean = cli(tmp_path / "c", corpora["clean"], "--steps", str(STEPS))
    assert poisoned.count("rolled back step") >= 1
    assert "rolled back" not in clean
    rows = read_csv(out / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))          # every step once, redone ones marked
    assert sum(r["spike"] for r in rows) == poisoned.count("rolled back step")
    assert not any(r["spike"] for r in read_csv(tmp_path / "c" / "metrics.csv"))


def test_rollback_then_resume_is_deterministic(tmp_path, corpora, poisoned_run):
    s_out, straight = poisoned_run
    # the first half is planned for the whole run (its lr schedule has STEPS entries), then stops half-way
    cli(tmp_path / "r", corpora["poisoned"], "--set", f"steps={STEPS}", "--steps", str(STEPS // 2), "--ckpt-every", "20")
    resumed = cli(tmp_path / "r", corpora["poisoned"], "--steps", str(STEPS), "--ckpt-every", "20", "--resume")
    a, b = read_csv(s_out / "metrics.csv"), read_csv(tmp_path / "r" / "metrics.csv")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and [r["spike"] for r in a] == [r["spike"] for r in b]
    skipped = lambda out: out.split("skipped data positions ")[-1].split("]")[0]
    assert "rolled back step" in straight and skipped(straight) == skipped(resumed)


def test_rollback_restores_weights_moments_and_step_counter_inside_the_compiled_step():
    import mindspore as ms
    import numpy as np
    from mshelpers.config import RunConfig
    from mshelpers.data import numpy_batches
    from mshelpers.device import setup
    from mshelpers.model import build_model
    from mshelpers.train import _SpikeGuard, make_optimizer, make_train_step
    cfg = RunConfig.preset("tiny").replace(mode="graph", steps=10)
    setup(mode="graph", seed=0)
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    step = make_train_step(net, opt, cfg)
    guard = _SpikeGuard(cfg, net, opt, step.loss_scaler)
    batches = numpy_batches(cfg)
    step(ms.Tensor(next(batches), ms.int32))
    guard.snapshot()
    before = [p.asnumpy().copy() for p in guard.params]
    step(ms.Tensor(next(batches), ms.int32))
    assert any(not np.array_equal(a, p.asnumpy()) for a, p in zip(before, guard.params))
    guard.roll_back(2, 9.9, 1.0, skipped=1)
    assert all(np.array_equal(a, p.asnumpy()) for a, p in zip(before, guard.params))
    step(ms.Tensor(next(batches), ms.int32))          # the compiled step must see the restored buffers
    assert int(opt.global_step.asnumpy()[0]) == 2
