"""mshelpers.doctor_logs: reading training logs for `python -m mshelpers.doctor CONFIG.yaml --log FILE`.

The mindformers lines are real: a subprocess drives mindformers' own MFLossMonitor (and the pynative
LossCallback's _print_log) on CPU with a two-layer Dense net, and the test reads both what it printed on
stdout and what its logger wrote to $LOG_MF_PATH/rank_0/info.log. The metrics.csv is real too: a 6-step
`python -m mshelpers.train --preset tiny` run.
"""
from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cli_fork

from mshelpers.doctor import logs as dl
from mshelpers.doctor.logs import LogError

ROOT = Path(__file__).resolve().parents[2]
ONE_LINE = re.compile(r"^doctor --log: \w+=[^\n]*; fix: [^\n]+$")

GEN = r'''
"""Drive mindformers' own MFLossMonitor on CPU; each part of the log starts with '=== <name> ==='."""
import os, sys, types
out = sys.argv[1]
os.environ["LOG_MF_PATH"] = os.path.join(out, "log")      # the logger writes <LOG_MF_PATH>/rank_0/info.log
os.environ["LOCAL_DEFAULT_PATH"] = out
import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.train import Model
import mindspore.dataset as ds
from mindformers.core.callback.callback import MFLossMonitor
from mindformers.tools.logger import logger
ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)   # steps of tens of ms: the log prints whole ms


def data(steps, bs=16):
    x = np.random.RandomState(0).randn(steps * bs, 64).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": x[:, :1] * 2.0}, shuffle=False).batch(bs)


class ScaledStep(nn.Cell):
    """Returns (loss, overflow, loss_scale, lr, global_norm), the 5-tuple MFLossMonitor reads."""
    def __init__(self, net, opt):
        super().__init__()
        self.net, self.opt, self.weights = net, opt, opt.parameters
        self.grad = ops.GradOperation(get_by_list=True)
        self.scale, self.lr = ms.Tensor(1024.0, ms.float32), ms.Tensor(0.01, ms.float32)

    def construct(self, x, y):
        loss = self.net(x, y)
        grads = self.grad(self.net, self.weights)(x, y)
        norm = ops.sqrt(ops.addn([ops.reduce_sum(g * g) for g in grads]))
        self.opt(grads)
        return loss, loss > 3.0, self.scale, self.lr, norm   # "overflow" while the loss is high


def section(name):
    logger.info("=== %s ===", name)


def train(name, cell="plain", lr=0.01, gbs=16, epochs=2, steps=6, tflops=False):
    section(name)
    net = nn.WithLossCell(nn.SequentialCell(nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 1)), nn.MSELoss())
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    step = ScaledStep(net, opt) if cell == "scaled" else nn.TrainOneStepCell(net, opt)
    mon = MFLossMonitor(learning_rate=lr, per_print_times=1, origin_epochs=epochs, dataset_size=steps,
                        global_batch_size=gbs)
    if tflops:   # as after a graph-mode FLOPs count: print_output_info adds train_throughput_per_npu
        mon.mf_calculated, mon.full_model_flops = True, 2.0e9
    Model(step).train(epochs, data(steps), callbacks=[mon], dataset_sink_mode=False)
    return mon


train("plain")                                   # lr: 0.01, overflow cond: False, loss_scale: unavailable
train("scaled", cell="scaled", lr=None)          # lr, overflow, loss_scale, global_norm from the cell
mon = train("tflops", lr=None, gbs=0, epochs=1, tflops=True)   # no lr, 0.00000 samples/s/p, TFLOP/s
section("sink")                                  # dataset sinking's "loss: x" form (CPU does not sink)
mon.mf_calculated = False
cb = types.SimpleNamespace(dataset_sink_mode=True)
for s in range(1, 5):
    mon.print_output_info(cb, 1, 1, 8.0 / (0.1 * s), s, 4, 2.0 / s, 100.0 * s, "False", 1024.0, 1.0,
                          25.0 * s, 0.5, None, None, None, None)
train("restart-a", epochs=1, steps=8)            # a job, then the same job started again
train("restart-b", epochs=1, steps=5)
section("pynative")
from mindformers.pynative.callback.loss_callback import LossCallback
for s in range(1, 4):
    LossCallback()._print_log({"loss": 2.0 / s, "grad_norm": 0.5, "cur_step": s, "max_steps": 3,
                               "step_time": 120 + s, "throughput": 0.5, "learning_rate": 1e-4})
section("end")
'''


