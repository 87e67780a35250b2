"""The Transformer pieces the text tasks share: the embedding table's size, learned absolute
positions, the pre-LayerNorm block and the checks of the model keys.

TPU notes: the embedding table has a multiple of 128 rows and the widths in configs/tpu.yaml are
multiples of 128, because the MXU multiplies 128x128 tiles and pads anything else.
"""

from __future__ import annotations

import tensorflow as tf

from ...core import recompute
from ...core.errors import UserError
from ...core.keras import keras
from .config import TextModelConfig

layers = keras.layers
EMBEDDING_ROW_MULTIPLE = 128


def embedding_rows(vocab_size: int) -> int:
    """Rows of the embedding table: the vocabulary rounded up to a multiple of 128, so that the
    table splits into whole MXU tiles (the extra rows are never looked up)."""
    return -(-vocab_size // EMBEDDING_ROW_MULTIPLE) * EMBEDDING_ROW_MULTIPLE


class PositionEmbedding(layers.Layer):
    """Adds a learned vector per position to [batch, seq_len, width] inputs (absolute positions, one
    sequence per row; a model of packed documents looks its positions up in an `Embedding` instead)."""

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


class MultiHeadAttention(layers.MultiHeadAttention):
    """Keras' attention, with the attention-probability dropout of `recompute.Dropout`, so that a
    recomputed block drops the same attention weights in its backward pass."""

    def _build_attention(self, rank):
        super()._build_attention(rank)
        self._dropout_layer = recompute.Dropout(rate=self._dropout, name="attention_probs_drop")


def transformer_block(x, attention_mask, config: TextModelConfig, name: str):
    """One pre-LayerNorm block: self-attention where `attention_mask` allows, then a GELU MLP.
    With `model.remat` the block is one recomputed unit: only its input (and the mask) is kept for
    the backward pass."""
    if not config.remat:
        return _block(x, attention_mask, config, name)
    x_in = keras.Input(shape=x.shape[1:], dtype=x.dtype, name=f"{name}_input")
    mask_in = keras.Input(shape=attention_mask.shape[1:], dtype=attention_mask.dtype, name=f"{name}_mask")
    block = keras.Model([x_in, mask_in], _block(x_in, mask_in, config, name), name=name)
    return recompute.Recomputed(block, name=f"{name}_recomputed")([x, attention_mask])


def _block(x, attention_mask, config: TextModelConfig, name: str):
    # Pre-LayerNorm: the residual path stays an identity, which trains stably without the long,
    # careful warm-up that post-LayerNorm Transformers need.
    y = layers.LayerNormalization(epsilon=1e-6, name=f"{name}_attention_norm")(x)
    y = MultiHeadAttention(
        config.heads, config.width // config.heads, dropout=config.dropout, name=f"{name}_attention"
    )(y, y, attention_mask=attention_mask)
    x = layers.Add(name=f"{name}_attention_add")(
        [x, recompute.Dropout(config.dropout, name=f"{name}_attention_drop")(y)]
    )
    y = layers.LayerNormalization(epsilon=1e-6, name=f"{name}_mlp_norm")(x)
    y = layers.Dense(config.mlp_width, activation="gelu", name=f"{name}_mlp_in")(y)
    y = layers.Dense(config.width, name=f"{name}_mlp_out")(
        recompute.Dropout(config.dropout, name=f"{name}_mlp_drop")(y)
    )
    return layers.Add(name=f"{name}_mlp_add")([x, y])


def check(config: TextModelConfig) -> None:
    for key, value in (
        ("model.width", config.width),
        ("model.depth", config.depth),
        ("model.heads", config.heads),
        ("model.mlp_width", config.mlp_width),
    ):
        if value < 1:
            raise UserError(f"{key} must be at least 1, got {value}")
    if config.width % config.heads:
        raise UserError(
            f"model.width ({config.width}) must divide evenly by model.heads ({config.heads}); "
            f"change one of them, e.g. model.heads={_divisor_near(config.width, config.heads)}"
        )
    if not 0.0 <= config.dropout < 1.0:
        raise UserError(f"model.dropout must be in [0, 1), got {config.dropout}")


def _divisor_near(width: int, heads: int) -> int:
    return min((d for d in range(1, width + 1) if width % d == 0), key=lambda d: (abs(d - heads), d))
