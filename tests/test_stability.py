"""The stability layer: a spike detector that flags exactly the planted spikes, and a training guard that
rolls back, skips the batch and continues, on real CLI runs over a poisoned and a clean byte-level corpus."""
import random

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


def test_the_defaults_are_the_documented_ones_and_the_state_names_them():
    assert SpikeDetector().state_dict() == {"window": 20, "threshold": 6.0, "warmup": 10, "rel_floor": 0.005,
                                            "losses": [], "grad_norms": [], "accepted": 0}


@pytest.mark.parametrize("kw", [dict(window=3), dict(warmup=0), dict(window=3, warmup=0, threshold=1, rel_floor=1e-9)])
def test_the_smallest_settings_are_accepted(kw):
    assert SpikeDetector(**kw).state_dict()["window"] == kw.get("window", 20)


@pytest.mark.parametrize("kw, message", [
    (dict(window=5.0), "SpikeDetector: window=5.0 is invalid; fix: pass an integer >= 3"),
    (dict(window=True), "SpikeDetector: window=True is invalid; fix: pass an integer >= 3"),
    (dict(warmup=-1), "SpikeDetector: warmup=-1 is invalid; fix: pass an integer >= 0"),
    (dict(rel_floor=0), "SpikeDetector: rel_floor=0 is invalid; fix: pass a finite number > 0"),
    (dict(threshold=True), "SpikeDetector: threshold=True is invalid; fix: pass a finite number > 0")])
def test_bad_settings_are_one_line_with_the_fix(kw, message):
    with pytest.raises(ValueError) as e:
        SpikeDetector(**kw)
    assert str(e.value) == message


def _bar(ys, k=6.0, rel_floor=0.005):
    """The detector's bar, computed here independently with numpy: Theil-Sen line over the history, MAD of its
    residuals x 1.4826 (floored at rel_floor x |median|), bar = max(trend at the next x, median) + k sigma."""
    import numpy as np
    y = np.asarray(ys, float)
    n, x = len(y), np.arange(len(y))
    slope = np.median([(y[j] - y[i]) / (j - i) for i in range(n) for j in range(i + 1, n)])
    icept = np.median(y - slope * x)
    resid = y - (icept + slope * x)
    sigma = max(1.4826 * np.median(np.abs(resid - np.median(resid))), rel_floor * abs(np.median(y)))
    return max(icept + slope * n, np.median(y)), sigma


@pytest.mark.parametrize("ys", [
    [1.0, 2.0, 3.0, 4.0, 6.0],                    # rising: the trend sets the bar (slope 1, not 1.125 without neighbours)
    [1.0, 2.2, 2.9, 4.3, 4.8, 6.4, 6.9],          # rising with noise: a MAD above the floor
    [10.0, 10.0, 10.0, 10.0],                     # flat: the floor, 0.5 % of the median
    [8.0, 7.5, 7.7, 7.1, 7.3, 6.9]])              # falling: the median sets the bar
def test_the_bar_is_the_theil_sen_trend_plus_k_robust_sigmas(ys):
    det = SpikeDetector(window=len(ys), warmup=0).load_state_dict({"losses": ys, "grad_norms": [], "accepted": len(ys)})
    level, sigma = _bar(ys)
    bar = level + 6.0 * sigma
    state = det.state_dict()
    assert det.update(bar) is False and det.last_reason == ""           # at the bar: not above it
    det.load_state_dict(state)
    assert det.update(bar * (1 + 1e-6) + 1e-9) is True
    assert det.last_reason == f"loss {bar * (1 + 1e-6) + 1e-9:.4g} > trend {level:.4g} + 6.0 x robust sigma {sigma:.4g}"


