"""The config doctor (mshelpers.doctor): calibration on two published points, error on the others, the
13B tuning case in the guide's order, the CLI's --json line, one-line errors with exit code 2, and the
improved YAML loaded back by mindformers' own classes."""
import json
import re
import statistics
from pathlib import Path

import pytest
import yaml

from mshelpers import doctor as D

DATA = Path(__file__).parents[1] / "data" / "mindformers"
Y7, Y13, Y70 = (DATA / f"r1.2.0_pretrain_llama2_{n}.yaml" for n in ("7b", "13b", "70b"))


@pytest.fixture(scope="module")
def table():
    return D.calibration_table(str(DATA))


def test_the_stored_calibration_is_what_the_four_fit_points_give():
    fit = D.fit_calibration(str(DATA))
    assert fit.fitted_on == D.FIT_FILES == tuple(p["file"] for p in D.PUBLISHED if p["role"] == "fit")
    assert len(fit.fitted_on) == 4 and len({D.family_of(p) for p in D.PUBLISHED if p["role"] == "fit"}) == 4
    assert D.CALIBRATION.half_width == 0.0          # no fit row for the width term: it has no effect
    for k in ("compute_efficiency", "comm_time_factor", "half_width", "attention_efficiency", "head_dim_half"):
        assert getattr(fit, k) == pytest.approx(getattr(D.CALIBRATION, k), rel=1e-3), k


def test_error_on_published_figures_not_used_for_fitting(table):
    assert len(table) == len(D.PUBLISHED) >= 90
    checked = [r for r in table if r["role"] == "check"]
    fitted = {(r["config"], r["hardware"], r["published"]) for r in table if r["role"] == "fit"}
    assert {c for c, _, _ in fitted} == set(D.FIT_FILES) and len(fitted) == 4
    assert len(checked) >= 80 and not {(r["config"], r["hardware"], r["published"]) for r in checked} & fitted
    assert len({r["family"] for r in checked}) >= 15
    errs = [abs(r["predicted"] / r["published"] - 1) for r in checked]      # from the data, not the stored field
    assert statistics.median(errs) <= 0.15, sorted(errs)
    llama = [e for e, r in zip(errs, checked) if r["family"].startswith("llama")]
    assert max(llama) <= 0.35
    for r in (r for r in table if r["role"] == "fit"):                     # the fit reproduces its own points
        assert abs(r["predicted"] / r["published"] - 1) < 0.01
    s = D.calibration_summary(table)
    assert s["median_abs_error"] == pytest.approx(statistics.median(errs), abs=5e-3)   # predicted is rounded


def test_families_off_target_are_exactly_those_with_a_stated_reason(table):
    """A family that starts or stops missing the targets must have its reason added or removed."""
    assert D.off_families(table) == set(D.OFF_FAMILIES), D.family_summary(table)


def test_each_family_off_target_cites_two_published_figures(table):
    """Issue 49 and 60: a family that misses says which published figure stands against which, with the branch,
    file and line of each; a miss without that is the model's (notebook 12's claim fails on it)."""
    assert not D.unexplained_families(table) and not D.unexplained_families(table, since=(1, 2))
    synthetic = [{"role": "check", "family": "x", "moe": False, "error": 0.9, "fits": True}]
    assert D.unexplained_families(synthetic) == {("x", False)}        # off target and no reason at all
    assert not D.cites_two_sources("optimistic by 13-28 % on four rows") and D.cites_two_sources(
        "1465 (r1.3.0 a.md l.15) against 1640 (l.23)")
    for fam in D.off_families(table):
        why = D.OFF_FAMILIES[fam]
        assert re.search(r"r1\.\d", why) and re.search(r"\.md l\.\d+", why), (fam, why)
        assert len(re.findall(r"\b\d{3,5}\b", why)) >= 2, (fam, why)      # at least two published figures


def test_release_of_reads_the_branch_off_the_file_name():
    assert D.release_of({"config": "r1.1.0_finetune_yi_6b.yaml"}) == (1, 1, 0)
    assert D.release_of({"file": "r1.0_run_glm32k.yaml"}) == (1, 0)
    assert D.release_of({"config": "master_pretrain_qwen3_32b_4k.yaml"}) == ()
    assert D.release_of({"config": "run_foo.yaml"}) == D.release_of({}) == ()


