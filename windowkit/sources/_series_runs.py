"""Series boundaries in a table: which rows belong to which series.

A long table names each row's series in its series column; staging needs the
runs of consecutive rows of one series, and each series' rows together. A
series that turns up again after another one started is refused with
:class:`NotInOrderError`, which staging answers by grouping the table in
memory when it fits (:mod:`._interleaved`). A wide table, without a series
column, is one series.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from windowkit.errors import SourceError
from windowkit.sources._row_locator import RowLocator, first_null
from windowkit.sources._table_schema import TableOptions


class NotInOrderError(SourceError):
    """The rows of a series are not together in the table."""


class SeriesRuns:
    """Cuts record batches into runs of one series each, and refuses a series
    whose rows are not together."""

    def __init__(self, name: str, options: TableOptions, wide_key: str,
                 rows: RowLocator) -> None:
        self.name = name
        self.series_col = options.series_col
        self.time_col = options.time_col
        self.wide_key = wide_key  # the key of the one series without a series column
        self.rows = rows
        self.seen: set[str] = set()

    def runs(self, batch: pa.RecordBatch) -> list[tuple[str, int, int]]:
        """The batch's runs of one series: ``(key, first row, end row)`` each."""
        keys, cuts = self._keys(batch)
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [batch.num_rows]])
        return [(str(keys[lo]) if keys is not None else self.wide_key, int(lo), int(hi))
                for lo, hi in zip(starts, ends, strict=True)]

    def _keys(self, batch: pa.RecordBatch) -> tuple[np.ndarray | None, np.ndarray]:
        """Each row's series key (None without a series column), and the rows
        where the key changes."""
        if self.series_col is None:
            return None, np.empty(0, dtype=np.int64)
        keys = batch.column(self.series_col).cast(pa.string())
        if keys.null_count:
            where, row = self.rows.in_batch(first_null(keys))
            raise SourceError(f"{where}: row {row}, series column "
                              f"{self.series_col!r} is empty")
        blank = pc.equal(pc.utf8_trim_whitespace(keys), "").to_numpy(zero_copy_only=False)
        if blank.any():
            where, at = self.rows.in_batch(int(np.flatnonzero(blank)[0]))
            raise SourceError(f"{where}: row {at}, series column "
                              f"{self.series_col!r} is empty; every row needs a "
                              "series id")
        values = np.asarray(keys.to_numpy(zero_copy_only=False), dtype=object)
        return values, np.flatnonzero(values[1:] != values[:-1]) + 1

    def claim(self, key: str, position: int) -> None:
        """Series ``key`` starts at staged ``position``: refused if it was seen before."""
        if key in self.seen:
            where, at = self.rows.at(position)
            raise NotInOrderError(
                f"{self.name}: rows of series {key!r} are not grouped together (it appears "
                f"again at {'' if where == self.name else where + ', '}row {at}); "
                f"{self._sort_hint()}")
        self.seen.add(key)

    def _sort_hint(self) -> str:
        keys = [repr(c) for c in (self.series_col, self.time_col) if c]
        return f"sort the table by {' and '.join(keys)} first"
