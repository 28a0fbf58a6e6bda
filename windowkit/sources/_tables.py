"""Table sources: CSV and Parquet files (long or wide form) and pandas DataFrames.

A table is streamed once, in record batches (pyarrow's streaming CSV reader,
Parquet row group by row group), and *staged*: the feature values of each
series are appended to one raw little-endian file and its times to another,
so the rest of the conversion reads series by row range from memory maps, in
bounded memory, whatever the table's size. Rows should come grouped by series
(the way a database export or a ``groupby`` usually writes them); a table whose
series are interleaved (a log of several sensors in time order) is grouped in
memory when it fits a budget (``sort_memory``), and refused otherwise with a
message that says how to fix it. Within a series, times must increase.

Time: integer, date and timestamp columns are kept as int64 (days for dates,
nanoseconds since the epoch, in UTC, for timestamps). Times must strictly
increase within a series. Each series' regular step is the most common
difference between consecutive times; a difference larger than ``max_gap``
is a gap, and no window spans it. By default ``max_gap`` is 1.5 steps: one
missed sample is a gap, a month of 30 days among months of 31 is not.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import itertools
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from windowkit.errors import DiskSpaceError, SourceError, SourceNotFoundError, WindowkitError
from windowkit.location import as_url_path, is_url, open_parquet, remote_errors, resolve
from windowkit.sources._datasets import TableFiles, dataset_batches, fingerprint, table_files
from windowkit.sources._datasets import table_rows as dataset_rows
from windowkit.sources._grouping import group_by_series, read_within
from windowkit.sources._pins import check_regular
from windowkit.sources._times import (
    CLOCK_DIRECTIVES,
    float_times,
    parse_gap,
    time_unit,
    times_int64,
)

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
_BATCH_ROWS = 1 << 16
_CSV_BLOCK_BYTES = 8 << 20
_TIME_CHUNK = 1 << 20  # time differences examined at once
_MISFIT = {True: "it overflows to infinity", False: "not a value of it"}
_MAX_NAME = 256  # characters of a column name a store's manifest holds
DEFAULT_SORT_MEMORY = 1 << 30  # largest table (in memory) grouped by series there
log = logging.getLogger("windowkit")


@dataclass(frozen=True)
class TableOptions:
    """How to read a table: which column names the series, which the time, and
    which are features (default: every other column)."""

    series_col: str | None = None
    time_col: str | None = None
    columns: tuple[str, ...] | None = None
    max_gap: str | int | None = None
    time_format: str | None = None  # strptime codes for a text time column
    static_columns: tuple[str, ...] | None = None  # one value per series, not features
    dtype: str | None = None  # the values' dtype (cast, checked), else the columns' own


def _suffix(path: str) -> str:
    """The file name's suffix, lower case (of a URL's path for a URL)."""
    return Path(urlsplit(path).path if is_url(path) else path).suffix.lower()


def is_table(source: Any) -> bool:
    """Whether ``source`` is a table: a CSV or Parquet file, several of them (a
    list, a glob, a directory of parts: :mod:`._datasets`), or a DataFrame."""
    if type(source).__name__ == "DataFrame" and hasattr(source, "columns"):
        return True
    if table_files(source) is not None:
        return True
    return isinstance(source, (str, os.PathLike)) and (
        _suffix(os.fspath(source)) in TABLE_SUFFIXES)


@dataclass
class StagedSeries:
    """One series of a staged table: rows in a raw file, read by memory map."""

    key: str
    where: str
    path: str
    first_row: int  # of this series in the staged file
    rows: int
    dtype: np.dtype
    step_shape: tuple[int, ...]
    source_id: str  # what the rows came from (the table's fingerprint)
    features: tuple[str, ...] = ()
    time_unit: str = ""  # "ns" (timestamps, UTC), "days" (dates), "" (integers)
    time_zone: str | None = None
    first_time: int | None = None
    last_time: int | None = None
    time_step: int | None = None
    segments: list[tuple[int, int]] = field(default_factory=list)  # gap-free row ranges
    times_path: str = ""
    static: tuple[float, ...] = ()  # the series' static column values

    def times(self) -> np.ndarray | None:
        """The series' times (int64, memory-mapped), or None without a time column."""
        if not self.times_path:
            return None
        return np.memmap(self.times_path, dtype="<i8", mode="r", offset=self.first_row * 8,
                         shape=(self.rows,))

    def read(self, start: int, stop: int) -> np.ndarray:
        width = int(np.prod(self.step_shape, dtype=np.int64))
        try:
            rows = np.memmap(self.path, dtype=self.dtype, mode="r",
                             offset=(self.first_row + start) * width * self.dtype.itemsize,
                             shape=(stop - start, *self.step_shape))
        except ValueError as exc:  # the staged file is shorter than the rows asked
            raise SourceError(f"{self.where}: staged rows {start}..{stop} cannot be read "
                              f"({exc})") from exc
        return np.array(rows)


