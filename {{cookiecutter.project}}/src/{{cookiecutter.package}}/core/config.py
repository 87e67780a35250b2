"""Typed configuration: YAML files under configs/, overridden by `dotted.key=value` arguments.

A config names the task it trains (`task: <name>`, a package under tasks/), whose data and model
keys join the shared ones. Loading one reads the task's keys from the `registry` that the command
passes in (the tasks package: its DEFAULT, available() and load(name)); the core imports no task.
Every key is a dataclass field below (or in the task's config classes), with its meaning. A key
that is not declared, or a value of the wrong type, is an error that names the key: a typo must
never silently fall back to a default on a TPU that costs money by the hour.

A config file may start from another: `extends: base.yaml` (a path relative to the file) reads that
file first and sets this file's keys over it, so a file holds only what differs from its base. A base
may extend another in turn; a base that is missing or a chain that comes back to a file is a one-line
error. The shipped configs extend configs/base.yaml, the one file that spells out every key.

A loaded config is a value: its dataclasses are frozen (the task's too), so code that needs another
config derives one with `dataclasses.replace` and nothing changes a config another part of the run
holds. Loading (`load`) is the one writer, before anyone holds it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence, Union

import yaml

from . import gcp
from .errors import UserError

log = logging.getLogger(__name__)


class ConfigError(UserError):
    """A config file or override is invalid."""


@dataclass(frozen=True)
class DataConfig:
    """The `data:` keys every task shares; a task's own data config adds its keys (tasks/)."""

    raw: str = "data/raw"
    """The raw input `make data` writes and `make preprocess` reads (RAW=... overrides it)."""
    dir: str = "data/tfrecords"
    """Directory (local path or gs://) holding the TFRecord shards and manifest.json."""
    eval_fraction: float = 0.1
    """Share of examples that the stable hash of their source sends to the eval split."""
    shuffle_buffer: int = 2048
    """Records of each input pipeline's train order permuted together: windows of this many
    consecutive records, each shuffled by a stateless function of (seed, epoch, window), so that a
    resumed run rebuilds the order exactly (training only)."""
    cache: Literal["auto", "none"] = "auto"
    """`auto`: each host keeps a split's records in memory, read once, when its share fits the smaller
    of a quarter of the host's available memory and 1 GiB; later epochs and evaluations read no
    storage (a gs:// split is downloaded once per process). The order is unchanged. `none`: always
    read the files (input_pipeline.py)."""
    max_example_share: float = 0.05
    """Preprocessing flags an example that becomes more than this share of its split, by the task's
    size statistic (`Task.size_statistic`: a packed document, by the tokens its windows
    hold), with the fix: one document repeated thousands of times in one line can become most of what
    the model trains on. Reported, not refused."""


