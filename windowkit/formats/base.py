"""The interface every storage format implements.

Formats only serialize rows: the conversion pipeline owns series, windows, the
index and the manifest. Global row numbers are the concatenation of all series.
The pipeline cuts the rows into *shards* (runs of whole storage blocks) that are
written independently, possibly in parallel processes; each shard is handed to
the format as *pieces*: the rows of one series inside one storage block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    block_rows: int  # rows per storage block (chunk, record, row group)
    window: WindowSpec
    compression: str

    @property
    def row_bytes(self) -> int:
        return max(1, self.dtype.itemsize * int(np.prod(self.step_shape, dtype=np.int64)))


@dataclass(frozen=True)
class Piece:
    """Rows of one series inside one storage block."""

    number: int  # position among all pieces of the store (a record's number)
    series_id: int
    series_rows: int  # rows of the whole series
    local_start: int  # row within the series of ``rows[0]``
    global_start: int  # global row of ``rows[0]``
    rows: np.ndarray


@dataclass(frozen=True)
class ShardTask:
    """A run of whole storage blocks, written on its own (maybe in a worker)."""

    number: int
    count: int  # shards in the store
    first_row: int  # global rows [first_row, first_row + rows)
    rows: int
    first_piece: int  # ``Piece.number`` of the shard's first piece


#: Reads rows ``[start, stop)`` of series ``series_id`` (for a halo past a piece).
ReadSeries = Callable[[int, int, int], np.ndarray]


class RowReader(Protocol):
    block_rows: int

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Global rows ``[start, stop)`` (``stop`` at most the store's rows) as a
        C-contiguous array."""
        ...


class StorageFormat(Protocol):
    """A format's entry in the registry (see ``windowkit.formats.FORMATS``).

    ``prepare`` runs once before any shard; ``write_shard`` runs once per shard,
    in any order and in any process, and returns a JSON-able summary; ``finish``
    receives the summaries in shard order and returns the manifest's ``data``.
    """

    name: str
    compressions: tuple[str, ...]
    default_compression: str
    target_block_bytes: int  # default storage block size: small for random access

    def min_block_rows(self, spec: WindowSpec) -> int:
        """The smallest storage block this format accepts for ``spec``."""
        ...

    def prepare(self, data_dir: Path, layout: DataLayout, num_shards: int) -> None: ...

    def write_shard(self, data_dir: Path, layout: DataLayout, shard: ShardTask,
                    pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]: ...

    def shard_files(self, data_dir: Path, layout: DataLayout, shard: ShardTask) -> list[str]:
        """The files (relative to ``data_dir``) that ``write_shard`` writes for ``shard``."""
        ...

    def finish(self, data_dir: Path, layout: DataLayout,
               shards: list[dict[str, Any]]) -> dict[str, Any]: ...

    def open_reader(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                    step_shape: tuple[int, ...], block_rows: int) -> RowReader:
        """A reader of global rows; ``data`` is what ``finish`` returned."""
        ...
