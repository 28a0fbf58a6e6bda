"""TFRecord storage: parts (data files) of ``tf.train.Example`` records, one per block piece.

``data/part-NNNNN-of-MMMMM.tfrecord`` files. Each record holds the rows of one
series inside one storage block *plus a halo*: up to ``span - 1`` following rows
of the same series, so every window whose start lies in the block is cut from
that record alone (no window is lost at a block or part boundary). Features:

- ``record`` int64: the record's number in the store (its row in ``records.parquet``)
- ``series`` int64: series id; ``row`` int64: row within the series of the first row
- ``rows`` int64: rows of the block; ``halo`` int64: rows that follow them
- ``shape`` int64 list: the step shape
- ``store`` int64: the store id's first 60 bits (a record of another store is refused)
- ``data`` bytes: the ``rows + halo`` rows, raw little-endian, row-major

``data/records.parquet`` lists every record's part (its ``shard`` column, an
on-disk name kept from before parts were called parts), byte offset and size,
so any row range can be read by seeking (random access), checking the CRCs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from google.protobuf.message import DecodeError
from pydantic import Field, ValidationInfo, model_validator

from windowkit._schema import Count, Positive, StorePath, context_value
from windowkit.errors import StoreError, StoreUnreachableError
from windowkit.formats._checks import (
    BlockDigester,
    CheckedReader,
    ask_guard,
    check_regular,
    checked,
    write_digests,
)
from windowkit.formats.base import (
    STORE_ID_KEY,
    DataFile,
    DataLayout,
    DataSection,
    PartTask,
    Piece,
    ReaderSetup,
    ReadSeries,
    RowReader,
    check_data_files,
    store_tag,
)
from windowkit.formats.tfrecord_io import (
    RecordError,
    decode_example,
    encode_example,
    frame_record,
    unframe_record,
)
from windowkit.location import open_parquet, read_ranges
from windowkit.spec import WindowSpec

RECORDS_TABLE = "records.parquet"
MAX_HALO_FRACTION = 0.05  # default blocks are long enough that halos add <= 5%
COMPRESSIONS = ("none", "gzip")
_RECORD_OVERHEAD = 256  # framing, Example keys and int features of one record

# "shard": the number of the part (data file) holding the record; the on-disk
# column keeps the old word, so that stores written before still read
_RECORD_COLUMNS = ("record", "shard", "offset", "bytes", "series", "row", "global_row",
                   "rows", "halo")


def part_name(number: int, count: int) -> str:
    return f"part-{number:05d}-of-{count:05d}.tfrecord"


class TFRecordPart(DataFile):
    records: Count


class TFRecordData(DataSection):
    """The manifest's ``data`` section of a TFRecord store."""

    # the parts (data files), in order; the manifest key keeps the old word
    shards: list[TFRecordPart] = Field(min_length=1)
    records: StorePath
    slot_rows: Positive

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> TFRecordData:
        self.check_compression(COMPRESSIONS)
        check_data_files(self.shards, info)
        if self.records not in (context_value(info, "files") or set()):
            raise ValueError(f"records table {self.records!r} is not in files")
        expected = context_value(info, "block_rows") + context_value(info, "span") - 1
        if self.slot_rows != expected:
            raise ValueError(f"slot_rows {self.slot_rows} must be block_rows + span - 1 "
                             f"= {expected}")
        return self


