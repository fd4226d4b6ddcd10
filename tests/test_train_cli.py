"""mshelpers.train_cli: drive the training CLI the way a cluster job (and a hostile user) would.

Each case runs real `python -m mshelpers.train` processes on the tiny preset (one layer) in graph mode: exact resume,
corrupt checkpoints, two writers, foreign checkpoints, torn metrics, NaN and collapse stops, a full disk,
bad input, and SIGKILL at random moments. Every case ends in a correct result or in one line `error: ...`
with a non-zero exit, and nothing is lost or mixed.
"""
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cli_fork
from mshelpers.checkpoint import info, list_checkpoints, read
from mshelpers.config import RunConfig
from mshelpers.table import read_csv
from mshelpers.train import lr_at

# tiny with one layer: what these tests check (resume, refusals, files on disk) does not depend on depth, and the
# CPU graph compile unrolls every layer (measured: first step 3.1 s with one layer, 4.5-5.2 s with tiny's two)
# Every run shares this worker's compile cache: the same settings compile once (about 3.5 s a run saved), and
# each resume below also checks that a graph loaded from the cache continues bitwise
BASE = ["--preset", "tiny", "--set", "mode=graph", "--set", "num_layers=1", "--set", "dynamic_loss_scale=true",
        "--set", "loss_scale=1024", "--quiet", "--compile-cache", cli_fork.COMPILE_CACHE]
TWO_LAYERS = ["--preset", "tiny", "--set", "mode=graph", "--set", "dynamic_loss_scale=true",   # tiny as it is
              "--set", "loss_scale=1024", "--quiet", "--compile-cache", cli_fork.COMPILE_CACHE]


def cli(out, *args, check=True, base=BASE, cwd=None):
    """One CLI run, forked from a server that imported MindSpore once (tests/cli_fork.py: the CLI's own main
    and exit code, without 4.5 s of imports a run). The signal and kill tests start real processes."""
    cmd = [*base, "--out", str(out), *args]
    p = cli_fork.run(cmd, cwd=cwd, timeout=300)
    if check and p.returncode:
        raise AssertionError(f"{cmd} failed:\n{p.stderr[-3000:]}")
    return p


def resume(out, *args, **kw):
    """A resume keeps the run's own config: only --steps, the checkpoint flags and the worker's compile cache
    (not a setting of the run: a resume without it compiles the same graph again, about 2 s) are passed."""
    return cli(out, "--resume", "--quiet", *args, base=["--compile-cache", cli_fork.COMPILE_CACHE], **kw)


def losses(out):
    return [r["loss"] for r in read_csv(Path(out) / "metrics.csv")]


def steps_of(out):
    return [r["step"] for r in read_csv(Path(out) / "metrics.csv")]


def one_error_line(p, *needles):
    """A refused case: non-zero exit, exactly one line on stderr starting `error:`, no traceback."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode != 0, p.stderr
    assert lines and lines[-1].startswith("error: "), p.stderr
    assert "Traceback" not in p.stderr and len([l for l in lines if l.startswith("error")]) == 1, p.stderr
    # one line means one line: MindSpore's own [ERROR]/[CRITICAL] log does not come before it (issue 26)
    assert not [l for l in lines if "[ERROR]" in l or "[CRITICAL]" in l], p.stderr
    for n in needles:
        assert n in lines[-1], lines[-1]
    return lines[-1]


def temp_files(out):
    return [p for p in Path(out).rglob(".tmp-*")]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    cli(out, "--steps", "8")
    return losses(out)


def _max_step(out) -> int:
    """The last step metrics.csv holds (0 before it exists); a torn last line is the CLI's to repair, not ours."""
    try:
        lines = (Path(out) / "metrics.csv").read_text().splitlines()[1:]
        return max((int(l.split(",", 1)[0]) for l in lines if l.split(",", 1)[0].isdigit()), default=0)
    except OSError:
        return 0


