"""Config files, overrides and the errors a user gets for a wrong key or value."""

from pathlib import Path

import pytest

from {{ cookiecutter.package }}.core import config
from {{ cookiecutter.package }} import tasks
from {{ cookiecutter.package }}.core.config import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
# The project's task's configs, and those of every task added later (configs/<task>/).
CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))


def written(path: Path) -> dict:
    """A config file's own keys, as written (without its base's)."""
    import yaml

    return yaml.safe_load(path.read_text()) or {}


# The files that spell out every key (configs/base.yaml, configs/<task>/base.yaml); the others extend one.
BASES = [path for path in CONFIGS if config.BASE_KEY not in written(path)]
DELTAS = [path for path in CONFIGS if path not in BASES]


def shown(path: Path) -> str:
    return str(path.relative_to(CONFIG_DIR))


@pytest.mark.parametrize("path", CONFIGS, ids=shown)
def test_shipped_configs_load_for_their_folders_task(path):
    loaded = config.load(str(path), registry=tasks)
    assert loaded.task == (tasks.DEFAULT if path.parent == CONFIG_DIR else path.parent.name)


def test_each_folder_has_one_base_which_every_config_there_extends():
    assert sorted(path.parent for path in BASES) == sorted({path.parent for path in CONFIGS})
    for path in CONFIGS:
        chain = [Path(file) for file, _ in config.read_layers(str(path))]
        assert chain[0] == path.parent / "base.yaml" and chain[-1] == path, chain


@pytest.mark.parametrize("path", BASES, ids=shown)
def test_a_base_declares_every_key(path):
    values = written(path)
    loaded = config.load(str(path), registry=tasks)
    declared = {f"{section}.{key}" for section, keys in values.items() if section != "task" for key in keys}
    assert values["task"] == loaded.task
    assert declared == set(config.all_keys(loaded))  # every key spelled out, with its comment


@pytest.mark.parametrize("path", DELTAS, ids=shown)
def test_a_config_that_extends_another_holds_only_what_differs(path):
    values = written(path)
    base = config.load(str(path.parent / values.pop(config.BASE_KEY)), registry=tasks)
    assert "task" not in values, f"{shown(path)} names the task its base names already"
    for section, keys in values.items():
        for key, value in keys.items():
            same = getattr(getattr(base, section), key) == value
            assert not same, f"{shown(path)}: {section}.{key}: {value!r} is its base's"


def test_a_config_extends_a_file_relative_to_itself_which_may_extend_another(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "base.yaml").write_text("train:\n  total_steps: 70\n  log_every: 7\n")
    (tmp_path / "mid.yaml").write_text("extends: shared/base.yaml\ntrain:\n  total_steps: 80\n")
    (tmp_path / "leaf.yaml").write_text("extends: mid.yaml\nruntime:\n  seed: 3\n")
    cfg = config.load(str(tmp_path / "leaf.yaml"), ["train.log_every=9"], registry=tasks)
    assert (cfg.train.total_steps, cfg.train.log_every, cfg.runtime.seed) == (80, 9, 3)
    resolved = config.dump(cfg)  # what a run writes: every key, no `extends:`
    assert "extends" not in resolved and "total_steps: 80" in resolved and "keep_checkpoints: " in resolved


