"""smalllm.RMSNorm under AMP: what its float32 statistics really run in (notebook 03, section 2)."""
import mindspore as ms
import numpy as np
import pytest


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