def _training(child, out, since: int, timeout: float = 120) -> bool:
    """Wait until the forked run writes a step after `since` (True) or ends first (False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            child.wait(timeout=0.002)
            return False
        except subprocess.TimeoutExpired:
            if _max_step(out) > since:
                return True
    raise AssertionError(f"no new step in {timeout} s")


@pytest.fixture(scope="module")
def kill_window(tmp_path_factory, straight):
    """The seconds an uninterrupted forked run of the SIGKILL test's own command spends from its first
    metrics row to its exit (its graph in the worker's compile cache, as the killed runs find it): the training,
    the checkpoint writes and the last row, where the kill moments below are drawn from."""
    out = tmp_path_factory.mktemp("kill_window")
    child = cli_fork.start([*BASE, "--out", str(out), "--steps", "8", "--ckpt-every", "2"])
    try:
        assert _training(child, out, 0)
        t0 = time.perf_counter()
        assert child.wait(timeout=300) == 0, child.stderr()
        return time.perf_counter() - t0
    finally:
        child.close()


def test_a_forked_cli_run_is_the_real_cli_run(tmp_path):
    """The harness itself: the same command as a real `python -m mshelpers.train` process and forked from the
    server gives the same metrics, stdout and exit code, and a refusal the same one line."""
    args = ["--steps", "3", "--ckpt-every", "3"]
    real = subprocess.run([sys.executable, "-m", "mshelpers.train", *BASE, "--out", str(tmp_path / "real"), *args],
                          capture_output=True, text=True, timeout=300)
    forked = cli(tmp_path / "forked", *args)
    assert real.returncode == forked.returncode == 0, real.stderr
    assert losses(tmp_path / "real") == losses(tmp_path / "forked")
    assert real.stdout.replace("real", "X").split(" median step")[0] == forked.stdout.replace("forked", "X").split(" median step")[0]
    bad = ["--steps", "0"]
    real = subprocess.run([sys.executable, "-m", "mshelpers.train", *BASE, "--out", str(tmp_path / "r2"), *bad],
                          capture_output=True, text=True, timeout=300)
    forked = cli(tmp_path / "f2", *bad, check=False)
    assert (real.returncode, real.stderr) == (forked.returncode, forked.stderr) and real.returncode == 1, real.stderr


# ------------------------------------------------------------------------------------------ exact resume
def test_resume_is_bitwise_identical_and_says_where_it_continued(tmp_path, straight):
    cli(tmp_path, "--steps", "4", "--ckpt-every", "2")
    before = (tmp_path / "metrics.csv").read_bytes()
    p = resume(tmp_path, "--steps", "8", "--ckpt-every", "2")
    assert "resumed from" in p.stderr and "step_000004.ckpt (step 4, data position 4)" in p.stderr
    assert steps_of(tmp_path) == list(range(1, 9))
    assert losses(tmp_path) == straight          # exact: same floats, data position included
    assert (tmp_path / "metrics.csv").read_bytes().startswith(before)   # rows already written keep their bytes


def test_the_last_step_is_always_checkpointed(tmp_path):
    cli(tmp_path, "--steps", "5", "--ckpt-every", "2")
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == \
        ["step_000005.ckpt", "step_000004.ckpt", "step_000002.ckpt"]


def test_corrupt_latest_checkpoint_falls_back(tmp_path, straight):
    cli(tmp_path, "--steps", "6", "--ckpt-every", "2")
    newest = list_checkpoints(tmp_path / "checkpoints")[0]
    assert newest.name == "step_000006.ckpt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])   # truncated, like a full disk
    p = resume(tmp_path, "--steps", "8", "--ckpt-every", "2")
    assert "step_000006.ckpt is corrupt or truncated" in p.stderr
    assert "resumed from" in p.stderr and "(step 4," in p.stderr
    assert losses(tmp_path) == straight          # resumed from step 4 and redid 5..8


def files_of(out):
    """Every file of a run folder and its bytes (the lock file aside: taking the lock writes our pid)."""
    return {p: p.read_bytes() for p in Path(out).rglob("*") if p.is_file() and p.name != ".lock"}


def test_every_checkpoint_corrupt_stops_and_touches_nothing(tmp_path):
    cli(tmp_path, "--steps", "4", "--ckpt-every", "2")
    for c in list_checkpoints(tmp_path / "checkpoints"):
        c.write_bytes(c.read_bytes()[:1000])
    snapshot = files_of(tmp_path)
    # issue 26 F1: with a --set too, config.yaml is not rewritten ("nothing was changed" is true)
    p = resume(tmp_path, "--steps", "8", "--set", "lr=0.5", "--allow-change", check=False)
    one_error_line(p, "NothingToResume", "nothing was changed")
    assert files_of(tmp_path) == snapshot


# ------------------------------------------------------------- issue 26: refused means nothing written
@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A 2-step run on a text file with a checkpoint every 2 steps (the interval is stored with the run).
    The data path is relative (run from the folder), so a copy of the folder is a run on its own copy."""
    root = tmp_path_factory.mktemp("text_run")
    data = root / "corpus.txt"
    rng = random.Random(0)
    data.write_bytes(bytes(rng.randrange(256) for _ in range(40 * 33)))   # 40 windows
    cli(root / "run", "--steps", "2", "--ckpt-every", "2", "--set", "data=corpus.txt", cwd=root)
    return root


def test_a_refused_resume_leaves_every_file_byte_identical(tmp_path, text_run):
    """F1, F2, F3, F5: each refusal is one line and leaves config.yaml, metrics.csv and the checkpoints as
    they were; the next plain resume is the same run (no changed setting, the original lr)."""
    shutil.copytree(text_run, tmp_path, dirs_exist_ok=True)
    out, data = tmp_path / "run", tmp_path / "corpus.txt"
    snapshot = files_of(out)
    refusals = [
        (["--steps", "4", "--set", "lr=0.5"], ["--set changes the run's results: lr 0.003 -> 0.5", "--allow-change"]),
        (["--steps", "1", "--set", "lr=0.5", "--allow-change"], ["steps=1 is fewer than the checkpoint's step 2"]),
        (["--steps", "100000000"], ["--steps=100000000 is invalid", "1 to 1,000,000"]),
        (["--steps", "4", "--set", "hidden_size=128", "--allow-change"], ["CorruptCheckpoint", "does not fit"]),
    ]
    for args, needles in refusals:
        one_error_line(resume(out, *args, check=False, cwd=tmp_path), *needles)
        assert files_of(out) == snapshot, args
    # a hand edit of config.yaml between runs is refused, naming the field; the file stays as edited
    (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("lr: 0.003", "lr: 0.3"))
    edited = files_of(out)
    one_error_line(resume(out, "--steps", "4", check=False, cwd=tmp_path),
                   "differs from the settings step_000002.ckpt was trained with", "lr 0.003 -> 0.3",
                   "--set (lr=0.3) and --allow-change")
    assert files_of(out) == edited
    (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("lr: 0.3", "lr: 0.003"))
    # the data file replaced under the same path (same size, other bytes)
    original = data.read_bytes()
    data.write_bytes(bytes(255 - b for b in original))
    line = one_error_line(resume(out, "--steps", "4", check=False, cwd=tmp_path), "the data 'corpus.txt' changed since",
                          "--allow-data-change")
    assert files_of(out) == snapshot, line
    # the same data back: the plain resume continues the run as it was (F10: the stored interval is used)
    data.write_bytes(original)
    p = resume(out, "--steps", "4", cwd=tmp_path)
    assert "changed settings" not in p.stderr and "checkpoint every 2 steps, as the run was started" in p.stderr
    assert RunConfig.from_yaml(out / "config.yaml").lr == 0.003 and steps_of(out) == [1, 2, 3, 4]
    assert [c.name for c in list_checkpoints(out / "checkpoints")] == ["step_000004.ckpt", "step_000002.ckpt"]
    assert (out / "metrics.csv").read_bytes().startswith(snapshot[out / "metrics.csv"])
    assert info(read(out / "checkpoints" / "step_000004.ckpt"))["loss"] == read_csv(out / "metrics.csv")[3]["loss"]


def test_changed_data_continues_only_when_you_say_so(tmp_path, text_run):
    """F3: --allow-data-change continues on the new content and says what changed."""
    shutil.copytree(text_run, tmp_path, dirs_exist_ok=True)
    out, data = tmp_path / "run", tmp_path / "corpus.txt"
    data.write_bytes(data.read_bytes()[::-1])
    p = resume(out, "--steps", "3", "--allow-data-change", cwd=tmp_path)
    assert "continuing on changed data 'corpus.txt': was file of 1320 bytes sha256 " in p.stderr
    assert steps_of(out) == [1, 2, 3]
    run = RunConfig.read_yaml(out / "config.yaml")["run"]
    assert run["data"] == read(out / "checkpoints" / "step_000003.ckpt")["meta.run.data"] != \
        read(out / "checkpoints" / "step_000002.ckpt")["meta.run.data"]


# ---------------------------------------------------------------------------------------- one writer
def test_a_second_writer_is_refused_at_once_and_the_first_finishes_intact(tmp_path):
    first = subprocess.Popen([sys.executable, "-m", "mshelpers.train", *BASE, "--out", str(tmp_path),
                              "--steps", "40", "--ckpt-every", "10"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".lock"
    deadline = time.time() + 120
    while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.05)
    for args in (["--steps", "40"], ["--steps", "40", "--resume"], ["--steps", "40", "--overwrite"]):
        t0 = time.time()
        p = cli(tmp_path, *args, check=False)
        one_error_line(p, "RunLocked", f"pid {first.pid}")
        assert time.time() - t0 < 60                      # refused at start-up, not after training
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert steps_of(tmp_path) == list(range(1, 41))       # every step once, from one run


def test_a_lock_left_by_a_killed_run_never_blocks(tmp_path, straight):
    # SIGKILL is not caught: a run forked from the server dies as a real process would (cli_fork.start)
    child = cli_fork.start([*BASE, "--out", str(tmp_path), "--steps", "8", "--ckpt-every", "2"])
    try:
        assert _training(child, tmp_path, 2), child.stderr()     # step 3 written: past the first checkpoint
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.close()
    assert (tmp_path / ".lock").exists() and (tmp_path / ".lock").read_text().strip() == str(child.pid)
    resume(tmp_path, "--steps", "8", "--ckpt-every", "2")
    assert losses(tmp_path) == straight


# ------------------------------------------------------------------------------------- run identity
def test_a_fresh_run_into_a_used_folder_is_refused_and_overwrite_moves_it_aside(tmp_path):
    cli(tmp_path, "--steps", "3", "--ckpt-every", "3")
    old_rows = (tmp_path / "metrics.csv").read_bytes()
    p = cli(tmp_path, "--steps", "3", check=False)
    one_error_line(p, "already holds a run", "--overwrite")
    assert (tmp_path / "metrics.csv").read_bytes() == old_rows
    p = cli(tmp_path, "--steps", "2", "--overwrite")
    moved = list((tmp_path / "previous").iterdir())
    assert len(moved) == 1 and (moved[0] / "metrics.csv").read_bytes() == old_rows
    assert (moved[0] / "checkpoints" / "step_000003.ckpt").exists()
    assert steps_of(tmp_path) == [1, 2]


def test_resume_never_continues_another_runs_checkpoints(tmp_path):
    other = tmp_path / "other"
    cli(other, "--steps", "6", "--ckpt-every", "6", "--set", "seed=1")
    run = tmp_path / "run"
    cli(run, "--steps", "2", "--ckpt-every", "2")
    # a stray checkpoint of another run, newer than ours, lands in our folder
    shutil.copy(other / "checkpoints" / "step_000006.ckpt", run / "checkpoints" / "step_000006.ckpt")
    theirs = (run / "checkpoints" / "step_000006.ckpt").read_bytes()
    other_id = RunConfig.read_yaml(other / "config.yaml")["run"]["id"]
    # our run reaches step 6 too (issue 26 F7): their file is moved aside, kept, and that is said
    p = resume(run, "--steps", "6", "--ckpt-every", "2")
    assert "step_000006.ckpt belongs to run" in p.stderr and "(step 2," in p.stderr
    assert f"step_000006.ckpt belongs to run {other_id}; moved it to" in p.stderr
    assert steps_of(run) == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoints" / "foreign" / "step_000006.ckpt").read_bytes() == theirs   # kept, never pruned
    ident = RunConfig.read_yaml(run / "config.yaml")["run"]["id"]
    assert read(run / "checkpoints" / "step_000006.ckpt")["meta.run.id"] == ident
    # only the foreign checkpoint left: nothing of ours to resume
    for c in list_checkpoints(run / "checkpoints"):
        c.unlink()
    os.replace(run / "checkpoints" / "foreign" / "step_000006.ckpt", run / "checkpoints" / "step_000006.ckpt")
    one_error_line(resume(run, "--steps", "8", check=False), "NothingToResume")


# ---------------------------------------------------------------------------------------- metrics.csv
def test_a_torn_last_metrics_line_is_repaired(tmp_path, straight):
    cli(tmp_path, "--steps", "6", "--ckpt-every", "2")
    # a crash while writing row 6: its checkpoint was never committed (that happens a step later) and the
    # row is cut mid-line
    (tmp_path / "checkpoints" / "step_000006.ckpt").unlink()
    csv = tmp_path / "metrics.csv"
    text = csv.read_text()
    csv.write_text(text[: len(text) - 25])
    p = resume(tmp_path, "--steps", "8", "--ckpt-every", "2")
    assert "dropped a torn last line" in p.stderr and "(step 4," in p.stderr
    assert steps_of(tmp_path) == list(range(1, 9)) and losses(tmp_path) == straight


def test_resume_without_metrics_csv_keeps_going_and_says_so(tmp_path, two_step_run):
    shutil.copytree(two_step_run, tmp_path, dirs_exist_ok=True)     # a run of 2 steps, a checkpoint at 2
    (tmp_path / "metrics.csv").unlink()
    p = resume(tmp_path, "--steps", "4", "--ckpt-every", "2")
    assert "no rows for 2 of steps 1..2" in p.stderr and "done: 2 steps" in p.stdout
    assert steps_of(tmp_path) == [3, 4]


# -------------------------------------------------------------------------------------- step counts
def test_extending_a_run_stretches_the_lr_schedule_and_says_how(tmp_path):
    cli(tmp_path, "--steps", "4", "--ckpt-every", "2")
    p = resume(tmp_path, "--steps", "12", "--ckpt-every", "2")
    assert "extending the run from 10 to 12 steps" in p.stderr      # tiny's preset schedule is 10 steps
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, 13))
    cfg = RunConfig.from_yaml(tmp_path / "config.yaml")
    assert cfg.steps == 12
    assert [r["lr"] for r in rows[4:]] == pytest.approx([lr_at(cfg, s) for s in range(5, 13)])


