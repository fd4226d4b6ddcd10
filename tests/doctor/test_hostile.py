"""The config doctor under hostile input: every published seed YAML with one value replaced by something no
mindformers config holds (None, -1, 0, 1.5, "", [], {}, NaN, inf, "58GBB") or deleted, broken files, and an
unwritable --out. The contract (mshelpers/doctor/cli.py): exit 0, or exit 2 with exactly one stderr line
`doctor: error: <field>=<value>; fix: <how>`; never a traceback. A deterministic sweep over the keys the
doctor reads, then Hypothesis property tests (derandomized: the same examples every run) over any key path, one
on the 2.x PyNative and mcore seeds with the layout search on half the time, then the values issue 49 found
accepted or ending in a traceback (null model keys, '' and -0.0 batches, null sections under the search)."""
from __future__ import annotations

import copy
import random
import re
import traceback
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mshelpers.doctor import ALIASES, main

DATA = Path(__file__).parents[1] / "data" / "mindformers"
SEEDS = (
    "r1.2.0_pretrain_llama2_7b.yaml",
    "r1.2.0_finetune_mixtral-8x7b.yaml",                        # r1.x MoE with a top-level moe_config
    "2.1.0/qwen3/pretrain_qwen3_32b_4k.yaml",
    "2.1.0/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml",
    "2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml",   # 2.x PyNative dialect
    "2.1.0/glm4/finetune_glm4_9b.yaml",
)
# the 2.x PyNative and mcore dialects' own Hypothesis seeds: MoE, MLA, class defaults without a config.json, VPP
SEEDS_2X = (
    "2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml",
    "2.1.0/deepseek4/pretrain_deepseek4_flash.yaml",            # PyNative MoE
    "2.1.0/qwen3/pretrain_qwen3_32b_4k.yaml",
    "2.1.0/qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml",
    "2.1.0/deepseek3/pretrain_deepseek3_671b.yaml",             # mcore MLA, model keys from the class defaults
    "2.1.0/telechat3/pretrain_telechat3_36b.yaml",              # mcore VPP with per-chunk recompute
)
PARSED = {s: yaml.safe_load((DATA / s).read_text()) for s in dict.fromkeys(SEEDS + SEEDS_2X)}
# the top-level keys the readers consult; the sweep writes each seed with only these (the doctor's answer is the
# same, test_the_trimmed_seed_reads_as_the_published_one checks it) so that ~4000 runs take seconds, not a minute
READ_SECTIONS = ("run_mode", "use_legacy", "pretrained_model_dir", "model", "moe_config", "parallel_config",
                 "parallel", "runner_config", "recompute_config", "micro_batch_interleave_num", "context", "optimizer",
                 "swap", "swap_config", "train_dataset", "train_dataset_task", "training", "parallelism", "recompute")
TRIMMED = {s: {k: v for k, v in d.items() if k in READ_SECTIONS} for s, d in PARSED.items()}

DELETE = object()                                               # "remove the key" rather than a value
HOSTILE = (None, -1, 0, 1.5, "", [], {}, float("nan"), float("inf"), "58GBB", DELETE)
HOSTILE_IDS = ("None", "-1", "0", "1.5", "empty-str", "empty-list", "empty-dict", "nan", "inf", "58GBB", "deleted")

# the sections whose every key is swept; the model section's keys are swept where the doctor reads them
SECTIONS = ("parallel_config", "parallelism", "runner_config", "training", "recompute_config", "recompute",
            "moe_config")
# keys the readers look up: the alias table plus every quoted key readers.py gets (kept in step with the reader)
_READERS_SRC = (Path(__file__).parents[2] / "mshelpers" / "doctor" / "readers.py").read_text()
_GOT = re.findall(r'(?:get|pop)\("([a-z_]+)"|\["([a-z_]+)"\]', _READERS_SRC)
READ_KEYS = {k for names in ALIASES.values() for k in names} | {a or b for a, b in _GOT}

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)        # libyaml when there: the sweep writes ~5000 files


