"""mshelpers.compiling: bucketing, recompile detection, compile-error capture (no training)."""
import time
from pathlib import Path

import numpy as np
import pytest

from mshelpers.compiling import (bucket_length, capture_compile_error, count_kernels, first_steps, fusion_steps,
                                 ir_dump_env, pad_to_bucket, shape_sweep)


def test_bucket_length_picks_smallest_bucket_that_fits():
    assert [bucket_length(n, (64, 128)) for n in (1, 64, 65, 128)] == [64, 64, 128, 128]
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket_length(129, (64, 128))
    with pytest.raises(ValueError, match="ascending"):
        bucket_length(10, (128, 64))


def test_pad_to_bucket_right_pads_with_pad_id():
    b = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    out = pad_to_bucket(b, (4, 8), pad_id=0)
    assert out.shape == (2, 4) and out.dtype == np.int32
    np.testing.assert_array_equal(out[:, :3], b)
    assert (out[:, 3] == 0).all()


def test_shape_sweep_flags_slow_first_calls_per_shape():
    seen = set()

    def fake_step(x):  # "compiles" (sleeps 0.3 s) the first time it sees a shape, else takes 20 ms
        # a steady call of microseconds made the 3x-median limit a few microseconds, so one preemption on a
        # busy machine flagged a steady call (stop 34's CI); at 20 ms a call must be held up 40 ms to cross it
        time.sleep(0.02 if x.shape in seen else 0.3)
        seen.add(x.shape)
        return float(x.sum())

    batches = [np.ones((2, n)) for n in (4, 4, 8, 8, 4, 8)]
    rows = shape_sweep(fake_step, batches)
    assert [r["compiled"] for r in rows] == [True, False, True, False, False, False]
    assert [r["new_shape"] for r in rows] == [True, False, True, False, False, False]


def test_first_steps_rejects_bad_jit_level_before_any_work():
    with pytest.raises(ValueError, match="jit_level='O3'"):
        first_steps("tiny", jit_level="O3")


@pytest.mark.parametrize("env", [{"MS_DEV_SAVE_GRAPHS": 1}, [("MS_DEV_SAVE_GRAPHS", "1")]])
def test_fusion_steps_refuses_an_env_it_cannot_set_before_any_work(tmp_path, env):
    import os
    cwd = os.getcwd()
    with pytest.raises(ValueError, match="fusion_steps: compile_env=.*fix: a dict"):
        fusion_steps("tiny", ir_dir=tmp_path / "ir", compile_env=env)
    assert os.getcwd() == cwd and not (tmp_path / "ir").exists()      # refused before it moved or wrote anything


def test_capture_compile_error_reads_first_line_and_source(tmp_path):
    import mindspore as ms
    from _compile_error_net import GuardedDense

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        err = capture_compile_error(GuardedDense(), ms.Tensor(np.ones((2, 4), np.float32)), workdir=str(tmp_path))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert err["error"] == "RuntimeError"
    assert "Try" in err["first_line"]
    assert any("_compile_error_net.py" in c for c in err["code"]), err["code"]


# ---------------------------------------------------------------- count_kernels on a real IR dump
# count_kernels reads the final executed graph of a real MindSpore IR dump (excerpt of a tiny LLaMA
# compiled with graph-kernel fusion, tests/data/ir).
DATA = Path(__file__).parent / "data" / "ir"


def test_counts_kernel_lines_not_actors():
    k = count_kernels(DATA)
    # StridedSlice x2, Reshape, Gather, GraphKernel_Square, GraphKernel_Add_Rsqrt_split; the
    # DataPrepareActor, HostDSActor and FusionActor lines are runtime actors, not kernels
    assert k["kernels"] == 6
    assert k["fused_kernels"] == 2
    assert k["by_type"] == {"StridedSlice": 2, "Reshape": 1, "Gather": 1, "GraphKernel_Square": 1,
                            "GraphKernel_Add_Rsqrt_split": 1}
    assert k["file"].endswith("final_actor_set_kernel_graph_0.ir")


def test_missing_dump_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="ir_dump_env"):
        count_kernels(tmp_path)


def test_dump_env_restricts_to_the_actor_set(tmp_path):
    env = ir_dump_env(tmp_path)
    assert env["MS_DEV_SAVE_GRAPHS_PATH"] == str(tmp_path) and env["MS_DEV_DUMP_IR_PASSES"] == "actor_set"
