"""TFRecord storage: shards of ``tf.train.Example`` records, one per block piece.

``data/part-NNNNN-of-MMMMM.tfrecord`` files. Each record holds the rows of one
series inside one storage block *plus a halo*: up to ``span - 1`` following rows
of the same series, so every window whose start lies in the block is cut from
that record alone (no window is lost at a block or shard boundary). Features:

- ``record`` int64: the record's number in the store (its row in ``records.parquet``)
- ``series`` int64: series id; ``row`` int64: row within the series of the first row
- ``rows`` int64: rows of the block; ``halo`` int64: rows that follow them
- ``shape`` int64 list: the step shape
- ``data`` bytes: the ``rows + halo`` rows, raw little-endian, row-major

``data/records.parquet`` lists every record's shard, byte offset and size, so
any row range can be read by seeking (random access), checking the CRCs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from windowkit.errors import StoreError
from windowkit.formats.base import DataLayout, Piece, ReadSeries, ShardTask
from windowkit.formats.tfrecord_io import (
    RecordError,
    decode_example,
    encode_example,
    frame_record,
    unframe_record,
)
from windowkit.spec import WindowSpec

RECORDS_TABLE = "records.parquet"
MAX_HALO_FRACTION = 0.05  # default blocks are long enough that halos add <= 5%
OPEN_FILES = 4  # shard files a reader keeps open

_RECORD_COLUMNS = ("record", "shard", "offset", "bytes", "series", "row", "global_row",
                   "rows", "halo")


def shard_name(number: int, count: int) -> str:
    return f"part-{number:05d}-of-{count:05d}.tfrecord"


class TFRecordFormat:
    name: str = "tfrecord"
    compressions: tuple[str, ...] = ("none", "gzip")
    default_compression: str = "none"
    target_block_bytes: int = 256 << 10

    def min_block_rows(self, spec: WindowSpec) -> int:
        return max(spec.span, int(np.ceil((spec.span - 1) / MAX_HALO_FRACTION)))

    def prepare(self, data_dir: Path, layout: DataLayout, num_shards: int) -> None:
        pass

    def write_shard(self, data_dir: Path, layout: DataLayout, shard: ShardTask,
                    pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]:
        gzip = layout.compression == "gzip"
        little = layout.dtype.newbyteorder("<")
        halo_rows = layout.window.span - 1
        table: dict[str, list[int]] = {name: [] for name in _RECORD_COLUMNS}
        offset = 0
        with open(data_dir / shard_name(shard.number, shard.count), "wb") as out:
            for piece in pieces:
                stop = piece.local_start + len(piece.rows)
                halo = read_series(piece.series_id, stop,
                                   min(piece.series_rows, stop + halo_rows))
                rows = np.concatenate([piece.rows, halo]) if len(halo) else piece.rows
                example = encode_example(
                    {"record": [piece.number], "series": [piece.series_id],
                     "row": [piece.local_start], "rows": [len(piece.rows)],
                     "halo": [len(halo)], "shape": list(layout.step_shape)},
                    {"data": np.ascontiguousarray(rows, dtype=little).tobytes()})
                stored = frame_record(example, gzip=gzip)
                out.write(stored)
                for name, value in zip(_RECORD_COLUMNS, (
                        piece.number, shard.number, offset, len(stored), piece.series_id,
                        piece.local_start, piece.global_start, len(piece.rows), len(halo)),
                        strict=True):
                    table[name].append(value)
                offset += len(stored)
        return {"path": f"data/{shard_name(shard.number, shard.count)}",
                "first_row": shard.first_row, "rows": shard.rows,
                "records": len(table["record"]), "table": table}

    def shard_files(self, data_dir: Path, layout: DataLayout, shard: ShardTask) -> list[str]:
        return [shard_name(shard.number, shard.count)]

    def finish(self, data_dir: Path, layout: DataLayout,
               shards: list[dict[str, Any]]) -> dict[str, Any]:
        columns = {name: np.concatenate([np.asarray(s["table"][name], dtype=np.int64)
                                         for s in shards]) for name in _RECORD_COLUMNS}
        pq.write_table(pa.table(columns), data_dir / RECORDS_TABLE, write_page_checksum=True)
        return {"shards": [{k: s[k] for k in ("path", "first_row", "rows", "records")}
                           for s in shards],
                "records": f"data/{RECORDS_TABLE}",
                "slot_rows": layout.block_rows + layout.window.span - 1}

    def open_reader(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                    step_shape: tuple[int, ...], block_rows: int) -> TFRecordRowReader:
        return TFRecordRowReader(data_dir, data, dtype=dtype, step_shape=step_shape,
                                 block_rows=block_rows)


class RecordTable:
    """``records.parquet``: where each record lies and which rows it holds."""

    def __init__(self, path: Path) -> None:
        try:
            table = pq.ParquetFile(path, page_checksum_verification=True).read()
            self.columns = {name: table.column(name).to_numpy() for name in _RECORD_COLUMNS}
        except (OSError, ValueError, KeyError) as exc:  # ArrowInvalid is a ValueError
            raise StoreError(f"{path}: cannot read the TFRecord record table ({exc})") from None
        if not np.array_equal(self.columns["record"], np.arange(len(table))):
            raise StoreError(f"{path}: record numbers are not 0..{len(table) - 1} in order")

    def __len__(self) -> int:
        return len(self.columns["record"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]


class TFRecordRowReader:
    """Reads global row ranges by seeking to the records that hold them."""

    def __init__(self, data_dir: Path, data: dict[str, Any], *, dtype: np.dtype,
                 step_shape: tuple[int, ...], block_rows: int) -> None:
        self._root = data_dir.parent
        self._data = data
        self._dtype = dtype
        self._step_shape = step_shape
        self._gzip = data.get("compression") == "gzip"
        self.block_rows = block_rows
        self._handles: OrderedDict[int, Any] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "_handles": OrderedDict()}
        state.pop("records", None)  # a cached_property: reloaded where it is used
        return state

    @cached_property
    def records(self) -> RecordTable:
        return RecordTable(self._root / self._data["records"])

    def shard_path(self, shard: int) -> Path:
        return self._root / self._data["shards"][shard]["path"]

    def _read_stored(self, shard: int, offset: int, size: int) -> bytes:
        handle = self._handles.get(shard)
        if handle is None:
            try:
                handle = open(self.shard_path(shard), "rb")  # noqa: SIM115 (kept open, LRU)
            except OSError as exc:
                raise StoreError(f"{self.shard_path(shard)}: cannot open shard ({exc})") from None
            self._handles[shard] = handle
            while len(self._handles) > OPEN_FILES:
                self._handles.popitem(last=False)[1].close()
        self._handles.move_to_end(shard)
        handle.seek(offset)
        return bytes(handle.read(size))

    def read_record(self, record: int) -> np.ndarray:
        """The rows (block and halo) of one record, checked against its CRCs."""
        table = self.records
        shard = int(table["shard"][record])
        offset, size = int(table["offset"][record]), int(table["bytes"][record])
        where = f"{self.shard_path(shard)}: record {record} at byte {offset}"
        stored = self._read_stored(shard, offset, size)
        if len(stored) != size:
            raise StoreError(f"{where}: file is truncated ({len(stored)} of {size} bytes)")
        try:
            ints, data = decode_example(unframe_record(stored, gzip=self._gzip))
        except RecordError as exc:
            raise StoreError(f"{where}: {exc}") from None
        except Exception as exc:  # protobuf's DecodeError
            raise StoreError(f"{where}: not a valid Example ({exc})") from None
        rows = int(table["rows"][record]) + int(table["halo"][record])
        if ints.get("record") != [record] or "data" not in data:
            raise StoreError(f"{where}: holds record {ints.get('record')}, expected {record}")
        values = np.frombuffer(data["data"], dtype=self._dtype.newbyteorder("<"))
        if values.size != rows * int(np.prod(self._step_shape, dtype=np.int64)):
            raise StoreError(f"{where}: holds {values.size} values, expected {rows} rows")
        return values.astype(self._dtype, copy=False).reshape(rows, *self._step_shape)

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        table = self.records
        global_row, own = table["global_row"], table["rows"]
        out = np.empty((max(0, stop - start), *self._step_shape), dtype=self._dtype)
        position = start
        while position < stop:
            record = int(np.searchsorted(global_row, position, side="right")) - 1
            if record < 0 or position >= global_row[record] + own[record] + table["halo"][record]:
                raise StoreError(f"{self._root}: no TFRecord record holds row {position}")
            rows = self.read_record(record)
            lo = position - int(global_row[record])
            take = min(stop - position, len(rows) - lo)
            out[position - start:position - start + take] = rows[lo:lo + take]
            position += take
        return out
