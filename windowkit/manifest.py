"""The store manifest ``windowkit.json``: written last (the commit point), read first.

A store is untrusted input. :class:`Manifest` is the schema and the manifest
at once (a pydantic model: exact types, ranges, and sizes consistent with each
other and with the files it lists); :meth:`Manifest.read` validates a store's,
requires every path in it to be relative, normalized and inside the store, and
every file it lists to lead (through any links: a DVC or git-annex checkout) to
a regular file. Opening never writes; a new
manifest is validated the same way before it is written (:meth:`Manifest.of`).

Every conversion gets a *store id*, a digest of everything the store's bytes
depend on (sources, options, windowkit's version). Data files carry it where
their format allows, and readers check it whenever they open files lazily
(:class:`windowkit.guard.StoreGuard`), so a store replaced under a running
reader is an error, never a mix of old and new files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from windowkit._schema import (
    MAX_BLOCK_BYTES,
    MAX_SPAN,
    MAX_STEP_ITEMS,
    Count,
    HexId,
    Name,
    Positive,
    Sha256,
    StorePath,
    Strict,
    describe_error,
)
from windowkit.errors import StoreError
from windowkit.formats import FORMATS
from windowkit.guard import MANIFEST_NAME, read_manifest_bytes
from windowkit.layout import RowLayout
from windowkit.location import is_remote, not_regular, open_regular, open_remote
from windowkit.spec import WindowSpec

#: ``root``: the folder of the store (one path segment) its files live under, or "".
GENERATION_PATTERN = r"^(|[A-Za-z0-9][A-Za-z0-9_-]{0,63})$"
FORMAT_VERSION = 3
CHECKSUM = "sha256"
STATIC_PREFIX = "static_"  # series.parquet column of a static feature: static_<name>
#: Every dtype a store may hold (numpy names).
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")


class _CountingReader:
    """A binary file that tells ``on_bytes`` how much each read returned."""

    def __init__(self, fh: BinaryIO, on_bytes: Callable[[int], object]) -> None:
        self._fh, self._on_bytes = fh, on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._fh.readinto(buffer)  # type: ignore[attr-defined]
        if count:
            self._on_bytes(count)
        return int(count or 0)


def file_digest(path: Path, on_bytes: Callable[[int], object] | None = None) -> str:
    """The file's checksum (hex); ``on_bytes`` sees the size of each piece read.
    A local file is opened with :func:`~windowkit.location.open_regular` (a FIFO
    or a directory is one line, never a wait), an object's reads are given up
    after the URL's timeouts."""
    opened = open_remote(path) if is_remote(path) else os.fdopen(open_regular(path), "rb")
    with opened as fh:
        source: Any = fh if on_bytes is None else _CountingReader(fh, on_bytes)
        return hashlib.file_digest(source, CHECKSUM).hexdigest()


class FileEntry(Strict):
    """One file of the store, relative to its root folder (``Manifest.root``)."""

    path: StorePath
    bytes: Count
    sha256: Sha256

    @classmethod
    def of(cls, root: Path, relative: str) -> FileEntry:
        full = root / relative
        return cls(path=relative, bytes=full.stat().st_size, sha256=file_digest(full))


# -- the schema ---------------------------------------------------------------------------
class WindowSection(Strict):
    """How the windows were cut (``WindowSpec``'s fields)."""

    length: int = Field(ge=1, le=MAX_SPAN)
    stride: int = Field(ge=1, le=MAX_SPAN)
    sampling_rate: int = Field(ge=1, le=MAX_SPAN)
    horizon: int = Field(ge=0, le=MAX_SPAN)


class SplitEntry(Strict):
    """One split: its windows, its index table, its targets' time range."""

    windows: Count
    index: StorePath
    first_time: int | None = None
    last_time: int | None = None


class SeriesSection(Strict):
    """The series: how many, and what conversion left out of them."""

    count: Positive
    too_short: Count
    gap_skipped_windows: Count = 0
    nan_skipped_windows: Count = 0
    missing_rows: Count = 0
    time_column: str | None = None
    time_unit: Literal["", "ns", "days"] = ""
    time_zone: str | None = None


class Statistics(Strict):
    """Per-column statistics of the training rows (or static features)."""

    count: Count
    mean: list[float]
    std: list[float]
    min: list[float]
    max: list[float]