def _model_keys(d: dict) -> tuple[tuple, dict]:
    m = d.get("model")
    if isinstance(m, dict) and isinstance(m.get("model_config"), dict):
        return ("model", "model_config"), m["model_config"]
    return ("model",), m if isinstance(m, dict) else {}


def key_paths(d: dict) -> list[tuple]:
    """The key paths that matter for the doctor, in the file's order: each top-level mapping section itself,
    every key of the layout sections, the model keys the readers read, and context.max_device_memory."""
    paths = [(k,) for k, v in d.items() if isinstance(v, dict)]
    prefix, mc = _model_keys(d)
    paths += [prefix + (k,) for k in mc if k in READ_KEYS]
    if prefix == ("model", "model_config"):
        paths.append(("model", "model_config"))
    for sec in SECTIONS:
        if isinstance(d.get(sec), dict):
            paths += [(sec, k) for k in d[sec]]
    if isinstance(d.get("context"), dict) and "max_device_memory" in d["context"]:
        paths.append(("context", "max_device_memory"))
    return list(dict.fromkeys(paths))


def all_key_paths(node, prefix=()) -> list[tuple]:
    """Every key path of the parsed YAML (mapping keys and list indices), depth first."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out += all_key_paths(v, prefix + (k,))
    return out


CASES = [(s, p) for s in SEEDS for p in key_paths(TRIMMED[s])]
ALL_PATHS = {s: all_key_paths(PARSED[s]) for s in PARSED}
READ_PATHS = {s: key_paths(PARSED[s]) for s in PARSED}


def mutated(seed: str, path: tuple, value, *, whole: bool = True) -> dict:
    """The seed (the published file, or with whole=False its TRIMMED form) with the value at `path` replaced."""
    d = copy.deepcopy(PARSED[seed] if whole else TRIMMED[seed])
    node = d
    for k in path[:-1]:
        node = node[k]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = copy.deepcopy(value)
    return d


# read_config's last resort (`CONFIG=<exception name>; fix: ... wrong type`): one line, but naming no field
CAUGHT_BY_THE_NET = re.compile(r"doctor: error: CONFIG='?[A-Z][A-Za-z]*(Error|Exception)'?;")


def run_doctor(argv: list, capsys) -> str | None:
    """None when the doctor kept its contract on `argv`, else what it did instead."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except BaseException:                                       # noqa: BLE001 - SystemExit included: main returns
        return "raised:\n" + traceback.format_exc()
    out, err = capsys.readouterr()
    if code in (0, 1):                                          # fits, does not fit: both answers
        return None if "Traceback" not in err else f"exit {code} with a traceback on stderr:\n{err}"
    lines = err.splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("doctor: error: ") and "fix:" in lines[0]:
        if CAUGHT_BY_THE_NET.match(lines[0]):
            return f"a reader raised and read_config's net caught it; the reader should name the field: {err!r}"
        return None
    return f"exit {code!r}, stderr {err!r}"


def check_case(tmp_path: Path, capsys, d: dict, name: str = "c.yaml", extra=("--no-search",)) -> str | None:
    p = tmp_path / name
    p.write_text(yaml.dump(d, Dumper=_Dumper, sort_keys=False))
    return run_doctor([p, *extra], capsys)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_seed_is_read_as_published(seed, capsys):
    assert run_doctor([DATA / seed, "--no-search"], capsys) is None
    assert main([str(DATA / seed), "--no-search"]) == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_the_trimmed_seed_reads_as_the_published_one(seed, tmp_path, capsys):
    p = tmp_path / "trimmed.yaml"
    p.write_text(yaml.safe_dump(TRIMMED[seed], sort_keys=False))
    answers = []
    for path in (DATA / seed, p):
        capsys.readouterr()
        assert main([str(path), "--no-search", "--json"]) == 0
        answers.append(capsys.readouterr().out)
    assert answers[0] == answers[1]


@pytest.mark.parametrize("seed,path", CASES, ids=[f"{s.rsplit('/', 1)[-1][:-5]}:{'.'.join(map(str, p))}"
                                                   for s, p in CASES])
