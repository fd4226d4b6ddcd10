import os
from pathlib import Path
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
    assert "step_000002.ckpt is corrupt or truncated" in capsys.readouterr().err


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


def test_a_flipped_byte_inside_a_weight_is_detected(tmp_path):
    """The file stays well-formed; only one float of the weight changes. The CRC must catch it."""
    net, opt, _ = make()
    net.weight.set_data(ms.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) + 0.5))
    p = checkpoint.save(tmp_path, net, opt, step=1, data_pos=1)
    b = bytearray(p.read_bytes())
    at = b.find(net.weight.asnumpy().tobytes())
    assert at > 0, "the weight's float32 bytes are stored verbatim"
    b[at + 5] ^= 0x01                      # low mantissa bit of the second float: 1.5 -> 1.50003
    p.write_bytes(bytes(b))
    damaged = ms.load_checkpoint(str(p), crc_check=False)["weight"].asnumpy()
    assert damaged[0, 1] != 1.5 and damaged[0, 0] == 0.5   # the flip is in the data and still parses
    with pytest.raises(checkpoint.CorruptCheckpoint, match="step_000001.ckpt is corrupt"):
        checkpoint.read(p)
    with pytest.raises(checkpoint.CorruptCheckpoint):
        checkpoint.load(p, net, opt)
    assert checkpoint.latest_good(tmp_path) is None


def _draw():
    """One draw from MindSpore's default generator: the (seed, offset) pair a random op consumes.

    On CPU no generator-driven random kernel is registered (mint.rand: "InplaceUniform unregistered"),
    so the pair that such an op would be handed is the draw; on Ascend/GPU it fixes their numbers.
    """
    from mindspore.common.generator import default_generator
    seed, offset = default_generator._step(ms.Tensor(4, ms.int64))   # noqa: SLF001
    return int(seed.asnumpy()), int(offset.asnumpy())


def test_rng_state_round_trip(tmp_path):
    net, opt, sc = make()
    ms.manual_seed(1234)
    first = _draw()
    p = checkpoint.save(tmp_path, net, opt, step=3, data_pos=3, loss_scaler=sc)
    second = _draw()
    assert second != first and second[0] == 1234          # the generator advances
    ms.manual_seed(99)                                    # a later run: other seed, other position
    _draw()
    checkpoint.load(p, net, opt, sc)
    third = _draw()
    assert third == second


def test_prune_keeps_the_newest_and_ignores_other_files(tmp_path):
    net, opt, _ = make()
    for s in (1, 2, 3, 10, 4):
        checkpoint.save(tmp_path, net, opt, step=s, data_pos=s)
    others = [tmp_path / ".tmp-1-step_000099.ckpt", tmp_path / "notes.txt", tmp_path / "step_7.ckpt"]
    for o in others:
        o.write_bytes(b"x")
    deleted = checkpoint.prune(tmp_path, 2)
    assert [d.name for d in deleted] == ["step_000003.ckpt", "step_000002.ckpt", "step_000001.ckpt"]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000010.ckpt", "step_000004.ckpt"]
    assert all(o.exists() for o in others)              # temp and foreign files are not pruned
    assert checkpoint.prune(tmp_path, 2) == [] and checkpoint.prune(tmp_path, 5) == []
    assert [d.name for d in checkpoint.prune(tmp_path, 1)] == ["step_000004.ckpt"]
    assert checkpoint.prune(tmp_path / "missing", 1) == []


def test_prune_never_deletes_the_newest_good_checkpoint_for_a_corrupt_one(tmp_path):
    net, opt, _ = make()
    for s in (1, 2, 3):
        checkpoint.save(tmp_path, net, opt, step=s, data_pos=s)
    newest = tmp_path / "step_000003.ckpt"
    newest.write_bytes(newest.read_bytes()[:100])
    deleted = checkpoint.prune(tmp_path, 1)
    assert [d.name for d in deleted] == ["step_000001.ckpt"]   # step 2 is the newest good one: kept
    assert checkpoint.latest_good(tmp_path)[0].name == "step_000002.ckpt"
    # a corrupt file older than a kept good one goes too. (This used to rename step 2 to step 5 to make it the
    # newest; since issue 26 a name that disagrees with its step is left alone, so step 5 is written for real.)
    checkpoint.save(tmp_path, net, opt, step=5, data_pos=5)
    checkpoint.save(tmp_path, net, opt, step=0, data_pos=0)
    (tmp_path / "step_000000.ckpt").write_bytes(b"broken")
    assert [d.name for d in checkpoint.prune(tmp_path, 1)] == ["step_000003.ckpt", "step_000002.ckpt",
                                                                "step_000000.ckpt"]


def test_prune_leaves_other_runs_alone(tmp_path):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=9, data_pos=9, run={"id": "old"})
    for s in (1, 2):
        checkpoint.save(tmp_path, net, opt, step=s, data_pos=s, run={"id": "new"}, keep=1)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step_000009.ckpt", "step_000002.ckpt"]
    path, meta = checkpoint.latest_good(tmp_path, run_id="new")
    assert path.name == "step_000002.ckpt" and meta["run"] == {"id": "new"}


def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    import mindspore as ms
    net, opt, _ = make()

    def full_disk(*a, **k):
        open(a[1], "wb").write(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ms, "save_checkpoint", full_disk)
    with pytest.raises(OSError, match="No space"):
        checkpoint.save(tmp_path, net, opt, step=1, data_pos=1)
    assert list(tmp_path.iterdir()) == []


def test_numpy_integer_steps_are_accepted(tmp_path):
    import numpy as np
    net, opt, _ = make()
    assert checkpoint.save(tmp_path, net, opt, step=np.int64(3), data_pos=np.int32(3)).name == "step_000003.ckpt"
    with pytest.raises(ValueError, match="step=2.5 is invalid"):
        checkpoint.save(tmp_path, net, opt, step=2.5, data_pos=1)


def test_a_prefix_mismatch_is_named_with_its_fix(tmp_path):
    from mindspore import nn

    class Wrap(nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = nn.Dense(4, 3)
    checkpoint.save(tmp_path, nn.Dense(4, 3), step=1, data_pos=1)
    with pytest.raises(checkpoint.CorruptCheckpoint, match="differ by the prefix 'net.'"):
        checkpoint.load(tmp_path / "step_000001.ckpt", Wrap())


def test_latest_good_returns_step_and_data_position(tmp_path):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=2, data_pos=5)
    path, meta = checkpoint.latest_good(tmp_path)
    assert path == tmp_path / "step_000002.ckpt" and meta == {"step": 2, "data_pos": 5}


def test_prune_tolerates_a_file_already_gone(tmp_path, monkeypatch):
    """Another process (a second rank, a cleanup job) may delete a file between listing and unlinking."""
    net, opt, _ = make()
    keep = checkpoint.save(tmp_path, net, opt, step=2, data_pos=2)
    gone = tmp_path / "step_000001.ckpt"
    monkeypatch.setattr(checkpoint, "list_checkpoints", lambda d: [keep, gone])
    assert checkpoint.prune(tmp_path, 1) == [gone] and keep.exists()


