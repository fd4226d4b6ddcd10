"""Pick the device and execution mode once, with the current MindSpore APIs.

Example:
    >>> from mshelpers import device
    >>> device.detect()            # "Ascend", "GPU" or "CPU"
    'CPU'
    >>> device.setup(mode="graph", seed=0)
    'CPU'
    >>> try:
    ...     device.require("Ascend")
    ... except device.DeviceUnavailable as e:
    ...     print("skipped:", e)
    skipped: this cell needs Ascend, but this machine runs on CPU: MindSpore's Ascend plugin found no usable ...

Ascend-only notebook cells call `require("Ascend")`, catch `DeviceUnavailable`
and print its reason; the CPU path next to them does the real work.
"""
from __future__ import annotations

import contextlib
import io
import os
from typing import Any

DEVICES = ("Ascend", "GPU", "CPU")
_MODES = {"graph": 0, "pynative": 1}   # ms.GRAPH_MODE == 0, ms.PYNATIVE_MODE == 1


class DeviceUnavailable(RuntimeError):
    """Raised by `require` when this machine lacks the device a cell needs.
    Taught in notebooks/00_environment.ipynb."""


def _available(target: str) -> bool:
    import logging
    import mindspore as ms
    # is_available logs the plugin loader's errors ("libmindspore_ops_ascend.so failed") through a
    # handler bound to the real stderr, so redirecting sys.stderr is not enough: mute logging for the call.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return bool(ms.hal.is_available(target))
    except Exception:  # noqa: BLE001 - a missing plugin means "not available"
        return False
    finally:
        logging.disable(previous)


def detect() -> str:
    """The best device MindSpore can use here: "Ascend", then "GPU", else "CPU".

    `MSHELPERS_DEVICE=CPU` forces a device (useful to run the CPU path on an Ascend host).
    Taught in: no notebook; model.py calls it.
    """
    forced = os.environ.get("MSHELPERS_DEVICE")
    if forced:
        if forced not in DEVICES:
            raise ValueError(f"MSHELPERS_DEVICE={forced!r} is invalid; fix: use one of {DEVICES}")
        return forced
    for target in ("Ascend", "GPU"):
        if _available(target):
            return target
    return "CPU"


def require(device: str) -> str:
    """Return `device` if this machine has it, else raise DeviceUnavailable with a readable reason.
    Taught in notebooks/00_environment.ipynb."""
    if device not in DEVICES:
        raise ValueError(f"require: device={device!r} is unknown; fix: use one of {DEVICES}")
    have = detect()
    if device == have or device == "CPU":
        return device
    raise DeviceUnavailable(
        f"this cell needs {device}, but this machine runs on {have}: MindSpore's "
        f"{device} plugin found no usable {device} device (mindspore.hal.is_available({device!r}) is False)")


def setup(mode: str = "graph", device: str | None = None, seed: int | None = 0,
          device_id: int | None = None, **context: Any) -> str:
    """Set device, execution mode and seed; return the device used.

    mode: "graph" (whole-graph compile, GRAPH_MODE) or "pynative" (op by op).
    device: None picks `detect()`. Extra keywords go to `ms.set_context`
    (e.g. `jit_config={"jit_level": "O1"}`).
    Taught in notebooks/00_environment.ipynb.
    """
    if mode not in _MODES:
        raise ValueError(f"setup: mode={mode!r} is invalid; fix: use 'graph' or 'pynative'")
    if device is not None and device not in DEVICES:
        raise ValueError(f"setup: device={device!r} is invalid; fix: use one of {DEVICES} or None")
    import mindspore as ms
    device = device or detect()
    if device != "CPU":
        require(device)
    try:
        ms.set_device(device, device_id) if device_id is not None else ms.set_device(device)
    except RuntimeError as e:
        # The device is fixed at the first op of a process; setting it again to the same one is harmless.
        if "set" not in str(e).lower():
            raise
    ms.set_context(mode=_MODES[mode], **context)
    if seed is not None:
        ms.set_seed(seed)
    return device


def mode_of() -> str:
    """The current execution mode as "graph" or "pynative".
    Taught with the rest of device.py in notebooks/00_environment.ipynb."""
    import mindspore as ms
    return "graph" if ms.get_context("mode") == 0 else "pynative"
