"""make parity on a model that draws random numbers in training: a noise layer of the model's own (no
Keras Dropout, so parity cannot switch it off) makes one device differ from itself, and parity says so
and names the layer instead of comparing the curves; so does one whose noise is seeded by a counter it
keeps in a non-trainable weight. The same model without it agrees, and so does a recurrent model with
the dropout of its (Bidirectional) LSTM's cells and of an attention layer, which parity switches off.
Small classifiers on random features, the suite's 8-replica strategy against one CPU device, float32."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from {{ cookiecutter.package }} import parity
from {{ cookiecutter.package }}.core.keras import keras

BATCH, STEPS = 64, 3
pytestmark = pytest.mark.usefixtures("seeded_weights")  # each verdict the same every run


@pytest.fixture(scope="module")
def batches():
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(STEPS):
        features = rng.normal(size=(BATCH, 8)).astype("float32")
        pairs.append(({"features": features}, features[:, :4].argmax(axis=1).astype("int32")))
    return pairs


class Jitter(keras.layers.Layer):
    """Adds uniform noise of +-`scale` to its inputs in training, drawn one of three ways: a stateful
    op without a seed, the same with an op seed (each traced step restarts the same stream), or a
    tf.random.Generator of its own."""

    def __init__(self, scale: float, draw: str, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.draw = scale, draw
        self.generator = tf.random.Generator.from_seed(7) if draw == "generator" else None

    def call(self, inputs, training=None):
        if not training:
            return inputs
        shape = tf.shape(inputs)
        if self.generator is not None:
            noise = self.generator.uniform(shape, -1.0, 1.0)
        else:
            noise = tf.random.uniform(shape, -1.0, 1.0, seed=3 if self.draw == "seeded" else None)
        return inputs + self.scale * noise


class CountedNoise(keras.layers.Layer):
    """Adds uniform noise of +-`scale` to its inputs in training, from a stateless op seeded by a
    counter that it keeps in a non-trainable weight and advances at every step: no random op in the
    traced step, and a new draw at every step all the same."""

    def __init__(self, scale: float, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def build(self, input_shape):
        self.count = self.add_weight(
            name="count",
            shape=(),
            dtype="int64",
            initializer="zeros",
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    def call(self, inputs, training=None):
        if not training:
            return inputs
        count = tf.convert_to_tensor(self.count.assign_add(1))
        noise = tf.random.stateless_uniform(tf.shape(inputs), tf.stack([count, tf.zeros_like(count)]), -1.0, 1.0)
        return inputs + self.scale * noise


def classifier(draw: str | None):
    """A 4-way classifier with Keras' own noise layers, which parity switches off, and (`draw`) a
    Jitter or (`counter`) a CountedNoise, which it cannot."""

    def make():
        inputs = keras.Input((8,), name="features")
        if draw == "counter":
            x = CountedNoise(0.0002, name="counted_noise")(inputs)
        else:
            x = Jitter(0.0002, draw, name="jitter")(inputs) if draw else inputs
        x = keras.layers.GaussianNoise(0.1, name="gaussian_noise")(x)
        x = keras.layers.Dense(16, activation="relu", name="hidden")(x)
        x = keras.layers.Dropout(0.3, name="dropout")(x)
        x = keras.layers.GaussianDropout(0.2, name="gaussian_dropout")(x)
        model = keras.Model({"features": inputs}, keras.layers.Dense(4, name="logits")(x))
        assert parity.dropout_off(model) == 3
        model.compile(keras.optimizers.Adam(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return make


def one_device():
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def verdict(curves: parity.Curves) -> list[str]:
    """The report's verdict line and its causes."""
    lines = parity.report(curves, None, None, "float32")
    start = next(index for index, line in enumerate(lines) if line.startswith("verdict: "))
    return [line for line in lines[start:] if not line.startswith("precision: ")]


