"""mshelpers.launch: the msrun command line, a real 2-rank msrun job, and how a failed rank is reported.

The two msrun jobs take about 30 s together on a 2-core CPU; run under `flock /tmp/heavy.lock`.
"""
from __future__ import annotations

import json
import os
import shlex
import sys

import pytest

from mshelpers.launch import (MsrunError, _first_error_line, free_port, msrun, msrun_command,
                              rank_output_dir, write_rank_result)
from mshelpers.workers import script_path


def test_msrun_command_single_node():
    cmd = shlex.split(msrun_command("train.py", workers=2, args=["--steps", "5"], master_port=9001))
    assert cmd[:6] == ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                       "--master_port=9001", "--log_dir=msrun_log"]
    assert cmd[-3:] == ["train.py", "--steps", "5"]
    assert not any(c.startswith("--node_rank") for c in cmd)


def test_msrun_command_multi_node_flags():
    cmd = msrun_command("train.py", workers=16, local_workers=8, master_addr="10.0.0.1", node_rank=1)
    for flag in ("--worker_num=16", "--local_worker_num=8", "--master_addr=10.0.0.1",
                 "--master_port=8118", "--node_rank=1"):
        assert flag in cmd.split()


@pytest.mark.parametrize("kw, field", [
    (dict(workers=0), "workers"),
    (dict(workers=4, local_workers=8), "local_workers"),
    (dict(workers=16, local_workers=8), "node_rank"),
])
def test_msrun_command_bad_input(kw, field):
    with pytest.raises(ValueError, match=field):
        msrun_command("train.py", **kw)


def test_msrun_rejects_missing_script(tmp_path):
    with pytest.raises(ValueError, match="script="):
        msrun(tmp_path / "nope.py")


def test_free_port_is_bindable():
    import socket
    p = free_port()
    assert isinstance(p, int) and 1024 <= p <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))                 # raises OSError if the port were taken
        assert s.getsockname() == ("127.0.0.1", p)
        s.listen()
        assert free_port() != p                  # a port in use is never handed out


def test_first_error_line_prefers_the_exception():
    log = ["[WARNING] ME(12:34,MainProcess): chatter", "Traceback (most recent call last):",
           '  File "x.py", line 3, in <module>', "    boom()", "RuntimeError: the real cause", "more"]
    assert _first_error_line(log) == "RuntimeError: the real cause"
    assert _first_error_line(["[WARNING] ME(1,a): x", "[ERROR] ME(1,a): bad thing"]) == "[ERROR] ME(1,a): bad thing"


def test_rank_output_dir_outside_msrun(monkeypatch, tmp_path):
    monkeypatch.setenv("MSHELPERS_RANK_OUT_ROOT", str(tmp_path))
    monkeypatch.setenv("RANK_ID", "3")
    assert rank_output_dir() == tmp_path / "rank_3"
    path = write_rank_result({"a": 1, "loss": [2.5, 1.25]})
    assert path == tmp_path / "rank_3" / "result.json"
    assert json.loads(path.read_text()) == {"a": 1, "loss": [2.5, 1.25]}


def test_two_rank_msrun_allreduce(tmp_path):
    run = msrun(script_path("allreduce_check"), workers=2, log_dir=tmp_path / "ok", timeout=180)
    assert run.ok and [r.exit_code for r in run.ranks] == [0, 0]
    # each rank all-reduced rank+1 over 2 ranks: 1 + 2 = 3 on both
    assert [r.result["allreduce_sum"] for r in run.ranks] == [3.0, 3.0]
    assert [r.result["rank"] for r in run.ranks] == [0, 1]
    assert run.ranks[0].result["pid"] != run.ranks[1].result["pid"]
    assert all(any(f.name == "result.json" for f in r.files) for r in run.ranks)
    assert "all-reduce of rank+1 = 3.0" in run[1].log_tail(5)
    # the local launch's 1 s cluster retries reached both ranks (MindSpore's 3-5 s left them waiting)
    assert [r.result["retry_interval_s"] for r in run.ranks] == [["1", "1"], ["1", "1"]]


def test_worker_env_retries_default_to_1_s_and_the_environment_or_env_wins(monkeypatch, tmp_path):
    from mshelpers.launch import worker_env
    monkeypatch.delenv("MS_RETRY_INTERVAL_LOWER", raising=False)
    monkeypatch.delenv("MS_RETRY_INTERVAL_UPPER", raising=False)
    e = worker_env(tmp_path)
    assert (e["MS_RETRY_INTERVAL_LOWER"], e["MS_RETRY_INTERVAL_UPPER"]) == ("1", "1")
    assert e["MSHELPERS_RANK_OUT_ROOT"] == str(tmp_path) and e["PYTHONUNBUFFERED"] == "1"
    assert e["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    monkeypatch.setenv("MS_RETRY_INTERVAL_UPPER", "5")           # a user's setting is kept
    e = worker_env(tmp_path, {"MS_RETRY_INTERVAL_LOWER": 2})     # and env= goes on top, as text
    assert (e["MS_RETRY_INTERVAL_LOWER"], e["MS_RETRY_INTERVAL_UPPER"]) == ("2", "5")
    assert "MS_RETRY_INTERVAL_LOWER" not in os.environ            # the parent's environment is untouched
    # one bound set by the user, in the environment or env=: ours is not added beside it (lower 4, upper 1)
    assert "MS_RETRY_INTERVAL_LOWER" not in worker_env(tmp_path)
    monkeypatch.delenv("MS_RETRY_INTERVAL_UPPER")
    assert "MS_RETRY_INTERVAL_UPPER" not in worker_env(tmp_path, {"MS_RETRY_INTERVAL_LOWER": 4})


@pytest.mark.parametrize("env", [["GLOG_v=3"], "GLOG_v=3", {3: "x"}])
def test_worker_env_refuses_an_env_that_is_not_a_dict_of_names(env, tmp_path):
    from mshelpers.launch import worker_env
    with pytest.raises(ValueError, match=r"^worker_env: env=.* is invalid; fix: pass a dict of variable names"):
        worker_env(tmp_path, env)


def test_failed_rank_raises_with_its_error_line(tmp_path):
    with pytest.raises(MsrunError) as info:
        msrun(script_path("allreduce_check"), workers=2, args=["--fail-rank", "1"],
              log_dir=tmp_path / "fail", timeout=180, grace_s=4)
    msg = str(info.value)
    assert "rank 1" in msg and "told to fail" in msg and "worker_1.log" in msg
    ranks = info.value.result.ranks
    assert ranks[1].exit_code == 1
    assert ranks[1].error_line.startswith("ValueError: rank 1 was told to fail")
    assert not info.value.result.ok
    assert info.value.result.wall_s < 120   # the scheduler's 600 s cluster timeout was not waited out
