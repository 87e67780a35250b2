"""Learning rate: linear scaling with the global batch, linear warm-up, cosine decay.

Scaling rule (Goyal et al., 2017): when the global batch grows k times, so does the learning
rate; the warm-up keeps the first steps of a large-batch run stable. The schedule is a function
of the optimizer's step counter, which is checkpointed, so a resumed run continues the schedule
exactly where it stopped.
"""

from __future__ import annotations

import math

import tensorflow as tf

from .config import TrainConfig
from .keras import keras


def scaled_learning_rate(base_learning_rate: float, global_batch_size: int, base_batch_size: int) -> float:
    """The one place the linear scaling rule lives."""
    return base_learning_rate * global_batch_size / base_batch_size


def learning_rate_at(step: float, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Plain-Python value of the schedule at `step` (for logging and tests)."""
    if warmup_steps and step < warmup_steps:
        return peak * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


@keras.utils.register_keras_serializable(package="{{ cookiecutter.package }}")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then cosine decay to 0 at `total_steps`."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = self.peak * step / max(1, self.warmup_steps)
        progress = tf.minimum(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        decay = self.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        return tf.where(step < self.warmup_steps, warmup, decay)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


def from_config(train: TrainConfig) -> WarmupCosine:
    effective_batch = train.global_batch_size * train.gradient_accumulation_steps
    peak = scaled_learning_rate(train.base_learning_rate, effective_batch, train.base_batch_size)
    return WarmupCosine(peak, train.warmup_steps, train.total_steps)