def test_a_name_that_disagrees_with_its_step_is_reported_and_left_alone(tmp_path, capsys):
    """Issue 26 F6: step_000010.ckpt renamed to step_000014.ckpt must not make --keep 1 prune the real newest
    (step 12): pruning and "newest" go by the step stored inside."""
    net, opt, _ = make()
    run = {"id": "r1"}
    checkpoint.save(tmp_path, net, opt, step=10, data_pos=10, run=run)
    (tmp_path / "step_000010.ckpt").rename(tmp_path / "step_000014.ckpt")
    checkpoint.save(tmp_path, net, opt, step=12, data_pos=12, run=run, keep=1)
    assert sorted(p.name for p in checkpoint.list_checkpoints(tmp_path)) == ["step_000012.ckpt", "step_000014.ckpt"]
    path, meta = checkpoint.latest_good(tmp_path, run_id="r1")
    assert path.name == "step_000012.ckpt" and meta["step"] == 12
    assert "step_000014.ckpt holds step 10, not 14; left alone" in capsys.readouterr().err
    assert [r["status"] for r in checkpoint.scan(tmp_path)] == ["misnamed", "good"]   # without a run id too


def test_another_runs_file_at_our_name_is_moved_aside_not_overwritten(tmp_path, capsys):
    """Issue 26 F7: a foreign checkpoint at the name we are about to write is kept under foreign/, and said."""
    net, opt, _ = make()
    theirs = checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": "theirs"})
    before = theirs.read_bytes()
    ours = checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": "ours"})
    assert checkpoint.read(ours)["meta.run.id"] == "ours"
    assert (tmp_path / "foreign" / "step_000006.ckpt").read_bytes() == before
    assert "belongs to run theirs; moved it to" in capsys.readouterr().err
    checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": "ours"})   # our own: replaced, no note
    assert "moved" not in capsys.readouterr().err and len(list((tmp_path / "foreign").iterdir())) == 1


def test_the_missing_key_hint_names_the_prefix_its_side_and_the_fix():
    # a net key longer than the checkpoint's: the prefix is on the net side
    assert checkpoint._nearest("net.weight", ["weight", "bias"]) == (
        "the checkpoint has 'weight': the names differ by the prefix 'net.' on the net side; fix: load into the cell "
        "the checkpoint was saved from, or rename keys ({k.removeprefix('net.'): v} or {'net.' + k: v}) before "
        "load_param_into_net")
    # the checkpoint's key is the longer one: the prefix is on the checkpoint side
    assert checkpoint._nearest("weight", ["bias", "body.weight"]).startswith(
        "the checkpoint has 'body.weight': the names differ by the prefix 'body.' on the checkpoint side; fix: ")
    # no prefix relation: the closest key, or only the fix
    assert checkpoint._nearest("layer.wq", ["layer.wk", "zzz"]) == (
        "nearest checkpoint key: 'layer.wk'; fix: resume with the config and model that wrote it")
    assert checkpoint._nearest("abc", ["xyz1234"]) == "fix: resume with the config and model that wrote it"
    assert checkpoint._nearest("abcd", ["abXY"]).startswith("nearest checkpoint key: 'abXY'")   # ratio 0.5: kept
    assert checkpoint._nearest("q", ["a.qq"]) == "fix: resume with the config and model that wrote it"   # 0.4 < 0.5


def test_more_foreign_files_at_the_same_name_are_kept_beside_the_first(tmp_path, capsys):
    net, opt, _ = make()
    kept = []
    for who in ("a", "b", "c"):
        kept.append(checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": who}).read_bytes())
    ours = checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": "ours"})
    assert checkpoint.read(ours)["meta.run.id"] == "ours"
    for name, data in zip(("step_000006.ckpt", "step_000006.1.ckpt", "step_000006.2.ckpt"), kept):
        assert (tmp_path / "foreign" / name).read_bytes() == data
    err = capsys.readouterr().err
    assert f"{tmp_path / 'step_000006.ckpt'} belongs to run c; moved it to {tmp_path / 'foreign' / 'step_000006.2.ckpt'} (kept) before writing ours" in err


def test_clean_temp_removes_only_leftover_temp_files(tmp_path):
    assert checkpoint.clean_temp(tmp_path / "missing") == []            # no folder: nothing to do, no error
    net, opt, _ = make()
    good = checkpoint.save(tmp_path, net, opt, step=2, data_pos=2)
    left = [tmp_path / f"{checkpoint.TMP_PREFIX}123-step_000004.ckpt", tmp_path / f"{checkpoint.TMP_PREFIX}9"]
    for p in left:
        p.write_bytes(b"half a write")
    (tmp_path / "notes.tmp-").write_text("not ours")                    # the prefix must lead the name
    assert sorted(checkpoint.clean_temp(tmp_path)) == sorted(left)
    assert not any(p.exists() for p in left) and good.exists() and (tmp_path / "notes.tmp-").exists()
    assert checkpoint.clean_temp(tmp_path) == []


def test_nonfinite_params_names_float_entries_with_nan_or_inf():
    params = {"w": np.array([1.0, np.nan], np.float32), "b": np.array([np.inf], np.float64),
              "ok": np.zeros(3, np.float32), "steps": np.array([2**31 - 1], np.int32),
              "meta.note": np.array([np.nan]), "name": "text", "p": ms.Parameter(ms.Tensor([1.0, -np.inf], ms.float32))}
    assert checkpoint.nonfinite_params(params) == ["w", "b", "p"]
    assert checkpoint.nonfinite_params({"ok": ms.Tensor([0.5], ms.float16)}) == []


class _Wrap(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = nn.Dense(4, 3)


class _Named(nn.Cell):
    """A cell whose parameters have the given names (and shape (1,))."""
    def __init__(self, *names):
        super().__init__()
        for i, n in enumerate(names):
            setattr(self, f"p{i}", ms.Parameter(ms.Tensor([1.0], ms.float32), name=n))


def test_load_is_strict_and_names_the_first_missing_key_with_its_own_hint(tmp_path):
    p = checkpoint.save(tmp_path, _Wrap(), step=1, data_pos=1)          # keys net.weight, net.bias
    with pytest.raises(checkpoint.CorruptCheckpoint) as e:               # a loose load would take them
        checkpoint.load(p, nn.Dense(4, 3))
    assert (f"checkpoint {p} lacks 2 parameters of Dense, e.g. 'weight'; the checkpoint has 'net.weight': the names "
            "differ by the prefix 'net.' on the checkpoint side") in str(e.value)


def test_the_checkpoints_own_entries_are_never_offered_as_a_parameter(tmp_path):
    net, opt, sc = make()
    p = checkpoint.save(tmp_path, net, opt, step=1, data_pos=1, loss_scaler=sc)  # has meta.step, loss_scaler.counter
    for name in ("step", "counter"):
        with pytest.raises(checkpoint.CorruptCheckpoint) as e:
            checkpoint.load(p, _Named(name))
        msg = str(e.value)
        assert f"lacks 1 parameters of _Named, e.g. {name!r}; " in msg and msg.endswith("fix: resume with the config "
                                                                                      "and model that wrote it")
        assert "meta." not in msg and "loss_scaler." not in msg        # not "the checkpoint has 'meta.step'"
    # a net parameter in the checkpoint's own namespaces is not asked for
    with pytest.raises(checkpoint.CorruptCheckpoint, match="lacks 1 parameters of _Named, e.g. 'x'; "):
        checkpoint.load(p, _Named("meta.extra", "loss_scaler.extra", "x"))


def test_ignored_entries_are_left_out_even_when_absent(tmp_path):
    def adam(n):
        net = nn.Dense(4, 3)
        return net, nn.AdamWeightDecay(net.trainable_params(), ms.Tensor(np.linspace(1e-3, 1e-4, n).astype(np.float32)))
    p = checkpoint.save(tmp_path, *adam(5), step=1, data_pos=1)           # a 5-step learning-rate table
    net, opt = adam(9)                                                     # the run extended to 9 steps
    with pytest.raises(checkpoint.CorruptCheckpoint) as e:
        checkpoint.load(p, net, opt)
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {p} does not fit this AdamWeightDecay: For 'load_param_into_net', learning_rate")
    detail = msg.split("AdamWeightDecay: ", 1)[1].rsplit("; fix: resume with the config that wrote it (same model)", 1)[0]
    assert len(detail) == 300                        # MindSpore's first line, cut to 300 characters
    want = checkpoint.read(p)["weight"].asnumpy()
    assert checkpoint.load(p, net, opt, ignore=("learning_rate", "not_in_the_file"))["step"] == 1
    np.testing.assert_array_equal(net.weight.asnumpy(), want)


def test_the_loss_scalers_counter_comes_back_and_a_static_scaler_takes_only_its_scale(tmp_path):
    net, opt, sc = make()
    sc.counter.set_data(ms.Tensor(17, sc.counter.dtype))
    p = checkpoint.save(tmp_path, net, opt, step=1, data_pos=1, loss_scaler=sc)
    sc.counter.set_data(ms.Tensor(0, sc.counter.dtype))
    checkpoint.load(p, net, opt, sc)
    assert int(sc.counter.asnumpy()) == 17
    static = amp.StaticLossScaler(8.0)                 # no counter attribute: nothing to restore into
    checkpoint.load(p, net, opt, static)
    assert float(static.scale_value.asnumpy()) == 1024.0


def test_prune_refuses_a_bad_keep_in_one_line(tmp_path):
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError) as e:
            checkpoint.prune(tmp_path, bad)
        assert str(e.value) == f"checkpoint.prune: keep={bad!r} is invalid; fix: keep at least 1 checkpoint"


def test_latest_good_skips_another_runs_and_only_checks_finiteness_when_asked(tmp_path, capsys):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=2, data_pos=2, run={"id": "ours"})
    net.weight.set_data(ms.Tensor(np.full((3, 4), np.nan, np.float32)))
    checkpoint.save(tmp_path, net, opt, step=4, data_pos=4, run={"id": "ours"})      # NaN weights
    checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": "theirs"})
    path, meta = checkpoint.latest_good(tmp_path, run_id="ours")               # finiteness not checked by default
    assert path.name == "step_000004.ckpt" and meta["run"] == {"id": "ours"}
    assert capsys.readouterr().err == (f"checkpoint {tmp_path / 'step_000006.ckpt'} belongs to run theirs, not ours; "
                                       "skipping it\n")
    path, meta = checkpoint.latest_good(tmp_path, run_id="ours", finite=True)
    assert path.name == "step_000002.ckpt" and meta["step"] == 2
    assert f"checkpoint {tmp_path / 'step_000004.ckpt'} holds non-finite values in 'weight'; skipping it" \
        in capsys.readouterr().err


