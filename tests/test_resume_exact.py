"""Exact resume across the warm-up and a changing dynamic loss scale (issue 14, item 4).

`report.resume_check` trains 2n steps straight and n + n with a checkpoint between, rebuilding the model
and optimizer from scratch. Everything must come back bitwise: losses, learning rates, the optimizer's
step counter (the lr position), the loss scale, every weight and moment, and the data position.
"""
from mshelpers.config import RunConfig
from mshelpers.report import resume_check


def test_resume_is_bitwise_across_warmup_and_scale_changes(tmp_path):
    cfg = RunConfig.preset("tiny").replace(mode="graph", warmup_steps=2, dynamic_loss_scale=True,
                                           loss_scale=2.0 ** 127)
    r = resume_check(cfg, 4, tmp_path)
    # the check must test something: the scale overflowed and halved before the checkpoint at step 4
    assert r["crossed_warmup"] and r["scale_changed_before_ckpt"]
    assert r["straight_overflow"][0] is True and r["straight_loss_scale"][:2] == [2.0 ** 126, 2.0 ** 125]
    assert r["loss_equal"] and r["straight_loss"][4:] == r["resumed_loss"][4:]   # finite after the overflows
    assert r["straight_lr"] == r["resumed_lr"]
    assert r["straight_loss_scale"] == r["resumed_loss_scale"]
    # the optimizer's step counter advances only on applied (non-overflowed) steps
    applied = 8 - sum(r["straight_overflow"])
    assert 0 < applied < 8 and r["lr_position"] == (applied, applied)
    assert r["data_pos_straight"] == r["data_pos_resumed"] == 8
    assert r["state_equal"] and r["bitwise"]
