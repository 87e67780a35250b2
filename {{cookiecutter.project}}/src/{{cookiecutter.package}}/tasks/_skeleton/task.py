"""__task__: numeric features in CSV files -> a multilayer perceptron -> one number per row.

The toy parts to replace are marked TOY: the raw format (CSV rows), the model (model.py), the
objective (mean squared error) and the sample data. Everything the core calls is here, in the
groups of the contract's map (by where the data is); README.md beside this file is the checklist.

    raw input       RAW/*.csv: a header row, numeric feature columns and a `target` column
    preprocessing   read_raw (rows, rejections) -> fit_encoding (train-split statistics) -> encode
    input           parse_batch: features float32 [batch, num_features], targets float32 [batch, 1]
    model           model.py
    objective       build_loss, build_metrics, headline_metric, higher_is_better, score_baselines
    serving         features -> {"prediction"}; predict reads CSV rows like the raw input
"""

from __future__ import annotations

import csv
import io
import json
import math
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ...core import config as config_lib
from ...core.errors import UserError
from ...core.task import Listing, Manifest, RawExample, RawRejection, Rejected, Task, Testing, files_under

TARGET_COLUMN = "target"
STATISTICS_FILE = "statistics.json"


@dataclass(frozen=True)
class DataConfig(config_lib.DataConfig):
    """The `data:` keys: the shared ones (dir, raw, eval_fraction, shuffle_buffer) plus this task's."""

    num_features: int = 8
    """Numeric feature columns each CSV row holds besides `target`; rows with another count are
    rejected, and training refuses shards written with another count."""
    statistics_sample: int = 10000
    """At most this many train rows give the mean and spread that standardise features and target."""
    feature_noise: float = 0.0
    """In training, Gaussian noise of this many standard deviations of each feature (the train
    split's) added to the features: a regulariser for a small table. Read by `parse_batch` at run
    time, like any augmentation: a new value takes effect at the next `make train`, without
    preprocessing again."""

    def problem(self) -> str | None:
        if self.num_features < 1:
            return f"data.num_features must be at least 1, got {self.num_features}"
        if self.statistics_sample < 2:
            return f"data.statistics_sample must be at least 2, got {self.statistics_sample}"
        if self.feature_noise < 0:
            return f"data.feature_noise must be at least 0, got {self.feature_noise}"
        return None


@dataclass(frozen=True)
class ModelConfig:
    """The `model:` keys."""

    hidden: list[int] = field(default_factory=lambda: [64, 64])
    """Widths of the hidden Dense layers; multiples of 128 on a TPU (configs/tpu.yaml)."""
    remat: bool = False
    """Recompute each hidden layer's activations in the backward pass instead of keeping them (a
    memory lever: `make doctor` shows its effect; see core/recompute.py for the pattern)."""

    def problem(self) -> str | None:
        if not self.hidden or min(self.hidden) < 1:
            return f"model.hidden must be a non-empty list of positive integers, got {self.hidden}"
        return None


