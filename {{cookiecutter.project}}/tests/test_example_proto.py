"""core/example_proto.py writes tf.train.Example records without TensorFlow: byte for byte what
TensorFlow's own protos serialize (deterministic), and reads them back."""

import random

import numpy as np
import pytest
from tensorflow.core.example import example_pb2, feature_pb2

from {{ cookiecutter.package }}.core import example_proto

INT64 = (-(2**63), -1, 0, 1, 127, 128, 300, 2**31, 2**63 - 1)


def tensorflows(features: dict) -> bytes:
    def feature(kind, values):
        if kind == "int64":
            return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=values))
        if kind == "float":
            return feature_pb2.Feature(float_list=feature_pb2.FloatList(value=values))
        return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=values))

    proto = example_pb2.Example(
        features=feature_pb2.Features(feature={name: feature(*value) for name, value in features.items()})
    )
    return proto.SerializeToString(deterministic=True)


def ours(features: dict) -> bytes:
    make = {
        "int64": example_proto.int64_feature,
        "float": example_proto.float_feature,
        "bytes": example_proto.bytes_feature,
    }
    return example_proto.example({name: make[kind](values) for name, (kind, values) in features.items()})


def random_features(generator: random.Random) -> dict:
    features = {}
    for index in range(generator.randint(1, 5)):
        kind = generator.choice(["int64", "float", "bytes"])
        count = generator.choice([0, 1, 2, 17, 200])
        if kind == "int64":
            values = [generator.choice([*INT64, generator.randint(-(2**63), 2**63 - 1)]) for _ in range(count)]
        elif kind == "float":
            values = [float(np.float32(generator.uniform(-1e6, 1e6))) for _ in range(count)]
        else:
            values = [generator.randbytes(generator.choice([0, 1, 130])) for _ in range(count)]
        features[generator.choice(["ids", "label", "image", "b", "zeta", "a_long_feature_name", "é"]) + str(index)] = (
            kind,
            values,
        )
    return features


@pytest.mark.parametrize("seed", range(40))
def test_examples_are_tensorflows_bytes_and_read_back(seed):
    features = random_features(random.Random(seed))
    serialized = ours(features)
    assert serialized == tensorflows(features)
    assert example_proto.parse(serialized) == {name: values for name, (_, values) in features.items()}


def test_the_tasks_records_and_one_by_hand():
    """The features the tasks write, and one Example spelled out in bytes."""
    features = {
        "inputs": ("int64", list(range(128))),
        "image": ("bytes", [bytes(range(256)) * 12]),
        "label": ("int64", [3]),
        "features": ("float", [0.5, -2.0]),
        "target": ("float", [1.25]),
    }
    assert ours(features) == tensorflows(features)
    # Example{features{feature{key: "y" value{int64_list{value: [1, 300]}}}}}
    by_hand = bytes(
        [0x0A, 0x0E, 0x0A, 0x0C, 0x0A, 0x01, ord("y"), 0x12, 0x07, 0x1A, 0x05, 0x0A, 0x03, 0x01, 0xAC, 0x02]
    )
    assert example_proto.example({"y": example_proto.int64_feature([1, 300])}) == by_hand