def test_resume_with_fewer_steps_than_the_checkpoint_is_refused(tmp_path, two_step_run):
    shutil.copytree(two_step_run, tmp_path, dirs_exist_ok=True)     # a run of 2 steps, a checkpoint at 2
    before = files_of(tmp_path)
    one_error_line(resume(tmp_path, "--steps", "1", check=False), "steps=1 is fewer than the checkpoint's step 2")
    assert files_of(tmp_path) == before


def test_a_finished_run_resumed_says_so_and_touches_nothing(tmp_path, two_step_run):
    shutil.copytree(two_step_run, tmp_path, dirs_exist_ok=True)
    before = files_of(tmp_path)
    p = resume(tmp_path, "--steps", "2")
    assert "the run is complete" in p.stderr and "step 2 of 2" in p.stderr and "continuing" not in p.stderr
    assert files_of(tmp_path) == before


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    p = cli(tmp_path, "--steps", "2", "--resume")
    assert "nothing to resume" in p.stderr and steps_of(tmp_path) == [1, 2]


# ----------------------------------------------------------------------------------- stop the damage
def test_a_blow_up_is_never_checkpointed_and_a_saner_lr_resumes(tmp_path):
    cli(tmp_path, "--steps", "2", "--ckpt-every", "1", "--set", "dynamic_loss_scale=false")
    # lr=1e30: step 3's update makes the weights ~1e29 (still finite), so step 4's forward overflows to NaN
    p = resume(tmp_path, "--steps", "6", "--ckpt-every", "1", "--set", "lr=1e30", "--allow-change", check=False)
    one_error_line(p, "NonFiniteLoss", "loss is nan at step 4", "newest checkpoint with finite weights",
                   "step_000002.ckpt")
    assert [c.name for c in list_checkpoints(tmp_path / "checkpoints")][0] == "step_000002.ckpt"
    assert not temp_files(tmp_path)
    p = resume(tmp_path, "--steps", "6", "--ckpt-every", "1", "--set", "lr=3e-3")
    assert "(step 2," in p.stderr and "lr 1e+30 -> 0.003" in p.stderr
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert all(r["loss"] == r["loss"] and r["loss"] < 6 for r in rows)


