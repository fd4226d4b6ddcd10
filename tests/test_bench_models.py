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


DIMS = dict(vocab=1024, dim=256, layers=4, heads=4, ffn=688, seq_len=128)


@pytest.fixture(scope="module")
def models():
    from mshelpers.config import RunConfig
    from mshelpers.device import setup
    from mshelpers.model import build_model, count_params
    from bench.lean_llama_ms import LeanLlama
    setup("pynative", seed=0)
    mf = build_model(RunConfig.preset("mini"))
    lean = LeanLlama(**DIMS)
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


@pytest.mark.parametrize("options", ["recipe", "plain"])
def test_lean_loss_matches_mindformers(models, options):
    """The benchmark's recipe (every CPU optimization on) and the plain Cell both compute mindformers' loss."""
    import mindspore as ms
    from bench.lean_llama_ms import LeanLlama, PLAIN
    mf, lean, _, _ = models
    lean = lean if options == "recipe" else LeanLlama(**DIMS, **PLAIN)
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


def _grads(net, x):
    import mindspore as ms
    _, grads = ms.value_and_grad(net, None, net.trainable_params())(x)
    return {p.name: g.asnumpy() for p, g in zip(net.trainable_params(), grads)}


def test_each_optimization_keeps_the_gradients(models):
    """Switching any one optimization leaves every gradient unchanged: the custom softmax bprop, the
    matmul-based rotary and norm, the fused cross-entropy and the MatMul primitives are exact rewrites."""
    import mindspore as ms
    from bench.lean_llama_ms import LeanLlama, TUNED
    _, recipe, _, _ = models
    x = ms.Tensor(np.random.default_rng(2).integers(0, 1024, (2, 129)).astype(np.int32))
    ref = _grads(recipe, x)
    for option, value in [*((o, False) for o in TUNED), ("norm_by_matmul", True)]:
        other = LeanLlama(**DIMS, **{option: value})
        ms.load_param_into_net(other, {p.name: ms.Parameter(p.data.copy(), name=p.name)
                                       for p in recipe.trainable_params()})
        got = _grads(other, x)
        for name, g in ref.items():
            scale = max(float(np.abs(g).max()), 1e-12)
            err = float(np.abs(got[name] - g).max()) / scale
            assert err < 1e-3, f"{option}={value}: gradient of {name} differs by {err:.2e} (relative)"


def test_lean_rejects_unknown_option():
    from bench.lean_llama_ms import LeanLlama
    with pytest.raises(TypeError, match="rope_by_matmull.*fix"):
        LeanLlama(**DIMS, rope_by_matmull=True)


def test_blas_matmul_matches_and_differentiates():
    """The OpenBLAS AOT candidate: forward and both gradients equal MindSpore's MatMul, batched too."""
    import shutil
    import mindspore as ms
    from mindspore import ops
    if shutil.which("g++") is None:   # a laptop without a compiler can still run the cookbook; CI has g++
        pytest.skip("g++ is missing: only the benchmark's AOT candidate needs it (apt-get install g++)")
    from bench.blas_matmul import blas_matmul, blas_matmul_nt
    rng = np.random.default_rng(3)
    for shape_a, shape_b in [((64, 32), (32, 48)), ((2, 3, 16, 8), (2, 3, 8, 12))]:
        a = ms.Tensor(rng.normal(size=shape_a).astype(np.float32))
        b = ms.Tensor(rng.normal(size=shape_b).astype(np.float32))
        ref = np.matmul(a.asnumpy(), b.asnumpy())
        np.testing.assert_allclose(blas_matmul(a, b).asnumpy(), ref, rtol=1e-5, atol=1e-5)
        bt = ms.Tensor(np.ascontiguousarray(np.swapaxes(b.asnumpy(), -1, -2)))
        np.testing.assert_allclose(blas_matmul_nt(a, bt).asnumpy(), ref, rtol=1e-5, atol=1e-5)
        gr = ms.grad(lambda x, y: (ops.matmul(x, y) ** 2).sum(), grad_position=(0, 1))(a, b)
        ga = ms.grad(lambda x, y: (blas_matmul(x, y) ** 2).sum(), grad_position=(0, 1))(a, b)
        gt = ms.grad(lambda x, y: (blas_matmul_nt(x, y) ** 2).sum(), grad_position=(0, 1))(a, bt)
        want_bt = np.ascontiguousarray(np.swapaxes(gr[1].asnumpy(), -1, -2))   # d/d(b^T) = (d/db)^T
        for got, want in [(ga[0], gr[0].asnumpy()), (ga[1], gr[1].asnumpy()), (gt[0], gr[0].asnumpy()),
                          (gt[1], want_bt)]:
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args, named", [(["--repeats", "0"], "--repeats 0"), (["--steps", "-1"], "--steps -1")])
def test_compare_pytorch_rejects_bad_counts_before_any_run(args, named):
    import subprocess
    r = subprocess.run([sys.executable, "-m", "bench.compare_pytorch", *args], cwd=repo_root(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and named in r.stderr and "fix:" in r.stderr, r.stderr[-500:]
