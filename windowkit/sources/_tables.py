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

import errno
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from windowkit.errors import DiskSpaceError, SourceError, SourceNotFoundError, WindowkitError
from windowkit.location import as_url_path, is_url, open_parquet, remote_errors, resolve
from windowkit.sources._datasets import (
    CSV_BLOCK_BYTES,
    TABLE_SUFFIXES,
    TableFiles,
    csv_bytes,
    csv_sample,
    csv_shape,
    csv_text,
    dataset_batches,
    fingerprint,
    first_line,
    headless_names,
    table_files,
    table_stem,
    table_suffix,
)
from windowkit.sources._datasets import table_rows as dataset_rows
from windowkit.sources._frames import frame_table
from windowkit.sources._interleaved import read_within, rows_by_series
from windowkit.sources._pins import check_regular
from windowkit.sources._row_locator import RowLocator
from windowkit.sources._series_runs import NotInOrderError, SeriesRuns
from windowkit.sources._staging import StagedSeries, StagingFiles
from windowkit.sources._static_columns import StaticValues
from windowkit.sources._table_schema import TableColumns, TableOptions, read_schema
from windowkit.sources._table_values import FeatureValues
from windowkit.sources._time_checks import SeriesTimes
from windowkit.sources._times import parse_gap, step_and_segments

_BATCH_ROWS = 1 << 16
DEFAULT_SORT_MEMORY = 1 << 30  # largest table (in memory) grouped by series there
log = logging.getLogger("windowkit")


def is_table(source: Any) -> bool:
    """Whether ``source`` is a table: a CSV or Parquet file, several of them (a
    list, a glob, a directory of parts: :mod:`._datasets`), or a DataFrame."""
    if type(source).__name__ == "DataFrame" and hasattr(source, "columns"):
        return True
    if table_files(source) is not None:
        return True
    return isinstance(source, (str, os.PathLike)) and (
        table_suffix(os.fspath(source)) in TABLE_SUFFIXES)


class _Stager:
    """Streams record batches of one table into the staging files: checks the
    schema (:mod:`._table_schema`), then cuts each batch into runs of one
    series (:mod:`._series_runs`) and stages their values (:mod:`._table_values`),
    times (:mod:`._time_checks`) and static values (:mod:`._static_columns`)
    to the files of :mod:`._staging`."""

    def __init__(self, name: str, options: TableOptions, staging: Path, source_id: str,
                 allow_missing: bool = False, origin: np.ndarray | None = None,
                 parts: list[tuple[int, str]] | None = None,
                 wide_key: str | None = None) -> None:
        self.name, self.options, self.source_id = name, options, source_id
        self.allow_missing = allow_missing  # empty values become NaN (nan="skip")
        # several files: first rows, paths; origin: table row of each staged row, if sorted
        self.rows = RowLocator(name, parts if parts is not None else [], origin)
        # a DataFrame has no file to identify it: a digest of what is staged does
        self.files = StagingFiles(staging, digest=not source_id)
        self.runs = SeriesRuns(name, options, wide_key if wide_key is not None
                               else table_stem(name), self.rows)
        self.static = StaticValues(list(options.static_columns or ()), self.rows)
        self.columns: TableColumns | None = None  # known from the first batch's schema
        self.values: FeatureValues | None = None
        self.times: SeriesTimes | None = None
        self.series: list[StagedSeries] = []
        self.staged = 0  # rows written
        self.current: str | None = None
        self.current_first = 0
        self.current_rows = 0

    def schema(self, schema: pa.Schema) -> None:
        self.columns = read_schema(self.name, self.options, schema)
        self.values = FeatureValues(self.columns, self.options, self.allow_missing, self.rows)
        if self.options.time_col is not None:
            self.times = SeriesTimes(self.name, self.options.time_col, self.columns.time,
                                     self.options.time_format, self.rows)
            if self.columns.time.unit or not self.columns.time.text:  # ISO text: later
                parse_gap(self.options.max_gap, self.columns.time.unit)  # before any row

    def batch(self, batch: pa.RecordBatch) -> None:
        """Stage one record batch: its values, cut into runs of one series each."""
        if batch.num_rows == 0:
            return
        assert self.values is not None
        values = self.values.read(batch)
        runs = self.runs.runs(batch)
        times = self.times.read(batch) if self.times is not None else None
        for key, lo, hi in runs:
            if key != self.current:
                self._start(key, self.rows.batch_start + lo)
            if self.static.names:
                self.static.check(batch, lo, hi, key)
            run_times = None
            if times is not None:
                assert self.times is not None
                self.times.check_increasing(times[lo:hi], self.rows.batch_start + lo, key)
                run_times = times[lo:hi].astype("<i8").tobytes()
            self.files.write(values[lo:hi].tobytes(), run_times)
            self.current_rows += hi - lo
        self.rows.batch_start += batch.num_rows

    def _start(self, key: str, row: int) -> None:
        self.runs.claim(key, row)
        self._finish()
        self.files.start_series(key)
        self.current, self.current_first, self.current_rows = key, self.staged, 0
        if self.times is not None:
            self.times.start_series()
        self.static.start_series()

    def _finish(self) -> None:
        if self.current is None:
            return
        assert self.columns is not None
        # ISO text times: their unit is known once the first batch is read
        time = self.times.kind if self.times is not None else self.columns.time
        series = StagedSeries(
            key=self.current, where=f"{self.name}: series {self.current!r}",
            path=str(self.files.values_path), first_row=self.current_first,
            rows=self.current_rows, dtype=self.columns.dtype,
            step_shape=(len(self.columns.features),), source_id=self.source_id,
            features=self.columns.features, time_unit=time.unit, time_zone=time.zone,
            times_path=str(self.files.times_path) if self.options.time_col else "",
            static=self.static.values())
        if self.options.time_col is not None:
            self._timing(series)
        self.series.append(series)
        self.staged += self.current_rows

    def _timing(self, series: StagedSeries) -> None:
        """First/last time, the regular step and the gap-free stretches of rows."""
        self.files.flush_times()
        times = series.times()
        assert times is not None
        series.first_time, series.last_time = int(times[0]), int(times[-1])
        series.time_step, series.segments = step_and_segments(times, self.options.max_gap,
                                                              series.time_unit)

    def close(self) -> list[StagedSeries]:
        self._finish()
        self.files.close()
        content_id = self.files.content_id(self.name)
        if content_id is not None:
            for series in self.series:
                series.source_id = content_id
        return self.series


