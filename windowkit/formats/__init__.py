"""Storage formats behind one interface (:mod:`.base`), chosen by name from a
registry; adding a format adds a module here and a line to ``FORMATS``."""

from __future__ import annotations

from windowkit.errors import InvalidSpecError
from windowkit.formats.base import DataLayout, RowReader, StorageFormat
from windowkit.formats.parquet_rows import ParquetFormat
from windowkit.formats.tfrecord_rows import TFRecordFormat
from windowkit.formats.zarr_rows import ZarrFormat

#: Every format the CLI and API name, in the order they are listed to users.
FORMAT_NAMES: tuple[str, ...] = ("tfrecord", "zarr", "parquet")

#: Each format's implementation, by name.
FORMATS: dict[str, StorageFormat] = {
    "tfrecord": TFRecordFormat(), "zarr": ZarrFormat(), "parquet": ParquetFormat()}


def get_format(name: str) -> StorageFormat:
    """The implementation of format ``name``, or a clear error listing valid ones."""
    if name in FORMATS:
        return FORMATS[name]
    raise InvalidSpecError(
        f"{name!r} is not a valid format; valid formats: {', '.join(FORMAT_NAMES)}"
    )


__all__ = ["FORMATS", "FORMAT_NAMES", "DataLayout", "RowReader",
           "StorageFormat", "get_format"]
