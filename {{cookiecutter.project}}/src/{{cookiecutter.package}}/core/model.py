"""The model seam: the task builds the network and says what it optimises (its loss and metrics);
the optimizer, the weighting of evaluation and gradient accumulation are shared.

The precision (bfloat16 compute with float32 variables, or float32) is chosen in precision.py;
every task returns float32 logits for a stable loss.

Random draws in the model resume with it. Every Keras layer that draws random numbers in training
(Dropout and its subclasses, the noise layers, the dropout of recurrent cells and attention layers,
recompute.Recomputed) draws them from a tf.random.Generator of its own, whose state is a variable
that `build_model` adds to the model's checkpoint (`random_generators`; not among its weights): a run
resumed from a checkpoint draws the masks the uninterrupted run drew from that step on. Under a
distribution strategy each replica draws its own numbers (the generator folds the replica's id into
its key): a function of the seed (`runtime.seed`), the replica and the step alone.

The generators are made once the task's network is built, so they draw nothing from the seeds its
initializers take: the initial weights are those the task's `build_model` makes under the seed, as
if no generator existed (making them during the build shifted every initializer after the first
random layer onto another seed, and with it the figures a recipe was tuned to).
"""

from __future__ import annotations

import types
from typing import NamedTuple

import tensorflow as tf

from . import optimizers, precision, warm_start
from .config import Config
from .errors import UserError
from .keras import keras


def gather(tensor):
    """Inside a training or evaluation step (the task's step loss): every replica's `tensor`
    concatenated along axis 0, in replica order, so a batch-level loss sees the global batch; with one
    replica, `tensor` itself. Differentiable: the gradient flows back to each replica's own part.

    Its cost is one all-gather per call per step: each replica receives (replicas - 1) x its share
    (for [16, 128] embeddings on 8 replicas, 14,336 numbers: nothing beside the gradient all-reduce
    of a model's every weight), and the memory of the gathered tensor and of what is computed from
    it (a [128, 128] similarity matrix) on every replica.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tensor
    return context.all_gather(tensor, axis=0)


def replica_offset(tensor):
    """Where this replica's rows of `tensor` begin in `gather(tensor)` (0 with one replica)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tf.constant(0, tf.int32)
    return tf.cast(context.replica_id_in_sync_group, tf.int32) * tf.shape(tensor)[0]


class Weighted(NamedTuple):
    """A step loss's value with the weight it is reported by (what `global_mean` returns). Training
    minimises `value` like a plain scalar; the reported figure (training log, evaluation,
    metrics.json) is the weighted mean of `value` over the replicas and steps, by `weight` instead of
    the number of examples: a token loss is reported per counted token, ln(perplexity)."""

    value: tf.Tensor
    weight: tf.Tensor


def global_mean(values, weights=None) -> Weighted:
    """Inside a step loss: the mean of `values` over the whole global batch, weighted by `weights`
    (broadcast to `values`; 1 for every value that counts, 0 for the rest: a masked-token objective's
    unmasked positions, evaluation's padding), from any replica. Return it as the step loss (or one of
    its entries).

    A replica's own mean, sum(values x weights) / sum(weights) on its share, is not the global batch's
    mean when the replicas count different totals (masked tokens, real tokens): 8 replicas then train
    another objective than one device does, by a small amount that `make parity` finds. Here every
    replica divides its weighted sum by the total weight of all replicas (one all-reduce of a scalar,
    held out of the gradient), times the number of replicas that the core divides by again: the
    replicas' summed gradients are the gradient of the global mean. Reported weighted by the total
    weight, the loss over a split is sum(values x weights) / sum(weights) over all of it (for a token
    loss, ln(perplexity) of the split). A batch with no weight gives 0 and counts nothing.

        losses = keras.losses.sparse_categorical_crossentropy(targets, outputs, from_logits=True)
        masked = tf.cast(features["masked"], tf.float32)        # [batch, length], 1 where predicted
        if weights is not None:                                  # evaluation: padding examples count 0
            masked *= tf.cast(weights, tf.float32)[:, None]
        return global_mean(losses, masked)
    """
    values = tf.cast(values, tf.float32)
    weights = (
        tf.ones_like(values) if weights is None else tf.broadcast_to(tf.cast(weights, tf.float32), tf.shape(values))
    )
    local_sum, total = tf.reduce_sum(values * weights), tf.reduce_sum(weights)
    replicas, context = 1, tf.distribute.get_replica_context()
    if context is not None and context.num_replicas_in_sync > 1:
        replicas = context.num_replicas_in_sync
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, total)
    total = tf.stop_gradient(total)
    return Weighted(tf.math.divide_no_nan(replicas * local_sum, total), total / replicas)