def test_a_collapsed_run_stops_with_a_message(tmp_path):
    # lr=1e6 saturates the weights: zero gradients and the loss pinned at ln(256), with no NaN anywhere
    p = cli(tmp_path, "--steps", "20", "--set", "lr=1e6", check=False)
    one_error_line(p, "CollapsedRun", "zero gradients or the loss pinned at ln vocab")
    assert len(steps_of(tmp_path)) < 20


def test_nonfinite_with_dynamic_loss_scale_is_skipped_and_counted(tmp_path):
    # float16 parameters (O3) overflow in the backward pass: every step is skipped, the scale halves, no crash
    cli(tmp_path, "--steps", "3", "--set", "amp_level=O3")
    rows = read_csv(tmp_path / "metrics.csv")
    assert all(r["overflow"] for r in rows)
    assert [r["loss_scale"] for r in rows] == [512.0, 256.0, 128.0]     # halved exactly once per overflow


# --------------------------------------------------------------------------------------- clean errors
@pytest.mark.parametrize("args, needle", [
    (["--set", "amp_level=O9"], "RunConfig.amp_level='O9' is invalid"),
    (["--set", "nope=1"], "--set nope: unknown RunConfig field"),
    (["--set", "lr=inf"], "RunConfig.lr=inf is invalid"),
    (["--set", "loss_scale=inf"], "RunConfig.loss_scale=inf is invalid"),
    (["--set", "grad_clip=nan"], "RunConfig.grad_clip=nan is invalid"),
    (["--set", "weight_decay=nan"], "RunConfig.weight_decay=nan is invalid"),
    (["--steps", "x"], "argument --steps: invalid int value"),
    # issue 26 F5, F11: bounds before work
    (["--steps", "99999999999999999999999"], "--steps=99999999999999999999999 is invalid; fix: pass an integer "
                                             "from 1 to 1,000,000"),
    (["--set", "batch_size=70000"], "batch_size=70000 needs 70000 sequences per step, but data='markov' holds 60600"),
])
def test_bad_cli_arguments_get_one_clear_error(tmp_path, args, needle):
    out = tmp_path / "run"
    p = cli(out, *(args if "--steps" in args else ["--steps", "3", *args]), check=False)
    one_error_line(p, needle)
    assert not out.exists()                          # refused before the folder is made


