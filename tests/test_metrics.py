"""mshelpers.metrics: FLOPs per token, MFU, share of achievable, StepLogger and summarize."""
from __future__ import annotations

import math
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest

from mshelpers import metrics
from mshelpers.metrics import COLUMNS, MetricsCSV, StepLogger, flops_per_token, mfu, summarize
from mshelpers.table import read_csv


def test_flops_per_token_palm_formula():
    # 6N + 12 L H T, worked by hand for the mini preset
    assert flops_per_token(3_688_704, 4, 256, 128) == 6 * 3_688_704 + 12 * 4 * 256 * 128 == 23_705_088
    assert flops_per_token(10, 1, 1, 1, attention=False) == 60


@pytest.mark.parametrize("kw, field", [(dict(n_params=0), "n_params"), (dict(seq_len=-5), "seq_len"),
                                       (dict(hidden_size=2.5), "hidden_size")])
def test_flops_per_token_bad_input(kw, field):
    args = dict(n_params=100, n_layers=2, hidden_size=8, seq_len=4) | kw
    with pytest.raises(ValueError, match=f"{field}=.*positive integer"):
        flops_per_token(**args)


def test_mfu_value_and_impossible_claim_warns():
    assert mfu(1000, 1e9, 2, 1e12) == pytest.approx(0.5)
    with pytest.warns(UserWarning, match="impossible"):
        assert mfu(3000, 1e9, 1, 1e12) == pytest.approx(3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mfu(100, 1e9, 1, 1e12)   # plausible: no warning


def test_mfu_bad_peak_names_the_fix():
    with pytest.raises(ValueError, match="peak_flops_per_device=0.*peak_flops"):
        mfu(1, 1, 1, 0)
    with pytest.raises(ValueError, match="n_devices=0"):
        mfu(1, 1, 0, 1e9)


def test_step_logger_csv_and_summary(tmp_path):
    log = StepLogger(tmp_path / "run.csv", tokens_per_step=1000, flops_per_token=1e6, peak_flops_per_device=1e10)
    for s, (loss, dt) in enumerate([(5.0, 2.0), (4.0, 0.1), (3.0, 0.2), (2.5, 0.1)], start=1):
        log.log_step(s, loss, dt, lr=0.1, grad_norm=1.0, overflow=(s == 3), loss_scale=2.0)
    rows = read_csv(tmp_path / "run.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[1]["tokens_per_s"] == pytest.approx(10_000)
    assert rows[2]["overflow"] is True and rows[0]["mfu"] == pytest.approx(1000 / 2.0 * 1e6 / 1e10)
    s = summarize(log.rows)
    assert s["compile_time_s"] == 2.0 and s["median_step_s"] == pytest.approx(0.1)
    assert s["final_loss"] == 2.5 and s["overflow_steps"] == 1 and s["peak_mem_mb"] > 0


def test_step_logger_rejects_bad_sizes():
    with pytest.raises(ValueError, match="tokens_per_step=0"):
        StepLogger(None, 0, 1.0, 1.0)


def test_counts_and_rates_accept_any_integral_number():
    import numpy as np
    assert flops_per_token(7e9, 32, 4096, 4096) == 6 * 7_000_000_000 + 12 * 32 * 4096 * 4096
    assert flops_per_token(np.int64(3_688_704), np.int32(4), 256, 128) == 23_705_088
    assert mfu(np.float32(1000), np.int64(10**9), np.int64(2), 1e12) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="n_layers=2.5 is invalid.*no fraction"):
        flops_per_token(100, 2.5, 8, 4)
    with pytest.raises(ValueError, match="n_params='7e9' is not a number"):
        flops_per_token("7e9", 1, 1, 1)
    with pytest.raises(ValueError, match="n_devices=1.5"):
        mfu(1, 1, 1.5, 1)


def test_flops_per_token_names_itself_in_its_refusal():
    with pytest.raises(ValueError) as e:
        flops_per_token(0, 2, 8, 4)
    assert str(e.value) == "flops_per_token: n_params=0 is invalid; fix: pass a positive integer"


def test_summarize_names_every_figure_and_refuses_no_rows():
    rows = [dict(step=i, loss=l, step_time_s=t, tokens_per_s=100 / t, mfu=0.1 / t, peak_mem_mb=m, overflow=o, spike=sp)
            for i, (l, t, m, o, sp) in enumerate([(5.0, 2.0, 10, False, False), (4.0, 0.5, 30, True, False),
                                                  (float("nan"), 0.25, 20, True, True), (3.0, 1.0, 5, False, False)])]
    assert summarize(rows) == dict(steps=4, compile_time_s=2.0, median_step_s=0.5, tokens_per_s=200.0, mfu=0.2,
                                   final_loss=3.0, peak_mem_mb=30, overflow_steps=2, spike_steps=1, nonfinite_losses=1)
    with pytest.raises(ValueError) as e:
        summarize([])
    assert str(e.value) == "summarize: rows is empty; fix: log at least one step"


def test_share_of_achievable_uses_the_peak_it_is_given_and_names_a_bad_count(tmp_path, monkeypatch):
    import json
    from mshelpers.metrics import share_of_achievable
    from mshelpers.peak import _peak_key
    monkeypatch.setenv("MSHELPERS_PEAK_CACHE", str(tmp_path / "peak.json"))
    (tmp_path / "peak.json").write_text(json.dumps({_peak_key("float32")[2]: {"flops": 4000.0}}))
    assert share_of_achievable(100, 10, n_devices=2, measured_peak_flops=1000) == 0.5   # 100 x 10 / (2 x 1000)
    with pytest.raises(ValueError) as e:
        share_of_achievable(100, 10, n_devices=0, measured_peak_flops=1000)
    assert str(e.value) == "share_of_achievable: n_devices=0 is invalid; fix: pass a positive integer"


@pytest.mark.parametrize("args, line", [
    ((-1, 10, 1, 1e9), "mfu: tokens_per_s=-1 is invalid; fix: pass a number >= 0"),
    ((float("nan"), 10, 1, 1e9), "mfu: tokens_per_s=nan is invalid; fix: pass a number >= 0"),
    ((True, 10, 1, 1e9), "mfu: tokens_per_s=True is invalid; fix: pass a number >= 0"),
    ((1, "x", 1, 1e9), "mfu: flops_per_token='x' is invalid; fix: pass a number >= 0"),
    ((1, -2.0, 1, 1e9), "mfu: flops_per_token=-2.0 is invalid; fix: pass a number >= 0"),
    ((1, 10, 1, -5), "mfu: peak_flops_per_device=-5 is invalid; fix: pass a number >= 0"),
    ((1, 10, 1, 0), "mfu: peak_flops_per_device=0 is invalid; fix: measure it with peak_flops() or use the "
                    "device's datasheet figure"),
    ((1, 10, 0, 1e9), "mfu: n_devices=0 is invalid; fix: pass a positive integer"),
    ((1, 10, 1.5, 1e9), "mfu: n_devices=1.5 is invalid; fix: pass a positive integer (a count has no fraction)"),
])
def test_every_mfu_refusal_is_its_exact_line(args, line):
    with pytest.raises(ValueError) as e:
        mfu(*args)
    assert str(e.value) == line


def test_mfu_warns_only_above_one_as_a_userwarning():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert mfu(100, 10, 1, 1000) == 1.0 and w == []               # exactly the peak: no warning
        assert mfu(0, 10, 1, 1000) == 0.0 and w == []
        assert mfu(110, 10, 1, 1000) == pytest.approx(1.1)
    assert len(w) == 1 and w[0].category is UserWarning
    assert str(w[0].message).endswith("the peak is too low or the token rate is wrong")


def test_summarize_counts_no_spike_for_rows_written_before_the_spike_column():
    rows = [{"step": i, "loss": 5.0 - i, "step_time_s": 0.1, "tokens_per_s": 10.0, "mfu": 0.1, "peak_mem_mb": 1.0,
             "overflow": False, "loss_scale": 1.0} for i in (1, 2, 3)]      # an older CSV: no "spike" column
    assert summarize(rows)["spike_steps"] == 0
    rows[1]["spike"] = True
    assert summarize(rows)["spike_steps"] == 1


# --- StepLogger and peak_memory_mb against hand-computed values (no training) ---
def test_mfu_with_two_devices_matches_the_hand_value(tmp_path):
    # 4096 tokens (global) in 0.5 s = 8192 tokens/s; x 2e6 FLOPs/token = 1.6384e10 FLOP/s
    # over 2 devices of 1e10 FLOP/s each: MFU = 1.6384e10 / 2e10 = 0.8192
    log = StepLogger(tmp_path / "s.csv", tokens_per_step=4096, flops_per_token=2e6,
                     peak_flops_per_device=1e10, n_devices=2)
    row = log.log_step(1, 3.5, 0.5, lr=1e-3, grad_norm=0.25, peak_mem_mb=100.0)
    assert row["tokens_per_s"] == 8192.0
    assert row["mfu"] == pytest.approx(0.8192, rel=1e-12)
    one = StepLogger(None, 4096, 2e6, 1e10, n_devices=1).log_step(1, 3.5, 0.5, peak_mem_mb=100.0)
    assert one["mfu"] == pytest.approx(2 * 0.8192)          # half the devices, twice the utilisation
    (written,) = read_csv(tmp_path / "s.csv")
    assert list(written) == list(COLUMNS)
    assert written["mfu"] == pytest.approx(0.8192) and written["tokens_per_s"] == 8192.0
    assert (written["step"], written["loss"], written["lr"], written["grad_norm"]) == (1, 3.5, 1e-3, 0.25)


def test_row_fields_and_zero_time():
    log = StepLogger(None, tokens_per_step=100, flops_per_token=10, peak_flops_per_device=1e3, n_devices=4)
    row = log.log_step(7, 2.0, 0.0, overflow=True, loss_scale=512, peak_mem_mb=5)
    assert row["tokens_per_s"] != row["tokens_per_s"] and row["mfu"] != row["mfu"]   # NaN, not a division error
    assert (row["step"], row["overflow"], row["loss_scale"], row["peak_mem_mb"]) == (7, True, 512.0, 5.0)
    assert log.rows == [row]
    with pytest.raises(ValueError, match="n_devices=0"):
        StepLogger(None, 100, 10, 1e3, n_devices=0)
    with pytest.raises(ValueError, match="tokens_per_step=0"):
        StepLogger(None, 0, 10, 1e3)


def test_peak_memory_mb_is_this_process_peak_rss_on_cpu():
    """In a fresh process: the figure is VmHWM in MiB, and it grows by what a big array touches."""
    code = (
        "import numpy as np\n"
        "from mshelpers.metrics import peak_memory_mb\n"
        "def hwm():\n"
        "    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
        "    return int(line.split()[1]) / 1024\n"
        "a = peak_memory_mb(); h = hwm()\n"
        "x = np.ones(64 * 2**20 // 8)          # 64 MiB, every page written\n"
        "b = peak_memory_mb()\n"
        "print(a, h, b, hwm())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    a, h, b, h2 = map(float, out.stdout.split()[-4:])
    assert abs(a - h) < 2 and abs(b - h2) < 2            # the process's own peak RSS, in MiB
    assert 60 < b - a < 70                               # +64 MiB


def test_peak_memory_mb_prefers_the_device_figure(monkeypatch):
    import mindspore as ms
    monkeypatch.setattr(ms.runtime, "max_memory_allocated", lambda *a, **k: 3 * 2**20)
    assert metrics.peak_memory_mb() == 3.0               # bytes -> MiB, device peak on Ascend/GPU
    monkeypatch.setattr(ms.runtime, "max_memory_allocated", lambda *a, **k: 0)   # what CPU returns
    from mshelpers.timing import peak_rss_mb
    assert metrics.peak_memory_mb() == pytest.approx(peak_rss_mb(), abs=1.0)


def test_an_existing_csv_is_never_truncated_silently(tmp_path):
    p = tmp_path / "run.csv"
    StepLogger(p, 100, 10, 1e3).log_step(1, 3.0, 0.1, peak_mem_mb=1)
    with pytest.raises(ValueError, match="append=True.*overwrite=True"):
        StepLogger(p, 100, 10, 1e3)
    assert [r["step"] for r in read_csv(p)] == [1]                      # untouched
    StepLogger(p, 100, 10, 1e3, append=True).log_step(2, 2.5, 0.1, peak_mem_mb=1)
    assert [r["step"] for r in read_csv(p)] == [1, 2]                   # a resumed run continues it
    StepLogger(p, 100, 10, 1e3, overwrite=True).log_step(1, 9.0, 0.1, peak_mem_mb=1)
    assert [(r["step"], r["loss"]) for r in read_csv(p)] == [(1, 9.0)]
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns"):
        StepLogger(tmp_path / "other.csv", 100, 10, 1e3, append=True)


def test_output_contract_is_explicit():
    import numpy as np
    log = StepLogger(None, 100, 10, 1e3)
    assert log.read_outputs(np.float32(2.0)) == {"loss": np.float32(2.0)}
    with pytest.raises(ValueError, match="returned a tuple of 3.*outputs='loss_overflow_scale'"):
        log.read_outputs((np.float32(2.0), np.float32(0.9), np.int32(64)))       # (loss, acc, n_tokens)
    scaled = StepLogger(None, 100, 10, 1e3, outputs="loss_overflow_scale")
    got = scaled.read_outputs((np.float32(2.0), np.bool_(True), np.float32(128.0)))
    assert got["overflow"] is True and got["loss_scale"] == 128.0
    mine = StepLogger(None, 100, 10, 1e3, outputs=lambda out: {"loss": out[0]})
    assert mine.read_outputs((1.5, 0.9, 64))["loss"] == 1.5
    with pytest.raises(ValueError, match="outputs='guess'"):
        StepLogger(None, 100, 10, 1e3, outputs="guess")


def test_non_scalar_loss_is_a_clear_value_error():
    import numpy as np
    log = StepLogger(None, 100, 10, 1e3)
    with pytest.raises(ValueError, match=r"loss=.*not a scalar \(shape \(4,\)\).*fix"):
        log.log_step(1, np.ones(4, np.float32), 0.1, peak_mem_mb=1)
    assert log.log_step(1, np.array([2.0]), 0.1, peak_mem_mb=1)["loss"] == 2.0   # one element is fine


def test_as_a_callback_in_model_train_it_reads_lr_and_grad_norm_fns(tmp_path):
    """Real Model.train on a tiny regression: loss from the net output, lr and grad norm from the fns."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn
    from mindspore.train import Callback, Model
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = nn.Dense(4, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    rng = np.random.default_rng(0)
    data = ms.dataset.NumpySlicesDataset({"x": rng.normal(size=(16, 4)).astype(np.float32),
                                          "y": rng.normal(size=(16, 1)).astype(np.float32)}, shuffle=False).batch(4)
    log = StepLogger(tmp_path / "cb.csv", tokens_per_step=4, flops_per_token=8, peak_flops_per_device=1e9,
                     grad_norm_fn=lambda step: 0.5 * step)
    assert isinstance(log, Callback)
    Model(net, nn.MSELoss(), opt).train(1, data, callbacks=[log], dataset_sink_mode=False)
    rows = read_csv(tmp_path / "cb.csv")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["lr"] == pytest.approx(0.01) for r in rows)           # the optimizer's fixed rate
    assert [r["grad_norm"] for r in rows] == [0.5, 1.0, 1.5, 2.0]
    assert all(r["overflow"] is False and r["loss_scale"] == 1.0 for r in rows)


def test_a_wrong_output_is_described_by_its_type_and_shape():
    import numpy as np
    scaled = StepLogger(None, 100, 10, 1e3, outputs="loss_overflow_scale")
    for out, said in ((np.zeros(2, np.float32), "one ndarray of shape (2,)"), (2.5, "one float"), ([1, 2], "a list of 2")):
        with pytest.raises(ValueError) as e:
            scaled.read_outputs(out)
        assert str(e.value) == (f"StepLogger: outputs='loss_overflow_scale' but the network returned {said}; "
                                "fix: outputs='loss' for a single loss, or a function")


def test_as_callback_turns_a_logger_built_before_mindspore_into_a_callback():
    from mindspore.train import Callback
    log = StepLogger(None, 100, 10, 1e3)
    cls = type(log)
    log.__class__ = StepLogger               # as if built before MindSpore was imported: a plain StepLogger
    assert not isinstance(log, Callback)
    assert log.as_callback() is log and isinstance(log, Callback) and isinstance(log, StepLogger)
    assert type(log) is cls and type(log.as_callback()) is cls          # once converted, it stays the same class


# ---- the callback hooks, value by value: MindSpore hands them a run_context whose original_args() holds
# net_outputs, cur_step_num and the optimizer (on cb.optimizer or cb.train_network.optimizer)
class _RunContext:
    def __init__(self, **cb):
        self.cb = SimpleNamespace(**cb)

    def original_args(self):
        return self.cb


def _hook_row(log, sleep_s=0.0, **cb):
    import time
    log.on_train_step_begin(_RunContext(**cb))
    time.sleep(sleep_s)
    log.on_train_step_end(_RunContext(**cb))
    return log.rows[-1]


def test_each_value_a_callback_step_logs_comes_from_where_the_contract_says(tmp_path):
    import math
    import mindspore as ms
    import numpy as np
    opt = SimpleNamespace(learning_rate=ms.Tensor(np.float32(0.25)))
    kw = dict(tokens_per_step=100, flops_per_token=10.0, peak_flops_per_device=1e6)
    log = StepLogger(tmp_path / "a.csv", **kw)
    r = _hook_row(log, 0.05, net_outputs=ms.Tensor(np.float32(2.5)), cur_step_num=7, optimizer=opt)
    assert (r["step"], r["loss"], r["lr"]) == (7, 2.5, 0.25) and math.isnan(r["grad_norm"])
    assert r["overflow"] is False and r["loss_scale"] == 1.0 and r["spike"] is False
    assert 0.05 <= r["step_time_s"] < 1.0 and r["tokens_per_s"] == pytest.approx(100 / r["step_time_s"])
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * 10.0 / 1e6)
    assert read_csv(tmp_path / "a.csv")[-1]["step"] == 7
    # the optimizer found on the train network when the callback args have none
    r = _hook_row(log, net_outputs=1.5, cur_step_num=8, optimizer=None,
                  train_network=SimpleNamespace(optimizer=opt))
    assert (r["step"], r["loss"], r["lr"]) == (8, 1.5, 0.25)
    assert math.isnan(_hook_row(log, net_outputs=1.0, cur_step_num=9)["lr"])      # no optimizer at all
    # lr_fn and grad_norm_fn are asked with the step number
    log = StepLogger(None, lr_fn=lambda s: s / 100, grad_norm_fn=lambda s: s * 2.0, **kw)
    r = _hook_row(log, net_outputs=3.0, cur_step_num=4, optimizer=opt)
    assert (r["lr"], r["grad_norm"]) == (0.04, 8.0)
    # what the outputs function returns wins over both, overflow and scale included
    log = StepLogger(None, lr_fn=lambda s: 9.0, grad_norm_fn=lambda s: 9.0, **kw,
                     outputs=lambda out: {"loss": out[0], "lr": 0.5, "grad_norm": 1.25, "overflow": 1,
                                          "loss_scale": 512.0})
    r = _hook_row(log, net_outputs=(2.0, 0), cur_step_num=5, optimizer=opt)
    assert (r["loss"], r["lr"], r["grad_norm"], r["overflow"], r["loss_scale"]) == (2.0, 0.5, 1.25, True, 512.0)
    log = StepLogger(None, outputs="loss_overflow_scale", **kw)
    r = _hook_row(log, net_outputs=(ms.Tensor(np.float32(4.0)), ms.Tensor(True), ms.Tensor(np.float32(64.0))),
                  cur_step_num=2)
    assert (r["loss"], r["overflow"], r["loss_scale"]) == (4.0, True, 64.0)


def test_a_fixed_lr_is_read_and_a_schedule_is_nan():
    import math
    import mindspore as ms
    import numpy as np
    ns = SimpleNamespace
    assert metrics._fixed_lr(ns(learning_rate=ms.Tensor(np.float32(0.125)))) == 0.125
    assert metrics._fixed_lr(ns(learning_rate=ms.Parameter(ms.Tensor(np.array([0.5], np.float32))))) == 0.5
    for opt in (None, ns(), ns(learning_rate=None), ns(learning_rate=0.1),
                ns(learning_rate=ms.Tensor(np.array([0.1, 0.2], np.float32))),
                ns(learning_rate=ns(asnumpy=lambda: 1 / 0))):
        assert math.isnan(metrics._fixed_lr(opt)), opt


def test_read_outputs_results_and_refusals_exactly():
    import numpy as np
    scaled = StepLogger(None, 100, 10, 1e3, outputs="loss_overflow_scale")
    for overflow, want in ((np.bool_(False), False), (np.array([True]), True), (0, False), (1.0, True), (True, True)):
        got = scaled.read_outputs([np.float32(2.5), overflow, np.array([64.0])])     # a list is a tuple here
        assert got == {"loss": np.float32(2.5), "overflow": want, "loss_scale": 64.0}, overflow
        assert type(got["overflow"]) is bool and type(got["loss_scale"]) is float
    with pytest.raises(ValueError) as e:
        scaled.read_outputs((np.float32(2.0), np.zeros(3), 1.0))
    assert str(e.value).startswith("StepLogger: overflow=array([0., 0., 0.]) is not a scalar (shape (3,)); fix: ")
    with pytest.raises(ValueError) as e:
        scaled.read_outputs((np.float32(2.0), False, "big"))
    assert str(e.value) == ("StepLogger: loss_scale='big' is not a scalar (type str); fix: reduce it to one number "
                            "(e.g. .mean()) in the network, or pass outputs=<function returning {'loss': float, ...}>")
    plain = StepLogger(None, 100, 10, 1e3)
    for out, said in (((1.0, 2.0, 3.0), "a tuple of 3"), ([1.0], "a list of 1")):
        with pytest.raises(ValueError) as e:
            plain.read_outputs(out)
        assert str(e.value) == (f"StepLogger: outputs='loss' but the network returned {said}; fix: "
                                "outputs='loss_overflow_scale' for TrainOneStepWithLossScaleCell, or "
                                "outputs=lambda out: {'loss': out[0]} to pick the loss yourself")
    arr = np.array([3.0])
    assert plain.read_outputs(arr)["loss"] is arr                       # passed through as it came
    src = {"loss": 1.0, "lr": 0.1}
    mine = StepLogger(None, 100, 10, 1e3, outputs=lambda out: src)
    got = mine.read_outputs(None)
    assert got == src and got is not src                                # a copy: the logger never edits yours
    for bad in ({"lr": 0.1}, [("loss", 1.0)], None):
        with pytest.raises(ValueError) as e:
            StepLogger(None, 100, 10, 1e3, outputs=lambda out, b=bad: b).read_outputs(None)
        assert str(e.value) == (f"StepLogger: outputs function returned {bad!r:.80}; fix: return a dict with 'loss' "
                                "and optionally 'overflow', 'loss_scale', 'grad_norm', 'lr'")


@pytest.mark.parametrize("make, line", [
    (lambda: StepLogger(None, 0, 10, 1e3), "StepLogger: tokens_per_step=0 is invalid; fix: pass batch*seq_len > 0"),
    (lambda: StepLogger(None, True, 10, 1e3), "StepLogger: tokens_per_step=True is invalid; fix: pass batch*seq_len > 0"),
    (lambda: StepLogger(None, "8", 10, 1e3), "StepLogger: tokens_per_step='8' is invalid; fix: pass batch*seq_len > 0"),
    (lambda: StepLogger(None, 2.5, 10, 1e3),
     "StepLogger: tokens_per_step=2.5 is invalid; fix: pass a positive integer (a count has no fraction)"),
    (lambda: StepLogger(None, 10, 10, 1e3, n_devices=0), "StepLogger: n_devices=0 is invalid; fix: pass >= 1"),
    (lambda: StepLogger(None, 10, 10, 1e3, n_devices="2"), "StepLogger: n_devices='2' is invalid; fix: pass >= 1"),
    (lambda: StepLogger(None, 10, 10, 1e3, n_devices=1.5),
     "StepLogger: n_devices=1.5 is invalid; fix: pass a positive integer (a count has no fraction)"),
    (lambda: StepLogger(None, 10, 0.0, 1e3), "StepLogger: flops_per_token=0.0 is invalid; fix: pass a number > 0"),
    (lambda: StepLogger(None, 10, True, 1e3), "StepLogger: flops_per_token=True is invalid; fix: pass a number > 0"),
    (lambda: StepLogger(None, 10, 10, 0), "StepLogger: peak_flops_per_device=0 is invalid; fix: pass a number > 0"),
    (lambda: StepLogger(None, 10, 10, "1e9"),
     "StepLogger: peak_flops_per_device='1e9' is invalid; fix: pass a number > 0"),
    (lambda: StepLogger(None, 10, 10, 1e3, outputs="guess"),
     "StepLogger: outputs='guess' is invalid; fix: one of ('loss', 'loss_overflow_scale') or a function net_outputs "
     "-> {'loss': ..., 'overflow': ..., 'loss_scale': ...}"),
    (lambda: StepLogger(None, 10, 10, 1e3, lr_fn=3),
     "StepLogger: lr_fn=3 is not callable; fix: pass a function step -> float"),
    (lambda: StepLogger(None, 10, 10, 1e3, grad_norm_fn="x"),
     "StepLogger: grad_norm_fn='x' is not callable; fix: pass a function step -> float"),
    (lambda: StepLogger("unused.csv", 10, 10, 1e3, append=True, overwrite=True),
     "StepLogger: append=True and overwrite=True contradict; fix: pick one"),
])
def test_every_steplogger_refusal_is_its_exact_line(make, line):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value) == line


def test_a_small_positive_peak_and_flops_are_accepted_and_used():
    log = StepLogger(None, 10, 0.5, 0.5)                         # above 0, below 1: valid, if odd
    assert log.log_step(1, 1.0, 2.0, peak_mem_mb=1)["mfu"] == pytest.approx(10 / 2.0 * 0.5 / 0.5)


@pytest.mark.parametrize("field", ["step_time_s", "lr", "grad_norm", "loss_scale"])
def test_log_step_names_the_field_that_is_not_a_scalar(field):
    import numpy as np
    kw = {"step_time_s": 0.1}
    kw[field] = np.ones(2)
    st = kw.pop("step_time_s")
    with pytest.raises(ValueError) as e:
        StepLogger(None, 10, 10, 1e3).log_step(1, 1.0, st, peak_mem_mb=1, **kw)
    assert str(e.value).startswith(f"StepLogger: {field}=array([1., 1.]) is not a scalar (shape (2,)); fix: ")


def test_log_step_defaults_and_an_empty_csv_counts_as_new(tmp_path):
    import math
    (tmp_path / "new" / "deep").mkdir(parents=True)
    (tmp_path / "new" / "deep" / "empty.csv").write_text("")
    log = StepLogger(tmp_path / "new" / "deep" / "empty.csv", 10, 10, 1e3)   # empty: no append/overwrite needed
    row = log.log_step(1, 2.0, 0.0, peak_mem_mb=1)
    assert row["overflow"] is False and row["spike"] is False and row["loss_scale"] == 1.0
    assert math.isnan(row["tokens_per_s"]) and math.isnan(row["lr"]) and math.isnan(row["grad_norm"])
    text = (tmp_path / "new" / "deep" / "empty.csv").read_bytes()
    assert text.count(b"\r\n") == 2 and b"\r\r" not in text       # header and one row, as the csv module ends them
    nested = StepLogger(tmp_path / "a" / "b" / "c.csv", 10, 10, 1e3)   # missing folders are created
    nested.log_step(1, 2.0, 0.1, peak_mem_mb=1)
    assert (tmp_path / "a" / "b" / "c.csv").exists()


def test_peak_memory_mb_reads_vmhwm_then_falls_back_to_ru_maxrss(monkeypatch):
    """In this process, with getrusage patched to a value VmHWM never has: which source answered is visible."""
    import builtins
    import resource
    import types
    monkeypatch.delitem(sys.modules, "mindspore", raising=False)           # no device figure to prefer
    monkeypatch.setattr(resource, "getrusage", lambda who: types.SimpleNamespace(ru_maxrss=3 * 2**20)
                        if who == resource.RUSAGE_SELF else None)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    assert metrics.peak_memory_mb() == pytest.approx(int(line.split()[1]) / 1024, abs=1.0)
    assert metrics.peak_memory_mb() != pytest.approx(3 * 2**20 / 1024, abs=1.0)
    real_open = builtins.open

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc"):
            raise OSError("no /proc here")
        return real_open(path, *a, **k)
    monkeypatch.setattr(builtins, "open", no_proc)
    assert metrics.peak_memory_mb() == 3 * 2**20 / 1024                   # Linux: ru_maxrss is in KiB
    monkeypatch.setattr(sys, "platform", "darwin")
    assert metrics.peak_memory_mb() == 3.0                                # macOS: in bytes


# ------------------------------------------------------------------------------------------ mutation survivors
class _OnlyAsnumpy:
    """A value with `.asnumpy()` and nothing else (no size, no reshape): only the asnumpy branch reads it."""

    def __init__(self, v):
        self.v = v

    def asnumpy(self):
        import numpy as np
        return np.asarray(self.v)


def test_a_value_that_only_has_asnumpy_is_read_through_it():
    row = StepLogger(None, 100, 10, 1e3).log_step(1, _OnlyAsnumpy(3.5), 0.5, grad_norm=_OnlyAsnumpy([0.25]))
    assert (row["loss"], row["grad_norm"]) == (3.5, 0.25)


def test_a_one_element_array_of_any_rank_is_read_without_numpy_deprecation_warnings():
    import warnings
    import numpy as np
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # float() of an ndim > 0 array is deprecated since NumPy 1.25
        row = StepLogger(None, 100, 10, 1e3).log_step(1, np.array([[2.5]]), 0.5, loss_scale=np.array([[[8.0]]]))
    assert (row["loss"], row["loss_scale"]) == (2.5, 8.0)


def test_spike_true_is_logged_and_written(tmp_path):
    log = StepLogger(tmp_path / "s.csv", 100, 10, 1e3)
    assert log.log_step(1, 2.0, 0.5, spike=True)["spike"] is True
    assert log.log_step(2, 2.0, 0.5)["spike"] is False
    assert [r["spike"] for r in read_csv(tmp_path / "s.csv")] == [True, False]


def test_peak_memory_mb_divides_vmhwm_kib_by_1024_exactly(monkeypatch):
    import builtins
    import io
    monkeypatch.delitem(sys.modules, "mindspore", raising=False)           # no device figure to prefer
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: io.StringIO("VmPeak:\t 9999 kB\nVmHWM:\t 2097152 kB\n")
                        if str(path) == "/proc/self/status" else real_open(path, *a, **k))
    assert metrics.peak_memory_mb() == 2048.0                              # 2,097,152 KiB / 1024


def test_a_callback_made_from_a_users_subclass_keeps_the_users_module():
    class MyLogger(StepLogger):
        pass
    cb = MyLogger(None, 100, 10, 1e3).as_callback()
    from mindspore.train import Callback
    assert isinstance(cb, Callback) and isinstance(cb, MyLogger)
    assert type(cb).__module__ == __name__ and type(cb).__name__ == "MyLogger"


def test_one_token_per_step_is_valid_and_without_mindspore_nothing_becomes_a_callback(monkeypatch):
    def no_callback(cls):
        raise AssertionError("StepLogger made itself a Callback although MindSpore was never imported")
    monkeypatch.delitem(sys.modules, "mindspore", raising=False)
    monkeypatch.setattr(metrics, "_as_callback_class", no_callback)
    log = StepLogger(None, tokens_per_step=1, flops_per_token=1, peak_flops_per_device=1)
    assert type(log) is StepLogger and log.tokens_per_step == 1


def test_an_existing_csv_of_one_byte_is_refused_and_both_refusals_name_the_file(tmp_path):
    one = tmp_path / "one.csv"
    one.write_text("x")
    with pytest.raises(ValueError) as e:
        StepLogger(one, 100, 10, 1e3)
    assert str(e.value).startswith(f"StepLogger: csv_path={str(one)!r} already exists and is not empty; fix: ")
    assert one.read_text() == "x"                                       # refused, untouched
    with pytest.raises(ValueError) as e:
        StepLogger(one, 100, 10, 1e3, append=True)
    assert str(e.value).startswith(f"StepLogger: csv_path={str(one)!r} has columns ['x'], not ")



# --- MetricsCSV: the run's CSV, cut back on resume (was in tests/test_resume.py) ---
def _metrics(tmp_path, steps_losses):
    m = MetricsCSV(tmp_path / "metrics.csv", ["step", "loss"])
    m.start_fresh()
    for st, loss in steps_losses:
        m.append({"step": st, "loss": loss})
    m.close()
    return m


def test_metrics_rows_that_repeat_or_run_backwards_are_reported_and_dropped(tmp_path):
    """Issue 26 F8: a well-formed fake row must not win over the run's own row, silently."""
    m = _metrics(tmp_path, [(1, 5.0), (2, 4.0), (3, 9.9), (3, 3.0), (4, 2.5), (2, 7.0), (5, 2.0)])
    rows, note = m.keep_upto(4)
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 5.0), (2, 4.0), (3, 9.9), (4, 2.5)]
    assert ("dropped 2 rows whose step repeats or runs backwards (step 3 at line 5 after step 3; "
            "step 2 at line 7 after step 4), keeping the first of each") in note
    # the checkpoint's step: the row whose loss the checkpoint recorded is kept, and that is said
    m = _metrics(tmp_path, [(1, 5.0), (2, 4.0), (3, 9.9), (3, 3.0), (4, 2.5)])
    rows, note = m.keep_upto(3, loss=3.0)
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 5.0), (2, 4.0), (3, 3.0)]
    assert "kept line 5 for step 3 (its loss matches the checkpoint's), dropped line 4" in note
    assert (tmp_path / "metrics.csv").read_text() == "step,loss\n1,5.0\n2,4.0\n3,3.0\n"
    rows, note = _metrics(tmp_path, [(1, 5.0), (2, 4.0)]).keep_upto(2, loss=1.0)
    assert "no row for step 2 has the checkpoint's loss 1.0; kept line 3" in note and len(rows) == 2