@dataclass(frozen=True)
class TrainConfig:
    global_batch_size: int = 128
    """Examples per step across all replicas; must divide evenly by the number of replicas."""
    optimizer: Literal["sgd", "adamw", "adafactor"] = "sgd"
    """`sgd` (Nesterov momentum: convolutional nets), `adamw` (Transformers) or `adafactor` (a
    factored second moment and no momentum: about no optimizer memory for matrices, where AdamW
    keeps two copies; core/optimizers.py)."""
    gradient_accumulation_steps: int = 1
    """Global batches whose mean gradient makes one optimizer update: the effective batch is
    global_batch_size x this (when TPU memory caps the batch). The learning-rate scaling, warm-up
    and total_steps count optimizer updates of the effective batch."""
    base_learning_rate: float = 0.1
    """Learning rate at `base_batch_size`; the rate used is scaled linearly to the global batch."""
    base_batch_size: int = 256
    """Reference batch size of `base_learning_rate`."""
    warmup_steps: int = 50
    """Steps of linear warm-up from 0 to the scaled learning rate; cosine decay to 0 follows."""
    total_steps: int = 600
    """Length of training in optimizer steps (the schedule and resume both count in steps)."""
    steps_per_execution: Union[int, Literal["auto", "auto:fresh"]] = "auto"
    """Training steps run per call into the device; `auto` measures candidates once per setting and
    reuses the choice (see steps_per_execution.py), `auto:fresh` measures again."""
    checkpoint_every: int = 100
    """Steps between checkpoints (a checkpoint is also written on SIGTERM and at the end)."""
    async_checkpoint: bool = True
    """`true`: each periodic checkpoint is copied to host memory and written by a background thread
    while training goes on (one more host copy of the model and optimizer state); a save waits for
    the one before it. The checkpoints of a preemption and of the run's end are written before the
    run goes on, so they are whole. `false`: every save holds training until it is written."""
    eval_every: int = 0
    """Steps between evaluations during training (logged to TensorBoard's eval run; the best one's
    checkpoint is kept apart); 0 evaluates only at the end."""
    early_stop_patience: int = 0
    """Evaluations in a row without an improvement of the task's headline metric (in its direction)
    by more than `early_stop_min_delta` after which training stops; 0: never. Needs `eval_every`."""
    early_stop_min_delta: float = 0.0
    """How much the headline metric must move in its direction to count as an improvement for
    `early_stop_patience` (in the metric's units)."""
    max_seconds_per_execution: float = 5.0
    """Upper bound on the time of one execution that `steps_per_execution: auto` may choose: a
    preemption notice is acted on at the next execution boundary, and finishing the execution plus
    saving a checkpoint must fit in the ~30 s a Spot TPU VM gets."""
    keep_checkpoints: int = 3
    """How many of the latest checkpoints to keep."""
    log_every: int = 50
    """Steps between console and TensorBoard logs; bounds `steps_per_execution` from above."""
    momentum: float = 0.9
    """SGD momentum (Nesterov); unused by adamw."""
    weight_decay: float = 0.0005
    """Decoupled weight decay applied by the optimizer."""
    init_from: str = ""
    """Another run whose model weights a new run starts from: its run directory (the newest
    checkpoint), its checkpoints/best folder, a checkpoint path, or its export. Weights are matched by layer and
    weight name (core/warm_start.py); read at the run's first start only: a resume restores the run's
    own checkpoint. Empty: random initialisation."""
    init_skip: list[str] = field(default_factory=list)
    """Weights left as initialised although `init_from` holds them: shell patterns of layer or weight
    paths, e.g. [logits] for a head of another number of classes."""
    freeze: list[str] = field(default_factory=list)
    """Layers that do not train (shell patterns of layer names, e.g. [token_embedding, block0_*]):
    no gradient, no optimizer slot, batch normalisation in inference mode."""


@dataclass(frozen=True)
class RuntimeConfig:
    strategy: str = "auto"
    """`auto` (TPU, else GPU, else CPU), `tpu`, `gpu` or `cpu`."""
    tpu: str = "local"
    """`local` on a single TPU VM, or the TPU name of a multi-host Pod slice."""
    cpu_devices: int = 8
    """Logical devices to split the CPU into, so that CPU runs exercise 8 replicas like a TPU."""
    mixed_precision: str = "auto"
    """`auto` (bfloat16 where the TPU, GPU or CPU computes it natively, else float32; see
    precision.py), `bfloat16` (compute in bf16, variables and logits in float32) or `float32`."""
    output_dir: str = "runs/local"
    """Run directory (local path or gs://): config.yaml, checkpoints/, logs/, metrics.json."""
    profile_steps: str = ""
    """`start,stop` window of training steps to trace into logs/, or empty for none."""
    profiler_port: int = 0
    """Port of the profiler server for on-demand capture (`make profile`), 0 for none."""
    seed: int = 0
    """Global seed for initialisation and shuffling."""
    metadata_poll_seconds: float = 5.0
    """How often the GCE metadata server is asked for a preemption or maintenance notice. A notice
    comes about 30 s before the hard stop, so a few seconds leave time to save."""
    cache_dir: str = ""
    """Where measurements reused across runs are kept (the `steps_per_execution: auto` choice per
    setting): a local path or gs://; empty for $XDG_CACHE_HOME/<package> (else ~/.cache/<package>)."""
    deterministic: bool = False
    """`true`: TensorFlow's op determinism on and the seeds fixed, so that on a CPU a run with the same
    config (and a resumed one) is reproducible to the bit; slower (see the README). The train input's
    order is resumable either way."""
    resume_input: str = "exact"
    """`exact`: a resume continues the train input's order where the checkpoint left it (on another
    number of hosts or replicas with the same global batch too: the epoch's unread records are
    redistributed), and refuses when the data, the global batch, the accumulation or the shuffle
    window changed since; `reseed`: after such a change, continue in a new order seeded by the step."""