def test_a_hostile_value_at_a_key_that_matters(seed, path, tmp_path, capsys):
    bad = []
    for value, vid in zip(HOSTILE, HOSTILE_IDS):
        got = check_case(tmp_path, capsys, mutated(seed, path, value, whole=False))
        if got:
            bad.append(f"{'.'.join(map(str, path))} = {vid}: {got}")
    assert not bad, "\n".join(bad)


def test_the_sweep_covers_what_it_says():
    assert len(CASES) >= 250
    from mshelpers.doctor import dialect_of
    assert {dialect_of(PARSED[s]) for s in SEEDS} == {dialect_of(PARSED[s]) for s in SEEDS_2X} | {"r1.x"} == {
        "r1.x", "mcore", "pynative"}
    for s in SEEDS:
        paths = set(READ_PATHS[s])
        assert ("model",) in paths
        assert any(p[:1] in {(x,) for x in SECTIONS} and len(p) == 2 for p in paths), s
    assert ("moe_config", "expert_num") in READ_PATHS["r1.2.0_finetune_mixtral-8x7b.yaml"]
    assert ("model", "num_hidden_layers") in READ_PATHS["2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml"]


SCALAR_CASES = [(seed, section) for seed in ("r1.2.0_pretrain_llama2_7b.yaml", "r1.2.0_finetune_mixtral-8x7b.yaml",
                                              "2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml")
                for section in ("model", "parallel_config", "parallelism", "runner_config", "training", "context",
                                "moe_config", "recompute_config") if section in PARSED[seed]]


@pytest.mark.parametrize("seed,section", SCALAR_CASES)
@pytest.mark.parametrize("value", [1.5, "x", 7, True, ["a"]])
def test_a_section_replaced_by_a_scalar_is_one_line_exit_2(seed, section, value, tmp_path, capsys):
    """The issue: `model: 1.5` gave AttributeError: 'str' object has no attribute 'get'. Every section the
    seed's dialect reads, replaced by a scalar or a list, is refused in one line naming that section."""
    d = copy.deepcopy(PARSED[seed])
    d[section] = value
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    err = _one_line_exit_2([p, "--no-search"], capsys)
    assert err.split("; fix:")[0].startswith(f"doctor: error: {section}"), err


def test_model_1_5_names_the_model_section(tmp_path, capsys):
    d = copy.deepcopy(PARSED["r1.2.0_pretrain_llama2_7b.yaml"])
    d["model"] = 1.5
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    assert main([str(p)]) == 2                                  # with the search on, as the issue ran it
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("doctor: error: model=1.5") and err.count("\n") == 1 and "fix:" in err


# ---------------------------------------------------------------- Hypothesis: any key path, any value
_scalar = st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats(), st.text(max_size=12),
                    st.booleans(), st.none())
# counts past what the cost model can walk or a float can hold, and a layer range of 10**11 layers
HUGE = (10**6, 2**31, 2**40, 2**1100, -2**1100, 1e300, "0-99999999999", ["0-99999999999"])
VALUES = st.one_of(st.sampled_from(HOSTILE), st.sampled_from(HUGE), _scalar, st.lists(_scalar, max_size=4),
                   st.dictionaries(st.text(max_size=8), _scalar, max_size=3))


@st.composite
def hostile_configs(draw):
    seed = draw(st.sampled_from(SEEDS))
    # half the draws go to the keys the doctor reads, half to any key of the file
    path = draw(st.one_of(st.sampled_from(READ_PATHS[seed]), st.sampled_from(ALL_PATHS[seed])))
    value = draw(VALUES)
    return seed, path, value


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=hostile_configs())
def test_any_key_any_value_keeps_the_contract(case, tmp_path, capsys):
    seed, path, value = case
    got = check_case(tmp_path, capsys, mutated(seed, path, value))
    assert got is None, f"{seed}: {'.'.join(map(str, path))} = {value!r}: {got}"


