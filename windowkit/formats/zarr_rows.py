"""Zarr v3 storage: one array of all rows, chunked along rows, zstd + crc32c."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ValidationInfo, model_validator

from windowkit._schema import Positive, context_value
from windowkit.errors import StoreError
from windowkit.formats.base import (
    STORE_ID_KEY,
    DataLayout,
    DataSection,
    Piece,
    ReaderSetup,
    ReadSeries,
    ShardTask,
)
from windowkit.location import as_url_path, is_remote, list_objects, remote_errors
from windowkit.spec import WindowSpec

COMPRESSIONS = ("zstd", "gzip", "none")
_CHUNK_OVERHEAD = 64  # bytes a chunk file may add to its rows (checksum, frame headers)

_WRITE_BYTES = 16 << 20  # rows buffered before one multi-chunk write


def _compressors(compression: str) -> list[Any]:
    from zarr.codecs import Crc32cCodec, GzipCodec, ZstdCodec

    codecs: dict[str, list[Any]] = {
        "zstd": [ZstdCodec(level=3)], "gzip": [GzipCodec(level=5)], "none": []}
    return [*codecs[compression], Crc32cCodec()]  # names checked by convert


class _SlabWriter:
    """Buffers consecutive rows and writes them to the array in chunk-aligned slabs."""

    def __init__(self, array: Any, layout: DataLayout, first_row: int) -> None:
        chunks_per_write = max(1, _WRITE_BYTES // (layout.row_bytes * layout.block_rows))
        self._array = array
        self._slab = np.empty(
            (chunks_per_write * layout.block_rows, *layout.step_shape), dtype=layout.dtype)
        self._slab_start = first_row  # global row of slab[0]
        self._filled = 0

    def write(self, global_start: int, rows: np.ndarray) -> None:
        if global_start != self._slab_start + self._filled:
            raise StoreError(f"rows from {global_start} do not follow the rows written before")
        while len(rows):
            take = min(len(rows), len(self._slab) - self._filled)
            self._slab[self._filled:self._filled + take] = rows[:take]
            self._filled += take
            rows = rows[take:]
            if self._filled == len(self._slab):
                self.flush()

    def flush(self) -> int:
        """Write what is buffered; return the global row after the last one written."""
        if self._filled:
            stop = self._slab_start + self._filled
            self._array[self._slab_start:stop] = self._slab[: self._filled]
            self._slab_start, self._filled = stop, 0
        return self._slab_start


class ZarrData(DataSection):
    """The manifest's ``data`` section of a Zarr store."""

    array: Literal["."]
    chunk_rows: Positive

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ZarrData:
        self.check_compression(COMPRESSIONS)
        if self.chunk_rows != context_value(info, "block_rows"):
            raise ValueError(f"chunk_rows {self.chunk_rows} differs from block_rows")
        if "data/zarr.json" not in (context_value(info, "files") or set()):
            raise ValueError("files does not list data/zarr.json")
        return self


def zarr_store(data_dir: Path) -> Any:
    """The data directory as a Zarr store: a local path, or zarr's fsspec store."""
    if not is_remote(data_dir):
        return str(data_dir)
    from zarr.storage import FsspecStore

    url = as_url_path(data_dir)
    with remote_errors(data_dir):
        return FsspecStore.from_url(str(url), read_only=True,
                                    storage_options=dict(url.storage_options))