def _first_null(column: pa.Array) -> int:
    """The position of the column's first empty value."""
    return int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])


class NotInOrderError(SourceError):
    """The rows of a series are not together in the table."""


class _Stager:
    """Streams record batches of one table into the staging files."""

    def __init__(self, name: str, options: TableOptions, staging: Path, source_id: str,
                 allow_missing: bool = False, origin: np.ndarray | None = None,
                 parts: list[tuple[int, str]] | None = None) -> None:
        self.name, self.options, self.source_id = name, options, source_id
        self.parts = parts if parts is not None else []  # several files: first rows, paths
        self.wide_key = Path(name).stem  # the key of the one series without a series column
        self.allow_missing = allow_missing  # empty values become NaN (nan="skip")
        self.origin = origin  # table row of each staged row, when the table was sorted
        # a DataFrame has no file to identify it: a digest of what is staged does
        self.digest = hashlib.blake2b(digest_size=16) if not source_id else None
        self.values_path = staging / "rows.bin"
        self.values = open(self.values_path, "wb")  # noqa: SIM115 - closed by close()
        self.times_path = staging / "times.bin"
        self.times = open(self.times_path, "wb")  # noqa: SIM115 - closed by close()
        self.features: list[str] = []
        self.dtype: np.dtype | None = None
        self.unit: str = ""
        self.text_times = False  # a text time column, parsed with options.time_format
        self.float_times = False  # a float time column: whole numbers only
        self.tz: str | None = None
        self.series: list[StagedSeries] = []
        self.seen: set[str] = set()
        self.row = 0  # table rows consumed
        self.staged = 0  # rows written
        self.current: str | None = None
        self.current_first = 0
        self.current_rows = 0
        self.last_time: int | None = None
        self.static_names = list(options.static_columns or ())
        self.current_static: np.ndarray | None = None

    def schema(self, schema: pa.Schema) -> None:
        names = schema.names
        opts = self.options
        for label, column in (("series", opts.series_col), ("time", opts.time_col),
                              *(("feature", c) for c in opts.columns or ()),
                              *(("static", c) for c in self.static_names)):
            if column is not None and column not in names:
                raise SourceError(f"{self.name}: no {label} column {column!r} (columns: "
                                  f"{', '.join(names)})")
        self._check_static(schema)
        skip = {opts.series_col, opts.time_col, *self.static_names}
        self.features = list(opts.columns) if opts.columns else [
            n for n in names if n not in skip]
        self._check_names(names, {*skip, *self.features} - {None})
        for label, chosen in (("--columns", self.features), ("--static-columns",
                                                              self.static_names)):
            repeated = sorted({c for c in chosen if chosen.count(c) > 1})
            if repeated:
                raise SourceError(f"{self.name}: {label} names {repeated[0]!r} more than "
                                  "once; name each column once")
        if not self.features:
            raise SourceError(f"{self.name}: no feature columns")
        kinds = []
        for column in self.features:
            kind = schema.field(column).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                    or pa.types.is_boolean(kind) or pa.types.is_null(kind)):
                raise SourceError(f"{self.name}: column {column!r} is not numeric ({kind}); "
                                  "pass the feature columns with --columns")
            kinds.append(np.dtype(kind.to_pandas_dtype()) if not pa.types.is_null(kind)
                         else np.dtype(np.float32))
        self.dtype = np.result_type(*kinds)
        if self.dtype.kind == "b":
            self.dtype = np.dtype(np.uint8)
        if opts.dtype is not None:
            self.dtype = np.dtype(opts.dtype)
        if opts.time_col is not None:
            kind = schema.field(opts.time_col).type
            self.text_times = pa.types.is_string(kind) or pa.types.is_large_string(kind) or (
                pa.types.is_integer(kind) and opts.time_format is not None)  # e.g. 20240131
            self.float_times = pa.types.is_floating(kind) and not self.text_times
            if not self.text_times:
                self.unit, self.tz = time_unit(kind, f"{self.name}: time column "
                                                     f"{opts.time_col!r}")
            elif opts.time_format:  # text without a format is refused at its first value
                clock = any(code in opts.time_format for code in CLOCK_DIRECTIVES)
                self.unit = "ns" if clock else "days"

    def _check_names(self, names: list[str], used: set[str | None]) -> None:
        """The columns used must have a name, at most 256 characters, found once."""
        hint = ", or choose the columns to use with --columns"
        for position, name in enumerate(names):
            if name not in used:
                continue
            if not name.strip():
                raise SourceError(f"{self.name}: column {position} (counting from 0) has no "
                                  f"name in the header: name it{hint}")
            if len(name) > _MAX_NAME:
                raise SourceError(f"{self.name}: column {position} has a name of {len(name)} "
                                  f"characters, over {_MAX_NAME}: rename it{hint}")
            if names.count(name) > 1:
                raise SourceError(f"{self.name}: column name {name!r} appears "
                                  f"{names.count(name)} times in the header; column names "
                                  f"must be unique: rename one{hint}")

    def _check_static(self, schema: pa.Schema) -> None:
        """Static columns: numeric, and neither the series, time nor a feature column."""
        opts = self.options
        for column in self.static_names:
            if column in (opts.series_col, opts.time_col) or column in (opts.columns or ()):
                role = ("the series" if column == opts.series_col else "the time"
                        if column == opts.time_col else "a feature")
                raise SourceError(f"{self.name}: static column {column!r} is also {role} "
                                  "column; a static column holds one value per series")
            kind = schema.field(column).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                    or pa.types.is_boolean(kind)):
                raise SourceError(f"{self.name}: static column {column!r} is not numeric "
                                  f"({kind})")

    def _static(self, batch: pa.RecordBatch, lo: int, hi: int, key: str) -> None:
        """Check that rows ``lo..hi`` (one series) hold the series' static values."""
        for k, column in enumerate(self.static_names):
            part = batch.column(column).slice(lo, hi - lo)
            if part.null_count:
                name, at = self._row_at(self.row + lo + _first_null(part))
                raise SourceError(f"{name}: series {key!r}, row {at}, static column "
                                  f"{column!r} is empty")
            values = part.cast(pa.float64()).to_numpy(zero_copy_only=False)
            if not np.isfinite(values).all():
                name, at = self._row_at(self.row + lo + int(np.flatnonzero(
                    ~np.isfinite(values))[0]))
                raise SourceError(f"{name}: series {key!r}, row {at}, static column "
                                  f"{column!r} is NaN or infinite")
            assert self.current_static is not None
            if np.isnan(self.current_static[k]):
                self.current_static[k] = values[0]
            changed = np.flatnonzero(values != self.current_static[k])
            if len(changed):
                name, at = self._row_at(self.row + lo + int(changed[0]))
                raise SourceError(
                    f"{name}: series {key!r}, row {at}, static column {column!r}: "
                    f"{values[changed[0]]:g} differs from the series' {self.current_static[k]:g}"
                    "; a static column must hold one value per series")

    def batch(self, batch: pa.RecordBatch) -> None:
        """Stage one record batch: its values, cut into runs of one series each."""
        n = batch.num_rows
        if n == 0:
            return
        values = self._values(batch)
        keys, cuts = self._series_runs(batch)
        times = self._times(batch)
        for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [n]]), strict=True):
            key = str(keys[lo]) if keys is not None else self.wide_key
            if key != self.current:
                self._start(key, self.row + int(lo))
            if self.static_names:
                self._static(batch, int(lo), int(hi), key)
            staged = [values[lo:hi].tobytes()]
            if times is not None:
                self._check_times(times[lo:hi], self.row + int(lo))
                staged.append(times[lo:hi].astype("<i8").tobytes())
                self.times.write(staged[1])
            self.values.write(staged[0])
            if self.digest is not None:
                for part in staged:
                    self.digest.update(part)
            self.current_rows += int(hi - lo)
        self.row += n

    def _values(self, batch: pa.RecordBatch) -> np.ndarray:
        """The feature values ``[rows, features]``, checked: numeric, and empty
        only where allowed (then NaN)."""
        assert self.dtype is not None
        columns = []
        for name in self.features:
            column = batch.column(name)
            if column.null_count and not (self.allow_missing and self.dtype.kind == "f"):
                at = _first_null(column)
                hint = ("; --nan skip needs float feature columns" if self.allow_missing else
                        "; missing values are not allowed (--nan skip keeps the rows and "
                        "leaves out the windows touching them)")
                where, row = self._row_at(self.row + at)
                raise SourceError(f"{where}: {self._series_at(batch, at)}row {row}, "
                                  f"column {name!r} is missing (empty or NaN){hint}")
            if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
                    or pa.types.is_boolean(column.type)):
                where, row = self._row_at(self.row)
                raise SourceError(f"{where}: column {name!r} is not numeric near row "
                                  f"{row} ({column.type})")
            if column.null_count:  # allowed: NaN, and the windows touching it are skipped
                column = column.cast(pa.float64()).fill_null(np.nan)
            columns.append(self._cast(column.to_numpy(zero_copy_only=False), name, batch))
        return np.column_stack(columns).astype(self.dtype.newbyteorder("<"), copy=False)

    def _cast(self, values: np.ndarray, column: str, batch: pa.RecordBatch) -> np.ndarray:
        """A column's values in the ``dtype`` asked for, checked: a float value
        that overflows to infinity, or one an integer dtype cannot hold, is an
        error naming the column and row."""
        if self.options.dtype is None or values.dtype == self.dtype:
            return values
        assert self.dtype is not None
        with np.errstate(over="ignore", invalid="ignore"):
            cast = values.astype(self.dtype)
            wide = values.astype(np.float64)
            if self.dtype.kind == "f":
                bad = np.isinf(cast) & np.isfinite(wide)
            else:
                info = np.iinfo(self.dtype)
                bad = ~np.isfinite(wide) | (wide != np.round(wide)) | (wide < info.min) | (
                    wide > info.max)
        if not bad.any():
            return cast
        at = int(np.flatnonzero(bad)[0])
        where, row = self._row_at(self.row + at)
        raise SourceError(f"{where}: {self._series_at(batch, at)}row {row}, column "
                          f"{column!r}: {values[at].item()!r} does not fit --dtype {self.dtype} "
                          f"({_MISFIT[self.dtype.kind == 'f']}); choose a wider --dtype")

    def _series_runs(self, batch: pa.RecordBatch) -> tuple[np.ndarray | None, np.ndarray]:
        """Each row's series key (None without a series column), and the rows
        where the key changes."""
        if self.options.series_col is None:
            return None, np.empty(0, dtype=np.int64)
        keys = batch.column(self.options.series_col).cast(pa.string())
        if keys.null_count:
            where, row = self._row_at(self.row + _first_null(keys))
            raise SourceError(f"{where}: row {row}, series column "
                              f"{self.options.series_col!r} is empty")
        blank = pc.equal(pc.utf8_trim_whitespace(keys), "").to_numpy(zero_copy_only=False)
        if blank.any():
            where, at = self._row_at(self.row + int(np.flatnonzero(blank)[0]))
            raise SourceError(f"{where}: row {at}, series column "
                              f"{self.options.series_col!r} is empty; every row needs a "
                              "series id")
        values = np.asarray(keys.to_numpy(zero_copy_only=False), dtype=object)
        return values, np.flatnonzero(values[1:] != values[:-1]) + 1

    def _times(self, batch: pa.RecordBatch) -> np.ndarray | None:
        """The rows' times as int64 (None without a time column)."""
        if self.options.time_col is None:
            return None
        column = batch.column(self.options.time_col)
        if column.null_count:
            where, row = self._row_at(self.row + _first_null(column))
            raise SourceError(f"{where}: row {row}, time column {self.options.time_col!r} "
                              "is empty")
        if self.float_times:
            return float_times(column, self._row_text, self.options.time_col)
        if self.text_times:
            column = self._parse_text_times(column)
        return times_int64(column, self.unit)

    def _parse_text_times(self, column: pa.Array) -> pa.Array:
        """Text times parsed with ``--time-format`` (strptime codes) into timestamps."""
        where = f"{self.name}: time column {self.options.time_col!r}"
        time_format = self.options.time_format
        if time_format is None:
            raise SourceError(f"{where} holds text ({column[0].as_py()!r} first), not times; "
                              "pass its format with --time-format, e.g. %Y/%m/%d or "
                              "'%d.%m.%Y %H:%M'")
        column = column.cast(pa.string())
        parsed = pc.strptime(column, format=time_format, unit="ns", error_is_null=True)
        if parsed.null_count:
            at = int(np.flatnonzero(parsed.is_null().to_numpy(zero_copy_only=False))[0])
            where, row = self._row_at(self.row + at)
            raise SourceError(f"{where}: row {row}, time {column[at].as_py()!r} does not "
                              f"match --time-format {time_format!r}")
        return parsed

    def _source_row(self, position: int) -> int:
        """The table row (as the user counts, from 0) of staged ``position``."""
        return position if self.origin is None else int(self.origin[position])

    def _row_at(self, position: int) -> tuple[str, int]:
        """The file and its row (from 0) of staged ``position``: for several
        files, the one holding it; else the table and its row."""
        row = self._source_row(position)
        if not self.parts:
            return self.name, row
        first, path = self.parts[bisect.bisect_right([p[0] for p in self.parts], row) - 1]
        return path, row - first

    def _row_text(self, at: int) -> str:
        """``file: row N`` of the current batch's row ``at``."""
        where, row = self._row_at(self.row + at)
        return f"{where}: row {row}"

    def _series_at(self, batch: pa.RecordBatch, at: int) -> str:
        if self.options.series_col is None:
            return ""
        return f"series {str(batch.column(self.options.series_col)[at].as_py())!r}, "

    def _sort_hint(self) -> str:
        keys = [repr(c) for c in (self.options.series_col, self.options.time_col) if c]
        return f"sort the table by {' and '.join(keys)} first"

    def _start(self, key: str, row: int) -> None:
        if key in self.seen:
            where, at = self._row_at(row)
            raise NotInOrderError(
                f"{self.name}: rows of series {key!r} are not grouped together (it appears "
                f"again at {'' if where == self.name else where + ', '}row {at}); "
                f"{self._sort_hint()}")
        self._finish()
        self.seen.add(key)
        if self.digest is not None:
            self.digest.update(f"\0{key}\0".encode())
        self.current, self.current_first, self.current_rows = key, self.staged, 0
        self.last_time = None
        self.current_static = np.full(len(self.static_names), np.nan)

    def _check_times(self, times: np.ndarray, row: int) -> None:
        previous = np.concatenate([[self.last_time], times[:-1]]) if self.last_time is not None \
            else times[:-1]
        current = times if self.last_time is not None else times[1:]
        bad = np.flatnonzero(current <= previous)
        if len(bad):
            where, at = self._row_at(row + int(bad[0]) + (0 if self.last_time is not None
                                                         else 1))
            what = "repeats" if current[bad[0]] == previous[bad[0]] else "goes back from"
            raise SourceError(
                f"{where}: series {self.current!r}, row {at}: time {what} the previous "
                f"row's; times must strictly increase within a series")
        if len(times):
            self.last_time = int(times[-1])

    def _finish(self) -> None:
        if self.current is None:
            return
        assert self.dtype is not None
        series = StagedSeries(
            key=self.current, where=f"{self.name}: series {self.current!r}",
            path=str(self.values_path), first_row=self.current_first, rows=self.current_rows,
            dtype=self.dtype, step_shape=(len(self.features),), source_id=self.source_id,
            features=tuple(self.features), time_unit=self.unit, time_zone=self.tz,
            times_path=str(self.times_path) if self.options.time_col else "",
            static=tuple(float(v) for v in self.current_static)
            if self.current_static is not None else ())
        if self.options.time_col is not None:
            self._timing(series)
        self.series.append(series)
        self.staged += self.current_rows

    @staticmethod
    def _time_chunks(times: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """Consecutive time differences, chunk by chunk, as ``(row of each chunk's
        first later time, diffs)``; memory stays bounded."""
        for lo in range(0, len(times) - 1, _TIME_CHUNK):
            yield lo + 1, np.diff(np.asarray(times[lo:lo + _TIME_CHUNK + 1]))

    def _timing(self, series: StagedSeries) -> None:
        """First/last time, the regular step (the most common difference) and the
        gap-free stretches of rows, in two bounded passes over the staged times."""
        self.times.flush()
        times = series.times()
        assert times is not None
        series.first_time, series.last_time = int(times[0]), int(times[-1])
        counts: Counter[int] = Counter()
        for _, diffs in self._time_chunks(times):
            steps, n = np.unique(diffs, return_counts=True)
            counts.update(dict(zip(steps.tolist(), n.tolist(), strict=True)))
        if not counts:
            series.segments = [(0, series.rows)]
            return
        series.time_step = max(counts.items(), key=lambda item: (item[1], -item[0]))[0]
        # calendar steps vary (months of 28-31 days, years of 365-366): a difference
        # is a gap when a sample is missing, i.e. over 1.5 steps
        gap = parse_gap(self.options.max_gap, self.unit) or series.time_step * 3 // 2
        breaks = [first + int(i) for first, diffs in self._time_chunks(times)
                  for i in np.flatnonzero(diffs > gap)]
        bounds = [0, *breaks, series.rows]
        series.segments = list(itertools.pairwise(bounds))

    def close(self) -> list[StagedSeries]:
        self._finish()
        self.values.close()
        self.times.close()
        if self.digest is not None:
            for series in self.series:
                series.source_id = f"{self.name}:{self.digest.hexdigest()}"
        return self.series


def _batches(source: Any, name: str, needed: list[str] | None,
             parts: list[tuple[int, str]]) -> Iterator[pa.RecordBatch]:
    """The table's record batches, streamed (several files: file after file,
    each one's first row recorded in ``parts``)."""
    if isinstance(source, TableFiles):
        parts.clear()
        yield from dataset_batches(source, needed, parts)
        return
    if not isinstance(source, (str, os.PathLike)):
        table = pa.Table.from_pandas(source, preserve_index=False)
        yield from table.to_batches(_BATCH_ROWS)
        return
    path = os.fspath(source)
    location = resolve(path)
    if not is_url(path):
        check_regular(path)  # a FIFO or a device is never opened
    with remote_errors(path, SourceError):
        if not location.exists():
            raise SourceNotFoundError(f"{path}: no such file")
    try:
        if _suffix(path) == ".csv":
            from pyarrow import csv

            with remote_errors(path, SourceError), location.open("rb") as fh:
                yield from csv.open_csv(fh, read_options=csv.ReadOptions(
                    block_size=_CSV_BLOCK_BYTES))
        else:
            yield from open_parquet(location).iter_batches(batch_size=_BATCH_ROWS,
                                                           columns=needed)
    except (pa.ArrowInvalid, OSError) as exc:
        message = str(exc).splitlines()[0]
        hint = _UTF8_HINT if "UTF8" in message or "UTF-8" in message else ""
        raise SourceError(f"{path}: cannot read the table ({message}){hint}") from None


_UTF8_HINT = ("; windowkit reads UTF-8 text only: re-encode the file, e.g. "
              "iconv -f latin1 -t utf-8")


def _identify(source: Any) -> tuple[str, str]:
    """How messages name the table, and what identifies its content for resuming
    (a file's path, size and time; a DataFrame's is a digest of its rows, see
    :meth:`_Stager.close`)."""
    if isinstance(source, TableFiles):
        return source.name, fingerprint(source)
    if not isinstance(source, (str, os.PathLike)):
        return "DataFrame", ""
    path = os.fspath(source)
    if is_url(path):
        url = as_url_path(resolve(path))
        try:
            info = url.fs.info(url.path)
        except (OSError, ValueError):
            return path, path
        return path, f"{path}:{info.get('size')}:{info.get('ETag') or info.get('mtime')}"
    try:
        stat = os.stat(path)
    except OSError:
        return path, path
    return path, f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}"