def test_a_data_file_too_short_is_refused_before_anything_is_built(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("too short")
    out = tmp_path / "run"
    one_error_line(cli(out, "--steps", "3", "--set", f"data={short}", check=False),
                   "holds 9 bytes, fewer than seq_len+1=33")
    assert not out.exists()


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_step")
    cli(out, "--steps", "2", "--ckpt-every", "2")
    return out


@pytest.mark.parametrize("yaml_text, needle", [
    ("grad_clip: abc\n", "RunConfig.grad_clip='abc' is invalid"),
    ("data: 123\n", "RunConfig.data=123 is invalid"),
    ("name: [unclosed\n", "not valid YAML"),
    ("name: tiny\x00\n", "not valid YAML"),
    ("", "is empty"),
    ("- a list\n", "expected `field: value` lines"),
])
def test_a_damaged_config_yaml_on_resume_is_one_line_and_touches_nothing(tmp_path, two_step_run, yaml_text, needle):
    tmp_path = tmp_path / "run"
    shutil.copytree(two_step_run, tmp_path)
    saved = tmp_path / "config.yaml"
    good = RunConfig.read_yaml(saved)
    if yaml_text.startswith(("grad_clip", "data")):        # a wrong type inside an otherwise intact file
        key = yaml_text.split(":")[0]
        text = saved.read_text().replace(f"{key}: {good[key]}", yaml_text.strip())
    else:
        text = yaml_text
    saved.write_text(text)
    rows = (tmp_path / "metrics.csv").read_bytes()
    one_error_line(cli(tmp_path, "--steps", "4", "--resume", "--preset", "tiny", check=False), needle)
    assert (tmp_path / "metrics.csv").read_bytes() == rows and saved.read_text() == text


def test_out_that_is_a_file_or_unwritable_is_one_line(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    one_error_line(cli(f, "--steps", "2", check=False), "is a file, not a folder")
    one_error_line(cli("/sys/mshelpers-not-writable", "--steps", "2", check=False), "PermissionError")


def test_debug_shows_the_traceback(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    p = cli(f, "--steps", "2", "--debug", check=False)
    assert p.returncode != 0 and "Traceback" in p.stderr


# ------------------------------------------------------------------------------------------ full disk
def _small_disk(tmp_path):
    """A 4 MiB tmpfs where mounting is allowed (root), else None (the caller uses RLIMIT_FSIZE)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    return mnt if r.returncode == 0 else None


def test_a_full_disk_is_one_line_leaves_no_temp_file_and_loses_nothing(tmp_path):
    # tiny's checkpoint is 1.5 MB: on a 4 MiB disk the second one fits, the third (with its pending copy) does not
    # (tiny's own two layers: the sizes are what the test is about)
    mnt = _small_disk(tmp_path)
    kw = {}
    if mnt is None:                  # no mount here: a per-process file-size limit gives EFBIG instead of ENOSPC
        import resource
        mnt = tmp_path / "disk"
        kw["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
    try:
        out = mnt / "run"
        p = cli(out, "--steps", "8", "--ckpt-every", "1", "--keep", "3", check=False, base=TWO_LAYERS, **kw)
        one_error_line(p, "OSError" if not kw else "File too large")
        assert not temp_files(out)
        good = list_checkpoints(out / "checkpoints")
        for c in good:
            read(c)                                   # every checkpoint that is there is whole
        done = steps_of(out)
        assert done == list(range(1, len(done) + 1))
        if not kw:                                    # with room for one checkpoint the run completes
            assert len(good) >= 1
            resume(out, "--steps", "8", "--ckpt-every", "1", "--keep", "1")
            assert steps_of(out) == list(range(1, 9)) and not temp_files(out)
    finally:
        if not kw:
            subprocess.run(["umount", str(mnt)], capture_output=True)


# ------------------------------------------------------------------------------------ fault injection
def test_stale_temp_files_are_removed_at_start_up(tmp_path, two_step_run):
    shutil.copytree(two_step_run, tmp_path, dirs_exist_ok=True)     # a run of 2 steps, a checkpoint at 2
    planted = [tmp_path / "checkpoints" / ".tmp-999-step_999999.ckpt", tmp_path / ".tmp-999-metrics.csv"]
    for t in planted:
        t.write_bytes(b"half a file")
    resume(tmp_path, "--steps", "3", "--ckpt-every", "2")
    assert not temp_files(tmp_path)


@pytest.mark.parametrize("trial", range(5))
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path, straight, kill_window, trial):
    """Kill the run at a random moment (up to three times), resume each time: rows 1..8 exactly once,
    the losses of an uninterrupted run, and no temp file left behind. SIGKILL cannot be caught, so the run is
    forked from the server (cli_fork.start), and each moment is drawn while it writes: after its first new
    metrics row, over the time an uninterrupted run spends from there to its exit (`kill_window`), when rows and
    checkpoints go to disk. A moment drawn from the process start (the real-process version: 2-14 s) mostly fell
    in the imports or after the exit: on a machine whose runs took 7-10 s it killed nothing (2026-12-07)."""
    rng = random.Random(1000 + trial)
    args = ["--steps", "8", "--ckpt-every", "2"]
    first, kills = True, 0
    for _ in range(12):
        child = cli_fork.start([*(BASE if first else ["--quiet", "--compile-cache", cli_fork.COMPILE_CACHE]),
                                "--out", str(tmp_path), *args,
                                *([] if first else ["--resume"])])
        try:
            if kills < 3 and _training(child, tmp_path, _max_step(tmp_path)):
                try:
                    rc = child.wait(timeout=rng.uniform(0.0, kill_window))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):      # it may have ended at that moment
                        os.kill(child.pid, signal.SIGKILL)
                    rc = child.wait(timeout=60)
                    if rc == -signal.SIGKILL:
                        kills += 1
                        first = first and not (tmp_path / "config.yaml").exists()
                        continue
            else:
                rc = child.wait(timeout=300)
            assert rc == 0, child.stderr()
        finally:
            child.close()
        if kills == 0:                     # it finished before its moment: nothing tested yet, start over
            shutil.rmtree(tmp_path)
            tmp_path.mkdir()
            first = True
            continue
        break
    assert kills >= 1, f"every run finished before its kill moment (window {kill_window:.2f} s): nothing was tested"
    assert steps_of(tmp_path) == list(range(1, 9))
    assert losses(tmp_path) == straight
    assert not temp_files(tmp_path)


# ------------------------------------------------------------------------------------------ preemption
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_at_a_random_moment_saves_and_resume_loses_no_completed_step(tmp_path, straight, sig):
    """Issue 26 F9: a scheduler's SIGTERM mid-training saves the last completed step (no --ckpt-every),
    prints one line saying where and exits 143; --resume continues at the next step, bitwise.
    SIGINT (Ctrl-C) the same with exit 130: MindSpore's SignalGuard would turn it into a SIGTERM."""
    rng = random.Random()
    csv = tmp_path / "metrics.csv"
    for attempt in range(4):
        # a finished attempt's metrics.csv would read as "training" before the next process has even
        # installed its handler (then the signal kills it at once: -15), so each attempt starts clean
        shutil.rmtree(tmp_path, ignore_errors=True)
        tmp_path.mkdir()
        proc = subprocess.Popen([sys.executable, "-m", "mshelpers.train", *BASE, "--out", str(tmp_path),
                                 "--steps", "8", "--overwrite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and \
                not (csv.exists() and len(csv.read_bytes().splitlines()) >= 2):   # step 1 written: training
            time.sleep(0.002)
        delay = rng.uniform(0, 0.08 / (attempt + 1))          # the 8 steps take ~0.1-0.2 s here
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        if proc.returncode == 0:                                # finished before the signal: try sooner
            continue
        assert proc.returncode == 128 + sig, err
        line = one_error_line(subprocess.CompletedProcess([], 128 + sig, out, err), f"Preempted: {sig.name} after step")
        done = steps_of(tmp_path)
        k = done[-1]
        assert done == list(range(1, k + 1)) and f"step_{k:06d}.ckpt (step {k})" in line, (delay, line)
        assert read(list_checkpoints(tmp_path / "checkpoints")[0])["meta.step"] == k
        if sig == signal.SIGINT:                                # the resume path is the same as for SIGTERM
            return
        p = resume(tmp_path, "--steps", "8")
        assert f"(step {k}, data position {k}); continuing at step {k + 1} of 8" in p.stderr, p.stderr
        assert steps_of(tmp_path) == list(range(1, 9)) and losses(tmp_path) == straight, delay
        assert not temp_files(tmp_path)
        return
    pytest.fail("the run finished before every SIGTERM; nothing was tested")


# --- --compile-cache (was in tests/test_compile_cache.py) ---
def test_the_cli_compile_cache_is_bitwise_faster_warm_and_survives_a_damaged_file(tmp_path):
    """`python -m mshelpers.train --compile-cache DIR`: a cold run fills one folder per graph, a warm run loads it
    (a shorter first step, the same losses to the bit), and a truncated cache file (a run killed while it wrote
    it) costs a recompile, never a wrong result: MindSpore logs an ERROR line and compiles. Also measured by
    hand (2026-12-03): an emptied dependency hash, a cache on a full disk and two cold writers at once each
    gave the same losses."""
    sys.path.insert(0, str(Path(__file__).parent))
    import cli_fork
    from mshelpers.table import read_csv

    cache = tmp_path / "cache"
    base = ["--preset", "tiny", "--set", "mode=graph", "--set", "num_layers=1", "--steps", "6", "--quiet",
            "--compile-cache", str(cache)]

    def run(name, *extra):
        p = cli_fork.run([*base, "--out", str(tmp_path / name), *extra], timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        rows = read_csv(tmp_path / name / "metrics.csv")
        return [r["loss"] for r in rows], rows[0]["step_time_s"]

    cold, cold_first = run("cold")
    graphs = [d for d in cache.iterdir() if d.is_dir()]
    assert len(graphs) == 1, graphs
    mindir = sorted(graphs[0].rglob("*.mindir"))
    assert mindir and mindir[0].stat().st_size > 0
    warm, warm_first = run("warm")
    assert warm == cold
    assert warm_first < 0.75 * cold_first, (warm_first, cold_first)     # measured: about 0.4 s warm, 3.5 s cold
    size = mindir[0].stat().st_size
    with open(mindir[0], "r+b") as f:
        f.truncate(size // 2)
    damaged, _ = run("damaged")
    assert damaged == cold