class TFRecordFormat:
    name: str = "tfrecord"
    compressions: tuple[str, ...] = COMPRESSIONS
    default_compression: str = "none"
    target_block_bytes: int = 256 << 10
    data_model: type[DataSection] = TFRecordData

    def min_block_rows(self, spec: WindowSpec) -> int:
        return max(spec.span, int(np.ceil((spec.span - 1) / MAX_HALO_FRACTION)))

    def max_data_bytes(self, layout: DataLayout, num_pieces: int) -> int:
        rows = layout.rows.total_rows + num_pieces * (layout.window.span - 1)
        return int(rows * layout.rows.row_bytes * 1.01) + num_pieces * (
            _RECORD_OVERHEAD + 8 * len(_RECORD_COLUMNS)) + (64 << 10)

    def prepare(self, data_dir: Path, layout: DataLayout, num_parts: int) -> None:
        pass

    def write_part(self, data_dir: Path, layout: DataLayout, part: PartTask,
                   pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]:
        gzip = layout.compression == "gzip"
        little = layout.rows.dtype.newbyteorder("<")
        halo_rows = layout.window.span - 1
        table: dict[str, list[int]] = {name: [] for name in _RECORD_COLUMNS}
        offset = 0
        digester = BlockDigester(layout)
        with open(data_dir / part_name(part.number, part.count), "wb") as out:
            for piece in digester.wrap(pieces):
                stop = piece.local_start + len(piece.rows)
                halo = read_series(piece.series_id, stop,
                                   min(piece.series_rows, stop + halo_rows))
                rows = np.concatenate([piece.rows, halo]) if len(halo) else piece.rows
                example = encode_example(
                    {"record": [piece.number], "series": [piece.series_id],
                     "row": [piece.local_start], "rows": [len(piece.rows)],
                     "halo": [len(halo)], "shape": list(layout.rows.step_shape),
                     "store": [store_tag(layout.store_id)]},
                    {"data": np.ascontiguousarray(rows, dtype=little).tobytes()})
                stored = frame_record(example, gzip=gzip)
                out.write(stored)
                for name, value in zip(_RECORD_COLUMNS, (
                        piece.number, part.number, offset, len(stored), piece.series_id,
                        piece.local_start, piece.global_start, len(piece.rows), len(halo)),
                        strict=True):
                    table[name].append(value)
                offset += len(stored)
        return {"path": f"data/{part_name(part.number, part.count)}",
                "first_row": part.first_row, "rows": part.rows,
                "records": len(table["record"]), "table": table, **digester.summary()}

    def part_files(self, data_dir: Path, layout: DataLayout, part: PartTask) -> list[str]:
        return [part_name(part.number, part.count)]

    def finish(self, data_dir: Path, layout: DataLayout,
               parts: list[dict[str, Any]]) -> dict[str, Any]:
        columns = {name: np.concatenate([np.asarray(p["table"][name], dtype=np.int64)
                                         for p in parts]) for name in _RECORD_COLUMNS}
        table = pa.table(columns).replace_schema_metadata({STORE_ID_KEY: layout.store_id})
        pq.write_table(table, data_dir / RECORDS_TABLE, write_page_checksum=True)
        return layout.data_section(  # "shards": the on-disk key of the parts, kept
            shards=[{k: p[k] for k in ("path", "first_row", "rows", "records")} for p in parts],
            records=f"data/{RECORDS_TABLE}",
            slot_rows=layout.rows.block_rows + layout.window.span - 1,
            digests=write_digests(data_dir, layout, parts))

    def open_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                    ) -> CheckedReader:
        reader = TFRecordRowReader(data_dir, data, setup)
        return checked(reader, data_dir, data, setup, reader.describe)

    def open_graph_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                          ) -> Any:
        """A reader of the store's records in the ``tf.data`` graph alone
        (:class:`windowkit.formats.tfrecord_graph.TFRecordGraphReader`)."""
        from windowkit.formats.tfrecord_graph import TFRecordGraphReader

        records = RecordTable(data_dir.parent / data["records"], parts=len(data["shards"]),
                              setup=setup)
        return TFRecordGraphReader(data_dir, data, setup, records)

    block_name: str = "record"

    def data_files(self, data: dict[str, Any]) -> int:
        return len(data["shards"])

    def stored_rows(self, root: Path, data: dict[str, Any]) -> int:
        records = open_parquet(root / data["records"]).read(columns=["rows"])
        return int(records.column("rows").to_numpy().sum())



