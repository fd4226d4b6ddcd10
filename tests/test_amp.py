"""mshelpers.amp: overflow location, dtype report, loss-scaled step (small nets, a few seconds), and the float16
facts notebook 03 relies on. The step itself is train_step.build_step's: tests/test_train_step.py."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mshelpers.amp import (
    NonfiniteReport,
    activation_stats,
    dtype_report,
    find_first_nonfinite,
    make_scaled_train_step,
)


class SmallNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Dense(8, 16)
        self.act = nn.ReLU()
        self.hidden = nn.Dense(16, 16)
        self.head = nn.Dense(16, 1)

    def construct(self, x):
        return self.head(self.hidden(self.act(self.embed(x)))).mean()


def _x(rows: int = 4) -> "ms.Tensor":
    return ms.Tensor(np.random.default_rng(0).normal(size=(rows, 8)).astype(np.float32))


def _plant_overflow(net: SmallNet) -> SmallNet:
    # float32 max is 3.4e38; 16 inputs of order 1 times weights of 1e38 overflow to inf.
    net.hidden.weight.set_data(ms.Tensor(np.full((16, 16), 1e38, np.float32)))
    return net


@pytest.fixture(autouse=True)
def _seed():
    ms.set_seed(0)


def test_healthy_net_has_no_nonfinite():
    assert find_first_nonfinite(SmallNet(), _x()) is None


def test_planted_overflow_names_that_layer():
    assert find_first_nonfinite(_plant_overflow(SmallNet()), _x()) == "hidden"


def test_float16_overflow_is_located_under_o3():
    net = SmallNet()
    # Weights of 1e3 on inputs of 1e2, summed over 8 features, exceed float16's 65504.
    net.embed.weight.set_data(ms.Tensor(np.full((16, 8), 1e3, np.float32)))
    x = ms.Tensor(np.full((2, 8), 1e2, np.float32))
    assert find_first_nonfinite(net, x) is None  # float32 holds 8e5 easily
    net16 = ms.amp.auto_mixed_precision(net, "O3")
    name = find_first_nonfinite(net16, x)
    assert name is not None and name.endswith("embed"), name


def test_grads_report_names_cell_and_parameter():
    assert find_first_nonfinite(SmallNet(), _x(), grads=True) == NonfiniteReport(None, None)
    # a finite forward whose backward overflows: gradients of 1e30 weights squared past float32
    net = SmallNet()
    net.head.weight.set_data(ms.Tensor(np.full((1, 16), 1e30, np.float32)))
    net.hidden.weight.set_data(ms.Tensor(np.full((16, 16), 1e-30, np.float32)))
    rep = find_first_nonfinite(net, _x(), grads=True)
    assert rep.cell is None and rep.note is None, rep


def test_execution_order_puts_inner_layers_first_and_restores_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        rows = activation_stats(SmallNet(), _x())
        assert ms.get_context("mode") == ms.GRAPH_MODE
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert [r["cell"] for r in rows] == ["embed", "act", "hidden", "head", ""]
    assert all(r["finite"] for r in rows)


def test_dtype_report_sees_float16_activations_under_o2():
    plain = dtype_report(SmallNet(), _x()).summary()
    assert plain == {"param dtypes": "float32 100%", "activation dtypes": "float32 100%"}
    o2 = dtype_report(ms.amp.auto_mixed_precision(SmallNet(), "O2"), _x()).summary()
    assert o2["param dtypes"] == "float32 100%"
    assert o2["activation dtypes"].startswith("float16"), o2
    assert dtype_report(SmallNet()).summary()["activation dtypes"] == "(no inputs given)"


def test_bad_inputs_raise_one_clear_value_error():
    with pytest.raises(ValueError, match="not a mindspore.nn.Cell"):
        find_first_nonfinite(lambda x: x, _x())
    with pytest.raises(ValueError, match="no inputs given"):
        find_first_nonfinite(SmallNet())
    with pytest.raises(ValueError, match="scale_factor"):
        net = SmallNet()
        make_scaled_train_step(net, nn.Adam(net.trainable_params(), 1e-3), scale_factor=1.5)


def test_scaled_step_skips_overflow_and_halves_scale():
    base = SmallNet()
    net = ms.amp.auto_mixed_precision(base, "O2")  # wraps base; weights are shared
    opt = nn.Adam(net.trainable_params(), 1e-2)
    # 2**40 times any float16 gradient is inf, so the first steps must be skipped.
    step = make_scaled_train_step(net, opt, init_scale=2.0 ** 40, scale_window=2)
    before = base.head.weight.asnumpy().copy()
    first = step(_x())
    assert not first.finite and first.scale == 2.0 ** 39
    np.testing.assert_array_equal(base.head.weight.asnumpy(), before)  # update skipped
    results = [step(_x()) for _ in range(40)]
    assert any(r.finite for r in results)
    assert not np.array_equal(base.head.weight.asnumpy(), before)  # a finite step updated
    assert all(np.isfinite(r.loss) for r in results if r.finite)


def test_number_formats_match_the_ieee_and_bfloat16_limits():
    from mshelpers.amp import number_formats

    rows = {r["format"]: r for r in number_formats()}
    assert rows["float16"]["max"] == 65504.0
    assert rows["bfloat16"]["epsilon"] == 2.0 ** -7
    assert rows["bfloat16"]["smallest normal"] == rows["float32"]["smallest normal"] == 2.0 ** -126
    assert rows["bfloat16"]["max"] == (2 - 2.0 ** -7) * 2.0 ** 127


def test_to_bfloat16_rounds_to_nearest_even():
    from mshelpers.amp import to_bfloat16

    out = to_bfloat16([1.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 70000.0, 3.4e38, -2.5])
    assert out.tolist() == [1.0, 1.0, 1 + 2.0 ** -6, 70144.0, float("inf"), -2.5]
    assert np.isnan(to_bfloat16([float("nan")])[0])


def test_auto_mixed_precision_wrapper_keeps_rewrites_out_of_cwd(tmp_path, monkeypatch):
    from mshelpers.amp import auto_mixed_precision

    monkeypatch.chdir(tmp_path)
    work = tmp_path / "rewrite"
    work.mkdir()
    net = auto_mixed_precision(SmallNet(), "O1", workdir=str(work))
    assert not (tmp_path / "rewritten_network").exists()
    assert find_first_nonfinite(net, _x()) is None
    with pytest.raises(ValueError, match="level='O4'"):
        auto_mixed_precision(SmallNet(), "O4")


class _Attn(nn.Cell):
    """Overflows in its own construct (q @ k^T in float16), then feeds the inf to its softmax child."""

    def __init__(self):
        super().__init__()
        self.q = nn.Dense(8, 8)
        self.softmax = nn.Softmax(-1)

    def construct(self, x):
        q = self.q(x).astype(ms.float16)
        scores = ms.ops.matmul(q * 300.0, q.transpose(1, 0) * 300.0)   # |q|~1: 9e4 > float16 max 65504
        return self.softmax(scores.astype(ms.float32)).sum()


def test_overflow_in_a_parents_own_code_names_the_parent_not_its_child():
    net = _Attn()
    net.q.weight.set_data(ms.Tensor(np.ones((8, 8), np.float32)))
    x = ms.Tensor(np.ones((2, 8), np.float32))
    rows = activation_stats(net, x)
    assert [r["cell"] for r in rows if not r["finite"]][0] == "softmax"    # the naive answer
    assert find_first_nonfinite(net, x) == ""                              # the root's own MatMul


def test_grads_with_a_nonfinite_forward_say_so_instead_of_naming_a_parameter():
    rep = find_first_nonfinite(_plant_overflow(SmallNet()), _x(), grads=True)
    assert rep.cell == "hidden" and rep.param is None and "forward" in rep.note


class _TwoInputLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = SmallNet()

    def construct(self, x, y):
        return ((self.net(x) - y) ** 2).mean()


def test_scaled_step_checks_the_construct_signature_before_the_first_gradient():
    loss = _TwoInputLoss()
    step = make_scaled_train_step(loss, nn.Adam(loss.trainable_params(), 1e-3), init_scale=np.float32(4),
                                  scale_factor=np.int64(2), jit=False)
    with pytest.raises(ValueError, match=r"got 1 input.*fix: call step\(x, y\)"):
        step(_x())
    r = step(_x(), ms.Tensor(np.float32(1.0)))
    assert r.finite and np.isfinite(r.loss) and r.scale == 4.0


# --- float16 facts notebook 03 relies on: smalllm.RMSNorm under AMP (was tests/test_smalllm_amp.py) ---
@pytest.mark.parametrize("mode,expected", [("pynative", "Float16"), ("graph", "Float32")])
def test_to_float16_cell_casts_the_inner_astype_in_pynative_only(mode, expected):
    from mindspore import nn, ops
    from mshelpers.device import setup

    class Square32(nn.Cell):          # RMSNorm's first step: cast to float32, then square
        def construct(self, x):
            return ops.square(x.astype(ms.float32))

    setup(mode=mode, seed=0)
    cell = Square32()
    cell.to_float(ms.float16)
    assert str(cell(ms.Tensor(np.ones(4, np.float32))).dtype) == expected


def test_float16_rsqrt_backward_overflows_at_the_embedding_scale():
    # mean of squares of a Normal(0, 0.02) embedding ~ 4e-4: d rsqrt/dm = -0.5 m^-1.5 ~ -6e4, past float16 in its y^3
    from mindspore import ops
    from mshelpers.device import setup
    setup(mode="pynative", seed=0)
    g16 = float(ms.grad(ops.rsqrt)(ms.Tensor(np.float16(4e-4))).asnumpy())
    g32 = float(ms.grad(ops.rsqrt)(ms.Tensor(np.float32(4e-4))).asnumpy())
    assert not np.isfinite(g16) and np.isfinite(g32)


def test_dtype_report_counts_parameter_elements_not_tensors():
    net = SmallNet()
    for p in net.head.get_parameters():          # head: 16 x 1 weight + 1 bias = 17 of the 433 elements
        p.set_dtype(ms.float16)
    rep = dtype_report(net)
    # embed 8*16 + 16 = 144, hidden 16*16 + 16 = 272, head 17: per tensor it would be 4 float32 against 2 float16
    assert dict(rep.param_elements) == {"float32": 416, "float16": 17}
