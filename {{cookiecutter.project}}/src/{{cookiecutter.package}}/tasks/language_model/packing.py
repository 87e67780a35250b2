"""The language model's record format and packing: documents -> fixed windows of `seq_len` tokens.

A document is its SentencePiece ids followed by the end-of-document id. `encode` stores each one as
a record of the window format (inputs, targets shifted by one, segment ids, positions), not padded;
`pack` then concatenates one shard's documents, in their stable order, into one token stream and
cuts it into windows of exactly `seq_len` inputs: window k reads stream[k*L : k*L+L] and predicts
stream[k*L+1 : k*L+L+1]. Only the shard's last window has padding. Why pack:

- static shapes: every batch is [B, seq_len], so XLA compiles the step once;
- no padding waste: a corpus of short documents padded one per row would spend most positions of
  every batch on nothing.

Inside a window every position carries its document's segment id (1, 2, ... in order; 0 is padding)
and its position counted from the document's start, or from the window's start for a document that
began in the previous window. The model attends only within a segment, so no document sees
another, and the loss counts only positions with a target (targets of 0 are padding).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core import example_proto
from ..text.tokenizer import EOS_ID, PAD_ID

SPEC_VERSION = 1
FEATURES = ("inputs", "targets", "segment_ids", "positions")


def feature_spec(seq_len: int) -> dict:
    """JSON description of a window; stored in the manifest and compared at start-up."""
    column = {"dtype": "int64", "shape": [seq_len]}
    return {
        "version": SPEC_VERSION,
        "inputs": {**column, "encoding": "sentencepiece", "pad_id": PAD_ID, "eos_id": EOS_ID},
        "targets": {**column, "shifted_by": 1, "pad_id": PAD_ID},
        "segment_ids": {**column, "pad": 0},
        "positions": column,
    }


def serialize(
    inputs: Sequence[int], targets: Sequence[int], segment_ids: Sequence[int], positions: Sequence[int]
) -> bytes:
    """One window as a tf.train.Example (written without TensorFlow: Beam's workers never import it)."""
    columns = dict(zip(FEATURES, (inputs, targets, segment_ids, positions)))
    return example_proto.example({name: example_proto.int64_feature(values) for name, values in columns.items()})


def columns_of(record: bytes) -> dict[str, list[int]]:
    feature = example_proto.parse(record)
    return {name: feature[name] for name in FEATURES}


def document_record(ids: Sequence[int]) -> bytes:
    """One document (its ids, without the end-of-document id) as one unpadded segment."""
    tokens = [*ids, EOS_ID]
    count = len(tokens) - 1
    return serialize(tokens[:-1], tokens[1:], [1] * count, range(count))


def document_tokens(record: bytes) -> list[int]:
    """The token stream of a `document_record`: its ids and the end-of-document id."""
    columns = columns_of(record)
    return [*columns["inputs"], columns["targets"][-1]]


def pack_stream(stream: Sequence[int], seq_len: int) -> list[dict[str, list[int]]]:
    """Windows (as columns, each exactly `seq_len` long) of a token stream of whole documents, each
    ending in EOS_ID: every token but the first is the target of exactly one position."""
    windows = []
    for start in range(0, max(len(stream) - 1, 0), seq_len):
        inputs = list(stream[start : min(start + seq_len, len(stream) - 1)])
        targets = list(stream[start + 1 : start + 1 + len(inputs)])
        segment_ids, positions = [], []
        segment, position = 1, 0
        for index, token in enumerate(inputs):
            segment_ids.append(segment)
            positions.append(position)
            position += 1
            if token == EOS_ID and index + 1 < len(inputs):  # the next input starts a new document
                segment, position = segment + 1, 0
        padding = seq_len - len(inputs)
        windows.append(
            {
                "inputs": inputs + [PAD_ID] * padding,
                "targets": targets + [PAD_ID] * padding,
                "segment_ids": segment_ids + [0] * padding,
                "positions": positions + [0] * padding,
            }
        )
    return windows


def pack(records: Sequence[bytes], seq_len: int) -> tuple[list[bytes], list[int]]:
    """(the window records, the target ids they hold) of one shard's document records, in order."""
    stream = [token for record in records for token in document_tokens(record)]
    windows = pack_stream(stream, seq_len)
    serialized = [serialize(*(window[name] for name in FEATURES)) for window in windows]
    return serialized, [token for window in windows for token in window["targets"] if token != PAD_ID]


def padding_record(seq_len: int) -> bytes:
    """A window of padding only: no segment, no target."""
    zeros = [0] * seq_len
    return serialize([PAD_ID] * seq_len, [PAD_ID] * seq_len, zeros, zeros)


def parse_batch(serialized, seq_len: int):
    """Serialized windows -> ({inputs, segment_ids, positions} int32 [B, seq_len], targets int32
    [B, seq_len]). A shorter record (one unpacked document) is padded and a longer one cut."""
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, {name: tf.io.RaggedFeature(tf.int64) for name in FEATURES})
    # Keep the batch dimension static when the batch was made with drop_remainder=True: XLA
    # compiles one program per shape.
    batch_size = serialized.shape[0] if serialized.shape.rank and serialized.shape[0] is not None else None
    columns = {
        name: tf.cast(parsed[name].to_tensor(default_value=0, shape=[batch_size, seq_len]), tf.int32)
        for name in FEATURES
    }
    targets = columns.pop("targets")
    return columns, targets