def test_prune_never_deletes_another_runs_or_a_misnamed_file_even_when_older(tmp_path):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=1, data_pos=1, run={"id": "old"})         # another run's, oldest
    mis = checkpoint.save(tmp_path, net, opt, step=2, data_pos=2, run={"id": "new"})
    mis.rename(tmp_path / "step_000000.ckpt")                                          # holds step 2, named 0
    for s in (3, 4):
        checkpoint.save(tmp_path, net, opt, step=s, data_pos=s, run={"id": "new"})
    gone = checkpoint.prune(tmp_path, keep=1, run_id="new")
    assert [p.name for p in gone] == ["step_000003.ckpt"]
    assert sorted(p.name for p in tmp_path.glob("step_*.ckpt")) == ["step_000000.ckpt", "step_000001.ckpt",
                                                                    "step_000004.ckpt"]


def test_clean_temp_tolerates_a_file_another_cleaner_removed_first(tmp_path, monkeypatch):
    gone = tmp_path / f"{checkpoint.TMP_PREFIX}1-step_000002.ckpt"          # listed, then deleted by someone else
    monkeypatch.setattr(type(tmp_path), "glob", lambda self, pattern: iter([gone]))
    assert checkpoint.clean_temp(tmp_path) == [gone]


def test_scan_names_each_status_and_treats_a_file_without_a_run_as_foreign(tmp_path, capsys):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=1, data_pos=1)                       # no run id stored
    net.weight.set_data(ms.Tensor(np.full((3, 4), np.inf, np.float32)))
    checkpoint.save(tmp_path, net, opt, step=2, data_pos=2)                       # inf weights
    (tmp_path / "step_000003.ckpt").write_bytes(b"not a checkpoint")
    assert [r["status"] for r in checkpoint.scan(tmp_path)] == ["corrupt", "good", "good"]   # finite: off by default
    assert [r["status"] for r in checkpoint.scan(tmp_path, finite=True)] == ["corrupt", "nonfinite", "good"]
    assert [r["status"] for r in checkpoint.scan(tmp_path, run_id="mine")] == ["corrupt", "foreign", "foreign"]
    capsys.readouterr()
    assert checkpoint.latest_good(tmp_path, run_id="mine") is None
    err = capsys.readouterr().err
    assert f"checkpoint {tmp_path / 'step_000001.ckpt'} belongs to run None, not mine; skipping it" in err


def test_load_returns_the_path_it_read(tmp_path):
    net, opt, _ = make()
    p = checkpoint.save(tmp_path, net, opt, step=3, data_pos=5)
    assert checkpoint.load(str(p), net, opt) == {"step": 3, "data_pos": 5, "path": p}


class _Box:
    """A value that is not MindSpore's: it has .asnumpy() and no __int__, __float__ or __array__."""
    def __init__(self, v):
        self.v = v

    def asnumpy(self):
        return np.asarray(self.v)


def test_info_reads_asnumpy_values_and_plain_ones():
    assert checkpoint.info({"meta.step": _Box(7), "meta.data_pos": _Box(3), "meta.loss": _Box(2.5),
                            "meta.run.id": "r1", "meta.run.config_hash": "h", "w": _Box([1.0])}) == {
        "step": 7, "data_pos": 3, "loss": 2.5, "run": {"id": "r1", "config_hash": "h"}}
    assert checkpoint.info({"meta.step": 4, "meta.loss": 1.5}) == {"step": 4, "loss": 1.5}
    assert checkpoint.info({"meta.step": np.int64(4)}) == {"step": 4}


def test_nonfinite_params_reads_any_value_with_asnumpy():
    assert checkpoint.nonfinite_params({"w": _Box(np.array([1.0, np.nan], np.float32)), "ok": _Box(np.ones(2))}) == ["w"]


@pytest.mark.parametrize("v, want", [(0, 0), (5, 5), (np.int64(3), 3), (0.0, 0), (3.0, 3), (np.float64(2.0), 2)])
def test_steps_from_zero_and_integral_floats_are_accepted(v, want):
    assert checkpoint._as_step("save", "step", v) == want and type(checkpoint._as_step("save", "step", v)) is int


