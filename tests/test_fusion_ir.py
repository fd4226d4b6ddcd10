"""count_kernels reads the final executed graph of a real MindSpore IR dump (excerpt of a tiny LLaMA
compiled with graph-kernel fusion, tests/data/ir)."""
from pathlib import Path

import pytest

from mshelpers.compiling import count_kernels, ir_dump_env

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
