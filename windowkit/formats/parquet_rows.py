"""Parquet storage: ordinary tables any Parquet tool reads.

``data/part-NNNNN.parquet`` files with columns ``series`` (int32), ``row``
(int64, row number within its series) and the values: one column per feature
for vector steps (``f0``, ``f1``, ... or the source's names), a single
``value`` column for scalar steps, and a fixed-size list column ``values`` for
N-D steps (row-major, shape in the manifest). Each row group holds one storage
block: consecutive rows of one or more series (a series longer than a block
spans several), so a block is one row group however short the series are.
zstd by default; page checksums and statistics are written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, ValidationInfo, model_validator

from windowkit._schema import Name
from windowkit.errors import StoreError, StoreUnreachableError
from windowkit.formats._checks import (
    BlockDigester,
    CheckedReader,
    ask_guard,
    check_regular,
    checked,
    in_threads,
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
)
from windowkit.location import is_remote, open_parquet
from windowkit.spec import WindowSpec

OPEN_FILES = 2  # part files a reader keeps open
COMPRESSIONS = ("zstd", "gzip", "none")
_ROW_OVERHEAD = 12  # the series (int32) and row (int64) columns of a row
_GROUP_OVERHEAD = 2048  # footer metadata of one row group (and its page headers)


def value_columns(step_shape: tuple[int, ...], names: Sequence[str] | None) -> list[str]:
    """Names of the value columns for a step shape: a vector step's features
    keep their source names (``names``), whatever they are; ``f0 .. f{F-1}``
    where the source had none."""
    if not step_shape:
        return ["value"]
    if len(step_shape) == 1:
        if names and len(names) == step_shape[0]:
            return list(names)
        return [f"f{i}" for i in range(step_shape[0])]
    return ["values"]


def bookkeeping_columns(values: Sequence[str]) -> tuple[str, str]:
    """The names of the series and row columns beside the ``values``: ``series``
    and ``row``, with a ``_`` put in front while a value column has the name
    (the layout's own columns give way, never the user's)."""
    taken = set(values)

    def free(name: str) -> str:
        while name in taken:
            name = f"_{name}"
        return name

    return free("series"), free("row")


class ParquetData(DataSection):
    """The manifest's ``data`` section of a Parquet store."""

    files: list[DataFile] = Field(min_length=1)
    columns: list[Name] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ParquetData:
        self.check_compression(COMPRESSIONS)
        check_data_files(self.files, info)
        return self


def value_fields(dtype: np.dtype, step_shape: tuple[int, ...], names: Sequence[str]
                 ) -> list[pa.Field]:
    """The value columns (named ``names``, see :func:`value_columns`) of the
    store's schema."""
    value_type = pa.from_numpy_dtype(dtype)
    if len(step_shape) > 1:
        items = int(np.prod(step_shape, dtype=np.int64))
        return [pa.field(names[0], pa.list_(value_type, items))]
    return [pa.field(name, value_type) for name in names]


class _TableBuilder:
    """Turns one piece's rows into an Arrow table of the store's schema."""

    def __init__(self, layout: DataLayout) -> None:
        self._step_shape = layout.rows.step_shape
        self._items = int(np.prod(layout.rows.step_shape, dtype=np.int64))
        values = value_columns(layout.rows.step_shape, layout.columns)
        self.series, row = bookkeeping_columns(values)
        self.schema = pa.schema(
            [pa.field(self.series, pa.int32()), pa.field(row, pa.int64()),
             *value_fields(layout.rows.dtype, layout.rows.step_shape, values)],
            metadata={STORE_ID_KEY: layout.store_id})

    def __call__(self, piece: Piece) -> pa.Table:
        rows, n = piece.rows, len(piece.rows)
        arrays: list[pa.Array] = [
            pa.array(np.full(n, piece.series_id, dtype=np.int32)),
            pa.array(np.arange(piece.local_start, piece.local_start + n, dtype=np.int64))]
        if len(self._step_shape) > 1:
            flat = pa.array(np.ascontiguousarray(rows).reshape(-1))
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, self._items))
        elif self._step_shape:
            arrays += [pa.array(np.ascontiguousarray(rows[:, i])) for i in range(rows.shape[1])]
        else:
            arrays.append(pa.array(rows))
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _group_bytes(meta: pq.FileMetaData, first: int, last: int) -> tuple[int, int]:
    """The bytes ``[start, stop)`` of row groups ``first..last``: their column
    chunks, which a writer puts one after another."""
    chunks = [meta.row_group(g).column(c) for g in (first, last)
              for c in range(meta.num_columns)]
    starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
              for c in chunks]
    return min(starts), max(s + c.total_compressed_size for s, c in zip(starts, chunks,
                                                                       strict=True))


