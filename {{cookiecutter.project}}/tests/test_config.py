"""Config files, overrides and the errors a user gets for a wrong key or value."""

from pathlib import Path

import pytest

from {{ cookiecutter.package }} import config
from {{ cookiecutter.package }}.config import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load_and_declare_every_key(path):
    import yaml

    loaded = config.load(str(path))
    written = yaml.safe_load(path.read_text())
    declared = {f"{section}.{key}" for section, keys in written.items() for key in keys}
    assert declared == set(config.all_keys(loaded))  # every key spelled out, with its comment


def test_overrides_are_typed():
    cfg = config.load(None, ["train.total_steps=7", "train.warmup_steps=2", "train.base_learning_rate=1", "train.weight_decay=1e-4", "model.widths=[8, 16]",
                             "runtime.profile_steps=3, 5", "train.steps_per_execution=auto", "runtime.seed=3"])
    assert cfg.train.total_steps == 7 and cfg.train.warmup_steps == 2
    assert cfg.train.base_learning_rate == 1.0 and isinstance(cfg.train.base_learning_rate, float)
    assert cfg.train.weight_decay == 1e-4
    assert cfg.model.widths == [8, 16]
    assert cfg.profile_window() == (3, 5)
    assert cfg.train.steps_per_execution == "auto"


@pytest.mark.parametrize("override, message", [
    ("train.bach_size=4", "unknown config key 'train.bach_size' on the command line; did you mean"),
    ("trian.total_steps=4", "unknown config key 'trian.total_steps'"),
    ("train.total_steps=many", "train.total_steps must be of type int"),
    ("train.total_steps=true", "train.total_steps must be an integer"),
    ("train.steps_per_execution=fast", "train.steps_per_execution must be an integer or 'auto'"),
    ("runtime.strategy=quantum", "runtime.strategy must be one of auto, tpu, gpu, cpu"),
    ("runtime.mixed_precision=float16", "runtime.mixed_precision must be one of bfloat16, float32"),
    ("runtime.profile_steps=9,3", "runtime.profile_steps must be 'start,stop'"),
    ("train.warmup_steps=5000", "train.warmup_steps must be between 0 and train.total_steps-1"),
    ("data.eval_fraction=1.5", "data.eval_fraction must be between 0 and 1"),
    ("model.widths=[8, x]", "model.widths must be a list of integers"),
    ("total_steps", "is not of the form dotted.key=value"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        config.load(None, [override])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  global_batch_sise: 64\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'train.global_batch_sise' in .*bad.yaml; "
                                          r"did you mean 'train.global_batch_size'"):
        config.load(str(path))


def test_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file .*nope.yaml not found"):
        config.load(str(tmp_path / "nope.yaml"))


def test_dump_round_trips(tmp_path):
    cfg = config.load(None, ["train.total_steps=90", "model.widths=[4,8]"])
    path = tmp_path / "resolved.yaml"
    path.write_text(config.dump(cfg))
    assert config.load(str(path)) == cfg
