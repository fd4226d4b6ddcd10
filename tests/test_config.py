import pytest

from mshelpers.config import RunConfig, build_dir, repo_root


def test_mini_preset_dims():
    c = RunConfig.preset("mini")
    assert (c.hidden_size, c.num_layers, c.num_heads, c.ffn_hidden_size, c.vocab_size, c.seq_len, c.batch_size) \
        == (256, 4, 4, 688, 1024, 128, 8)
    c.validate()


def test_llama2_7b_preset_dims():
    c = RunConfig.preset("llama2-7b").validate()
    assert (c.hidden_size, c.num_layers, c.num_heads, c.ffn_hidden_size, c.vocab_size) == (4096, 32, 32, 11008, 32000)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'.*mini"):
        RunConfig.preset("gpt5")


def test_replace_and_unknown_field():
    c = RunConfig.preset("mini").replace(steps=3, mode="graph")
    assert (c.steps, c.mode) == (3, "graph")
    fresh = RunConfig.preset("mini")
    assert (fresh.steps, fresh.mode) != (3, "graph")      # replace() returned a copy; the preset is untouched
    assert c.replace() == c and c.replace(steps=4) != c
    with pytest.raises(ValueError, match="unknown field 'hidden'"):
        c.replace(hidden=3)


def test_yaml_round_trip(tmp_path):
    c = RunConfig.preset("mini").replace(lr=1e-4, recompute="full", dynamic_loss_scale=True)
    assert RunConfig.from_yaml(c.to_yaml()) == c
    c.to_yaml(tmp_path / "c.yaml")
    assert RunConfig.from_yaml(tmp_path / "c.yaml") == c


@pytest.mark.parametrize("changes, field, fix", [
    (dict(hidden_size=250), "hidden_size", "divisible by num_heads"),
    (dict(amp_level="O4"), "amp_level", "O0"),
    (dict(batch_size=0), "batch_size", "positive integer"),
    (dict(num_layers=-1), "num_layers", "positive integer"),
    (dict(batch_size=6, dp=4), "batch_size", "divisible by dp\\*micro_batches"),
    (dict(mode="eager"), "mode", "pynative"),
    (dict(recompute="some"), "recompute", "selective"),
    (dict(lr=0.0), "lr", "positive"),
    (dict(loss_scale=0.5), "loss_scale", ">= 1"),
    (dict(mp=3), "mp", "num_heads"),
    (dict(pp=3), "pp", "num_layers"),
    (dict(data="/no/such/file.txt"), "data", "existing text file"),
])
def test_validate_names_field_value_and_fix(changes, field, fix):
    c = RunConfig.preset("mini").replace(**changes)
    with pytest.raises(ValueError, match=fix) as e:
        c.validate()
    msg = str(e.value)
    assert msg.startswith(f"RunConfig.{field}=") and repr(getattr(c, field)) in msg
    assert msg.count("RunConfig.") == 1   # one error, one field


def test_derived_sizes():
    c = RunConfig.preset("mini").replace(grad_accum=2)
    assert c.head_dim == 64 and c.tokens_per_step == 8 * 128 * 2


def test_build_dir_is_under_repo(tmp_path, monkeypatch):
    assert (repo_root() / "pyproject.toml").exists()
    monkeypatch.setenv("MSHELPERS_BUILD", str(tmp_path))
    assert build_dir("runs") == tmp_path / "runs" and (tmp_path / "runs").is_dir()