def test_a_wrong_key_in_a_base_names_the_base(tmp_path):
    (tmp_path / "base.yaml").write_text("train:\n  global_batch_sise: 64\n")
    (tmp_path / "local.yaml").write_text("extends: base.yaml\n")
    unknown = r"unknown config key 'train.global_batch_sise' in .*/base.yaml; did you mean"
    with pytest.raises(ConfigError, match=unknown):
        config.load(str(tmp_path / "local.yaml"), registry=tasks)


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"a.yaml": "extends: nope.yaml\n"},
            "config file {dir}/nope.yaml not found (`extends: nope.yaml` in {dir}/a.yaml)",
        ),
        (
            {"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: ./a.yaml\n"},
            "config file {dir}/a.yaml: its `extends:` chain comes back to {dir}/a.yaml "
            "({dir}/a.yaml -> {dir}/b.yaml -> {dir}/a.yaml)",
        ),
        ({"a.yaml": "extends: a.yaml\n"}, "its `extends:` chain comes back to {dir}/a.yaml"),
        ({"a.yaml": "extends: [base.yaml]\n"}, "extends in {dir}/a.yaml must name a config file, relative to"),
    ],
    ids=["missing", "cycle", "itself", "not a path"],
)
def test_a_missing_base_or_a_cycle_is_one_line(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as error:
        config.load(str(tmp_path / "a.yaml"), registry=tasks)
    assert message.format(dir=tmp_path) in str(error.value) and "\n" not in str(error.value)


def test_early_stopping_is_checked_and_needs_evaluations_during_training():
    cfg = config.load(
        None, ["train.eval_every=50", "train.early_stop_patience=3", "train.early_stop_min_delta=0.01"], registry=tasks
    )
    assert (cfg.train.early_stop_patience, cfg.train.early_stop_min_delta) == (3, 0.01)
    for overrides, expected in [
        (
            ["train.early_stop_patience=3"],
            "train.early_stop_patience=3 needs evaluations during training, but train.eval_every is 0",
        ),
        (["train.eval_every=50", "train.early_stop_patience=-1"], "train.early_stop_patience must be 0 (never)"),
        (["train.early_stop_min_delta=-0.1"], "train.early_stop_min_delta must be 0 or more, got -0.1"),
    ]:
        with pytest.raises(ConfigError) as error:
            config.load(None, overrides, registry=tasks)
        assert expected in str(error.value) and "\n" not in str(error.value)


def test_a_config_of_an_unknown_task_is_one_line(tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text("task: speech_recognition\ntrain:\n  total_steps: 10\n")
    with pytest.raises(ConfigError) as raised:
        config.load(str(path), registry=tasks)
    message = str(raised.value)
    assert message.startswith(f"task 'speech_recognition' in {path} is not a task of this project")
    assert f"the tasks here are {', '.join(tasks.available())}" in message and "\n" not in message
    assert config.load(None, registry=tasks).task == tasks.DEFAULT  # a config without `task:` trains the default


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
        registry=tasks,
    )
    assert cfg.train.total_steps == 7 and cfg.train.warmup_steps == 2
    assert cfg.train.base_learning_rate == 1.0 and isinstance(cfg.train.base_learning_rate, float)
    assert cfg.train.weight_decay == 1e-4
    assert cfg.profile_window() == (3, 5) and cfg.runtime.profile_steps == "3,5"  # as loading wrote it
    assert cfg.train.steps_per_execution == "auto"


def test_a_loaded_config_is_a_value():
    """Frozen, every section (the task's too): another config is derived, the one held is unchanged; a
    task section that is a mutable dataclass is refused in one line."""
    import dataclasses

    cfg = config.load(None, ["train.total_steps=10"], registry=tasks)
    sections = {"": cfg, "data": cfg.data, "model": cfg.model, "train": cfg.train, "runtime": cfg.runtime}
    sections.update(
        {name: getattr(cfg, name) for name in ("objective", "predict") if dataclasses.is_dataclass(getattr(cfg, name))}
    )
    for section in sections.values():
        first = next((each.name for each in dataclasses.fields(section)), "width")  # a section without keys too
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(section, first, getattr(section, first, 1))
    derived = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, total_steps=20))
    assert (cfg.train.total_steps, derived.train.total_steps) == (10, 20) and derived.runtime is cfg.runtime

    @dataclasses.dataclass
    class Mutable:
        width: int = 8

    with pytest.raises(ConfigError) as raised:
        config.validate(dataclasses.replace(cfg, model=Mutable()))
    assert str(raised.value) == (
        "the task's Mutable is a mutable dataclass; declare it @dataclass(frozen=True) (a config is a value: derive "
        "another with dataclasses.replace)"
    )


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
        config.load(None, [override], registry=tasks)
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
        config.load(str(path), registry=tasks)


