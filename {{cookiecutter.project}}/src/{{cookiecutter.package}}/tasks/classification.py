"""What the classification tasks share: their objective and what they serve.

- targets: category names from the raw input (a folder name, a `label` field); preprocessing
  collects them (the `label` vocabulary, with counts), and the manifest keeps `label_names` and
  `num_classes`; a label is encoded as its index in the sorted names
- objective: softmax cross-entropy on float32 logits, with `objective.label_smoothing`; `accuracy`
  is the headline, higher is better
- serving: `probabilities` and `class`; `make predict` prints the label and its probability

A task subclasses `ClassificationTask` and adds its data, model and inputs (see task.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..core.task import Manifest, RawExample, Task


@dataclass(frozen=True)
class ClassificationObjectiveConfig:
    label_smoothing: float = 0.0
    """Moves this share of each target's probability evenly over all classes (0.1 is the usual
    ImageNet value): the model is not pushed to ever larger logits. 0 is plain cross-entropy."""

    def problem(self) -> str | None:
        if not 0.0 <= self.label_smoothing < 1.0:
            return f"objective.label_smoothing must be in [0, 1), got {self.label_smoothing}"
        return None


def cross_entropy(label_smoothing: float, num_classes: int):
    """Softmax cross-entropy of integer targets against float32 logits, one value per example; with
    `label_smoothing`, against targets smoothed toward the uniform distribution over the classes."""
    import tensorflow as tf

    from ..core.keras import keras

    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    class SmoothedCrossEntropy(keras.losses.Loss):
        def call(self, targets, logits):
            one_hot = tf.one_hot(tf.cast(tf.reshape(targets, [-1]), tf.int32), num_classes)
            smoothed = one_hot * (1.0 - label_smoothing) + label_smoothing / num_classes
            return keras.losses.categorical_crossentropy(smoothed, logits, from_logits=True)

    return SmoothedCrossEntropy(name="smoothed_cross_entropy")


LABEL = "label"
"""The vocabulary of the class names (`vocabularies`): the manifest's `vocabularies.label` counts them."""


class ClassificationTask(Task):
    objective_config = ClassificationObjectiveConfig
    headline_metric = "accuracy"
    higher_is_better = True

    def vocabularies(self, example: RawExample) -> dict[str, list[str]]:
        return {LABEL: [example.target]}

    def manifest_fields(self, stats, data_config, artifacts, vocabularies: dict[str, list[str]]) -> dict:
        names = vocabularies.get(LABEL, [])
        return {"label_names": list(names), "num_classes": len(names)}

    @staticmethod
    def label_index(example: RawExample, vocabularies: dict[str, list[str]]) -> int:
        """The id `encode` writes for the example's label: its index in the sorted class names."""
        return vocabularies[LABEL].index(example.target)

    def describe_data(self, manifest: Manifest) -> str:
        return f"{manifest['num_classes']} classes"

    def build_loss(self, objective_config: ClassificationObjectiveConfig, manifest: Manifest):
        return cross_entropy(objective_config.label_smoothing, manifest["num_classes"])

    def build_metrics(self, objective_config, manifest: Manifest) -> list:
        from ..core.keras import keras

        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def score_baselines(self, train, evaluation, manifest: Manifest) -> dict[str, float]:
        """The majority class alone; a task adds a linear model of its inputs (`linear_baselines`)."""
        return linear_baselines(train, evaluation, manifest["num_classes"])

    def random_targets(self, batch_size: int, manifest: Manifest):
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

    def export_assets(self, manifest: Manifest, data_dir: str) -> dict[str, bytes]:
        return {"labels.json": json.dumps(manifest["label_names"]).encode()}

    def predictions(self, inputs, outputs: dict, manifest: Manifest, export_dir: str) -> list[dict]:
        names, probabilities = manifest["label_names"], outputs["probabilities"]
        return [
            {"label": names[index], "probability": float(probabilities[row, index])}
            for row, index in enumerate(outputs["class"])
        ]


def linear_baselines(
    train, evaluation, num_classes: int, featurize=None, kind: str = "", name: str = ""
) -> dict[str, float]:
    """Eval accuracy of the majority class of the train split and, with `featurize` (a features batch
    -> a float [batch, d] numpy array), of a linear model of those features fitted in one pass:
    `kind` "naive_bayes" (multinomial, add-one smoothed: for counts such as a bag of words) or
    "ridge" (least squares on one-hot targets with a small ridge: for pixels)."""
    import numpy as np

    prior = np.zeros(num_classes)
    sums = gram = cross = None
    for features, targets in train:
        labels = np.asarray(targets).reshape(-1).astype(np.int64)
        prior += np.bincount(labels, minlength=num_classes)
        if featurize is None:
            continue
        x = featurize(features)
        one_hot = np.eye(num_classes)[labels]
        if kind == "naive_bayes":
            sums = one_hot.T @ x if sums is None else sums + one_hot.T @ x
        else:
            x = np.hstack([x, np.ones((len(x), 1))])
            gram = x.T @ x if gram is None else gram + x.T @ x
            cross = x.T @ one_hot if cross is None else cross + x.T @ one_hot
    if featurize is not None and kind == "naive_bayes":
        log_prior = np.log((prior + 1) / (prior.sum() + num_classes))
        log_likelihood = np.log((sums + 1) / (sums.sum(axis=1, keepdims=True) + sums.shape[1]))
    elif featurize is not None:
        ridge = 1e-3 * np.trace(gram) / len(gram)
        weights = np.linalg.solve(gram + ridge * np.eye(len(gram)), cross)
    majority = int(prior.argmax())
    right_majority = right_linear = seen = 0
    for features, targets in evaluation:
        labels = np.asarray(targets).reshape(-1).astype(np.int64)
        seen += len(labels)
        right_majority += int((labels == majority).sum())
        if featurize is None:
            continue
        x = featurize(features)
        if kind == "naive_bayes":
            scores = x @ log_likelihood.T + log_prior
        else:
            scores = np.hstack([x, np.ones((len(x), 1))]) @ weights
        right_linear += int((scores.argmax(axis=1) == labels).sum())
    if not seen:
        return {}
    found = {"majority": right_majority / seen}
    if featurize is not None:
        found[name or kind] = right_linear / seen
    return found