def test_three_values_are_enough_history_and_warmup_counts_accepted_values():
    det = SpikeDetector(window=5, warmup=3)
    assert [det.update(5.0) for _ in range(3)] == [False] * 3 and det.last_reason == ""
    assert det.update(9.0) is True and det.last_reason.startswith("loss 9 > trend 5 + ")
    assert det.update(5.0) is False and det.last_reason == ""           # the reason is cleared on the next step
    assert det.state_dict()["accepted"] == 4
    early = SpikeDetector(window=5, warmup=0)
    assert early.update(5.0) is False and early.last_reason == ""       # no history yet: nothing to compare


def test_the_grad_norm_counts_from_half_the_threshold_of_the_loss():
    # a flat loss of 10: sigma is the floor, 0.05, so half the threshold (3 sigmas) is 10.15
    for loss, flagged in ((10.125, False), (10.175, True)):
        det = SpikeDetector(window=8, warmup=4)
        for _ in range(8):
            det.update(10.0, grad_norm=1.0)
        assert det.update(loss, grad_norm=50.0) is flagged
        assert det.last_reason.startswith("grad norm 50 > ") is flagged


def test_a_state_with_a_longer_history_keeps_the_window_and_the_grad_norms():
    det = SpikeDetector(window=4).load_state_dict(
        {"losses": [1, 2, 3, 4, 5, 6], "grad_norms": ["0.5", 0.25, 1, 2, 3, 4], "accepted": "6"})
    assert det.state_dict()["losses"] == [3.0, 4.0, 5.0, 6.0] and det.state_dict()["grad_norms"] == [1.0, 2.0, 3.0, 4.0]
    assert det.accepted == 6
    det.update(7.0, grad_norm=5.0)
    assert list(det.losses) == [4.0, 5.0, 6.0, 7.0] and list(det.grad_norms) == [2.0, 3.0, 4.0, 5.0]


def test_a_state_that_is_not_a_state_dict_is_one_line():
    with pytest.raises(ValueError) as e:
        SpikeDetector().load_state_dict({"losses": []})
    assert str(e.value) == "SpikeDetector.load_state_dict: missing ['accepted', 'grad_norms']; fix: pass a state_dict()"


def test_the_text_corpus_is_seeded_zipf_sentences_of_4_to_14_words(tmp_path):
    import collections
    import re
    from mshelpers import stability
    with_tmp = str(tmp_path)
    a = write_text_corpus(f"{with_tmp}/x/y/a.txt", seed=3)              # the folders are created
    assert a["bytes"] == 200_000 and a["poison_start"] == a["poison_end"] == 100_000
    text = a["path"].read_bytes()
    assert len(text) == 200_000 and text == write_text_corpus(f"{with_tmp}/b.txt", seed=3)["path"].read_bytes()
    assert text != write_text_corpus(f"{with_tmp}/c.txt", seed=4)["path"].read_bytes()
    sentences = re.findall(r"([A-Z][a-z ]*)\. ", text.decode("ascii"))[:-1]     # the last one may be cut
    lengths = collections.Counter(len(s.split()) for s in sentences)
    assert min(lengths) == 4 and max(lengths) == 14 and len(lengths) == 11
    words = collections.Counter(w.lower() for s in sentences for w in s.split())
    assert set(words) <= set(stability._WORDS)
    top = [w for w, _ in words.most_common(3)]
    assert top == list(stability._WORDS[:3])                            # Zipf: the first words lead, in order
    assert 1.7 < words["the"] / words["of"] < 2.3                       # weight 1/1 against 1/2
    assert write_text_corpus(f"{with_tmp}/d.txt", n_bytes=1000)["path"].read_bytes()[:1000] == \
        write_text_corpus(f"{with_tmp}/e.txt", n_bytes=1000, seed=0)["path"].read_bytes()   # seed 0 by default