class TaskRegistry(Protocol):
    """The project's tasks as config loading reads them: the tasks package, passed in by the command."""

    DEFAULT: str
    """The task of a config without a `task:` key (the one the project was generated with)."""

    def available(self) -> list[str]:
        """The names of the project's tasks."""

    def load(self, name: str, where: str = "") -> Any:
        """The Task object of `name`; a name that is no task is a one-line UserError naming `where`."""


@dataclass(frozen=True)
class Config:
    task: str
    """The task this config trains: a package under tasks/ (see tasks/__init__.py)."""
    data: Any
    """The shared DataConfig keys plus the task's (e.g. image_size or seq_len)."""
    model: Any
    """The task's model keys."""
    objective: Any
    """The task's objective keys (what its loss and metrics are made with; none for some tasks)."""
    predict: Any
    """The task's serving keys (what the export serves; none for most tasks)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    @classmethod
    def defaults(cls, task) -> "Config":
        """The config of `task` (a Task object) with every key at its default."""
        return cls(task.name, task.data_config(), task.model_config(), task.objective_config(), task.predict_config())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def effective_batch_size(self) -> int:
        """Examples per optimizer update: the global batch times the accumulation steps."""
        return self.train.global_batch_size * self.train.gradient_accumulation_steps

    def profile_window(self) -> tuple[int, int] | None:
        """The (start, stop) steps of `runtime.profile_steps`, or None."""
        if not self.runtime.profile_steps:
            return None
        start, stop = (int(part) for part in self.runtime.profile_steps.split(","))
        return start, stop


def is_auto(steps_per_execution) -> bool:
    """`auto` or `auto:fresh`: chosen by measurement at start-up, not given."""
    return steps_per_execution in ("auto", "auto:fresh")


STRATEGIES = ("auto", "tpu", "gpu", "cpu")
PRECISIONS = ("auto", "bfloat16", "float32")


def all_keys(config: Config) -> list[str]:
    """Every dotted key the config accepts (its task's and the shared ones), e.g. `train.global_batch_size`."""
    return [
        f"{section.name}.{key.name}"
        for section in dataclasses.fields(config)
        if dataclasses.is_dataclass(getattr(config, section.name))
        for key in dataclasses.fields(getattr(config, section.name))
    ]


def _owners(key: str, current: str, registry: TaskRegistry) -> list[str]:
    """The tasks of this project other than `current` that declare `key` (e.g. data.image_size)."""
    section, _, name = key.partition(".")
    owners = []
    for task_name in registry.available():
        task = registry.load(task_name)
        kind = {
            "data": task.data_config,
            "model": task.model_config,
            "objective": task.objective_config,
            "predict": task.predict_config,
        }.get(section)
        if (
            task_name != current
            and dataclasses.is_dataclass(kind)
            and name in {f.name for f in dataclasses.fields(kind)}
        ):
            owners.append(task_name)
    return owners


def unknown_key(key: str, where: str, config: Config, registry: TaskRegistry) -> ConfigError:
    """The one-line error for `key`, which `config` does not declare: the task that does, or the
    closest key."""
    current = config.task
    owners = _owners(key, current, registry)
    if owners:
        return ConfigError(
            f"config key '{key}' {where} belongs to task {' and '.join(owners)}, but this config trains "
            f"'{current}' (its `task:` key); the tasks here are {', '.join(registry.available())}"
        )
    close = difflib.get_close_matches(key, all_keys(config), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"task '{current}' has no such key (see its configs)"
    return ConfigError(f"unknown config key '{key}' {where}; {hint}")


def _describe(kind: Any) -> str:
    """How a type reads in an error message: 'an integer', 'a list of integers', ..."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union:
        return " or ".join(_describe(arg) for arg in args)
    if origin is Literal:
        return " or ".join(repr(arg) for arg in args)
    if origin is list:
        return f"a list of {_describe(args[0]).split(' ', 1)[1]}s" if args else "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        kind, getattr(kind, "__name__", str(kind))
    )


class _Mismatch(Exception):
    pass


def _convert(value: Any, kind: Any) -> Any:
    """`value` as `kind`, allowing only the harmless conversions; raises _Mismatch."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union:
        for arg in args:
            try:
                return _convert(value, arg)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is Literal:
        if value in args:
            return value
        raise _Mismatch
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        return [_convert(item, args[0]) for item in value] if args else list(value)
    if isinstance(value, bool):  # YAML's true/false: only for bool fields, never a 1 or 0
        if kind is bool:
            return value
        raise _Mismatch
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, (int, float)):
        return float(value)
    if kind is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            return float(value)
        except ValueError:
            raise _Mismatch from None
    if kind is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)):
            return str(value)
    raise _Mismatch


