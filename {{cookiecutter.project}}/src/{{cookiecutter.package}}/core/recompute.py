"""Recomputation of activations (`model.remat: true`): a block keeps only its inputs for the
backward pass and runs its forward pass again there, trading about a third more compute for the
activations of every layer inside it.

    block = keras.Model([x_in, mask_in], y, name="block0")   # any functional block
    x = recompute.Recomputed(block, name="block0_recomputed")([x, mask]) if config.remat else block([x, mask])

The backward pass must see what the forward pass saw, so inside a recomputed block:
- `recompute.Dropout` (use it instead of Keras' Dropout in blocks) draws its mask from a seed the
  block's call draws once, so the recomputation draws the same mask (the seed comes from the
  Recomputed layer's own tf.random.Generator, which core/model.py checkpoints with the model: a
  resumed run draws the seeds, and so the masks, that the uninterrupted run drew);
- batch normalization updates its moving statistics once, in the forward pass (the recomputation
  leaves them as they are).

`make doctor` counts what a recomputed model keeps (core/memory.py), and `make parity`-style tests
check that the gradient of a recomputed block equals the stored one.
"""

from __future__ import annotations

import contextlib
import threading
import zlib

import tensorflow as tf

from .keras import keras

_CALL = threading.local()  # the seed of the recomputed block being traced, if any


@contextlib.contextmanager
def _inside_block(seed):
    previous = getattr(_CALL, "seed", None)
    _CALL.seed = seed
    try:
        yield
    finally:
        _CALL.seed = previous


@contextlib.contextmanager
def _statistics_frozen(block: keras.layers.Layer):
    """Batch normalization's moving statistics stay as they are while the block is recomputed:
    with momentum 1 the update writes back the value it read."""
    norms = [layer for layer in block._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 1.0
    try:
        yield
    finally:
        for layer, momentum in zip(norms, momenta):
            layer.momentum = momentum


class Dropout(keras.layers.Dropout):
    """Keras' Dropout, except inside a recomputed block: there the mask is a stateless function of
    the block call's seed and the layer's name, so the recomputation in the backward pass drops the
    same units as the forward pass did."""

    def call(self, inputs, training=None):
        seed = getattr(_CALL, "seed", None)
        if seed is None or not training or self.rate == 0:
            return super().call(inputs, training=training)
        layer_seed = tf.random.experimental.stateless_fold_in(seed, zlib.crc32(self.name.encode()) & 0x7FFFFFFF)
        return tf.nn.experimental.stateless_dropout(
            inputs, self.rate, seed=layer_seed, noise_shape=self._get_noise_shape(inputs)
        )


class Recomputed(keras.__internal__.layers.BaseRandomLayer):
    """Calls `block` (a Keras model or layer) so that, in training, only its inputs are kept for
    the backward pass, which recomputes the block's forward pass. Inference calls it directly.
    Each training call draws the seed of the block's `Dropout` masks from the layer's
    tf.random.Generator (a different one on each replica)."""

    def __init__(self, block: keras.layers.Layer, recompute: bool = True, **kwargs):
        super().__init__(rng_type="stateful", **kwargs)  # a tf.random.Generator, whatever Keras' default
        self.block, self.recompute = block, recompute

    def call(self, inputs, training=None):
        if not training:
            return self.block(inputs, training=False)
        seed = self._random_generator.make_seed_for_stateless_op()
        if not self.recompute:  # the same function, stored rather than recomputed (for tests)
            with _inside_block(seed):
                return self.block(inputs, training=True)
        flat = tf.nest.flatten(inputs)
        differentiable = [tensor.dtype.is_floating for tensor in flat]
        block = self.block

        @tf.custom_gradient
        def forward(seed, *tensors):
            with _inside_block(seed):
                outputs = block(tf.nest.pack_sequence_as(inputs, list(tensors)), training=True)

            def backward(*upstream, variables=None):
                # XLA orders work by data, not by control dependencies: a dependency on the
                # upstream gradient keeps the recomputation from running (and holding its
                # activations) before the backward pass reaches this block.
                first = tf.reduce_max(tf.cast(tf.reshape(upstream[0], [-1])[:1], tf.float32))
                after = tf.where(tf.equal(first, first), 0.0, float("nan"))
                again = [
                    tensor + tf.cast(after, tensor.dtype) if floating else tensor
                    for tensor, floating in zip(tensors, differentiable)
                ]
                watched = [tensor for tensor, floating in zip(again, differentiable) if floating]
                variables = list(variables or [])
                with tf.name_scope(f"recompute_{self.name}"), tf.GradientTape() as tape:
                    tape.watch(watched)
                    tape.watch(variables)
                    with _inside_block(seed), _statistics_frozen(block):
                        recomputed = block(tf.nest.pack_sequence_as(inputs, again), training=True)
                gradients = tape.gradient(
                    recomputed,
                    watched + variables,
                    output_gradients=list(upstream),
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                by_input = iter(gradients[: len(watched)])
                input_gradients = [next(by_input) if floating else None for floating in differentiable]
                return [None, *input_gradients], gradients[len(watched) :]

            return outputs, backward

        return forward(seed, *flat)
