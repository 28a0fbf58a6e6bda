"""The interface every storage format implements.

Formats only serialize rows: the conversion pipeline owns series, windows, the
index and the manifest. A writer receives each series' rows in order (global row
numbers are the concatenation of all series); a reader returns any range of
global rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from windowkit.spec import WindowSpec


@dataclass(frozen=True)
class DataLayout:
    """What a writer needs to lay rows out, fixed before the first row."""

    dtype: np.dtype
    step_shape: tuple[int, ...]
    total_rows: int
    block_rows: int  # rows per storage block (chunk, record block, row group)
    window: WindowSpec
    compression: str


class RowWriter(Protocol):
    def write_series(self, series_id: int, first_row: int, blocks: Iterator[np.ndarray]) -> None:
        """Append one series' rows; ``first_row`` is its first global row."""
        ...

    def close(self) -> dict[str, Any]:
        """Finish writing; return format details for the manifest's ``data``."""
        ...


class RowReader(Protocol):
    block_rows: int

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Global rows ``[start, stop)`` (``stop`` at most the store's rows) as a
        C-contiguous array."""
        ...


class StorageFormat(Protocol):
    """A format's entry in the registry (see ``windowkit.formats.FORMATS``)."""

    name: str
    compressions: tuple[str, ...]

    def create_writer(self, data_dir: Path, layout: DataLayout) -> RowWriter: ...

    def open_reader(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                    step_shape: tuple[int, ...], block_rows: int) -> RowReader:
        """A reader of global rows; ``data`` is what the writer's ``close`` returned."""
        ...