@pytest.mark.parametrize("draw", ["unseeded", "seeded", "generator"])
def test_a_noise_layer_of_the_models_own_is_named_and_gets_no_verdict(strategy, batches, draw):
    curves = parity.compare(classifier(draw), batches, one_device(), strategy, tolerance=1e-3)
    # The noise is small: the curves stay within --tolerance 1e-3, where the comparison alone would agree
    # (5e-6 to 3e-5 apart over seeds 0-5, by chance: no bound measured from the reorderings holds them).
    assert curves.parting_step is None, curves
    assert curves.draws_random_numbers, curves  # noise > parity.ROUNDING
    op = "RngReadAndSkip" if draw == "generator" else "RandomUniform"
    assert curves.random_layers == [f"jitter ({op})"]
    (first, cause) = verdict(curves)
    assert first.startswith("verdict: none: the model draws random numbers in training") and "agree" not in first
    assert cause.startswith("  - random numbers in training:") and "Drawn in: jitter" in cause
    assert "keras.layers.Dropout subclass" in cause
    assert curves.causes() == [cause[len("  - ") :]]
    assert not curves.only_norms(curves)


def test_the_same_model_without_it_repeats_itself_and_agrees(strategy, batches):
    curves = parity.compare(classifier(None), batches, one_device(), strategy)
    # The same traced step from the same start on a CPU: the same losses, bit for bit.
    assert curves.replayed == curves.one_device and curves.noise == 0.0
    assert not curves.draws_random_numbers and curves.random_layers == []
    assert curves.parting_step is None and curves.causes() == [], curves
    assert curves.one_device[-1] < curves.one_device[0]  # it trained
    (line,) = verdict(curves)
    assert line.startswith("verdict: agree: 8 replicas train as one device does")
    report = parity.report(curves, None, None, "float32")
    assert "noise floor: the same 3 steps again on one device from the same weights: largest difference 0.0e+00" in (
        line.split(" (")[0] for line in report
    )


def test_noise_seeded_by_a_non_trainable_counter_is_caught(strategy, batches):
    # The replay restores the trainable weights and the optimizer's state, not the counter: the same
    # steps again draw other numbers, though no op of the traced step is a random one.
    curves = parity.compare(classifier("counter"), batches, one_device(), strategy)
    assert curves.draws_random_numbers, curves
    assert curves.random_layers == []
    (first, cause) = verdict(curves)
    assert first.startswith("verdict: none: the model draws random numbers in training")
    assert "Drawn in: no random op under a layer's name in the traced step" in cause
    assert "seed stateless random ops from a variable they update" in cause


def recurrent():
    """A 4-way classifier of the features read as a sequence of 4 steps: self-attention with dropout,
    then a Bidirectional LSTM with dropout and recurrent_dropout (one cell each way). Its initial
    weights are seeded: whether 3 steps lower the loss depends on them."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,), name="features")
    steps = keras.layers.Reshape((4, 2))(inputs)
    attended = keras.layers.Attention(dropout=0.3, name="attention")([steps, steps])
    lstm = keras.layers.LSTM(8, dropout=0.3, recurrent_dropout=0.3, name="lstm")
    x = keras.layers.Bidirectional(lstm, name="bidirectional")(keras.layers.Concatenate()([steps, attended]))
    model = keras.Model({"features": inputs}, keras.layers.Dense(4, name="logits")(x))
    assert parity.dropout_off(model) == 3  # the attention and the LSTM's cell each way
    bidirectional = model.get_layer("bidirectional")
    for way in (bidirectional.forward_layer, bidirectional.backward_layer):
        assert way.dropout == way.recurrent_dropout == 0.0  # read from its cell
    assert model.get_layer("attention").dropout == 0.0
    model.compile(keras.optimizers.Adam(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    tf.random.set_seed(None)  # the seed stays with these weights: later draws are unseeded again
    np.random.seed(None)
    return model


def test_a_recurrent_model_with_dropout_in_its_cells_and_attention_repeats_itself_and_agrees(strategy, batches):
    curves = parity.compare(recurrent, batches, one_device(), strategy)
    assert curves.replayed == curves.one_device and curves.noise == 0.0, curves
    assert not curves.draws_random_numbers and curves.random_layers == []
    assert curves.parting_step is None and curves.causes() == [], curves
    assert curves.one_device[-1] < curves.one_device[0]  # it trained
    (line,) = verdict(curves)
    assert line.startswith("verdict: agree: 8 replicas train as one device does")