def _coerce(key: str, value: Any, kind: Any) -> Any:
    """Checks `value` against the field's type hint: the one conversion rule for every key."""
    try:
        return _convert(value, kind)
    except _Mismatch:
        raise ConfigError(f"{key} must be {_describe(kind)}, got {value!r}") from None


def _set(config: Config, key: str, value: Any, where: str, registry: TaskRegistry) -> None:
    if key not in all_keys(config):
        raise unknown_key(key, where, config, registry)
    section_name, _, field_name = key.partition(".")
    section = getattr(config, section_name)
    kind = typing.get_type_hints(type(section))[field_name]
    object.__setattr__(section, field_name, _coerce(key, value, kind))  # loading: the config's one writer


def validate(config: Config) -> Config:
    """Checks the values that have rules beyond their type; the task's sections check their own."""
    rt, tr, data = config.runtime, config.train, config.data
    if tr.init_skip and not tr.init_from:
        raise ConfigError("train.init_skip names weights to leave out of train.init_from, which is empty; set both")
    if rt.resume_input not in ("exact", "reseed"):
        raise ConfigError(f"runtime.resume_input must be exact or reseed, got {rt.resume_input!r}")
    if rt.strategy not in STRATEGIES:
        raise ConfigError(f"runtime.strategy must be one of {', '.join(STRATEGIES)}, got {rt.strategy!r}")
    if rt.mixed_precision not in PRECISIONS:
        raise ConfigError(f"runtime.mixed_precision must be one of {', '.join(PRECISIONS)}, got {rt.mixed_precision!r}")
    if rt.profile_steps:
        parts = rt.profile_steps.split(",")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or int(parts[0]) >= int(parts[1]):
            raise ConfigError(
                f"runtime.profile_steps must be 'start,stop' with start < stop (e.g. '20,30'), got {rt.profile_steps!r}"
            )
        rt = dataclasses.replace(rt, profile_steps=",".join(p.strip() for p in parts))
    for key, value in (
        ("train.global_batch_size", tr.global_batch_size),
        ("train.base_batch_size", tr.base_batch_size),
        ("train.total_steps", tr.total_steps),
        ("train.checkpoint_every", tr.checkpoint_every),
        ("train.log_every", tr.log_every),
        ("train.keep_checkpoints", tr.keep_checkpoints),
        ("runtime.cpu_devices", rt.cpu_devices),
        ("train.gradient_accumulation_steps", tr.gradient_accumulation_steps),
    ):
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    if tr.warmup_steps < 0:
        raise ConfigError(f"train.warmup_steps must be 0 or more, got {tr.warmup_steps}")
    if tr.warmup_steps >= tr.total_steps:
        # A short smoke run (train.total_steps=10) keeps the schedule's shape instead of failing:
        # the warm-up takes a tenth of the run, and the log says so.
        clamped = tr.total_steps // 10
        log.warning(
            "note: train.warmup_steps=%d is not shorter than train.total_steps=%d; warming up for %d "
            "steps (a tenth of the run) instead",
            tr.warmup_steps,
            tr.total_steps,
            clamped,
        )
        tr = dataclasses.replace(tr, warmup_steps=clamped)
    if tr.eval_every < 0:
        raise ConfigError(f"train.eval_every must be 0 (only at the end) or a number of steps, got {tr.eval_every}")
    if tr.early_stop_patience < 0:
        raise ConfigError(
            f"train.early_stop_patience must be 0 (never) or a number of evaluations, got {tr.early_stop_patience}"
        )
    if tr.early_stop_min_delta < 0:
        raise ConfigError(f"train.early_stop_min_delta must be 0 or more, got {tr.early_stop_min_delta}")
    if tr.early_stop_patience and not tr.eval_every:
        raise ConfigError(
            f"train.early_stop_patience={tr.early_stop_patience} needs evaluations during training, but "
            "train.eval_every is 0 (only at the end): set train.eval_every to a number of steps, or "
            "train.early_stop_patience=0"
        )
    if tr.max_seconds_per_execution <= 0:
        raise ConfigError(f"train.max_seconds_per_execution must be positive, got {tr.max_seconds_per_execution}")
    if isinstance(tr.steps_per_execution, int) and tr.steps_per_execution < 1:
        raise ConfigError(f"train.steps_per_execution must be at least 1 or 'auto', got {tr.steps_per_execution}")
    if not 0.0 < data.eval_fraction < 1.0:
        raise ConfigError(f"data.eval_fraction must be between 0 and 1 (exclusive), got {data.eval_fraction}")
    if data.shuffle_buffer < 1:
        raise ConfigError(f"data.shuffle_buffer must be at least 1, got {data.shuffle_buffer}")
    if tr.base_learning_rate <= 0:
        raise ConfigError(f"train.base_learning_rate must be positive, got {tr.base_learning_rate}")
    if not 0 <= rt.profiler_port < 65536:
        raise ConfigError(f"runtime.profiler_port must be a port number or 0, got {rt.profiler_port}")
    if rt.metadata_poll_seconds <= 0:
        raise ConfigError(f"runtime.metadata_poll_seconds must be positive, got {rt.metadata_poll_seconds}")
    for section in (config.data, config.model, config.objective, config.predict):
        if dataclasses.is_dataclass(section) and not type(section).__dataclass_params__.frozen:
            raise ConfigError(
                f"the task's {type(section).__name__} is a mutable dataclass; declare it @dataclass(frozen=True) "
                "(a config is a value: derive another with dataclasses.replace)"
            )
        problem = section.problem() if hasattr(section, "problem") else None
        if problem:
            raise ConfigError(problem)
    return dataclasses.replace(config, train=tr, runtime=rt)