def test_since_keeps_only_figures_from_that_branch_on(table):
    """README: the r1.0/r1.1.0 figures, taken on older MindSpore releases, all come out optimistic (the same
    layouts are published faster from r1.2.0 on); set apart, fewer families miss, and none newly does."""
    old = [r for r in table if r["role"] == "check" and () < D.release_of(r) < (1, 2)]
    assert len(old) == 13 and sum(r["error"] > 0.1 for r in old) >= 11, [(r["config"], r["error"]) for r in old]
    new = D.family_summary(table, since=(1, 2))
    assert sum(f["n"] for f in new) == sum(f["n"] for f in D.family_summary(table)) - len(old)
    off_new = D.off_families(table, since=(1, 2))
    assert off_new < D.off_families(table)
    assert off_new == {("gpt2", False), ("internlm", False), ("qwen", False), ("qwen1.5", False), ("qwen2", False)}
    synthetic = [{"role": "check", "family": "x", "error": 0.9, "config": "r1.1.0_a.yaml", "fits": True},
                 {"role": "check", "family": "x", "error": 0.0, "config": "r1.3.0_a.yaml", "fits": True},
                 {"role": "check", "family": "y", "error": 0.0, "config": "a.yaml", "fits": True}]
    assert D.off_families(synthetic) == {("x", False)} and D.off_families(synthetic, since=(1, 2)) == set()
    assert [f["family"] for f in D.family_summary(synthetic, since=(1, 2))] == ["x"]


def test_excluded_rows_are_printed_with_a_reason_and_not_scored(table):
    ex = [r for r in table if r["role"] == "excluded"]
    assert len(ex) == 2 and all(len(r["reason"]) > 40 for r in ex)
    assert D.calibration_summary(table)["n_checked"] == sum(r["role"] == "check" for r in table)


def test_rankings_of_one_model_on_different_layouts(table):
    groups = {g["group"]: g for g in D.ranking_groups(table)}
    assert len(groups) == 3
    for name, g in groups.items():
        if name.startswith("CodeLlama"):              # 16 -> 32 cards: 677 -> 733 (r1.2.0), 669 -> 747 (r1.3.0)
            assert g["kendall_tau"] == 1.0, g["rows"]


def test_every_published_config_is_said_to_fit(table):
    assert all(r["fits"] for r in table), [r["config"] for r in table if not r["fits"]]


def test_step_terms_add_up_and_give_tokens_and_mfu():
    cfg = D.read_config(Y70)
    st = D.step_time(cfg, D.hardware("atlas-800t-a2"))
    terms = ("compute_s", "tp_s", "p2p_s", "bubble_s", "dp_s", "optimizer_s")
    assert sum(st[k] for k in terms) == pytest.approx(st["step_s"])
    assert all(st[k] > 0 for k in ("compute_s", "tp_s", "p2p_s", "bubble_s"))    # mp 4, pp 8, dp 2
    assert cfg.layout.global_batch == 1 * 2 * 128 and cfg.layout.devices == 64
    assert st["tokens_per_s_per_device"] == pytest.approx(cfg.layout.global_batch * 4096 / (st["step_s"] * 64))
    assert st["mfu_6n"] < st["mfu_attention"]
    full = D.step_time(D.read_config(Y13), D.hardware("atlas-800t-a2"))      # full recompute: hardware > model
    assert full["mfu_hardware"] > full["mfu_attention"] > full["mfu_6n"] and full["recompute_factor"] > 1.25
    assert st["peak_flops"] == 376e12                     # float16 at the 376T datasheet figure
    bf = D.step_time(D.read_config(DATA / "r1.3.0_pretrain_llama2_7b_bf16.yaml"), D.hardware("atlas-800t-a2"))
    assert bf["peak_flops"] == 353.9e12


def test_recompute_costs_time_and_select_lists_count_their_matmuls():
    hw = D.hardware("atlas-800t-a2")
    base = D.read_config(Y13)                             # full recompute
    none = D.with_layout(base, recompute=False, select_recompute=False)
    silu = D.with_layout(base, recompute=False, select_recompute=True)
    fine = D.with_layout(base, recompute=False, select_recompute=[r"feed_forward\.w1\.matmul", r"attention\.flash"])
    t = {k: D.step_time(c, hw)["compute_s"] for k, c in (("full", base), ("none", none), ("silu", silu), ("fine", fine))}
    assert t["none"] == t["silu"] < t["fine"] < t["full"]


