"""A store's ``series.parquet``: one row per series, read once and checked.

The table says where each series' rows are among the store's global rows,
how many windows it holds, where each split's windows lie in it, and its
static features. A store is untrusted input: every column is checked against
the manifest before a reader relies on it.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from windowkit._schema import check_columns
from windowkit.errors import StoreError
from windowkit.guard import StoreGuard
from windowkit.location import open_parquet
from windowkit.manifest import STATIC_PREFIX, Manifest
from windowkit.splits import window_range_columns

SERIES_TABLE = "series.parquet"


class SeriesTable:
    """The checked ``series.parquet`` of the store whose files are under ``root``."""

    def __init__(self, root: Path, manifest: Manifest, guard: StoreGuard) -> None:
        self.path = root / SERIES_TABLE
        self._manifest = manifest
        self._guard = guard

    @cached_property
    def table(self) -> Any:
        """The table as a pyarrow Table, checked: its columns and types, one row
        per series in order, rows and offsets adding up to the store's rows,
        each split's row ranges inside its series."""
        try:
            handle = open_parquet(self.path, page_checksum_verification=True)
            check_columns(self.path, handle.schema_arrow, self.columns(), "series table")
            table = handle.read()
        except (OSError, ValueError, KeyError) as exc:  # ArrowInvalid is a ValueError
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"{self.path}: cannot read ({exc})") from exc
        self._guard.check()
        self._check(table)
        return table

    def _check(self, table: Any) -> None:
        path, count = self.path, self._manifest.series.count
        if len(table) != count:
            raise StoreError(f"{path}: holds {len(table)} series, the manifest says {count}")
        missing = [name for name in self.columns() if table.column(name).null_count]
        if missing:
            raise StoreError(f"{path}: column {missing[0]!r} has missing values")
        column = {name: table.column(name).to_numpy(zero_copy_only=False)
                  for name in self.columns()}
        if not np.array_equal(column["series"], np.arange(count)):
            raise StoreError(f"{path}: column 'series' is not 0..{count - 1} in order")
        rows, offsets = column["rows"], column["row_offset"]
        total = self._manifest.total_rows
        if (rows.min() < 1 or not np.array_equal(offsets, np.cumsum(rows) - rows)
                or int(rows.sum()) != total):
            raise StoreError(f"{path}: series rows and offsets do not add up to the store's "
                             f"{total} rows")
        for split in self._manifest.splits:
            first, end = (column[name] for name in window_range_columns(split))
            bad = np.flatnonzero((first < 0) | (end < first) | (end > rows))
            if len(bad):
                raise StoreError(f"{path}: series {int(bad[0])}: split {split!r} covers rows "
                                 f"{int(first[bad[0]])}..{int(end[bad[0]])}, outside its "
                                 f"{int(rows[bad[0]])} rows")

    def columns(self) -> dict[str, Any]:
        """The columns the table must have, and their types (static features are
        checked with their values, :meth:`static_values`)."""
        import pyarrow as pa

        columns: dict[str, Any] = {"series": pa.int32(), "key": pa.string(),
                                   "rows": pa.int64(), "row_offset": pa.int64(),
                                   "windows": pa.int64()}
        for split in self._manifest.splits:
            columns.update(dict.fromkeys(window_range_columns(split), pa.int64()))
        return columns

    def int_column(self, name: str) -> np.ndarray:
        """A checked integer column (``rows``, ``row_offset``, ...) as int64."""
        return self.table.column(name).to_numpy().astype(np.int64)

    def split_rows(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Per series, the first row and the end of the rows the windows of
        ``split`` lie in."""
        first, end = window_range_columns(split)
        return self.int_column(first), self.int_column(end)

    def static_values(self) -> np.ndarray | None:
        """``[series, S]`` float64: each series' static features (None: none),
        each a finite number."""
        names = self._manifest.static_columns
        if not names:
            return None
        table = self.table
        missing = [n for n in names if STATIC_PREFIX + n not in table.column_names]
        if missing:
            raise StoreError(f"{self.path}: no column {STATIC_PREFIX + missing[0]!r} for "
                             f"static feature {missing[0]!r}")
        try:
            values = np.column_stack([table.column(STATIC_PREFIX + n).to_numpy()
                                      .astype(np.float64) for n in names])
        except (ValueError, TypeError) as exc:  # ArrowInvalid is a ValueError
            raise StoreError(f"{self.path}: static features are not numbers ({exc})") from exc
        bad = np.argwhere(~np.isfinite(values))
        if len(bad):  # conversion writes only finite values: the table was changed
            series, column = bad[0]
            raise StoreError(f"{self.path}: static feature {names[column]!r} of series "
                             f"{series} is {values[series, column]} (missing or not finite)")
        return values
