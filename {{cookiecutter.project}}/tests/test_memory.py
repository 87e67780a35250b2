"""The memory plan and model FLOPs (core/memory.py), recomputation (core/recompute.py) and the
factored optimizer (core/optimizers.py), on small real Keras models traced and trained here."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from {{ cookiecutter.package }}.core import memory, optimizers, recompute
from {{ cookiecutter.package }}.core.keras import keras

layers = keras.layers


def residual_mlp(blocks: int, width: int = 32, *, remat: bool = False, dropout: float = 0.0, norm: bool = False):
    """`blocks` residual Dense blocks (with dropout and batch norm when asked), each a recomputed
    unit with `remat`: the pattern the shipped models use."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((width,), name="features")
    x = inputs
    for index in range(blocks):
        block_in = keras.Input((width,))
        y = layers.Dense(4 * width, activation="gelu", name=f"up{index}")(block_in)
        if norm:
            y = layers.BatchNormalization(name=f"norm{index}")(y)
        y = recompute.Dropout(dropout, name=f"drop{index}")(y)
        y = layers.Add()([block_in, layers.Dense(width, name=f"down{index}")(y)])
        block = keras.Model(block_in, y, name=f"block{index}")
        x = recompute.Recomputed(block, recompute=remat, name=f"block{index}_unit")(x)
    return keras.Model(inputs, layers.Dense(1, name="out")(x))


def test_model_flops_are_the_matrix_multiplies_counted_exactly():
    model = residual_mlp(2, width=32)
    batch = 8
    # Per block: 32 -> 128 -> 32; then 32 -> 1. Forward FLOPs are 2 x multiply-adds.
    forward = 2 * batch * (2 * (32 * 128 + 128 * 32) + 32 * 1)
    assert memory.forward_flops(model, batch) == forward
    traced = memory.trace(model, batch)
    assert traced.forward_flops == forward
    assert traced.training_flops_per_example == 3 * forward / batch


def test_activations_grow_with_the_batch_and_recomputation_keeps_only_block_inputs():
    plain, recomputed = residual_mlp(4), residual_mlp(4, remat=True)
    small, large = memory.trace(plain, 8), memory.trace(plain, 16)
    assert small.activation_bytes > 0 and large.activation_bytes == 2 * small.activation_bytes
    kept = memory.trace(recomputed, 8)
    # Without recomputation each block keeps its 4x-wide hidden activations; with it, its input.
    assert kept.activation_bytes < small.activation_bytes / 3
    # While a block's backward pass runs, its recomputed activations live: about one block's share.
    one_block = (small.activation_bytes - kept.activation_bytes) / 4
    assert 0.5 * one_block < kept.recompute_bytes < 2 * one_block
    assert kept.forward_flops == small.forward_flops  # model FLOPs do not count the recomputation


def test_a_recomputed_block_has_the_stored_blocks_gradients_and_updates_batch_norm_once():
    model = residual_mlp(2, remat=True, dropout=0.3, norm=True)
    units = [layer for layer in model.layers if isinstance(layer, recompute.Recomputed)]
    statistics = model.non_trainable_variables
    start = [variable.numpy() for variable in statistics]
    x = tf.random.stateless_normal([16, 32], seed=[1, 2])
    results = []
    for recomputing in (False, True):
        for unit in units:
            unit.recompute = recomputing
        for variable, value in zip(statistics, start):
            variable.assign(value)
        for unit in units:  # the same draw of each block's dropout seed in both runs
            unit._random_generator._generator.reset_from_seed(7)

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x, training=True) ** 2)
            return loss, tape.gradient(loss, model.trainable_variables)

        loss, gradients = step(x)
        results.append((float(loss), [g.numpy() for g in gradients], [v.numpy() for v in statistics]))
    (stored_loss, stored, stored_stats), (loss, recomputed, stats) = results
    assert loss == pytest.approx(stored_loss, rel=1e-6)  # the same dropout masks
    for a, b in zip(stored, recomputed):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    for a, b, before in zip(stored_stats, stats, start):
        assert not np.allclose(a, before)  # the forward pass moved them ...
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)  # ... once, not again when recomputed


