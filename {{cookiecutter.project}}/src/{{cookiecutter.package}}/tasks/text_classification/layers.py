"""The classifier's own layer: learned absolute positions (the shared Transformer pieces are in
../text/layers.py).
"""

from __future__ import annotations

import tensorflow as tf

from ...core.keras import keras


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position to [batch, seq_len, width] inputs."""

    def __init__(self, seq_len: int, width: int, **kwargs):
        super().__init__(**kwargs)
        self.seq_len, self.width = seq_len, width

    def build(self, input_shape):
        # Named like Embedding's table, so that rules keyed on "embeddings" (no weight decay) cover it.
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=[self.seq_len, self.width],
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )

    def call(self, inputs):
        return inputs + tf.cast(self.embeddings, inputs.dtype)

    def get_config(self):
        return {**super().get_config(), "seq_len": self.seq_len, "width": self.width}