def test_guide_13b_steps_come_out_in_the_guides_order():
    rows = D.guide_13b_ranking(Y13)
    assert [r["published"] for r in rows] == sorted(r["published"] for r in rows)     # the guide's order
    pred = [r["predicted"] for r in rows]
    assert pred == sorted(pred) and len(set(pred)) == len(pred), rows
    assert all(r["fits"] for r in rows)


def test_1_9_layout_is_read():
    cfg = D.read_config(DATA / "master_pretrain_qwen3_32b_4k.yaml")
    assert cfg.dialect == "mcore" and cfg.model.layers == 64 and cfg.model.kv_heads == 8 and cfg.model.head_dim == 128
    assert cfg.layout.stage_layers == (15, 15, 17, 17) and cfg.model.ffn == 25600


def _cli(args, capsys):
    code = D.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_last_line(capsys):
    code, out, _ = _cli([Y7, "--json", "--no-search"], capsys)
    assert code == 0
    obj = json.loads(out.strip().splitlines()[-1])
    for k in ("tokens_per_s_per_device", "step_s", "mfu", "memory_per_device_bytes", "budget_bytes", "fits",
              "layout", "hardware"):
        assert k in obj, k
    assert obj["fits"] is True and obj["budget_bytes"] == 58 * 2**30
    assert obj["layout"]["data_parallel"] == 8
    assert abs(obj["tokens_per_s_per_device"] / 4820 - 1) < 0.01


def _broken(tmp_path, edit):
    d = yaml.safe_load(Y13.read_text())
    edit(d)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _set(path, value):
    def edit(d):
        node = d
        *parents, last = path.split(".")
        for k in parents:
            node = node[k]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return edit


