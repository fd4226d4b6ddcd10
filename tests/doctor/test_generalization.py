"""The doctor on families it has never seen (issue 59): leave-one-family-out on mindformers' cards, the error band
every prediction prints from it, and both figures where the price depends on the mindformers release."""
import json
import statistics
from pathlib import Path

import pytest

from mshelpers import doctor as D
from mshelpers.doctor import calibration as C
from mshelpers.doctor.describe import EXPECTED_ERROR

DATA = Path(__file__).parents[1] / "data" / "mindformers"
Y7 = DATA / "r1.2.0_pretrain_llama2_7b.yaml"
TELECHAT_MOE = DATA / "r1.6.0_finetune_telechat_39b_a12b.yaml"


@pytest.fixture(scope="module")
def lofo():
    return C.leave_one_family_out(str(DATA))


def test_each_family_is_predicted_by_a_fit_that_never_saw_it(lofo):
    fit_families = {C.family_of(p) for p in D.PUBLISHED if p["role"] == "fit"}
    refit = [f for f in lofo if f["family"] in fit_families]
    assert {f["family"] for f in refit} == fit_families
    for f in lofo:
        seen = {C.family_of(p) for p in D.PUBLISHED if p["file"] in f["calibration"].fitted_on}
        assert f["family"] not in seen, (f["family"], f["calibration"].fitted_on)
        assert len(f["calibration"].fitted_on) == 4
    for f in refit:                   # the held-out family's own fit row is now predicted, not reproduced
        assert f["stand_ins"] and f["n"] == sum(1 for p in D.PUBLISHED if C.family_of(p) == f["family"]
                                                and p["role"] != "excluded" and C.release_of(p) >= (1, 2)
                                                and (D.read_config(DATA / p["file"]).model.moe is not None) == f["moe"])
        assert all(abs(e) > 1e-3 for e in f["errors"]), f


def test_a_stand_in_takes_the_part_of_the_step_its_fit_row_set():
    pts = C.stand_in_points("chatglm3", str(DATA))
    new = [p for p in pts if p["file"] not in D.FIT_POINTS]
    assert [p["sets"] for p in new] == ["attention"] and C.family_of(new[0]) != "chatglm3"
    assert [p["file"] for p in pts if p["file"] in D.FIT_POINTS] == [p["file"] for p in D.PUBLISHED
                                                                      if p["role"] == "fit" and p["sets"] != "attention"]
    # telechat2's fit row is MoE: its stand-in is MoE too (the all-to-all is what the comm factor was fitted on)
    tele = [p for p in C.stand_in_points("telechat2", str(DATA)) if p["file"] not in D.FIT_POINTS]
    assert [p["sets"] for p in tele] == ["comm"] and D.read_config(DATA / tele[0]["file"]).model.moe is not None


def test_the_stored_band_is_what_leave_one_family_out_gives(lofo):
    got = C.lofo_summary(lofo)
    for kind in ("dense", "moe"):
        for k in ("median_abs_error", "p80_abs_error"):
            assert got[kind][k] == pytest.approx(EXPECTED_ERROR[kind][k], abs=1.5e-3), (kind, k, got[kind])
        assert (got[kind]["rows"], got[kind]["families"]) == (EXPECTED_ERROR[kind]["rows"],
                                                              EXPECTED_ERROR[kind]["families"])
    errs = sorted(abs(e) for f in lofo if not f["moe"] for e in f["errors"])
    assert got["dense"]["median_abs_error"] == pytest.approx(statistics.median(errs), abs=1e-4)


def test_every_ascend_prediction_prints_its_band_and_the_cpu_none(capsys):
    r = D.diagnose(str(Y7), search=False)
    band = EXPECTED_ERROR["dense"]
    assert f"+/-{band['median_abs_error']:.0%} typical" in r["verdict"]
    assert D.summary_json(r)["expected_error"]["median_abs_error"] == band["median_abs_error"]
    moe = D.diagnose(str(TELECHAT_MOE), search=False)
    assert D.summary_json(moe)["expected_error"]["kind"] == "moe"
    cpu = D.diagnose(str(Y7), hardware_name="cpu", search=False)
    assert "expected error" not in cpu["verdict"] and D.summary_json(cpu)["expected_error"] is None
    assert D.main([str(Y7), "--no-search", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["expected_error"]["kind"] == "dense"


def test_both_release_figures_in_one_line_when_the_price_depends_on_it():
    r = D.diagnose(str(TELECHAT_MOE), search=False)
    pair = r["release_pair"]
    before = D.step_time(D.with_reserve(D.read_config(TELECHAT_MOE, release="r1.4.0"), D.hardware()), D.hardware())
    after = D.step_time(D.with_reserve(D.read_config(TELECHAT_MOE, release="r1.6.0"), D.hardware()), D.hardware())
    assert pair["before"] == pytest.approx(before["tokens_per_s_per_device"])
    assert pair["from"] == pytest.approx(after["tokens_per_s_per_device"]) and pair["before"] < 0.95 * pair["from"]
    assert f"{pair['before']:.0f} tokens/s/p before r1.5.0, {pair['from']:.0f} from r1.5.0 on" in r["verdict"]
    assert D.diagnose(str(TELECHAT_MOE), search=False, release="r1.6.0")["release_pair"] is None
    assert D.diagnose(str(Y7), search=False)["release_pair"] is None          # dense: no release changes its price