def test_metrics_csv_deleted_mid_run_is_recreated_from_memory(tmp_path, capsys):
    """Issue 26 F12: the next write notices the file is gone and re-creates it with every row."""
    csv = tmp_path / "metrics.csv"
    m = MetricsCSV(csv, ["step", "loss"])
    m.start_fresh()
    rows = []
    for st in (1, 2, 3):
        rows.append({"step": st, "loss": 1.0 / st})
        m.append(rows[-1], rows)
        if st == 2:
            csv.unlink()
    assert "metrics.csv disappeared during the run; re-created it from the 3 rows held in memory (steps 1..3)" \
        in capsys.readouterr().err
    rows.append({"step": 4, "loss": 0.25})
    m.append(rows[-1], rows)
    csv.unlink()                                   # after the last write: caught when the file is closed
    m.close(rows)
    assert csv.read_text() == "step,loss\n1,1.0\n2,0.5\n3,0.3333333333333333\n4,0.25\n"


def test_keep_upto_repairs_each_kind_of_damage_says_each_and_keeps_reading(tmp_path):
    """Every repair a resume makes, in one file: a row with too many cells, a row whose step is not a number
    (each followed by good rows, which are kept), bytes that are not UTF-8, and a torn last line; each note
    quotes the first 40 characters of its line. Steps 1 and 4 are missing and the note names the first."""
    csv = tmp_path / "metrics.csv"
    long = "9" * 60
    csv.write_bytes(b"step,loss\n2,4.0\n" + f"3,{long},extra\n".encode() + f"x{long},3.5\n".encode()
                    + b"3,\xff\n" + f"5,{long}".encode())
    rows, note = MetricsCSV(csv, ["step", "loss"]).keep_upto(5)
    assert [(r["step"], r["loss"]) for r in rows] == [(2, 4.0), (3, "\ufffd")]
    assert note == "; ".join([
        f"dropped a torn last line ({('5,' + long)[:40]!r}...)",
        f"dropped a malformed line ({('3,' + long + ',extra')[:40]!r})",
        f"dropped a line without a step ({('x' + long + ',3.5')[:40]!r})",
        "metrics.csv has no rows for 3 of steps 1..5 (e.g. step 1); those steps ran before the checkpoint and "
        "are not redone"])
    assert csv.read_text(encoding="utf-8") == "step,loss\n2,4.0\n3,\ufffd\n"


