"""make parity's verdicts, both ways, and a task's step loss on 8 replicas against one device: small
two-tower models on random pairs, the suite's 8-replica strategy against one CPU device, float32."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_same_updates

from {{ cookiecutter.package }} import parity
from {{ cookiecutter.package }}.core.keras import keras
from {{ cookiecutter.package }}.core.model import TaskModel, gather, global_mean, replica_offset

BATCH, STEPS = 64, 3
pytestmark = pytest.mark.usefixtures("seeded_weights")  # each verdict the same every run


@pytest.fixture(scope="module")
def batches():
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(STEPS):
        query = rng.normal(size=(BATCH, 8)).astype("float32")
        document = (query + 0.5 * rng.normal(size=(BATCH, 8))).astype("float32")
        classes = query[:, :4].argmax(axis=1).astype("int32")  # learnable: the per-example loss falls
        pairs.append(({"query": query, "document": document}, classes))
    return pairs


def towers(kind=keras.Model):
    inputs = {name: keras.Input((8,), name=name) for name in ("query", "document")}
    outputs = {name: keras.layers.Dense(16, name=f"{name}_tower")(inputs[name]) for name in inputs}
    return kind(inputs=inputs, outputs=outputs)


def in_batch_loss(global_negatives: bool):
    """Each query's softmax cross-entropy over the documents of its batch: this replica's share of it,
    or (global_negatives) the whole global batch's, gathered."""

    def step_loss(model, features, targets, outputs, weights):
        documents = gather(outputs["document"]) if global_negatives else outputs["document"]
        offset = replica_offset(outputs["query"]) if global_negatives else 0
        logits = tf.matmul(outputs["query"], documents, transpose_b=True) / 0.1
        positives = offset + tf.range(tf.shape(logits)[0])
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits)
        return {"loss": tf.reduce_mean(losses), "mean_logit": tf.reduce_mean(logits)}

    return step_loss


def two_tower(step_loss):
    def make():
        model = towers(TaskModel)
        model.track_step_loss(step_loss, ["mean_logit"])
        model.compile(keras.optimizers.SGD(0.05))
        return model

    return make