def estimate_staged_bytes(source: Any, options: TableOptions) -> int:
    """About what staging ``source`` and then converting it writes, at most: the
    staged values and times (8 bytes each) and the store's rows (a little more
    than the values). Parquet files and DataFrames know their rows; a CSV file's
    are extrapolated from its first block."""
    source = table_files(source) or source
    if isinstance(source, TableFiles):
        try:
            rows, columns = dataset_rows(source)
        except (OSError, ValueError, StopIteration, WindowkitError):
            return 0  # staging says why
    elif not isinstance(source, (str, os.PathLike)):
        rows, columns = len(source), len(source.columns)
    else:
        path = os.fspath(source)
        location = resolve(path)
        try:
            if not is_url(path):
                check_regular(path)
            if _suffix(path) == ".csv":
                from pyarrow import csv

                size = int(location.stat().st_size)
                with location.open("rb") as fh:
                    reader = csv.open_csv(fh, read_options=csv.ReadOptions(
                        block_size=_CSV_BLOCK_BYTES))
                    first = reader.read_next_batch()
                columns = first.num_columns
                sample = min(size, _CSV_BLOCK_BYTES)
                rows = int(size / max(1, sample) * max(1, first.num_rows)) + 1
            else:
                meta = open_parquet(location).metadata
                rows, columns = meta.num_rows, meta.num_columns
        except (OSError, ValueError, StopIteration, WindowkitError):
            return 0  # unreadable or empty (ArrowInvalid, UnicodeDecodeError): staging says why
    values = rows * len(options.columns) if options.columns else rows * columns
    return int(values * 8 * 2.3) + rows * 8 + (16 << 20)


