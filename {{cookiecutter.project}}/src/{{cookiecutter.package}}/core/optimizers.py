"""The optimizers `train.optimizer` names: `sgd` (Nesterov momentum), `adamw`, and `adafactor`,
whose second moment of a matrix is a row and a column vector instead of a copy of the matrix.

Memory per float32 weight (4 bytes each): SGD keeps 1 slot, AdamW 2, Adafactor about 0 for
matrices (rows + columns) and 1 for vectors; `make doctor` counts them for the config's model.
"""

from __future__ import annotations

import tensorflow as tf

from . import schedule
from .config import TrainConfig
from .keras import keras

# Weights without decay: normalisation scales and offsets, biases, embedding tables.
NO_DECAY = ["gamma", "beta", "bias", "embeddings"]


class Adafactor(keras.optimizers.Adafactor):
    """tf_keras' Adafactor (Shazeer and Stern, 2018) without its full-size copy of the second
    moment: tf_keras keeps one per weight (`v`) though for a matrix it is rebuilt each step from
    the factored row and column moments, which is what this class does instead.

    The update (clipped to an RMS of `clip_threshold`) is tf_keras'. Its step is the learning
    rate, as AdamW's is, so `train.base_learning_rate` and its scaling and schedule mean the same
    for both; `relative_step=True` multiplies it by each weight's RMS (and caps it at
    1/sqrt(step)), as tf_keras does, which needs a rate about 10-100x larger."""

    def __init__(self, learning_rate=0.001, relative_step: bool = False, **kwargs):
        super().__init__(learning_rate=learning_rate, relative_step=relative_step, **kwargs)

    def build(self, var_list):
        keras.optimizers.Optimizer.build(self, var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._r, self._c, self._v = [], [], []
        for var in var_list:
            name = var._shared_name
            if len(var.shape) < 2:  # vectors: an unfactored second moment
                self._r.append(None)
                self._c.append(None)
                self._v.append(self.add_variable_from_reference(model_variable=var, variable_name="v"))
            else:
                self._r.append(self.add_variable(shape=var.shape[:-1], dtype=var.dtype, name=f"r/{name}"))
                self._c.append(
                    self.add_variable(shape=var.shape[:-2] + var.shape[-1], dtype=var.dtype, name=f"c/{name}")
                )
                self._v.append(None)

    def update_step(self, gradient, variable):
        lr = tf.cast(self.learning_rate, variable.dtype)
        step = tf.cast(self.iterations + 1, variable.dtype)
        index = self._index_dict[self._var_key(variable)]
        if self.relative_step:
            scale = tf.maximum(tf.cast(self.epsilon_2, variable.dtype), self._rms(variable))
            step_size = scale * tf.minimum(lr, tf.math.rsqrt(step))
        else:
            step_size = lr
        squared = tf.square(gradient) + self.epsilon_1
        decay = 1 - tf.pow(step, self.beta_2_decay)
        if self._v[index] is not None:
            second = self._v[index]
            second.assign(decay * second + (1 - decay) * squared)
            second = tf.convert_to_tensor(second)
        else:
            rows, columns = self._r[index], self._c[index]
            rows.assign(decay * rows + (1 - decay) * tf.reduce_mean(squared, axis=-1))
            columns.assign(decay * columns + (1 - decay) * tf.reduce_mean(squared, axis=-2))
            second = tf.expand_dims(rows / tf.reduce_mean(rows, axis=-1, keepdims=True), -1) * tf.expand_dims(
                columns, -2
            )
        update = gradient * tf.math.rsqrt(second)
        update = update / tf.maximum(1.0, self._rms(update) / self.clip_threshold)
        variable.assign_add(-step_size * update)


def make(train: TrainConfig) -> keras.optimizers.Optimizer:
    """The optimizer of `train.optimizer`, on the scaled, warmed-up learning-rate schedule."""
    learning_rate = schedule.from_config(train)
    if train.optimizer == "adamw":
        optimizer = keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=train.weight_decay)
    elif train.optimizer == "adafactor":
        optimizer = Adafactor(learning_rate=learning_rate, weight_decay=train.weight_decay)
    else:
        optimizer = keras.optimizers.SGD(
            learning_rate=learning_rate, momentum=train.momentum, nesterov=True, weight_decay=train.weight_decay
        )
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer
