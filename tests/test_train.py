"""mshelpers.train: the runner on the real mindformers model (tiny preset, a few steps: about 30 s), its exact
resume, and MindSpore's compile cache (`train.compile_cache`; was tests/test_resume_exact.py and
tests/test_compile_cache.py). The CLI's tests are in test_train_cli.py, the step's in test_train_step.py."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mshelpers.config import RunConfig
from mshelpers.table import read_csv
from mshelpers.train import lr_at, train


def test_bad_config_fails_before_mindspore_work():
    with pytest.raises(ValueError, match="RunConfig.hidden_size=250"):
        train(RunConfig.preset("tiny").replace(hidden_size=250))
    with pytest.raises(ValueError, match="steps=0"):
        train(RunConfig.preset("tiny"), steps=0)


def test_lr_schedule_warmup_then_cosine():
    cfg = RunConfig.preset("mini").replace(lr=1.0, warmup_steps=4, steps=20)
    assert lr_at(cfg, 2) == pytest.approx(0.5) and lr_at(cfg, 4) == pytest.approx(1.0)
    assert lr_at(cfg, 20) == pytest.approx(0.1) and lr_at(cfg, 12) < lr_at(cfg, 5)


def test_graph_and_pynative_train_the_same_and_loss_falls(tmp_path):
    cfg = RunConfig.preset("tiny").replace(steps=8)
    g = train(cfg.replace(mode="graph"), csv_path=tmp_path / "g.csv", progress=False, peak_flops=1e11)
    p = train(cfg.replace(mode="pynative"), steps=3, csv_path=tmp_path / "p.csv", progress=False, peak_flops=1e11)
    gl = [r["loss"] for r in g.rows]
    assert gl[-1] < gl[0] - 0.5                      # it learns
    assert math.log(cfg.vocab_size) - 0.3 < gl[0] < math.log(cfg.vocab_size) + 0.3
    np.testing.assert_allclose([r["loss"] for r in p.rows], gl[:3], rtol=1e-4)
    rows = read_csv(tmp_path / "g.csv")
    assert len(rows) == 8 and {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "overflow"} <= set(rows[0])
    s = g.summary()
    assert s["compile_time_s"] > s["median_step_s"] and s["overflow_steps"] == 0
    assert g.floor is not None and 0 < g.floor < gl[-1]


def test_grad_accum_matches_one_big_batch(tmp_path):
    cfg = RunConfig.preset("tiny").replace(steps=3, mode="graph", batch_size=4, grad_clip=0.0)
    one = train(cfg, csv_path=tmp_path / "a.csv", progress=False, peak_flops=1e11)
    two = train(cfg.replace(batch_size=2, grad_accum=2), csv_path=tmp_path / "b.csv", progress=False,
                peak_flops=1e11)
    np.testing.assert_allclose([r["loss"] for r in two.rows], [r["loss"] for r in one.rows], rtol=1e-4)


def test_dynamic_loss_scale_is_logged(tmp_path):
    cfg = RunConfig.preset("tiny").replace(steps=3, mode="graph", dynamic_loss_scale=True, loss_scale=2.0 ** 10)
    h = train(cfg, csv_path=tmp_path / "s.csv", progress=False, peak_flops=1e11)
    assert [r["loss_scale"] for r in h.rows] == [1024.0] * 3       # healthy float32 steps: no overflow
    assert [r["overflow"] for r in h.rows] == [False] * 3
    assert [r["loss_scale"] for r in read_csv(tmp_path / "s.csv")] == [1024.0] * 3


class Planted:
    """A one-parameter "model" whose gradient is C x the loss scale, whatever its weight.

    loss = w * C with C = 1e36, so the scaled gradient overflows float32 (3.4e38) exactly when
    the scale exceeds 340: scales 1024 and 512 overflow, 256 does not. The data are ignored.
    """

    @staticmethod
    def build():
        import mindspore as ms
        from mindspore import nn

        class _Net(nn.Cell):
            def __init__(self):
                super().__init__()
                self.w = ms.Parameter(ms.Tensor(np.ones((1,), np.float32)), name="w")

            def construct(self, input_ids):
                return (self.w * 1e36).sum() + 0 * input_ids.astype(ms.float32).mean()
        return _Net()


def test_planted_overflows_halve_the_scale_then_it_grows_after_the_window(tmp_path):
    """The runner's scaler: /2 per overflow, skipped updates, x2 after scale_window=50 good steps."""
    cfg = RunConfig.preset("tiny").replace(steps=53, mode="pynative", dynamic_loss_scale=True,
                                           loss_scale=1024.0, vocab_size=1024, grad_clip=0.0)
    h = train(cfg, net=Planted.build(), csv_path=tmp_path / "p.csv", progress=False, peak_flops=1e11)
    scales = [r["loss_scale"] for r in h.rows]
    overflow = [r["overflow"] for r in h.rows]
    # 1024 -> overflow -> 512 -> overflow -> 256; 50 good steps at 256 (steps 3..52) -> 512 after step 52;
    # step 53 runs at 512 and overflows again -> 256
    assert scales == [512.0, 256.0] + [256.0] * 49 + [512.0, 256.0]
    assert overflow == [True, True] + [False] * 50 + [True]
    assert h.summary()["overflow_steps"] == 3
    assert [r["loss_scale"] for r in read_csv(tmp_path / "p.csv")] == scales


def test_make_loss_scaler_dynamic_and_static():
    from mindspore import amp
    from mshelpers.train import make_loss_scaler
    cfg = RunConfig.preset("tiny").replace(loss_scale=1024.0)
    dyn = make_loss_scaler(cfg.replace(dynamic_loss_scale=True))
    assert isinstance(dyn, amp.DynamicLossScaler)
    assert (float(dyn.scale_value.asnumpy()), dyn.scale_factor, dyn.scale_window) == (1024.0, 2, 50)
    static = make_loss_scaler(cfg.replace(dynamic_loss_scale=False))
    assert isinstance(static, amp.StaticLossScaler) and not isinstance(static, amp.DynamicLossScaler)
    assert float(static.scale_value.asnumpy()) == 1024.0


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_train_step_exact_halving_and_growth_with_a_short_window(mode):
    """make_train_step with its own DynamicLossScaler(window 3): the exact sequence, in both modes."""
    import mindspore as ms
    from mindspore import amp, nn
    from mshelpers.train import make_train_step
    cfg = RunConfig.preset("tiny").replace(mode=mode, dynamic_loss_scale=True, grad_clip=0.0)
    net = Planted.build()
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-36)
    step = make_train_step(net, opt, cfg, loss_scaler=amp.DynamicLossScaler(2048.0, 2, 3))
    x = ms.Tensor(np.zeros((2, 4), np.int32))
    scales, finite, w = [], [], []
    for _ in range(9):
        _, _, ok, scale = step(x)
        scales.append(float(scale.asnumpy()))
        finite.append(bool(ok.asnumpy()))
        w.append(float(net.w.asnumpy()[0]))
    # 2048, 1024, 512 overflow; 3 good steps at 256 -> 512 (overflows) -> 256; 3 good -> 512
    assert scales == [1024.0, 512.0, 256.0, 256.0, 256.0, 512.0, 256.0, 256.0, 256.0]
    assert finite == [False, False, False, True, True, True, False, True, True]
    assert w[:3] == [1.0, 1.0, 1.0] and w[3] == pytest.approx(0.0, abs=1e-6)   # SGD: 1 - 1e-36 * 1e36
    assert w[5] == w[6]                                                       # the 7th step was skipped


def test_history_summary_takes_its_medians_after_skip_first_steps():
    from mshelpers.config import RunConfig
    from mshelpers.train import History
    rows = [{"step": i, "step_time_s": t, "tokens_per_s": 1024 / t, "mfu": 0.1 / t, "loss": 7.0 - i,
             "peak_mem_mb": 100.0, "overflow": False} for i, t in enumerate([9.0, 3.0, 3.0, 2.0, 1.0, 1.0], 1)]
    h = History(cfg=RunConfig.preset("tiny"), rows=rows)
    assert h.summary()["median_step_s"] == 2.0 and h.summary()["compile_time_s"] == 9.0   # steps 2-6
    half = h.summary(skip_first=3)                                                         # steps 4-6
    assert half["median_step_s"] == 1.0 and half["tokens_per_s"] == 1024 and half["steps"] == 6


def test_graph_accumulation_keeps_one_micro_batch_of_memory_live():
    """GRAPH_MODE grad_accum=2 at the same sequences per update: the peak (fresh processes, RSS above the imports)
    falls to about half. A graph per micro-batch, or one graph unrolling both, held both micro-batches' working
    memory (0.92 of the plain run's here); the shared gradient graph and the Parameter buffer hold one (0.54)."""
    from mshelpers.memory_probe import measure_peaks, train_for_peak
    base = RunConfig.preset("tiny").replace(mode="graph", steps=2, seq_len=256)
    plain, accum = measure_peaks(train_for_peak, [(base.replace(batch_size=32), 2, 1e11),
                                                  (base.replace(batch_size=16, grad_accum=2), 2, 1e11)],
                                 preload=("mindspore", "mindformers"))
    assert accum.work_rss_bytes <= 0.75 * plain.work_rss_bytes, (accum.work_rss_bytes, plain.work_rss_bytes)