@st.composite
def hostile_2x_configs(draw):
    seed = draw(st.sampled_from(SEEDS_2X))
    path = draw(st.one_of(st.sampled_from(READ_PATHS[seed]), st.sampled_from(ALL_PATHS[seed])))
    return seed, path, draw(VALUES), draw(st.booleans())


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=hostile_2x_configs())
def test_any_key_any_value_keeps_the_contract_in_the_2x_and_mcore_dialects(case, tmp_path, capsys):
    """The same property on the 2.x PyNative and mcore seeds alone, half the runs with the layout search on (its
    variants once wrote into a null section: TypeError, issue 49)."""
    seed, path, value, search = case
    got = check_case(tmp_path, capsys, mutated(seed, path, value), extra=() if search else ("--no-search",))
    assert got is None, f"{seed}: {'.'.join(map(str, path))} = {value!r} (search {search}): {got}"


# ---------------------------------------------------------------- values the issue found accepted (issue 49)
_P = "2.1.0/deepseek3/pretrain_deepseek3_1b_8p_pynative.yaml"
_M = "2.1.0/qwen3/pretrain_qwen3_32b_4k.yaml"
_R = "r1.2.0_pretrain_llama2_7b.yaml"


def _err(d: dict, tmp_path, capsys, *extra) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.dump(d, Dumper=_Dumper, sort_keys=False))
    return _one_line_exit_2([p, *extra], capsys)


@pytest.mark.parametrize("seed, path", [(_P, ("model", "num_attention_heads")),
                                        (_M, ("model", "model_config", "num_attention_heads")),
                                        (_P, ("model", "num_hidden_layers")),
                                        ("2.1.0/deepseek3/pretrain_deepseek3_671b.yaml",
                                         ("model", "model_config", "num_attention_heads"))])
def test_a_null_model_key_with_no_other_source_is_one_line_naming_it(seed, path, tmp_path, capsys):
    """With the search on, as the issue ran it (it ended in TypeError: 'NoneType' object does not support item
    assignment). DeepSeek-V3's class defaults fill keys a file leaves out, not ones it sets to None."""
    err = _err(mutated(seed, path, None), tmp_path, capsys)
    assert err.startswith(f"doctor: error: {'.'.join(path)}=None; fix:"), err


@pytest.mark.parametrize("seed, path, hf, heads", [
    (_P, ("model", "num_attention_heads"), "DeepSeek-V3", 128),
    (_M, ("model", "model_config", "num_attention_heads"), "Qwen3-32B", 64)])
def test_a_null_model_key_taken_from_config_json_is_said(seed, path, hf, heads, tmp_path):
    from mshelpers.doctor import diagnose, render_text
    r = diagnose(mutated(seed, path, None), model_config=DATA / "hf" / hf)
    note = f"{'.'.join(path)} is None: num_attention_heads={heads} from {DATA / 'hf' / hf / 'config.json'}"
    assert r["config"].model.heads == heads and note in r["config"].notes
    assert note in render_text(r)                              # under "Assumed by the reader"


BATCH_KEYS = [(_R, ("runner_config", "gradient_accumulation_steps")), (_R, ("runner_config", "batch_size")),
              (_R, ("model", "model_config", "batch_size")), (_P, ("training", "local_batch_size")),
              (_P, ("training", "global_batch_size")), (_R, ("micro_batch_interleave_num",)),
              (_P, ("parallelism", "tensor_parallel")), (_R, ("parallel_config", "context_parallel"))]


@pytest.mark.parametrize("seed, path", BATCH_KEYS, ids=[".".join(p) for _, p in BATCH_KEYS])
@pytest.mark.parametrize("value", ["", float("nan"), -0.0, [], 0, False, 2.0],
                         ids=["empty-str", "nan", "minus-0.0", "empty-list", "0", "False", "2.0"])
