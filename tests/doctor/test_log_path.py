"""The doctor's log path, whole (issue 49, Deliver 4): --refit keeps every constant it does not refit and
reproduces its own run; the text report shows every note --json has; a log with fewer than 5 steady steps
says so; the communication groups of the step are printed and put in --json.

The logs under tests/data/logs are synthetic (tests/data/logs/README.md): MFLossMonitor's lines as mindformers
1.9.0 prints them, with step times chosen so the measured figure is a round number worked by hand below.
"""
from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from mshelpers import doctor as D
from mshelpers.doctor import cli as doctor_cli
from mshelpers.doctor import logs as dl

DATA = Path(__file__).parents[1] / "data"
Y = DATA / "mindformers"
LOGS = DATA / "logs"
Y7 = Y / "r1.2.0_pretrain_llama2_7b.yaml"

# (yaml, log, measured tokens/s/p by hand: global_batch * seq / (median step s * devices))
RUNS = {
    "dense dp8": (Y7, "llama2_7b_dp8.log", 64 * 4096 / (8.192 * 8)),                          # 4000
    "dense dp2 tp4 pp8": (Y / "r1.2.0_pretrain_llama2_70b.yaml", "llama2_70b_dp2_tp4_pp8.log",
                          256 * 4096 / (48.0 * 64)),                                           # 341.3
    "moe dp8 ep8 pp2": (Y / "r1.2.0_finetune_mixtral-8x7b.yaml", "mixtral_8x7b_dp8_ep8_pp2.log",
                        128 * 4096 / (19.275 * 16)),                                           # 1700
}


def _run(yaml_path, log, **kw):
    r = D.diagnose(str(yaml_path), search=False)
    r["log"] = D.measured_run(r, str(LOGS / log), **kw)
    return r


# ---------------------------------------------------------------- --refit
def _kept(new, old) -> bool:
    """Every constant but the refitted one (and the fit set) as it was: whatever fields Calibration has."""
    return all(getattr(new, f.name) == getattr(old, f.name) for f in fields(old)
               if f.name not in ("compute_efficiency", "fitted_on"))


@pytest.mark.parametrize("name", list(RUNS))
def test_refit_reproduces_the_run_it_was_fitted_on_and_keeps_the_other_constants(name):
    yaml_path, log, by_hand = RUNS[name]
    r = _run(yaml_path, log, refit=True)
    lg, cal = r["log"], r["calibration"]
    assert lg["measured_tokens_per_s_per_device"] == pytest.approx(by_hand, rel=1e-12)
    new = lg["refit_calibration"]
    # priced again here, outside measured_run: the refitted constants on the same config and hardware
    again = D.step_time(r["config"], r["hardware"], new)["tokens_per_s_per_device"]
    assert abs(again / by_hand - 1) < 0.01                  # the promise (issue 49)
    assert abs(again / by_hand - 1) < 1e-3                  # what the solve aims at (a one-step ratio misses
                                                            # it by 0.8 % on the pp8 run: the bubble moves)
    assert lg["refit"]["predicted_tokens_per_s_per_device"] == pytest.approx(again, rel=1e-12)
    assert (new.half_width, new.attention_efficiency, new.comm_time_factor) == \
        (cal.half_width, cal.attention_efficiency, cal.comm_time_factor)
    assert _kept(new, cal)
    assert new.fitted_on == (str(LOGS / log),) and new.compute_efficiency == lg["refit"]["compute_efficiency"]
    assert lg["refit"]["calibration"] == new.row()
    assert f"{lg['refit']['error']:+.2%}" in D.render_text(r)


def test_refit_solves_where_holding_the_other_terms_fixed_misses(monkeypatch):
    """The pp8 run: half its non-compute time is bubble, which is compute of the other stages. A refit that
    holds step - compute fixed (one ratio, no iteration) misses the run by more than the test allows."""
    yaml_path, log, by_hand = RUNS["dense dp2 tp4 pp8"]
    # started from half the stored efficiency, so the prediction is far from the run whatever the cost model's
    # other terms come to: the refit has a long way to go
    # every constant off its dataclass default, so a refit that builds a fresh Calibration loses them whatever
    # the stored fit comes to (a stored half_width of 0.0 would equal the default)
    start = replace(D.CALIBRATION, compute_efficiency=D.CALIBRATION.compute_efficiency / 2, half_width=256.0,
                    attention_efficiency=0.7)
    r = D.diagnose(str(yaml_path), search=False, calib=start)
    st = r["step"]
    one_ratio = start.compute_efficiency * st["compute_s"] / (48.0 - (st["step_s"] - st["compute_s"]))
    # neither refit's re-ranked layouts are asserted here (test_refit_reproduces... runs this run's searches), and
    # the four layout searches were most of this test's time
    monkeypatch.setattr(doctor_cli, "better_layouts", lambda *a, **k: [])
    with monkeypatch.context() as m:
        m.setattr(doctor_cli, "refit_efficiency", lambda cfg, hw, c, measured: one_ratio)
        lg = D.measured_run(r, str(LOGS / log), refit=True)
    assert abs(lg["refit"]["predicted_tokens_per_s_per_device"] / by_hand - 1) > 1e-3
    solved = D.measured_run(r, str(LOGS / log), refit=True)                  # the real solve, same start
    assert abs(solved["refit"]["predicted_tokens_per_s_per_device"] / by_hand - 1) < 1e-4
    assert _kept(solved["refit_calibration"], start) and solved["refit_calibration"].half_width == 256.0


