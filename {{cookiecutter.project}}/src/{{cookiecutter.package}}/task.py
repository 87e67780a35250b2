"""The seam between the shared TPU machinery and a task: what a task must provide.

Everything else (config loading, strategy, the Beam record plumbing, the tf.data skeleton,
schedule, steps_per_execution, the training monitor, evaluation, export, doctor's engine and
the benchmarks) is shared and imports no task code; it reaches the task through `tasks.current()`.

A task is a package under `tasks/` whose `TASK` object implements `Task`:

    preprocessing (Beam workers)  list_raw -> read_raw -> [fit] -> encode -> [pack]
    input (tf.data)               check_manifest, parse_batch, padding_record, synthetic_batch
    model                         build_model
    objective                     loss, metrics, headline_metric, higher_is_better
    serving                       serving_signature, export_assets, predict_inputs, predictions
    the rest                      write_sample_data, doctor_rules, describe_data, output_layers

The core never names what a task learns (classes, labels, a score): it trains on the task's loss,
reports the task's metrics under their names, keeps the checkpoint of the best `headline_metric`
(highest or lowest, as `higher_is_better` says) and prints what `predictions` returns.

A new model for the same data changes only the task's `model.py`; a new raw format only its
`read_raw`/`list_raw`; a new task is a new package with its own configs and sample data
(`make new-task NAME=...` writes a working one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence


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
    name when the task has `categorical_targets`, else whatever the task's `encode` reads (a number,
    or None when the payload holds it)."""
    payload: Any
    """What `encode` needs: the file's bytes for an image, the text for a text example."""
    split: str | None = None
    """'train' or 'eval' when the raw input itself decides (a CSV index's ML_USE column); None
    leaves the split to the stable hash of `source`."""


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


@dataclass
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
    fit_sample: str = ""
    """For a task with a fit: the override (`data.<key>=<n>`) that bounds its sample, n smaller than
    the small sample's train split: preprocessing must give `fit` exactly n train payloads."""


