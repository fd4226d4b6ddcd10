"""One config, one price (issue 49): every fixture YAML under tests/data/mindformers/ (2.1.0/ included, with the
config.json of hf/ where a template names no model) goes through each public entry point that prices a model on
a layout, and all of them must say the same memory per device, step time and fits verdict:

  the doctor API       mshelpers.doctor.diagnose (search off)
  the CLI              mshelpers.doctor.cli.main([path, "--json"]) in this process, stdout parsed
  the memory estimate  mshelpers.memory.estimate_from_mindformers_yaml
  the planner          mshelpers.parallel.make_layout(path) on the file's own layout, on the Ascend reference profile

The numbers are not pinned (the cost model is refitted as it improves); the entry points are compared with each
other, exactly: they must run the same code on the same Model and Layout. The planner's other inputs (a RunConfig
and degrees) are held to the doctor on the YAML `mindformers_yaml.mindformers_yaml` writes for them, and the planner's
hardware profiles to the doctor's. The planner never writes or re-reads a YAML itself (issue 58): a file's Layout is
varied with dataclasses.replace (`doctor.adapt.on_degrees`), held here to the file edited and read again
(`readers.with_layout`) on every fixture, and a RunConfig's Config is built directly (`doctor.adapt.planned_config`),
held to the Config read from the YAML `mindformers_yaml` writes.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
from pathlib import Path

import pytest

from mshelpers import doctor as D
from mshelpers import collectives, hardware, memory, mindformers_yaml, parallel
from mshelpers.config import RunConfig
from test_dialects import MODEL_FOR as DIALECT_MODEL_FOR

DATA = Path(__file__).parents[1] / "data" / "mindformers"
FILES = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.yaml"))
# the model each 2.1.0 file that names none is read with: the dialect tests' own table, under this file's paths
MODEL_FOR = {f"2.1.0/{name}": path for name, path in DIALECT_MODEL_FOR.items()}
ASCEND = hardware.Hardware.reference("ascend-910b")


def _cli(path: str, model_config) -> dict:
    argv = [path, "--json", "--no-search"] + (["--model-config", str(model_config)] if model_config else [])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = D.cli.main(argv)
    got = json.loads(out.getvalue())                # --json prints one JSON object and nothing else
    assert code == (0 if got["fits"] else 1) == got["exit_code"], (path, err.getvalue())
    return got


@functools.lru_cache(maxsize=None)
def prices(name: str) -> dict[str, tuple]:
    """(memory per device, step seconds, fits) from every entry point, for one fixture file (computed once)."""
    path, mc = str(DATA / name), MODEL_FOR.get(name)
    r = D.diagnose(path, model_config=mc, search=False)
    j = _cli(path, mc)
    e = memory.estimate_from_mindformers_yaml(path, model_config=mc)
    lay = parallel.make_layout(path, hardware=ASCEND, model_config=mc)
    return {"doctor": (r["memory"]["memory_per_device_bytes"], r["step"]["step_s"], r["fits"]),
            "cli --json": (j["memory_per_device_bytes"], j["step_s"], j["fits"]),
            "memory.estimate_from_mindformers_yaml": (e["total"], None, e["fits"]),
            "parallel.make_layout": (lay.memory_per_device_bytes, lay.step_time["step_s"], lay.fits)}


def test_every_fixture_is_a_training_config_the_doctor_reads():
    assert len(FILES) >= 100, FILES            # 87 published r1.x files, the 2.1.0 wheel's 19, the masters
    for name in FILES:
        D.read_config(DATA / name, model_config=MODEL_FOR.get(name))


@pytest.mark.parametrize("name", FILES)
def test_every_entry_point_prices_the_file_alike(name):
    got = prices(name)
    mem, step, fits = got["doctor"]
    assert mem > 0 and step > 0 and fits in (True, False)
    for entry, (m, s, f) in got.items():
        assert m == mem, f"{name}: memory per device {entry} {m} != doctor {mem}"
        assert s is None or s == step, f"{name}: step time {entry} {s} != doctor {step}"
        assert f is fits, f"{name}: fits {entry} {f} != doctor {fits}"


# ---------------------------------------------------------------- the planner's own inputs
L7 = RunConfig.preset("llama2-7b")


@pytest.mark.parametrize("dp, mp, pp, m, zero, sp, v", [
    (8, 4, 1, 8, 1, False, 1), (4, 8, 1, 4, 1, True, 1), (2, 4, 4, 8, 2, False, 1), (2, 2, 8, 16, 0, True, 2)])
def test_the_planner_prices_the_yaml_it_emits_as_the_doctor_does(dp, mp, pp, m, zero, sp, v):
    kw = dict(global_batch=64, seq_len=4096, zero_stage=zero, sequence_parallel=sp, flash_attention=True)
    lay = parallel.make_layout(L7, dp, mp, pp, m, **kw, memory_budget_bytes=58 * 2**30, hardware=ASCEND,
                               **(dict(schedule="interleaved", virtual_stages=v) if v > 1 else {}))
    spec = mindformers_yaml.mindformers_yaml(L7, lay, seq_len=4096, zero_stage=zero, use_flash_attention=True,
                                     sequence_parallel=sp, virtual_stages=v)
    r = D.diagnose(spec, search=False)
    assert (lay.memory_per_device_bytes, lay.step_time["step_s"], lay.fits) == \
        (r["memory"]["memory_per_device_bytes"], r["step"]["step_s"], r["fits"])
    assert (r["config"].layout.dp, r["config"].layout.tp, r["config"].layout.pp, r["config"].layout.vpp) == (dp, mp, pp, v)
    assert r["config"].layout.seq_parallel == sp and r["config"].layout.parallel_optimizer == (zero >= 1)


def test_the_ascend_reference_profile_is_the_doctors():
    import dataclasses
    hw, cal = ASCEND.to_doctor()
    assert hw == D.hardware("atlas-800t-a2") and cal == D.CALIBRATION
    assert ASCEND.peak_flops_per_device == D.hardware("atlas-800t-a2").peak("bfloat16")
    # a what-if on the peak scales every dtype of the profile alike
    fast = dataclasses.replace(ASCEND, peak_flops_per_device=2 * ASCEND.peak_flops_per_device).to_doctor()[0]
    assert fast.peak("float16") == 2 * hw.peak("float16") and fast.peak("bfloat16") == 2 * hw.peak("bfloat16")
    # a what-if on the view reaches the doctor's profile, and only the figure changed moves
    slow = dataclasses.replace(ASCEND, inter_node_bytes_per_s=ASCEND.inter_node_bytes_per_s / 4).to_doctor()[0]
    assert slow.inter_bytes_per_s == hw.inter_bytes_per_s / 4 and dataclasses.replace(
        slow, inter_bytes_per_s=hw.inter_bytes_per_s) == hw


def test_the_measured_profile_is_the_doctors_cpu_profile():
    fit = collectives.fit_alpha_beta([{"op": "all_reduce", "bytes": b, "seconds": 2e-3 + b / 3e8, "ranks": 2}
                                   for b in (1e4, 1e6, 1.6e7)], "all_reduce")
    mine = hardware.Hardware.from_measurement(fit, peak_flops_per_device=5e10, group_size=2).to_doctor()[0]
    theirs = D.cpu_hardware(2, alpha_beta=fit, peak=1e11)        # 2 ranks share the measured peak
    assert dataclasses_equal_but_name(mine, theirs)


def dataclasses_equal_but_name(a, b) -> bool:
    import dataclasses
    return dataclasses.replace(a, name=b.name, sources=b.sources) == b


def test_collective_time_is_the_doctors_gradient_reduction():
    """A pure data-parallel step's gradient reduction (doctor, comm factor 1) is collective_time's all-reduce of the
    gradients on the same links, inside a node (3 of 7 links for 4 ranks) and across nodes."""
    import dataclasses
    for dp, hw in ((4, ASCEND), (16, ASCEND), (8, dataclasses.replace(ASCEND, intra_node_latency_s=2e-5))):
        lay = parallel.make_layout(L7, dp, 1, 1, 1, global_batch=dp, seq_len=512, zero_stage=0)
        dh, cal = hw.to_doctor()
        st = D.step_time(lay.config, dh, dataclasses.replace(cal, comm_time_factor=1.0))
        grads = sum(D.stage_params(lay.config, 0)) * lay.config.layout.param_bytes
        want = collectives.collective_time("all_reduce", grads, dp, hw, crosses_nodes=dp > hw.devices_per_node)
        assert st["dp_total_s"] == pytest.approx(want, rel=1e-12), (dp, st["dp_total_s"], want)


# ---------------------------------------------------------------- one Layout, varied with dataclasses.replace
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _degree_choices(cfg: D.Config) -> list[tuple]:
    """Some (dp, tp, pp, micro) on the file's devices and global batch: the first that raises tp, the first that
    raises dp, the first that changes pp, and a spread of the rest (tp dividing the heads and the FFN)."""
    lay, m = cfg.layout, cfg.model
    n, batch = lay.devices // lay.cp, lay.global_batch // lay.interleave
    every = []
    for tp in _divisors(n):
        if m.heads % tp or m.ffn % tp or (m.kv_heads % tp and tp % m.kv_heads):
            continue
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            ms = [x for x in _divisors(batch // dp) if x >= pp] if batch % dp == 0 else []
            for micro in dict.fromkeys(ms[:1] + ms[-1:]):
                if (dp, tp, pp, micro) != (lay.dp, lay.tp, lay.pp, lay.n_micro):
                    every.append((dp, tp, pp, micro))
    first = [next((c for c in every if ok(c)), None) for ok in (
        lambda c: c[1] > lay.tp, lambda c: c[0] > lay.dp, lambda c: c[2] != lay.pp)]
    return list(dict.fromkeys([c for c in first if c] + every[::max(1, len(every) // 4)]))


@functools.lru_cache(maxsize=None)
def _varied(name: str) -> dict:
    """For one fixture: each degree choice varied by the planner's path (adapt.on_degrees: layout_variant, no YAML)
    and by the slow reference (readers.with_layout: the file edited and read again), both priced."""
    from mshelpers.doctor import adapt
    cfg = D.read_config(DATA / name, model_config=MODEL_FOR.get(name))
    out = {"cfg": cfg, "rows": []}
    for dp, tp, pp, micro in _degree_choices(cfg):
        kw = adapt.degree_changes(cfg, dp, tp, pp, micro)
        try:
            slow = D.with_layout(cfg, **kw)
        except D.DoctorError:
            with pytest.raises(D.DoctorError):              # a file the reader refuses is a refused variant
                adapt.on_degrees(cfg, dp, tp, pp, micro)
            out["rows"].append(((dp, tp, pp, micro), None, None))
            continue
        out["rows"].append(((dp, tp, pp, micro), slow, adapt.on_degrees(cfg, dp, tp, pp, micro)))
    return out


@pytest.mark.parametrize("name", FILES)
def test_the_planners_replace_prices_every_fixture_as_its_file_read_again(name):
    """parallel.make_layout(file, dp, mp, pp, m) varies the file's Layout with dataclasses.replace (adapt.on_degrees);
    the file's own switches (use_seq_parallel at tp 1, the parallel optimizer at dp x cp 1, the recompute entries
    a new stage split re-splits) travel in Config.asked. Each variant prices exactly as the file edited and read
    again (readers.with_layout, the slow reference): the same Model and Layout, memory and step time."""
    for degrees, slow, fast in _varied(name)["rows"]:
        if slow is None:
            continue
        assert (fast.model, fast.layout, fast.budget_bytes, fast.dialect) == \
            (slow.model, slow.layout, slow.budget_bytes, slow.dialect), (name, degrees)
        assert D.memory_per_stage(fast) == D.memory_per_stage(slow), (name, degrees)
        assert D.step_time(fast, D.hardware("atlas-800t-a2")) == D.step_time(slow, D.hardware("atlas-800t-a2")), \
            (name, degrees)


def test_the_varied_fixtures_reach_every_switch_a_layout_cannot_show():
    """The equality above is not vacuous: among the fixtures' variants, files at tp 1 that ask for sequence
    parallel get it at tp > 1, files at dp x cp 1 that ask for the parallel optimizer get it at dp > 1, and new
    stage splits re-split recompute entries."""
    sp = po = resplit = checked = refused = 0
    for name in FILES:
        got = _varied(name)
        lay, asked = got["cfg"].layout, got["cfg"].asked
        for (dp, tp, pp, _), slow, fast in got["rows"]:
            if slow is None:
                refused += 1
                continue
            checked += 1
            sp += lay.tp == 1 and tp > 1 and fast.layout.seq_parallel
            po += lay.dp * lay.cp == 1 and fast.layout.parallel_optimizer
            resplit += pp != lay.pp and sum(fast.layout.full_recompute) + sum(map(len, fast.layout.select_ops)) > 0
    assert checked > 300 and sp >= 10 and po >= 15 and resplit >= 30, (checked, refused, sp, po, resplit)


@pytest.mark.parametrize("preset, dp, mp, pp, m, kw", [
    ("llama2-7b", 8, 4, 1, 8, dict(zero_stage=1)),
    ("llama2-7b", 4, 8, 1, 4, dict(zero_stage=1, sequence_parallel=True, flash_attention=True)),
    ("llama2-13b", 2, 4, 4, 8, dict(zero_stage=2, recompute="full")),
    ("llama2-70b", 2, 8, 4, 16, dict(recompute="selective", sequence_parallel=True)),
    ("llama2-7b", 2, 2, 8, 16, dict(sequence_parallel=True, schedule="interleaved", virtual_stages=2)),
    ("llama2-13b", 1, 2, 4, 8, dict(zero_stage=1, recompute="full", schedule="interleaved", virtual_stages=5)),
    ("tiny", 2, 1, 2, 4, dict(budget=2**30)),
    ("gqa", 2, 4, 2, 4, dict(flash_attention=True, zero_stage=1)),
])
def test_a_runconfigs_direct_config_prices_as_the_yaml_mindformers_yaml_writes(preset, dp, mp, pp, m, kw):
    """The planner builds a RunConfig's doctor Config directly (adapt.planned_config: Model + Layout, no YAML); it
    is the Config the doctor reads from the YAML mindformers_yaml writes for the same layout, and prices alike."""
    import types
    from mshelpers.doctor import adapt
    kw = dict(kw)
    rc = kw.pop("recompute", "none")
    if preset == "gqa":                     # a user's own config with grouped-query attention
        run = types.SimpleNamespace(**{**RunConfig.preset("llama2-13b").__dict__, "num_kv_heads": 8,
                                       "recompute": rc})
    else:
        run = RunConfig.preset(preset).replace(recompute=rc)
    batch = 64 if preset != "tiny" else 16
    direct = adapt.planned_config(run, dp, mp, pp, m, global_batch=batch, seq_len=None, **kw)
    v = kw.get("virtual_stages", 1)
    spec = mindformers_yaml.mindformers_yaml(run, direct.layout, zero_stage=kw.get("zero_stage", 0),
                                             use_flash_attention=kw.get("flash_attention", False),
                                             sequence_parallel=kw.get("sequence_parallel", False), virtual_stages=v)
    read = D.read_config(spec, budget=kw.get("budget"))
    assert (direct.model, direct.layout, direct.budget_bytes, direct.dialect) == \
        (read.model, read.layout, read.budget_bytes, read.dialect)
    assert direct.asked == read.asked
    assert D.memory_per_stage(direct) == D.memory_per_stage(read)
    assert D.step_time(direct, D.hardware("atlas-800t-a2")) == D.step_time(read, D.hardware("atlas-800t-a2"))
    assert direct.layout.global_batch == batch and direct.layout.devices == dp * mp * pp