def _batches(source: Any, name: str, needed: list[str] | None,
             parts: list[tuple[int, str]], header: bool = True,
             text: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch]:
    """The table's record batches, streamed (several files: file after file,
    each one's first row recorded in ``parts``; CSV without ``header``: columns
    ``"0"``, ``"1"``, ...; CSV columns ``text`` as text)."""
    if isinstance(source, TableFiles):
        parts.clear()
        yield from dataset_batches(source, needed, parts, header, text)
        return
    if isinstance(source, pa.Table):  # a DataFrame, index levels named included
        yield from source.to_batches(_BATCH_ROWS)
        return
    path = os.fspath(source)
    location = resolve(path)
    if not is_url(path):
        check_regular(path)  # a FIFO or a device is never opened
    with remote_errors(path, SourceError):
        if not location.exists():
            raise SourceNotFoundError(f"{path}: no such file")
    try:
        if table_suffix(path) == ".csv":
            from pyarrow import csv

            names = None
            remote = is_url(path)
            if not header:
                with _remote_guard(path, remote), location.open("rb") as fh:
                    names = headless_names(first_line(fh, path))
            with _remote_guard(path, remote), location.open("rb") as fh:
                yield from csv.open_csv(csv_bytes(fh, path), read_options=csv.ReadOptions(
                    block_size=CSV_BLOCK_BYTES, column_names=names),
                    convert_options=csv_text(text))
        else:
            yield from open_parquet(location).iter_batches(batch_size=_BATCH_ROWS,
                                                           columns=needed)
    except (pa.ArrowInvalid, OSError) as exc:
        message = str(exc).splitlines()[0]
        hint = _UTF8_HINT if "UTF8" in message or "UTF-8" in message else ""
        raise SourceError(f"{path}: cannot read the table ({message}){hint}") from None


def _remote_guard(path: str, remote: bool) -> AbstractContextManager[None]:
    """Object storage's errors as one line, for a URL; a local file's errors (a
    damaged ``.csv.gz``) are the table's, said by :func:`_batches`."""
    return remote_errors(path, SourceError) if remote else nullcontext()


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
            if table_suffix(path) == ".csv":
                with location.open("rb") as fh:
                    sample, size = csv_sample(fh, path, int(location.stat().st_size))
                rows, columns = csv_shape(sample, size)
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
        stager.files.close()
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
        return SourceError(f"{name}: cannot read the table near row "
                           f"{stager.rows.batch_start} ({message})"
                           f"{_UTF8_HINT if 'UTF8' in message else ''}")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return DiskSpaceError(f"{exc.filename or stager.files.values_path.parent}: "
                              f"{exc.strerror} while staging the rows of {name}; make room "
                              "and run the same command again")
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
    if not isinstance(source, (str, os.PathLike, TableFiles)):
        source = frame_table(source, name, options)  # a DataFrame: once, index included
    needed = None
    if options.columns:
        needed = [c for c in (options.series_col, options.time_col, *options.columns,
                              *(options.static_columns or ())) if c]
    parts: list[tuple[int, str]] = []
    # a time column given a --time-format is read as the text it is, then parsed by it
    text = (options.time_col,) if options.time_format and options.time_col else ()

    def stager(origin: np.ndarray | None = None) -> _Stager:
        wide_key = source.key if isinstance(source, TableFiles) else None
        return _Stager(name, options, staging, source_id, allow_missing, origin, parts,
                       wide_key)

    try:
        return _stage(_batches(source, name, needed, parts, options.header, text), stager(),
                      name)
    except NotInOrderError as refusal:
        if sort_memory <= 0:
            raise
        table = read_within(_batches(source, name, needed, parts, options.header, text), needed,
                            sort_memory, refusal)
    assert options.series_col is not None  # only grouping is ever out of order
    log.info("%s: rows of each series are not together; grouping them in memory (%.0f MiB)",
             name, table.nbytes / 2**20)
    grouped, origin = rows_by_series(table, options.series_col, _BATCH_ROWS)
    return _stage(grouped, stager(origin), name)