@pytest.mark.parametrize("field", ["step", "data_pos"])
@pytest.mark.parametrize("v", [True, False, -1, 2.5, -2.0, "3"])
def test_write_pending_refuses_a_bad_step_or_position_in_one_line(tmp_path, field, v):
    kw = {"step": 1, "data_pos": 1, field: v}
    with pytest.raises(ValueError) as e:
        checkpoint.write_pending(tmp_path, None, **kw)
    assert str(e.value) == f"checkpoint.save: {field}={v!r} is invalid; fix: pass a non-negative integer"
    assert not any(tmp_path.iterdir())


def test_a_missing_nested_folder_is_created_and_the_loss_is_kept_exactly(tmp_path):
    net, opt, _ = make()
    d = tmp_path / "a" / "b"
    final = checkpoint.commit(checkpoint.write_pending(d, net, opt, step=2, data_pos=9, loss=np.float32(1.1)))
    assert final == d / "step_000002.ckpt"
    assert checkpoint.info(checkpoint.read(final)) == {"step": 2, "data_pos": 9, "loss": float(np.float32(1.1))}


def test_commit_refuses_a_path_that_is_not_pending_in_one_line(tmp_path):
    with pytest.raises(ValueError) as e:
        checkpoint.commit(tmp_path / "step_000001.ckpt")
    assert str(e.value) == (f"checkpoint.commit: {tmp_path / 'step_000001.ckpt'} is not a pending checkpoint; "
                            "fix: pass write_pending()'s path")


def test_commit_without_a_run_id_replaces_whatever_is_at_the_name(tmp_path, capsys):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=4, data_pos=4, run={"id": "theirs"})
    final = checkpoint.commit(checkpoint.write_pending(tmp_path, net, opt, step=4, data_pos=8))
    assert checkpoint.info(checkpoint.read(final)) == {"step": 4, "data_pos": 8}
    assert not (tmp_path / "foreign").exists() and "moved" not in capsys.readouterr().err


def test_commit_replaces_a_damaged_file_and_moves_aside_a_run_less_or_misnamed_one(tmp_path, capsys):
    net, opt, _ = make()
    (tmp_path / "step_000004.ckpt").write_bytes(b"half a file")                     # damaged: ours replaces it
    final = checkpoint.commit(checkpoint.write_pending(tmp_path, net, opt, step=4, data_pos=4, run={"id": "me"}),
                              run_id="me")
    assert checkpoint.info(checkpoint.read(final))["run"] == {"id": "me"} and not (tmp_path / "foreign").exists()
    capsys.readouterr()
    # a file with no run id at our name: another run's, kept
    runless = checkpoint.save(tmp_path, net, opt, step=5, data_pos=5).read_bytes()
    checkpoint.save(tmp_path, net, opt, step=5, data_pos=5, run={"id": "me"})
    assert (tmp_path / "foreign" / "step_000005.ckpt").read_bytes() == runless
    assert f"{tmp_path / 'step_000005.ckpt'} belongs to run None; moved it to" in capsys.readouterr().err
    # our own run's file holding another step under this name: kept, and said why
    os.replace(checkpoint.save(tmp_path, net, opt, step=3, data_pos=3, run={"id": "me"}), tmp_path / "step_000006.ckpt")
    misnamed = (tmp_path / "step_000006.ckpt").read_bytes()
    checkpoint.save(tmp_path, net, opt, step=6, data_pos=6, run={"id": "me"})
    assert (tmp_path / "foreign" / "step_000006.ckpt").read_bytes() == misnamed
    assert checkpoint.info(checkpoint.read(tmp_path / "step_000006.ckpt"))["step"] == 6
    assert (f"{tmp_path / 'step_000006.ckpt'} holds step 3, not the step its name says; moved it to "
            f"{tmp_path / 'foreign' / 'step_000006.ckpt'} (kept) before writing ours") in capsys.readouterr().err


def test_read_names_what_is_wrong_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as e:
        checkpoint.read(tmp_path / "step_000001.ckpt")
    assert str(e.value) == f"checkpoint {tmp_path / 'step_000001.ckpt'} does not exist; fix: pass a file from list_checkpoints()"
    plain = tmp_path / "plain.ckpt"
    ms.save_checkpoint(nn.Dense(2, 2), str(plain))                                    # not written by checkpoint.save
    with pytest.raises(checkpoint.CorruptCheckpoint) as e:
        checkpoint.read(plain)
    assert str(e.value) == f"checkpoint {plain} has no meta.step entry: it was not written by checkpoint.save"
    for raised, shown in ((ValueError("bad crc\nsecond line"), "bad crc"), (RuntimeError("  "), "RuntimeError"),
                          (OSError(""), "OSError")):
        def fail(*a, _e=raised, **k):
            raise _e
        monkeypatch.setattr(ms, "load_checkpoint", fail)
        with pytest.raises(checkpoint.CorruptCheckpoint) as e:
            checkpoint.read(plain)
        assert str(e.value) == f"checkpoint {plain} is corrupt or truncated ({shown})"


@pytest.mark.parametrize("leaves", [(), (".ckpt",), (".tmp",), (".ckpt", ".tmp")])
def test_a_failed_write_raises_its_own_error_and_removes_whatever_it_left(tmp_path, monkeypatch, leaves):
    """MindSpore may fail before writing anything, or leave its scratch `.tmp` beside our temp name: either way the
    caller sees the write's own error (not a FileNotFoundError from the clean-up) and no file is left."""
    net, opt, _ = make()

    def fail(entries, path, **k):
        for suffix in leaves:
            open(Path(path).with_suffix(suffix), "wb").write(b"partial")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ms, "save_checkpoint", fail)
    with pytest.raises(OSError) as e:
        checkpoint.write_pending(tmp_path, net, opt, step=1, data_pos=1)
    assert e.value.errno == 28 and type(e.value) is OSError
    assert list(tmp_path.iterdir()) == []


# --- CheckpointManager: resume, commit and preemption of one training run (real checkpoints, real steps) ---
# Each test drives the manager as train.train does: vouch(loss) after every step, write() when due, finish() at
# the last step, preempted() when a stop signal fired. A "step" is a real Adam step of a Dense(4, 3) net.
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace

from mshelpers.metrics import MetricsCSV
from mshelpers.stability import SpikeGuard
from mshelpers.train_cli import StopSignal


class _Run:
    """A tiny real training run: net, optimizer, loss scaler, one PyNative train step."""

    def __init__(self, seed=0):
        ms.set_seed(seed)
        self.net, self.opt, self.sc = make()
        self.step_cell = nn.TrainOneStepCell(nn.WithLossCell(self.net, nn.MSELoss()), self.opt)
        self.x = ms.Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
        self.y = ms.Tensor(np.ones((2, 3), np.float32))

    def step(self):
        return float(self.step_cell(self.x, self.y).asnumpy())

    def state(self):
        return {p.name: p.asnumpy().copy() for p in self.opt.get_parameters() if p.name != "learning_rate"}


def _loop(mgr, run, first, last, data_pos=0):
    """train()'s protocol for steps first..last; returns the data position and {step: state after it}."""
    states = {}
    for step in range(first, last + 1):
        loss = run.step()
        data_pos += 1
        mgr.vouch(loss)
        states[step] = {**run.state(), "loss": loss}
        if mgr.due(step, last):
            mgr.write(step, data_pos, loss)
    mgr.finish()
    return data_pos, states


