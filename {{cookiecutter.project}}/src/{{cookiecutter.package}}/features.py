"""The feature spec: the one definition of what a TFRecord example holds.

The Beam encoder (`encode`) and the tf.data parser (`parse_batch`) both come from here, and the
spec is written into manifest.json so that training can refuse shards written by other code.

Images are stored as raw uint8 pixels already resized to `image_size`, not as PNG/JPEG: decoding
compressed images is the most common input bottleneck on a TPU host, and raw bytes parse as one
vectorised op per batch. The cost is disk space (use GZIP shards when that matters).
"""

from __future__ import annotations

import numpy as np

CHANNELS = 3
SPEC_VERSION = 1


def feature_spec(image_size: int) -> dict:
    """JSON-friendly description of an example; stored in the manifest and compared at start-up."""
    return {
        "version": SPEC_VERSION,
        "image": {"dtype": "uint8", "shape": [image_size, image_size, CHANNELS], "encoding": "raw"},
        "label": {"dtype": "int64", "shape": []},
    }


def encode(image: np.ndarray, label: int) -> bytes:
    """Serialises one example; `image` is uint8 [size, size, 3]."""
    from tensorflow.core.example import example_pb2, feature_pb2  # protos only: cheap on Beam workers

    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != CHANNELS:
        raise ValueError(f"expected a uint8 [H, W, {CHANNELS}] image, got {image.dtype} {image.shape}")
    features = feature_pb2.Features(feature={
        "image": feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[image.tobytes()])),
        "label": feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(label)])),
    })
    # deterministic: map fields are otherwise written in an order that differs between processes.
    return example_pb2.Example(features=features).SerializeToString(deterministic=True)


def parse_batch(serialized, image_size: int):
    """Parses a batch of serialized examples into (uint8 images [B, H, W, 3], int32 labels [B])."""
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    })
    images = tf.io.decode_raw(parsed["image"], tf.uint8)
    # Keep the batch dimension static when the batch was made with drop_remainder=True.
    batch_size = serialized.shape[0] if serialized.shape.rank and serialized.shape[0] is not None else -1
    images = tf.reshape(images, [batch_size, image_size, image_size, CHANNELS])
    return images, tf.cast(parsed["label"], tf.int32)