def test_adafactor_keeps_factored_moments_and_updates_as_tf_keras_does():
    def regression(optimizer):
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((16,)), layers.Dense(8), layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        x = np.random.default_rng(0).normal(size=(64, 16)).astype("float32")
        y = x @ np.linspace(-1, 1, 16, dtype="float32")[:, None]
        history = model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
        return model, optimizer, history.history["loss"]

    ours_model, ours, ours_loss = regression(optimizers.Adafactor(learning_rate=0.05, relative_step=True))
    theirs_model, _, theirs_loss = regression(keras.optimizers.Adafactor(learning_rate=0.05))
    for a, b in zip(ours_model.get_weights(), theirs_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert ours_loss[-1] < ours_loss[0]
    shapes = [tuple(variable.shape) for variable in ours_model.trainable_variables]
    kept = sum(int(np.prod(v.shape)) for v in ours._r + ours._c + ours._v if v is not None)
    assert kept == memory.optimizer_slot_elements("adafactor", shapes) == (16 + 8) + 8 + (8 + 1) + 1
    assert memory.optimizer_slot_elements("adamw", shapes) == 2 * sum(int(np.prod(s)) for s in shapes)


class MaskMultiply(layers.Layer):
    """Dropout written as many models write it: the input times its mask cast to the input's dtype."""

    def call(self, x, training=None):
        return x * tf.cast(tf.random.uniform(tf.shape(x)) >= 0.5, x.dtype) * 2.0


def classifier(dropout=None, features: int = 24, hidden: int = 32, classes: int = 40):
    """features -> hidden -> [dropout] -> float32 logits over `classes`: each tensor the backward pass
    reads is known by hand."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((features,), name="features")
    x = layers.Dense(hidden, name="hidden")(inputs)
    x = dropout(x) if dropout else x
    return keras.Model(inputs, layers.Dense(classes, dtype="float32", name="logits")(x))


def cross_entropy(inputs, targets, outputs):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(targets, outputs)


def test_the_trace_keeps_the_float32_logits_of_the_tasks_loss_and_one_byte_per_dropout_mask():
    batch, features, hidden, classes = 8, 24, 32, 40
    targets = tf.TensorSpec([batch], tf.int32)
    # Each matrix multiply reads its input for its weight's gradient, float32 here.
    inputs_read = 4 * batch * (features + hidden)
    assert memory.trace(classifier(), batch).activation_bytes == inputs_read
    # A softmax cross-entropy keeps its float32 gradient of the logits, batch x classes, for the backward pass.
    with_loss = memory.trace(classifier(), batch, cross_entropy, targets)
    assert with_loss.activation_bytes == inputs_read + 4 * batch * classes
    # Dropout keeps its mask for the backward pass: one byte an element (a predicate in XLA), whether
    # it selects (Keras') or multiplies by the mask cast to float32 (a hand-written one).
    for dropout in (recompute.Dropout(0.5, name="drop"), MaskMultiply(name="drop")):
        dropped = memory.trace(classifier(dropout), batch, cross_entropy, targets)
        assert dropped.activation_bytes == inputs_read + 4 * batch * classes + batch * hidden, dropout
        assert dropped.weight_copy_bytes == 0  # a mask is no weight copy


def test_a_model_built_from_shapes_holds_no_memory_and_plans_like_a_real_one():
    """A 4 GiB layer (float32 32768 x 32768), built and planned from shapes: the process does not
    grow by it, and a real model built before it still trains after it."""
    import resource

    real = residual_mlp(1, width=8)
    real.compile(optimizer="sgd", loss="mse")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with memory.abstract():
        inputs = keras.Input((32768,), name="features")
        wide = layers.Dense(32768, name="wide")(inputs)
        model = keras.Model(inputs, tf.nn.relu(wide - tf.constant(0.5)))
    traced = memory.trace(model, 8)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 2**30, f"building from shapes grew the process by {grown / 2**30:.1f} GiB"
    assert memory.shapes(model.weights) == [(32768, 32768), (32768,)]
    assert traced.forward_flops == 2 * 8 * 32768 * 32768
    assert traced.activation_bytes == 2 * 4 * 8 * 32768  # the input (for the weight's gradient), the relu's output
    history = real.fit(np.ones((16, 8), "float32"), np.ones((16, 1), "float32"), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_a_plan_adds_weights_gradients_slots_and_activations():
    traced = memory.Trace(batch=8, activation_bytes=8 * 2**20, recompute_bytes=0, weight_copy_bytes=0, forward_flops=0)
    shapes = [(1024, 256), (256,)]
    params = 1024 * 256 + 256
    sgd = memory.plan(
        traced, shapes, shapes, per_replica_batch=16, optimizer="sgd", momentum=0.9, accumulation_steps=1, hbm=2**30
    )
    assert (sgd.weights, sgd.gradients, sgd.optimizer_slots, sgd.accumulator) == (4 * params,) * 3 + (0,)
    assert sgd.activations == 16 * 2**20  # twice the traced batch
    odd = memory.plan(
        traced, shapes, shapes, per_replica_batch=12, optimizer="sgd", momentum=0.9, accumulation_steps=1, hbm=2**30
    )
    assert odd.activations == 12 * 2**20  # 1.5 times the traced batch
    adamw = memory.plan(
        traced, shapes, shapes, per_replica_batch=16, optimizer="adamw", momentum=0.9, accumulation_steps=2, hbm=2**30
    )
    assert adamw.optimizer_slots == 8 * params and adamw.accumulator == 4 * params
    assert adamw.total == sgd.total + 8 * params and adamw.fits()
    assert adamw.state == adamw.total - adamw.activations == 4 * params * 5  # weights, gradients, accumulator, 2 slots
    assert not dataclasses.replace(adamw, hbm=2**24).fits()
    # Every part is in the total, once: the trainable weights frozen still hold their weights, not gradients.
    frozen = memory.plan(
        dataclasses.replace(traced, weight_copy_bytes=3 * 2**20, recompute_bytes=2**20),
        shapes + [(512,)],
        shapes,
        per_replica_batch=8,
        optimizer="sgd",
        momentum=0.0,
        accumulation_steps=1,
        hbm=2**30,
    )
    assert frozen.weights == 4 * (params + 512) and frozen.gradients == 4 * params and frozen.optimizer_slots == 0
    assert frozen.weight_copies == 3 * 2**20 and frozen.activations == 9 * 2**20
    assert frozen.total == 4 * (params + 512) + 4 * params + 3 * 2**20 + 9 * 2**20
    assert frozen.state == frozen.total - 9 * 2**20


def test_a_plan_passes_warns_and_fails_at_its_boundaries():
    """What a plan may use is the HBM less 15% for XLA's own buffers; up to 80% of that it passes,
    up to all of it it warns (the estimate is not exact), beyond it fails."""
    hbm = 100 * 2**30
    usable = int(hbm * 0.85)

    def with_total(total: int) -> memory.Plan:
        return memory.Plan(
            weights=0, gradients=0, accumulator=0, optimizer_slots=0, weight_copies=0, activations=total, hbm=hbm
        )

    assert with_total(0).usable == usable
    assert with_total(2**30).breakdown() == "activations 1.00 GiB"  # no loops, nothing left out
    with pytest.raises(dataclasses.FrozenInstanceError):
        with_total(0).hbm = 1
    # Adafactor factors a weight of 3 or more dimensions over its last two: 2x3 rows, 2x4 columns.
    assert memory.optimizer_slot_elements("adafactor", [(2, 3, 4), (5,)]) == 2 * 3 + 2 * 4 + 5
    assert with_total(int(0.8 * usable)).verdict() == "pass"
    assert with_total(int(0.8 * usable) + 1).verdict() == "warn"
    assert with_total(usable).verdict() == "warn"
    assert with_total(usable + 1).verdict() == "fail"


def test_a_v3_replica_is_one_tensorcore_planned_against_half_the_chip():
    """v2 and v3 chips are two TensorCores, each its own replica with half the chip's HBM; the doctor
    plans a replica against its TensorCore's share and reports the chip as two of them."""
    from {{ cookiecutter.package }} import tasks
    from {{ cookiecutter.package }}.core import config, topology
    from {{ cookiecutter.package }}.core.topology import Target
    from {{ cookiecutter.package }}.doctor import memory as memory_rule
    from {{ cookiecutter.package }}.doctor.engine import Context

    assert topology.chip("v2-8").replica_hbm_bytes == 8 * 2**30
    assert topology.chip("v3-8").replica_hbm_bytes == 16 * 2**30
    assert topology.chip("v4-8").replica_hbm_bytes == 32 * 2**30
    cfg = config.load(None, ["runtime.mixed_precision=bfloat16", "train.global_batch_size=64"], registry=tasks)
    verdict = memory_rule.verdict(Context(cfg, tasks.load(cfg.task), Target("tpu", 8, 1, tpu_type="v3-8", chips=4)))
    assert "of 32.0 GiB HBM per v3 chip" in verdict.message
    assert "of 16.0 GiB per TensorCore, x2" in verdict.message, verdict.message


def test_out_of_memory_is_one_line_with_the_estimate_the_hbm_and_the_levers():
    from {{ cookiecutter.package }} import tasks
    from {{ cookiecutter.package }}.core import config
    from {{ cookiecutter.package }}.core.topology import Target
    from {{ cookiecutter.package }}.core.levers import out_of_memory

    cfg = config.load(None, ["train.global_batch_size=128", "runtime.mixed_precision=bfloat16"], registry=tasks)
    task = tasks.load(cfg.task)
    manifest = task.nominal_manifest(cfg.data)
    error = tf.errors.ResourceExhaustedError(
        None, None, "Ran out of memory in memory space hbm. Used 17.2G of 15.75G hbm.\nBuffer 1: ..."
    )
    message = out_of_memory(cfg, task, manifest, Target("tpu", 8, 1, tpu_type="v5litepod-8", chips=8), error)
    assert "\n" not in message
    assert message.startswith("out of device memory at 16 examples per replica (Ran out of memory in memory space hbm")
    assert "GiB per replica (weights" in message and "of 14.9 GiB HBM" in message
    assert "`make doctor`" in message and "train.optimizer=adafactor" in message
    assert "train.gradient_accumulation_steps" in message


def test_utilisation_is_per_chip_against_the_generations_peak():
    from {{ cookiecutter.package }}.core import topology, utilisation
    from {{ cookiecutter.package }}.core.topology import Target

    # v3-8: 8 TensorCores on 4 chips of 123 TFLOP/s; a 246-TFLOP step once a second uses half of them.
    v3 = utilisation.Utilisation(246e12, Target("tpu", 8, 1, tpu_type="v3-8"), "bfloat16", "")
    assert v3.chips == 4 and v3.tflops_per_chip(1.0) == pytest.approx(61.5) and v3.mfu(1.0) == pytest.approx(0.5)
    assert topology.chips_of("v5litepod-16", 16) == 16 and topology.chips_of("v4-32", 16) == 16
    unknown = utilisation.Utilisation(1e12, Target("tpu", 8, 1, tpu_type="v9-8"), "bfloat16", "")
    assert unknown.mfu(1.0) is None and "no peak known" in unknown.describe()
    gpu = utilisation.Utilisation(1e12, Target("gpu", 2, 1), "bfloat16", "")
    assert gpu.chips == 2 and gpu.mfu(1.0) is None
