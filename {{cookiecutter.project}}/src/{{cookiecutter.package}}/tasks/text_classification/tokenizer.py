"""The text classifier's record format: a text's SentencePiece ids and its label -> tf.train.Example
-> [B, seq_len].

Each text is stored as the ids of its window (`window`: at most `data.seq_len`, the first pieces or
the first and the last), not padded: padding is added per batch by `parse_batch` (and by `pad_batch`
for `make predict`), so shards stay small. Beside them the record keeps the bag of every piece of
the whole text (`bag_ids`, sorted, and their `bag_counts`): the baselines read it (`parse_bag`), so
they see the full text whatever the window cuts off; the model's `parse_batch` never reads it. The tokenizer
itself (training, loading, its ids) is the text tasks' shared one in ../text/tokenizer.py,
re-exported here for this task's modules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...core import example_proto
from .config import TRUNCATIONS
from ..text.tokenizer import (
    MODEL_FILE,
    PAD_ID,
    UNK_ID,
    fit,
    fit_or_share,
    processor,
    sha256,
    shared,
    tokenize,
    tokenize_or_reject,
    vocab_size,
)

__all__ = [
    "MODEL_FILE",
    "PAD_ID",
    "TRUNCATIONS",
    "UNK_ID",
    "feature_spec",
    "fit",
    "fit_or_share",
    "pad_batch",
    "parse_bag",
    "parse_batch",
    "processor",
    "serialize",
    "sha256",
    "shared",
    "tokenize",
    "tokenize_or_reject",
    "vocab_size",
    "window",
]

SPEC_VERSION = 2


def feature_spec(seq_len: int, truncation: str = "head") -> dict:
    """JSON-friendly description of an example; stored in the manifest and compared at start-up."""
    return {
        "version": SPEC_VERSION,
        "ids": {
            "dtype": "int64",
            "max_len": seq_len,
            "encoding": "sentencepiece",
            "pad_id": PAD_ID,
            "truncation": truncation,
        },
        "bag": {"ids": "int64, sorted, every piece of the whole text", "counts": "int64"},
        "label": {"dtype": "int64", "shape": []},
    }


def window(ids: Sequence[int], seq_len: int, truncation: str = "head") -> list[int]:
    """The pieces of a text the model reads: all of them when they fit in seq_len, else the first
    seq_len (`head`) or the first seq_len // 2 and the last seq_len - seq_len // 2 (`head_tail`)."""
    ids = list(ids)
    if len(ids) <= seq_len:
        return ids
    if truncation == "head_tail":
        head = seq_len // 2
        return ids[:head] + ids[len(ids) - (seq_len - head) :]
    return ids[:seq_len]


def pad_batch(sequences: Sequence[Sequence[int]], seq_len: int, truncation: str = "head") -> np.ndarray:
    """int32 [len(sequences), seq_len]: each text's `window`, padded with PAD_ID, as the shards'
    records are cut and `parse_batch` pads them (predict's batch from its INPUT texts)."""
    batch = np.full((len(sequences), seq_len), PAD_ID, dtype=np.int32)
    for row, ids in enumerate(sequences):
        kept = window(ids, seq_len, truncation)
        batch[row, : len(kept)] = kept
    return batch


def serialize(ids: Sequence[int], label: int, document: Sequence[int] | None = None) -> bytes:
    """One example: `ids` (the window, at most seq_len, unpadded), `label`, and the bag of every
    piece of `document`, the whole text (default: `ids`)."""
    pieces, counts = np.unique(np.asarray(ids if document is None else document, np.int64), return_counts=True)
    # Written without TensorFlow: Beam's workers never import it.
    return example_proto.example(
        {
            "ids": example_proto.int64_feature(ids),
            "label": example_proto.int64_feature([int(label)]),
            "bag_ids": example_proto.int64_feature(pieces.tolist()),
            "bag_counts": example_proto.int64_feature(counts.tolist()),
        }
    )


def parse_batch(serialized, seq_len: int):
    """A batch of serialized examples -> (int32 ids [B, seq_len] padded with PAD_ID, int32 labels [B])."""
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized,
        {
            "ids": tf.io.RaggedFeature(tf.int64),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    # Keep the batch dimension static when the batch was made with drop_remainder=True: XLA on a
    # TPU compiles one program per shape, and a static [B, seq_len] is what lets it compile once.
    batch_size = serialized.shape[0] if serialized.shape.rank and serialized.shape[0] is not None else None
    # to_tensor with a shape pads short rows and truncates long ones to exactly seq_len.
    ids = parsed["ids"].to_tensor(default_value=PAD_ID, shape=[batch_size, seq_len])
    return tf.cast(ids, tf.int32), tf.cast(parsed["label"], tf.int32)


def parse_bag(serialized, vocab_size: int):
    """A batch of serialized examples -> (float32 counts [B, vocab_size] of every piece of each whole
    text, padding left out; int32 labels [B]): what the baselines read."""
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized,
        {
            "bag_ids": tf.io.RaggedFeature(tf.int64),
            "bag_counts": tf.io.RaggedFeature(tf.int64),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    pieces, counts = parsed["bag_ids"], parsed["bag_counts"]
    where = tf.stack([tf.cast(pieces.value_rowids(), tf.int64), pieces.values], axis=1)
    rows = tf.shape(parsed["label"], out_type=tf.int64)[0]
    bag = tf.scatter_nd(where, tf.cast(counts.values, tf.float32), tf.stack([rows, tf.constant(vocab_size, tf.int64)]))
    not_padding = tf.one_hot(PAD_ID, vocab_size, on_value=0.0, off_value=1.0)
    return bag * not_padding, tf.cast(parsed["label"], tf.int32)