def _stage(batches: Iterable[pa.RecordBatch], stager: _Stager, name: str) -> list[StagedSeries]:
    first = True
    try:
        for batch in batches:
            if first:
                stager.schema(batch.schema)
                first = False
            stager.batch(batch)
    except BaseException as exc:
        stager.values.close()
        stager.times.close()
        translated = _staging_error(exc, name, stager)
        if translated is None:
            raise
        raise translated from None
    series = stager.close()
    if first:
        raise SourceError(f"{name}: the table has no rows")
    return series


def _staging_error(exc: BaseException, name: str, stager: _Stager) -> WindowkitError | None:
    """One line for what staging a table raised: a header or values that are not
    UTF-8, a full disk; None for anything else."""
    if isinstance(exc, UnicodeDecodeError):  # column names (the header) not UTF-8
        return SourceError(f"{name}: the header is not UTF-8 text (byte "
                           f"{exc.object[exc.start]:#04x} in {exc.object[:exc.end + 8]!r})"
                           f"{_UTF8_HINT}")
    if isinstance(exc, pa.ArrowInvalid):  # a value pyarrow cannot convert
        message = str(exc).splitlines()[0]
        return SourceError(f"{name}: cannot read the table near row {stager.row} ({message})"
                           f"{_UTF8_HINT if 'UTF8' in message else ''}")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return DiskSpaceError(f"{exc.filename or stager.values_path.parent}: {exc.strerror} "
                              f"while staging the rows of {name}; make room and run the same "
                              "command again")
    return None