def _sections(text: str) -> dict[str, list[str]]:
    """The log cut at its '=== name ===' lines."""
    parts: dict[str, list[str]] = {}
    name = "head"
    for line in text.splitlines(keepends=True):
        m = re.search(r"=== ([\w-]+) ===", line)
        if m:
            name = m.group(1)
            continue
        parts.setdefault(name, []).append(line)
    return parts


@pytest.fixture(scope="module")
def mf(tmp_path_factory):
    """Real mindformers output: {"stdout": sections, "file": sections} (file: $LOG_MF_PATH/rank_0/info.log)."""
    out = tmp_path_factory.mktemp("mflog")
    (out / "gen.py").write_text(GEN)
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(out / "gen.py"), str(out)], cwd=out, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = out / "log" / "rank_0" / "info.log"
    return {"stdout": _sections(proc.stdout), "file": _sections(info.read_text(encoding="utf-8")), "dir": out}


def write(tmp_path: Path, name: str, lines, newline: str = "") -> Path:
    p = tmp_path / name
    p.write_bytes(("".join(lines) if not newline else newline.join(x.rstrip("\r\n") for x in lines)).encode())
    return p


def step_lines(lines) -> list[str]:
    """An independent count: the lines that carry a per-step time."""
    return [x for x in lines if "per_step_time:" in x]


def check_plain(recs: list[dict], lines: list[str]) -> None:
    """What the 'plain' run's 12 MFLossMonitor lines say."""
    assert len(recs) == len(step_lines(lines)) == 12
    assert [r["step"] for r in recs] == list(range(1, 13))
    assert [r["epoch"] for r in recs] == [1] * 6 + [2] * 6
    assert {r["callback"] for r in recs} == {"MFLossMonitor"}
    for r, line in zip(recs, step_lines(lines)):
        ms = int(re.search(r"per_step_time: (\d+)ms", line).group(1))
        assert r["per_step_time_s"] == ms / 1000 and ms > 0
        assert f"loss:[{r['loss']:.6f}/" in line
    assert all(r["lr"] == 0.01 and r["overflow"] is False for r in recs)
    assert all(r["loss_scale"] is None and r["global_norm"] is None for r in recs)
    assert all(r["samples_per_s_p"] > 0 for r in recs)


# ---------------------------------------------------------------- real mindformers lines
@pytest.mark.parametrize("where", ["stdout", "file"])
def test_real_mflossmonitor_lines(mf, where):
    lines = mf[where]["plain"]
    check_plain(dl.parse_mindformers_log(lines), lines)


def test_both_logger_formats_give_the_same_steps(mf, tmp_path):
    a = dl.read_training_log(write(tmp_path, "stdout.log", mf["stdout"]["plain"]))
    b = dl.read_training_log(write(tmp_path, "info.log", mf["file"]["plain"]))
    assert a["format"] == b["format"] == "mindformers"
    keys = ("step", "loss", "per_step_time_s", "samples_per_s_p")
    assert [[r[k] for k in keys] for r in a["steps"]] == [[r[k] for k in keys] for r in b["steps"]]


def test_scale_overflow_and_norm_from_the_train_cell(mf):
    recs = dl.parse_mindformers_log(mf["file"]["scaled"])
    assert len(recs) == 12
    assert all(r["loss_scale"] == 1024.0 and r["lr"] == 0.01 and r["global_norm"] > 0 for r in recs)
    assert [r["overflow"] for r in recs] == [r["loss"] > 3.0 for r in recs]
    assert any(r["overflow"] for r in recs) and not all(r["overflow"] for r in recs)


def test_no_lr_no_batch_size_and_tflops(mf):
    recs = dl.parse_mindformers_log(mf["stdout"]["tflops"])
    assert len(recs) == 6
    assert all(r["lr"] is None and r["samples_per_s_p"] is None for r in recs)   # printed 0.00000 samples/s/p
    assert all(r["model_tflops_per_device"] > 0 for r in recs)
    out = dl.measured_throughput(recs, global_batch=16, seq_len=1, devices=1)
    assert out["log_tokens_per_s_per_device"] is None and out["log_model_tflops_per_device"] > 0