class NewTask(Task):
    name = "__task__"
    data_config = DataConfig
    model_config = ModelConfig
    raw_format = "RAW/*.csv with a header row: numeric feature columns and a `target` column"
    reject_reasons = {
        "bad_row": "a CSV row whose number of cells differs from its header's",
        "not_a_number": "a cell that is not a finite number",
        "no_target": "a CSV file whose header has no `target` column",
    }
    # TOY objective: the mean squared error is both the loss and the headline (lower is better).
    headline_metric = "loss"
    higher_is_better = False

    # --------------------------------------------------------------- preprocessing (Beam)
    def list_raw(self, input_root: str) -> Listing:
        units, ignored = [], 0
        for relative in files_under(input_root):
            if relative.lower().endswith(".csv") and "/" not in relative:
                units.append(relative)
            else:
                ignored += 1
        if not units:
            raise UserError(
                f"no CSV files found in {input_root}: expected {input_root}/*.csv; run `make data` "
                "for the sample set or point RAW at a folder of CSV files"
            )
        return Listing(sorted(units), ignored)

    def read_raw(self, relative: str, raw_bytes: bytes) -> Iterator[RawExample | RawRejection]:
        rows = list(csv.reader(io.StringIO(raw_bytes.decode("utf-8-sig", errors="replace"))))
        if not rows or TARGET_COLUMN not in rows[0]:
            yield RawRejection(relative, "no_target", f"header {rows[0] if rows else []} has no `{TARGET_COLUMN}`")
            return
        header = rows[0]
        target_at = header.index(TARGET_COLUMN)
        for number, row in enumerate(rows[1:], 2):
            source = f"{relative}:{number}"
            if not row:
                continue
            if len(row) != len(header):
                yield RawRejection(source, "bad_row", f"{len(row)} cells, the header has {len(header)}")
                continue
            try:
                values = [float(cell) for cell in row]
            except ValueError:
                yield RawRejection(source, "not_a_number", f"{row!r}")
                continue
            if not all(math.isfinite(value) for value in values):
                yield RawRejection(source, "not_a_number", f"{row!r}")
                continue
            features = [value for index, value in enumerate(values) if index != target_at]
            yield RawExample(source, values[target_at], {"features": features, "target": values[target_at]})

    # The standardisation statistics come from the train split: a task that defines `fit_encoding`
    # has preprocessing run it (leave it out when encoding needs nothing learned).
    def fit_encoding(self, train_payloads: Sequence[Any], data_config: DataConfig, workdir: str) -> dict[str, bytes]:
        rows = [payload for payload in train_payloads if len(payload["features"]) == data_config.num_features]
        if len(rows) < 2:
            raise UserError(
                f"fewer than 2 train rows with {data_config.num_features} features; check RAW and data.num_features"
            )
        features = np.array([row["features"] for row in rows])
        targets = np.array([row["target"] for row in rows])
        statistics = {
            "feature_mean": features.mean(axis=0).tolist(),
            "feature_std": np.maximum(features.std(axis=0), 1e-6).tolist(),
            "target_mean": float(targets.mean()),
            "target_std": float(max(targets.std(), 1e-6)),
            "rows": len(rows),
        }
        return {STATISTICS_FILE: json.dumps(statistics, indent=2).encode()}

    def encoding_sample_size(self, data_config: DataConfig) -> int:
        return data_config.statistics_sample

    # A task whose examples name categories (a class, a tag per token) returns them from `vocabularies`
    # ({"label": [example.target]}); `encode` then gets each field's sorted names and writes a name's index.
    def encode(self, example: RawExample, data_config: DataConfig, vocabularies, artifacts) -> tuple[bytes, dict]:
        import tensorflow as tf

        features = example.payload["features"]
        if len(features) != data_config.num_features:
            raise Rejected("bad_row", f"{len(features)} features, data.num_features is {data_config.num_features}")
        proto = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "features": tf.train.Feature(float_list=tf.train.FloatList(value=features)),
                    "target": tf.train.Feature(float_list=tf.train.FloatList(value=[example.target])),
                }
            )
        )
        return proto.SerializeToString(), {}

    def feature_spec(self, data_config: DataConfig) -> dict:
        return {"version": 1, "features": ["float32", data_config.num_features], "target": ["float32", 1]}

    def manifest_fields(self, stats, data_config: DataConfig, artifacts, vocabularies) -> dict:
        return {"num_features": data_config.num_features, "statistics": json.loads(artifacts[STATISTICS_FILE])}

    def bytes_per_example(self, data_config: DataConfig) -> int:
        return data_config.num_features * 4 + 48

    # --------------------------------------------------------------- input (tf.data)
    def check_manifest(self, manifest: Manifest, data_config: DataConfig, data_dir: str) -> None:
        if manifest.get("num_features") != data_config.num_features:
            raise UserError(
                f"data.num_features={data_config.num_features} but the shards in {data_dir} hold "
                f"{manifest.get('num_features')} features; set data.num_features={manifest.get('num_features')} "
                "or re-run `make preprocess`"
            )

    def parse_batch(self, serialized, manifest: Manifest, training: bool = False, seed=None, data_config=None):
        import tensorflow as tf

        parsed = tf.io.parse_example(
            serialized,
            {
                "features": tf.io.FixedLenFeature([manifest["num_features"]], tf.float32),
                "target": tf.io.FixedLenFeature([1], tf.float32),
            },
        )
        features = parsed["features"]
        # A run-time data key (the run's config, not the manifest): drawn from the batch's key, so a
        # resumed run adds the noise the uninterrupted one added.
        noise = (data_config or self.data_config()).feature_noise
        if training and noise > 0:
            spread = noise * tf.constant(manifest["statistics"]["feature_std"], tf.float32)
            shape = tf.shape(features)
            draws = tf.random.normal(shape) if seed is None else tf.random.stateless_normal(shape, seed)
            features += spread * draws
        return features, parsed["target"]

    def padding_record(self, manifest: Manifest) -> bytes:
        payload = {"features": [0.0] * manifest["num_features"], "target": 0.0}
        example = RawExample("padding", 0.0, payload)
        return self.encode(example, self.data_config(num_features=manifest["num_features"]), {}, {})[0]

    def synthetic_batch(self, batch_size: int, manifest: Manifest):
        import tensorflow as tf

        return tf.random.normal([batch_size, manifest["num_features"]]), tf.random.normal([batch_size, 1])

    def describe_data(self, manifest: Manifest) -> str:
        return f"{manifest['num_features']} numeric features, one numeric target"

    # --------------------------------------------------------------- model
    def build_model(self, model_config: ModelConfig, manifest: Manifest):
        from .model import build_model  # imports TensorFlow: not needed to read a config

        return build_model(model_config.hidden, manifest, remat=model_config.remat)

    def output_layers(self, model) -> list[str]:
        # The 1-unit head and the parameter-free rescaling after it: their width is the target's.
        return ["output", "target"]

    # --------------------------------------------------------------- objective (TOY)
    def build_loss(self, objective_config, manifest: Manifest):
        from ...core.keras import keras

        return keras.losses.MeanSquaredError()

    def build_metrics(self, objective_config, manifest: Manifest) -> list:
        return []

    def score_baselines(self, train, evaluation, manifest: Manifest) -> dict[str, float]:
        """TOY: the eval mean squared error of always predicting the train targets' mean, what a model
        that ignored the features would score (the headline is the loss). Add a linear model of the
        features, or whatever a simple rule of your data would score: the model must beat the best."""
        total = count = 0.0
        for _, targets in train:
            total, count = total + float(np.sum(targets)), count + targets.size
        squared = seen = 0.0
        for _, targets in evaluation:
            squared, seen = squared + float(np.sum((targets - total / max(count, 1.0)) ** 2)), seen + targets.size
        return {"train_mean": squared / seen} if seen else {}

    # --------------------------------------------------------------- serving
    def build_serving_signature(self, model, predict_config, objective_config, manifest: Manifest):
        import tensorflow as tf

        spec = tf.TensorSpec([None, manifest["num_features"]], tf.float32, name="features")

        @tf.function(input_signature=[spec])
        def serve(features):
            return {"prediction": tf.cast(model(features, training=False), tf.float32)[:, 0]}

        return serve

    def predict_inputs(self, inputs: Sequence[str], manifest: Manifest, export_dir: str):
        import tensorflow as tf

        names, rows = [], []
        for path in inputs:
            if not tf.io.gfile.exists(path):
                raise UserError(f"INPUT {path} does not exist; pass CSV files with the raw data's columns")
            with tf.io.gfile.GFile(path, "rb") as handle:
                content = handle.read()
            lines = content.decode("utf-8-sig", errors="replace").splitlines()
            if lines and TARGET_COLUMN not in next(csv.reader(lines[:1])):  # predict needs no target: add one
                content = "\n".join([f"{lines[0]},{TARGET_COLUMN}", *(f"{line},0" for line in lines[1:])]).encode()
            for item in self.read_raw(posixpath.basename(path), content):
                if isinstance(item, RawRejection) or len(item.payload["features"]) != manifest["num_features"]:
                    raise UserError(f"INPUT {path}: {getattr(item, 'detail', 'a row with another number of features')}")
                names.append(item.source)
                rows.append(item.payload["features"])
        if not rows:
            raise UserError(f"INPUT {', '.join(inputs)} holds no rows; write a header and one row per example")
        return names, np.array(rows, np.float32)

    def predictions(self, inputs, outputs: dict, manifest: Manifest, export_dir: str) -> list[dict]:
        return [{"prediction": float(value)} for value in outputs["prediction"]]

    # --------------------------------------------------------------- the rest
    def write_sample_data(self, output: Path, seed: int = 0, small: bool = False) -> str:
        """TOY: rows of 8 features whose target is a noisy smooth function of them, and 2 broken rows."""
        rng = np.random.default_rng(seed)
        rows = 400 if small else 3000
        features = rng.normal(size=(rows, 8))
        weights = np.linspace(-2.0, 2.0, 8)
        target = features @ weights + 1.5 * np.sin(2 * features[:, 0]) * features[:, 1] + rng.normal(0, 0.3, rows) + 10
        output.mkdir(parents=True, exist_ok=True)
        header = ",".join([*(f"x{index}" for index in range(8)), TARGET_COLUMN])
        lines = [header, *(",".join(f"{value:.5f}" for value in (*row, y)) for row, y in zip(features, target))]
        lines.insert(5, "1,2,3")  # too few cells
        lines.insert(9, ",".join(["oops"] * 9))  # not numbers
        (output / "rows.csv").write_text("\n".join(lines) + "\n")
        return f"wrote {rows} rows of 8 features + target to {output}/rows.csv, and 2 broken rows (to show rejection)"

    def nominal_manifest(self, data_config: DataConfig) -> dict:
        n = data_config.num_features
        statistics = {"feature_mean": [0.0] * n, "feature_std": [1.0] * n, "target_mean": 0.0, "target_std": 1.0}
        return {"num_features": n, "statistics": statistics}

    def testing(self) -> Testing:
        return Testing(
            overrides=("model.hidden=[32,32]", "train.base_learning_rate=0.05"),
            rejected=2,
            mismatch="data.num_features=3",
            predict_inputs=_clean_rows,
            encoding_sample="data.statistics_sample=5",
        )


def _clean_rows(raw: Path, scratch: Path) -> list[str]:
    """A CSV of the sample's first valid rows, without the target: what a user would predict for."""
    lines = (raw / "rows.csv").read_text().splitlines()
    rows = [line for line in lines[1:] if len(line.split(",")) == 9 and "oops" not in line][:5]
    path = scratch / "predict.csv"
    path.write_text("\n".join([lines[0].rsplit(",", 1)[0], *(row.rsplit(",", 1)[0] for row in rows)]) + "\n")
    return [str(path)]


TASK = NewTask()