class TaskModel(keras.Model):
    """The task's functional network with what the core adds to its step, when the run needs it:

    - `accumulation_steps` > 1: the training step takes that many micro-batches at once ([k, per-replica
      batch, ...], stacked by the input pipeline) and applies the mean of their float32 gradients in one
      optimizer update: the effective batch is k times the global batch while only one micro-batch's
      activations are alive at a time. (The micro-batches arrive together instead of one per step with
      a conditional update because the optimizer's cross-replica all-reduce may not run inside control
      flow under a distribution strategy: every step is one update.)
    - `step_loss` (the task's, see Task.build_step_loss): the loss of each training and evaluation step
      is the task's function of this model and the whole batch, instead of the mean of a per-example loss.
    """

    accumulation_steps = 1
    step_loss = None
    loss_terms: tuple[str, ...] = ()

    def track_step_loss(self, step_loss, loss_terms) -> None:
        """Uses `step_loss`; its 'loss' and each of `loss_terms` are reported under their names (created
        here, under the float32 policy, before any step is traced)."""
        self.step_loss = step_loss
        self.loss_terms = tuple(loss_terms)
        with precision.policy("float32"):
            trackers = {name: keras.metrics.Mean(name=name) for name in ("loss", *self.loss_terms)}
        # In a plain namespace, which Keras does not track: like compiled metrics, the trackers are no
        # weights of the model (get_weights, checkpoints and the export leave them out).
        self.tracked = types.SimpleNamespace(step=trackers)

    @property
    def step_trackers(self) -> dict:
        return self.tracked.step if self.step_loss is not None else {}

    @property
    def metrics(self):
        return [*self.step_trackers.values(), *super().metrics]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        if self.step_loss is None:
            return super().compute_loss(x, y, y_pred, sample_weight)
        values = self.step_loss(self, x, y, y_pred, sample_weight)
        values = dict(values) if isinstance(values, dict) else {"loss": values}
        unknown = sorted(set(values) - set(self.step_trackers))
        if "loss" not in values or unknown:
            raise UserError(
                f"the task's step loss (build_step_loss) returned {sorted(values)}: it returns a scalar, or a dict "
                f"with a 'loss' entry and entries named in the task's loss_terms ({list(self.loss_terms) or 'none'}); "
                "add the other names to loss_terms"
            )
        # The examples this replica's batch counts: evaluation's padding has weight 0.
        if sample_weight is None:
            weight = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
        else:
            weight = tf.reduce_sum(tf.cast(sample_weight, tf.float32))
        for name, value in values.items():
            value, by = (value.value, value.weight) if isinstance(value, Weighted) else (value, weight)
            self.step_trackers[name].update_state(tf.cast(value, tf.float32), sample_weight=by)
        loss = values["loss"]
        total = tf.cast(loss.value if isinstance(loss, Weighted) else loss, tf.float32)
        if self.losses:  # the layers' regularisation, as Keras adds it to a compiled loss
            total += tf.add_n([tf.cast(loss, tf.float32) for loss in self.losses])
        # Each replica returns the loss of the global batch (or its estimate of it), and the replicas'
        # gradients are summed: divided by their number, the sum is the global loss's gradient.
        return total / tf.distribute.get_strategy().num_replicas_in_sync

    def train_step(self, data):
        if self.accumulation_steps == 1:
            return super().train_step(data)
        inputs, labels = data[0], data[1]
        trainable = self.trainable_variables
        total = [tf.zeros(variable.shape, tf.float32) for variable in trainable]
        for index in range(self.accumulation_steps):  # k is small and static: unrolled
            micro_inputs = tf.nest.map_structure(lambda tensor, i=index: tensor[i], inputs)
            micro_labels = tf.nest.map_structure(lambda tensor, i=index: tensor[i], labels)
            with tf.GradientTape() as tape:
                predictions = self(micro_inputs, training=True)
                loss = self.compute_loss(micro_inputs, micro_labels, predictions)
            gradients = tape.gradient(loss, trainable)
            total = [sum_ + tf.cast(gradient, tf.float32) for sum_, gradient in zip(total, gradients)]
            self.compute_metrics(micro_inputs, micro_labels, predictions, None)
        self.optimizer.apply_gradients(zip([sum_ / self.accumulation_steps for sum_ in total], trainable))
        return {metric.name: metric.result() for metric in self.metrics}


