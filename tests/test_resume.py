"""Drive the training CLI the way a cluster job would: exact resume, corrupt fallback, SIGKILL recovery.

Each case runs real `python -m mshelpers.train` processes on the tiny preset in graph mode.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mshelpers.checkpoint import list_checkpoints
from mshelpers.table import read_csv

BASE = ["--preset", "tiny", "--set", "mode=graph", "--set", "dynamic_loss_scale=true",
        "--set", "loss_scale=1024", "--quiet"]


def cli(out, *args, check=True):
    cmd = [sys.executable, "-m", "mshelpers.train", *BASE, "--out", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and p.returncode:
        raise AssertionError(f"{cmd} failed:\n{p.stderr[-3000:]}")
    return p


def losses(out):
    return [r["loss"] for r in read_csv(Path(out) / "metrics.csv")]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    cli(out, "--steps", "8")
    return losses(out)


def test_resume_is_bitwise_identical(tmp_path, straight):
    cli(tmp_path, "--steps", "4", "--ckpt-every", "2")
    cli(tmp_path, "--steps", "8", "--ckpt-every", "2", "--resume")
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert losses(tmp_path) == straight          # exact: same floats, data position included


def test_corrupt_latest_checkpoint_falls_back(tmp_path, straight):
    cli(tmp_path, "--steps", "6", "--ckpt-every", "2")
    newest = list_checkpoints(tmp_path / "checkpoints")[0]
    assert newest.name == "step_000006.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])   # truncated, like a full disk
    p = cli(tmp_path, "--steps", "8", "--ckpt-every", "2", "--resume")
    assert "step_000006.ckpt is corrupt or truncated" in p.stderr
    assert losses(tmp_path) == straight          # resumed from step 4 and redid 5..8


def test_sigkill_loses_at_most_k_steps(tmp_path, straight):
    k = 2
    cmd = [sys.executable, "-m", "mshelpers.train", *BASE, "--out", str(tmp_path), "--steps", "400",
           "--ckpt-every", str(k)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    csv = tmp_path / "metrics.csv"
    deadline = time.time() + 240
    while time.time() < deadline and (not csv.exists() or len(csv.read_text().splitlines()) < 8):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(read_csv(csv))
    saved = int(list_checkpoints(tmp_path / "checkpoints")[0].stem.split("_")[1])
    assert done - saved <= k + 1                 # +1: a step may finish between the CSV write and the kill
    # A kill mid-write may leave a temp file; it must never be read. Plant one that would win if it were.
    ckpts = tmp_path / "checkpoints"
    (ckpts / ".tmp-999-step_999999.ckpt").write_bytes(b"half a checkpoint")
    assert all(not p.name.startswith(".tmp-") for p in list_checkpoints(ckpts))
    p = cli(tmp_path, "--steps", str(saved + 2), "--ckpt-every", str(k), "--resume")
    assert "corrupt" not in p.stderr
    rows = read_csv(csv)
    assert [r["step"] for r in rows] == list(range(1, saved + 3))


def test_nonfinite_loss_stops_with_step_and_checkpoint(tmp_path):
    # lr=1e30: Adam's first update makes the weights ~1e29, so the second forward overflows to NaN
    p = cli(tmp_path, "--steps", "6", "--ckpt-every", "1", "--set", "dynamic_loss_scale=false",
            "--set", "lr=1e30", check=False)
    assert p.returncode != 0
    assert "NonFiniteLoss: loss is nan at step 2; last good checkpoint:" in p.stderr
    assert "step_000001.ckpt" in p.stderr


def test_nonfinite_with_dynamic_loss_scale_is_skipped_and_counted(tmp_path):
    # float16 parameters (O3) overflow in the backward pass: every step is skipped, the scale halves, no crash
    cli(tmp_path, "--steps", "3", "--set", "amp_level=O3")
    rows = read_csv(tmp_path / "metrics.csv")
    assert all(r["overflow"] for r in rows)
    assert [r["loss_scale"] for r in rows] == [512.0, 256.0, 128.0]     # halved exactly once per overflow


def test_bad_cli_arguments_get_one_clear_error(tmp_path):
    p = cli(tmp_path, "--steps", "3", "--set", "amp_level=O9", check=False)
    assert p.returncode == 2 and "RunConfig.amp_level='O9' is invalid" in p.stderr
    p = cli(tmp_path, "--steps", "3", "--set", "nope=1", check=False)
    assert p.returncode == 2 and "--set nope: unknown RunConfig field" in p.stderr
