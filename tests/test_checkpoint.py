import mindspore as ms
import numpy as np
import pytest
from mindspore import amp, nn

from mshelpers import checkpoint


def make():
    net = nn.Dense(4, 3)
    return net, nn.AdamWeightDecay(net.trainable_params(), 1e-3), amp.DynamicLossScaler(1024.0, 2, 50)


def test_round_trip_restores_params_optimizer_scaler_and_meta(tmp_path):
    net, opt, sc = make()
    want = net.weight.asnumpy().copy()
    p = checkpoint.save(tmp_path, net, opt, step=7, data_pos=7, loss_scaler=sc)
    assert p.name == "step_000007.ckpt" and not list(tmp_path.glob(".tmp-*"))
    net.weight.set_data(ms.Tensor(np.zeros((3, 4), np.float32)))
    sc.scale_value.set_data(ms.Tensor(1.0, ms.float32))
    meta = checkpoint.load(p, net, opt, sc)
    assert meta["step"] == 7 and meta["data_pos"] == 7
    np.testing.assert_array_equal(net.weight.asnumpy(), want)
    assert float(sc.scale_value.asnumpy()) == 1024.0


def test_keep_prunes_oldest(tmp_path):
    net, opt, _ = make()
    for s in (1, 2, 3, 4):
        checkpoint.save(tmp_path, net, opt, step=s, data_pos=s, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000004.ckpt", "step_000003.ckpt"]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_latest_is_detected_and_skipped(tmp_path, capsys, damage):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=1, data_pos=1)
    newest = checkpoint.save(tmp_path, net, opt, step=2, data_pos=2)
    b = bytearray(newest.read_bytes())
    if damage == "truncate":
        b = b[: len(b) // 2]
    else:
        b[len(b) // 2] ^= 0xFF
    newest.write_bytes(bytes(b))
    with pytest.raises(checkpoint.CorruptCheckpoint, match="step_000002.ckpt is corrupt"):
        checkpoint.read(newest)
    path, meta = checkpoint.latest_good(tmp_path)
    assert path.name == "step_000001.ckpt" and meta["step"] == 1
    assert "falling back to the previous checkpoint" in capsys.readouterr().err


def test_mismatched_model_is_refused_with_a_fix(tmp_path):
    net, opt, _ = make()
    p = checkpoint.save(tmp_path, net, opt, step=1, data_pos=1)
    other = nn.Dense(5, 3)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="resume with the config that wrote it"):
        checkpoint.load(p, other)


def test_bad_arguments(tmp_path):
    net, opt, _ = make()
    with pytest.raises(ValueError, match="step=-1"):
        checkpoint.save(tmp_path, net, opt, step=-1, data_pos=0)
    with pytest.raises(ValueError, match="keep=0"):
        checkpoint.save(tmp_path, net, opt, step=1, data_pos=0, keep=0)
    assert checkpoint.latest_good(tmp_path / "none") is None
