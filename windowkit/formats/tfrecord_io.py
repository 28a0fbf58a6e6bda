"""TFRecord files and ``tf.train.Example`` messages without importing TensorFlow.

Conversion must stay light (TensorFlow alone takes ~650 MB), so records are
framed here and the Example schema is declared to ``protobuf`` in a private
descriptor pool (it never clashes with TensorFlow's own copy of the schema).

A TFRecord file is a sequence of records, each::

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

little-endian; with GZIP compression each record is its own gzip member, so a
record can be read by seeking to its offset, and the file is still one valid
gzip stream for ``tf.data.TFRecordDataset(..., compression_type="GZIP")``.
"""

from __future__ import annotations

import struct
import zlib
from functools import cache
from typing import Any

import google_crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
HEADER_BYTES = _HEADER.size  # a record's length and its CRC, before its data


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C of ``data``, masked as TFRecord files store it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes, *, gzip: bool) -> bytes:
    """One record as it is written to a TFRecord file."""
    length = struct.pack("<Q", len(data))
    framed = b"".join([length, struct.pack("<I", masked_crc32c(length)), data,
                       _FOOTER.pack(masked_crc32c(data))])
    if gzip:
        compressor = zlib.compressobj(5, zlib.DEFLATED, 31)  # 31: a gzip member, mtime 0
        framed = compressor.compress(framed) + compressor.flush()
    return framed


class RecordError(ValueError):
    """A record's bytes do not hold a valid, intact TFRecord record."""


def check_header(header: bytes, size: int) -> int:
    """The data length that a record's ``header`` (its first 12 bytes) gives,
    once its CRC holds and it says the record is ``size`` bytes, as stored
    (else ``RecordError``): what a reader checks before it reads the rest."""
    if size < _HEADER.size + _FOOTER.size:
        raise RecordError(f"record is truncated ({size} bytes)")
    length, length_crc = _HEADER.unpack_from(header)
    if masked_crc32c(header[:8]) != length_crc:
        raise RecordError("record length fails its CRC check")
    if size != _HEADER.size + length + _FOOTER.size:
        raise RecordError(f"record holds {size} bytes, its header says "
                          f"{_HEADER.size + length + _FOOTER.size}")
    return int(length)


def unframe_record(stored: bytes, *, gzip: bool, limit: int | None = None) -> bytes:
    """The data of one stored record, after checking both CRCs; a gzip member
    inflates into at most ``limit`` bytes of data (else ``RecordError``)."""
    if gzip:
        most = (1 << 62) if limit is None else limit + _HEADER.size + _FOOTER.size
        try:
            inflate = zlib.decompressobj(31)
            raw = inflate.decompress(stored, most + 1)
        except zlib.error as exc:
            raise RecordError(f"gzip member is corrupt ({exc})") from exc
        if len(raw) > most or inflate.unconsumed_tail:
            raise RecordError(f"gzip member inflates past the {most} bytes a record can "
                              "hold (refused)")
        if not inflate.eof:
            raise RecordError("gzip member is truncated")
        stored = raw
    length = check_header(stored[:_HEADER.size], len(stored))
    data = stored[_HEADER.size:_HEADER.size + length]
    (data_crc,) = _FOOTER.unpack_from(stored, _HEADER.size + length)
    if masked_crc32c(data) != data_crc:
        raise RecordError("record data fails its CRC check")
    return data


@cache
def example_class() -> Any:
    """The ``tensorflow.Example`` message class (same wire format as TensorFlow's)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="windowkit/example.proto", package="tensorflow", syntax="proto3")
    label_repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    label_optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    types = descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> Any:
        msg = fdp.message_type.add(name=name)
        for field_name, number, label, type_, type_name in fields:
            field = msg.field.add(name=field_name, number=number, label=label, type=type_)
            if type_name:
                field.type_name = type_name
        return msg

    message("BytesList", ("value", 1, label_repeated, types.TYPE_BYTES, None))
    message("FloatList", ("value", 1, label_repeated, types.TYPE_FLOAT, None))
    message("Int64List", ("value", 1, label_repeated, types.TYPE_INT64, None))
    feature = message(
        "Feature",
        ("bytes_list", 1, label_optional, types.TYPE_MESSAGE, ".tensorflow.BytesList"),
        ("float_list", 2, label_optional, types.TYPE_MESSAGE, ".tensorflow.FloatList"),
        ("int64_list", 3, label_optional, types.TYPE_MESSAGE, ".tensorflow.Int64List"))
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message(
        "Features",
        ("feature", 1, label_repeated, types.TYPE_MESSAGE, ".tensorflow.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, label=label_optional, type=types.TYPE_STRING)
    entry.field.add(name="value", number=2, label=label_optional, type=types.TYPE_MESSAGE,
                    type_name=".tensorflow.Feature")
    entry.options.map_entry = True
    message("Example",
            ("features", 1, label_optional, types.TYPE_MESSAGE, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def encode_example(ints: dict[str, list[int]], data: dict[str, bytes]) -> bytes:
    """A serialized Example of int64-list and bytes features (keys in sorted order)."""
    example = example_class()()
    features = example.features.feature
    for key, values in ints.items():
        features[key].int64_list.value.extend(values)
    for key, value in data.items():
        features[key].bytes_list.value.append(value)
    return bytes(example.SerializeToString(deterministic=True))


def decode_example(serialized: bytes) -> tuple[dict[str, list[int]], dict[str, bytes]]:
    """The int64-list and bytes features of a serialized Example."""
    example = example_class()()
    example.ParseFromString(serialized)
    ints: dict[str, list[int]] = {}
    data: dict[str, bytes] = {}
    for key, feature in example.features.feature.items():
        if feature.HasField("int64_list"):
            ints[key] = list(feature.int64_list.value)
        elif feature.HasField("bytes_list") and len(feature.bytes_list.value) == 1:
            data[key] = feature.bytes_list.value[0]
    return ints, data
