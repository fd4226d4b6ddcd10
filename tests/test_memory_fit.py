"""mshelpers.memory_fit: `calibrate` fits measured peaks to the estimate's model states and activations."""
from __future__ import annotations

import pytest

from _checks import module_doctests
from mshelpers import memory_fit
from mshelpers.memory_fit import calibrate


def test_calibrate_exact_fits_and_every_refusal():
    def es(acts, buf=None):
        out = []
        for a in acts:
            e = {"activations": a, "params": 10, "grads": 10, "optimizer_states": 20}
            if buf is not None:
                e["grad_accum_buffer"] = buf
            out.append(e)
        return out
    acts = (100, 200, 400)
    # an accumulation buffer is counted in grads (estimate's grad_accum_buffer says how much of them): not twice
    assert calibrate(es(acts, 50), [40 + 100 + 2 * a for a in acts]) == \
        {"activation_scale": 2.0, "overhead_bytes": 100.0}
    assert calibrate(es(acts), [40 + 100 + 2 * a for a in acts]) == {"activation_scale": 2.0, "overhead_bytes": 100.0}
    r = calibrate(es(acts), [40 + 100.4 + a / 3 for a in acts])
    assert r == {"activation_scale": 0.3333, "overhead_bytes": 100.0}             # 4 digits; whole bytes
    assert calibrate(es(acts), [40 + 0.5 * a for a in acts])["activation_scale"] == 0.5      # below 1 is valid
    assert calibrate(es(acts), [40 - 30 + 2 * a for a in acts])["overhead_bytes"] == 0.0    # a negative intercept
    assert calibrate(es(acts[:1]), [40 + 7 + 3 * 100], overhead_bytes=7) == {"activation_scale": 3.0,
                                                                             "overhead_bytes": 7}
    assert calibrate(es(acts[:1]), [40 + 100 / 3], overhead_bytes=0)["activation_scale"] == 0.3333
    assert calibrate(es(acts[:1]), [40 + 0.5 + 50], overhead_bytes=0.5)["activation_scale"] == 0.5

    def msg(*a, **kw):
        with pytest.raises(ValueError) as err:
            calibrate(*a, **kw)
        return str(err.value)
    assert msg(es(acts[:1]), [1.0]) == ("calibrate: got 1 estimates and 1 measurements; fix: pass two equally long "
                                        "lists with at least 2 run(s) of different sizes, or pass overhead_bytes")
    assert msg([], [], overhead_bytes=0) == ("calibrate: got 0 estimates and 0 measurements; fix: pass two equally "
                                             "long lists with at least 1 run(s)")
    for bad in (-1, True, "5", None.__class__):
        assert msg(es(acts[:1]), [500.0], overhead_bytes=bad) == \
            f"calibrate: overhead_bytes={bad!r} is invalid; fix: pass a number >= 0"
    assert msg(es(acts[:1]), [40 + 7], overhead_bytes=7) == (
        "calibrate: the runs sit below overhead_bytes=7; "
        "fix: pass the overhead fitted on the same kind of runs (same mode and device)")
    assert msg(es((100, 100)), [500.0, 600.0]) == (
        "calibrate: all runs have the same activation estimate; "
        "fix: measure at least two different batch sizes or sequence lengths")
    assert msg(es(acts), [140.0, 140.0, 140.0]) == (
        "calibrate: measured peaks do not grow with the activations (slope=0); "
        "fix: measure over a wider range of batch sizes, each in a fresh process")


def test_doctests():
    tries, failures = module_doctests(memory_fit)
    assert tries >= 2 and failures == 0
