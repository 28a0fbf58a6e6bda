"""The time column of a table while it is staged, batch by batch.

Each batch's times are read as int64 (:mod:`._times` converts them, ISO text
:mod:`._iso_times`), and checked on the way: no time may be empty, and within
a series times must strictly increase, across batch boundaries too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from windowkit.errors import SourceError
from windowkit.sources._iso_times import iso_times
from windowkit.sources._row_locator import RowLocator, first_null
from windowkit.sources._times import TimeKind, float_times, parse_text_times, times_int64


class SeriesTimes:
    """Reads the time column of each batch and checks that times strictly
    increase within each series."""

    def __init__(self, name: str, column: str, kind: TimeKind, time_format: str | None,
                 rows: RowLocator) -> None:
        self.name = name
        self.column = column
        self.kind = kind
        self.time_format = time_format
        self.rows = rows
        self.last_time: int | None = None  # the current series' latest time

    def read(self, batch: pa.RecordBatch) -> np.ndarray:
        """The rows' times as int64."""
        column = batch.column(self.column)
        if column.null_count:
            where, row = self.rows.in_batch(first_null(column))
            raise SourceError(f"{where}: row {row}, time column {self.column!r} "
                              "is empty")
        if self.kind.floats:
            return float_times(column, self.rows.text, self.column)
        if self.kind.text and self.time_format is None:  # ISO text, of any source
            times, unit, zone = iso_times(column, self.kind.unit,
                                          f"{self.name}: time column {self.column!r}",
                                          self.rows.text)
            if not self.kind.unit:  # the first batch says: dates or timestamps
                self.kind = TimeKind(unit, zone, text=True)
            return times
        if self.kind.text:
            assert self.time_format is not None
            column = parse_text_times(column, self.time_format, self.rows.text)
        return times_int64(column, self.kind.unit)

    def start_series(self) -> None:
        """A new series starts: its times need not follow the last series'."""
        self.last_time = None

    def check_increasing(self, times: np.ndarray, position: int, key: str | None) -> None:
        """Check that ``times``, staged from ``position`` on in series ``key``,
        strictly increase, from the series' previous time on."""
        previous = np.concatenate([[self.last_time], times[:-1]]) if self.last_time is not None \
            else times[:-1]
        current = times if self.last_time is not None else times[1:]
        bad = np.flatnonzero(current <= previous)
        if len(bad):
            where, at = self.rows.at(position + int(bad[0]) + (0 if self.last_time is not None
                                                                else 1))
            what = "repeats" if current[bad[0]] == previous[bad[0]] else "goes back from"
            raise SourceError(
                f"{where}: series {key!r}, row {at}: time {what} the previous "
                f"row's; times must strictly increase within a series")
        if len(times):
            self.last_time = int(times[-1])