# --- exact resume (was tests/test_resume_exact.py) ---
# A warm start (train(warm=...)): another seed on the step an earlier run compiled. Notebook 10 trains 27 runs of one
# graph this way. The earlier run overflowed and halved its loss scale and advanced its optimizer's step count
# through the warm-up, so a warm run that kept any of that state would log other losses or scales.
def test_a_warm_run_trains_exactly_as_a_fresh_one_without_compiling_again(tmp_path):
    cfg = RunConfig.preset("tiny").replace(mode="graph", steps=6, warmup_steps=2, dynamic_loss_scale=True,
                                           loss_scale=2.0 ** 127)
    first = train(cfg.replace(seed=1), csv_path=tmp_path / "a.csv", progress=False, peak_flops=1e11)
    assert first.column("loss_scale")[-1] < 2.0 ** 127              # its scale moved: the warm run must reset it
    cpu0 = time.process_time()         # the process's CPU time, every thread's: compiling is CPU-bound work
    fresh = train(cfg.replace(seed=2), csv_path=tmp_path / "b.csv", progress=False, peak_flops=1e11)
    cpu1 = time.process_time()
    warm = train(cfg.replace(seed=2, spike_guard=True), csv_path=tmp_path / "c.csv", progress=False,
                 peak_flops=1e11, warm=first)
    cpu2 = time.process_time()
    for col in ("loss", "grad_norm", "loss_scale", "overflow"):
        np.testing.assert_array_equal(warm.column(col), fresh.column(col), err_msg=col)   # NaN == NaN here
    assert warm.net is first.net                  # the one model, now holding the seed-2 run's weights
    for a, b in zip(warm.net.get_parameters(), fresh.net.get_parameters()):
        assert np.array_equal(a.asnumpy(), b.asnumpy()), a.name
    # no compile: the warm run reuses the step the first one built, and spends a fraction of the fresh run's CPU time
    # (idle, 2 cores: 0.28-0.35 s against 2.8-3.2 s; beside a busy loop, 0.35-0.43 against 2.6-3.2). CPU time, not the
    # first step's wall time: beside a busy loop a warm 13 ms first step once read 1.57 s (the process waiting, not
    # compiling), against a fresh one's 2.65 s
    assert warm.built[3] is first.built[3]        # built = (cfg, net, optimizer, step): the same compiled step
    assert cpu2 - cpu1 < (cpu1 - cpu0) / 4, (cpu2 - cpu1, cpu1 - cpu0)

    # refused in one line, the earlier run's model untouched
    kept = [p.asnumpy().copy() for p in first.net.get_parameters()]
    from mshelpers.model import build_model
    other = build_model(cfg.replace(num_layers=1))
    from mshelpers.train import History
    for kwargs, match in (({"warm": History(cfg)}, "warm=History holds no built step"),
                          ({"warm": "first"}, "warm=str holds no built step"),
                          ({"warm": first, "resume": True, "ckpt_dir": tmp_path / "ck"}, "resume=True is not"),
                          ({"warm": first, "net": other}, "holds another model: its '.*' is"),
                          ):
        with pytest.raises(ValueError, match=match):
            train(cfg.replace(seed=3), csv_path=tmp_path / "d.csv", progress=False, **kwargs)
    with pytest.raises(ValueError, match=r"another graph \(num_layers=2 there, 1 here\)"):
        train(cfg.replace(seed=3, num_layers=1), progress=False, warm=first)
    with pytest.raises(ValueError, match="grad_accum=2"):
        train(cfg.replace(batch_size=4, grad_accum=2), progress=False, warm=first)
    assert all(np.array_equal(a, p.asnumpy()) for a, p in zip(kept, first.net.get_parameters()))


# Exact resume across the warm-up and a changing dynamic loss scale (issue 14, item 4).
#
# `report.resume_check` trains 2n steps straight and n + n with a checkpoint between, rebuilding the model
# and optimizer from scratch. Everything must come back bitwise: losses, learning rates, the optimizer's
# step counter (the lr position), the loss scale, every weight and moment, and the data position.
def test_resume_is_bitwise_across_warmup_and_scale_changes(tmp_path):
    from mshelpers.report import resume_check
    cfg = RunConfig.preset("tiny").replace(mode="graph", warmup_steps=2, dynamic_loss_scale=True,
                                           loss_scale=2.0 ** 127)
    r = resume_check(cfg, 4, tmp_path)
    # the check must test something: the scale overflowed and halved before the checkpoint at step 4
    assert r["crossed_warmup"] and r["scale_changed_before_ckpt"]
    assert r["straight_overflow"][0] is True and r["straight_loss_scale"][:2] == [2.0 ** 126, 2.0 ** 125]
    assert r["loss_equal"] and r["straight_loss"][4:] == r["resumed_loss"][4:]   # finite after the overflows
    assert r["straight_lr"] == r["resumed_lr"]
    assert r["straight_loss_scale"] == r["resumed_loss_scale"]
    # the optimizer's step counter advances only on applied (non-overflowed) steps
    applied = 8 - sum(r["straight_overflow"])
    assert 0 < applied < 8 and r["lr_position"] == (applied, applied)
    assert r["data_pos_straight"] == r["data_pos_resumed"] == 8
    assert r["state_equal"] and r["bitwise"]


