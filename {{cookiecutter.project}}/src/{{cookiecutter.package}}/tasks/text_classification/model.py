"""The example model: a small Transformer encoder for text classification.

Replace `build_model` to bring your own model; the rest of the project only needs a Keras model
that takes int32 token ids [batch, seq_len] (0 = padding) and returns float32 logits
[batch, classes].

TPU notes: every shape is static ([batch, seq_len] in, no Python branch on the data), so XLA
compiles the step once; padding is handled by masks, not by slicing. The embedding table has a
multiple of 128 rows and the widths in configs/tpu.yaml are multiples of 128, because the MXU
multiplies 128x128 tiles and pads anything else. Under mixed_bfloat16 the layers compute in
bfloat16 with float32 variables; the logits are float32 for a stable loss.

`model.bag_width` adds a bag of pieces and of hashed adjacent pairs beside the Transformer
(fastText): on a small corpus word counts and short phrases carry most of the signal, and a
Transformer trained from scratch on a few thousand texts learns them more slowly than naive Bayes
counts them (README: "Real data and the baselines"). Its table is an embedding like the tokens' and
its hashing is in the graph, so the shapes stay static and the export takes the same ids.
"""

from __future__ import annotations

import tensorflow as tf

from ...core.keras import keras
from .config import ClassifierModelConfig
from ..text.layers import PositionEmbedding, check, embedding_rows, transformer_block
from . import tokenizer

layers = keras.layers


def build_model(config: ClassifierModelConfig, seq_len: int, vocab_size: int, num_classes: int) -> keras.Model:
    check(config)
    ids = keras.Input(shape=(seq_len,), dtype="int32", name="ids")
    is_token = tf.not_equal(ids, tokenizer.PAD_ID)  # [B, S] bool
    rows = embedding_rows(vocab_size)
    x = layers.Embedding(rows, config.width, name="token_embedding")(ids)
    x = PositionEmbedding(seq_len, config.width, name="position_embedding")(x)
    x = layers.Dropout(config.dropout, name="embedding_drop")(x)
    # [B, 1, S]: every query attends to the real tokens only; broadcasts over queries and heads.
    attention_mask = tf.expand_dims(is_token, 1)
    for block in range(config.depth):
        x = transformer_block(x, attention_mask, config, f"block{block}")
    x = layers.LayerNormalization(epsilon=1e-6, name="final_norm")(x)
    # Masked mean over the real tokens: padding must not dilute short texts. The count is at least
    # one so that an all-padding row (the evaluation's padding records hold one token) stays finite.
    weights = tf.cast(is_token, x.dtype)[:, :, None]
    mean = tf.reduce_sum(x * weights, axis=1) / tf.maximum(tf.reduce_sum(weights, axis=1), 1.0)
    # Masked max: the strongest evidence anywhere in the text (one "dull" in a long review), which a
    # mean over many tokens waters down; padding is pushed far below any real value.
    maximum = tf.reduce_max(x + (weights - 1.0) * 1e4, axis=1)
    pooled = {"mean": mean, "max": maximum, "mean_max": tf.concat([mean, maximum], axis=-1)}[config.pooling]
    if config.bag_width:
        pooled = tf.concat([pooled, pieces_and_pairs(ids, is_token, config, rows)], axis=-1)
    pooled = layers.Dropout(config.dropout, name="pool_drop")(pooled)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(pooled)
    return keras.Model(ids, logits, name="transformer")


def pieces_and_pairs(ids, is_token, config: ClassifierModelConfig, rows: int):
    """The fastText path: the sum of the embeddings of a text's pieces and of its adjacent pairs,
    over its number of pieces. [B, S] ids in, [B, bag_width] out.

    A pair (previous, current) is hashed into `bag_buckets` rows after the pieces' own `rows`; the
    first piece and pairs that touch padding count nothing. All in int32 without overflow, and in
    the graph, so the exported model takes the same ids."""
    previous = tf.pad(ids[:, :-1], [[0, 0], [1, 0]], constant_values=tokenizer.PAD_ID)
    is_pair = tf.logical_and(is_token, tf.not_equal(previous, tokenizer.PAD_ID))
    below_overflow = (2**31 - 1 - rows) // rows  # previous' factor keeps previous * rows + ids in int32
    pair = rows + tf.math.floormod(tf.math.floormod(previous, below_overflow) * rows + ids, config.bag_buckets)
    table = layers.Embedding(rows + config.bag_buckets, config.bag_width, name="bag_embedding")
    pieces, pairs = table(ids), table(pair)
    piece_weight = tf.cast(is_token, pieces.dtype)[:, :, None]
    pair_weight = tf.cast(is_pair, pairs.dtype)[:, :, None]
    total = tf.reduce_sum(pieces * piece_weight, axis=1) + tf.reduce_sum(pairs * pair_weight, axis=1)
    return total / tf.maximum(tf.reduce_sum(piece_weight, axis=1), 1.0)