def test_the_poisoned_corpus_is_the_clean_one_with_random_bytes_in_its_region(tmp_path):
    clean = write_text_corpus(tmp_path / "clean.txt", n_bytes=20_000, seed=1)["path"].read_bytes()
    p = write_text_corpus(tmp_path / "p.txt", n_bytes=20_000, seed=1, poison=0.1, poison_at=0.3)
    data = p["path"].read_bytes()
    assert (p["poison_start"], p["poison_end"], p["bytes"]) == (6000, 8000, 20_000)
    assert data[:6000] == clean[:6000] and data[8000:] == clean[8000:]
    region = data[6000:8000]
    assert sum(b >= 128 for b in region) > 800 and sum(a != b for a, b in zip(region, clean[6000:8000])) > 1900
    assert region == write_text_corpus(tmp_path / "q.txt", n_bytes=20_000, seed=1, poison=0.1,
                                       poison_at=0.3)["path"].read_bytes()[6000:8000]
    half = write_text_corpus(tmp_path / "h.txt", n_bytes=20_000, seed=1, poison=0.1)        # at the middle by default
    assert (half["poison_start"], half["poison_end"]) == (10_000, 12_000)


@pytest.mark.parametrize("kw", [dict(poison=0.5), dict(poison=-0.01), dict(poison_at=1.0), dict(poison_at=-0.1)])
def test_a_bad_poison_setting_is_one_line(tmp_path, kw):
    with pytest.raises(ValueError) as e:
        write_text_corpus(tmp_path / "x.txt", n_bytes=100, **kw)
    args = {"poison": 0.0, "poison_at": 0.5, **kw}
    assert str(e.value) == (f"write_text_corpus: poison={args['poison']}, poison_at={args['poison_at']}; "
                            "fix: 0 <= poison < 0.5, 0 <= poison_at < 1")
    assert not (tmp_path / "x.txt").exists()


def test_the_corpus_has_exactly_the_bytes_asked_for_and_nothing_but_sentences(tmp_path):
    text = write_text_corpus(tmp_path / "a.txt", n_bytes=3000)["path"].read_bytes().decode("ascii")
    assert set(text) <= set("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.")
    assert all(i == 0 or text[i - 2:i] == ". " for i, ch in enumerate(text) if ch.isupper())
    # a size one byte past the end of a sentence: the writer must not stop a byte short
    ends = [i + 2 for i in range(len(text) - 1) if text[i:i + 2] == ". "]
    for n in (ends[3] + 1, ends[10] + 1, ends[10]):
        assert len(write_text_corpus(tmp_path / f"{n}.txt", n_bytes=n)["path"].read_bytes()) == n
    p = write_text_corpus(tmp_path / "z.txt", n_bytes=1000, poison=0.2, poison_at=0.0)   # at the very start
    assert (p["poison_start"], p["poison_end"]) == (0, 200)


def test_a_fresh_detector_has_no_reason_and_bounded_histories():
    det = SpikeDetector(window=4, warmup=2)
    assert det.last_reason == "" and det.accepted == 0
    for i in range(9):
        det.update(5.0, grad_norm=1.0 + i)
    assert len(det.losses) == len(det.grad_norms) == 4 and list(det.grad_norms) == [6.0, 7.0, 8.0, 9.0]


def test_find_spikes_passes_its_settings_to_the_detector():
    curve = [5.0] * 6 + [5.5]
    assert find_spikes(curve) == []                                     # default warm-up 10: too early
    assert find_spikes(curve, warmup=3, window=5) == [6]


# ---------------------------------------------------------------- the guard, through the real CLI
STEPS = 120


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    return {"clean": write_text_corpus(d / "clean.txt", 200_000, seed=0)["path"],
            "poisoned": write_text_corpus(d / "poisoned.txt", 200_000, seed=0, poison=0.01)["path"]}