def test_keep_upto_without_a_file_keeps_nothing_and_says_which_steps_are_missing(tmp_path):
    csv = tmp_path / "run" / "metrics.csv"
    rows, note = MetricsCSV(csv, ["step", "loss"]).keep_upto(2)
    assert rows == [] and note == ("metrics.csv has no rows for 2 of steps 1..2 (e.g. step 1); those steps ran "
                                   "before the checkpoint and are not redone")
    assert csv.read_text() == "step,loss\n"                      # its folder made, the header written
    assert [p.name for p in csv.parent.iterdir()] == ["metrics.csv"]   # no temporary file left


def test_keep_upto_picks_the_checkpoint_row_among_three_and_skips_a_loss_that_is_not_a_number(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,loss\n1,5.0\n2,4.0\n3,abc\n3,9.9\n3,3.0\n")
    rows, note = MetricsCSV(csv, ["step", "loss"]).keep_upto(3, loss=3.0)
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 5.0), (2, 4.0), (3, 3.0)]
    assert note == "kept line 6 for step 3 (its loss matches the checkpoint's), dropped lines 4, 5"


def test_keep_upto_with_no_loss_column_keeps_the_first_row_of_the_step(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,lr\n1,0.1\n2,0.2\n")
    rows, note = MetricsCSV(csv, ["step", "lr"]).keep_upto(2, loss=1.0)
    assert [r["step"] for r in rows] == [1, 2]
    assert note == "no row for step 2 has the checkpoint's loss 1.0; kept line 3"


def test_keep_upto_re_serialises_an_older_column_set_under_the_current_header(tmp_path):
    """A file written under other columns (one gone, one new): each kept row is written again under the current
    header, the gone column dropped and the new one empty."""
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,loss,old\n1,5.0,x\n2,4.0,y\n")
    rows, note = MetricsCSV(csv, ["step", "loss", "lr"]).keep_upto(2)
    assert note == "" and rows == [{"step": 1, "loss": 5.0, "lr": ""}, {"step": 2, "loss": 4.0, "lr": ""}]
    assert csv.read_bytes() == b"step,loss,lr\n1,5.0,\n2,4.0,\n"


@pytest.mark.parametrize("n_dropped, says", [
    (1, "dropped 1 row whose step repeats or runs backwards (step 1 at line 3 after step 1), keeping the first of "
        "each"),
    (6, "dropped 6 rows whose step repeats or runs backwards (step 1 at line 3 after step 1; step 1 at line 4 "
        "after step 1; step 1 at line 5 after step 1; step 1 at line 6 after step 1; step 1 at line 7 after step "
        "1), keeping the first of each")])
def test_dropped_repeats_are_counted_and_at_most_five_are_listed(n_dropped, says, tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,loss\n" + "1,5.0\n" * (1 + n_dropped))
    rows, note = MetricsCSV(csv, ["step", "loss"]).keep_upto(1)
    assert len(rows) == 1 and note == says


def test_a_file_deleted_before_any_row_is_recreated_empty_and_rows_with_extra_keys_are_kept(tmp_path, capsys):
    csv = tmp_path / "metrics.csv"
    m = MetricsCSV(csv, ["step", "loss"])
    m.start_fresh()
    m.append({"step": 1, "loss": 1.0, "note": "extra"})       # a key the header does not have: ignored
    csv.unlink()
    m.close([])
    assert csv.read_text() == "step,loss\n"
    assert capsys.readouterr().err == (f"{csv} disappeared during the run; re-created it from the 0 rows held in "
                                       "memory (no rows); no row lost\n")
    m = MetricsCSV(csv, ["step", "loss"])
    rows = [{"step": 1, "loss": 1.0, "note": "extra"}]
    m.append(rows[0], rows)
    csv.unlink()
    m.close(rows)
    assert csv.read_text() == "step,loss\n1,1.0\n"