def test_refit_on_a_run_faster_than_the_other_terms_allow_is_one_line():
    r = D.diagnose(str(Y7), search=False)
    fast = r["step"]["tokens_per_s_per_device"] * 1e3
    with pytest.raises(D.DoctorError) as e:
        doctor_cli.refit_efficiency(r["config"], r["hardware"], r["calibration"], fast)
    assert e.value.field == "--refit" and "\n" not in str(e.value) and "fix:" in str(e.value)


# ---------------------------------------------------------------- every note in the text
@pytest.mark.parametrize("yaml_path, log", [
    (Y7, "llama2_7b_dp8_monitor_twice_the_batch.log"),              # samples/s/p of twice the YAML's batch
    (Y7, "llama2_7b_two_steps.log"),                                # the short-log warning
    (Y / "2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml", "llama2_7b_dp8.log"),   # reader's notes too
])
def test_text_report_shows_every_note_json_has(yaml_path, log):
    r = _run(yaml_path, log)
    js, text = D.summary_json(r), D.render_text(r)
    notes = js["notes"] + js["log"]["notes"]
    assert js["log"]["notes"]                                        # each case carries a log note
    if "deepseek3" in str(yaml_path):
        assert js["notes"] and any("differs" in n for n in js["log"]["notes"])   # gb 8 in the YAML, 64 in the log
    for n in notes:
        assert n in text, n


def test_twice_the_batch_warns_in_the_text_of_the_cli(capsys):
    args = [str(Y7), "--no-search", "--log", str(LOGS / "llama2_7b_dp8_monitor_twice_the_batch.log")]
    code = D.main(args + ["--json"])
    js = json.loads(capsys.readouterr().out)
    assert code == 0 == D.main(args)
    text = capsys.readouterr().out
    twice = [n for n in js["log"]["notes"] if "differs by more than 10%" in n]
    assert len(twice) == 1 and "8000 tokens/s/p" in twice[0]         # 128 / 8 / 8.192 s x 4096 = 8000
    assert twice[0] in text and "Notes on the log:" in text


# ---------------------------------------------------------------- fewer than 5 steady steps
def test_fewer_than_five_steady_steps_is_said_in_one_line():
    two = _run(Y7, "llama2_7b_two_steps.log")["log"]
    short = [n for n in two["notes"] if "steady step" in n]
    assert two["n_used"] == 1 and len(short) == 1 and "\n" not in short[0]
    assert short[0].startswith("only 1 steady step of 2 after leaving out 1 warm-up")
    six = _run(Y7, "llama2_7b_six_steps.log")["log"]                 # default skip max(1, 6 // 10) = 1: 5 left
    assert six["n_used"] == 5 and not any("steady step" in n for n in six["notes"])
    six2 = _run(Y7, "llama2_7b_six_steps.log", skip=2)["log"]        # 6 - 2 = 4 left
    assert six2["n_used"] == 4 and six2["n_warmup"] == 2
    assert [n for n in six2["notes"] if "steady step" in n] == [
        "only 4 steady steps of 6 after leaving out 2 warm-up: fewer than 5, so the measured figure is not a "
        "steady median; train longer or log every step (per_print_times: 1)"]
    assert not any("steady step" in n for n in _run(Y7, "llama2_7b_dp8.log")["log"]["notes"])


def test_slow_steps_count_against_the_five():
    times = [5.0, 0.1, 0.1, 0.1, 0.1, 0.9, 0.1]      # compile, 4 steady, a checkpoint save, 1 steady: 5 used
    recs = [{"step": i, "line": i, "per_step_time_s": t} for i, t in enumerate(times, start=1)]
    assert dl.steady_step_time(recs)["notes"] == []
    s = dl.steady_step_time(recs[:-1])                # 4 used: the save left out too
    assert s["steps_used"] == 4 and s["skipped_slow"] == 1
    assert s["notes"][0].startswith("only 4 steady steps of 6 after leaving out 1 warm-up and 1 slower than 3x")


# ---------------------------------------------------------------- communication groups
GROUPS = [{"group": "TP", "size": 4, "span": "ranks 0-3", "nodes": 1, "link": "intra-node", "time_s": 0.1234},
          {"group": "DP", "size": 16, "span": "stride 4 over 64 ranks", "nodes": 8, "link": "inter-node",
           "time_s": 0.4567},
          {"group": "EP", "size": 2, "devices": [0, 8], "nodes": 2, "link": "intra+inter", "time_s": 0.05},
          {"group": "CP", "size": 1, "span": "rank 0", "nodes": 1, "link": "intra-node", "time_s": 0.0}]


def test_communication_groups_in_the_text_and_the_json():
    r = D.diagnose(str(Y7), search=False)
    r["step"] = {k: v for k, v in r["step"].items() if k != "groups"}      # a cost model that places no ranks
    assert "Communication groups" not in D.render_text(r) and D.summary_json(r)["groups"] == []
    r["step"] = dict(r["step"], groups=GROUPS)
    text = D.render_text(r)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.count("|") == 7 and
            ln.split("|")[1].strip() in ("TP", "DP", "EP", "CP")]
    assert rows == ["| TP | 4 | ranks 0-3 | 1 | intra-node | 0.123 |",
                    "| DP | 16 | stride 4 over 64 ranks | 8 | inter-node | 0.457 |",
                    "| EP | 2 | devices 0, 8 | 2 | intra+inter | 0.050 |"]          # CP of size 1: left out
    assert text.index("| **step** |") < text.index("Communication groups") < text.index("tokens/s per device")
    js = json.loads(json.dumps(D.summary_json(r)))
    assert js["groups"] == GROUPS[:3]
