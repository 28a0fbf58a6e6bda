"""Where a staged row came from, as the user counts it.

Messages about a table's rows name the file and the row in it (from 0), not
the position the row was staged at: a table of several files counts rows per
file, and a table grouped by series in memory has its rows reordered. Every
check made while staging points at rows through a :class:`RowLocator`.
"""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa


class RowLocator:
    """The file and row (from 0) of a staged position, and the first table row
    of the record batch being staged."""

    def __init__(self, name: str, parts: list[tuple[int, str]],
                 origin: np.ndarray | None) -> None:
        self.name = name  # how messages name the table
        self.parts = parts  # several files: each one's first row and path (filled as read)
        self.origin = origin  # table row of each staged row, when the table was sorted
        self.batch_start = 0  # table rows consumed before the current batch

    def source_row(self, position: int) -> int:
        """The table row (as the user counts, from 0) of staged ``position``."""
        return position if self.origin is None else int(self.origin[position])

    def at(self, position: int) -> tuple[str, int]:
        """The file and its row (from 0) of staged ``position``: for several
        files, the one holding it; else the table and its row."""
        row = self.source_row(position)
        if not self.parts:
            return self.name, row
        first, path = self.parts[bisect.bisect_right([p[0] for p in self.parts], row) - 1]
        return path, row - first

    def in_batch(self, at: int) -> tuple[str, int]:
        """The file and its row of the current batch's row ``at``."""
        return self.at(self.batch_start + at)

    def text(self, at: int) -> str:
        """``file: row N`` of the current batch's row ``at``."""
        where, row = self.in_batch(at)
        return f"{where}: row {row}"


def first_null(column: pa.Array) -> int:
    """The position of the column's first empty value."""
    return int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
