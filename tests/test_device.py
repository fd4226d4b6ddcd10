import pytest

from mshelpers import device


def test_detect_returns_a_known_device():
    assert device.detect() in device.DEVICES


def test_forced_device_and_bad_value(monkeypatch):
    monkeypatch.setenv("MSHELPERS_DEVICE", "CPU")
    assert device.detect() == "CPU"
    monkeypatch.setenv("MSHELPERS_DEVICE", "TPU")
    with pytest.raises(ValueError, match="MSHELPERS_DEVICE='TPU'.*Ascend"):
        device.detect()


def test_require_ascend_on_cpu_gives_a_reason(monkeypatch):
    monkeypatch.setenv("MSHELPERS_DEVICE", "CPU")
    assert device.require("CPU") == "CPU"
    with pytest.raises(device.DeviceUnavailable, match="needs Ascend.*runs on CPU"):
        device.require("Ascend")
    with pytest.raises(ValueError, match="device='NPU' is unknown"):
        device.require("NPU")


def test_setup_sets_mode_and_rejects_bad_mode():
    import mindspore as ms
    with pytest.raises(ValueError, match="mode='eager'.*'graph' or 'pynative'"):
        device.setup(mode="eager")
    assert device.setup(mode="pynative", seed=1) == device.detect()
    assert device.mode_of() == "pynative"
    device.setup(mode="graph", seed=1)
    assert ms.get_context("mode") == ms.GRAPH_MODE and device.mode_of() == "graph"