def test_a_batch_or_degree_mindformers_refuses_is_refused(seed, path, value, tmp_path, capsys):
    """mindformers refuses each: gradient_accumulation_steps must be an int >= 1 (base_trainer.py), the parallel
    degrees pass Validator.check_positive_int, 2.x's TrainingConfig wants positive batch sizes, and the batch
    arithmetic needs numbers. The doctor took '' and -0.0 for 1 and never looked at the model's batch_size."""
    err = _err(mutated(seed, path, value), tmp_path, capsys, "--no-search")
    assert err.startswith(f"doctor: error: {'.'.join(path)}="), err


@pytest.mark.parametrize("seed, path, refused", [
    (_R, ("runner_config", "gradient_accumulation_steps"), False),   # mindformers' trainer makes None 1
    (_R, ("model", "model_config", "batch_size"), False),            # training builds the model with the runner's
    (_R, ("runner_config", "batch_size"), True), (_P, ("training", "local_batch_size"), True),
    (_P, ("training", "global_batch_size"), True)])
def test_a_null_batch_is_refused_or_said(seed, path, refused, tmp_path, capsys):
    if refused:
        err = _err(mutated(seed, path, None), tmp_path, capsys, "--no-search")
        assert err.startswith(f"doctor: error: {'.'.join(path)}=None; fix:"), err
    else:
        import dataclasses
        from mshelpers.doctor import read_config
        c, base = read_config(mutated(seed, path, None)), read_config(copy.deepcopy(PARSED[seed])).layout
        assert c.layout == (dataclasses.replace(base, grad_accum=1) if path[-1] == "gradient_accumulation_steps"
                            else base)
        assert any(n.startswith(f"{'.'.join(path)} is None:") for n in c.notes), c.notes


DTYPE_KEYS = [(_R, ("model", "model_config", "param_init_type")), (_R, ("model", "model_config", "compute_dtype")),
              (_P, ("model", "params_dtype")), (_P, ("model", "compute_dtype")),
              (_M, ("model", "model_config", "params_dtype"))]
FLAG_KEYS = [(_R, ("parallel_config", "use_seq_parallel")), (_R, ("parallel_config", "vocab_emb_dp")),
             (_R, ("parallel", "parallel_optimizer_config", "gradient_accumulation_shard")),
             (_R, ("model", "model_config", "use_flash_attention")), (_P, ("parallelism", "sequence_parallel")),
             (_M, ("model", "model_config", "tie_word_embeddings")), (_M, ("model", "model_config", "attention_bias"))]


@pytest.mark.parametrize("seed, path", DTYPE_KEYS, ids=[".".join(p) for _, p in DTYPE_KEYS])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), {}, "", "float8", 16],
                         ids=["inf", "nan", "empty-dict", "empty-str", "float8", "16"])
def test_a_dtype_mindformers_cannot_convert_is_refused(seed, path, value, tmp_path, capsys):
    """A 1,000-mutation sweep of the fixture YAMLs (2026-12-05) found param_init_type: inf and compute_dtype: nan
    taken as float32 and priced: mindformers' convert_mstype raises KeyError on them."""
    err = _err(mutated(seed, path, value), tmp_path, capsys, "--no-search")
    assert err.startswith(f"doctor: error: {'.'.join(path)}=") and "convert_mstype" in err, err


@pytest.mark.parametrize("seed, path", DTYPE_KEYS[:2], ids=[".".join(p) for _, p in DTYPE_KEYS[:2]])
@pytest.mark.parametrize("value, dtype", [("Float16", "float16"), ("BF16", "bfloat16"), ("fp32", "float32")])
def test_a_dtype_in_another_case_or_short_name_is_read(seed, path, value, dtype):
    from mshelpers.doctor import read_config
    lay = read_config(mutated(seed, path, value)).layout
    assert (lay.param_bytes == (4 if dtype == "float32" else 2)) if path[-1] == "param_init_type" \
        else lay.compute_dtype == dtype