def _csv(path, steps):
    path.write_text("step,loss\n" + "".join(f"{s},{s / 10}\n" for s in steps))
    return MetricsCSV(path, ["step", "loss"])


def _names(d):
    return sorted(p.name for p in Path(d).iterdir())


def test_manager_writes_every_k_steps_keeps_the_newest_and_resumes_the_exact_state(tmp_path, capsys):
    run = _Run(seed=1)
    mgr = checkpoint.CheckpointManager(tmp_path / "ck", every=2, keep=2, run={"id": "r1"}).attach(run.net, run.opt, run.sc)
    data_pos, states = _loop(mgr, run, 1, 5)
    # due at 2, 4 and the last step 5; keep=2 pruned step 2 when step 5 was committed
    assert _names(tmp_path / "ck") == ["step_000004.ckpt", "step_000005.ckpt"] and data_pos == 5
    assert mgr.last == tmp_path / "ck" / "step_000005.ckpt" and mgr.pending is None
    # a new process: another init, the same run id; resume restores weights, Adam's moments and its step count
    again = _Run(seed=2)
    assert not np.array_equal(again.net.weight.asnumpy(), states[5]["weight"])
    # the log as a crash can leave it: a row of step 5 from an earlier attempt before the real one (whose loss the
    # checkpoint holds), and steps 6 and 7 that ran after the checkpoint
    lines = [f"{s},{states[s]['loss']}" for s in range(1, 5)] + ["5,9.5", f"5,{states[5]['loss']}", "6,0.6", "7,0.7"]
    (tmp_path / "metrics.csv").write_text("step,loss\n" + "".join(line + "\n" for line in lines))
    log = MetricsCSV(tmp_path / "metrics.csv", ["step", "loss"])
    m2 = checkpoint.CheckpointManager(tmp_path / "ck", every=2, keep=2, run={"id": "r1"})
    assert m2.check_resume(8) is False and [r["step"] for r in m2.good] == [5, 4]
    ready = []
    start, pos, rows = m2.attach(again.net, again.opt, again.sc).begin(True, 8, log, on_ready=lambda: ready.append(1))
    assert (start, pos, ready) == (6, 5, [1]) and [(r["step"], r["loss"]) for r in rows] == [
        (s, states[s]["loss"]) for s in range(1, 6)]
    assert (tmp_path / "metrics.csv").read_text() == "step,loss\n" + "".join(line + "\n" for line in lines[:4] + lines[5:6])
    got, _ = again.state(), states[5].pop("loss")
    assert got.keys() == states[5].keys()
    for k in got:
        np.testing.assert_array_equal(got[k], states[5][k], err_msg=k)
    assert m2.start == 6 and m2.last == tmp_path / "ck" / "step_000005.ckpt"
    assert capsys.readouterr().err.endswith(f"resumed from {tmp_path / 'ck' / 'step_000005.ckpt'} (step 5, data "
                                            "position 5); continuing at step 6 of 8; kept line 7 for step 5 (its "
                                            "loss matches the checkpoint's), dropped line 6\n")


