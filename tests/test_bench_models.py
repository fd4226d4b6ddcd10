"""The benchmark's lean MindSpore LLaMA computes the same loss as mindformers' LlamaForCausalLM.

bench/compare_pytorch.py times a lean in-repo LLaMA Cell against PyTorch; this checks that the lean
Cell is the cookbook's model and not an easier one: same parameter count, and with mindformers'
weights copied in, the same loss on the same batch.
"""
import sys

import numpy as np
import pytest

import mshelpers  # noqa: F401
from mshelpers.config import repo_root

sys.path.insert(0, str(repo_root()))   # bench/ is a folder of scripts, not an installed package


@pytest.fixture(scope="module")
def models():
    from mshelpers.config import RunConfig
    from mshelpers.device import setup
    from mshelpers.model import build_model, count_params
    from bench.lean_llama_ms import LeanLlama
    setup("pynative", seed=0)
    mf = build_model(RunConfig.preset("mini"))
    lean = LeanLlama(vocab=1024, dim=256, layers=4, heads=4, ffn=688, seq_len=128)
    return mf, lean, count_params(mf), count_params(lean)


def copy_mindformers_into_lean(mf, lean) -> int:
    """Load mindformers' weights into the lean model (Linear weights are stored transposed there)."""
    import mindspore as ms
    src = {p.name: p.asnumpy() for p in mf.trainable_params()}
    names = {"embed": "model.tok_embeddings.embedding_weight", "head": "lm_head.weight",
             "norm.weight": "model.norm_out.weight"}
    for i in range(4):
        for w in ("wq", "wk", "wv", "wo"):
            names[f"blocks.{i}.{w}"] = f"model.layers.{i}.attention.{w}.weight"
        for w in ("w1", "w2", "w3"):
            names[f"blocks.{i}.{w}"] = f"model.layers.{i}.feed_forward.{w}.weight"
        names[f"blocks.{i}.attn_norm.weight"] = f"model.layers.{i}.attention_norm.weight"
        names[f"blocks.{i}.mlp_norm.weight"] = f"model.layers.{i}.ffn_norm.weight"
    copied = 0
    for p in lean.trainable_params():
        w = src[names[p.name]]
        w = w if w.ndim == 1 or p.name == "embed" else w.T
        assert w.shape == tuple(p.shape), (p.name, w.shape, p.shape)
        p.set_data(ms.Tensor(np.ascontiguousarray(w)))
        copied += 1
    return copied


def test_same_parameter_count(models):
    _, _, n_mf, n_lean = models
    assert n_mf == n_lean == 3_688_704


def test_lean_loss_matches_mindformers(models):
    import mindspore as ms
    mf, lean, _, _ = models
    # Large random weights first: at the 0.02-std init attention is near uniform and the loss would
    # not notice a wrong rotary embedding or mask.
    rng = np.random.default_rng(1)
    for p in mf.trainable_params():
        w = rng.normal(1.0, 0.1, p.shape) if len(p.shape) == 1 else rng.normal(0.0, 0.15, p.shape)
        p.set_data(ms.Tensor(w.astype(np.float32)))
    assert copy_mindformers_into_lean(mf, lean) == len(mf.trainable_params())
    # token 0 is mindformers' pad id, whose positions it drops from the loss: keep it out of the batch
    x = ms.Tensor(np.random.default_rng(0).integers(1, 1024, (2, 129)).astype(np.int32))
    a, b = float(mf(x).asnumpy()), float(lean(x).asnumpy())
    assert abs(a - b) < 1e-4, f"mindformers loss {a} vs lean loss {b}"


@pytest.mark.parametrize("args, named", [(["--repeats", "0"], "--repeats 0"), (["--steps", "-1"], "--steps -1")])
def test_compare_pytorch_rejects_bad_counts_before_any_run(args, named):
    import subprocess
    r = subprocess.run([sys.executable, "-m", "bench.compare_pytorch", *args], cwd=repo_root(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and named in r.stderr and "fix:" in r.stderr, r.stderr[-500:]
