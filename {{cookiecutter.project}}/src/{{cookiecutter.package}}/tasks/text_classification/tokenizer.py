"""The text classifier's record format: a text's SentencePiece ids and its label -> tf.train.Example
-> [B, seq_len].

Each text is stored as its ids, truncated to `data.seq_len` but not padded: padding is added per
batch by `parse_batch` (and by `pad_batch` for `make predict`), so shards stay small. The tokenizer
itself (training, loading, its ids) is the text tasks' shared one in ../text/tokenizer.py,
re-exported here for this task's modules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..text.tokenizer import (
    MODEL_FILE,
    PAD_ID,
    UNK_ID,
    fit,
    processor,
    sha256,
    tokenize,
    tokenize_or_reject,
    vocab_size,
)

__all__ = [
    "MODEL_FILE",
    "PAD_ID",
    "UNK_ID",
    "feature_spec",
    "fit",
    "pad_batch",
    "parse_batch",
    "processor",
    "serialize",
    "sha256",
    "tokenize",
    "tokenize_or_reject",
    "vocab_size",
]

SPEC_VERSION = 1


def feature_spec(seq_len: int) -> dict:
    """JSON-friendly description of an example; stored in the manifest and compared at start-up."""
    return {
        "version": SPEC_VERSION,
        "ids": {"dtype": "int64", "max_len": seq_len, "encoding": "sentencepiece", "pad_id": PAD_ID},
        "label": {"dtype": "int64", "shape": []},
    }


def pad_batch(sequences: Sequence[Sequence[int]], seq_len: int) -> np.ndarray:
    """int32 [len(sequences), seq_len]: each truncated to seq_len and padded with PAD_ID, as
    `parse_batch` pads the shards' records (predict's batch from its INPUT texts)."""
    batch = np.full((len(sequences), seq_len), PAD_ID, dtype=np.int32)
    for row, ids in enumerate(sequences):
        kept = list(ids)[:seq_len]
        batch[row, : len(kept)] = kept
    return batch


def serialize(ids: Sequence[int], label: int) -> bytes:
    """One example: `ids` (at most seq_len, unpadded) and `label`."""
    from tensorflow.core.example import example_pb2, feature_pb2  # protos only: cheap on Beam workers

    features = feature_pb2.Features(
        feature={
            "ids": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(i) for i in ids])),
            "label": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(label)])),
        }
    )
    # deterministic: map fields are otherwise written in an order that differs between processes.
    return example_pb2.Example(features=features).SerializeToString(deterministic=True)


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