class ParquetRowReader(RowReader):
    """Reads global row ranges from the row groups that hold them."""

    def __init__(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup) -> None:
        self._root = data_dir.parent
        self._files = data["files"]
        self._columns = data["columns"]
        self._setup = setup
        self._dtype = setup.rows.dtype
        self._step_shape = setup.rows.step_shape
        self.block_rows = setup.rows.block_rows
        self._fields = value_fields(setup.rows.dtype, setup.rows.step_shape, self._columns)
        self._file_first = np.array([f["first_row"] for f in self._files], dtype=np.int64)
        # an open file holds decoder buffers: keep a few open, and every file's layout
        self._handles: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self._group_starts: dict[int, np.ndarray] = {}
        self._known: dict[int, dict[str, Any]] = {}  # what opening each file found out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": OrderedDict(), "_known": {}}

    def __copy__(self) -> ParquetRowReader:
        """A reader of its own open files that shares what this one learnt of
        every file (its footer and layout): a copy opens a file without a request."""
        twin = object.__new__(ParquetRowReader)
        twin.__dict__.update(self.__dict__, _handles=OrderedDict())
        return twin

    def _file(self, i: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """An open part file and the global first row of each of its row groups."""
        if i in self._handles:
            self._handles.move_to_end(i)
            return self._handles[i], self._group_starts[i]
        entry = self._files[i]
        path = self._root / entry["path"]
        first_open = i not in self._known
        known = self._known.get(i, {})
        check_regular(path)
        try:
            handle = open_parquet(path, known=known, page_checksum_verification=True)
        except StoreUnreachableError:
            raise  # one line already, naming the URL and the timeouts
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
            ask_guard(self._setup)  # a replaced store says so, never "corrupt"
            raise StoreError(f"{path}: cannot open Parquet file ({exc})") from exc
        check_regular(path)  # checked again after the open: nothing else was swapped in
        self._setup.check_store()  # after the open: the handle reads this store's file
        if first_open:  # what the file holds: checked once
            self._check_schema(path, handle.schema_arrow)
            self._group_starts[i] = self._check_groups(path, handle.metadata, entry)
            self._known[i] = known
        self._handles[i] = handle
        while len(self._handles) > OPEN_FILES:
            self._handles.popitem(last=False)
        return handle, self._group_starts[i]

    def _check_schema(self, path: Path, schema: pa.Schema) -> None:
        """The file must hold this store's value columns, of its dtype, and its id."""
        found = [schema.field(name) if name in schema.names else None
                 for name in self._columns]
        if [f.type if f else None for f in found] != [f.type for f in self._fields] or [
                f.name for f in self._fields] != self._columns:
            bookkeeping = bookkeeping_columns(self._columns)
            have = ", ".join(f"{f.name}: {f.type}" for f in schema
                             if f.name not in bookkeeping)
            want = ", ".join(f"{f.name}: {f.type}" for f in self._fields)
            raise StoreError(f"{path}: value columns ({have}) differ from the manifest's "
                             f"({want})")
        store_id = (schema.metadata or {}).get(STORE_ID_KEY.encode(), b"").decode()
        if store_id != self._setup.store_id:
            ask_guard(self._setup)  # a replaced store says so
            raise StoreError(f"{path}: belongs to store id {store_id[:12] or '(none)'}, "
                             f"not to this store ({self._setup.store_id[:12]})")

    def _check_groups(self, path: Path, meta: pq.FileMetaData, entry: dict[str, Any]
                      ) -> np.ndarray:
        """The global first row of each row group (and the file's end); one line
        unless every row group is one whole storage block whose column chunks
        decode into at most a block's bytes (a bomb is refused unread)."""
        sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)],
                         dtype=np.int64)
        if sizes.sum() != entry["rows"]:
            raise StoreError(f"{path}: holds {sizes.sum()} rows, manifest says "
                             f"{entry['rows']}")
        starts = entry["first_row"] + np.concatenate([[0], np.cumsum(sizes)])
        size = self.block_rows
        ends = np.minimum(starts[:-1] // size * size + size, self._setup.rows.total_rows)
        bad = np.flatnonzero((starts[:-1] % size != 0) | (starts[1:] != ends))
        if len(bad):
            raise StoreError(f"{path}: row group {bad[0]} holds rows {starts[bad[0]]}.."
                             f"{starts[bad[0] + 1]}, not one storage block of {size} rows")
        limit = size * max(8, self._setup.rows.dtype.itemsize * int(
            np.prod(self._step_shape, dtype=np.int64))) * 2 + (1 << 16)
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                if group.column(c).total_uncompressed_size > limit:
                    raise StoreError(
                        f"{path}: row group {g} column {group.column(c).path_in_schema} "
                        f"declares {group.column(c).total_uncompressed_size} bytes decoded, "
                        f"more than a block can hold ({limit}); refused")
        return starts

    def describe(self, block: int) -> str:
        """Where block ``block`` lies, for messages."""
        row = block * self.block_rows
        i = max(0, int(np.searchsorted(self._file_first, row, side="right")) - 1)
        starts = self._group_starts.get(i)
        group = "" if starts is None else (
            f" row group {int(np.searchsorted(starts, row, side='right')) - 1}")
        return f"{self._root / self._files[i]['path']}{group}"

    def _read_groups(self, i: int, first: int, last: int) -> pa.Table:
        """The value columns of row groups ``first..last`` of part file ``i``, read
        with one call (on object storage, with one request for their bytes);
        Arrow decodes them outside the interpreter lock."""
        handle, starts = self._file(i)
        path = self._root / self._files[i]["path"]
        which = f"row group {first}" if first == last else f"row groups {first}..{last}"
        try:
            if is_remote(self._root):  # the groups' bytes (consecutive in the file) at once
                handle = open_parquet(path, known=self._known[i],
                                      prefetch=_group_bytes(handle.metadata, first, last),
                                      page_checksum_verification=True)
                self._setup.check_store()  # after the read: the bytes were this store's
            table = handle.read_row_groups(list(range(first, last + 1)), columns=self._columns)
        except StoreUnreachableError:
            raise  # one line already, naming the URL and the timeouts
        except (OSError, ValueError, pa.ArrowInvalid) as exc:
            ask_guard(self._setup)  # a replaced store says so, never "corrupt"
            raise StoreError(f"{path}: cannot read {which} ({exc})") from exc
        if len(table) != starts[last + 1] - starts[first]:
            raise StoreError(f"{path}: {which} hold {len(table)} rows, the metadata says "
                             f"{starts[last + 1] - starts[first]}")
        return table

    def _rows_into(self, table: pa.Table, skip: int, into: np.ndarray) -> None:
        """Rows ``skip ..`` of ``table`` (as many as ``into`` holds) into ``into``:
        a vector step's columns are interleaved block by block, over the usable
        cores (copies outside the interpreter lock, each in the cache)."""
        rows = len(into)
        if len(self._step_shape) > 1:
            flat = table.column(0).combine_chunks().flatten().to_numpy(zero_copy_only=False)
            into[...] = flat.reshape(len(table), *self._step_shape)[skip:skip + rows]
            return
        columns = [table.column(c).to_numpy(zero_copy_only=False)[skip:skip + rows]
                   for c in range(len(self._columns))]
        if not self._step_shape:
            into[...] = columns[0]
            return
        step = self.block_rows

        def interleave(piece: int) -> None:
            lo, hi = piece * step, min(rows, (piece + 1) * step)
            stacked = np.empty((len(columns), hi - lo), dtype=into.dtype)
            for c, column in enumerate(columns):
                stacked[c] = column[lo:hi]
            into[lo:hi] = stacked.T

        in_threads(interleave, -(-rows // step))

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((max(0, stop - start), *self._step_shape), dtype=self._dtype)
        file_index = int(np.searchsorted(self._file_first, start, side="right")) - 1
        position = start
        while position < stop and file_index < len(self._files):
            _, group_starts = self._file(file_index)
            first = int(np.searchsorted(group_starts, position, side="right")) - 1
            last = min(int(np.searchsorted(group_starts, stop, side="left")) - 1,
                       len(group_starts) - 2)
            if first <= last:
                table = self._read_groups(file_index, first, last)
                lo = position - int(group_starts[first])
                hi = min(stop, int(group_starts[last + 1])) - int(group_starts[first])
                self._rows_into(table, lo, out[position - start:position - start + hi - lo])
                position = int(group_starts[first]) + hi
            file_index += 1
        if position != stop:
            raise StoreError(f"{self._root / 'data'}: no Parquet file holds rows "
                             f"{position}..{stop} (the files hold {start}..{position} of "
                             f"rows {start}..{stop})")
        return out


class ParquetFormat:
    name: str = "parquet"
    compressions: tuple[str, ...] = COMPRESSIONS
    default_compression: str = "zstd"
    target_block_bytes: int = 1 << 20
    data_model: type[DataSection] = ParquetData

    def min_block_rows(self, spec: WindowSpec) -> int:
        return spec.span

    def max_data_bytes(self, layout: DataLayout, num_pieces: int) -> int:
        columns = len(value_columns(layout.rows.step_shape, layout.columns)) + 2
        return int(layout.rows.total_rows * (layout.rows.row_bytes + _ROW_OVERHEAD) * 1.01) + (
            num_pieces * _GROUP_OVERHEAD * columns // 4) + (64 << 10)

    def prepare(self, data_dir: Path, layout: DataLayout, num_parts: int) -> None:
        pass

    def write_part(self, data_dir: Path, layout: DataLayout, part: PartTask,
                   pieces: Iterator[Piece], read_series: ReadSeries) -> dict[str, Any]:
        """One file per part, one row group per storage block (the pieces of
        the block's series, in order)."""
        name = self.part_files(data_dir, layout, part)[0]
        build = _TableBuilder(layout)
        digester = BlockDigester(layout)
        compression = None if layout.compression == "none" else layout.compression
        with pq.ParquetWriter(data_dir / name, build.schema, compression=compression,
                              write_page_checksum=True, write_statistics=True,
                              use_dictionary=[build.series]) as writer:
            block: list[pa.Table] = []

            def write_block() -> None:
                if block:
                    table = pa.concat_tables(block)
                    writer.write_table(table, row_group_size=max(1, len(table)))
                    block.clear()

            current = -1
            for piece in digester.wrap(pieces):
                if piece.global_start // layout.rows.block_rows != current:
                    write_block()
                    current = piece.global_start // layout.rows.block_rows
                block.append(build(piece))
            write_block()
        return {"path": f"data/{name}", "first_row": part.first_row, "rows": part.rows,
                **digester.summary()}

    def part_files(self, data_dir: Path, layout: DataLayout, part: PartTask) -> list[str]:
        return [f"part-{part.number:05d}.parquet"]

    def finish(self, data_dir: Path, layout: DataLayout,
               parts: list[dict[str, Any]]) -> dict[str, Any]:
        files = [{k: p[k] for k in ("path", "first_row", "rows")} for p in parts]
        return layout.data_section(
            files=files, columns=value_columns(layout.rows.step_shape, layout.columns),
            digests=write_digests(data_dir, layout, parts))

    def open_reader(self, data_dir: Path, data: dict[str, Any], setup: ReaderSetup
                    ) -> CheckedReader:
        reader = ParquetRowReader(data_dir, data, setup)
        return checked(reader, data_dir, data, setup, reader.describe)

    block_name: str = "row group"

    def data_files(self, data: dict[str, Any]) -> int:
        return len(data["files"])

    def stored_rows(self, root: Path, data: dict[str, Any]) -> int:
        return sum(open_parquet(root / f["path"]).metadata.num_rows for f in data["files"])