def test_sink_mode_loss_form(mf):
    recs = dl.parse_mindformers_log(mf["file"]["sink"])
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert [r["per_step_time_s"] for r in recs] == [0.1, 0.2, 0.3, 0.4]
    assert [r["loss"] for r in recs] == pytest.approx([2.0, 1.0, 2 / 3, 0.5], abs=1e-6)
    assert [r["samples_per_s_p"] for r in recs] == pytest.approx([80, 40, 80 / 3, 20], rel=1e-6)
    assert all("epoch_mean_loss" not in r for r in recs)


def test_pynative_loss_callback_1_9(mf):
    notes: list[str] = []
    recs = dl.parse_mindformers_log(mf["file"]["pynative"], notes)
    assert [(r["step"], r["per_step_time_s"], r["callback"]) for r in recs] == \
        [(1, 0.121, "LossCallback"), (2, 0.122, "LossCallback"), (3, 0.123, "LossCallback")]
    assert recs[0]["lr"] == 1e-4 and recs[0]["global_norm"] == 0.5 and recs[0]["epoch"] is None
    assert recs[0]["model_tflops_per_device"] == 500.0     # printed "  0.50T": 1.9.0 divides by 1e12, not 1e9
    assert any("1000x" in n for n in notes)


def test_pynative_loss_callback_2_1_format():
    """mindformers 2.1.0 pynative/callback/loss_callback.py LossCallback._print_log, its f-strings filled in."""
    lines = ["{ step:[    7/  100], consumed_samples: 56, global_batch_size: 8, loss:   2.500000, "
             "per_step_time:    250ms, load_balancing_loss:   0.010000, lr: 1.000000e-04, grad_norm:   0.750000, "
             "throughput:  12.50T }\n",
             "{ step:[    8/  100], consumed_samples: 64, global_batch_size: 8, loss: N/A (non-last PP stage, "
             "refer to last stage for real loss), per_step_time:    251ms }\n"]
    notes: list[str] = []
    a, b = dl.parse_mindformers_log(lines, notes)
    assert (a["step"], a["loss"], a["per_step_time_s"], a["model_tflops_per_device"]) == (7, 2.5, 0.25, 12.5)
    assert (a["consumed_samples"], a["global_batch_size"], a["global_norm"]) == (56, 8, 0.75)
    assert b["loss"] is None and b["per_step_time_s"] == 0.251
    assert not any("1000x" in n for n in notes)


def test_restart_keeps_the_last_run(mf, tmp_path):
    lines = mf["stdout"]["restart-a"] + mf["stdout"]["restart-b"]
    got = dl.read_training_log(write(tmp_path, "restart.log", lines))
    assert [r["step"] for r in got["steps"]] == [1, 2, 3, 4, 5]
    assert got["steps"][0]["line"] > len(step_lines(mf["stdout"]["restart-a"]))
    assert any("went back" in n and "last run" in n for n in got["notes"])


def test_whole_real_log_ignores_non_step_lines(mf):
    path = mf["dir"] / "log" / "rank_0" / "info.log"
    text = path.read_text(encoding="utf-8")
    assert "WARNING" in text and "=== plain ===" in text
    got = dl.read_training_log(path)
    assert [r["callback"] for r in got["steps"]] == ["LossCallback"] * 3   # the last run: the pynative part


# ---------------------------------------------------------------- hostile input, on real lines
def test_crlf_and_ansi_colours(mf, tmp_path):
    lines = ["\x1b[32m" + x.rstrip("\n") + "\x1b[0m\n" for x in mf["stdout"]["plain"]]
    check_plain(dl.parse_mindformers_log(write(tmp_path, "win.log", lines, newline="\r\n")), mf["stdout"]["plain"])


def test_truncated_last_line(mf, tmp_path):
    lines = mf["file"]["plain"]
    last = max(i for i, x in enumerate(lines) if "per_step_time" in x)
    torn = lines[:last] + [lines[last][: lines[last].index("overflow cond") + 5]]   # cut mid-line, no newline
    notes: list[str] = []
    recs = dl.parse_mindformers_log(write(tmp_path, "torn.log", torn), notes)
    assert [r["step"] for r in recs] == list(range(1, 12))
    assert any("torn" in n for n in notes)