class Task:
    """The contract. Subclass it in `tasks/<name>/task.py` and set `TASK = YourTask()`."""

    name: str = ""
    data_config: type = object
    """Dataclass of the `data:` section: the shared `config.DataConfig` plus this task's keys.
    Every field has a type hint (it drives the one conversion rule) and a docstring; an optional
    `problem()` method returns a one-line error for values that break a rule, else None."""
    model_config: type = object
    """Dataclass of the `model:` section, with the same conventions."""
    predict_config: type = NoKeys
    """Dataclass of the `predict:` section: what the export serves beyond the model (e.g. how many
    tokens a generator writes per prompt), given to `serving_signature`; no keys by default."""
    raw_format: str = ""
    """One line that says what RAW must look like (used in errors and help)."""
    reject_reasons: dict[str, str] = {}
    """Why an input was rejected: code -> meaning (counted in the manifest and Beam metrics)."""
    needs_fit: bool = False
    """True when encoding needs something learned from the train split first (a tokenizer)."""
    categorical_targets: bool = False
    """True when `RawExample.target` names a category: preprocessing then collects the sorted
    category names of the whole input and hands them to `encode` and `manifest_fields`."""
    headline_metric: str = "loss"
    """The metric that judges a run: the name of one of `metrics()`, or `loss`. The best periodic
    evaluation is kept by it, and metrics.json records it as `best_<name>`."""
    higher_is_better: bool = False
    """Whether a larger `headline_metric` is better (accuracy) or a smaller one (loss, error)."""

    # --------------------------------------------------------------- preprocessing (Beam)
    def list_raw(self, input_root: str) -> Listing:
        """Lists RAW (local or gs://); raises UserError when it holds no raw input."""
        raise NotImplementedError

    def read_raw(self, relative: str, data: bytes) -> Iterator[RawExample | RawRejection]:
        """The examples (or rejections) in one listed file, given its bytes."""
        raise NotImplementedError

    def fit(self, train_payloads: Sequence[Any], data: Any, workdir: str) -> dict[str, bytes]:
        """Learns what encoding needs from a bounded sample of train payloads (when `needs_fit`);
        returns artifacts by file name, written beside the shards."""
        return {}

    def fit_sample_size(self, data: Any) -> int:
        """How many train payloads `fit` sees at most (a bounded, hash-chosen sample)."""
        return 0

    def encode(
        self, example: RawExample, categories: Sequence[str], data: Any, artifacts: dict[str, bytes]
    ) -> tuple[bytes, dict]:
        """(serialized tf.train.Example, additive statistics such as {'tokens': 42}); raises
        `Rejected` for an input that does not decode. `categories` are the sorted category names
        (with `categorical_targets`; empty otherwise)."""
        raise NotImplementedError

    def pack(self, split: str, records: Sequence[bytes], data: Any) -> tuple[list[bytes], dict]:
        """The records one shard writes, from its encoded examples in their stable order: by default
        the examples themselves. A task whose records span several examples (documents packed
        into fixed windows of tokens) returns its own, and additive statistics of them
        (e.g. {'train_windows': 9}) that join the encode statistics handed to `manifest_fields`.
        The manifest's and the input pipeline's example counts are the records returned here."""
        return list(records), {}

    def feature_spec(self, data: Any) -> dict:
        """JSON description of an example: written into the manifest, compared at start-up."""
        raise NotImplementedError

    def manifest_fields(self, data: Any, artifacts: dict[str, bytes], stats: dict, categories: Sequence[str]) -> dict:
        """Task facts for manifest.json (e.g. image_size; the tokenizer's file and sha256; the
        category names)."""
        return {}

    def bytes_per_example(self, data: Any) -> int:
        """Estimated bytes of one record, for sizing shards."""
        raise NotImplementedError

    # --------------------------------------------------------------- input (tf.data)
    def check_manifest(self, manifest: dict, data: Any, data_dir: str) -> None:
        """Raises UserError when the shards do not fit the config (size, tokenizer, ...)."""

    def parse_batch(self, serialized, manifest: dict, training: bool = False):
        """A batch of serialized examples -> (features, targets), with static shapes.
        `training` is True for the train split: the place for random augmentation, which runs here,
        on the host, inside the input pipeline's parallel map; False gives deterministic features."""
        raise NotImplementedError

    def padding_record(self, manifest: dict) -> bytes:
        """One valid serialized example, used with weight 0 to pad evaluation."""
        raise NotImplementedError

    def synthetic_batch(self, batch_size: int, manifest: dict):
        """(features, targets) of random data shaped like a parsed batch (benchmarks)."""
        raise NotImplementedError

    def describe_data(self, manifest: dict) -> str:
        """A few words on the examples, e.g. '4 classes, 32px images' (for the start-up line)."""
        return ""

    # --------------------------------------------------------------- model
    def build_model(self, model: Any, manifest: dict):
        """A Keras model from parsed features to what `loss` compares with the targets; its
        outputs are float32 (under mixed bfloat16, cast the last layer's output)."""
        raise NotImplementedError

    def output_layers(self, model) -> list[str]:
        """Names of the layers that produce the model's outputs (their widths are set by the data,
        not by choice: `make doctor`'s width rules leave them alone)."""
        return list(model.output_names)

    # --------------------------------------------------------------- objective
    def loss(self):
        """The Keras loss training minimises (from the model's float32 outputs). Its `call(targets,
        outputs)` gives one value per example: evaluation weights those to count every real example
        once and reports their mean as `loss`."""
        raise NotImplementedError

    def metrics(self) -> list:
        """Keras metrics reported in training logs, evaluation, TensorBoard and metrics.json under
        their names (weighted like the loss). New instances on every call."""
        return []

    # --------------------------------------------------------------- serving
    def serving_signature(self, model, manifest: dict, predict: Any) -> Callable:
        """A tf.function with an input signature: model inputs -> a dict of named outputs. `predict`
        is the config's `predict:` section (an instance of `predict_config`)."""
        raise NotImplementedError

    def export_assets(self, manifest: dict, data_dir: str) -> dict[str, bytes]:
        """Files that `predict` needs beside the SavedModel (e.g. the tokenizer), by name."""
        return {}

    def predict_inputs(self, inputs: Sequence[str], export_dir: str, manifest: dict) -> tuple[list[str], Any]:
        """(a name per example, the batch for the serving signature) from `make predict INPUT=...`;
        raises UserError for an input that cannot be read."""
        raise NotImplementedError

    def predictions(self, outputs: dict, export_dir: str, manifest: dict) -> list[dict]:
        """What `make predict` prints for each example, from the serving signature's outputs (numpy
        arrays): an ordered {field: value} per example, e.g. {'label': 'cat', 'probability': 0.93}.
        Floats print with 3 decimals."""
        raise NotImplementedError

    # --------------------------------------------------------------- the rest
    def write_sample_data(self, output: Path, seed: int = 0, small: bool = False) -> str:
        """Writes the generated sample raw data (no download); returns a one-line summary.
        `small` writes a few hundred examples for tests."""
        raise NotImplementedError

    def nominal_manifest(self, data: Any) -> dict:
        """The manifest fields `build_model` needs, from the config alone and typical values for
        what only the data decides (for `make doctor` before any data exists)."""
        raise NotImplementedError

    def width_fix(self, model: Any, quantum: int) -> str:
        """The config change that makes the model's widths multiples of `quantum` (doctor)."""
        return f"make the model.* widths multiples of {quantum}"

    def testing(self) -> Testing:
        """What the contract tests need: small overrides, the sample's rejections, predict inputs."""
        return Testing()

    def doctor_rules(self) -> list:
        """This task's `make doctor` rules: (name, function) pairs, each function taking
        (config, target, manifest or None) and returning (status, message, fix) with status
        'pass', 'warn', 'fail' or 'skip'."""
        return []


def fields_of(section: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(section)]
