"""Window index tables and their compact in-memory form.

On disk a split's windows are a Parquet table ``(series:int32, start:int64,
length:int32)`` with one row per window. In memory a reader never
holds one entry per window: consecutive windows of a series whose starts step by
the spec's stride form a *run* ``(series, first, count)``, so memory grows with
the number of series and gaps, not with the number of windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from windowkit._schema import check_columns
from windowkit.errors import InvalidSpecError, StoreError
from windowkit.location import open_parquet
from windowkit.spec import WindowSpec

INDEX_SCHEMA = pa.schema(
    [("series", pa.int32()), ("start", pa.int64()), ("length", pa.int32())]
)
_INDEX_ROW_GROUP = 1 << 20
_RUNS_BATCH = 1 << 16  # small batches keep the temporaries of building runs small


def window_starts(rows: int, spec: WindowSpec, *, first: int = 0,
                  limit: int | None = None) -> np.ndarray:
    """Series-local start rows of the windows of a series of ``rows`` rows,
    from the ``first``-th window on, at most ``limit`` of them."""
    stop = max(0, rows - (spec.steps - 1) * spec.sampling_rate)
    begin = first * spec.stride
    end = stop if limit is None else min(stop, begin + limit * spec.stride)
    return np.arange(begin, max(begin, end), spec.stride, dtype=np.int64)


def grid_start(row: int, stride: int) -> int:
    """The first row at or after ``row`` on a series' stride grid (``k * stride``)."""
    return -(-row // stride) * stride


def grid_windows(lo: int, hi: int, spec: WindowSpec) -> int:
    """How many windows on the series' stride grid lie wholly in its rows ``[lo, hi)``."""
    aligned = grid_start(lo, spec.stride)
    return spec.num_windows(hi - aligned) if hi > aligned else 0


def stretches_without(stretches: list[tuple[int, int]], holes: np.ndarray
                      ) -> list[tuple[int, int]]:
    """The parts of row ranges ``stretches`` outside ``holes`` (``[k, 2]`` row
    ranges sorted by start): where windows may lie when the holes' rows are
    missing values."""
    if len(holes) == 0:
        return stretches
    out = []
    for a, b in stretches:
        first = int(np.searchsorted(holes[:, 1], a, side="right"))
        last = int(np.searchsorted(holes[:, 0], b, side="left"))
        position = a
        for start, stop in holes[first:last].tolist():
            if start > position:
                out.append((position, start))
            position = max(position, stop)
        if b > position:
            out.append((position, b))
    return out


class IndexWriter:
    """Streams one split's window index table to Parquet in bounded memory."""

    def __init__(self, path: Path, spec: WindowSpec) -> None:
        self._path = path
        self._spec = spec
        self._pending: list[tuple[int, np.ndarray]] = []
        self._pending_rows = 0
        self._writer = pq.ParquetWriter(
            path, INDEX_SCHEMA, compression="zstd", use_dictionary=["series"],
            column_encoding={"start": "DELTA_BINARY_PACKED", "length": "DELTA_BINARY_PACKED"},
            write_statistics=True, write_page_checksum=True,
        )
        self.windows = 0

    def add_series(self, series_id: int, rows: int, *, first_row: int = 0) -> int:
        """Append every window on the series' stride grid (starts ``k * stride``)
        that lies in its ``rows`` rows from row ``first_row`` (a whole series, or
        a stretch of one), in bounded slices; return how many windows they hold."""
        aligned = grid_start(first_row, self._spec.stride)
        rows -= aligned - first_row
        count = self._spec.num_windows(rows) if rows > 0 else 0
        for first in range(0, count, _INDEX_ROW_GROUP):
            self.add(series_id, aligned + window_starts(rows, self._spec, first=first,
                                                        limit=_INDEX_ROW_GROUP))
        return count

    def add(self, series_id: int, starts: np.ndarray) -> None:
        """Append the windows of one series (starts ascending)."""
        if len(starts) == 0:
            return
        self._pending.append((series_id, starts))
        self._pending_rows += len(starts)
        self.windows += len(starts)
        if self._pending_rows >= _INDEX_ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        series = np.concatenate(
            [np.full(len(s), sid, dtype=np.int32) for sid, s in self._pending]
        )
        starts = np.concatenate([s for _, s in self._pending])
        lengths = np.full(len(starts), self._spec.length, dtype=np.int32)
        table = pa.Table.from_arrays(
            [pa.array(series), pa.array(starts), pa.array(lengths)], schema=INDEX_SCHEMA
        )
        self._writer.write_table(table, row_group_size=_INDEX_ROW_GROUP)
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        self._flush()
        self._writer.close()


def iter_index(path: Path, batch_rows: int = _INDEX_ROW_GROUP,
               columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream an index table in record batches (never the whole table), after
    checking it is one: columns ``series:int32, start:int64, length:int32``."""
    try:
        table = open_parquet(path, page_checksum_verification=True)
        check_columns(path, table.schema_arrow, dict(zip(INDEX_SCHEMA.names, INDEX_SCHEMA.types,
                                                         strict=True)),
                      "window index table", exact=True)
        yield from table.iter_batches(batch_size=batch_rows, columns=columns)
    except (OSError, ValueError, KeyError) as exc:  # ArrowInvalid is a ValueError
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"{path}: cannot read window index table ({exc})") from exc


@dataclass(frozen=True)
class IndexLimits:
    """What every entry of one split's index table must satisfy: a window of
    ``span`` rows of a series the store has, inside the rows ``[first, end)`` of
    its series that the split's windows may lie in, of the spec's ``length``,
    its start on the series' stride grid (a multiple of ``stride``)."""

    series_rows: np.ndarray  # int64 [series]
    first: np.ndarray | None = None  # int64 [series] (None: 0)
    end: np.ndarray | None = None  # int64 [series] (None: the series' rows)
    span: int = 1
    length: int | None = None  # the ``length`` column's value (None: unchecked)
    stride: int = 1

    def check(self, path: Path, row: int, series: np.ndarray, start: np.ndarray,
              length: np.ndarray | None) -> None:
        """Raise one :class:`StoreError` naming the table and the first bad row
        (``row`` is the table row of ``series[0]``); vectorized."""
        bad = (series < 0) | (series >= len(self.series_rows))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise StoreError(f"{path}: row {row + i}: series {int(series[i])} is not one of "
                             f"the store's {len(self.series_rows)} series")
        rows = self.series_rows[series]
        first = np.zeros_like(start) if self.first is None else self.first[series]
        end = rows if self.end is None else np.minimum(self.end[series], rows)
        checks = [
            ((start < 0) | (start + self.span > rows), "lies outside its series "
             "({rows} rows)"),
            ((start < first) | (start + self.span > end), "reaches outside the rows "
             "{first}..{end} of its series that the split's windows lie in"),
        ]
        if self.stride > 1:
            checks.append((start % self.stride != 0,
                           f"is not on its series' grid of stride {self.stride}"))
        if length is not None and self.length is not None:
            checks.append((length != self.length, "has length {length}, the store's "
                           f"windows have {self.length}"))
        for mask, why in checks:
            if mask.any():
                i = int(np.flatnonzero(mask)[0])
                what = why.format(rows=int(rows[i]), first=int(first[i]), end=int(end[i]),
                                  length=None if length is None else int(length[i]))
                raise StoreError(f"{path}: row {row + i}: the window of series "
                                 f"{int(series[i])} starting at row {int(start[i])} "
                                 f"({self.span} rows) {what}")


@dataclass(frozen=True)
class WindowRuns:
    """A split's windows as runs of equally spaced starts, in index order.

    Run ``i`` holds ``count[i]`` windows of series ``series[i]`` starting at
    series-local rows ``first[i] + k * stride``. ``row_offset[s]`` is the global
    row of series ``s``'s first row in the store's data.
    """

    series: np.ndarray  # int32 [runs]
    first: np.ndarray  # int64 [runs]
    count: np.ndarray  # int64 [runs]
    stride: int
    row_offset: np.ndarray  # int64 [num_series]

    @cached_property
    def cumulative(self) -> np.ndarray:
        """Position in the index of each run's first window, plus the total."""
        return np.concatenate([[0], np.cumsum(self.count)])

    @cached_property
    def total(self) -> int:
        return int(self.count.sum())

    @cached_property
    def global_first(self) -> np.ndarray:
        return self.row_offset[self.series] + self.first

    @cached_property
    def global_last(self) -> np.ndarray:
        return self.global_first + (self.count - 1) * self.stride

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(series, series-local start)`` of windows at index ``positions``."""
        positions = np.asarray(positions, dtype=np.int64)
        total = self.total
        if positions.size and (positions.min() < 0 or positions.max() >= total):
            bad = positions[(positions < 0) | (positions >= total)][0]
            raise IndexError(f"window position {bad} is out of range for {total} windows")
        cumulative = self.cumulative
        run = np.searchsorted(cumulative, positions, side="right") - 1
        start = self.first[run] + (positions - cumulative[run]) * self.stride
        return self.series[run], start

    def global_starts(self, positions: np.ndarray) -> np.ndarray:
        """Global data rows where the windows at index ``positions`` start."""
        return self.global_starts_and_series(positions)[0]

    def global_starts_and_series(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`global_starts`, and each window's series (int32)."""
        series, start = self.locate(positions)
        return self.row_offset[series] + start, series.astype(np.int32)

    def _runs_in_ranges(self, low: np.ndarray, high: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For row ranges ``[low[i], high[i])`` (ascending, disjoint): the pieces
        of runs inside them, as ``(range, run, k_lo, k_hi)`` (windows
        ``k_lo..k_hi-1`` of run ``run`` start in range ``range``), empty ones
        left out."""
        lo = np.searchsorted(self.global_last, low, side="left")
        hi = np.searchsorted(self.global_first, high, side="left")
        per_range = np.maximum(hi - lo, 0)
        total = int(per_range.sum())
        which = np.repeat(np.arange(len(low)), per_range)
        run = np.repeat(lo, per_range) + (
            np.arange(total) - np.repeat(np.cumsum(per_range) - per_range, per_range))
        first, count = self.global_first[run], self.count[run]
        k_lo = np.clip(-((first - low[which]) // self.stride), 0, count)
        k_hi = np.clip(-((first - high[which]) // self.stride), 0, count)
        keep = k_hi > k_lo
        return which[keep], run[keep], k_lo[keep], k_hi[keep]

    def select_rows(self, low: np.ndarray, high: np.ndarray) -> WindowRuns:
        """The windows whose global start lies in one of the row ranges
        ``[low[i], high[i])`` (ascending, disjoint), as runs in index order."""
        _, run, k_lo, k_hi = self._runs_in_ranges(np.asarray(low, dtype=np.int64),
                                                  np.asarray(high, dtype=np.int64))
        return WindowRuns(series=self.series[run],
                          first=(self.first[run] + k_lo * self.stride).astype(np.int64),
                          count=(k_hi - k_lo).astype(np.int64), stride=self.stride,
                          row_offset=self.row_offset)

    def select_positions(self, lo: int, hi: int) -> WindowRuns:
        """The windows at index positions ``[lo, hi)``, as runs in index order."""
        if not 0 <= lo <= hi <= self.total:
            raise IndexError(f"positions [{lo}, {hi}) out of range for {self.total} windows")
        cumulative = self.cumulative
        first_run = int(np.searchsorted(cumulative, lo, side="right")) - 1
        last_run = int(np.searchsorted(cumulative, hi, side="left"))  # exclusive
        if lo == hi:
            first_run, last_run = 0, 0
        run = np.arange(first_run, last_run, dtype=np.int64)
        k_lo = np.maximum(lo - cumulative[run], 0)
        k_hi = np.minimum(hi - cumulative[run], self.count[run])
        return WindowRuns(series=self.series[run],
                          first=(self.first[run] + k_lo * self.stride).astype(np.int64),
                          count=(k_hi - k_lo).astype(np.int64), stride=self.stride,
                          row_offset=self.row_offset)

    def runs_per_block(self, block_first: np.ndarray, block_rows: np.ndarray) -> BlockRuns:
        """The windows whose start lies in each block of rows, as runs.

        Block ``i`` covers global rows ``[block_first[i], block_first[i] +
        block_rows[i])``. Vectorized; the result grows with runs and blocks,
        not windows.
        """
        low = np.asarray(block_first, dtype=np.int64)
        high = low + np.asarray(block_rows, dtype=np.int64)
        block, run, k_lo, k_hi = self._runs_in_ranges(low, high)
        local_first = self.global_first[run] + k_lo * self.stride - low[block]
        row_splits = np.concatenate([[0], np.cumsum(np.bincount(block, minlength=len(low)))])
        return BlockRuns(row_splits.astype(np.int64), local_first.astype(np.int64),
                         (k_hi - k_lo).astype(np.int64), self.series[run].astype(np.int32))


@dataclass(frozen=True)
class BlockRuns:
    """Each block's windows as runs: block ``i`` holds runs
    ``row_splits[i]:row_splits[i+1]``, run ``r`` ``count[r]`` windows of series
    ``series[r]`` starting at block-local rows ``first[r] + k * stride``."""

    row_splits: np.ndarray  # int64 [blocks + 1]
    first: np.ndarray  # int64 [runs]
    count: np.ndarray  # int64 [runs]
    series: np.ndarray  # int32 [runs]

    def windows(self) -> np.ndarray:
        """How many windows start in each block."""
        blocks = len(self.row_splits) - 1
        return np.bincount(np.repeat(np.arange(blocks), np.diff(self.row_splits)),
                           weights=self.count, minlength=blocks).astype(np.int64)


def _check_order(path: Path, row: int, series: np.ndarray, start: np.ndarray,
                 prev_series: int, prev_start: int) -> None:
    """Raise unless the entries follow ``(prev_series, prev_start)`` in strictly
    ascending ``(series, start)`` order (no window twice)."""
    step_series = np.diff(series, prepend=np.int32(prev_series))
    step_start = np.diff(start, prepend=np.int64(prev_start))
    bad = ~((step_series > 0) | ((step_series == 0) & (step_start > 0)))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        why = "repeats the window before it" if step_series[i] == 0 and step_start[i] == 0 \
            else "comes before the entry above it"
        raise StoreError(f"{path}: row {row + i}: (series {int(series[i])}, start "
                         f"{int(start[i])}) {why}: the table is not sorted "
                         "by (series, start) with each window once")


def read_window_runs(path: Path, *, stride: int, row_offset: np.ndarray,
                     series_rows: np.ndarray | None = None, span: int = 1,
                     limits: IndexLimits | None = None) -> WindowRuns:
    """The runs of an index table, streamed, every entry checked against
    ``limits`` (default: a window of ``span`` rows inside its series) and the
    table sorted by ``(series, start)`` without repeats (a store is untrusted)."""
    if limits is None:
        assert series_rows is not None
        limits = IndexLimits(np.asarray(series_rows, dtype=np.int64), span=span)
    runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    prev_series, prev_start, row = -1, -1, 0
    for batch in iter_index(path, _RUNS_BATCH):
        if batch.num_rows == 0:
            continue
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if column.null_count:
                i = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                raise StoreError(f"{path}: row {row + i}: no value in column {name!r}")
        series = batch.column(0).to_numpy().astype(np.int32, copy=False)
        start = batch.column(1).to_numpy().astype(np.int64, copy=False)
        limits.check(path, row, series, start, batch.column(2).to_numpy())
        _check_order(path, row, series, start, prev_series, prev_start)
        # a run may split at a batch boundary: still correct, still compact
        new_run = np.ones(len(series), dtype=bool)
        new_run[1:] = (series[1:] != series[:-1]) | (np.diff(start) != stride)
        heads = np.flatnonzero(new_run)
        ends = np.append(heads[1:], len(series))
        runs.append((series[heads], start[heads], (ends - heads).astype(np.int64)))
        prev_series, prev_start = int(series[-1]), int(start[-1])
        row += len(series)
    if not runs:
        empty = np.empty(0, dtype=np.int64)
        return WindowRuns(empty.astype(np.int32), empty, empty, stride, row_offset)
    series, first, count = (np.concatenate(part) for part in zip(*runs, strict=True))
    return WindowRuns(series, first, count, stride, row_offset)


def index_positions(positions: object, total: int) -> np.ndarray:
    """``positions`` of an index of ``total`` windows as int64 positions, as
    NumPy indexes an array of that length: an integer or an array of integers
    (any integer dtype; negative ones count from the end), a slice, or a
    boolean mask of ``total`` entries. Anything else, a float or a 2-D array
    say, is one line (``1.9`` is no window 1)."""
    if isinstance(positions, slice):
        return np.arange(total, dtype=np.int64)[positions]
    values = np.asarray(positions)
    if values.dtype == bool:
        if values.shape != (total,):
            raise IndexError(f"a boolean mask of window positions has shape {values.shape}, "
                             f"the index has {total} windows")
        return np.flatnonzero(values).astype(np.int64)
    if values.size == 0 and values.dtype.kind in "fO":  # [] reads as float64: no window
        return np.zeros(0, dtype=np.int64)
    if values.ndim > 1:  # NumPy would stack them; a batch of windows is one list
        raise InvalidSpecError(f"window positions are one list (or a slice, or a boolean "
                               f"mask), got an array of shape {values.shape}: flatten it "
                               "and reshape the windows")
    if values.dtype.kind not in "iu":
        raise InvalidSpecError(f"window positions are integers (or a slice, or a boolean "
                               f"mask), got {values.dtype} values such as "
                               f"{values.ravel()[0]!r}")
    flat = values.astype(np.int64).ravel()
    if flat.size and (flat.min() < -total or flat.max() >= total):
        bad = flat[(flat < -total) | (flat >= total)][0]
        raise IndexError(f"window position {bad} is out of range for {total} windows")
    return np.where(flat < 0, flat + total, flat)
