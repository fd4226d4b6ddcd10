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