class Manifest(Strict):
    """The manifest of a store, validated: everything a reader needs to know
    about it. :meth:`parse` and :meth:`read` are the ways to get one."""

    format_version: Literal[3]
    store_id: HexId
    format: Name
    dtype: Literal[DTYPES]  # type: ignore[valid-type]
    step_shape: tuple[int, ...] = Field(max_length=8)
    columns: list[Name] | None
    target_columns: list[Name] | None = None
    known_columns: list[Name] | None = None
    static_columns: list[Name] | None = None
    static_statistics: Statistics | None = None
    window: WindowSection
    total_rows: Count
    block_rows: Positive
    splits: dict[Name, SplitEntry] = Field(min_length=1)
    series: SeriesSection
    data: dict[str, Any]
    normalization: Statistics | None
    options: dict[str, Any]
    source_fingerprint: Sha256
    files: list[FileEntry]
    root: str = Field(default="", pattern=GENERATION_PATTERN)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.format not in FORMATS:
            raise ValueError(f"format {self.format!r} is not one of {', '.join(FORMATS)}")
        items = int(np.prod(self.step_shape, dtype=np.int64))
        if any(d < 1 for d in self.step_shape) or items > MAX_STEP_ITEMS:
            raise ValueError(f"step_shape {list(self.step_shape)} must hold 1..{MAX_STEP_ITEMS} "
                             "values per row")
        row_bytes = self.layout.row_bytes
        span = self.spec.span
        if span > MAX_SPAN:
            raise ValueError(f"a window spans {span} rows; at most {MAX_SPAN} are supported")
        if (self.block_rows + span) * row_bytes > MAX_BLOCK_BYTES:
            raise ValueError(f"block_rows {self.block_rows} of {row_bytes}-byte rows exceeds "
                             f"{MAX_BLOCK_BYTES} bytes per block")
        columns = 1 if not self.step_shape else self.step_shape[0]
        if self.columns is not None and (not self.step_shape or len(self.columns) != columns
                                         or len(set(self.columns)) != columns):
            raise ValueError(f"columns must name each of the {columns} features once")
        if self.target_columns is not None and (
                not self.columns or not set(self.target_columns) <= set(self.columns)
                or len(set(self.target_columns)) != len(self.target_columns)
                or self.window.horizon == 0):
            raise ValueError("target_columns must be distinct columns of a store with a horizon")
        if self.known_columns is not None and (
                not self.columns or not set(self.known_columns) <= set(self.columns)
                or len(set(self.known_columns)) != len(self.known_columns)
                or self.window.horizon == 0):
            raise ValueError("known_columns must be distinct columns of a store with a horizon")
        static = self.static_columns or []
        if len(set(static)) != len(static) or set(static) & set(self.columns or []):
            raise ValueError("static_columns must be distinct and not feature columns")
        if self.static_statistics is not None and {
                len(self.static_statistics.mean), len(self.static_statistics.std)} != {
                len(static)}:
            raise ValueError(f"static statistics must have {len(static)} values each")
        stats = self.normalization
        if stats is not None and {len(stats.mean), len(stats.std), len(stats.min),
                                  len(stats.max)} != {columns}:
            raise ValueError(f"normalization statistics must have {columns} values each")
        if stats is not None:
            check_statistics(stats, "normalization", self.dtype,
                             self.total_rows * (items // max(1, columns)))
        if self.static_statistics is not None:
            check_statistics(self.static_statistics, "static_statistics", "float64",
                             self.series.count)
        paths = [entry.path for entry in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("files lists a path twice")
        listed = set(paths)
        for name, split in self.splits.items():
            if split.index not in listed:
                raise ValueError(f"splits.{name}.index {split.index!r} is not in files")
        if "series.parquet" not in listed:
            raise ValueError("files does not list series.parquet")
        return self


    # -- what readers ask of it ----------------------------------------------------------
    @property
    def spec(self) -> WindowSpec:
        """How the store's windows were cut."""
        return WindowSpec(**self.window.model_dump())

    @property
    def layout(self) -> RowLayout:
        """The stored rows: dtype, step shape, count and storage blocks."""
        return RowLayout(np.dtype(self.dtype), tuple(self.step_shape), self.total_rows,
                         self.block_rows)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as JSON-able values, as ``windowkit.json`` holds it
        (the keys it was given: a section's defaults are not written out)."""
        out = self.model_dump(mode="json", exclude_unset=True)
        if not self.root:  # the store's files at its root: no "root" key
            out.pop("root", None)
        return out

    def data_root(self, store: Path) -> Path:
        """Where the files of the store at ``store`` are (its ``root`` folder)."""
        return store / self.root if self.root else store

    def file_keys(self) -> list[str]:
        """Each listed file's path relative to the store's root (``root`` included)."""
        return [f"{self.root}/{entry.path}" if self.root else entry.path
                for entry in self.files]

    # -- reading and writing ----------------------------------------------------------------
    @classmethod
    def parse(cls, raw: bytes, where: str) -> Manifest:
        """A manifest from the bytes of ``windowkit.json``, validated with its
        format's ``data`` section (``where`` names the file in errors)."""
        try:
            version = json.loads(raw).get("format_version")
        except (ValueError, AttributeError) as exc:
            raise StoreError(f"{where}: manifest is not a JSON object ({exc})") from exc
        except RecursionError:
            raise StoreError(f"{where}: manifest is not a windowkit manifest (JSON nested "
                             "too deeply)") from None
        if version != FORMAT_VERSION:
            raise StoreError(f"{where}: store format version {version!r} is not supported "
                             f"(expected {FORMAT_VERSION}); convert the sources again")
        try:
            model = cls.model_validate_json(raw)
            data = FORMATS[model.format].data_model.model_validate(
                model.data, context={"total_rows": model.total_rows,
                                     "row_bytes": model.layout.row_bytes,
                                     "block_rows": model.block_rows,
                                     "span": model.spec.span,
                                     "files": {entry.path for entry in model.files}})
        except ValidationError as exc:
            prefix = "data." if "model" in locals() else ""
            raise StoreError(f"{where}: invalid manifest, {prefix}{describe_error(exc)}"
                             ) from exc
        return model.model_copy(update={"data": data.model_dump()})

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Manifest:
        """A new manifest from plain values, validated as a store's would be."""
        raw = json.dumps({"format_version": FORMAT_VERSION, **fields}).encode()
        return cls.parse(raw, "the new store's manifest")

    def with_root(self, root: str) -> Manifest:
        """The same manifest, its files under the folder ``root``."""
        return self.model_copy(update={"root": root})

    def write(self, root: Path) -> None:
        """Write the manifest durably (temporary file, fsync, rename)."""
        target = root / MANIFEST_NAME
        tmp = root / (MANIFEST_NAME + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)

    @classmethod
    def read(cls, root: Path) -> Manifest:
        """The validated manifest of the store at ``root``; its files must lead
        to regular files."""
        manifest = cls.parse(read_manifest_bytes(root), str(root / MANIFEST_NAME))
        refuse_special_files(root, manifest.file_keys())
        return manifest


def check_statistics(stats: Statistics, where: str, dtype: str, values: int) -> None:
    """Raise ``ValueError`` unless the statistics could be those of at most ``values``
    values per column of ``dtype``: finite in the dtype normalization computes
    in, ``min <= mean <= max``, ``0 <= std <= max - min``, ``1 / std`` finite."""
    compute = np.float64 if dtype == "float64" else np.float32
    limit = float(np.finfo(compute).max)
    tiny = 1.0 / limit
    if not 0 < stats.count <= values:
        raise ValueError(f"{where}.count {stats.count} is not between 1 and {values} (the "
                         "values per column)")
    for k, (mean, std, low, high) in enumerate(zip(stats.mean, stats.std, stats.min,
                                                   stats.max, strict=True)):
        slack = 1e-9 * max(abs(low), abs(high))
        if not all(abs(v) <= limit for v in (mean, std, low, high)) or not (
                low <= high and low - slack <= mean <= high + slack):
            raise ValueError(f"{where} of column {k}: mean {mean} is not within min {low} and "
                             f"max {high}, or they are out of {compute.__name__}'s range")
        if std < 0 or std > (high - low) * (1 + 1e-9) + slack or 0 < std < tiny:
            raise ValueError(f"{where} of column {k}: std {std} is not in 0..max - min "
                             f"({high - low}), or so small that 1/std overflows {compute.__name__}")


def refuse_special_files(root: Path, paths: list[str]) -> None:
    """Raise if one of ``paths`` (relative to ``root``) is there but does not
    lead to a regular file (a FIFO, a device, a socket or a directory, which a
    reader would wait on forever or fail to read). Links are followed (a store
    behind a symlink, a DVC or git-annex checkout): what they lead to is
    checked here, and every block read from it against its digest."""
    if is_remote(root):
        return  # object storage has no links
    for relative in paths:
        try:
            mode = os.stat(root / relative).st_mode
        except FileNotFoundError:
            continue  # reported by verify, and by a reader that needs it
        except OSError as exc:  # a loop of links, no permission
            raise StoreError(f"{root / relative}: cannot read ({exc.strerror or exc})") from exc
        error = not_regular(root / relative, mode)
        if error is not None:
            raise error
