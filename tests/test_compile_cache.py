"""MindSpore 2.9's on-disk compile cache and the ways to build a train step (notebook 04's NaN).

Measured here (2 fresh processes per kind, the second with a warm cache): a step built as an
`ms.jit` *function* trains cold, but warm its parameters read as zeros (loss exactly ln(vocab),
gradient norm 0; under 2-rank DATA_PARALLEL the next step is NaN; on tiny the warm first loss is NaN).
The same happens to any Parameter the graph reaches through another object: a Cell that called a
DynamicLossScaler's `adjust` kept its scale through overflows. `train.make_train_step`'s graph step is a
Cell that holds those Parameters itself, and trains identically cold and warm (the second test, which
also stands for `dp_train`'s Cell). Accumulation's step is two Cells, one graph per micro-batch and one for
the update, sharing the model's Parameters; warm, they train on garbage (`_cache_probe.py train-accum`, run
twice on one folder: every loss NaN), so `make_train_step` refuses the cache for them with one line. If a
MindSpore upgrade makes the first test fail, the bug is fixed: check train-accum, then drop the refusal.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("_cache_probe.py")


def run_probe(kind: str, cache: Path, garbage_ok: bool = False, *args: str) -> list[list[float]] | str:
    """The probe's losses and gradient norms. With garbage_ok, a run that reads uninitialised memory and dies
    in a kernel (seen once in a fresh-clone CI run: Gather's indices out of range) returns MindSpore's line."""
    env = {**os.environ, "MS_COMPILER_CACHE_ENABLE": "1", "MS_COMPILER_CACHE_PATH": str(cache), "GLOG_v": "3"}
    p = subprocess.run([sys.executable, str(PROBE), kind, *args], capture_output=True, text=True, env=env, timeout=300)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if not line and garbage_ok:
        died = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("RuntimeError: For '")]
        if died:
            return died[-1]
    assert line, f"probe {kind} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return json.loads(line[-1][len("RESULT "):])


def test_a_jitted_function_step_loses_its_weights_on_a_warm_cache(tmp_path):
    from mshelpers.config import RunConfig
    ln_v = math.log(RunConfig.preset("tiny").vocab_size)
    cold_f = run_probe("function", tmp_path / "f")
    warm_f = run_probe("function", tmp_path / "f", garbage_ok=True)
    print("function step, cold:", cold_f, "warm:", warm_f)
    assert cold_f[0][1] > 0 and abs(cold_f[0][0] - ln_v) > 1e-3          # cold: real weights
    # warm: the same weights and batch give another step-1 loss, or a kernel dies on what it read: the graph does
    # not read the parameters (mini: exactly ln V with gradient norm 0, i.e. zeros; tiny: NaN, i.e. uninitialised
    # memory, or once a Gather index out of range)
    if isinstance(warm_f, str):
        assert "Gather" in warm_f or "index" in warm_f, warm_f
    else:
        assert not warm_f[0][0] == pytest.approx(cold_f[0][0], abs=1e-4)


def test_train_s_cell_step_keeps_weights_and_loss_scale_on_a_warm_cache(tmp_path):
    """train()'s graph step on a warm cache: the same losses, and the dynamic scale still halves on overflow
    (a step that reached the scaler's Parameters through the scaler object kept 2**127 warm)."""
    cold = run_probe("train", tmp_path / "t", False, str(tmp_path / "cold.csv"))
    warm = run_probe("train", tmp_path / "t", False, str(tmp_path / "warm.csv"))
    print("train(), cold:", cold, "warm:", warm)
    (cl, cs), (wl, ws) = cold, warm
    assert cs[0] < 2.0 ** 127 and cs[-1] < cs[0]                  # overflow halved the scale, cold
    assert ws == cs                                               # and warm, step for step
    assert [str(x) for x in wl] == [str(x) for x in cl]           # the same losses (nan/inf included)
    assert all(math.isfinite(x) for x in cl[-2:])                 # and it trains once the scale is sane


def test_train_refuses_the_compile_cache_for_its_function_steps(monkeypatch):
    from mshelpers.config import RunConfig
    from mshelpers.train import make_train_step
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    with pytest.raises(ValueError, match="MS_COMPILER_CACHE_ENABLE=1 with grad_accum > 1.*fix: unset"):
        make_train_step(None, None, RunConfig.preset("tiny").replace(mode="graph", grad_accum=2))


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