def test_two_ranks_interleaved_without_a_tag(mf, tmp_path):
    rank0 = mf["file"]["plain"]
    rank1 = [x.replace("per_step_time: ", "per_step_time: 9") for x in rank0]   # the other rank's times
    lines = [x for pair in zip(rank0, rank1) for x in pair]
    got = dl.read_training_log(write(tmp_path, "two.log", lines))
    check_plain(got["steps"], rank0)
    assert any("interleaved" in n for n in got["notes"])


def test_two_ranks_tagged_by_grep(mf, tmp_path):
    rank0 = ["output/msrun_log/worker_0.log:" + x for x in mf["stdout"]["plain"]]
    rank1 = ["output/msrun_log/worker_1.log:" + x.replace("per_step_time: ", "per_step_time: 9")
             for x in mf["stdout"]["plain"]]
    got = dl.read_training_log(write(tmp_path, "grep.log", rank0 + rank1))   # grep -H: one file after the other
    check_plain(got["steps"], mf["stdout"]["plain"])
    assert {r["rank"] for r in got["steps"]} == {0}
    assert any("ranks [0, 1]" in n and "kept rank 0" in n for n in got["notes"])


@pytest.mark.parametrize("content, field", [
    (None, "file"),                                              # missing
    (b"", "file"),                                               # empty
    (b"\n  \n", "file"),                                         # blank
    (bytes(random.Random(0).randrange(256) for _ in range(4096)), "content"),   # binary garbage
    (b"Epoch 1 done\nnothing to see here\n", "step_lines"),
    (b"step,loss,tokens_per_s\n1,2.0,100\n", "columns"),          # a CSV without step_time_s
])
def test_bad_files_raise_one_line(tmp_path, content, field):
    p = tmp_path / "x.log"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(LogError) as e:
        dl.read_training_log(p)
    assert e.value.field == field and isinstance(e.value, ValueError)
    assert ONE_LINE.match(str(e.value)), str(e.value)


@pytest.mark.parametrize("t", [0.0, -0.5, float("nan")])
def test_bad_step_times_raise(t):
    recs = [{"step": i, "line": i, "per_step_time_s": 0.1} for i in range(1, 6)]
    recs[3]["per_step_time_s"] = t
    with pytest.raises(LogError, match=r"^doctor --log: per_step_time_s=.*step 4.*; fix: "):
        dl.steady_step_time(recs)