def _task(name: str, where: str, registry: TaskRegistry):
    """The Task object of the task named `name`; a name that is no task is a one-line ConfigError."""
    try:
        return registry.load(name, where)
    except UserError as error:
        raise ConfigError(str(error)) from None


def from_dict(values: dict, where: str = "", *, registry: TaskRegistry) -> Config:
    """The config of `values` (a parsed YAML file) for the task its `task:` key names (else the
    registry's DEFAULT), whose keys it reads first."""
    values = dict(values or {})
    name = values.pop("task", registry.DEFAULT)
    if not isinstance(name, str):
        raise ConfigError(f"task {where} must be a task's name, e.g. task: {registry.DEFAULT}; got {name!r}")
    config = Config.defaults(_task(name, where, registry))
    _apply(config, values, where, registry)
    return config


def _apply(config: Config, values: dict, where: str, registry: TaskRegistry) -> None:
    """Sets the keys of `values` (sections of keys, no `task:`) over `config`."""
    for section, keys in values.items():
        if section not in {f.name for f in dataclasses.fields(config)}:
            raise unknown_key(str(section), where, config, registry)
        if not isinstance(keys, dict):
            raise ConfigError(f"section '{section}' {where} must be a mapping of keys, got {keys!r}")
        for name, value in keys.items():
            _set(config, f"{section}.{name}", value, where, registry)


