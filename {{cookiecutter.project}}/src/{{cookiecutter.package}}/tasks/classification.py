"""What the classification tasks share: their objective and what they serve.

- targets: category names from the raw input (a folder name, a `label` field); preprocessing
  collects them, and the manifest keeps `label_names` and `num_classes`
- objective: softmax cross-entropy on float32 logits; `accuracy` is the headline, higher is better
- serving: `probabilities` and `class`; `make predict` prints the label and its probability

A task subclasses `ClassificationTask` and adds its data, model and inputs (see task.py).
"""

from __future__ import annotations

import json
from typing import Sequence

from ..core.task import Task


class ClassificationTask(Task):
    categorical_targets = True
    headline_metric = "accuracy"
    higher_is_better = True

    def manifest_fields(self, data_config, artifacts, stats, categories: Sequence[str]) -> dict:
        return {"label_names": list(categories), "num_classes": len(categories)}

    def describe_data(self, manifest: dict) -> str:
        return f"{manifest['num_classes']} classes"

    def loss(self):
        from ..core.keras import keras

        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def metrics(self) -> list:
        from ..core.keras import keras

        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def random_targets(self, batch_size: int, manifest: dict):
        import tensorflow as tf

        return tf.random.uniform([batch_size], maxval=manifest["num_classes"], dtype=tf.int32)

    @staticmethod
    def serve_logits(logits) -> dict:
        """The serving outputs of a batch of logits: each class's probability and the likeliest class."""
        import tensorflow as tf

        logits = tf.cast(logits, tf.float32)
        return {
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "class": tf.argmax(logits, axis=-1, output_type=tf.int32),
        }

    def export_assets(self, manifest: dict, data_dir: str) -> dict[str, bytes]:
        return {"labels.json": json.dumps(manifest["label_names"]).encode()}

    def predictions(self, outputs: dict, export_dir: str, manifest: dict) -> list[dict]:
        names, probabilities = manifest["label_names"], outputs["probabilities"]
        return [
            {"label": names[index], "probability": float(probabilities[row, index])}
            for row, index in enumerate(outputs["class"])
        ]