def stage_table(source: Any, options: TableOptions, staging: Path, *,
                allow_missing: bool = False,
                sort_memory: int = DEFAULT_SORT_MEMORY) -> list[StagedSeries]:
    """Stream a table into ``staging`` and return its series. Empty values are an
    error, or with ``allow_missing`` (``nan="skip"``) NaN in float columns.

    A table whose series' rows are not together is read into memory, if it fits
    ``sort_memory`` bytes, and its rows grouped by series (series in order of
    first appearance, each series' rows in table order); else it is refused.
    """
    source = table_files(source) or source
    name, source_id = _identify(source)
    needed = None
    if options.columns:
        needed = [c for c in (options.series_col, options.time_col, *options.columns,
                              *(options.static_columns or ())) if c]
    parts: list[tuple[int, str]] = []

    def stager(origin: np.ndarray | None = None) -> _Stager:
        staged = _Stager(name, options, staging, source_id, allow_missing, origin, parts)
        if isinstance(source, TableFiles):
            staged.wide_key = source.key
        return staged

    try:
        return _stage(_batches(source, name, needed, parts), stager(), name)
    except NotInOrderError as refusal:
        if sort_memory <= 0:
            raise
        table = read_within(_batches(source, name, needed, parts), needed, sort_memory,
                            refusal)
    assert options.series_col is not None  # only grouping is ever out of order
    log.info("%s: rows of each series are not together; grouping them in memory (%.0f MiB)",
             name, table.nbytes / 2**20)
    grouped, origin = group_by_series(table, options.series_col, _BATCH_ROWS)
    return _stage(grouped, stager(origin), name)
