"""Zarr v3 storage: one array of all rows, chunked along rows, zstd + crc32c."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from windowkit.errors import StoreError
from windowkit.formats.base import DataLayout

_WRITE_BYTES = 16 << 20  # rows buffered before one multi-chunk write


def _compressors(compression: str) -> list[Any]:
    from zarr.codecs import Crc32cCodec, GzipCodec, ZstdCodec

    codecs: dict[str, list[Any]] = {
        "zstd": [ZstdCodec(level=3)], "gzip": [GzipCodec(level=5)], "none": []}
    return [*codecs[compression], Crc32cCodec()]  # names checked by convert


class ZarrRowWriter:
    """Appends rows into a pre-sized Zarr array, one chunk-aligned slab at a time."""

    def __init__(self, data_dir: Path, layout: DataLayout) -> None:
        import zarr

        self._layout = layout
        self._array = zarr.create_array(
            store=str(data_dir),
            shape=(layout.total_rows, *layout.step_shape),
            chunks=(layout.block_rows, *layout.step_shape),
            dtype=layout.dtype,
            compressors=_compressors(layout.compression),
            fill_value=0,
            config={"write_empty_chunks": True},
            zarr_format=3,
        )
        row_bytes = max(1, layout.dtype.itemsize * int(np.prod(layout.step_shape)))
        chunks_per_write = max(1, _WRITE_BYTES // (row_bytes * layout.block_rows))
        self._slab = np.empty(
            (chunks_per_write * layout.block_rows, *layout.step_shape), dtype=layout.dtype
        )
        self._slab_start = 0  # global row of slab[0]
        self._filled = 0

    def write_series(self, series_id: int, first_row: int, blocks: Iterator[np.ndarray]) -> None:
        if first_row != self._slab_start + self._filled:
            raise StoreError(f"series {series_id} does not follow the previous series' rows")
        for block in blocks:
            while len(block):
                take = min(len(block), len(self._slab) - self._filled)
                self._slab[self._filled:self._filled + take] = block[:take]
                self._filled += take
                block = block[take:]
                if self._filled == len(self._slab):
                    self._flush()

    def _flush(self) -> None:
        if self._filled:
            stop = self._slab_start + self._filled
            self._array[self._slab_start:stop] = self._slab[: self._filled]
            self._slab_start, self._filled = stop, 0

    def close(self) -> dict[str, Any]:
        self._flush()
        if self._slab_start != self._layout.total_rows:
            raise StoreError(
                f"wrote {self._slab_start} rows, expected {self._layout.total_rows}"
            )
        return {"array": ".", "chunk_rows": self._layout.block_rows}


class ZarrRowReader:
    """Reads global row ranges; a missing chunk file is an error, never fill values."""

    def __init__(self, data_dir: Path, *, block_rows: int) -> None:
        self._data_dir = data_dir
        self.block_rows = block_rows
        self._array: Any = None  # opened lazily, so readers pickle across processes

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}

    def _open(self) -> Any:
        if self._array is None:
            import zarr

            try:
                self._array = zarr.open_array(store=str(self._data_dir), mode="r")
            except Exception as exc:  # zarr raises several types for a broken array
                raise StoreError(f"{self._data_dir}: cannot open Zarr array ({exc})") from None
        return self._array

    def _check_chunks(self, start: int, stop: int) -> None:
        array = self._open()
        for chunk in range(start // self.block_rows, -(-stop // self.block_rows)):
            key = array.metadata.encode_chunk_key((chunk,) + (0,) * (array.ndim - 1))
            if not (self._data_dir / key).is_file():
                raise StoreError(f"{self._data_dir / key}: Zarr chunk file is missing")

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        self._check_chunks(start, stop)
        try:
            return np.asarray(self._open()[start:stop])
        except StoreError:
            raise
        except Exception as exc:  # codec errors: checksum mismatch, truncated chunk
            raise StoreError(
                f"{self._data_dir}: cannot read rows {start}..{stop} ({exc})"
            ) from None


class ZarrFormat:
    name: str = "zarr"
    compressions: tuple[str, ...] = ("zstd", "gzip", "none")

    def create_writer(self, data_dir: Path, layout: DataLayout) -> ZarrRowWriter:
        return ZarrRowWriter(data_dir, layout)

    def open_reader(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                    step_shape: tuple[int, ...], block_rows: int) -> ZarrRowReader:
        return ZarrRowReader(data_dir, block_rows=block_rows)
