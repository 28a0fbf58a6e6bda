"""Parquet storage: ordinary tables any Parquet tool reads.

``data/part-NNNNN.parquet`` files with columns ``series`` (int32), ``row``
(int64, row number within its series) and the values: one column per feature
for vector steps (``f0``, ``f1``, ... or the source's names), a single
``value`` column for scalar steps, and a fixed-size list column ``values`` for
N-D steps (row-major, shape in the manifest). Each row group holds consecutive
rows of one series inside one storage block, so a block is read from whole row
groups. zstd by default; page checksums and statistics are written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from windowkit.errors import StoreError
from windowkit.formats.base import DataLayout

FILE_BYTES = 64 << 20  # start a new part file past this many raw bytes
OPEN_FILES = 2  # part files a reader keeps open


def value_columns(step_shape: tuple[int, ...], columns: list[str] | None) -> list[str]:
    """Names of the value columns for a step shape."""
    if not step_shape:
        return ["value"]
    if len(step_shape) == 1:
        return columns or [f"f{i}" for i in range(step_shape[0])]
    return ["values"]


class ParquetRowWriter:
    """Writes row groups of one series within one block, rolling part files."""

    def __init__(self, data_dir: Path, layout: DataLayout) -> None:
        self._dir = data_dir
        self._layout = layout
        self._names = value_columns(layout.step_shape, None)
        value_type = pa.from_numpy_dtype(layout.dtype)
        items = int(np.prod(layout.step_shape, dtype=np.int64))
        fields = [pa.field("series", pa.int32()), pa.field("row", pa.int64())]
        if len(layout.step_shape) > 1:
            fields.append(pa.field("values", pa.list_(value_type, items)))
        else:
            fields += [pa.field(name, value_type) for name in self._names]
        self._schema = pa.schema(fields)
        self._items = items
        self._row_bytes = max(1, layout.dtype.itemsize * items)
        self._writer: pq.ParquetWriter | None = None
        self._files: list[dict[str, Any]] = []

    def _table(self, series_id: int, first: int, rows: np.ndarray) -> pa.Table:
        n = len(rows)
        arrays: list[pa.Array] = [pa.array(np.full(n, series_id, dtype=np.int32)),
                                  pa.array(np.arange(first, first + n, dtype=np.int64))]
        if len(self._layout.step_shape) > 1:
            flat = pa.array(np.ascontiguousarray(rows).reshape(-1))
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, self._items))
        elif self._layout.step_shape:
            arrays += [pa.array(np.ascontiguousarray(rows[:, i])) for i in range(rows.shape[1])]
        else:
            arrays.append(pa.array(rows))
        return pa.Table.from_arrays(arrays, schema=self._schema)

    def _open_file(self, first_global_row: int) -> pq.ParquetWriter:
        if self._writer is None or self._files[-1]["raw_bytes"] >= FILE_BYTES:
            self._close_file()
            name = f"part-{len(self._files):05d}.parquet"
            compression = None if self._layout.compression == "none" else self._layout.compression
            self._writer = pq.ParquetWriter(
                self._dir / name, self._schema, compression=compression,
                write_page_checksum=True, write_statistics=True, use_dictionary=["series"])
            self._files.append({"path": f"data/{name}", "first_row": first_global_row,
                                "rows": 0, "raw_bytes": 0})
        return self._writer

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def write_series(self, series_id: int, first_row: int, blocks: Iterator[np.ndarray]) -> None:
        block_rows = self._layout.block_rows
        local = 0  # rows of this series written so far
        pending: list[np.ndarray] = []
        pending_rows = 0
        for block in blocks:
            while len(block):
                global_row = first_row + local + pending_rows
                room = block_rows - global_row % block_rows  # rows left in this storage block
                take = min(room, len(block))
                pending.append(block[:take])
                pending_rows += take
                block = block[take:]
                if take == room:
                    self._write_group(series_id, first_row, local, pending)
                    local += pending_rows
                    pending, pending_rows = [], 0
        if pending:
            self._write_group(series_id, first_row, local, pending)

    def _write_group(self, series_id: int, first_row: int, local: int,
                     parts: list[np.ndarray]) -> None:
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        writer = self._open_file(first_row + local)
        writer.write_table(self._table(series_id, local, rows), row_group_size=len(rows))
        self._files[-1]["rows"] += len(rows)
        self._files[-1]["raw_bytes"] += len(rows) * self._row_bytes

    def close(self) -> dict[str, Any]:
        self._close_file()
        return {"files": [{k: f[k] for k in ("path", "first_row", "rows")} for f in self._files],
                "columns": self._names}


class ParquetRowReader:
    """Reads global row ranges from the row groups that hold them."""

    def __init__(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                 step_shape: tuple[int, ...], block_rows: int) -> None:
        self._root = data_dir.parent
        self._files = data["files"]
        self._columns = data["columns"]
        self._dtype = dtype
        self._step_shape = step_shape
        self.block_rows = block_rows
        self._file_first = np.array([f["first_row"] for f in self._files], dtype=np.int64)
        # an open file holds decoder buffers: keep a few open, and every file's layout
        self._handles: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._group_starts: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": OrderedDict()}

    def _file(self, i: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """An open part file and the global first row of each of its row groups."""
        if i in self._handles:
            self._handles.move_to_end(i)
            return self._handles[i], self._group_starts[i]
        path = self._root / self._files[i]["path"]
        try:
            handle = pq.ParquetFile(path, page_checksum_verification=True)
        except (OSError, pa.ArrowInvalid) as exc:
            raise StoreError(f"{path}: cannot open Parquet file ({exc})") from None
        if i not in self._group_starts:
            meta = handle.metadata
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            if sum(sizes) != self._files[i]["rows"]:
                raise StoreError(f"{path}: holds {sum(sizes)} rows, manifest says "
                                 f"{self._files[i]['rows']}")
            self._group_starts[i] = self._files[i]["first_row"] + np.concatenate(
                [[0], np.cumsum(sizes)])
        self._handles[i] = handle
        while len(self._handles) > OPEN_FILES:
            self._handles.popitem(last=False)
        return handle, self._group_starts[i]

    def _read_group(self, i: int, group: int) -> np.ndarray:
        handle, _ = self._file(i)
        try:
            table = handle.read_row_group(group, columns=self._columns)
        except (OSError, pa.ArrowInvalid) as exc:
            path = self._root / self._files[i]["path"]
            raise StoreError(f"{path}: cannot read row group {group} ({exc})") from None
        if len(self._step_shape) > 1:
            flat = table.column(0).combine_chunks().flatten().to_numpy(zero_copy_only=False)
            return flat.reshape(len(table), *self._step_shape)
        values = [table.column(c).to_numpy(zero_copy_only=False) for c in range(len(self._columns))]
        return values[0] if not self._step_shape else np.column_stack(values)

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        parts = []
        file_index = int(np.searchsorted(self._file_first, start, side="right")) - 1
        position = start
        while position < stop and file_index < len(self._files):
            _, group_starts = self._file(file_index)
            group = int(np.searchsorted(group_starts, position, side="right")) - 1
            while position < stop and group < len(group_starts) - 1:
                rows = self._read_group(file_index, group)
                lo = position - group_starts[group]
                hi = min(stop, group_starts[group + 1]) - group_starts[group]
                parts.append(rows[lo:hi])
                position = int(group_starts[group] + hi)
                group += 1
            file_index += 1
        if not parts:
            return np.empty((0, *self._step_shape), dtype=self._dtype)
        out = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return np.ascontiguousarray(out, dtype=self._dtype)


class ParquetFormat:
    name: str = "parquet"
    compressions: tuple[str, ...] = ("zstd", "gzip", "none")

    def create_writer(self, data_dir: Path, layout: DataLayout) -> ParquetRowWriter:
        return ParquetRowWriter(data_dir, layout)

    def open_reader(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                    step_shape: tuple[int, ...], block_rows: int) -> ParquetRowReader:
        return ParquetRowReader(data_dir, data, dtype=dtype, step_shape=step_shape,
                                block_rows=block_rows)
