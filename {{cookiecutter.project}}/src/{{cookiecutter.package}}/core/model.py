"""The model seam: the task builds the network and says what it optimises (its loss and metrics);
the optimizer, the weighting of evaluation and gradient accumulation are shared.

The precision (bfloat16 compute with float32 variables, or float32) is chosen in precision.py;
every task returns float32 logits for a stable loss.
"""

from __future__ import annotations

import tensorflow as tf

from . import precision, schedule
from .. import tasks
from .config import Config
from .errors import UserError
from .keras import keras


class AccumulatingModel(keras.Model):
    """A functional model whose training step takes `accumulation_steps` micro-batches at once
    ([k, per-replica batch, ...], stacked by the input pipeline) and applies the mean of their
    float32 gradients in one optimizer update: the effective batch is k times the global batch
    while only one micro-batch's activations are alive at a time.

    Why the micro-batches arrive together instead of one per step with a conditional update: the
    optimizer's cross-replica all-reduce may not run inside control flow under a distribution
    strategy, so the update has to happen on every step; here every step is one update.
    """

    accumulation_steps = 1

    def train_step(self, data):
        inputs, labels = data[0], data[1]
        trainable = self.trainable_variables
        total = [tf.zeros(variable.shape, tf.float32) for variable in trainable]
        for index in range(self.accumulation_steps):  # k is small and static: unrolled
            micro_inputs = tf.nest.map_structure(lambda tensor, i=index: tensor[i], inputs)
            micro_labels = labels[index]
            with tf.GradientTape() as tape:
                predictions = self(micro_inputs, training=True)
                loss = self.compute_loss(micro_inputs, micro_labels, predictions)
            gradients = tape.gradient(loss, trainable)
            total = [sum_ + tf.cast(gradient, tf.float32) for sum_, gradient in zip(total, gradients)]
            self.compute_metrics(micro_inputs, micro_labels, predictions, None)
        self.optimizer.apply_gradients(zip([sum_ / self.accumulation_steps for sum_ in total], trainable))
        return {metric.name: metric.result() for metric in self.metrics}


def build_model(cfg: Config, manifest: dict) -> keras.Model:
    """The task's network for the data described by `manifest`; with
    `train.gradient_accumulation_steps` > 1, the same layers in an AccumulatingModel (same weights,
    same checkpoints, same serving)."""
    model = tasks.current().build_model(cfg.model, manifest)
    if cfg.train.gradient_accumulation_steps > 1:
        model = AccumulatingModel(inputs=model.inputs, outputs=model.outputs, name=model.name)
        model.accumulation_steps = cfg.train.gradient_accumulation_steps
    return model


# The weighted per-example loss under its own metric name ("loss" is Keras' own, unweighted and
# including regularisation): evaluation reports it as `loss`.
LOSS_METRIC = "weighted_loss"


def objective_metrics(cfg: Config, manifest: dict) -> list:
    """The task's metrics plus the weighted mean of its loss per example, fresh instances, each
    keeping its state in float32 whatever the precision policy.

    Under mixed_bfloat16 a metric's state variables would be AutoCast variables, which Keras'
    F1Score and AUC (among others) cannot read across replicas: their result() fails with
    "call variable.read_value() inside variable_sync_on_read_context is not supported" at the first
    evaluation. Created under the float32 policy they are plain float32 variables (and a sum over
    many examples keeps its digits); the predictions are cast to float32 on the way in.
    """
    task = tasks.current()
    loss = task.loss(cfg.objective, manifest)
    with precision.policy("float32"):
        metrics = [*task.metrics(cfg.objective, manifest), keras.metrics.MeanMetricWrapper(loss.call, name=LOSS_METRIC)]
    for metric in metrics:
        used = metric.dtype_policy
        if used.compute_dtype != used.variable_dtype:
            raise UserError(
                f"the task's metric {metric.name} uses the {used.name} policy (made outside Task.metrics(), or "
                f"with dtype={used.name!r}): its state cannot be read across replicas; create it inside "
                "Task.metrics() without a dtype, or with dtype='float32'"
            )
    return metrics


def metric_names(cfg: Config, manifest: dict) -> list[str]:
    """The names evaluation reports: `loss` first, then the task's metrics."""
    return ["loss", *(metric.name for metric in tasks.current().metrics(cfg.objective, manifest))]


def compile_model(model: keras.Model, cfg: Config, manifest: dict, steps_per_execution: int) -> keras.Model:
    """Attaches the optimizer (with the scaled, warmed-up schedule) and the task's loss and metrics
    (made with the config's `objective:` section and the data's manifest).

    The metrics are weighted so that evaluation, which pads the last steps with weight-0
    examples to keep shapes static, counts every real example exactly once.
    """
    train = cfg.train
    if train.optimizer == "adamw":
        optimizer = keras.optimizers.AdamW(learning_rate=schedule.from_config(train), weight_decay=train.weight_decay)
    else:
        optimizer = keras.optimizers.SGD(
            learning_rate=schedule.from_config(train),
            momentum=train.momentum,
            nesterov=True,
            weight_decay=train.weight_decay,
        )
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias", "embeddings"])  # norms, biases
    model.compile(
        optimizer=optimizer,
        loss=tasks.current().loss(cfg.objective, manifest),
        weighted_metrics=objective_metrics(cfg, manifest),
        steps_per_execution=steps_per_execution,
    )
    return model