def cli(out, data, *args):
    """`python -m mshelpers.train ...`, forked from a server that imported MindSpore once (tests/cli_fork.py)."""
    import cli_fork
    cmd = ["--preset", "tiny", "--set", "mode=graph", "--set", f"data={data}",
           "--set", "spike_guard=true", "--quiet", "--compile-cache", cli_fork.COMPILE_CACHE, "--out", str(out), *args]
    p = cli_fork.run(cmd, timeout=600)
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
    from mshelpers.stability import SpikeGuard
    from mshelpers.train import make_optimizer, make_train_step
    cfg = RunConfig.preset("tiny").replace(mode="graph", steps=10)
    setup(mode="graph", seed=0)
    net = build_model(cfg)
    opt = make_optimizer(net, cfg)
    step = make_train_step(net, opt, cfg)
    guard = SpikeGuard(cfg, net, opt, step.loss_scaler)
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


# ---------------------------------------------------------------- the guard's parts, in-process (fast; mutmut runs these)
def _guard_parts(window=5, threshold=6.0, scaler="dynamic"):
    import mindspore as ms
    import numpy as np
    from types import SimpleNamespace
    from mindspore import amp, nn
    from mshelpers.stability import SpikeGuard
    ms.set_seed(0)
    net = nn.Dense(4, 3)
    opt = nn.Adam(net.trainable_params(), 0.1)
    sc = {"dynamic": amp.DynamicLossScaler(1024.0, 2, 50), "static": amp.StaticLossScaler(8.0), None: None}[scaler]
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.zeros((2, 3), np.float32))
    guard = SpikeGuard(SimpleNamespace(spike_window=window, spike_threshold=threshold), net, opt, sc)
    return guard, net, opt, sc, lambda: float(step(x, y).asnumpy())


def test_the_guard_holds_every_parameter_once_and_the_scalers_state():
    guard, net, opt, sc, _ = _guard_parts(window=5, threshold=4.0)
    names = [p.name for p in net.get_parameters()]
    names += [p.name for p in opt.get_parameters() if p.name not in names]
    assert [p.name for p in guard.params[:-2]] == names and len(names) == len(set(names))
    assert guard.params[-2] is sc.scale_value and guard.params[-1] is sc.counter
    assert all(a is b for a, b in zip(guard.params, list(net.get_parameters())))   # the net's own Parameters
    assert (guard.detector.window, guard.detector.threshold, guard.detector.warmup) == (5, 4.0, 5)
    assert guard.saved == [] and guard.events == []
    assert _guard_parts(window=30)[0].detector.warmup == 10                       # min(10, window)
    static, _, _, ssc, _ = _guard_parts(scaler="static")
    assert static.params[-1] is ssc.scale_value and all(p.name != "counter" for p in static.params)
    plain = _guard_parts(scaler=None)[0]
    assert len(plain.params) == len(names)


def test_roll_back_restores_the_snapshot_records_the_event_and_says_so(capsys):
    import numpy as np
    guard, net, opt, sc, step = _guard_parts()
    step()
    guard.snapshot()
    before = [p.asnumpy().copy() for p in guard.params]
    assert all(np.array_equal(a, b) for a, b in zip(guard.saved, before))
    sc.scale_value.set_data(sc.scale_value * 2)
    step()
    assert not np.array_equal(net.weight.asnumpy(), before[0])
    assert not np.array_equal(guard.saved[0], net.weight.asnumpy())             # the snapshot is a copy
    for _ in range(5):
        guard.is_spike(1.0, 1.0)
    assert guard.is_spike(1.0, float("nan")) is True                            # the grad norm reaches the detector
    guard.roll_back(7, 9.5, float("nan"), skipped=6)
    assert all(np.array_equal(a, p.asnumpy()) for a, p in zip(before, guard.params))
    assert guard.events == [{"step": 7, "loss": 9.5, "grad_norm": guard.events[0]["grad_norm"],
                             "trigger": "non-finite: loss 1.0, grad norm nan", "skipped_data_pos": 6}]
    assert capsys.readouterr().out == ("rolled back step 7: non-finite: loss 1.0, grad norm nan; skipped data "
                                       "position 6; redoing step 7 on the next batch\n")


