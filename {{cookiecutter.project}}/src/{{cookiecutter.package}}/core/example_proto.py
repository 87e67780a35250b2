"""`tf.train.Example` records without importing TensorFlow.

Preprocessing's Beam workers encode every example. `from tensorflow.core.example import example_pb2`
imports all of TensorFlow (seconds per worker process, and its memory) before the worker's first
element. These are the same messages (tensorflow/core/example/{example,feature}.proto), built from
their descriptors on the `protobuf` runtime alone, in a pool of their own (so a process that has
imported TensorFlow holds both without a clash): the same wire format and the same serializer, so
the same bytes (`tests/test_example_proto.py` checks them against TensorFlow's).

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }
"""

from __future__ import annotations

from typing import Iterable, Mapping

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FIELD = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/example_without_tensorflow.proto", package="tensorflow", syntax="proto3"
    )

    def message(name: str, *fields: tuple, parent=None):
        added = (parent.nested_type if parent else proto.message_type).add(name=name)
        for number, field_name, kind, label, type_name in fields:
            added.field.add(name=field_name, number=number, type=kind, label=label, type_name=type_name or None)
        return added

    repeated, optional = _FIELD.LABEL_REPEATED, _FIELD.LABEL_OPTIONAL
    message("BytesList", (1, "value", _FIELD.TYPE_BYTES, repeated, ""))
    message("FloatList", (1, "value", _FIELD.TYPE_FLOAT, repeated, ""))  # proto3: packed
    message("Int64List", (1, "value", _FIELD.TYPE_INT64, repeated, ""))  # proto3: packed
    feature = message(
        "Feature",
        (1, "bytes_list", _FIELD.TYPE_MESSAGE, optional, ".tensorflow.BytesList"),
        (2, "float_list", _FIELD.TYPE_MESSAGE, optional, ".tensorflow.FloatList"),
        (3, "int64_list", _FIELD.TYPE_MESSAGE, optional, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", (1, "feature", _FIELD.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry"))
    entry = message(
        "FeatureEntry",
        (1, "key", _FIELD.TYPE_STRING, optional, ""),
        (2, "value", _FIELD.TYPE_MESSAGE, optional, ".tensorflow.Feature"),
        parent=features,
    )
    entry.options.map_entry = True
    message("Example", (1, "features", _FIELD.TYPE_MESSAGE, optional, ".tensorflow.Features"))
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _class(name: str):
    descriptor = _POOL.FindMessageTypeByName(f"tensorflow.{name}")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(_POOL).GetPrototype(descriptor)


BytesList, FloatList, Int64List = _class("BytesList"), _class("FloatList"), _class("Int64List")
Feature, Features, Example = _class("Feature"), _class("Features"), _class("Example")


def int64_feature(values: Iterable[int]):
    return Feature(int64_list=Int64List(value=[int(value) for value in values]))


def float_feature(values: Iterable[float]):
    return Feature(float_list=FloatList(value=[float(value) for value in values]))


def bytes_feature(values: Iterable[bytes]):
    return Feature(bytes_list=BytesList(value=list(values)))


def example(features: Mapping[str, object]) -> bytes:
    """The serialized Example of {name: Feature}. Deterministic: the map's entries in key order,
    whatever the process (otherwise its order may differ between two processes' records)."""
    return Example(features=Features(feature=features)).SerializeToString(deterministic=True)


def parse(record: bytes) -> dict[str, list]:
    """{name: values} of a serialized Example: ints, floats or bytes as its lists hold them."""
    parsed = {}
    for name, feature in Example.FromString(record).features.feature.items():
        kind = feature.WhichOneof("kind")
        parsed[name] = list(getattr(feature, kind).value) if kind else []
    return parsed