class RecordTable:
    """``records.parquet``: where each record lies and which rows it holds.

    Checked on load: records in order, each in a part of the store, holding at
    most a block plus its halo, and together every row once."""

    def __init__(self, path: Path, *, parts: int, setup: ReaderSetup) -> None:
        check_regular(path)
        try:
            file = open_parquet(path, page_checksum_verification=True)
            table = file.read()
            self.columns = {name: table.column(name).to_numpy().astype(np.int64, copy=False)
                            for name in _RECORD_COLUMNS}
        except StoreUnreachableError:
            raise  # one line already, naming the URL and the timeouts
        except (OSError, ValueError, KeyError) as exc:  # ArrowInvalid is a ValueError
            ask_guard(setup)  # a replaced store says so, never "corrupt"
            raise StoreError(f"{path}: cannot read the TFRecord record table ({exc})") from exc
        setup.check_store()  # after the read: the table read was this store's
        store_id = (file.schema_arrow.metadata or {}).get(STORE_ID_KEY.encode(), b"").decode()
        if store_id != setup.store_id:
            ask_guard(setup)  # a replaced store says so
            raise StoreError(f"{path}: belongs to store id {store_id[:12] or '(none)'}, "
                             f"not to this store ({setup.store_id[:12]})")
        problem = self._problem(parts, setup)
        if problem:
            raise StoreError(f"{path}: {problem}")

    def _problem(self, parts: int, setup: ReaderSetup) -> str | None:
        c, n = self.columns, len(self)
        slot_bytes = (setup.rows.block_rows + setup.span) * setup.rows.dtype.itemsize * int(
            np.prod(setup.rows.step_shape, dtype=np.int64))
        ends = c["global_row"] + c["rows"]
        checks = [
            (np.array_equal(c["record"], np.arange(n)), f"record numbers are not 0..{n - 1}"),
            (n == 0 or (c["shard"].min() >= 0 and c["shard"].max() < parts),
             f"a record names a part outside 0..{parts - 1}"),
            (n == 0 or (c["rows"].min() >= 1 and c["rows"].max() <= setup.rows.block_rows),
             f"a record holds no rows or more than a block ({setup.rows.block_rows})"),
            (n == 0 or (c["halo"].min() >= 0 and c["halo"].max() <= setup.span - 1),
             f"a record's halo is not within 0..{setup.span - 1} rows"),
            (n == 0 or (c["offset"].min() >= 0 and c["bytes"].min() >= 1
                        and c["bytes"].max() <= 2 * slot_bytes + 4096),
             "a record's offset or size is out of range"),
            (n == 0 or (c["global_row"][0] == 0 and np.array_equal(c["global_row"][1:],
                                                                   ends[:-1])),
             "records do not hold consecutive rows from row 0"),
            ((ends[-1] if n else 0) == setup.rows.total_rows,
             f"records hold {ends[-1] if n else 0} rows, the store has {setup.rows.total_rows}"),
        ]
        return next((message for ok, message in checks if not ok), None)

    def __len__(self) -> int:
        return len(self.columns["record"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]


class TFRecordRowReader(RowReader):
    """Reads global row ranges by seeking to the records that hold them: the
    records needed are fetched as contiguous runs of bytes (one ranged request
    each on object storage, all at once), and every record's CRCs are checked."""

    fetches_together = True

    def __init__(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup) -> None:
        self._root = data_dir.parent
        self._data = data
        self._setup = setup
        self._dtype = setup.rows.dtype
        self._step_shape = setup.rows.step_shape
        self._little = setup.rows.dtype.newbyteorder("<")
        self._items = int(np.prod(setup.rows.step_shape, dtype=np.int64))
        self._gzip = data.get("compression") == "gzip"
        self._tag = store_tag(setup.store_id)
        self.block_rows = setup.rows.block_rows

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("records", None)  # a cached_property: reloaded where it is used
        return state

    @cached_property
    def records(self) -> RecordTable:
        return RecordTable(self._root / self._data["records"],
                           parts=len(self._data["shards"]), setup=self._setup)

    def part_path(self, part: int) -> Path:
        return self._root / self._data["shards"][part]["path"]

    def _records_for(self, start: int, stop: int) -> list[int]:
        """The records whose rows (and halos) hold global rows ``[start, stop)``."""
        table = self.records
        global_row, ends = table["global_row"], table["global_row"] + table["rows"] + table["halo"]
        out, position = [], start
        while position < stop:
            record = int(np.searchsorted(global_row, position, side="right")) - 1
            if record < 0 or position >= ends[record]:
                raise StoreError(f"{self._root}: no TFRecord record holds row {position}")
            out.append(record)
            position = int(ends[record])
        return out

    def _fetch(self, records: list[int]) -> dict[int, bytes]:
        """The stored bytes of ``records`` (ascending): neighbours in one part
        are one ranged read; all ranges are fetched together."""
        table = self.records
        part, offset, size = table["shard"], table["offset"], table["bytes"]
        runs: list[list[int]] = []
        for record in records:
            last = runs[-1][-1] if runs else -1
            if (runs and record == last + 1 and part[record] == part[last]
                    and offset[record] == offset[last] + size[last]):
                runs[-1].append(record)
            else:
                runs.append([record])
        paths = [self.part_path(int(part[run[0]])) for run in runs]
        starts = [int(offset[run[0]]) for run in runs]
        stops = [int(offset[run[-1]] + size[run[-1]]) for run in runs]
        for path in set(paths):
            check_regular(path)
        try:
            blobs = read_ranges(paths, starts, stops)
        except StoreUnreachableError:
            raise  # one line already, naming the URL and the timeouts
        except OSError as exc:
            ask_guard(self._setup)  # a replaced store says so, never "corrupt"
            raise StoreError(f"{paths[0]}: cannot read part ({exc})") from exc
        for path in set(paths):  # checked again after the read: nothing else swapped in
            check_regular(path)
        self._setup.check_store()  # after the read: the bytes read were this store's
        stored: dict[int, bytes] = {}
        for run, blob, start in zip(runs, blobs, starts, strict=True):
            for record in run:
                lo = int(offset[record]) - start
                stored[record] = blob[lo:lo + int(size[record])]
        return stored

    def _where(self, record: int) -> str:
        """Where a record lies, for messages."""
        table = self.records
        return (f"{self.part_path(int(table['shard'][record]))}: record {record} at byte "
                f"{int(table['offset'][record])}")

    def describe(self, block: int) -> str:
        """Where block ``block`` lies (its first record), for messages."""
        record = max(0, int(np.searchsorted(self.records["global_row"],
                                            block * self.block_rows, side="right")) - 1)
        return self._where(record)

    def _decode(self, record: int, stored: bytes) -> np.ndarray:
        """The rows (block and halo) of one record, checked against its CRCs and
        the records table; inflated into at most the record's own bytes."""
        table = self.records
        size = int(table["bytes"][record])
        if len(stored) != size:
            ask_guard(self._setup)  # a replaced store says so, never "truncated"
            raise StoreError(f"{self._where(record)}: file is truncated ({len(stored)} of "
                             f"{size} bytes)")
        rows = int(table["rows"][record]) + int(table["halo"][record])
        limit = rows * self._items * self._dtype.itemsize + _RECORD_OVERHEAD * 4
        try:
            ints, data = decode_example(unframe_record(stored, gzip=self._gzip, limit=limit))
        except (RecordError, DecodeError) as exc:
            ask_guard(self._setup)  # a replaced store says so, never "corrupt"
            what = "not a valid Example: " if isinstance(exc, DecodeError) else ""
            raise StoreError(f"{self._where(record)}: {what}{exc}") from exc
        if ints.get("store") != [self._tag]:
            ask_guard(self._setup)  # a replaced store says so
            raise StoreError(f"{self._where(record)}: belongs to another store (store tag "
                             f"{ints.get('store')}, expected {self._tag})")
        self._check_fields(record, ints, data)
        if len(data["data"]) != rows * self._items * self._dtype.itemsize:
            raise StoreError(f"{self._where(record)}: holds {len(data['data'])} bytes of rows, "
                             f"expected {rows} rows of {self._items} {self._dtype} values")
        values = np.frombuffer(data["data"], dtype=self._little)
        return values.astype(self._dtype, copy=False).reshape(rows, *self._step_shape)

    def _check_fields(self, record: int, ints: dict[str, list[int]],
                      data: dict[str, bytes]) -> None:
        """The record's own fields must say what the records table says of it."""
        table = self.records
        expected = {"record": [record], "series": [int(table["series"][record])],
                    "row": [int(table["row"][record])], "rows": [int(table["rows"][record])],
                    "halo": [int(table["halo"][record])], "shape": list(self._step_shape)}
        found = {name: ints.get(name) for name in expected}
        if found != expected or "data" not in data:
            wrong = next((n for n in expected if found[n] != expected[n]), "data")
            raise StoreError(f"{self._where(record)}: field {wrong!r} is "
                             f"{found.get(wrong, 'missing')}, the records table says "
                             f"{expected.get(wrong, 'bytes')}")

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        return self.read_many([(start, stop)])[0]

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """Global rows of each ``(start, stop)``, their records fetched at once."""
        table = self.records
        needed = [self._records_for(start, stop) for start, stop in ranges]
        wanted = sorted({record for records in needed for record in records})
        stored = self._fetch(wanted) if wanted else {}
        decoded = {record: self._decode(record, stored[record]) for record in wanted}
        out = []
        for (start, stop), records in zip(ranges, needed, strict=True):
            rows = np.empty((max(0, stop - start), *self._step_shape), dtype=self._dtype)
            position = start
            for record in records:
                values = decoded[record]
                lo = position - int(table["global_row"][record])
                take = min(stop - position, len(values) - lo)
                rows[position - start:position - start + take] = values[lo:lo + take]
                position += take
            out.append(rows)
        return out