# ---------------------------------------------------------------- the cookbook's metrics.csv
@pytest.fixture(scope="module")
def run_csv(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "tiny"
    proc = cli_fork.run(["--preset", "tiny", "--steps", "6", "--out", str(out), "--quiet"], cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "metrics.csv"


def test_real_metrics_csv(run_csv):
    got = dl.read_training_log(run_csv)
    rows = run_csv.read_text().splitlines()
    assert got["format"] == "metrics.csv" and len(got["steps"]) == len(rows) - 1 == 6
    assert [r["step"] for r in got["steps"]] == list(range(1, 7))
    times = [float(x.split(",")[rows[0].split(",").index("step_time_s")]) for x in rows[1:]]
    assert [r["per_step_time_s"] for r in got["steps"]] == times
    # tiny preset: batch 4 x seq 32, one device; the CSV's tokens_per_s is 128 / step_time_s
    out = dl.measured_throughput(got["steps"], global_batch=4, seq_len=32, devices=1)
    assert out["tokens_per_s_per_device"] == pytest.approx(128 / out["step_time"]["median_s"])
    assert out["log_tokens_per_s_per_device"] == pytest.approx(out["tokens_per_s_per_device"], rel=0.3)
    assert out["step_time"]["skipped_warmup"] == 1 and out["step_time"]["first_step_s"] == times[0]


def test_metrics_csv_resumed_torn_and_nan(run_csv, tmp_path):
    head, *rows = run_csv.read_text().splitlines(keepends=True)
    resumed = [head] + rows + rows[2:]            # StepLogger(append=True) after a resume from step 2
    notes: list[str] = []
    recs = dl.read_metrics_csv(write(tmp_path, "resumed.csv", resumed), notes)
    assert [r["step"] for r in recs] == [3, 4, 5, 6] and any("went back" in n for n in notes)
    torn = [head] + rows[:-1] + [rows[-1][:9]]
    notes = []
    assert len(dl.read_metrics_csv(write(tmp_path, "torn.csv", torn), notes)) == 5
    assert any("torn" in n for n in notes)
    col = head.split(",").index("step_time_s")
    bad = rows[3].split(",")
    bad[col] = "nan"
    with pytest.raises(LogError, match="per_step_time_s=nan"):
        dl.steady_step_time(dl.read_metrics_csv(write(tmp_path, "nan.csv", [head] + rows[:3] + [",".join(bad)])))


# ---------------------------------------------------------------- the figures
def test_steady_step_time_leaves_out_warmup_and_slow_steps():
    times = [5.0] + [0.1, 0.11, 0.09, 0.1, 0.12, 0.1, 0.1, 0.9, 0.1, 0.1, 0.1]   # compile, then a save at 9
    recs = [{"step": i, "line": i, "per_step_time_s": t} for i, t in enumerate(times, start=1)]
    s = dl.steady_step_time(recs)
    assert (s["skipped_warmup"], s["skipped_slow"], s["steps_used"]) == (1, 1, 10)
    assert s["median_s"] == 0.1 and s["first_step_s"] == 5.0 and 9 not in s["used"]
    assert s["q1_s"] <= s["median_s"] <= s["q3_s"]
    assert dl.steady_step_time(recs, skip=3)["steps_used"] == 8
    with pytest.raises(LogError, match="^doctor --log: steps=1;"):
        dl.steady_step_time(recs[:1])


def test_measured_throughput_and_mfu():
    recs = [{"step": i, "line": i, "per_step_time_s": t, "samples_per_s_p": 64 / 8 / t}
            for i, t in enumerate([3.0, 2.0, 2.0, 2.0, 2.0, 2.0], start=1)]   # 5 steady: no short-log note
    out = dl.measured_throughput(recs, global_batch=64, seq_len=4096, devices=8)
    assert out["tokens_per_s_per_device"] == 64 * 4096 / (2.0 * 8) == 16384
    assert out["log_tokens_per_s_per_device"] == pytest.approx(16384) and not out["notes"]
    wrong = dl.measured_throughput(recs, global_batch=32, seq_len=4096, devices=8)
    assert len(wrong["notes"]) == 1 and "differs" in wrong["notes"][0]   # the log's own figure disagrees
    short = dl.measured_throughput(recs, global_batch=64, seq_len=4096, devices=8, skip=2)   # skip reaches it
    assert short["step_time"]["skipped_warmup"] == 2 and short["notes"][0].startswith("only 4 steady steps")
    m = dl.mfu_from_log(16384, n_params=7e9, layers=32, heads=32, head_dim=128, seq_len=4096,
                        peak_flops=280e12, hardware_flops_per_token=8 * 7e9)
    assert m["mfu_6n"] == pytest.approx(16384 * 6 * 7e9 / 280e12)
    assert m["mfu_palm"] == pytest.approx(16384 * (6 * 7e9 + 12 * 32 * 32 * 128 * 4096) / 280e12)
    assert m["mfu_hardware"] == pytest.approx(16384 * 8 * 7e9 / 280e12)
    moe = dl.mfu_from_log(16384, n_params=47e9, n_active_params=13e9, layers=32, heads=32, head_dim=128,
                          seq_len=4096, peak_flops=280e12)
    assert moe["flops_per_token_6n"] == 6 * 13e9 and moe["mfu_hardware"] is None
    with pytest.raises(LogError, match="^doctor --log: peak_flops=0; fix:"):
        dl.mfu_from_log(1.0, n_params=1, layers=1, heads=1, head_dim=1, seq_len=1, peak_flops=0)


# ---------------------------------------------------------------- the tests bite
def test_a_broken_parser_fails_these_tests(mf, monkeypatch):
    lines = mf["file"]["plain"]
    check_plain(dl.parse_mindformers_log(lines), lines)
    with monkeypatch.context() as m:
        m.setattr(dl, "STEP", re.compile(r"(?!x)x"))                 # finds no step line
        with pytest.raises(LogError):
            check_plain(dl.parse_mindformers_log(lines), lines)
    with monkeypatch.context() as m:
        m.setattr(dl, "_one_run", lambda recs, notes: [])            # returns no records
        with pytest.raises(AssertionError):
            check_plain(dl.parse_mindformers_log(lines), lines)
    with monkeypatch.context() as m:
        m.setattr(dl, "FIELD", {**dl.FIELD, "per_step_time_ms": re.compile(r"per_step_time:\s*(\d)")})
        with pytest.raises(AssertionError):                         # reads one digit of the time
            check_plain(dl.parse_mindformers_log(lines), lines)