def parse_override(text: str) -> tuple[str, Any]:
    """`train.total_steps=100` -> ('train.total_steps', 100); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value (e.g. train.total_steps=100)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def shipped_config(task_name: str, which: str, *, registry: TaskRegistry) -> str:
    """A task's shipped config (`which`: local, tpu or pod), relative to the project: configs/<which>.yaml
    for the project's own task, configs/<task>/<which>.yaml for a task added with `make new-task`."""
    return f"configs/{which}.yaml" if task_name == registry.DEFAULT else f"configs/{task_name}/{which}.yaml"


BASE_KEY = "extends"
"""The top-level key of a config file that names the file it starts from."""


def _read(path: str, named_by: str = "") -> dict:
    """The keys of one YAML config file; `named_by` says which file's `extends:` named it."""
    try:
        with open(path) as handle:
            values = yaml.safe_load(handle) or {}
    except FileNotFoundError:
        if named_by:
            raise ConfigError(
                f"config file {path} not found ({named_by}); name an existing file, relative to it"
            ) from None
        raise ConfigError(f"config file {path} not found; pick one from configs/ (e.g. configs/local.yaml)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(values, dict):
        raise ConfigError(
            f"config file {path} must hold a mapping of sections (data, model, objective, predict, train, "
            f"runtime), with `task:` and `{BASE_KEY}:` at the top"
        )
    return values


def read_layers(path: str) -> list[tuple[str, dict]]:
    """The files a config is made of, its base first: (file, its keys without `extends:`) for `path`
    and for each file that the one before names in `extends:` (relative to that file)."""
    layers: list[tuple[str, dict]] = []
    named_by = ""
    while True:
        values = _read(path, named_by)
        layers.append((path, values))
        base = values.pop(BASE_KEY, None)
        if base is None:
            return layers[::-1]
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(
                f"{BASE_KEY} in {path} must name a config file, relative to {path}, e.g. {BASE_KEY}: base.yaml; "
                f"got {base!r}"
            )
        named_by = f"`{BASE_KEY}: {base}` in {path}"
        path = os.path.normpath(os.path.join(os.path.dirname(path), base))
        if os.path.realpath(path) in {os.path.realpath(file) for file, _ in layers}:
            chain = " -> ".join([*(file for file, _ in layers), path])
            raise ConfigError(
                f"config file {layers[0][0]}: its `{BASE_KEY}:` chain comes back to {path} ({chain}); "
                f"the file meant as the base must name no `{BASE_KEY}:`"
            )


def load(path: str | None, overrides: Sequence[str] = (), *, registry: TaskRegistry) -> Config:
    """Reads a YAML config, applies `dotted.key=value` overrides and validates the result; the
    task's keys come from `registry` (the tasks package)."""
    layers = [(f"in {file}", values) for file, values in read_layers(path)] if path else []
    parsed = [parse_override(text) for text in overrides]
    # task=NAME on the command line picks the task before any key is read; else the last file naming one.
    layers += [("on the command line", {"task": value}) for key, value in parsed if key == "task"]
    named = [(where, values["task"]) for where, values in layers if "task" in values]
    where, task = named[-1] if named else ("", None)
    config = from_dict({} if task is None else {"task": task}, where, registry=registry)
    for where, values in layers:  # the base's keys first, each error naming the file that holds the key
        _apply(config, {key: value for key, value in values.items() if key != "task"}, where, registry)
    for key, value in parsed:
        if key != "task":
            _set(config, key, value, "on the command line", registry)
    return validate(config)


def dump(config: Config) -> str:
    """The resolved config as YAML, in the same layout as the files under configs/."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def command_line(
    description: str, argv: Sequence[str] | None, add_arguments=None, *, registry: TaskRegistry
) -> tuple[Config, argparse.Namespace]:
    """The entry points' shared command line: --config FILE [options] [dotted.key=value ...]; the
    config's task keys come from `registry` (the tasks package)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="YAML file under configs/")
    if add_arguments:
        add_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. train.total_steps=100")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger(__package__.split(".")[0]).setLevel(logging.INFO)  # the whole project's loggers
    gcp.quiet_logging()
    config = load(args.config, args.overrides, registry=registry)
    gcp.require_credentials({"data.dir": config.data.dir, "runtime.output_dir": config.runtime.output_dir})
    return config, args