def test_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file .*nope.yaml not found"):
        config.load(str(tmp_path / "nope.yaml"), registry=tasks)


def test_dump_round_trips(tmp_path):
    cfg = config.load(None, ["train.total_steps=90", "train.optimizer=adamw"], registry=tasks)
    path = tmp_path / "resolved.yaml"
    path.write_text(config.dump(cfg))
    assert config.load(str(path), registry=tasks) == cfg


def test_a_warm_up_longer_than_the_run_is_clamped_with_a_note(caplog):
    """A smoke run (train.total_steps=10) keeps the default warm-up from failing it."""
    cfg = config.load(None, ["train.total_steps=10", "train.warmup_steps=40"], registry=tasks)
    assert cfg.train.warmup_steps == 1
    assert "warming up for 1 steps (a tenth of the run)" in caplog.text
    longer = config.load(None, ["train.total_steps=100", "train.warmup_steps=40"], registry=tasks)
    assert longer.train.warmup_steps == 40


def test_the_task_sections_are_typed_and_documented():
    """The task's data, model, objective and predict keys go through the same type-hint-driven conversion."""
    import dataclasses
    import inspect
    import typing

    cfg = config.load(None, registry=tasks)
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
        config.load(None, [f"{key}=wide"], registry=tasks)


def test_the_objective_section_reaches_the_loss_and_metrics_and_is_refused_when_unknown(tmp_path, monkeypatch):
    """`objective:` is the task's like `model:`: its keys typed and written to config.yaml, an
    unknown one refused in one line, and the values handed to `build_loss`, `build_metrics` and the
    export's `build_serving_signature` (with the manifest)."""
    import dataclasses

    from {{ cookiecutter.package }}.core import model, run_dir

    cfg = config.load(None, registry=tasks)
    keys = [f"objective.{field.name}" for field in dataclasses.fields(cfg.objective)]
    assert set(keys) <= set(config.all_keys(cfg))
    with pytest.raises(
        ConfigError, match=r"^unknown config key 'objective.temperature' on the command line; "
    ) as raised:
        config.load(None, ["objective.temperature=0.07"], registry=tasks)
    assert "\n" not in str(raised.value)
    path = tmp_path / "config.yaml"
    path.write_text(config.dump(cfg))
    assert config.load(str(path), registry=tasks).objective == cfg.objective

    task, seen = tasks.load(cfg.task), []
    own_loss, own_metrics = task.build_loss, task.build_metrics
    monkeypatch.setattr(
        task,
        "build_loss",
        lambda objective, manifest: seen.append(("loss", objective, manifest)) or own_loss(objective, manifest),
    )
    monkeypatch.setattr(
        task,
        "build_metrics",
        lambda objective, manifest: seen.append(("metrics", objective, manifest)) or own_metrics(objective, manifest),
    )
    manifest = task.nominal_manifest(cfg.data)
    model.objective_metrics(cfg, task, manifest)
    assert [(what, objective is cfg.objective, given is manifest) for what, objective, given in seen] == [
        ("loss", True, True),
        ("metrics", True, True),
    ]

    class Exported(Exception):
        """Stops the export once the serving signature is asked for: its arguments are the check."""

    def build_serving_signature(model_, predict, objective, manifest_):
        raise Exported(predict is cfg.predict and objective is cfg.objective and manifest_ is manifest)

    monkeypatch.setattr(task, "build_serving_signature", build_serving_signature)
    with pytest.raises(Exported) as exported:
        run_dir.export(None, str(tmp_path / "run"), manifest, cfg, task)
    assert exported.value.args == (True,)
