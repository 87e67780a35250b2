"""The example model: a small pre-LayerNorm decoder-only Transformer over packed windows.

Replace `build_model` to bring your own model; the rest of the project needs a Keras model that takes
{inputs, segment_ids, positions} int32 [batch, seq_len] and returns float32 next-token logits
[batch, seq_len, embedding rows].

Attention is causal and within a segment: position q sees position k only when k <= q and both hold
the same document, so packed documents stay independent and padding (segment 0) reaches nothing
real. Every shape is static; the mask is computed, never sliced. The embedding table has a multiple
of 128 rows (the extra rows are never targets, and generation masks them); under mixed_bfloat16 the
blocks compute in bfloat16 with float32 variables, and the logits are float32 for a stable loss.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from ...core.keras import keras
from ..text.layers import check, embedding_rows, transformer_block
from .config import LanguageModelConfig

layers = keras.layers


class TiedLogits(layers.Layer):
    """Next-token logits from the input embedding table, transposed: [B, S, W] -> [B, S, rows]."""

    def __init__(self, embedding: layers.Embedding, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.embedding = embedding

    def call(self, x):
        return tf.matmul(tf.cast(x, tf.float32), tf.cast(self.embedding.embeddings, tf.float32), transpose_b=True)


def attention_mask(segment_ids, seq_len: int):
    """[B, S, S] bool: query q may attend to key k when k <= q and both are in the same segment."""
    causal = tf.constant(np.tril(np.ones((seq_len, seq_len), dtype=bool)))
    same_segment = tf.equal(segment_ids[:, :, None], segment_ids[:, None, :])
    return tf.logical_and(same_segment, causal[None])


def build_model(config: LanguageModelConfig, seq_len: int, vocab_size: int) -> keras.Model:
    check(config)
    features = {
        name: keras.Input(shape=(seq_len,), dtype="int32", name=name) for name in ("inputs", "segment_ids", "positions")
    }
    embedding = layers.Embedding(embedding_rows(vocab_size), config.width, name="token_embedding")
    x = embedding(features["inputs"])
    x = x + layers.Embedding(seq_len, config.width, name="position_embedding")(features["positions"])
    x = layers.Dropout(config.dropout, name="embedding_drop")(x)
    mask = attention_mask(features["segment_ids"], seq_len)
    for block in range(config.depth):
        x = transformer_block(x, mask, config, f"block{block}")
    x = layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
    if config.tie_embeddings:
        logits = TiedLogits(embedding, name="logits")(x)
    else:
        logits = layers.Dense(embedding_rows(vocab_size), dtype="float32", name="logits")(x)
    return keras.Model(features, logits, name="decoder")