def build_model(cfg: Config, task, manifest: dict) -> keras.Model:
    """`task`'s network for the data described by `manifest`, its layers' random generators in its
    checkpoint (`track_random_generators`), the layers `train.freeze` names not trainable. With
    `train.gradient_accumulation_steps` > 1 or a task's step loss, the same layers in a TaskModel (same
    weights, same checkpoints, same serving)."""
    model = task.build_model(cfg.model, manifest)
    step_loss = task.build_step_loss(cfg.objective, manifest)
    if cfg.train.gradient_accumulation_steps > 1 or step_loss is not None:
        model = TaskModel(inputs=model.input, outputs=model.output, name=model.name)
        model.accumulation_steps = cfg.train.gradient_accumulation_steps
        if step_loss is not None:
            model.track_step_loss(step_loss, task.loss_terms)
    warm_start.freeze(model, cfg.train.freeze)
    track_random_generators(model)
    return model


def random_generators(model: keras.Model) -> list[tf.random.Generator]:
    """The tf.random.Generator of every layer of `model` (nested ones included) that draws random
    numbers through Keras' RandomGenerator, in the layers' order. A layer that would run stateful ops
    (Keras' default, whose state no checkpoint holds) is given a generator now, seeded as Keras seeds
    one (the layer's own seed, else the next of the global seed's draws); call it once the network is
    built, under the strategy's scope, so that no initializer's seed moves."""
    generators = []
    for layer in model._flatten_layers():
        random = getattr(layer, "_random_generator", None)  # Keras' (private) backend.RandomGenerator
        if random is None or not hasattr(random, "_maybe_init"):
            continue
        if getattr(random, "_generator", None) is None and random._rng_type != random.RNG_STATELESS:
            random._rng_type, random._built = random.RNG_STATEFUL, False  # made again as a generator
        random._maybe_init()
        generator = getattr(random, "_generator", None)
        if generator is not None:  # None: a stateless layer (a function of its seed alone)
            generators.append(generator)
    return generators


def track_random_generators(model: keras.Model) -> None:
    """Adds the state of `model`'s random generators to what its checkpoint saves and restores (Keras
    leaves them out: a layer's generator is not one of its weights), so that a resumed run draws the
    numbers the uninterrupted one drew. They stay out of `model.weights`: get_weights, the parameter
    count and the memory plan do not see them."""
    model.random_generators = random_generators(model)


# The weighted per-example loss under its own metric name ("loss" is Keras' own, unweighted and
# including regularisation): evaluation reports it as `loss`.
LOSS_METRIC = "weighted_loss"


def objective_metrics(cfg: Config, task, manifest: dict) -> list:
    """The task's metrics plus the weighted mean of its loss per example, fresh instances, each
    keeping its state in float32 whatever the precision policy.

    Under mixed_bfloat16 a metric's state variables would be AutoCast variables, which Keras'
    F1Score and AUC (among others) cannot read across replicas: their result() fails with
    "call variable.read_value() inside variable_sync_on_read_context is not supported" at the first
    evaluation. Created under the float32 policy they are plain float32 variables (and a sum over
    many examples keeps its digits); the predictions are cast to float32 on the way in.
    """
    # A step loss is reported by the model itself (TaskModel.compute_loss).
    loss = task.build_loss(cfg.objective, manifest) if task.build_step_loss(cfg.objective, manifest) is None else None
    with precision.policy("float32"):
        metrics = task.build_metrics(cfg.objective, manifest)
        if loss is not None:
            metrics.append(keras.metrics.MeanMetricWrapper(loss.call, name=LOSS_METRIC))
    for metric in metrics:
        used = metric.dtype_policy
        if used.compute_dtype != used.variable_dtype:
            raise UserError(
                f"the task's metric {metric.name} uses the {used.name} policy (made outside Task.build_metrics(), or "
                f"with dtype={used.name!r}): its state cannot be read across replicas; create it inside "
                "Task.build_metrics() without a dtype, or with dtype='float32'"
            )
    return metrics