@pytest.mark.parametrize("seed, path", FLAG_KEYS, ids=[".".join(p) for _, p in FLAG_KEYS])
@pytest.mark.parametrize("value", ["58GBB", float("nan"), {}, 1, "True"], ids=["58GBB", "nan", "empty-dict", "1", "str-True"])
def test_a_switch_that_is_not_a_bool_is_refused(seed, path, value, tmp_path, capsys):
    """The same sweep: use_seq_parallel: {} and gradient_accumulation_shard: '58GBB' were read as True and priced
    (Validator.check_bool refuses them in mindformers)."""
    err = _err(mutated(seed, path, value), tmp_path, capsys, "--no-search")
    assert err.startswith(f"doctor: error: {'.'.join(path)}=") and "True or False" in err, err


NULL_SECTIONS = [(s, k) for s in (_R, _M, _P) for k in PARSED[s]
                 if k in READ_SECTIONS and isinstance(PARSED[s][k], dict)]


@pytest.mark.parametrize("seed, section", NULL_SECTIONS, ids=[f"{s.rsplit('/', 1)[-1][:-5]}:{k}"
                                                              for s, k in NULL_SECTIONS])
def test_a_null_section_with_the_search_on_keeps_the_contract(seed, section, tmp_path, capsys):
    """`runner_config:` or `training:` left empty: the search once wrote its variants into None (TypeError)."""
    assert check_case(tmp_path, capsys, mutated(seed, (section,), None), extra=()) is None


# ---------------------------------------------------------------- files that are not a config
def _one_line_exit_2(argv, capsys):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out[-300:], err)
    assert out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("doctor: error: ") and "fix:" in err, err
    return err


@pytest.mark.parametrize("seed", SEEDS)
def test_a_truncated_file(seed, tmp_path, capsys):
    """The first half of the bytes: refused in one line (cut mid-key it is not YAML; cut later it lacks the
    model), unless that half still holds a whole model section (glm4's comes before the layout sections, and no
    layout means one device): then it must run."""
    raw = (DATA / seed).read_bytes()
    p = tmp_path / "half.yaml"
    p.write_bytes(raw[:len(raw) // 2])
    try:
        half = yaml.safe_load(raw[:len(raw) // 2])
    except yaml.YAMLError:
        half = None
    if isinstance(half, dict) and isinstance(half.get("model"), dict):
        assert run_doctor([p, "--no-search"], capsys) is None
    else:
        _one_line_exit_2([p, "--no-search"], capsys)


def test_binary_garbage(tmp_path, capsys):
    p = tmp_path / "garbage.yaml"
    p.write_bytes(random.Random(0).randbytes(4096))
    assert "binary" in _one_line_exit_2([p, "--no-search"], capsys)


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "[1, 2, 3]\n", "just a string\n", "model: [\n",
                                  "\t- : :\n", "a: &x [*x]\n", "!!python/object:os.system ls\n", "\ufeff\x00\x01"])
def test_text_that_is_not_a_config(text, tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    _one_line_exit_2([p, "--no-search"], capsys)


def test_an_empty_file(tmp_path, capsys):
    p = tmp_path / "empty.yaml"
    p.write_bytes(b"")
    _one_line_exit_2([p, "--no-search"], capsys)


def test_a_directory(tmp_path, capsys):
    _one_line_exit_2([tmp_path, "--no-search"], capsys)


def test_a_file_that_does_not_exist(tmp_path, capsys):
    _one_line_exit_2([tmp_path / "nope.yaml", "--no-search"], capsys)


@pytest.mark.parametrize("under", [False, True])
def test_out_at_a_regular_file_writes_nothing(under, tmp_path, capsys):
    blocker = tmp_path / "report"
    blocker.write_text("keep me\n")
    out = blocker / "sub" if under else blocker
    err = _one_line_exit_2([DATA / SEEDS[0], "--no-search", "--out", out], capsys)
    assert "--out" in err
    assert blocker.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_a_reader_that_closes_the_pipe_gets_no_traceback():
    """`python -m mshelpers.doctor X --json | head -c 20` once ended in BrokenPipeError's traceback."""
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "mshelpers.doctor", str(DATA / _R), "--json", "--no-search"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
    p.stdout.close()            # the reader goes away before the report is written (the import alone takes longer)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1 and err == "", err