def per_example():
    """A per-example loss on the query tower (a 4-way classifier), compiled the Keras way."""
    inputs = keras.Input((8,), name="query")
    model = keras.Model({"query": inputs}, keras.layers.Dense(4)(keras.layers.Dense(16, activation="relu")(inputs)))
    model.compile(keras.optimizers.Adam(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def one_device():
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def test_a_per_example_loss_trains_alike_on_one_device_and_8_replicas(strategy, batches):
    queries = [({"query": features["query"]}, targets) for features, targets in batches]
    curves = parity.compare(per_example, queries, one_device(), strategy)
    assert curves.replicas == 8
    assert curves.parting_step is None, curves
    assert curves.causes() == []
    assert curves.one_device[-1] < curves.one_device[0]  # it trained


def test_a_per_replica_in_batch_loss_is_flagged_at_the_first_step(strategy, batches):
    curves = parity.compare(two_tower(in_batch_loss(global_negatives=False)), batches, one_device(), strategy)
    assert curves.parting_step == 0
    # 8 candidates per query against 64: the replicas' loss is lower, and so in inference mode too.
    assert curves.replicated_inference < 0.8 * curves.one_device_inference
    (cause,) = curves.causes()
    assert cause.startswith("per-replica batch-level loss") and "gather" in cause


def test_the_in_batch_loss_over_the_gathered_batch_agrees_and_has_the_one_device_gradient(strategy, batches):
    make = two_tower(in_batch_loss(global_negatives=True))
    curves = parity.compare(make, batches, one_device(), strategy)
    assert curves.parting_step is None, curves
    assert curves.relative(curves.one_device_inference, curves.replicated_inference) < 1e-5
    # One SGD update from the same weights on the same global batch: the same change of every weight.
    updates = []
    for side in (one_device(), strategy):
        _, _, model = parity.train_curve(make, side, curves.initial, batches[:1])
        updates.append([after - before for after, before in zip(model.get_weights(), curves.initial)])
    assert_same_updates(*updates, curves.initial, terms=BATCH)
    assert np.abs(updates[0][0]).max() > 1e-4  # the update is not zero


class Transitions(keras.layers.Layer):
    """A weight of the objective, as a CRF keeps its transition matrix: a trainable [4, 4] matrix that
    only the step loss reads (from the model it is given); the layer passes its input on unchanged."""

    def build(self, input_shape):
        self.matrix = self.add_weight(name="matrix", shape=(4, 4), initializer="random_normal", trainable=True)

    def call(self, inputs):
        return tf.identity(inputs)


def chain_loss(model, features, targets, outputs, weights):
    """The negative log-likelihood of the target repeated over a chain of two steps, scored by the
    model's 4 outputs at each step plus the transition between them (a linear-chain CRF's score)."""
    transitions = model.get_layer("transitions").matrix
    pairs = outputs[:, :, None] + transitions[None] + outputs[:, None, :]  # [batch, from, to]
    log_partition = tf.reduce_logsumexp(tf.reshape(pairs, [-1, 16]), axis=1)
    classes = tf.cast(targets, tf.int32)
    gold = tf.gather_nd(pairs, tf.stack([tf.range(tf.shape(classes)[0]), classes, classes], axis=1))
    return tf.reduce_mean(log_partition - gold)


def tagger():
    inputs = keras.Input((8,), name="query")
    scores = keras.layers.Dense(4, name="scores")(inputs)
    model = TaskModel({"query": inputs}, Transitions(name="transitions")(scores))
    model.track_step_loss(chain_loss, [])
    model.compile(keras.optimizers.SGD(0.5))
    return model


def test_a_step_loss_trains_a_weight_of_the_model_it_reads_as_one_device_does(strategy, batches):
    """The step loss reads the transitions from the model it is given: on 8 replicas the gradient
    reaches that weight (one SGD update moves it) and the update of every weight is one device's,
    from the same initial weights on the same global batch."""
    queries = [({"query": features["query"]}, targets) for features, targets in batches[:1]]
    with one_device().scope():
        initial = tagger().get_weights()
    updates = []
    for side in (one_device(), strategy):
        _, _, model = parity.train_curve(tagger, side, initial, queries)
        (matrix,) = [index for index, weight in enumerate(model.weights) if "transitions" in weight.name]
        updates.append([after - before for after, before in zip(model.get_weights(), initial)])
    assert np.abs(updates[1][matrix]).max() > 1e-3  # the 8-replica update reached the transitions
    assert_same_updates(*updates, initial, terms=BATCH)


def test_a_step_loss_reports_its_mean_over_the_real_examples(strategy):
    """In evaluation, padding (weight 0) does not count: each replica's step loss is weighted by its real
    examples, so the reported loss is the mean over every real example, and each term is reported."""

    def step_loss(model, features, targets, outputs, weights):
        values, weights = tf.reduce_mean(features["query"], axis=1), tf.cast(weights, tf.float32)
        return {
            "loss": tf.math.divide_no_nan(tf.reduce_sum(values * weights), tf.reduce_sum(weights)),
            "mean_logit": tf.constant(1.0),
        }

    with strategy.scope():
        model = two_tower(step_loss)()
    values = np.array([1.0] * 16 + [3.0] * 8 + [100.0] * 8, "float32")  # the last 8: padding
    features = {name: np.repeat(values[:, None], 8, axis=1) for name in ("query", "document")}
    weights = np.array([1.0] * 24 + [0.0] * 8, "float32")
    results = model.evaluate(
        features, np.zeros(32, "int32"), sample_weight=weights, batch_size=16, verbose=0, return_dict=True
    )
    # (16 x 1 + 8 x 3) / 24 real examples; a mean of the two batches' losses would say 2.0.
    assert results == {"loss": pytest.approx(40 / 24, rel=1e-6), "mean_logit": pytest.approx(1.0)}


def test_a_step_loss_with_an_undeclared_term_is_refused_in_one_line(strategy):
    from {{ cookiecutter.package }}.core.errors import UserError

    with strategy.scope():
        model = two_tower(
            lambda model, f, t, outputs, weights: {"loss": tf.reduce_mean(outputs["query"]), "extra": 1.0}
        )()
    features = {name: np.ones((16, 8), "float32") for name in ("query", "document")}
    with pytest.raises(UserError, match=r"entries named in the task's loss_terms .*add the other names to loss_terms"):
        model.fit(features, np.zeros(16, "int32"), batch_size=16, epochs=1, verbose=0)


def test_a_step_loss_with_gradient_accumulation_applies_the_mean_of_the_micro_batches_updates(strategy, batches):
    """k=2 micro-batches of 64 on 8 replicas, each with the gathered in-batch loss: one SGD update, the
    mean of the two updates that each micro-batch alone makes on one device from the same weights."""
    make = two_tower(in_batch_loss(global_negatives=True))
    with one_device().scope():
        initial = make().get_weights()
    alone = []
    for micro in batches[:2]:
        _, _, model = parity.train_curve(make, one_device(), initial, [micro])
        alone.append([after - before for after, before in zip(model.get_weights(), initial)])
    replicas = strategy.num_replicas_in_sync
    share = BATCH // replicas

    def dataset_fn(context):
        """One element per replica, in replica order (one input pipeline hands them out in turn): replica
        r's rows of both micro-batches, [2, 8, ...], rows r*8..r*8+7 of each, the order gather keeps."""

        def take(arrays):
            return np.stack(
                [np.stack([array[r * share : (r + 1) * share] for array in arrays]) for r in range(replicas)]
            )

        features = {name: take([b[0][name] for b in batches[:2]]) for name in ("query", "document")}
        return tf.data.Dataset.from_tensor_slices((features, take([b[1] for b in batches[:2]])))

    with strategy.scope():
        model = make()
        model.set_weights(initial)
        model.accumulation_steps = 2
    model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=1, steps_per_epoch=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 1
    assert_same_updates(
        [after - before for after, before in zip(model.get_weights(), initial)],
        [(first + second) / 2 for first, second in zip(*alone)],
        initial,
        terms=BATCH,
    )


def counted_loss(global_batch: bool):
    """Each pair's 4-way cross-entropy (of both towers' first 4 outputs) weighted by a count near 1
    (1 +- 1%, from its features, as a masked-token objective counts its masked tokens); the weighted
    sum divided by this replica's own total (each replica's mean), or by the global batch's
    (`global_mean`)."""

    def step_loss(model, features, targets, outputs, weights):
        logits = outputs["query"][:, :4] + outputs["document"][:, :4]
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(targets, tf.int32), logits)
        counts = 1.0 + 0.01 * tf.sin(1000.0 * features["query"][:, 0])
        if weights is not None:
            counts *= tf.cast(weights, tf.float32)
        if global_batch:
            loss = global_mean(losses, counts)
        else:
            loss = tf.reduce_sum(losses * counts) / tf.reduce_sum(counts)
        return {"loss": loss, "mean_logit": tf.reduce_mean(outputs["query"])}

    return step_loss


def largest_difference(curves: parity.Curves) -> float:
    return max(curves.relative(a, b) for a, b in zip(curves.one_device, curves.replicated))


def test_a_mean_over_each_replicas_own_count_parts_below_1e_3_and_names_the_step_loss(strategy, batches):
    """The curves differ by less than a fixed 1e-3 would see, and by far more than summation order
    explains: no agreement; the step loss is named, with the global-batch mean."""
    keras.utils.set_random_seed(0)  # the initial weights: the difference is 2.6e-4 to 2.8e-4 over seeds
    curves = parity.compare(two_tower(counted_loss(global_batch=False)), batches, one_device(), strategy)
    assert curves.tolerance is None and not curves.draws_random_numbers
    worst = largest_difference(curves)
    assert worst < 1e-3  # a fixed tolerance of 1e-3 agreed here
    assert worst > 10 * curves.bound > 0, curves
    assert curves.parting_step == 0  # each replica's mean is another number from the first batch on
    (cause,) = curves.causes()
    assert cause.startswith("per-replica batch-level loss")
    assert "the task's step loss (build_step_loss) is the likeliest cause" in cause
    assert "core.model.global_mean(values, weights)" in cause
    lines = parity.report(curves, None, None, "float32")
    verdict = next(line for line in lines if line.startswith("verdict:"))
    first = curves.relative(curves.one_device[0], curves.replicated[0])
    assert verdict.startswith(f"verdict: the curves part at step 0 (difference {first:.1e}, beyond bound ")
    assert f"reversed or its halves swapped move the loss by up to {curves.order:.1e}" in verdict

    # --tolerance 1e-3, given: the verdict follows it, and says where it came from.
    given = dataclasses.replace(curves, tolerance=1e-3)
    assert given.parting_step is None and given.causes() == []
    verdict = next(line for line in parity.report(given, None, None, "float32") if line.startswith("verdict:"))
    assert verdict.startswith("verdict: agree: 8 replicas train as one device does (largest difference")
    assert "tolerance 0.001, given with --tolerance" in verdict


def test_the_global_batch_mean_agrees_and_has_the_one_device_gradient(strategy, batches):
    make = two_tower(counted_loss(global_batch=True))
    curves = parity.compare(make, batches, one_device(), strategy)
    assert curves.parting_step is None and curves.causes() == [], curves
    assert largest_difference(curves) <= curves.bound
    verdict = next(line for line in parity.report(curves, None, None, "float32") if line.startswith("verdict:"))
    assert verdict.startswith("verdict: agree") and "halves swapped move the loss by up to" in verdict
    updates = []
    for side in (one_device(), strategy):
        _, _, model = parity.train_curve(make, side, curves.initial, batches[:1])
        updates.append([after - before for after, before in zip(model.get_weights(), curves.initial)])
        # One step of SGD on the first batch lowers that batch's loss (the gradient's sign, on both sides).
        trained = model.test_on_batch(*batches[0], return_dict=True)["loss"]
        assert trained < curves.one_device_inference == pytest.approx(curves.replicated_inference, rel=1e-6)
    assert_same_updates(*updates, curves.initial, terms=BATCH)
    assert min(np.abs(update).max() for update in updates[0]) > 1e-4  # every weight moved


def test_the_global_batch_mean_is_reported_per_counted_value_over_the_real_examples(strategy):
    """Evaluation on 8 replicas, 2 examples each per batch, padding weighted 0: the reported loss is
    sum(values x counts) / sum(counts) over the real examples of every batch (a token loss's
    ln(perplexity)), not a mean of the replicas' or the batches' means."""

    def step_loss(model, features, targets, outputs, weights):
        values = tf.reduce_mean(features["query"], axis=1)
        counts = features["document"][:, 0] * tf.cast(weights, tf.float32)
        return {"loss": global_mean(values, counts), "mean_logit": tf.constant(1.0)}

    with strategy.scope():
        model = two_tower(step_loss)()
    rng = np.random.default_rng(1)
    values = rng.uniform(0, 10, 32).astype("float32")
    counts = rng.integers(0, 4, 32).astype("float32")  # some examples count nothing
    weights = np.array([1.0] * 24 + [0.0] * 8, "float32")  # the last 8: padding
    features = {"query": np.repeat(values[:, None], 8, axis=1), "document": np.repeat(counts[:, None], 8, axis=1)}
    results = model.evaluate(
        features, np.zeros(32, "int32"), sample_weight=weights, batch_size=16, verbose=0, return_dict=True
    )
    expected = float((values * counts * weights).sum() / (counts * weights).sum())
    assert results["loss"] == pytest.approx(expected, rel=1e-6)
    by_example = float((values * weights).sum() / weights.sum())
    assert abs(by_example - expected) > 0.1  # the mean by examples is another number


def test_the_bound_is_what_summation_order_explains_unless_a_tolerance_is_given():
    """ORDER_FACTOR x the largest difference of the reversed or the rotated batches, at least ROUNDING;
    a difference above it parts the curves at that step, one below it agrees; --tolerance replaces it."""
    base = [2.0, 1.9, 1.8]

    def curves(replicated: float, reordered: float, tolerance=None, rotated=0.0) -> parity.Curves:
        moved = lambda by: [value * (1 + by) for value in base]  # noqa: E731
        replicated_curve = [base[0], *moved(replicated)[1:]]
        orders = {"replayed": base, "reordered": moved(reordered), "rotated": moved(rotated)}
        return parity.Curves(8, base, replicated_curve, 2.0, 2.0, tolerance, **orders)

    assert parity.ORDER_FACTOR * 1e-6 > parity.ROUNDING
    assert curves(0, 1e-6).order == pytest.approx(1e-6, rel=1e-3)
    # The larger of the two reorderings, whichever it is.
    assert curves(0, 1e-7, rotated=1e-6).order == pytest.approx(1e-6, rel=1e-3)
    assert curves(0, 1e-6, rotated=1e-7).order == pytest.approx(1e-6, rel=1e-3)
    assert curves(3 * 1e-6, 1e-7, rotated=1e-6).parting_step is None
    assert curves(0, 1e-6).bound == pytest.approx(parity.ORDER_FACTOR * 1e-6, rel=1e-3)
    assert curves(0.95 * parity.ORDER_FACTOR * 1e-6, 1e-6).parting_step is None
    assert curves(1.05 * parity.ORDER_FACTOR * 1e-6, 1e-6).parting_step == 1
    # Order that moves nothing: the bound is float32 rounding.
    assert curves(0, 0).bound == parity.ROUNDING
    assert curves(0.9 * parity.ROUNDING, 0).parting_step is None
    assert curves(1.1 * parity.ROUNDING, 0).parting_step == 1
    # Given: whatever the order says.
    assert curves(5e-4, 1e-7, tolerance=1e-3).parting_step is None
    assert curves(2e-3, 1e-7, tolerance=1e-3).parting_step == 1
    assert curves(2e-3, 1e-7, tolerance=1e-3).bound == 1e-3


def test_the_reorderings_keep_every_example_and_only_move_rows():
    """reversed_rows and rotated_rows: the same examples, features and targets together, in another order
    (the reversal backwards; the rotation the second half first, an odd count's middle example last of it)."""
    rows = np.arange(5)
    batch = ({"query": np.stack([rows, 10 * rows], axis=1)}, rows)
    for reorder, order in ((parity.reversed_rows, [4, 3, 2, 1, 0]), (parity.rotated_rows, [2, 3, 4, 0, 1])):
        ((features, targets),) = reorder([batch])
        assert targets.tolist() == order
        assert features["query"].tolist() == [[row, 10 * row] for row in order]