BAD = {
    "not a mindformers config": (lambda d: d.clear() or d.update(a=1), [], "model.model_config"),
    "missing key": (_set("model.model_config.hidden_size", KeyError), [], "model.model_config.hidden_size"),
    "mp does not divide heads": (_set("parallel_config.model_parallel", 3), [], "parallel_config.model_parallel"),
    "offsets do not sum to the remainder": (lambda d: (_set("parallel_config.pipeline_stage", 2)(d),
                                                       _set("parallel_config.micro_batch_num", 2)(d),
                                                       _set("model.model_config.offset", [3, 3])(d)),
                                            [], "model.model_config.offset"),
    "no layout fits the devices asked for": (lambda d: None, ["--devices", "1"], "--devices"),
    "unknown hardware": (lambda d: None, ["--hardware", "h100"], "--hardware"),
    "unparsable budget in YAML": (_set("context.max_device_memory", "lots"), [], "context.max_device_memory"),
    "unparsable --budget": (lambda d: None, ["--budget", "58 gigs"], "--budget"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gets_one_line_and_exit_2(case, tmp_path, capsys):
    edit, args, field = BAD[case]
    code, out, err = _cli([_broken(tmp_path, edit), *args], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"doctor: error: {field}=") and "fix:" in lines[0], err


def test_13b_on_8_cards_without_recompute_does_not_fit_and_the_advice_does(tmp_path, capsys):
    p = _broken(tmp_path, _set("recompute_config.recompute", False))
    code, out, _ = _cli([p, "--json", "--out", tmp_path / "out"], capsys)
    obj = json.loads(out)
    assert code == 1 and obj["fits"] is False and obj["memory_per_device_bytes"] > obj["budget_bytes"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.splitlines()[2].startswith("**DOES NOT FIT")          # the report opens with the verdict
    assert "<table" in (tmp_path / "out" / "report.html").read_text()
    fixed = D.diagnose(str(tmp_path / "out" / "improved.yaml"), search=False)
    assert fixed["fits"] is True
    old, new = yaml.safe_load(p.read_text()), yaml.safe_load((tmp_path / "out" / "improved.yaml").read_text())
    changed = D.changed_keys(old, new)
    assert changed and all(k.split(".")[0] in ("parallel_config", "runner_config", "recompute_config", "parallel",
                                               "model") for k in changed)


def test_improved_yaml_loads_in_mindformers_classes(tmp_path, capsys):
    p = _broken(tmp_path, _set("recompute_config.recompute", False))
    r = D.diagnose(str(p))
    paths = D.write_outputs(r, str(tmp_path / "out"), str(p))
    got = D.load_with_mindformers(paths["yaml"])
    best = r["layouts"][0]["config"]
    assert got["parallel_config"].data_parallel == best.layout.dp
    assert got["parallel_config"].model_parallel == best.layout.tp and got["parallel_config"].pipeline_stage == best.layout.pp
    assert got["model_config"].num_layers == 40 and got["config"].runner_config.batch_size == best.layout.batch


# ---------------------------------------------------------------- the CPU check (issue 25, item 7): fast terms only;
# the measurement itself runs in notebook 12 (section 6), under nbval.
_AB = (2e-3, 100e6)           # an all-reduce alpha-beta pair: 2 ms + S / (100 MB/s)


def test_mini_config_is_the_cookbook_mini_model():
    c = D.mini_config()
    m, lay = c.model, c.layout
    assert (m.hidden, m.layers, m.heads, m.ffn, m.vocab, m.seq) == (256, 4, 4, 688, 1024, 128)
    assert D.param_count(c) == 3_688_704 and lay.batch == 8 and lay.dp == 1 and lay.full_recompute == (0,)
    two = D.mini_config(dp=2, recompute="full").layout
    assert two.batch == 4 and two.dp == 2 and two.global_batch == 8 and two.full_recompute == (4,)


def test_cpu_prediction_terms():
    hw1, hw2 = D.cpu_hardware(1, peak=60e9, cores=2), D.cpu_hardware(2, alpha_beta=_AB, peak=60e9, cores=2)
    assert hw1.peak("float32") == 60e9 and hw2.peak("float32") == 30e9     # 2 ranks on 2 cores: half each
    cal = D.Calibration(0.8, 1.0)
    st = {(dp, rc): D.step_time(D.mini_config(dp=dp, recompute=rc), hw1 if dp == 1 else hw2, cal)
          for dp in (1, 2) for rc in ("none", "full")}
    c = D.mini_config()
    layer_fwd = sum(D.layer_ops(c.model, 0).values())
    fwd = c.model.layers * layer_fwd + 2 * c.model.vocab * c.model.hidden
    tokens = c.layout.batch * c.model.seq
    assert st[1, "none"]["compute_s"] == pytest.approx(tokens * 3 * fwd / (60e9 * 0.8))
    # full recompute: one more forward of every layer (not of the lm_head)
    assert st[1, "full"]["compute_s"] / st[1, "none"]["compute_s"] == pytest.approx((3 * fwd + c.model.layers * layer_fwd) / (3 * fwd))
    # half the tokens per rank at half the peak: the same compute time as one process
    assert st[2, "none"]["compute_s"] == pytest.approx(st[1, "none"]["compute_s"])
    # the gradient all-reduce: alpha + S/beta over the fp32 gradients, not hidden behind the backward
    S = D.param_count(c) * 4
    for rc in ("none", "full"):
        assert st[2, rc]["dp_s"] == pytest.approx(_AB[0] + S / _AB[1]) and st[2, rc]["dp_hidden_s"] == 0
        assert st[1, rc]["dp_s"] == 0
    # the Ascend profiles still hide the reduction behind the backward
    assert D.step_time(D.read_config(Y7), D.hardware("atlas-800t-a2"))["dp_hidden_s"] > 0


def test_cpu_calibration_reproduces_its_fit_run_and_names_it():
    hw1, hw2 = D.cpu_hardware(1, peak=60e9, cores=2), D.cpu_hardware(2, alpha_beta=_AB, peak=60e9, cores=2)
    cal = D.fit_cpu_calibration(0.5, D.mini_config(), hw1)
    assert cal.fitted_on == ("single none",) and 0 < cal.compute_efficiency < 1
    rows = D.predict_cpu(cal, {"single": hw1, "2 ranks": hw2})
    assert [(r["run"], r["recompute"], r["role"]) for r in rows] == [
        ("single", "none", "fit"), ("single", "full", "check"), ("2 ranks", "none", "check"), ("2 ranks", "full", "check")]
    assert rows[0]["predicted_s"] == pytest.approx(0.5)
    assert rows[0]["predicted_s"] < rows[1]["predicted_s"] < rows[3]["predicted_s"] and rows[0]["predicted_s"] < rows[2]["predicted_s"]


@pytest.mark.parametrize("call, field", [
    (lambda: D.cpu_hardware(2, peak=60e9), "alpha_beta"),
    (lambda: D.cpu_hardware(0, peak=60e9), "ranks"),
    (lambda: D.cpu_hardware(2, alpha_beta=(1e-3, -5.0), peak=60e9), "alpha_beta"),
    (lambda: D.mini_config(dp=3), "run.batch_size"),
    (lambda: D.mini_config(recompute="some"), "run.recompute"),
    (lambda: D.fit_cpu_calibration(0.0, D.mini_config(), D.cpu_hardware(1, peak=60e9)), "measured_s"),
])
def test_cpu_check_bad_input_is_one_line(call, field):
    with pytest.raises(D.DoctorError) as e:
        call()
    assert e.value.field == field and "\n" not in str(e.value) and "fix:" in str(e.value)


def _cpu_times(full_scale: float, spread: float):
    """Step times whose fit run (single none) is 0.5 s and whose single-full run is `full_scale` x the
    prediction, each with +-spread around its median."""
    hw1 = D.cpu_hardware(1, peak=60e9, cores=2)
    hws = {"single": hw1, "2 ranks": D.cpu_hardware(2, alpha_beta=_AB, peak=60e9, cores=2)}
    pred = {(r["run"], r["recompute"]): r["predicted_s"] for r in
            D.predict_cpu(D.fit_cpu_calibration(0.5, D.mini_config(), hw1), hws)}
    around = lambda m: [m * (1 - spread), m, m * (1 + spread)]
    t = {k: around(v) for k, v in pred.items()}
    t["single", "none"] = around(0.5)
    t["single", "full"] = around(pred["single", "full"] / full_scale)
    return t, hws


@pytest.mark.parametrize("scale, spread, verdict", [
    (1.0, 0.02, "within"), (1.2, 0.0, "within"), (0.8, 0.0, "within"),
    (1.3, 0.0, "beyond"), (0.7, 0.0, "beyond"), (1.3, 0.01, "beyond"),
    (1.3, 0.06, "undecided"), (0.7, 0.12, "undecided")])
def test_cpu_check_verdict_weighs_the_miss_against_the_runs_spread(scale, spread, verdict):
    t, hws = _cpu_times(scale, spread)
    rows = {(r["run"], r["recompute"]): r for r in D.cpu_check(t, hws, tolerance=0.25)}
    r = rows["single", "full"]
    assert r["error"] == pytest.approx(scale - 1, abs=1e-9) and r["verdict"] == verdict
    assert r["error_lo"] <= r["error"] <= r["error_hi"]
    if spread == 0:
        assert r["error_lo"] == pytest.approx(r["error"]) and r["error_hi"] == pytest.approx(r["error"])
    assert rows["single", "none"]["verdict"] == "fit" and rows["single", "none"]["error"] == pytest.approx(0, abs=1e-12)
    assert rows["2 ranks", "none"]["verdict"] == rows["2 ranks", "full"]["verdict"] == "within"
    assert rows["2 ranks", "none"]["measured_s"] == pytest.approx(t["2 ranks", "none"][1])


@pytest.mark.parametrize("times, tol, field", [
    ({("single", "none"): []}, 0.25, "times[('single', 'none')]"),
    ({("single", "none"): [0.5, float("nan")]}, 0.25, "times[('single', 'none')]"),
    ({("single", "none"): [0.5, -0.1]}, 0.25, "times[('single', 'none')]"),
    ({("single", "none"): "fast"}, 0.25, "times[('single', 'none')]"),
    ({("single", "full"): [0.5]}, 0.25, "times"),
    ({("single", "none"): [0.5]}, 0.0, "tolerance"),
])
def test_cpu_check_bad_times_are_one_line(times, tol, field):
    hw = D.cpu_hardware(1, peak=60e9, cores=2)
    with pytest.raises(D.DoctorError) as e:
        D.cpu_check(times, {"single": hw, "2 ranks": hw}, tolerance=tol)
    assert e.value.field == field and "\n" not in str(e.value) and "fix:" in str(e.value)


def test_the_head_dim_term_is_checked_on_the_head_dim_64_row_it_was_not_fitted_on(table):
    """Fitted on Qwen2-0.5B (head dim 64, seq 32768); checked on Qwen1.5-0.5B (head dim 64, seq 8192), the only
    other head-dim-64 row: +59 % without the term (head dim read right), within 16 % with it (15.0 % since issue 59's
    MoE terms moved the comm factor the fit shares with it)."""
    import dataclasses
    row = next(r for r in table if r["config"] == "r1.3.0_finetune_qwen1_5_05b.yaml")
    assert row["role"] == "check" and abs(row["error"]) < 0.16
    flat = D.calibration_table(str(DATA), calib=dataclasses.replace(D.CALIBRATION, head_dim_half=0.0))
    assert next(r for r in flat if r["config"] == row["config"])["error"] > 0.5