def metric_names(cfg: Config, task, manifest: dict) -> list[str]:
    """The names evaluation reports: `loss` first, then the step loss's other terms, the task's
    metrics and its whole-split metrics."""
    terms = task.loss_terms if task.build_step_loss(cfg.objective, manifest) is not None else ()
    return [
        "loss",
        *terms,
        *(metric.name for metric in task.build_metrics(cfg.objective, manifest)),
        *task.split_metric_names,
    ]


def step_metric_names(cfg: Config, task, manifest: dict) -> list[str]:
    """The names a training step reports (the whole-split metrics are evaluation's only)."""
    return [name for name in metric_names(cfg, task, manifest) if name not in task.split_metric_names]


def compile_model(model: keras.Model, cfg: Config, task, manifest: dict, steps_per_execution: int) -> keras.Model:
    """Attaches the optimizer (with the scaled, warmed-up schedule) and the task's loss and metrics
    (made with the config's `objective:` section and the data's manifest).

    The metrics are weighted so that evaluation, which pads the last steps with weight-0
    examples to keep shapes static, counts every real example exactly once.
    """
    optimizer = optimizers.make(cfg.train)
    model.compile(
        optimizer=optimizer,
        # With a step loss, the model computes its loss itself (TaskModel.compute_loss).
        loss=None
        if task.build_step_loss(cfg.objective, manifest) is not None
        else task.build_loss(cfg.objective, manifest),
        weighted_metrics=objective_metrics(cfg, task, manifest),
        steps_per_execution=steps_per_execution,
    )
    install_train_function(model)
    return model


def install_train_function(model: keras.Model) -> None:
    """Gives `model` a multi-step train function whose step is traced once per replica, where Keras'
    traces it twice: Keras loops `for _ in tf.range(steps_per_execution): outputs = step(...)` with
    `outputs` undefined before the loop, and AutoGraph traces the loop body once more to find out
    what the loop carries. On a CPU or GPU under MirroredStrategy the step is traced for every
    replica, so the extra trace costs seconds at every start (~2 s of the shipped local run's ~9 s
    first execution on 2 replicas; twice that on 8).

    The step is Keras' own one-step function (what `make_train_function` builds when
    steps_per_execution is 1: the data's next batch, `train_step` on every replica, the reduction,
    the train counter); the loop runs it `model.steps_per_execution` times, a variable read inside
    the compiled loop as in Keras, so one compilation serves every value. Its outputs are those of
    the last step, as Keras returns them. fit(), train_on_batch and the calibration use it (Keras
    returns a model's `train_function` while compile() has not reset it). On a TPU (traced once for
    all replicas there), with run_eagerly, or under a cluster coordinator, Keras' own is kept."""
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.TPUStrategy) or model.run_eagerly or model._cluster_coordinator:
        return
    chosen = int(model.steps_per_execution.numpy())
    model.steps_per_execution.assign(1)
    try:
        step = model.make_train_function(force=True)  # Keras' one-step function (a tf.function)
    finally:
        model.steps_per_execution.assign(chosen)

    def train_function(iterator):
        # What the loop carries, from the step's one trace (which the loop's calls then reuse).
        carried = step.get_concrete_function(iterator).structured_outputs
        outputs = tf.nest.map_structure(lambda tensor: tf.zeros(tensor.shape, tensor.dtype), carried)
        for _ in tf.range(model.steps_per_execution):
            outputs = step(iterator)
        return outputs

    model.train_tf_function = model.train_function = tf.function(train_function, reduce_retracing=True)