class ZarrRowReader:
    """Reads global row ranges; a missing chunk file is an error, never fill values."""

    def __init__(self, data_dir: Path, setup: ReaderSetup) -> None:
        self._data_dir = data_dir
        self._setup = setup
        self.block_rows = setup.block_rows
        self._array: Any = None  # opened lazily, so readers pickle across processes
        self._chunk_keys: set[str] | None = None  # on object storage: listed once

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None, "_chunk_keys": None}

    def _open(self) -> Any:
        if self._array is None:
            import zarr

            setup, where = self._setup, self._data_dir / "zarr.json"
            try:
                array = zarr.open_array(store=zarr_store(self._data_dir), mode="r")
                found = (tuple(array.shape), tuple(array.chunks), np.dtype(array.dtype),
                         array.attrs.get(STORE_ID_KEY))
            except (OSError, ValueError, KeyError, TypeError) as exc:  # damaged metadata
                raise StoreError(f"{where}: cannot open the Zarr array ({exc})") from exc
            setup.check_store()  # after the read: the metadata read was this store's
            expected = ((setup.total_rows, *setup.step_shape),
                        (setup.block_rows, *setup.step_shape), setup.dtype, setup.store_id)
            if found != expected:
                raise StoreError(f"{where}: the array (shape, chunks, dtype, store id) "
                                 f"{found} differs from the manifest's {expected}")
            self._array = array
        return self._array

    def _has_chunk(self, key: str) -> bool:
        if not is_remote(self._data_dir):
            return (self._data_dir / key).is_file()
        if self._chunk_keys is None:  # one listing, not a request per chunk
            self._chunk_keys = set(list_objects(self._data_dir))
        return key in self._chunk_keys

    def _check_chunks(self, start: int, stop: int) -> None:
        array = self._open()
        for chunk in range(start // self.block_rows, -(-stop // self.block_rows)):
            key = array.metadata.encode_chunk_key((chunk,) + (0,) * (array.ndim - 1))
            if not self._has_chunk(key):
                raise StoreError(f"{self._data_dir / key}: Zarr chunk file is missing")

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        self._check_chunks(start, stop)
        try:
            rows = np.asarray(self._open()[start:stop])
        except (OSError, ValueError, RuntimeError) as exc:  # checksum mismatch, bad frame
            raise StoreError(f"{self._data_dir}: cannot read rows {start}..{stop}, chunks "
                             f"{start // self.block_rows}..{(stop - 1) // self.block_rows} "
                             f"({exc})") from exc
        self._setup.check_store()  # after the read: the chunks read were this store's
        if len(rows) != stop - start:
            raise StoreError(f"{self._data_dir}: rows {start}..{stop} (chunk "
                             f"{start // self.block_rows}): read {len(rows)} rows")
        return rows


class ZarrFormat:
    name: str = "zarr"
    compressions: tuple[str, ...] = COMPRESSIONS
    default_compression: str = "zstd"
    target_block_bytes: int = 1 << 20
    data_model: type[DataSection] = ZarrData

    def min_block_rows(self, spec: WindowSpec) -> int:
        return spec.span

    def max_data_bytes(self, layout: DataLayout, num_pieces: int) -> int:
        return int(layout.total_rows * layout.row_bytes * 1.01) + (
            layout.num_blocks * _CHUNK_OVERHEAD) + (64 << 10)

    def prepare(self, data_dir: Path, layout: DataLayout, num_shards: int) -> None:
        """Create the array (metadata only); shards then fill disjoint chunks."""
        import zarr

        zarr.create_array(
            store=str(data_dir),
            shape=(layout.total_rows, *layout.step_shape),
            chunks=(layout.block_rows, *layout.step_shape),
            dtype=layout.dtype,
            compressors=_compressors(layout.compression),
            fill_value=0,
            config={"write_empty_chunks": True},
            zarr_format=3,
            attributes={STORE_ID_KEY: layout.store_id},
        )

    def write_shard(self, data_dir: Path, layout: DataLayout, shard: ShardTask,
                    pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]:
        import zarr

        # the setting is not stored with the array: a chunk of zeros (the fill
        # value) must still be written, or it would be missing from the store
        array = zarr.open_array(store=str(data_dir), mode="r+").with_config(
            {"write_empty_chunks": True})
        slab = _SlabWriter(array, layout, shard.first_row)
        for piece in pieces:
            slab.write(piece.global_start, piece.rows)
        end = slab.flush()
        if end != shard.first_row + shard.rows:
            raise StoreError(f"shard {shard.number} wrote rows up to {end}, expected "
                             f"{shard.first_row + shard.rows}")
        return {"rows": shard.rows}

    def shard_files(self, data_dir: Path, layout: DataLayout, shard: ShardTask) -> list[str]:
        """The chunk files of the shard's blocks (default v3 chunk key encoding)."""
        first = shard.first_row // layout.block_rows
        stop = -(-(shard.first_row + shard.rows) // layout.block_rows)
        rest = "/0" * len(layout.step_shape)
        return [f"c/{chunk}{rest}" for chunk in range(first, stop)]

    def finish(self, data_dir: Path, layout: DataLayout,
               shards: list[dict[str, Any]]) -> dict[str, Any]:
        return layout.data_section(array=".", chunk_rows=layout.block_rows)

    def open_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                    ) -> ZarrRowReader:
        return ZarrRowReader(data_dir, setup)

    block_name: str = "chunk"

    def data_files(self, data: dict[str, Any]) -> int:
        return 0  # one array; its chunk files are blocks

    def stored_rows(self, root: Path, data: dict[str, Any]) -> int:
        import zarr

        return int(zarr.open_array(store=zarr_store(root / "data"), mode="r").shape[0])