def test_a_spike_storm_of_5_in_50_steps_stops_the_run_and_names_them():
    from mshelpers.stability import SpikeGuard, SpikeStorm
    guard, *_ = _guard_parts()
    guard.snapshot()
    assert (SpikeGuard.MAX_ROLLBACKS, SpikeGuard.WITHIN) == (5, 50)
    for step in (10, 20, 30, 40, 60):          # at step 60 the window is steps 11..60: step 10 left it, 4 remain
        guard.roll_back(step, 5.0, 1.0, skipped=step + 100)
    with pytest.raises(SpikeStorm) as e:
        guard.roll_back(61, 5.0, 1.0, skipped=161)
    assert str(e.value) == ("spike guard: 5 rollbacks within 50 steps (steps [20, 30, 40, 60, 61], skipped data "
                            "positions [120, 130, 140, 160, 161]); fix: lower lr or inspect those batches rather "
                            "than skipping more")
    assert len(guard.events) == 6


def test_the_guard_state_is_saved_beside_its_checkpoint_and_loaded_in_place(tmp_path):
    import json
    guard, *_ = _guard_parts(window=4)
    for v in (3.0, 3.1, 2.9, 3.0, 3.05):
        guard.is_spike(v, 1.0)
    guard.events.append({"step": 3, "skipped_data_pos": 2})
    assert json.loads(guard.state()) == {"detector": guard.detector.state_dict(), "events": guard.events}
    for n in (2, 3):
        (tmp_path / f"step_00000{n}.ckpt").write_bytes(b"x")
    (tmp_path / "step_000001.guard.json").write_text("{}")                    # its checkpoint was pruned
    (tmp_path / "step_000003.guard.json").write_text("{}")                    # its checkpoint is there
    (tmp_path / "notes.guard.json").write_text("{}")                          # not a sidecar
    guard.save(tmp_path / "step_000002.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.guard.json", "step_000002.ckpt", "step_000002.guard.json", "step_000003.ckpt", "step_000003.guard.json"]
    assert (tmp_path / "step_000002.guard.json").read_text() == guard.state()
    guard.save(str(tmp_path / "step_000003.ckpt"), state='{"given": 1}')
    assert (tmp_path / "step_000003.guard.json").read_text() == '{"given": 1}'
    other, *_ = _guard_parts(window=4)
    events = other.events
    other.load(tmp_path / "step_000002.ckpt")
    assert other.events is events and events == guard.events                  # in place: History holds this list
    assert other.detector.state_dict() == guard.detector.state_dict()
    other.load(str(tmp_path / "step_000009.ckpt"))                            # no sidecar: nothing changes
    assert other.events == guard.events and other.detector.state_dict() == guard.detector.state_dict()
    (tmp_path / "step_000004.guard.json").mkdir()                             # a write that cannot land
    with pytest.raises(OSError):
        guard.save(tmp_path / "step_000004.ckpt")
    assert not list(tmp_path.glob(".tmp-*"))


def test_the_guards_line_is_flushed_at_once(monkeypatch):
    """A run killed right after a rollback still shows it: the line leaves the buffer when printed."""
    import io
    import sys
    guard, *_ = _guard_parts()
    guard.snapshot()
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8"))   # buffered, as a pipe is
    guard.roll_back(3, 5.0, 1.0, skipped=2)
    assert raw.getvalue().startswith(b"rolled back step 3: ")


def test_a_stale_sidecar_another_cleaner_removed_first_is_no_error(tmp_path, monkeypatch):
    guard, *_ = _guard_parts()
    (tmp_path / "step_000002.ckpt").write_bytes(b"x")
    gone = tmp_path / "step_000001.guard.json"                          # listed, then deleted by someone else
    monkeypatch.setattr(type(tmp_path), "glob", lambda self, pattern: iter([gone]))
    guard.save(tmp_path / "step_000002.ckpt")
    assert (tmp_path / "step_000002.guard.json").read_text() == guard.state()
