"""The doctor as a tool an engineer trusts (issue 57): it reads what the file says (an unknown key is named with the
nearest known one, a missing section as missing), answers the question asked (on an OOM the dominant term and the
smallest change that fits; --devices N searches N-device layouts), names every degree of a layout (and a moved
expert shard), and speaks to tools: --json is one JSON object, errors too, exit 0 fits / 1 does not fit / 2 refused."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mshelpers import doctor as D
from mshelpers.doctor import keys as K
from mshelpers.doctor.yamledit import load_text as safe_load   # as the doctor parses (libyaml)

DATA = Path(__file__).parents[1] / "data" / "mindformers"
Y7, Y13 = DATA / "r1.2.0_pretrain_llama2_7b.yaml", DATA / "r1.2.0_pretrain_llama2_13b.yaml"
Y70 = DATA / "pretrain_llama2_70b_bf16_32p.yaml"
QWEN3_MOE = DATA / "2.1.0" / "qwen3_moe" / "pretrain_qwen3_30b_a3b_4k.yaml"
FIXTURES = sorted(p for p in DATA.rglob("*.yaml"))


def test_the_doctors_parse_gives_every_file_the_mapping_mindformers_pure_python_loader_gives(tmp_path):
    """The doctor parses with libyaml (9x faster); mindformers loads with PyYAML's pure-Python SafeLoader. Both build
    the same mapping from every file we hold, and a broken file is one line naming it."""
    from mshelpers.doctor.readers import load_yaml
    files = sorted((DATA.parent).rglob("*.yaml"))
    assert len(files) >= len(FIXTURES) > 100 and yaml.CSafeLoader is not yaml.SafeLoader
    for p in files:
        text = p.read_text()
        want = yaml.load(text, Loader=yaml.SafeLoader)
        assert load_yaml(p) == want and safe_load(text) == want, p
    for i, broken in enumerate(("a: [1, 2\n", "a: b: c\n", "- x\ny: 1\n")):
        with pytest.raises(yaml.YAMLError):
            yaml.load(broken, Loader=yaml.SafeLoader)
        (tmp_path / f"{i}.yaml").write_text(broken)
        with pytest.raises(D.DoctorError, match="not valid YAML"):
            load_yaml(tmp_path / f"{i}.yaml")


def _read_or_refused(path: Path):
    """The file's Config, or None when the doctor refuses it in one line (a file without its model keys, such as
    the 2.1.0 templates without a config.json): the refusal itself is checked here, so no fixture is skipped."""
    try:
        return D.read_config(path)
    except D.DoctorError as e:
        assert e.field and e.fix and "\n" not in str(e), str(e)
        return None


def _write(tmp_path: Path, d: dict, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def _cli(argv, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = D.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- 1. it reads what the file says
def test_a_misspelled_degree_is_named_with_the_key_it_meant(tmp_path, capsys):
    d = safe_load(Y7.read_text())
    d["parallel_config"]["model_paralel"] = 4
    cfg = D.read_config(_write(tmp_path, d))
    [flag] = cfg.key_flags
    assert flag["key"] == "parallel_config.model_paralel" and flag["suggestion"] == "model_parallel"
    assert "did you mean `model_parallel`?" in flag["text"] and "not used" in flag["text"]
    code, out, _ = _cli([_write(tmp_path, d), "--no-search"], capsys)
    verdict = out.splitlines()[2]
    assert verdict.startswith("**CHECK THE FILE FIRST: 1 key(s)") and "model_paralel" in verdict
    code, out, _ = _cli([_write(tmp_path, d), "--no-search", "--json"], capsys)
    assert [f["key"] for f in json.loads(out)["key_flags"]] == ["parallel_config.model_paralel"]


def test_a_key_in_the_wrong_section_says_where_it_belongs(tmp_path):
    d = safe_load(Y7.read_text())
    d["runner_config"]["micro_batch_num"] = 4
    [flag] = D.read_config(d).key_flags
    assert flag["text"] == "`runner_config.micro_batch_num`: unknown in `runner_config`; it belongs in `parallel_config`"


def test_a_missing_section_is_named_missing_in_each_dialect(tmp_path):
    d = safe_load(Y7.read_text())
    d["paralel_config"] = d.pop("parallel_config")
    flags = D.read_config(d).key_flags
    assert [f["key"] for f in flags] == ["parallel_config"]
    assert "missing section" in flags[0]["text"] and "did you mean `parallel_config`?" in flags[0]["text"]
    p2 = DATA / "2.1.0" / "deepseek3" / "pretrain_deepseek3_1b_8p_pynative.yaml"
    d2 = safe_load(p2.read_text())
    d2.pop("parallelism")
    cfg = D.read_config(d2, devices=8)
    assert [f["key"] for f in cfg.key_flags] == ["parallelism"]
    # the note on dp no longer reads as if the file set data_parallel_shard
    assert any("data_parallel_shard=-1 (not set" in n for n in cfg.notes)
    d2 = safe_load(p2.read_text())
    d2["training"]["global_batchsize"] = 8
    [flag] = D.read_config(d2, devices=8).key_flags
    assert flag["suggestion"] == "global_batch_size" and "mindformers 2.1.0 refuses unknown keys" in flag["text"]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_no_key_of_a_shipped_or_published_file_is_flagged(path):
    cfg = _read_or_refused(path)
    assert cfg is None or cfg.key_flags == (), [f["text"] for f in cfg.key_flags]


def test_every_priced_key_is_read_by_a_reader():
    # the vocabulary's "priced" keys are the readers' own: each appears in the readers' source as a key it reads
    src = "".join((Path(D.__file__).parent / f).read_text() for f in ("readers.py", "layouts.py"))
    for section, names in K.PRICED.items():
        for k in names:
            assert f'"{k}"' in src, (section, k)
    assert not any(K.PRICED[s] & K.NOT_PRICED.get(s, frozenset()) for s in K.PRICED)


# ---------------------------------------------------------------- 6. the question asked
def test_an_oom_names_the_dominant_term_and_the_smallest_change_first(tmp_path, capsys):
    d = safe_load(Y13.read_text())
    d["recompute_config"]["recompute"] = False
    r = D.diagnose(d)
    assert r["fits"] is False
    part = max(zip(r["memory"]["per_stage_bytes"], r["memory"]["per_stage_breakdown"]), key=lambda t: t[0])[1]
    biggest = max(("params", "grads", "optimizer_states", "activations"), key=part.get)
    term, size = D.diagnosis.dominant_term(r["memory"])
    assert size == part[biggest] and term.startswith({"activations": "activations", "optimizer_states": "optimizer",
                                                      "params": "parameters", "grads": "gradients"}.get(biggest, "-"))
    assert f"the largest term is {term}, {size / 2**30:.1f} GiB" in r["verdict"]
    [sm] = r["smallest"]
    # no fitting layout in the search changes fewer knobs, and the fastest changes at least as many
    everything = D.better_layouts(r["config"], r["hardware"], top=10_000)
    assert sm["knobs"] == min(x["knobs"] for x in everything) < r["layouts"][0]["knobs"] + 1
    assert D.diagnose(sm["config"].raw, search=False)["fits"] is True
    assert r["verdict"].index("smallest change that fits") < r["verdict"].index("fastest that fits")
    assert sm["changes"] == {"recompute_config.recompute": True} or sm["knobs"] == 1


def test_devices_other_than_the_files_searches_that_count(capsys):
    code, out, err = _cli([Y70, "--devices", "16", "--json"], capsys)
    j = json.loads(out)
    assert j["moved_to_devices"]["from_devices"] == 32 and j["layout_name"].startswith("dp")
    lay = j["layout"]
    assert lay["data_parallel"] * lay["model_parallel"] * lay["pipeline_stage"] * lay["context_parallel"] == 16
    assert j["verdict"].startswith("ON 16 DEVICES") and code == (0 if j["fits"] else 1)


# ---------------------------------------------------------------- 9. layout strings name every degree
def test_a_layout_string_names_every_degree_and_a_moved_expert_shard():
    cfg = D.read_config(QWEN3_MOE)
    assert D.search.layout_name(cfg).startswith("dp1-tp4-pp4-vpp1-cp1-ep4-es4 ")
    rows = D.better_layouts(cfg, D.hardware("atlas-800t-a2"))
    moved = [r for r in rows if D.cost.expert_shard(r["config"]) != D.cost.expert_shard(cfg)]
    assert moved and all(r["notes"] and f"expert shard 4 -> {D.cost.expert_shard(r['config'])}" in r["notes"][0]
                         for r in moved)
    assert all(not r["notes"] for r in rows if r not in moved)
    dense = D.read_config(Y7)
    assert D.search.layout_name(dense).startswith("dp8-tp1-pp1-vpp1-cp1 b1 m8")


# ---------------------------------------------------------------- 8. output tools can read
def test_json_is_one_object_with_what_the_text_shows(capsys):
    code, out, _ = _cli([QWEN3_MOE, "--json"], capsys)
    j = json.loads(out)                                 # the whole of stdout: nothing before or after
    assert code == j["exit_code"] == (0 if j["fits"] else 1)
    assert j["layouts"] and all({"layout", "changes", "tokens_per_s_per_device", "knobs"} <= set(x) for x in j["layouts"])
    assert len(j["layers_per_stage"]) == j["layout"]["pipeline_stage"] == len(j["per_stage_breakdown_bytes"])
    assert j["model"]["moe"]["routed"] == 128 and j["expert_shard"] == 4
    text = subprocess.run([sys.executable, "-m", "mshelpers.doctor", str(QWEN3_MOE), "--json"], capture_output=True,
                          text=True)
    assert json.loads(text.stdout) == j                 # `| python -m json.tool` reads it


def test_an_error_is_json_too_and_exit_codes_say_fits_does_not_fit_refused(tmp_path, capsys):
    code, out, err = _cli([tmp_path / "missing.yaml", "--json"], capsys)
    j = json.loads(out)
    assert code == 2 == j["exit_code"] and j["error"]["field"] == "CONFIG" and "fix" in j["error"]
    assert err.startswith("doctor: error: ") and len(err.splitlines()) == 1
    code, out, err = _cli([tmp_path / "missing.yaml"], capsys)
    assert code == 2 and out == ""
    d = safe_load(Y13.read_text())
    d["recompute_config"]["recompute"] = False
    assert _cli([_write(tmp_path, d), "--no-search"], capsys)[0] == 1
    assert _cli([Y7, "--no-search"], capsys)[0] == 0


def test_text_format_is_plain_and_every_flag_has_help(capsys):
    code, out, _ = _cli([Y7, "--no-search", "--format", "text"], capsys)
    assert code == 0 and "**" not in out and not any(line.startswith("#") for line in out.splitlines())
    assert out.splitlines()[:2] == ["Config doctor", "============="]
    with pytest.raises(SystemExit):
        D.main(["--help"])
    helptext = capsys.readouterr().out
    for flag in ("--hardware", "--devices", "--budget", "--model-config", "--release", "--log", "--refit", "--out",
                 "--format", "--json", "--no-search"):
        block = helptext.split(flag, 1)[1].split("\n  --", 1)[0]
        assert len(block.split()) > 3, (flag, block)
    assert "exit codes: 0" in helptext


def test_the_console_script_is_the_module():
    script = Path(sys.executable).parent / "ms-doctor"
    assert script.exists(), "pip install -e . puts ms-doctor beside the interpreter"
    a = subprocess.run([str(script), str(Y7), "--no-search", "--json"], capture_output=True, text=True)
    b = subprocess.run([sys.executable, "-m", "mshelpers.doctor", str(Y7), "--no-search", "--json"],
                       capture_output=True, text=True)
    assert a.returncode == b.returncode == 0 and json.loads(a.stdout) == json.loads(b.stdout)


# ---------------------------------------------------------------- 11. minor
def test_zero_terms_are_listed_not_tabled_and_the_budget_says_gib(capsys):
    code, out, _ = _cli([Y7, "--no-search"], capsys)
    table = out.split("## Step time", 1)[1].split("**step**", 1)[0]
    assert "| 0.000 | 0.0% |" not in table and "no flash attention" not in table
    assert "Zero on this layout: attention scores through HBM (no flash attention)" in out
    assert "context.max_device_memory '58GB', read as GiB (MindSpore counts its GB as 2^30 bytes" in out


def test_the_offset_message_says_remainder_not_percent():
    d = safe_load(Y7.read_text())
    d["parallel_config"].update(pipeline_stage=3, micro_batch_num=3)
    d["model"]["model_config"]["offset"] = [1, 1, 1]
    with pytest.raises(D.DoctorError) as e:
        D.read_config(d)
    assert " % " not in str(e.value) and "the remainder of 32 layers divided by 3 x 1 chunks" in str(e.value)


# ---------------------------------------------------------------- 2. it writes what mindformers runs
def _comments(text: str) -> list[str]:
    return [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_fixture_is_edited_in_place_only_where_it_changes(path):
    from mshelpers.doctor.yamledit import edit_yaml_text, follow_derived
    text = path.read_text()
    d = safe_load(text)
    if "parallel_config" in d:
        ch = {"parallel_config.data_parallel": 3, "recompute_config.recompute": [1, 2, 3],
              "runner_config.gradient_accumulation_steps": 5, "parallel_config.use_seq_parallel": True}
    elif "parallelism" in d:
        ch = {"parallelism.tensor_parallel": 3, "training.global_batch_size": 77}
    else:
        raise AssertionError(f"{path}: a fixture YAML with neither parallel_config nor parallelism")
    ch = follow_derived(d, ch)
    new = edit_yaml_text(text, ch)
    want = safe_load(text)
    for k, v in ch.items():
        node = want
        *parents, last = k.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    assert safe_load(new) == want
    old_lines, new_lines = text.splitlines(), new.splitlines()
    kept = [line for line in old_lines if line in new_lines]
    assert len(old_lines) - len(kept) <= len(ch) + sum(1 for line in old_lines if line.lstrip().startswith("- "))
    assert set(_comments(text)) - set(_comments(new)) <= {c for line in old_lines if line not in new_lines
                                                          for c in _comments(line)}
    if "&dp" in text:
        assert "&dp 3" in new and new.count("*dp") == text.count("*dp")     # the alias follows dp


def test_out_writes_the_file_with_only_its_changes_and_it_reads_back_to_the_same_prediction(tmp_path, capsys):
    src = DATA / "master_pretrain_qwen3_32b_4k.yaml"             # comments, anchors (&dp, *dp) and offsets
    text = src.read_text()
    p = tmp_path / "mine.yaml"
    p.write_text(text)
    code, out, _ = _cli([p, "--json", "--out", tmp_path / "o"], capsys)
    j = json.loads(out)
    new = (tmp_path / "o" / "improved.yaml").read_text()
    assert "# edited in place" in new.splitlines()[1]
    body = "\n".join(new.splitlines()[2:])
    best = j["layouts"][0] if j["layouts"] and (j["best_gain"] > 0.005 or not j["fits"]) else None
    changed = D.changed_keys(safe_load(text), safe_load(body))
    expect = set(best["changes"]) if best else set()
    if best and "parallel_config.data_parallel" in best["changes"]:
        expect.add("parallel.dataset_strategy")                         # derived: it follows dp (an alias here)
    assert set(changed) == expect
    assert set(_comments(text)) <= set(_comments(body)) | {c for line in text.splitlines() if line not in body
                                                           for c in _comments(line)}
    assert "gradient_accumulation_steps: 1" not in body or "gradient_accumulation_steps: 1" in text
    if best:
        again = D.diagnose(str(tmp_path / "o" / "improved.yaml"), search=False)
        assert round(again["step"]["tokens_per_s_per_device"]) == best["tokens_per_s_per_device"]
        assert round(again["memory"]["memory_per_device_bytes"] / 2**30, 2) == best["memory_GiB"]


def test_out_on_other_devices_moves_dp_and_its_alias_follows(tmp_path, capsys):
    src = DATA / "master_pretrain_qwen3_32b_4k.yaml"
    code, out, _ = _cli([src, "--devices", "16", "--json", "--out", tmp_path / "o"], capsys)
    j = json.loads(out)
    body = (tmp_path / "o" / "improved.yaml").read_text()
    got = safe_load(body)
    dp = got["parallel_config"]["data_parallel"]
    assert dp * got["parallel_config"]["model_parallel"] * got["parallel_config"]["pipeline_stage"] == 16
    assert all(x[0] == dp for x in got["parallel"]["dataset_strategy"]) and body.count("*dp") == src.read_text().count("*dp")
    assert D.diagnose(str(tmp_path / "o" / "improved.yaml"), search=False)["config"].layout.devices == 16


# ---------------------------------------------------------------- 7. one FLOP bookkeeping
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_model_flops_never_exceed_hardware_flops_nor_hardware_mfu_the_rate_it_runs_at(path):
    cfg = _read_or_refused(path)
    if cfg is None:
        return
    st = D.step_time(cfg, D.hardware("atlas-800t-a2"))
    # the FLOP counts as their sources count (every pair of attention); the kernels compute fewer under a causal
    # mask, and what they compute never outruns the matmul rate
    assert st["mfu_6n"] <= st["mfu_attention"] <= st["mfu_hardware"]
    assert st["mfu_computed"] <= st["mfu_hardware"] and st["mfu_computed"] <= D.CALIBRATION.compute_efficiency * (1 + 1e-9)
    assert (st["mfu_computed"] < st["mfu_hardware"]) == (cfg.model.flash and st["attention_s"] > 0)
    lay = cfg.layout
    # selective recompute of elementwise ops (SiLU, Mul) adds no matmul FLOPs; of a matmul or attention it does
    matmul_selected = any(D.cost.pattern_ops(pat) for stage in lay.select_ops for pat, _ in stage)
    extra = any(lay.full_recompute) or matmul_selected or st["moe_capacity_padding"] > 1
    assert (st["recompute_factor"] > 1) == extra and st["recompute_factor"] >= 1


# ---------------------------------------------------------------- 5 and 10. pipeline balance, each hop on its link
YI34 = DATA / "r1.2.0_pretrain_yi_34b.yaml"


def test_each_stage_is_tabled_and_each_hop_priced_on_the_link_it_crosses(capsys):
    code, out, _ = _cli([YI34, "--no-search", "--json"], capsys)
    j = json.loads(out)
    # dp1 tp4 pp4 on 16 devices: stages 0-1 on node 0, 2-3 on node 1; only the 1 <-> 2 hop leaves a node
    p2p = j["per_stage_p2p_s"]
    assert j["layers_per_stage"] == [14, 16, 16, 14] and len(j["per_stage_s"]) == 4
    assert p2p[0] == p2p[3] < p2p[1] == p2p[2]
    hw = D.hardware("atlas-800t-a2")
    # stage 0 makes both its sends over the node's mesh, stage 1 one of them over the NIC: the byte times of the
    # two hops stand in the ratio of the two links' datasheet rates
    intra_hop = p2p[0] / 2 - hw.intra_latency_s
    inter_hop = p2p[1] - p2p[0] / 2 - hw.inter_latency_s
    assert inter_hop / intra_hop == pytest.approx(hw.intra_link_bytes_per_s * hw.links_per_device
                                                  / hw.inter_bytes_per_s, rel=1e-6)
    code, out, _ = _cli([YI34, "--no-search"], capsys)
    table = out.split("## Pipeline stages", 1)[1].split("##", 1)[0]
    assert len([line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]) == 4


def test_an_unbalanced_offset_is_fixed_by_the_smallest_change_that_gains():
    d = safe_load(YI34.read_text())
    d["model"]["model_config"]["offset"] = [3, -1, -1, -1]          # 18/14/14/14: stage 0 binds
    r = D.diagnose(d, budget="60GB")            # (at the file's 57GB stage 0 no longer fits beside HCCL's buffers)
    [sg] = r["smallest_gain"]
    assert sg["changes"] == {"model.model_config.offset": 0} and sg["knobs"] == 1
    fixed = D.diagnose(sg["config"].raw, search=False, budget="60GB")
    assert fixed["step"]["tokens_per_s_per_device"] / r["step"]["tokens_per_s_per_device"] - 1 > 0.10
    assert max(fixed["step"]["per_stage_s"]) < max(r["step"]["per_stage_s"])
    assert "smallest change that gains: offset=0 (1 knob(s))" in r["verdict"]


# ---------------------------------------------------------------- 4. the refit reaches everything
def test_after_refit_the_headline_layouts_and_sources_use_the_refitted_calibration(capsys):
    log = Path(__file__).parents[1] / "data" / "logs" / "llama2_7b_dp8.log"      # 4000 tokens/s/p measured
    code, out, _ = _cli([Y7, "--log", log, "--refit", "--json"], capsys)
    j = json.loads(out)
    rf = j["log"]["refit"]
    assert j["tokens_per_s_per_device"] == pytest.approx(rf["predicted_tokens_per_s_per_device"], rel=1e-9)
    assert j["tokens_per_s_per_device"] == pytest.approx(4000, rel=1e-3)      # what the run measured
    assert [f"{x['layout']} ({x['tokens_per_s_per_device']})" for x in j["layouts"]] == rf["after"]
    assert f"predicted {j['tokens_per_s_per_device']:.0f} tokens/s/p" in j["verdict"]
    assert "whole error is put on the compute efficiency" in rf["assumption"]
    code, out, _ = _cli([Y7, "--log", log, "--refit"], capsys)
    sources = out.split("## Where the figures come from", 1)[1]
    assert f"compute efficiency {rf['compute_efficiency']:.4f} of peak" in sources and str(log) in sources



# ---------------------------------------------------------------- 3. memory with a reserve
def test_fits_means_fits_beside_hcclS_buffers_and_the_report_says_the_headroom(capsys):
    cfg = D.read_config(Y70)                    # dp1 tp4 pp8 on 32 cards
    r = D.diagnose(str(Y70), search=False)
    rs = r["reserve"]
    assert rs["groups"] == ["TP", "PP", "world"] and rs["bytes"] == 3 * 2 * 200 * 2**20
    mem = r["memory"]
    assert mem["headroom_bytes"] == cfg.budget_bytes - rs["bytes"] - mem["memory_per_device_bytes"]
    # a budget between the tensors alone and the tensors with the reserve: it does not fit, and says so
    tight = mem["memory_per_device_bytes"] + rs["bytes"] // 2
    r2 = D.diagnose(str(Y70), search=False, budget=tight)
    assert r2["fits"] is False and r2["memory"]["headroom_bytes"] < 0
    assert D.diagnose(str(Y70), search=False, budget=tight + rs["bytes"])["fits"] is True
    code, out, _ = _cli([Y70, "--no-search"], capsys)
    assert "| reserve | | | | | 1.17 | | HCCL buffers: 2 x HCCL_BUFFSIZE (200 MB) x 3 communication domains" in out
    assert f"headroom after the reserve {mem['headroom_bytes'] / 2**30:+.2f} GiB" in out
    assert D.memory_reserve(cfg, D.hardware("cpu"))["bytes"] == 0           # no HCCL on the CPU


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_fixture_edited_in_place_reads_back_to_the_variants_prediction(path):
    """The file --out would write for a variant (here: selective recompute and twice the micro-batch, in the
    file's own dialect) is the source text with those keys edited, and reads back to the variant's price."""
    from mshelpers.doctor.yamledit import edit_yaml_text, follow_derived
    cfg = _read_or_refused(path)
    if cfg is None:
        return
    kw = dict(recompute=False, select_recompute=True)
    if cfg.dialect == "pynative":
        kw = {}                                     # 2.x: recompute keys are not the static ones
    variant = D.layout_variant(cfg, **kw, batch_size=cfg.layout.batch * 2)
    target = D.edited_yaml(cfg, **kw, batch_size=cfg.layout.batch * 2)
    changes = {k: v[1] for k, v in D.changed_keys(cfg.raw, target).items()}
    text = edit_yaml_text(path.read_text(), follow_derived(cfg.raw, changes))
    again = D.read_config(safe_load(text), model_config=cfg.model_config)
    hw = D.hardware("atlas-800t-a2")
    assert again.layout == variant.layout
    assert D.step_time(again, hw)["step_s"] == D.step_time(variant, hw)["step_s"]
    assert D.memory_per_stage(again)["memory_per_device_bytes"] == D.memory_per_stage(variant)["memory_per_device_bytes"]


@pytest.mark.parametrize("bad", [{}, [], "1.3", True, -1, 0])
def test_an_ffn_multiplier_that_is_not_a_positive_number_is_refused(bad):
    d = safe_load((DATA / "r1.2.0_finetune_llama3_70b.yaml").read_text())
    d["model"]["model_config"]["ffn_dim_multiplier"] = bad
    with pytest.raises(D.DoctorError) as e:
        D.read_config(d)
    assert e.value.field == "model.model_config.ffn_dim_multiplier"


def test_per_stage_recompute_is_the_fewest_layers_that_fit_beside_the_reserve():
    """The search's per-stage bisection tests what `fits` tests (the stage plus HCCL's buffers within the budget).
    Worked here stage by stage, by a linear count: Yi-34B at 60GB on dp2 tp2 pp4 with offset 0 and SiLU/Mul
    selective recompute needs some fully recomputed layers; the search must offer exactly those counts."""
    d = safe_load(YI34.read_text())
    cfg = D.with_reserve(D.read_config(d, budget="60GB"), D.hardware("atlas-800t-a2"))
    kw = dict(data_parallel=2, model_parallel=2, pipeline_stage=4, micro_batch_num=28, offset=0,
              use_seq_parallel=True, enable_parallel_optimizer=True, select_recompute=True)
    counts = []
    for i, n in enumerate(D.layout_variant(cfg, **kw, recompute=False).layout.stage_layers):
        k = 0
        while True:
            trial = counts + [k] + [n_ for n_ in D.layout_variant(cfg, **kw, recompute=False).layout.stage_layers[i + 1:]]
            e = D.memory_per_stage(D.layout_variant(cfg, **kw, recompute=trial))
            if e["per_stage_bytes"][i] + e["reserve_bytes"] <= e["budget_bytes"]:
                break
            k += 1
        counts.append(k)
    assert 0 < sum(counts)                          # the case needs some recompute
    rows = D.better_layouts(cfg, D.hardware("atlas-800t-a2"), top=10_000)
    got = [x for x in rows if x["layout"].startswith("dp2-tp2-pp4-") and " sp po " in x["layout"]
           and list(x["config"].layout.full_recompute) == counts and x["config"].layout.stage_layers == (15,) * 4]
    assert got and all(D.memory_per_stage(x["config"])["fits"] for x in got), counts