# --- MindSpore's compile cache (was tests/test_compile_cache.py) ---
# MindSpore 2.9's on-disk compile cache and the ways to build a train step (notebook 04's NaN).
#
# Measured here (2 fresh processes per kind, the second with a warm cache): a step built as an
# `ms.jit` *function* trains cold, but warm its parameters read as zeros (loss exactly ln(vocab),
# gradient norm 0; under 2-rank DATA_PARALLEL the next step is NaN; on tiny the warm first loss is NaN).
# The same happens to any Parameter the graph reaches through another object: a Cell that called a
# DynamicLossScaler's `adjust` kept its scale through overflows. `train.make_train_step`'s graph step is a
# Cell that holds those Parameters itself, and trains identically cold and warm (the second test, which
# also stands for `dp_train`'s Cell). Accumulation's step is two Cells, one graph per micro-batch and one for
# the update, sharing the model's Parameters; warm, they train on garbage (`_cache_probe.py train-accum`, run
# twice on one folder: every loss NaN), so `make_train_step` refuses the cache for them with one line. If a
# MindSpore upgrade makes the first test fail, the bug is fixed: check train-accum, then drop the refusal.
PROBE = Path(__file__).with_name("_cache_probe.py")


def run_probe(kind: str, cache: Path, garbage_ok: bool = False, *args: str) -> list[list[float]] | str:
    """The probe's losses and gradient norms. With garbage_ok, a run that reads uninitialised memory and dies
    in a kernel (seen once in a fresh-clone CI run: Gather's indices out of range) returns MindSpore's line."""
    env = {**os.environ, "MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache), "GLOG_v": "3"}
    p = subprocess.run([sys.executable, str(PROBE), kind, *args], capture_output=True, text=True, env=env, timeout=300)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if not line and garbage_ok:
        died = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("RuntimeError: For '")]
        if died:
            return died[-1]
    assert line, f"probe {kind} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return json.loads(line[-1][len("RESULT "):])


def test_a_jitted_function_step_loses_its_weights_on_a_warm_cache(tmp_path):
    from mshelpers.config import RunConfig
    ln_v = math.log(RunConfig.preset("tiny").vocab_size)
    cold_f = run_probe("function", tmp_path / "f")
    warm_f = run_probe("function", tmp_path / "f", garbage_ok=True)
    print("function step, cold:", cold_f, "warm:", warm_f)
    assert cold_f[0][1] > 0 and abs(cold_f[0][0] - ln_v) > 1e-3          # cold: real weights
    # warm: the same weights and batch give another step-1 loss, or a kernel dies on what it read: the graph does
    # not read the parameters (mini: exactly ln V with gradient norm 0, i.e. zeros; tiny: NaN, i.e. uninitialised
    # memory, or once a Gather index out of range)
    if isinstance(warm_f, str):
        assert "Gather" in warm_f or "index" in warm_f, warm_f
    else:
        assert not warm_f[0][0] == pytest.approx(cold_f[0][0], abs=1e-4)


def test_train_s_cell_step_keeps_weights_and_loss_scale_on_a_warm_cache(tmp_path):
    """train()'s graph step on a warm cache: the same losses, and the dynamic scale still halves on overflow
    (a step that reached the scaler's Parameters through the scaler object kept 2**127 warm)."""
    cold = run_probe("train", tmp_path / "t", False, str(tmp_path / "cold.csv"))
    warm = run_probe("train", tmp_path / "t", False, str(tmp_path / "warm.csv"))
    print("train(), cold:", cold, "warm:", warm)
    (cl, cs), (wl, ws) = cold, warm
    assert cs[0] < 2.0 ** 127 and cs[-1] < cs[0]                  # overflow halved the scale, cold
    assert ws == cs                                               # and warm, step for step
    assert [str(x) for x in wl] == [str(x) for x in cl]           # the same losses (nan/inf included)
    assert all(math.isfinite(x) for x in cl[-2:])                 # and it trains once the scale is sane


def test_train_refuses_the_compile_cache_for_its_function_steps(monkeypatch):
    from mshelpers.config import RunConfig
    from mshelpers.train import make_train_step
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    with pytest.raises(ValueError, match="MS_COMPILER_CACHE_ENABLE=1 with grad_accum > 1.*fix: unset"):
        make_train_step(None, None, RunConfig.preset("tiny").replace(mode="graph", grad_accum=2))