@pytest.mark.parametrize("damage", ["truncate", "empty"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_and_is_kept(tmp_path, capsys, damage):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=2, keep=3).attach(run.net, run.opt, run.sc)
    _, states = _loop(mgr, run, 1, 4)
    newest = tmp_path / "step_000004.ckpt"
    newest.write_bytes(newest.read_bytes()[: len(newest.read_bytes()) // 2] if damage == "truncate" else b"")
    damaged = newest.read_bytes()
    again = _Run(seed=3)
    m2 = checkpoint.CheckpointManager(tmp_path, every=2, keep=3)
    assert m2.check_resume(10) is False
    start, pos, _ = m2.attach(again.net, again.opt, again.sc).begin(True, 10, _csv(tmp_path / "m.csv", [1, 2, 3]))
    assert (start, pos) == (3, 2)
    np.testing.assert_array_equal(again.net.weight.asnumpy(), states[2]["weight"])
    err = capsys.readouterr().err
    assert f"checkpoint {newest} is corrupt or truncated" in err and "; skipping it\n" in err
    assert newest.read_bytes() == damaged and (tmp_path / "step_000002.ckpt").exists()   # nothing lost


def test_all_checkpoints_damaged_fails_in_one_line_and_touches_nothing(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=1, keep=2).attach(run.net, run.opt)
    _loop(mgr, run, 1, 2)
    for p in tmp_path.iterdir():
        p.write_bytes(p.read_bytes()[:64])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(checkpoint.NothingToResume) as e:
        checkpoint.CheckpointManager(tmp_path, every=1, keep=2).check_resume(5)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"no checkpoint in {tmp_path} can be resumed (checkpoint ")
    assert "step_000002.ckpt is corrupt" in msg and "step_000001.ckpt is corrupt" in msg
    assert msg.endswith("; nothing was changed; fix: restore a checkpoint, or start a fresh run in another folder")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_only_another_runs_checkpoints_is_nothing_to_resume_and_a_finished_run_does_nothing(tmp_path, capsys):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=3, keep=2, run={"id": "theirs"}).attach(run.net, run.opt)
    _loop(mgr, run, 1, 3)
    with pytest.raises(checkpoint.NothingToResume, match=r"\(step_000003.ckpt belongs to run theirs\); nothing"):
        checkpoint.CheckpointManager(tmp_path, run={"id": "ours"}).check_resume(5)
    theirs = checkpoint.CheckpointManager(tmp_path, run={"id": "theirs"})
    with pytest.raises(ValueError) as e:
        theirs.check_resume(2)
    assert str(e.value) == ("steps=2 is fewer than the checkpoint's step 3 (step_000003.ckpt); "
                            "fix: pass steps >= 3")
    capsys.readouterr()
    assert theirs.check_resume(3) is True
    assert capsys.readouterr().err == (f"the run is complete: {tmp_path / 'step_000003.ckpt'} is step 3 of 3; "
                                       "nothing to do (pass a larger --steps to extend it)\n")
    assert checkpoint.CheckpointManager(tmp_path / "none").check_resume(3) is False      # nothing there yet


def test_resume_with_nothing_yet_starts_fresh_and_says_so(tmp_path, capsys):
    run = _Run()
    log = _csv(tmp_path / "metrics.csv", [1, 2])                     # a log without checkpoints: started over
    mgr = checkpoint.CheckpointManager(tmp_path / "ck", every=2).attach(run.net, run.opt)
    assert mgr.check_resume(4) is False
    order = []
    assert mgr.begin(True, 4, log, on_ready=lambda: order.append((tmp_path / "metrics.csv").read_text())) == (1, 0, [])
    assert order == ["step,loss\n1,0.1\n2,0.2\n"]                    # on_ready runs before the log is cut
    assert (tmp_path / "metrics.csv").read_text() == "step,loss\n"
    assert capsys.readouterr().err == f"resume: no checkpoint in {tmp_path / 'ck'} yet; starting at step 1\n"
    assert mgr.begin(False, 4, log) == (1, 0, []) and capsys.readouterr().err == ""


def test_commit_is_a_rename_of_a_pending_file_no_reader_can_see(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=1, keep=5).attach(run.net, run.opt, run.sc)
    loss = run.step()
    mgr.write(1, 1, loss)
    pending = mgr.pending
    assert pending.name.startswith(f".tmp-{os.getpid()}-step_000001") and _names(tmp_path) == [pending.name]
    assert checkpoint.list_checkpoints(tmp_path) == [] and checkpoint.latest_good(tmp_path) is None
    inode, data = os.stat(pending).st_ino, pending.read_bytes()
    mgr.vouch(run.step())                                             # the next loss is finite: committed
    final = tmp_path / "step_000001.ckpt"
    assert _names(tmp_path) == ["step_000001.ckpt"] and mgr.last == final and mgr.pending is None
    assert os.stat(final).st_ino == inode and final.read_bytes() == data   # renamed into place, not rewritten
    assert checkpoint.info(checkpoint.read(final)) == {"step": 1, "data_pos": 1, "loss": float(np.float32(loss))}


def test_a_nonfinite_next_loss_drops_the_pending_checkpoint_and_keeps_the_last_good(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=1, keep=5).attach(run.net, run.opt)
    mgr.write(1, 1, run.step())
    mgr.vouch(1.0)
    mgr.write(2, 2, run.step())
    mgr.vouch(float("nan"))
    assert _names(tmp_path) == ["step_000001.ckpt"] and mgr.pending is None and mgr.last.name == "step_000001.ckpt"
    mgr.write(3, 3, run.step())
    mgr.vouch(float("inf"))
    mgr.finish()                                                      # nothing pending: nothing committed
    mgr.drop()
    assert _names(tmp_path) == ["step_000001.ckpt"]
    mgr.write(4, 4, run.step())
    mgr.drop()                                                        # the run stopped: nobody vouched for it
    assert _names(tmp_path) == ["step_000001.ckpt"] and mgr.pending is None and mgr.pending_guard is None


def test_due_every_k_steps_and_at_the_last_and_never_when_off(tmp_path):
    mgr = checkpoint.CheckpointManager(tmp_path, every=3)
    assert [s for s in range(1, 11) if mgr.due(s, 10)] == [3, 6, 9, 10]
    assert not any(checkpoint.CheckpointManager(tmp_path).due(s, 10) for s in range(1, 11))
    assert mgr.due(3, 3) is True and mgr.due(2, 3) is False


def test_the_spike_guards_state_goes_beside_the_commit_as_it_was_at_the_write(tmp_path):
    run = _Run()
    cfg = SimpleNamespace(spike_window=5, spike_threshold=6.0)
    guard = SpikeGuard(cfg, run.net, run.opt, run.sc)
    mgr = checkpoint.CheckpointManager(tmp_path, every=1, keep=2).attach(run.net, run.opt, run.sc, guard)
    for _ in range(3):
        guard.is_spike(run.step(), 1.0)
    mgr.write(3, 3, 0.5)
    at_write = guard.state()
    guard.events.append({"step": 4, "skipped_data_pos": 3})          # after the write: not part of step 3
    mgr.vouch(0.5)
    assert (tmp_path / "step_000003.guard.json").read_text() == at_write
    fresh = _Run(seed=4)
    g2 = SpikeGuard(cfg, fresh.net, fresh.opt, fresh.sc)
    m2 = checkpoint.CheckpointManager(tmp_path, every=1, keep=2)
    m2.check_resume(5)
    m2.attach(fresh.net, fresh.opt, fresh.sc, g2).begin(True, 5, _csv(tmp_path / "m.csv", [1, 2, 3]))
    assert g2.state() == at_write and g2.events == []


def _stopped(signo):
    stop = StopSignal()
    stop.signo = signo                  # what its signal thread sets when the signal arrives
    return stop


def test_preempted_commits_the_vouched_pending_one_and_saves_the_step_it_stopped_after(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=4, keep=5, run={"id": "r"}).attach(run.net, run.opt, run.sc)
    losses = [run.step() for _ in range(4)]
    mgr.write(4, 4, losses[-1])
    loss5 = run.step()                                               # step 5's loss is finite, then SIGTERM
    want = run.state()
    err = mgr.preempted(5, 5, loss5, _stopped(signal.SIGTERM))
    assert isinstance(err, checkpoint.Preempted) and err.signo == signal.SIGTERM
    assert str(err) == (f"SIGTERM after step 5: saved {tmp_path / 'step_000005.ckpt'} (step 5); "
                        "fix: rerun with --resume to continue")
    assert _names(tmp_path) == ["step_000004.ckpt", "step_000005.ckpt"]
    assert checkpoint.info(checkpoint.read(tmp_path / "step_000005.ckpt")) == {
        "step": 5, "data_pos": 5, "loss": float(np.float32(loss5)), "run": {"id": "r"}}
    again = _Run(seed=5)
    m2 = checkpoint.CheckpointManager(tmp_path, run={"id": "r"})
    m2.check_resume(9)
    assert m2.attach(again.net, again.opt, again.sc).begin(True, 9, _csv(tmp_path / "m.csv", []))[:2] == (6, 5)
    for k, v in again.state().items():
        np.testing.assert_array_equal(v, want[k], err_msg=k)


def test_preempted_right_after_a_write_commits_that_one_without_writing_it_twice(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=2, keep=5).attach(run.net, run.opt)
    run.step()
    loss = run.step()
    mgr.write(2, 2, loss)
    os.utime(mgr.pending, ns=(10**18, 10**18))                       # a mark a second write would replace
    err = mgr.preempted(2, 2, loss, _stopped(signal.SIGINT))
    assert str(err).startswith(f"SIGINT after step 2: saved {tmp_path / 'step_000002.ckpt'} (step 2)")
    assert _names(tmp_path) == ["step_000002.ckpt"] and os.stat(tmp_path / "step_000002.ckpt").st_mtime_ns == 10**18


def test_preempted_before_any_step_or_with_nonfinite_weights_saves_nothing_new(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=0).attach(run.net, run.opt)
    err = mgr.preempted(0, 0, None, _stopped(signal.SIGTERM))         # stopped before step 1 ran
    assert str(err) == ("SIGTERM after step 0: no step completed in this process; newest checkpoint: none; "
                        "fix: rerun with --resume to continue")
    assert _names(tmp_path) == []
    first = mgr.save_now(1, 1, run.step())
    assert first == tmp_path / "step_000001.ckpt" and mgr.save_now(1, 1, 0.5) == first
    run.net.weight.set_data(ms.Tensor(np.full((3, 4), np.nan, np.float32)))
    assert mgr.nonfinite_weight() == "weight"
    mgr.write(2, 2, 0.5)                                             # a pending one with NaN weights: dropped too
    assert mgr.save_now(2, 2, 0.5) == first and mgr.pending is None
    assert _names(tmp_path) == ["step_000001.ckpt"]                  # never a checkpoint of NaN weights
    assert mgr.newest_finite() == f"{first} (step 1)"
    assert checkpoint.CheckpointManager(None).newest_finite() == "none written yet"
    assert checkpoint.CheckpointManager(None).attach(run.net, run.opt).save_now(3, 3, 0.5) is None
    resumed = checkpoint.CheckpointManager(tmp_path)
    resumed.check_resume(5)
    resumed.attach(run.net, run.opt).begin(True, 5, _csv(tmp_path / "m.csv", [1]))
    assert str(resumed.preempted(1, 1, None, _stopped(signal.SIGTERM))).startswith(
        f"SIGTERM after step 1: no step completed in this process; newest checkpoint: {first}; fix")


_SIGNAL_CHILD = textwrap.dedent("""
    import sys, time
    from mshelpers.train_cli import StopSignal
    stop = StopSignal().install()                 # before MindSpore, as the CLI does
    import mindspore as ms, numpy as np
    from mindspore import nn
    from mshelpers import checkpoint
    net = nn.Dense(4, 3)
    opt = nn.Adam(net.trainable_params())
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.zeros((2, 3), np.float32))
    mgr = checkpoint.CheckpointManager(sys.argv[1], every=0).attach(net, opt)
    for step in range(1, 2001):
        loss = float(cell(x, y).asnumpy())
        mgr.vouch(loss)
        print(step, flush=True)
        time.sleep(0.02)
        if stop.signo:
            err = mgr.preempted(step, step, loss, stop)
            print(err, file=sys.stderr, flush=True)
            sys.exit(128 + err.signo)
    sys.exit(3)
""")


def test_a_real_sigterm_mid_run_saves_the_last_completed_step(tmp_path):
    """The signal path end to end: StopSignal's thread takes the SIGTERM, the loop sees it after the step."""
    p = subprocess.Popen([sys.executable, "-c", _SIGNAL_CHILD, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if int(line) == 3:
                p.send_signal(signal.SIGTERM)
                break
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    last = int(out.split()[-1]) if out.split() else 3
    assert p.returncode == 128 + signal.SIGTERM, err
    name = f"step_{last:06d}.ckpt"
    assert err.splitlines()[-1] == (f"SIGTERM after step {last}: saved {tmp_path / name} (step {last}); "
                                    "fix: rerun with --resume to continue")
    assert _names(tmp_path) == [name] and checkpoint.info(checkpoint.read(tmp_path / name))["step"] == last


def test_two_writers_never_overwrite_each_other(tmp_path, capsys):
    """A second run writing into the same folder: its file at our name moves ours to foreign/ (kept, said), its
    prune leaves ours alone, and our resume skips its checkpoints. The run lock refuses a second holder at once."""
    a, b = _Run(seed=6), _Run(seed=7)
    ma = checkpoint.CheckpointManager(tmp_path, every=2, keep=1, run={"id": "A"}).attach(a.net, a.opt)
    mb = checkpoint.CheckpointManager(tmp_path, every=2, keep=1, run={"id": "B"}).attach(b.net, b.opt)
    _loop(ma, a, 1, 4)                                               # A: step 2, then step 4 (keep 1)
    ours = (tmp_path / "step_000004.ckpt").read_bytes()
    _loop(mb, b, 1, 4)                                                # B: its 2, then its 4 at A's name
    assert (tmp_path / "foreign" / "step_000004.ckpt").read_bytes() == ours
    assert f"{tmp_path / 'step_000004.ckpt'} belongs to run A; moved it to" in capsys.readouterr().err
    assert checkpoint.info(checkpoint.read(tmp_path / "step_000004.ckpt"))["run"] == {"id": "B"}
    with pytest.raises(checkpoint.NothingToResume, match="step_000004.ckpt belongs to run B"):
        checkpoint.CheckpointManager(tmp_path, run={"id": "A"}).check_resume(6)
    with checkpoint.run_lock(tmp_path / "run"):
        with pytest.raises(checkpoint.RunLocked, match=f"in use by another run \\(pid {os.getpid()}\\); fix"):
            with checkpoint.run_lock(tmp_path / "run"):
                pass
    with checkpoint.run_lock(tmp_path / "run"):                      # released when its holder let go
        pass


def test_bad_inputs_fail_in_one_line_before_anything_is_lost(tmp_path, capsys):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=1, keep=2, run={"id": "r"}).attach(run.net, run.opt)
    _loop(mgr, run, 1, 1)
    for field, kw in (("step", {"step": -1, "data_pos": 1}), ("data_pos", {"step": 2, "data_pos": 1.5})):
        with pytest.raises(ValueError) as e:
            mgr.write(loss=0.5, **kw)
        assert str(e.value) == f"checkpoint.save: {field}={kw[field]!r} is invalid; fix: pass a non-negative integer"
    assert _names(tmp_path) == ["step_000001.ckpt"] and mgr.pending is None
    # another model size: refused in one line, before on_ready, with the metrics log and the checkpoint untouched
    log = _csv(tmp_path / "m.csv", [1, 2])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    other = nn.Dense(5, 3)
    m2 = checkpoint.CheckpointManager(tmp_path, every=1, keep=2, run={"id": "r"})
    m2.check_resume(3)
    ready = []
    with pytest.raises(checkpoint.CorruptCheckpoint) as e:
        m2.attach(other, nn.Adam(other.trainable_params())).begin(True, 3, log, on_ready=lambda: ready.append(1))
    assert "\n" not in str(e.value) and str(e.value).endswith("; fix: resume with the config that wrote it (same model)")
    assert ready == [] and {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("kw", [{"keep": 0}, {"keep": -1}, {"keep": 2.0}, {"keep": True}, {"every": -1},
                                {"every": "5"}])
def test_manager_refuses_a_bad_keep_or_every_before_anything_is_written(kw, tmp_path):
    with pytest.raises(ValueError, match=f"CheckpointManager: {next(iter(kw))}=.*fix"):
        checkpoint.CheckpointManager(tmp_path, **kw)
    assert list(tmp_path.iterdir()) == []


def test_a_stop_with_non_finite_weights_names_the_older_checkpoint_it_kept(tmp_path):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path).attach(run.net, run.opt)
    mgr.check_resume(5)
    mgr.begin(False, 5, _csv(tmp_path / "m.csv", []))
    first = mgr.save_now(1, 1, run.step())
    run.net.weight.set_data(ms.Tensor(np.full((3, 4), np.nan, np.float32)))
    err = str(mgr.preempted(2, 2, 0.5, _stopped(signal.SIGTERM)))
    assert err.startswith(f"SIGTERM after step 2: step 2 was not saved (non-finite weights); newest checkpoint: "
                          f"{first} (step 1); fix"), err


def test_move_run_aside_moves_every_file_and_never_reuses_a_folder(tmp_path, monkeypatch):
    # --overwrite's move: nothing deleted, each earlier run in a folder of its own, even within one second
    import time
    monkeypatch.setattr(time, "strftime", lambda fmt: "20261205-080000" if fmt == "%Y%m%d-%H%M%S" else fmt)
    out = tmp_path / "run"
    out.mkdir()
    dests = []
    for k in range(3):
        files = [out / "metrics.csv", out / f"step_{k:06d}.ckpt"]
        for i, f in enumerate(files):
            f.write_text(f"run {k} file {i}")
        dests.append(checkpoint.move_run_aside(out, files))
        assert not any(f.exists() for f in files)
    assert [d.relative_to(out).as_posix() for d in dests] == [
        "previous/20261205-080000", "previous/20261205-080000.1", "previous/20261205-080000.2"]
    for k, d in enumerate(dests):
        assert sorted(p.name for p in d.iterdir()) == ["metrics.csv", f"step_{k:06d}.ckpt"]
        assert (d / "metrics.csv").read_text() == f"run {k} file 0"
        assert (d / f"step_{k:06d}.ckpt").read_text() == f"run {k} file 1"


def test_the_manager_saves_the_whole_model_and_the_loss_scale_not_only_what_the_optimizer_holds(tmp_path):
    # a frozen parameter (no gradient, so not the optimizer's) and the loss scale must both be in the checkpoint
    run = _Run()
    frozen = ms.Parameter(ms.Tensor(np.full((2,), 7.0, np.float32)), name="frozen_scale", requires_grad=False)
    run.net.frozen_scale = frozen
    run.sc.scale_value.set_data(ms.Tensor(512.0, ms.float32))
    mgr = checkpoint.CheckpointManager(tmp_path, every=1).attach(run.net, run.opt, run.sc)
    mgr.write(1, 1, run.step())
    mgr.finish()
    saved = checkpoint.read(tmp_path / "step_000001.ckpt")
    np.testing.assert_array_equal(saved["frozen_scale"].asnumpy(), [7.0, 7.0])
    assert float(saved["loss_scaler.scale_value"].asnumpy()) == 512.0


def test_a_run_prunes_only_its_own_checkpoints_and_names_only_its_own_newest(tmp_path):
    a, b = _Run(seed=6), _Run(seed=7)
    _loop(checkpoint.CheckpointManager(tmp_path, every=2, keep=1, run={"id": "A"}).attach(a.net, a.opt), a, 1, 4)
    mb = checkpoint.CheckpointManager(tmp_path, every=2, keep=1, run={"id": "B"}).attach(b.net, b.opt)
    _loop(mb, b, 1, 2)
    # B's keep=1 counts B's checkpoints only: A's newer step 4 is not B's to count, nor to delete
    assert _names(tmp_path) == ["step_000002.ckpt", "step_000004.ckpt"]
    assert mb.newest_finite() == f"{tmp_path / 'step_000002.ckpt'} (step 2)"      # not A's newer step 4
    # B's step 3, written with NaN weights: the newest finite one is still step 2
    b.net.weight.set_data(ms.Tensor(np.full((3, 4), np.nan, np.float32)))
    checkpoint.save(tmp_path, b.net, b.opt, step=3, data_pos=3, run={"id": "B"})
    assert mb.newest_finite() == f"{tmp_path / 'step_000002.ckpt'} (step 2)"


def test_check_resume_names_every_checkpoint_it_cannot_use_in_one_line(tmp_path):
    net, opt, _ = make()
    checkpoint.save(tmp_path, net, opt, step=1, data_pos=1)                      # no run id at all
    checkpoint.save(tmp_path, net, opt, step=2, data_pos=2, run={"id": "theirs"})
    with pytest.raises(checkpoint.NothingToResume) as e:
        checkpoint.CheckpointManager(tmp_path, run={"id": "ours"}).check_resume(5)
    assert str(e.value) == (f"no checkpoint in {tmp_path} can be resumed (step_000002.ckpt belongs to run theirs; "
                            "step_000001.ckpt belongs to run None); nothing was changed; fix: restore a checkpoint, "
                            "or start a fresh run in another folder")


def test_resume_says_which_checkpoints_it_passed_over_and_why(tmp_path, capsys):
    run = _Run()
    mgr = checkpoint.CheckpointManager(tmp_path, every=2, keep=5, run={"id": "A"}).attach(run.net, run.opt)
    _loop(mgr, run, 1, 4)                                              # A: steps 2 and 4
    checkpoint.save(tmp_path, run.net, run.opt, step=6, data_pos=6, run={"id": "B"})       # newer, another run's
    (tmp_path / "step_000003.ckpt").write_bytes((tmp_path / "step_000002.ckpt").read_bytes())   # older, misnamed
    capsys.readouterr()
    m2 = checkpoint.CheckpointManager(tmp_path, every=2, keep=5, run={"id": "A"})
    m2.check_resume(8)
    start, _, _ = m2.attach(run.net, run.opt).begin(True, 8, _csv(tmp_path / "m.csv", [1, 2, 3, 4]))
    err = capsys.readouterr().err
    assert start == 5
    assert f"checkpoint {tmp_path / 'step_000006.ckpt'} belongs to run B; skipping it\n" in err
    assert (f"checkpoint {tmp_path / 'step_000003.ckpt'} holds step 2, not 3; left alone (rename it to match, or "
            "remove it); skipping it\n") in err


def test_a_stop_right_after_resuming_saves_or_explains_the_first_step_of_this_process(tmp_path):
    run = _Run()
    checkpoint.save(tmp_path, run.net, run.opt, step=1, data_pos=1)
    mgr = checkpoint.CheckpointManager(tmp_path, every=0)
    mgr.check_resume(5)
    assert mgr.attach(run.net, run.opt).begin(True, 5, _csv(tmp_path / "m.csv", [1]))[0] == 2
    err = str(mgr.preempted(2, 2, run.step(), _stopped(signal.SIGTERM)))             # step 2 = self.start
    assert err.startswith(f"SIGTERM after step 2: saved {tmp_path / 'step_000002.ckpt'} (step 2); fix"), err
    m3 = checkpoint.CheckpointManager(tmp_path, every=0)
    m3.check_resume(5)
    assert m3.attach(run.net, run.opt).begin(True, 5, _csv(tmp_path / "m.csv", [1, 2]))[0] == 3
    run.net.weight.set_data(ms.Tensor(np.full((3, 4), np.nan, np.float32)))
    err = str(m3.preempted(3, 3, 0.5, _stopped(signal.SIGTERM)))                    # step 3 = m3.start
    assert err.startswith(f"SIGTERM after step 3: step 3 was not saved (non-finite weights); newest checkpoint: "
                          f"{tmp_path / 'step_000002.ckpt'} (step 2); fix"), err


def test_checkpoint_counts_start_at_zero():
    # "a non-negative integer": step 0 and data position 0 are valid (a save before the first step)
    assert checkpoint._as_step("save", "step", 0) == 0 and checkpoint._as_step("save", "data_pos", np.int64(0)) == 0


def test_run_lock_makes_its_folder_names_its_holder_and_refuses_a_file(tmp_path):
    import fcntl
    with checkpoint.run_lock(tmp_path / "a" / "b") as lock:                  # parents made
        assert (tmp_path / "a" / "b" / ".lock").read_text() == f"{os.getpid()}\n" and lock.folder == tmp_path / "a" / "b"
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError) as e:
        with checkpoint.run_lock(tmp_path / "f"):
            pass
    assert str(e.value) == f"--out {tmp_path / 'f'} is a file, not a folder; fix: pass a folder path"
    # a holder that has not written its pid yet
    (tmp_path / "c").mkdir()
    with open(tmp_path / "c" / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(checkpoint.RunLocked) as e:
            with checkpoint.run_lock(tmp_path / "c"):
                pass
    assert str(e.value) == (f"{tmp_path / 'c'} is in use by another run (pid unknown); fix: wait for it to finish, "
                            "or pass another --out")


def test_move_aside_never_overwrites_an_earlier_foreign_file(tmp_path, capsys):
    for k in range(3):
        (tmp_path / "step_000004.ckpt").write_text(f"theirs {k}")
        checkpoint._move_aside(tmp_path / "step_000004.ckpt", "belongs to run X")
    assert sorted(p.name for p in (tmp_path / "foreign").iterdir()) == [
        "step_000004.1.ckpt", "step_000004.2.ckpt", "step_000004.ckpt"]
    assert [(tmp_path / "foreign" / n).read_text() for n in ("step_000004.ckpt", "step_000004.1.ckpt",
                                                             "step_000004.2.ckpt")] == ["theirs 0", "theirs 1", "theirs 2"]
