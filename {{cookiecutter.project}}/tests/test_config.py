"""Config files, overrides and the errors a user gets for a wrong key or value."""

from pathlib import Path

import pytest

from conftest import selected
from {{ cookiecutter.package }}.core import config
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core.config import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
# The project's task's configs, and those of every task added later (configs/<task>/).
CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_shipped_configs_load_and_declare_every_key(path):
    import yaml

    written = yaml.safe_load(path.read_text())
    task_name = written.pop("task")
    assert task_name == (tasks.DEFAULT if path.parent == CONFIG_DIR else path.parent.name)
    with selected(task_name):
        loaded = config.load(str(path))
        declared = {f"{section}.{key}" for section, keys in written.items() for key in keys}
        assert declared == set(config.all_keys(loaded))  # every key spelled out, with its comment


def test_a_config_of_an_unknown_task_is_one_line(tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text("task: speech_recognition\ntrain:\n  total_steps: 10\n")
    with pytest.raises(ConfigError) as raised:
        config.load(str(path))
    message = str(raised.value)
    assert message.startswith(f"task 'speech_recognition' in {path} is not a task of this project")
    assert f"the tasks here are {', '.join(tasks.available())}" in message and "\n" not in message
    assert tasks.current().name == tasks.DEFAULT  # nothing was selected


def test_overrides_are_typed():
    cfg = config.load(
        None,
        [
            "train.total_steps=7",
            "train.warmup_steps=2",
            "train.base_learning_rate=1",
            "train.weight_decay=1e-4",
            "runtime.profile_steps=3, 5",
            "train.steps_per_execution=auto",
            "runtime.seed=3",
        ],
    )
    assert cfg.train.total_steps == 7 and cfg.train.warmup_steps == 2
    assert cfg.train.base_learning_rate == 1.0 and isinstance(cfg.train.base_learning_rate, float)
    assert cfg.train.weight_decay == 1e-4
    assert cfg.profile_window() == (3, 5)
    assert cfg.train.steps_per_execution == "auto"


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.bach_size=4", "unknown config key 'train.bach_size' on the command line; did you mean"),
        ("trian.total_steps=4", "unknown config key 'trian.total_steps'"),
        ("train.total_steps=many", "train.total_steps must be an integer, got 'many'"),
        ("train.total_steps=true", "train.total_steps must be an integer"),
        ("train.steps_per_execution=fast", "train.steps_per_execution must be an integer or 'auto'"),
        ("runtime.strategy=quantum", "runtime.strategy must be one of auto, tpu, gpu, cpu"),
        ("runtime.mixed_precision=float16", "runtime.mixed_precision must be one of auto, bfloat16, float32"),
        ("runtime.profile_steps=9,3", "runtime.profile_steps must be 'start,stop'"),
        ("train.warmup_steps=-1", "train.warmup_steps must be 0 or more"),
        ("train.optimizer=adam", "train.optimizer must be 'sgd' or 'adamw'"),
        ("data.eval_fraction=1.5", "data.eval_fraction must be between 0 and 1"),
        ("total_steps", "is not of the form dotted.key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        config.load(None, [override])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  global_batch_sise: 64\n")
    with pytest.raises(
        ConfigError,
        match=r"unknown config key 'train.global_batch_sise' in .*bad.yaml; "
        r"did you mean 'train.global_batch_size'",
    ):
        config.load(str(path))


def test_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file .*nope.yaml not found"):
        config.load(str(tmp_path / "nope.yaml"))


def test_dump_round_trips(tmp_path):
    cfg = config.load(None, ["train.total_steps=90", "train.optimizer=adamw"])
    path = tmp_path / "resolved.yaml"
    path.write_text(config.dump(cfg))
    assert config.load(str(path)) == cfg


def test_a_warm_up_longer_than_the_run_is_clamped_with_a_note(caplog):
    """A smoke run (train.total_steps=10) keeps the default warm-up from failing it."""
    cfg = config.load(None, ["train.total_steps=10", "train.warmup_steps=40"])
    assert cfg.train.warmup_steps == 1
    assert "warming up for 1 steps (a tenth of the run)" in caplog.text
    assert config.load(None, ["train.total_steps=100", "train.warmup_steps=40"]).train.warmup_steps == 40


def test_the_task_sections_are_typed_and_documented():
    """The task's data, model, objective and predict keys go through the same type-hint-driven conversion."""
    import dataclasses
    import inspect
    import typing

    cfg = config.load(None)
    for section in (cfg.data, cfg.model, cfg.objective, cfg.predict):
        hints = typing.get_type_hints(type(section))
        source = "".join(inspect.getsource(cls) for cls in type(section).__mro__ if dataclasses.is_dataclass(cls))
        for field in dataclasses.fields(section):
            assert field.name in hints
            documented = source.split(f"    {field.name}:", 1)[1].split("\n", 2)[1].strip()
            assert documented.startswith('"""'), f"{field.name} has no docstring"
    key = next(
        f"model.{f.name}"
        for f in dataclasses.fields(cfg.model)
        if typing.get_type_hints(type(cfg.model))[f.name] is int
    )
    with pytest.raises(ConfigError, match=f"{key} must be an integer, got 'wide'"):
        config.load(None, [f"{key}=wide"])


def test_the_objective_section_reaches_the_loss_and_metrics_and_is_refused_when_unknown(tmp_path, monkeypatch):
    """`objective:` is the task's like `model:`: its keys typed and written to config.yaml, an
    unknown one refused in one line, and the values handed to `loss`, `metrics` and the export's
    `serving_signature` (with the manifest)."""
    import dataclasses

    from {{ cookiecutter.package }}.core import model, run_dir

    cfg = config.load(None)
    keys = [f"objective.{field.name}" for field in dataclasses.fields(cfg.objective)]
    assert set(keys) <= set(config.all_keys(cfg))
    with pytest.raises(
        ConfigError, match=r"^unknown config key 'objective.temperature' on the command line; "
    ) as raised:
        config.load(None, ["objective.temperature=0.07"])
    assert "\n" not in str(raised.value)
    path = tmp_path / "config.yaml"
    path.write_text(config.dump(cfg))
    assert config.load(str(path)).objective == cfg.objective

    task, seen = tasks.current(), []
    own_loss, own_metrics = task.loss, task.metrics
    monkeypatch.setattr(
        task,
        "loss",
        lambda objective, manifest: seen.append(("loss", objective, manifest)) or own_loss(objective, manifest),
    )
    monkeypatch.setattr(
        task,
        "metrics",
        lambda objective, manifest: seen.append(("metrics", objective, manifest)) or own_metrics(objective, manifest),
    )
    manifest = task.nominal_manifest(cfg.data)
    model.objective_metrics(cfg, manifest)
    assert [(what, objective is cfg.objective, given is manifest) for what, objective, given in seen] == [
        ("loss", True, True),
        ("metrics", True, True),
    ]

    class Exported(Exception):
        """Stops the export once the serving signature is asked for: its arguments are the check."""

    def serving_signature(model_, manifest_, predict, objective):
        raise Exported(predict is cfg.predict and objective is cfg.objective and manifest_ is manifest)

    monkeypatch.setattr(task, "serving_signature", serving_signature)
    with pytest.raises(Exported) as exported:
        run_dir.export(None, str(tmp_path / "run"), manifest, cfg)
    assert exported.value.args == (True,)
